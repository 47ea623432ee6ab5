//! Host-side stub so that `paceline` can name this crate as a build dependency (aya-build builds
//! the real eBPF binary, `src/main.rs`, for the bpf target).
#![no_std]
