//! Building client responses: from a stored object, from a fetch in flight, or for a failure. Every one
//! carries `Age`, `X-Cache`, `Cache-Status` (RFC 9211) and `Via`.

use std::{collections::VecDeque, sync::Arc, time::Duration};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http::{
    header, request::Parts, HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode,
};
use http_body::Frame;
use lacquer_storage::{ObjectMeta, ObjectSet};

use lacquer_backends::body::{self, Body, BoxError};
use lacquer_policy::{
    conditional,
    range::{self, Ranges},
};
use lacquer_rules::{Ahead, Rules};

use crate::{
    coalesce::{FetchReader, FetchedHead},
    coding::{take_identity_length, Busy, Conversion},
    fields::{append, CACHE_STATUS, VIA, X_CACHE},
    prepared::Prepared,
    store::CacheStore,
};

/// The cache's verdict on one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Hit {
        ttl_s: i64,
    },
    /// A stale object: within grace while a background fetch refreshes it (`origin_failed` false), or
    /// standing in for an origin that failed (`fwd_status` is its 5xx, none when it could not be reached).
    Stale {
        ttl_s: i64,
        origin_failed: bool,
        fwd_status: Option<u16>,
    },
    /// Answered from a fetch; `stored` when the response is being stored, `collapsed` when the request
    /// joined a fetch started by another.
    Miss {
        stored: bool,
        collapsed: bool,
        detail: Option<&'static str>,
    },
    /// Sent to the origin without a lookup: an unsafe method (`fwd=method`), or passed for `detail`'s
    /// reason (`cookie`, `authorization`, `route`, …).
    Pass {
        unsafe_method: bool,
        detail: Option<&'static str>,
    },
}

impl Outcome {
    /// How the deliver rules see it (`match.outcome`, `${outcome}`).
    pub(crate) fn delivered(self) -> lacquer_rules::Outcome {
        match self {
            Outcome::Hit { .. } => lacquer_rules::Outcome::Hit,
            Outcome::Stale { .. } => lacquer_rules::Outcome::Stale,
            Outcome::Miss { stored: true, .. } => lacquer_rules::Outcome::Miss,
            Outcome::Miss { stored: false, .. } => lacquer_rules::Outcome::Uncacheable,
            Outcome::Pass { .. } => lacquer_rules::Outcome::Pass,
        }
    }

    pub(crate) fn x_cache(self) -> &'static str {
        match self {
            Outcome::Hit { .. } => "HIT",
            Outcome::Stale { .. } => "STALE",
            Outcome::Miss { .. } => "MISS",
            Outcome::Pass { .. } => "PASS",
        }
    }

    /// `Cache-Status` (RFC 9211) for this outcome, written straight into the value's own bytes.
    pub(crate) fn cache_status(self) -> HeaderValue {
        use std::fmt::Write;
        let mut s = bytes::BytesMut::with_capacity(64);
        s.extend_from_slice(b"lacquer; ");
        // Writing to a `BytesMut` cannot fail.
        let _ = match self {
            // Every hit writes one: without the formatting machinery.
            Outcome::Hit { ttl_s } => {
                s.extend_from_slice(b"hit; ttl=");
                s.extend_from_slice(itoa::Buffer::new().format(ttl_s).as_bytes());
                Ok(())
            }
            Outcome::Stale {
                ttl_s,
                origin_failed: false,
                ..
            } => write!(s, "hit; ttl={ttl_s}; detail=\"stale-while-revalidate\""),
            Outcome::Stale {
                ttl_s,
                origin_failed: true,
                fwd_status: Some(status),
            } => write!(s, "fwd=stale; fwd-status={status}; ttl={ttl_s}"),
            Outcome::Stale {
                ttl_s,
                origin_failed: true,
                fwd_status: None,
            } => write!(s, "fwd=stale; ttl={ttl_s}; detail=\"origin-unreachable\""),
            Outcome::Miss {
                stored,
                collapsed,
                detail,
            } => {
                s.extend_from_slice(b"fwd=miss");
                if stored {
                    s.extend_from_slice(b"; stored");
                }
                if collapsed {
                    s.extend_from_slice(b"; collapsed");
                }
                match detail {
                    Some(d) => write!(s, "; detail=\"{d}\""),
                    None => Ok(()),
                }
            }
            Outcome::Pass {
                unsafe_method,
                detail,
            } => {
                s.extend_from_slice(if unsafe_method {
                    b"fwd=method"
                } else {
                    b"fwd=bypass"
                });
                match detail {
                    Some(d) => write!(s, "; detail=\"{d}\""),
                    None => Ok(()),
                }
            }
        };
        HeaderValue::from_maybe_shared(s.freeze()).expect("Cache-Status is visible ASCII")
    }
}

