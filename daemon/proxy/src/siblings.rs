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

use bytes::Bytes;

use lacquer_codec::{CodecError, Decoder, DictionaryCoding, Encoder};
use lacquer_policy::encoding::{Coding, Compression};

use crate::{
    coding::{Reserved, EXPANSION_FLOOR, IDENTITY_LENGTH},
    dictionary::Dictionary,
    stats::{inc, Stats},
    store::Found,
    store::{BodyWriter, CacheStore},
};

/// A representation to make: the variant body it is made from, in which coding it is stored (`None`:
/// identity) and what is wanted. Borrowed: most hits that ask find it made or being made, and copy
/// nothing.
pub(crate) struct Wanted<'a> {
    /// The body's cache key.
    pub key: &'a str,
    /// The stored variant.
    pub found: &'a Found,
    /// The coding the body is stored in.
    pub stored: Option<Coding>,
    /// What to make.
    pub made: Made,
}

/// What a representation is made as.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) enum Made {
    /// Another coding (`None`: identity).
    Coding(Option<Coding>),
    /// A coding against a dictionary, by its hash.
    Dictionary(DictionaryCoding, [u8; 32]),
}

impl Made {
    /// The coding the representation is kept under: the `Content-Encoding` token, and for a dictionary
    /// coding the dictionary's hash after a colon (`dcz:…`): one representation per dictionary.
    pub fn kept_as(&self) -> Option<String> {
        match self {
            Made::Coding(coding) => coding.map(|c| c.token().to_owned()),
            Made::Dictionary(coding, hash) => Some(dictionary_coding(*coding, hash)),
        }
    }
}

/// How a representation compressed against the dictionary with `hash` is kept: `dcz:` and the hash in
/// hexadecimal.
pub(crate) fn dictionary_coding(coding: DictionaryCoding, hash: &[u8; 32]) -> String {
    use std::fmt::Write;
    let mut kept = String::with_capacity(68);
    kept.push_str(coding.token());
    kept.push(':');
    for b in hash {
        let _ = write!(kept, "{b:02x}");
    }
    kept
}

/// The representations being made, by variant body (generation) and what is made: one at a time for
/// each, at most `conversions` in all; and those that could not be made, which are not tried again.
#[derive(Default)]
pub struct Making {
    in_flight: Mutex<HashSet<(u64, Made)>>,
    failed: Mutex<HashSet<(u64, Made)>>,
}

/// Representations remembered as failed: past it the memory starts again (a body that fails again costs
/// one more conversion).
const FAILED_KEPT: usize = 4096;

/// A place among the representations being made, given back when the making ends, however it ends.
struct Slot {
    making: Arc<Making>,
    what: (u64, Made),
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
    fn slot(self: &Arc<Self>, what: (u64, Made), budget: u32, stats: &Stats) -> Option<Slot> {
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
        in_flight.insert(what.clone());
        Some(Slot {
            making: self.clone(),
            what,
        })
    }

    /// Remembers that `what` could not be made (a body that does not decode, or decodes past the limit):
    /// the clients that need it are served by converting on the way out, without making it again each time.
    fn failed(&self, what: (u64, Made)) {
        let mut failed = self.failed.lock().expect("making mutex");
        if failed.len() >= FAILED_KEPT {
            failed.clear();
        }
        failed.insert(what);
    }
}

/// The coding of the representation a client should get of a body stored in `stored` that it does not
/// take: gzip when it takes gzip and the body is in another coding, identity otherwise.
pub(crate) fn coding_for(stored: Coding, takes_gzip: bool) -> Option<Coding> {
    (takes_gzip && stored != Coding::Gzip).then_some(Coding::Gzip)
}

