//! What watches every response leave, in one layer: the status and latency counters (what `varnishhist`
//! draws and Prometheus' request histograms hold), the bytes sent, the access log's line and the request's
//! span. The time to the head is taken when the response is handed to the connection, the time to the end
//! of its body when the body ends or is dropped, which also completes the log line and ends the span.

use std::{
    net::IpAddr,
    pin::Pin,
    sync::{atomic::Ordering::Relaxed, Arc},
    task::{Context, Poll},
    time::Instant,
};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body as HttpBody, Frame, SizeHint};
use lacquer_backends::body::{Body, BoxError};
use lacquer_edge::RequestBody;
use lacquer_telemetry::{RequestSpan, Trace};

use crate::{
    access_log::{Note, Recording},
    store::CacheStore,
    timing::Outcome,
    worker::{Shared, Worker},
};

/// A request being observed, from its arrival.
pub(crate) struct Observing {
    started: Instant,
    recording: Option<Recording>,
    span: Option<RequestSpan>,
}

impl Observing {
    /// Starts observing a request as it arrives: its clock, its log line when it is recorded, its span
    /// when it is traced; with what the data path notes for the log line and starts its spans from.
    pub fn begin<S: CacheStore>(
        shared: &Shared<S>,
        req: &Request<RequestBody>,
        client: IpAddr,
    ) -> (Self, Option<Arc<Note>>, Option<Trace>) {
        let recording = shared.access_log.begin(req, client);
        let note = recording.as_ref().map(Recording::note);
        let (span, trace) = shared.telemetry.begin(req, client).unzip();
        let observing = Self {
            started: lacquer_clock::monotonic(),
            recording,
            span,
        };
        (observing, note, trace)
    }

    /// Counts the response's status, observes its time to the head, records its head, and follows its
    /// body. `outcome` is the cache's verdict as the data path made it (before the deliver rules, which may
    /// rewrite `X-Cache`); `collapsed` when it joined another request's fetch. The body holds the worker
    /// that answered (whose count only its own thread touches), not the counters every worker shares.
    pub fn respond(
        self,
        worker: Arc<Worker>,
        resp: Response<Body>,
        outcome: Outcome,
        collapsed: bool,
    ) -> Response<Observed> {
        let Self {
            started,
            recording,
            span,
        } = self;
        let stats = &worker.shared.stats;
        stats.responses.count(resp.status());
        stats.latency[outcome.index()]
            .ttfb
            .observe(started.elapsed());
        let recording = recording.map(|mut r| {
            r.head(&resp);
            r
        });
        if let Some(span) = &span {
            span.respond(resp.status(), Some(outcome.name()), collapsed);
        }
        resp.map(|inner| Observed {
            inner,
            worker,
            started,
            outcome,
            recording,
            _span: span,
            ended: false,
        })
    }
}

/// A response body on its way to the client, observed.
pub struct Observed {
    inner: Body,
    worker: Arc<Worker>,
    started: Instant,
    outcome: Outcome,
    recording: Option<Recording>,
    /// Ends the span when the body is done with.
    _span: Option<RequestSpan>,
    /// Its end was observed already.
    ended: bool,
}

impl Observed {
    fn end(&mut self) {
        if !self.ended {
            self.ended = true;
            self.worker.shared.stats.latency[self.outcome.index()]
                .total
                .observe(self.started.elapsed());
        }
    }
}

impl HttpBody for Observed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let frame = Pin::new(&mut this.inner).poll_frame(cx);
        match &frame {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(data) = f.data_ref() {
                    let n = data.len() as u64;
                    this.worker.shared.stats.bytes_out.fetch_add(n, Relaxed);
                    if let Some(r) = &mut this.recording {
                        r.sent(n);
                    }
                }
                if this.inner.is_end_stream() {
                    this.end();
                }
            }
            Poll::Ready(_) => this.end(),
            Poll::Pending => {}
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        // A body never polled (a HEAD, an empty one) or given up by its client ends here.
        self.end();
        if let Some(recording) = self.recording.take() {
            recording.finish();
        }
    }
}
