//! The time this machine stood still: the `steal` column of `/proc/stat`, which a virtual
//! machine's kernel fills with the time its hypervisor ran something else while a CPU of it
//! wanted to run.
//!
//! A rate measured on the wire over a window loses what the shaper could not send while the
//! machine stood still: HTB's tokens fill only up to its burst, and an EDT clock that fell
//! behind the present does not send faster to catch up. On a shared machine that was 5-12% of
//! a 5 s window (the loss followed the steal of the same window within a point or two), so a
//! rate test's lower bound gives up the stolen fraction of its own window, measured here, and
//! keeps its upper bound whole.
//!
//! ```no_run
//! let mark = paceline_tests::stolen::Mark::now();
//! // ... measure a rate over the same window ...
//! let stolen = mark.fraction(); // 0.0 on bare metal
//! let lower = 0.95 * (1.0 - stolen);
//! ```

use std::time::Instant;

/// Each CPU's stolen time (in clock ticks) at one instant.
#[derive(Clone, Debug)]
pub struct Mark {
    at: Instant,
    ticks: Vec<u64>,
}

impl Mark {
    pub fn now() -> Self {
        Mark {
            at: Instant::now(),
            ticks: per_cpu_steal(),
        }
    }

    /// When the mark was taken.
    pub fn at(&self) -> Instant {
        self.at
    }

    /// The fraction of the time since this mark that the machine's CPUs were stolen, the mean
    /// over CPUs (0.0 where the kernel accounts no steal, as on bare metal), at most 1.
    pub fn fraction(&self) -> f64 {
        Self::now().fraction_since(self)
    }

    /// The stolen fraction of the window from `earlier` to this mark.
    pub fn fraction_since(&self, earlier: &Mark) -> f64 {
        let secs = (self.at - earlier.at).as_secs_f64();
        if secs <= 0.0 || self.ticks.is_empty() || self.ticks.len() != earlier.ticks.len() {
            return 0.0;
        }
        let stolen: u64 = self
            .ticks
            .iter()
            .zip(&earlier.ticks)
            .map(|(now, then)| now.saturating_sub(*then))
            .sum();
        let per_cpu = stolen as f64 / clock_ticks_per_second() / self.ticks.len() as f64;
        (per_cpu / secs).clamp(0.0, 1.0)
    }
}

/// The steal column (the eighth value) of each `cpuN` line of `/proc/stat`; empty when the file
/// cannot be read or has no such column (kernels before 2.6.11).
fn per_cpu_steal() -> Vec<u64> {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    parse_steal(&stat)
}

fn parse_steal(stat: &str) -> Vec<u64> {
    stat.lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .filter_map(|l| l.split_whitespace().nth(8)?.parse().ok())
        .collect()
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 { hz as f64 } else { 100.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_steal_column_of_each_cpu_and_not_the_total() {
        let stat = "cpu  1166144 766 182694 882286 6458 0 48892 81630 0 0\n\
                    cpu0 564456 290 84239 468955 1742 0 23847 40913 0 0\n\
                    cpu1 601688 475 98455 413331 4716 0 25045 40716 0 0\n\
                    intr 1 2 3\n";
        assert_eq!(parse_steal(stat), vec![40913, 40716]);
    }

    #[test]
    fn the_fraction_is_the_mean_over_cpus_of_the_window() {
        let hz = clock_ticks_per_second() as u64;
        let then = Mark {
            at: Instant::now(),
            ticks: vec![0, 0],
        };
        let now = Mark {
            at: then.at + std::time::Duration::from_secs(2),
            // One CPU stolen for 1 s of 2, the other not at all: a quarter of the machine.
            ticks: vec![hz, 0],
        };
        assert!((now.fraction_since(&then) - 0.25).abs() < 1e-9);
        assert_eq!(then.fraction_since(&now), 0.0, "a window backwards is no window");
    }
}
