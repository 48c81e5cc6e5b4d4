//! The fill's stage for a 304 to the validators of what is stored: the stored object confirmed, its head
//! and freshness brought up to date, its body served to the readers from the store.

use std::{sync::Arc, time::Duration};

use http::{header, HeaderMap, HeaderName, StatusCode};
use lacquer_policy::storable::{self, Credentials, Decision};

use super::{
    publish::with_response,
    request::{Ending, Fill},
    send::Sent,
};
use crate::{
    coalesce::{Fetch, FetchError, FetchedHead, HeadError},
    phase,
    store::{CacheStore, Found},
    worker::Worker,
};

const KEEP_ON_UPDATE: [HeaderName; 4] = [
    header::CONTENT_LENGTH,
    header::CONTENT_ENCODING,
    header::CONTENT_RANGE,
    header::ETAG,
];

/// A 304 for a stored object: its headers are updated from the 304 (RFC 9111 §4.3.4), its freshness is
/// recomputed, and the readers get the stored body, which the origin did not send again.
pub(super) async fn revalidated<S: CacheStore>(
    worker: &Worker<S>,
    fetch: &Arc<Fetch<S>>,
    request: &Fill,
    stale: &Found,
    update: HeaderMap,
    sent: &Sent<'_>,
) -> Ending {
    let (initial_age, response_time) = (sent.initial_age, sent.response_time);
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
