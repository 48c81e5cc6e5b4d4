use serde::{Deserialize, Serialize};

use crate::{chunk::ChunkKey, error::StoreError};

/// First byte of every sled record: bump it when the layout changes so old records are recognised.
const FORMAT_VERSION: u8 = 3;

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

    /// The stored value of header `name` (case-insensitive); the first one when it was repeated.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    pub(crate) fn approx_size(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(n, v)| n.len() + v.len() + 48)
            .sum();
        let variant: usize = self
            .variant
            .iter()
            .map(|(n, v)| n.len() + v.len() + 48)
            .sum();
        let tags: usize = self.tags.iter().map(|t| t.len() + 24).sum();
        std::mem::size_of::<Self>() + headers + variant + tags
    }
}

/// Every stored variant of one cache key, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectSet {
    /// Newest first; at most `max_variants` (the oldest is dropped past it).
    pub variants: Vec<ObjectMeta>,
}

impl ObjectSet {
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
        match bytes.split_first() {
            Some((&FORMAT_VERSION, rest)) => {
                let (set, used) =
                    bincode::serde::decode_from_slice(rest, bincode::config::standard())
                        .map_err(|e| corrupt(e.to_string()))?;
                if used != rest.len() {
                    return Err(corrupt(format!("{} trailing bytes", rest.len() - used)));
                }
                Ok(set)
            }
            Some((version, _)) => Err(corrupt(format!("unknown format version {version}"))),
            None => Err(corrupt("empty record".into())),
        }
    }

    pub(crate) fn approx_size(&self) -> usize {
        64 + self
            .variants
            .iter()
            .map(ObjectMeta::approx_size)
            .sum::<usize>()
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
        }
    }

    #[test]
    fn record_round_trips_with_version_byte() {
        let set = ObjectSet {
            variants: vec![meta(10, 4)],
        };
        let bytes = set.encode();
        assert_eq!(bytes[0], FORMAT_VERSION);
        assert_eq!(ObjectSet::decode("k", &bytes).unwrap(), set);
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
