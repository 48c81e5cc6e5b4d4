use std::{
    hash::{Hash, Hasher},
    sync::{
        atomic::{
            AtomicBool, AtomicU64,
            Ordering::{Relaxed, SeqCst},
        },
        Arc, Mutex,
    },
    time::Duration,
};

use bytes::Bytes;
use foyer::{Cache, HybridCache, Source};
use tokio::sync::mpsc;

use crate::{
    ban::{BanExpr, BanInfo, Bans, Verdict},
    builder::StoreBuilder,
    chunk::ChunkKey,
    error::StoreError,
    health::Health,
    journal::Journal,
    meta::{ObjectMeta, ObjectSet},
    purge::{InvalidationMark, Invalidations},
    space::DiskGuard,
    stats::{StoreStats, StoreStatsSnapshot},
    tags,
    writer::{Job, ObjectWriter},
};

/// Whether reading or writing a set puts it in the hot copy (`Fill`), or only refreshes a copy already there
/// (`IfPresent`, for the lurker's walk over every record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HotCopy {
    Fill,
    IfPresent,
}

/// Which tier served a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Memory,
    Disk,
}

/// How many of a body's chunks each tier holds (a chunk in both counts in both).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChunkTiers {
    pub chunks: u32,
    pub in_memory: u32,
    pub on_disk: u32,
}

#[derive(Debug, Clone)]
pub struct ChunkRead {
    pub data: Bytes,
    pub tier: Tier,
}

/// Handle on the store; cheap to clone.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) chunks: HybridCache<ChunkKey, Bytes>,
    pub(crate) db: sled::Db,
    pub(crate) objects: sled::Tree,
    pub(crate) tags: sled::Tree,
    /// Store-wide values: how far the invalidation journal has been seen to go.
    pub(crate) state: sled::Tree,
    pub(crate) bans: Bans,
    pub(crate) invalidations: Invalidations,
    pub(crate) journal: Journal,
    /// Free space on the store's filesystem; `None` for a memory-only store.
    pub(crate) disk: Option<DiskGuard>,
    pub(crate) health: Health,
    /// The store directory's lock, held while the store is open.
    pub(crate) lock: Mutex<Option<std::fs::File>>,
    /// Group commit of sled flushes: tickets taken before writes, and the highest one a flush covered.
    pub(crate) flush_tickets: AtomicU64,
    pub(crate) flushed: AtomicU64,
    pub(crate) flushing: tokio::sync::Mutex<()>,
    pub(crate) hot: Cache<String, Arc<ObjectSet>>,
    /// Serialises every change to an object set, so the hot copy and sled never disagree.
    pub(crate) mutate: Mutex<()>,
    pub(crate) jobs: mpsc::Sender<Job>,
    pub(crate) stats: StoreStats,
    pub(crate) config: StoreBuilder,
    pub(crate) registry: prometheus::Registry,
    pub(crate) closed: AtomicBool,
    pub(crate) runtime: tokio::runtime::Handle,
}

/// How much of a body [`Store::open_body`] proves readable before the response starts: enough to cover
/// most objects whole, small enough that a disk hit's first byte waits for a few reads at most.
pub const VERIFY_AHEAD: u64 = 1 << 20;

impl Store {
    /// A new id from the sequence body generations and invalidations share (see `journal`).
    pub(crate) fn next_id(&self) -> u64 {
        self.inner.journal.next_id()
    }

    pub fn chunk_size(&self) -> usize {
        self.inner.config.chunk_size
    }

    /// A stable id for a cache key and variant.
    pub fn object_id(primary: &str, variant: &[(String, String)]) -> u64 {
        let mut h = std::hash::DefaultHasher::new();
        primary.hash(&mut h);
        variant.hash(&mut h);
        h.finish()
    }

    /// Every stored variant of `primary` that no ban covers. Served from memory when hot; reads sled
    /// otherwise. Variants not yet tested against the newest bans are tested now, and removed if banned.
    pub fn lookup(&self, primary: &str) -> Result<Option<Arc<ObjectSet>>, StoreError> {
        let newest = self.inner.bans.newest();
        if let Some(entry) = self.inner.hot.get(primary) {
            let set = entry.value().clone();
            if !set
                .variants
                .iter()
                .any(|m| self.inner.bans.needs_test(m, newest))
            {
                return Ok(Some(set));
            }
        }
        let _guard = self.inner.mutate.lock().expect("store mutex");
        let Some(set) = self.load_set(primary, HotCopy::Fill)? else {
            return Ok(None);
        };
        let (set, removed) = self.apply_bans_locked(primary, set, newest, HotCopy::Fill)?;
        StoreStats::add(&self.inner.stats.objects_banned, removed as u64);
        Ok(set)
    }

