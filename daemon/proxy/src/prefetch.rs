//! Prefetch (a route's `prefetch`): objects fetched into the store in the background before players ask
//! for them, named by the media playlists the route serves or by the players' CMCD data. A prefetch is
//! the request a player would make, run through the request phase as one (normalised, denied, routed and
//! ruled alike), then fetched as a background fill coalesced with any client's: a player asking while it
//! is in flight joins it. Never of another host, never beyond `[prefetch]`'s budget, and counted:
//! `prefetched`, `prefetch_hits`, `prefetch_wasted`, `prefetch_dropped`, `prefetch_refused`.

use std::{
    collections::{HashMap, VecDeque},
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
    fetch::{self, Ask, Fill},
    find_variant, forwarded_range,
    phase::{self, Admitted},
    stats::{inc, Stats},
    store::CacheStore,
    worker::Worker,
};

/// Prefetched objects waiting for their first request, at most: beyond it the oldest counts as wasted.
const MAX_WAITING: usize = 4096;
/// Objects the remembered playlists list, together, at most: the oldest playlists are forgotten first.
const MAX_LISTED: usize = 16_384;
/// A playlist body read for what it lists, at most; a longer one is served and stored, not read.
pub(crate) const MAX_PLAYLIST: usize = 1 << 20;

/// The prefetch state every worker shares: the budget in use, what was prefetched and not yet asked
/// for, and the playlists seen.
#[derive(Default)]
pub struct Prefetcher {
    running: AtomicUsize,
    /// Bytes brought in the current one-second window, and when it began.
    spent: Mutex<(Option<Instant>, u64)>,
    waiting: Mutex<Waiting>,
    /// `waiting`'s length, read without the lock on every lookup.
    waiting_now: AtomicU64,
    playlists: Mutex<Playlists>,
}

#[derive(Default)]
struct Waiting {
    order: VecDeque<(Instant, String)>,
    keys: HashMap<String, Instant>,
}

/// Media playlists by host and path (every version of a live playlist, `_HLS_*` parameters and all, is
/// one), with the objects they list, each as host and target.
#[derive(Default)]
struct Playlists {
    by_name: HashMap<String, Listing>,
    order: VecDeque<String>,
    /// Which playlist lists an object.
    index: HashMap<String, String>,
    listed: usize,
}

struct Listing {
    objects: Vec<(String, bool)>,
    /// The segment and the part (indexed by `part`) listed furthest on that a player has asked for: players
    /// following parts and players following segments each have their own next.
    newest: [Option<String>; 2],
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
        {
            let mut spent = self.spent.lock().expect("prefetch budget");
            if spent
                .0
                .is_none_or(|since| now.duration_since(since) >= Duration::from_secs(1))
            {
                *spent = (Some(now), 0);
            }
            if spent.1 >= budget.max_rate.as_u64() {
                return None;
            }
        }
        let running = self.running.fetch_add(1, Relaxed);
        let permit = Permit(&self.running);
        (running < budget.max_concurrent).then_some(permit)
    }

    fn charge(&self, bytes: u64) {
        self.spent.lock().expect("prefetch budget").1 += bytes;
    }

    /// Counts a client's request for `key` as a prefetch's hit when the key was prefetched and not asked
    /// for since.
    pub(crate) fn claim(&self, key: &str, stats: &Stats) {
        if self.waiting_now.load(Relaxed) == 0 {
            return;
        }
        let mut waiting = self.waiting.lock().expect("prefetch waiting");
        if waiting.keys.remove(key).is_some() {
            inc(&stats.prefetch_hits);
            self.waiting_now.store(waiting.keys.len() as u64, Relaxed);
        }
    }

    fn wait_for_request(&self, key: String, unused_after: Duration, stats: &Stats) {
        let now = Instant::now();
        let mut waiting = self.waiting.lock().expect("prefetch waiting");
        waiting.keys.insert(key.clone(), now);
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
        let mut waiting = self.waiting.lock().expect("prefetch waiting");
        if waiting.keys.remove(key).is_some() {
            inc(&stats.prefetch_wasted);
            self.waiting_now.store(waiting.keys.len() as u64, Relaxed);
        }
    }

    /// Remembers what a new version of the playlist `name` lists; the objects after the newest ones players
    /// have asked for (parts after the newest part, segments after the newest segment), `n` of each at
    /// most.
    fn listed(&self, name: String, objects: Vec<(String, bool)>, n: usize) -> Vec<String> {
        let mut playlists = self.playlists.lock().expect("playlists");
        let newest = playlists
            .forget(&name)
            .map_or_else(Default::default, |old| old.newest);
        let next = newest
            .iter()
            .flatten()
            .flat_map(|newest| after(&objects, newest, n))
            .collect();
        let objects: Vec<(String, bool)> = objects.into_iter().take(MAX_LISTED).collect();
        playlists.listed += objects.len();
        for (object, _) in &objects {
            playlists.index.insert(object.clone(), name.clone());
        }
        playlists
            .by_name
            .insert(name.clone(), Listing { objects, newest });
        playlists.order.push_back(name);
        while playlists.listed > MAX_LISTED {
            let Some(oldest) = playlists.order.front().cloned() else {
                break;
            };
            playlists.forget(&oldest);
        }
        next
    }

    /// A player asked for `object`: the `n` objects its playlist lists after it.
    fn asked(&self, object: &str, n: usize) -> Vec<String> {
        let mut playlists = self.playlists.lock().expect("playlists");
        let Some(name) = playlists.index.get(object).cloned() else {
            return Vec::new();
        };
        let Some(listing) = playlists.by_name.get_mut(&name) else {
            return Vec::new();
        };
        let at = |o: &str| listing.objects.iter().position(|(x, _)| x == o);
        let Some(here) = at(object) else {
            return Vec::new();
        };
        let newest = &mut listing.newest[usize::from(listing.objects[here].1)];
        if newest
            .as_deref()
            .is_none_or(|newest| Some(here) > at(newest))
        {
            *newest = Some(object.to_owned());
        }
        after(&listing.objects, object, n)
    }
}

