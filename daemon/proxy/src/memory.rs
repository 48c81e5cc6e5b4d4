//! An in-memory [`CacheStore`] for unit tests of the data path. It keeps the contract the data path relies
//! on as the real store does: bodies in chunks of a chosen size under a generation never reused, variants
//! replaced by selection, bans tested at lookup and before a fill publishes, purges that cancel a fill that
//! started before them. Tests can also age objects, ban or purge at any point of a fill, and see which
//! chunks were read.

use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, Mutex, MutexGuard},
};

use bytes::{Bytes, BytesMut};
use lacquer_storage::{
    ChunkRead, InvalidationMark, ObjectMeta, ObjectSet, Part, PartFate, PartKept, Partial, Sibling,
    Store, StoreError, Tier,
};
use tokio::sync::watch;

use crate::store::{BodyWriter, CacheStore, PartialRead};

/// Which objects a ban covers, given the cache key and the stored metadata.
type BanTest = Arc<dyn Fn(&str, &ObjectMeta) -> bool + Send + Sync>;

struct Ban {
    id: u64,
    covers: BanTest,
}

#[derive(Default)]
struct State {
    sets: HashMap<String, Arc<ObjectSet>>,
    /// Chunk bytes by (generation, index): a generation is unique, as in the real store.
    chunks: HashMap<(u64, u32), Bytes>,
    /// One sequence for generations and ban ids, as the store's journal shares one.
    next_id: u64,
    bans: Vec<Ban>,
    /// Keys purged, by the epoch each purge moved to.
    purges: Vec<(u64, String)>,
    epoch: u64,
    /// Chunks read by (generation, index), in order.
    reads: Vec<(u64, u32)>,
    published: usize,
    publishes_cancelled: usize,
    /// Chunks are refused, as the real store refuses them below its free-space reserve.
    disk_full: bool,
}

impl State {
    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn newest_ban(&self) -> u64 {
        self.bans.last().map_or(0, |b| b.id)
    }

    /// Whether a ban newer than the one `meta` was tested against covers it.
    fn banned(&self, primary: &str, meta: &ObjectMeta) -> bool {
        self.bans
            .iter()
            .any(|b| b.id > meta.ban_checked && (b.covers)(primary, meta))
    }

    fn forget_body(&mut self, generation: u64) {
        self.chunks.retain(|(g, _), _| *g != generation);
    }

    /// Replaces the variants of `primary`, dropping the bodies of those no longer kept and the siblings
    /// made from them.
    fn save(&mut self, primary: &str, variants: Vec<ObjectMeta>) {
        let old = self.sets.remove(primary);
        let kept = |generation: u64| variants.iter().any(|m| m.generation == generation);
        for meta in old.iter().flat_map(|s| &s.variants) {
            if !kept(meta.generation) {
                self.forget_body(meta.generation);
            }
        }
        let mut siblings = Vec::new();
        for sibling in old.iter().flat_map(|s| &s.siblings) {
            if kept(sibling.of) {
                siblings.push(sibling.clone());
            } else {
                self.forget_body(sibling.body.generation);
            }
        }
        let mut partials = Vec::new();
        for partial in old.iter().flat_map(|s| &s.partials) {
            if kept(partial.of) {
                partials.push(partial.clone());
            } else {
                for part in &partial.parts {
                    self.forget_body(part.body.generation);
                }
            }
        }
        if !variants.is_empty() {
            let set = ObjectSet {
                variants,
                siblings,
                partials,
            };
            self.sets.insert(primary.to_owned(), Arc::new(set));
        }
    }