    /// Tests the variants of `primary` against bans up to `upto`, removing the banned ones; returns what is
    /// left and how many were removed. The caller holds the mutation lock.
    ///
    /// Removals reach sled at once. That the others passed is recorded in the hot copy only, keeping sled
    /// writes off the hit path and out of the lurker's walk: losing it in a restart only means testing again
    /// against bans still pending, and once the lurker completes a ban no object needs testing against it.
    fn apply_bans_locked(
        &self,
        primary: &str,
        set: Arc<ObjectSet>,
        upto: u64,
        hot: HotCopy,
    ) -> Result<(Option<Arc<ObjectSet>>, usize), StoreError> {
        if !set
            .variants
            .iter()
            .any(|m| self.inner.bans.needs_test(m, upto))
        {
            return Ok((Some(set), 0));
        }
        let bans = self.inner.bans.snapshot();
        let (mut kept, mut dropped) = (Vec::new(), Vec::new());
        for meta in &set.variants {
            if !self.inner.bans.needs_test(meta, upto) {
                kept.push(meta.clone());
                continue;
            }
            match self.inner.bans.test(&bans, upto, primary, meta) {
                Verdict::Banned => dropped.push(meta.clone()),
                Verdict::Clear(checked) => kept.push(ObjectMeta {
                    ban_checked: checked,
                    ..meta.clone()
                }),
            }
        }
        let removed = dropped.len();
        if removed == 0 {
            let set = Arc::new(ObjectSet { variants: kept });
            if hot == HotCopy::Fill || self.inner.hot.contains(primary) {
                self.inner.hot.insert(primary.to_owned(), set.clone());
            }
            return Ok((Some(set), 0));
        }
        let set = self.save_set(primary, ObjectSet { variants: kept }, &dropped, hot)?;
        Ok((set, removed))
    }

    /// Whether the body `generation` of `primary` is still stored (bans are not applied).
    /// Leaves the hot copy alone: the sweeper and tag purges ask this for every tag entry.
    pub(crate) fn stored_generation(
        &self,
        primary: &str,
        generation: u64,
    ) -> Result<bool, StoreError> {
        let _guard = self.inner.mutate.lock().expect("store mutex");
        Ok(self
            .load_set(primary, HotCopy::IfPresent)?
            .is_some_and(|set| set.variants.iter().any(|m| m.generation == generation)))
    }

    /// Tests the variants of `primary` against bans up to `upto` under the lock, as a lookup would but
    /// without filling the hot copy: what the lurker does with a record it could not read on its own.
    pub(crate) fn apply_bans(&self, primary: &str, upto: u64) -> Result<usize, StoreError> {
        let _guard = self.inner.mutate.lock().expect("store mutex");
        let Some(set) = self.load_set(primary, HotCopy::IfPresent)? else {
            return Ok(0);
        };
        self.apply_bans_locked(primary, set, upto, HotCopy::IfPresent)
            .map(|(_, n)| n)
    }

    /// Adds a ban (see [`BanExpr`]); it applies to every object stored before this call returns, and it is
    /// durable when it returns.
    pub async fn add_ban(&self, expr: BanExpr) -> Result<BanInfo, StoreError> {
        let info = self.inner.bans.add(self, expr).await?;
        self.inner.invalidations.banned();
        StoreStats::add(&self.inner.stats.bans_added, 1);
        Ok(info)
    }

    /// The ban list, oldest first.
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

    /// Reads the set from the hot copy or sled; the caller holds the mutation lock.
    fn load_set(&self, primary: &str, hot: HotCopy) -> Result<Option<Arc<ObjectSet>>, StoreError> {
        if let Some(entry) = self.inner.hot.get(primary) {
            return Ok(Some(entry.value().clone()));
        }
        let Some(bytes) = self.inner.objects.get(primary.as_bytes())? else {
            return Ok(None);
        };
        match ObjectSet::decode(primary, &bytes) {
            Ok(set) => {
                let set = Arc::new(set);
                if hot == HotCopy::Fill {
                    self.inner.hot.insert(primary.to_owned(), set.clone());
                }
                Ok(Some(set))
            }
            Err(e) => {
                tracing::warn!(error = %e, "dropping unreadable metadata record");
                StoreStats::add(&self.inner.stats.corrupt_records, 1);
                self.inner.objects.remove(primary.as_bytes())?;
                Ok(None)
            }
        }
    }