/// Adds what every delivered response carries. `age` replaces any `Age` already present.
pub fn decorate(headers: &mut HeaderMap, outcome: Outcome, age: Option<u64>) {
    match age {
        Some(age) => {
            headers.insert(header::AGE, HeaderValue::from(age));
        }
        None if !headers.contains_key(header::AGE) => {
            headers.insert(header::AGE, HeaderValue::from_static("0"));
        }
        None => {}
    }
    headers.insert(X_CACHE, HeaderValue::from_static(outcome.x_cache()));
    headers.insert(CACHE_STATUS, outcome.cache_status());
    append(headers, header::VIA, VIA);
}

/// Sets what changes from one response to the next in a [`Prepared::head`]: `Age`, `Cache-Status`, and
/// `X-Cache` unless it is the `HIT` prepared.
fn mark(headers: &mut HeaderMap, outcome: Outcome, age: u64) {
    headers.insert(header::AGE, HeaderValue::from(age));
    if !matches!(outcome, Outcome::Hit { .. }) {
        headers.insert(X_CACHE, HeaderValue::from_static(outcome.x_cache()));
    }
    headers.insert(CACHE_STATUS, outcome.cache_status());
}

/// A response made for the client from what is stored or fetched.
pub enum Made {
    /// The data path's answer.
    Answer(Response<Body>),
    /// A 5xx lacquerd answers itself ([`failure`]): its page is chosen as it leaves.
    Failure(Response<Body>),
}

#[cfg(test)]
impl Made {
    /// The response, whichever it is.
    pub fn into_response(self) -> Response<Body> {
        match self {
            Made::Answer(resp) | Made::Failure(resp) => resp,
        }
    }
}

/// A 5xx lacquerd answers itself (no backend answered, or it cannot serve the request now), without its
/// body: its page is chosen as it leaves ([`ErrorPages::apply`](crate::error_page::ErrorPages::apply)),
/// and never says why; the caller logs that. A 503 says when to try again: in 5 s, as Varnish's built-in
/// `vcl_backend_error` does (a backend that was down is probed again by then); lacquerd's own brief
/// refusals say 1 s instead.
pub fn failure(status: StatusCode, outcome: Outcome) -> Response<Body> {
    let mut resp = Response::new(body::empty());
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if status == StatusCode::SERVICE_UNAVAILABLE {
        h.insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    }
    decorate(h, outcome, Some(0));
    resp
}

/// Removes the response's surrogate keys (`cache.surrogate_key_headers`) unless the cache exposes them:
/// they are for purging, and the store has read them already.
pub(crate) fn withhold_tags(headers: &mut HeaderMap, cache: &lacquer_config::Cache) {
    if !cache.expose_surrogate_keys {
        for name in &cache.surrogate_key_headers {
            headers.remove(name.as_str());
        }
    }
}

/// A request refused before any lookup; `retry` becomes `Retry-After` in whole seconds, at least 1.
pub(crate) fn refused(
    status: StatusCode,
    message: &str,
    retry: Option<Duration>,
) -> Response<Body> {
    let mut resp = error(
        status,
        Outcome::Pass {
            unsafe_method: false,
            detail: None,
        },
        message,
    );
    if let Some(wait) = retry {
        let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        resp.headers_mut()
            .insert(header::RETRY_AFTER, seconds.max(1).into());
    }
    resp
}

pub(crate) fn body_too_large() -> Response<Body> {
    refused(
        StatusCode::PAYLOAD_TOO_LARGE,
        "request body too large",
        None,
    )
}

