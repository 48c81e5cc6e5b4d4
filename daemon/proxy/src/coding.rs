//! Content codings on the data path (`[compression]`): the client's `Accept-Encoding` set aside for one
//! the origin and the store share, bodies compressed (or checked) as a fill streams them, and stored bodies
//! decompressed on the way out for clients that do not take their coding.

use std::sync::{atomic::Ordering::Relaxed, Arc};

use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap, HeaderName, HeaderValue};
use http_body::Frame;
use http_body_util::BodyExt;
use lacquer_backends::body::{self, Body, BoxError};
use lacquer_codec::{CodecError, Decoder, Encoder};
use lacquer_policy::{
    cache_control::CacheControl,
    encoding::{
        self, Accepts, Coded, Coding, Compression, Delivery, DictionaryCoding, Negotiation,
        AVAILABLE_DICTIONARY, DICTIONARY_ID,
    },
};

use crate::{
    coalesce::{FIRST_TURN, YIELD_EVERY},
    stats::{add, inc, Stats},
};

/// The length a compressed stored body has once decoded, kept with its headers so identity clients get a
/// `Content-Length` and byte ranges. Internal: removed from what origins send and from what clients get.
pub const IDENTITY_LENGTH: HeaderName = HeaderName::from_static("lacquer-identity-length");

