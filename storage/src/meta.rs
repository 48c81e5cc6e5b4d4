use std::{any::Any, sync::OnceLock};

use http::{HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};

use crate::{chunk::ChunkKey, error::StoreError};

/// First byte of every sled record: bump it when the layout changes so old records are recognised.
const FORMAT_VERSION: u8 = 5;

/// Records written before partial bodies were kept: the variants and their siblings.
const FORMAT_WITHOUT_PARTIALS: u8 = 4;

/// Records written before siblings were kept: the variants alone, read as a set without siblings (a store
/// upgraded in place keeps its objects).
const FORMAT_VARIANTS_ONLY: u8 = 3;

/// What the store knows about one stored response body (one variant of one cache key).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectMeta {
    /// Stable for the cache key and variant.
    pub object: u64,
    /// Unique for this body; never reused, so chunk keys are immutable.
    pub generation: u64,
    /// The request header values the response's `Vary` selected (lower-case names, in `Vary` order); empty when
    /// the response did not vary.
    pub variant: Vec<(String, String)>,
    /// The response's status code.
    pub status: u16,
    /// Response headers as stored (hop-by-hop and `Connection`-listed headers already removed).
    pub headers: Vec<(String, Vec<u8>)>,
    /// Body length in bytes.
    pub length: u64,
    /// The chunk size the body was split with (a store reopened with another chunk size still reads it).
    pub chunk_size: u32,
    /// When the response was received (unix milliseconds): the `response_time` of RFC 9111 §4.2.3.
    pub stored_at_ms: u64,
    /// The corrected initial age at `stored_at_ms`, in seconds (RFC 9111 §4.2.3).
    pub initial_age_s: u64,
    /// Freshness lifetime from `stored_at_ms - initial_age`.
    pub ttl_ms: u64,
    /// How long past freshness the object may be served stale while it is refreshed.
    pub grace_ms: u64,
    /// How long past grace the object is kept for revalidation.
    pub keep_ms: u64,
    /// How long past freshness the object may stand in for a failing origin (`stale-if-error`).
    pub stale_if_error_ms: u64,
    /// `must-revalidate`, `proxy-revalidate` or `no-cache`: never served stale.
    pub no_stale: bool,
    /// Surrogate keys (`Surrogate-Key`, `xkey`, `Cache-Tag`): purging one of them purges the object.
    pub tags: Vec<String>,
    /// The newest ban this object has been tested against (or that existed when its fetch started); bans
    /// after it must still be tested before it is served.
    pub ban_checked: u64,
    /// What the data path made from this copy when first asked for ([`ObjectMeta::prepared`]). Not stored.
    #[serde(skip)]
    pub prepared: Prepared,
}

/// What the data path derives once from one copy of an object's metadata and reuses for every response
/// served from that copy (the hot copy holds one per key): the response head parsed and finished, which a
/// hit clones (its values share their bytes) instead of parsing every name and copying every value. It is
/// a cache of the record, never part of it: a clone of the metadata starts without one (a copy may be given
/// other headers, as a 304's refresh does), and metadata compare equal whatever is prepared. The store does
/// not know its type: what is made from a record is the data path's business.
#[derive(Default)]
pub struct Prepared(OnceLock<Box<dyn Any + Send + Sync>>);

impl Clone for Prepared {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for Prepared {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Prepared {}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "Prepared(made)"
        } else {
            "Prepared"
        })
    }
}

impl ObjectMeta {
    /// How many chunks the body is stored in (0 for an empty body).
    pub fn chunk_count(&self) -> u32 {
        if self.length == 0 {
            0
        } else {
            self.length.div_ceil(u64::from(self.chunk_size)) as u32
        }
    }

    /// The key chunk `index` of this body is stored under.
    pub(crate) fn chunk_key(&self, index: u32) -> ChunkKey {
        ChunkKey {
            object: self.object,
            generation: self.generation,
            index,
        }
    }

    /// Expected length of chunk `index`: every chunk is full but the last.
    pub fn chunk_len(&self, index: u32) -> usize {
        let start = u64::from(index) * u64::from(self.chunk_size);
        (self.length - start).min(u64::from(self.chunk_size)) as usize
    }

