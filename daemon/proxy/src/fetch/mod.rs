//! The fill task: one backend fetch that streams into a shared [`Fetch`] for its readers and, when the
//! response is storable, into the store. It runs in typed stages, each taking what the one before made:
//!
//! ```text
//! send ─┬─ revalidate (a 304 to what is stored) ───────────────┐
//!       └─ decide (store? which variant, which part) ─ pump ─ publish ─┴─ settle
//! ```

mod decide;
mod publish;
mod pump;
mod request;
mod revalidate;
mod send;

use std::{panic::AssertUnwindSafe, sync::Arc};

use futures_util::FutureExt;
use http::StatusCode;

pub use self::decide::placed_part;
pub(crate) use self::request::forwarded_range;
use self::request::Ending;
pub use self::request::{Ask, Fill};
use crate::{
    coalesce::{Fetch, FetchError, HeadError},
    stats::{dec, inc},
    store::CacheStore,
    worker::Worker,
};

/// Runs one fill to its end, and settles its fetch; the media playlist it brought, when its route prefetches
/// from playlists (see [`crate::prefetch::fill`]).
pub async fn run<S: CacheStore>(
    worker: Arc<Worker<S>>,
    fetch: Arc<Fetch<S>>,
    request: Fill,
) -> Option<Vec<u8>> {
    let stats = &worker.shared.stats;
    inc(&stats.fetches_in_flight);
    inc(&stats.backend_requests);
    // A bug must not leave this fetch's readers waiting forever (found when a TLS connector panicked).
    let (ending, listed) = match AssertUnwindSafe(fill(&worker, &fetch, &request))
        .catch_unwind()
        .await
    {
        Ok(filled) => filled,
        Err(_) => {
            tracing::error!(key = %request.key, "the fetch panicked; its readers get 502");
            fetch.abandon(HeadError {
                status: StatusCode::BAD_GATEWAY,
                error: FetchError::new("internal error while fetching"),
            });
            (Ending::Failed, None)
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
    listed
}

/// The stages: how the fill ended, and the playlist it read.
async fn fill<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    fetch: &Arc<Fetch<S>>,
    request: &Fill,
) -> (Ending, Option<Vec<u8>>) {
    let live = worker.shared.live();
    let rules = &live.rules;
    let mut sent = match send::send(worker, fetch, request, rules).await {
        Ok(sent) => sent,
        Err(ending) => return (ending, None),
    };
    if let (StatusCode::NOT_MODIFIED, Some(stale)) = (sent.head.status, &request.stale) {
        let update = std::mem::take(&mut sent.head.headers);
        let revalidated =
            revalidate::revalidated(worker, fetch, request, stale, update, &sent).await;
        return (revalidated, None);
    }
    let mut verdict = match decide::decide(worker, fetch, request, rules, &mut sent) {
        Ok(verdict) => verdict,
        Err(ending) => return (ending, None),
    };
    let pumped = match pump::pump(worker, fetch, request, &mut sent, &mut verdict).await {
        Ok(pumped) => pumped,
        Err(ending) => return (ending, None),
    };
    let listed = verdict.playlist.take();
    (
        publish::publish(worker, request, sent, verdict, pumped).await,
        listed,
    )
}
