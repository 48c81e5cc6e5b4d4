//! Benchmark origin. `bench-origin PORT [CONTROL_PORT]` serves:
//! - `/obj/2k`, `/obj/4m`: 2 KiB and 4 MiB bodies, cacheable for an hour;
//! - `/burst/ID`: 4 MiB after a 300 ms delay (a cold object per ID);
//! - `/flap/ID`: 2 KiB, fresh for one second (for the origin-failure benchmark);
//! - `/small/...`: 1 KiB, cacheable for an hour, with `x-url: PATH` (so Varnish bans on `obj.http.x-url` can
//!   be walked by its lurker);
//! - `/stream/CACHE_CONTROL/LENGTH[/ANYTHING]`: a LENGTH-byte body streamed in 64 KiB frames (never held in
//!   memory whole) with `Cache-Control: CACHE_CONTROL`, for the memory benchmark's multi-GiB responses;
//! - `/sized/BYTES/...`: BYTES (at most 4 MiB), cacheable for an hour, with `x-url` (the soak's churning
//!   URL set);
//! - `/hls/...`: a 2 KiB HLS media playlist (`application/vnd.apple.mpegurl`) and `/page/...`: a 200 KiB HTML
//!   page (`text/html`), both text that compresses as real ones do, cacheable for an hour;
//! - `/new/...`: 1 KiB, cacheable for an hour, counted as `/new` whatever follows (every request of the miss
//!   benchmark is a new URL: a count per URL would grow without bound);
//! - `/range/LENGTH/ANYTHING`: a LENGTH-byte object (any size: streamed in 64 KiB frames, never held whole)
//!   served as a file server does, for the slicing benchmark: cacheable for an hour, a strong `ETag` derived
//!   from the path, `Last-Modified`, `Accept-Ranges: bytes`; one range (`bytes=a-b`, `a-`, `-n`) gets a 206
//!   with `Content-Range`, one that starts past the end a 416, anything else (several ranges, bad syntax, an
//!   `If-Range` that does not match) the whole body;
//! - `/live/...`: a live Low-Latency HLS stream made from the origin's start on (`bench_origin::live`): a new
//!   part every 200 ms (`BENCH_LIVE_PART_MS`) of 25 600 bytes (`BENCH_LIVE_PART_BYTES`), four to a segment,
//!   `/live/sN.pK.m4s` (`max-age=60`); the media playlist `/live/index.m3u8` (`max-age=1`) lists the parts
//!   of the last 16 segments (`BENCH_LIVE_WINDOW`) and a preload hint for the next part. Blocking reloads
//!   (`_HLS_msn`, `_HLS_part`) and part requests are held until that part exists, or refused (400) when it
//!   is more than 3 s ahead. `/live/__t0` tells the players the time zero (`t0_unix_us`), the sizes and
//!   how many parts exist (not counted). A reload is counted by the part it waits for, as
//!   `/live/index.m3u8?_HLS_msn=N&_HLS_part=P` (five keys a second, as for parts);
//! - `/vod/ID/...`: a video-on-demand HLS stream per ID, for the prefetch benchmark: the media playlist
//!   `/vod/ID/index.m3u8` lists `seg0.ts` to `seg{N-1}.ts` (relative references, `#EXTINF:2.0`,
//!   `#EXT-X-ENDLIST`), N from `BENCH_VOD_SEGMENTS` (20); each segment is `BENCH_VOD_SEGMENT_BYTES` (1 MiB),
//!   streamed in 64 KiB frames after `BENCH_VOD_DELAY_MS` (300 ms: a slow origin, the case prefetch is
//!   for). Both cacheable for an hour; any other name under an ID is a 404;
//! - `/__count/PATH[?QUERY]`: how many times PATH was requested, as a plain number; `/__total`: all requests;
//!   `/__bytes/PREFIX`: body bytes sent (handed to the connection) for every path that starts with
//!   `/PREFIX`, `/__bytes` alone for all; `/__connections`: connections accepted on PORT.
//!
//! PORT speaks HTTP/1.1 and HTTP/2 with prior knowledge (h2c) alike, told apart by the connection's first
//! bytes, so a proxy's `http1` and `h2c` backends can be compared against the same origin.
//!
//! Every body follows one pattern: byte `i` is `i % 251`, so a client can check any range of it. A live part
//! and a VOD segment start further on in it, each at its own place (a VOD segment at the FNV-1a hash of its
//! path, mod 251), so that one served for another is caught.
//!
//! On CONTROL_PORT, `GET /mode/ok|503|reset|refuse` switches how the main port behaves: normally; answering
//! 503 to everything; resetting every connection and request; or not listening at all.

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::{
        atomic::{AtomicU64, AtomicU8, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::{
    header::{IF_RANGE, RANGE},
    server::conn::http1,
    service::service_fn,
    Request, Response, StatusCode,
};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};

use bench_origin::{
    env_or, fnv1a,
    live::{self, Live},
};

const OK: u8 = 0;
const UNAVAILABLE: u8 = 1;
const RESET: u8 = 2;
const REFUSE: u8 = 3;

fn body(len: usize) -> Bytes {
    (0..len).map(|i| (i % 251) as u8).collect::<Vec<_>>().into()
}

/// A live HLS media playlist of exactly `len` bytes: six-second segments with long CDN paths, padded with a
/// comment line (players skip lines that start with `#` but not `#EXT`).
fn manifest(len: usize) -> Bytes {
    let mut out = String::from(
        "#EXTM3U\n#EXT-X-VERSION:6\n#EXT-X-TARGETDURATION:6\n#EXT-X-MEDIA-SEQUENCE:184020\n\
         #EXT-X-DISCONTINUITY-SEQUENCE:12\n#EXT-X-INDEPENDENT-SEGMENTS\n",
    );
    let mut seq = 184_020u32;
    loop {
        let entry = format!(
            "#EXT-X-PROGRAM-DATE-TIME:2026-12-01T16:{:02}:{:02}.{:03}Z\n#EXTINF:6.006,\n\
             /live/channel-7/720p/seg-{seq}.ts\n",
            (seq / 10) % 60,
            (seq * 6) % 60,
            (seq * 6) % 1000,
        );
        if out.len() + entry.len() + 8 > len {
            break;
        }
        out.push_str(&entry);
        seq += 1;
    }
    let pad = len - out.len() - 2;
    out.push('#');
    out.extend(std::iter::repeat_n(' ', pad));
    out.push('\n');
    debug_assert_eq!(out.len(), len);
    Bytes::from(out)
}

/// An HTML news page of exactly `len` bytes, the same on every run: articles of pseudo-English words drawn
/// with a skewed frequency (so gzip shrinks it about as much as real HTML), with links and images.
fn page(len: usize) -> Bytes {
    const WORDS: &[&str] = &[
        "the",
        "of",
        "and",
        "to",
        "in",
        "a",
        "is",
        "that",
        "for",
        "it",
        "as",
        "was",
        "with",
        "be",
        "by",
        "on",
        "not",
        "he",
        "this",
        "are",
        "or",
        "his",
        "from",
        "at",
        "which",
        "but",
        "have",
        "an",
        "had",
        "they",
        "you",
        "were",
        "their",
        "one",
        "all",
        "we",
        "can",
        "her",
        "has",
        "there",
        "been",
        "if",
        "more",
        "when",
        "will",
        "would",
        "who",
        "so",
        "no",
        "city",
        "council",
        "election",
        "market",
        "weather",
        "football",
        "season",
        "report",
        "minister",
        "police",
        "court",
        "health",
        "energy",
        "climate",
        "research",
        "students",
        "university",
        "government",
        "business",
        "president",
        "country",
        "children",
        "service",
        "family",
        "development",
        "national",
        "public",
        "system",
        "program",
        "water",
        "company",
        "million",
        "percent",
        "officials",
        "announced",
        "according",
        "statement",
        "spokesperson",
    ];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let head = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
                <title>Front page</title>\n<link rel=\"stylesheet\" href=\"/static/site.css\">\n</head>\n\
                <body>\n<main id=\"content\">\n";
    let tail = "</main>\n</body>\n</html>\n";
    let mut out = String::from(head);
    let mut story = 0;
    loop {
        story += 1;
        let mut block = format!(
            "<article class=\"story\" id=\"story-{story}\">\n<h2 class=\"story__title\"><a href=\"/news/2026/11/\
             {:02}/story-{}\">",
            next(30) + 1,
            next(90_000) + 10_000
        );
        for paragraph in 0..3 {
            if paragraph > 0 {
                block.push_str("<p class=\"story__text\">");
            }
            for w in 0..(12 + next(40)) {
                // Skewed: low indices (the common words) come up far more often.
                let bound = next(WORDS.len()) + 1;
                let word = WORDS[next(bound)];
                if w > 0 {
                    block.push(' ');
                }
                block.push_str(word);
            }
            block.push_str(if paragraph == 0 {
                "</a></h2>\n"
            } else {
                ".</p>\n"
            });
        }
        block.push_str(&format!(
            "<figure><img class=\"story__image\" src=\"/img/{}-960.jpg\" width=\"960\" height=\"540\" \
             loading=\"lazy\" alt=\"\"></figure>\n</article>\n",
            next(900_000) + 100_000
        ));
        if out.len() + block.len() + tail.len() + 16 > len {
            break;
        }
        out.push_str(&block);
    }
    let pad = len - out.len() - tail.len() - "<!--  -->\n".len();
    out.push_str("<!-- ");
    out.extend(std::iter::repeat_n('.', pad));
    out.push_str(" -->\n");
    out.push_str(tail);
    debug_assert_eq!(out.len(), len);
    Bytes::from(out)
}

struct Origin {
    /// Connections accepted on the main port.
    connections: AtomicU64,
    manifest: Bytes,
    page: Bytes,
    tiny: Bytes,
    small: Bytes,
    large: Bytes,
    counts: Mutex<HashMap<String, Counted>>,
    mode: AtomicU8,
    live: Live,
    vod: Vod,
}

/// `/vod/`'s streams: every ID the same shape, so that a benchmark takes a new ID wherever it needs a stream no
/// cache has seen.
struct Vod {
    segments: u64,
    segment_bytes: u64,
    delay: Duration,
}

impl Vod {
    fn from_env() -> Vod {
        Vod {
            segments: env_or("BENCH_VOD_SEGMENTS", 20),
            segment_bytes: env_or("BENCH_VOD_SEGMENT_BYTES", 1 << 20),
            delay: Duration::from_millis(env_or("BENCH_VOD_DELAY_MS", 300)),
        }
    }

    fn playlist(&self) -> Bytes {
        let mut text = String::from(
            "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:2\n#EXT-X-MEDIA-SEQUENCE:0\n\
             #EXT-X-PLAYLIST-TYPE:VOD\n",
        );
        for k in 0..self.segments {
            text.push_str(&format!("#EXTINF:2.0,\nseg{k}.ts\n"));
        }
        text.push_str("#EXT-X-ENDLIST\n");
        Bytes::from(text)
    }

    /// `/vod/ID/NAME`: see the top of the file.
    async fn respond(&self, path: &str) -> Reply {
        let name = path
            .strip_prefix("/vod/")
            .and_then(|rest| rest.split_once('/'))
            .map_or("", |(_, name)| name);
        let resp = Response::builder().header("cache-control", "max-age=3600");
        if name == "index.m3u8" {
            return resp
                .header("content-type", "application/vnd.apple.mpegurl")
                .body(full(self.playlist()))
                .unwrap();
        }
        let listed = name
            .strip_prefix("seg")
            .and_then(|n| n.strip_suffix(".ts"))
            .and_then(|k| k.parse::<u64>().ok())
            .is_some_and(|k| k < self.segments);
        if !listed {
            return Response::builder()
                .status(StatusCode::NOT_FOUND)
                .body(full(Bytes::new()))
                .unwrap();
        }
        tokio::time::sleep(self.delay).await;
        resp.header("content-type", "video/mp2t")
            .header("content-length", self.segment_bytes)
            .header("etag", etag(path))
            .body(streamed(fnv1a(path) % 251, self.segment_bytes))
            .unwrap()
    }
}

#[derive(Default)]
struct Counted {
    requests: u64,
    /// Shared with the bodies being sent, which add each frame as hyper takes it: a client (or proxy) that
    /// hangs up early is charged only for what was sent.
    bytes: Arc<AtomicU64>,
}

/// `/range/` objects never change: one date for all.
const LAST_MODIFIED: &str = "Mon, 01 Dec 2025 00:00:00 GMT";

/// What a `Range` header asks of a `len`-byte body.
#[derive(Debug, PartialEq)]
enum Asked {
    Whole,
    /// First and last byte, inclusive.
    Part(u64, u64),
    Unsatisfiable,
}

/// Reads `Range` as common file servers do: one range `a-b`, `a-` or `-n`, the end clamped to the body's;
/// several ranges or bad syntax are ignored (a 200 is a valid answer to either, RFC 9110 §14.2).
fn asked(range: Option<&str>, len: u64) -> Asked {
    let Some(spec) = range.and_then(|r| r.trim().strip_prefix("bytes=")) else {
        return Asked::Whole;
    };
    let Some((first, last)) = spec.split_once('-') else {
        return Asked::Whole;
    };
    let (first, last) = (first.trim(), last.trim());
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let part = |from: u64, to: u64| {
        if from < len {
            Asked::Part(from, to.min(len - 1))
        } else {
            Asked::Unsatisfiable
        }
    };
    match (first.parse::<u64>(), last.parse::<u64>()) {
        (Ok(from), Ok(to)) if digits(first) && digits(last) && from <= to => part(from, to),
        (Ok(from), Err(_)) if digits(first) && last.is_empty() => part(from, u64::MAX),
        (Err(_), Ok(n)) if first.is_empty() && digits(last) => {
            if n == 0 || len == 0 {
                Asked::Unsatisfiable
            } else {
                Asked::Part(len - n.min(len), len - 1)
            }
        }
        _ => Asked::Whole,
    }
}

/// A strong validator that stays the same across runs and builds.
fn etag(path: &str) -> String {
    format!("\"{:016x}\"", fnv1a(path))
}

type Reply = Response<BoxBody<Bytes, Infallible>>;

fn full(data: Bytes) -> BoxBody<Bytes, Infallible> {
    Full::new(data).boxed()
}

/// `len` bytes of [`body`]'s pattern from byte `start` on, in 64 KiB frames cut from one small buffer.
fn streamed(start: u64, len: u64) -> BoxBody<Bytes, Infallible> {
    const FRAME: u64 = 64 * 1024;
    let base = body(FRAME as usize + 251);
    let frames = futures_util::stream::iter((0..len).step_by(FRAME as usize).map(move |at| {
        let from = ((start + at) % 251) as usize;
        let n = (len - at).min(FRAME) as usize;
        Ok(hyper::body::Frame::data(base.slice(from..from + n)))
    }));
    StreamBody::new(frames).boxed()
}

/// `/range/LENGTH/...`: see the top of the file.
fn ranged(req: &Request<hyper::body::Incoming>, path: &str, len: u64) -> Reply {
    let etag = etag(path);
    let headers = req.headers();
    let current = headers
        .get(IF_RANGE)
        .is_none_or(|v| v.as_bytes() == etag.as_bytes() || v == LAST_MODIFIED);
    let asked = if current {
        asked(headers.get(RANGE).and_then(|v| v.to_str().ok()), len)
    } else {
        Asked::Whole
    };
    let resp = Response::builder()
        .header("cache-control", "max-age=3600")
        .header("content-type", "application/octet-stream")
        .header("etag", etag)
        .header("last-modified", LAST_MODIFIED)
        .header("accept-ranges", "bytes");
    match asked {
        Asked::Whole => resp.header("content-length", len).body(streamed(0, len)),
        Asked::Part(first, last) => resp
            .status(StatusCode::PARTIAL_CONTENT)
            .header("content-range", format!("bytes {first}-{last}/{len}"))
            .header("content-length", last - first + 1)
            .body(streamed(first, last - first + 1)),
        Asked::Unsatisfiable => resp
            .status(StatusCode::RANGE_NOT_SATISFIABLE)
            .header("content-range", format!("bytes */{len}"))
            .body(full(Bytes::new())),
    }
    .unwrap()
}

async fn serve(
    origin: Arc<Origin>,
    req: Request<hyper::body::Incoming>,
) -> Result<Reply, std::io::Error> {
    let path = req.uri().path().to_owned();
    if path == "/__connections" {
        let n = origin.connections.load(Ordering::Relaxed);
        return Ok(Response::new(full(Bytes::from(n.to_string()))));
    }
    if path == "/__total" {
        let n: u64 = origin
            .counts
            .lock()
            .unwrap()
            .values()
            .map(|c| c.requests)
            .sum();
        return Ok(Response::new(full(Bytes::from(n.to_string()))));
    }
    if path == live::CLOCK {
        return Ok(Response::new(full(Bytes::from(origin.live.clock()))));
    }
    let path_and_query = req.uri().path_and_query().map_or("", |p| p.as_str());
    if let Some(counted) = path_and_query.strip_prefix("/__count") {
        let n = origin
            .counts
            .lock()
            .unwrap()
            .get(counted)
            .map_or(0, |c| c.requests);
        return Ok(Response::new(full(Bytes::from(n.to_string()))));
    }
    if let Some(prefix) = path.strip_prefix("/__bytes") {
        let n: u64 = origin
            .counts
            .lock()
            .unwrap()
            .iter()
            .filter(|(path, _)| path.starts_with(prefix))
            .map(|(_, c)| c.bytes.load(Ordering::Relaxed))
            .sum();
        return Ok(Response::new(full(Bytes::from(n.to_string()))));
    }
    match origin.mode.load(Ordering::SeqCst) {
        // An error from the service makes hyper drop the connection without an answer; connections kept
        // alive from before a refusal are dropped the same way.
        RESET | REFUSE => return Err(std::io::Error::other("scripted failure")),
        UNAVAILABLE => {
            let mut resp = Response::new(full(Bytes::from_static(b"origin down\n")));
            *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            return Ok(resp);
        }
        _ => {}
    }
    let counted = if path.starts_with("/new/") {
        "/new".to_owned()
    } else if path.starts_with("/live/") {
        live::counted(&path, req.uri().query())
    } else {
        path.clone()
    };
    let sent = {
        let mut counts = origin.counts.lock().unwrap();
        let entry = counts.entry(counted).or_default();
        entry.requests += 1;
        entry.bytes.clone()
    };
    let resp = respond(&origin, &req, path).await;
    Ok(resp.map(|body| {
        body.map_frame(move |frame| {
            if let Some(data) = frame.data_ref() {
                sent.fetch_add(data.len() as u64, Ordering::Relaxed);
            }
            frame
        })
        .boxed()
    }))
}

async fn respond(origin: &Origin, req: &Request<hyper::body::Incoming>, path: String) -> Reply {
    if path.starts_with("/live/") {
        return origin
            .live
            .respond(&path, req.uri().query())
            .await
            .map(full);
    }
    if path.starts_with("/vod/") {
        return origin.vod.respond(&path).await;
    }
    if let Some(spec) = path.strip_prefix("/range/") {
        let len = spec
            .split('/')
            .next()
            .and_then(|l| l.parse::<u64>().ok())
            .unwrap_or(0);
        return ranged(req, &path, len);
    }
    if let Some(spec) = path.strip_prefix("/stream/") {
        let mut fields = spec.split('/');
        let cache_control = fields.next().unwrap_or("no-store").to_owned();
        let len = fields
            .next()
            .and_then(|l| l.parse::<u64>().ok())
            .unwrap_or(0);
        return Response::builder()
            .header("cache-control", cache_control)
            .header("content-type", "application/octet-stream")
            .header("content-length", len)
            .body(streamed(0, len))
            .unwrap();
    }
    let text = if path == "/esi/page" {
        Some((esi_page(), "text/html; charset=utf-8"))
    } else if let Some(n) = path.strip_prefix("/esi/frag/") {
        Some((esi_fragment(n), "text/html; charset=utf-8"))
    } else if path.starts_with("/hls/") {
        Some((origin.manifest.clone(), "application/vnd.apple.mpegurl"))
    } else if path.starts_with("/page/") {
        Some((origin.page.clone(), "text/html; charset=utf-8"))
    } else {
        None
    };
    if let Some((data, content_type)) = text {
        return Response::builder()
            .header("cache-control", "max-age=3600")
            .header("content-type", content_type)
            .header("etag", format!("\"t{}\"", data.len()))
            .body(full(data))
            .unwrap();
    }
    let (data, cache_control) = match path.as_str() {
        "/obj/2k" => (origin.small.clone(), "max-age=3600"),
        p if p.starts_with("/new/") => (origin.tiny.clone(), "max-age=3600"),
        p if p.starts_with("/flap/") => (origin.small.clone(), "max-age=1"),
        p if p.starts_with("/small/") => (origin.tiny.clone(), "max-age=3600"),
        p if p.starts_with("/sized/") => {
            let len = p["/sized/".len()..]
                .split('/')
                .next()
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or(0)
                .min(origin.large.len());
            (origin.large.slice(..len), "max-age=3600")
        }
        p if p.starts_with("/burst/") => {
            tokio::time::sleep(Duration::from_millis(300)).await;
            (origin.large.clone(), "max-age=3600")
        }
        _ => (origin.large.clone(), "max-age=3600"),
    };
    Response::builder()
        .header("cache-control", cache_control)
        .header("x-url", path)
        .header("content-type", "application/octet-stream")
        .header("etag", format!("\"{}\"", data.len()))
        .body(full(data))
        .unwrap()
}

async fn control(origin: Arc<Origin>, port: u16) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind control port");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let origin = origin.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                let mode = match req.uri().path() {
                    "/mode/503" => Some(UNAVAILABLE),
                    "/mode/reset" => Some(RESET),
                    "/mode/refuse" => Some(REFUSE),
                    "/mode/ok" => Some(OK),
                    _ => None,
                };
                if let Some(mode) = mode {
                    origin.mode.store(mode, Ordering::SeqCst);
                }
                let status = if mode.is_some() {
                    StatusCode::OK
                } else {
                    StatusCode::NOT_FOUND
                };
                let mut resp = Response::new(Full::<Bytes>::new(Bytes::new()));
                *resp.status_mut() = status;
                async move { Ok::<_, Infallible>(resp) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1).map(|a| {
        a.parse::<u16>()
            .expect("usage: bench-origin PORT [CONTROL_PORT]")
    });
    let port = args
        .next()
        .expect("usage: bench-origin PORT [CONTROL_PORT]");
    let origin = Arc::new(Origin {
        connections: AtomicU64::new(0),
        manifest: manifest(2048),
        page: page(200 * 1024),
        tiny: body(1024),
        small: body(2048),
        large: body(4 * 1024 * 1024),
        counts: Mutex::default(),
        mode: AtomicU8::new(OK),
        live: Live::from_env(),
        vod: Vod::from_env(),
    });
    if let Some(control_port) = args.next() {
        tokio::spawn(control(origin.clone(), control_port));
    }
    loop {
        // Refusing means not listening at all: the port is closed until the mode changes.
        while origin.mode.load(Ordering::SeqCst) == REFUSE {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind");
        while origin.mode.load(Ordering::SeqCst) != REFUSE {
            let Ok(Ok((stream, _))) =
                tokio::time::timeout(Duration::from_millis(50), listener.accept()).await
            else {
                continue;
            };
            if origin.mode.load(Ordering::SeqCst) == RESET {
                let _ = stream.set_zero_linger();
                continue;
            }
            origin.connections.fetch_add(1, Ordering::Relaxed);
            let origin = origin.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| serve(origin.clone(), req));
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    }
}