    /// Age in seconds at `now_ms` (RFC 9111 §4.2.3: corrected initial age plus resident time).
    pub fn age_s(&self, now_ms: u64) -> u64 {
        self.initial_age_s + now_ms.saturating_sub(self.stored_at_ms) / 1000
    }

    /// Milliseconds of freshness left at `now_ms`; negative once stale.
    pub fn remaining_ttl_ms(&self, now_ms: u64) -> i64 {
        let born = self.stored_at_ms.saturating_sub(self.initial_age_s * 1000);
        (born + self.ttl_ms) as i64 - now_ms as i64
    }

    /// What decides, at `now_ms`, whether the object may answer a request
    /// ([`lacquer_policy::stale::usability`]).
    pub fn lifetime(&self, now_ms: u64) -> lacquer_policy::stale::Lifetime {
        lacquer_policy::stale::Lifetime {
            remaining_ttl_ms: self.remaining_ttl_ms(now_ms),
            grace_ms: self.grace_ms,
            stale_if_error_ms: self.stale_if_error_ms,
            no_stale: self.no_stale,
        }
    }

    /// When the store may forget the object (unix milliseconds): past freshness, grace and keep, and past the
    /// window in which it may stand in for a failing origin.
    pub fn expires_at_ms(&self) -> u64 {
        let born = self.stored_at_ms.saturating_sub(self.initial_age_s * 1000);
        let after = self
            .grace_ms
            .saturating_add(self.keep_ms)
            .max(self.stale_if_error_ms);
        born.saturating_add(self.ttl_ms).saturating_add(after)
    }

    /// The stored headers as a header map, with room for `extra` more fields. A stored field that is no
    /// longer a valid name or value is left out.
    pub fn header_map(&self, extra: usize) -> HeaderMap {
        let mut headers = HeaderMap::with_capacity(self.headers.len() + extra);
        for (name, value) in &self.headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_bytes(value),
            ) {
                headers.append(n, v);
            }
        }
        headers
    }

    /// What `make` derives from this copy of the metadata: made on the first call, shared by the later
    /// ones (see [`Prepared`]). `None` when something of another type was prepared first.
    pub fn prepared<T: Any + Send + Sync>(&self, make: impl FnOnce(&Self) -> T) -> Option<&T> {
        self.prepared
            .0
            .get_or_init(|| Box::new(make(self)))
            .downcast_ref()
    }

    /// Takes the head and freshness of `head`, a newer response carrying a part of the same representation:
    /// the origin's word that the object is unchanged as of that response, as a 304 would be. Identity,
    /// variant, body and tags stay.
    pub fn refresh_from_part(&mut self, head: ObjectMeta) {
        if head.stored_at_ms < self.stored_at_ms {
            return;
        }
        *self = ObjectMeta {
            object: self.object,
            generation: self.generation,
            variant: std::mem::take(&mut self.variant),
            length: self.length,
            chunk_size: self.chunk_size,
            tags: std::mem::take(&mut self.tags),
            ban_checked: self.ban_checked,
            ..head
        };
    }

    /// Its `ETag` and `Last-Modified` values.
    pub fn validators(&self) -> lacquer_policy::range::Validators<'_> {
        (self.header("etag"), self.header("last-modified"))
    }

    /// Its validators as proof of which representation it is ([`lacquer_policy::range::proving`]: a
    /// `Last-Modified` only when strong against its `Date`).
    pub fn proof(&self) -> lacquer_policy::range::Validators<'_> {
        lacquer_policy::range::proving(self.validators(), self.header("date"))
    }

    /// The stored value of header `name` (case-insensitive); the first one when it was repeated.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }
}

