//! The fingerprint of each datapath map's key and value types, derived from their Rust
//! definitions (build.rs writes them into the agent; `kernel::persist` records them in
//! `pins.json` and resets a pinned map whose types changed).
//!
//! The object's BTF cannot serve: aya-ebpf's `#[map]` maps (most of ours) carry their key and
//! value types only as a `PhantomData` named after them, so the BTF has no layout of
//! `PolicyTable`, `FlowState` and the rest. So the sources are read instead: each map
//! declaration in the datapath (`#[map(name = "PL_..")] static _: Kind<K, V>` or
//! `#[btf_map] static PL_..: Kind<..>`) and every struct of `paceline-common` and the datapath.
//! A map's fingerprint hashes its declared type with every struct in it expanded, recursively:
//! field names, their order, their types, and the struct's `repr`; not doc comments, nor the
//! struct's own name. So renaming, reordering or retyping a field changes it, even where the
//! size stays the same. A constant used as an array length is hashed by name (its value shows
//! in the size, which `pins.json` records beside this).
//!
//! A type name is resolved in the file that uses it first (structs, then type aliases), then
//! among the structs of all files; a name two files define and the using file does not is an
//! error, never a guess.

use std::collections::BTreeMap;

/// One parsed source file.
pub struct Source {
    /// The name it is known by in errors (its path).
    pub name: String,
    pub file: syn::File,
}

/// A source file's structs and type aliases, by name.
#[derive(Default)]
struct Scope {
    structs: BTreeMap<String, syn::ItemStruct>,
    aliases: BTreeMap<String, syn::Type>,
}

/// All structs and aliases, per file.
struct Types {
    files: Vec<(String, Scope)>,
}

/// Parses `text` as a Rust file named `name`.
pub fn parse(name: &str, text: &str) -> Result<Source, String> {
    syn::parse_file(text)
        .map(|file| Source {
            name: name.to_string(),
            file,
        })
        .map_err(|e| format!("{name}: {e}"))
}

/// The fingerprint (16 hex digits) of every map declared in `maps`, by map name, with the
/// types of `types` (the files of `maps` are searched too).
pub fn fingerprints(maps: &[Source], types: &[Source]) -> Result<BTreeMap<String, String>, String> {
    let all = Types {
        files: maps
            .iter()
            .chain(types)
            .map(|s| Ok((s.name.clone(), scope(s)?)))
            .collect::<Result<_, String>>()?,
    };
    let mut out = BTreeMap::new();
    for (file, s) in maps.iter().enumerate() {
        for item in &s.file.items {
            let syn::Item::Static(st) = item else { continue };
            let Some(name) = map_name(st) else { continue };
            let text = all.describe(file, &st.ty, 0)?;
            if out.insert(name.clone(), hex(fnv1a(text.as_bytes()))).is_some() {
                return Err(format!("{}: map {name} is declared twice", s.name));
            }
        }
    }
    Ok(out)
}

/// The name of the map a static declares: `#[map(name = "X")]` or `#[btf_map]` (its own
/// name); `None` if it declares none.
fn map_name(st: &syn::ItemStatic) -> Option<String> {
    for a in &st.attrs {
        if a.path().is_ident("btf_map") {
            return Some(st.ident.to_string());
        }
        if a.path().is_ident("map") {
            let mut name = None;
            let _ = a.parse_nested_meta(|m| {
                if m.path.is_ident("name") {
                    name = Some(m.value()?.parse::<syn::LitStr>()?.value());
                }
                Ok(())
            });
            return Some(name.unwrap_or_else(|| st.ident.to_string()));
        }
    }
    None
}

/// The top-level structs and type aliases of a file; a name defined twice there (under
/// different `cfg`s, say) is an error, as either could be the one the object has.
fn scope(src: &Source) -> Result<Scope, String> {
    let mut s = Scope::default();
    for item in &src.file.items {
        let twice = match item {
            syn::Item::Struct(st) => s.structs.insert(st.ident.to_string(), st.clone()).is_some(),
            syn::Item::Type(t) => s.aliases.insert(t.ident.to_string(), (*t.ty).clone()).is_some(),
            _ => false,
        };
        if twice {
            return Err(format!("{}: a struct or type alias is defined twice", src.name));
        }
    }
    Ok(s)
}

