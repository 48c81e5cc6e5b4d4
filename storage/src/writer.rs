use std::{collections::HashSet, sync::Arc};

use bytes::{Bytes, BytesMut};
use tokio::sync::{mpsc, oneshot, watch};

use crate::{
    chunk::ChunkKey,
    error::StoreError,
    meta::{ObjectMeta, Part, Sibling},
    store::{PartKept, Store},
};

pub(crate) enum Job {
    Chunk {
        key: ChunkKey,
        data: Bytes,
        /// How much of the body foyer holds, for readers of the body in progress.
        stored: Arc<watch::Sender<Progress>>,
    },
    Publish {
        primary: String,
        meta: Box<ObjectMeta>,
        epoch: u64,
        done: oneshot::Sender<Result<(), StoreError>>,
    },
    /// A sibling whose chunks are all given to foyer: kept with its variant body, if that is still stored.
    PublishSibling {
        primary: String,
        sibling: Box<Sibling>,
        done: oneshot::Sender<Result<bool, StoreError>>,
    },
    /// A part of a body whose chunks are all given to foyer: kept with the variant body it is a byte range
    /// of (see [`Store::add_part`]).
    PublishPart {
        primary: String,
        head: Box<ObjectMeta>,
        total: u64,
        part: Box<Part>,
        epoch: u64,
        done: oneshot::Sender<Result<PartKept, StoreError>>,
    },
    Discard {
        object: u64,
        generation: u64,
        chunks: u32,
    },
    Drain(oneshot::Sender<()>),
}

/// Writes one body: split into chunks as bytes arrive, published with its metadata once complete.
/// Dropping a writer without [`ObjectWriter::finish`] discards what it wrote.
pub struct ObjectWriter {
    store: Store,
    object: u64,
    generation: u64,
    /// The newest ban when the fetch started: bans after it are tested before publishing.
    ban_checked: u64,
    /// The invalidation epoch when the fetch started.
    epoch: u64,
    buf: BytesMut,
    /// The size of this body's chunks: the store's, or its large one ([`ObjectWriter::expect_length`]).
    chunk_size: usize,
    chunks: u32,
    length: u64,
    finished: bool,
    stored: Arc<watch::Sender<Progress>>,
}

impl ObjectWriter {
    pub(crate) fn new(
        store: Store,
        object: u64,
        generation: u64,
        ban_checked: u64,
        epoch: u64,
    ) -> Self {
        Self {
            chunk_size: store.chunk_size(),
            store,
            object,
            generation,
            ban_checked,
            epoch,
            buf: BytesMut::new(),
            chunks: 0,
            length: 0,
            finished: false,
            stored: Arc::new(watch::Sender::new(Progress::default())),
        }
    }

    /// Body bytes pushed so far, stored or still buffered.
    pub fn length(&self) -> u64 {
        self.length
    }

    /// The body's announced length (its `Content-Length`), told before its first byte: a large body is
    /// split into the store's large chunks
    /// ([`StoreBuilder::with_large_chunk_size`](crate::StoreBuilder::with_large_chunk_size)). Told later,
    /// or not at all, the body keeps the store's chunk size: what is stored, and what its readers were
    /// told, is never cut another way.
    pub fn expect_length(&mut self, length: u64) {
        // No byte taken and no reader of the body in progress (a [`PartialBody`]) made yet.
        if self.length == 0 && self.stored.receiver_count() == 0 {
            self.chunk_size = self.store.chunk_size_for(Some(length));
        }
    }

    /// Read access to the chunks this writer has stored so far, valid while the writer (or the object it
    /// publishes) lives.
    pub fn partial_body(&self) -> PartialBody {
        PartialBody {
            store: self.store.clone(),
            object: self.object,
            generation: self.generation,
            chunk_size: self.chunk_size as u64,
            stored: self.stored.subscribe(),
        }
    }

