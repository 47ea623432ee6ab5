//! DASR's map types (same rules as `crate::maps`: `#[repr(C)]`, explicit padding, sizes
//! asserted) and names. The per-socket share itself lives in the tc program's socket state
//! (`crate::maps::SockState::dasr_rate`), next to the flow clock it sets.

use core::mem::size_of;

use super::count::AddrView;
use super::rate::RATE_BUCKETS;

/// Names of DASR's maps in the eBPF object.
pub mod names {
    /// `HashMap<u32 ifindex, DasrIface>`: the interfaces the ingress program serves (written
    /// by the agent).
    pub const DASR_IFACES: &str = "PL_DASR_IFACES";
    /// `LruHashMap<[u32; 4], DasrAddr>`: senders counted per local address.
    pub const DASR_ADDRS: &str = "PL_DASR_ADDRS";
    /// `LruHashMap<DasrFlowKey, DasrFlow>`: the epoch each arriving flow was last counted in.
    pub const DASR_FLOWS: &str = "PL_DASR_FLOWS";
    /// `SkStorage<DasrSock>`: sock_ops' per-socket DASR state.
    pub const DASR_SOCK: &str = "PL_DASR_SOCK";
    /// `PerCpuArray<DasrStats>` with one entry.
    pub const DASR_STATS: &str = "PL_DASR_STATS";
}

/// Entries of [`names::DASR_ADDRS`] (local addresses; an LRU, so forwarded traffic a router
/// sees cannot fill it).
pub const DASR_ADDR_ENTRIES: u32 = 1024;
/// Entries of [`names::DASR_FLOWS`].
pub const DASR_FLOW_ENTRIES: u32 = 65_536;

/// [`DasrIface::flags`]: count the senders of arriving data (this host is a DASR receiver).
pub const IFACE_RECEIVE: u32 = 1 << 0;
/// Read DASR options of arriving ACKs and cap the flows they acknowledge (a DASR sender).
pub const IFACE_SEND: u32 = 1 << 1;

/// One interface the ingress program serves (value of [`names::DASR_IFACES`]).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub struct DasrIface {
    /// The line rate advertised for addresses reached through this interface, wire bytes/s
    /// (a value the option holds exactly).
    pub line_rate: u64,
    /// `active_rtts * rtt`, ns (see [`super::Window`]).
    pub min_window_ns: u64,
    /// What each sender adds to an epoch, ns.
    pub per_sender_ns: u64,
    /// `IFACE_*` bits.
    pub flags: u32,
    /// `line_rate` as the option's rate field.
    pub line_code: u16,
    pub _pad: u16,
}
const _: () = assert!(size_of::<DasrIface>() == 32);

impl DasrIface {
    #[inline(always)]
    pub const fn window(&self) -> super::Window {
        super::Window {
            min_ns: self.min_window_ns,
            per_sender_ns: self.per_sender_ns,
        }
    }
}

/// The senders counted for one local address (value of [`names::DASR_ADDRS`], keyed by the
/// address, 16 bytes, IPv4-mapped). `word` and `slots` are updated with compare-and-swap
/// (`super::count`).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub struct DasrAddr {
    pub word: u64,
    pub slots: [u64; 2],
    /// The line rate of the interface its data arrives on (bytes/s) and as the option's field.
    pub line_rate: u64,
    /// The current epoch's length, ticks.
    pub len: u32,
    pub line_code: u16,
    pub _pad: u16,
}
const _: () = assert!(size_of::<DasrAddr>() == 40);

impl DasrAddr {
    #[inline(always)]
    pub const fn view(&self) -> AddrView {
        AddrView {
            word: self.word,
            slots: self.slots,
            len: self.len,
        }
    }
}

/// An arriving flow, as its receiver sees it (key of [`names::DASR_FLOWS`]). Ports in host
/// byte order.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub struct DasrFlowKey {
    pub local: [u32; 4],
    pub remote: [u32; 4],
    pub local_port: u16,
    pub remote_port: u16,
}
const _: () = assert!(size_of::<DasrFlowKey>() == 36);

/// Value of [`names::DASR_FLOWS`].
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub struct DasrFlow {
    /// The epoch it was last counted in.
    pub seq: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<DasrFlow>() == 8);

/// [`DasrSock::flags`]: an option is prepared in `opt` and room was reserved for it.
pub const DSOCK_OPT_DUE: u32 = 1 << 0;
/// The socket's RTT callback was turned on for the staleness check.
pub const DSOCK_RTT_CB: u32 = 1 << 1;

/// sock_ops' per-socket DASR state (value of [`names::DASR_SOCK`]).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
pub struct DasrSock {
    /// The share last mirrored into SO_MAX_PACING_RATE (wire bytes/s; 0: none).
    pub applied: u64,
    /// The option the next WRITE_HDR_OPT callback writes.
    pub opt: [u8; super::wire::OPT_LEN],
    pub flags: u32,
    /// `data_segs_out` of the socket when an ACK last confirmed the share (see
    /// [`super::stale`]).
    pub segs_at_seen: u32,
}
const _: () = assert!(size_of::<DasrSock>() == 24);

