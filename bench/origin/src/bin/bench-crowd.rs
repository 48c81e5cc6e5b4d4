//! A crowd of keep-alive connections and an accept storm, against one proxy (bench/crowd.py):
//!
//! `bench-crowd --target HOST:PORT --path PATH --idle N --active M --rate R --seconds S
//!  [--storm-rate K --storm-seconds T] [--sources 127.0.0.2,...]`
//!
//! 1. Opens `idle` connections, each of which GETs `path` once and then stays open saying nothing (a player
//!    between playlist reloads, a browser's spare connection), and `active` connections.
//! 2. For `seconds`, the `active` connections GET `path` at `rate` requests per second in all, each at its
//!    own steady pace (a GET every `active / rate` seconds, the first at a random moment of that interval),
//!    timing each from its write to the response's head (TTFB) and to its last byte.
//! 3. From the middle of that window, `storm-rate` new connections a second for `storm-seconds`: each
//!    connects (timed: the accept latency as a client sees it, SYN to the handshake's end), GETs `path`
//!    once (timed from the connect's start to the head) and closes.
//!
//! Connections bind to the `--sources` addresses in turn (default 127.0.0.2 to 127.0.0.17): one source
//! address has fewer than 30 000 ephemeral ports, and a proxy's per-address connection limit (lacquerd's
//! `max_connections_per_ip`, 4096 by default) is meant for one client, not for a crowd. The idle and active
//! connections are opened at most 5 000 a second, so the listen backlog (not the proxy) is never the limit
//! there. An error or a status other than 200 is counted, never retried. A line of JSON goes to stdout:
//! counts, errors, and p50/p99/max of each timing, in milliseconds.

