//! `cachectl top`: the most frequent URLs, hosts, misses, origin fetches, statuses or backends among the
//! requests of a sliding window, live, as `varnishtop` shows them; counted here from the log stream, so the
//! daemon keeps no tables for it.

use std::{
    collections::{HashMap, VecDeque},
    io::IsTerminal,
    time::{Duration, Instant},
};

use lacquer_admin::{
    wire::{LogEntry, LogFilter},
    AdminClient, AdminError, LogEvent,
};
use serde::Serialize;

use crate::Output;

/// What `cachectl top` counts requests by.
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
    fn key(self, e: &LogEntry) -> Option<String> {
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

/// Counts over the last `window`: each key's requests, dropped as they age out.
struct Window {
    window: Duration,
    seen: VecDeque<(Instant, String)>,
    counts: HashMap<String, u64>,
}

impl Window {
    fn new(window: Duration) -> Self {
        Self {
            window,
            seen: VecDeque::new(),
            counts: HashMap::new(),
        }
    }

    fn add(&mut self, at: Instant, key: String) {
        *self.counts.entry(key.clone()).or_default() += 1;
        self.seen.push_back((at, key));
    }

    fn expire(&mut self, now: Instant) {
        while let Some((at, _)) = self.seen.front() {
            if now.duration_since(*at) <= self.window {
                break;
            }
            let (_, key) = self.seen.pop_front().expect("a front");
            if let Some(n) = self.counts.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    self.counts.remove(&key);
                }
            }
        }
    }

    /// The `limit` most counted, most first, then by key for a stable order.
    fn top(&self, limit: usize) -> Vec<Row> {
        let mut rows: Vec<Row> = self
            .counts
            .iter()
            .map(|(key, &count)| Row {
                key: key.clone(),
                count,
                per_second: count as f64 / self.window.as_secs_f64(),
            })
            .collect();
        rows.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        rows.truncate(limit);
        rows
    }
}

#[derive(Serialize)]
struct Row {
    key: String,
    count: u64,
    per_second: f64,
}

#[derive(Serialize)]
struct Top {
    by: String,
    window_seconds: f64,
    rows: Vec<Row>,
}

fn render(top: &Top) -> String {
    let mut text = format!(
        "top {} over the last {}s\n{:>8} {:>9}  {}\n",
        top.by, top.window_seconds, "COUNT", "PER SEC", "KEY"
    );
    for row in &top.rows {
        text += &format!("{:>8} {:>9.2}  {}\n", row.count, row.per_second, row.key);
    }
    text
}

/// Shows the table every second until interrupted, or once after `duration`.
pub async fn run(
    client: &AdminClient,
    out: Output,
    by: By,
    window: Duration,
    limit: usize,
    duration: Option<Duration>,
) -> Result<(), AdminError> {
    let mut stream = client.log_stream(&LogFilter::default()).await?;
    let mut counted = Window::new(window);
    let started = Instant::now();
    let clear = duration.is_none() && !out.json && std::io::stdout().is_terminal();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let name = format!("{by:?}").to_ascii_lowercase();
    let show = |counted: &Window| {
        let top = Top {
            by: name.clone(),
            window_seconds: window.as_secs_f64(),
            rows: counted.top(limit),
        };
        if clear {
            print!("\x1b[2J\x1b[H");
        }
        out.show(&top, render);
    };
    loop {
        tokio::select! {
            event = stream.next() => {
                if let LogEvent::Entry(entry) = event? {
                    if let Some(key) = by.key(&entry) {
                        counted.add(Instant::now(), key);
                    }
                }
            }
            _ = tick.tick() => {
                counted.expire(Instant::now());
                match duration {
                    Some(d) if started.elapsed() >= d => {
                        show(&counted);
                        return Ok(());
                    }
                    Some(_) => {}
                    None => show(&counted),
                }
            }
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
        let mut w = Window::new(Duration::from_secs(10));
        for (i, e) in log.iter().enumerate() {
            w.add(
                start + Duration::from_secs(i as u64 * 4),
                By::Url.key(e).unwrap(),
            );
        }
        let top = w.top(2);
        assert_eq!((top[0].key.as_str(), top[0].count), ("a.test/x", 2));
        assert_eq!(top.len(), 2);
        // At 15 s the two requests of 0 s and 4 s are past the 10 s window.
        w.expire(start + Duration::from_secs(15));
        let keys: Vec<_> = w.top(10).into_iter().map(|r| (r.key, r.count)).collect();
        assert_eq!(keys, [("a.test/z".into(), 1), ("b.test/y".into(), 1)]);
    }
}
