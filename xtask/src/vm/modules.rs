//! A Debian kernel's module tree made usable without kmod: modules uncompressed and without
//! signatures, `modules.dep` and `modules.alias` generated from each module's `.modinfo`
//! ([`prepare_modules`]), and [`ModIndex`] to resolve what a module needs, in load order.

use anyhow::{Context, Result, anyhow, bail};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::path::Path;

/// One pass over all modules: strip the appended signatures (checking them costs ~60 ms per
/// module under TCG; the kernel loads unsigned modules with a taint flag, as sig_enforce is
/// off), and write `modules.dep` (kmod order: a module's dependencies, the one loaded last
/// first) and `modules.alias` from each module's `.modinfo`, so that busybox modprobe (the
/// kernel's module autoloader in the VM) and our own load-order resolution work without kmod.
pub(super) fn prepare_modules(moddir: &Path) -> Result<()> {
    struct M {
        rel: String,
        deps: Vec<String>,
        aliases: Vec<String>,
    }
    let mut mods: BTreeMap<String, M> = BTreeMap::new();
    let mut stack = vec![moddir.join("kernel")];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d)?.flatten() {
            let p = e.path();
            let ft = e.file_type()?;
            if ft.is_dir() {
                stack.push(p);
                continue;
            }
            let mut fname = e.file_name().to_string_lossy().into_owned();
            let mut p = p;
            if let Some(base) = fname.strip_suffix(".ko.xz") {
                // Debian's 6.1 ships plain .ko, its 6.12 .ko.xz (busybox insmod cannot xz)
                let raw = fs::read(&p)?;
                let mut out = Vec::new();
                std::io::Read::read_to_end(&mut xz2::read::XzDecoder::new(&raw[..]), &mut out)
                    .with_context(|| format!("decompressing {}", p.display()))?;
                let plain = p.with_file_name(format!("{base}.ko"));
                fs::write(&plain, &out)?;
                fs::remove_file(&p)?;
                p = plain;
                fname = format!("{base}.ko");
            }
            if !fname.ends_with(".ko") {
                continue;
            }
            let mut data = fs::read(&p)?;
            if let Some(n) = signed_len(&data) {
                data.truncate(n);
                fs::OpenOptions::new().write(true).open(&p)?.set_len(n as u64)?;
            }
            let info = modinfo(&data).with_context(|| format!("reading .modinfo of {}", p.display()))?;
            let name = info
                .iter()
                .find_map(|(k, v)| (*k == "name").then(|| v.to_string()))
                .unwrap_or_else(|| norm(fname.trim_end_matches(".ko")));
            let deps = info
                .iter()
                .filter(|(k, _)| *k == "depends")
                .flat_map(|(_, v)| v.split(',').filter(|s| !s.is_empty()).map(norm))
                .collect();
            let aliases = info
                .iter()
                .filter(|(k, _)| *k == "alias")
                .map(|(_, v)| v.to_string())
                .collect();
            let rel = p.strip_prefix(moddir)?.to_string_lossy().into_owned();
            mods.insert(norm(&name), M { rel, deps, aliases });
        }
    }
    let mut dep = String::new();
    let mut alias = String::from("# Aliases extracted from modules themselves.\n");
    for (name, m) in &mods {
        // load order of the dependencies (post-order DFS), then reversed into kmod's order
        let mut order = Vec::new();
        let mut seen = HashSet::new();
        fn visit<'a>(
            n: &'a str,
            mods: &'a BTreeMap<String, M>,
            seen: &mut HashSet<&'a str>,
            order: &mut Vec<&'a str>,
        ) {
            if !seen.insert(n) {
                return;
            }
            if let Some(m) = mods.get(n) {
                for d in &m.deps {
                    visit(d, mods, seen, order);
                }
                order.push(&m.rel);
            }
        }
        seen.insert(name.as_str());
        for d in &m.deps {
            visit(d, &mods, &mut seen, &mut order);
        }
        order.reverse();
        dep.push_str(&format!(
            "{}:{}{}\n",
            m.rel,
            if order.is_empty() { "" } else { " " },
            order.join(" ")
        ));
        // Device-ID aliases (`pci:v...`, `usb:...`, `acpi*:...`) only serve hotplug, which
        // nothing handles in the VM; dropping them makes each autoload parse 1k lines, not 26k.
        for a in m.aliases.iter().filter(|a| !a.contains(':')) {
            alias.push_str(&format!("alias {a} {name}\n"));
        }
    }
    fs::write(moddir.join("modules.dep"), dep)?;
    fs::write(moddir.join("modules.alias"), alias)?;
    // busybox modprobe reads these when present; empty is fine
    for f in ["modules.symbols", "modules.softdep"] {
        if !moddir.join(f).exists() {
            fs::write(moddir.join(f), "")?;
        }
    }
    Ok(())
}

/// Length of the module without its appended signature, if it has one.
pub fn signed_len(d: &[u8]) -> Option<usize> {
    const MAGIC: &[u8] = b"~Module signature appended~\n";
    if !d.ends_with(MAGIC) || d.len() < MAGIC.len() + 12 {
        return None;
    }
    let end = d.len() - MAGIC.len();
    // struct module_signature { u8 algo, hash, id_type, signer_len, key_id_len, pad[3]; __be32 sig_len; }
    let sig_len = u32::from_be_bytes(d[end - 4..end].try_into().ok()?) as usize;
    end.checked_sub(12 + sig_len)
}

