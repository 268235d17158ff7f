//! How a count (shards received, shards read) spreads over nodes.

use std::fmt;

/// Min, mean, 99th percentile and max of one count per node, zeros included.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Distribution {
    /// Nodes counted.
    pub nodes: usize,
    /// Nodes with a count above zero.
    pub nonzero: usize,
    pub total: u64,
    pub min: u64,
    pub mean: f64,
    pub p99: u64,
    pub max: u64,
}

impl Distribution {
    /// The distribution of `counts`, one per node.
    pub fn of(counts: impl IntoIterator<Item = u64>) -> Distribution {
        let mut sorted: Vec<u64> = counts.into_iter().collect();
        sorted.sort_unstable();
        let Some(&max) = sorted.last() else {
            return Distribution::default();
        };
        let total: u64 = sorted.iter().sum();
        // The smallest count that at least 99% of the nodes do not exceed.
        let p99_rank = (sorted.len() * 99).div_ceil(100).max(1) - 1;
        Distribution {
            nodes: sorted.len(),
            nonzero: sorted.iter().filter(|&&c| c > 0).count(),
            total,
            min: sorted[0],
            mean: total as f64 / sorted.len() as f64,
            p99: sorted[p99_rank],
            max,
        }
    }

    /// The busiest node against the mean (1.0: perfectly even).
    pub fn max_over_mean(&self) -> f64 {
        ratio(self.max as f64, self.mean)
    }

    /// The 99th percentile against the mean.
    pub fn p99_over_mean(&self) -> f64 {
        ratio(self.p99 as f64, self.mean)
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "mean {:.2}  p99 {}  max {}  (p99/mean {:.2}, max/mean {:.2}; min {})",
            self.mean,
            self.p99,
            self.max,
            self.p99_over_mean(),
            self.max_over_mean(),
            self.min
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_and_ratios_of_a_known_list() {
        let d = Distribution::of((1..=100).chain([0]));
        assert_eq!((d.nodes, d.nonzero, d.total), (101, 100, 5050));
        assert_eq!((d.min, d.p99, d.max), (0, 99, 100));
        assert!((d.mean - 50.0).abs() < 1e-9);
        assert!((d.max_over_mean() - 2.0).abs() < 1e-9);
        assert_eq!(Distribution::of([]), Distribution::default());
    }
}
