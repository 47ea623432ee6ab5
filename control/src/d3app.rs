//! The application side of D3: attach the size and deadline of a transfer to a TCP socket.
//!
//! The agent pins a socket-storage map (`<bpffs dir>/d3_app`, default
//! `/sys/fs/bpf/paceline/d3_app`); an application updates it with its socket as the key
//! (`bpf(BPF_MAP_UPDATE_ELEM)` with the socket's file descriptor as the key, as for any
//! `BPF_MAP_TYPE_SK_STORAGE` map). The value, from `paceline_common::maps::D3App`:
//!
//! ```c
//! struct paceline_d3_app {       /* 24 bytes, host byte order */
//!     __u64 size;                 /* bytes of the transfer about to be written */
//!     __u64 deadline_ns;          /* CLOCK_MONOTONIC time it must be acknowledged by */
//!     __u32 generation;           /* change it for every new transfer on the socket */
//!     __u32 pad;                  /* zero */
//! };
//! ```
//!
//! Set it before writing the transfer's first byte; the socket's class must have `d3`
//! in the policy. [`D3Sockets`] does this for Rust programs.

use std::{os::fd::AsRawFd, path::Path, time::Duration};

use anyhow::{Context as _, Result};
use aya::maps::{MapData, SkStorage};
use paceline_common::maps::D3App;

/// Default location of the pinned map.
pub const DEFAULT_PIN: &str = "/sys/fs/bpf/paceline/d3_app";

/// The pinned D3 application map.
pub struct D3Sockets {
    map: SkStorage<MapData, D3App>,
}

impl D3Sockets {
    /// Opens the map the agent pinned at `path`.
    pub fn open(path: &Path) -> Result<D3Sockets> {
        let data = MapData::from_pin(path)
            .with_context(|| format!("opening {} (is the agent running with D3 on?)", path.display()))?;
        let map = SkStorage::try_from(aya::maps::Map::SkStorage(data))?;
        Ok(D3Sockets { map })
    }

    /// Announces a transfer of `size` bytes on `socket` that must be acknowledged within
    /// `deadline` from now.
    pub fn set(&mut self, socket: &impl AsRawFd, size: u64, deadline: Duration) -> Result<()> {
        let generation = match self.map.get(socket, 0) {
            Ok(v) => v.generation.wrapping_add(1).max(1),
            Err(_) => 1,
        };
        let v = D3App {
            size,
            deadline_ns: mono_now_ns() + deadline.as_nanos() as u64,
            generation,
            _pad: 0,
        };
        self.map
            .insert(socket, v, 0)
            .context("updating the socket's D3 deadline")?;
        Ok(())
    }
}

fn mono_now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
