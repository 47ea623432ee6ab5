//! Kernel ABI constants both sides use (`include/uapi/linux/bpf.h`), defined once: the eBPF
//! programs pass them to helpers and map definitions, the agent to bpf(2).

/// `bpf_sk_storage_get` flag: create the socket's storage when it has none.
pub const BPF_SK_STORAGE_GET_F_CREATE: u64 = 1;
/// Map flag: inner maps of any size fit the outer map of a map-in-map (Linux 5.10).
pub const BPF_F_INNER_MAP: u32 = 1 << 12;
/// Map flag: the array can be mmap()ed (the agent fills it with one copy).
pub const BPF_F_MMAPABLE: u32 = 1 << 10;
/// Map flag: programs may only read the map (a `.rodata` section's).
pub const BPF_F_RDONLY_PROG: u32 = 1 << 7;
