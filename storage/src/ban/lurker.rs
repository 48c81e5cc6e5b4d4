//! The ban lurker: walks the stored objects in the background, removing the banned ones and marking the
//! rest checked, so bans stop costing lookups and can be retired.

use std::{
    sync::{atomic::Ordering::Relaxed, Weak},
    time::{Duration, Instant},
};

use crate::{
    meta::ObjectSet,
    stats::StoreStats,
    store::{Inner, Store},
};

/// Like Varnish's `ban_lurker_batch` and `ban_lurker_sleep`: the walk pauses after this many keys so that
/// it never holds a core away from client traffic for long.
const BATCH: usize = 1000;
const PAUSE: Duration = Duration::from_millis(5);
/// Bans arriving together are walked together.
const GATHER: Duration = Duration::from_millis(50);
/// A walk that failed (sled error) is retried after this.
const RETRY: Duration = Duration::from_secs(10);

/// Holds the store weakly so that dropping every handle closes sled.
pub(crate) async fn run(store: Weak<Inner>) {
    let Some(wake) = store.upgrade().map(|inner| inner.bans.lurker.clone()) else {
        return;
    };
    loop {
        let Some(pending) = store.upgrade().map(|inner| inner.bans.pending()) else {
            return;
        };
        // A ban added meanwhile left a permit, so this wait cannot miss it.
        if pending == 0 {
            tokio::select! {
                () = wake.notified() => {}
                () = tokio::time::sleep(RETRY) => continue,
            }
        }
        tokio::time::sleep(GATHER).await;
        let Some(inner) = store.upgrade() else { return };
        if inner.closed.load(Relaxed) {
            return;
        }
        if inner.bans.pending() == 0 {
            continue;
        }
        let store_handle = Store { inner };
        let walked = tokio::task::spawn_blocking(move || walk(&store_handle)).await;
        match walked {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "ban lurker walk failed; retrying");
                tokio::time::sleep(RETRY).await;
            }
            Err(e) => tracing::error!(error = %e, "ban lurker panicked"),
        }
    }
}

/// Tests every stored object against the bans that exist now; then, once that is durable, marks those bans
/// completed. Objects published during the walk were tested when published.
fn walk(store: &Store) -> Result<(), crate::StoreError> {
    let inner = &store.inner;
    let upto = inner.bans.newest();
    let started = Instant::now();
    let (mut keys, mut removed) = (0usize, 0usize);
    for item in store.objects_tree().iter() {
        if inner.closed.load(Relaxed) {
            return Ok(());
        }
        let (key, value) = item?;
        let primary = String::from_utf8_lossy(&key);
        let needs_test = ObjectSet::decode(&primary, &value).map_or(true, |set| {
            set.variants.iter().any(|m| m.ban_checked < upto)
        });
        if needs_test {
            removed += store.apply_bans(&primary, upto)?;
        }
        keys += 1;
        if keys % BATCH == 0 {
            std::thread::sleep(PAUSE);
        }
    }
    store.flush_metadata_blocking()?;
    let completed = inner.bans.complete(upto)?;
    inner.bans.save_counters()?;
    StoreStats::add(&inner.stats.objects_lurked, removed as u64);
    StoreStats::add(&inner.stats.bans_completed, completed as u64);
    StoreStats::add(&inner.stats.lurker_walks, 1);
    tracing::info!(
        keys,
        removed,
        completed,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "ban lurker walk done"
    );
    Ok(())
}
