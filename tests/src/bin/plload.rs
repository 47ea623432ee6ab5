//! `plload`: the workload generators as a command (see `paceline_tests::workload`).
//!
//! ```text
//! plload serve  --port 5001 [--flows N] [--duration S] [--hook sockopt:LEVEL:OPT] [--samples]
//!               [--hook d3:/sys/fs/bpf/paceline/d3_app]      (D3: size + deadline per response)
//!               [--hook deadline-mark:THRESHOLD_US:MARK]     (SO_MARK for urgent responses)
//! plload bulk   --to 10.0.2.2:5001 --flows 4 --duration 10 [--bytes N] [--udp --rate-bps R]
//!               [--cc cubic] [--pacing-rate-bps R] [--mark M] [--dscp D|--tos T] [--priority P]
//! plload rpc    --to 10.0.2.2:5001 [--rate 1000 [--poisson]] [--req-size 64] [--resp-size 64]
//! plload pa     --workers A:P,B:P [--queries 100] [--deadline-mean-ms 30] [--seed 1]
//! plload incast --servers A:P,B:P [--fragment 262144] [--blocks 100]
//! ```
//! `--hook` is parsed by `workload::hook::parse_hook` (see its module docs for every hook).
//! Every subcommand takes `--tag key=value` (repeatable, copied into the report) and
//! `--out FILE` (default: JSON on stdout). `serve` writes its report when its flow count or
//! duration is reached, or on SIGTERM/SIGINT.

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use paceline_tests::workload::{self, Tags, bulk, incast, pa, rpc, serve};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Parser)]
#[command(
    name = "plload",
    about = "paceline workload generators (JSON results)",
    version
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Args, Clone)]
struct Common {
    /// Label copied into the report's `tags` (repeatable): key=value.
    #[arg(long = "tag", value_parser = workload::parse_tag)]
    tags: Vec<(String, String)>,
    /// Write the JSON report here instead of stdout.
    #[arg(long)]
    out: Option<PathBuf>,
}

impl Common {
    fn tags(&self) -> Tags {
        self.tags.iter().cloned().collect()
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve every workload on one TCP+UDP port; report bulk flows received.
    Serve {
        #[command(flatten)]
        opts: serve::ServeOpts,
        #[command(flatten)]
        common: Common,
    },
    /// Long-lived TCP flows, or UDP flows at a fixed rate.
    Bulk {
        #[command(flatten)]
        opts: bulk::BulkOpts,
        #[command(flatten)]
        common: Common,
    },
    /// Request/response latency, closed or open loop.
    Rpc {
        #[command(flatten)]
        opts: rpc::RpcOpts,
        #[command(flatten)]
        common: Common,
    },
    /// Partition-aggregate with per-response sizes and deadlines (D3).
    Pa {
        #[command(flatten)]
        opts: pa::PaOpts,
        #[command(flatten)]
        common: Common,
    },
    /// Incast: blocks striped over S servers, fixed fragment per server.
    Incast {
        #[command(flatten)]
        opts: incast::IncastOpts,
        #[command(flatten)]
        common: Common,
    },
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Serve { opts, common } => {
            // SAFETY: the handler only stores to an atomic.
            unsafe {
                libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
                libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
            }
            let mut server = serve::Server::start_with_opts_hook(&opts)?;
            eprintln!("plload serve: listening on port {} (tcp+udp)", server.port());
            server.run_until(&STOP);
            let report = server.report(&common.tags());
            server.stop();
            workload::write_json(&report, common.out.as_deref())
        }
        Cmd::Bulk { opts, common } => {
            workload::write_json(&bulk::run(&opts, &common.tags())?, common.out.as_deref())
        }
        Cmd::Rpc { opts, common } => {
            workload::write_json(&rpc::run(&opts, &common.tags())?, common.out.as_deref())
        }
        Cmd::Pa { opts, common } => {
            workload::write_json(&pa::run(&opts, &common.tags())?, common.out.as_deref())
        }
        Cmd::Incast { opts, common } => {
            workload::write_json(&incast::run(&opts, &common.tags())?, common.out.as_deref())
        }
    }
}