    /// Replaces the set of `primary` (or removes it when empty) in sled and the hot copy, and returns it; the
    /// caller holds the mutation lock. Chunks and tag entries of `dropped` variants are removed.
    fn save_set(
        &self,
        primary: &str,
        set: ObjectSet,
        dropped: &[ObjectMeta],
        hot: HotCopy,
    ) -> Result<Option<Arc<ObjectSet>>, StoreError> {
        let saved = if set.variants.is_empty() {
            self.inner.objects.remove(primary.as_bytes())?;
            self.inner.hot.remove(primary);
            None
        } else {
            self.inner
                .objects
                .insert(primary.as_bytes(), set.encode())?;
            let set = Arc::new(set);
            if hot == HotCopy::Fill || self.inner.hot.contains(primary) {
                self.inner.hot.insert(primary.to_owned(), set.clone());
            }
            Some(set)
        };
        for meta in dropped {
            tags::remove(&self.inner.tags, primary, meta)?;
            self.forget_body_later(meta);
        }
        StoreStats::sub(&self.inner.stats.objects, dropped.len() as u64);
        StoreStats::sub(
            &self.inner.stats.stored_bytes,
            dropped.iter().map(|m| m.length).sum(),
        );
        Ok(saved)
    }

    /// Applies `change` to the set of `primary` and saves it; returns what `change` returned (0 when there
    /// is no set).
    pub(crate) fn modify(
        &self,
        primary: &str,
        change: impl FnOnce(&mut ObjectSet) -> usize,
    ) -> Result<usize, StoreError> {
        let _guard = self.inner.mutate.lock().expect("store mutex");
        let Some(set) = self.load_set(primary, HotCopy::Fill)? else {
            return Ok(0);
        };
        let mut set = (*set).clone();
        let n = change(&mut set);
        if n > 0 {
            self.save_set(primary, set, &[], HotCopy::Fill)?;
        }
        Ok(n)
    }

    /// Hands the removal of a body's chunks to the writer task: callers such as the low-priority lurker
    /// should not hold foyer's shard locks, which hits need, where the scheduler may pause them. The
    /// metadata is already gone, so nothing can read the chunks meanwhile. Removed at once when the queue
    /// is full.
    fn forget_body_later(&self, meta: &ObjectMeta) {
        let job = Job::Discard {
            object: meta.object,
            generation: meta.generation,
            chunks: meta.chunk_count(),
        };
        if self.inner.jobs.try_send(job).is_err() {
            self.forget_body(meta);
        }
    }

    pub(crate) fn forget_body(&self, meta: &ObjectMeta) {
        for index in 0..meta.chunk_count() {
            self.inner.chunks.remove(&ChunkKey {
                object: meta.object,
                generation: meta.generation,
                index,
            });
        }
    }

    /// Makes a fully written body visible, replacing the variant it shares a selection with; unless a purge
    /// or ban added since its fetch started (at `epoch`) covers it, in which case it is discarded.
    pub(crate) fn publish(
        &self,
        primary: &str,
        mut meta: ObjectMeta,
        epoch: u64,
    ) -> Result<(), StoreError> {
        let _guard = self.inner.mutate.lock().expect("store mutex");
        let newest = self.inner.bans.newest();
        let banned = meta.ban_checked < newest
            && match self.inner.bans.test_fetched(
                &self.inner.bans.snapshot(),
                meta.ban_checked,
                primary,
                &meta,
            ) {
                Verdict::Banned => true,
                Verdict::Clear(checked) => {
                    meta.ban_checked = checked;
                    false
                }
            };
        if banned || self.inner.invalidations.covers(epoch, primary, &meta.tags) {
            self.forget_body(&meta);
            StoreStats::add(&self.inner.stats.publishes_cancelled, 1);
            return Ok(());
        }
        tags::add(&self.inner.tags, primary, &meta)?;
        let mut set = self
            .load_set(primary, HotCopy::Fill)?
            .map(|s| (*s).clone())
            .unwrap_or_default();
        let mut dropped = Vec::new();
        if let Some(pos) = set.variants.iter().position(|v| v.variant == meta.variant) {
            dropped.push(set.variants.remove(pos));
        }
        StoreStats::add(&self.inner.stats.objects, 1);
        StoreStats::add(&self.inner.stats.stored_bytes, meta.length);
        set.variants.insert(0, meta);
        while set.variants.len() > self.inner.config.max_variants {
            dropped.push(set.variants.pop().expect("non-empty"));
            StoreStats::add(&self.inner.stats.variants_overflowed, 1);
        }
        self.save_set(primary, set, &dropped, HotCopy::Fill)?;
        StoreStats::add(&self.inner.stats.objects_published, 1);
        Ok(())
    }