/// Per-CPU DASR counters (value of [`names::DASR_STATS`]). On the user side (feature `user`)
/// also the counters of `/status`'s `counters.dasr`, summed over CPUs, with the histogram
/// written as the shares set on senders ([`shares_set`]).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "bpf"), derive(Debug))]
#[cfg_attr(feature = "user", derive(serde::Serialize, serde::Deserialize))]
pub struct DasrStats {
    /// Receiver: data segments counted.
    pub data_segments: u64,
    /// Receiver: flows counted into an epoch (a flow's first data segment in each epoch).
    pub sightings: u64,
    /// Receiver: epochs started.
    pub epochs: u64,
    /// Receiver: options written on pure ACKs.
    pub options_written: u64,
    /// Receiver: pure ACKs of a counted flow with no room left for the option (SACK blocks).
    pub options_no_room: u64,
    /// Sender: valid options read.
    pub options_read: u64,
    /// Sender: options with DASR's kind and ExID that were malformed or truncated: ignored.
    pub options_malformed: u64,
    /// Sender: valid options for which no local TCP socket was found.
    pub options_no_socket: u64,
    /// Sender: shares set on a socket (each change of a socket's share).
    pub rates_set: u64,
    /// Sender: SO_MAX_PACING_RATE updates sock_ops made to follow a share.
    pub pacing_updates: u64,
    /// Sender: shares dropped because the receiver stopped repeating them.
    pub stale_resets: u64,
    /// Sender: SO_MAX_PACING_RATE updates the kernel refused.
    pub sockopt_errors: u64,
    /// Sender: the shares set, by [`super::rate_bucket`].
    #[cfg_attr(feature = "user", serde(rename = "shares_set", with = "shares_set"))]
    pub rate_hist: [u64; RATE_BUCKETS],
}
const _: () = assert!(size_of::<DasrStats>() == 12 * 8 + 8 * RATE_BUCKETS);

impl Default for DasrStats {
    fn default() -> Self {
        DasrStats {
            data_segments: 0,
            sightings: 0,
            epochs: 0,
            options_written: 0,
            options_no_room: 0,
            options_read: 0,
            options_malformed: 0,
            options_no_socket: 0,
            rates_set: 0,
            pacing_updates: 0,
            stale_resets: 0,
            sockopt_errors: 0,
            rate_hist: [0; RATE_BUCKETS],
        }
    }
}

impl DasrStats {
    /// Adds `o` into `self` (summing per-CPU values on the user side).
    pub fn add(&mut self, o: &DasrStats) {
        self.data_segments = self.data_segments.wrapping_add(o.data_segments);
        self.sightings = self.sightings.wrapping_add(o.sightings);
        self.epochs = self.epochs.wrapping_add(o.epochs);
        self.options_written = self.options_written.wrapping_add(o.options_written);
        self.options_no_room = self.options_no_room.wrapping_add(o.options_no_room);
        self.options_read = self.options_read.wrapping_add(o.options_read);
        self.options_malformed = self.options_malformed.wrapping_add(o.options_malformed);
        self.options_no_socket = self.options_no_socket.wrapping_add(o.options_no_socket);
        self.rates_set = self.rates_set.wrapping_add(o.rates_set);
        self.pacing_updates = self.pacing_updates.wrapping_add(o.pacing_updates);
        self.stale_resets = self.stale_resets.wrapping_add(o.stale_resets);
        self.sockopt_errors = self.sockopt_errors.wrapping_add(o.sockopt_errors);
        for i in 0..RATE_BUCKETS {
            self.rate_hist[i] = self.rate_hist[i].wrapping_add(o.rate_hist[i]);
        }
    }
}

/// [`DasrStats::rate_hist`] as people read it: the non-empty buckets, each with its upper
/// bound ([`ShareBucket`](shares_set::ShareBucket)), lowest first. Written and read back
/// exactly.
#[cfg(feature = "user")]
pub mod shares_set {
    use core::fmt;

    use serde::de::{Error as _, SeqAccess, Visitor};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::dasr::{RATE_BUCKETS, bucket_upper};

    /// Shares set on senders below `below_bytes_per_second` (and at or above the bucket before).
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    pub struct ShareBucket {
        /// `None` for the last, open-ended bucket.
        pub below_bytes_per_second: Option<u64>,
        pub count: u64,
    }

    /// The non-empty buckets of `hist`, lowest first.
    pub fn buckets(hist: &[u64; RATE_BUCKETS]) -> impl Iterator<Item = ShareBucket> + '_ {
        hist.iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| ShareBucket {
                below_bytes_per_second: (i < RATE_BUCKETS - 1).then(|| bucket_upper(i)),
                count: *n,
            })
    }

    pub fn serialize<S: Serializer>(hist: &[u64; RATE_BUCKETS], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(buckets(hist))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u64; RATE_BUCKETS], D::Error> {
        struct Buckets;
        impl<'de> Visitor<'de> for Buckets {
            type Value = [u64; RATE_BUCKETS];

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of share buckets")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut hist = [0; RATE_BUCKETS];
                while let Some(b) = seq.next_element::<ShareBucket>()? {
                    let i = match b.below_bytes_per_second {
                        None => RATE_BUCKETS - 1,
                        Some(r) => {
                            (0..RATE_BUCKETS - 1)
                                .find(|&i| bucket_upper(i) == r)
                                .ok_or_else(|| {
                                    A::Error::custom(format_args!("no share bucket ends at {r} bytes/s"))
                                })?
                        }
                    };
                    hist[i] = b.count;
                }
                Ok(hist)
            }
        }
        d.deserialize_seq(Buckets)
    }
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: `#[repr(C)]`, `Copy`, integers and arrays of integers only, explicit padding:
    // every bit pattern is valid.
    unsafe impl aya::Pod for DasrIface {}
    unsafe impl aya::Pod for DasrAddr {}
    unsafe impl aya::Pod for DasrFlowKey {}
    unsafe impl aya::Pod for DasrFlow {}
    unsafe impl aya::Pod for DasrSock {}
    unsafe impl aya::Pod for DasrStats {}
}
