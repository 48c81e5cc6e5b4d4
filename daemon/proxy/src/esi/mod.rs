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
use tokio::{sync::mpsc, task::JoinHandle};

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
    let (tx, rx) = mpsc::channel(4);
    let assembly = Assembly {
        worker: worker.clone(),
        fetcher,
        page: page.clone(),
        client,
        within: Arc::new(Within { pages, left }),
        settings,
        out: Out {
            tx,
            encoder: gzip.map(|level| Encoder::new(Coding::Gzip, level)),
        },
    };
    tokio::spawn(assembly.run(template));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let item = rx.recv().await?;
        Some((item.map(Frame::data), rx))
    });
    Response::from_parts(head, body::from_stream(stream))
}

/// The most segments an assembly holds read ahead: with includes that are never fetched (refused, past
/// `max_includes`) counting neither as text nor as fetches, this is what bounds them.
const QUEUED: usize = 1024;

/// One page being assembled for one client.
struct Assembly {
    worker: Arc<Worker>,
    fetcher: Fetcher,
    /// The page's request head, as the request phase left it: each fragment's is made from it.
    page: Parts,
    client: Client,
    /// This page and the ones above it: a fragment's request is one level deeper.
    within: Arc<Within>,
    settings: Esi,
    out: Out,
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

/// Why an assembly stopped before the page's end.
enum Stop {
    /// The client left.
    Gone,
    /// An include failed without `onerror="continue"`, or the template did not read: the page is cut
    /// off, as Varnish cuts it, so the client sees a response that did not end.
    Cut(String),
}

impl Assembly {
    async fn run(mut self, template: Body) {
        match self.assemble(template).await {
            Ok(()) => {
                let _ = self.out.end().await;
            }
            Err(Stop::Gone) => {}
            Err(Stop::Cut(reason)) => {
                inc(&self.worker.shared.stats.esi_errors);
                tracing::info!(page = %self.page.uri, reason, "ESI page cut off");
                let _ = self.out.flush().await;
                let _ = self.out.tx.send(Err(BoxError::from(reason))).await;
            }
        }
    }

    async fn assemble(&mut self, mut template: Body) -> Result<(), Stop> {
        let mut reader = Reader::new();
        let mut queue: VecDeque<Pending> = VecDeque::new();
        // Text read ahead, and fragments in flight, not yet sent.
        let (mut ahead, mut fetching) = (0usize, 0usize);
        let mut read_all = false;
        let read_ahead = self.settings.read_ahead.as_u64() as usize;
        loop {
            let may_read = !read_all
                && ahead < read_ahead
                && fetching < self.settings.parallel
                && queue.len() < QUEUED;
            match queue.front_mut() {
                None if read_all => return Ok(()),
                Some(Pending::Text(_)) => {
                    let Some(Pending::Text(text)) = queue.pop_front() else {
                        unreachable!("the front is text")
                    };
                    ahead -= text.len();
                    self.out.send(text).await?;
                    continue;
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
                        segment = next_segment(&mut template, &mut reader) => Some(segment),
                    };
                    match segment {
                        // The fragment is answered: sent on the next turn.
                        None => continue,
                        Some(segment) => {
                            self.queue(
                                segment,
                                &mut queue,
                                &mut read_all,
                                (&mut ahead, &mut fetching),
                            )?;
                            continue;
                        }
                    }
                }
                Some(Pending::Include { .. }) => {
                    let Some(Pending::Include { include, fetch }) = queue.pop_front() else {
                        unreachable!("the front is an include")
                    };
                    if fetch.is_ok() {
                        fetching -= 1;
                    }
                    self.include(include, fetch).await?;
                    continue;
                }
                None => {
                    let segment = next_segment(&mut template, &mut reader).await;
                    self.queue(
                        segment,
                        &mut queue,
                        &mut read_all,
                        (&mut ahead, &mut fetching),
                    )?;
                }
            }
        }
    }

