//! The store handle and the parts it is wired from. Only the modules below see [`Inner`]'s fields; the rest
//! of the crate (the writer, the sweeper, purges, the ban lurker, health) goes through the narrow methods
//! each of them documents:
//!
//! - `open`: opening the directory, wiring foyer (bodies) and sled (metadata), starting the background tasks;
//! - `recover`: the start-up replay of the invalidation journal over the metadata;
//! - `records`: every change to a metadata record, under its key's lock that keeps the hot copy and sled in
//!   step; bans are applied to a record here when a lookup meets it;
//! - `tags`: the surrogate-key index, changed together with the records;
//! - `hot`: the hot metadata copy and what its entries weigh;
//! - `index`: the in-memory index of stored keys, so a key never stored is a miss without asking sled;
//! - `bodies`: reading, proving and forgetting body chunks;
//! - `durability`: what is promised to survive a crash, and when (group commit of sled, the journal);
//! - `stats`: the store's counters, declared once.

mod bodies;
mod disk_reads;
mod durability;
mod hot;
mod index;
mod open;
mod records;
mod recover;
mod stats;
mod tags;

use std::{
    hash::{Hash, Hasher},
    sync::{
        atomic::{
            AtomicBool, AtomicU64,
            Ordering::{Relaxed, SeqCst},
        },
        Arc, Mutex, Weak,
    },
    time::Duration,
};

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use foyer::HybridCache;
use tokio::sync::mpsc;

pub use bodies::{ChunkRead, ChunkTiers, Tier, VERIFY_AHEAD};
use durability::{Deferred, GroupCommit};
use open::JOURNAL_LAST;
pub use records::{Inspected, PartKept};
use stats::Counters;
pub use stats::StoreStatsSnapshot;
pub(crate) use tags::Tagged;

use crate::{
    ban::{BanExpr, BanInfo, Bans},
    builder::StoreBuilder,
    chunk::ChunkKey,
    error::StoreError,
    health::Health,
    journal::Journal,
    purge::{Invalidated, Invalidation, InvalidationMark, Invalidations},
    space::DiskGuard,
    writer::{Job, ObjectWriter},
};

/// Where [`Store::cluster_revision`] is kept in the `state` tree.
const CLUSTER_REVISION: &[u8] = b"cluster-revision";

/// Ids the ceiling is raised by at a time (see [`Store::next_id`]): a sled write per million ids, and
/// well under a second of the wall clock's lead at the next start (`recover`'s `IDS_PER_MS`).
const ID_BLOCK: u64 = 1 << 20;

/// Handle on the store; cheap to clone. The writer task holds one until [`Store::close`], which finishes
/// pending writes and releases the store directory (a process can then open it again).
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

/// A handle that does not keep the store open: what background tasks hold, so that none of them keeps a
/// closed store (sled, the directory lock) alive.
#[derive(Clone)]
pub(crate) struct WeakStore {
    inner: Weak<Inner>,
    /// The store's own flag, read before upgrading: a task in the idle scheduling class that upgraded a
    /// closed store could be the last to drop it and tear sled down (its directory lock held all the while)
    /// whenever the scheduler lets it, long after the owner closed and dropped its handle.
    closed: Arc<AtomicBool>,
}

impl WeakStore {
    /// The store, unless every handle was dropped or it is closing: a background task ends when this is
    /// `None`.
    pub(crate) fn open(&self) -> Option<Store> {
        if self.closed.load(Relaxed) {
            return None;
        }
        let inner = self.inner.upgrade()?;
        (!inner.closed.load(Relaxed)).then_some(Store { inner })
    }

    /// The store while any handle keeps it, closing or not: what a failure report needs.
    pub(crate) fn upgrade(&self) -> Option<Store> {
        self.inner.upgrade().map(|inner| Store { inner })
    }
}

