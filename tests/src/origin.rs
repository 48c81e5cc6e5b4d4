//! A scripted origin: each test supplies a function from request to [`Reply`]; the origin records every
//! request it receives.

use std::{
    collections::HashMap,
    convert::Infallible,
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    sync::Notify,
};

/// One step of a response body.
#[derive(Clone)]
pub enum Step {
    Data(Bytes),
    Sleep(Duration),
    /// Waits until the test calls `notify_one`/`notify_waiters` on the gate.
    Gate(Arc<Notify>),
    /// Drops the connection mid-body.
    Reset,
}

#[derive(Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// Delay before the response head.
    pub delay: Duration,
    pub body: Vec<Step>,
}

impl Reply {
    pub fn ok(body: impl Into<Bytes>) -> Self {
        let body: Bytes = body.into();
        Self {
            status: 200,
            headers: vec![("content-length".into(), body.len().to_string())],
            delay: Duration::ZERO,
            body: vec![Step::Data(body)],
        }
    }

    /// The `len`-byte [`pattern`] body in 64 KiB frames (slices of one small buffer), with its
    /// `Content-Length`.
    pub fn large(len: usize) -> Self {
        const FRAME: usize = 64 * 1024;
        let base = Bytes::from(pattern(FRAME + 251));
        let steps = (0..len)
            .step_by(FRAME)
            .map(|at| Step::Data(base.slice(at % 251..at % 251 + (len - at).min(FRAME))))
            .collect();
        Self::ok("").steps(steps, Some(len))
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Replaces the body with steps; `content_length` is announced when given, else the body is chunked.
    pub fn steps(mut self, steps: Vec<Step>, content_length: Option<usize>) -> Self {
        self.headers.retain(|(n, _)| n != "content-length");
        if let Some(len) = content_length {
            self.headers
                .push(("content-length".into(), len.to_string()));
        }
        self.body = steps;
        self
    }
}

/// A file server's answer for a [`pattern`] object of `len` bytes, `shift` places along (byte `i` is
/// `(i + shift) % 251`, so two versions differ in every byte) with entity-tag `etag`: a single `bytes`
/// range (`a-b`, `a-`, `-n`) answered 206 with its `Content-Range`, one past the end 416, anything else (and
/// a range whose `If-Range` is not `etag`) the whole; streamed in 64 KiB frames of one small buffer, so a multi-GiB object costs nothing. An empty
/// `etag` sends none.
pub fn ranged(seen: &Seen, len: u64, shift: u64, etag: &str) -> Reply {
    const FRAME: u64 = 64 * 1024;
    let unchanged = seen
        .headers
        .get("if-range")
        .is_none_or(|v| !etag.is_empty() && v.as_bytes() == etag.as_bytes());
    let wanted = seen
        .headers
        .get("range")
        .filter(|_| unchanged)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes="))
        .filter(|v| !v.contains(','))
        .and_then(|spec| {
            let (first, last) = spec.split_once('-')?;
            match (first.parse::<u64>().ok(), last.parse::<u64>().ok()) {
                (Some(first), Some(last)) if first <= last => Some((first, last.min(len - 1))),
                (Some(first), None) if last.is_empty() => Some((first, len - 1)),
                (None, Some(suffix)) if first.is_empty() && suffix > 0 => {
                    Some((len - suffix.min(len), len - 1))
                }
                _ => None,
            }
        });
    let reply = |status: u16| {
        let reply = Reply::ok("").status(status);
        let reply = match etag {
            "" => reply,
            etag => reply.header("etag", etag),
        };
        reply
            .header("cache-control", "max-age=3600")
            .header("accept-ranges", "bytes")
            .header("content-type", "application/octet-stream")
    };
    let (first, last) = match wanted {
        Some((first, _)) if first >= len => {
            return reply(416)
                .header("content-range", &format!("bytes */{len}"))
                .steps(Vec::new(), Some(0))
        }
        Some(span) => span,
        None => (0, len - 1),
    };
    let base = Bytes::from(pattern((FRAME + 251) as usize));
    let steps = (first..=last)
        .step_by(FRAME as usize)
        .map(|at| {
            let from = ((at + shift) % 251) as usize;
            let n = (last + 1 - at).min(FRAME) as usize;
            Step::Data(base.slice(from..from + n))
        })
        .collect();
    let size = (last + 1 - first) as usize;
    match wanted {
        Some(_) => reply(206)
            .header("content-range", &format!("bytes {first}-{last}/{len}"))
            .steps(steps, Some(size)),
        None => reply(200).steps(steps, Some(size)),
    }
}

/// Body bytes that show where they sit: byte `i` is `i % 251`, so a body read back out of order, shifted
/// or short fails a comparison (251 is prime: no chunk or frame size lines up with it).
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// One step of a response an origin writes byte for byte ([`Origin::raw`]), for the misbehaviour an HTTP
/// library would not produce: a body shorter than its `Content-Length`, a chunked body without its last
/// chunk, bytes dripped one at a time.
#[derive(Clone)]
pub enum Raw {
    Write(Bytes),
    Sleep(Duration),
    /// Waits until the test calls `notify_one`/`notify_waiters` on the gate.
    Gate(Arc<Notify>),
    /// Closes the connection (a FIN, not a reset); without it the connection waits for the next request.
    Close,
}

impl Raw {
    pub fn write(bytes: impl Into<Bytes>) -> Self {
        Raw::Write(bytes.into())
    }

