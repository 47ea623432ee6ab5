//! The few bpf(2) and membarrier(2) calls aya 0.14 does not offer: creating a standalone map with
//! exact flags (the classifier's inner maps), filling and pruning a hash map in batches, filling
//! or patching an mmap-able array in place, emptying a map of any value type, and waiting for
//! every BPF program that may still read an old policy to finish.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

pub const BPF_MAP_TYPE_HASH: u32 = 1;
pub const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_MAP_TYPE_PERCPU_HASH: u32 = 5;
const BPF_MAP_TYPE_PERCPU_ARRAY: u32 = 6;
const BPF_MAP_TYPE_LRU_HASH: u32 = 9;
const BPF_MAP_TYPE_LRU_PERCPU_HASH: u32 = 10;
pub use paceline_common::abi::{BPF_F_INNER_MAP, BPF_F_MMAPABLE, BPF_F_RDONLY_PROG};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
/// bpf(2) command: open a pinned object (the tests also call it raw, between fork and exec).
pub const BPF_OBJ_GET: libc::c_long = 7;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
const BPF_MAP_DELETE_BATCH: libc::c_long = 27;
const BPF_LINK_UPDATE: libc::c_long = 29;

/// `union bpf_attr`, as bytes: each command writes the fields it uses at their offsets.
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Self {
        Attr([0; 128])
    }
    fn u32(&mut self, off: usize, v: u32) -> &mut Self {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(&mut self, off: usize, v: u64) -> &mut Self {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn read_u32(&self, off: usize) -> u32 {
        u32::from_ne_bytes(self.0[off..off + 4].try_into().expect("4 bytes"))
    }
}

fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: bpf(2) with a zeroed attribute block of the size passed; the kernel reads and
    // writes only within it.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.0.as_mut_ptr(), attr.0.len()) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// BPF_MAP_CREATE without BTF.
pub fn map_create(
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    flags: u32,
    name: &str,
) -> io::Result<OwnedFd> {
    let mut a = Attr::new();
    a.u32(0, map_type)
        .u32(4, key_size)
        .u32(8, value_size)
        .u32(12, max_entries)
        .u32(16, flags);
    let n = name.as_bytes();
    let len = n.len().min(15);
    a.0[28..28 + len].copy_from_slice(&n[..len]);
    let fd = bpf(BPF_MAP_CREATE, &mut a)?;
    // SAFETY: the kernel returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The shape of a map, as [`clear`] needs it (from `bpf_map_info`).
pub struct MapShape {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
}

/// Empties a map as a fresh one is: every key of a hash map (plain, per-CPU or LRU) deleted,
/// every entry of an array (plain or per-CPU) zeroed. Other types are left as they are;
/// returns whether this one was cleared.
pub fn clear(fd: BorrowedFd<'_>, m: &MapShape) -> io::Result<bool> {
    let raw = fd.as_raw_fd() as u32;
    match m.map_type {
        BPF_MAP_TYPE_HASH
        | BPF_MAP_TYPE_PERCPU_HASH
        | BPF_MAP_TYPE_LRU_HASH
        | BPF_MAP_TYPE_LRU_PERCPU_HASH => {
            // Deleting the first key until there is none: no iteration over a changing map.
            let mut key = vec![0u8; m.key_size as usize];
            loop {
                let mut a = Attr::new();
                a.u32(0, raw).u64(8, 0).u64(16, key.as_mut_ptr() as u64);
                match bpf(BPF_MAP_GET_NEXT_KEY, &mut a) {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(true),
                    Err(e) => return Err(e),
                }
                let mut a = Attr::new();
                a.u32(0, raw).u64(8, key.as_ptr() as u64);
                match bpf(BPF_MAP_DELETE_ELEM, &mut a) {
                    // an LRU entry may go between the two calls
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        BPF_MAP_TYPE_ARRAY | BPF_MAP_TYPE_PERCPU_ARRAY => {
            // Per-CPU values are copied one per possible CPU, each rounded up to 8 bytes.
            let len = if m.map_type == BPF_MAP_TYPE_PERCPU_ARRAY {
                let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
                (m.value_size as usize).div_ceil(8) * 8 * cpus
            } else {
                m.value_size as usize
            };
            let zeros = vec![0u8; len];
            for i in 0..m.max_entries {
                let mut a = Attr::new();
                a.u32(0, raw)
                    .u64(8, &i as *const u32 as u64)
                    .u64(16, zeros.as_ptr() as u64)
                    .u64(24, 0);
                bpf(BPF_MAP_UPDATE_ELEM, &mut a)?;
            }
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// BPF_OBJ_GET: a new file descriptor for the object pinned at `path`.
pub fn obj_get(path: &std::path::Path) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut a = Attr::new();
    a.u64(0, c.as_ptr() as u64);
    let fd = bpf(BPF_OBJ_GET, &mut a)?;
    // SAFETY: the kernel returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// BPF_LINK_UPDATE: the link runs `prog` from now on (atomically; 5.7+ for cgroup links).
pub fn link_update(link: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    let mut a = Attr::new();
    a.u32(0, link.as_raw_fd() as u32).u32(4, prog.as_raw_fd() as u32);
    bpf(BPF_LINK_UPDATE, &mut a).map(|_| ())
}

/// Reads entry `key` of an array map whose values are `V` into `out` (for values too large
/// to pass by value on a thread's stack, which aya's typed maps do).
pub fn lookup_into<V: Copy>(fd: BorrowedFd<'_>, key: u32, out: &mut V) -> io::Result<()> {
    let mut a = Attr::new();
    a.u32(0, fd.as_raw_fd() as u32)
        .u64(8, &key as *const u32 as u64)
        .u64(16, out as *mut V as u64);
    bpf(BPF_MAP_LOOKUP_ELEM, &mut a).map(|_| ())
}

/// Writes `value` into entry `key` of an array map whose values are `V`, in one update.
pub fn update_from<V: Copy>(fd: BorrowedFd<'_>, key: u32, value: &V) -> io::Result<()> {
    let mut a = Attr::new();
    a.u32(0, fd.as_raw_fd() as u32)
        .u64(8, &key as *const u32 as u64)
        .u64(16, value as *const V as u64);
    bpf(BPF_MAP_UPDATE_ELEM, &mut a).map(|_| ())
}

/// Entries per BPF_MAP_UPDATE_BATCH call (bounds the time spent in one syscall).
const BATCH: usize = 16_384;

/// Inserts `keys[i] -> values[i]` (plain-old-data types of the map's sizes) with
/// BPF_MAP_UPDATE_BATCH (5.6+).
pub fn update_batch<K: Copy, V: Copy>(fd: BorrowedFd<'_>, keys: &[K], values: &[V]) -> io::Result<()> {
    assert_eq!(keys.len(), values.len());
    for (ks, vs) in keys.chunks(BATCH).zip(values.chunks(BATCH)) {
        let mut a = Attr::new();
        a.u64(16, ks.as_ptr() as u64)
            .u64(24, vs.as_ptr() as u64)
            .u32(32, ks.len() as u32)
            .u32(36, fd.as_raw_fd() as u32);
        bpf(BPF_MAP_UPDATE_BATCH, &mut a).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "BPF_MAP_UPDATE_BATCH ({} of {} done): {e}",
                    a.read_u32(32),
                    ks.len()
                ),
            )
        })?;
    }
    Ok(())
}

/// Deletes `keys` (plain-old-data of the map's key size, every one present) with
/// BPF_MAP_DELETE_BATCH (5.6+).
pub fn delete_batch<K: Copy>(fd: BorrowedFd<'_>, keys: &[K]) -> io::Result<()> {
    for ks in keys.chunks(BATCH) {
        let mut a = Attr::new();
        a.u64(16, ks.as_ptr() as u64)
            .u32(32, ks.len() as u32)
            .u32(36, fd.as_raw_fd() as u32);
        bpf(BPF_MAP_DELETE_BATCH, &mut a).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "BPF_MAP_DELETE_BATCH ({} of {} done): {e}",
                    a.read_u32(32),
                    ks.len()
                ),
            )
        })?;
    }
    Ok(())
}

