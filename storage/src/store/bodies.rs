//! Body chunks in foyer: proving a body whole before a response starts, reading it chunk by chunk, and
//! forgetting a body whose metadata is gone or that lost a chunk. A body with a hole is never served: it
//! becomes a miss.

use std::future::Future;

use bytes::Bytes;
use foyer::{ErrorKind, HybridGet, Source};

use crate::{chunk::ChunkKey, error::StoreError, meta::ObjectMeta, writer::Job};

use super::{
    disk_reads::{Joined, SharedRead},
    Store,
};

/// Which tier served a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The memory tier (or a chunk just read from disk into it by the same request).
    Memory,
    /// The disk tier: the read went to the device.
    Disk,
}

/// How many of a body's chunks each tier holds (a chunk in both counts in both).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChunkTiers {
    /// Chunks the body is stored in.
    pub chunks: u32,
    /// Chunks the memory tier holds.
    pub in_memory: u32,
    /// Chunks the disk tier's index holds (an index hit can still fail to read).
    pub on_disk: u32,
}

/// One chunk read from the store.
#[derive(Debug, Clone)]
pub struct ChunkRead {
    /// The chunk's bytes: exactly the length the metadata promised.
    pub data: Bytes,
    /// Where it came from (hits are counted by tier).
    pub tier: Tier,
}

impl ChunkRead {
    /// The whole of an empty body: nothing to read, from anywhere.
    pub fn empty() -> Self {
        Self {
            data: Bytes::new(),
            tier: Tier::Memory,
        }
    }
}

/// How much of a body [`Store::open_body`] proves readable before the response starts: enough to cover
/// most objects whole, small enough that a disk hit's first byte waits for a few reads at most.
pub const VERIFY_AHEAD: u64 = 1 << 20;

/// The chunks of `meta`'s body that lie in its first [`VERIFY_AHEAD`] bytes (at least one).
fn verified_chunks(meta: &ObjectMeta) -> u32 {
    (VERIFY_AHEAD / u64::from(meta.chunk_size.max(1))).max(1) as u32
}

/// A chunk read [`Store::read_chunk`] has started.
enum Started {
    /// Through the memory tier: a memory hit, or foyer's own disk read, which brings the chunk to memory.
    Promoted(HybridGet<ChunkKey, Bytes>),
    /// Found in the memory tier.
    Memory(Bytes),
    /// A disk-tier read past the memory tier, on the store's runtime, shared with the other readers of the
    /// chunk ([`DiskReads`]).
    Disk(SharedRead),
}

impl Started {
    /// The chunk's bytes and where they came from; `None` when foyer holds no such chunk.
    async fn finish(self) -> foyer::Result<Option<(Bytes, Tier)>> {
        match self {
            Started::Promoted(get) => Ok(get
                .await?
                .map(|entry| (entry.value().clone(), tier_of(entry.source())))),
            Started::Memory(data) => Ok(Some((data, Tier::Memory))),
            Started::Disk(read) => read.await.map_err(|e| {
                foyer::Error::new(ErrorKind::External, "disk read failed").with_source(e)
            }),
        }
    }
}

fn tier_of(source: Source) -> Tier {
    match source {
        Source::Disk => Tier::Disk,
        Source::Memory | Source::Outer => Tier::Memory,
    }
}

impl Store {
    /// Whether every chunk of the body is still held by memory or disk: checked before a response is started,
    /// so that a body lost to eviction or a crash becomes a miss instead of a truncated response.
    pub fn has_body(&self, meta: &ObjectMeta) -> bool {
        (0..meta.chunk_count()).all(|index| self.inner.chunks.contains(&meta.chunk_key(index)))
    }