    /// Appends body bytes. Waits when the disk falls behind, which slows the origin read instead of letting
    /// foyer drop entries.
    /// Refused ([`StoreError::DiskFull`]) once the store has refused a chunk of this body: the fill should
    /// stop storing it rather than hold bytes for a store that will not take them.
    pub async fn push(&mut self, data: &[u8]) -> Result<(), StoreError> {
        if self.stored.borrow().refused {
            return Err(StoreError::DiskFull);
        }
        self.length += data.len() as u64;
        self.buf.extend_from_slice(data);
        let chunk_size = self.chunk_size;
        while self.buf.len() >= chunk_size {
            let chunk = self.buf.split_to(chunk_size).freeze();
            self.send_chunk(chunk).await?;
        }
        Ok(())
    }

    async fn send_chunk(&mut self, data: Bytes) -> Result<(), StoreError> {
        let key = ChunkKey {
            object: self.object,
            generation: self.generation,
            index: self.chunks,
        };
        self.chunks += 1;
        self.store
            .submit(Job::Chunk {
                key,
                data,
                stored: self.stored.clone(),
            })
            .await
    }

    /// Writes the last chunk and publishes the object. `meta` supplies the response's description; identity,
    /// length and chunk layout are filled in here. Returns once the object is visible to lookups.
    pub async fn finish(mut self, primary: String, mut meta: ObjectMeta) -> Result<(), StoreError> {
        if !self.buf.is_empty() {
            let rest = self.buf.split().freeze();
            self.send_chunk(rest).await?;
        }
        meta.object = self.object;
        meta.generation = self.generation;
        meta.length = self.length;
        meta.chunk_size = self.chunk_size as u32;
        meta.ban_checked = self.ban_checked;
        let (done, wait) = oneshot::channel();
        self.finished = true;
        self.store
            .submit(Job::Publish {
                primary,
                meta: Box::new(meta),
                epoch: self.epoch,
                done,
            })
            .await?;
        wait.await.map_err(|_| StoreError::Closed)?
    }

    /// Writes the last chunk and keeps the body as the sibling of variant body `of` of `primary` in
    /// `coding` (`None`: identity): another representation of that body, made from it. `Ok(false)` when
    /// that body is no longer stored (the sibling is then discarded).
    pub async fn finish_sibling(
        mut self,
        primary: String,
        of: u64,
        coding: Option<String>,
    ) -> Result<bool, StoreError> {
        if !self.buf.is_empty() {
            let rest = self.buf.split().freeze();
            self.send_chunk(rest).await?;
        }
        let body = (self.object, self.generation);
        let chunk_size = self.chunk_size as u32;
        let sibling = Sibling::new(of, coding, body, self.length, chunk_size);
        let (done, wait) = oneshot::channel();
        self.finished = true;
        self.store
            .submit(Job::PublishSibling {
                primary,
                sibling: Box::new(sibling),
                done,
            })
            .await?;
        wait.await.map_err(|_| StoreError::Closed)?
    }
}

impl ObjectWriter {
    /// Writes the last chunk and keeps the body as bytes `start..` of a representation `total` bytes
    /// long (a 206's body), part of the variant body of `primary` that `head` describes (its status, headers
    /// and freshness, as for [`ObjectWriter::finish`]; its variant selection chooses the body). The part joins
    /// the parts stored of the same representation, or starts a new variant body that replaces the one
    /// stored before ([`PartKept`]).
    pub async fn finish_part(
        mut self,
        primary: String,
        mut head: ObjectMeta,
        start: u64,
        total: u64,
    ) -> Result<PartKept, StoreError> {
        if !self.buf.is_empty() {
            let rest = self.buf.split().freeze();
            self.send_chunk(rest).await?;
        }
        let chunk_size = self.chunk_size as u32;
        let body = (self.object, self.generation);
        let part = Part::new(start, body, self.length, chunk_size);
        head.object = self.object;
        head.ban_checked = self.ban_checked;
        let (done, wait) = oneshot::channel();
        self.finished = true;
        self.store
            .submit(Job::PublishPart {
                primary,
                head: Box::new(head),
                total,
                part: Box::new(part),
                epoch: self.epoch,
                done,
            })
            .await?;
        wait.await.map_err(|_| StoreError::Closed)?
    }
}

impl Drop for ObjectWriter {
    fn drop(&mut self) {
        if !self.finished && self.chunks > 0 {
            let job = Job::Discard {
                object: self.object,
                generation: self.generation,
                chunks: self.chunks,
            };
            self.store.submit_detached(job);
        }
    }
}

