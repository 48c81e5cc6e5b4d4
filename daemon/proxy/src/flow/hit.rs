//! The hit step: a stored variant, fresh or within grace, served from the store (its sibling in the
//! client's coding when one is stored); one served in grace is refreshed in the background.

use std::sync::Arc;

use http::header;
use lacquer_policy::encoding::{Coded, Coding, Delivery};
use lacquer_storage::{ChunkRead, ObjectMeta, Tier};

use super::{
    pass,
    step::{Hit, Step, Txn},
    stored::record_hit,
};
use crate::{
    coalesce::Joined,
    coding::{says_no_transform, Conversion, DictionaryAsked},
    dictionary::Dictionary,
    esi::fill::TEMPLATE,
    fetch::Fill,
    prefetch,
    prepared::{self, Prepared},
    respond::{self, Outcome},
    siblings::{self, Made},
    stats::{add, inc},
    store::{CacheStore, Found},
    worker::Worker,
};

/// Serves the hit; a miss when its body is no longer all there.
pub(super) async fn hit<S: CacheStore>(worker: &Arc<Worker<S>>, txn: &mut Txn, hit: Hit) -> Step {
    let Hit {
        found,
        now,
        outcome,
        otherwise,
    } = hit;
    let Some(step) = serve_stored(worker, txn, &found, now, outcome).await else {
        return Step::Miss(otherwise);
    };
    if let Outcome::Stale { .. } = outcome {
        inc(&worker.shared.stats.stale_served);
        refresh(worker, txn, found);
    }
    step
}

/// Answers from a stored object whose body is all there (every chunk present, the first ones read: see
/// `Store::open_body`); `None` (and the metadata dropped) when it is not.
pub(super) async fn serve_stored<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    txn: &mut Txn,
    found: &Found,
    now: u64,
    outcome: Outcome,
) -> Option<Step> {
    let shared = &worker.shared;
    let meta = found.meta();
    let prepared = prepared::prepared(meta);
    if prepared.dictionary {
        // Read as a dictionary once (after a restart, or once let go, again when next served).
        if let Some(negotiation) = &txn.route.policy.compression {
            shared.dictionaries.offer(
                &shared.store,
                &shared.stats,
                &negotiation.settings,
                &txn.key,
                meta,
            );
        }
    }
    if let Some(asked) = txn.negotiated.as_ref().and_then(|n| n.dictionary()) {
        if let Some(step) = dictionary(worker, txn, found, &prepared, now, outcome, asked).await {
            return Some(step);
        }
    }
    let delivery = txn.delivery_of(prepared.coded, &prepared.head);
    if delivery == Delivery::Forward {
        inc(&shared.stats.coding_forwarded);
        return Some(pass::forward_as_sent(worker, txn).await);
    }
    if let Delivery::Decode(coding) = delivery {
        if let Some((sibling, conversion, first)) = sibling(worker, txn, found, coding).await {
            record_hit(&shared.stats, first.tier);
            txn.step("Body", || {
                format!("stored, {:?} tier, its {coding:?} sibling", first.tier)
            });
            let Conversion::Sibling { coding, .. } = conversion else {
                unreachable!("a sibling is sent as one");
            };
            let make = |m: &ObjectMeta| Prepared::sibling(&prepared, coding, m.length);
            let sent = Sibling {
                index: sibling,
                first: first.data,
                conversion: &conversion,
            };
            let made = send_sibling(worker, txn, found, sent, (now, outcome), make);
            with_debug(txn, &prepared, meta, now);
            return Some(txn.made(made, outcome));
        }
    }
    let first = if meta.length == 0 {
        None
    } else {
        match shared.store.open_body(meta).await {
            Ok(Some(chunk)) => Some(chunk),
            Ok(None) => {
                inc(&shared.stats.bodies_lost);
                if let Err(e) = shared.store.remove_generation(&txn.key, meta.generation) {
                    tracing::warn!(key = txn.key, error = %e, "cannot drop metadata of a lost body");
                }
                return None;
            }
            Err(e) => {
                tracing::warn!(key = txn.key, error = %e, "reading a stored body failed; refetching");
                return None;
            }
        }
    };
    let tier = first.as_ref().map_or(Tier::Memory, |c| c.tier);
    record_hit(&shared.stats, tier);
    txn.step("Body", || format!("stored, {tier:?} tier"));
    let data = first.map(|c| c.data);
    let (made, ahead) = respond::stored(
        &shared.store,
        &found.set,
        found.index,
        None,
        data,
        now,
        outcome,
        txn.head(),
        &prepared,
        &txn.conversion(delivery, &shared.stats),
        &shared.live.load().rules,
    );
    txn.ahead = ahead;
    with_debug(txn, &prepared, meta, now);
    Some(txn.made(made, outcome))
}