    /// Proves a stored body can be served before its status line is sent, and returns its chunk 0: every
    /// chunk must be present (memory, or the disk tier's index), and the chunks in the first
    /// [`VERIFY_AHEAD`] bytes that are only on disk are read, which checks them and brings them to memory
    /// for the response. `None` when the body cannot be served whole; it is then forgotten, so the request
    /// (and every later one) is a plain miss instead of a truncated response. A body in memory costs one
    /// lookup per chunk, and a body of one chunk one lookup in all.
    pub async fn open_body(&self, meta: &ObjectMeta) -> Result<Option<ChunkRead>, StoreError> {
        if meta.length == 0 {
            return Ok(Some(ChunkRead::empty()));
        }
        // Most objects are one chunk: reading it is the proof, one foyer lookup instead of two.
        if meta.chunk_count() == 1 {
            return self.read_through(meta, 0).await;
        }
        if !self.has_body(meta) {
            return Ok(None);
        }
        let Some(first) = self.read_through(meta, 0).await? else {
            return Ok(None);
        };
        for index in 1..meta.chunk_count().min(verified_chunks(meta)) {
            let key = meta.chunk_key(index);
            if self.inner.chunks.memory().contains(&key) {
                continue;
            }
            if self.read_through(meta, index).await?.is_none() {
                return Ok(None);
            }
        }
        Ok(Some(first))
    }