/// Another representation of a stored variant's body, made here from it rather than fetched (an identity
/// copy of a body stored gzip'd, for the clients that do not take gzip). It lives and dies with the body it
/// was made from: its freshness, validators and headers are that variant's, every invalidation of the
/// variant removes it, and a new body for the variant leaves it behind, to be dropped when the record is
/// next written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sibling {
    /// The `generation` of the variant body it represents.
    pub of: u64,
    /// Its content coding (a token such as `gzip`); `None` for identity.
    pub coding: Option<String>,
    /// Where its body is: `object`, `generation`, `length` and `chunk_size` (a generation of its own, so
    /// chunk keys stay immutable); the other fields are left empty: the variant's apply.
    pub body: ObjectMeta,
}

impl Sibling {
    /// The representation of variant body `of` in `coding`, whose own body was written as `generation` of
    /// `object`: `length` bytes in chunks of `chunk_size`.
    pub fn new(
        of: u64,
        coding: Option<String>,
        (object, generation): (u64, u64),
        length: u64,
        chunk_size: u32,
    ) -> Self {
        Self {
            of,
            coding,
            body: ObjectMeta {
                object,
                generation,
                length,
                chunk_size,
                ..ObjectMeta::default()
            },
        }
    }
}

/// A variant whose body is stored in parts, as an origin sent byte ranges of it (206 responses, a sliced
/// route's slices): the variant's own metadata is the object's head and freshness, its own body is empty,
/// and the bytes are in the parts, each a body of its own. All parts are byte ranges of one representation:
/// the store takes a part only when its validators and total length are the variant's (see
/// [`ObjectWriter::finish_part`](crate::ObjectWriter::finish_part)), and a response made of them never
/// mixes two versions of the object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partial {
    /// The `generation` of the variant whose body this is.
    pub of: u64,
    /// The representation's whole length in bytes (the `complete-length` of `Content-Range`).
    pub total: u64,
    /// The parts held, in order of their first byte; they may overlap.
    pub parts: Vec<Part>,
}

/// One stored byte range of a [`Partial`] body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    /// Where its first byte is in the representation.
    pub start: u64,
    /// Where its bytes are: `object`, `generation`, `length` and `chunk_size` (a generation of its own, so
    /// chunk keys stay immutable); the other fields are left empty: the variant's apply.
    pub body: ObjectMeta,
}

impl Part {
    /// Bytes `start..` of a representation, whose own body was written as `generation` of `object`:
    /// `length` bytes in chunks of `chunk_size`.
    pub fn new(start: u64, (object, generation): (u64, u64), length: u64, chunk_size: u32) -> Self {
        Self {
            start,
            body: ObjectMeta {
                object,
                generation,
                length,
                chunk_size,
                ..ObjectMeta::default()
            },
        }
    }

    /// One past its last byte.
    pub fn end(&self) -> u64 {
        self.start + self.body.length
    }
}

impl Partial {
    /// The most parts one body is kept in: its record lists them and is rewritten as each arrives (8192: an
    /// object of 64 GiB in slices of 8 MiB). Parts past it are not kept; the bytes are fetched when asked.
    pub const MAX_PARTS: usize = 8192;

    /// The most parts shorter than a chunk (and not the object's last bytes) one body is kept in: clients'
    /// own ranges, forwarded, may be a few bytes each, and every part makes the record longer and its next
    /// rewrite dearer. Past it, a part must bring at least a chunk.
    pub const SMALL_PARTS: usize = 1024;

    /// Whether `part` would add to the body: no part stored holds all its bytes already (a part fetched
    /// twice, or within another), and the body has room for it: parts of overlapping ranges hold at most
    /// twice the representation's length between them.
    pub fn adds(&self, part: &Part) -> bool {
        let small = part.body.length < u64::from(part.body.chunk_size) && part.end() < self.total;
        let room = if small {
            Self::SMALL_PARTS
        } else {
            Self::MAX_PARTS
        };
        let stored: u64 = self.parts.iter().map(|p| p.body.length).sum();
        self.parts.len() < room
            && stored + part.body.length <= self.total.saturating_mul(2)
            && !self
                .parts
                .iter()
                .any(|p| p.start <= part.start && part.end() <= p.end())
    }