/// A 503 the client may retry in a second: lacquerd holds back a request the origin is already busy with.
pub(crate) fn busy_briefly() -> Response<Body> {
    let mut resp = failure(
        StatusCode::SERVICE_UNAVAILABLE,
        Outcome::Pass {
            unsafe_method: false,
            detail: None,
        },
    );
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

/// A request refused (4xx): `message` says what was wrong with it, for its sender to read.
pub fn error(status: StatusCode, outcome: Outcome, message: &str) -> Response<Body> {
    let mut resp = plain(status, message);
    decorate(resp.headers_mut(), outcome, Some(0));
    resp
}

/// A one-line answer lacquerd makes itself, as plain text.
pub(crate) fn plain(status: StatusCode, message: &str) -> Response<Body> {
    own_body(status, "text/plain; charset=utf-8", format!("{message}\n"))
}

/// A body lacquerd makes itself, of `content_type`: never stored by anyone.
pub(crate) fn own_body(
    status: StatusCode,
    content_type: &'static str,
    body: String,
) -> Response<Body> {
    let mut resp = Response::new(body::full(body));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// A response read from a fetch in flight (or just finished, or confirmed by the origin with a 304),
/// shaped for the request by [`represent`].
pub async fn fetched<S: CacheStore>(
    head: &FetchedHead,
    reader: FetchReader<S>,
    outcome: Outcome,
    req: &Parts,
    conversion: &Conversion,
) -> Made {
    let mut length = head
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if length.is_none() {
        // A range of a body still arriving is answered once its first byte is in hand (a closed one: its
        // last), never as a short 206: a body that ends first has its length known, and a range past it is
        // a 416.
        if let Some(pos) = growing_wait(req, head.status) {
            reader.arrived(pos).await;
        }
        // A body sent chunked has its length once it is all in hand.
        length = reader.complete_length();
    }
    let age = head.initial_age + head.received_at.elapsed().as_secs();
    // The readers of a small body in hand that all need it decoded (players without Accept-Encoding
    // joining the fill of a playlist stored gzip'd) share one decode: it was a tenth of the CPU of a
    // thousand players at the live edge, each decoding the same two kilobytes.
    let decoded = conversion
        .decodes()
        .then(|| reader.decoded_once(DECODED_ONCE_IN, |pieces| conversion.decode_whole(pieces)))
        .flatten();
    let (source, length, made_once) = match decoded {
        Some(bytes) => {
            let length = bytes.len() as u64;
            (
                Source::Decoded(bytes),
                Some(length),
                Some(conversion.made_once()),
            )
        }
        None => (Source::Fetched(reader), length, None),
    };
    represent(
        source,
        head.status,
        Head::Fetched(head.headers.clone()),
        length,
        age,
        outcome,
        req,
        made_once.as_ref().unwrap_or(conversion),
    )
}

/// The most a fetch's body (as it arrived, compressed) may be for its readers to share one decode of it.
const DECODED_ONCE_IN: u64 = 64 * 1024;

/// A closed range longer than this asks for a body of indeterminate length (RFC 8673 §2.2: a last position
/// "larger than can be transferred in the foreseeable term"): answered as it grows, as an open one is.
const INDETERMINATE: u64 = 1 << 40;

/// The byte a growing answer to `req` waits for: the first of an open or indeterminate range, the last of
/// a closed one; `None` when the answer is no single range ([`shape`] says when it is).
fn growing_wait(req: &Parts, status: StatusCode) -> Option<u64> {
    if status != StatusCode::OK
        || req.method != Method::GET
        || req.headers.contains_key(header::IF_RANGE)
    {
        return None;
    }
    match range::single(&req.headers)? {
        range::Single::From(first, Some(last)) if last - first < INDETERMINATE => Some(last),
        range::Single::From(first, _) => Some(first),
        range::Single::Suffix(_) => None,
    }
}

/// A response from a stored object whose first chunk has been read already (so the object is known to be
/// readable before the status line goes out), shaped for the request by [`represent`]. `prepared` is the
/// head of the body sent: the variant's, or its sibling `sibling`'s (an index into the set's siblings,
/// sent with [`Conversion::Sibling`]). A plain hit is sent with the head the live `rules` prepared from it,
/// and with what of the deliver phase they ran ahead of it.
#[allow(clippy::too_many_arguments)]
pub fn stored<S: CacheStore>(
    store: &S,
    set: &Arc<ObjectSet>,
    variant: usize,
    sibling: Option<usize>,
    first: Option<Bytes>,
    now_ms: u64,
    outcome: Outcome,
    req: &Parts,
    prepared: &Prepared,
    conversion: &Conversion,
    rules: &Rules,
) -> (Made, Option<Ahead>) {
    let meta = &set.variants[variant];
    let status = StatusCode::from_u16(meta.status).unwrap_or(StatusCode::OK);
    let age = meta.age_s(now_ms);
    let length = sibling.map_or(meta, |i| &set.siblings[i].body).length;
    let stored = |first| Stored {
        store: store.clone(),
        set: set.clone(),
        variant,
        sibling,
        first,
    };
    // Most hits: the bytes as stored, whole, to a GET without conditionals. The prepared head is what
    // `represent` would make of it, but for what changes per response.
    if !conversion.decodes() && req.method == Method::GET && !asks(req) {
        conversion.count_served();
        let (mut headers, ahead) = prepared.plain_head(rules, status);
        mark(&mut headers, outcome, age);
        let body = match first {
            _ if length == 0 => body::empty(),
            // A body within its first chunk is in hand whole: sent as it is, with no stream to poll, no
            // read ahead, and no hold on the object or the store (counts every core would share).
            Some(first) if first.len() as u64 == length => body::full(first),
            first => stored(first).range(0, length - 1),
        };
        return (Made::Answer(response(status, headers, body)), ahead);
    }
    let made = represent(
        Source::Stored(stored(first)),
        status,
        Head::Prepared(prepared.head.clone(), prepared.identity_length),
        Some(length),
        age,
        outcome,
        req,
        conversion,
    );
    (made, None)
}

/// The head a response is made from.
enum Head {
    /// A fetched response's fields, as the origin sent them (a fill's recorded decoded length included).
    Fetched(HeaderMap),
    /// A stored body's [`Prepared::head`] and its decoded length.
    Prepared(HeaderMap, Option<u64>),
}

/// Whether a request carries a conditional or a range: most do not, and skip copying the validators.
fn asks(req: &Parts) -> bool {
    [
        header::IF_NONE_MATCH,
        header::IF_MODIFIED_SINCE,
        header::RANGE,
    ]
    .iter()
    .any(|name| req.headers.contains_key(name))
}

/// Where the bytes of a response come from.
enum Source<S: CacheStore> {
    /// A stored body: any byte of it can be read directly.
    Stored(Stored<S>),
    /// A fetch's body, read in order as it arrives (or from the store behind it).
    Fetched(FetchReader<S>),
    /// A fetch's whole body, decoded once for all its readers.
    Decoded(Bytes),
}

impl<S: CacheStore> Source<S> {
    /// The body's first bytes, when they are in hand (they tell a decoder's window).
    fn start(&self) -> Option<Bytes> {
        match self {
            Source::Stored(stored) => stored.first.clone(),
            Source::Fetched(_) | Source::Decoded(_) => None,
        }
    }

    /// The whole body as stored or fetched.
    fn whole(self) -> Body {
        match self {
            Source::Stored(stored) => match stored.body().length {
                0 => body::empty(),
                len => stored.range(0, len - 1),
            },
            Source::Fetched(reader) => reader.into_body(),
            Source::Decoded(bytes) => body::full(bytes),
        }
    }

    /// Bytes `first..=last` of the body as stored or fetched.
    fn range(self, first: u64, last: u64) -> Body {
        match self {
            Source::Stored(stored) => stored.range(first, last),
            Source::Fetched(reader) => reader.into_range_body(first, last),
            Source::Decoded(bytes) => body::full(bytes.slice(first as usize..=last as usize)),
        }
    }
}

/// Decides what a client is sent for a stored or fetched response, whatever the path that found it (a
/// hit, a miss, a revalidation, a stale object): the coding (`conversion`), the length and the ranges are
/// all of that one representation. `length` is the body's as stored or fetched, when known.
///
/// Ranges are answered over the representation sent. A decoded body can only be read from its start, so
/// a range of one is answered 206 only when the decode it needs stays within `range_decode`, and several
/// ranges of one are answered with the whole body (200, as RFC 9110 §14.2 allows), as are several ranges
/// of a body still arriving. A decoder that `decode_memory` has no room for is a 503 with `Retry-After`.
#[allow(clippy::too_many_arguments)]
fn represent<S: CacheStore>(
    source: Source<S>,
    status: StatusCode,
    head: Head,
    length: Option<u64>,
    age: u64,
    outcome: Outcome,
    req: &Parts,
    conversion: &Conversion,
) -> Made {
    let (mut headers, prepared, identity_length) = match head {
        Head::Fetched(mut headers) => {
            let identity_length = take_identity_length(&mut headers);
            (headers, false, identity_length)
        }
        Head::Prepared(headers, identity_length) => (headers, true, identity_length),
    };
    let sent = conversion.headers(&mut headers, length, identity_length);
    if let (false, Some(len)) = (conversion.decodes(), sent) {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    }
    if prepared {
        mark(&mut headers, outcome, age);
        if sent.is_none() {
            // A decoded body of a length not known: it cannot be ranged.
            headers.remove(header::ACCEPT_RANGES);
        }
    } else {
        decorate(&mut headers, outcome, Some(age));
    }
    let shape = match shape(req, &mut headers, sent, status) {
        Shape::Part(first, last) if !conversion.answers_range(&[(first, last)]) => Shape::Whole,
        Shape::Parts(parts) if !conversion.answers_range(&parts) => Shape::Whole,
        // A decoder reads from the start: a part of a body of unknown length is the whole.
        Shape::Growing(..) if conversion.decodes() => Shape::Whole,
        shape => shape,
    };
    let head_only = req.method == Method::HEAD;
    let start = source.start();
    let start = start.as_deref();
    let whole = |source: Source<S>| {
        if head_only {
            return Ok(body::empty());
        }
        conversion.body(source.whole(), None, start)
    };
    let (status, body) = match shape {
        Shape::Whole => (status, whole(source)),
        Shape::Part(first, last) => {
            let total = sent.expect("ranges are evaluated over a known length");
            let value = format!("bytes {first}-{last}/{total}");
            headers.insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&value).expect("ascii"),
            );
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(last - first + 1));
            let body = if conversion.decodes() {
                conversion.body(source.whole(), Some((first, last)), start)
            } else {
                Ok(source.range(first, last))
            };
            (StatusCode::PARTIAL_CONTENT, body)
        }
        Shape::Growing(first, last) => {
            // The total is not known yet (`*`). A closed range's last byte is in hand (`fetched` waited for
            // it): its length is known. An open or indeterminate one ends where the body does, without a
            // length; an open one is written `a-*`, as RFC 9110's grammar has no form for an end not known.
            let value = match last {
                Some(last) if last - first < INDETERMINATE => {
                    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(last - first + 1));
                    format!("bytes {first}-{last}/*")
                }
                Some(last) => {
                    headers.remove(header::CONTENT_LENGTH);
                    format!("bytes {first}-{last}/*")
                }
                None => {
                    headers.remove(header::CONTENT_LENGTH);
                    format!("bytes {first}-*/*")
                }
            };
            headers.insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&value).expect("ascii"),
            );
            (
                StatusCode::PARTIAL_CONTENT,
                Ok(source.range(first, last.unwrap_or(u64::MAX))),
            )
        }
        Shape::Parts(parts) => match source {
            Source::Stored(stored) => {
                let content_type = headers.get(header::CONTENT_TYPE).cloned();
                let (body, total, boundary) = stored.multipart(&parts, content_type.as_ref());
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(total));
                let value = format!("multipart/byteranges; boundary={boundary}");
                headers.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_str(&value).expect("boundary is ASCII"),
                );
                (StatusCode::PARTIAL_CONTENT, Ok(body))
            }
            // Several ranges of a body still arriving: the whole body is a correct answer too.
            fetched => (status, whole(fetched)),
        },
        other => (other.status(), Ok(body::empty())),
    };
    match body {
        Ok(body) => Made::Answer(response(status, headers, body)),
        Err(Busy) => Made::Failure(busy(outcome)),
    }
}

