//! Sliced routes (`[[route]] slice`): an object is fetched from the origin as aligned byte ranges, slices
//! (`Range: bytes=k×size-…`), each stored as a part of the object's one variant body
//! ([`lacquer_storage::Partial`]) and fetched once however many requests want it (coalesced under a key
//! of its own, [`part_key`]). A response, whole or a range, is assembled from the parts stored and the
//! slices fetched for it, the next slice asked for while one is sent, so a client's range costs the origin
//! the slices it covers and an object larger than the memory tier or `max_object_size` is cached slice by
//! slice.
//!
//! The object is one object: one head, one freshness and one set of validators (its first slice's), in one
//! record that purges, bans and tag purges remove whole. A slice whose validators or length are not the
//! object's is a new version of it: the store keeps it as the first part of a new body, and a response is
//! never made of two versions (begun, it ends in an error; not begun, it starts over).

use std::{net::IpAddr, sync::Arc};

use bytes::Bytes;
use http::{header, request::Parts, HeaderMap, HeaderValue, Method, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use lacquer_backends::{
    body::{self, BoxError},
    routing::Route,
};
use lacquer_policy::{
    encoding::{self, Coded, Delivery},
    range::{self, Ranges},
    stale::{usability, Usability},
    storable::NotStored,
};
use lacquer_storage::{ObjectMeta, ObjectSet, Part};
use tokio::sync::mpsc;

use lacquer_telemetry::Trace;

use crate::{
    access_log::Note,
    coalesce::{Fetch, FetchReader, FetchedHead, Joined},
    coding::{Conversion, Negotiated},
    fetch::{self, placed_part, Ask, Fill},
    flow::{
        step::Txn,
        stored::{find_variant, record_hit, vouched, within_request_grace},
    },
    phase::{self, Decided},
    respond::{self, Made, Outcome, Shape},
    stats::inc,
    store::{CacheStore, Found},
    worker::Worker,
};

/// How often a response reads the store again for a slice that a fetch finished meanwhile (the store
/// holds it now), before it fetches slices without looking.
const LOOKS: u32 = 64;

/// The most gaps between stored parts one response of a route without `slice` asks the origin for: a
/// body cut up by many small ranges is fetched whole (or as the client's range) instead, which replaces
/// or joins the parts, rather than costing the origin a request per gap on every response.
const MAX_GAPS: usize = 4;

/// How often a request starts over because the object changed at the origin before its first byte was
/// sent; then it is answered 502.
const RESTARTS: usize = 3;

/// Whether a slice's answer not being stored says the object's other slices would not be either: what
/// its head or its size forbid, not what passes (a failing store, a server error, a stand-in).
fn never_stored(why: NotStored) -> bool {
    matches!(
        why,
        NotStored::Rule
            | NotStored::NoStore
            | NotStored::Private
            | NotStored::Authorization
            | NotStored::SetCookie
            | NotStored::VaryAny
            | NotStored::NoFreshness
            | NotStored::NoCacheWithoutValidator
            | NotStored::NotFresh
            | NotStored::TooLargeSliced
    )
}

/// Bytes `first..=last` of an object asked of the origin in one range request (`None`: to the end).
type Span = (u64, Option<u64>);

/// How the bytes of a response not stored are cut into fetches.
#[derive(Clone, Copy)]
enum Cut {
    /// Aligned slices of this many bytes (`[[route]] slice`).
    Slices(u64),
    /// The bytes between the parts stored, each asked for as one range, with `If-Range` when the object
    /// has a strong validator: an object whose parts are ranges forwarded to the origin on a route
    /// without `slice` (`cache.forward_ranges`).
    Gaps,
}

/// Answers a request on a route sliced in `size`-byte slices. `None` when the object is stored whole (an
/// origin that ignored `Range`, or a store from before the route was sliced): the ordinary way serves it.
pub(crate) async fn serve<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    txn: &Txn,
    size: u64,
) -> Option<Sliced> {
    let shared = &worker.shared;
    let (key, parts) = (txn.key.as_str(), txn.head());
    let asker = Asker::new(worker, txn, Cut::Slices(size), None);
    if shared.coalescer.is_hit_for_miss(key) {
        inc(&shared.stats.hit_for_miss);
        return Some(Sliced::AsSent);
    }
    for attempt in 0..RESTARTS {
        // Noted before the store is read: see `Coalescer::finished`. The last attempt fetches whatever
        // finished meanwhile.
        let looked_up_at = (attempt + 1 < RESTARTS).then(|| shared.coalescer.finished());
        let vouched = vouched(shared);
        let now = lacquer_clock::now_ms();
        let found = find_variant(worker, key, parts).await;
        if let Some(found) = &found {
            found.set.partial(found.meta().generation)?;
            let meta = found.meta();
            let ttl_s = meta.remaining_ttl_ms(now) / 1000;
            let usable = usability(meta.lifetime(now));
            match within_request_grace(usable, meta, now, &txn.decided) {
                Usability::Fresh if vouched => {
                    let object = Object::stored(found, now, looked_up_at);
                    match answer(&asker, object, None, Outcome::Hit { ttl_s }).await {
                        Answered::Sent(resp, outcome) => return Some(Sliced::Sent(resp, outcome)),
                        Answered::AsSent => return Some(Sliced::AsSent),
                        Answered::Changed => continue,
                    }
                }
                Usability::Grace if vouched => {
                    let object = Object::stored(found, now, looked_up_at);
                    let outcome = Outcome::Stale {
                        ttl_s,
                        origin_failed: false,
                        fwd_status: None,
                    };
                    let sliced = match answer(&asker, object, None, outcome).await {
                        Answered::Sent(resp, outcome) => Sliced::Sent(resp, outcome),
                        Answered::AsSent => Sliced::AsSent,
                        Answered::Changed => continue,
                    };
                    inc(&shared.stats.stale_served);
                    asker.refresh(found, size);
                    return Some(sliced);
                }
                _ => {}
            }
        }
        match fetch_first(&asker, size, found, looked_up_at).await {
            Answered::Sent(resp, outcome) => return Some(Sliced::Sent(resp, outcome)),
            Answered::AsSent => return Some(Sliced::AsSent),
            Answered::Changed => {}
        }
    }
    let outcome = Outcome::Miss {
        stored: false,
        collapsed: false,
        detail: Some("object-changing"),
    };
    tracing::warn!(key = %asker.key, "the object kept changing at the origin while sliced: 502");
    let failed = respond::failure(StatusCode::BAD_GATEWAY, outcome);
    Some(Sliced::Sent(Made::Failure(failed), outcome))
}

