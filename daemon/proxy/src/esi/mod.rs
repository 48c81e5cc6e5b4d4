//! Edge Side Includes on the data path: a page parsed as its fill streams it ([`fill::EsiFill`]), and
//! the assembly of a page for one client ([`assemble`]), each fragment fetched as a request of its own.
//!
//! The parsed page (a [`lacquer_esi`] template) is what the store keeps and what the fill's readers get;
//! [`fill::TEMPLATE`] in its head says so. The head is shaped once, at the fill, as Varnish shapes an ESI
//! response: no `Content-Length` (the assembled length is not known), no `Accept-Ranges` (a `Range` is
//! answered with the whole page), a weak `ETag` (the bytes sent differ by the fragments), and identity
//! coding (the page is parsed decoded; it is compressed for each client as it is assembled).

pub(crate) mod fill;

use std::{
    collections::VecDeque,
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use bytes::Bytes;
use http::{header, request::Parts, HeaderValue, Method, Request, Response};
use http_body::Frame;
use http_body_util::BodyExt;
use lacquer_backends::body::{self, Body, BoxError};
use lacquer_codec::{Coding, Encoder};
use lacquer_config::Esi;
use lacquer_edge::{Client, RequestBody};
use lacquer_esi::{Include, Reader, Segment, TemplateError};
use lacquer_policy::encoding::{self, Compression};
use tokio::task::JoinHandle;

use crate::{stats::inc, worker::Worker};

/// Where a request stands in an assembly: the targets of the pages above it, the page first, and the
/// includes the client's page may still make, its fragments' included (`[esi] max_includes`).
#[derive(Debug)]
pub(crate) struct Within {
    pages: Vec<String>,
    left: Arc<AtomicUsize>,
}

impl Within {
    /// How deep the request is: 0 for a client's, 1 for a fragment of its page.
    pub fn depth(&self) -> usize {
        self.pages.len()
    }
}

/// A fragment request made through the whole flow (see [`crate::flow::fragment`]).
pub(crate) type Fragment = Pin<Box<dyn Future<Output = Response<Body>> + Send>>;

/// What makes a fragment request: the flow's entry for requests lacquerd makes itself.
pub(crate) type Fetcher = fn(Arc<Worker>, Client, Request<RequestBody>, Arc<Within>) -> Fragment;

/// The page answered to `page` (the head as the request phase left it) assembled with its fragments:
/// its template read as it comes, each include fetched (up to `[esi] parallel` ahead of the one being
/// sent) and sent in its place. Under `[compression]` (`compression`: its settings, and whether the client
/// takes gzip) a page of a type it compresses varies on `Accept-Encoding`, and is compressed with gzip
/// for a client that takes it. A HEAD, a 304 and an error lacquerd made assemble nothing.
#[allow(clippy::too_many_arguments)]
pub(crate) fn assemble(
    worker: &Arc<Worker>,
    fetcher: Fetcher,
    resp: Response<Body>,
    page: &Parts,
    client: Client,
    within: Option<&Arc<Within>>,
    compression: Option<(&Compression, bool)>,
) -> Response<Body> {
    let (mut head, template) = resp.into_parts();
    head.headers.remove(header::CONTENT_LENGTH);
    head.headers.remove(header::ACCEPT_RANGES);
    let bodiless = matches!(head.status.as_u16(), 204 | 304) || page.method == Method::HEAD;
    if bodiless {
        return Response::from_parts(head, template);
    }
    let live = worker.shared.live();
    let settings = live.esi.clone();
    let compressed = compression
        .filter(|(s, _)| encoding::compress_with(head.status, &head.headers, s, None).is_some());
    let gzip = match compressed {
        Some((settings, takes_gzip)) => {
            crate::coding::vary_on_accept_encoding(&mut head.headers);
            takes_gzip.then_some(settings.gzip_level)
        }
        None => None,
    };
    if gzip.is_some() {
        head.headers.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_static(Coding::Gzip.token()),
        );
    }
    inc(&worker.shared.stats.esi_assemblies);
    let mut pages = within.map(|w| w.pages.clone()).unwrap_or_default();
    pages.push(
        page.uri
            .path_and_query()
            .map_or("/", |pq| pq.as_str())
            .to_owned(),
    );
    // One budget for the client's page and every fragment below it: nesting cannot multiply it.
    let left = within.map_or_else(
        || Arc::new(AtomicUsize::new(settings.max_includes)),
        |w| w.left.clone(),
    );
    let assembly = Assembly {
        worker: worker.clone(),
        fetcher,
        page: page.clone(),
        client,
        within: Arc::new(Within { pages, left }),
        settings,
        template,
        reader: Reader::new(),
        queue: VecDeque::new(),
        current: None,
        ahead: 0,
        fetching: 0,
        read_all: false,
        ended: false,
        encoder: gzip.map(|level| Encoder::new(Coding::Gzip, level)),
        unflushed: false,
    };
    // Polled in place by the response body: no task and no channel between the page and the client, and a
    // fragment that is itself a page is polled in place by its parent.
    let stream = futures_util::stream::unfold(assembly, |mut assembly| async move {
        let item = assembly.next_piece().await?;
        Some((item.map(Frame::data), assembly))
    });
    Response::from_parts(head, body::from_stream(stream))
}