/// The answer to a request that needs a decoder when `decode_memory` has no room for one: the decoders
/// held now end as their clients read, so the client may try again shortly.
fn busy(outcome: Outcome) -> Response<Body> {
    tracing::debug!("no room in compression.decode_memory for a decoder: 503");
    let mut resp = failure(StatusCode::SERVICE_UNAVAILABLE, outcome);
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

pub(crate) fn response(status: StatusCode, headers: HeaderMap, body: Body) -> Response<Body> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    resp
}

/// What a response becomes for this request.
pub(crate) enum Shape {
    Whole,
    NotModified,
    Unsatisfiable,
    Part(u64, u64),
    Parts(Vec<(u64, u64)>),
    /// One range of a body whose length is not known yet, from its first byte to its last (`None`: to the
    /// end of the body).
    Growing(u64, Option<u64>),
}

impl Shape {
    /// The status of the shapes that carry no body.
    pub(crate) fn status(self) -> StatusCode {
        match self {
            Shape::NotModified => StatusCode::NOT_MODIFIED,
            Shape::Unsatisfiable => StatusCode::RANGE_NOT_SATISFIABLE,
            Shape::Whole | Shape::Part(..) | Shape::Parts(_) | Shape::Growing(..) => {
                unreachable!("shapes with a body are sent with it")
            }
        }
    }
}

