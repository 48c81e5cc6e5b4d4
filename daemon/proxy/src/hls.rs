//! LL-HLS blocking playlist reloads (RFC 8216bis §6.2.5.2): requests carrying `_HLS_msn`, which the
//! origin holds until the playlist version they name exists. Each distinct one costs an origin connection
//! for as long as it is held, so the distinct ones of one playlist at the origin at once are bounded
//! (`cache.blocking_reloads_per_playlist`).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use http::request::Parts;
use lacquer_policy::{hls::blocking_reload, key::primary_key};

/// The blocking reloads at the origin now, by playlist.
#[derive(Default)]
pub struct BlockingReloads {
    at_origin: Arc<Mutex<HashMap<String, usize>>>,
}

/// One blocking reload's place at the origin, given back when dropped: once the origin has answered it,
/// or the request was given up (held by the fetch, not by the client that started it, which may leave
/// while others wait on the same request).
pub(crate) struct Slot {
    at_origin: Arc<Mutex<HashMap<String, usize>>>,
    playlist: String,
}

/// The playlist a blocking reload asks for a version of: its key without the query, so that every
/// `_HLS_*` value counts against one; `None` for any other request.
pub(crate) fn playlist(parts: &Parts) -> Option<String> {
    if !blocking_reload(parts.uri.query()?) {
        return None;
    }
    let mut key = primary_key(parts);
    if let Some(at) = key.find('?') {
        key.truncate(at);
    }
    Some(key)
}

impl BlockingReloads {
    /// A place at the origin for a blocking reload of `playlist`; `None` when `limit` are there already.
    pub(crate) fn take(&self, playlist: String, limit: usize) -> Option<Slot> {
        let mut at_origin = self.at_origin.lock().expect("blocking reloads");
        let n = at_origin.entry(playlist.clone()).or_default();
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(Slot {
            at_origin: self.at_origin.clone(),
            playlist,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut at_origin = self.at_origin.lock().expect("blocking reloads");
        if let Some(n) = at_origin.get_mut(&self.playlist) {
            *n -= 1;
            if *n == 0 {
                at_origin.remove(&self.playlist);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(target: &str) -> Parts {
        http::Request::get(target)
            .header("host", "live.example")
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    #[test]
    fn every_hls_value_of_a_playlist_counts_against_one_bound() {
        let reloads = BlockingReloads::default();
        let name = |t: &str| playlist(&head(t));
        assert_eq!(name("/live/index.m3u8"), None);
        assert_eq!(name("/live/index.m3u8?_HLS_part=1"), None);
        assert_eq!(
            name("/live/index.m3u8?%5FHLS_msn=7"),
            name("/live/index.m3u8?_HLS_msn=5"),
            "an encoded name is the same parameter"
        );
        let a = name("/live/index.m3u8?_HLS_msn=5&_HLS_part=1").unwrap();
        assert_eq!(Some(a.clone()), name("/live/index.m3u8?_HLS_msn=900"));
        let first = reloads.take(a.clone(), 2).expect("one");
        let second = reloads.take(a.clone(), 2).expect("two");
        assert!(reloads.take(a.clone(), 2).is_none(), "a third");
        let other = name("/other/index.m3u8?_HLS_msn=5").unwrap();
        assert!(reloads.take(other, 2).is_some(), "another playlist's own");
        drop(first);
        let third = reloads.take(a.clone(), 2).expect("a place given back");
        drop((second, third));
        assert!(reloads.at_origin.lock().unwrap().is_empty());
    }
}