/// Answers a request on a route without `slice` for an object stored in parts (`found`: ranges forwarded
/// to the origin, `cache.forward_ranges`) while it is fresh: from the parts, the bytes between them fetched
/// as ranges and joined to them when they are of the same version. `None` when the ordinary way answers
/// instead (it fetches the whole, or forwards the range): the object changed at the origin, or nothing
/// proves its parts are of one version with the bytes between them. `looked_up_at` is
/// [`crate::coalesce::Coalescer::finished`] before the store was read.
pub(crate) async fn serve_parts<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    txn: &Txn,
    found: &Found,
    looked_up_at: u64,
) -> Option<Sliced> {
    let meta = found.meta();
    let if_range = range::if_range(meta.validators(), meta.header("date"))
        .and_then(|v| HeaderValue::from_bytes(v).ok());
    let asker = Asker::new(worker, txn, Cut::Gaps, if_range);
    let now = lacquer_clock::now_ms();
    let ttl_s = meta.remaining_ttl_ms(now) / 1000;
    let object = Object::stored(found, now, Some(looked_up_at));
    match answer(&asker, object, None, Outcome::Hit { ttl_s }).await {
        Answered::Sent(resp, outcome) => Some(Sliced::Sent(resp, outcome)),
        Answered::AsSent => Some(Sliced::AsSent),
        Answered::Changed => None,
    }
}

/// How a request the slices answer is answered.
pub(crate) enum Sliced {
    /// With this response, and the cache's verdict on it.
    Sent(Made, Outcome),
    /// Sent to the origin as the client sent it, as a pass: nothing proves slices of one version.
    AsSent,
}

/// What an attempt to answer came to.
enum Answered {
    Sent(Made, Outcome),
    /// Sent to the origin as the client sent it.
    AsSent,
    /// The object changed at the origin before a byte was sent: look it up again.
    Changed,
}

/// Fetches the slice holding the first byte the request wants, revalidating what is stored (`found`) with
/// it when it can, and answers from what that brings: the object it starts, the stored one it confirmed, or
/// the origin's answer as it is when that is not a part (an origin that ignores `Range` sends the whole).
async fn fetch_first<S: CacheStore>(
    asker: &Asker<S>,
    size: u64,
    found: Option<Found>,
    looked_up_at: Option<u64>,
) -> Answered {
    let shared = &asker.worker.shared;
    let now = lacquer_clock::now_ms();
    let stored_total = found
        .as_ref()
        .and_then(|f| f.set.partial(f.meta().generation))
        .map(|p| p.total);
    let wanted = match (stored_total, &found) {
        (Some(total), Some(f)) => {
            let (etag, last_modified) = text_validators(f.meta());
            match range::evaluate(
                &asker.parts.headers,
                total,
                etag.as_deref(),
                last_modified.as_deref(),
            ) {
                Ranges::Parts(parts) => parts[0].0,
                Ranges::Whole | Ranges::Unsatisfiable => 0,
            }
        }
        _ => range::first_wanted(&asker.parts.headers).unwrap_or(0),
    };
    let first = wanted / size * size;
    let ask = Ask::Bytes(first, Some(first.saturating_add(size - 1)));
    let stand_in = found
        .as_ref()
        .is_some_and(|f| usability(f.meta().lifetime(now)) != Usability::Unusable);
    let revalidate = found.clone().filter(Found::revalidatable);
    let Some((mut reader, mut owner)) = asker.ask(ask, revalidate, stand_in, false, looked_up_at)
    else {
        return Answered::Changed;
    };
    let mut head = reader.head().await;
    if let (false, Ok(h)) = (owner, &head) {
        if !asker.takes(h) {
            // Another request's own answer (private, a cookie) or another variant's: this one fetches
            // for itself.
            let (own, _) = asker.alone(ask, found.clone().filter(Found::revalidatable), stand_in);
            (reader, owner) = (own, true);
            head = reader.head().await;
        }
    }
    let fallback = found.clone().filter(|f| {
        let usable = usability(f.meta().lifetime(now));
        matches!(usable, Usability::OnError | Usability::Grace) && vouched(shared)
    });
    let failed = match &head {
        Err(_) => Some(None),
        Ok(h) if h.status.is_server_error() => Some(Some(h.status.as_u16())),
        Ok(_) => None,
    };
    if let (Some(fwd_status), Some(found)) = (failed, &fallback) {
        let outcome = Outcome::Stale {
            ttl_s: found.meta().remaining_ttl_ms(now) / 1000,
            origin_failed: true,
            fwd_status,
        };
        let object = Object::stored(found, now, looked_up_at);
        match answer(asker, object, None, outcome).await {
            Answered::Changed => {}
            answered => {
                inc(&shared.stats.stale_on_error);
                return answered;
            }
        }
    }
    let count_miss = || {
        inc(&shared.stats.misses);
        if !owner {
            inc(&shared.stats.coalesced_waiters);
        }
    };
    let head = match head {
        Ok(head) => head,
        Err(e) => {
            count_miss();
            let outcome = Outcome::Miss {
                stored: false,
                collapsed: !owner,
                detail: Some("backend-error"),
            };
            let failed = respond::failure(e.status, outcome);
            return Answered::Sent(Made::Failure(failed), outcome);
        }
    };
    if head.revalidated {
        // The stored object is confirmed: once the store has its new freshness, it answers (a hit).
        reader.leave_until_settled().await;
        return Answered::Changed;
    }
    count_miss();
    let outcome = Outcome::Miss {
        stored: head.shareable,
        collapsed: !owner,
        detail: None,
    };
    let placed = (head.status == StatusCode::PARTIAL_CONTENT)
        .then(|| placed_part(&head.headers, (first, first.saturating_add(size - 1))).ok())
        .flatten();
    let Some((_, _, total)) = placed else {
        // Not a part (the whole, an error, a redirect): the origin's answer, as a miss of the ordinary way
        // would send it.
        return asker.as_fetched(&head, reader, outcome).await;
    };
    if let Some(why) = head.not_stored.filter(|why| never_stored(*why)) {
        // The object will not be stored whatever slice is asked (`no-store`, past
        // `max_sliced_object_size`, ...): for `hit_for_miss`, later requests go to the origin as they
        // were sent, rather than each costing it a whole slice for one byte.
        let hit_for_miss = asker.route.policy.cache.hit_for_miss;
        shared
            .coalescer
            .mark_hit_for_miss(&asker.key, hit_for_miss, why);
    }
    let (etag, last_modified) = validators(&head.headers);
    if etag.is_none_or(|e| e.starts_with(b"W/")) && (etag.is_some() || last_modified.is_none()) {
        // Nothing proves the next slice is of this version: the client's request goes as it was sent,
        // and so do the next ones for `hit_for_miss`.
        drop(reader);
        inc(&shared.stats.uncacheable);
        let hit_for_miss = asker.route.policy.cache.hit_for_miss;
        shared
            .coalescer
            .mark_hit_for_miss(&asker.key, hit_for_miss, NotStored::PartUnjoinable);
        return Answered::AsSent;
    }
    let object = Object::fetched(&head, total, found.as_ref(), looked_up_at);
    answer(asker, object, Some((first, reader)), outcome).await
}