impl Playlists {
    fn forget(&mut self, name: &str) -> Option<Listing> {
        let listing = self.by_name.remove(name)?;
        self.order.retain(|n| n != name);
        self.listed -= listing.objects.len();
        for (object, _) in &listing.objects {
            if self.index.get(object).is_some_and(|n| n == name) {
                self.index.remove(object);
            }
        }
        Some(listing)
    }
}

/// The `n` objects `objects` lists after `object` that are of its kind.
fn after(objects: &[(String, bool)], object: &str, n: usize) -> Vec<String> {
    let Some(at) = objects.iter().position(|(o, _)| o == object) else {
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

/// What the prefetch of a request on `route` needs from the client's head before the request phase
/// rewrites it (a `[normalize]` may strip the `CMCD` query parameter from the key): its CMCD data.
pub(crate) fn cmcd_sent(parts: &Parts) -> NextRequest {
    hls::next_request(&parts.headers, parts.uri.query())
}

/// The prefetches a client's request (its head as the request phase left it) sets off on a route with
/// `prefetch`: the objects the playlist lists after the one asked for, and what its CMCD data names.
pub(crate) fn on_request<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    parts: &Parts,
    client: IpAddr,
    secure: bool,
    playlist: usize,
    cmcd: NextRequest,
) {
    let shared = &worker.shared;
    let here = target(parts);
    if playlist > 0 {
        let object = format!("{}{}", host(parts), here);
        let host_len = host(parts).len();
        for next in shared.prefetch.asked(&object, playlist) {
            start(
                worker,
                parts,
                client,
                secure,
                next[host_len..].to_owned(),
                None,
            );
        }
    }
    let range = cmcd.range.map(|(first, last)| Single::From(first, last));
    let next = match cmcd.object {
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
        start(worker, parts, client, secure, next, range);
    }
}

/// A new version of a media playlist arrived from the origin (`text`, fetched for `parts`): what it lists
/// is remembered, and the objects after the newest one players asked for are prefetched.
pub(crate) fn on_playlist<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    parts: &Parts,
    client: IpAddr,
    secure: bool,
    n: usize,
    text: &[u8],
) {
    let Some(listed) = std::str::from_utf8(text).ok().and_then(hls::media_objects) else {
        return;
    };
    let host = host(parts);
    let base = target(parts);
    let objects = listed
        .into_iter()
        .filter_map(|l| Some((format!("{host}{}", hls::resolve(base, &l.uri)?), l.part)))
        .collect();
    let name = format!("{host}{}", parts.uri.path());
    for next in worker.shared.prefetch.listed(name, objects, n) {
        start(
            worker,
            parts,
            client,
            secure,
            next[host.len()..].to_owned(),
            None,
        );
    }
}

