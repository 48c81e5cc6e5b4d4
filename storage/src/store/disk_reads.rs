//! Disk reads shared by the readers of one body. A large body streamed from the disk tier skips the memory
//! tier (see [`Store::read_chunk`](super::Store::read_chunk)), so readers that stream it at the same time
//! (players fetching a new segment, clients of a release download) would each read every chunk from the
//! device: a read of a chunk in flight is joined instead, and the last few chunks read are kept for readers
//! a little behind.

use std::{
    collections::{HashMap, VecDeque},
    future::Future,
    sync::{Arc, Mutex},
};

use bytes::Bytes;
use foyer::{ErrorKind, HybridCacheProperties, Load};
use futures_util::{
    future::{BoxFuture, Shared},
    FutureExt,
};
use tokio_util::task::AbortOnDropHandle;

use super::bodies::Tier;
use crate::chunk::ChunkKey;

/// What a shared read gives every reader: the chunk and where it came from, `None` when the disk tier
/// holds no such chunk.
pub(super) type Read = Result<Option<(Bytes, Tier)>, Arc<foyer::Error>>;

/// A device read any number of readers wait for.
pub(super) type SharedRead = Shared<BoxFuture<'static, Read>>;

/// Bytes of chunks kept after they were read, for readers a little behind the first (8 chunks of 256 KiB,
/// 2 of a large body's 1 MiB), whatever the number of readers; at least the last chunk read.
const RECENT_BYTES: usize = 2 << 20;

/// The reads in flight, by chunk, and the chunks read last.
#[derive(Default)]
pub(super) struct DiskReads {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    in_flight: HashMap<ChunkKey, SharedRead>,
    recent: VecDeque<(ChunkKey, Bytes)>,
    /// The bytes `recent` holds.
    recent_bytes: usize,
}

/// How a chunk read from the disk tier is got.
pub(super) enum Joined {
    /// Read a moment ago by another reader.
    Recent(Bytes),
    /// A read in flight: another reader's, or one this reader started.
    Read {
        read: SharedRead,
        /// Whether another reader started it.
        shared: bool,
    },
}

impl DiskReads {
    /// Chunk `key`: a recent read, a read in flight, or a new one (`load`, run on `runtime`). A read runs
    /// to its end even if the reader that started it goes (others may wait for it); it costs one chunk.
    pub(super) fn read<F>(
        self: &Arc<Self>,
        key: ChunkKey,
        load: impl FnOnce() -> F,
        runtime: &tokio::runtime::Handle,
    ) -> Joined
    where
        F: Future<Output = foyer::Result<Load<ChunkKey, Bytes, HybridCacheProperties>>>
            + Send
            + 'static,
    {
        let mut state = self.state.lock().expect("disk reads mutex");
        if let Some((_, data)) = state.recent.iter().find(|(k, _)| *k == key) {
            return Joined::Recent(data.clone());
        }
        if let Some(read) = state.in_flight.get(&key) {
            return Joined::Read {
                read: read.clone(),
                shared: true,
            };
        }
        let (reads, load) = (self.clone(), load());
        let task = AbortOnDropHandle::new(runtime.spawn(async move {
            let read: Read = match load.await {
                Ok(Load::Entry { value, .. }) => Ok(Some((value, Tier::Disk))),
                // Still in foyer's write buffers: memory.
                Ok(Load::Piece { piece, .. }) => Ok(Some((piece.value().clone(), Tier::Memory))),
                Ok(Load::Miss | Load::Throttled) => Ok(None),
                Err(e) => Err(Arc::new(e)),
            };
            reads.settled(key, &read);
            read
        }));
        let read = async move {
            task.await.unwrap_or_else(|e| {
                Err(Arc::new(
                    foyer::Error::new(ErrorKind::Join, "disk read task failed").with_source(e),
                ))
            })
        }
        .boxed()
        .shared();
        state.in_flight.insert(key, read.clone());
        Joined::Read {
            read,
            shared: false,
        }
    }

    /// A read ended: later readers of the chunk find it among the recent ones (when it was found).
    fn settled(&self, key: ChunkKey, read: &Read) {
        let mut state = self.state.lock().expect("disk reads mutex");
        state.in_flight.remove(&key);
        if let Ok(Some((data, Tier::Disk))) = read {
            state.recent_bytes += data.len();
            state.recent.push_back((key, data.clone()));
            while state.recent_bytes > RECENT_BYTES && state.recent.len() > 1 {
                if let Some((_, old)) = state.recent.pop_front() {
                    state.recent_bytes -= old.len();
                }
            }
        }
    }
}