/// Evaluates conditionals, then ranges, for a response of `status` and `len` bytes; only a 200 is shaped.
/// A length not known yet (a body the origin is still producing, such as a live segment a player asks a
/// part of) answers one range as its bytes arrive ([`Shape::Growing`], RFC 8673), but never with `If-Range`
/// (the validator may need the whole) and never several (the whole is as good an answer). Sets the headers that go with a 304 (only what RFC 9110
/// §15.4.5 allows is kept) or a 416; those of a 206 are set once the ranges are known to be answered.
pub(crate) fn shape(
    req: &Parts,
    headers: &mut HeaderMap,
    len: Option<u64>,
    status: StatusCode,
) -> Shape {
    if status != StatusCode::OK || !matches!(req.method, Method::GET | Method::HEAD) {
        return Shape::Whole;
    }
    if len.is_some() {
        headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    }
    if !asks(req) {
        return Shape::Whole;
    }
    let text = |h: &HeaderMap, name| {
        h.get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
            .map(str::to_owned)
    };
    let etag = text(headers, header::ETAG);
    let last_modified = text(headers, header::LAST_MODIFIED);
    let date = text(headers, header::DATE);
    if conditional::not_modified(
        &req.headers,
        etag.as_deref(),
        last_modified.as_deref(),
        date.as_deref(),
    ) {
        let keep: Vec<HeaderName> = conditional::NOT_MODIFIED_HEADERS
            .iter()
            .cloned()
            .chain([header::AGE, header::VIA, X_CACHE, CACHE_STATUS])
            .collect();
        let names: Vec<HeaderName> = headers
            .keys()
            .filter(|n| !keep.contains(n))
            .cloned()
            .collect();
        for name in names {
            headers.remove(name);
        }
        return Shape::NotModified;
    }
    // An ESI page's template: ranges are of the page assembled, whose length is not known; Varnish sends
    // the whole page, and so does this.
    if req.method != Method::GET || headers.contains_key(crate::esi::fill::TEMPLATE) {
        return Shape::Whole;
    }
    let Some(len) = len else {
        return match range::single(&req.headers) {
            Some(range::Single::From(first, last))
                if !req.headers.contains_key(header::IF_RANGE) =>
            {
                Shape::Growing(first, last)
            }
            _ => Shape::Whole,
        };
    };
    match range::evaluate(&req.headers, len, etag.as_deref(), last_modified.as_deref()) {
        Ranges::Whole => Shape::Whole,
        Ranges::Unsatisfiable => {
            headers.insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&format!("bytes */{len}")).expect("ascii"),
            );
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(0));
            Shape::Unsatisfiable
        }
        Ranges::Parts(parts) if parts.len() == 1 => Shape::Part(parts[0].0, parts[0].1),
        Ranges::Parts(parts) => Shape::Parts(parts),
    }
}