    /// Puts what the template read next in the queue: text, or an include with its fragment's request
    /// started.
    fn queue(
        &self,
        segment: Result<Option<Segment>, Stop>,
        queue: &mut VecDeque<Pending>,
        read_all: &mut bool,
        (ahead, fetching): (&mut usize, &mut usize),
    ) -> Result<(), Stop> {
        match segment? {
            None => *read_all = true,
            Some(Segment::Literal(text)) => {
                *ahead += text.len();
                queue.push_back(Pending::Text(text));
            }
            Some(Segment::Include(include)) => {
                let fetch = self.start(&include);
                if fetch.is_ok() {
                    *fetching += 1;
                }
                queue.push_back(Pending::Include { include, fetch });
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

    /// Sends one include's fragment in its place; an include that fails is left out with
    /// `onerror="continue"`, and otherwise cuts the page off.
    async fn include(
        &mut self,
        include: Include,
        fetch: Result<Fetch, String>,
    ) -> Result<(), Stop> {
        let failed = |reason: String| -> Result<(), Stop> {
            let reason = format!("include {:?}: {reason}", include.src);
            if include.continue_on_error {
                inc(&self.worker.shared.stats.esi_errors);
                tracing::debug!(page = %self.page.uri, reason, "ESI include left out");
                Ok(())
            } else {
                Err(Stop::Cut(reason))
            }
        };
        let answered = match fetch {
            Ok(Fetch::Done(answered)) => answered,
            Ok(Fetch::Running(handle)) => {
                // The client waits for it: what is compressed so far leaves first.
                self.out.flush().await?;
                handle.await
            }
            Err(reason) => return failed(reason),
        };
        let resp = match answered {
            Ok(resp) => resp,
            Err(e) => return failed(format!("request failed: {e}")),
        };
        if !matches!(resp.status().as_u16(), 200 | 204 | 206) {
            return failed(format!("status {}", resp.status()));
        }
        let mut body = resp.into_body();
        loop {
            match body.frame().await {
                None => return Ok(()),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.out.send(data).await?;
                    }
                }
                // Part of it is sent already: the page cannot be whole, whatever `onerror` says.
                Some(Err(e)) => {
                    return Err(Stop::Cut(format!(
                        "include {:?}: body failed: {e}",
                        include.src
                    )))
                }
            }
        }
    }
}

/// The template's next segment, reading its body as needed; `None` at its end.
async fn next_segment(template: &mut Body, reader: &mut Reader) -> Result<Option<Segment>, Stop> {
    let damaged = |e: TemplateError| Stop::Cut(e.to_string());
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
            Some(Err(e)) => return Err(Stop::Cut(format!("the page's body failed: {e}"))),
        }
    }
}

/// Where the assembled page goes: to the client's response, compressed on the way when it takes gzip.
struct Out {
    tx: mpsc::Sender<Result<Bytes, BoxError>>,
    encoder: Option<Encoder>,
}

impl Out {
    async fn send(&mut self, data: Bytes) -> Result<(), Stop> {
        match &mut self.encoder {
            None => self.put(data).await,
            Some(encoder) => {
                encoder.feed(data);
                self.drain().await
            }
        }
    }

    /// What the compressor holds, sent: before waiting on a fragment, so the client has the page so far.
    async fn flush(&mut self) -> Result<(), Stop> {
        match &mut self.encoder {
            None => Ok(()),
            Some(encoder) => {
                encoder.flush();
                self.drain().await
            }
        }
    }

    async fn end(&mut self) -> Result<(), Stop> {
        if let Some(encoder) = &mut self.encoder {
            encoder.end();
        }
        self.drain().await
    }

    async fn drain(&mut self) -> Result<(), Stop> {
        loop {
            let piece = match &mut self.encoder {
                None => return Ok(()),
                Some(encoder) => encoder
                    .piece()
                    .map_err(|e| Stop::Cut(format!("compressing the page failed: {e}")))?,
            };
            match piece {
                Some(piece) => self.put(piece).await?,
                None => return Ok(()),
            }
        }
    }

    async fn put(&mut self, data: Bytes) -> Result<(), Stop> {
        if data.is_empty() {
            return Ok(());
        }
        self.tx.send(Ok(data)).await.map_err(|_| Stop::Gone)
    }
}
