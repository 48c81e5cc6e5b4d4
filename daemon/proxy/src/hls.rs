//! LL-HLS blocking playlist reloads (RFC 8216bis §6.2.5.2): requests carrying `_HLS_msn`, which the
//! origin holds until the playlist version they name exists. Each distinct one costs an origin connection
//! for as long as it is held, so the distinct ones of one playlist at the origin at once are bounded
//! (`cache.blocking_reloads_per_playlist`), and so are those of one client (`blocking_reloads_per_client`)
//! and those on one backend (half its `max_connections`); each waiting client is counted ([`Held`]).

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
};

use http::request::Parts;
use lacquer_policy::{hls::blocking_reload, key::primary_key};

use crate::stats::{add, dec, inc, Stats};

/// The blocking reloads at the origin now: by playlist, by the client that sent each, by backend.
#[derive(Default)]
pub struct BlockingReloads {
    at_origin: Arc<Mutex<AtOrigin>>,
}

#[derive(Default)]
struct AtOrigin {
    playlists: HashMap<String, usize>,
    clients: HashMap<IpAddr, usize>,
    backends: HashMap<String, usize>,
}

/// How many blocking reloads may be at the origin at once.
pub(crate) struct Limits {
    /// Of one playlist (`cache.blocking_reloads_per_playlist`).
    pub per_playlist: usize,
    /// Sent by one client address (`cache.blocking_reloads_per_client`).
    pub per_client: usize,
    /// On the backend they go to, named, at most: half its `max_connections` (none without a limit).
    pub per_backend: Option<(String, usize)>,
}

/// One blocking reload's place at the origin, given back when dropped: once the origin has answered it,
/// or the request was given up (held by the fetch, not by the client that started it, which may leave
/// while others wait on the same request).
pub(crate) struct Slot {
    at_origin: Arc<Mutex<AtOrigin>>,
    playlist: String,
    client: IpAddr,
    backend: Option<String>,
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
    /// A place at the origin for a blocking reload of `playlist` sent by `client`; `Err` with the bound
    /// that is reached when one is.
    pub(crate) fn take(
        &self,
        playlist: String,
        client: IpAddr,
        limits: Limits,
    ) -> Result<Slot, &'static str> {
        let mut guard = self.at_origin.lock().expect("blocking reloads");
        let at = &mut *guard;
        if at.playlists.get(&playlist).copied().unwrap_or(0) >= limits.per_playlist {
            return Err("cache.blocking_reloads_per_playlist");
        }
        if at.clients.get(&client).copied().unwrap_or(0) >= limits.per_client {
            return Err("cache.blocking_reloads_per_client");
        }
        if let Some((name, limit)) = &limits.per_backend {
            if at.backends.get(name).copied().unwrap_or(0) >= *limit {
                return Err("half the backend's max_connections");
            }
            *at.backends.entry(name.clone()).or_default() += 1;
        }
        *at.playlists.entry(playlist.clone()).or_default() += 1;
        *at.clients.entry(client).or_default() += 1;
        Ok(Slot {
            at_origin: self.at_origin.clone(),
            playlist,
            client,
            backend: limits.per_backend.map(|(name, _)| name),
        })
    }
}

/// One less of `key` in `counts`, forgetting it at none.
fn release<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, usize>, key: &K) {
    if let Some(n) = counts.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            counts.remove(key);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut at = self.at_origin.lock().expect("blocking reloads");
        release(&mut at.playlists, &self.playlist);
        release(&mut at.clients, &self.client);
        if let Some(backend) = &self.backend {
            release(&mut at.backends, backend);
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
        let limits = |per_client| Limits {
            per_playlist: 2,
            per_client,
            per_backend: Some(("origin".to_owned(), 3)),
        };
        let (alice, bob) = (IpAddr::from([192, 0, 2, 1]), IpAddr::from([192, 0, 2, 2]));
        let first = reloads.take(a.clone(), alice, limits(8)).expect("one");
        let second = reloads.take(a.clone(), bob, limits(8)).expect("two");
        assert_eq!(
            reloads.take(a.clone(), alice, limits(8)).err(),
            Some("cache.blocking_reloads_per_playlist"),
            "a third"
        );
        let other = name("/other/index.m3u8?_HLS_msn=5").unwrap();
        let fourth = reloads.take(other.clone(), alice, limits(1));
        assert_eq!(
            fourth.err(),
            Some("cache.blocking_reloads_per_client"),
            "alice has one at the origin already"
        );
        let others = reloads
            .take(other.clone(), bob, limits(8))
            .expect("another playlist's own");
        assert_eq!(
            reloads
                .take(name("/third/i.m3u8?_HLS_msn=1").unwrap(), bob, limits(8))
                .err(),
            Some("half the backend's max_connections"),
        );
        drop(first);
        let third = reloads
            .take(a.clone(), alice, limits(8))
            .expect("a place given back");
        drop((second, third, others));
        let at = reloads.at_origin.lock().unwrap();
        assert!(at.playlists.is_empty() && at.clients.is_empty() && at.backends.is_empty());
    }
}
