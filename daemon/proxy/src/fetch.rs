//! The fill task: one backend fetch that streams into a shared [`Fetch`] for its readers and, when the
//! response is storable, into the store.

use std::{
    borrow::Cow,
    net::IpAddr,
    panic::AssertUnwindSafe,
    sync::Arc,
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use futures_util::FutureExt;
use http::{header, request::Parts, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use http_body::Body as _;
use http_body_util::BodyExt;
use lacquer_rules::Phase;
use lacquer_storage::{ObjectMeta, PartKept};
use lacquer_telemetry::Trace;

use crate::{flow::step::Found, forward};
use lacquer_backends::{error_chain, routing::Route, BackendError};
use lacquer_policy::{
    age::corrected_initial_age,
    encoding::{self, Coded},
    range,
    storable::{self, Credentials, Decision, NotStored, Storable},
    surrogate, vary, Policy,
};

use crate::{
    coalesce::{Fetch, FetchError, FetchedHead, HeadError},
    coding::{FillCoding, Pushed},
    phase::{self, Decided},
    prefetch,
    stats::{add, dec, inc},
    store::{BodyWriter, CacheStore},
    worker::Worker,
};

/// How a fill ended, for the coalescer: whether later requests should skip coalescing for a while.
enum Ending {
    Stored,
    /// The origin confirmed the stored object (304); its headers and freshness were refreshed.
    Revalidated,
    NotStored(NotStored),
    /// The origin answered the client's own conditional with 304: an answer for that client alone, which
    /// says nothing about whether the URL is cacheable.
    NotModified,
    Failed,
    /// Every reader left while the body was not being stored: the origin read stopped.
    Cancelled,
}

/// One fill: what to fetch, for whom, and what is stored already.
pub struct Fill {
    pub key: String,
    /// Whether the fetch is the coalescer's entry for the key (unregistered when done).
    pub registered: bool,
    /// The request the fill is made for: its headers select the variant.
    pub parts: Arc<Parts>,
    /// That request's head as the client sent it, before the request phase, when its route prefetches: a
    /// playlist's references resolve against it, and prefetches are made from it.
    pub asked: Option<Arc<Parts>>,
    pub client: IpAddr,
    /// The route the request took: its backend and cache policy.
    pub route: Arc<Route>,
    /// What the request's rules decided for the later phases.
    pub decided: Decided,
    /// A stored variant with validators: they go with the request, and a 304 refreshes it instead of
    /// transferring the body again (RFC 9111 §4.3).
    pub stale: Option<Found>,
    /// A refresh nobody waits for (grace): it is not cancelled for want of readers before its head arrives.
    pub background: bool,
    /// The stored variant can still stand in for a failing origin (grace or stale-if-error): a server
    /// error does not replace it.
    pub stand_in: bool,
    /// A byte range asked for instead of the whole: a 206 carrying it is stored as a part of the object's
    /// body.
    pub part: Option<Ask>,
    /// Sent as `If-Range` with `part`: the stored object's strong validator, so that an origin whose object
    /// changed answers with the whole instead of a part of another version.
    pub if_range: Option<HeaderValue>,
}

/// A byte range a fill asks the origin for instead of the whole object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// Exactly bytes `first..=last` (`None`: to the end): a slice of a sliced route, or bytes between the
    /// parts stored. A 206 carrying other bytes is refused.
    Bytes(u64, Option<u64>),
    /// A client's own range of an object not stored, forwarded (`cache.forward_ranges`): its 206 is
    /// stored wherever its `Content-Range` places it.
    Client(range::Single),
}

impl Ask {
    /// The key a fetch of this range of `key` is coalesced under: a space is in no cache key (a request
    /// target has none), so it names no other object.
    pub fn key(self, key: &str) -> String {
        format!("{key} {}", self.header())
    }

    /// The `Range` value sent.
    fn header(self) -> String {
        match self {
            Ask::Bytes(first, last) => range::Single::From(first, last).header(),
            Ask::Client(single) => single.header(),
        }
    }
}

pub async fn run<S: CacheStore>(worker: Arc<Worker<S>>, fetch: Arc<Fetch<S>>, request: Fill) {
    let stats = &worker.shared.stats;
    inc(&stats.fetches_in_flight);
    inc(&stats.backend_requests);
    // A bug must not leave this fetch's readers waiting forever (found when a TLS connector panicked).
    let ending = match AssertUnwindSafe(fill(&worker, &fetch, &request))
        .catch_unwind()
        .await
    {
        Ok(ending) => ending,
        Err(_) => {
            tracing::error!(key = %request.key, "the fetch panicked; its readers get 502");
            fetch.abandon(HeadError {
                status: StatusCode::BAD_GATEWAY,
                error: FetchError::new("internal error while fetching"),
            });
            Ending::Failed
        }
    };
    dec(&stats.fetches_in_flight);
    let coalescer = &worker.shared.coalescer;
    let Fill {
        key,
        registered,
        route,
        part,
        ..
    } = request;
    let key = match part {
        Some(ask) => ask.key(&key),
        None => key,
    };
    match ending {
        Ending::Stored => {
            inc(&stats.objects_stored);
            coalescer.clear_hit_for_miss(&key);
        }
        Ending::Revalidated => {
            inc(&stats.revalidations);
            coalescer.clear_hit_for_miss(&key);
        }
        Ending::Failed => inc(&stats.backend_errors),
        Ending::NotStored(_) => inc(&stats.uncacheable),
        Ending::NotModified => {}
        Ending::Cancelled => inc(&stats.fetches_cancelled),
    }
    if registered {
        let uncacheable = match ending {
            Ending::NotStored(why) => Some((route.policy.cache.hit_for_miss, why)),
            _ => None,
        };
        coalescer.finish(&key, &fetch, uncacheable);
    }
    fetch.settle();
}

const KEEP_ON_UPDATE: [HeaderName; 4] = [
    header::CONTENT_LENGTH,
    header::CONTENT_ENCODING,
    header::CONTENT_RANGE,
    header::ETAG,
];

/// A 304 for a stored object: its headers are updated from the 304 (RFC 9111 §4.3.4), its freshness is
/// recomputed, and the readers get the stored body, which the origin did not send again.
async fn revalidated<S: CacheStore>(
    worker: &Worker<S>,
    fetch: &Arc<Fetch<S>>,
    request: &Fill,
    stale: &Found,
    update: HeaderMap,
    initial_age: u64,
    response_time: SystemTime,
) -> Ending {
    let store = &worker.shared.store;
    let key = request.key.as_str();
    let old = stale.meta();
    let mut headers = old.header_map(0);
    for name in update.keys() {
        // Fields that describe the stored body itself keep describing it (RFC 9111 §3.2): a 304 cannot
        // change the bytes, so it cannot change their length, coding, range, digest or entity-tag.
        if KEEP_ON_UPDATE.contains(name) || name == "content-md5" {
            continue;
        }
        headers.remove(name);
        for value in update.get_all(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    let status = StatusCode::from_u16(old.status).unwrap_or(StatusCode::OK);
    let policy = &request.route.policy;
    // The stored head may carry what rules wrote when it was filled: whether an authorized answer is
    // shared is read from what the origin says now, in its 304.
    let credentials = Credentials::of(
        request.parts.headers.contains_key(header::AUTHORIZATION),
        &update,
        policy,
    );
    let live = worker.shared.live();
    let adjust = phase::backend_response(
        &live.rules,
        &request.parts,
        request.client,
        &request.decided,
        status,
        &mut headers,
    );
    let decision = storable::decide_adjusted(
        credentials,
        status,
        &headers,
        policy,
        &adjust,
        response_time,
    );
    let ttl = match &decision {
        Decision::Store(s) => s.ttl.saturating_sub(Duration::from_secs(initial_age)),
        Decision::DontStore(_) => Duration::ZERO,
    };
    if !store.has_body(old) {
        fetch.set_head(Err(HeadError {
            status: StatusCode::BAD_GATEWAY,
            error: FetchError::new("the stored body was lost during revalidation"),
        }));
        let _ = store.remove_generation(key, old.generation);
        return Ending::Failed;
    }
    fetch.set_head(Ok(Arc::new(FetchedHead {
        status,
        headers: headers.clone(),
        // What may not be stored (a `Set-Cookie`, `private`, ...) is this request's answer alone.
        shareable: matches!(decision, Decision::Store(_)),
        not_stored: match decision {
            Decision::DontStore(why) => Some(why),
            Decision::Store(_) => None,
        },
        selection: old.variant.clone(),
        initial_age,
        received_at: lacquer_clock::monotonic(),
        ttl,
        revalidated: true,
    })));
    fetch.complete_from_store(store.clone(), old.clone());
    let result = match decision {
        Decision::Store(s) => {
            let meta = with_response(
                old.clone(),
                &headers,
                &s,
                initial_age,
                response_time,
                policy,
            );
            store.refresh(key, meta).map(drop)
        }
        Decision::DontStore(_) => {
            // The readers are reading the confirmed body from the store: it goes once they are done.
            let (fetch, store, key) = (fetch.clone(), store.clone(), key.to_owned());
            let generation = old.generation;
            tokio::spawn(async move {
                fetch.deserted().await;
                if let Err(e) = store.remove_generation(&key, generation) {
                    tracing::warn!(key, error = %e, "dropping a revalidated object failed");
                }
            });
            Ok(())
        }
    };
    if let Err(e) = result {
        tracing::warn!(key, error = %e, "updating a revalidated object failed");
    }
    Ending::Revalidated
}

/// `base` carrying the headers and freshness of a response the store keeps.
fn with_response(
    base: ObjectMeta,
    headers: &HeaderMap,
    storable: &Storable,
    initial_age: u64,
    response_time: SystemTime,
    policy: &Policy,
) -> ObjectMeta {
    ObjectMeta {
        tags: surrogate::tags(headers, &policy.cache.surrogate_key_headers),
        headers: headers
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect(),
        stored_at_ms: lacquer_clock::to_ms(response_time),
        initial_age_s: initial_age,
        ttl_ms: storable.ttl.as_millis() as u64,
        grace_ms: storable.grace.as_millis() as u64,
        keep_ms: storable.keep.as_millis() as u64,
        stale_if_error_ms: storable.stale_if_error.as_millis() as u64,
        no_stale: storable.no_stale,
        ..base
    }
}

/// Where the bytes of a 206 answering a request for `asked` (inclusive positions; the last may lie past
/// the end) are: `(first, last, total)`, when its `Content-Range` places exactly them, that is the first
/// asked for and up to the last asked for or the end of the representation; otherwise why not.
pub fn placed_part(headers: &HeaderMap, asked: (u64, u64)) -> Result<(u64, u64, u64), String> {
    let value = headers
        .get(header::CONTENT_RANGE)
        .ok_or("no Content-Range")?;
    let (first, last, total) = range::content_range(value.as_bytes())
        .ok_or_else(|| format!("Content-Range {value:?} gives no place in a known length"))?;
    if first != asked.0 || last != asked.1.min(total - 1) {
        return Err(format!(
            "Content-Range {value:?} for bytes {}-{}",
            asked.0, asked.1
        ));
    }
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if length.is_some_and(|len| len != last - first + 1) {
        return Err(format!("Content-Range {value:?} with {length:?} bytes"));
    }
    Ok((first, last, total))
}

/// Where the bytes of a 206 are, `(first, last, total)`, wherever its `Content-Range` places them in a
/// representation of known length, with a `Content-Length` (when given) that agrees; otherwise why not.
pub fn placed_anywhere(headers: &HeaderMap) -> Result<(u64, u64, u64), String> {
    let value = headers
        .get(header::CONTENT_RANGE)
        .ok_or("no Content-Range")?;
    let (first, last, total) = range::content_range(value.as_bytes())
        .ok_or_else(|| format!("Content-Range {value:?} gives no place in a known length"))?;
    placed_part(headers, (first, last))
        .map_err(|_| format!("Content-Range {value:?} with another Content-Length"))?;
    Ok((first, last, total))
}

/// Whether a response carries a validator that can prove two of its byte ranges belong together: a strong
/// entity-tag, or a strong `Last-Modified` where there is no entity-tag (`range::proving`).
fn has_strong_validator(headers: &HeaderMap) -> bool {
    let value = |name| headers.get(name).map(HeaderValue::as_bytes);
    let validators = (value(header::ETAG), value(header::LAST_MODIFIED));
    range::if_range(validators, value(header::DATE)).is_some()
}

/// Whether a response is an HLS playlist: by its type, or by the `.m3u8` its path ends with.
fn is_playlist(headers: &HeaderMap, parts: &Parts) -> bool {
    let kind = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase());
    match kind.as_deref() {
        Some(
            "application/vnd.apple.mpegurl"
            | "application/x-mpegurl"
            | "audio/mpegurl"
            | "audio/x-mpegurl",
        ) => true,
        _ => parts.uri.path().ends_with(".m3u8"),
    }
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

/// Sends one piece of the body to the fetch's readers and, while storing, to the store; the `last` piece
/// of a body ends it as it reaches the readers. Returns whether the piece took the body past
/// `max_object_size`, which stopped storing it.
async fn forward_piece<S: CacheStore>(
    fetch: &Fetch<S>,
    writer: &mut Option<S::Writer>,
    piece: Bytes,
    max_object_size: u64,
    key: &str,
    last: bool,
) -> bool {
    if last {
        fetch.push_last(piece.clone());
    } else {
        fetch.push(piece.clone());
    }
    if let Some(w) = writer.as_mut() {
        let over = w.length() + piece.len() as u64 > max_object_size;
        if over {
            tracing::info!(key, "body exceeds max_object_size; not storing");
        }
        if over || w.push(&piece).await.is_err() {
            fetch.stop_storing(writer.take());
        }
        return over;
    }
    false
}

/// A compressed body from the origin that does not decode: nothing is stored and the readers' responses
/// end in an error, so none takes it for complete.
fn corrupt<S: CacheStore>(
    worker: &Worker<S>,
    fetch: &Fetch<S>,
    key: &str,
    e: lacquer_codec::CodecError,
) -> Ending {
    inc(&worker.shared.stats.corrupt_bodies);
    tracing::warn!(key, error = %e, "backend body does not decode; nothing stored");
    fetch.end(Err(FetchError::new(format!("backend body failed: {e}"))));
    Ending::Failed
}

async fn fill<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    fetch: &Arc<Fetch<S>>,
    request: &Fill,
) -> Ending {
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
    let policy = &route.policy;
    let live = shared.live();
    let rules = &live.rules;
    let decided = &request.decided;
    let trace = Trace::of(&parts.extensions);
    let backend = match route.pick_from(decided.target.as_ref(), key) {
        Ok(state) => {
            // A refresh nobody waits for is logged by no one: the request it came from is answered.
            if !request.background {
                crate::access_log::note_backend(parts, state.name());
            }
            worker.pool(state)
        }
        Err(e) => return failed(worker, fetch, key, e),
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
        forward::count_interim(&mut req, &shared.stats);
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
        match backend.send(build()).await {
            Err(BackendError::Failed { .. }) => backend.send(build()).await,
            other => other,
        }
    };
    // Clients that give up (an HTTP/2 reset, a closed connection) before the head arrives take the request
    // to the origin with them.
    let sent = tokio::select! {
        sent = send => sent,
        () = fetch.deserted(), if !request.background => {
            tracing::debug!(key, "every reader left before the response head; fetch cancelled");
            return Ending::Cancelled;
        }
    };
    let resp = match sent {
        Ok(resp) => resp,
        Err(e) => {
            crate::access_log::step(parts, "Error", || e.to_string());
            if let Some(span) = &fetching {
                span.fail("backend_error");
            }
            return failed(worker, fetch, key, e);
        }
    };
    if let Some(span) = &fetching {
        span.status(resp.status());
    }
    let response_time = lacquer_clock::wall();
    let received_at = lacquer_clock::monotonic();
    crate::access_log::step(parts, "Origin", || resp.status().to_string());
    let (mut head, mut body) = resp.into_parts();
    phase::origin_fields(decided, &mut head.headers);
    if !head.headers.contains_key(header::DATE) {
        head.headers.insert(
            header::DATE,
            HeaderValue::from_str(&httpdate::fmt_http_date(response_time)).expect("date"),
        );
    }
    let initial_age = corrected_initial_age(&head.headers, request_time, response_time);
    head.headers.remove(header::AGE);
    if let (StatusCode::NOT_MODIFIED, Some(stale)) = (head.status, stale) {
        return revalidated(
            worker,
            fetch,
            request,
            stale,
            head.headers,
            initial_age,
            response_time,
        )
        .await;
    }

    // Read before the rules edit the head: whether the origin itself shares an authorized answer.
    let credentials = Credentials::of(
        parts.headers.contains_key(header::AUTHORIZATION),
        &head.headers,
        policy,
    );
    let adjust = phase::backend_response(
        rules,
        parts,
        *client,
        decided,
        head.status,
        &mut head.headers,
    );
    // The part of the object a 206 carries. Asked for exact bytes, it carries exactly them, or nothing is
    // stored or sent as that part; otherwise (a client's range, or an origin that answers a whole request
    // with a part) wherever its `Content-Range` places it, or it goes to its readers as sent, unstored.
    let placed = match (request.part, head.status) {
        (Some(Ask::Bytes(first, last)), StatusCode::PARTIAL_CONTENT) => {
            match placed_part(&head.headers, (first, last.unwrap_or(u64::MAX))) {
                Ok(placed) => Some(placed),
                Err(reason) => {
                    inc(&shared.stats.slice_errors);
                    tracing::warn!(
                        key,
                        reason,
                        "the origin's answer to a range request cannot be placed"
                    );
                    fetch.set_head(Err(HeadError {
                        status: StatusCode::BAD_GATEWAY,
                        error: FetchError::new(format!("bad answer to a range request: {reason}")),
                    }));
                    return Ending::Failed;
                }
            }
        }
        (_, StatusCode::PARTIAL_CONTENT) => match placed_anywhere(&head.headers) {
            Ok(placed) => Some(placed),
            Err(reason) => {
                inc(&shared.stats.slice_errors);
                tracing::warn!(key, reason, "a 206 that cannot be placed; not storing");
                None
            }
        },
        _ => None,
    };
    let too_large = head
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .is_some_and(|len| len > policy.cache.max_object_size.as_u64());
    let part_refused = placed.and_then(|(_, _, total)| {
        if total > policy.cache.max_sliced_object_size.as_u64() {
            Some(NotStored::TooLargeSliced)
        } else if route.slice.is_some() && !has_strong_validator(&head.headers) {
            // Nothing would prove that the next slice is of the same version of the object. Elsewhere
            // such a part is kept alone: it answers ranges within it, and is never joined with another.
            Some(NotStored::PartUnjoinable)
        } else if encoding::coded(&head.headers) != Coded::Identity {
            // Bytes of a coding the origin chose for one request: joined with the next part, or sent to a
            // client that did not ask for that coding, they would be wrong.
            Some(NotStored::PartUnjoinable)
        } else {
            None
        }
    });
    // A part is stored as its object is: as if the whole had been answered.
    let judged = if placed.is_some() {
        StatusCode::OK
    } else {
        head.status
    };
    let decision = match storable::decide_adjusted(
        credentials,
        judged,
        &head.headers,
        policy,
        &adjust,
        response_time,
    ) {
        Decision::Store(_) if too_large => Decision::DontStore(NotStored::TooLarge),
        Decision::Store(_) if part_refused.is_some() => {
            Decision::DontStore(part_refused.expect("checked"))
        }
        // What a range request gets besides its part says nothing of the object but for these: the whole
        // (an origin that ignores ranges), or that there is no such object. A 416 to a range past the end
        // is that request's answer alone; stored, it would answer every request for the object.
        Decision::Store(_)
            if request.part.is_some()
                && placed.is_none()
                && !matches!(head.status.as_u16(), 200 | 404 | 410) =>
        {
            Decision::DontStore(NotStored::PartAnswer)
        }
        // RFC 9111 §3: a POST's response is stored only when it says how long it is fresh.
        Decision::Store(_)
            if decided.body.is_some() && !storable::explicitly_fresh(&head.headers, policy) =>
        {
            Decision::DontStore(NotStored::PostWithoutFreshness)
        }
        Decision::Store(_) if request.stand_in && !storable::replaces_stand_in(head.status) => {
            Decision::DontStore(NotStored::StandIn)
        }
        d => d,
    };
    let (storable, selection, not_stored) = match &decision {
        Decision::Store(s) => {
            // Under `[compression]` every stored response varies on the shared `Accept-Encoding`: with
            // compression turned off, clients' own values no longer select what was stored for it.
            let mut names = s.vary.clone();
            if policy.compression.is_some() && !names.iter().any(|n| n == "accept-encoding") {
                names.push("accept-encoding".into());
            }
            for name in &decided.key {
                if !names.iter().any(|n| n == name.as_str()) {
                    names.push(name.as_str().to_owned());
                }
            }
            let selection = vary::selection(&names, &parts.headers);
            if vary::selection(&names, &sent_head.headers) != selection {
                // The origin saw another value than the one a lookup selects with: stored, it would
                // answer requests it was not made for.
                tracing::debug!(
                    key,
                    "varies on a field a backend_request rule changed; not storing"
                );
                (None, Vec::new(), Some(NotStored::VariesOnRewritten))
            } else {
                (Some(s.clone()), selection, None)
            }
        }
        Decision::DontStore(reason) => {
            tracing::debug!(key, %reason, "not storing");
            (None, Vec::new(), Some(*reason))
        }
    };
    crate::access_log::step(parts, "Store", || match (&storable, not_stored) {
        (Some(s), _) => format!(
            "storing: ttl {} s, grace {} s, keep {} s, varies on [{}]",
            s.ttl.as_secs(),
            s.grace.as_secs(),
            s.keep.as_secs(),
            selection
                .iter()
                // Each field line of the value follows a newline; none: the field was absent.
                .map(|(name, value)| match value.strip_prefix('\n') {
                    Some(lines) => format!("{name}: {:?}", lines.replace('\n', ", ")),
                    None => format!("{name} absent"),
                })
                .collect::<Vec<_>>()
                .join(", ")
        ),
        (None, Some(reason)) => format!("not stored: {reason}"),
        (None, None) => "not stored".into(),
    });
    let mut writer = match &storable {
        Some(_) => match shared.store.writer(key, &selection, fetch.since()) {
            Ok(w) => Some(w),
            // A full disk or a dead store task: the store has logged and counted it once.
            Err(e) if e.is_refusal() => None,
            Err(e) => {
                tracing::warn!(key, error = %e, "cannot store");
                None
            }
        },
        None => None,
    };
    if let Some(w) = &writer {
        fetch.store_into(w);
    }
    let not_stored = match (&storable, &writer) {
        (Some(_), None) => Some(NotStored::StoreRefused),
        _ => not_stored,
    };
    // From the first byte written to the object's publication (or its abandonment).
    let storing = trace.filter(|_| writer.is_some()).map(Trace::store);
    let max_object_size = policy.cache.max_object_size.as_u64();
    // A media playlist on a route that prefetches from playlists is read for what it lists, as the origin
    // sent it (a compressed one is not: decoding it again is not worth a prefetch).
    let prefetch_playlist = route.prefetch.playlist;
    let mut playlist = (prefetch_playlist > 0
        && request.asked.is_some()
        && head.status == StatusCode::OK
        && placed.is_none()
        && encoding::coded(&head.headers) == Coded::Identity
        && is_playlist(&head.headers, parts))
    .then(Vec::new);
    let mut coding = FillCoding::start(
        policy.compression.as_ref().map(|n| &n.settings),
        head.status,
        &mut head.headers,
        writer.is_some(),
        max_object_size,
    );
    let fetched = Arc::new(FetchedHead {
        status: head.status,
        headers: head.headers.clone(),
        shareable: writer.is_some(),
        not_stored,
        selection: selection.clone(),
        initial_age,
        received_at,
        ttl: storable.as_ref().map_or(Duration::ZERO, |s| {
            s.ttl.saturating_sub(Duration::from_secs(initial_age))
        }),
        revalidated: false,
    });
    fetch.set_head(Ok(fetched));

    let mut unattended = false;
    // A client's forwarded range that every reader left: the origin is read no further, and the bytes in
    // hand are kept as a part (an open range of a huge object is mostly asked for, then left).
    let left_part = matches!(request.part, Some(Ask::Client(_))) && placed.is_some();
    let mut left = false;
    // A body without a declared length found larger than `max_object_size` as it came.
    let mut grew_too_large = false;
    loop {
        fetch.room().await;
        if writer.is_some() && !unattended && fetch.unattended() {
            if left_part && fetch.leave_if_deserted() {
                left = true;
                break;
            }
            unattended = true;
            inc(&shared.stats.background_fills);
        }
        let next = tokio::select! {
            biased;
            () = fetch.deserted() => {
                tracing::debug!(key, "every reader left an unstored body; fetch cancelled");
                return Ending::Cancelled;
            }
            next = tokio::time::timeout(backend.between_bytes_timeout, body.frame()) => next,
        };
        let frame = match next {
            Err(_) => Err(format!(
                "no body bytes for {:?}",
                backend.between_bytes_timeout
            )),
            Ok(None) => break,
            Ok(Some(Err(e))) => Err(error_chain(&e)),
            Ok(Some(Ok(frame))) => Ok(frame),
        };
        let frame = match frame {
            Ok(frame) => frame,
            Err(reason) => {
                tracing::warn!(key, reason, "backend body failed; nothing stored");
                fetch.end(Err(FetchError::new(format!(
                    "backend body failed: {reason}"
                ))));
                return Ending::Failed;
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        add(&shared.stats.bytes_in, data.len() as u64);
        if let Some(text) = playlist.as_mut() {
            if text.len() + data.len() > prefetch::MAX_PLAYLIST {
                playlist = None;
            } else {
                text.extend_from_slice(&data);
            }
        }
        let pieces = match coding.push(data).await {
            Ok(Pushed::Pieces(pieces)) => pieces,
            Ok(Pushed::OverLimit(pieces)) => {
                inc(&shared.stats.decode_limit);
                tracing::info!(
                    key,
                    "compressed body expands past max_object_size; not storing"
                );
                fetch.stop_storing(writer.take());
                pieces
            }
            Err(e) => return corrupt(worker, fetch, key, e),
        };
        // A body of known length sent on as the origin sent it is whole once its last bytes are in hand.
        // Marked so as they reach the readers, a request right after a client took every byte finds it
        // complete (as good as stored) rather than joining a fetch that waits for the store to take them.
        let whole = body.is_end_stream() && coding.passes_through();
        let count = pieces.len();
        for (i, piece) in pieces.into_iter().enumerate() {
            let last = whole && i + 1 == count;
            grew_too_large |=
                forward_piece(fetch, &mut writer, piece, max_object_size, key, last).await;
        }
    }
    if !left {
        let last = match coding.finish() {
            Ok(pieces) => pieces,
            Err(e) => return corrupt(worker, fetch, key, e),
        };
        for piece in last {
            grew_too_large |=
                forward_piece(fetch, &mut writer, piece, max_object_size, key, false).await;
        }
        fetch.end(Ok(()));
        if let (Some(text), Some(asked)) = (playlist, &request.asked) {
            prefetch::on_playlist(
                worker,
                asked,
                *client,
                decided.secure,
                prefetch_playlist,
                &text,
            );
        }
    }
    coding.record(&mut head.headers, &shared.stats);

    if let (Some(span), None) = (&storing, &writer) {
        span.fail("not_stored");
    }
    let (Some(writer), Some(storable)) = (writer, storable) else {
        // A server error is a failure of the origin, not a sign that the URL is uncacheable: no hit-for-miss.
        return if head.status.is_server_error() {
            Ending::Failed
        } else if head.status == StatusCode::NOT_MODIFIED {
            Ending::NotModified
        } else {
            Ending::NotStored(not_stored.unwrap_or(match grew_too_large {
                true => NotStored::TooLarge,
                false => NotStored::StoreRefused,
            }))
        };
    };
    if placed.is_some() {
        // The object's head: what a response made of its parts starts from.
        for name in [header::CONTENT_RANGE, header::CONTENT_LENGTH] {
            head.headers.remove(name);
        }
    }
    let base = ObjectMeta {
        variant: selection,
        status: judged.as_u16(),
        ..ObjectMeta::default()
    };
    let meta = with_response(
        base,
        &head.headers,
        &storable,
        initial_age,
        response_time,
        policy,
    );
    if let Some((first, last, total)) = placed {
        let kept = writer.length();
        let expected = last - first + 1;
        // Left early, fewer bytes are a part of their own; more than the `Content-Range` gives never are.
        if kept != expected && !(left && 0 < kept && kept < expected) {
            inc(&shared.stats.slice_errors);
            tracing::warn!(
                key,
                sent = kept,
                "a part's body is not the length its Content-Range gives; not storing"
            );
            return Ending::NotStored(NotStored::PartAnswer);
        }
        return match writer.finish_part(key.to_owned(), meta, first, total).await {
            // A part a purge came after is as cacheable as ever: the next request must not bypass
            // coalescing for it.
            Ok(PartKept::Added | PartKept::Started | PartKept::Discarded) => Ending::Stored,
            Err(e) => {
                if !e.is_refusal() {
                    tracing::warn!(key, error = %e, "storing a part failed");
                }
                Ending::NotStored(NotStored::StoreRefused)
            }
        };
    }
    let finished = writer.finish(key.to_owned(), meta).await;
    if let (Some(span), Err(_)) = (&storing, &finished) {
        span.fail("store_error");
    }
    match finished {
        Ok(()) => Ending::Stored,
        Err(e) if e.is_refusal() => Ending::NotStored(NotStored::StoreRefused),
        Err(e) => {
            tracing::warn!(key, error = %e, "storing failed");
            Ending::NotStored(NotStored::StoreRefused)
        }
    }
}

/// The range a request for an object not stored sends to the origin instead of fetching the whole
/// (`cache.forward_ranges`): its one range, of a GET on a route without `slice`, when it is a suffix or
/// begins `forward_ranges_from` or further in and ends. An open range (`bytes=a-`) is forwarded only when
/// the whole is known not to be stored (`whole_unstored`: too large, or uncacheable): clients resuming a
/// download or seeking in a video each ask for the rest of the object, and one fetch of the whole serves
/// them all where one forwarded range each would fetch the rest again and again. Not with `If-Range`, whose
/// answer may have to be the whole.
pub(crate) fn forwarded_range(
    route: &Route,
    decided: &Decided,
    parts: &Parts,
    whole_unstored: impl FnOnce() -> bool,
) -> Option<Ask> {
    let cache = &route.policy.cache;
    let eligible = cache.forward_ranges
        && route.slice.is_none()
        && parts.method == Method::GET
        && decided.body.is_none()
        && !parts.headers.contains_key(header::IF_RANGE);
    let single = range::single(&parts.headers).filter(|_| eligible)?;
    let far = match single {
        range::Single::Suffix(_) => true,
        range::Single::From(first, last) => {
            first >= cache.forward_ranges_from.as_u64() && (last.is_some() || whole_unstored())
        }
    };
    far.then_some(Ask::Client(single))
}
