//! The sweeper: keeps sled bounded by what the body cache holds, and the invalidation journal bounded by
//! what can still matter.

use std::time::Duration;

use crate::{
    journal::COMPACT_AT,
    meta::{ObjectMeta, ObjectSet},
    store::{Store, WeakStore},
};

/// Bodies younger than this may still sit in foyer's flush queue, where `contains` can miss them.
const SETTLE_MS: u64 = 10_000;

/// Periodically removes metadata of objects past their keep time and of bodies foyer has evicted, so sled
/// stays bounded by what the body cache holds. Runs on a background thread; holds the store weakly so that
/// dropping every handle closes sled.
pub(crate) fn start(store: WeakStore, interval: Duration) -> Result<(), crate::StoreError> {
    crate::background::spawn(
        "sweeper",
        crate::background::Priority::Idle,
        store,
        move |store| loop {
            std::thread::sleep(interval);
            let Some(store) = store.open() else { return };
            match sweep_once(&store) {
                Ok(n) if n > 0 => tracing::debug!(removed = n, "swept metadata"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "metadata sweep failed"),
            }
            if let Err(e) = compact_journal(&store, COMPACT_AT) {
                tracing::warn!(error = %e, "compacting the invalidation journal failed");
            }
        },
    )
}

/// Retires the journal's entries once nothing can need them, when it holds `at` entries or more: purges
/// (applied to sled before they were acknowledged) and bans the lurker has completed. They are replaced by
/// a checkpoint: a floor (the newest retired id) below which stored bodies are invalid unless kept, and the
/// bodies below it still stored now, which passed every retired entry. A record that a crash or damage
/// brings back from below the floor is dropped at the next start. Blocks: runs on the sweeper's thread.
pub(crate) fn compact_journal(store: &Store, at: usize) -> Result<bool, crate::StoreError> {
    let journal = store.journal();
    // Records the start-up replay has not checked yet would be listed as kept.
    if journal.len() < at || store.replay_pending() {
        return Ok(false);
    }
    let retired = journal.retirable(|id| store.ban_list().is_pending(id));
    let Some(&floor) = retired.iter().max() else {
        return Ok(false);
    };
    let mut kept = Vec::new();
    for record in store.records() {
        if let Some(set) = record?.set {
            kept.extend(
                set.variants
                    .iter()
                    .map(|m| m.generation)
                    .filter(|g| *g < floor),
            );
        }
    }
    journal.compact(floor, &retired, kept)?;
    tracing::info!(
        retired = retired.len(),
        left = journal.len(),
        "invalidation journal compacted"
    );
    Ok(true)
}

/// Whether a variant is past keeping, or lost its body: a body stored in parts is lost when every part is.
fn gone(store: &Store, set: &ObjectSet, meta: &ObjectMeta, now: u64) -> bool {
    let lost = || match set.partial(meta.generation) {
        Some(partial) => partial.parts.iter().all(|p| !store.has_body(&p.body)),
        None => !store.has_body(meta),
    };
    now >= meta.expires_at_ms() || (now.saturating_sub(meta.stored_at_ms) > SETTLE_MS && lost())
}

