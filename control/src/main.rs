//! The `paceline` binary: parses arguments, sets up logging, and calls the library.

use clap::Parser as _;

fn main() {
    let cli = paceline::cli::Cli::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(&cli.log_level))
        .format_timestamp_millis()
        .init();
    std::process::exit(paceline::cli::run(cli));
}
