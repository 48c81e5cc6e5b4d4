//! `cachectl warm`: URLs fetched through the cache, at a bounded rate and concurrency, so that what a list
//! or yesterday's access log names is stored before clients ask; then how each went, by `Cache-Status`.

use std::{
    collections::BTreeMap,
    io::IsTerminal,
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use serde::Serialize;

/// One URL to warm: its host and target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub host: String,
    pub target: String,
}

impl Url {
    /// `http://host/target` (or `https://`; the request goes to the cache's listener either way), or a
    /// target with `host` given.
    pub fn parse(text: &str, host: Option<&str>) -> Result<Self, String> {
        let rest = text
            .strip_prefix("http://")
            .or_else(|| text.strip_prefix("https://"));
        match (rest, host) {
            (Some(rest), _) => {
                let (authority, target) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
                if authority.is_empty() {
                    return Err(format!("{text}: no host"));
                }
                Ok(Self {
                    host: authority.to_owned(),
                    target: if target.is_empty() { "/" } else { target }.to_owned(),
                })
            }
            (None, Some(host)) if text.starts_with('/') => Ok(Self {
                host: host.to_owned(),
                target: text.to_owned(),
            }),
            _ => Err(format!(
                "{text}: give http://host/path, or a path with --host"
            )),
        }
    }
}

/// The URLs a list names: one per line; blank lines and `#` comments skipped; each once, in order.
pub fn from_list(text: &str, host: Option<&str>) -> Result<Vec<Url>, String> {
    let lines = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'));
    dedup(
        lines
            .map(|l| Url::parse(l, host))
            .collect::<Result<_, _>>()?,
    )
}

/// The URLs an access log's `GET` requests name, each once, in the order first seen: lacquerd's `default`
/// format carries the full URL in the request line; `combined` (and NGINX's, Apache's, varnishncsa's with
/// a path) needs `host`. Lines of other methods, or that are not log lines, are skipped.
pub fn from_log(text: &str, host: Option<&str>) -> Result<Vec<Url>, String> {
    let mut urls = Vec::new();
    for line in text.lines() {
        let Some(request) = line.split('"').nth(1) else {
            continue;
        };
        let mut words = request.split(' ');
        if words.next() != Some("GET") {
            continue;
        }
        if let Some(Ok(url)) = words.next().map(|t| Url::parse(t, host)) {
            urls.push(url);
        }
    }
    dedup(urls)
}

fn dedup(urls: Vec<Url>) -> Result<Vec<Url>, String> {
    let mut seen = std::collections::HashSet::new();
    Ok(urls
        .into_iter()
        .filter(|u| seen.insert((u.host.clone(), u.target.clone())))
        .collect())
}

/// How the URLs went.
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    /// URLs fetched.
    pub urls: usize,
    /// Served from the cache: stored already.
    pub cached: usize,
    /// Fetched from the origin and stored.
    pub stored: usize,
    /// Answered but not stored, by the `Cache-Status` detail (why).
    pub not_stored: BTreeMap<String, usize>,
    /// No answer, or an error status, by what happened.
    pub failed: BTreeMap<String, usize>,
    /// Seconds the run took.
    pub seconds: f64,
}

/// Warms `urls` through the cache listening at `via`: at most `rate` requests a second, `concurrency` at
/// once, each a plain `GET` as a client with nothing special sends (no `Accept-Encoding`: the variant
/// most clients share when lacquerd negotiates codings, as it does by default).
pub async fn warm(urls: Vec<Url>, via: SocketAddr, rate: f64, concurrency: usize) -> Summary {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let gate = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let started = Instant::now();
    let total = urls.len();
    let done = Arc::new(AtomicUsize::new(0));
    let progress = std::io::stderr().is_terminal();
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(0.001)));
    let mut tasks = Vec::with_capacity(total);
    for url in urls {
        ticks.tick().await;
        let permit = gate.clone().acquire_owned().await.expect("never closed");
        let (client, done) = (client.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let outcome = fetch(&client, via, &url).await;
            drop(permit);
            let n = done.fetch_add(1, Ordering::Relaxed) + 1;
            if progress {
                eprint!("\rwarming: {n}/{total}");
            }
            outcome
        }));
    }
    let mut summary = Summary {
        urls: total,
        ..Summary::default()
    };
    for task in tasks {
        match task.await.unwrap_or(Outcome::Failed("panicked".into())) {
            Outcome::Cached => summary.cached += 1,
            Outcome::Stored => summary.stored += 1,
            Outcome::NotStored(why) => *summary.not_stored.entry(why).or_default() += 1,
            Outcome::Failed(why) => *summary.failed.entry(why).or_default() += 1,
        }
    }
    if progress {
        eprintln!();
    }
    summary.seconds = started.elapsed().as_secs_f64();
    summary
}