/// Starts making `wanted` in the background, unless it is being made or `settings.conversions` are (the
/// client that asked is served by converting on the way out, or in a coding it takes, either way). `limit`
/// is the largest body the route stores (`max_object_size`): a representation that would be larger, or
/// of a compressed body whose decoded length was not recorded when it was stored, is not made.
/// `dictionary` is the dictionary a [`Made::Dictionary`] is made against.
pub(crate) fn start<S: CacheStore>(
    store: &S,
    making: &Arc<Making>,
    stats: &Arc<Stats>,
    settings: &Compression,
    limit: u64,
    wanted: Wanted<'_>,
    dictionary: Option<Arc<Dictionary>>,
) {
    let meta = wanted.found.meta();
    let decoded = match wanted.stored {
        Some(_) => meta
            .header(IDENTITY_LENGTH.as_str())
            .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok()),
        None => Some(meta.length),
    };
    if decoded.is_none_or(|len| len > limit) {
        return;
    }
    let what = (meta.generation, wanted.made.clone());
    let Some(slot) = making.slot(what.clone(), settings.conversions, stats) else {
        return;
    };
    let making = making.clone();
    let job = Job {
        store: store.clone(),
        stats: stats.clone(),
        limit,
        max_expansion: u64::from(settings.max_expansion),
        decode_memory: settings.decode_memory.as_u64(),
        levels: (
            settings.gzip_level,
            settings.brotli_level,
            settings.zstd_level,
        ),
        key: wanted.key.to_owned(),
        found: wanted.found.clone(),
        stored: wanted.stored,
        made: wanted.made,
        dictionary,
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
    /// gzip's, brotli's and zstd's levels.
    levels: (u32, u32, u32),
    key: String,
    found: Found,
    stored: Option<Coding>,
    made: Made,
    dictionary: Option<Arc<Dictionary>>,
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
            made,
            levels: (gzip, brotli, zstd),
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
        let window = stored.map_or(0, |stored| Decoder::memory(stored, Some(&first)));
        let Some(_reserved) = Reserved::take(&self.stats, window, self.decode_memory) else {
            return Err(NotMade::NoMemory);
        };
        let decoder = stored.map(|stored| {
            Decoder::new(stored, self.limit).with_max_expansion(self.max_expansion, EXPANSION_FLOOR)
        });
        let mut encoder = match (made, &self.dictionary) {
            (Made::Coding(coding), _) => coding.map(|c| Encoder::new(c, *gzip)),
            (Made::Dictionary(coding, hash), Some(dictionary)) => {
                let level = match coding {
                    DictionaryCoding::Dcb => *brotli,
                    DictionaryCoding::Dcz => *zstd,
                };
                Some(Encoder::with_dictionary(
                    *coding,
                    level,
                    &dictionary.bytes,
                    hash,
                )?)
            }
            (Made::Dictionary(..), None) => unreachable!("a dictionary coding is made with one"),
        };
        let mut since_yield = 0;
        let mut first = Some(first);
        let mut identity = Identity::new(decoder);
        for index in 0..=meta.chunk_count() {
            match first.take() {
                Some(data) => identity.feed(data),
                None if index < meta.chunk_count() => identity.feed(read(index).await?),
                None => identity.end(),
            }
            while let Some(piece) = identity.piece()? {
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
        Ok(writer
            .finish_sibling(key.clone(), meta.generation, made.kept_as())
            .await?)
    }
}

/// A stored body's identity bytes: decoded, or as stored when it is stored uncompressed.
enum Identity {
    Decoded(Decoder),
    AsStored { next: Option<Bytes> },
}

impl Identity {
    fn new(decoder: Option<Decoder>) -> Self {
        match decoder {
            Some(decoder) => Identity::Decoded(decoder),
            None => Identity::AsStored { next: None },
        }
    }

    fn feed(&mut self, data: Bytes) {
        match self {
            Identity::Decoded(decoder) => decoder.feed(data),
            Identity::AsStored { next } => *next = Some(data),
        }
    }

    fn end(&mut self) {
        if let Identity::Decoded(decoder) = self {
            decoder.end();
        }
    }

    fn piece(&mut self) -> Result<Option<Bytes>, CodecError> {
        match self {
            Identity::Decoded(decoder) => decoder.piece(),
            Identity::AsStored { next } => Ok(next.take()),
        }
    }
}