/// The most segments an assembly holds read ahead: with includes that are never fetched (refused, past
/// `max_includes`) counting neither as text nor as fetches, this is what bounds them.
const QUEUED: usize = 1024;

/// One page being assembled for one client: its template as it is read, what was read ahead of the
/// include being waited for, and the fragment being sent.
struct Assembly {
    worker: Arc<Worker>,
    fetcher: Fetcher,
    /// The page's request head, as the request phase left it: each fragment's is made from it.
    page: Parts,
    client: Client,
    /// This page and the ones above it: a fragment's request is one level deeper.
    within: Arc<Within>,
    settings: Esi,
    template: Body,
    reader: Reader,
    queue: VecDeque<Pending>,
    /// The body of the fragment being sent.
    current: Option<Body>,
    /// Text read ahead, and fragments in flight, not yet sent.
    ahead: usize,
    fetching: usize,
    read_all: bool,
    /// The page is sent (or cut): nothing more comes.
    ended: bool,
    /// Compresses the page for a client that takes gzip.
    encoder: Option<Encoder>,
    /// The encoder was fed since it last flushed.
    unflushed: bool,
}

/// What comes next in the page, in order.
enum Pending {
    /// Template text, read ahead.
    Text(Bytes),
    /// An include: its fragment's request, or why it is not made.
    Include {
        include: Include,
        fetch: Result<Fetch, String>,
    },
}

/// A fragment's request.
enum Fetch {
    /// In flight.
    Running(JoinHandle<Response<Body>>),
    /// Answered (or failed) while the page waited on an earlier one.
    Done(Result<Response<Body>, tokio::task::JoinError>),
}

/// Why an assembly stopped before the page's end: an include failed without `onerror="continue"`, or the
/// template did not read. The page is cut off there, as Varnish cuts it, so the client sees a response
/// that did not end.
struct Cut(String);

impl Assembly {
    /// The page's next bytes for the client; `None` once it is all sent.
    async fn next_piece(&mut self) -> Option<Result<Bytes, BoxError>> {
        if self.ended {
            return None;
        }
        match self.produce().await {
            Ok(Some(piece)) => Some(Ok(piece)),
            Ok(None) => {
                self.ended = true;
                let tail = self.encoder.as_mut().map(|encoder| {
                    encoder.end();
                    drain(encoder)
                })?;
                match tail {
                    Ok(tail) if tail.is_empty() => None,
                    Ok(tail) => Some(Ok(tail)),
                    Err(Cut(reason)) => Some(Err(self.cut(reason))),
                }
            }
            Err(Cut(reason)) => {
                self.ended = true;
                Some(Err(self.cut(reason)))
            }
        }
    }

    fn cut(&self, reason: String) -> BoxError {
        inc(&self.worker.shared.stats.esi_errors);
        tracing::info!(page = %self.page.uri, reason, "ESI page cut off");
        BoxError::from(reason)
    }

