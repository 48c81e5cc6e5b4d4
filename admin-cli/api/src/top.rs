//! Counting requests by URL, host, miss, fetch, status or backend over a sliding window, as `varnishtop`
//! does: what `cachectl top` and cachetop's top view show, counted by the client from the log stream so
//! the daemon keeps no tables for it.

use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

use serde::Serialize;

use crate::wire::LogEntry;

/// What `cachectl top` and cachetop's top view count requests by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    /// The full URL (`host/path?query`).
    Url,
    /// The `Host`.
    Host,
    /// URLs of requests the cache did not answer from what it stored (`MISS`).
    Miss,
    /// URLs of requests that went to a backend (misses, passes, revalidations).
    Fetch,
    /// The status sent.
    Status,
    /// The backend a request was sent to.
    Backend,
}

impl By {
    /// The key `entry` counts under, or none when it is not one of these.
    pub fn key(self, e: &LogEntry) -> Option<String> {
        let url = || format!("{}{}", e.host.as_deref().unwrap_or(""), e.url);
        match self {
            By::Url => Some(url()),
            By::Host => Some(e.host.clone().unwrap_or_else(|| "-".into())),
            By::Miss => e.cache.starts_with("MISS").then(url),
            By::Fetch => e.backend.is_some().then(url),
            By::Status => Some(e.status.to_string()),
            By::Backend => e.backend.clone(),
        }
    }
}

/// Requests a [`Window`] remembers at most: past it the oldest go first, so memory stays bounded however
/// busy the daemon (the window then spans less than asked, and [`Window::full`] says so).
pub const MOST_REMEMBERED: usize = 500_000;

/// Counts over the last `window`: each key's requests, dropped as they age out.
#[derive(Debug)]
pub struct Window {
    window: Duration,
    /// When counting began: until a whole window has gone by, rates are over the time since.
    since: Instant,
    seen: VecDeque<(Instant, String)>,
    counts: HashMap<String, u64>,
}

impl Window {
    /// An empty window `window` long, counting from `since`.
    pub fn new(window: Duration, since: Instant) -> Self {
        Self {
            window,
            since,
            seen: VecDeque::new(),
            counts: HashMap::new(),
        }
    }

    /// The time the counts span at `now`: the window, or less while it has not filled yet (counting began
    /// later) or when it holds [`MOST_REMEMBERED`] requests (the oldest were forgotten); at least a second,
    /// so the first requests do not show as a burst.
    pub fn span(&self, now: Instant) -> Duration {
        let mut span = self.window.min(now.saturating_duration_since(self.since));
        if self.full() {
            if let Some((oldest, _)) = self.seen.front() {
                span = span.min(now.saturating_duration_since(*oldest));
            }
        }
        span.max(Duration::from_secs(1))
    }

    /// Counts a request under `key`, seen at `at`.
    pub fn add(&mut self, at: Instant, key: String) {
        if self.seen.len() >= MOST_REMEMBERED {
            self.forget_oldest();
        }
        *self.counts.entry(key.clone()).or_default() += 1;
        self.seen.push_back((at, key));
    }

    /// Forgets the requests older than the window at `now`.
    pub fn expire(&mut self, now: Instant) {
        while let Some((at, _)) = self.seen.front() {
            if now.duration_since(*at) <= self.window {
                break;
            }
            self.forget_oldest();
        }
    }

    /// Whether it holds [`MOST_REMEMBERED`] requests, so that it spans less than its window.
    pub fn full(&self) -> bool {
        self.seen.len() >= MOST_REMEMBERED
    }

    fn forget_oldest(&mut self) {
        let Some((_, key)) = self.seen.pop_front() else {
            return;
        };
        if let Some(n) = self.counts.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(&key);
            }
        }
    }

    /// The `limit` most counted at `now`, most first, then by key for a stable order; rates are over the
    /// [`Window::span`].
    pub fn top(&self, limit: usize, now: Instant) -> Vec<Row> {
        let span = self.span(now).as_secs_f64();
        let mut rows: Vec<Row> = self
            .counts
            .iter()
            .map(|(key, &count)| Row {
                key: key.clone(),
                count,
                per_second: count as f64 / span,
            })
            .collect();
        rows.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        rows.truncate(limit);
        rows
    }
}