/// One version of a sliced object: as stored, or as the first slice fetched of it says.
struct Object {
    /// The fields a response starts from: the object's, without `Content-Length` or `Content-Range`.
    head: HeaderMap,
    /// The representation's whole length.
    total: u64,
    /// Its age now.
    age: u64,
    /// Its stored parts, when this version is stored: the set, and the variant body's generation.
    stored: Option<(Arc<ObjectSet>, u64)>,
    /// [`crate::coalesce::Coalescer::finished`] before the store was read, when the slices of this version not stored
    /// then may be looked for again before they are fetched.
    looked_up_at: Option<u64>,
}

impl Object {
    fn stored(found: &Found, now: u64, looked_up_at: Option<u64>) -> Self {
        let meta = found.meta();
        let total = found
            .set
            .partial(meta.generation)
            .map_or(0, |partial| partial.total);
        Self {
            head: meta.header_map(6),
            total,
            age: meta.age_s(now),
            stored: Some((found.set.clone(), meta.generation)),
            looked_up_at,
        }
    }

    /// The version a fetched part (`head`, of a representation `total` bytes long) is of; the stored parts
    /// of `found` serve it too when they are of the same representation.
    fn fetched(
        head: &FetchedHead,
        total: u64,
        found: Option<&Found>,
        looked_up_at: Option<u64>,
    ) -> Self {
        let mut fields = head.headers.clone();
        for name in [header::CONTENT_RANGE, header::CONTENT_LENGTH] {
            fields.remove(name);
        }
        let stored = found.and_then(|f| {
            let partial = f.set.partial(f.meta().generation)?;
            (partial.total == total
                && range::same_representation(f.meta().proof(), validators(&fields)))
            .then(|| (f.set.clone(), f.meta().generation))
        });
        Self {
            head: fields,
            total,
            age: head.initial_age + head.received_at.elapsed().as_secs(),
            stored,
            looked_up_at,
        }
    }
}

/// A head's `ETag` and `Last-Modified` values as proof of which representation it is
/// ([`range::proving`]: a `Last-Modified` only when strong against its `Date`).
fn validators(headers: &HeaderMap) -> range::Validators<'_> {
    let value = |name| headers.get(name).map(HeaderValue::as_bytes);
    range::proving(
        (value(header::ETAG), value(header::LAST_MODIFIED)),
        value(header::DATE),
    )
}

fn text_validators(meta: &ObjectMeta) -> (Option<String>, Option<String>) {
    let text = |v: Option<&[u8]>| {
        v.and_then(|v| std::str::from_utf8(v).ok())
            .map(str::to_owned)
    };
    let (etag, last_modified) = meta.validators();
    (text(etag), text(last_modified))
}

