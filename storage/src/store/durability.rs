//! What the store promises survives a crash, and when the promise is kept:
//!
//! - a purge or ban is appended to the invalidation journal and synced before it is acknowledged
//!   ([`Store::append_journal`]), and the metadata it changed is flushed before the call returns;
//! - a published object is counted durable (`objects_durable`) only once foyer has written its chunks and
//!   sled has flushed its record ([`Store::settle_writes`]);
//! - sled flushes are grouped: one flush covers every caller that arrived before it started
//!   ([`Store::flush_metadata`]), so a stampede of purges costs one flush per batch.

use std::{
    future::Future,
    sync::atomic::{AtomicU64, Ordering::SeqCst},
};

use crate::{error::StoreError, journal::Entry};

use super::{Store, JOURNAL_LAST};

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
        let store = self.clone();
        tokio::task::spawn_blocking(move || {
            let last = entries.iter().map(Entry::id).max().unwrap_or(0);
            store.inner.journal.append(entries)?;
            store
                .inner
                .state
                .insert(JOURNAL_LAST, &last.to_be_bytes())?;
            Ok(())
        })
        .await
        .map_err(|e| sled::Error::ReportableBug(format!("journal task: {e}")))?
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