/// A stored body, read chunk by chunk.
struct Stored<S> {
    store: S,
    set: Arc<ObjectSet>,
    variant: usize,
    /// The sibling of the variant sent instead of its body.
    sibling: Option<usize>,
    /// Chunk 0, already read to prove the body is there.
    first: Option<Bytes>,
}

impl<S> Stored<S> {
    /// The body sent: the variant's, or its sibling's.
    fn body(&self) -> &ObjectMeta {
        match self.sibling {
            Some(index) => &self.set.siblings[index].body,
            None => &self.set.variants[self.variant],
        }
    }
}

/// Bytes of a stored body asked of the store ahead of the chunk being sent (at least one chunk; 2 chunks of
/// 256 KiB): while one chunk goes to the client the next are read, from the disk tier on the store's
/// runtime, so a body on disk streams at the disk's pace rather than at a read per send. A response holds
/// at most this plus the chunk it sends.
pub const READ_AHEAD: u64 = 512 * 1024;

/// Where a stored body's stream stands: the chunk to send next, and the reads started for it and after.
struct Sending<S, R> {
    source: Stored<S>,
    next: u32,
    /// The next chunk to ask for.
    asked: u32,
    /// Reads started, in chunk order from `next`.
    reads: VecDeque<R>,
}

impl<S: CacheStore> Stored<S> {
    /// Streams bytes `first..=last`, reading only the chunks that hold them. A chunk lost mid-body ends the
    /// stream with an error, so the client sees a broken response rather than a short one.
    fn range(self, first: u64, last: u64) -> Body {
        body::from_stream(self.range_stream(first, last))
    }

    fn range_stream(
        self,
        first: u64,
        last: u64,
    ) -> impl Stream<Item = Result<Frame<Bytes>, BoxError>> + Send {
        let chunk_size = u64::from(self.body().chunk_size);
        let start_index = (first / chunk_size) as u32;
        let end_index = (last / chunk_size) as u32;
        let ahead = (READ_AHEAD / chunk_size).max(1) as u32;
        let state = Sending {
            source: self,
            next: start_index,
            asked: start_index,
            reads: VecDeque::new(),
        };
        futures_util::stream::unfold(state, move |mut s| async move {
            let index = s.next;
            if index > end_index {
                return None;
            }
            // A body in memory never makes the stream wait, so the connection would take chunk after chunk
            // (copying each into its buffer) before writing any: letting go of the thread before every
            // chunk of a body of several sends the head at once, and each chunk as soon as it is taken. A
            // body of one chunk goes out with its head in one write, as before.
            if end_index > start_index {
                tokio::task::yield_now().await;
            }
            let in_hand = if index == 0 {
                s.source.first.take()
            } else {
                None
            };
            if in_hand.is_some() {
                s.asked = s.asked.max(1);
            }
            let meta = s.source.body();
            while s.asked <= end_index && s.asked <= index + ahead {
                s.reads.push_back(s.source.store.read_chunk(meta, s.asked));
                s.asked += 1;
            }
            let data: Result<Bytes, BoxError> = match in_hand {
                Some(data) => Ok(data),
                None => match s.reads.pop_front().expect("chunk asked for").await {
                    Ok(Some(read)) => Ok(read.data),
                    Ok(None) => Err(format!("chunk {index} of a stored body is gone").into()),
                    Err(e) => Err(e.into()),
                },
            };
            let chunk_start = u64::from(index) * chunk_size;
            let data = data.map(|d| {
                let from = first.saturating_sub(chunk_start) as usize;
                let to = ((last + 1 - chunk_start) as usize).min(d.len());
                d.slice(from..to)
            });
            if data.is_err() {
                // Nothing more is sent: the reads ahead are dropped, which abandons them.
                s.reads.clear();
                s.next = end_index + 1;
            } else {
                s.next = index + 1;
            }
            Some((data.map(Frame::data), s))
        })
    }

