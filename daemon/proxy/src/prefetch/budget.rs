//! The prefetch state every worker shares (see [`super`]): the budget in use, what was prefetched and not
//! yet asked for, and the playlists seen, each bounded.

use std::{
    collections::{HashMap, VecDeque},
    hash::BuildHasher,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use lacquer_config::Prefetch;

use crate::stats::{inc, Stats};

/// Prefetched objects waiting for their first request, at most: beyond it the oldest counts as wasted.
const MAX_WAITING: usize = 4096;
/// What the remembered playlists may hold together: their paths and the targets they list, at this many
/// bytes and each object counted with [`PER_OBJECT`] more (its places in the listing and the index). The
/// oldest playlists are forgotten first.
const MAX_LISTED_BYTES: usize = 8 << 20;
const PER_OBJECT: usize = 96;
/// Playlists remembered at most, however little they list.
const MAX_PLAYLISTS: usize = 4096;
/// A playlist body read for what it lists, at most; a longer one is served and stored, not read.
pub(crate) const MAX_PLAYLIST: usize = 1 << 20;
/// What a prefetch takes from `max_rate` as it starts, counted towards its first bytes.
pub(super) const RESERVED: u64 = 64 * 1024;

/// The prefetch state every worker shares: the budget in use, what was prefetched and not yet asked
/// for, and the playlists seen.
#[derive(Default)]
pub struct Prefetcher {
    running: AtomicUsize,
    /// A token bucket of body bytes: filled at `max_rate` a second up to one second's worth, emptied by
    /// what prefetches bring as it arrives, into debt; none starts while it is empty. With when it was last
    /// filled.
    bucket: Mutex<(f64, Option<Instant>)>,
    waiting: Mutex<Waiting>,
    /// `waiting`'s length, read without the lock on every lookup.
    waiting_now: AtomicU64,
    playlists: Mutex<Playlists>,
    /// Hosts and keys are remembered by their hash: what a client sends in them costs nothing here.
    hasher: std::collections::hash_map::RandomState,
}

/// Prefetched keys (by hash) not asked for yet, oldest first.
#[derive(Default)]
struct Waiting {
    order: VecDeque<(Instant, u64)>,
    keys: HashMap<u64, Instant>,
}

/// A playlist or a listed object: its host's hash and its target (path and query) as clients send it.
type Name = (u64, Arc<str>);

/// Media playlists by host and path (every version of a live playlist, `_HLS_*` parameters and all, is
/// one), with the objects they list.
#[derive(Default)]
struct Playlists {
    by_name: HashMap<Name, Listing>,
    /// Oldest first, with the version of the listing each entry was for: an entry whose playlist has been
    /// listed again since is stale, and skipped.
    order: VecDeque<(u64, Name)>,
    /// Which playlist lists an object.
    index: HashMap<Name, Name>,
    bytes: usize,
    versions: u64,
}

struct Listing {
    objects: Vec<(Arc<str>, bool)>,
    /// The segment and the part (indexed by `part`) listed furthest on that a player has asked for: players
    /// following parts and players following segments each have their own next.
    newest: [Option<Arc<str>>; 2],
    version: u64,
    bytes: usize,
}

/// A running prefetch's share of `max_concurrent`.
pub(super) struct Permit<'a>(&'a AtomicUsize);

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

