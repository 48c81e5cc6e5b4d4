//! What the store promises survives a crash, and when the promise is kept:
//!
//! - a purge or ban is appended to the invalidation journal and synced before it is acknowledged
//!   ([`Store::append_journal`]), and the metadata it changed is flushed before the call returns;
//! - except a cluster's log, applied without waiting for either ([`Store::invalidate_deferred`]): etcd
//!   already holds it durably and the node replays it from its persisted revision after a crash, so that
//!   revision is the one thing that must not run ahead of what is durable here ([`Deferred`]);
//! - a published object is counted durable (`objects_durable`) only once foyer has written its chunks and
//!   sled has flushed its record ([`Store::settle_writes`]);
//! - sled flushes are grouped: one flush covers every caller that arrived before it started
//!   ([`Store::flush_metadata`]), so a stampede of purges costs one flush per batch.

use std::{
    future::Future,
    sync::{
        atomic::{AtomicU64, Ordering::SeqCst},
        Mutex,
    },
};

use crate::{error::StoreError, journal::Entry};

use super::{Store, JOURNAL_LAST};

/// A cluster's log applied without a journal sync or a metadata flush, until a [`Store::checkpoint`].
///
/// The persisted revision (`CLUSTER_REVISION`) tells the node where to resume the log after a crash; it
/// may lag behind what was applied (entries then apply twice: harmless, see [`Store::invalidate_deferred`])
/// but never run ahead of what is durable here, or a crash would skip entries nothing here kept. So it, and
/// `JOURNAL_LAST`, are written to sled only after the journal sync that covers them: sled flushes on its own
/// every 200 ms, and anything written to it may reach the disk at any moment after.
///
/// What a crash does at each point of a deferred batch and of a checkpoint:
///
/// - before or during the journal write, or after it (unsynced, or lost with the machine): the persisted
///   revision is older than the batch, so the node replays it from etcd before it vouches again. A torn
///   last record is dropped at start; sled may hold the batch's removals (more removed) or not (the
///   replay removes them again). `JOURNAL_LAST` was not moved, so a journal shorter than what sled saw is
///   not mistaken for damage. Ids never go back (`recover` starts them above every generation, ban check,
///   journal id and the wall clock), so a ban applied again gets a newer id: it covers more, never less.
/// - after the sync, before or during the flush: the markers may or may not have reached sled; either is
///   true of the journal, and an older revision only means a longer replay.
/// - after the flush: the revision is durable and so is everything it stands for.
#[derive(Default)]
pub(super) struct Deferred {
    /// The newest revision applied and not yet made durable by a checkpoint.
    revision: Mutex<Option<u64>>,
    /// One checkpoint at a time, and none while a synchronous batch records its own revision (which
    /// replaces the one pending: a log that was rewound starts over below it).
    checkpoints: tokio::sync::Mutex<()>,
}

impl Deferred {
    fn pending(&self) -> std::sync::MutexGuard<'_, Option<u64>> {
        self.revision.lock().expect("deferred revision")
    }
}

/// Group commit: one flush at a time, and a flush covers every caller that arrived before it started, so
/// callers that pile up behind a running flush share the next one instead of flushing once each.
#[derive(Default)]
pub(super) struct GroupCommit {
    /// Tickets handed out, one per caller, taken before waiting (after the caller's writes).
    tickets: AtomicU64,
    /// The highest ticket a completed flush covered.
    covered: AtomicU64,
    one_at_a_time: tokio::sync::Mutex<()>,
}

impl GroupCommit {
    /// Returns once a `flush` that started after this call began has succeeded: the caller's writes, made
    /// before the call, are covered. Runs `flush` itself unless a flush started meanwhile already covered
    /// it. A failed flush covers nobody: its error goes to the caller that ran it, and the next caller
    /// flushes again.
    async fn commit<F, Fut>(&self, flush: F) -> Result<(), StoreError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(), StoreError>>,
    {
        let ticket = self.tickets.fetch_add(1, SeqCst) + 1;
        let _one = self.one_at_a_time.lock().await;
        if self.covered.load(SeqCst) >= ticket {
            return Ok(());
        }
        let upto = self.tickets.load(SeqCst);
        flush().await?;
        self.covered.store(upto, SeqCst);
        Ok(())
    }
}

