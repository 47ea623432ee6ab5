//! What outlives the agent: its maps and links pinned in a BPF filesystem, so that `kill -9`,
//! a crash or an upgrade leaves the datapath running the last policy, and the next agent adopts
//! it without a gap.
//!
//! Under the agent's bpffs directory (`--bpffs-dir`, default `/sys/fs/bpf/paceline`):
//! - `maps/<NAME>`: every map of the eBPF object (`PL_*`); a new agent reuses a pinned map when
//!   it has the layout this build expects (type, key and value sizes, entries, flags, and
//!   [`LAYOUT_VERSION`]); a map that differs is unpinned and created afresh, and the reset is
//!   logged. So the same object keeps every map (flow clocks, counters, socket state); a newer
//!   object keeps those whose layout did not change.
//! - `links/<program>-<interface>` and `links/sock_ops`: the tcx and cgroup links; a new agent
//!   replaces their programs atomically (BPF_LINK_UPDATE) instead of detaching. clsact filters
//!   (kernels without tcx) outlive the process anyway and are replaced in place over netlink.
//! - `d3_app`: the D3 application map, where applications find it (the same map as
//!   `maps/PL_D3_APP`).
//!
//! The layouts the pins were made with are recorded in the state directory (`pins.json`).
//! A clean stop and `paceline cleanup` remove all of it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

/// Where the agent pins by default (`--bpffs-dir`).
pub const DEFAULT_BPFFS_DIR: &str = "/sys/fs/bpf/paceline";

/// Bumped when a type shared with the datapath changes meaning without changing size: every
/// pinned map is then reset at the next start.
pub const LAYOUT_VERSION: u32 = 1;

/// A map's layout as the kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapLayout {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
}

/// What the pins were made with (the state directory's `pins.json`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Record {
    pub layout_version: u32,
    pub maps: BTreeMap<String, MapLayout>,
}

/// The pin directory of one agent.
#[derive(Clone, Debug)]
pub struct Pins {
    root: PathBuf,
    /// The group given read-write access to the D3 application map's pin (`--d3-app-group`);
    /// without one only root may open it.
    app_group: Option<u32>,
}

/// What [`Pins::prepare`] found.
#[derive(Debug, Default)]
pub struct Adoption {
    /// Maps a previous agent pinned that this one reuses.
    pub kept: Vec<String>,
    /// Maps a previous agent pinned that this one starts afresh, with why.
    pub reset: Vec<(String, String)>,
}

impl Pins {
    pub fn new(root: &Path) -> Pins {
        Pins {
            root: root.to_path_buf(),
            app_group: None,
        }
    }

    /// These pins, with the D3 application map open to `group` (read-write, mode 0660).
    pub fn with_app_group(mut self, group: Option<u32>) -> Pins {
        self.app_group = group;
        self
    }

    /// The group the D3 application map's pin belongs to, if any but root's.
    pub fn app_group(&self) -> Option<u32> {
        self.app_group
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn maps_dir(&self) -> PathBuf {
        self.root.join("maps")
    }

    pub fn map(&self, name: &str) -> PathBuf {
        self.maps_dir().join(name)
    }

    pub fn links_dir(&self) -> PathBuf {
        self.root.join("links")
    }

    /// The pin of `program`'s link on `iface` (`egress-eth0`, `router-eth1`) or of sock_ops.
    pub fn link(&self, name: &str) -> PathBuf {
        self.links_dir().join(name)
    }

    /// Checks every pinned map against the layouts this build expects (`expected`, from the
    /// object) and the record of how the pins were made; unpins the ones that differ. Creates
    /// the directories.
    pub fn prepare(
        &self,
        expected: &BTreeMap<String, MapLayout>,
        record: Option<&Record>,
    ) -> Result<Adoption> {
        std::fs::create_dir_all(self.maps_dir())
            .with_context(|| format!("creating {}", self.maps_dir().display()))?;
        std::fs::create_dir_all(self.links_dir())
            .with_context(|| format!("creating {}", self.links_dir().display()))?;
        let mut out = Adoption::default();
        for entry in std::fs::read_dir(self.maps_dir())? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let why = match (expected.get(&name), record) {
                (None, _) => Some("this build has no such map".to_string()),
                (Some(_), None) => Some("no record of how it was made".to_string()),
                (Some(_), Some(r)) if r.layout_version != LAYOUT_VERSION => {
                    Some(format!("layout version {} -> {LAYOUT_VERSION}", r.layout_version))
                }
                (Some(want), Some(_)) => match pinned_layout(&entry.path()) {
                    Ok(have) if have == *want => None,
                    Ok(have) => Some(format!("layout {have:?} -> {want:?}")),
                    Err(e) => Some(format!("unreadable ({e})")),
                },
            };
            match why {
                None => out.kept.push(name),
                Some(w) => {
                    std::fs::remove_file(entry.path())
                        .with_context(|| format!("unpinning {}", entry.path().display()))?;
                    out.reset.push((name, w));
                }
            }
        }
        Ok(out)
    }

    /// Removes every pin and the directories (a clean stop, `paceline cleanup`).
    pub fn remove_all(&self) -> Vec<String> {
        let mut done = Vec::new();
        for dir in [self.links_dir(), self.maps_dir()] {
            if let Ok(entries) = std::fs::read_dir(&dir) {
                for e in entries.flatten() {
                    match std::fs::remove_file(e.path()) {
                        Ok(()) => done.push(format!("unpinned {}", e.path().display())),
                        Err(err) => done.push(format!("unpinning {} failed: {err}", e.path().display())),
                    }
                }
            }
            let _ = std::fs::remove_dir(&dir);
        }
        let _ = std::fs::remove_file(self.root.join("d3_app"));
        let _ = std::fs::remove_dir(&self.root);
        done
    }

    /// Whether a previous agent left pinned links (its datapath may still be running).
    pub fn has_links(&self) -> bool {
        std::fs::read_dir(self.links_dir())
            .map(|mut d| d.next().is_some())
            .unwrap_or(false)
    }
}

/// The layout of the map pinned at `path`.
fn pinned_layout(path: &Path) -> Result<MapLayout> {
    let info = aya::maps::MapInfo::from_pin(path)?;
    Ok(MapLayout {
        map_type: info.map_type()? as u32,
        key_size: info.key_size(),
        value_size: info.value_size(),
        max_entries: info.max_entries(),
        flags: info.map_flags(),
    })
}

/// The layouts of the object's named maps (`PL_*`; not .rodata/.bss), with the flow table sized
/// `flow_table_size` as the loader sizes it.
pub fn expected_layouts(object: &[u8], flow_table_size: u32) -> Result<BTreeMap<String, MapLayout>> {
    let obj = aya_obj::Object::parse(object).context("parsing the eBPF object")?;
    let mut out = BTreeMap::new();
    for (name, m) in &obj.maps {
        if !name.starts_with("PL_") {
            continue;
        }
        let max_entries = if name == paceline_common::maps::names::FLOWS {
            flow_table_size
        } else {
            m.max_entries()
        };
        out.insert(
            name.clone(),
            MapLayout {
                map_type: m.map_type(),
                key_size: m.key_size(),
                value_size: m.value_size(),
                max_entries,
                flags: m.map_flags(),
            },
        );
    }
    Ok(out)
}