/// The decoded length a fill recorded in `headers` ([`IDENTITY_LENGTH`]), the field removed.
pub fn take_identity_length(headers: &mut HeaderMap) -> Option<u64> {
    headers
        .remove(IDENTITY_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
}

/// A lookup's `Accept-Encoding`, read and replaced by the one the origin and the store see.
#[derive(Clone)]
pub struct Negotiated {
    accepts: Accepts,
    /// The field as the client sent it, for a request that must go to the origin as sent.
    original: Vec<HeaderValue>,
    /// The request says `no-transform`: it gets the stored coding or the origin's answer, never a
    /// conversion.
    no_transform: bool,
    /// The dictionary the client holds, when it takes a coding against one.
    dictionary: Option<DictionaryAsked>,
}

/// A client's compression dictionary (RFC 9842): its hash, and the codings against it that it takes.
#[derive(Clone, Copy, Debug)]
pub struct DictionaryAsked {
    /// The dictionary's SHA-256 (`Available-Dictionary`).
    pub hash: [u8; 32],
    /// The coding to send it in: `dcz` when the client takes it (zstd decodes faster, and the C library
    /// makes it), `dcb` when it takes only that.
    pub coding: DictionaryCoding,
}

impl Negotiated {
    /// Reads the client's `Accept-Encoding` and puts in its place the one every client shares.
    pub fn take(headers: &mut HeaderMap, negotiation: &Negotiation) -> Self {
        let accepts = Accepts::from_headers(headers);
        let original = headers
            .get_all(header::ACCEPT_ENCODING)
            .iter()
            .cloned()
            .collect();
        headers.insert(header::ACCEPT_ENCODING, negotiation.accept_encoding.clone());
        let coding = [DictionaryCoding::Dcz, DictionaryCoding::Dcb]
            .into_iter()
            .find(|c| accepts.accepts_dictionary(*c));
        let no_transform = CacheControl::from_headers(headers).no_transform;
        // A request that says `no-transform` gets the stored coding, never one made for it.
        let dictionary = coding.filter(|_| !no_transform).and_then(|coding| {
            Some(DictionaryAsked {
                hash: encoding::available_dictionary(headers)?,
                coding,
            })
        });
        // They speak of codings the origin is not asked for: it is sent neither, and never varies on them.
        headers.remove(AVAILABLE_DICTIONARY);
        headers.remove(DICTIONARY_ID);
        Self {
            accepts,
            original,
            no_transform,
            dictionary,
        }
    }

    /// The dictionary the client holds, when it takes a coding against one.
    pub fn dictionary(&self) -> Option<DictionaryAsked> {
        self.dictionary
    }

    /// How a response with `headers` reaches this client.
    pub fn delivery(&self, headers: &HeaderMap) -> Delivery {
        self.delivery_of(encoding::coded(headers), headers)
    }

    /// [`Negotiated::delivery`] for a response whose coding is known already.
    pub fn delivery_of(&self, coded: Coded, headers: &HeaderMap) -> Delivery {
        // The stored `Cache-Control` matters only when a conversion would be needed: most hits skip it.
        match encoding::delivery_of(coded, &self.accepts, self.no_transform) {
            Delivery::Decode(_) if says_no_transform(headers) => Delivery::Forward,
            delivery => delivery,
        }
    }

    /// Whether the client takes gzip.
    pub fn takes_gzip(&self) -> bool {
        self.accepts.accepts(Some(Coding::Gzip))
    }

    /// Puts the client's own `Accept-Encoding` back, for a request sent to the origin as the client sent it.
    pub fn restore(&self, headers: &mut HeaderMap) {
        headers.remove(header::ACCEPT_ENCODING);
        for value in &self.original {
            headers.append(header::ACCEPT_ENCODING, value.clone());
        }
    }
}

/// Whether a stored response's `Cache-Control` says `no-transform`: parsed only when the word is there, as
/// it nearly never is (every identity hit of a compressed object asks).
pub(crate) fn says_no_transform(headers: &HeaderMap) -> bool {
    let word = b"no-transform";
    headers.get_all(header::CACHE_CONTROL).iter().any(|v| {
        v.as_bytes()
            .windows(word.len())
            .any(|w| w.eq_ignore_ascii_case(word))
    }) && CacheControl::from_headers(headers).no_transform
}

/// How a response leaves: the delivery chosen, with the decoding's settings when it decodes.
pub enum Conversion {
    /// The bytes as stored or fetched.
    None,
    /// A sibling of the stored body is sent as stored: the representation of it in `coding` (`None`:
    /// identity) made before, under the variant's headers.
    Sibling {
        /// The sibling's coding.
        coding: Option<Coding>,
        /// Where it is counted.
        stats: Arc<Stats>,
    },
    /// Decompressed once for every reader of a fetch that needs it decoded
    /// ([`Conversion::decode_whole`]): the identity bytes in hand are sent, with their length.
    DecodedOnce {
        /// The stored coding.
        coding: Coding,
        /// Where the conversion is counted.
        stats: Arc<Stats>,
    },
    /// Decompressed on the way out.
    Decode {
        /// The stored coding.
        coding: Coding,
        /// Output past this many bytes cuts the response off (`max_object_size`).
        limit: u64,
        /// What all decoders may hold together (`decode_memory`).
        memory: u64,
        /// Decoded bytes a range may need (`range_decode`).
        range_decode: u64,
        /// Output allowed per input byte (`max_expansion`).
        max_expansion: u64,
        /// Where the conversion and any failure are counted, and the decoders' memory held.
        stats: Arc<Stats>,
    },
}

/// A decoder would take the decoders' memory past `decode_memory`: the request is answered without one.
#[derive(Debug)]
pub struct Busy;

/// Output a body may reach before `max_expansion` applies: a small body of repetitive text (an empty
/// table, a run of spaces) may expand more than text does, at a cost that stays small.
pub const EXPANSION_FLOOR: u64 = 1 << 20;

impl Conversion {
    /// The conversion for `delivery` under `[compression]` `settings` (never called with `Forward`, which
    /// the caller handles first; a route without settings negotiates nothing, so decodes nothing).
    pub fn new(
        delivery: Delivery,
        limit: u64,
        settings: Option<&Compression>,
        stats: &Arc<Stats>,
    ) -> Self {
        match (delivery, settings) {
            (Delivery::Decode(coding), Some(settings)) => Conversion::Decode {
                coding,
                limit,
                memory: settings.decode_memory.as_u64(),
                range_decode: settings.range_decode.as_u64(),
                max_expansion: u64::from(settings.max_expansion),
                stats: stats.clone(),
            },
            _ => Conversion::None,
        }
    }

    /// Counts a sibling sent.
    pub fn count_served(&self) {
        if let Conversion::Sibling { stats, .. } = self {
            inc(&stats.representations_served);
        }
    }

    /// Whether the body is decoded on the way out.
    pub fn decodes(&self) -> bool {
        matches!(self, Conversion::Decode { .. })
    }

    /// Whether byte ranges `parts` of what is sent are answered: always for bytes as stored; for a decoded
    /// body, which is read from its start, a single range whose decode stays within `range_decode`
    /// (counted when not: the whole body is sent instead).
    pub fn answers_range(&self, parts: &[(u64, u64)]) -> bool {
        match self {
            Conversion::None | Conversion::Sibling { .. } | Conversion::DecodedOnce { .. } => true,
            Conversion::Decode {
                range_decode,
                stats,
                ..
            } => {
                let within = matches!(parts, [(_, last)] if *last < *range_decode);
                if !within {
                    inc(&stats.ranges_whole);
                }
                within
            }
        }
    }

    /// Shapes the headers for what is sent: for a decoded body (or a sibling) `Content-Encoding` goes (or
    /// becomes the sibling's), the entity-tag turns weak (RFC 9110 §8.8.3) and `Content-Length` becomes
    /// the decoded length when known; any coded body tells caches downstream that it varies on
    /// `Accept-Encoding`. `stored_length` is that of the bytes sent as they are stored (the sibling's for a
    /// sibling), `identity_length` the decoded length recorded at fill time ([`take_identity_length`]).
    /// Returns the length sent, when known.
    pub fn headers(
        &self,
        headers: &mut HeaderMap,
        stored_length: Option<u64>,
        identity_length: Option<u64>,
    ) -> Option<u64> {
        if encoding::coded(headers) != Coded::Identity {
            vary_on_accept_encoding(headers);
        }
        let (coding, stats) = match self {
            Conversion::None => return stored_length,
            Conversion::Sibling { coding, .. } => {
                self.count_served();
                match coding {
                    Some(c) => headers.insert(
                        header::CONTENT_ENCODING,
                        HeaderValue::from_static(c.token()),
                    ),
                    None => headers.remove(header::CONTENT_ENCODING),
                };
                weaken_etag(headers);
                return stored_length;
            }
            Conversion::DecodedOnce { coding, stats } => {
                count_decoded(*coding, stats);
                headers.remove(header::CONTENT_ENCODING);
                weaken_etag(headers);
                return stored_length;
            }
            Conversion::Decode { coding, stats, .. } => (coding, stats),
        };
        count_decoded(*coding, stats);
        headers.remove(header::CONTENT_ENCODING);
        weaken_etag(headers);
        match identity_length {
            Some(len) => {
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
            }
            None => {
                headers.remove(header::CONTENT_LENGTH);
            }
        }
        identity_length
    }

    /// The whole of a small body in hand (`pieces`, in the stored coding) decoded at once, for all the
    /// readers of a fetch that need it decoded ([`FetchReader::decoded_once`](crate::coalesce::FetchReader::decoded_once)),
    /// within the limits [`Conversion::body`] keeps and at most [`DECODED_ONCE_OUT`] bytes; `None` when this
    /// conversion does not decode, the decoders' memory has no room, or the body does not decode within
    /// them. Send it as [`Conversion::made_once`] says.
    pub fn decode_whole(&self, pieces: &[Bytes]) -> Option<Bytes> {
        let start = pieces.first().map(|p| &p[..]);
        let (made, stats) = self.decoder(start, DECODED_ONCE_OUT)?;
        let Decoding {
            mut decoder,
            reserved: _reserved,
        } = made.ok()?;
        let mut out = BytesMut::new();
        for piece in pieces.iter().cloned().map(Some).chain([None]) {
            match piece {
                Some(piece) => decoder.feed(piece),
                None => decoder.end(),
            }
            while let Some(data) = decoder.piece().ok()? {
                out.extend_from_slice(&data);
            }
        }
        add(&stats.decoded_bytes, out.len() as u64);
        Some(out.freeze())
    }

    /// A decoder for this conversion, its output cut at `cap` bytes too, with its share of `decode_memory`
    /// (`Busy` when that has no room), and where it is counted; `None` when the conversion does not decode.
    fn decoder(
        &self,
        start: Option<&[u8]>,
        cap: u64,
    ) -> Option<(Result<Decoding, Busy>, &Arc<Stats>)> {
        let Conversion::Decode {
            coding,
            limit,
            memory,
            max_expansion,
            stats,
            ..
        } = self
        else {
            return None;
        };
        let made = match Reserved::take(stats, Decoder::memory(*coding, start), *memory) {
            Some(reserved) => Ok(Decoding {
                decoder: Decoder::new(*coding, (*limit).min(cap))
                    .with_max_expansion(*max_expansion, EXPANSION_FLOOR),
                reserved,
            }),
            None => Err(Busy),
        };
        Some((made, stats))
    }

    /// How a body [`Conversion::decode_whole`] made is sent: identity, its length known, ranges answered
    /// from it; each response is counted as decoded on the way out, the bytes decoded once.
    pub fn made_once(&self) -> Conversion {
        match self {
            Conversion::Decode { coding, stats, .. } => Conversion::DecodedOnce {
                coding: *coding,
                stats: stats.clone(),
            },
            _ => Conversion::None,
        }
    }

    /// `body` as sent: decoded when the conversion decodes, restricted to bytes `first..=last` of the
    /// decoded body when `range` says so. A body that does not decode, decodes past the limit or expands
    /// past `max_expansion` ends in an error, so the client never takes it for complete. `start` is the
    /// body's first bytes when known: the decoder is counted for the window they declare, and [`Busy`]
    /// when that would pass `decode_memory`.
    pub fn body(
        &self,
        body: Body,
        range: Option<(u64, u64)>,
        start: Option<&[u8]>,
    ) -> Result<Body, Busy> {
        let Some((made, stats)) = self.decoder(start, u64::MAX) else {
            return Ok(body);
        };
        let Ok(Decoding { decoder, reserved }) = made else {
            inc(&stats.decodes_refused);
            return Err(Busy);
        };
        let state = DecodeState {
            inner: body,
            decoder,
            ended: false,
            offset: 0,
            range,
            failed: false,
            yielded_at: 0,
            stats: stats.clone(),
            _reserved: reserved,
        };
        Ok(body::from_stream(futures_util::stream::unfold(
            state,
            |mut s| async move {
                match s.next().await {
                    Ok(Some(data)) => Some((Ok(Frame::data(data)), s)),
                    Ok(None) => None,
                    Err(e) => {
                        s.failed = true;
                        Some((Err(e), s))
                    }
                }
            },
        )))
    }
}

/// A response decoded on the way out, counted by the coding decoded.
fn count_decoded(coding: Coding, stats: &Stats) {
    inc(match coding {
        Coding::Br => &stats.decoded_br,
        Coding::Gzip => &stats.decoded_gzip,
        Coding::Zstd => &stats.decoded_zstd,
    });
}

/// The most a body decoded once for a fetch's readers may decode to ([`Conversion::decode_whole`]); a
/// larger one is decoded by each reader as it reads.
pub const DECODED_ONCE_OUT: u64 = 1 << 20;

/// A decoder [`Conversion::decoder`] made, and its share of `decode_memory`, held as long as it is.
struct Decoding {
    decoder: Decoder,
    reserved: Reserved,
}

/// A decoder's share of `decode_memory`, given back when the decoding body ends or is dropped.
pub(crate) struct Reserved {
    stats: Arc<Stats>,
    bytes: u64,
}

impl Reserved {
    /// `bytes` more of the decoders' memory, unless that passes `budget`.
    pub(crate) fn take(stats: &Arc<Stats>, bytes: u64, budget: u64) -> Option<Self> {
        stats
            .decode_memory
            .fetch_update(Relaxed, Relaxed, |held| {
                (held + bytes <= budget).then_some(held + bytes)
            })
            .ok()?;
        Some(Self {
            stats: stats.clone(),
            bytes,
        })
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.stats.decode_memory.fetch_sub(self.bytes, Relaxed);
    }
}

/// Makes the `ETag` weak: the bytes sent are not the origin's (RFC 9110 §8.8.3).
pub fn weaken_etag(headers: &mut HeaderMap) {
    if let Some(etag) = headers.get(header::ETAG) {
        let weak = encoding::weak_etag(etag);
        headers.insert(header::ETAG, weak);
    }
}

/// Adds `Accept-Encoding` to `Vary` unless it is there (or `Vary: *` says it all).
pub fn vary_on_accept_encoding(headers: &mut HeaderMap) {
    let listed = headers
        .get_all(header::VARY)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("").split(','))
        .any(|n| n.trim().eq_ignore_ascii_case("accept-encoding") || n.trim() == "*");
    if !listed {
        headers.append(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    }
}

struct DecodeState {
    inner: Body,
    decoder: Decoder,
    ended: bool,
    /// Decoded bytes produced so far (for ranges).
    offset: u64,
    range: Option<(u64, u64)>,
    /// An error was sent: the body is over.
    failed: bool,
    /// `offset` when the task last let go of its thread.
    yielded_at: u64,
    stats: Arc<Stats>,
    /// Held as long as the decoder is.
    _reserved: Reserved,
}

impl DecodeState {
    /// The next decoded piece to send, `None` at the end.
    async fn next(&mut self) -> Result<Option<Bytes>, BoxError> {
        loop {
            // Decoding a stored body never waits, so the connection would take every piece before writing
            // any: letting go of the thread after the first FIRST_TURN bytes, and every YIELD_EVERY after
            // (also while decoding up to a range's start), sends the head and the first bytes while the
            // rest is decoded and never holds a worker thread for a whole large body. A small body (a
            // playlist) is decoded whole in the first turn and sent with its head and its end in one write.
            let turn = if self.yielded_at == 0 {
                FIRST_TURN
            } else {
                YIELD_EVERY
            };
            if self.offset - self.yielded_at >= turn {
                self.yielded_at = self.offset;
                tokio::task::yield_now().await;
            }
            if self.failed || self.range.is_some_and(|(_, last)| self.offset > last) {
                return Ok(None);
            }
            match self.decoder.piece() {
                Ok(Some(data)) => {
                    add(&self.stats.decoded_bytes, data.len() as u64);
                    let start = self.offset;
                    self.offset += data.len() as u64;
                    let Some((first, last)) = self.range else {
                        return Ok(Some(data));
                    };
                    if self.offset <= first {
                        continue;
                    }
                    let from = first.saturating_sub(start) as usize;
                    let to = ((last + 1).saturating_sub(start) as usize).min(data.len());
                    return Ok(Some(data.slice(from..to)));
                }
                Ok(None) if self.ended => return Ok(None),
                Ok(None) => {}
                Err(e) => {
                    inc(match e {
                        CodecError::TooLarge { .. } => &self.stats.decode_limit,
                        CodecError::Expands { .. } => {
                            tracing::warn!(error = %e, "decoding for a client cut off");
                            &self.stats.decode_expansion
                        }
                        _ => &self.stats.corrupt_bodies,
                    });
                    return Err(e.into());
                }
            }
            match self.inner.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.decoder.feed(data);
                    }
                }
                Some(Err(e)) => return Err(e),
                None => {
                    self.ended = true;
                    self.decoder.end();
                }
            }
        }
    }
}

