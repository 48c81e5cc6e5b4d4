//! Compression dictionaries (RFC 9842, `[compression] dictionaries`). A stored response with
//! `Use-As-Dictionary` is read back once, decoded, and held as a dictionary known by the SHA-256 of its
//! bytes. A later client that announces it holds that dictionary (`Available-Dictionary`, `dcz` or `dcb` in
//! `Accept-Encoding`) is sent a stored body of the same host compressed against it: made once from the
//! stored body as another representation of it ([`crate::siblings`]), so the compression is never paid per
//! hit, and dropped with that body.
//!
//! Using a dictionary loosens nothing that is stored or shared: the body sent is one every client of the
//! URL is sent, in another coding. What it must not do is let a client learn what it could not fetch
//! (compressed against a dictionary, a body's back-references show which of its strings the dictionary
//! holds). So a dictionary is used only for its own host, is taken only from a response stored for every
//! client (one that varies on no field but `Accept-Encoding`), is keyed by the hash of the bytes held (which
//! a client cannot forge), and is looked up again before each use: a dictionary purged or banned since is
//! never used again.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
};

use bytes::{Bytes, BytesMut};
use lacquer_codec::Decoder;
use lacquer_policy::encoding::{self, Coded, Compression, USE_AS_DICTIONARY};
use lacquer_storage::ObjectMeta;

use crate::{
    coding::IDENTITY_LENGTH,
    stats::{add, dec, inc, sub, Stats},
    store::CacheStore,
};

/// A dictionary held (by the SHA-256 of its bytes): its bytes, decoded, and where they were stored.
pub(crate) struct Dictionary {
    /// The bytes, as clients hold them (decoded).
    pub bytes: Bytes,
    /// The cache key of the response it was read from, and that body (object, generation): looked up
    /// before each use, so that a purge or a ban of that response ends its use.
    key: String,
    body: (u64, u64),
}

/// The host part of a cache key (`host[:port]/path?query`).
fn host_of(key: &str) -> &str {
    key.split_once('/').map_or(key, |(host, _)| host)
}

/// The dictionaries held, within `dictionary_memory`.
#[derive(Default)]
pub struct Dictionaries {
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    /// By hash and host (the same file served by two hosts is two dictionaries, each for its own), with
    /// the tick of their last use (least recently used goes first).
    by_hash: HashMap<([u8; 32], String), (Arc<Dictionary>, u64)>,
    /// Stored bodies (object, generation) read or being read as dictionaries: each is read once (one
    /// refused, too large or undecodable, is not read again). Asked on every hit of such a body: no
    /// allocation.
    read: HashSet<(u64, u64)>,
    /// Bytes held in `by_hash`.
    memory: u64,
    /// Bodies being read now.
    reading: usize,
    tick: u64,
}

/// Bodies read as dictionaries at once, at most.
const MAX_READING: usize = 2;

/// A read in progress, counted out when it ends, however it ends.
struct Reading(Arc<Dictionaries>);

impl Drop for Reading {
    fn drop(&mut self) {
        self.0.held.lock().expect("dictionaries mutex").reading -= 1;
    }
}

/// Stored bodies remembered as read: past it the memory starts again (each is then read once more).
const READ_KEPT: usize = 4096;

impl Held {
    /// Lets go of the dictionary with `hash`, and forgets that its body was read (served again, it is read
    /// again).
    fn drop_hash(&mut self, held: &([u8; 32], String), stats: &Stats) {
        if let Some((dictionary, _)) = self.by_hash.remove(held) {
            self.memory -= dictionary.bytes.len() as u64;
            self.read.remove(&dictionary.body);
            dec(&stats.dictionaries_held);
            sub(&stats.dictionary_memory, dictionary.bytes.len() as u64);
            inc(&stats.dictionaries_dropped);
        }
    }
}