impl Types {
    /// `ty` as used in file `file`, with the structs in it expanded.
    fn describe(&self, file: usize, ty: &syn::Type, depth: usize) -> Result<String, String> {
        if depth > 16 {
            return Err(format!("{}: types nested too deep", self.files[file].0));
        }
        Ok(match ty {
            syn::Type::Path(p) if p.qself.is_none() => {
                let mut out = String::new();
                let last = p.path.segments.last().ok_or("an empty path")?;
                let ident = last.ident.to_string();
                match self.resolve(file, &ident)? {
                    Some(Found::Struct(f, st)) => out += &self.describe_struct(f, st, depth)?,
                    Some(Found::Alias(f, t)) => out += &self.describe(f, t, depth + 1)?,
                    None => out += &ident,
                }
                if let syn::PathArguments::AngleBracketed(args) = &last.arguments {
                    let mut parts = Vec::new();
                    for a in &args.args {
                        parts.push(match a {
                            syn::GenericArgument::Type(t) => self.describe(file, t, depth + 1)?,
                            other => tokens(other),
                        });
                    }
                    out += &format!("<{}>", parts.join(","));
                }
                out
            }
            syn::Type::Array(a) => format!(
                "[{};{}]",
                self.describe(file, &a.elem, depth + 1)?,
                tokens(&a.len)
            ),
            syn::Type::Tuple(t) => {
                let mut parts = Vec::new();
                for e in &t.elems {
                    parts.push(self.describe(file, e, depth + 1)?);
                }
                format!("({})", parts.join(","))
            }
            syn::Type::Paren(p) => self.describe(file, &p.elem, depth)?,
            other => tokens(other),
        })
    }

    /// A struct's `repr` and its fields (name and type, in order).
    fn describe_struct(&self, file: usize, st: &syn::ItemStruct, depth: usize) -> Result<String, String> {
        let repr: Vec<String> = st
            .attrs
            .iter()
            .filter(|a| a.path().is_ident("repr"))
            .map(tokens)
            .collect();
        let mut fields = Vec::new();
        for (i, f) in st.fields.iter().enumerate() {
            let name = f.ident.as_ref().map_or_else(|| i.to_string(), |n| n.to_string());
            fields.push(format!("{name}:{}", self.describe(file, &f.ty, depth + 1)?));
        }
        Ok(format!("struct{}{{{}}}", repr.join(""), fields.join(",")))
    }

