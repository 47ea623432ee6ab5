//! The papers' experiments, run on the testbed with the agent (`plexp <name>`, normally
//! through `cargo xtask bench <name>`, which runs them inside the VM whose kernel has sch_fq).
//! Each writes `<out>/<name>.json` (results in the workload JSON shape), a markdown table
//! `<out>/<name>.md` and SVG plots into `<out>/`.
//!
//! # Layout
//! - [`pacing`]: pacing conformance (configured vs achieved, per flow and aggregate, TCP/UDP).
//! - [`qjump`]: QJump: RPC latency at a high QJump level next to bulk traffic.
//! - [`study`]: the TCP pacing study: N flows through a small-buffer bottleneck, paced or not; N*.
//! - [`d3`]: the D3 paper (D3): partition-aggregate deadlines vs senders, TCP / paced / QJump / D3.
//! - [`aqm`]: a paced class's queue held by the horizon or by CoDel + ECN.
//! - [`incast`]: the incast study and Dart: synchronized reads from S servers (TCP, tuned TCP, paced,
//!   DASR) and short messages next to bulk senders.

pub mod aqm;
pub mod d3;
pub mod harness;
pub mod incast;
pub mod pacing;
pub mod qjump;
pub mod study;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Options every experiment takes.
#[derive(clap::Args, Clone, Debug)]
pub struct Common {
    /// Where results, tables and plots go.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// A quicker, smaller run (fewer points, shorter durations) for smoke-testing the harness.
    #[arg(long)]
    pub quick: bool,
    /// Seed for every random draw.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// The JSON file an experiment writes, `<out>/<kind>.json`: what ran, where, and its points in
/// the workload JSON shape. Rewritten after every point, so an aborted run keeps what it
/// measured (`complete: false`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Document<C> {
    pub kind: String,
    pub version: u32,
    pub complete: bool,
    pub elapsed_s: f64,
    pub seed: u64,
    pub quick: bool,
    pub config: C,
    pub environment: Value,
    pub results: Vec<Value>,
    /// What the experiment adds: its summary tables (supported N, N*), raw measurements.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

impl<C: Serialize> Document<C> {
    pub fn new(
        kind: &str,
        common: &Common,
        config: C,
        environment: &Value,
        results: &[Value],
        complete: bool,
        elapsed_s: f64,
    ) -> Document<C> {
        Document {
            kind: kind.to_string(),
            version: paceline_tests::workload::SCHEMA_VERSION,
            complete,
            elapsed_s,
            seed: common.seed,
            quick: common.quick,
            config,
            environment: environment.clone(),
            results: results.to_vec(),
            extra: Default::default(),
        }
    }

    /// Adds a top-level field of the experiment's own.
    pub fn with(mut self, key: &str, value: impl Serialize) -> Document<C> {
        self.extra.insert(
            key.to_string(),
            serde_json::to_value(value).unwrap_or(Value::Null),
        );
        self
    }

    /// Writes `<out>/<kind>.json`.
    pub fn write(&self, out: &Path) -> anyhow::Result<()> {
        paceline_tests::workload::write_json(self, Some(&out.join(format!("{}.json", self.kind))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The envelope keeps its fields at the top level, the experiment's own beside them, and
    /// reads back.
    #[test]
    fn a_document_round_trips_with_its_extra_fields() {
        let c = Common {
            out: PathBuf::from("/nonexistent"),
            quick: true,
            seed: 7,
        };
        let points = vec![serde_json::json!({"kind": "x", "tags": {"n": "1"}})];
        let d = Document::new(
            "x",
            &c,
            serde_json::json!({"rate": 1}),
            &Value::Null,
            &points,
            false,
            1.5,
        )
        .with("supported", vec![1, 2]);
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["kind"], "x");
        assert_eq!(v["seed"], 7);
        assert_eq!(v["complete"], false);
        assert_eq!(v["supported"], serde_json::json!([1, 2]));
        assert_eq!(v["results"][0]["tags"]["n"], "1");
        let back: Document<Value> = serde_json::from_value(v).unwrap();
        assert_eq!(back.extra["supported"], serde_json::json!([1, 2]));
        assert_eq!(back.config["rate"], 1);
    }
}