use std::{
    net::{IpAddr, SocketAddr},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{client::conn::http1, Request};
use hyper_util::rt::TokioIo;
use tokio::net::TcpSocket;

const USAGE: &str =
    "usage: bench-crowd --target HOST:PORT --path PATH --idle N --active M --rate R \
                     --seconds S [--storm-rate K --storm-seconds T] [--sources IP,IP,...]";
const TIMEOUT: Duration = Duration::from_secs(10);
const OPEN_PER_SECOND: u64 = 5_000;

struct Args {
    target: SocketAddr,
    path: String,
    idle: u64,
    active: u64,
    rate: f64,
    seconds: f64,
    storm_rate: u64,
    storm_seconds: u64,
    sources: Vec<IpAddr>,
}

fn args() -> Args {
    let mut a = Args {
        target: "127.0.0.1:80".parse().unwrap(),
        path: "/".into(),
        idle: 0,
        active: 0,
        rate: 0.0,
        seconds: 10.0,
        storm_rate: 0,
        storm_seconds: 0,
        sources: (2..=17).map(|i| IpAddr::from([127, 0, 0, i])).collect(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{USAGE}"));
        match flag.as_str() {
            "--target" => a.target = value.parse().expect("--target"),
            "--path" => a.path = value,
            "--idle" => a.idle = value.parse().expect("--idle"),
            "--active" => a.active = value.parse().expect("--active"),
            "--rate" => a.rate = value.parse().expect("--rate"),
            "--seconds" => a.seconds = value.parse().expect("--seconds"),
            "--storm-rate" => a.storm_rate = value.parse().expect("--storm-rate"),
            "--storm-seconds" => a.storm_seconds = value.parse().expect("--storm-seconds"),
            "--sources" => {
                a.sources = value
                    .split(',')
                    .map(|s| s.parse().expect("--sources"))
                    .collect()
            }
            _ => panic!("{USAGE}"),
        }
    }
    assert!(!a.sources.is_empty(), "{USAGE}");
    a
}

/// Timings in microseconds, and the failures.
#[derive(Default)]
struct Tally {
    samples: Mutex<Vec<u64>>,
    errors: AtomicU64,
}

impl Tally {
    fn record(&self, took: Duration) {
        self.samples.lock().unwrap().push(took.as_micros() as u64);
    }

    fn fail(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    fn json(&self) -> serde_json::Value {
        let mut s = self.samples.lock().unwrap().clone();
        s.sort_unstable();
        let at = |q: f64| {
            s.get(((s.len() as f64 * q) as usize).min(s.len().saturating_sub(1)))
                .map_or(0.0, |us| *us as f64 / 1000.0)
        };
        serde_json::json!({
            "count": s.len(),
            "errors": self.errors.load(Ordering::Relaxed),
            "p50_ms": at(0.5),
            "p99_ms": at(0.99),
            "max_ms": s.last().map_or(0.0, |us| *us as f64 / 1000.0),
        })
    }
}

struct Crowd {
    args: Args,
    next_source: AtomicU64,
}

impl Crowd {
    async fn connect(&self) -> std::io::Result<tokio::net::TcpStream> {
        let i = self.next_source.fetch_add(1, Ordering::Relaxed) as usize % self.args.sources.len();
        let socket = TcpSocket::new_v4()?;
        socket.bind(SocketAddr::new(self.args.sources[i], 0))?;
        socket.connect(self.args.target).await
    }

    /// A new connection, with its handshake; the connection task runs until the sender is dropped.
    async fn open(&self) -> Option<http1::SendRequest<Empty<Bytes>>> {
        let stream = tokio::time::timeout(TIMEOUT, self.connect())
            .await
            .ok()?
            .ok()?;
        stream.set_nodelay(true).ok()?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream)).await.ok()?;
        tokio::spawn(conn);
        Some(sender)
    }

    /// One GET; `Some((head, end))` elapsed since `start` for a whole 200.
    async fn get(
        &self,
        sender: &mut http1::SendRequest<Empty<Bytes>>,
        start: Instant,
    ) -> Option<(Duration, Duration)> {
        let req = Request::get(self.args.path.as_str())
            .header("host", self.args.target.to_string())
            .body(Empty::new())
            .ok()?;
        let exchange = async {
            sender.ready().await.ok()?;
            let res = sender.send_request(req).await.ok()?;
            let head = start.elapsed();
            let ok = res.status() == 200;
            res.into_body().collect().await.ok()?;
            ok.then(|| (head, start.elapsed()))
        };
        tokio::time::timeout(TIMEOUT, exchange).await.ok()?
    }
}

#[tokio::main]
async fn main() {
    let crowd = Arc::new(Crowd {
        args: args(),
        next_source: AtomicU64::new(0),
    });
    let a = &crowd.args;
    let (ttfb, whole, storm_connect, storm_ttfb, opening) = (
        Arc::new(Tally::default()),
        Arc::new(Tally::default()),
        Arc::new(Tally::default()),
        Arc::new(Tally::default()),
        Arc::new(Tally::default()),
    );

    // 1. The crowd, opened at a bounded pace; each connection is served once.
    let total = a.idle + a.active;
    let mut opened = Vec::with_capacity(total as usize);
    let started = Instant::now();
    for i in 0..total {
        let due = started + Duration::from_secs_f64(i as f64 / OPEN_PER_SECOND as f64);
        tokio::time::sleep_until(due.into()).await;
        let (crowd, opening) = (crowd.clone(), opening.clone());
        opened.push(tokio::spawn(async move {
            let t = Instant::now();
            let mut sender = crowd.open().await?;
            match crowd.get(&mut sender, t).await {
                Some((head, _)) => opening.record(head),
                None => {
                    opening.fail();
                    return None;
                }
            }
            Some(sender)
        }));
    }
    let mut senders = Vec::with_capacity(total as usize);
    for task in opened {
        match task.await.unwrap() {
            Some(s) => senders.push(s),
            None => opening.fail(),
        }
    }
    let open_s = started.elapsed().as_secs_f64();
    let active: Vec<_> = senders.split_off(senders.len().saturating_sub(a.active as usize));
    let idle = senders;

    // 2. The active connections' steady requests, and 3. the storm from the window's middle.
    let window = Duration::from_secs_f64(a.seconds);
    let begin = Instant::now();
    let interval = Duration::from_secs_f64(a.active as f64 / a.rate.max(0.001));
    let mut tasks = Vec::new();
    for (i, mut sender) in active.into_iter().enumerate() {
        let (crowd, ttfb, whole) = (crowd.clone(), ttfb.clone(), whole.clone());
        let offset = interval.mul_f64((i as f64 * 0.618_034) % 1.0);
        tasks.push(tokio::spawn(async move {
            let mut due = begin + offset;
            while due < begin + window {
                tokio::time::sleep_until(due.into()).await;
                let t = Instant::now();
                match crowd.get(&mut sender, t).await {
                    Some((head, end)) => {
                        ttfb.record(head);
                        whole.record(end);
                    }
                    None => {
                        ttfb.fail();
                        return;
                    }
                }
                due += interval;
            }
        }));
    }
    let storm = {
        let (crowd, connect_t, ttfb_t) = (crowd.clone(), storm_connect.clone(), storm_ttfb.clone());
        let (rate, secs) = (a.storm_rate, a.storm_seconds);
        tokio::spawn(async move {
            if rate == 0 {
                return;
            }
            let from = begin + window.saturating_sub(Duration::from_secs(secs)) / 2;
            let mut joins = Vec::new();
            for i in 0..rate * secs {
                let due = from + Duration::from_secs_f64(i as f64 / rate as f64);
                tokio::time::sleep_until(due.into()).await;
                let (crowd, connect_t, ttfb_t) = (crowd.clone(), connect_t.clone(), ttfb_t.clone());
                joins.push(tokio::spawn(async move {
                    let t = Instant::now();
                    let Ok(Ok(stream)) = tokio::time::timeout(TIMEOUT, crowd.connect()).await
                    else {
                        connect_t.fail();
                        return;
                    };
                    connect_t.record(t.elapsed());
                    let _ = stream.set_nodelay(true);
                    let Ok((mut sender, conn)) = http1::handshake(TokioIo::new(stream)).await
                    else {
                        ttfb_t.fail();
                        return;
                    };
                    tokio::spawn(conn);
                    match crowd.get(&mut sender, t).await {
                        Some((head, _)) => ttfb_t.record(head),
                        None => ttfb_t.fail(),
                    }
                }));
            }
            for j in joins {
                let _ = j.await;
            }
        })
    };
    for t in tasks {
        let _ = t.await;
    }
    let _ = storm.await;
    let idle_left = idle.iter().filter(|s| !s.is_closed()).count();
    println!(
        "{}",
        serde_json::json!({
            "opened": total,
            "open_seconds": open_s,
            "opening": opening.json(),
            "idle_open_at_end": idle_left,
            "idle": idle.len(),
            "ttfb": ttfb.json(),
            "whole": whole.json(),
            "storm_connect": storm_connect.json(),
            "storm_ttfb": storm_ttfb.json(),
        })
    );
}