enum Outcome {
    Cached,
    Stored,
    NotStored(String),
    Failed(String),
}

async fn fetch(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>,
    via: SocketAddr,
    url: &Url,
) -> Outcome {
    let req = http::Request::get(format!("http://{via}{}", url.target))
        .header(http::header::HOST, &url.host)
        .header(http::header::USER_AGENT, "cachectl-warm")
        .body(Empty::new());
    let Ok(req) = req else {
        return Outcome::Failed("not a request".into());
    };
    let resp = match tokio::time::timeout(Duration::from_secs(60), client.request(req)).await {
        Ok(Ok(resp)) => resp,
        Ok(Err(_)) => return Outcome::Failed("connection".into()),
        Err(_) => return Outcome::Failed("timeout".into()),
    };
    let status = resp.status();
    let cache_status = resp
        .headers()
        .get("cache-status")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    // The body is read to its end: a fill stores what its readers took whole.
    if resp.into_body().collect().await.is_err() {
        return Outcome::Failed("body".into());
    }
    if status.is_server_error() {
        return Outcome::Failed(format!("status {}", status.as_u16()));
    }
    classify(&cache_status)
}

/// What lacquerd's `Cache-Status` says happened.
fn classify(cache_status: &str) -> Outcome {
    let params: Vec<&str> = cache_status.split(';').map(str::trim).collect();
    let detail = params
        .iter()
        .find_map(|p| p.strip_prefix("detail="))
        .map(|d| d.trim_matches('"').to_owned());
    if params.contains(&"hit") {
        Outcome::Cached
    } else if params.contains(&"stored") {
        Outcome::Stored
    } else if let Some(p) = params.iter().find(|p| p.starts_with("fwd=")) {
        Outcome::NotStored(detail.unwrap_or_else(|| p.trim_start_matches("fwd=").to_owned()))
    } else {
        Outcome::NotStored("no Cache-Status".into())
    }
}

/// The summary as people read it.
pub fn render(s: &Summary) -> String {
    use std::fmt::Write;
    let mut out = format!(
        "{} URLs in {:.1} s: {} already cached, {} stored, {} not stored, {} failed\n",
        s.urls,
        s.seconds,
        s.cached,
        s.stored,
        s.not_stored.values().sum::<usize>(),
        s.failed.values().sum::<usize>()
    );
    for (why, n) in &s.not_stored {
        let _ = writeln!(out, "  not stored: {why}: {n}");
    }
    for (why, n) in &s.failed {
        let _ = writeln!(out, "  failed: {why}: {n}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_logs() {
        let list =
            "# the front\nhttp://shop.test/\nhttp://shop.test/a?b=1\n\n/c\nhttp://shop.test/\n";
        assert!(from_list(list, None).is_err(), "a path without --host");
        let urls = from_list(list, Some("shop.test")).unwrap();
        let targets: Vec<&str> = urls.iter().map(|u| u.target.as_str()).collect();
        assert_eq!(targets, ["/", "/a?b=1", "/c"]);
        let log = "203.0.113.7 - - [30/Nov/2026:07:36:14 +0000] \"GET http://www.example.com/a?b=1 HTTP/1.1\" 200 2048 \"-\" \"curl/8.0\" HIT 0.0001 0.0004 -\n\
                   203.0.113.7 - - [30/Nov/2026:07:36:15 +0000] \"POST http://www.example.com/cart HTTP/1.1\" 200 5 \"-\" \"curl/8.0\" PASS 0.01 0.01 -\n\
                   garbage\n\
                   203.0.113.8 - - [30/Nov/2026:07:36:16 +0000] \"GET /b HTTP/1.1\" 200 5 \"-\" \"x\"\n";
        let urls = from_log(log, Some("www.example.com")).unwrap();
        assert_eq!(
            urls,
            [
                Url::parse("http://www.example.com/a?b=1", None).unwrap(),
                Url::parse("http://www.example.com/b", None).unwrap(),
            ]
        );
    }

    #[test]
    fn cache_status_says_what_happened() {
        let table = [
            ("lacquer; hit; ttl=30", "cached"),
            ("lacquer; fwd=miss; stored", "stored"),
            ("lacquer; fwd=miss; stored; collapsed", "stored"),
            (
                "lacquer; fwd=miss; detail=\"private\"",
                "not stored: private",
            ),
            (
                "lacquer; fwd=bypass; detail=\"cookie\"",
                "not stored: cookie",
            ),
            ("lacquer; fwd=bypass", "not stored: bypass"),
        ];
        for (header, want) in table {
            let got = match classify(header) {
                Outcome::Cached => "cached".to_owned(),
                Outcome::Stored => "stored".to_owned(),
                Outcome::NotStored(why) => format!("not stored: {why}"),
                Outcome::Failed(why) => format!("failed: {why}"),
            };
            assert_eq!(got, want, "{header}");
        }
    }
}