/// Writes the 32-bit words `new` into an mmap-able array map of at least `new.len()` and
/// `old.len()` entries whose entries hold `old`: only the words that differ, and zeroes past
/// the end of `new` up to `old.len()` (as a fresh map holds). Each word goes into the low half
/// of its 8-byte entry (an array's entries are 8-byte aligned: this layout is the map's own).
/// The map must be one no program reads.
pub fn patch_mmapable(fd: BorrowedFd<'_>, old: &[u32], new: &[u32]) -> io::Result<()> {
    patch_words(
        fd,
        WordLayout::Entries,
        0,
        old.len().max(new.len()),
        Some(old),
        new,
        0,
    )
}

/// How an mmap-able array map holds 32-bit words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WordLayout {
    /// One word to an entry, in the low half of its 8 bytes (an `Array<u32>`).
    Entries,
    /// Packed, 4 bytes a word, in entries of whole arrays of words (an `Array<[u32; N]>`).
    Packed,
}

impl WordLayout {
    fn bytes(self) -> usize {
        match self {
            WordLayout::Entries => 8,
            WordLayout::Packed => 4,
        }
    }
}

/// Writes the 32-bit words `new` into `len` words of an mmap-able array map laid out as
/// `layout` says, from word `start` (a whole number of pages in), and `fill` past the end of
/// `new`. `old`: what those words hold, as the same words and `fill` after them, when known:
/// then only the words that differ are written; `None`: every one is. The region must be one
/// no program reads.
pub fn patch_words(
    fd: BorrowedFd<'_>,
    layout: WordLayout,
    start: usize,
    len: usize,
    old: Option<&[u32]>,
    new: &[u32],
    fill: u32,
) -> io::Result<()> {
    if new.len() > len {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "more words than the region holds",
        ));
    }
    // Nothing to map (mmap refuses a length of 0).
    if len == 0 {
        return Ok(());
    }
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let word = layout.bytes();
    if !(start * word).is_multiple_of(page) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a region not on a page",
        ));
    }
    let bytes = (len * word).div_ceil(page) * page;
    // SAFETY: mapping the map's own memory, shared, at an offset and of a length within its
    // size (the kernel refuses them otherwise).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            (start * word) as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let slot = |i: usize| p.cast::<u8>().wrapping_add(i * word).cast::<u32>();
    let last = match old {
        // Past both `old` and `new`, the region holds `fill` and stays so.
        Some(o) => o.len().max(new.len()).min(len),
        None => len,
    };
    for i in 0..last {
        let want = new.get(i).copied().unwrap_or(fill);
        let held = old.map(|o| o.get(i).copied().unwrap_or(fill));
        if held != Some(want) {
            // SAFETY: `i` is below `len`, which the mapping covers; a word (or an entry's low
            // half: the upper half of an entry is never read and stays as the kernel zeroed
            // it) is 4-byte aligned.
            unsafe { slot(i).write(want) };
        }
    }
    // SAFETY: unmapping the mapping made above.
    unsafe { libc::munmap(p, bytes) };
    Ok(())
}

/// Waits until every BPF program that started before this call has finished: tc and sock_ops
/// programs run inside RCU read-side sections, and MEMBARRIER_CMD_GLOBAL waits for an RCU grace
/// period (`synchronize_rcu`). Returns false where the kernel refuses it (nohz_full), after
/// sleeping 50 ms instead, a thousand times longer than a program runs.
pub fn wait_for_readers() -> bool {
    const MEMBARRIER_CMD_GLOBAL: libc::c_long = 1;
    // SAFETY: membarrier(2) takes no pointers.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) };
    if r == 0 {
        return true;
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    false
}