/// Answers the request from `object`: conditionals and ranges evaluated over its whole length, the source of
/// the first byte proved before the status line (a stored part that is there, or a fetched slice of this
/// version: `first` is one already under way, from its first byte), the rest streamed by an [`Assembly`].
async fn answer<S: CacheStore>(
    asker: &Asker<S>,
    object: Object,
    first: Option<(u64, FetchReader<S>)>,
    outcome: Outcome,
) -> Answered {
    let shared = &asker.worker.shared;
    let mut headers = object.head.clone();
    let total = object.total;
    let shape = respond::shape(&asker.parts, &mut headers, Some(total), StatusCode::OK);
    let (status, span) = match shape {
        // Several ranges are answered with the whole, as RFC 9110 §14.2 allows.
        Shape::Whole | Shape::Parts(_) => (StatusCode::OK, (total > 0).then(|| (0, total - 1))),
        Shape::Part(from, to) => {
            let value = format!("bytes {from}-{to}/{total}");
            headers.insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&value).expect("ascii"),
            );
            (StatusCode::PARTIAL_CONTENT, Some((from, to)))
        }
        other => {
            respond::decorate(&mut headers, outcome, Some(object.age));
            let resp = respond::response(other.status(), headers, body::empty());
            return Answered::Sent(Made::Answer(resp), outcome);
        }
    };
    let length = span.map_or(0, |(from, to)| to - from + 1);
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    respond::decorate(&mut headers, outcome, Some(object.age));
    let Some((from, to)) = span.filter(|_| asker.parts.method != Method::HEAD) else {
        let resp = respond::response(status, headers, body::empty());
        return Answered::Sent(Made::Answer(resp), outcome);
    };
    let (etag, last_modified) = validators(&object.head);
    let owned = |v: Option<&[u8]>| v.and_then(|v| HeaderValue::from_bytes(v).ok());
    let (etag, last_modified) = (owned(etag), owned(last_modified));
    let mut assembly = Assembly {
        asker: asker.clone(),
        etag,
        last_modified,
        total,
        stored: object.stored,
        lost: Vec::new(),
        ahead: Vec::new(),
        proved: None,
        looked_up_at: object.looked_up_at,
        looks_left: LOOKS,
    };
    if let Cut::Gaps = asker.cut {
        // Parts help where they can; otherwise the ordinary way answers, and its whole (or the client's
        // range) replaces or joins them: a response that would need more than `MAX_GAPS` gaps, or an open
        // range (`bytes=a-`, a resumed download) reaching past the parts, which one fetch of the whole
        // serves for every client resuming (`forward_ranges`).
        let gaps = assembly.gaps(from, to).len();
        let open = matches!(
            range::single(&asker.parts.headers),
            Some(range::Single::From(_, None))
        );
        let resumes = open && gaps > 0 && !shared.coalescer.is_hit_for_miss(&asker.key);
        if gaps > MAX_GAPS || resumes {
            return Answered::Changed;
        }
    }
    // The slice fetched to learn of the object, unless the response starts elsewhere (a suffix, an
    // If-Range that did not hold): a reader that never reads would hold an unstored fetch still.
    let (_, span) = assembly.unit(from, to);
    if let Some((_, reader)) = first.filter(|(slice, _)| *slice == span.0) {
        assembly.ahead.push((span, reader, true));
    }
    // The first byte's source is proved before the status line: its chunk read from the store (a part
    // found to have lost it is forgotten, and the slice fetched instead), or its slice's head checked.
    let fetched = loop {
        if let Some(part) = assembly.part_holding(from) {
            let chunk = u64::from(part.body.chunk_size.max(1));
            let index = ((from - part.start) / chunk) as u32;
            match shared.store.read_part_chunk(&part.body, index, total).await {
                Ok(Some(read)) => {
                    if let Outcome::Hit { .. } | Outcome::Stale { .. } = outcome {
                        record_hit(&shared.stats, read.tier);
                    }
                    assembly.proved = Some((part.body.generation, index, read.data));
                    break None;
                }
                Ok(None) | Err(_) => {
                    assembly.forget(&part);
                    continue;
                }
            }
        }
        match assembly.fetched(span).await {
            Ok(Some(reader)) => break Some(Ok(reader)),
            // Stored meanwhile: read it.
            Ok(None) => continue,
            Err(stop) => break Some(Err(stop)),
        }
    };
    let outcome = match outcome {
        // The first byte comes from the origin after all: what was found stored does not hold it.
        Outcome::Hit { .. } if assembly.proved.is_none() => {
            inc(&shared.stats.misses);
            Outcome::Miss {
                stored: true,
                collapsed: false,
                detail: None,
            }
        }
        outcome => outcome,
    };
    headers.insert(
        crate::fields::X_CACHE,
        HeaderValue::from_static(outcome.x_cache()),
    );
    headers.insert(crate::fields::CACHE_STATUS, outcome.cache_status());
    match fetched {
        Some(Ok(reader)) => assembly.ahead.push((span, reader, true)),
        Some(Err(stop)) => return stopped(asker, stop).await,
        None => {}
    }
    let first_gap = match asker.cut {
        Cut::Gaps => assembly.gaps(from, to).first().copied(),
        Cut::Slices(_) => None,
    };
    if let Some(gap) = first_gap {
        // Parts stored that are not proved to be of one version with the bytes between them (no strong
        // validator, or the origin's object changed) would make a body of two: the first gap's head is
        // checked before the status line too, and the whole is answered when the origin sends it.
        let (_, span) = assembly.unit(gap, to);
        match assembly.fetched(span).await {
            Ok(Some(reader)) => assembly.ahead.push((span, reader, true)),
            Ok(None) => {}
            Err(stop) => return stopped(asker, stop).await,
        }
    }
    // Two chunks queued for the connection while the task reads the next: a stored body streams at the
    // store's pace, and a response holds at most three chunks.
    let (tx, rx) = mpsc::channel(2);
    tokio::spawn(assembly.run(from, to, tx));
    let body = body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
        let item = rx.recv().await?;
        Some((item.map(Frame::data), rx))
    }));
    Answered::Sent(
        Made::Answer(respond::response(status, headers, body)),
        outcome,
    )
}