/// Everything `encoder` has ready, as one piece (empty when it has nothing yet).
pub(crate) fn drain(encoder: &mut Encoder) -> Result<Bytes, CodecError> {
    let mut out = Vec::new();
    while let Some(piece) = encoder.piece()? {
        out.extend_from_slice(&piece);
    }
    Ok(Bytes::from(out))
}

/// What a fill does to the body it streams.
pub enum FillCoding {
    /// Nothing: sent and stored as the origin sent it.
    AsSent,
    /// Compressed as it streams (the response was stored uncompressed in a listed type).
    Compress(Encoder),
    /// The origin's compressed body, checked as it streams so that a truncated or corrupt one is never
    /// stored or delivered as complete; its decoded length is counted for identity clients. Each frame is
    /// held until the next arrives (the last until the check is done): with a `Content-Length`, a client
    /// given every byte would take the body for complete whatever came after.
    Check {
        /// The decoder that checks.
        decoder: Decoder,
        /// The frame held back.
        held: Option<Bytes>,
    },
    /// A compressed body that expanded past the limit: sent on as it is, not stored, not checked further.
    Unchecked,
}

/// Output a fill's check decodes between two yields of its thread.
const CHECK_YIELD: usize = 1 << 20;

/// Input compressed without any output before the compressor is made to flush.
const FLUSH_AFTER: u64 = 256 * 1024;

