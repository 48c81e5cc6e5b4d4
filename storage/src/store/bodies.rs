//! Body chunks in foyer: proving a body whole before a response starts, reading it chunk by chunk, and
//! forgetting a body whose metadata is gone or that lost a chunk. A body with a hole is never served: it
//! becomes a miss.

use bytes::Bytes;
use foyer::Source;

use crate::{chunk::ChunkKey, error::StoreError, meta::ObjectMeta, writer::Job};

use super::Store;

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
    /// lookup per chunk, as before.
    pub async fn open_body(&self, meta: &ObjectMeta) -> Result<Option<ChunkRead>, StoreError> {
        if meta.length == 0 {
            return Ok(Some(ChunkRead::empty()));
        }
        if !self.has_body(meta) {
            return Ok(None);
        }
        let Some(first) = self.read_chunk(meta, 0).await? else {
            return Ok(None);
        };
        let ahead = (VERIFY_AHEAD / u64::from(meta.chunk_size.max(1))).max(1) as u32;
        for index in 1..meta.chunk_count().min(ahead) {
            let key = meta.chunk_key(index);
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
        let key = meta.chunk_key(index);
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
            self.counters().chunks_missing.add(1);
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
            self.counters().chunks_missing.add(1);
            return Ok(None);
        }
        let tier = match entry.source() {
            Source::Disk => {
                self.counters().chunk_reads_disk.add(1);
                Tier::Disk
            }
            Source::Memory | Source::Outer => {
                self.counters().chunk_reads_memory.add(1);
                Tier::Memory
            }
        };
        Ok(Some(ChunkRead { data, tier }))
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