    /// `bytes` one at a time, `gap` apart.
    pub fn drip(bytes: &[u8], gap: Duration) -> Vec<Raw> {
        bytes
            .iter()
            .flat_map(|&b| [Raw::Sleep(gap), Raw::Write(Bytes::copy_from_slice(&[b]))])
            .collect()
    }
}

/// What the origin saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

type Script = dyn Fn(&Seen) -> Reply + Send + Sync;

pub struct Origin {
    pub addr: SocketAddr,
    /// The accept loop and every connection task, so `stop` can refuse and reset like a dead origin.
    tasks: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
    /// Body bytes the connections have taken from the scripted bodies (what the proxy has read, give or
    /// take the socket buffers).
    body_bytes: Arc<AtomicUsize>,
}

impl Origin {
    pub async fn start(script: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Origin {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let script: Arc<Script> = Arc::new(script);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let max_in_flight = Arc::new(AtomicUsize::new(0));
        let body_bytes = Arc::new(AtomicUsize::new(0));
        let state = State {
            seen: seen.clone(),
            in_flight: in_flight.clone(),
            max_in_flight: max_in_flight.clone(),
            body_bytes: body_bytes.clone(),
        };
        let tasks: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let registry = tasks.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (script, state) = (script.clone(), state.clone());
                let conn = tokio::spawn(async move {
                    let service = service_fn(move |req| serve(script.clone(), state.clone(), req));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
                registry.lock().unwrap().push(conn.abort_handle());
            }
        });
        tasks.lock().unwrap().push(accept.abort_handle());
        Origin {
            addr,
            tasks,
            seen,
            in_flight,
            max_in_flight,
            body_bytes,
        }
    }

