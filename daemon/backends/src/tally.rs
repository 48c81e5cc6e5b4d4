//! Latency histograms and counts by status code, kept with relaxed atomics: every worker records into the
//! same ones without a lock, and the admin API reads them as [`wire::Histogram`] and [`wire::StatusCounts`].

use std::{
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::Duration,
};

use lacquer_admin::wire::{self, LATENCY_BOUNDS_US, LATENCY_BUCKETS};

/// A latency histogram over [`LATENCY_BOUNDS_US`].
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS],
    sum_us: AtomicU64,
}

impl Histogram {
    /// Counts one observation.
    pub fn observe(&self, took: Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        // Prometheus' `le`: the first bucket whose bound is at least the value.
        let bucket = LATENCY_BOUNDS_US.partition_point(|&bound| bound < us);
        self.buckets[bucket].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
    }

    /// What it holds now.
    pub fn view(&self) -> wire::Histogram {
        wire::Histogram {
            counts: self.buckets.iter().map(|b| b.load(Relaxed)).collect(),
            sum_us: self.sum_us.load(Relaxed),
        }
    }
}

/// Time to a response head and to the end of its body.
#[derive(Debug, Default)]
pub struct Latency {
    /// To the response head.
    pub ttfb: Histogram,
    /// To the end of the body.
    pub total: Histogram,
}

impl Latency {
    /// What it holds now.
    pub fn view(&self) -> wire::Latency {
        wire::Latency {
            ttfb: self.ttfb.view(),
            total: self.total.view(),
        }
    }
}

/// The lowest status code `http` accepts; it takes three digits, so 900 slots hold every code.
const FIRST_CODE: u16 = 100;

/// Responses by status code: one counter per code `http::StatusCode` can hold (7 KiB), so counting is an
/// index and an increment, never a lookup.
#[derive(Debug)]
pub struct StatusCounts(Box<[AtomicU64]>);

impl Default for StatusCounts {
    fn default() -> Self {
        Self((FIRST_CODE..1000).map(|_| AtomicU64::new(0)).collect())
    }
}

impl StatusCounts {
    /// Counts a response with `status`.
    pub fn count(&self, status: http::StatusCode) {
        if let Some(slot) = self.0.get(usize::from(status.as_u16() - FIRST_CODE)) {
            slot.fetch_add(1, Relaxed);
        }
    }

    /// The codes counted at least once.
    pub fn view(&self) -> wire::StatusCounts {
        (FIRST_CODE..)
            .zip(self.0.iter())
            .filter_map(|(code, n)| Some((code, n.load(Relaxed))).filter(|(_, n)| *n > 0))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_whose_bound_holds_them() {
        let h = Histogram::default();
        let cases: [(u64, usize); 7] = [
            (0, 0),
            (25, 0),
            (26, 1),
            (1_000, 5),
            (1_001, 6),
            (30_000_000, LATENCY_BUCKETS - 2),
            (30_000_001, LATENCY_BUCKETS - 1),
        ];
        for (us, _) in cases {
            h.observe(Duration::from_micros(us));
        }
        let view = h.view();
        let mut expected = vec![0; LATENCY_BUCKETS];
        for (_, bucket) in cases {
            expected[bucket] += 1;
        }
        assert_eq!(view.counts, expected);
        assert_eq!(view.sum_us, cases.iter().map(|(us, _)| us).sum::<u64>());
    }

    #[test]
    fn status_counts_keep_every_code_apart() {
        let counts = StatusCounts::default();
        for code in [200, 200, 304, 503, 100, 999] {
            counts.count(http::StatusCode::from_u16(code).unwrap());
        }
        let view = counts.view();
        assert_eq!(
            view.into_iter().collect::<Vec<_>>(),
            [(100, 1), (200, 2), (304, 1), (503, 1), (999, 1)]
        );
    }
}
