//! The fill's first stage: the request sent to the origin, and its answer's head made what every later
//! stage reads (the backend-response phase's built-in part, a `Date`, the age the response arrived with).

use std::{
    borrow::Cow,
    sync::Arc,
    time::{Instant, SystemTime},
};

use http::{header, request::Parts, response, HeaderValue};
use lacquer_backends::{Backend, BackendBody, BackendError};
use lacquer_policy::age::corrected_initial_age;
use lacquer_rules::{Phase, Rules};
use lacquer_telemetry::{Child, Trace};

use super::request::{Ending, Fill};
use crate::{
    coalesce::{Fetch, FetchError, HeadError},
    forward, phase,
    stats::inc,
    store::CacheStore,
    worker::Worker,
};

/// The origin's answer, its head ready for the decision.
pub(super) struct Sent<'a> {
    pub head: response::Parts,
    pub body: BackendBody,
    /// The connection pool it came over: its `between_bytes_timeout` bounds the body.
    pub backend: Backend,
    /// The head the origin received (the backend-request rules' copy, when they edit it).
    pub sent_head: Cow<'a, Parts>,
    /// The request's trace, when it is sampled.
    pub trace: Option<&'a Trace>,
    /// The fill's span: it ends when this is dropped, once the body is in, stored or not.
    pub _fetching: Option<Child>,
    pub response_time: SystemTime,
    pub received_at: Instant,
    /// The response's age when it arrived (RFC 9111 §4.2.3).
    pub initial_age: u64,
}

/// Sends the fill's request (once more on a fresh connection when a pooled one was closed), unless every
/// reader leaves first; `Err` with how the fill ended when no head came.
pub(super) async fn send<'a, S: CacheStore>(
    worker: &Arc<Worker<S>>,
    fetch: &Arc<Fetch<S>>,
    request: &'a Fill,
    rules: &Rules,
) -> Result<Sent<'a>, Ending> {
    let Fill {
        key,
        parts,
        client,
        route,
        stale,
        ..
    } = request;
    let key = key.as_str();
    let shared = &worker.shared;
    let decided = &request.decided;
    let trace = request.trace.as_ref();
    let backend = match route.pick_from(decided.target.as_ref(), key) {
        Ok(state) => {
            // A refresh nobody waits for is logged by no one: the request it came from is answered.
            if !request.background {
                if let Some(note) = &request.note {
                    note.backend(state.name());
                }
            }
            worker.pool(state)
        }
        Err(e) => return Err(failed(worker, fetch, key, e)),
    };
    // The fill's span, of the request that started it (a request that joins it has its own span only);
    // it lasts until the body is in, stored or not.
    let fetching = trace.map(|t| {
        t.fetch(
            &parts.method,
            backend.state.name(),
            &backend.state.authority,
        )
    });
    if let (Some(span), true) = (&fetching, request.background) {
        span.set("lacquer.background", true);
    }
    let request_time = lacquer_clock::wall();
    // With nothing stored to validate with, the client's own validators may go: a 304 is not shareable,
    // so any request coalesced on this fill fetches again for itself rather than take it.
    let client_validators = stale.is_none() && !request.background && request.part.is_none();
    // The backend-request rules edit a copy of the head once per fill: the copy is what is sent (twice
    // when a pooled connection was stale), and what a variant is checked against below.
    let sent_head = if rules.has(Phase::BackendRequest) {
        let mut sent = Parts::clone(parts);
        phase::backend_request(rules, parts, *client, decided, &mut sent.headers);
        Cow::Owned(sent)
    } else {
        Cow::Borrowed(&**parts)
    };
    let build = || {
        let mut req = forward::fill_request(
            &sent_head,
            *client,
            client_validators,
            decided.body.as_ref(),
        );
        if let Some(span) = &fetching {
            span.inject(req.headers_mut());
        }
        forward::forward_interim(&mut req, &shared.stats, request.interim.as_ref());
        if let Some(ask) = request.part {
            let headers = req.headers_mut();
            headers.insert(
                header::RANGE,
                HeaderValue::from_str(&ask.header()).expect("digits"),
            );
            // A part is a byte range of the origin's own representation; a coding it chose per request
            // could not be joined with the next one.
            headers.remove(header::ACCEPT_ENCODING);
            if let Some(validator) = &request.if_range {
                headers.insert(header::IF_RANGE, validator.clone());
            }
        }
        if let Some(stale) = stale {
            let meta = stale.meta();
            for (validator, condition) in [
                (header::ETAG, header::IF_NONE_MATCH),
                (header::LAST_MODIFIED, header::IF_MODIFIED_SINCE),
            ] {
                if let Some(value) = meta
                    .header(validator.as_str())
                    .and_then(|v| HeaderValue::from_bytes(v).ok())
                {
                    req.headers_mut().insert(condition, value);
                }
            }
        }
        req
    };
    // A pooled connection the origin closed while idle fails the first request sent on it; a fill has no
    // body to lose, so it is sent once more on a fresh connection.
    let send = async {
        // Boxed: hyper's client future is ten kilobytes, which the fill task would otherwise carry whole
        // from its spawn, copied into the task's memory on every miss.
        match Box::pin(backend.send(build())).await {
            Err(BackendError::Failed { .. }) => Box::pin(backend.send(build())).await,
            other => other,
        }
    };
    // Clients that give up (an HTTP/2 reset, a closed connection) before the head arrives take the request
    // to the origin with them.
    let sent = tokio::select! {
        sent = send => sent,
        () = fetch.deserted(), if !request.background => {
            tracing::debug!(key, "every reader left before the response head; fetch cancelled");
            return Err(Ending::Cancelled);
        }
    };
    let resp = match sent {
        Ok(resp) => resp,
        Err(e) => {
            request.step("Error", || e.to_string());
            if let Some(span) = &fetching {
                span.fail("backend_error");
            }
            return Err(failed(worker, fetch, key, e));
        }
    };
    if let Some(span) = &fetching {
        span.status(resp.status());
    }
    let response_time = lacquer_clock::wall();
    let received_at = lacquer_clock::monotonic();
    request.step("Origin", || resp.status().to_string());
    let (mut head, body) = resp.into_parts();
    phase::origin_fields(decided, &mut head.headers);
    if !head.headers.contains_key(header::DATE) {
        head.headers.insert(
            header::DATE,
            HeaderValue::from_str(&httpdate::fmt_http_date(response_time)).expect("date"),
        );
    }
    let initial_age = corrected_initial_age(&head.headers, request_time, response_time);
    head.headers.remove(header::AGE);
    Ok(Sent {
        head,
        body,
        backend,
        sent_head,
        trace,
        _fetching: fetching,
        response_time,
        received_at,
        initial_age,
    })
}

/// A fill that got no response head: nothing to send to (sick, or every connection busy), or the send
/// failed. Readers get the error's status.
fn failed<S: CacheStore>(
    worker: &Worker<S>,
    fetch: &Fetch<S>,
    key: &str,
    e: BackendError,
) -> Ending {
    if let BackendError::Unavailable { .. } = e {
        inc(&worker.shared.stats.backend_unavailable);
        crate::repeats::WARNINGS.warn("nothing to fetch from", key, &e);
    } else {
        crate::repeats::WARNINGS.warn("fetch failed", key, &e);
    }
    fetch.set_head(Err(HeadError {
        status: e.status(),
        error: FetchError::new(e.to_string()),
    }));
    Ending::Failed
}
