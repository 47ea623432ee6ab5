//! DASR, Dart's direct apportioning of sending rates, for TCP: a receiver counts the
//! senders currently sending to each of its addresses and tells each of them N and its line
//! rate in a TCP option on its ACKs; a sender paces the flow at line / N and follows N as it
//! changes. DASR only caps: congestion inside the network stays with TCP's own congestion
//! control. `docs/dasr.md` has the wire format, the definition of "currently sending" and the
//! reasoning behind both.
//!
//! Everything here is pure and `no_std`; the datapath (`datapath-ebpf/src/ebpf/dasr.rs`) and
//! the agent call it, the unit tests cover it.
//!
//! # Layout
//! - [`wire`]: the 8-byte option (kind 253, ExID `0xDA5A`): encode, decode, find it in a TCP
//!   option area.
//! - [`count`]: counting senders per local address in epochs (lock-free words the datapath
//!   updates with compare-and-swap), and N at any instant.
//! - [`rate`]: the share line / N, how it caps a flow, the sender's staleness rule, the
//!   histogram buckets of the rates set.
//! - [`maps`]: the map types (layouts asserted) and map names.

pub mod count;
pub mod maps;
pub mod rate;
pub mod wire;

pub use count::*;
pub use maps::*;
pub use rate::*;
pub use wire::*;