/// How much of a body in progress the store holds.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Progress {
    /// Bytes of the body foyer holds, from its start.
    bytes: u64,
    /// The store refused a chunk (a full disk): no further chunk of the body will be stored; the chunks
    /// before it stay readable.
    refused: bool,
}

/// The chunks of a body still being written, for readers that fell behind what the fetch keeps in memory.
#[derive(Clone)]
pub struct PartialBody {
    store: Store,
    object: u64,
    generation: u64,
    chunk_size: u64,
    stored: watch::Receiver<Progress>,
}

impl PartialBody {
    /// Bytes of the body the store holds now, from its start.
    pub fn stored(&self) -> u64 {
        self.stored.borrow().bytes
    }

    /// Waits until the store holds more than `bytes` of the body (`true`), or will hold no more of it: it
    /// refused a chunk, or the writer is gone (`false`).
    pub async fn stored_beyond(&mut self, bytes: u64) -> bool {
        match self.stored.wait_for(|p| p.bytes > bytes || p.refused).await {
            Ok(p) => p.bytes > bytes,
            Err(_) => false,
        }
    }

    /// The body's chunk size: chunk `n` starts at byte `n × chunk_size`.
    pub fn chunk_size(&self) -> u64 {
        self.chunk_size
    }

    /// Chunk `index`, once the writer task has stored it; `None` when it never will be (the writer was
    /// dropped first) or foyer no longer holds it.
    pub async fn read_chunk(&mut self, index: u32) -> Result<Option<Bytes>, StoreError> {
        let chunk_size = self.chunk_size;
        let start = u64::from(index) * chunk_size;
        if !self.stored_beyond(start).await {
            return Ok(None);
        }
        let stored = self.stored();
        let expected = (stored - start).min(chunk_size) as usize;
        let key = ChunkKey {
            object: self.object,
            generation: self.generation,
            index,
        };
        Ok(self
            .store
            .read_key(key, expected)
            .await?
            .map(|read| read.data))
    }
}