    /// As the real store's `add_part`: joins the parts of the same representation, or starts a new
    /// variant body.
    fn add_part(
        &mut self,
        primary: &str,
        mut head: ObjectMeta,
        total: u64,
        part: Part,
        epoch: u64,
    ) -> PartKept {
        let purged = self
            .purges
            .iter()
            .any(|(e, key)| *e > epoch && key == primary);
        if purged || self.banned(primary, &head) {
            self.forget_body(part.body.generation);
            self.publishes_cancelled += 1;
            return PartKept::Discarded;
        }
        let mut set = self
            .sets
            .get(primary)
            .map_or_else(ObjectSet::default, |s| (**s).clone());
        let replaces = match set.part_fate(&head, total, &part) {
            PartFate::Joins {
                variant,
                partial,
                adds,
            } => {
                set.variants[variant].refresh_from_part(head);
                let partial = &mut set.partials[partial];
                if adds {
                    let at = partial.parts.partition_point(|p| p.start < part.start);
                    partial.parts.insert(at, part);
                } else {
                    self.forget_body(part.body.generation);
                }
                self.sets.insert(primary.to_owned(), Arc::new(set));
                return PartKept::Added;
            }
            PartFate::Refused => {
                self.forget_body(part.body.generation);
                return PartKept::Discarded;
            }
            PartFate::Starts { replaces } => replaces,
        };
        head.generation = self.next_id();
        head.length = 0;
        head.ban_checked = self.newest_ban();
        let mut variants = set.variants.clone();
        if let Some(pos) = replaces {
            variants.remove(pos);
        }
        variants.insert(0, head.clone());
        self.save(primary, variants);
        let mut set = self
            .sets
            .get(primary)
            .map_or_else(ObjectSet::default, |s| (**s).clone());
        set.partials.push(Partial {
            of: head.generation,
            total,
            parts: vec![part],
        });
        self.sets.insert(primary.to_owned(), Arc::new(set));
        self.published += 1;
        PartKept::Started
    }

    /// Keeps `sibling` with its variant body, replacing one in the same coding; `false` when that body is
    /// gone.
    fn add_sibling(&mut self, primary: &str, sibling: Sibling) -> bool {
        let Some(set) = self
            .sets
            .get(primary)
            .filter(|set| set.variants.iter().any(|m| m.generation == sibling.of))
        else {
            self.forget_body(sibling.body.generation);
            return false;
        };
        let mut set = (**set).clone();
        if let Some(pos) = set
            .siblings
            .iter()
            .position(|s| s.of == sibling.of && s.coding == sibling.coding)
        {
            let old = set.siblings.remove(pos);
            self.forget_body(old.body.generation);
        }
        set.siblings.push(sibling);
        self.sets.insert(primary.to_owned(), Arc::new(set));
        true
    }
}

/// A store held in memory; cloning shares it.
#[derive(Clone)]
pub struct MemoryStore {
    chunk_size: u64,
    state: Arc<Mutex<State>>,
    /// Held for writing while writers' pushes must wait ([`MemoryStore::hold_writes`]).
    writes: Arc<tokio::sync::RwLock<()>>,
}

impl MemoryStore {
    /// An empty store whose bodies are cut in chunks of `chunk_size` bytes.
    pub fn new(chunk_size: u64) -> Self {
        Self {
            chunk_size,
            state: Arc::default(),
            writes: Arc::default(),
        }
    }

    /// Makes every writer's push wait until the guard is dropped, as a store busy writing does.
    pub async fn hold_writes(&self) -> tokio::sync::OwnedRwLockWriteGuard<()> {
        self.writes.clone().write_owned().await
    }

    /// Refuses (or takes again) every chunk from now on, as the real store does while its disk is full: a
    /// writer learns of it at its next push, its readers find no chunk from the refused one on.
    pub fn set_disk_full(&self, full: bool) {
        self.lock().disk_full = full;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("memory store mutex")
    }

    /// Adds a ban on whatever `covers` matches: stored objects and fills in flight alike.
    pub fn ban(&self, covers: impl Fn(&str, &ObjectMeta) -> bool + Send + Sync + 'static) {
        let mut s = self.lock();
        let id = s.next_id();
        s.bans.push(Ban {
            id,
            covers: Arc::new(covers),
        });
        s.epoch += 1;
    }

    /// Removes every variant of `primary`, and cancels the publication of fills that started before.
    pub fn purge(&self, primary: &str) {
        let mut s = self.lock();
        s.epoch += 1;
        let epoch = s.epoch;
        s.purges.push((epoch, primary.to_owned()));
        s.save(primary, Vec::new());
    }

    /// Moves every variant of `primary` `ms` milliseconds into the past, as if stored that much earlier.
    pub fn age(&self, primary: &str, ms: u64) {
        let mut s = self.lock();
        let Some(set) = s.sets.get(primary) else {
            return;
        };
        let variants = set
            .variants
            .iter()
            .map(|m| ObjectMeta {
                stored_at_ms: m.stored_at_ms - ms,
                ..m.clone()
            })
            .collect();
        s.save(primary, variants);
    }

