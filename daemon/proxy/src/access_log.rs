//! The access log: one line per request in `access_log.format` ([`LogFormat`]: by default the NCSA combined
//! line `varnishncsa` writes, with the cache result and timings appended), to a file reopened on `SIGUSR1`
//! or to standard output; and the same records, as JSON, to whoever follows `GET /v1/log/stream`.
//!
//! Workers format the line and hand it to a writer thread through a bounded queue: a slow disk drops lines
//! (counted) rather than slowing requests down.

use std::{
    fs::{File, OpenOptions},
    io::{self, BufWriter, Write},
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicUsize, Ordering::Relaxed},
        mpsc::{self, RecvTimeoutError, SyncSender, TrySendError},
        Arc, Mutex, OnceLock,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use arc_swap::ArcSwap;
use http::{header, Request, Response};
use lacquer_admin::wire::{HeaderField, LogEntry, TraceStep};
use tokio::sync::broadcast;

use lacquer_backends::body::Body;
use lacquer_config as config;

use crate::{
    log_format::{Captured, LogFormat},
    stats::{inc, Stats},
};

/// Lines waiting for the writer; past it, lines are dropped and counted.
const QUEUE: usize = 65_536;
/// Records waiting for a slow log-stream follower, who then misses some (told so by the stream).
const TAIL_BUFFER: usize = 4096;

enum Message {
    Line(String),
    Reopen,
    Close,
}

/// The access log: a file written by a thread of its own (never by the workers), and a live stream for
/// `GET /v1/log/stream`.
pub struct AccessLog {
    file: Option<SyncSender<Message>>,
    /// Replaced whole by a reload; a request keeps the one it started with.
    format: ArcSwap<LogFormat>,
    sample: f64,
    tail: broadcast::Sender<Arc<LogEntry>>,
    /// Followers that asked for every step of each request: while there is one, requests are traced.
    tracers: AtomicUsize,
    stats: Arc<Stats>,
}

impl AccessLog {
    /// Opens the file (an error here stops the start) and starts its writer thread; lines are written in
    /// `format`, compiled from `config.format`.
    pub fn start(
        config: &config::AccessLog,
        format: LogFormat,
        stats: Arc<Stats>,
    ) -> io::Result<(Arc<Self>, Option<JoinHandle<()>>)> {
        let (file, writer) = match &config.path {
            None => (None, None),
            Some(path) => {
                let out = Output::open(path)?;
                let (tx, rx) = mpsc::sync_channel(QUEUE);
                let thread = std::thread::Builder::new()
                    .name("lacquer-access-log".into())
                    .spawn(move || write_lines(out, rx))?;
                (Some(tx), Some(thread))
            }
        };
        let (tail, _) = broadcast::channel(TAIL_BUFFER);
        let log = Arc::new(Self {
            file,
            format: ArcSwap::from_pointee(format),
            sample: config.sample,
            tail,
            tracers: AtomicUsize::new(0),
            stats,
        });
        Ok((log, writer))
    }

    /// Writes out what is queued and stops the writer thread (at shutdown, before joining it).
    pub fn close(&self) {
        if let Some(file) = &self.file {
            let _ = file.send(Message::Close);
        }
    }

    /// Writes the lines of requests that arrive from now on in `format` (a reload).
    pub fn set_format(&self, format: LogFormat) {
        self.format.store(Arc::new(format));
    }

    /// Closes and opens the file again, for logrotate (`SIGUSR1`).
    pub fn reopen(&self) {
        if let Some(file) = &self.file {
            let _ = file.send(Message::Reopen);
        }
    }

    /// Every request recorded from now on (whatever the file's sampling), for live followers; a follower
    /// that falls behind loses the oldest entries, never slows requests down.
    pub fn follow(&self) -> broadcast::Receiver<Arc<LogEntry>> {
        self.tail.subscribe()
    }

    /// Every request recorded from now on with the steps the data path took, until the guard is dropped.
    pub fn follow_traced(self: &Arc<Self>) -> (broadcast::Receiver<Arc<LogEntry>>, Tracing) {
        self.tracers.fetch_add(1, Relaxed);
        let guard = Tracing(self.clone());
        (self.tail.subscribe(), guard)
    }

