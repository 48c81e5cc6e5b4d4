use crate::{
    journal::{Entry, COMPACT_AT},
    meta::{ObjectMeta, ObjectSet},
    stats::StoreStats,
    store::{Inner, Store},
};
use std::{
    collections::HashSet,
    sync::{atomic::Ordering::Relaxed, Weak},
    time::Duration,
};

/// Bodies younger than this may still sit in foyer's flush queue, where `contains` can miss them.
const SETTLE_MS: u64 = 10_000;

/// Periodically removes metadata of objects past their keep time and of bodies foyer has evicted, so sled
/// stays bounded by what the body cache holds. Runs on a background thread; holds the store weakly so that
/// dropping every handle closes sled.
pub(crate) fn start(store: Weak<Inner>, interval: Duration) -> Result<(), crate::StoreError> {
    crate::background::spawn("sweeper", store, move |store| loop {
        std::thread::sleep(interval);
        let Some(inner) = store.upgrade() else { return };
        if inner.closed.load(Relaxed) {
            return;
        }
        let store = Store { inner };
        match sweep_once(&store) {
            Ok(n) if n > 0 => tracing::debug!(removed = n, "swept metadata"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "metadata sweep failed"),
        }
        if let Err(e) = compact_journal(&store, COMPACT_AT) {
            tracing::warn!(error = %e, "compacting the invalidation journal failed");
        }
    })
}

/// Retires the journal's entries once nothing can need them, when it holds `at` entries or more: purges
/// (applied to sled before they were acknowledged) and bans the lurker has completed. They are replaced by
/// a checkpoint: a floor (the newest retired id) below which stored bodies are invalid unless kept, and the
/// bodies below it still stored now, which passed every retired entry. A record that a crash or damage
/// brings back from below the floor is dropped at the next start. Blocks: runs on the sweeper's thread.
pub(crate) fn compact_journal(store: &Store, at: usize) -> Result<bool, crate::StoreError> {
    let inner = &store.inner;
    if inner.journal.len() < at {
        return Ok(false);
    }
    let retired: HashSet<u64> = {
        // Appends hold this shared until applied: taking it exclusively waits for those in progress, and
        // the entries read meanwhile are all applied.
        let _applied = inner.journal.applying.blocking_write();
        let state = inner.journal.state.lock().expect("journal state");
        state
            .entries
            .iter()
            .filter(|e| match e {
                Entry::Ban { id, .. } => !inner.bans.is_pending(*id),
                _ => true,
            })
            .map(Entry::id)
            .collect()
    };
    let Some(&floor) = retired.iter().max() else {
        return Ok(false);
    };
    let mut kept = Vec::new();
    for item in store.objects_tree().iter() {
        let (key, value) = item?;
        if let Ok(set) = ObjectSet::decode(&String::from_utf8_lossy(&key), &value) {
            kept.extend(
                set.variants
                    .iter()
                    .map(|m| m.generation)
                    .filter(|g| *g < floor),
            );
        }
    }
    inner.journal.compact(floor, &retired, kept)?;
    tracing::info!(
        retired = retired.len(),
        left = inner.journal.len(),
        "invalidation journal compacted"
    );
    Ok(true)
}

fn gone(store: &Store, meta: &ObjectMeta, now: u64) -> bool {
    now >= meta.expires_at_ms()
        || (now.saturating_sub(meta.stored_at_ms) > SETTLE_MS && !store.has_body(meta))
}

pub(crate) fn sweep_once(store: &Store) -> Result<usize, crate::StoreError> {
    let now = lacquer_clock::now_ms();
    let mut removed = 0;
    let (mut objects, mut bytes) = (0u64, 0u64);
    for item in store.objects_tree().iter() {
        let (key, value) = item?;
        let primary = String::from_utf8_lossy(&key).into_owned();
        let Ok(set) = ObjectSet::decode(&primary, &value) else {
            store.objects_tree().remove(&key)?;
            continue;
        };
        if set.variants.iter().any(|m| gone(store, m, now)) {
            removed += store.retain(&primary, |m| !gone(store, m, now))?;
        }
        for m in set.variants.iter().filter(|m| !gone(store, m, now)) {
            objects += 1;
            bytes += m.length;
        }
    }
    sweep_tags(store)?;
    StoreStats::add(&store.inner.stats.objects_swept, removed as u64);
    store.inner.stats.objects.store(objects, Relaxed);
    store.inner.stats.stored_bytes.store(bytes, Relaxed);
    Ok(removed)
}

/// Removes tag entries whose object is gone: left behind by a crash between removing an object and its
/// entries, or by a record dropped as unreadable.
fn sweep_tags(store: &Store) -> Result<(), crate::StoreError> {
    let tree = &store.inner.tags;
    for item in tree.iter() {
        let (key, _) = item?;
        let alive = match crate::tags::parse(&key) {
            Some((_, tagged)) => store.stored_generation(&tagged.primary, tagged.generation)?,
            None => false,
        };
        if !alive {
            tree.remove(&key)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PurgeMode, StoreBuilder};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_journal_is_compacted_and_still_covers_what_it_retired() {
        let dir = tempfile::tempdir().unwrap();
        let store = StoreBuilder::new(dir.path())
            .with_memory_bytes(8 << 20)
            .with_disk_bytes(64 << 20)
            .with_chunk_size(64 << 10)
            .open(tokio::runtime::Handle::current())
            .await
            .unwrap();
        let keep = |store: &Store| store.inner.journal.len();
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
        let state = store.inner.journal.state.lock().unwrap();
        let old = store.lookup("a.test/old").unwrap().unwrap().variants[0].generation;
        let new = store.lookup("a.test/new").unwrap().unwrap().variants[0].generation;
        assert!(
            old < state.floor && state.kept.contains(&old),
            "the live old body is kept"
        );
        assert!(
            new > state.floor,
            "a body newer than the floor needs nothing"
        );
        assert_eq!(state.kept.len(), 1);
    }
}