pub(crate) fn sweep_once(store: &Store) -> Result<usize, crate::StoreError> {
    let now = lacquer_clock::now_ms();
    let mut removed = 0;
    let (mut objects, mut bytes) = (0u64, 0u64);
    for record in store.records() {
        let record = record?;
        let primary = record.primary();
        let Some(set) = &record.set else {
            store.drop_unreadable(&record.key)?;
            continue;
        };
        if set.variants.iter().any(|m| gone(store, set, m, now)) {
            removed += store.retain(&primary, |m| !gone(store, set, m, now))?;
        }
        for m in set.variants.iter().filter(|m| !gone(store, set, m, now)) {
            objects += 1;
            bytes += m.length;
            // Parts the store evicted are forgotten, so the record tells what is held. Every part
            // refreshes its variant's `stored_at`: a variant settled has only settled parts.
            let settled = now.saturating_sub(m.stored_at_ms) > SETTLE_MS;
            for part in set.partial(m.generation).into_iter().flat_map(|p| &p.parts) {
                if !settled || store.has_body(&part.body) {
                    bytes += part.body.length;
                } else {
                    store.remove_part(&primary, m.generation, part.body.generation)?;
                }
            }
        }
    }
    store.prune_tag_index()?;
    store.counters().objects_swept.add(removed as u64);
    // While the start-up replay walks, it counts what it passes: a recount now would be counted again.
    if !store.replay_pending() {
        store.recount(objects, bytes);
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PurgeMode, StoreBuilder};

    /// Parts the body cache lost leave the record at the next sweep; a body whose every part is lost
    /// leaves with them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lost_parts_are_swept_and_a_body_without_any_goes() {
        let dir = tempfile::tempdir().unwrap();
        let store = StoreBuilder::small(dir.path())
            .open(tokio::runtime::Handle::current())
            .await
            .unwrap();
        let key = "a.test/big";
        let head = ObjectMeta {
            status: 200,
            headers: vec![("etag".into(), b"\"v\"".to_vec())],
            stored_at_ms: 0,
            ttl_ms: u64::MAX / 4,
            ..ObjectMeta::default()
        };
        for start in [0u64, 4, 8] {
            let mut w = store.writer(key, &[], store.mark()).unwrap();
            w.push(b"abcd").await.unwrap();
            w.finish_part(key.to_owned(), head.clone(), start, 12)
                .await
                .unwrap();
        }
        let parts = |store: &Store| {
            store
                .lookup(key)
                .unwrap()
                .map(|set| set.partials[0].parts.clone())
        };
        let held = parts(&store).unwrap();
        assert_eq!(held.len(), 3, "{held:?} {:?}", store.lookup(key).unwrap());
        // foyer forgets a removed entry's disk copy in the background: the part is lost once `contains`
        // says so.
        let lose = |part: &crate::Part| {
            let (store, body) = (store.clone(), part.body.clone());
            async move {
                store.discard_chunks(body.object, body.generation, 1);
                for _ in 0..500 {
                    if !store.has_body(&body) {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                panic!("a discarded chunk stayed");
            }
        };
        lose(&held[1]).await;
        let swept = store.clone();
        tokio::task::spawn_blocking(move || sweep_once(&swept))
            .await
            .unwrap()
            .unwrap();
        let left = parts(&store).unwrap();
        assert_eq!(
            left.iter().map(|p| p.start).collect::<Vec<_>>(),
            vec![0, 8],
            "the lost part is forgotten, the others kept"
        );
        lose(&left[0]).await;
        lose(&left[1]).await;
        let swept = store.clone();
        tokio::task::spawn_blocking(move || sweep_once(&swept))
            .await
            .unwrap()
            .unwrap();
        assert!(
            store.lookup(key).unwrap().is_none(),
            "nothing left to serve"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_journal_is_compacted_and_still_covers_what_it_retired() {
        let dir = tempfile::tempdir().unwrap();
        let store = StoreBuilder::small(dir.path())
            .open(tokio::runtime::Handle::current())
            .await
            .unwrap();
        let keep = |store: &Store| store.journal().len();
        let put = |key: &'static str| {
            let store = store.clone();
            async move {
                let mut w = store.writer(key, &[], store.mark()).unwrap();
                w.push(b"body").await.unwrap();
                let meta = ObjectMeta {
                    status: 200,
                    stored_at_ms: u64::MAX,
                    ttl_ms: 3_600_000,
                    ..ObjectMeta::default()
                };
                w.finish(key.to_owned(), meta).await.unwrap();
            }
        };
        put("a.test/old").await;
        for n in 0..20 {
            store
                .purge(&format!("a.test/p{n}"), PurgeMode::Hard)
                .await
                .unwrap();
        }
        put("a.test/new").await;
        assert_eq!(keep(&store), 20);
        let compacting = store.clone();
        let done = tokio::task::spawn_blocking(move || compact_journal(&compacting, 10))
            .await
            .unwrap()
            .unwrap();
        assert!(done);
        assert_eq!(keep(&store), 0, "every purge retired");
        let old = store.lookup("a.test/old").unwrap().unwrap().variants[0].generation;
        let new = store.lookup("a.test/new").unwrap().unwrap().variants[0].generation;
        let (floor, kept) = store
            .journal()
            .view(|state| (state.floor, state.kept.clone()));
        assert!(
            old < floor && kept.contains(&old),
            "the live old body is kept"
        );
        assert!(new > floor, "a body newer than the floor needs nothing");
        assert_eq!(kept.len(), 1);
    }
}
