//! The report tool: turns the generators' JSON results (schema in [`paceline_tests::workload`]'s module
//! docs: `kind`, `version`, `tags`, `params`, `summary`, details) into markdown tables and SVG
//! plots (CDFs of latencies, a metric against the number of flows/senders with one line per
//! series). Used by the `plreport` binary and by the benchmarks (xtask).
//!
//! Values are addressed by *paths*: a JSON pointer (`/summary/p99_us`), or the same with dots
//! (`summary.p99_us`); a `*` segment fans out over an array (`/responses/*/fct_ms` yields every
//! response's completion time). Strings that hold numbers (tags such as `senders=8`) count as
//! numbers.
//!
//! ```no_run
//! use paceline_lab::report::{self, PlotOpts};
//! # fn main() -> anyhow::Result<()> {
//! let results = report::load_many(&["paced.json".into(), "unpaced.json".into()], None)?;
//! println!("{}", report::results_table(&results, &report::default_columns(&results)));
//! let cdf = report::cdf_series(&results, "/samples_us", Some("/tags/mode"));
//! report::cdf_plot("lat.svg".as_ref(), &PlotOpts::new("RPC latency", "latency (us)", "CDF"), &cdf)?;
//! let xy = report::xy_series(&results, "/tags/flows", "/summary/p99_fct_s", Some("/tags/mode"));
//! report::xy_plot("fct.svg".as_ref(), &PlotOpts::new("p99 FCT", "flows", "seconds"), &xy)?;
//! # Ok(()) }
//! ```
//!
//! Plots are SVG only (plotters' SVG backend writes text as `<text>` elements, so no font files
//! or fontconfig are needed at build or run time).

mod plot;
mod table;

pub use plot::{PlotOpts, Series, XySeries, cdf_plot, cdf_points, xy_plot};
pub use table::{Column, default_columns, fmt_num, markdown_table, results_table};

use anyhow::{Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Reads one result file.
pub fn load(path: &Path) -> Result<Value> {
    let s = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    serde_json::from_str(&s).with_context(|| format!("parse {}", path.display()))
}

/// Reads result files and labels each: with the value at `label_path` when given and present,
/// else the file stem.
pub fn load_many(paths: &[PathBuf], label_path: Option<&str>) -> Result<Vec<(String, Value)>> {
    paths
        .iter()
        .map(|p| {
            let v = load(p)?;
            let stem = p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| p.display().to_string());
            let label = label_path.and_then(|lp| get_str(&v, lp)).unwrap_or(stem);
            Ok((label, v))
        })
        .collect()
}

fn segments(path: &str) -> Vec<String> {
    let p = path.trim();
    let parts: Vec<&str> = if let Some(rest) = p.strip_prefix('/') {
        rest.split('/').collect()
    } else {
        p.split('.').collect()
    };
    parts
        .into_iter()
        .filter(|s| !s.is_empty())
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect()
}

/// Every value at `path` (more than one when it contains `*`).
pub fn select<'a>(v: &'a Value, path: &str) -> Vec<&'a Value> {
    let mut cur = vec![v];
    for seg in segments(path) {
        let mut next = Vec::new();
        for c in cur {
            match (c, seg.as_str()) {
                (Value::Array(a), "*") => next.extend(a.iter()),
                (Value::Object(o), "*") => next.extend(o.values()),
                (Value::Array(a), i) => {
                    if let Some(x) = i.parse::<usize>().ok().and_then(|i| a.get(i)) {
                        next.push(x)
                    }
                }
                (Value::Object(o), k) => {
                    if let Some(x) = o.get(k) {
                        next.push(x)
                    }
                }
                _ => {}
            }
        }
        cur = next;
    }
    cur
}

/// A value as a number (numbers, numeric strings, booleans as 0/1).
pub fn as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        Value::Bool(b) => Some(*b as u8 as f64),
        _ => None,
    }
}

/// The number at `path` (the first, if `path` fans out).
pub fn get_f64(v: &Value, path: &str) -> Option<f64> {
    select(v, path).into_iter().find_map(as_f64)
}

/// The value at `path` as display text (strings unquoted).
pub fn get_str(v: &Value, path: &str) -> Option<String> {
    select(v, path).into_iter().next().map(|x| match x {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => other.to_string(),
    })
}

/// Every number at `path`; arrays of numbers are flattened (so `/samples_us` and
/// `/responses/*/fct_ms` both work).
pub fn get_samples(v: &Value, path: &str) -> Vec<f64> {
    let mut out = Vec::new();
    for x in select(v, path) {
        match x {
            Value::Array(a) => out.extend(a.iter().filter_map(as_f64)),
            other => out.extend(as_f64(other)),
        }
    }
    out
}

