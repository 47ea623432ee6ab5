//! The `paceline` binary: everything is in the library (`paceline::cli`).

fn main() {
    paceline::cli::main()
}
