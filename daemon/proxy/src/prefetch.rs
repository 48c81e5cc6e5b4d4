//! Prefetch (a route's `prefetch`): objects fetched into the store in the background before players ask
//! for them, named by the media playlists the route serves or by the players' CMCD data. A prefetch is
//! the request a player would make, run through the request phase as one (normalised, denied, routed and
//! ruled alike), then fetched as a background fill coalesced with any client's: a player asking while it
//! is in flight joins it. Never of another host, never beyond `[prefetch]`'s budget, and counted:
//! `prefetched`, `prefetch_hits`, `prefetch_wasted`, `prefetch_dropped`, `prefetch_refused`.

use std::{
    collections::{HashMap, VecDeque},
    hash::BuildHasher,
    net::IpAddr,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use http::{header, request::Parts, HeaderValue, Method, Uri};
use lacquer_config::Prefetch;
use lacquer_policy::{
    hls::{self, NextRequest},
    key::primary_key,
    range::Single,
    request::RequestClass,
    stale::{usability, Usability},
};

use crate::{
    coalesce::Joined,
    coding::Negotiated,
    fetch::{self, forwarded_range, Ask, Fill},
    flow::stored::find_variant,
    phase::{self, Admitted},
    stats::{inc, Stats},
    store::CacheStore,
    worker::Worker,
};

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
/// How often a running prefetch's bytes are counted against `max_rate`.
const CHARGE_EVERY: Duration = Duration::from_millis(100);
/// What a prefetch takes from `max_rate` as it starts, counted towards its first bytes.
const RESERVED: u64 = 64 * 1024;

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
struct Permit<'a>(&'a AtomicUsize);

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

