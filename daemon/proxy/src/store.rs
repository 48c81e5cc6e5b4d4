//! What the data path needs from the store, as a seam: looking an object set up, proving a body readable
//! and reading its chunks, writing a new body while readers follow it, refreshing or removing a stored body,
//! and the invalidation mark a fetch starts from.
//!
//! The data path is generic over [`CacheStore`] rather than holding a trait object: a hit reads every chunk
//! through [`CacheStore::read_chunk`], and an `async` method of a trait object returns a boxed future, one
//! allocation per chunk. Generic code is compiled for [`lacquer_storage::Store`] alone in `lacquerd`, so the
//! hit path is the same machine code as when it called the store directly; the unit tests compile it again
//! for an in-memory store. Invalidations an operator asks for (`PURGE`, `BAN`, the admin API) are not part of
//! the seam: they are the store's own API, and only their effect on lookups and fills is the data path's
//! business.

use std::{future::Future, sync::Arc};

use bytes::Bytes;
use lacquer_storage::{
    ChunkRead, InvalidationMark, ObjectMeta, ObjectSet, ObjectWriter, PartKept, PartialBody, Store,
    StoreError,
};

/// A store the data path can serve from and fill. The contract the data path relies on:
/// - a body is published by [`BodyWriter::finish`] only if no ban or purge that came after the writer's
///   `since` mark covers it: a fill never makes visible what an invalidation during its fetch removed;
/// - [`CacheStore::lookup`] never returns a variant a ban covers;
/// - chunks are `chunk_size` bytes but the last, and a generation's chunks never change: a reader holding
///   an old [`ObjectMeta`] reads that body or nothing.
pub trait CacheStore: Clone + Send + Sync + 'static {
    /// Writes one new body; see [`BodyWriter`].
    type Writer: BodyWriter<Partial = Self::Partial>;
    /// The part of a body in progress that its writer has stored; see [`PartialRead`].
    type Partial: PartialRead;

    /// Every stored variant of the cache key `primary` that no ban covers, newest first. Never blocks the
    /// calling thread on a disk read.
    fn lookup(
        &self,
        primary: &str,
    ) -> impl Future<Output = Result<Option<Arc<ObjectSet>>, StoreError>> + Send;

    /// Where the invalidation history stands now: taken when a fetch starts, so that what it brings is
    /// tested against the bans and purges that came later before it is stored.
    fn mark(&self) -> InvalidationMark;

    /// Whether a ban, or a purge that may cover `primary`, came after `since`: a fetch of `primary` that
    /// started then is joined by nobody after.
    fn invalidated_after(&self, since: InvalidationMark, primary: &str) -> bool;

    /// Whether every chunk of the body is still held: a revalidation confirms only a body that is there.
    fn has_body(&self, meta: &ObjectMeta) -> bool;

    /// Proves the body can be served whole before a status line goes out, and returns chunk 0; `None`
    /// when it cannot (the caller then treats the request as a miss).
    fn open_body(
        &self,
        meta: &ObjectMeta,
    ) -> impl Future<Output = Result<Option<ChunkRead>, StoreError>> + Send;

    /// Chunk `index` of a stored body; `None` when it is gone (the body is then never served again). The
    /// read starts with this call, not at the first poll, and the future borrows nothing: a response asks
    /// for the next chunks while it sends one. Dropping the future abandons the read.
    fn read_chunk(
        &self,
        meta: &ObjectMeta,
        index: u32,
    ) -> impl Future<Output = Result<Option<ChunkRead>, StoreError>> + Send + use<Self>;

    /// [`CacheStore::read_chunk`] of a part of a body stored in parts, `total` bytes long in all: a large
    /// object's parts stream from the disk tier as a large body does.
    fn read_part_chunk(
        &self,
        part: &ObjectMeta,
        index: u32,
        total: u64,
    ) -> impl Future<Output = Result<Option<ChunkRead>, StoreError>> + Send + use<Self>;

    /// Starts writing a new body for `primary` and its variant selection, fetched since `since`. An error
    /// for which [`StoreError::is_refusal`] holds was logged and counted by the store already.
    fn writer(
        &self,
        primary: &str,
        variant: &[(String, String)],
        since: InvalidationMark,
    ) -> Result<Self::Writer, StoreError>;

    /// Replaces the metadata of a stored body (same generation, same chunks), as after a 304; `false`
    /// when that body is no longer stored.
    fn refresh(&self, primary: &str, meta: ObjectMeta) -> Result<bool, StoreError>;

    /// Removes every variant of `primary`, and keeps fetches for it that started before from storing what
    /// they bring (RFC 9111 §4.4: what an unsafe method changed must not come back from a fetch made before
    /// it); returns how many variants there were.
    fn invalidate(&self, primary: &str) -> Result<usize, StoreError>;

    /// Removes one stored body if it is still the current one (a body found lost, or no longer storable).
    fn remove_generation(&self, primary: &str, generation: u64) -> Result<(), StoreError>;

    /// Forgets the part stored as `generation` of the variant body `of` (a part found to have lost a
    /// chunk); the variant stays.
    fn remove_part(&self, primary: &str, of: u64, generation: u64) -> Result<(), StoreError>;
}