    /// Removes every variant of `primary`; returns how many there were.
    pub fn remove(&self, primary: &str) -> Result<usize, StoreError> {
        let _guard = self.inner.mutate.lock().expect("store mutex");
        let Some(set) = self.load_set(primary, HotCopy::Fill)? else {
            return Ok(0);
        };
        let dropped = set.variants.clone();
        self.save_set(primary, ObjectSet::default(), &dropped, HotCopy::Fill)?;
        StoreStats::add(&self.inner.stats.objects_removed, dropped.len() as u64);
        Ok(dropped.len())
    }

    /// Replaces the metadata of a stored body (same generation, same chunks), as after a revalidation;
    /// `false` when that body is no longer stored.
    pub fn refresh(&self, primary: &str, meta: ObjectMeta) -> Result<bool, StoreError> {
        let _guard = self.inner.mutate.lock().expect("store mutex");
        let Some(set) = self.load_set(primary, HotCopy::Fill)? else {
            return Ok(false);
        };
        let mut set = (*set).clone();
        let Some(slot) = set
            .variants
            .iter_mut()
            .find(|m| m.generation == meta.generation)
        else {
            return Ok(false);
        };
        let mut meta = meta;
        meta.ban_checked = meta.ban_checked.max(slot.ban_checked);
        let old = std::mem::replace(slot, meta.clone());
        if old.tags != meta.tags {
            tags::add(&self.inner.tags, primary, &meta)?;
        }
        self.save_set(primary, set, &[], HotCopy::Fill)?;
        if old.tags != meta.tags {
            let gone = ObjectMeta {
                tags: old
                    .tags
                    .into_iter()
                    .filter(|t| !meta.tags.contains(t))
                    .collect(),
                ..old
            };
            tags::remove(&self.inner.tags, primary, &gone)?;
        }
        Ok(true)
    }

    /// Removes one stored body (for instance one whose chunks were lost) if it is still the current one.
    pub fn remove_generation(&self, primary: &str, generation: u64) -> Result<(), StoreError> {
        self.retain(primary, |m| m.generation != generation)
            .map(|_| ())
    }

    /// Keeps the variants of `primary` for which `keep` holds; returns how many were dropped.
    pub(crate) fn retain(
        &self,
        primary: &str,
        keep: impl Fn(&ObjectMeta) -> bool,
    ) -> Result<usize, StoreError> {
        let _guard = self.inner.mutate.lock().expect("store mutex");
        let Some(set) = self.load_set(primary, HotCopy::Fill)? else {
            return Ok(0);
        };
        let (kept, dropped): (Vec<_>, Vec<_>) = set.variants.iter().cloned().partition(|m| keep(m));
        if dropped.is_empty() {
            return Ok(0);
        }
        self.save_set(
            primary,
            ObjectSet { variants: kept },
            &dropped,
            HotCopy::Fill,
        )?;
        Ok(dropped.len())
    }

    /// Drops metadata past its keep time or whose body is gone (the sweeper does this periodically);
    /// returns how many variants were dropped.
    pub fn sweep(&self) -> Result<usize, StoreError> {
        crate::sweep::sweep_once(self)
    }

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

    pub(crate) fn objects_tree(&self) -> &sled::Tree {
        &self.inner.objects
    }

    /// Writes sled's log to disk now (blocking); the lurker's walk is durable before bans are completed.
    pub(crate) fn flush_metadata_blocking(&self) -> Result<(), StoreError> {
        self.inner.db.flush()?;
        Ok(())
    }