/// Serves the client the stored body compressed against the dictionary it holds, when that
/// representation is made; `None` otherwise (it is then made for the clients after this one, when the
/// dictionary is held, and this one is served as any other).
async fn dictionary<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    txn: &mut Txn,
    found: &Found,
    prepared: &Prepared,
    now: u64,
    outcome: Outcome,
    asked: DictionaryAsked,
) -> Option<Step> {
    let shared = &worker.shared;
    let negotiation = txn.route.policy.compression.as_ref()?;
    let meta = found.meta();
    // A range is of the bytes sent: the ordinary representation's, which the client can check against
    // what it holds. A template is assembled, never sent as stored. A response that says `no-transform`
    // is sent in its own coding.
    if !negotiation.settings.dictionaries
        || meta.status != 200
        || meta.length == 0
        || prepared.coded == Coded::Other
        || txn.head().headers.contains_key(header::RANGE)
        || meta.header(TEMPLATE.as_str()).is_some()
        || says_no_transform(&prepared.head)
    {
        return None;
    }
    let made = Made::Dictionary(asked.coding, asked.hash);
    let kept = made.kept_as();
    if let Some(index) = found.set.sibling(meta.generation, kept.as_deref()) {
        let body = &found.set.siblings[index].body;
        match shared.store.open_body(body).await {
            Ok(Some(first)) => {
                record_hit(&shared.stats, first.tier);
                inc(&shared.stats.dictionary_responses);
                add(
                    &shared.stats.dictionary_bytes_saved,
                    meta.length.saturating_sub(body.length),
                );
                txn.step("Body", || {
                    format!(
                        "stored, {:?} tier, compressed against the client's dictionary ({})",
                        first.tier,
                        asked.coding.token()
                    )
                });
                let make =
                    |m: &ObjectMeta| Prepared::dictionary_sibling(prepared, asked.coding, m.length);
                let sent = Sibling {
                    index,
                    first: first.data,
                    conversion: &Conversion::None,
                };
                let made = send_sibling(worker, txn, found, sent, (now, outcome), make);
                with_debug(txn, prepared, meta, now);
                return Some(txn.made(made, outcome));
            }
            // Made again below: the new one replaces it.
            Ok(None) => inc(&shared.stats.representations_evicted),
            Err(e) => tracing::warn!(key = txn.key, error = %e, "reading a representation failed"),
        }
    }
    if negotiation.settings.conversions == 0 || made_against_dictionaries(found) >= PER_BODY {
        return None;
    }
    let dictionary = shared
        .dictionaries
        .get(&shared.store, &shared.stats, &asked.hash, &txn.key)
        .await?;
    let stored = match prepared.coded {
        Coded::With(coding) => Some(coding),
        _ => None,
    };
    start_making(worker, txn, found, stored, made, Some(dictionary));
    None
}

/// A stored representation of a variant's body to send: its index among the set's siblings, its chunk
/// 0, and how it is sent.
struct Sibling<'a> {
    index: usize,
    first: bytes::Bytes,
    conversion: &'a Conversion,
}

/// The response sending `sibling` of `found`'s body, under the head `make` prepares from its metadata
/// (made once per copy of it, as a variant's is).
fn send_sibling<S: CacheStore>(
    worker: &Worker<S>,
    txn: &mut Txn,
    found: &Found,
    sibling: Sibling<'_>,
    (now, outcome): (u64, Outcome),
    make: impl Fn(&ObjectMeta) -> Prepared,
) -> respond::Made {
    let shared = &worker.shared;
    let body = &found.set.siblings[sibling.index].body;
    let owned;
    let head = match body.prepared(&make) {
        Some(head) => head,
        None => {
            owned = make(body);
            &owned
        }
    };
    let (made, ahead) = respond::stored(
        &shared.store,
        &found.set,
        found.index,
        Some(sibling.index),
        Some(sibling.first),
        now,
        outcome,
        txn.head(),
        head,
        sibling.conversion,
        &shared.live.load().rules,
    );
    txn.ahead = ahead;
    made
}

/// Representations against dictionaries kept for one body at most: one per version of a file that
/// clients still hold is a handful; more would let clients with many dictionaries fill the store.
const PER_BODY: usize = 4;

