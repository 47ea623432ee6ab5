/// Rebuild when the `bpf-linker` binary changes (it is an undeclared tool dependency).
fn main() {
    if let Ok(p) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", p.display());
    }
}