/// A page as Magento writes it with its page cache set to Varnish: 8 KiB of markup with three blocks as
/// ESI includes (the menu, the cart summary, the footer), for `bench/cpu.py`'s `esi` workload.
fn esi_page() -> Bytes {
    let filler = "<p class=\"product\">A product description that a catalogue page repeats.</p>\n";
    let mut page =
        String::from("<!doctype html>\n<html><head><title>Category</title></head><body>\n");
    page.push_str("<esi:include src=\"/esi/frag/menu\"/>\n<main>\n");
    while page.len() < 4096 {
        page.push_str(filler);
    }
    page.push_str("<esi:include src=\"/esi/frag/cart\"/>\n");
    while page.len() < 8192 {
        page.push_str(filler);
    }
    page.push_str("</main>\n<esi:include src=\"/esi/frag/footer\"/>\n</body></html>\n");
    Bytes::from(page)
}

/// One block of [`esi_page`]: 1 KiB of markup named for it.
fn esi_fragment(name: &str) -> Bytes {
    let mut block = format!("<div class=\"block-{name}\">");
    while block.len() < 1000 {
        block.push_str(&format!("<a href=\"/{name}\">{name}</a> "));
    }
    block.push_str("</div>");
    Bytes::from(block)
}

#[cfg(test)]
mod tests {
    use super::{asked, Asked};

