//! The `paceline` command line, built inside the test package: cargo tells integration tests
//! the paths of their own package's binaries only (`CARGO_BIN_EXE_plagent`). Same library
//! code as the `paceline` binary.

fn main() {
    paceline::cli::main()
}