/// How many representations of `found`'s body against dictionaries are kept.
fn made_against_dictionaries(found: &Found) -> usize {
    let generation = found.meta().generation;
    found
        .set
        .siblings
        .iter()
        .filter(|s| {
            s.of == generation
                && s.coding
                    .as_deref()
                    .is_some_and(|c| c.starts_with("dcb:") || c.starts_with("dcz:"))
        })
        .count()
}

/// Counts the hit while a rule shows hit counts (`debug_headers`), and keeps the count and the freshness
/// left for the deliver phase when that rule may show them to this request.
fn with_debug(txn: &mut Txn, prepared: &Prepared, meta: &ObjectMeta, now: u64) {
    if txn.decided.counts_hits {
        let hits = prepared.hits.count();
        if txn.decided.wants_debug {
            txn.debug = Some(lacquer_rules::Debug {
                hits: Some(hits),
                ttl_s: Some(meta.remaining_ttl_ms(now) / 1000),
                outcome: None,
            });
        }
    }
}

/// The sibling of `found` this client should be sent instead of converting its body (stored in `coding`)
/// on the way out, its index in the set, how it is sent and its chunk 0; `None` when there is none to send.
/// A sibling is then made, for the clients after this one, unless `[compression] conversions` is 0.
async fn sibling<S: CacheStore>(
    worker: &Worker<S>,
    txn: &Txn,
    found: &Found,
    coding: Coding,
) -> Option<(usize, Conversion, ChunkRead)> {
    let shared = &worker.shared;
    let negotiated = txn.negotiated.as_ref()?;
    let negotiation = txn.route.policy.compression.as_ref()?;
    let meta = found.meta();
    if negotiation.settings.conversions == 0 || meta.length == 0 {
        return None;
    }
    let wanted = siblings::coding_for(coding, negotiated.takes_gzip());
    if let Some(index) = found
        .set
        .sibling(meta.generation, wanted.map(Coding::token))
    {
        match shared
            .store
            .open_body(&found.set.siblings[index].body)
            .await
        {
            Ok(Some(first)) => {
                let conversion = Conversion::Sibling {
                    coding: wanted,
                    stats: shared.stats.clone(),
                };
                return Some((index, conversion, first));
            }
            // Made again below: the new one replaces it.
            Ok(None) => inc(&shared.stats.representations_evicted),
            Err(e) => tracing::warn!(key = txn.key, error = %e, "reading a representation failed"),
        }
    }
    start_making(worker, txn, found, Some(coding), Made::Coding(wanted), None);
    None
}

/// Starts making `made` from `found`'s body (stored in `stored`, `None`: identity) in the background, for
/// the clients after this one (see [`siblings::start`]); `dictionary` is the one a dictionary coding is
/// made against.
fn start_making<S: CacheStore>(
    worker: &Worker<S>,
    txn: &Txn,
    found: &Found,
    stored: Option<Coding>,
    made: Made,
    dictionary: Option<Arc<Dictionary>>,
) {
    let shared = &worker.shared;
    let Some(negotiation) = &txn.route.policy.compression else {
        return;
    };
    siblings::start(
        &shared.store,
        &shared.making,
        &shared.stats,
        &negotiation.settings,
        txn.route.policy.cache.max_object_size.as_u64(),
        siblings::Wanted {
            key: &txn.key,
            found,
            stored,
            made,
        },
        dictionary,
    );
}

/// Starts one background fetch (a revalidation when the object has validators) for a key served in grace,
/// unless a fetch for it is already running.
fn refresh<S: CacheStore>(worker: &Arc<Worker<S>>, txn: &Txn, found: Found) {
    let key = &txn.key;
    let now = worker.shared.store.mark();
    let transit_buffer = txn.route.policy.cache.transit_buffer.as_u64();
    let invalidated = |since| worker.shared.store.invalidated_after(since, key);
    if let Joined::Leader(fetch) =
        worker
            .shared
            .coalescer
            .join(key, now, transit_buffer, None, invalidated)
    {
        let fill = Fill {
            key: key.clone(),
            registered: true,
            parts: txn.head().clone(),
            asked: txn.asked.clone(),
            client: txn.client,
            route: txn.route.clone(),
            decided: txn.decided.clone(),
            stale: found.revalidatable().then_some(found),
            background: true,
            stand_in: true,
            part: None,
            if_range: None,
            note: txn.note.clone(),
            trace: txn.trace.clone(),
            interim: None,
        };
        tokio::spawn(prefetch::fill(worker.clone(), fetch, fill));
    }
}