/// Writes one body chunk by chunk as it arrives; dropping it without [`BodyWriter::finish`] discards what
/// it wrote.
pub trait BodyWriter: Send + Sync + 'static {
    /// Read access to what this writer has stored so far.
    type Partial;

    /// Bytes pushed so far.
    fn length(&self) -> u64;

    /// The body's announced length, told before its first byte and before [`BodyWriter::partial_body`]: the
    /// store may choose how to cut it from it. Default: nothing.
    fn expect_length(&mut self, _length: u64) {}

    /// Read access to the chunks stored so far, for readers that fell behind what a fetch keeps in memory.
    fn partial_body(&self) -> Self::Partial;

    /// Appends body bytes; may wait for the store, which slows the origin read.
    fn push(&mut self, data: &[u8]) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Stores the last chunk and publishes the body under `primary` with `meta` (identity, length and
    /// chunk layout are filled in by the writer), unless an invalidation since the writer's mark covers it.
    fn finish(
        self,
        primary: String,
        meta: ObjectMeta,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Stores the last chunk and keeps the body as bytes `start..` of a representation `total` bytes long,
    /// part of the variant body of `primary` that `head` describes: joined to the parts stored of the same
    /// representation, or the first part of a new variant body (see [`PartKept`]).
    fn finish_part(
        self,
        primary: String,
        head: ObjectMeta,
        start: u64,
        total: u64,
    ) -> impl Future<Output = Result<PartKept, StoreError>> + Send;

    /// Stores the last chunk and keeps the body as a sibling of the variant body `of` of `primary`: its
    /// representation in `coding` (`None`: identity), made from it. `Ok(false)` (and the body discarded)
    /// when that variant body is no longer stored.
    fn finish_sibling(
        self,
        primary: String,
        of: u64,
        coding: Option<String>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// The chunks of a body still being written.
pub trait PartialRead: Clone + Send + Sync + 'static {
    /// Bytes per chunk.
    fn chunk_size(&self) -> u64;

    /// Bytes of the body the store holds now, from its start: what a reader can read back.
    fn stored(&self) -> u64;

    /// Waits until the store holds more than `bytes` of the body (`true`), or will hold no more of it: the
    /// store refused it or the writer is gone (`false`).
    fn stored_beyond(&mut self, bytes: u64) -> impl Future<Output = bool> + Send;

    /// Chunk `index` once it is stored; `None` when it never will be (the writer stopped) or is gone.
    fn read_chunk(
        &mut self,
        index: u32,
    ) -> impl Future<Output = Result<Option<Bytes>, StoreError>> + Send;
}

impl CacheStore for Store {
    type Writer = ObjectWriter;
    type Partial = PartialBody;

    fn lookup(
        &self,
        primary: &str,
    ) -> impl Future<Output = Result<Option<Arc<ObjectSet>>, StoreError>> + Send {
        Store::lookup_off_thread(self, primary)
    }

    fn mark(&self) -> InvalidationMark {
        Store::mark(self)
    }

    fn invalidated_after(&self, since: InvalidationMark, primary: &str) -> bool {
        Store::invalidated_after(self, since, primary)
    }

    fn has_body(&self, meta: &ObjectMeta) -> bool {
        Store::has_body(self, meta)
    }

    fn open_body(
        &self,
        meta: &ObjectMeta,
    ) -> impl Future<Output = Result<Option<ChunkRead>, StoreError>> + Send {
        Store::open_body(self, meta)
    }

    fn read_chunk(
        &self,
        meta: &ObjectMeta,
        index: u32,
    ) -> impl Future<Output = Result<Option<ChunkRead>, StoreError>> + Send + use<> {
        Store::read_chunk(self, meta, index)
    }

    fn read_part_chunk(
        &self,
        part: &ObjectMeta,
        index: u32,
        total: u64,
    ) -> impl Future<Output = Result<Option<ChunkRead>, StoreError>> + Send + use<> {
        Store::read_part_chunk(self, part, index, total)
    }

    fn writer(
        &self,
        primary: &str,
        variant: &[(String, String)],
        since: InvalidationMark,
    ) -> Result<ObjectWriter, StoreError> {
        Store::writer(self, primary, variant, since)
    }

    fn refresh(&self, primary: &str, meta: ObjectMeta) -> Result<bool, StoreError> {
        Store::refresh(self, primary, meta)
    }

    fn invalidate(&self, primary: &str) -> Result<usize, StoreError> {
        Store::invalidate_key(self, primary)
    }

    fn remove_generation(&self, primary: &str, generation: u64) -> Result<(), StoreError> {
        Store::remove_generation(self, primary, generation)
    }

    fn remove_part(&self, primary: &str, of: u64, generation: u64) -> Result<(), StoreError> {
        Store::remove_part(self, primary, of, generation)
    }
}

impl BodyWriter for ObjectWriter {
    type Partial = PartialBody;

    fn length(&self) -> u64 {
        ObjectWriter::length(self)
    }

    fn expect_length(&mut self, length: u64) {
        ObjectWriter::expect_length(self, length);
    }

    fn partial_body(&self) -> PartialBody {
        ObjectWriter::partial_body(self)
    }

    fn push(&mut self, data: &[u8]) -> impl Future<Output = Result<(), StoreError>> + Send {
        ObjectWriter::push(self, data)
    }

    fn finish(
        self,
        primary: String,
        meta: ObjectMeta,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        ObjectWriter::finish(self, primary, meta)
    }

    fn finish_part(
        self,
        primary: String,
        head: ObjectMeta,
        start: u64,
        total: u64,
    ) -> impl Future<Output = Result<PartKept, StoreError>> + Send {
        ObjectWriter::finish_part(self, primary, head, start, total)
    }

    fn finish_sibling(
        self,
        primary: String,
        of: u64,
        coding: Option<String>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        ObjectWriter::finish_sibling(self, primary, of, coding)
    }
}

impl PartialRead for PartialBody {
    fn chunk_size(&self) -> u64 {
        PartialBody::chunk_size(self)
    }

    fn stored(&self) -> u64 {
        PartialBody::stored(self)
    }

    fn stored_beyond(&mut self, bytes: u64) -> impl Future<Output = bool> + Send {
        PartialBody::stored_beyond(self, bytes)
    }

    fn read_chunk(
        &mut self,
        index: u32,
    ) -> impl Future<Output = Result<Option<Bytes>, StoreError>> + Send {
        PartialBody::read_chunk(self, index)
    }
}

/// A stored variant selected for a request.
#[derive(Clone)]
pub struct Found {
    pub(crate) set: Arc<ObjectSet>,
    pub(crate) index: usize,
}

impl Found {
    /// The variant's metadata, as stored when it was looked up.
    pub fn meta(&self) -> &ObjectMeta {
        &self.set.variants[self.index]
    }

    /// Whether a fill can ask the origin to confirm it instead of sending the body again.
    pub(crate) fn revalidatable(&self) -> bool {
        let meta = self.meta();
        meta.header("etag").is_some() || meta.header("last-modified").is_some()
    }
}