/// Prefetches `target` (a path and query on the host `base` was sent to), or its byte `range`, as the
/// request a player would send with `base`'s fields; nothing when it is stored and fresh, being
/// fetched, not a cacheable GET after the request phase, or beyond the budget.
fn start<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    base: &Parts,
    client: IpAddr,
    secure: bool,
    target: String,
    range: Option<Single>,
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
        let Some(_permit) = shared.prefetch.admit(&live.prefetch, Instant::now()) else {
            inc(&shared.stats.prefetch_dropped);
            return;
        };
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
        let key = primary_key(&parts);
        if let Some(negotiation) = route.policy.compression.as_ref() {
            Negotiated::take(&mut parts.headers, negotiation);
        }
        let found = find_variant(&worker, &key, &parts).await;
        let now = lacquer_clock::now_ms();
        let usable = found.as_ref().map(|f| usability(f.meta().lifetime(now)));
        if usable == Some(Usability::Fresh) {
            return;
        }
        let forwarded = range
            .and_then(|_| {
                forwarded_range(&route, &decided, &parts, || {
                    shared.coalescer.is_hit_for_miss(&key)
                })
            })
            .filter(|_| found.is_none());
        let fetch_key = forwarded.map_or_else(|| key.clone(), |ask: Ask| ask.key(&key));
        let transit_buffer = route.policy.cache.transit_buffer.as_u64();
        let mark = shared.store.mark();
        let Joined::Leader(fetch) = shared
            .coalescer
            .join(&fetch_key, mark, transit_buffer, None)
        else {
            return;
        };
        inc(&shared.stats.prefetched);
        let unused_after = live.prefetch.unused_after;
        drop(live);
        shared
            .prefetch
            .wait_for_request(key.clone(), unused_after, &shared.stats);
        let fill = Fill {
            key: key.clone(),
            registered: true,
            parts: Arc::new(parts),
            client,
            route,
            decided,
            stale: found.filter(|f| f.revalidatable()),
            background: true,
            stand_in: false,
            part: forwarded,
            if_range: None,
        };
        fetch::run(worker.clone(), fetch.clone(), fill).await;
        shared.prefetch.charge(fetch.received());
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

    #[test]
    fn a_player_asking_sets_off_the_next_of_its_kind_and_a_new_version_what_follows_the_newest() {
        let p = Prefetcher::default();
        let v1 = objects(&[
            ("h/s0.p0", true),
            ("h/s0.p1", true),
            ("h/s0", false),
            ("h/s1.p0", true),
        ]);
        assert!(
            p.listed("h/index".into(), v1, 2).is_empty(),
            "nobody asked yet"
        );
        assert_eq!(p.asked("h/s0.p0", 2), ["h/s0.p1", "h/s1.p0"]);
        assert_eq!(p.asked("h/s0", 2), Vec::<String>::new());
        assert_eq!(p.asked("h/s0.p1", 2), ["h/s1.p0"]);
        assert!(p.asked("h/elsewhere", 2).is_empty());
        let v2 = objects(&[
            ("h/s0.p0", true),
            ("h/s0.p1", true),
            ("h/s0", false),
            ("h/s1.p0", true),
            ("h/s1.p1", true),
        ]);
        assert_eq!(p.listed("h/index".into(), v2, 2), ["h/s1.p0", "h/s1.p1"]);
        // Asking for an older one does not move the newest back.
        p.asked("h/s0.p0", 1);
        let v3 = objects(&[
            ("h/s0.p1", true),
            ("h/s0", false),
            ("h/s1.p2", true),
            ("h/s1", false),
        ]);
        assert_eq!(p.listed("h/index".into(), v3, 4), ["h/s1", "h/s1.p2"]);
    }

    #[test]
    fn what_playlists_list_is_bounded_oldest_playlist_first() {
        let p = Prefetcher::default();
        let many = |tag: &str| -> Vec<(String, bool)> {
            (0..MAX_LISTED / 2 + 1)
                .map(|i| (format!("{tag}/{i}"), false))
                .collect()
        };
        p.listed("a".into(), many("a"), 1);
        p.listed("b".into(), many("b"), 1);
        p.listed("c".into(), many("c"), 1);
        let playlists = p.playlists.lock().unwrap();
        assert!(playlists.listed <= MAX_LISTED);
        assert_eq!(playlists.index.len(), playlists.listed);
        assert!(!playlists.by_name.contains_key("a"));
        assert!(playlists.by_name.contains_key("c"));
    }

    #[test]
    fn a_prefetch_is_a_hit_once_and_wasted_when_nobody_asks() {
        let p = Prefetcher::default();
        let stats = Stats::default();
        let long = Duration::from_secs(60);
        p.wait_for_request("k1".into(), long, &stats);
        p.wait_for_request("k2".into(), long, &stats);
        p.claim("k1", &stats);
        p.claim("k1", &stats);
        assert_eq!(stats.prefetch_hits.load(Relaxed), 1);
        p.failed("k2", &stats);
        assert_eq!(stats.prefetch_wasted.load(Relaxed), 1);
        p.wait_for_request("k3".into(), Duration::ZERO, &stats);
        std::thread::sleep(Duration::from_millis(5));
        p.wait_for_request("k4".into(), Duration::ZERO, &stats);
        assert_eq!(stats.prefetch_wasted.load(Relaxed), 2, "k3 expired unasked");
    }

    #[test]
    fn the_budget_bounds_prefetches_at_once_and_bytes_per_second() {
        let p = Prefetcher::default();
        let budget = Prefetch {
            max_concurrent: 2,
            max_rate: bytesize::ByteSize::b(1000),
            ..Prefetch::default()
        };
        let t0 = Instant::now();
        let a = p.admit(&budget, t0).expect("first");
        let b = p.admit(&budget, t0).expect("second");
        assert!(p.admit(&budget, t0).is_none(), "a third at once");
        drop(a);
        p.charge(1000);
        assert!(
            p.admit(&budget, t0).is_none(),
            "the second's bytes are spent"
        );
        drop(b);
        assert!(p.admit(&budget, t0 + Duration::from_millis(1001)).is_some());
    }
}