impl Prefetcher {
    pub(super) fn admit(&self, budget: &Prefetch, now: Instant) -> Option<Permit<'_>> {
        let mut bucket = self.bucket.lock().expect("prefetch budget");
        let rate = budget.max_rate.as_u64() as f64;
        bucket.0 = match bucket.1 {
            Some(at) => (bucket.0 + rate * now.duration_since(at).as_secs_f64()).min(rate),
            None => rate,
        };
        bucket.1 = Some(now);
        if bucket.0 <= 0.0 {
            return None;
        }
        let running = self.running.fetch_add(1, Relaxed);
        let permit = Permit(&self.running);
        if running >= budget.max_concurrent {
            return None;
        }
        // Prefetches set off together all start before any byte arrives: each takes some of the budget
        // at once, so that a small one is spent by the first.
        bucket.0 -= RESERVED as f64;
        Some(permit)
    }

    /// Takes `bytes` (given back when negative) from the budget.
    pub(super) fn charge(&self, bytes: i64) {
        self.bucket.lock().expect("prefetch budget").0 -= bytes as f64;
    }

    fn hash(&self, text: &str) -> u64 {
        self.hasher.hash_one(text)
    }

    /// Counts a client's request for `key` as a prefetch's hit when the key was prefetched and not asked
    /// for since.
    pub(crate) fn claim(&self, key: &str, stats: &Stats) {
        if self.waiting_now.load(Relaxed) == 0 {
            return;
        }
        let key = self.hash(key);
        let mut waiting = self.waiting.lock().expect("prefetch waiting");
        if waiting.keys.remove(&key).is_some() {
            inc(&stats.prefetch_hits);
            self.waiting_now.store(waiting.keys.len() as u64, Relaxed);
        }
    }

    pub(super) fn wait_for_request(&self, key: &str, unused_after: Duration, stats: &Stats) {
        let key = self.hash(key);
        let now = Instant::now();
        let mut waiting = self.waiting.lock().expect("prefetch waiting");
        waiting.keys.insert(key, now);
        waiting.order.push_back((now, key));
        while let Some((since, _)) = waiting.order.front() {
            let expired = now.duration_since(*since) > unused_after;
            if !expired && waiting.order.len() <= MAX_WAITING {
                break;
            }
            let (since, key) = waiting.order.pop_front().expect("a front");
            // A key prefetched again since is judged by its newer entry.
            if waiting.keys.get(&key) == Some(&since) {
                waiting.keys.remove(&key);
                inc(&stats.prefetch_wasted);
            }
        }
        self.waiting_now.store(waiting.keys.len() as u64, Relaxed);
    }

    /// A prefetch that brought nothing to store serves nobody.
    pub(super) fn failed(&self, key: &str, stats: &Stats) {
        let key = self.hash(key);
        let mut waiting = self.waiting.lock().expect("prefetch waiting");
        if waiting.keys.remove(&key).is_some() {
            inc(&stats.prefetch_wasted);
            self.waiting_now.store(waiting.keys.len() as u64, Relaxed);
        }
    }

    /// Remembers what a new version of the playlist `path` on `host` lists (targets); the objects after the
    /// newest ones players have asked for (parts after the newest part, segments after the newest
    /// segment), `n` of each at most.
    pub(super) fn listed(
        &self,
        host: &str,
        path: &str,
        objects: Vec<(String, bool)>,
        n: usize,
    ) -> Vec<Arc<str>> {
        let host = self.hash(host);
        let name: Name = (host, Arc::from(path));
        let objects: Vec<(Arc<str>, bool)> = objects
            .into_iter()
            .map(|(target, part)| (Arc::from(target), part))
            .collect();
        let mut playlists = self.playlists.lock().expect("playlists");
        let newest = playlists
            .forget(&name)
            .map_or_else(Default::default, |old| old.newest);
        let next = newest
            .iter()
            .flatten()
            .flat_map(|newest| after(&objects, newest, n))
            .collect();
        let bytes = path.len()
            + objects
                .iter()
                .map(|(t, _)| t.len() + PER_OBJECT)
                .sum::<usize>();
        // A playlist listing nothing kept has no next to give; one larger than all the room is not kept.
        if objects.is_empty() || bytes > MAX_LISTED_BYTES {
            return next;
        }
        for (target, _) in &objects {
            playlists.index.insert((host, target.clone()), name.clone());
        }
        playlists.versions += 1;
        let version = playlists.versions;
        playlists.bytes += bytes;
        playlists.by_name.insert(
            name.clone(),
            Listing {
                objects,
                newest,
                version,
                bytes,
            },
        );
        playlists.order.push_back((version, name));
        while playlists.bytes > MAX_LISTED_BYTES || playlists.by_name.len() > MAX_PLAYLISTS {
            let Some((version, oldest)) = playlists.order.pop_front() else {
                break;
            };
            if playlists
                .by_name
                .get(&oldest)
                .is_some_and(|l| l.version == version)
            {
                playlists.forget(&oldest);
            }
        }
        // Entries left by playlists listed again: dropped once they outnumber the live ones.
        if playlists.order.len() > 2 * playlists.by_name.len() + 64 {
            let Playlists { order, by_name, .. } = &mut *playlists;
            order.retain(|(v, n)| by_name.get(n).is_some_and(|l| l.version == *v));
        }
        next
    }

    /// A player asked for `target` on `host`: the `n` objects its playlist lists after it.
    pub(super) fn asked(&self, host: &str, target: &str, n: usize) -> Vec<Arc<str>> {
        let object: Name = (self.hash(host), Arc::from(target));
        let mut playlists = self.playlists.lock().expect("playlists");
        let Some(name) = playlists.index.get(&object).cloned() else {
            return Vec::new();
        };
        let Some(listing) = playlists.by_name.get_mut(&name) else {
            return Vec::new();
        };
        let at = |o: &str| listing.objects.iter().position(|(x, _)| &**x == o);
        let Some(here) = at(target) else {
            return Vec::new();
        };
        let (listed, part) = listing.objects[here].clone();
        let newest = &mut listing.newest[usize::from(part)];
        if newest
            .as_deref()
            .is_none_or(|newest| Some(here) > at(newest))
        {
            *newest = Some(listed);
        }
        after(&listing.objects, target, n)
    }
}