/// The answer when a fetch stopped before a byte was sent: the object looked up again once the new
/// version is stored (`Changed`), the origin's whole answer (`Whole`), or 502.
async fn stopped<S: CacheStore>(asker: &Asker<S>, stop: Stop<S>) -> Answered {
    match stop {
        Stop::Changed(fetch) => {
            // A sliced object is looked up again once the new version's slice is stored, or the lookup
            // would find the old version again. Parts are tried once: the ordinary way need not wait.
            if let (Cut::Slices(_), Some(reader)) = (asker.cut, fetch) {
                reader.leave_until_settled().await;
            }
            Answered::Changed
        }
        Stop::Whole(reader, head) => {
            // The origin answers the whole now: as `fetch_first` answers it.
            let outcome = Outcome::Miss {
                stored: head.shareable,
                collapsed: false,
                detail: None,
            };
            asker.as_fetched(&head, reader, outcome).await
        }
        Stop::Failed(e) => {
            inc(&asker.worker.shared.stats.backend_errors);
            let outcome = Outcome::Miss {
                stored: false,
                collapsed: false,
                detail: Some("backend-error"),
            };
            tracing::warn!(key = %asker.key, error = %e, "a slice fetch failed: 502");
            let failed = respond::failure(StatusCode::BAD_GATEWAY, outcome);
            Answered::Sent(Made::Failure(failed), outcome)
        }
    }
}

/// What a request needs to fetch slices of its object: owned, for the task that streams its body.
struct Asker<S: CacheStore> {
    worker: Arc<Worker<S>>,
    key: String,
    parts: Arc<Parts>,
    client: IpAddr,
    route: Arc<Route>,
    decided: Decided,
    cut: Cut,
    /// The object's strong validator, which a gap's fetch sends as `If-Range`.
    if_range: Option<HeaderValue>,
    /// The client's `Accept-Encoding` on a route that negotiates codings (a sliced one does not): how a
    /// whole answer fetched instead of a gap leaves for it.
    negotiated: Option<Negotiated>,
    /// The request's access-log note and trace, for the fills it starts.
    note: Option<Arc<Note>>,
    trace: Option<Trace>,
}

impl<S: CacheStore> Clone for Asker<S> {
    fn clone(&self) -> Self {
        Self {
            worker: self.worker.clone(),
            key: self.key.clone(),
            parts: self.parts.clone(),
            client: self.client,
            route: self.route.clone(),
            decided: self.decided.clone(),
            cut: self.cut,
            if_range: self.if_range.clone(),
            negotiated: self.negotiated.clone(),
            note: self.note.clone(),
            trace: self.trace.clone(),
        }
    }
}

impl<S: CacheStore> Asker<S> {
    fn new(worker: &Arc<Worker<S>>, txn: &Txn, cut: Cut, if_range: Option<HeaderValue>) -> Self {
        Self {
            worker: worker.clone(),
            key: txn.key.clone(),
            parts: txn.head().clone(),
            client: txn.client,
            route: txn.route.clone(),
            decided: txn.decided.clone(),
            cut,
            if_range,
            negotiated: txn.negotiated.clone(),
            note: txn.note.clone(),
            trace: txn.trace.clone(),
        }
    }

    /// How a fetch of a slice (or a gap) is made.
    fn fill(&self, ask: Ask, how: Asked) -> Fill {
        Fill {
            key: self.key.clone(),
            registered: how.registered,
            parts: self.parts.clone(),
            // A slice or a gap is no playlist.
            asked: None,
            client: self.client,
            route: self.route.clone(),
            decided: self.decided.clone(),
            stale: how.stale,
            background: how.background,
            stand_in: how.stand_in,
            part: Some(ask),
            if_range: how.if_range,
            note: self.note.clone(),
            trace: self.trace.clone(),
            interim: None,
        }
    }

    /// Starts `fetch` of `ask`: a reader of it, made before the fill task starts (so the fill never sees a
    /// fetch without readers that it would cancel), and `true`: this request started it.
    fn start(&self, fetch: Arc<Fetch<S>>, ask: Ask, how: Asked) -> (FetchReader<S>, bool) {
        let reader = fetch.reader();
        inc(&self.worker.shared.stats.slices_fetched);
        let fill = self.fill(ask, how);
        tokio::spawn(fetch::run(self.worker.clone(), fetch, fill));
        (reader, true)
    }

    fn transit_buffer(&self) -> u64 {
        self.route.policy.cache.transit_buffer.as_u64()
    }

    /// Joins the fetch of `ask` under way, or starts it (revalidating `stale` with it when given; with
    /// `If-Range` in `if_range`); a reader of it, and whether this request started it. For a request that read the
    /// store when [`crate::coalesce::Coalescer::finished`] was `looked_up_at`: `None` when a fetch
    /// finished since (it may have stored the slice), so the caller looks again instead of fetching the
    /// slice a second time.
    fn ask(
        &self,
        ask: Ask,
        stale: Option<Found>,
        stand_in: bool,
        background: bool,
        looked_up_at: Option<u64>,
    ) -> Option<(FetchReader<S>, bool)> {
        let shared = &self.worker.shared;
        let transit_buffer = self.transit_buffer();
        let if_range = self.condition(stale.as_ref());
        let how = |registered| Asked {
            registered,
            stale: stale.clone(),
            stand_in,
            background,
            if_range: if_range.clone(),
        };
        let now = shared.store.mark();
        let key = ask.key(&self.key);
        Some(
            match shared
                .coalescer
                .join(&key, now, transit_buffer, looked_up_at, |since| {
                    shared.store.invalidated_after(since, &self.key)
                }) {
                Joined::Leader(fetch) => self.start(fetch, ask, how(true)),
                Joined::Waiter(fetch) => {
                    let reader = fetch.reader();
                    if reader.cancelled() {
                        self.start(Fetch::new(now, transit_buffer), ask, how(false))
                    } else {
                        (reader, false)
                    }
                }
                Joined::HitForMiss => self.start(Fetch::new(now, transit_buffer), ask, how(false)),
                Joined::LookAgain => return None,
            },
        )
    }

    /// Starts a fetch of `ask` for this request alone (revalidating `stale` with it when given), not
    /// joined by any other.
    fn alone(&self, ask: Ask, stale: Option<Found>, stand_in: bool) -> (FetchReader<S>, bool) {
        let fetch = Fetch::new(self.worker.shared.store.mark(), self.transit_buffer());
        let how = Asked {
            registered: false,
            if_range: self.condition(stale.as_ref()),
            stale,
            stand_in,
            background: false,
        };
        self.start(fetch, ask, how)
    }

