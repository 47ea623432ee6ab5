//! `plreport`: markdown tables and SVG plots from `plload` results (see
//! `paceline_lab::report`).
//!
//! ```text
//! plreport table [--col HEADER=PATH]... [--label PATH] FILE...
//! plreport plot --kind cdf --samples /samples_us [--series /tags/mode] [--log-x] --out lat.svg FILE...
//! plreport plot --kind xy --x /tags/flows --y /summary/p99_fct_s [--series /tags/mode] --out fct.svg FILE...
//! ```

use anyhow::{Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use paceline_lab::report::{self, Column, PlotOpts};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "plreport",
    about = "tables and plots from plload JSON results",
    version
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum Kind {
    /// Empirical CDF of samples (one line per series).
    Cdf,
    /// A metric against x (one point per file, one line per series).
    Xy,
}

#[derive(Subcommand)]
enum Cmd {
    /// Markdown table, one row per result file.
    Table {
        /// Column as HEADER=PATH or PATH (repeatable; default: kind, tags, summary).
        #[arg(long = "col")]
        cols: Vec<String>,
        /// Path of the row label (default: file name).
        #[arg(long)]
        label: Option<String>,
        /// Result files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// SVG plot.
    Plot {
        /// cdf or xy.
        #[arg(long, value_enum)]
        kind: Kind,
        /// cdf: path of the samples (e.g. /samples_us, /responses/*/fct_ms, /block_ms).
        #[arg(long)]
        samples: Option<String>,
        /// xy: path of x (e.g. /tags/flows).
        #[arg(long)]
        x: Option<String>,
        /// xy: path of y (e.g. /summary/p99_fct_s).
        #[arg(long)]
        y: Option<String>,
        /// Path whose value names the series (e.g. /tags/mode); default one per file (cdf) or one (xy).
        #[arg(long)]
        series: Option<String>,
        /// Logarithmic x axis.
        #[arg(long)]
        log_x: bool,
        /// Caption.
        #[arg(long, default_value = "")]
        title: String,
        /// X axis label (default: the path).
        #[arg(long)]
        xlabel: Option<String>,
        /// Y axis label (default: CDF or the path).
        #[arg(long)]
        ylabel: Option<String>,
        /// Output file (.svg).
        #[arg(long)]
        out: PathBuf,
        /// Result files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Table { cols, label, files } => {
            let results = report::load_many(&files, label.as_deref())?;
            let cols: Vec<Column> = if cols.is_empty() {
                report::default_columns(&results)
            } else {
                cols.iter().map(|c| Column::parse(c)).collect()
            };
            print!("{}", report::results_table(&results, &cols));
        }
        Cmd::Plot {
            kind,
            samples,
            x,
            y,
            series,
            log_x,
            title,
            xlabel,
            ylabel,
            out,
            files,
        } => {
            let results = report::load_many(&files, None)?;
            match kind {
                Kind::Cdf => {
                    let Some(sp) = samples else {
                        bail!("--kind cdf needs --samples PATH")
                    };
                    let s = report::cdf_series(&results, &sp, series.as_deref());
                    if s.iter().all(|s| s.values.is_empty()) {
                        bail!("no samples at {sp} in any file");
                    }
                    let opts = PlotOpts::new(
                        &title,
                        xlabel.as_deref().unwrap_or(&sp),
                        ylabel.as_deref().unwrap_or("CDF"),
                    )
                    .log_x(log_x);
                    report::cdf_plot(&out, &opts, &s)?;
                }
                Kind::Xy => {
                    let (Some(xp), Some(yp)) = (x, y) else {
                        bail!("--kind xy needs --x PATH and --y PATH")
                    };
                    let s = report::xy_series(&results, &xp, &yp, series.as_deref());
                    if s.is_empty() {
                        bail!("no file has numbers at both {xp} and {yp}");
                    }
                    let opts = PlotOpts::new(
                        &title,
                        xlabel.as_deref().unwrap_or(&xp),
                        ylabel.as_deref().unwrap_or(&yp),
                    )
                    .log_x(log_x);
                    report::xy_plot(&out, &opts, &s)?;
                }
            }
            eprintln!("plreport: wrote {}", out.display());
        }
    }
    Ok(())
}