    /// Starts recording a request, when the file wants it (sampled) or someone follows the stream, with a
    /// [`Note`] for the data path to fill in ([`Recording::note`]).
    pub fn begin(
        self: &Arc<Self>,
        req: &Request<lacquer_edge::RequestBody>,
        client: IpAddr,
    ) -> Option<Recording> {
        let to_file = self.file.is_some() && (self.sample >= 1.0 || fastrand::f64() < self.sample);
        if !to_file && self.tail.receiver_count() == 0 {
            return None;
        }
        let text = |name: header::HeaderName| {
            req.headers()
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        };
        let format = self.format.load_full();
        let request = LogFormat::capture(&format.request_fields, req.headers());
        let started = lacquer_clock::monotonic();
        let traced = self.tracers.load(Relaxed) > 0;
        let note = Note {
            steps: traced.then(|| (started, Mutex::default())),
            ..Note::default()
        };
        let recording = Recording {
            log: self.clone(),
            to_file,
            format,
            request,
            response: Vec::new(),
            note: Arc::new(note),
            started,
            entry: LogEntry {
                time_ms: lacquer_clock::now_ms(),
                client: client.to_string(),
                method: req.method().to_string(),
                url: req
                    .uri()
                    .path_and_query()
                    .map_or("/", |p| p.as_str())
                    .to_owned(),
                host: text(header::HOST).or_else(|| req.uri().authority().map(|a| a.to_string())),
                protocol: format!("{:?}", req.version()),
                status: 0,
                bytes: 0,
                referer: text(header::REFERER),
                user_agent: text(header::USER_AGENT),
                cache: "-".into(),
                detail: None,
                ttfb: 0.0,
                duration: 0.0,
                backend: None,
                route: None,
                request_headers: if traced {
                    every_field(req.headers())
                } else {
                    Vec::new()
                },
                response_headers: Vec::new(),
                steps: Vec::new(),
            },
        };
        Some(recording)
    }

    fn emit(&self, r: Recording) {
        let Recording {
            to_file,
            format,
            request,
            response,
            entry,
            ..
        } = r;
        if to_file {
            if let Some(file) = &self.file {
                match file.try_send(Message::Line(format.line(&entry, &request, &response))) {
                    Ok(()) => {}
                    Err(TrySendError::Full(_)) => inc(&self.stats.access_log_dropped),
                    Err(TrySendError::Disconnected(_)) => {}
                }
            }
        }
        if self.tail.receiver_count() > 0 {
            let _ = self.tail.send(Arc::new(entry));
        }
    }
}

/// A request being recorded; completed when its response body ends or is dropped.
pub struct Recording {
    log: Arc<AccessLog>,
    to_file: bool,
    format: Arc<LogFormat>,
    /// The request and response fields `format` asks for.
    request: Captured,
    response: Captured,
    note: Arc<Note>,
    started: Instant,
    entry: LogEntry,
}

/// What the data path learns of a recorded request after it arrived, for its log line: its route, the
/// backend it was sent to and, when it is traced, the steps it took. The request's context carries it (and
/// the fills it starts); a request not recorded carries none and pays nothing.
#[derive(Debug, Default)]
pub struct Note {
    route: OnceLock<String>,
    backend: OnceLock<String>,
    /// When the request is traced: its arrival, and the steps taken so far.
    steps: Option<(Instant, Mutex<Vec<TraceStep>>)>,
}

impl Note {
    /// Notes the route; `describe` runs once.
    pub fn route(&self, describe: impl FnOnce() -> String) {
        let route = self.route.get_or_init(describe);
        self.step("Route", || route.clone());
    }

    /// Notes the backend the request is sent to (the first, when it is sent more than once).
    pub fn backend(&self, name: &str) {
        self.backend.get_or_init(|| name.to_owned());
        self.step("Backend", || name.to_owned());
    }

    /// Notes a step when the request is traced; `detail` runs only then.
    pub fn step(&self, tag: &'static str, detail: impl FnOnce() -> String) {
        if let Some((started, steps)) = &self.steps {
            let at_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            let step = TraceStep {
                at_us,
                tag: tag.to_owned(),
                detail: detail(),
            };
            steps.lock().expect("trace lock").push(step);
        }
    }
}

/// Keeps requests traced while held ([`AccessLog::follow_traced`]).
pub struct Tracing(Arc<AccessLog>);

impl Drop for Tracing {
    fn drop(&mut self) {
        self.0.tracers.fetch_sub(1, Relaxed);
    }
}

impl Recording {
    /// The note the data path fills in for this request.
    pub(crate) fn note(&self) -> Arc<Note> {
        self.note.clone()
    }