    /// A `multipart/byteranges` body for several ranges, its length, and its boundary.
    fn multipart(
        self,
        parts: &[(u64, u64)],
        content_type: Option<&HeaderValue>,
    ) -> (Body, u64, String) {
        let len = self.body().length;
        let boundary = format!("lacquer-{:016x}", self.body().generation);
        let content_type = content_type
            .and_then(|v| v.to_str().ok())
            .map(|t| format!("Content-Type: {t}\r\n"));
        let mut total = 0u64;
        let mut pieces = Vec::new();
        for &(first, last) in parts {
            let head = format!(
                "\r\n--{boundary}\r\n{}Content-Range: bytes {first}-{last}/{len}\r\n\r\n",
                content_type.as_deref().unwrap_or("")
            );
            total += head.len() as u64 + (last - first + 1);
            pieces.push((Bytes::from(head), first, last));
        }
        let tail = Bytes::from(format!("\r\n--{boundary}--\r\n"));
        total += tail.len() as u64;
        let source = Arc::new(self);
        let stream = futures_util::stream::iter(pieces)
            .flat_map(move |(head, first, last)| {
                let part = Stored {
                    store: source.store.clone(),
                    set: source.set.clone(),
                    variant: source.variant,
                    sibling: source.sibling,
                    first: source.first.clone(),
                };
                futures_util::stream::once(async move { Ok(Frame::data(head)) })
                    .chain(part.range_stream(first, last))
            })
            .chain(futures_util::stream::once(
                async move { Ok(Frame::data(tail)) },
            ));
        (body::from_stream(stream), total, boundary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::phase;
    use crate::{memory::MemoryStore, stats::Stats};
    use lacquer_policy::encoding::Coding;
    use lacquer_storage::Sibling;
    use std::sync::atomic::Ordering::Relaxed;

    fn meta(status: u16, headers: &[(&str, &str)], length: u64) -> ObjectMeta {
        ObjectMeta {
            object: 1,
            generation: 1,
            status,
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
                .collect(),
            length,
            chunk_size: 1024,
            stored_at_ms: 1_000_000,
            ttl_ms: 60_000,
            ..ObjectMeta::default()
        }
    }

    fn get(fields: &[(&str, &str)]) -> Parts {
        let mut req = http::Request::get("/a");
        for (n, v) in fields {
            req = req.header(*n, *v);
        }
        req.body(()).unwrap().into_parts().0
    }

    /// The head of a response from `set` (its variant 0, or `sibling`) to `req`.
    fn head(
        set: &Arc<ObjectSet>,
        sibling: Option<usize>,
        prepared: &Prepared,
        req: &Parts,
        conversion: &Conversion,
    ) -> (StatusCode, HeaderMap) {
        let (resp, _) = delivered(set, sibling, prepared, req, conversion, &Rules::default());
        (resp.status(), resp.headers().clone())
    }

    /// The response from `set` to `req` under `rules`, as the deliver phase leaves it, and whether it was
    /// sent with the head the deliver rules edited ahead of it.
    fn delivered(
        set: &Arc<ObjectSet>,
        sibling: Option<usize>,
        prepared: &Prepared,
        req: &Parts,
        conversion: &Conversion,
        rules: &Rules,
    ) -> (Response<Body>, bool) {
        let (made, ahead) = stored(
            &MemoryStore::new(1024),
            set,
            0,
            sibling,
            Some(Bytes::from_static(b"x")),
            1_010_000,
            Outcome::Hit { ttl_s: 50 },
            req,
            prepared,
            conversion,
            rules,
        );
        let delivering = phase::Delivering {
            ahead,
            ..Default::default()
        };
        let client = "192.0.2.1".parse().unwrap();
        let resp = made.into_response();
        let (resp, _) = phase::deliver(rules, req, client, false, delivering, resp);
        (resp, ahead.is_some())
    }

    fn compiled(text: &str) -> Rules {
        let config = lacquer_config::Config::parse(text, "test").unwrap();
        Rules::compile(&config.rule, &[]).unwrap()
    }

    /// A plain hit is sent with the head the response-only deliver rules edited once: it gets what the
    /// whole way and the whole deliver phase give a conditional request, a rule on the request after
    /// them still runs per request, every rule is counted per response, and reloaded rules make the
    /// head again.
    #[test]
    fn a_plain_hit_gets_the_deliver_rules_its_prepared_head_was_edited_by() {
        let text = r#"
            [[rule]]
            name = "served-by"
            on = "deliver"
            set_headers = { "x-served-by" = "one" }
            [[rule]]
            name = "hide"
            on = "deliver"
            unset_headers = ["server"]
            [[rule]]
            name = "html"
            on = "deliver"
            match = { content_types = ["text/html"] }
            set_headers = { "cache-control" = "max-age=60" }
            [[rule]]
            name = "for-this-client"
            on = "deliver"
            match = { clients = ["192.0.2.0/24"] }
            append_headers = { "x-near" = "yes" }
            "#;
        let rules = compiled(text);
        assert!(rules.prepares());
        let m = meta(
            200,
            &[
                ("content-type", "text/html"),
                ("cache-control", "max-age=600"),
                ("server", "origin"),
            ],
            10,
        );
        let set = Arc::new(ObjectSet::of(vec![m.clone()]));
        let prepared = Prepared::of(&m);
        let plain = get(&[]);
        let conditional = get(&[("if-none-match", "\"other\"")]);
        let run = |rules: &Rules, req: &Parts, edited: bool| {
            let (resp, ahead) = delivered(&set, None, &prepared, req, &Conversion::None, rules);
            assert_eq!(
                ahead, edited,
                "only a plain hit is sent with the edited head"
            );
            resp.headers().clone()
        };
        let short = run(&rules, &plain, true);
        let again = run(&rules, &plain, true);
        let long = run(&rules, &conditional, false);
        assert_eq!(short, long);
        assert_eq!(again, short, "the second hit clones what the first made");
        assert_eq!(fields(&short, "x-served-by"), ["one"]);
        assert!(short.get("server").is_none());
        assert_eq!(fields(&short, "cache-control"), ["max-age=60"]);
        assert_eq!(fields(&short, "x-near"), ["yes"]);
        let counts: Vec<u64> = rules.counters().map(|(_, _, n)| n).collect();
        assert_eq!(
            counts,
            [3, 3, 3, 3],
            "every response counts every rule it matched"
        );

        let reloaded =
            compiled(&text.replace(r#""x-served-by" = "one""#, r#""x-served-by" = "two""#));
        let short = run(&reloaded, &plain, true);
        assert_eq!(fields(&short, "x-served-by"), ["two"]);
        assert_eq!(short, run(&reloaded, &conditional, false));
    }

    fn fields(headers: &HeaderMap, name: &str) -> Vec<String> {
        headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    }

    /// A plain GET takes a shortcut past `represent`: what it is sent must be what `represent` would send
    /// (a conditional that does not match goes the whole way and is answered with the whole body too).
    #[test]
    fn a_plain_hit_is_sent_what_the_whole_way_would_send() {
        let stats = Arc::new(Stats::default());
        let gzip = meta(
            200,
            &[
                ("content-type", "text/html"),
                ("content-encoding", "gzip"),
                ("etag", "\"v1\""),
                ("vary", "Origin"),
                ("via", "1.1 upstream"),
                ("lacquer-identity-length", "5000"),
            ],
            300,
        );
        let cases = [
            meta(200, &[("content-type", "text/plain"), ("etag", "\"a\"")], 1),
            meta(404, &[("content-type", "text/plain")], 1),
            gzip.clone(),
        ];
        let plain = get(&[]);
        let conditional = get(&[("if-none-match", "\"other\"")]);
        for m in cases {
            let set = Arc::new(ObjectSet::of(vec![m.clone()]));
            let prepared = Prepared::of(&m);
            let (status, short) = head(&set, None, &prepared, &plain, &Conversion::None);
            let (_, long) = head(&set, None, &prepared, &conditional, &Conversion::None);
            assert_eq!(short, long, "status {}", m.status);
            assert_eq!(status.as_u16(), m.status);
            assert_eq!(fields(&short, "cache-status"), ["lacquer; hit; ttl=50"]);
            assert_eq!(fields(&short, "age"), ["10"]);
            assert_eq!(fields(&short, "x-cache"), ["HIT"]);
            assert_eq!(fields(&short, "content-length"), [m.length.to_string()]);
            assert!(short.get("lacquer-identity-length").is_none());
            assert_eq!(
                fields(&short, "accept-ranges").len(),
                usize::from(m.status == 200)
            );
        }
        let set = Arc::new(ObjectSet::of(vec![gzip.clone()]));
        let (_, short) = head(&set, None, &Prepared::of(&gzip), &plain, &Conversion::None);
        assert_eq!(fields(&short, "via"), ["1.1 upstream, 1.1 lacquer"]);
        assert_eq!(fields(&short, "vary"), ["Origin", "Accept-Encoding"]);
        assert_eq!(fields(&short, "content-encoding"), ["gzip"]);

        // The identity representation made of it, sent under its fields.
        let mut set = ObjectSet::of(vec![gzip.clone()]);
        set.siblings.push(Sibling {
            of: gzip.generation,
            coding: None,
            body: meta(200, &[], 5000),
        });
        let set = Arc::new(set);
        let sibling = Prepared::sibling(&Prepared::of(&gzip), None, 5000);
        let conversion = Conversion::Sibling {
            coding: None,
            stats: stats.clone(),
        };
        let (_, short) = head(&set, Some(0), &sibling, &plain, &conversion);
        let (_, long) = head(&set, Some(0), &sibling, &conditional, &conversion);
        assert_eq!(short, long);
        assert!(short.get("content-encoding").is_none());
        assert_eq!(fields(&short, "etag"), ["W/\"v1\""]);
        assert_eq!(fields(&short, "content-length"), ["5000"]);
        assert_eq!(fields(&short, "vary"), ["Origin", "Accept-Encoding"]);
        assert_eq!(stats.representations_served.load(Relaxed), 2);

        // Decoded on the way out: the decoded length when it was recorded, no length (and no ranges)
        // when it was not.
        let decode = Conversion::Decode {
            coding: Coding::Gzip,
            limit: 1 << 30,
            memory: 1 << 30,
            range_decode: 1 << 20,
            max_expansion: 1000,
            stats,
        };
        let (_, long) = head(&set, None, &Prepared::of(&gzip), &plain, &decode);
        assert_eq!(fields(&long, "content-length"), ["5000"]);
        assert_eq!(fields(&long, "accept-ranges"), ["bytes"]);
        assert!(long.get("content-encoding").is_none());
        let unknown = meta(200, &[("content-encoding", "gzip")], 300);
        let set = Arc::new(ObjectSet::of(vec![unknown.clone()]));
        let (_, long) = head(&set, None, &Prepared::of(&unknown), &plain, &decode);
        assert!(long.get("content-length").is_none());
        assert!(long.get("accept-ranges").is_none());
        assert_eq!(fields(&long, "via"), ["1.1 lacquer"]);
    }
}