fn series_name(label: &str, v: &Value, series_path: Option<&str>) -> String {
    series_path
        .and_then(|p| get_str(v, p))
        .unwrap_or_else(|| label.to_string())
}

/// CDF series from results: the samples at `samples_path`, grouped (merged) by the value at
/// `series_path` (or one series per result, named by its label).
pub fn cdf_series(results: &[(String, Value)], samples_path: &str, series_path: Option<&str>) -> Vec<Series> {
    let mut order = Vec::new();
    let mut m: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (label, v) in results {
        let name = series_name(label, v, series_path);
        if !m.contains_key(&name) {
            order.push(name.clone());
        }
        m.entry(name).or_default().extend(get_samples(v, samples_path));
    }
    order
        .into_iter()
        .map(|n| Series {
            values: m.remove(&n).unwrap_or_default(),
            name: n,
        })
        .collect()
}

/// XY series from results: one point (value at `x_path`, value at `y_path`) per result,
/// grouped by the value at `series_path` (one series when absent), sorted by x. Results
/// missing either value are skipped.
pub fn xy_series(
    results: &[(String, Value)],
    x_path: &str,
    y_path: &str,
    series_path: Option<&str>,
) -> Vec<XySeries> {
    let mut order = Vec::new();
    let mut m: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for (_label, v) in results {
        let name = series_path
            .and_then(|p| get_str(v, p))
            .unwrap_or_else(|| y_path.trim_start_matches('/').to_string());
        let (Some(x), Some(y)) = (get_f64(v, x_path), get_f64(v, y_path)) else {
            continue;
        };
        if !m.contains_key(&name) {
            order.push(name.clone());
        }
        m.entry(name).or_default().push((x, y));
    }
    order
        .into_iter()
        .map(|n| {
            let mut points = m.remove(&n).unwrap_or_default();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            XySeries { name: n, points }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> Vec<(String, Value)> {
        vec![
            (
                "a".into(),
                json!({"kind":"rpc","tags":{"mode":"paced","flows":"4"},"summary":{"p99_us":10.0,"count":3},"samples_us":[1.0,2.0,3.0]}),
            ),
            (
                "b".into(),
                json!({"kind":"rpc","tags":{"mode":"paced","flows":"2"},"summary":{"p99_us":5.0,"count":2},"samples_us":[4.0,5.0]}),
            ),
            (
                "c".into(),
                json!({"kind":"rpc","tags":{"mode":"unpaced","flows":"2"},"summary":{"p99_us":7.5,"count":1},"samples_us":[6.0]}),
            ),
        ]
    }

    #[test]
    fn paths_and_samples() {
        let v =
            json!({"summary":{"x":1.5},"tags":{"n":"8"},"responses":[{"fct_ms":1.0},{"fct_ms":2.0}],"a/b":3});
        assert_eq!(get_f64(&v, "/summary/x"), Some(1.5));
        assert_eq!(get_f64(&v, "summary.x"), Some(1.5));
        assert_eq!(get_f64(&v, "/tags/n"), Some(8.0));
        assert_eq!(get_samples(&v, "/responses/*/fct_ms"), vec![1.0, 2.0]);
        assert_eq!(get_f64(&v, "/a~1b"), Some(3.0));
        assert_eq!(get_f64(&v, "/nope"), None);
    }

    #[test]
    fn groups_series() {
        let r = sample();
        let c = cdf_series(&r, "/samples_us", Some("/tags/mode"));
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].name, "paced");
        assert_eq!(c[0].values.len(), 5);
        let xy = xy_series(&r, "/tags/flows", "/summary/p99_us", Some("/tags/mode"));
        assert_eq!(xy[0].points, vec![(2.0, 5.0), (4.0, 10.0)]);
        assert_eq!(xy[1].points, vec![(2.0, 7.5)]);
    }

    #[test]
    fn plots_render_svg() {
        let dir = std::env::temp_dir().join(format!("plreport-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let r = sample();
        let cdf = dir.join("cdf.svg");
        cdf_plot(
            &cdf,
            &PlotOpts::new("lat", "us", "CDF").log_x(true),
            &cdf_series(&r, "/samples_us", Some("/tags/mode")),
        )
        .unwrap();
        let s = std::fs::read_to_string(&cdf).unwrap();
        assert!(
            s.contains("<svg") && s.contains("paced") && s.contains("<polyline"),
            "{s}"
        );
        let xy = dir.join("xy.svg");
        xy_plot(
            &xy,
            &PlotOpts::new("p99", "flows", "us"),
            &xy_series(&r, "/tags/flows", "/summary/p99_us", Some("/tags/mode")),
        )
        .unwrap();
        assert!(std::fs::read_to_string(&xy).unwrap().contains("unpaced"));
        assert!(cdf_plot(&dir.join("x.png"), &PlotOpts::new("", "", ""), &[]).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