    /// Every stored variant of `primary` that no ban covers, with where its chunks are, for operators: unlike
    /// [`Store::lookup`] it does not make the key hot.
    pub fn inspect(&self, primary: &str) -> Result<Vec<(ObjectMeta, ChunkTiers)>, StoreError> {
        let set = {
            let _guard = self.inner.mutate.lock().expect("store mutex");
            let Some(set) = self.load_set(primary, HotCopy::IfPresent)? else {
                return Ok(Vec::new());
            };
            let (set, removed) =
                self.apply_bans_locked(primary, set, self.inner.bans.newest(), HotCopy::IfPresent)?;
            StoreStats::add(&self.inner.stats.objects_banned, removed as u64);
            set
        };
        let variants = set.map_or_else(Vec::new, |set| set.variants.clone());
        Ok(variants
            .into_iter()
            .map(|meta| {
                let mut tiers = ChunkTiers {
                    chunks: meta.chunk_count(),
                    ..ChunkTiers::default()
                };
                for index in 0..meta.chunk_count() {
                    let key = ChunkKey {
                        object: meta.object,
                        generation: meta.generation,
                        index,
                    };
                    tiers.in_memory += u32::from(self.inner.chunks.memory().contains(&key));
                    tiers.on_disk += u32::from(self.inner.chunks.storage().may_contains(&key));
                }
                (meta, tiers)
            })
            .collect())
    }

    /// Whether every chunk of the body is still held by memory or disk: checked before a response is started,
    /// so that a body lost to eviction or a crash becomes a miss instead of a truncated response.
    pub fn has_body(&self, meta: &ObjectMeta) -> bool {
        (0..meta.chunk_count()).all(|index| {
            self.inner.chunks.contains(&ChunkKey {
                object: meta.object,
                generation: meta.generation,
                index,
            })
        })
    }

    /// Proves a stored body can be served before its status line is sent, and returns its chunk 0: every
    /// chunk must be present (memory, or the disk tier's index), and the chunks in the first
    /// [`VERIFY_AHEAD`] bytes that are only on disk are read, which checks them and brings them to memory
    /// for the response. `None` when the body cannot be served whole; it is then forgotten, so the request
    /// (and every later one) is a plain miss instead of a truncated response. A body in memory costs one
    /// lookup per chunk, as before.
    pub async fn open_body(&self, meta: &ObjectMeta) -> Result<Option<ChunkRead>, StoreError> {
        if meta.length == 0 {
            return Ok(Some(ChunkRead {
                data: Bytes::new(),
                tier: Tier::Memory,
            }));
        }
        if !self.has_body(meta) {
            return Ok(None);
        }
        let Some(first) = self.read_chunk(meta, 0).await? else {
            return Ok(None);
        };
        let ahead = (VERIFY_AHEAD / u64::from(meta.chunk_size.max(1))).max(1) as u32;
        for index in 1..meta.chunk_count().min(ahead) {
            let key = ChunkKey {
                object: meta.object,
                generation: meta.generation,
                index,
            };
            if self.inner.chunks.memory().contains(&key) {
                continue;
            }
            if self.read_chunk(meta, index).await?.is_none() {
                return Ok(None);
            }
        }
        Ok(Some(first))
    }

    /// Reads chunk `index` of a body; `None` when it is gone or not the length the metadata promised (the
    /// whole body is then forgotten: a body with a hole is never served again).
    pub async fn read_chunk(
        &self,
        meta: &ObjectMeta,
        index: u32,
    ) -> Result<Option<ChunkRead>, StoreError> {
        let key = ChunkKey {
            object: meta.object,
            generation: meta.generation,
            index,
        };
        let read = self.read_key(key, meta.chunk_len(index)).await;
        if !matches!(read, Ok(Some(_))) {
            self.forget_body(meta);
        }
        read
    }

    /// Reads one chunk of `expected_len` bytes; `None` when foyer holds none, or one of another length.
    pub(crate) async fn read_key(
        &self,
        key: ChunkKey,
        expected_len: usize,
    ) -> Result<Option<ChunkRead>, StoreError> {
        let Some(entry) = self.inner.chunks.get(&key).await? else {
            StoreStats::add(&self.inner.stats.chunks_missing, 1);
            return Ok(None);
        };
        let data = entry.value().clone();
        if data.len() != expected_len {
            tracing::warn!(
                object = key.object,
                generation = key.generation,
                index = key.index,
                "chunk has the wrong length"
            );
            StoreStats::add(&self.inner.stats.chunks_missing, 1);
            return Ok(None);
        }
        let tier = match entry.source() {
            Source::Disk => {
                StoreStats::add(&self.inner.stats.chunk_reads_disk, 1);
                Tier::Disk
            }
            Source::Memory | Source::Outer => {
                StoreStats::add(&self.inner.stats.chunk_reads_memory, 1);
                Tier::Memory
            }
        };
        Ok(Some(ChunkRead { data, tier }))
    }