    /// The `If-Range` a gap's fetch carries, so that an origin whose object changed sends the whole instead
    /// of a part of another version: the object's strong entity-tag or, without one, its `Last-Modified`.
    /// Slices carry none (a whole answer to a slice of a huge object would be the huge object), nor does a
    /// revalidation (`stale`), whose conditionals already ask whether the object changed.
    fn condition(&self, stale: Option<&Found>) -> Option<HeaderValue> {
        let (Cut::Gaps, None) = (self.cut, stale) else {
            return None;
        };
        self.if_range.clone()
    }

    /// Whether this request may take a fetch another started: an answer that is stored, of the variant
    /// this request selects (one that is not is the other request's own).
    fn takes(&self, head: &FetchedHead) -> bool {
        head.shareable && phase::selects(&head.selection, &self.parts)
    }

    /// A fetched answer that is not a part (the whole, an error), sent as the ordinary way sends a miss:
    /// in a coding this client takes (on a sliced route, which does not compress, as the origin coded
    /// it), shaped for the request's range.
    async fn as_fetched(
        &self,
        head: &FetchedHead,
        reader: FetchReader<S>,
        outcome: Outcome,
    ) -> Answered {
        let shared = &self.worker.shared;
        let policy = &self.route.policy;
        let delivery = self
            .negotiated
            .as_ref()
            .map_or(Delivery::AsStored, |n| n.delivery(&head.headers));
        if delivery == Delivery::Forward {
            // Nothing fetched is in a coding this client may get (`no-transform`): as the client sent it.
            drop(reader);
            inc(&shared.stats.coding_forwarded);
            return Answered::AsSent;
        }
        let limit = policy.cache.max_object_size.as_u64();
        let settings = policy.compression.as_ref().map(|n| &n.settings);
        let conversion = Conversion::new(delivery, limit, settings, &shared.stats);
        let made = respond::fetched(head, reader, outcome, &self.parts, &conversion).await;
        Answered::Sent(made, outcome)
    }

    /// Revalidates an object of a sliced route served in grace, in the background, with its first stored
    /// part's slice, unless a fetch of that slice is under way.
    fn refresh(&self, found: &Found, size: u64) {
        let first = found
            .set
            .partial(found.meta().generation)
            .and_then(|p| p.parts.first())
            .map_or(0, |p| p.start / size * size);
        let ask = Ask::Bytes(first, Some(first.saturating_add(size - 1)));
        let stale = Some(found.clone()).filter(Found::revalidatable);
        let key = ask.key(&self.key);
        let shared = &self.worker.shared;
        let now = shared.store.mark();
        if let Joined::Leader(fetch) =
            shared
                .coalescer
                .join(&key, now, self.transit_buffer(), None, |since| {
                    shared.store.invalidated_after(since, &self.key)
                })
        {
            let how = Asked {
                registered: true,
                stale,
                stand_in: true,
                background: true,
                if_range: None,
            };
            // Nobody reads it: a background fill is not cancelled for want of readers.
            drop(self.start(fetch, ask, how));
        }
    }
}

/// How a slice's fetch is asked for, besides which slice.
struct Asked {
    /// It is the coalescer's entry for the slice.
    registered: bool,
    /// A stored object it revalidates.
    stale: Option<Found>,
    /// The stored object may stand in for a failing origin.
    stand_in: bool,
    /// Nobody waits for it: not cancelled for want of readers.
    background: bool,
    /// The `If-Range` it carries.
    if_range: Option<HeaderValue>,
}

/// Why a response stops taking bytes from a slice.
enum Stop<S: CacheStore> {
    /// The slice is of another version of the object, which its fetch (when it is storing it) replaces
    /// the stored one with.
    Changed(Option<FetchReader<S>>),
    /// The origin answered the slice's range with the whole object.
    Whole(FetchReader<S>, Arc<FetchedHead>),
    /// The origin failed, or sent what cannot be placed.
    Failed(String),
}

/// The body of one response from one version of a sliced object: stored parts where they hold the bytes,
/// fetched slices elsewhere, the next slice asked for while one is sent.
struct Assembly<S: CacheStore> {
    asker: Asker<S>,
    /// The object's validators as proof of its version (`validators`): what every part must carry.
    etag: Option<HeaderValue>,
    last_modified: Option<HeaderValue>,
    total: u64,
    stored: Option<(Arc<ObjectSet>, u64)>,
    /// Parts found to have lost a chunk (by generation): not read again.
    lost: Vec<u64>,
    /// Fetches started ahead of their bytes, by the bytes they ask for, and whether this response started
    /// them.
    ahead: Vec<(Span, FetchReader<S>, bool)>,
    /// The first chunk sent, read to prove it before the status line: the part's generation, the chunk's
    /// index in it, its bytes.
    proved: Option<(u64, u32, Bytes)>,
    /// [`crate::coalesce::Coalescer::finished`] when `stored` was read; `None` once looking again is given up.
    looked_up_at: Option<u64>,
    /// How many more times the store may be looked up again for a slice a fetch just finished.
    looks_left: u32,
}

