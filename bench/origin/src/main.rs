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
//! - `/__count/PATH`: how many times PATH was requested, as a plain number; `/__total`: all requests.
//!
//! On CONTROL_PORT, `GET /mode/ok|503|reset|refuse` switches how the main port behaves: normally; answering
//! 503 to everything; resetting every connection and request; or not listening at all.

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::{
        atomic::{AtomicU8, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::{server::conn::http1, service::service_fn, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

const OK: u8 = 0;
const UNAVAILABLE: u8 = 1;
const RESET: u8 = 2;
const REFUSE: u8 = 3;

fn body(len: usize) -> Bytes {
    (0..len).map(|i| (i % 251) as u8).collect::<Vec<_>>().into()
}

struct Origin {
    tiny: Bytes,
    small: Bytes,
    large: Bytes,
    counts: Mutex<HashMap<String, u64>>,
    mode: AtomicU8,
}

type Reply = Response<BoxBody<Bytes, Infallible>>;

fn full(data: Bytes) -> BoxBody<Bytes, Infallible> {
    Full::new(data).boxed()
}

/// `len` bytes of [`body`]'s pattern in 64 KiB frames cut from one small buffer.
fn streamed(len: u64) -> BoxBody<Bytes, Infallible> {
    const FRAME: u64 = 64 * 1024;
    let base = body(FRAME as usize + 251);
    let frames = futures_util::stream::iter((0..len).step_by(FRAME as usize).map(move |at| {
        let from = (at % 251) as usize;
        let n = (len - at).min(FRAME) as usize;
        Ok(hyper::body::Frame::data(base.slice(from..from + n)))
    }));
    StreamBody::new(frames).boxed()
}

async fn serve(
    origin: Arc<Origin>,
    req: Request<hyper::body::Incoming>,
) -> Result<Reply, std::io::Error> {
    let path = req.uri().path().to_owned();
    if path == "/__total" {
        let n: u64 = origin.counts.lock().unwrap().values().sum();
        return Ok(Response::new(full(Bytes::from(n.to_string()))));
    }
    if let Some(counted) = path.strip_prefix("/__count") {
        let n = origin
            .counts
            .lock()
            .unwrap()
            .get(counted)
            .copied()
            .unwrap_or(0);
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
    *origin
        .counts
        .lock()
        .unwrap()
        .entry(path.clone())
        .or_default() += 1;
    if let Some(spec) = path.strip_prefix("/stream/") {
        let mut fields = spec.split('/');
        let cache_control = fields.next().unwrap_or("no-store").to_owned();
        let len = fields
            .next()
            .and_then(|l| l.parse::<u64>().ok())
            .unwrap_or(0);
        return Ok(Response::builder()
            .header("cache-control", cache_control)
            .header("content-type", "application/octet-stream")
            .header("content-length", len)
            .body(streamed(len))
            .unwrap());
    }
    let (data, cache_control) = match path.as_str() {
        "/obj/2k" => (origin.small.clone(), "max-age=3600"),
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
    Ok(Response::builder()
        .header("cache-control", cache_control)
        .header("x-url", path)
        .header("content-type", "application/octet-stream")
        .header("etag", format!("\"{}\"", data.len()))
        .body(full(data))
        .unwrap())
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
        tiny: body(1024),
        small: body(2048),
        large: body(4 * 1024 * 1024),
        counts: Mutex::default(),
        mode: AtomicU8::new(OK),
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
            let origin = origin.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| serve(origin.clone(), req));
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    }
}