    /// What `ident` names in file `file`: its own struct or alias, else the one struct of that
    /// name among all files; `None` for a name no file defines (a primitive, a kernel-side map
    /// kind).
    fn resolve(&self, file: usize, ident: &str) -> Result<Option<Found<'_>>, String> {
        let own = &self.files[file].1;
        if let Some(st) = own.structs.get(ident) {
            return Ok(Some(Found::Struct(file, st)));
        }
        if let Some(t) = own.aliases.get(ident) {
            return Ok(Some(Found::Alias(file, t)));
        }
        let found: Vec<(usize, &syn::ItemStruct)> = self
            .files
            .iter()
            .enumerate()
            .filter_map(|(i, (_, s))| s.structs.get(ident).map(|st| (i, st)))
            .collect();
        match found.as_slice() {
            [] => Ok(None),
            [(i, st)] => Ok(Some(Found::Struct(*i, st))),
            more => Err(format!(
                "{}: `{ident}` is ambiguous: defined in {}",
                self.files[file].0,
                more.iter()
                    .map(|(i, _)| self.files[*i].0.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
}

enum Found<'a> {
    Struct(usize, &'a syn::ItemStruct),
    Alias(usize, &'a syn::Type),
}

/// Tokens as text, spaced the same way whatever the source's spacing.
fn tokens(t: &impl quote::ToTokens) -> String {
    t.to_token_stream().to_string()
}

/// FNV-1a, 64 bits: stable across Rust versions and builds (what `pins.json` records must be).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn hex(v: u64) -> String {
    format!("{v:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = r#"
        type Sels = BtfHashMap<SelKey, [u32; 4], 1>;
        #[map(name = "PL_TABLES")]
        static TABLES: Array<PolicyTable> = Array::with_max_entries(2, 0);
        #[map(name = "PL_FLOWS")]
        static FLOWS: LruHashMap<FlowKey, FlowState> = LruHashMap::with_max_entries(64, 0);
        #[btf_map]
        static PL_SELS: ArrayOfMaps<Sels, 2> = ArrayOfMaps::new();
        #[map(name = "PL_SCRATCH")]
        static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);
        struct Scratch { a: u32 }
        static NOT_A_MAP: u32 = 0;
    "#;

    const TYPES: &str = r#"
        /// The table.
        #[repr(C)]
        pub struct PolicyTable { pub flags: u32, pub levels: [Level; 8], pub horizon_ns: u64 }
        #[repr(C)]
        pub struct Level { pub dscp: u8, pub pcp: u8, pub _pad: [u8; 2] }
        #[repr(C)]
        pub struct FlowKey { pub a: [u32; 4], pub port: u16, pub _pad: u16 }
        #[repr(C)]
        pub struct FlowState { pub t_last: u64, pub rate: u64 }
        #[repr(C)]
        pub struct SelKey { pub w: u32 }
        pub struct Scratch { b: u64 }
    "#;

    fn prints(types: &str) -> BTreeMap<String, String> {
        let maps = parse("maps.rs", MAPS).expect("parses");
        let types = parse("types.rs", types).expect("parses");
        fingerprints(&[maps], &[types]).expect("fingerprints")
    }

    /// The maps whose fingerprint differs between `TYPES` and `TYPES` with `from` replaced.
    fn changed(from: &str, to: &str) -> Vec<String> {
        assert!(TYPES.contains(from), "{from}");
        let (a, b) = (prints(TYPES), prints(&TYPES.replace(from, to)));
        assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
        a.keys().filter(|m| a[*m] != b[*m]).cloned().collect()
    }

    #[test]
    fn every_declared_map_is_fingerprinted() {
        let p = prints(TYPES);
        assert_eq!(
            p.keys().collect::<Vec<_>>(),
            ["PL_FLOWS", "PL_SCRATCH", "PL_SELS", "PL_TABLES"]
        );
        assert!(
            p.values()
                .all(|f| f.len() == 16 && f.chars().all(|c| c.is_ascii_hexdigit()))
        );
        assert_eq!(p, prints(TYPES), "deterministic");
    }

    /// A field renamed, fields swapped, or a field retyped at the same size (in a nested struct
    /// too) changes the fingerprint of the maps that hold the type, and only theirs.
    #[test]
    fn a_field_renamed_reordered_or_retyped_changes_the_maps_that_hold_it() {
        assert_eq!(changed("t_last: u64", "t_next: u64"), ["PL_FLOWS"]);
        assert_eq!(
            changed("pub t_last: u64, pub rate: u64", "pub rate: u64, pub t_last: u64"),
            ["PL_FLOWS"]
        );
        assert_eq!(
            changed("pub dscp: u8, pub pcp: u8", "pub pcp: u8, pub dscp: u8"),
            ["PL_TABLES"]
        );
        assert_eq!(changed("pub _pad: [u8; 2]", "pub _pad: u16"), ["PL_TABLES"]);
        assert_eq!(
            changed(
                "pub struct SelKey { pub w: u32 }",
                "pub struct SelKey { pub w: i32 }"
            ),
            ["PL_SELS"]
        );
        assert_eq!(
            changed("#[repr(C)]\n        pub struct FlowState", "pub struct FlowState"),
            ["PL_FLOWS"]
        );
    }

    /// Doc comments, spacing and the struct's own name are not its layout.
    #[test]
    fn comments_spacing_and_names_of_types_do_not_count() {
        assert!(changed("/// The table.", "/// The policy table, renamed in prose.").is_empty());
        assert!(changed("pub rate: u64 }", "pub   rate :u64 }").is_empty());
        assert!(
            changed("Level", "Tier").is_empty(),
            "a struct renamed where it is used too"
        );
    }

    /// The map file's own `Scratch` is the one its map holds, not another file's.
    #[test]
    fn a_name_resolves_in_its_own_file_first() {
        assert!(changed("pub struct Scratch { b: u64 }", "pub struct Scratch { c: u64 }").is_empty());
    }

    #[test]
    fn a_name_defined_twice_in_one_file_is_an_error() {
        let maps = parse("maps.rs", MAPS).expect("parses");
        let twice = format!("{TYPES}\n#[cfg(test)] pub struct FlowState {{ t: u64 }}");
        let types = parse("types.rs", &twice).expect("parses");
        let e = fingerprints(&[maps], &[types]).expect_err("FlowState twice");
        assert!(e.contains("types.rs") && e.contains("twice"), "{e}");
    }

    #[test]
    fn an_ambiguous_name_is_an_error() {
        let maps = parse("maps.rs", MAPS).expect("parses");
        let a = parse("a.rs", TYPES).expect("parses");
        let b = parse("b.rs", "pub struct FlowState { x: u64 }").expect("parses");
        let e = fingerprints(&[maps], &[a, b]).expect_err("FlowState is defined twice");
        assert!(
            e.contains("FlowState") && e.contains("a.rs") && e.contains("b.rs"),
            "{e}"
        );
    }
}