    #[test]
    fn ranges_as_a_file_server_reads_them() {
        let len = 1000;
        assert_eq!(asked(None, len), Asked::Whole);
        assert_eq!(asked(Some("bytes=0-99"), len), Asked::Part(0, 99));
        assert_eq!(asked(Some("bytes=990-2000"), len), Asked::Part(990, 999));
        assert_eq!(asked(Some("bytes=500-"), len), Asked::Part(500, 999));
        assert_eq!(asked(Some("bytes=-10"), len), Asked::Part(990, 999));
        assert_eq!(asked(Some("bytes=-5000"), len), Asked::Part(0, 999));
        assert_eq!(asked(Some("bytes=1000-"), len), Asked::Unsatisfiable);
        assert_eq!(asked(Some("bytes=-0"), len), Asked::Unsatisfiable);
        assert_eq!(asked(Some("bytes=0-0"), 0), Asked::Unsatisfiable);
        for ignored in [
            "bytes=5-1",
            "bytes=0-1,5-9",
            "bytes=x-",
            "items=0-1",
            "bytes=-",
            "bytes=+1-2",
        ] {
            assert_eq!(asked(Some(ignored), len), Asked::Whole, "{ignored}");
        }
    }

    #[tokio::test]
    async fn a_vod_stream_lists_its_segments_and_each_starts_at_its_own_place_in_the_pattern() {
        use http_body_util::BodyExt;
        let vod = super::Vod {
            segments: 3,
            segment_bytes: 1000,
            delay: std::time::Duration::ZERO,
        };
        let listed = vod.playlist();
        let text = std::str::from_utf8(&listed).unwrap();
        let names: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(names, ["seg0.ts", "seg1.ts", "seg2.ts"]);
        assert!(text.ends_with("#EXT-X-ENDLIST\n"));
        let path = "/vod/a/seg2.ts";
        let got = vod.respond(path).await.into_body().collect().await;
        let got = got.unwrap().to_bytes();
        let shift = bench_origin::fnv1a(path) % 251;
        assert_eq!(got.len(), 1000);
        assert!(got
            .iter()
            .zip(shift..)
            .all(|(&b, i)| u64::from(b) == i % 251));
        for missing in ["/vod/a/seg3.ts", "/vod/a/other", "/vod/a"] {
            assert_eq!(vod.respond(missing).await.status(), 404, "{missing}");
        }
    }

    #[tokio::test]
    async fn any_part_of_the_pattern_in_frames_of_64_kib() {
        use http_body_util::BodyExt;
        let start = (3u64 << 30) - 1;
        let len = 200_000;
        let got = super::streamed(start, len)
            .collect()
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(got.len() as u64, len);
        assert!(got
            .iter()
            .zip(start..)
            .all(|(&b, i)| u64::from(b) == i % 251));
    }
}