/// One key of a [`Window`] and its requests.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// What the requests share ([`By::key`]).
    pub key: String,
    /// Requests within the window.
    pub count: u64,
    /// `count` over the time the window spans ([`Window::span`]).
    pub per_second: f64,
}

impl By {
    /// Every way of counting, in the order cachetop cycles through them.
    pub const ALL: [By; 6] = [
        By::Url,
        By::Host,
        By::Miss,
        By::Fetch,
        By::Status,
        By::Backend,
    ];

    /// `url`, `host`, …: as `--by` takes it.
    pub fn name(self) -> &'static str {
        match self {
            By::Url => "url",
            By::Host => "host",
            By::Miss => "miss",
            By::Fetch => "fetch",
            By::Status => "status",
            By::Backend => "backend",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(host: &str, url: &str, status: u16, cache: &str, backend: Option<&str>) -> LogEntry {
        LogEntry {
            time_ms: 0,
            client: "192.0.2.1".into(),
            method: "GET".into(),
            url: url.into(),
            host: Some(host.into()),
            protocol: "HTTP/1.1".into(),
            status,
            bytes: 0,
            referer: None,
            user_agent: None,
            cache: cache.into(),
            detail: None,
            ttfb: 0.0,
            duration: 0.0,
            backend: backend.map(Into::into),
            route: None,
            request_headers: Vec::new(),
            response_headers: Vec::new(),
            steps: Vec::new(),
        }
    }

    #[test]
    fn requests_count_under_their_key_and_age_out_of_the_window() {
        let log = [
            entry("a.test", "/x", 200, "HIT", None),
            entry("a.test", "/x", 200, "MISS", Some("app")),
            entry("b.test", "/y", 404, "PASS", Some("app")),
            entry("a.test", "/z", 200, "MISS", Some("app")),
        ];
        let keys = |by: By| -> Vec<Option<String>> { log.iter().map(|e| by.key(e)).collect() };
        assert_eq!(
            keys(By::Miss),
            [None, Some("a.test/x".into()), None, Some("a.test/z".into())]
        );
        assert_eq!(keys(By::Fetch).iter().flatten().count(), 3);
        assert_eq!(keys(By::Status)[2].as_deref(), Some("404"));
        assert_eq!(keys(By::Backend)[0], None);

        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut w = Window::new(Duration::from_secs(10), start);
        assert!(!w.full());
        for (i, e) in log.iter().enumerate() {
            w.add(at(i as u64 * 4), By::Url.key(e).unwrap());
        }
        let top = w.top(2, at(12));
        assert_eq!((top[0].key.as_str(), top[0].count), ("a.test/x", 2));
        assert_eq!(top.len(), 2);
        assert_eq!(top[0].per_second, 0.2, "2 over the whole 10 s window");
        // At 15 s the two requests of 0 s and 4 s are past the 10 s window.
        w.expire(at(15));
        let keys: Vec<_> = w
            .top(10, at(15))
            .into_iter()
            .map(|r| (r.key, r.count))
            .collect();
        assert_eq!(keys, [("a.test/z".into(), 1), ("b.test/y".into(), 1)]);
    }

    /// Six requests in the first 4 s of a 60 s window are 1.5 a second, not 0.1.
    #[test]
    fn rates_are_over_the_time_counted_until_the_window_fills() {
        let start = Instant::now();
        let mut w = Window::new(Duration::from_secs(60), start);
        for i in 0..6 {
            w.add(start + Duration::from_millis(i * 600), "a.test/x".into());
        }
        let now = start + Duration::from_secs(4);
        assert_eq!(w.span(now), Duration::from_secs(4));
        assert_eq!(w.top(1, now)[0].per_second, 1.5);
        assert_eq!(
            w.span(start + Duration::from_millis(200)),
            Duration::from_secs(1),
            "never under a second"
        );
        assert_eq!(
            w.span(start + Duration::from_secs(90)),
            Duration::from_secs(60)
        );
    }
}