    /// An origin whose responses are written by the script, byte for byte; requests (without bodies) are
    /// parsed and recorded as by [`Origin::start`].
    pub async fn raw(script: impl Fn(&Seen) -> Vec<Raw> + Send + Sync + 'static) -> Origin {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let script = Arc::new(script);
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let tasks: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let (registry, record) = (tasks.clone(), seen.clone());
        let accept = tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let (script, record) = (script.clone(), record.clone());
                let conn = tokio::spawn(async move {
                    while let Some(request) = read_head(&mut stream).await {
                        record.lock().unwrap().push(request.clone());
                        for step in script(&request) {
                            let written = match step {
                                Raw::Write(bytes) => stream.write_all(&bytes).await,
                                Raw::Sleep(d) => {
                                    tokio::time::sleep(d).await;
                                    Ok(())
                                }
                                Raw::Gate(g) => {
                                    g.notified().await;
                                    Ok(())
                                }
                                Raw::Close => {
                                    let _ = stream.shutdown().await;
                                    return;
                                }
                            };
                            if written.is_err() {
                                return;
                            }
                        }
                    }
                });
                registry.lock().unwrap().push(conn.abort_handle());
            }
        });
        tasks.lock().unwrap().push(accept.abort_handle());
        Origin {
            addr,
            tasks,
            seen,
            in_flight: Arc::default(),
            max_in_flight: Arc::default(),
            body_bytes: Arc::default(),
        }
    }

    /// Closes the listener and every open connection: from now on connections are refused.
    pub fn stop(&self) {
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    /// Every request seen, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// How many requests for `path` (path and query) the origin received.
    pub fn count(&self, path: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.path == path)
            .count()
    }

    pub fn total(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// Each request's `Range`, in the order they came: `whole` for one without.
    pub fn ranges(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|s| {
                s.headers
                    .get("range")
                    .map_or("whole".into(), |v| v.to_str().unwrap().to_owned())
            })
            .collect()
    }

    /// Requests being answered now (until their body is sent or their connection is gone).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Body bytes taken from the scripted bodies so far, across every request.
    pub fn body_bytes(&self) -> usize {
        self.body_bytes.load(Ordering::SeqCst)
    }

    /// The most requests that were being answered at the same time.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }

    pub fn counts(&self) -> HashMap<String, usize> {
        let mut m = HashMap::new();
        for s in self.seen.lock().unwrap().iter() {
            *m.entry(s.path.clone()).or_default() += 1;
        }
        m
    }
}

#[derive(Clone)]
struct State {
    seen: Arc<Mutex<Vec<Seen>>>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
    body_bytes: Arc<AtomicUsize>,
}
type OriginBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn serve(
    script: Arc<Script>,
    state: State,
    req: Request<Incoming>,
) -> Result<Response<OriginBody>, Infallible> {
    let State {
        seen,
        in_flight,
        max_in_flight,
        body_bytes,
    } = state;
    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    max_in_flight.fetch_max(now, Ordering::SeqCst);
    let guard = InFlight(in_flight);
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let record = Seen {
        method: parts.method.to_string(),
        path: parts
            .uri
            .path_and_query()
            .map_or("/".into(), |p| p.to_string()),
        headers: parts.headers,
        body,
    };
    seen.lock().unwrap().push(record.clone());
    let reply = script(&record);
    tokio::time::sleep(reply.delay).await;
    let mut resp = Response::builder().status(StatusCode::from_u16(reply.status).unwrap());
    for (n, v) in &reply.headers {
        resp = resp.header(n, v);
    }
    let steps = futures_util::stream::unfold(
        (reply.body.into_iter(), Some(guard), body_bytes),
        |(mut steps, guard, body_bytes)| async move {
            loop {
                match steps.next() {
                    None => return None,
                    Some(Step::Data(d)) => {
                        body_bytes.fetch_add(d.len(), Ordering::SeqCst);
                        return Some((Ok(Frame::data(d)), (steps, guard, body_bytes)));
                    }
                    Some(Step::Sleep(d)) => tokio::time::sleep(d).await,
                    Some(Step::Gate(g)) => g.notified().await,
                    Some(Step::Reset) => {
                        return Some((
                            Err(std::io::Error::other("scripted reset")),
                            (steps, guard, body_bytes),
                        ));
                    }
                }
            }
        },
    );
    Ok(resp.body(StreamBody::new(steps).boxed()).unwrap())
}

/// Reads one request head; `None` when the connection ends first or sends something that is not HTTP.
async fn read_head(stream: &mut TcpStream) -> Option<Seen> {
    let mut buf = Vec::new();
    loop {
        let mut slots = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut slots);
        if let httparse::Status::Complete(_) = req.parse(&buf).ok()? {
            let mut headers = HeaderMap::new();
            for h in req.headers.iter() {
                headers.append(
                    http::HeaderName::from_bytes(h.name.as_bytes()).ok()?,
                    http::HeaderValue::from_bytes(h.value).ok()?,
                );
            }
            return Some(Seen {
                method: req.method?.to_owned(),
                path: req.path?.to_owned(),
                headers,
                body: Bytes::new(),
            });
        }
        if stream.read_buf(&mut buf).await.ok()? == 0 {
            return None;
        }
    }
}
