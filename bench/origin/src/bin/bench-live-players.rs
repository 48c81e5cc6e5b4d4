//! LL-HLS players for the live benchmark (bench/live.py), against a proxy in front of `bench-origin`'s
//! `/live/` stream:
//!
//! `bench-live-players --target HOST:PORT --origin HOST:PORT --players N --seconds S [--ramp-ms MS]`
//!
//! Each player joins at its own moment within the ramp (default 1000 ms): it loads the playlist, then, like
//! `tests/tests/live.rs`'s players, asks for the hinted part and the blocking reload that lists it at once,
//! before the part exists, and moves on to the next part when both came; until S seconds have passed. Each
//! player has two HTTP/1.1 keep-alive connections of its own (one for parts, one for the playlist), as a
//! player fetching both at once has. Every part's bytes are checked against the origin's pattern for that
//! part; an error (refused connection, timeout after 10 s, a status other than 200) makes the player join
//! again on new connections.
//!
//! Times count from the moment the origin made the part (its time zero, read from the origin's
//! `/live/__t0`, plus the part's end), on this machine's clock: part TTFB is when the response's head was
//! read, delivery when its last byte was. Parts made before a player joined (a joining player's playlist
//! may be up to a second old) are counted apart (`catching_up`), untimed; `ahead` counts the timed parts
//! asked for before they existed (the rest were asked for late: the player had fallen behind the live
//! edge). A line of JSON goes to stdout.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use bench_origin::live::{self, hinted, part_path, part_shift, reload_path};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{client::conn::http1, Request};
use hyper_util::rt::TokioIo;

const TIMEOUT: Duration = Duration::from_secs(10);
const USAGE: &str =
    "usage: bench-live-players --target HOST:PORT --origin HOST:PORT --players N --seconds S \
                     [--ramp-ms MS]";

fn unix_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

struct Got {
    status: u16,
    body: Bytes,
    /// Unix microseconds: the response's head read, its last byte read.
    head: i64,
    done: i64,
}

/// One keep-alive connection, opened again when the server closed it.
struct Conn {
    addr: SocketAddr,
    sender: Option<http1::SendRequest<Empty<Bytes>>>,
}

impl Conn {
    fn new(addr: SocketAddr) -> Conn {
        Conn { addr, sender: None }
    }

    async fn get(&mut self, path: &str) -> Result<Got, String> {
        let got = match tokio::time::timeout(TIMEOUT, self.send(path)).await {
            Ok(got) => got,
            Err(_) => Err(format!("{path}: no answer in {TIMEOUT:?}")),
        };
        if got.is_err() {
            self.sender = None;
        }
        got
    }

    async fn send(&mut self, path: &str) -> Result<Got, String> {
        if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
            let stream = tokio::net::TcpStream::connect(self.addr)
                .await
                .map_err(|e| format!("connect: {e}"))?;
            stream.set_nodelay(true).map_err(|e| e.to_string())?;
            let (sender, conn) = http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| format!("handshake: {e}"))?;
            tokio::spawn(conn);
            self.sender = Some(sender);
        }
        let sender = self.sender.as_mut().expect("connected above");
        sender.ready().await.map_err(|e| format!("{path}: {e}"))?;
        let req = Request::get(path)
            .header(hyper::header::HOST, self.addr.to_string())
            .body(Empty::new())
            .unwrap();
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("{path}: {e}"))?;
        let head = unix_us();
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("{path}: body: {e}"))?
            .to_bytes();
        Ok(Got {
            status,
            body,
            head,
            done: unix_us(),
        })
    }
}

/// The origin's clock and sizes, from `/live/__t0`.
struct Stream {
    t0_unix_us: i64,
    part_us: i64,
    pattern: Bytes,
    part_bytes: usize,
}

impl Stream {
    fn made_at(&self, k: u64) -> i64 {
        self.t0_unix_us + self.part_us * (k as i64 + 1)
    }