    /// The variants of `primary` as stored, bans not applied.
    pub fn variants(&self, primary: &str) -> Vec<ObjectMeta> {
        self.lock()
            .sets
            .get(primary)
            .map_or_else(Vec::new, |s| s.variants.clone())
    }

    /// The set of `primary` as stored (siblings included), bans not applied.
    pub fn set(&self, primary: &str) -> Option<Arc<ObjectSet>> {
        self.lock().sets.get(primary).cloned()
    }

    /// Chunks read so far, as (generation, index), in order; clears the record.
    pub fn take_reads(&self) -> Vec<(u64, u32)> {
        std::mem::take(&mut self.lock().reads)
    }

    /// Drops one chunk of a body, as an eviction or a damaged disk would.
    pub fn lose_chunk(&self, generation: u64, index: u32) {
        self.lock().chunks.remove(&(generation, index));
    }

    /// Chunks held, of every body.
    pub fn chunks(&self) -> usize {
        self.lock().chunks.len()
    }

    /// Bodies made visible by fills.
    pub fn published(&self) -> usize {
        self.lock().published
    }

    /// Fills whose body an invalidation during their fetch kept from being published.
    pub fn publishes_cancelled(&self) -> usize {
        self.lock().publishes_cancelled
    }

    fn read(&self, meta: &ObjectMeta, index: u32) -> Option<Bytes> {
        let mut s = self.lock();
        s.reads.push((meta.generation, index));
        match s.chunks.get(&(meta.generation, index)) {
            Some(data) if data.len() == meta.chunk_len(index) => Some(data.clone()),
            // A body with a hole is never served again.
            _ => {
                s.forget_body(meta.generation);
                None
            }
        }
    }

    fn publish(&self, primary: &str, mut meta: ObjectMeta, epoch: u64) {
        let mut s = self.lock();
        let purged = s.purges.iter().any(|(e, key)| *e > epoch && key == primary);
        if purged || s.banned(primary, &meta) {
            s.forget_body(meta.generation);
            s.publishes_cancelled += 1;
            return;
        }
        meta.ban_checked = s.newest_ban();
        let mut variants: Vec<ObjectMeta> = s
            .sets
            .get(primary)
            .map_or_else(Vec::new, |set| set.variants.clone());
        variants.retain(|v| v.variant != meta.variant);
        variants.insert(0, meta);
        s.save(primary, variants);
        s.published += 1;
    }
}

impl CacheStore for MemoryStore {
    type Writer = MemoryWriter;
    type Partial = MemoryPartial;

    async fn lookup(&self, primary: &str) -> Result<Option<Arc<ObjectSet>>, StoreError> {
        let mut s = self.lock();
        let Some(set) = s.sets.get(primary).cloned() else {
            return Ok(None);
        };
        let newest = s.newest_ban();
        if set.variants.iter().all(|m| m.ban_checked >= newest) {
            return Ok(Some(set));
        }
        let kept: Vec<ObjectMeta> = set
            .variants
            .iter()
            .filter(|m| !s.banned(primary, m))
            .map(|m| ObjectMeta {
                ban_checked: newest,
                ..m.clone()
            })
            .collect();
        s.save(primary, kept);
        Ok(s.sets.get(primary).cloned())
    }

    fn mark(&self) -> InvalidationMark {
        let s = self.lock();
        InvalidationMark {
            ban: s.newest_ban(),
            epoch: s.epoch,
        }
    }

    fn invalidated_after(&self, since: InvalidationMark, primary: &str) -> bool {
        let s = self.lock();
        s.newest_ban() != since.ban
            || s.purges
                .iter()
                .any(|(epoch, key)| *epoch > since.epoch && key == primary)
    }

    fn has_body(&self, meta: &ObjectMeta) -> bool {
        let s = self.lock();
        (0..meta.chunk_count()).all(|i| s.chunks.contains_key(&(meta.generation, i)))
    }

    async fn open_body(&self, meta: &ObjectMeta) -> Result<Option<ChunkRead>, StoreError> {
        if meta.length == 0 {
            return Ok(Some(ChunkRead::empty()));
        }
        if !self.has_body(meta) {
            return Ok(None);
        }
        Ok(self.read(meta, 0).map(|data| ChunkRead {
            data,
            tier: Tier::Memory,
        }))
    }