    /// Starts writing a new body for `primary` and its variant selection, fetched since `since`.
    pub fn writer(
        &self,
        primary: &str,
        variant: &[(String, String)],
        since: InvalidationMark,
    ) -> Result<ObjectWriter, StoreError> {
        if self.inner.closed.load(Relaxed) {
            return Err(StoreError::Closed);
        }
        let refused = if self.inner.health.broken.load(Relaxed) {
            Some(StoreError::Unavailable)
        } else if self.inner.disk.as_ref().is_some_and(|g| !g.room()) {
            Some(StoreError::DiskFull)
        } else {
            None
        };
        if let Some(refused) = refused {
            StoreStats::add(&self.inner.stats.fills_refused, 1);
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

    pub fn stats(&self) -> StoreStatsSnapshot {
        let mut s = StoreStatsSnapshot::default();
        self.inner.stats.fill(&mut s);
        s.memory_bytes_used = self.inner.chunks.memory().usage() as u64;
        s.memory_bytes_capacity = self.inner.chunks.memory().capacity() as u64;
        s.disk_bytes_capacity = self.inner.config.disk_bytes as u64;
        s.disk_bytes_written = self.inner.chunks.statistics().disk_write_bytes() as u64;
        s.disk_bytes_read = self.inner.chunks.statistics().disk_read_bytes() as u64;
        self.fill_from_foyer_metrics(&mut s);
        s.bans = self.inner.bans.snapshot().len() as u64;
        s.bans_pending = self.inner.bans.pending() as u64;
        let health = &self.inner.health;
        s.disk_full = u64::from(self.inner.disk.as_ref().is_some_and(|g| g.is_full()));
        s.damaged_at_start = u64::from(health.damaged_at_start.is_some());
        s.memory_only = u64::from(health.memory_only.is_some());
        s.tasks_failed = health.tasks_failed.load(Relaxed);
        s.journal_entries = self.inner.journal.len() as u64;
        s
    }

    /// What foyer only reports through its metrics: entries it ignored because a flush queue or buffer was
    /// full, memory-tier evictions, and how many disk blocks hold data (every block that is not clean).
    fn fill_from_foyer_metrics(&self, s: &mut StoreStatsSnapshot) {
        let families = self.inner.registry.gather();
        let sum = |family: &str, label: &str, values: &[&str], gauge: bool| -> u64 {
            families
                .iter()
                .filter(|f| f.name() == family)
                .flat_map(|f| f.get_metric())
                .filter(|m| {
                    values.is_empty()
                        || m.get_label()
                            .iter()
                            .any(|l| l.name() == label && values.contains(&l.value()))
                })
                .map(|m| {
                    if gauge {
                        m.get_gauge().value() as u64
                    } else {
                        m.get_counter().value() as u64
                    }
                })
                .sum()
        };
        s.foyer_drops = sum(
            "foyer_storage_inner_op_total",
            "op",
            &["buffer_overflow", "channel_overflow"],
            false,
        );
        s.memory_evictions = sum("foyer_memory_op_total", "op", &["evict"], false);
        let used_blocks = sum(
            "foyer_storage_block_engine_block",
            "type",
            &["writing", "evictable", "reclaiming"],
            true,
        );
        let block_size = sum("foyer_storage_block_engine_block_size_bytes", "", &[], true);
        s.disk_bytes_used = used_blocks * block_size;
    }

    /// The Prometheus registry holding foyer's own metrics.
    pub fn metrics_registry(&self) -> &prometheus::Registry {
        &self.inner.registry
    }

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
        // Not `flush_async`: it runs on sled's thread pool, which keeps the database (and its directory lock)
        // alive for a moment after the future resolves.
        self.inner.db.flush()?;
        self.inner.lock.lock().expect("store lock").take();
        Ok(())
    }
}
