//! The ban lurker: walks the stored objects in the background and removes the banned ones; once the
//! removals are durable, the bans are completed, so they stop costing lookups and can be retired.

use std::{
    sync::{Arc, Condvar, Mutex},
    time::{Duration, Instant},
};

use crate::{
    ban::Verdict,
    store::{Store, WeakStore},
};

/// Keys tested between pauses, counter updates and checks that the store is still open.
const BATCH: usize = 200;
/// Share of one core the walk may take while it runs: after a batch that took `t` it sleeps
/// `t × (1 − DUTY) / DUTY`. The idle scheduling class already gives a client thread its core back at
/// once; the pause bounds what the class cannot: the walk's removals set off work on the store's
/// normal-priority threads (sled, foyer's tombstones, the writer), and a walk running flat out on one core
/// slows the other through what they share (caches, memory, a hyperthread sibling).
const DUTY: f64 = 0.25;
/// Bans arriving together are walked together.
const GATHER: Duration = Duration::from_millis(50);
/// A walk that failed (sled error) is retried after this; also how often an idle lurker checks the store is
/// still open.
const RETRY: Duration = Duration::from_secs(10);

/// Wakes the lurker when a ban is added.
#[derive(Default)]
pub(crate) struct Wake {
    pending: Mutex<bool>,
    cond: Condvar,
}

impl Wake {
    pub(crate) fn notify(&self) {
        *self.pending.lock().expect("lurker wake") = true;
        self.cond.notify_one();
    }

    /// Waits for a notification (or `timeout`); a notification sent before the wait is not lost.
    fn wait(&self, timeout: Duration) {
        let pending = self.pending.lock().expect("lurker wake");
        let (mut pending, _) = self
            .cond
            .wait_timeout_while(pending, timeout, |p| !*p)
            .expect("lurker wake");
        *pending = false;
    }
}

/// Starts the lurker on a background thread. Holds the store weakly so that dropping every handle closes
/// sled.
pub(crate) fn start(store: WeakStore, wake: Arc<Wake>) -> Result<(), crate::StoreError> {
    crate::background::spawn(
        "lurker",
        crate::background::Priority::Idle,
        store,
        move |store| run(store, &wake),
    )
}

fn run(store: &WeakStore, wake: &Wake) {
    loop {
        let Some(pending) = store.open().map(|store| store.ban_list().pending()) else {
            return;
        };
        if pending == 0 {
            wake.wait(RETRY);
            std::thread::sleep(GATHER);
        }
        let Some(store) = store.open() else { return };
        if store.ban_list().pending() == 0 {
            continue;
        }
        if let Err(e) = walk(&store) {
            tracing::warn!(error = %e, "ban lurker walk failed; retrying");
            std::thread::sleep(RETRY);
        }
    }
}

/// Tests every stored object against the bans that exist now; then, once the removals are durable, marks
/// those bans completed. Objects published during the walk were tested when published.
///
/// The walk runs in the idle scheduling class (see `background`) and at most [`DUTY`] of a core.
fn walk(store: &Store) -> Result<(), crate::StoreError> {
    let list = store.ban_list();
    let upto = list.newest();
    let bans = list.snapshot();
    let started = Instant::now();
    let (mut keys, mut removed) = (0usize, 0usize);
    let mut batch_started = Instant::now();
    for record in store.records() {
        if store.is_closed() {
            return Ok(());
        }
        let record = record?;
        let primary = record.primary();
        // Tested on the record as read, without the store's lock: only a banned variant needs the lock,
        // to remove exactly that body (by generation, so a body replaced meanwhile is left alone).
        match &record.set {
            Some(set) => {
                let banned: Vec<u64> = set
                    .variants
                    .iter()
                    .filter(|m| list.needs_test(m, upto))
                    .filter(|m| matches!(list.test(&bans, upto, &primary, m), Verdict::Banned))
                    .map(|m| m.generation)
                    .collect();
                if !banned.is_empty() {
                    removed += store.retain(&primary, |m| !banned.contains(&m.generation))?;
                }
            }
            // An unreadable record is dropped the way a lookup drops it.
            None => removed += store.apply_bans(&primary, upto)?,
        }
        keys += 1;
        if keys % BATCH == 0 {
            store.counters().lurker_records_tested.add(BATCH as u64);
            std::thread::sleep(batch_started.elapsed().mul_f64((1.0 - DUTY) / DUTY));
            batch_started = Instant::now();
        }
    }
    store
        .counters()
        .lurker_records_tested
        .add((keys % BATCH) as u64);
    store.flush_metadata_blocking()?;
    // Counted before the bans show completed: whoever sees no pending ban sees what the walk removed.
    store.counters().objects_lurked.add(removed as u64);
    let completed = list.complete(upto)?;
    list.save_counters()?;
    store.counters().bans_completed.add(completed as u64);
    store.counters().lurker_walks.add(1);
    tracing::info!(
        keys,
        removed,
        completed,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "ban lurker walk done"
    );
    Ok(())
}