    /// The part holding byte `at`, if one does (the one reaching furthest when several do).
    pub fn holding(&self, at: u64) -> Option<&Part> {
        self.parts
            .iter()
            .filter(|p| p.start <= at && at < p.end())
            .max_by_key(|p| p.end())
    }

    /// Bytes held, counted once however the parts overlap.
    pub fn held(&self) -> u64 {
        let (mut held, mut reached) = (0, 0);
        for part in &self.parts {
            let from = part.start.max(reached);
            if part.end() > from {
                held += part.end() - from;
                reached = part.end();
            }
        }
        held
    }

    /// Whether the parts cover the whole representation.
    pub fn is_complete(&self) -> bool {
        self.held() == self.total
    }
}

/// What becomes of a part offered to an object ([`ObjectSet::part_fate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartFate {
    /// It is of the representation variant `variant`'s body holds in `partials[partial]`, whose head and
    /// freshness it refreshes; `adds`: it is kept beside them ([`Partial::adds`]), else forgotten.
    Joins {
        /// The variant it joins.
        variant: usize,
        /// Where that variant's parts are.
        partial: usize,
        /// Whether it is kept beside them.
        adds: bool,
    },
    /// It is forgotten: of an older version than the body stored, or of the version stored whole.
    Refused,
    /// It starts a new variant body of its own, which replaces variant `replaces` when there is one.
    Starts {
        /// The variant it replaces.
        replaces: Option<usize>,
    },
}

/// Whether two stored heads describe the same representation
/// ([`lacquer_policy::range::same_representation`]), so that their byte ranges may be joined.
pub fn same_representation(a: &ObjectMeta, b: &ObjectMeta) -> bool {
    lacquer_policy::range::same_representation(a.proof(), b.proof())
}

/// Every stored variant of one cache key, newest first, and the representations made from them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectSet {
    /// Newest first; at most `max_variants` (the oldest is dropped past it).
    pub variants: Vec<ObjectMeta>,
    /// Representations made from the variants' bodies: at most one per variant body and coding.
    pub siblings: Vec<Sibling>,
    /// The bodies of the variants stored in parts: at most one per variant.
    pub partials: Vec<Partial>,
}

/// The layout of [`FORMAT_VARIANTS_ONLY`] records.
#[derive(Deserialize)]
struct VariantsOnly {
    variants: Vec<ObjectMeta>,
}

/// The layout of [`FORMAT_WITHOUT_PARTIALS`] records.
#[derive(Deserialize)]
struct WithoutPartials {
    variants: Vec<ObjectMeta>,
    siblings: Vec<Sibling>,
}

impl ObjectSet {
    /// A set of `variants` with no siblings.
    pub fn of(variants: Vec<ObjectMeta>) -> Self {
        Self {
            variants,
            siblings: Vec::new(),
            partials: Vec::new(),
        }
    }

    /// The parts of variant body `generation`, when it is stored in parts.
    pub fn partial(&self, generation: u64) -> Option<&Partial> {
        self.partials.iter().find(|p| p.of == generation)
    }

    /// What becomes of `part`, bytes of a representation `total` bytes long whose head is `head`, offered
    /// to the variant body `head` selects: both stores decide by this.
    pub fn part_fate(&self, head: &ObjectMeta, total: u64, part: &Part) -> PartFate {
        let Some(variant) = self.variants.iter().position(|v| v.variant == head.variant) else {
            return PartFate::Starts { replaces: None };
        };
        let current = &self.variants[variant];
        let same = same_representation(current, head);
        match self
            .partials
            .iter()
            .position(|p| p.of == current.generation)
        {
            Some(partial) if same && self.partials[partial].total == total => PartFate::Joins {
                variant,
                partial,
                adds: self.partials[partial].adds(part),
            },
            // A part whose fetch began before the body stored under its selection was is of an older
            // version, which must not replace a newer one; nor does a part of the version stored whole
            // replace it (a range fetched while the whole was).
            partial if current.generation > part.body.generation || (partial.is_none() && same) => {
                PartFate::Refused
            }
            _ => PartFate::Starts {
                replaces: Some(variant),
            },
        }
    }

