//! Client-side latency by cache outcome, and client responses by status code: what `varnishhist` draws and
//! Prometheus' request histograms hold. Observed for every request as its response leaves `Service::call`:
//! the time to the head when the response is handed to the connection, the time to the end of its body
//! when the body ends or is dropped.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Instant,
};

use bytes::Bytes;
use http::{HeaderMap, Response};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use lacquer_backends::body::{Body, BoxError};

use crate::{error_page::Failure, respond::X_CACHE, stats::Stats};

/// An outcome, as an index into [`OUTCOMES`](lacquer_admin::wire::OUTCOMES).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outcome(usize);

impl Outcome {
    const HIT: Self = Self(0);
    const MISS: Self = Self(1);
    const PASS: Self = Self(2);
    const STALE: Self = Self(3);
    const SYNTH: Self = Self(4);

    /// Read off a response of the data path: its `X-Cache`, unless it was made here (an error, a refusal,
    /// a rule's page, an answer to `OPTIONS *` or a purge, which carry none or a `PASS` of their own).
    pub(crate) fn of(resp: &Response<Body>) -> Self {
        if let Some(kept) = resp.extensions().get::<Outcome>() {
            return *kept;
        }
        if resp.extensions().get::<Failure>().is_some() || resp.extensions().get::<Made>().is_some()
        {
            return Self::SYNTH;
        }
        Self::from_x_cache(resp.headers())
    }

    /// `hit`, `miss`, `pass`, `stale` or `synth`.
    pub(crate) fn name(self) -> &'static str {
        lacquer_admin::wire::OUTCOMES[self.0]
    }

    fn from_x_cache(headers: &HeaderMap) -> Self {
        match headers.get(X_CACHE).map(|v| v.as_bytes()) {
            Some(b"HIT") => Self::HIT,
            Some(b"MISS") => Self::MISS,
            Some(b"PASS") => Self::PASS,
            Some(b"STALE") => Self::STALE,
            _ => Self::SYNTH,
        }
    }

    /// Keeps the outcome in the response, for deliver rules that may remove or rewrite its `X-Cache`.
    pub(crate) fn keep(resp: &Response<Body>) -> impl FnOnce(&mut Response<Body>) {
        let outcome = Self::of(resp);
        move |resp| {
            resp.extensions_mut().insert(outcome);
        }
    }
}

/// Marks a response lacquerd made itself without a `Failure` page (a refusal): `synth`, whatever its
/// `X-Cache` says.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Made;

/// Counts the response's status, observes its time to the head, and follows its body to observe the time
/// to its end.
pub(crate) fn timed(resp: Response<Body>, stats: Arc<Stats>, started: Instant) -> Response<Body> {
    let outcome = Outcome::of(&resp);
    stats.responses.count(resp.status());
    stats.latency[outcome.0].ttfb.observe(started.elapsed());
    resp.map(|inner| {
        Timed {
            inner,
            pending: Some((stats, outcome, started)),
        }
        .boxed_unsync()
    })
}

struct Timed {
    inner: Body,
    pending: Option<(Arc<Stats>, Outcome, Instant)>,
}

impl Timed {
    fn observe(&mut self) {
        if let Some((stats, outcome, started)) = self.pending.take() {
            stats.latency[outcome.0].total.observe(started.elapsed());
        }
    }
}

impl HttpBody for Timed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(frame, Poll::Ready(None) | Poll::Ready(Some(Err(_))))
            || self.inner.is_end_stream()
        {
            self.observe();
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

impl Drop for Timed {
    fn drop(&mut self) {
        // A body never polled (a HEAD, an empty one) or given up by its client ends here.
        self.observe();
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderValue, StatusCode};

    use super::*;

    fn response(x_cache: Option<&'static str>) -> Response<Body> {
        let mut resp = Response::new(lacquer_backends::body::empty());
        if let Some(v) = x_cache {
            resp.headers_mut()
                .insert(X_CACHE, HeaderValue::from_static(v));
        }
        resp
    }

    #[test]
    fn outcomes_come_from_x_cache_unless_made_here() {
        let cases = [
            (Some("HIT"), Outcome::HIT),
            (Some("MISS"), Outcome::MISS),
            (Some("PASS"), Outcome::PASS),
            (Some("STALE"), Outcome::STALE),
            (Some("hit"), Outcome::SYNTH),
            (None, Outcome::SYNTH),
        ];
        for (x_cache, outcome) in cases {
            assert_eq!(Outcome::of(&response(x_cache)), outcome, "{x_cache:?}");
        }
        let mut refused = response(Some("PASS"));
        refused.extensions_mut().insert(Made);
        assert_eq!(Outcome::of(&refused), Outcome::SYNTH);
        let mut failed = response(Some("MISS"));
        failed.extensions_mut().insert(Failure);
        assert_eq!(Outcome::of(&failed), Outcome::SYNTH);
    }

    #[test]
    fn a_kept_outcome_outlives_a_rewritten_x_cache() {
        let mut resp = response(Some("HIT"));
        let keep = Outcome::keep(&resp);
        resp.headers_mut().remove(X_CACHE);
        keep(&mut resp);
        assert_eq!(Outcome::of(&resp), Outcome::HIT);
    }

    #[tokio::test]
    async fn head_and_end_are_observed_once_each() {
        let stats = Arc::new(Stats::default());
        let mut resp = response(Some("MISS"));
        *resp.status_mut() = StatusCode::NOT_FOUND;
        *resp.body_mut() = lacquer_backends::body::full("body");
        let resp = timed(resp, stats.clone(), lacquer_clock::monotonic());
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"body");
        let miss = &stats.latency()[Outcome::MISS.0];
        assert_eq!(miss.outcome, "miss");
        assert_eq!(miss.latency.ttfb.count(), 1);
        assert_eq!(miss.latency.total.count(), 1);
        assert_eq!(stats.responses().get(&404), Some(&1));
        let others: u64 = stats
            .latency()
            .iter()
            .filter(|l| l.outcome != "miss")
            .map(|l| l.latency.ttfb.count() + l.latency.total.count())
            .sum();
        assert_eq!(others, 0);
    }
}