struct Inner {
    chunks: HybridCache<ChunkKey, Bytes>,
    /// Reads of large bodies from the disk tier, shared by their concurrent readers.
    disk_reads: Arc<disk_reads::DiskReads>,
    db: sled::Db,
    objects: sled::Tree,
    tags: sled::Tree,
    /// Store-wide values: how far the invalidation journal has been seen to go.
    state: sled::Tree,
    bans: Bans,
    invalidations: Invalidations,
    journal: Journal,
    /// Free space on the store's filesystem; `None` for a memory-only store.
    disk: Option<DiskGuard>,
    health: Health,
    /// The store directory's lock, held while the store is open.
    lock: Mutex<Option<std::fs::File>>,
    /// Group commit of sled flushes.
    flushes: GroupCommit,
    /// A cluster's log applied and not yet durable here.
    deferred: Deferred,
    hot: hot::HotCopy,
    /// The edited copies of prepared heads the hot copy weighs ([`Store::weigh_edited_heads`]).
    edited_heads: hot::EditedHeads,
    /// Serialises every change to one key's object set, so the hot copy and sled never disagree.
    records: records::Records,
    /// The hashes of the keys with a record in sled, changed under their record locks.
    keys: index::KeyIndex,
    jobs: mpsc::Sender<Job>,
    counters: Counters,
    config: StoreBuilder,
    registry: prometheus::Registry,
    /// Shared with every [`WeakStore`], which reads it without upgrading.
    closed: Arc<AtomicBool>,
    runtime: tokio::runtime::Handle,
    /// The start-up replay while its walk runs (see `recover`).
    replay: ArcSwapOption<recover::Pending>,
    /// No id at or above this has been handed out; kept in sled before one is (see [`Store::next_id`]).
    id_ceiling: AtomicU64,
    /// Held while the ceiling is raised.
    raising: Mutex<()>,
}

impl Store {
    /// Whether the data path keeps an edited copy of each prepared response head, with at most this many
    /// fields more (deliver rules that look at the response alone edit a hit's head once, ahead of its
    /// hits; `None`: no copies). The hot copy weighs that copy too, so `storage.metadata_cache` still
    /// bounds what it holds: when copies become larger than its entries were weighed for, it is emptied
    /// (sled holds every record; the next lookups fill it again, weighed anew).
    pub fn weigh_edited_heads(&self, edited: Option<usize>) {
        let now = edited.map_or(0, |added| added + 1);
        if self.inner.edited_heads.swap(now, Relaxed) < now {
            self.inner.hot.clear();
        }
    }

    /// The size bodies are split into (see [`StoreBuilder::with_chunk_size`]); every chunk but a body's
    /// last is exactly this long.
    pub fn chunk_size(&self) -> usize {
        self.inner.config.chunk_size
    }

    /// The chunk size of a body announced `length` bytes long (see
    /// [`StoreBuilder::with_large_chunk_size`](crate::StoreBuilder::with_large_chunk_size)).
    pub(crate) fn chunk_size_for(&self, length: Option<u64>) -> usize {
        self.inner.config.chunk_size_for(length)
    }

    /// A stable id for a cache key and variant: chunk keys carry it, so it must not change across
    /// restarts of the same build.
    pub fn object_id(primary: &str, variant: &[(String, String)]) -> u64 {
        let mut h = std::hash::DefaultHasher::new();
        primary.hash(&mut h);
        variant.hash(&mut h);
        h.finish()
    }

    /// Starts writing a new body for `primary` and its variant selection, fetched since `since` (taken
    /// with [`Store::mark`] when the fetch started). Refused while the disk is full or a store task has
    /// died ([`StoreError::is_refusal`]), and once the store is closing.
    pub fn writer(
        &self,
        primary: &str,
        variant: &[(String, String)],
        since: InvalidationMark,
    ) -> Result<ObjectWriter, StoreError> {
        if self.is_closed() {
            return Err(StoreError::Closed);
        }
        let refused = if self.health().is_broken() {
            Some(StoreError::Unavailable)
        } else if !self.disk_has_room() {
            Some(StoreError::DiskFull)
        } else {
            None
        };
        if let Some(refused) = refused {
            self.counters().fills_refused.add(1);
            return Err(refused);
        }
        let generation = self.next_id();
        Ok(ObjectWriter::new(
            self.clone(),
            Self::object_id(primary, variant),
            generation,
            since.ban,
            since.epoch,
        ))
    }

    /// Adds a ban (see [`BanExpr`]); it applies to every object stored before this call returns, and it is
    /// durable when it returns. Older identical bans are dropped: the new one covers everything they
    /// covered.
    pub async fn add_ban(&self, expr: BanExpr) -> Result<BanInfo, StoreError> {
        match self
            .invalidate(vec![Invalidation::Ban(expr)], None)
            .await?
            .pop()
        {
            Some(Invalidated::Ban(info)) => Ok(info),
            other => unreachable!("a ban applied as {other:?}"),
        }
    }

