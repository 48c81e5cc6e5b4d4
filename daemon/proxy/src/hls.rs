//! LL-HLS blocking playlist reloads (RFC 8216bis §6.2.5.2): requests carrying `_HLS_msn`, which the
//! origin holds until the playlist version they name exists. Each distinct one costs an origin connection
//! for as long as it is held, so the distinct ones of one playlist at the origin at once are bounded
//! (`cache.blocking_reloads_per_playlist`), and each waiting client is counted ([`Held`]).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use http::request::Parts;
use lacquer_policy::{hls::blocking_reload, key::primary_key};

use crate::stats::{add, dec, inc, Stats};

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

/// An LL-HLS blocking playlist reload (a request carrying `_HLS_msn`, RFC 8216bis §6.2.5.2) waiting for the
/// origin, which holds it until the playlist version it names exists: counted while it waits, and for how
/// long, however the wait ends (a client that leaves drops it).
pub(crate) struct Held<'a> {
    stats: &'a Stats,
    since: std::time::Instant,
}

impl<'a> Held<'a> {
    pub(crate) fn new(stats: &'a Stats, owner: bool) -> Self {
        inc(&stats.hls_reloads);
        if !owner {
            inc(&stats.hls_reloads_joined);
        }
        inc(&stats.hls_reloads_held);
        Self {
            stats,
            since: std::time::Instant::now(),
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        dec(&self.stats.hls_reloads_held);
        add(
            &self.stats.hls_reload_wait_ms,
            self.since.elapsed().as_millis() as u64,
        );
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