    fn is_part(&self, k: u64, body: &[u8]) -> bool {
        let shift = part_shift(k);
        body == &self.pattern[shift..shift + self.part_bytes]
    }
}

#[derive(Default)]
struct Tally {
    requests: u64,
    parts: u64,
    bytes: u64,
    errors: u64,
    /// Statuses other than 200, by status.
    statuses: BTreeMap<u16, u64>,
    wrong_bytes: u64,
    /// Reloads whose preload hint was not past the part they were asked for.
    wrong_playlists: u64,
    /// Parts fetched while joining, made before the player asked for its first playlist: not timed.
    catching_up: u64,
    /// Timed parts asked for before they existed: the player was at the live edge, not behind it.
    ahead: u64,
    /// Microseconds after the part was made.
    part_ttfb: Vec<i64>,
    part_delivery: Vec<i64>,
    reload_delivery: Vec<i64>,
    first_part: Option<u64>,
    last_part: Option<u64>,
    /// Errors' texts, the first few.
    samples: Vec<String>,
}

impl Tally {
    fn error(&mut self, what: String) {
        self.errors += 1;
        if self.samples.len() < 5 {
            self.samples.push(what);
        }
    }

    /// Counts one answer; true when it is a 200.
    fn answer(&mut self, got: &Got) -> bool {
        self.requests += 1;
        self.bytes += got.body.len() as u64;
        if got.status != 200 {
            *self.statuses.entry(got.status).or_default() += 1;
        }
        got.status == 200
    }

    fn merge(&mut self, other: Tally) {
        self.requests += other.requests;
        self.parts += other.parts;
        self.bytes += other.bytes;
        self.errors += other.errors;
        for (status, n) in other.statuses {
            *self.statuses.entry(status).or_default() += n;
        }
        self.wrong_bytes += other.wrong_bytes;
        self.wrong_playlists += other.wrong_playlists;
        self.catching_up += other.catching_up;
        self.ahead += other.ahead;
        self.part_ttfb.extend(other.part_ttfb);
        self.part_delivery.extend(other.part_delivery);
        self.reload_delivery.extend(other.reload_delivery);
        self.first_part = match (self.first_part, other.first_part) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last_part = self.last_part.max(other.last_part);
        for s in other.samples {
            if self.samples.len() < 5 {
                self.samples.push(s);
            }
        }
    }
}

