//! Prefetch (a route's `prefetch`): objects fetched into the store in the background before players ask
//! for them, named by the media playlists the route serves or by the players' CMCD data. A prefetch is
//! the request a player would make, run through the request phase as one (normalised, denied, routed and
//! ruled alike), then fetched as a background fill coalesced with any client's: a player asking while it
//! is in flight joins it. Never of another host, never beyond `[prefetch]`'s budget, and counted:
//! `prefetched`, `prefetch_hits`, `prefetch_wasted`, `prefetch_dropped`, `prefetch_refused`.

pub(crate) mod budget;

use std::{
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use http::{header, request::Parts, HeaderValue, Method, Uri};
use lacquer_policy::{
    hls::{self, NextRequest},
    key::primary_key,
    range::Single,
    request::RequestClass,
    stale::{usability, Usability},
};

use self::budget::RESERVED;
use crate::{
    coalesce::{Fetch, Joined},
    coding::Negotiated,
    fetch::{self, forwarded_range, Ask, Fill},
    flow::stored::find_variant,
    phase::{self, Admitted},
    stats::inc,
    store::CacheStore,
    worker::Worker,
};

/// How often a running prefetch's bytes are counted against `max_rate`.
const CHARGE_EVERY: Duration = Duration::from_millis(100);

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

/// Runs a fill for a client's request and, when it brought a media playlist on a route that prefetches from
/// playlists, prefetches what the playlist lists after the newest objects players asked for.
pub(crate) async fn fill<S: CacheStore>(worker: Arc<Worker<S>>, fetch: Arc<Fetch<S>>, fill: Fill) {
    let asked = fill.asked.clone();
    let (client, secure, n) = (
        fill.client,
        fill.decided.secure,
        fill.route.prefetch.playlist,
    );
    let listed = fetch::run(worker.clone(), fetch, fill).await;
    if let (Some(text), Some(asked)) = (listed, asked) {
        on_playlist(&worker, &asked, client, secure, n, &text);
    }
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
fn on_playlist<S: CacheStore>(
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
            note: None,
            trace: None,
            interim: None,
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