impl Playlists {
    fn forget(&mut self, name: &Name) -> Option<Listing> {
        let listing = self.by_name.remove(name)?;
        self.bytes -= listing.bytes;
        for (target, _) in &listing.objects {
            let object = (name.0, target.clone());
            if self.index.get(&object).is_some_and(|n| n == name) {
                self.index.remove(&object);
            }
        }
        Some(listing)
    }
}

/// The `n` objects `objects` lists after `object` that are of its kind.
fn after(objects: &[(Arc<str>, bool)], object: &str, n: usize) -> Vec<Arc<str>> {
    let Some(at) = objects.iter().position(|(o, _)| &**o == object) else {
        return Vec::new();
    };
    let part = objects[at].1;
    objects[at + 1..]
        .iter()
        .filter(|(_, p)| *p == part)
        .take(n)
        .map(|(o, _)| o.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objects(names: &[(&str, bool)]) -> Vec<(String, bool)> {
        names.iter().map(|(n, p)| (n.to_string(), *p)).collect()
    }

    fn strings(listed: Vec<Arc<str>>) -> Vec<String> {
        listed.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_player_asking_sets_off_the_next_of_its_kind_and_a_new_version_what_follows_the_newest() {
        let p = Prefetcher::default();
        let v1 = objects(&[
            ("/s0.p0", true),
            ("/s0.p1", true),
            ("/s0", false),
            ("/s1.p0", true),
        ]);
        assert!(
            p.listed("h", "/index", v1, 2).is_empty(),
            "nobody asked yet"
        );
        assert_eq!(strings(p.asked("h", "/s0.p0", 2)), ["/s0.p1", "/s1.p0"]);
        assert!(p.asked("h", "/s0", 2).is_empty());
        assert_eq!(strings(p.asked("h", "/s0.p1", 2)), ["/s1.p0"]);
        assert!(p.asked("h", "/elsewhere", 2).is_empty());
        assert!(
            p.asked("other-host", "/s0.p0", 2).is_empty(),
            "another host's"
        );
        let v2 = objects(&[
            ("/s0.p0", true),
            ("/s0.p1", true),
            ("/s0", false),
            ("/s1.p0", true),
            ("/s1.p1", true),
        ]);
        assert_eq!(
            strings(p.listed("h", "/index", v2, 2)),
            ["/s1.p0", "/s1.p1"]
        );
        // Asking for an older one does not move the newest back.
        p.asked("h", "/s0.p0", 1);
        let v3 = objects(&[
            ("/s0.p1", true),
            ("/s0", false),
            ("/s1.p2", true),
            ("/s1", false),
        ]);
        assert_eq!(strings(p.listed("h", "/index", v3, 4)), ["/s1", "/s1.p2"]);
    }

    #[test]
    fn what_playlists_list_is_bounded_in_bytes_and_count_oldest_first() {
        let p = Prefetcher::default();
        let long = "x".repeat(4096);
        let many = |tag: &str| -> Vec<(String, bool)> {
            (0..1000)
                .map(|i| (format!("/{tag}/{long}/{i}"), false))
                .collect()
        };
        for tag in ["a", "b", "c"] {
            p.listed(&long, &format!("/{tag}/index"), many(tag), 1);
        }
        {
            let playlists = p.playlists.lock().unwrap();
            assert!(playlists.bytes <= MAX_LISTED_BYTES);
            assert!(!playlists
                .by_name
                .contains_key(&(p.hash(&long), Arc::from("/a/index"))));
            assert!(playlists
                .by_name
                .contains_key(&(p.hash(&long), Arc::from("/c/index"))));
            assert_eq!(
                playlists.index.len(),
                playlists
                    .by_name
                    .values()
                    .map(|l| l.objects.len())
                    .sum::<usize>()
            );
        }
        // Listing nothing, or listed again and again, costs nothing that stays.
        for i in 0..3 * MAX_PLAYLISTS {
            p.listed("h", &format!("/empty/{i}"), Vec::new(), 1);
            p.listed("h", "/live/index", objects(&[("/live/s1", false)]), 1);
        }
        let playlists = p.playlists.lock().unwrap();
        assert!(playlists.by_name.len() <= MAX_PLAYLISTS);
        assert!(playlists.order.len() <= 2 * playlists.by_name.len() + 65);
    }

    #[test]
    fn a_prefetch_is_a_hit_once_and_wasted_when_nobody_asks() {
        let p = Prefetcher::default();
        let stats = Stats::default();
        let long = Duration::from_secs(60);
        p.wait_for_request("k1", long, &stats);
        p.wait_for_request("k2", long, &stats);
        p.claim("k1", &stats);
        p.claim("k1", &stats);
        assert_eq!(stats.prefetch_hits.load(Relaxed), 1);
        p.failed("k2", &stats);
        assert_eq!(stats.prefetch_wasted.load(Relaxed), 1);
        p.wait_for_request("k3", Duration::ZERO, &stats);
        std::thread::sleep(Duration::from_millis(5));
        p.wait_for_request("k4", Duration::ZERO, &stats);
        assert_eq!(stats.prefetch_wasted.load(Relaxed), 2, "k3 expired unasked");
        for i in 0..2 * MAX_WAITING {
            p.wait_for_request(&format!("many/{i}"), long, &stats);
        }
        assert!(p.waiting.lock().unwrap().keys.len() <= MAX_WAITING);
    }

    #[test]
    fn the_budget_bounds_prefetches_at_once_and_bytes_per_second() {
        let p = Prefetcher::default();
        let budget = Prefetch {
            max_concurrent: 2,
            max_rate: bytesize::ByteSize::mib(1),
            ..Prefetch::default()
        };
        let t0 = Instant::now();
        let a = p.admit(&budget, t0).expect("first");
        let b = p.admit(&budget, t0).expect("second");
        assert!(p.admit(&budget, t0).is_none(), "a third at once");
        drop(a);
        // Two seconds' worth brought: none starts until the debt is paid, a second and more later.
        p.charge(2 << 20);
        assert!(p.admit(&budget, t0).is_none(), "the bytes are spent");
        drop(b);
        assert!(
            p.admit(&budget, t0 + Duration::from_millis(1100)).is_none(),
            "still in debt"
        );
        assert!(p.admit(&budget, t0 + Duration::from_millis(1500)).is_some());
        // A small budget is spent by the first of prefetches set off together.
        let small = Prefetch {
            max_rate: bytesize::ByteSize::kib(1),
            ..Prefetch::default()
        };
        let p = Prefetcher::default();
        let first = p.admit(&small, t0);
        assert!(first.is_some());
        assert!(p.admit(&small, t0).is_none());
    }
}
