//! A request's server span ([`lacquer_telemetry`]) from the response: what it recorded, and its end when
//! the body has been sent.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::Response;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use lacquer_backends::body::{Body, BoxError};
use lacquer_telemetry::RequestSpan;

use crate::{respond::CACHE_STATUS, timing::Outcome};

/// Records the response on the request's span, which ends when the body ends or is dropped.
pub fn respond(span: RequestSpan, resp: Response<Body>) -> Response<Body> {
    // The outcome is decided along many paths, and this is the one place they all reach; it is read as the
    // latency histograms read it, from before the deliver rules.
    let headers = resp.headers();
    let cache = Some(Outcome::of(&resp).name());
    let collapsed = headers
        .get(CACHE_STATUS)
        .is_some_and(|v| v.as_bytes().windows(9).any(|w| w == b"collapsed"));
    span.respond(resp.status(), cache, collapsed);
    resp.map(|inner| Traced { inner, _span: span }.boxed_unsync())
}

struct Traced {
    inner: Body,
    /// Ends the span when the body is done with.
    _span: RequestSpan,
}

impl HttpBody for Traced {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