    /// Takes the response head's fields: its status, the fields the format asks for, its `X-Cache` and
    /// `Cache-Status`' detail as the client sees them.
    pub(crate) fn head(&mut self, resp: &Response<Body>) {
        self.entry.status = resp.status().as_u16();
        if self.note.steps.is_some() {
            self.entry.response_headers = every_field(resp.headers());
        }
        self.response = LogFormat::capture(&self.format.response_fields, resp.headers());
        if let Some(cache) = resp.headers().get("x-cache").and_then(|v| v.to_str().ok()) {
            self.entry.cache = cache.to_owned();
        }
        self.entry.detail = resp
            .headers()
            .get("cache-status")
            .and_then(|v| v.to_str().ok())
            .and_then(detail)
            .map(str::to_owned);
        self.entry.ttfb = self.started.elapsed().as_secs_f64();
    }

    /// Counts body bytes sent.
    pub(crate) fn sent(&mut self, bytes: u64) {
        self.entry.bytes += bytes;
    }

    /// Completes the line when the body has ended or is dropped, and writes it.
    pub(crate) fn finish(mut self) {
        self.entry.duration = self.started.elapsed().as_secs_f64();
        self.entry.route = self.note.route.get().cloned();
        self.entry.backend = self.note.backend.get().cloned();
        if let Some((_, steps)) = &self.note.steps {
            self.entry.steps = std::mem::take(&mut *steps.lock().expect("trace lock"));
        }
        self.log.clone().emit(self);
    }
}

/// Every field of `headers`, in order, for a traced record (`cachectl trace --headers`, varnishlog's
/// `ReqHeader` and `RespHeader`): values as sent, lossily decoded, credentials included, as varnishlog
/// shows them to whoever holds the admin secret.
fn every_field(headers: &http::HeaderMap) -> Vec<HeaderField> {
    headers
        .iter()
        .map(|(name, value)| HeaderField {
            name: name.as_str().to_owned(),
            value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
        })
        .collect()
}

/// The `detail` parameter of a `Cache-Status` entry (RFC 9211 §2.8), unquoted.
fn detail(status: &str) -> Option<&str> {
    status.split(';').find_map(|p| {
        let value = p.trim().strip_prefix("detail=")?;
        Some(value.trim_matches('"'))
    })
}

enum Output {
    Stdout(io::Stdout),
    File {
        path: PathBuf,
        file: BufWriter<File>,
    },
}

impl Output {
    fn open(path: &Path) -> io::Result<Self> {
        if path == Path::new("-") {
            return Ok(Self::Stdout(io::stdout()));
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot open the access log {}: {e}", path.display()),
                )
            })?;
        Ok(Self::File {
            path: path.to_owned(),
            file: BufWriter::with_capacity(64 * 1024, file),
        })
    }

    fn writer(&mut self) -> &mut dyn Write {
        match self {
            Self::Stdout(s) => s,
            Self::File { file, .. } => file,
        }
    }

    fn reopen(&mut self) {
        if let Self::File { path, file } = self {
            let _ = file.flush();
            match Output::open(path) {
                Ok(fresh) => *self = fresh,
                Err(e) => tracing::error!(error = %e, "keeping the old access log file"),
            }
        }
    }
}

/// Writes what arrives, flushing whenever the queue runs dry; ends when every sender is gone.
fn write_lines(mut out: Output, rx: mpsc::Receiver<Message>) {
    let mut unflushed = false;
    loop {
        let message = if unflushed {
            match rx.try_recv() {
                Ok(m) => Ok(m),
                Err(mpsc::TryRecvError::Empty) => {
                    if let Err(e) = out.writer().flush() {
                        tracing::error!(error = %e, "writing the access log failed");
                    }
                    unflushed = false;
                    continue;
                }
                Err(mpsc::TryRecvError::Disconnected) => Err(RecvTimeoutError::Disconnected),
            }
        } else {
            rx.recv_timeout(Duration::from_secs(1))
        };
        match message {
            Ok(Message::Line(line)) => {
                if let Err(e) = out.writer().write_all(line.as_bytes()) {
                    tracing::error!(error = %e, "writing the access log failed");
                }
                unflushed = true;
            }
            Ok(Message::Reopen) => {
                out.reopen();
                tracing::info!("access log reopened");
            }
            Err(RecvTimeoutError::Timeout) => {}
            Ok(Message::Close) | Err(RecvTimeoutError::Disconnected) => {
                let _ = out.writer().flush();
                return;
            }
        }
    }
}
