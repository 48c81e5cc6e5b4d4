//! What the screen shows, derived from successive stats documents; no I/O here.

use std::{collections::VecDeque, time::Instant};

use lacquer_admin::wire::Stats;

/// Samples kept for the sparkline: one per refresh.
const HISTORY: usize = 120;

#[derive(Debug, Default)]
pub struct State {
    pub addr: String,
    pub latest: Option<Stats>,
    previous: Option<(Stats, Instant)>,
    taken: Option<Instant>,
    pub error: Option<String>,
    /// Requests per second, newest last.
    pub request_rates: VecDeque<u64>,
}

impl State {
    pub fn new(addr: String) -> Self {
        Self {
            addr,
            ..Self::default()
        }
    }

    pub fn update(&mut self, stats: Stats, at: Instant) {
        if let (Some(latest), Some(taken)) = (self.latest.take(), self.taken) {
            self.previous = Some((latest, taken));
        }
        self.latest = Some(stats);
        self.taken = Some(at);
        self.error = None;
        if let Some(rate) = self.rate("proxy.requests") {
            if self.request_rates.len() == HISTORY {
                self.request_rates.pop_front();
            }
            self.request_rates.push_back(rate.round() as u64);
        }
    }

    pub fn disconnected(&mut self, error: String) {
        self.error = Some(error);
    }

    /// A value by its `section.name`, e.g. `proxy.hits`.
    pub fn value(&self, name: &str) -> Option<u64> {
        self.latest.as_ref()?.get(name)
    }

    /// Per-second change of a counter between the last two samples.
    pub fn rate(&self, name: &str) -> Option<f64> {
        let (prev, prev_at) = self.previous.as_ref()?;
        let now = self.value(name)?;
        let before = prev.get(name)?;
        let secs = self.taken?.duration_since(*prev_at).as_secs_f64();
        (secs > 0.0).then(|| now.saturating_sub(before) as f64 / secs)
    }

    pub fn hit_ratio(&self) -> Option<f64> {
        self.latest.as_ref()?.hit_ratio()
    }

    pub fn uptime(&self) -> Option<u64> {
        Some(self.latest.as_ref()?.uptime_seconds)
    }
}