async fn player(addr: SocketAddr, stream: &Stream, start: Instant, until: Instant) -> Tally {
    tokio::time::sleep_until(start.into()).await;
    let mut tally = Tally::default();
    let (mut parts, mut playlists) = (Conn::new(addr), Conn::new(addr));
    while Instant::now() < until {
        let joined = unix_us();
        let mut next = match playlists.get(live::PLAYLIST).await {
            Ok(got) if tally.answer(&got) => match hinted(&got.body) {
                Some(k) => k,
                None => {
                    tally.wrong_playlists += 1;
                    tally.error("a playlist without a preload hint".into());
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            Ok(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(e) => {
                tally.error(e);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        while Instant::now() < until {
            let ahead = unix_us() < stream.made_at(next);
            let (part_at, reload_at) = (part_path(next), reload_path(next));
            let (part, reload) = tokio::join!(parts.get(&part_at), playlists.get(&reload_at));
            let made = stream.made_at(next);
            let (part, reload) = match (part, reload) {
                (Ok(part), Ok(reload)) => (part, reload),
                (part, reload) => {
                    for e in [part.err(), reload.err()].into_iter().flatten() {
                        tally.error(e);
                    }
                    break;
                }
            };
            let (part_ok, reload_ok) = (tally.answer(&part), tally.answer(&reload));
            if !(part_ok && reload_ok) {
                break;
            }
            if stream.is_part(next, &part.body) {
                tally.parts += 1;
                tally.first_part.get_or_insert(next);
                tally.last_part = Some(next);
                // A joining player's playlist may be up to its max-age old: the parts that existed before
                // it joined have no time to count from. Every later one is timed, also when it asks late.
                if made > joined {
                    tally.ahead += u64::from(ahead);
                    tally.part_ttfb.push(part.head - made);
                    tally.part_delivery.push(part.done - made);
                    tally.reload_delivery.push(reload.done - made);
                } else {
                    tally.catching_up += 1;
                }
            } else {
                tally.wrong_bytes += 1;
            }
            if hinted(&reload.body).is_none_or(|h| h <= next) {
                tally.wrong_playlists += 1;
            }
            next += 1;
        }
    }
    tally
}

fn flag<T: std::str::FromStr>(args: &[String], name: &str) -> Option<T> {
    let at = args.iter().position(|a| a == name)?;
    Some(
        args.get(at + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name}: a value expected\n{USAGE}")),
    )
}

/// `[p50, p99, max]` in milliseconds.
fn percentiles(mut us: Vec<i64>) -> serde_json::Value {
    if us.is_empty() {
        return serde_json::Value::Null;
    }
    us.sort_unstable();
    let at = |q: usize| us[(us.len() - 1) * q / 100] as f64 / 1000.0;
    serde_json::json!({"p50": at(50), "p99": at(99), "max": at(100)})
}

async fn clock(origin: SocketAddr) -> Stream {
    let got = Conn::new(origin)
        .get(live::CLOCK)
        .await
        .unwrap_or_else(|e| panic!("the origin's clock: {e}"));
    let clock: serde_json::Value = serde_json::from_slice(&got.body).unwrap_or_else(|e| {
        panic!(
            "{} from the origin's {}: {e} (a bench-origin without the live route?)",
            got.status,
            live::CLOCK
        )
    });
    let field = |name: &str| {
        clock[name]
            .as_i64()
            .unwrap_or_else(|| panic!("{name} missing in {clock}"))
    };
    let part_bytes = field("part_bytes") as usize;
    Stream {
        t0_unix_us: field("t0_unix_us"),
        part_us: field("part_us"),
        pattern: live::pattern(part_bytes),
        part_bytes,
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let target: SocketAddr = flag(&args, "--target").expect(USAGE);
    let origin: SocketAddr = flag(&args, "--origin").expect(USAGE);
    let players: u32 = flag(&args, "--players").expect(USAGE);
    let seconds: f64 = flag(&args, "--seconds").expect(USAGE);
    let ramp = Duration::from_millis(flag(&args, "--ramp-ms").unwrap_or(1000));
    let stream = Arc::new(clock(origin).await);
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(seconds);
    let handles: Vec<_> = (0..players)
        .map(|i| {
            let start = started + ramp * i / players.max(1);
            let stream = stream.clone();
            tokio::spawn(async move { player(target, &stream, start, until).await })
        })
        .collect();
    let mut tally = Tally::default();
    for h in handles {
        tally.merge(h.await.expect("a player"));
    }
    let took = started.elapsed().as_secs_f64();
    let out = serde_json::json!({
        "players": players,
        "seconds": took,
        "requests": tally.requests,
        "parts": tally.parts,
        "catching_up": tally.catching_up,
        "timed": tally.part_ttfb.len(),
        "ahead": tally.ahead,
        "bytes": tally.bytes,
        "errors": tally.errors,
        "statuses": tally.statuses.iter().map(|(s, n)| (s.to_string(), *n)).collect::<BTreeMap<_, _>>(),
        "wrong_bytes": tally.wrong_bytes,
        "wrong_playlists": tally.wrong_playlists,
        "first_part": tally.first_part,
        "last_part": tally.last_part,
        "part_ttfb_ms": percentiles(tally.part_ttfb),
        "part_delivery_ms": percentiles(tally.part_delivery),
        "reload_delivery_ms": percentiles(tally.reload_delivery),
        "error_samples": tally.samples,
    });
    println!("{out}");
}