    /// Works through the page until it has bytes for the client (compressed, for a gzip client);
    /// `Ok(None)` at the page's end.
    async fn produce(&mut self) -> Result<Option<Bytes>, Cut> {
        let read_ahead = self.settings.read_ahead.as_u64() as usize;
        loop {
            if let Some(body) = &mut self.current {
                match body.frame().await {
                    Some(Ok(frame)) => {
                        if let Ok(data) = frame.into_data() {
                            if let Some(out) = self.out(data)? {
                                return Ok(Some(out));
                            }
                        }
                    }
                    None => self.current = None,
                    // Part of it is sent already: the page cannot be whole, whatever `onerror` says.
                    Some(Err(e)) => return Err(Cut(format!("a fragment's body failed: {e}"))),
                }
                continue;
            }
            let may_read = !self.read_all
                && self.ahead < read_ahead
                && self.fetching < self.settings.parallel
                && self.queue.len() < QUEUED;
            match self.queue.front_mut() {
                None if self.read_all => return Ok(None),
                None => {
                    let segment = next_segment(&mut self.template, &mut self.reader).await;
                    self.queue(segment)?;
                }
                Some(Pending::Text(_)) => {
                    let Some(Pending::Text(text)) = self.queue.pop_front() else {
                        unreachable!("the front is text")
                    };
                    self.ahead -= text.len();
                    if let Some(out) = self.out(text)? {
                        return Ok(Some(out));
                    }
                }
                Some(Pending::Include {
                    fetch: Ok(fetch @ Fetch::Running(_)),
                    ..
                }) if may_read => {
                    let Fetch::Running(handle) = fetch else {
                        unreachable!("running")
                    };
                    // Read on while the first fragment is fetched, to start the next ones.
                    let segment = tokio::select! {
                        biased;
                        done = handle => {
                            *fetch = Fetch::Done(done);
                            None
                        }
                        segment = next_segment(&mut self.template, &mut self.reader) => Some(segment),
                    };
                    if let Some(segment) = segment {
                        self.queue(segment)?;
                    }
                }
                Some(Pending::Include {
                    fetch: Ok(Fetch::Running(_)),
                    ..
                }) if self.unflushed => {
                    // The client waits for the fragment: what is compressed so far leaves first.
                    if let Some(out) = self.flush()? {
                        return Ok(Some(out));
                    }
                }
                Some(Pending::Include { .. }) => {
                    let Some(Pending::Include { include, fetch }) = self.queue.pop_front() else {
                        unreachable!("the front is an include")
                    };
                    if fetch.is_ok() {
                        self.fetching -= 1;
                    }
                    self.current = self.include(include, fetch).await?;
                }
            }
        }
    }