    /// Reads at once: `take_reads` shows the chunks asked for, in order, as they are asked.
    fn read_chunk(
        &self,
        meta: &ObjectMeta,
        index: u32,
    ) -> impl Future<Output = Result<Option<ChunkRead>, StoreError>> + Send + use<> {
        std::future::ready(Ok(self.read(meta, index).map(|data| ChunkRead {
            data,
            tier: Tier::Memory,
        })))
    }

    fn read_part_chunk(
        &self,
        part: &ObjectMeta,
        index: u32,
        _total: u64,
    ) -> impl Future<Output = Result<Option<ChunkRead>, StoreError>> + Send + use<> {
        self.read_chunk(part, index)
    }

    fn writer(
        &self,
        primary: &str,
        variant: &[(String, String)],
        since: InvalidationMark,
    ) -> Result<MemoryWriter, StoreError> {
        let generation = self.lock().next_id();
        Ok(MemoryWriter {
            store: self.clone(),
            object: Store::object_id(primary, variant),
            generation,
            since,
            buf: BytesMut::new(),
            chunks: 0,
            length: 0,
            finished: false,
            stored: Arc::new(watch::Sender::new((0, false))),
        })
    }

    fn refresh(&self, primary: &str, meta: ObjectMeta) -> Result<bool, StoreError> {
        let mut s = self.lock();
        let Some(set) = s.sets.get(primary) else {
            return Ok(false);
        };
        let mut variants = set.variants.clone();
        let Some(slot) = variants
            .iter_mut()
            .find(|m| m.generation == meta.generation)
        else {
            return Ok(false);
        };
        let ban_checked = slot.ban_checked.max(meta.ban_checked);
        *slot = ObjectMeta {
            ban_checked,
            ..meta
        };
        s.save(primary, variants);
        Ok(true)
    }

    fn invalidate(&self, primary: &str) -> Result<usize, StoreError> {
        let n = self
            .lock()
            .sets
            .get(primary)
            .map_or(0, |set| set.variants.len());
        self.purge(primary);
        Ok(n)
    }

    fn remove_part(&self, primary: &str, of: u64, generation: u64) -> Result<(), StoreError> {
        let mut s = self.lock();
        let Some(set) = s.sets.get(primary) else {
            return Ok(());
        };
        let mut set = (**set).clone();
        if let Some(partial) = set.partials.iter_mut().find(|p| p.of == of) {
            partial.parts.retain(|p| p.body.generation != generation);
        }
        s.sets.insert(primary.to_owned(), Arc::new(set));
        s.forget_body(generation);
        Ok(())
    }

    fn remove_generation(&self, primary: &str, generation: u64) -> Result<(), StoreError> {
        let mut s = self.lock();
        let kept = s.sets.get(primary).map_or_else(Vec::new, |set| {
            set.variants
                .iter()
                .filter(|m| m.generation != generation)
                .cloned()
                .collect()
        });
        s.save(primary, kept);
        Ok(())
    }
}

/// Writes one body into a [`MemoryStore`]; chunks are readable through [`MemoryPartial`] as soon as they
/// are full.
pub struct MemoryWriter {
    store: MemoryStore,
    object: u64,
    generation: u64,
    since: InvalidationMark,
    buf: BytesMut,
    chunks: u32,
    length: u64,
    finished: bool,
    /// Bytes stored as chunks so far, and whether the store refused one; dropped with the writer, which
    /// tells readers no more will come.
    stored: Arc<watch::Sender<(u64, bool)>>,
}

impl MemoryWriter {
    fn store_chunk(&mut self, data: Bytes) {
        let len = data.len() as u64;
        let mut s = self.store.lock();
        if s.disk_full || self.stored.borrow().1 {
            self.stored.send_modify(|(_, refused)| *refused = true);
            return;
        }
        s.chunks.insert((self.generation, self.chunks), data);
        self.chunks += 1;
        self.stored.send_modify(|(stored, _)| *stored += len);
    }

    fn refused(&self) -> Result<(), StoreError> {
        if self.stored.borrow().1 {
            return Err(StoreError::DiskFull);
        }
        Ok(())
    }
}

