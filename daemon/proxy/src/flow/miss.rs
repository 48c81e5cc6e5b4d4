//! The miss step: the request answered from a fetch, a new one or one in flight for the same key
//! (coalescing), revalidating what the lookup found when it can, and falling back on it when the origin
//! fails.

use std::{borrow::Cow, sync::Arc};

use http::{header, StatusCode};
use lacquer_policy::{
    encoding::Delivery,
    stale::{usability, Usability},
    storable::NotStored,
};
use lacquer_storage::Tier;

use super::{
    hit, pass,
    step::{Joining, Miss, Stale, Step, Txn},
    stored::record_hit,
};
use crate::{
    coalesce::{Fetch, FetchError, HeadError, Joined},
    fetch::{forwarded_range, Fill},
    hls, phase, prefetch,
    respond::{self, busy_briefly, Made, Outcome},
    stats::inc,
    store::{CacheStore, Found},
    worker::Worker,
};

/// Answers a request the store could not, from a fetch: a new one, or one in flight for the same key.
/// Looks up again when the fetch in flight is for another variant and has now settled, or when a fetch
/// finished since the lookup (`looked_up_at`, see [`crate::coalesce::Coalescer::join`]); with
/// [`Joining::NoWait`] it fetches alone instead.
pub(super) async fn miss<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    txn: &mut Txn,
    miss: Miss,
) -> Step {
    txn.send_early_hints(&worker.shared.stats);
    let Miss {
        joining,
        stale: Stale {
            found: stale,
            vouched,
        },
        looked_up_at,
    } = miss;
    let may_wait = joining == Joining::MayWait;
    let shared = &worker.shared;
    // Misses are rare beside hits: the head, the route and the key are held here while the steps they may
    // end in (a stale object served, a pass) take the request's context.
    let (client, route, key) = (txn.client, txn.route.clone(), txn.key.clone());
    let (route, key, parts) = (&route, key.as_str(), &txn.head().clone());
    let transit_buffer = route.policy.cache.transit_buffer.as_u64();
    let stand_in = stale.as_ref().is_some_and(|found| {
        usability(found.meta().lifetime(lacquer_clock::now_ms())) != Usability::Unusable
    });
    // A range of an object not stored goes to the origin as that range, coalesced with fetches of the same
    // range alone.
    let forwarded = stale
        .is_none()
        .then(|| {
            let whole_unstored = || shared.coalescer.is_hit_for_miss(key);
            forwarded_range(route, &txn.decided, parts, whole_unstored)
        })
        .flatten();
    let fetch_key = forwarded.map_or(Cow::Borrowed(key), |ask| Cow::Owned(ask.key(key)));
    // Starts the coalescer's fetch for the key (`leader`), or one of this request's own, revalidating the
    // stale object when `revalidate`. The reader exists before the fill task starts, so the fill never sees
    // a fetch without readers that it would cancel.
    let start = |leader: Option<Arc<Fetch<S>>>, revalidate: bool| {
        let registered = leader.is_some();
        let fetch = leader.unwrap_or_else(|| Fetch::new(shared.store.mark(), transit_buffer));
        let reader = fetch.reader();
        let fill = Fill {
            key: key.to_owned(),
            registered,
            parts: parts.clone(),
            asked: txn.asked.clone(),
            client,
            route: route.clone(),
            decided: txn.decided.clone(),
            stale: stale
                .clone()
                .filter(|found| revalidate && found.revalidatable()),
            background: false,
            stand_in,
            part: forwarded,
            if_range: None,
            note: txn.note.clone(),
            trace: txn.trace.clone(),
            interim: txn.interim.clone(),
        };
        tokio::spawn(prefetch::fill(worker.clone(), fetch.clone(), fill));
        (fetch, reader)
    };
    let now = shared.store.mark();
    let joined = (joining != Joining::Never).then(|| {
        let invalidated = |since| shared.store.invalidated_after(since, key);
        shared
            .coalescer
            .join(&fetch_key, now, transit_buffer, looked_up_at, invalidated)
    });
    // A blocking reload that would go to the origin takes a place among its playlist's there, or is
    // refused before it is sent; it keeps the place until the origin answers.
    let blocking = hls::playlist(parts);
    let slot = match (&blocking, &joined) {
        (Some(_), Some(Joined::Waiter(_) | Joined::LookAgain)) | (None, _) => None,
        (Some(playlist), _) => {
            let cache = &route.policy.cache;
            let per_backend = route
                .pick_from(txn.decided.target.as_ref(), key)
                .ok()
                .and_then(|b| {
                    let max = b.config.max_connections;
                    (max > 0).then(|| (b.name().to_owned(), (max / 2).max(1)))
                });
            let limits = hls::Limits {
                per_playlist: cache.blocking_reloads_per_playlist,
                per_client: cache.blocking_reloads_per_client,
                per_backend,
            };
            match shared.blocking.take(playlist.clone(), client, limits) {
                Ok(slot) => Some(slot),
                Err(bound) => {
                    if let Some(Joined::Leader(fetch)) = &joined {
                        fetch.abandon(HeadError {
                            status: StatusCode::SERVICE_UNAVAILABLE,
                            error: FetchError::new("too many blocking reloads of this playlist"),
                        });
                        shared.coalescer.finish(&fetch_key, fetch, None);
                        fetch.settle();
                    }
                    inc(&shared.stats.hls_reloads_refused);
                    tracing::debug!(bound, "too many blocking reloads at the origin: 503");
                    txn.failure = true;
                    return Step::Deliver(busy_briefly());
                }
            }
        }
    };
    let ((fetch, mut reader), mut owner) = match joined {
        None => (start(None, true), true),
        Some(Joined::LookAgain) => return Step::Lookup { again: true },
        Some(Joined::Leader(fetch)) => (start(Some(fetch), true), true),
        Some(Joined::Waiter(fetch)) => {
            let reader = fetch.reader();
            if reader.cancelled() {
                // Its readers all left just before this one came: it is no longer fetching.
                (start(None, true), true)
            } else {
                ((fetch, reader), false)
            }
        }
        Some(Joined::HitForMiss) => {
            inc(&shared.stats.hit_for_miss);
            (start(None, true), true)
        }
    };
    txn.step("Fetch", || {
        let revalidating = stale.as_ref().is_some_and(Found::revalidatable);
        match (owner, revalidating) {
            (true, true) => "started, asking the origin to confirm the stored object".into(),
            (true, false) => "started".into(),
            (false, _) => "joined the fetch in flight for this key".into(),
        }
    });
    if let Some(slot) = slot {
        // The place is the origin request's: kept until the origin answers it or it is given up, however
        // many of the clients waiting on it leave before.
        let fetch = fetch.clone();
        tokio::spawn(async move {
            fetch.answered().await;
            drop(slot);
        });
    }
    // A body that is already complete is as good as stored: the store just has not published it yet.
    let complete = !owner && fetch.is_complete();
    let held = blocking
        .is_some()
        .then(|| hls::Held::new(&shared.stats, owner));
    let mut head = match held {
        Some(_) => {
            let hold = route.policy.cache.blocking_reload_hold;
            match tokio::time::timeout(hold, reader.head()).await {
                Ok(head) => head,
                Err(_) => {
                    inc(&shared.stats.hls_reloads_timed_out);
                    tracing::debug!(
                        "the origin held a blocking reload past cache.blocking_reload_hold: 503"
                    );
                    txn.failure = true;
                    return Step::Deliver(busy_briefly());
                }
            }
        }
        None => reader.head().await,
    };
    drop(held);
    if let (false, Ok(h)) = (owner, &head) {
        let other_variant = !phase::selects(&h.selection, parts);
        // A finished fetch stands in for the store only while its response is fresh: a no-cache or
        // already expired response must be validated again for this request, and with what it stores as
        // the validator: once it is published, the lookup again finds it and asks the origin whether it
        // changed (a fetch from here would ask whole, with nothing to validate).
        let spent = complete && h.ttl.saturating_sub(h.received_at.elapsed()).is_zero();
        if h.shareable && (other_variant || spent) && may_wait {
            reader.settled().await;
            return Step::Lookup { again: true };
        }
        if !h.shareable || other_variant || spent {
            // Uncacheable, another variant again, or spent: fetch alone at once rather than queue. An
            // unshareable answer asks whole: the stale object it confirmed may already be going from the
            // store (no longer storable), and a 304 for it would then find no body to serve.
            reader = start(None, h.shareable).1;
            head = reader.head().await;
            owner = true;
        }
    }
    // A stale object may stand in for an origin that failed or answered with a server error.
    let failure = match &head {
        Err(_) => Some(None),
        Ok(h) if h.status.is_server_error() => Some(Some(h.status.as_u16())),
        Ok(_) => None,
    };
    let now = lacquer_clock::now_ms();
    let fallback = stale.filter(|found| {
        // An object in grace reaches a miss only past a rule's `request_grace` (or unvouched, which
        // `vouched` keeps out): it stands in as an object past grace does.
        let usable = usability(found.meta().lifetime(now));
        matches!(usable, Usability::OnError | Usability::Grace) && vouched
    });
    if let (Some(fwd_status), Some(found)) = (failure, &fallback) {
        let ttl_s = found.meta().remaining_ttl_ms(now) / 1000;
        let outcome = Outcome::Stale {
            ttl_s,
            origin_failed: true,
            fwd_status,
        };
        if let Some(step) = hit::serve_stored(worker, txn, found, now, outcome).await {
            inc(&shared.stats.stale_on_error);
            return step;
        }
    }
    let delivery = match &head {
        // A 206's bytes are the origin's at their place in its representation: decoded, they would
        // not be the ones its `Content-Range` names.
        Ok(h) if h.status == StatusCode::PARTIAL_CONTENT => Delivery::AsStored,
        Ok(h) => txn.delivery(&h.headers),
        Err(_) => Delivery::AsStored,
    };
    if delivery == Delivery::Forward {
        inc(&shared.stats.coding_forwarded);
        return pass::forward_as_sent(worker, txn).await;
    }
    let conversion = txn.conversion(delivery, &shared.stats);
    let debug = txn.decided.wants_debug.then(|| lacquer_rules::Debug {
        hits: None,
        ttl_s: head
            .as_ref()
            .ok()
            .filter(|h| h.shareable)
            .map(|h| h.ttl.saturating_sub(h.received_at.elapsed()).as_secs() as i64),
        outcome: None,
    });
    txn.debug = debug;
    let (made, outcome) = match head {
        Ok(head) if complete && !owner => {
            record_hit(&shared.stats, Tier::Memory);
            let ttl_s = head
                .ttl
                .saturating_sub(head.received_at.elapsed())
                .as_secs() as i64;
            let outcome = Outcome::Hit { ttl_s };
            let made = respond::fetched(&head, reader, outcome, parts, &conversion).await;
            (made, outcome)
        }
        Ok(head) => {
            inc(&shared.stats.misses);
            if !owner {
                inc(&shared.stats.coalesced_waiters);
            }
            let outcome = Outcome::Miss {
                stored: head.shareable,
                collapsed: !owner,
                detail: head.not_stored.map(NotStored::token),
            };
            let made = respond::fetched(&head, reader, outcome, parts, &conversion).await;
            (made, outcome)
        }
        Err(e) => {
            inc(&shared.stats.misses);
            let outcome = Outcome::Miss {
                stored: false,
                collapsed: !owner,
                detail: Some("backend-error"),
            };
            return txn.failed(e.status, outcome);
        }
    };
    if let Made::Answer(resp) = &made {
        let growing = resp.status() == StatusCode::PARTIAL_CONTENT
            && resp
                .headers()
                .get(header::CONTENT_RANGE)
                .is_some_and(|v| v.as_bytes().ends_with(b"/*"));
        if growing {
            inc(&shared.stats.ranges_growing);
        }
    }
    txn.made(made, outcome)
}
