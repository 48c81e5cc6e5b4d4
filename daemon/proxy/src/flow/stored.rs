//! Reading what the store holds for a request: the variant it selects, whether this node may vouch for
//! it, how usable it is, and the hit counted.

use http::request::Parts;
use lacquer_policy::stale::Usability;
use lacquer_storage::{ObjectMeta, Tier};

use crate::store::Found;
use crate::{
    phase::{self, Decided},
    stats::{inc, Stats},
    store::CacheStore,
    worker::{Shared, Worker},
};

/// Whether this node may serve what it stores without asking the origin: always on a single node; in a
/// cluster, while it can vouch for having applied every invalidation.
pub(crate) fn vouched<S: CacheStore>(shared: &Shared<S>) -> bool {
    shared.cluster.as_ref().is_none_or(|c| c.vouched())
}

/// The stored variant this request selects, whole or in parts, fresh or not (the sweeper removes what is
/// past keeping).
pub(crate) async fn find_variant<S: CacheStore>(
    worker: &Worker<S>,
    key: &str,
    parts: &Parts,
) -> Option<Found> {
    let set = worker.shared.store.lookup(key).await.unwrap_or_else(|e| {
        tracing::warn!(key, error = %e, "lookup failed; treating as a miss");
        None
    })?;
    let index = set
        .variants
        .iter()
        .position(|m| phase::selects(&m.variant, parts))?;
    Some(Found { set, index })
}

/// `usability`, with the request rules' `request_grace` applied: an object in grace staler than that
/// waits for the origin, and still stands in if the origin fails.
pub(crate) fn within_request_grace(
    usable: Usability,
    meta: &ObjectMeta,
    now: u64,
    decided: &Decided,
) -> Usability {
    match (usable, decided.request_grace) {
        (Usability::Grace, Some(limit))
            if meta.remaining_ttl_ms(now).unsigned_abs() > limit.as_millis() as u64 =>
        {
            Usability::OnError
        }
        (usable, _) => usable,
    }
}

/// Counts a hit, by the tier its body came from.
pub(crate) fn record_hit(stats: &Stats, tier: Tier) {
    inc(&stats.hits);
    inc(match tier {
        Tier::Memory => &stats.hits_memory,
        Tier::Disk => &stats.hits_disk,
    });
}
