//! Exact percentile summaries (sorting the samples) and Jain's fairness index.

use serde::{Deserialize, Serialize};

/// Summary of latency samples, in microseconds. Percentiles are nearest-rank over all samples.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Number of samples.
    pub count: u64,
    /// Mean.
    pub mean_us: f64,
    /// Minimum.
    pub min_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Maximum.
    pub max_us: f64,
}

/// Nearest-rank percentile `p` (0..=100) of sorted values.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Sorts `v` (NaNs last) and returns it.
pub fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(|a, b| a.total_cmp(b));
    v
}

impl LatencySummary {
    /// Summary of samples in nanoseconds.
    pub fn from_ns(samples: &[u64]) -> LatencySummary {
        Self::from_us(samples.iter().map(|&n| n as f64 / 1000.0).collect())
    }

    /// Summary of samples in microseconds.
    pub fn from_us(samples: Vec<f64>) -> LatencySummary {
        if samples.is_empty() {
            return LatencySummary::default();
        }
        let s = sorted(samples);
        let n = s.len();
        LatencySummary {
            count: n as u64,
            mean_us: s.iter().sum::<f64>() / n as f64,
            min_us: s[0],
            p50_us: percentile_sorted(&s, 50.0),
            p90_us: percentile_sorted(&s, 90.0),
            p99_us: percentile_sorted(&s, 99.0),
            p999_us: percentile_sorted(&s, 99.9),
            max_us: s[n - 1],
        }
    }

    /// The fields as `(name, value)` pairs, for flattening into a summary map.
    pub fn fields(&self) -> Vec<(&'static str, f64)> {
        vec![
            ("count", self.count as f64),
            ("mean_us", self.mean_us),
            ("min_us", self.min_us),
            ("p50_us", self.p50_us),
            ("p90_us", self.p90_us),
            ("p99_us", self.p99_us),
            ("p999_us", self.p999_us),
            ("max_us", self.max_us),
        ]
    }
}

/// Jain's fairness index of `xs` (1 = perfectly fair, 1/n = one takes all; 0 for no data).
pub fn jain(xs: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let s: f64 = xs.iter().sum();
    let s2: f64 = xs.iter().map(|x| x * x).sum();
    if n == 0.0 || s2 == 0.0 {
        0.0
    } else {
        s * s / (n * s2)
    }
}

/// Mean of `xs` (0 for none).
pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_nearest_rank() {
        let s: Vec<f64> = (1..=100).map(|x| x as f64).collect();
        assert_eq!(percentile_sorted(&s, 50.0), 50.0);
        assert_eq!(percentile_sorted(&s, 99.0), 99.0);
        assert_eq!(percentile_sorted(&s, 99.9), 100.0);
        assert_eq!(percentile_sorted(&s, 0.0), 1.0);
        let l = LatencySummary::from_ns(&[3000, 1000, 2000]);
        assert_eq!(
            (l.count, l.min_us, l.p50_us, l.max_us, l.mean_us),
            (3, 1.0, 2.0, 3.0, 2.0)
        );
        assert_eq!(LatencySummary::from_us(vec![]).count, 0);
    }

    #[test]
    fn jain_index() {
        assert!((jain(&[1.0, 1.0, 1.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[1.0, 0.0]) - 0.5).abs() < 1e-12);
        assert_eq!(jain(&[]), 0.0);
    }
}