    /// Where in `siblings` the representation of the variant body `generation` in `coding` (`None`:
    /// identity) is, if one was made.
    pub fn sibling(&self, generation: u64, coding: Option<&str>) -> Option<usize> {
        self.siblings
            .iter()
            .position(|s| s.of == generation && s.coding.as_deref() == coding)
    }

    /// Takes out the siblings whose variant body is no longer in the set, and returns them.
    pub(crate) fn orphans(&mut self) -> Vec<Sibling> {
        let (kept, orphans) = std::mem::take(&mut self.siblings)
            .into_iter()
            .partition(|s| self.variants.iter().any(|v| v.generation == s.of));
        self.siblings = kept;
        orphans
    }

    /// Takes out the parts whose variant body is no longer in the set, and returns them.
    pub(crate) fn orphan_parts(&mut self) -> Vec<Part> {
        let (kept, orphans): (Vec<_>, Vec<_>) = std::mem::take(&mut self.partials)
            .into_iter()
            .partition(|p| self.variants.iter().any(|v| v.generation == p.of));
        self.partials = kept;
        orphans.into_iter().flat_map(|p| p.parts).collect()
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = vec![FORMAT_VERSION];
        bincode::serde::encode_into_std_write(self, &mut out, bincode::config::standard())
            .expect("encoding into a Vec cannot fail");
        out
    }