    /// The ban list, oldest first: pending bans and the most recent completed ones.
    pub fn bans(&self) -> Vec<BanInfo> {
        self.inner.bans.infos()
    }

    /// Where the invalidation history stands now; see [`InvalidationMark`].
    pub fn mark(&self) -> InvalidationMark {
        InvalidationMark {
            ban: self.inner.bans.newest(),
            epoch: self.inner.invalidations.epoch(),
        }
    }

    /// Drops metadata past its keep time or whose body is gone (the sweeper does this every
    /// [`StoreBuilder::with_sweep_interval`]); returns how many variants were dropped. Blocks on sled.
    pub fn sweep(&self) -> Result<usize, StoreError> {
        crate::sweep::sweep_once(self)
    }

    /// The Prometheus registry holding foyer's own metrics (appended to `/metrics` as they are).
    pub fn metrics_registry(&self) -> &prometheus::Registry {
        &self.inner.registry
    }

    /// The runtime the store's disk tasks and write pipeline run on (given to [`StoreBuilder::open`]).
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        &self.inner.runtime
    }

    /// Finishes pending writes, waits for foyer's disk writes, closes foyer and flushes sled.
    /// A store task that died, or a disk that filled, never makes this panic: what cannot be finished within
    /// `timeout` is logged and left (the next start recovers from it).
    pub async fn close(&self, timeout: Duration) -> Result<(), StoreError> {
        self.inner.closed.store(true, Relaxed);
        let drained = tokio::time::timeout(timeout, async {
            let (tx, rx) = tokio::sync::oneshot::channel();
            if self.inner.jobs.send(Job::Drain(tx)).await.is_ok() {
                let _ = rx.await;
            }
        });
        if drained.await.is_err() {
            tracing::warn!("pending store writes did not finish before the shutdown timeout");
        }
        // foyer's close panics when one of its tasks has died; a task turns that into an error.
        let chunks = self.inner.chunks.clone();
        let closing = self
            .inner
            .runtime
            .spawn(async move { chunks.close().await });
        match tokio::time::timeout(timeout, closing).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "closing the body cache failed"),
            Ok(Err(e)) => tracing::warn!(error = %e, "closing the body cache failed"),
            Err(_) => tracing::warn!("the body cache did not close before the shutdown timeout"),
        }
        // A cluster's log applied since the last checkpoint: durable now, so the next start resumes after it.
        self.checkpoint().await?;
        // Not `flush_async`: it runs on sled's thread pool, which keeps the database (and its directory lock)
        // alive for a moment after the future resolves.
        self.inner.db.flush()?;
        // A replay that did not finish walking leaves records unchecked: the next start replays again.
        if self.replay_pending() {
            self.inner.lock.lock().expect("store lock").take();
            return Ok(());
        }
        // Written after everything above is in sled, so the next start can skip its replay; the id margin
        // covers ids a straggler takes after this point.
        let (objects, bytes) = self.counted();
        let clean = recover::CleanClose {
            journal_last: self.inner.journal.last(),
            next_id: self.next_id() + (1 << 20),
            objects,
            bytes,
        };
        self.inner
            .state
            .insert(recover::CLEAN_CLOSE, &clean.encode())?;
        self.inner.db.flush()?;
        self.inner.lock.lock().expect("store lock").take();
        Ok(())
    }

    /// The newest revision of a cluster's invalidation log applied to this store and durable here (a
    /// deferred batch counts from the [`Store::checkpoint`] after it); 0 when none. It lives with the
    /// metadata, so a store moved aside or started empty starts the log over.
    pub fn cluster_revision(&self) -> Result<u64, StoreError> {
        Ok(self
            .inner
            .state
            .get(CLUSTER_REVISION)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map_or(0, u64::from_be_bytes))
    }

    /// Writes `revision` as the cluster's applied revision, for the caller's next flush to make durable;
    /// only once every entry up to it is durable here (sled may flush it any moment).
    pub(crate) fn note_cluster_revision(&self, revision: u64) -> Result<(), StoreError> {
        self.inner
            .state
            .insert(CLUSTER_REVISION, &revision.to_be_bytes())?;
        Ok(())
    }

    /// A new id from the sequence body generations and invalidations share (see `journal`): never handed
    /// out twice, and never lower than one handed out before, even across a crash.
    ///
    /// Ids are handed out below a ceiling written to sled before any id reaches it, so the next start
    /// knows every id below it may be in use without reading every record. sled recovers a prefix of its
    /// writes, so a record that survives a crash survives with a ceiling above its ids.
    pub(crate) fn next_id(&self) -> u64 {
        let id = self.inner.journal.next_id();
        if id >= self.inner.id_ceiling.load(SeqCst) {
            let _raising = self.inner.raising.lock().expect("id ceiling");
            if id >= self.inner.id_ceiling.load(SeqCst) {
                if let Err(e) = self.set_id_ceiling(id + 1) {
                    // sled refuses writes: the records these ids are for cannot be kept either.
                    tracing::error!(error = %e, "cannot record the id ceiling");
                }
            }
        }
        id
    }

    /// Raises the id ceiling to `ID_BLOCK` ids above `from` (the first id still to hand out), in sled
    /// first.
    fn set_id_ceiling(&self, from: u64) -> Result<(), StoreError> {
        let ceiling = from + ID_BLOCK;
        self.inner
            .state
            .insert(recover::ID_CEILING, &ceiling.to_be_bytes())?;
        self.inner.id_ceiling.store(ceiling, SeqCst);
        Ok(())
    }

    /// A handle for a background task, which must not keep the store open.
    pub(crate) fn downgrade(&self) -> WeakStore {
        WeakStore {
            inner: Arc::downgrade(&self.inner),
            closed: self.inner.closed.clone(),
        }
    }

    /// Whether [`Store::close`] has begun: background work stops, new fills are refused.
    pub(crate) fn is_closed(&self) -> bool {
        self.inner.closed.load(Relaxed)
    }

    /// The counters the store keeps itself; anyone who does what one counts adds to it.
    pub(crate) fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    /// The ban list: what the lurker walks for, and what lookups and publishes test against.
    pub(crate) fn ban_list(&self) -> &Bans {
        &self.inner.bans
    }

    /// The purges and bans fetches in flight are tested against before they publish.
    pub(crate) fn invalidations(&self) -> &Invalidations {
        &self.inner.invalidations
    }

    /// The invalidation journal, for compaction and the start-up replay; appends go through
    /// [`Store::append_journal`], which also notes them in sled.
    pub(crate) fn journal(&self) -> &Journal {
        &self.inner.journal
    }

    /// What is wrong with the store (failed tasks, damage at start).
    pub(crate) fn health(&self) -> &Health {
        &self.inner.health
    }

    /// The free-space guard; `None` for a memory-only store, which has no disk to fill.
    pub(crate) fn disk(&self) -> Option<&DiskGuard> {
        self.inner.disk.as_ref()
    }

    /// Whether a chunk may be given to foyer now: false below the free-space reserve (foyer panics on
    /// ENOSPC). Rereads the free space at most every few hundred milliseconds.
    pub(crate) fn disk_has_room(&self) -> bool {
        self.disk().is_none_or(DiskGuard::room)
    }

    /// Queues a job for the writer task, waiting while its queue is full (the backpressure that slows the
    /// origin read instead of letting foyer drop entries); [`StoreError::Closed`] once the task is gone.
    pub(crate) async fn submit(&self, job: Job) -> Result<(), StoreError> {
        self.inner
            .jobs
            .send(job)
            .await
            .map_err(|_| StoreError::Closed)
    }

    /// Queues a job for the writer task without waiting, from where one cannot wait (a `Drop`): the job is
    /// sent from a task on the store's runtime.
    pub(crate) fn submit_detached(&self, job: Job) {
        let jobs = self.inner.jobs.clone();
        self.inner.runtime.spawn(async move {
            let _ = jobs.send(job).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn background_tasks_let_go_of_a_closing_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = StoreBuilder::small(dir.path())
            .open(tokio::runtime::Handle::current())
            .await
            .unwrap();
        let weak = store.downgrade();
        assert!(weak.open().is_some());
        store.close(Duration::from_secs(5)).await.unwrap();
        assert!(weak.open().is_none(), "tasks stop once the store closes");
        assert!(
            weak.upgrade().is_some(),
            "a failure report still reaches it"
        );
        assert!(matches!(
            store.writer("a.test/x", &[], store.mark()),
            Err(StoreError::Closed)
        ));
        drop(store);
        assert!(weak.upgrade().is_none(), "nothing but handles keeps it");
    }
}
