//! Representations made from stored bodies (`[compression] conversions`). A client that takes none of a
//! stored body's coding (a player without `Accept-Encoding` asking for a manifest stored gzip'd) is served
//! the first time by converting on the way out, as before; meanwhile the conversion is made once, from the
//! stored bytes, and kept as a [`Sibling`](lacquer_storage::Sibling) of the body, so every later such client
//! is sent stored bytes. The origin is not asked again: the sibling is made from what is stored, and it
//! lives and dies with that body (the store drops it with every invalidation or replacement of it).

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
};

use lacquer_codec::{CodecError, Decoder, Encoder};
use lacquer_policy::encoding::{Coding, Compression};

use crate::{
    coding::{Reserved, EXPANSION_FLOOR, IDENTITY_LENGTH},
    stats::{inc, Stats},
    store::Found,
    store::{BodyWriter, CacheStore},
};

/// A representation to make: the variant body it is made from, in which coding it is stored and which
/// one is wanted (`None`: identity). Borrowed: most hits that ask find it made or being made, and copy
/// nothing.
pub(crate) struct Wanted<'a> {
    /// The body's cache key.
    pub key: &'a str,
    /// The stored variant.
    pub found: &'a Found,
    /// The coding the body is stored in.
    pub stored: Coding,
    /// The coding to make.
    pub coding: Option<Coding>,
}

/// The representations being made, by variant body (generation) and coding: one at a time for each,
/// at most `conversions` in all; and those that could not be made, which are not tried again.
#[derive(Default)]
pub struct Making {
    in_flight: Mutex<HashSet<(u64, Option<Coding>)>>,
    failed: Mutex<HashSet<(u64, Option<Coding>)>>,
}

/// Representations remembered as failed: past it the memory starts again (a body that fails again costs
/// one more conversion).
const FAILED_KEPT: usize = 4096;

/// A place among the representations being made, given back when the making ends, however it ends.
struct Slot {
    making: Arc<Making>,
    what: (u64, Option<Coding>),
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.making
            .in_flight
            .lock()
            .expect("making mutex")
            .remove(&self.what);
    }
}

impl Making {
    /// A slot for making `what`, unless it is being made already or `budget` are being made (counted).
    fn slot(
        self: &Arc<Self>,
        what: (u64, Option<Coding>),
        budget: u32,
        stats: &Stats,
    ) -> Option<Slot> {
        if self.failed.lock().expect("making mutex").contains(&what) {
            return None;
        }
        let mut in_flight = self.in_flight.lock().expect("making mutex");
        if in_flight.contains(&what) {
            return None;
        }
        if in_flight.len() >= budget as usize {
            inc(&stats.representations_deferred);
            return None;
        }
        in_flight.insert(what);
        Some(Slot {
            making: self.clone(),
            what,
        })
    }

    /// Remembers that `what` could not be made (a body that does not decode, or decodes past the limit):
    /// the clients that need it are served by converting on the way out, without making it again each time.
    fn failed(&self, what: (u64, Option<Coding>)) {
        let mut failed = self.failed.lock().expect("making mutex");
        if failed.len() >= FAILED_KEPT {
            failed.clear();
        }
        failed.insert(what);
    }
}

/// The coding of the representation a client should get of a body stored in `stored` that it does not
/// take: gzip when it takes gzip and the body is in another coding, identity otherwise.
pub fn coding_for(stored: Coding, takes_gzip: bool) -> Option<Coding> {
    (takes_gzip && stored != Coding::Gzip).then_some(Coding::Gzip)
}