impl Store {
    /// Makes every metadata write made before the call durable, grouped with concurrent callers (see
    /// [`GroupCommit`]). Not sled's `flush_async`: it parks sled's own IO threads until a log write queued
    /// on that same pool runs, which deadlocks once a few callers overlap.
    pub(crate) async fn flush_metadata(&self) -> Result<(), StoreError> {
        self.inner
            .flushes
            .commit(|| async {
                let db = self.inner.db.clone();
                tokio::task::spawn_blocking(move || db.flush())
                    .await
                    .map_err(|e| {
                        sled::Error::ReportableBug(format!("metadata flush task: {e}"))
                    })??;
                Ok(())
            })
            .await
    }

    /// Writes sled's log to disk now, from a thread that may block (the lurker's walk is durable before
    /// its bans are completed).
    pub(crate) fn flush_metadata_blocking(&self) -> Result<(), StoreError> {
        self.inner.db.flush()?;
        Ok(())
    }

    /// Appends `entries` to the invalidation journal and syncs them (on a blocking thread, one sync for
    /// all), then notes in sled that the journal reaches them: a journal found shorter at start has lost
    /// entries. Once this returns, a crash cannot lose them. The caller holds
    /// [`crate::journal::Journal::applying`] until what they invalidate is applied to the metadata.
    pub(crate) async fn append_journal(&self, entries: Vec<Entry>) -> Result<(), StoreError> {
        self.journal_task(move |store| {
            let last = entries.iter().map(Entry::id).max().unwrap_or(0);
            store.inner.journal.append(entries)?;
            store.note_journal_last(last)
        })
        .await
    }

