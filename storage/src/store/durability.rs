//! What the store promises survives a crash, and when the promise is kept:
//!
//! - a purge or ban is appended to the invalidation journal and synced before it is acknowledged
//!   ([`Store::append_journal`]), and the metadata it changed is flushed before the call returns;
//! - a published object is counted durable (`objects_durable`) only once foyer has written its chunks and
//!   sled has flushed its record ([`Store::settle_writes`]);
//! - sled flushes are grouped: one flush covers every caller that arrived before it started
//!   ([`Store::flush_metadata`]), so a stampede of purges costs one flush per batch.

use std::sync::atomic::Ordering::SeqCst;

use crate::{error::StoreError, journal::Entry};

use super::{Store, JOURNAL_LAST};

impl Store {
    /// Makes every metadata write made before the call durable. One flush at a time covers every caller
    /// that arrived before it started (group commit). Not sled's `flush_async`: it parks sled's own IO
    /// threads until a log write queued on that same pool runs, which deadlocks once a few callers overlap.
    pub(crate) async fn flush_metadata(&self) -> Result<(), StoreError> {
        let inner = &self.inner;
        let ticket = inner.flush_tickets.fetch_add(1, SeqCst) + 1;
        let _one = inner.flushing.lock().await;
        if inner.flushed.load(SeqCst) >= ticket {
            return Ok(());
        }
        let upto = inner.flush_tickets.load(SeqCst);
        let db = inner.db.clone();
        tokio::task::spawn_blocking(move || db.flush())
            .await
            .map_err(|e| sled::Error::ReportableBug(format!("metadata flush task: {e}")))??;
        inner.flushed.store(upto, SeqCst);
        Ok(())
    }

    /// Writes sled's log to disk now, from a thread that may block (the lurker's walk is durable before
    /// its bans are completed).
    pub(crate) fn flush_metadata_blocking(&self) -> Result<(), StoreError> {
        self.inner.db.flush()?;
        Ok(())
    }

    /// Appends `entry` to the invalidation journal and syncs it (on a blocking thread), then notes in sled
    /// that the journal reaches it: a journal found shorter at start has lost entries. Once this returns,
    /// a crash cannot lose the entry. The caller holds [`crate::journal::Journal::applying`] until what the
    /// entry invalidates is applied to the metadata.
    pub(crate) async fn append_journal(&self, entry: Entry) -> Result<(), StoreError> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || {
            let id = entry.id();
            store.inner.journal.append(entry)?;
            store.inner.state.insert(JOURNAL_LAST, &id.to_be_bytes())?;
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