/// `key=value` pairs of an ELF64 module's `.modinfo` section.
fn modinfo(d: &[u8]) -> Result<Vec<(&str, &str)>> {
    let rd16 = |o: usize| -> Result<usize> {
        Ok(u16::from_le_bytes(d.get(o..o + 2).ok_or_else(|| anyhow!("short ELF"))?.try_into()?) as usize)
    };
    let rd32 = |o: usize| -> Result<usize> {
        Ok(u32::from_le_bytes(d.get(o..o + 4).ok_or_else(|| anyhow!("short ELF"))?.try_into()?) as usize)
    };
    let rd64 = |o: usize| -> Result<usize> {
        Ok(u64::from_le_bytes(d.get(o..o + 8).ok_or_else(|| anyhow!("short ELF"))?.try_into()?) as usize)
    };
    if !d.starts_with(b"\x7fELF\x02\x01") {
        bail!("not a little-endian ELF64 file");
    }
    let (shoff, shentsize, shnum, shstrndx) = (rd64(0x28)?, rd16(0x3a)?, rd16(0x3c)?, rd16(0x3e)?);
    let sh = |i: usize| -> Result<(usize, usize, usize)> {
        let b = shoff + i * shentsize;
        Ok((rd32(b)?, rd64(b + 0x18)?, rd64(b + 0x20)?))
    };
    let (_, stroff, strsize) = sh(shstrndx)?;
    let strtab = d
        .get(stroff..stroff + strsize)
        .ok_or_else(|| anyhow!("bad shstrtab"))?;
    for i in 0..shnum {
        let (name, off, size) = sh(i)?;
        let n = strtab
            .get(name..)
            .and_then(|s| s.split(|&c| c == 0).next())
            .unwrap_or_default();
        if n == b".modinfo" {
            let sec = d.get(off..off + size).ok_or_else(|| anyhow!("bad .modinfo"))?;
            return Ok(sec
                .split(|&c| c == 0)
                .filter_map(|kv| std::str::from_utf8(kv).ok())
                .filter_map(|kv| kv.split_once('='))
                .collect());
        }
    }
    Ok(Vec::new())
}

fn norm(name: &str) -> String {
    name.replace('-', "_")
}

/// Modules known to a module tree: name -> (path relative to the tree, transitive deps).
pub struct ModIndex {
    deps: HashMap<String, (String, Vec<String>)>,
    builtin: HashSet<String>,
}

impl ModIndex {
    pub fn load(moddir: &Path) -> Result<ModIndex> {
        let mut deps = HashMap::new();
        let text = fs::read_to_string(moddir.join("modules.dep")).with_context(|| {
            format!(
                "reading {}/modules.dep (delete that cache directory to have it prepared again)",
                moddir.display()
            )
        })?;
        for line in text.lines() {
            let Some((m, ds)) = line.split_once(':') else {
                continue;
            };
            deps.insert(
                mod_name(m),
                (
                    m.trim().to_string(),
                    ds.split_whitespace().map(String::from).collect(),
                ),
            );
        }
        Ok(ModIndex {
            deps,
            builtin: builtin(moddir),
        })
    }

    /// Paths (relative to the module tree) to insmod, in load order, for `names`.
    /// Built-in modules are skipped; unknown ones are returned in the second list.
    pub fn resolve(&self, names: &[String]) -> (Vec<String>, Vec<String>) {
        let by_path: HashMap<&str, &str> = self
            .deps
            .iter()
            .map(|(n, (p, _))| (p.as_str(), n.as_str()))
            .collect();
        let mut order = Vec::new();
        let mut seen = HashSet::new();
        let mut missing = Vec::new();
        fn visit(
            me: &ModIndex,
            by_path: &HashMap<&str, &str>,
            n: &str,
            seen: &mut HashSet<String>,
            order: &mut Vec<String>,
        ) {
            if !seen.insert(n.to_string()) {
                return;
            }
            let Some((path, deps)) = me.deps.get(n) else {
                return;
            };
            for d in deps {
                if let Some(dn) = by_path.get(d.as_str()) {
                    visit(me, by_path, dn, seen, order);
                }
            }
            order.push(path.clone());
        }
        for n in names {
            let n = norm(n);
            if self.builtin.contains(&n) {
                continue;
            }
            if !self.deps.contains_key(&n) {
                missing.push(n);
                continue;
            }
            visit(self, &by_path, &n, &mut seen, &mut order);
        }
        (order, missing)
    }
}

fn builtin(moddir: &Path) -> HashSet<String> {
    fs::read_to_string(moddir.join("modules.builtin"))
        .unwrap_or_default()
        .lines()
        .map(mod_name)
        .collect()
}

fn mod_name(path: &str) -> String {
    let base = path.trim().rsplit('/').next().unwrap_or(path);
    let base = base.split(".ko").next().unwrap_or(base);
    norm(base)
}