impl BodyWriter for MemoryWriter {
    type Partial = MemoryPartial;

    fn length(&self) -> u64 {
        self.length
    }

    fn partial_body(&self) -> MemoryPartial {
        MemoryPartial {
            store: self.store.clone(),
            generation: self.generation,
            stored: self.stored.subscribe(),
        }
    }

    async fn push(&mut self, data: &[u8]) -> Result<(), StoreError> {
        drop(self.store.writes.read().await);
        self.refused()?;
        self.length += data.len() as u64;
        self.buf.extend_from_slice(data);
        while self.buf.len() as u64 >= self.store.chunk_size {
            let chunk = self.buf.split_to(self.store.chunk_size as usize).freeze();
            self.store_chunk(chunk);
        }
        Ok(())
    }

    async fn finish(mut self, primary: String, mut meta: ObjectMeta) -> Result<(), StoreError> {
        if !self.buf.is_empty() {
            let rest = self.buf.split().freeze();
            self.store_chunk(rest);
        }
        self.refused()?;
        meta.object = self.object;
        meta.generation = self.generation;
        meta.length = self.length;
        meta.chunk_size = self.store.chunk_size as u32;
        meta.ban_checked = self.since.ban;
        self.finished = true;
        self.store.publish(&primary, meta, self.since.epoch);
        Ok(())
    }

    fn finish_part(
        self,
        primary: String,
        head: ObjectMeta,
        start: u64,
        total: u64,
    ) -> impl Future<Output = Result<PartKept, StoreError>> + Send {
        self.publish_part(primary, head, start, total)
    }

    async fn finish_sibling(
        mut self,
        primary: String,
        of: u64,
        coding: Option<String>,
    ) -> Result<bool, StoreError> {
        if !self.buf.is_empty() {
            let rest = self.buf.split().freeze();
            self.store_chunk(rest);
        }
        self.refused()?;
        self.finished = true;
        let body = (self.object, self.generation);
        let chunk_size = self.store.chunk_size as u32;
        let sibling = Sibling::new(of, coding, body, self.length, chunk_size);
        Ok(self.store.lock().add_sibling(&primary, sibling))
    }
}

impl MemoryWriter {
    /// [`BodyWriter::finish_part`], for the trait.
    async fn publish_part(
        mut self,
        primary: String,
        mut head: ObjectMeta,
        start: u64,
        total: u64,
    ) -> Result<PartKept, StoreError> {
        if !self.buf.is_empty() {
            let rest = self.buf.split().freeze();
            self.store_chunk(rest);
        }
        self.refused()?;
        self.finished = true;
        head.object = self.object;
        let body = (self.object, self.generation);
        let part = Part::new(start, body, self.length, self.store.chunk_size as u32);
        let epoch = self.since.epoch;
        Ok(self
            .store
            .lock()
            .add_part(&primary, head, total, part, epoch))
    }
}

impl Drop for MemoryWriter {
    fn drop(&mut self) {
        if !self.finished {
            self.store.lock().forget_body(self.generation);
        }
    }
}

/// The chunks a [`MemoryWriter`] has stored so far.
#[derive(Clone)]
pub struct MemoryPartial {
    store: MemoryStore,
    generation: u64,
    stored: watch::Receiver<(u64, bool)>,
}

impl PartialRead for MemoryPartial {
    fn chunk_size(&self) -> u64 {
        self.store.chunk_size
    }

    fn stored(&self) -> u64 {
        self.stored.borrow().0
    }

    async fn stored_beyond(&mut self, bytes: u64) -> bool {
        match self
            .stored
            .wait_for(|(stored, refused)| *stored > bytes || *refused)
            .await
        {
            Ok(progress) => progress.0 > bytes,
            Err(_) => false,
        }
    }

    async fn read_chunk(&mut self, index: u32) -> Result<Option<Bytes>, StoreError> {
        let start = u64::from(index) * self.store.chunk_size;
        if !self.stored_beyond(start).await {
            return Ok(None);
        }
        let stored = self.stored();
        let expected = (stored - start).min(self.store.chunk_size) as usize;
        let mut s = self.store.lock();
        s.reads.push((self.generation, index));
        Ok(s.chunks
            .get(&(self.generation, index))
            .filter(|d| d.len() == expected)
            .cloned())
    }
}
