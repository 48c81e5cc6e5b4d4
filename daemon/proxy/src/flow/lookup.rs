//! The lookup step: the store read for the request's variant, and what was found decides the next step.

use std::sync::Arc;

use http::Method;
use lacquer_policy::stale::{usability, Usability};
use lacquer_telemetry::Trace;

use super::{
    step::{Hit, Joining, Miss, Stale, Step, Txn},
    stored::{find_variant, vouched, within_request_grace},
};
use crate::{
    respond::Outcome,
    slice::{self, Sliced},
    stats::inc,
    store::CacheStore,
    worker::Worker,
};

/// Looks the request's variant up: a fresh one (or one in grace) is a hit, anything else a miss, which may
/// revalidate or fall back on what was found. `again` after a fetch in flight settled or finished: the
/// miss then no longer waits for anyone.
pub(super) async fn lookup<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    txn: &mut Txn,
    again: bool,
) -> Step {
    let shared = &worker.shared;
    let readable = matches!(txn.head().method, Method::GET | Method::HEAD);
    if !again {
        let sliced = txn
            .route
            .slice
            .filter(|_| readable && txn.decided.body.is_none());
        if let Some(size) = sliced {
            match slice::serve(worker, txn, size).await {
                Some(Sliced::Sent(made, outcome)) => return txn.made(made, outcome),
                Some(Sliced::AsSent) => return super::pass::forward_as_sent(worker, txn).await,
                None => {}
            }
        }
    }
    // Noted before the store is read: see `Coalescer::finished`.
    let finished = shared.coalescer.finished();
    // Whether this node vouches is read before the store: a node that catches up while the lookup runs
    // may have applied an invalidation the lookup did not see, and must not vouch for its result.
    let vouched = vouched(shared);
    let now = lacquer_clock::now_ms();
    let looking = txn.trace.as_ref().map(Trace::lookup);
    let found = find_variant(worker, &txn.key, txn.head()).await;
    if let Some(span) = looking {
        span.set("lacquer.found", found.is_some());
    }
    let found = match found {
        // An object stored in parts (ranges forwarded to the origin) answers while it is fresh; the
        // ordinary way fetches the whole, or forwards the range, otherwise.
        Some(found) if found.set.partial(found.meta().generation).is_some() => {
            let usable = usability(found.meta().lifetime(now));
            let fresh = within_request_grace(usable, found.meta(), now, &txn.decided);
            if let (Usability::Fresh, true, true, false) =
                (fresh, vouched, readable, txn.parts_tried)
            {
                txn.parts_tried = true;
                match slice::serve_parts(worker, txn, &found, finished).await {
                    Some(Sliced::Sent(made, outcome)) => return txn.made(made, outcome),
                    Some(Sliced::AsSent) => return super::pass::forward_as_sent(worker, txn).await,
                    None => {}
                }
            }
            None
        }
        found => found,
    };
    let mut miss = Miss {
        joining: if again {
            Joining::NoWait
        } else {
            Joining::MayWait
        },
        stale: Stale {
            found: None,
            vouched,
        },
        looked_up_at: (!again).then_some(finished),
    };
    let Some(found) = found else {
        txn.step("Lookup", || "nothing stored for this variant".into());
        return Step::Miss(miss);
    };
    let ttl_s = found.meta().remaining_ttl_ms(now) / 1000;
    let usable = within_request_grace(
        usability(found.meta().lifetime(now)),
        found.meta(),
        now,
        &txn.decided,
    );
    txn.step("Lookup", || {
        let (variant, of) = (found.index + 1, found.set.variants.len());
        let state = match usable {
            Usability::Fresh => format!("fresh, {ttl_s} s left"),
            Usability::Grace => "stale, within grace: served while it is refetched".into(),
            Usability::OnError => "stale, kept for origin errors only".into(),
            Usability::Unusable => "stale, past grace".into(),
        };
        let unvouched = if vouched {
            ""
        } else {
            "; this node may have missed an invalidation: the origin confirms it"
        };
        format!("variant {variant} of {of}, {state}{unvouched}")
    });
    let outcome = match usable {
        // An invalidation this node has not seen may cover what it stores: the origin confirms the object
        // (a 304 to its validators) or sends it again.
        Usability::Fresh | Usability::Grace if !vouched => {
            inc(&shared.stats.cluster_revalidations);
            miss.stale.found = Some(found);
            return Step::Miss(miss);
        }
        Usability::Fresh => Outcome::Hit { ttl_s },
        Usability::Grace => Outcome::Stale {
            ttl_s,
            origin_failed: false,
            fwd_status: None,
        },
        Usability::OnError | Usability::Unusable => {
            miss.stale.found = Some(found);
            return Step::Miss(miss);
        }
    };
    Step::Hit(Hit {
        found,
        now,
        outcome,
        otherwise: miss,
    })
}