impl Prefetcher {
    fn admit(&self, budget: &Prefetch, now: Instant) -> Option<Permit<'_>> {
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
    fn charge(&self, bytes: i64) {
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

    fn wait_for_request(&self, key: &str, unused_after: Duration, stats: &Stats) {
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
    fn failed(&self, key: &str, stats: &Stats) {
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
    fn listed(
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
    fn asked(&self, host: &str, target: &str, n: usize) -> Vec<Arc<str>> {
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

/// A request's host, as the index of playlists and objects names it.
fn host(parts: &Parts) -> &str {
    parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
}

fn target(parts: &Parts) -> &str {
    parts.uri.path_and_query().map_or("/", |pq| pq.as_str())
}

/// The prefetches a client's request sets off on a route with `prefetch` (`asked`: its head as the client
/// sent it, before the request phase): the objects the playlist lists after the one asked for, and what
/// its CMCD data names.
pub(crate) fn on_request<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    asked: &Parts,
    client: IpAddr,
    secure: bool,
    playlist: usize,
    cmcd: bool,
) {
    let shared = &worker.shared;
    let here = target(asked);
    if playlist > 0 {
        let next = shared.prefetch.asked(host(asked), here, playlist);
        start_listed(worker, asked, client, secure, next);
    }
    if !cmcd {
        return;
    }
    let NextRequest { object, range } = hls::next_request(&asked.headers, asked.uri.query());
    let range = range.map(|(first, last)| Single::From(first, last));
    let next = match object {
        Some(reference) => match hls::resolve(here, &reference) {
            Some(next) => Some(next),
            None => {
                inc(&shared.stats.prefetch_refused);
                tracing::debug!(reference, "CMCD nor leaves the site; not prefetched");
                None
            }
        },
        // A next range of this very object.
        None => range.map(|_| here.to_owned()),
    };
    if let Some(next) = next {
        start(worker, asked, client, secure, next, range, Named::Client);
    }
}

/// Who named the object a prefetch fetches.
#[derive(Clone, Copy, PartialEq)]
enum Named {
    /// A media playlist the origin sent.
    Playlist,
    /// The client, in its CMCD data: any path of the site it chooses.
    Client,
}

/// A new version of a media playlist arrived from the origin (`text`, asked for by a client with `asked`,
/// its head before the request phase): what it lists is remembered, and the objects after the newest ones
/// players asked for are prefetched.
pub(crate) fn on_playlist<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    asked: &Parts,
    client: IpAddr,
    secure: bool,
    n: usize,
    text: &[u8],
) {
    let Some(listed) = std::str::from_utf8(text).ok().and_then(hls::media_objects) else {
        return;
    };
    let base = target(asked);
    let objects = listed
        .into_iter()
        .filter_map(|l| Some((hls::resolve(base, &l.uri)?, l.part)))
        .collect();
    let next = worker
        .shared
        .prefetch
        .listed(host(asked), asked.uri.path(), objects, n);
    start_listed(worker, asked, client, secure, next);
}

/// Prefetches what a playlist lists next (`next`), for the request `asked`.
fn start_listed<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    asked: &Parts,
    client: IpAddr,
    secure: bool,
    next: Vec<Arc<str>>,
) {
    for next in next {
        start(
            worker,
            asked,
            client,
            secure,
            next.to_string(),
            None,
            Named::Playlist,
        );
    }
}

/// Prefetches `target` (a path and query on the host `base` was sent to), or its byte `range`, as the
/// request a player would send with `base`'s fields (as it sent them, before the request phase); nothing
/// when it is stored and fresh, being fetched, not a cacheable GET after the request phase, a blocking
/// playlist reload, beyond the budget, beyond the rate limit of the client that set it off on the
/// target's route, or (`named` by the client) on a route that does not prefetch CMCD's next requests.
fn start<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    base: &Parts,
    client: IpAddr,
    secure: bool,
    target: String,
    range: Option<Single>,
    named: Named,
) {
    let shared = &worker.shared;
    let Ok(uri) = target.parse::<Uri>() else {
        inc(&shared.stats.prefetch_refused);
        return;
    };
    let mut parts = base.clone();
    parts.method = Method::GET;
    parts.uri = uri;
    parts.extensions = http::Extensions::new();
    for name in [
        header::RANGE,
        header::IF_RANGE,
        header::IF_MATCH,
        header::IF_NONE_MATCH,
        header::IF_MODIFIED_SINCE,
        header::IF_UNMODIFIED_SINCE,
        header::CONTENT_LENGTH,
        header::CONTENT_TYPE,
    ] {
        parts.headers.remove(name);
    }
    for name in ["cmcd-request", "cmcd-object", "cmcd-status", "cmcd-session"] {
        parts.headers.remove(name);
    }
    if let Some(range) = range {
        parts.headers.insert(
            header::RANGE,
            HeaderValue::from_str(&range.header()).expect("digits"),
        );
    }
    let worker = worker.clone();
    tokio::spawn(async move {
        let shared = &worker.shared;
        let live = shared.live.load_full();
        let admitted = phase::request(&live, &mut parts, client, secure, None, None);
        let Ok(Admitted {
            route,
            decided,
            class: RequestClass::Lookup,
            body_cap: None,
            ..
        }) = admitted
        else {
            inc(&shared.stats.prefetch_refused);
            return;
        };
        // The origin holds a blocking reload; only a player's own is bounded and timed (`miss`). A
        // client's CMCD names any path of the site: only one whose route prefetches CMCD's next requests
        // itself (a `/search` is no segment), so `nor` reaches no further than the client's own request.
        if crate::hls::playlist(&parts).is_some() || named == Named::Client && !route.prefetch.cmcd
        {
            inc(&shared.stats.prefetch_refused);
            return;
        }
        let key = primary_key(&parts);
        if let Some(negotiation) = route.policy.compression.as_ref() {
            Negotiated::take(&mut parts.headers, negotiation);
        }
        let found = find_variant(&worker, &key, &parts).await;
        let now = lacquer_clock::now_ms();
        let usable = found.as_ref().map(|f| usability(f.meta().lifetime(now)));
        let forwarded = range
            .and_then(|_| {
                forwarded_range(&route, &decided, &parts, || {
                    shared.coalescer.is_hit_for_miss(&key)
                })
            })
            .filter(|_| found.is_none());
        let fetch_key = forwarded.map_or_else(|| key.clone(), |ask: Ask| ask.key(&key));
        // What is stored and fresh, or on its way, takes nothing from the budget: every request at the
        // live edge proposes the same next objects again.
        if usable == Some(Usability::Fresh) || shared.coalescer.in_flight(&fetch_key) {
            return;
        }
        // A prefetch is a request the client made happen: charged to its rate limit on the target's
        // route as its own request would be, so that one request cannot make the origin see many a limit
        // would have refused.
        if let Some(Err(_)) = route.rate_limit.as_ref().map(|l| l.check(client)) {
            inc(&shared.stats.prefetch_refused);
            return;
        }
        let Some(_permit) = shared.prefetch.admit(&live.prefetch, Instant::now()) else {
            inc(&shared.stats.prefetch_dropped);
            return;
        };
        let transit_buffer = route.policy.cache.transit_buffer.as_u64();
        let mark = shared.store.mark();
        let Joined::Leader(fetch) =
            shared
                .coalescer
                .join(&fetch_key, mark, transit_buffer, None, |since| {
                    shared.store.invalidated_after(since, &key)
                })
        else {
            return;
        };
        inc(&shared.stats.prefetched);
        let unused_after = live.prefetch.unused_after;
        drop(live);
        shared
            .prefetch
            .wait_for_request(&key, unused_after, &shared.stats);
        let fill = Fill {
            key: key.clone(),
            registered: true,
            parts: Arc::new(parts),
            asked: None,
            client,
            route,
            decided,
            stale: found.filter(|f| f.revalidatable()),
            background: true,
            stand_in: false,
            part: forwarded,
            if_range: None,
        };
        let mut running = tokio::spawn(fetch::run(worker.clone(), fetch.clone(), fill));
        // Counted as they arrive: a prefetch still running spends the budget of the ones after it.
        let mut charged = RESERVED;
        loop {
            let done = tokio::select! {
                _ = &mut running => true,
                () = tokio::time::sleep(CHARGE_EVERY) => false,
            };
            let received = fetch.received();
            if received > charged || done {
                shared.prefetch.charge(received as i64 - charged as i64);
                charged = received;
            }
            if done {
                break;
            }
        }
        if !fetch.is_complete() {
            shared.prefetch.failed(&key, &shared.stats);
        }
    });
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