    pub(crate) fn decode(key: &str, bytes: &[u8]) -> Result<Self, StoreError> {
        let corrupt = |reason: String| StoreError::CorruptMetadata {
            key: key.to_owned(),
            reason,
        };
        fn whole<T: serde::de::DeserializeOwned>(rest: &[u8]) -> Result<T, String> {
            let (value, used) =
                bincode::serde::decode_from_slice(rest, bincode::config::standard())
                    .map_err(|e| e.to_string())?;
            if used != rest.len() {
                return Err(format!("{} trailing bytes", rest.len() - used));
            }
            Ok(value)
        }
        match bytes.split_first() {
            Some((&FORMAT_VERSION, rest)) => whole(rest).map_err(corrupt),
            Some((&FORMAT_WITHOUT_PARTIALS, rest)) => whole(rest)
                .map(|old: WithoutPartials| ObjectSet {
                    variants: old.variants,
                    siblings: old.siblings,
                    partials: Vec::new(),
                })
                .map_err(corrupt),
            Some((&FORMAT_VARIANTS_ONLY, rest)) => whole(rest)
                .map(|old: VariantsOnly| ObjectSet::of(old.variants))
                .map_err(corrupt),
            Some((version, _)) => Err(corrupt(format!("unknown format version {version}"))),
            None => Err(corrupt("empty record".into())),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn meta(length: u64, chunk_size: u32) -> ObjectMeta {
        ObjectMeta {
            object: 7,
            generation: 1,
            variant: vec![("accept-encoding".into(), "gzip".into())],
            status: 200,
            headers: vec![
                ("content-type".into(), b"text/plain".to_vec()),
                ("ETag".into(), b"\"x\"".to_vec()),
            ],
            length,
            chunk_size,
            stored_at_ms: 1_000_000,
            initial_age_s: 5,
            ttl_ms: 60_000,
            grace_ms: 10_000,
            keep_ms: 0,
            stale_if_error_ms: 5_000,
            no_stale: false,
            tags: vec!["t1".into()],
            ban_checked: 3,
            prepared: Prepared::default(),
        }
    }

    #[test]
    fn record_round_trips_with_version_byte() {
        let mut set = ObjectSet::of(vec![meta(10, 4)]);
        set.siblings.push(Sibling {
            of: 1,
            coding: None,
            body: ObjectMeta {
                object: 7,
                generation: 9,
                length: 40,
                chunk_size: 4,
                ..ObjectMeta::default()
            },
        });
        let bytes = set.encode();
        assert_eq!(bytes[0], FORMAT_VERSION);
        assert_eq!(ObjectSet::decode("k", &bytes).unwrap(), set);
    }

    /// A store upgraded in place keeps what it stored before siblings existed.
    #[test]
    fn records_of_the_previous_format_are_read_without_siblings() {
        let variants = vec![meta(10, 4), meta(0, 4)];
        let mut bytes = vec![FORMAT_VARIANTS_ONLY];
        bincode::serde::encode_into_std_write(&variants, &mut bytes, bincode::config::standard())
            .unwrap();
        assert_eq!(
            ObjectSet::decode("k", &bytes).unwrap(),
            ObjectSet::of(variants)
        );
    }

    /// A store upgraded in place keeps what it stored before partial bodies existed.
    #[test]
    fn records_without_partials_are_read_with_none() {
        let sibling = Sibling::new(1, None, (7, 9), 40, 4);
        let old = (vec![meta(10, 4)], vec![sibling.clone()]);
        let mut bytes = vec![FORMAT_WITHOUT_PARTIALS];
        bincode::serde::encode_into_std_write(&old, &mut bytes, bincode::config::standard())
            .unwrap();
        let set = ObjectSet::decode("k", &bytes).unwrap();
        assert_eq!(set.variants, vec![meta(10, 4)]);
        assert_eq!(set.siblings, vec![sibling]);
        assert!(set.partials.is_empty());
    }

    fn part(start: u64, length: u64, generation: u64) -> Part {
        Part {
            start,
            body: ObjectMeta {
                generation,
                length,
                chunk_size: 4,
                ..ObjectMeta::default()
            },
        }
    }

    #[test]
    fn parts_answer_for_the_bytes_they_hold() {
        let partial = Partial {
            of: 1,
            total: 100,
            parts: vec![part(0, 10, 2), part(5, 20, 3), part(40, 10, 4)],
        };
        assert_eq!(partial.holding(0).map(|p| p.body.generation), Some(2));
        assert_eq!(
            partial.holding(7).map(|p| p.body.generation),
            Some(3),
            "the one reaching furthest"
        );
        assert_eq!(partial.holding(24).map(|p| p.body.generation), Some(3));
        assert!(partial.holding(25).is_none());
        assert_eq!(partial.holding(49).map(|p| p.body.generation), Some(4));
        assert!(partial.holding(50).is_none());
        assert_eq!(partial.held(), 35, "overlaps counted once");
        assert!(!partial.is_complete());
        let whole = Partial {
            parts: vec![part(0, 60, 2), part(50, 50, 3)],
            ..partial.clone()
        };
        assert!(whole.is_complete());
    }

    #[test]
    fn a_part_adds_what_is_not_held_while_the_body_has_room() {
        let partial = Partial {
            of: 1,
            total: 100,
            parts: vec![part(0, 10, 2), part(40, 20, 3)],
        };
        let cases = [
            (part(0, 10, 9), false, "fetched twice"),
            (part(45, 5, 9), false, "within one"),
            (part(5, 10, 9), true, "reaching past one"),
            (part(10, 30, 9), true, "between"),
        ];
        for (new, adds, why) in cases {
            assert_eq!(partial.adds(&new), adds, "{why}");
        }
        // `part` cuts chunks of 4 bytes: a part of 2 is small, one of 4 is not, nor are the last bytes.
        let crowded = Partial {
            parts: (0..Partial::SMALL_PARTS as u64)
                .map(|i| part(i * 3, 1, i))
                .collect(),
            total: 10_000,
            ..partial.clone()
        };
        assert!(
            !crowded.adds(&part(5000, 2, 9)),
            "small parts past their cap"
        );
        assert!(crowded.adds(&part(5000, 4, 9)), "a chunk or more");
        assert!(crowded.adds(&part(9998, 2, 9)), "the object's last bytes");
        let full = Partial {
            parts: (0..Partial::MAX_PARTS as u64)
                .map(|i| part(i * 4, 4, i))
                .collect(),
            total: 1 << 20,
            ..partial
        };
        assert!(!full.adds(&part(1 << 19, 4096, 9)), "no room at all");
        let overlapping = Partial {
            of: 1,
            total: 100,
            parts: vec![part(0, 60, 2), part(30, 60, 3)],
        };
        assert!(overlapping.adds(&part(50, 50, 9)), "200 bytes in all");
        assert!(!overlapping.adds(&part(19, 81, 9)), "past twice the length");
    }

    #[test]
    fn what_becomes_of_a_part_offered() {
        // Variant body 5 in parts of a 100-byte representation tagged "x"; its selection is meta()'s.
        let in_parts = ObjectSet {
            variants: vec![ObjectMeta {
                generation: 5,
                ..meta(0, 4)
            }],
            siblings: Vec::new(),
            partials: vec![Partial {
                of: 5,
                total: 100,
                parts: vec![part(0, 8, 6)],
            }],
        };
        let whole = ObjectSet::of(vec![ObjectMeta {
            generation: 5,
            ..meta(100, 4)
        }]);
        let tagged = |etag: &[u8]| {
            let mut head = meta(0, 4);
            head.headers[1].1 = etag.to_vec();
            head
        };
        let other = ObjectMeta {
            variant: vec![("accept-encoding".into(), "br".into())],
            ..meta(0, 4)
        };
        let joins = |adds| PartFate::Joins {
            variant: 0,
            partial: 0,
            adds,
        };
        let cases = [
            (
                &in_parts,
                tagged(b"\"x\""),
                100,
                part(8, 8, 9),
                joins(true),
                "the next part",
            ),
            (
                &in_parts,
                tagged(b"\"x\""),
                100,
                part(2, 4, 9),
                joins(false),
                "within one",
            ),
            (
                &in_parts,
                tagged(b"\"y\""),
                100,
                part(8, 8, 9),
                PartFate::Starts { replaces: Some(0) },
                "a new version",
            ),
            (
                &in_parts,
                tagged(b"\"x\""),
                90,
                part(8, 8, 9),
                PartFate::Starts { replaces: Some(0) },
                "another length",
            ),
            (
                &in_parts,
                tagged(b"\"y\""),
                100,
                part(8, 8, 4),
                PartFate::Refused,
                "older than the body",
            ),
            (
                &whole,
                tagged(b"\"x\""),
                100,
                part(8, 8, 9),
                PartFate::Refused,
                "of the version stored whole",
            ),
            (
                &whole,
                tagged(b"\"y\""),
                100,
                part(8, 8, 9),
                PartFate::Starts { replaces: Some(0) },
                "a new version of the whole",
            ),
            (
                &whole,
                other,
                100,
                part(8, 8, 9),
                PartFate::Starts { replaces: None },
                "another variant",
            ),
        ];
        for (set, head, total, offered, fate, why) in cases {
            assert_eq!(set.part_fate(&head, total, &offered), fate, "{why}");
        }
    }

    #[test]
    fn parts_go_with_their_variant_body() {
        let mut set = ObjectSet::of(vec![meta(0, 4)]);
        set.partials = vec![
            Partial {
                of: 1,
                total: 10,
                parts: vec![part(0, 4, 5)],
            },
            Partial {
                of: 2,
                total: 10,
                parts: vec![part(0, 4, 6), part(4, 4, 7)],
            },
        ];
        assert_eq!(set.partial(1).map(|p| p.parts.len()), Some(1));
        let orphans = set.orphan_parts();
        assert_eq!(orphans, vec![part(0, 4, 6), part(4, 4, 7)]);
        assert_eq!(set.partials.len(), 1);
        let bytes = set.encode();
        assert_eq!(ObjectSet::decode("k", &bytes).unwrap(), set);
    }

    #[test]
    fn a_part_of_the_same_representation_refreshes_the_head_but_not_its_identity() {
        let mut current = meta(0, 4);
        let newer = ObjectMeta {
            object: 99,
            generation: 98,
            headers: vec![
                ("ETag".into(), b"\"x\"".to_vec()),
                ("x-new".into(), b"1".to_vec()),
            ],
            stored_at_ms: 2_000_000,
            ttl_ms: 5,
            tags: vec!["other".into()],
            variant: Vec::new(),
            ..meta(0, 4)
        };
        assert!(same_representation(&current, &newer));
        current.refresh_from_part(newer);
        assert_eq!((current.object, current.generation), (7, 1));
        assert_eq!((current.stored_at_ms, current.ttl_ms), (2_000_000, 5));
        assert_eq!(current.tags, vec!["t1".to_owned()]);
        assert_eq!(current.variant, meta(0, 4).variant);
        assert_eq!(current.header("x-new"), Some(&b"1"[..]));
        let older = ObjectMeta {
            stored_at_ms: 1,
            ..meta(0, 4)
        };
        current.refresh_from_part(older);
        assert_eq!(
            current.stored_at_ms, 2_000_000,
            "an older response changes nothing"
        );
    }

    #[test]
    fn siblings_without_their_variant_body_are_orphans() {
        let sibling = |of, coding: Option<&str>| Sibling {
            of,
            coding: coding.map(String::from),
            body: ObjectMeta::default(),
        };
        let mut set = ObjectSet::of(vec![meta(10, 4)]);
        set.siblings = vec![sibling(1, None), sibling(2, None), sibling(1, Some("gzip"))];
        assert_eq!(set.sibling(1, Some("gzip")), Some(2));
        assert_eq!(set.sibling(2, Some("gzip")), None);
        assert_eq!(set.orphans(), vec![sibling(2, None)]);
        assert_eq!(
            set.siblings,
            vec![sibling(1, None), sibling(1, Some("gzip"))]
        );
    }

    #[test]
    fn unknown_version_and_garbage_are_reported() {
        let mut bytes = ObjectSet::default().encode();
        bytes[0] = 99;
        assert!(ObjectSet::decode("k", &bytes)
            .unwrap_err()
            .to_string()
            .contains("unknown format version 99"));
        assert!(ObjectSet::decode("k", &[]).is_err());
        assert!(ObjectSet::decode("k", &[FORMAT_VERSION, 0xff, 0xff]).is_err());
    }

    #[test]
    fn what_is_prepared_is_made_once_per_copy_and_never_copied() {
        let m = meta(1, 4);
        let made = || m.prepared(|m| m.header_map(0)).unwrap();
        assert_eq!(made().get("etag").unwrap(), "\"x\"");
        assert_eq!(made().get("content-type").unwrap(), "text/plain");
        assert!(std::ptr::eq(made(), made()), "made once");
        assert!(m.prepared(|_| 7u8).is_none(), "of one type only");
        let refreshed = ObjectMeta {
            headers: vec![("ETag".into(), b"\"y\"".to_vec())],
            ..m.clone()
        };
        let head = refreshed.prepared(|m| m.header_map(0)).unwrap();
        assert_eq!(head.get("etag").unwrap(), "\"y\"");
        assert!(head.get("content-type").is_none());
        assert_eq!(
            m,
            ObjectMeta { ..m.clone() },
            "what is prepared is not compared"
        );
    }

    #[test]
    fn chunk_layout() {
        let m = meta(10, 4);
        assert_eq!(m.chunk_count(), 3);
        assert_eq!((m.chunk_len(0), m.chunk_len(1), m.chunk_len(2)), (4, 4, 2));
        assert_eq!(meta(0, 4).chunk_count(), 0);
        assert_eq!(meta(8, 4).chunk_count(), 2);
    }

    #[test]
    fn age_and_freshness() {
        let m = meta(1, 4);
        assert_eq!(m.age_s(1_000_000), 5);
        assert_eq!(m.age_s(1_010_500), 15);
        assert_eq!(m.remaining_ttl_ms(1_000_000), 55_000);
        assert_eq!(m.remaining_ttl_ms(1_060_000), -5_000);
        assert_eq!(m.expires_at_ms(), 1_000_000 - 5_000 + 70_000);
        let kept_for_errors = ObjectMeta {
            stale_if_error_ms: 3_600_000,
            ..m.clone()
        };
        assert_eq!(
            kept_for_errors.expires_at_ms(),
            1_000_000 - 5_000 + 60_000 + 3_600_000
        );
        assert_eq!(m.header("etag"), Some(&b"\"x\""[..]));
    }
}