    /// Runs `work` on the blocking pool: journal writes wait for the disk.
    async fn journal_task<T: Send + 'static>(
        &self,
        work: impl FnOnce(Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || work(store))
            .await
            .map_err(|e| sled::Error::ReportableBug(format!("journal task: {e}")))?
    }

    /// Makes the revision a synchronous batch records replace any deferred one; held through the batch.
    pub(crate) async fn recording_revision(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.inner.deferred.checkpoints.lock().await
    }

    /// Called by a synchronous batch that recorded its revision and flushed, holding
    /// [`Store::recording_revision`]: its journal sync covered every deferred batch applied before it.
    pub(crate) fn recorded_revision(&self) {
        *self.inner.deferred.pending() = None;
    }

    /// Appends `entries` to the invalidation journal without syncing them, and without noting them in sled
    /// (see [`Deferred`]); the caller holds [`crate::journal::Journal::applying`] as for
    /// [`Store::append_journal`].
    pub(crate) async fn append_journal_unsynced(
        &self,
        entries: Vec<Entry>,
    ) -> Result<(), StoreError> {
        self.journal_task(move |store| store.inner.journal.append_unsynced(entries))
            .await
    }

    /// Syncs every journal entry written so far, then notes in sled how far the journal reaches (never
    /// before: see [`Deferred`]).
    pub(crate) async fn sync_journal(&self) -> Result<(), StoreError> {
        self.journal_task(|store| {
            let synced = store.inner.journal.sync()?;
            store.note_journal_last(synced)
        })
        .await
    }

    /// Notes in sled that the journal reaches entry `last`, once the entries up to it are synced: a
    /// journal found shorter at start has lost entries.
    fn note_journal_last(&self, last: u64) -> Result<(), StoreError> {
        self.inner.state.insert(JOURNAL_LAST, &last.to_be_bytes())?;
        Ok(())
    }

    /// Notes that a deferred batch applied the log up to `revision`, for the next checkpoint.
    pub(crate) fn defer_revision(&self, revision: u64) {
        let mut pending = self.inner.deferred.pending();
        *pending = Some(pending.map_or(revision, |r| r.max(revision)));
    }

    /// Makes every batch applied by [`Store::invalidate_deferred`] so far durable (one journal sync, one
    /// metadata flush), then records the newest revision among them as [`Store::cluster_revision`]; returns
    /// it, or `None` when nothing was waiting. Run it every so often while a cluster's log is applied: until
    /// it runs, a crash makes the node replay those batches from the log. [`Store::close`] runs it too.
    pub async fn checkpoint(&self) -> Result<Option<u64>, StoreError> {
        let _one = self.inner.deferred.checkpoints.lock().await;
        let Some(revision) = *self.inner.deferred.pending() else {
            return Ok(None);
        };
        // The batch that applied `revision` wrote its entries before noting it: this sync covers them.
        self.sync_journal().await?;
        self.note_cluster_revision(revision)?;
        self.flush_metadata().await?;
        let mut pending = self.inner.deferred.pending();
        // Revisions only grow between checkpoints: an equal one was applied before the sync.
        if *pending == Some(revision) {
            *pending = None;
        }
        Ok(Some(revision))
    }

    /// Waits for foyer to finish the disk writes of every chunk inserted so far, then (when `published`
    /// objects are waiting) flushes sled, and counts those objects durable: they survive a `kill -9` from
    /// now on. Returns `false`, counting nothing, when the flush failed (the objects stay waiting).
    pub(crate) async fn settle_writes(&self, published: u64) -> bool {
        self.inner.chunks.storage().wait().await;
        if published > 0 {
            if let Err(e) = self.flush_metadata().await {
                tracing::warn!(error = %e, "flushing metadata failed");
                return false;
            }
        }
        self.counters().write_waits.add(1);
        self.counters().objects_durable.add(published);
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        atomic::{AtomicUsize, Ordering::SeqCst},
        Arc,
    };

    use tokio::sync::Semaphore;

    use super::*;

    /// A flush that counts its runs and waits for the test to let it finish.
    fn flush(
        runs: &Arc<AtomicUsize>,
        gate: &Arc<Semaphore>,
    ) -> impl Future<Output = Result<(), StoreError>> {
        let (runs, gate) = (runs.clone(), gate.clone());
        async move {
            runs.fetch_add(1, SeqCst);
            gate.acquire().await.unwrap().forget();
            Ok(())
        }
    }

    async fn until(what: impl Fn() -> bool) {
        while !what() {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_behind_a_running_flush_share_the_next_one() {
        let group = Arc::new(GroupCommit::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(Semaphore::new(0));
        let first = tokio::spawn({
            let (group, runs, gate) = (group.clone(), runs.clone(), gate.clone());
            async move { group.commit(|| flush(&runs, &gate)).await }
        });
        until(|| runs.load(SeqCst) == 1).await;
        // Seven callers whose writes came after the running flush started: it cannot cover them.
        let later: Vec<_> = (0..7)
            .map(|_| {
                let (group, runs, gate) = (group.clone(), runs.clone(), gate.clone());
                tokio::spawn(async move { group.commit(|| flush(&runs, &gate)).await })
            })
            .collect();
        until(|| group.tickets.load(SeqCst) == 8).await;
        gate.add_permits(8);
        first.await.unwrap().unwrap();
        for caller in later {
            caller.await.unwrap().unwrap();
        }
        assert_eq!(
            runs.load(SeqCst),
            2,
            "one flush for the first caller, one shared by the seven behind it"
        );
        assert_eq!(group.covered.load(SeqCst), 8);
    }

    #[tokio::test]
    async fn a_failed_flush_covers_nobody() {
        let group = GroupCommit::default();
        let failed = group.commit(|| async { Err(StoreError::Closed) }).await;
        assert!(matches!(failed, Err(StoreError::Closed)));
        assert_eq!(group.covered.load(SeqCst), 0);
        let runs = AtomicUsize::new(0);
        group
            .commit(|| async {
                runs.fetch_add(1, SeqCst);
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(runs.load(SeqCst), 1, "the next caller flushes again");
        group
            .commit(|| async {
                runs.fetch_add(1, SeqCst);
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(
            runs.load(SeqCst),
            2,
            "a caller arriving after a completed flush is not covered by it"
        );
    }
}
