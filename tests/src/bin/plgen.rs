//! `plgen policy --rules N`: prints a generated policy of N rules after expansion (tenants'
//! address lists under UDP port rules, and one probe rule), the shape of an operator's large
//! policy. Used to try the agent at scale:
//!
//! ```sh
//! cargo run --release -p paceline-tests --bin plgen -- policy --rules 100000 --interfaces '[eth0]' > big.yaml
//! paceline policy check big.yaml
//! ```

use clap::Parser;
use paceline_tests::policygen::BigPolicy;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// A policy of `rules` rules after expansion.
    Policy {
        #[arg(long, default_value_t = 100_000)]
        rules: u32,
        /// Addresses per tenant rule.
        #[arg(long, default_value_t = 1000)]
        per_rule: u32,
        /// The policy's `spec.interfaces`.
        #[arg(long, default_value = "[auto]")]
        interfaces: String,
        /// Shifts the addresses and ports: two variants differ in every rule.
        #[arg(long, default_value_t = 0)]
        variant: u32,
    },
}

fn main() {
    let What::Policy {
        rules,
        per_rule,
        interfaces,
        variant,
    } = Cli::parse().what;
    let p = BigPolicy {
        interfaces,
        rules,
        per_rule,
        variant,
        probe: ("probe".into(), 7001, "192.0.2.1/32".into()),
        probe_first: false,
    };
    print!("{}", p.yaml());
}