impl Dictionaries {
    /// Reads `meta`'s body (stored under `key`) as a dictionary in the background, if its response says
    /// `Use-As-Dictionary`, it may serve as one (see the module's comment) and it was not read before.
    pub(crate) fn offer<S: CacheStore>(
        self: &Arc<Self>,
        store: &S,
        stats: &Arc<Stats>,
        settings: &Compression,
        key: &str,
        meta: &ObjectMeta,
    ) {
        if !settings.dictionaries || meta.status != 200 {
            return;
        }
        let body = (meta.object, meta.generation);
        let max = settings.max_dictionary_size.as_u64();
        let reading = {
            let mut held = self.held.lock().expect("dictionaries mutex");
            // Every hit of a dictionary's body asks: one read done, this is all it costs.
            if held.read.contains(&body) {
                return;
            }
            let eligible = meta.header(USE_AS_DICTIONARY.as_str()).is_some()
                && meta
                    .variant
                    .iter()
                    .all(|(name, _)| name.eq_ignore_ascii_case("accept-encoding"));
            if !eligible {
                return;
            }
            // A read holds up to `max` bytes and a decoder: a few at once, whatever the origin marks
            // `Use-As-Dictionary`. One not started now is offered again when its body is next served.
            if held.reading >= MAX_READING {
                return;
            }
            if held.read.len() >= READ_KEPT {
                held.read.clear();
            }
            held.read.insert(body);
            held.reading += 1;
            Reading(self.clone())
        };
        let identity = meta
            .header(IDENTITY_LENGTH.as_str())
            .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
            .unwrap_or(meta.length);
        if identity > max || meta.length == 0 {
            inc(&stats.dictionaries_refused);
            return;
        }
        let coded = encoding::coded(&meta.header_map(0));
        let this = self.clone();
        let store = store.clone();
        let stats = stats.clone();
        let budget = settings.dictionary_memory.as_u64();
        let key = key.to_owned();
        let meta = meta.clone();
        tokio::spawn(async move {
            let _reading = reading;
            match read(&store, &meta, coded, max).await {
                Some(bytes) => this.hold(&stats, budget, key, body, bytes),
                None => {
                    inc(&stats.dictionaries_refused);
                    tracing::debug!(
                        key,
                        "a Use-As-Dictionary response was not kept as a dictionary"
                    );
                }
            }
        });
    }

    /// Holds `bytes`, read from `key`'s `body`, letting go of the least recently used past `budget`.
    fn hold(&self, stats: &Stats, budget: u64, key: String, body: (u64, u64), bytes: Bytes) {
        let hash: [u8; 32] = ring::digest::digest(&ring::digest::SHA256, &bytes)
            .as_ref()
            .try_into()
            .expect("SHA-256 is 32 bytes");
        let len = bytes.len() as u64;
        let mut held = self.held.lock().expect("dictionaries mutex");
        // The same bytes from another URL or generation of the host: one copy is enough.
        let id = (hash, host_of(&key).to_owned());
        if held.by_hash.contains_key(&id) {
            return;
        }
        while held.memory + len > budget {
            let Some(oldest) = held
                .by_hash
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(id, _)| id.clone())
            else {
                break;
            };
            held.drop_hash(&oldest, stats);
        }
        held.tick += 1;
        let tick = held.tick;
        held.memory += len;
        held.by_hash
            .insert(id, (Arc::new(Dictionary { bytes, key, body }), tick));
        inc(&stats.dictionaries_held);
        add(&stats.dictionary_memory, len);
        inc(&stats.dictionaries_kept);
    }

    /// The dictionary with `hash` of the host of `key`, for the response stored there: `None` when none is
    /// held, or when the response it was read from is no longer stored (purged, banned, replaced or
    /// evicted: it is let go).
    pub(crate) async fn get<S: CacheStore>(
        &self,
        store: &S,
        stats: &Stats,
        hash: &[u8; 32],
        key: &str,
    ) -> Option<Arc<Dictionary>> {
        let id = (*hash, host_of(key).to_owned());
        let dictionary = {
            let mut held = self.held.lock().expect("dictionaries mutex");
            held.tick += 1;
            let tick = held.tick;
            let (dictionary, used) = held.by_hash.get_mut(&id)?;
            *used = tick;
            dictionary.clone()
        };
        let stored = match store.lookup(&dictionary.key).await {
            Ok(Some(set)) => set
                .variants
                .iter()
                .any(|v| (v.object, v.generation) == dictionary.body),
            Ok(None) => false,
            // Not proven stored: not used this time, kept for the next.
            Err(_) => return None,
        };
        if !stored {
            self.held
                .lock()
                .expect("dictionaries mutex")
                .drop_hash(&id, stats);
            return None;
        }
        Some(dictionary)
    }
}

/// `meta`'s body, decoded from `coded`, when it is at most `max` bytes and reads whole.
async fn read<S: CacheStore>(
    store: &S,
    meta: &ObjectMeta,
    coded: Coded,
    max: u64,
) -> Option<Bytes> {
    let mut decoder = match coded {
        Coded::Identity => None,
        Coded::With(coding) => Some(Decoder::new(coding, max)),
        Coded::Other => return None,
    };
    let mut out = BytesMut::new();
    for index in 0..meta.chunk_count() {
        let chunk = store.read_chunk(meta, index).await.ok()??.data;
        match &mut decoder {
            Some(decoder) => {
                decoder.feed(chunk);
                while let Some(piece) = decoder.piece().ok()? {
                    out.extend_from_slice(&piece);
                }
            }
            None => out.extend_from_slice(&chunk),
        }
    }
    if let Some(decoder) = &mut decoder {
        decoder.end();
        while let Some(piece) = decoder.piece().ok()? {
            out.extend_from_slice(&piece);
        }
    }
    (out.len() as u64 <= max).then(|| out.freeze())
}