/// What one origin frame became.
pub enum Pushed {
    /// Pieces to send and store.
    Pieces(Vec<Bytes>),
    /// The body expands past `max_object_size`: stop storing; the pieces still go to the readers.
    OverLimit(Vec<Bytes>),
}

impl FillCoding {
    /// Whether every piece is sent as it is pushed: nothing is held back or added at the end.
    pub fn passes_through(&self) -> bool {
        matches!(self, FillCoding::AsSent | FillCoding::Unchecked)
    }

    /// Decides for a response with `headers` (changed to describe what is stored) under `settings`;
    /// `storing` when the response is being stored, `limit` is `max_object_size`, `forced` a rule's
    /// `compress`.
    pub fn start(
        settings: Option<&Compression>,
        status: http::StatusCode,
        headers: &mut HeaderMap,
        (storing, forced): (bool, Option<bool>),
        limit: u64,
    ) -> Self {
        let Some(settings) = settings else {
            return FillCoding::AsSent;
        };
        if let Some(coding) = storing
            .then(|| encoding::compress_with(status, headers, settings, forced))
            .flatten()
        {
            let level = match coding {
                Coding::Br => settings.brotli_level,
                Coding::Gzip => settings.gzip_level,
                Coding::Zstd => settings.zstd_level,
            };
            headers.insert(
                header::CONTENT_ENCODING,
                HeaderValue::from_static(coding.token()),
            );
            headers.remove(header::CONTENT_LENGTH);
            weaken_etag(headers);
            vary_on_accept_encoding(headers);
            return FillCoding::Compress(Encoder::new(coding, level));
        }
        match encoding::coded(headers) {
            // Only what is stored is checked: what is not goes on as the origin sent it, to clients that
            // decode it themselves (or through a decoder that checks it on the way out).
            Coded::With(coding) if storing => {
                vary_on_accept_encoding(headers);
                FillCoding::Check {
                    decoder: Decoder::new(coding, limit),
                    held: None,
                }
            }
            Coded::With(_) | Coded::Other => {
                vary_on_accept_encoding(headers);
                FillCoding::AsSent
            }
            Coded::Identity => FillCoding::AsSent,
        }
    }

