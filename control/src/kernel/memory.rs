//! The kernel memory the datapath's maps take: every eBPF map this process holds open, at the
//! memlock the kernel charges it (`/proc/self/fdinfo`), counted once however many descriptors
//! name it, and grouped into what an operator sizes (`spec.flow_table_size`, the policy's
//! classifier, the rest). The classifier's fast words are a fixed array of both banks
//! (8 MiB), charged whatever the policy; the words and hash tables of each bank follow the
//! policy's size.

use std::{collections::BTreeMap, sync::Mutex};

use paceline_common::maps::names;
use serde::{Deserialize, Serialize};

/// The kernel memory the datapath's maps take, by the kernel's accounting (memlock), read
/// when asked ([`of_this_process`]), as `/status` serves it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelMemory {
    pub total_bytes: u64,
    /// The per-flow table (`spec.flow_table_size`).
    pub flow_table_bytes: u64,
    /// The classifier's maps, both banks: the fixed fast words and each bank's words and
    /// hash tables, which follow the policy's size.
    pub classifier_bytes: u64,
    /// Everything else: counters, clocks, the per-CPU state, sockets' storage, D3, trace.
    pub other_bytes: u64,
    /// Every map, largest first.
    pub maps: Vec<MapMemory>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapMemory {
    pub name: String,
    pub bytes: u64,
}

/// A numeric field of an fdinfo text.
fn field<T: std::str::FromStr>(text: &str, name: &str) -> Option<T> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().parse().ok())
}

/// The id and memlock of a map's fdinfo text; `None` for another kind of descriptor.
pub fn parse_fdinfo(text: &str) -> Option<(u32, u64)> {
    Some((field(text, "map_id:")?, field(text, "memlock:")?))
}

/// The memlock the kernel charges the map (or program) behind `fd`.
pub fn memlock_of(fd: std::os::fd::BorrowedFd<'_>) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    field(&text, "memlock:")
}

/// Which part of [`KernelMemory`] a map of this name belongs to: the flow table, the
/// classifier (its maps in the object, `PL_CTAB_*`, and each bank's inner maps, `pl_ctab_*`),
/// or anything else.
pub fn part_of(name: &str) -> Part {
    if name == names::FLOWS {
        Part::FlowTable
    } else if name.to_ascii_uppercase().starts_with("PL_CTAB") {
        Part::Classifier
    } else {
        Part::Other
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    FlowTable,
    Classifier,
    Other,
}

/// The maps `found` (id, name, memlock), each once, summed into their parts; the maps listed
/// largest first.
pub fn summarize(found: impl IntoIterator<Item = (u32, String, u64)>) -> KernelMemory {
    let by_id: BTreeMap<u32, (String, u64)> = found.into_iter().map(|(id, n, b)| (id, (n, b))).collect();
    let mut m = KernelMemory::default();
    for (name, bytes) in by_id.into_values() {
        m.total_bytes += bytes;
        match part_of(&name) {
            Part::FlowTable => m.flow_table_bytes += bytes,
            Part::Classifier => m.classifier_bytes += bytes,
            Part::Other => m.other_bytes += bytes,
        }
        m.maps.push(MapMemory { name, bytes });
    }
    m.maps
        .sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    m
}

/// The maps this process holds open, now.
pub fn of_this_process() -> std::io::Result<KernelMemory> {
    // Map names by id, asked of the kernel once per map (a map's name never changes, and an id
    // is not reused while a descriptor holds its map); the maps no longer open are forgotten.
    static NAMES: Mutex<BTreeMap<u32, String>> = Mutex::new(BTreeMap::new());
    let mut names = NAMES.lock().unwrap_or_else(|p| p.into_inner());
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fdinfo")? {
        let Ok(entry) = entry else { continue };
        // A descriptor closed since the listing is skipped.
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let Some((id, memlock)) = parse_fdinfo(&text) else {
            continue;
        };
        let name = names.entry(id).or_insert_with(|| {
            aya::maps::MapInfo::from_id(id)
                .ok()
                .and_then(|i| i.name_as_str().map(str::to_string))
                .unwrap_or_default()
        });
        found.push((id, name.clone(), memlock));
    }
    names.retain(|id, _| found.iter().any(|(f, _, _)| f == id));
    Ok(summarize(found))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_maps_fdinfo_gives_its_id_and_memlock_and_other_descriptors_nothing() {
        let map = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1050\nmap_type:\t2\nkey_size:\t4\n\
                   value_size:\t4\nmax_entries:\t2097152\nmap_flags:\t0x400\nmap_extra:\t0x0\n\
                   memlock:\t16781312\nmap_id:\t77\nfrozen:\t0\n";
        assert_eq!(parse_fdinfo(map), Some((77, 16_781_312)));
        let prog = "pos:\t0\nflags:\t02000002\nprog_type:\t3\nprog_jited:\t1\nmemlock:\t4096\nprog_id:\t9\n";
        assert_eq!(parse_fdinfo(prog), None);
        assert_eq!(parse_fdinfo("pos:\t0\nflags:\t02\n"), None);
    }

    /// Checked (2026-12-07): with the maps kept as found, not by id, the total read 41,550.
    #[test]
    fn maps_are_counted_once_and_summed_into_their_parts() {
        let m = summarize([
            (1, names::FLOWS.to_string(), 9_000),
            (2, names::CTAB_FAST.to_string(), 16_000),
            (3, "pl_ctab_words".to_string(), 300),
            (4, "pl_ctab_rules".to_string(), 200),
            (5, names::CPU.to_string(), 50),
            // The same map through a second descriptor.
            (2, names::CTAB_FAST.to_string(), 16_000),
        ]);
        assert_eq!(m.total_bytes, 25_550);
        assert_eq!(m.flow_table_bytes, 9_000);
        assert_eq!(m.classifier_bytes, 16_500);
        assert_eq!(m.other_bytes, 50);
        let names: Vec<&str> = m.maps.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(
            names,
            [
                names::CTAB_FAST,
                names::FLOWS,
                "pl_ctab_words",
                "pl_ctab_rules",
                names::CPU
            ]
        );
    }
}