/// Starts making `wanted` in the background, unless it is being made or `settings.conversions` are (the
/// client that asked is served by converting on the way out, either way). `limit` is the largest body the
/// route stores (`max_object_size`): a representation that would be larger, or whose decoded length was
/// not recorded when the body was stored, is not made.
pub(crate) fn start<S: CacheStore>(
    store: &S,
    making: &Arc<Making>,
    stats: &Arc<Stats>,
    settings: &Compression,
    limit: u64,
    wanted: Wanted<'_>,
) {
    let meta = wanted.found.meta();
    let decoded = meta
        .header(IDENTITY_LENGTH.as_str())
        .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok());
    if decoded.is_none_or(|len| len > limit) {
        return;
    }
    let what = (meta.generation, wanted.coding);
    let Some(slot) = making.slot(what, settings.conversions, stats) else {
        return;
    };
    let making = making.clone();
    let job = Job {
        store: store.clone(),
        stats: stats.clone(),
        limit,
        max_expansion: u64::from(settings.max_expansion),
        decode_memory: settings.decode_memory.as_u64(),
        level: settings.gzip_level,
        key: wanted.key.to_owned(),
        found: wanted.found.clone(),
        stored: wanted.stored,
        coding: wanted.coding,
    };
    tokio::spawn(async move {
        let _slot = slot;
        let key = job.key.clone();
        match job.run().await {
            Ok(true) => inc(&job.stats.representations_made),
            // The body was invalidated or replaced meanwhile: nothing to keep.
            Ok(false) => {}
            // Not kept, but worth trying again: the store refused it (a full disk) or lost the body.
            Err(e @ (NotMade::Store(_) | NotMade::BodyGone | NotMade::NoMemory)) => {
                inc(&job.stats.representations_failed);
                tracing::debug!(key, error = %e, "a representation was not made");
            }
            Err(e @ NotMade::Codec(_)) => {
                inc(&job.stats.representations_failed);
                making.failed(what);
                tracing::debug!(key, error = %e, "a representation cannot be made");
            }
        }
    });
}

/// Why a representation was not made.
#[derive(Debug, thiserror::Error)]
enum NotMade {
    #[error("the stored body is gone")]
    BodyGone,
    #[error("decode_memory has no room for its decoder")]
    NoMemory,
    #[error(transparent)]
    Store(#[from] lacquer_storage::StoreError),
    #[error(transparent)]
    Codec(#[from] CodecError),
}

struct Job<S> {
    store: S,
    stats: Arc<Stats>,
    limit: u64,
    max_expansion: u64,
    decode_memory: u64,
    level: u32,
    key: String,
    found: Found,
    stored: Coding,
    coding: Option<Coding>,
}

/// Output written between two yields of the thread: a large body is converted without holding a worker.
const YIELD_EVERY: usize = 64 * 1024;

impl<S: CacheStore> Job<S> {
    /// Reads the stored body chunk by chunk, converts it and stores the result as the body's sibling;
    /// `Ok(false)` when the body was invalidated or replaced before it was kept.
    async fn run(&self) -> Result<bool, NotMade> {
        let Job {
            key,
            found,
            stored,
            coding,
            ..
        } = self;
        let meta = found.meta();
        let read = |index| async move {
            match self.store.read_chunk(meta, index).await? {
                Some(chunk) => Ok(chunk.data),
                None => Err(NotMade::BodyGone),
            }
        };
        // First: a store that refuses new bodies (a full disk) costs no read and no decode.
        let mut writer = self.store.writer(key, &meta.variant, self.store.mark())?;
        let first = read(0).await?;
        // Counted with the decoders clients hold: the conversions share `decode_memory` with them.
        let window = Decoder::memory(*stored, Some(&first));
        let Some(_reserved) = Reserved::take(&self.stats, window, self.decode_memory) else {
            return Err(NotMade::NoMemory);
        };
        let mut decoder = Decoder::new(*stored, self.limit)
            .with_max_expansion(self.max_expansion, EXPANSION_FLOOR);
        let mut encoder = coding.map(|c| Encoder::new(c, self.level));
        let mut since_yield = 0;
        let mut first = Some(first);
        for index in 0..=meta.chunk_count() {
            match first.take() {
                Some(data) => decoder.feed(data),
                None if index < meta.chunk_count() => decoder.feed(read(index).await?),
                None => decoder.end(),
            }
            while let Some(piece) = decoder.piece()? {
                since_yield += piece.len();
                match &mut encoder {
                    Some(encoder) => {
                        encoder.feed(piece);
                        while let Some(out) = encoder.piece()? {
                            writer.push(&out).await?;
                        }
                    }
                    None => writer.push(&piece).await?,
                }
                if since_yield >= YIELD_EVERY {
                    since_yield = 0;
                    tokio::task::yield_now().await;
                }
            }
        }
        if let Some(encoder) = &mut encoder {
            encoder.end();
            while let Some(out) = encoder.piece()? {
                writer.push(&out).await?;
            }
        }
        let coding = coding.map(|c| c.token().to_owned());
        Ok(writer
            .finish_sibling(key.clone(), meta.generation, coding)
            .await?)
    }
}