    /// Starts reading chunk `index` of a body and returns what waits for it: the read runs from this call
    /// on, not from the first poll (a disk read on the store's runtime), so a response can ask for the
    /// next chunks while it sends one. Dropping the future abandons the read. `None` when the chunk is gone
    /// or not the length the metadata promised (the whole body is then forgotten: a body with a hole is
    /// never served again).
    ///
    /// A chunk only on disk enters the memory tier on its way out, unless it lies past the first
    /// [`VERIFY_AHEAD`] bytes of a body larger than a sixteenth of the memory tier: a one-time read of a
    /// large body then streams from the disk tier without pushing the hot set out of memory (its first
    /// MiB, which [`Store::open_body`] reads, is kept for the next first byte).
    pub fn read_chunk(
        &self,
        meta: &ObjectMeta,
        index: u32,
    ) -> impl Future<Output = Result<Option<ChunkRead>, StoreError>> + Send + 'static {
        let promote = index < verified_chunks(meta) || self.fits_memory(meta.length);
        self.read_chunk_promoting(meta, index, promote)
    }

    /// [`Store::read_chunk`] of a part of a body stored in parts ([`crate::Partial`]) `total` bytes long:
    /// whether a chunk read from disk enters the memory tier is decided by the whole object's size, as it
    /// is for a body stored whole, not by the part's.
    pub fn read_part_chunk(
        &self,
        part: &ObjectMeta,
        index: u32,
        total: u64,
    ) -> impl Future<Output = Result<Option<ChunkRead>, StoreError>> + Send + 'static {
        let promote = self.fits_memory(total);
        self.read_chunk_promoting(part, index, promote)
    }

    /// Whether a body of `length` bytes is small enough for the memory tier to take on a read from disk.
    fn fits_memory(&self, length: u64) -> bool {
        length <= self.inner.config.memory_bytes as u64 / 16
    }

    fn read_chunk_promoting(
        &self,
        meta: &ObjectMeta,
        index: u32,
        promote: bool,
    ) -> impl Future<Output = Result<Option<ChunkRead>, StoreError>> + Send + 'static {
        let key = meta.chunk_key(index);
        // The memory tier first: a hybrid get costs an allocation, a clock read and a histogram even when
        // memory has the chunk.
        let started = if let Some(entry) = self.inner.chunks.memory().get(&key) {
            Started::Memory(entry.value().clone())
        } else if promote {
            Started::Promoted(self.inner.chunks.get(&key))
        } else {
            let disk = self.inner.chunks.storage();
            let load = || {
                let disk = disk.clone();
                async move { disk.load(&key).await }
            };
            match self.inner.disk_reads.read(key, load, &self.inner.runtime) {
                Joined::Recent(data) => {
                    self.counters().disk_reads_shared.add(1);
                    Started::Memory(data)
                }
                Joined::Read { read, shared } => {
                    if shared {
                        self.counters().disk_reads_shared.add(1);
                    }
                    Started::Disk(read)
                }
            }
        };
        let store = self.clone();
        let (expected, chunks) = (meta.chunk_len(index), meta.chunk_count());
        async move {
            let found = started.finish().await;
            let read = found
                .map_err(StoreError::from)
                .map(|found| store.checked(key, expected, found));
            if !matches!(read, Ok(Some(_))) {
                store.discard_chunks(key.object, key.generation, chunks);
            }
            read
        }
    }

    /// [`Store::read_chunk`] through the memory tier, borrowed: what [`Store::open_body`] uses, so that a
    /// hit's first chunk costs no more than a lookup.
    async fn read_through(
        &self,
        meta: &ObjectMeta,
        index: u32,
    ) -> Result<Option<ChunkRead>, StoreError> {
        let read = self
            .read_key(meta.chunk_key(index), meta.chunk_len(index))
            .await;
        if !matches!(read, Ok(Some(_))) {
            self.forget_body(meta);
        }
        read
    }

    /// Reads one chunk of `expected_len` bytes through the memory tier; `None` when foyer holds none, or
    /// one of another length.
    pub(crate) async fn read_key(
        &self,
        key: ChunkKey,
        expected_len: usize,
    ) -> Result<Option<ChunkRead>, StoreError> {
        let found = match self.inner.chunks.memory().get(&key) {
            // What a hit finds nearly always: the memory tier, without the hybrid get's bookkeeping.
            Some(entry) => Some((entry.value().clone(), Tier::Memory)),
            None => self
                .inner
                .chunks
                .get(&key)
                .await?
                .map(|entry| (entry.value().clone(), tier_of(entry.source()))),
        };
        Ok(self.checked(key, expected_len, found))
    }

    /// A chunk foyer returned, if it is the length expected; counts the read by tier, or as missing.
    fn checked(
        &self,
        key: ChunkKey,
        expected_len: usize,
        found: Option<(Bytes, Tier)>,
    ) -> Option<ChunkRead> {
        let Some((data, tier)) = found else {
            self.counters().chunks_missing.add(1);
            return None;
        };
        if data.len() != expected_len {
            tracing::warn!(
                object = key.object,
                generation = key.generation,
                index = key.index,
                "chunk has the wrong length"
            );
            self.counters().chunks_missing.add(1);
            return None;
        }
        match tier {
            Tier::Disk => self.counters().chunk_reads_disk.add(1),
            Tier::Memory => self.counters().chunk_reads_memory.add(1),
        }
        Some(ChunkRead { data, tier })
    }

    /// Hands the removal of a body's chunks to the writer task: callers such as the low-priority lurker
    /// should not hold foyer's shard locks, which hits need, where the scheduler may pause them. The
    /// metadata is already gone, so nothing can read the chunks meanwhile. Removed at once when the queue
    /// is full.
    pub(super) fn forget_body_later(&self, meta: &ObjectMeta) {
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
        self.discard_chunks(meta.object, meta.generation, meta.chunk_count());
    }

    /// Where the chunks of a body are, for operators (`GET /v1/objects`): reads nothing.
    pub(super) fn chunk_tiers(&self, meta: &ObjectMeta) -> ChunkTiers {
        let mut tiers = ChunkTiers {
            chunks: meta.chunk_count(),
            ..ChunkTiers::default()
        };
        for index in 0..meta.chunk_count() {
            let key = meta.chunk_key(index);
            tiers.in_memory += u32::from(self.inner.chunks.memory().contains(&key));
            tiers.on_disk += u32::from(self.inner.chunks.storage().may_contains(&key));
        }
        tiers
    }

    /// Gives a chunk to foyer (memory now, disk when its flushers get to it). Only the writer task calls
    /// this, after asking [`Store::disk_has_room`]: foyer panics when a disk write meets ENOSPC.
    pub(crate) fn insert_chunk(&self, key: ChunkKey, data: Bytes) {
        self.inner.chunks.insert(key, data);
    }

    /// Removes the first `chunks` chunks of a body from both tiers (chunks never written are no-ops).
    pub(crate) fn discard_chunks(&self, object: u64, generation: u64, chunks: u32) {
        for index in 0..chunks {
            self.inner.chunks.remove(&ChunkKey {
                object,
                generation,
                index,
            });
        }
    }
}