    /// Takes one origin frame. A small frame of a hostile body may decode to `max_object_size`: the check
    /// lets go of its thread every CHECK_YIELD of output, so it never holds a worker for long.
    pub async fn push(&mut self, data: Bytes) -> Result<Pushed, CodecError> {
        match self {
            FillCoding::AsSent | FillCoding::Unchecked => Ok(Pushed::Pieces(vec![data])),
            FillCoding::Compress(encoder) => {
                encoder.feed(data);
                let mut pieces = Vec::new();
                while let Some(piece) = encoder.piece()? {
                    pieces.push(piece);
                }
                // Readers of a slow origin get compressed bytes at least every FLUSH_AFTER of input, not
                // only when the codec has gathered a block (brotli's can be megabytes).
                if encoder.consumed() - encoder.consumed_at_output() >= FLUSH_AFTER {
                    encoder.flush();
                    while let Some(piece) = encoder.piece()? {
                        pieces.push(piece);
                    }
                }
                Ok(Pushed::Pieces(pieces))
            }
            FillCoding::Check { decoder, held } => {
                decoder.feed(data.clone());
                let released: Vec<Bytes> = held.replace(data).into_iter().collect();
                let mut since_yield = 0;
                loop {
                    match decoder.piece() {
                        Ok(Some(piece)) => {
                            since_yield += piece.len();
                            if since_yield >= CHECK_YIELD {
                                since_yield = 0;
                                tokio::task::yield_now().await;
                            }
                        }
                        Ok(None) => return Ok(Pushed::Pieces(released)),
                        Err(CodecError::TooLarge { .. }) => {
                            let mut all = released;
                            all.extend(held.take());
                            *self = FillCoding::Unchecked;
                            return Ok(Pushed::OverLimit(all));
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
        }
    }

    /// Ends the body: the compressor's last pieces, or the check that the coded body ended where the
    /// HTTP body did.
    pub fn finish(&mut self) -> Result<Vec<Bytes>, CodecError> {
        let mut pieces = Vec::new();
        match self {
            FillCoding::AsSent | FillCoding::Unchecked => {}
            FillCoding::Compress(encoder) => {
                encoder.end();
                while let Some(piece) = encoder.piece()? {
                    pieces.push(piece);
                }
            }
            FillCoding::Check { decoder, held } => {
                decoder.end();
                while decoder.piece()?.is_some() {}
                pieces.extend(held.take());
            }
        }
        Ok(pieces)
    }

    /// Counts the compression, and records the decoded length in the headers to store.
    pub fn record(&self, headers: &mut HeaderMap, stats: &Stats) {
        let identity = match self {
            FillCoding::Compress(encoder) => {
                add(&stats.compress_in, encoder.consumed());
                add(&stats.compress_out, encoder.produced());
                encoder.consumed()
            }
            FillCoding::Check { decoder, .. } => decoder.produced(),
            FillCoding::AsSent | FillCoding::Unchecked => return,
        };
        headers.insert(IDENTITY_LENGTH, HeaderValue::from(identity));
    }
}