    /// Puts what the template read next in the queue: text, or an include with its fragment's request
    /// started.
    fn queue(&mut self, segment: Result<Option<Segment>, Cut>) -> Result<(), Cut> {
        match segment? {
            None => self.read_all = true,
            Some(Segment::Literal(text)) => {
                self.ahead += text.len();
                self.queue.push_back(Pending::Text(text));
            }
            Some(Segment::Include(include)) => {
                let fetch = self.start(&include);
                if fetch.is_ok() {
                    self.fetching += 1;
                }
                self.queue.push_back(Pending::Include { include, fetch });
            }
        }
        Ok(())
    }
    /// Starts the request for an include of the page, or says why it is not made.
    fn start(&self, include: &Include) -> Result<Fetch, String> {
        let settings = &self.settings;
        let taken = self
            .within
            .left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        if taken.is_err() {
            return Err(format!(
                "past esi.max_includes ({}) for the client's page",
                settings.max_includes
            ));
        }
        // `within` holds this page: its depth is the fragment's.
        if self.within.depth() > settings.max_depth {
            return Err(format!("past esi.max_depth ({})", settings.max_depth));
        }
        let host = self
            .page
            .headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok());
        let target =
            lacquer_esi::resolve(&include.src, &self.page.uri, host).map_err(|e| e.to_string())?;
        if self.within.pages.iter().any(|p| p == target.as_str()) {
            return Err(format!("{target} includes itself"));
        }
        let mut parts = self.page.clone();
        parts.method = Method::GET;
        parts.uri = http::Uri::from(target);
        // The fragment is fetched whole and uncompressed, whatever the page's request asked for.
        for name in [
            header::ACCEPT_ENCODING,
            header::RANGE,
            header::IF_RANGE,
            header::IF_NONE_MATCH,
            header::IF_MODIFIED_SINCE,
            header::IF_MATCH,
            header::IF_UNMODIFIED_SINCE,
            header::CONTENT_LENGTH,
            header::CONTENT_TYPE,
            header::TRANSFER_ENCODING,
            header::EXPECT,
        ] {
            parts.headers.remove(name);
        }
        inc(&self.worker.shared.stats.esi_fragments);
        let req = Request::from_parts(parts, RequestBody::Empty);
        Ok(Fetch::Running(tokio::spawn((self.fetcher)(
            self.worker.clone(),
            self.client,
            req,
            self.within.clone(),
        ))))
    }

    /// The body sent in an include's place: its fragment's, `None` for an include that failed with
    /// `onerror="continue"` (left out); otherwise the page is cut off.
    async fn include(
        &mut self,
        include: Include,
        fetch: Result<Fetch, String>,
    ) -> Result<Option<Body>, Cut> {
        let failed = |reason: String| -> Result<Option<Body>, Cut> {
            let reason = format!("include {:?}: {reason}", include.src);
            if include.continue_on_error {
                inc(&self.worker.shared.stats.esi_errors);
                tracing::debug!(page = %self.page.uri, reason, "ESI include left out");
                Ok(None)
            } else {
                Err(Cut(reason))
            }
        };
        let answered = match fetch {
            Ok(Fetch::Done(answered)) => answered,
            Ok(Fetch::Running(handle)) => handle.await,
            Err(reason) => return failed(reason),
        };
        let resp = match answered {
            Ok(resp) => resp,
            Err(e) => return failed(format!("request failed: {e}")),
        };
        if !matches!(resp.status().as_u16(), 200 | 204 | 206) {
            return failed(format!("status {}", resp.status()));
        }
        Ok(Some(resp.into_body()))
    }

    /// What `data` makes for the client: itself, or what the compressor gives for it (`None` when it
    /// gives nothing yet).
    fn out(&mut self, data: Bytes) -> Result<Option<Bytes>, Cut> {
        let Some(encoder) = &mut self.encoder else {
            return Ok(Some(data).filter(|d| !d.is_empty()));
        };
        encoder.feed(data);
        self.unflushed = true;
        let out = drain(encoder)?;
        Ok(Some(out).filter(|o| !o.is_empty()))
    }

    /// What the compressor holds, flushed: before waiting on a fragment, so the client has the page so far.
    fn flush(&mut self) -> Result<Option<Bytes>, Cut> {
        self.unflushed = false;
        let Some(encoder) = &mut self.encoder else {
            return Ok(None);
        };
        encoder.flush();
        let out = drain(encoder)?;
        Ok(Some(out).filter(|o| !o.is_empty()))
    }
}

/// Everything the compressor has ready.
fn drain(encoder: &mut Encoder) -> Result<Bytes, Cut> {
    crate::coding::drain(encoder).map_err(|e| Cut(format!("compressing the page failed: {e}")))
}

/// The template's next segment, reading its body as needed; `None` at its end.
async fn next_segment(template: &mut Body, reader: &mut Reader) -> Result<Option<Segment>, Cut> {
    let damaged = |e: TemplateError| Cut(e.to_string());
    loop {
        if let Some(segment) = reader.next_segment().map_err(damaged)? {
            return Ok(Some(segment));
        }
        match template.frame().await {
            None => {
                reader.finish().map_err(damaged)?;
                return Ok(None);
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    reader.push(data);
                }
            }
            Some(Err(e)) => return Err(Cut(format!("the page's body failed: {e}"))),
        }
    }
}