impl<S: CacheStore> Assembly<S> {
    /// The object's validators, which every part must carry.
    fn proof(&self) -> range::Validators<'_> {
        (
            self.etag.as_ref().map(HeaderValue::as_bytes),
            self.last_modified.as_ref().map(HeaderValue::as_bytes),
        )
    }

    /// The stored part holding byte `at`, if any.
    fn part_holding(&self, at: u64) -> Option<Part> {
        let (set, generation) = self.stored.as_ref()?;
        let partial = set.partial(*generation)?;
        partial
            .parts
            .iter()
            .filter(|p| p.start <= at && at < p.end() && !self.lost.contains(&p.body.generation))
            .max_by_key(|p| p.end())
            .cloned()
    }

    /// The fetch that brings byte `at` (not stored) of a response ending at byte `to`: the last byte of the
    /// response it brings, and the bytes it asks the origin for. A slice; or the gap from `at` to the next
    /// part stored or the response's end, asked for open-ended when that is the object's end.
    fn unit(&self, at: u64, to: u64) -> (u64, Span) {
        match self.asker.cut {
            Cut::Slices(size) => {
                let first = at / size * size;
                let last = first.saturating_add(size - 1);
                (last.min(to), (first, Some(last)))
            }
            Cut::Gaps => {
                let next = self.stored.as_ref().and_then(|(set, generation)| {
                    let partial = set.partial(*generation)?;
                    partial
                        .parts
                        .iter()
                        .filter(|p| p.start > at && !self.lost.contains(&p.body.generation))
                        .map(|p| p.start)
                        .min()
                });
                let last = next.map_or(to, |n| to.min(n - 1));
                let end = if last + 1 == self.total {
                    None
                } else {
                    Some(last)
                };
                (last, (at, end))
            }
        }
    }

    /// Where the gaps between stored parts in bytes `from..=to` begin: `MAX_GAPS + 1` at most, enough to
    /// tell there are too many.
    fn gaps(&self, from: u64, to: u64) -> Vec<u64> {
        let (mut gaps, mut at) = (Vec::new(), from);
        while at <= to && gaps.len() <= MAX_GAPS {
            at = match self.part_holding(at) {
                Some(part) => part.end(),
                None => {
                    gaps.push(at);
                    self.unit(at, to).0 + 1
                }
            };
        }
        gaps
    }

    /// Forgets a part found to have lost a chunk: not read again by this response, and removed from the
    /// store, so the bytes are fetched again.
    fn forget(&mut self, part: &Part) {
        self.lost.push(part.body.generation);
        if let Some((_, of)) = &self.stored {
            let store = &self.asker.worker.shared.store;
            if let Err(e) = store.remove_part(&self.asker.key, *of, part.body.generation) {
                tracing::warn!(key = %self.asker.key, error = %e, "cannot forget a lost part");
            }
        }
    }

    /// Sends bytes `from..=to` into `tx`; a failure ends the body with an error.
    async fn run(mut self, mut from: u64, to: u64, tx: mpsc::Sender<Result<Bytes, BoxError>>) {
        while from <= to {
            // A stored part is sent to its end, or a slice's.
            let mut until = to;
            if let Cut::Slices(size) = self.asker.cut {
                let next = (from / size * size).saturating_add(size);
                until = to.min(next - 1);
                let span = (next, Some(next.saturating_add(size - 1)));
                if next <= to
                    && self.part_holding(next).is_none()
                    && !self.ahead.iter().any(|(a, ..)| *a == span)
                {
                    // In the background: a client that leaves does not cancel a slice others will want.
                    let ask = Ask::Bytes(span.0, span.1);
                    let asked = self.asker.ask(ask, None, false, true, self.looked_up_at);
                    if let Some((reader, owner)) = asked {
                        self.ahead.push((span, reader, owner));
                    }
                }
            }
            let sent = match self.part_holding(from) {
                Some(part) => {
                    self.send_stored(&part, from, until.min(part.end() - 1), &tx)
                        .await
                }
                None => {
                    let (last, span) = self.unit(from, to);
                    match self.fetched(span).await {
                        Ok(Some(reader)) => {
                            self.send_fetched(reader, span.0, from, last, &tx).await
                        }
                        // Stored meanwhile: read it.
                        Ok(None) => continue,
                        Err(stop) => Err(stop),
                    }
                }
            };
            match sent {
                Ok(Some(reached)) => from = reached,
                // The client is gone.
                Ok(None) => return,
                Err(stop) => {
                    let why = match stop {
                        Stop::Changed(_) | Stop::Whole(..) => {
                            "the object changed at the origin".to_owned()
                        }
                        Stop::Failed(e) => e,
                    };
                    tracing::warn!(key = %self.asker.key, from, error = %why, "a sliced response ends early");
                    let _ = tx.send(Err(BoxError::from(why))).await;
                    return;
                }
            }
        }
    }

    /// Sends bytes `from..=to` of a stored part; where it reached (one past the last byte sent), which is
    /// short of `to` when a chunk was lost (the rest is then fetched); `None` when the client is gone.
    async fn send_stored(
        &mut self,
        part: &Part,
        from: u64,
        to: u64,
        tx: &mpsc::Sender<Result<Bytes, BoxError>>,
    ) -> Result<Option<u64>, Stop<S>> {
        let shared = &self.asker.worker.shared;
        let store = &shared.store;
        let chunk = u64::from(part.body.chunk_size.max(1));
        let (first, last) = ((from - part.start) / chunk, (to - part.start) / chunk);
        inc(&shared.stats.slices_served);
        let proved = self
            .proved
            .take()
            .filter(|(generation, index, _)| {
                *generation == part.body.generation && u64::from(*index) == first
            })
            .map(|(_, _, data)| data);
        let total = self.total;
        let read = |index: u64| store.read_part_chunk(&part.body, index as u32, total);
        // The chunks after the one being sent are read meanwhile (from the disk tier on the store's
        // runtime), as a body stored whole is: `respond::READ_AHEAD`.
        let ahead = (respond::READ_AHEAD / chunk).max(1);
        let mut reads = std::collections::VecDeque::new();
        let mut asked = first + u64::from(proved.is_some());
        let mut proved = proved;
        let mut at = from;
        for index in first..=last {
            while asked <= last && asked <= index + ahead {
                reads.push_back(read(asked));
                asked += 1;
            }
            let data = match proved.take() {
                Some(data) => Ok(Some(data)),
                None => reads
                    .pop_front()
                    .expect("a read for every chunk")
                    .await
                    .map(|read| read.map(|r| r.data)),
            };
            let data = match data {
                Ok(Some(data)) => data,
                Ok(None) | Err(_) => {
                    self.forget(part);
                    return Ok(Some(at));
                }
            };
            let chunk_start = part.start + index * chunk;
            let skip = (at - chunk_start) as usize;
            let end = ((to + 1 - chunk_start) as usize).min(data.len());
            if tx.send(Ok(data.slice(skip..end))).await.is_err() {
                return Ok(None);
            }
            at = chunk_start + end as u64;
        }
        Ok(Some(at))
    }

    /// Sends bytes `from..=to` of the slice (or gap) starting at byte `slice`, from its fetch; where it
    /// reached, or `None` when the client is gone.
    async fn send_fetched(
        &mut self,
        reader: FetchReader<S>,
        slice: u64,
        from: u64,
        to: u64,
        tx: &mpsc::Sender<Result<Bytes, BoxError>>,
    ) -> Result<Option<u64>, Stop<S>> {
        let mut body = reader.into_range_body(from - slice, to - slice);
        let mut at = from;
        while let Some(frame) = body.frame().await {
            let data = frame
                .map_err(|e| Stop::Failed(format!("slice from byte {slice}: {e}")))?
                .into_data()
                .unwrap_or_default();
            at += data.len() as u64;
            if tx.send(Ok(data)).await.is_err() {
                return Ok(None);
            }
        }
        if at != to + 1 {
            return Err(Stop::Failed(format!(
                "slice from byte {slice} ended at byte {at}"
            )));
        }
        Ok(Some(at))
    }

    /// The fetch of the slice starting at byte `slice` (started ahead, or now), once its head shows it is a
    /// part of this version of the object; `None` when the store holds the slice now (read it).
    async fn fetched(&mut self, (slice, last): Span) -> Result<Option<FetchReader<S>>, Stop<S>> {
        let stats = self.asker.worker.shared.stats.clone();
        let ask = Ask::Bytes(slice, last);
        let (mut reader, mut owner) =
            match self.ahead.iter().position(|(a, ..)| *a == (slice, last)) {
                Some(pos) => {
                    let (_, reader, owner) = self.ahead.swap_remove(pos);
                    (reader, owner)
                }
                None => match self.asker.ask(ask, None, false, false, self.looked_up_at) {
                    Some(asked) => asked,
                    None => {
                        self.look_again().await;
                        return Ok(None);
                    }
                },
            };
        let failed = |e: crate::coalesce::HeadError| {
            Stop::Failed(format!("slice from byte {slice}: {}", e.error))
        };
        let mut head = reader.head().await.map_err(failed)?;
        if head.revalidated {
            // Another request's revalidation, which confirmed the object: the store holds that slice.
            drop(reader);
            self.look_again().await;
            if self.part_holding(slice).is_some() {
                return Ok(None);
            }
            (reader, owner) = self.asker.alone(ask, None, false);
            head = reader.head().await.map_err(failed)?;
        }
        if !owner && !self.asker.takes(&head) {
            (reader, _) = self.asker.alone(ask, None, false);
            head = reader.head().await.map_err(failed)?;
        }
        let asked = (slice, last.unwrap_or(u64::MAX));
        let placed = (head.status == StatusCode::PARTIAL_CONTENT)
            .then(|| placed_part(&head.headers, asked).ok())
            .flatten();
        let Some((_, _, total)) = placed else {
            if head.status == StatusCode::OK {
                // A whole answer where a part was: the origin stopped honouring ranges.
                inc(&stats.slice_mismatches);
                return Err(Stop::Whole(reader, head));
            }
            return Err(Stop::Failed(format!(
                "slice from byte {slice}: the origin answered {}",
                head.status
            )));
        };
        let same = range::same_representation(self.proof(), validators(&head.headers));
        if total != self.total || !same {
            inc(&stats.slice_mismatches);
            // The origin has a new version: the stored one goes now, not once the new version's slice is
            // stored (after its body arrives), or a request in between would start the old version's
            // body, with its length, and be cut where its stored slices end.
            if let Some((_, generation)) = &self.stored {
                let key = &self.asker.key;
                if let Err(e) = self
                    .asker
                    .worker
                    .shared
                    .store
                    .remove_generation(key, *generation)
                {
                    tracing::warn!(key, error = %e, "an old version of a sliced object not removed");
                }
            }
            return Err(Stop::Changed(Some(reader)));
        }
        if encoding::coded(&head.headers) != Coded::Identity {
            // Asked for without `Accept-Encoding`, coded all the same: its bytes would not be the
            // representation's.
            inc(&stats.slice_errors);
            return Err(Stop::Failed(format!(
                "bytes from {slice}: the origin coded them"
            )));
        }
        Ok(Some(reader))
    }

    /// Reads the store again after a fetch finished since it was read (it may have stored the slice
    /// wanted): the parts of this version stored now. After [`LOOKS`] times, slices are fetched without
    /// looking again.
    async fn look_again(&mut self) {
        let shared = &self.asker.worker.shared;
        self.looks_left = self.looks_left.saturating_sub(1);
        self.looked_up_at = (self.looks_left > 0).then(|| shared.coalescer.finished());
        let worker = &self.asker.worker;
        let Some(found) = find_variant(worker, &self.asker.key, &self.asker.parts).await else {
            return;
        };
        let meta = found.meta();
        let same = found
            .set
            .partial(meta.generation)
            .is_some_and(|p| p.total == self.total)
            && range::same_representation(meta.proof(), self.proof());
        if same {
            self.stored = Some((found.set.clone(), meta.generation));
        }
    }
}
