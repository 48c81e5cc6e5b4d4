//! Latency histograms and counts by status code: in `GET /v1/stats` for the client side (by cache outcome)
//! and in `GET /v1/backends` for each origin, rendered as Prometheus histograms by `/metrics`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The upper bounds of the latency buckets, in microseconds, as Prometheus' `le` (a bucket counts the
/// observations at most its bound); one more bucket, `+Inf`, follows the last. From 25 µs (a hit from
/// memory on loopback) to 30 s (a slow origin's whole body), about three buckets per decade, as
/// `varnishhist` draws them on a log scale.
pub const LATENCY_BOUNDS_US: [u64; 19] = [
    25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 30_000_000,
];

/// Buckets of a histogram: [`LATENCY_BOUNDS_US`] and `+Inf`.
pub const LATENCY_BUCKETS: usize = LATENCY_BOUNDS_US.len() + 1;

/// How the cache answered, the label of the client-side histograms: `hit`, `miss`, `pass`, `stale`, and
/// `synth` for answers made here (errors, refusals, redirects and pages of rules, `OPTIONS *`, purges).
pub const OUTCOMES: [&str; 5] = ["hit", "miss", "pass", "stale", "synth"];

/// One histogram since start: observations per bucket (not cumulative; [`LATENCY_BUCKETS`] of them) and
/// their sum.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Histogram {
    /// Observations per bucket, in the order of [`LATENCY_BOUNDS_US`], the `+Inf` bucket last.
    pub counts: Vec<u64>,
    /// Sum of the observations, microseconds.
    pub sum_us: u64,
}

impl Histogram {
    /// Observations in all.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Adds `other`'s observations (another node's).
    pub fn add(&mut self, other: &Histogram) {
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.sum_us += other.sum_us;
    }

    /// What was observed after `earlier` (a snapshot of the same histogram), for live views.
    pub fn since(&self, earlier: &Histogram) -> Histogram {
        Histogram {
            counts: self
                .counts
                .iter()
                .enumerate()
                .map(|(i, c)| c.saturating_sub(earlier.counts.get(i).copied().unwrap_or(0)))
                .collect(),
            sum_us: self.sum_us.saturating_sub(earlier.sum_us),
        }
    }

    /// The upper bound (µs) of the bucket holding the `q` quantile (0–1); `None` when empty or in `+Inf`.
    pub fn quantile_bound_us(&self, q: f64) -> Option<u64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return LATENCY_BOUNDS_US.get(i).copied();
            }
        }
        None
    }
}

/// Time to the response head (`ttfb`) and to the end of its body (`total`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Latency {
    pub ttfb: Histogram,
    pub total: Histogram,
}

impl Latency {
    /// Adds `other`'s observations (another node's).
    pub fn add(&mut self, other: &Latency) {
        self.ttfb.add(&other.ttfb);
        self.total.add(&other.total);
    }
}

/// The client side's latency for one cache outcome ([`OUTCOMES`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct OutcomeLatency {
    pub outcome: String,
    pub latency: Latency,
}

/// Responses by status code (`"200": 1234`); codes never sent are left out.
pub type StatusCounts = BTreeMap<u16, u64>;

#[cfg(test)]
mod tests {
    use super::*;

    fn histogram(counts: &[(usize, u64)]) -> Histogram {
        let mut h = Histogram {
            counts: vec![0; LATENCY_BUCKETS],
            sum_us: 0,
        };
        for &(bucket, n) in counts {
            h.counts[bucket] = n;
        }
        h
    }

    #[test]
    fn quantiles_name_the_bound_of_their_bucket() {
        let h = histogram(&[(0, 50), (5, 40), (10, 9), (LATENCY_BUCKETS - 1, 1)]);
        let cases = [
            (0.0, Some(25)),
            (0.5, Some(25)),
            (0.51, Some(1_000)),
            (0.9, Some(1_000)),
            (0.99, Some(50_000)),
            (1.0, None),
        ];
        for (q, bound) in cases {
            assert_eq!(h.quantile_bound_us(q), bound, "q {q}");
        }
        assert_eq!(histogram(&[]).quantile_bound_us(0.5), None);
    }

    #[test]
    fn since_and_add_are_per_bucket() {
        let a = histogram(&[(1, 3), (2, 5)]);
        let b = histogram(&[(1, 4), (2, 5), (3, 2)]);
        assert_eq!(b.since(&a), histogram(&[(1, 1), (3, 2)]));
        let mut sum = a.clone();
        sum.add(&b);
        assert_eq!(sum, histogram(&[(1, 7), (2, 10), (3, 2)]));
        assert_eq!(sum.count(), 19);
    }
}
