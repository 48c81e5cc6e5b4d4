//! The fill's stage that decides on the origin's answer: the backend-response rules, where a part of the
//! object belongs, whether it is stored and under which variant, and the head the readers get.

use std::{sync::Arc, time::Duration};

use http::{header, request::Parts, HeaderMap, HeaderValue, StatusCode};
use lacquer_policy::{
    encoding::{self, Coded},
    range,
    storable::{self, Credentials, Decision, NotStored, Storable},
    vary,
};
use lacquer_rules::Rules;
use lacquer_telemetry::{Child, Trace};

use super::{
    request::{Ask, Ending, Fill},
    send::Sent,
};
use crate::{
    coalesce::{Fetch, FetchError, FetchedHead, HeadError},
    coding::FillCoding,
    esi::fill::EsiFill,
    phase,
    stats::inc,
    store::{BodyWriter, CacheStore},
    worker::Worker,
};

/// What the fill does with the body: store it (and as which part) or not, and how it is coded on the way.
pub(super) struct Verdict<S: CacheStore> {
    /// Where a 206's bytes are in the object: `(first, last, total)`.
    pub placed: Option<(u64, u64, u64)>,
    /// The status the decision judged: a part is stored as its object is, as if the whole were answered.
    pub judged: StatusCode,
    pub storable: Option<Storable>,
    /// The variant the stored response is selected by.
    pub selection: Vec<(String, String)>,
    pub not_stored: Option<NotStored>,
    /// Where the body goes in the store; `None` once it is not stored.
    pub writer: Option<S::Writer>,
    /// From the first byte written to the object's publication (or its abandonment).
    pub storing: Option<Child>,
    pub coding: FillCoding,
    /// A media playlist on a route that prefetches from playlists, as read so far.
    pub playlist: Option<Vec<u8>>,
    /// The page parsed for Edge Side Includes as it streams, when a rule or the route turns them on.
    pub esi: Option<EsiFill>,
}

/// Decides on the answer `sent` to `request` and gives the readers its head; `Err` with how the fill ended
/// when a part asked for came back misplaced.
pub(super) fn decide<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    fetch: &Arc<Fetch<S>>,
    request: &Fill,
    rules: &Rules,
    sent: &mut Sent<'_>,
) -> Result<Verdict<S>, Ending> {
    let Fill {
        key,
        parts,
        client,
        route,
        ..
    } = request;
    let key = key.as_str();
    let shared = &worker.shared;
    let policy = &route.policy;
    let decided = &request.decided;
    let (head, sent_head, trace) = (&mut sent.head, &sent.sent_head, sent.trace);
    let (initial_age, received_at, response_time) =
        (sent.initial_age, sent.received_at, sent.response_time);
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
    // A 206 whose Content-Range places it nowhere: its `Cache-Status` says so, not "uncacheable status".
    let mut unplaced = false;
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
                    return Err(Ending::Failed);
                }
            }
        }
        (_, StatusCode::PARTIAL_CONTENT) => match placed_anywhere(&head.headers) {
            Ok(placed) => Some(placed),
            Err(reason) => {
                inc(&shared.stats.slice_errors);
                tracing::warn!(key, reason, "a 206 that cannot be placed; not storing");
                unplaced = true;
                None
            }
        },
        _ => None,
    };
    let too_large = declared_length(&head.headers)
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
        // A QUERY's response is cacheable as a GET's is (RFC 10008 §2.8).
        Decision::Store(_)
            if decided.body.is_some()
                && parts.method == http::Method::POST
                && !storable::explicitly_fresh(&head.headers, policy) =>
        {
            Decision::DontStore(NotStored::PostWithoutFreshness)
        }
        Decision::Store(_) if request.stand_in && !storable::replaces_stand_in(head.status) => {
            Decision::DontStore(NotStored::StandIn)
        }
        Decision::DontStore(NotStored::Status) if unplaced => {
            Decision::DontStore(NotStored::PartUnplaced)
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
    request.step("Store", || match (&storable, not_stored) {
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
    let writer = match &storable {
        Some(_) => match shared.store.writer(key, &selection, fetch.since()) {
            Ok(mut w) => {
                // A whole body's announced length chooses its chunks (large ones for a download); a part's
                // chunks are the store's, as every part of the body it joins.
                if let (None, Some(length)) = (placed, declared_length(&head.headers)) {
                    w.expect_length(length);
                }
                Some(w)
            }
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
    let playlist = (route.prefetch.playlist > 0
        && request.asked.is_some()
        && head.status == StatusCode::OK
        && placed.is_none()
        && encoding::coded(&head.headers) == Coded::Identity
        && is_playlist(&head.headers, parts))
    .then(Vec::new);
    // Before the coding: a page parsed for ESI is stored decoded, compressed for each client as it is
    // assembled.
    let esi = EsiFill::start(
        adjust.esi.unwrap_or(route.esi) && route.slice.is_none(),
        head.status,
        placed.is_some(),
        &mut head.headers,
        max_object_size,
        &shared.stats,
    );
    let coding = FillCoding::start(
        policy.compression.as_ref().map(|n| &n.settings),
        head.status,
        &mut head.headers,
        // A page parsed for ESI is never compressed as stored: it is compressed as it is assembled.
        (
            writer.is_some(),
            if esi.is_some() {
                Some(false)
            } else {
                adjust.compress
            },
        ),
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
    // Announced with the first body bytes in hand (or before the fill first waits): the readers then
    // write the head and those bytes together.
    fetch.set_head_quietly(fetched);

    Ok(Verdict {
        placed,
        judged,
        storable,
        selection,
        not_stored,
        writer,
        storing,
        coding,
        playlist,
        esi,
    })
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
    let length = declared_length(headers);
    if length.is_some_and(|len| len != last - first + 1) {
        return Err(format!("Content-Range {value:?} with {length:?} bytes"));
    }
    Ok((first, last, total))
}

/// Where the bytes of a 206 are, `(first, last, total)`, wherever its `Content-Range` places them in a
/// representation of known length, with a `Content-Length` (when given) that agrees; otherwise why not.
fn placed_anywhere(headers: &HeaderMap) -> Result<(u64, u64, u64), String> {
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

/// The body length a response declares (`Content-Length`), when it is one number.
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
}