/// The single task that inserts chunks into foyer. It asks foyer to finish its disk writes (`wait`) whenever
/// `budget` bytes were inserted since the last time, so foyer's flush queue never overflows, and in the
/// background whenever it has nothing else to do; objects published before a completed wait are counted
/// durable. The background wait (a sync of the disk, seconds on a busy one) holds up no publication: an
/// object is served from when its body is in, not from when it is durable.
///
/// Before each chunk it asks the disk guard whether there is room: when there is not, the chunk is not given
/// to foyer (whose flusher panics on ENOSPC) and the body it belongs to is spoiled: it is not published.
pub(crate) async fn run(store: Store, mut rx: mpsc::Receiver<Job>, budget: usize) {
    // Bodies that lost a chunk to a full disk, by (object, generation); each leaves with its publish or
    // discard, so the set holds at most the fills in flight.
    let mut spoiled: HashSet<(u64, u64)> = HashSet::new();
    let mut written = Written::default();
    let mut settling: Option<Settling> = None;
    let mut closing = None;
    loop {
        let job = if let Some(background) = settling.as_mut() {
            tokio::select! {
                biased;
                settled = &mut background.task => {
                    written.settled(background.covers, settled.unwrap_or(false));
                    settling = None;
                    continue;
                }
                job = rx.recv() => match job {
                    Some(job) => job,
                    None => break,
                },
            }
        } else if written.pending() {
            match rx.try_recv() {
                Ok(job) => job,
                Err(mpsc::error::TryRecvError::Empty) => {
                    settling = Some(Settling::start(&store, written));
                    continue;
                }
                Err(mpsc::error::TryRecvError::Disconnected) => break,
            }
        } else {
            match rx.recv().await {
                Some(job) => job,
                None => break,
            }
        };
        match job {
            Job::Chunk { key, data, stored } => {
                let body = (key.object, key.generation);
                if spoiled.contains(&body) {
                    continue;
                }
                if !store.disk_has_room() {
                    spoiled.insert(body);
                    store.counters().fills_refused.add(1);
                    // Readers of the body in progress stop waiting for chunks that will not come.
                    stored.send_modify(|p| p.refused = true);
                    continue;
                }
                let len = data.len() as u64;
                written.unflushed += data.len();
                store.counters().chunks_written.add(1);
                store.counters().chunk_bytes_written.add(len);
                store.insert_chunk(key, data);
                stored.send_modify(|p| p.bytes += len);
                if written.unflushed >= budget {
                    settle(&store, &mut settling, &mut written).await;
                }
            }
            Job::Publish {
                primary,
                mut meta,
                epoch,
                done,
            } => {
                if spoiled.remove(&(meta.object, meta.generation)) {
                    store.forget_body(&meta);
                    let _ = done.send(Err(StoreError::DiskFull));
                    continue;
                }
                meta.stored_at_ms = meta.stored_at_ms.min(lacquer_clock::now_ms());
                let result = store.publish(&primary, *meta, epoch);
                if result.is_ok() {
                    written.undurable += 1;
                }
                let _ = done.send(result);
            }
            Job::PublishSibling {
                primary,
                sibling,
                done,
            } => {
                if spoiled.remove(&(sibling.body.object, sibling.body.generation)) {
                    store.forget_body(&sibling.body);
                    let _ = done.send(Err(StoreError::DiskFull));
                    continue;
                }
                // Made durable with the next wait (its chunks count as unflushed); not counted in
                // `objects_durable`, which counts fetched objects.
                let _ = done.send(store.add_sibling(&primary, *sibling));
            }
            Job::PublishPart {
                primary,
                head,
                total,
                part,
                epoch,
                done,
            } => {
                if spoiled.remove(&(part.body.object, part.body.generation)) {
                    store.forget_body(&part.body);
                    let _ = done.send(Err(StoreError::DiskFull));
                    continue;
                }
                let result = store.add_part(&primary, *head, total, *part, epoch);
                if matches!(result, Ok(PartKept::Started | PartKept::Added)) {
                    written.undurable += 1;
                }
                let _ = done.send(result);
            }
            Job::Discard {
                object,
                generation,
                chunks,
            } => {
                spoiled.remove(&(object, generation));
                store.discard_chunks(object, generation, chunks);
            }
            Job::Drain(done) => {
                settle(&store, &mut settling, &mut written).await;
                if store.is_closed() {
                    closing = Some(done);
                    break;
                }
                let _ = done.send(());
            }
        }
    }
    // Acknowledge the close only once neither this task nor its background wait holds the store, so the
    // caller can reopen it.
    if let Some(background) = settling.take() {
        let _ = background.task.await;
    }
    drop(store);
    if let Some(done) = closing {
        let _ = done.send(());
    }
}

/// What the writer task inserted and published since foyer's last completed wait.
#[derive(Debug, Default, Clone, Copy)]
struct Written {
    /// Chunk bytes inserted.
    unflushed: usize,
    /// Objects published, not yet counted durable.
    undurable: u64,
}

impl Written {
    fn pending(&self) -> bool {
        self.unflushed > 0 || self.undurable > 0
    }

    /// A wait that covered `covered` ended; what was written while it ran is still pending, and so is all
    /// of it when the wait failed.
    fn settled(&mut self, covered: Written, succeeded: bool) {
        if succeeded {
            self.unflushed = self.unflushed.saturating_sub(covered.unflushed);
            self.undurable = self.undurable.saturating_sub(covered.undurable);
        }
    }
}

/// A wait for foyer's disk writes and sled's flush running beside the writer task.
struct Settling {
    task: tokio::task::JoinHandle<bool>,
    /// What was written when it started: what it makes durable.
    covers: Written,
}

impl Settling {
    fn start(store: &Store, covers: Written) -> Self {
        let store = store.clone();
        Self {
            task: tokio::spawn(async move { store.settle_writes(covers.undurable).await }),
            covers,
        }
    }
}

/// Makes everything written so far durable (see [`Store::settle_writes`]) before the writer task goes on:
/// the wait in the background, if any, then one for the rest.
async fn settle(store: &Store, settling: &mut Option<Settling>, written: &mut Written) {
    if let Some(background) = settling.take() {
        let settled = background.task.await.unwrap_or(false);
        written.settled(background.covers, settled);
    }
    if written.pending() {
        let covers = *written;
        let settled = store.settle_writes(covers.undurable).await;
        written.settled(covers, settled);
    }
}
