//! The fill's last stage: what was stored published (a whole body, or a part of one), or why nothing was.

use std::{sync::Arc, time::SystemTime};

use http::{header, HeaderMap, StatusCode};
use lacquer_policy::{
    encoding::USE_AS_DICTIONARY,
    storable::{NotStored, Storable},
    surrogate, Policy,
};
use lacquer_storage::{ObjectMeta, PartKept};

use super::{
    decide::Verdict,
    pump::Pumped,
    request::{Ending, Fill},
    send::Sent,
};
use crate::{
    stats::inc,
    store::{BodyWriter, CacheStore},
    worker::Worker,
};

/// Publishes the body the fill stored, under the head the readers got.
pub(super) async fn publish<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    request: &Fill,
    sent: Sent<'_>,
    verdict: Verdict<S>,
    pumped: Pumped,
) -> Ending {
    let key = request.key.as_str();
    let shared = &worker.shared;
    let policy = &request.route.policy;
    let Sent {
        mut head,
        initial_age,
        response_time,
        ..
    } = sent;
    let Verdict {
        placed,
        judged,
        storable,
        selection,
        not_stored,
        writer,
        storing,
        ..
    } = verdict;
    let Pumped {
        left,
        grew_too_large,
    } = pumped;
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
        Ok(()) => {
            if head.headers.contains_key(USE_AS_DICTIONARY) {
                offer_dictionary(worker, request, key).await;
            }
            Ending::Stored
        }
        Err(e) if e.is_refusal() => Ending::NotStored(NotStored::StoreRefused),
        Err(e) => {
            tracing::warn!(key, error = %e, "storing failed");
            Ending::NotStored(NotStored::StoreRefused)
        }
    }
}

/// Offers the response just stored under `key` as a compression dictionary (read in the background), so
/// that the next request for a file it compresses finds it held.
async fn offer_dictionary<S: CacheStore>(worker: &Arc<Worker<S>>, request: &Fill, key: &str) {
    let shared = &worker.shared;
    let Some(negotiation) = &request.route.policy.compression else {
        return;
    };
    if let Ok(Some(set)) = shared.store.lookup(key).await {
        for meta in &set.variants {
            shared.dictionaries.offer(
                &shared.store,
                &shared.stats,
                &negotiation.settings,
                key,
                meta,
            );
        }
    }
}

/// `base` carrying the headers and freshness of a response the store keeps.
pub(super) fn with_response(
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
