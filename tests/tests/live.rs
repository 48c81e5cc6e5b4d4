//! Low-Latency HLS through lacquerd, end to end: a scripted live origin that makes a new 200 ms part every
//! 200 ms, holds blocking playlist reloads (`_HLS_msn`, `_HLS_part`) and requests for a preload-hinted part
//! until that part exists, and players following the live edge. What the origin is asked for is checked as
//! well as what every player gets.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use bytes::Bytes;
use lacquer_tests::{eventually, get, ClientReply, Daemon, Origin, Reply};

const PART: Duration = Duration::from_millis(200);
const PARTS_PER_SEGMENT: u64 = 4;
const PART_BYTES: u64 = 3000;
/// How long the origin holds a blocking request at most; a part further ahead is refused (400), as RFC
/// 8216bis §6.2.5.2 has a server refuse an `_HLS_msn` too far ahead.
const HOLD: Duration = Duration::from_secs(3);

/// Part `k`'s bytes: a pattern shifted by `k`, so a part served for another is caught.
fn part_body(k: u64) -> Bytes {
    (0..PART_BYTES)
        .map(|i| ((i + k * 13) % 251) as u8)
        .collect()
}

fn part_uri(k: u64) -> String {
    format!("s{}.p{}.m4s", k / PARTS_PER_SEGMENT, k % PARTS_PER_SEGMENT)
}

/// When part `k` exists at the origin: the end of the 200 ms it covers.
fn made_at(t0: Instant, k: u64) -> Instant {
    t0 + PART * (k as u32 + 1)
}

/// The media playlist once part `last` exists: every part so far and a preload hint for the next one.
fn playlist(last: u64) -> String {
    let mut text = String::from(
        "#EXTM3U\n#EXT-X-VERSION:9\n#EXT-X-TARGETDURATION:1\n#EXT-X-PART-INF:PART-TARGET=0.2\n\
         #EXT-X-SERVER-CONTROL:CAN-BLOCK-RELOAD=YES,PART-HOLD-BACK=0.6\n#EXT-X-MEDIA-SEQUENCE:0\n",
    );
    for k in 0..=last {
        text += &format!("#EXT-X-PART:DURATION=0.2,URI=\"{}\"\n", part_uri(k));
        if k % PARTS_PER_SEGMENT == PARTS_PER_SEGMENT - 1 {
            text += &format!("#EXTINF:0.8,\ns{}.m4s\n", k / PARTS_PER_SEGMENT);
        }
    }
    text + &format!(
        "#EXT-X-PRELOAD-HINT:TYPE=PART,URI=\"{}\"\n",
        part_uri(last + 1)
    )
}

/// The part a blocking reload's `_HLS_msn` and `_HLS_part` name, if they are there.
fn blocking(query: &str) -> Option<u64> {
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some(param("_HLS_msn")? * PARTS_PER_SEGMENT + param("_HLS_part").unwrap_or(0))
}

/// The live origin, making parts from `t0` on.
async fn live_origin(t0: Instant) -> Origin {
    Origin::start(move |seen| {
        let now = Instant::now();
        let made = (now.saturating_duration_since(t0).as_millis() / PART.as_millis()) as u64;
        // Held until the part exists; refused when that is further ahead than a hold.
        let wait_for = |k: u64| {
            let at = made_at(t0, k);
            (at <= now + HOLD).then(|| at.saturating_duration_since(now))
        };
        let (path, query) = seen.path.split_once('?').unwrap_or((&seen.path, ""));
        let (reply, delay) = if path == "/live/index.m3u8" {
            match blocking(query) {
                None => (Reply::ok(playlist(made.saturating_sub(1))), Duration::ZERO),
                Some(k) => match wait_for(k) {
                    Some(delay) => (Reply::ok(playlist(k)), delay),
                    None => (Reply::ok("too far ahead").status(400), Duration::ZERO),
                },
            }
        } else if let Some(name) = path.strip_prefix("/live/s") {
            let (n, p) = name
                .trim_end_matches(".m4s")
                .split_once(".p")
                .expect("a part's name");
            let k = n.parse::<u64>().unwrap() * PARTS_PER_SEGMENT + p.parse::<u64>().unwrap();
            match wait_for(k) {
                Some(delay) => (Reply::ok(part_body(k)), delay),
                None => (Reply::ok("too far ahead").status(400), Duration::ZERO),
            }
        } else {
            (Reply::ok("no such thing").status(404), Duration::ZERO)
        };
        // An answer to a blocking reload is one version of the playlist, kept longer than the plain
        // playlist (as LL-HLS origins do): a player that starts late and asks for an early version a
        // second after the others is then still answered from the cache, and a second origin request for
        // a version can only be a fill that was not shared.
        let mut reply = reply.header(
            "cache-control",
            if path.ends_with(".m3u8") && blocking(query).is_none() {
                "max-age=1"
            } else {
                "max-age=60"
            },
        );
        reply.delay = delay;
        reply
    })
    .await
}

/// The part a playlist hints at.
fn hinted(playlist: &[u8]) -> u64 {
    let text = std::str::from_utf8(playlist).expect("a playlist");
    let uri = text
        .lines()
        .find_map(|l| l.strip_prefix("#EXT-X-PRELOAD-HINT:TYPE=PART,URI=\""))
        .expect("a preload hint")
        .trim_end_matches('"');
    let (n, p) = uri
        .trim_end_matches(".m4s")
        .trim_start_matches('s')
        .split_once(".p")
        .unwrap();
    n.parse::<u64>().unwrap() * PARTS_PER_SEGMENT + p.parse::<u64>().unwrap()
}

/// One player at the live edge until `until`: the playlist, then each hinted part asked for before it
/// exists, with the blocking reload that announces the part after it. Returns, per part, how long after
/// the origin made it the player had all of it.
async fn player(addr: SocketAddr, t0: Instant, until: Instant) -> Vec<(u64, Duration)> {
    let first = get(addr, "/live/index.m3u8").await;
    assert_eq!(first.status, 200);
    let mut next = hinted(&first.body);
    let mut got = Vec::new();
    while Instant::now() < until {
        let reload = format!(
            "/live/index.m3u8?_HLS_msn={}&_HLS_part={}",
            next / PARTS_PER_SEGMENT,
            next % PARTS_PER_SEGMENT
        );
        let part_path = format!("/live/{}", part_uri(next));
        let (part, reload) = tokio::join!(get(addr, &part_path), get(addr, &reload));
        let latency = Instant::now().saturating_duration_since(made_at(t0, next));
        assert_eq!(part.status, 200, "{part_path}");
        assert!(
            part.body == part_body(next),
            "{part_path}: another part's bytes"
        );
        assert_eq!(reload.status, 200);
        assert_eq!(
            hinted(&reload.body),
            next + 1,
            "the reload announces the next part"
        );
        got.push((next, latency));
        next += 1;
    }
    got
}

#[tokio::test(flavor = "multi_thread")]
async fn players_at_the_live_edge_cost_the_origin_one_request_per_part_and_playlist_version() {
    let t0 = Instant::now();
    let origin = live_origin(t0).await;
    let d = Daemon::start(origin.addr, &[]);
    // A few parts exist before the players join.
    tokio::time::sleep(made_at(t0, 3).saturating_duration_since(Instant::now())).await;
    let until = Instant::now() + Duration::from_secs(3);
    let players: Vec<_> = (0..100)
        .map(|_| tokio::spawn(player(d.addr, t0, until)))
        .collect();
    let mut latencies = Vec::new();
    for p in players {
        let got = p.await.expect("a player");
        assert!(
            got.len() >= 10,
            "a player kept up with the edge: {} parts",
            got.len()
        );
        let parts: Vec<u64> = got.iter().map(|(k, _)| *k).collect();
        assert!(
            parts.windows(2).all(|w| w[1] == w[0] + 1),
            "no part skipped"
        );
        latencies.extend(got.into_iter().map(|(_, l)| l));
    }
    for (path, n) in origin.counts() {
        if path.starts_with("/live/s") || path.contains("_HLS_msn") {
            assert_eq!(n, 1, "{path} asked of the origin {n} times");
        }
    }
    let stats = d.stats().await;
    let proxy = &stats["proxy"];
    let versions = origin
        .counts()
        .keys()
        .filter(|path| path.contains("_HLS_msn"))
        .count() as u64;
    let counted = |name: &str| proxy[name].as_u64().unwrap();
    assert!(counted("hls_reloads") >= versions, "{proxy}");
    assert!(
        counted("hls_reloads_joined") > 0,
        "players joined each other's reloads: {proxy}"
    );
    assert!(counted("hls_reload_wait_ms") > 0, "{proxy}");
    assert_eq!(
        counted("hls_reloads_held"),
        0,
        "none held once all answered"
    );
    latencies.sort();
    let at = |q: usize| latencies[(latencies.len() - 1) * q / 100];
    // A reading, not a target (targets live in bench/): what the cache adds between the origin making a
    // part and 100 players holding all of it, on this machine's loopback and a debug build.
    eprintln!(
        "part delivery after it was made: p50 {:?}, p99 {:?}, max {:?} over {} parts",
        at(50),
        at(99),
        latencies.last().unwrap(),
        latencies.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_blocking_reload_too_far_ahead_gets_the_origins_refusal_at_once() {
    let t0 = Instant::now();
    let origin = live_origin(t0).await;
    let d = Daemon::start(origin.addr, &[]);
    let asked = Instant::now();
    let r = get(d.addr, "/live/index.m3u8?_HLS_msn=10000&_HLS_part=0").await;
    assert_eq!(r.status, 400);
    assert!(
        asked.elapsed() < HOLD,
        "answered without holding the connection"
    );
    let part = get(d.addr, "/live/s10000.p0.m4s").await;
    assert_eq!(part.status, 400);
}

/// Freshness is kept to the millisecond: a playlist with `max-age=1` is fresh for one second after the
/// origin sent it (not for anything up to two, as a cache counting whole seconds would), and a rule's TTL
/// below a second (`ttl = "400ms"`, which NGINX cannot set) holds as set.
#[tokio::test(flavor = "multi_thread")]
async fn a_playlists_freshness_is_kept_to_the_millisecond() {
    let origin = Origin::start(|seen| {
        Reply::ok(format!("#EXTM3U\n# {}\n", seen.path)).header("cache-control", "max-age=1")
    })
    .await;
    let d = Daemon::with_config(
        origin.addr,
        "[[listen]]\naddress = \"127.0.0.1:0\"\n\
         [[rule]]\nname = \"fast\"\non = \"backend_response\"\n\
         match = { path_prefix = [\"/fast/\"] }\nttl = \"400ms\"\n",
    );
    // A hit is asked for this long after the miss was sent (the origin answered later), and a miss this
    // long after its answer came: margins of a few hundred milliseconds either way.
    for (path, fresh, stale) in [
        ("/live/index.m3u8", 500, 1400),
        ("/fast/index.m3u8", 100, 700),
    ] {
        let sent = Instant::now();
        assert_eq!(get(d.addr, path).await.header("x-cache"), "MISS");
        let answered = Instant::now();
        tokio::time::sleep(Duration::from_millis(fresh).saturating_sub(sent.elapsed())).await;
        let hit = get(d.addr, path).await;
        assert_eq!((path, hit.header("x-cache")), (path, "HIT"));
        assert_eq!(hit.header("age"), "0", "{path}: under a second old");
        tokio::time::sleep(Duration::from_millis(stale).saturating_sub(answered.elapsed())).await;
        assert_eq!(get(d.addr, path).await.header("x-cache"), "MISS", "{path}");
        assert_eq!(origin.count(path), 2);
    }
}

/// A byte range of a segment the origin is still producing (LL-HLS parts addressed as ranges of their
/// segment): answered `206` at once with `Content-Range: bytes a-b/*` (or `a-*/*` for an open range, which
/// a preload hint's `BYTERANGE-START` asks for), its bytes sent as the origin makes them, every player on
/// one origin request; once the segment is complete, ranges come from the store with its length.
#[tokio::test(flavor = "multi_thread")]
async fn ranges_of_a_growing_segment_stream_as_it_grows_and_come_from_the_store_once_whole() {
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let last_gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let parts: Vec<Bytes> = (0..4).map(part_body).collect();
    let whole: Vec<u8> = parts.iter().flat_map(|p| p.to_vec()).collect();
    let origin = {
        let (gate, last_gate, parts) = (gate.clone(), last_gate.clone(), parts.clone());
        Origin::start(move |_| {
            use lacquer_tests::Step;
            // Parts 0 and 1 at once, 2 and 3 each once the test opens its gate: the segment is growing.
            let steps = vec![
                Step::Data(parts[0].clone()),
                Step::Data(parts[1].clone()),
                Step::Gate(gate.clone()),
                Step::Data(parts[2].clone()),
                Step::Gate(last_gate.clone()),
                Step::Data(parts[3].clone()),
            ];
            Reply::ok("")
                .header("cache-control", "max-age=60")
                .header("content-type", "video/mp4")
                .steps(steps, None)
        })
        .await
    };
    let d = Daemon::start(origin.addr, &[]);
    let ranged = |range: &'static str| {
        let addr = d.addr;
        tokio::spawn(async move {
            lacquer_tests::request(
                addr,
                http::Method::GET,
                "/seg/s0.mp4",
                &[("range", range)],
                Bytes::new(),
            )
            .await
            .expect("a ranged answer")
        })
    };
    let n = PART_BYTES;
    // Part 1, asked for while the segment is growing: all of it is there already.
    let first = ranged("bytes=3000-5999").await.unwrap();
    assert_eq!(first.status, 206);
    assert_eq!(
        first.header("content-range"),
        format!("bytes {n}-{}/*", 2 * n - 1)
    );
    assert_eq!(first.body, parts[1]);
    // Part 2 (closed) and the rest from part 2 on (open), asked for before they exist.
    let closed = ranged("bytes=6000-8999");
    let open = ranged("bytes=6000-");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !closed.is_finished() && !open.is_finished(),
        "held for bytes not made yet"
    );
    // Part 2 made: the closed range has all its bytes; the open one runs on with the segment.
    gate.notify_one();
    let closed = closed.await.unwrap();
    assert_eq!(closed.status, 206);
    assert_eq!(closed.header("content-range"), "bytes 6000-8999/*");
    assert_eq!(closed.header("content-length"), "3000");
    assert_eq!(closed.body, parts[2]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!open.is_finished(), "an open range ends with the segment");
    last_gate.notify_one();
    let open = open.await.unwrap();
    assert_eq!(open.status, 206);
    assert_eq!(open.header("content-range"), "bytes 6000-*/*");
    assert_eq!(open.header("content-length"), "");
    assert_eq!(open.body, whole[6000..]);
    assert_eq!(origin.count("/seg/s0.mp4"), 1, "one origin request for all");
    // Whole and stored: the length is known.
    let stored = eventually(Duration::from_secs(5), || async {
        let r = lacquer_tests::request(
            d.addr,
            http::Method::GET,
            "/seg/s0.mp4",
            &[("range", "bytes=3000-5999")],
            Bytes::new(),
        )
        .await
        .unwrap();
        (r.x_cache() == "HIT").then_some(r)
    })
    .await;
    assert_eq!(stored.header("content-range"), "bytes 3000-5999/12000");
    assert_eq!(stored.body, parts[1]);
    assert_eq!(origin.count("/seg/s0.mp4"), 1);
    let proxy = &d.stats().await["proxy"];
    assert_eq!(proxy["ranges_growing"].as_u64(), Some(3), "{proxy}");
}

fn reload_of(addr: SocketAddr, path: &'static str) -> tokio::task::JoinHandle<ClientReply> {
    tokio::spawn(async move { get(addr, path).await })
}

/// A segment origin for the prefetch tests: `/NAME` is 2000 bytes made from NAME, cacheable, after
/// `delay`; a playlist `PREFIX/index.m3u8` lists `seg0.ts` to `seg{N}.ts` where N is `newest` (uncacheable,
/// so every request sees the newest version, as a live player's reload would).
async fn segment_origin(
    newest: std::sync::Arc<std::sync::atomic::AtomicU64>,
    delay: Duration,
) -> Origin {
    Origin::start(move |seen| {
        let (path, _) = seen.path.split_once('?').unwrap_or((&seen.path, ""));
        if let Some(dir) = path.strip_suffix("/index.m3u8") {
            let n = newest.load(std::sync::atomic::Ordering::SeqCst);
            let mut text = String::from("#EXTM3U\n#EXT-X-TARGETDURATION:2\n");
            for k in 0..=n {
                text += &format!("#EXTINF:2.0,\nseg{k}.ts\n");
            }
            let _ = dir;
            return Reply::ok(text)
                .header("content-type", "application/vnd.apple.mpegurl")
                .header("cache-control", "no-store");
        }
        Reply::ok(segment(path))
            .header("cache-control", "max-age=60")
            .header("content-type", "video/mp2t")
            .delay(delay)
    })
    .await
}

fn segment(path: &str) -> Bytes {
    path.bytes().cycle().take(2000).collect()
}

/// `prefetch = { playlist = 2 }`: a player asking for a segment a playlist lists sets off the next two,
/// which are then hits; a new version of a live playlist sets off the segment after the newest one asked
/// for before any player asks for it.
#[tokio::test(flavor = "multi_thread")]
async fn the_next_segments_a_playlist_lists_are_prefetched_and_then_hits() {
    let newest = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(5));
    let origin = segment_origin(newest.clone(), Duration::ZERO).await;
    let d = Daemon::with_config(
        origin.addr,
        "[[listen]]\naddress = \"127.0.0.1:0\"\n\
         [[route]]\npath_prefix = \"/tv/\"\nprefetch = { playlist = 2 }\n",
    );
    assert_eq!(get(d.addr, "/tv/index.m3u8").await.status, 200);
    assert_eq!(origin.total(), 1, "a playlist alone sets nothing off");
    let first = get(d.addr, "/tv/seg0.ts").await;
    assert_eq!(first.body, segment("/tv/seg0.ts"));
    eventually(Duration::from_secs(5), || async {
        (origin.count("/tv/seg1.ts") == 1 && origin.count("/tv/seg2.ts") == 1).then_some(())
    })
    .await;
    for k in 1..=2 {
        let path = format!("/tv/seg{k}.ts");
        let hit = eventually(Duration::from_secs(5), || async {
            let r = get(d.addr, &path).await;
            (r.x_cache() == "HIT").then_some(r)
        })
        .await;
        assert_eq!(hit.body, segment(&path));
    }
    // Asking for seg2 set off seg3 and seg4; the live edge is seg5 and nobody asked for it.
    eventually(Duration::from_secs(5), || async {
        (origin.count("/tv/seg4.ts") == 1).then_some(())
    })
    .await;
    assert_eq!(origin.count("/tv/seg5.ts"), 0);
    assert_eq!(get(d.addr, "/tv/seg5.ts").await.x_cache(), "MISS");
    // A new version lists seg6: prefetched before anyone asks, since players are at seg5.
    newest.store(6, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(get(d.addr, "/tv/index.m3u8").await.status, 200);
    eventually(Duration::from_secs(5), || async {
        (origin.count("/tv/seg6.ts") == 1).then_some(())
    })
    .await;
    let edge = eventually(Duration::from_secs(5), || async {
        let r = get(d.addr, "/tv/seg6.ts").await;
        (r.x_cache() == "HIT").then_some(r)
    })
    .await;
    assert_eq!(edge.body, segment("/tv/seg6.ts"));
    for k in 0..=6 {
        assert_eq!(origin.count(&format!("/tv/seg{k}.ts")), 1, "seg{k}");
    }
    let proxy = &d.stats().await["proxy"];
    let counted = |name: &str| proxy[name].as_u64().unwrap();
    assert_eq!(counted("prefetched"), 5, "seg1, 2, 3, 4 and 6: {proxy}");
    assert_eq!(counted("prefetch_hits"), 3, "seg1, 2 and 6: {proxy}");
    assert_eq!(counted("prefetch_wasted"), 0, "{proxy}");
}

/// `prefetch = { cmcd = true }`: the next object (`nor`) or range (`nrr`) a player's CMCD data names is
/// fetched before it asks, from the header or the query (read before `[normalize]` strips it); a `nor`
/// naming another host or leaving the site is refused, and the origin never sees it.
#[tokio::test(flavor = "multi_thread")]
async fn what_cmcd_names_next_is_prefetched_on_the_same_site_only() {
    let newest = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let origin = segment_origin(newest, Duration::ZERO).await;
    let d = Daemon::with_config(
        origin.addr,
        "[[listen]]\naddress = \"127.0.0.1:0\"\n\
         [normalize]\nstrip_query_params = [\"CMCD\"]\n\
         [[route]]\npath_prefix = \"/v/\"\nprefetch = { cmcd = true }\n",
    );
    let addr = d.addr;
    let with_cmcd = |path: &'static str, cmcd: &'static str| async move {
        let headers = [("cmcd-request", cmcd)];
        lacquer_tests::request(addr, http::Method::GET, path, &headers, Bytes::new()).await
    };
    let r = with_cmcd("/v/a/seg1.m4s", r#"nor="seg2.m4s",sid="x""#)
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    eventually(Duration::from_secs(5), || async {
        (origin.count("/v/a/seg2.m4s") == 1).then_some(())
    })
    .await;
    // The query form, percent-encoded; the key and the origin never see the parameter.
    // Asked for again until the prefetch has stored it: the first may join it in flight.
    eventually(Duration::from_secs(5), || async {
        let r = get(
            d.addr,
            "/v/a/seg2.m4s?CMCD=nor%3D%22..%252Fb%252Fseg3.m4s%22",
        )
        .await;
        (r.x_cache() == "HIT").then_some(())
    })
    .await;
    eventually(Duration::from_secs(5), || async {
        (origin.count("/v/b/seg3.m4s") == 1).then_some(())
    })
    .await;
    for refused in [
        r#"nor="https://elsewhere.example/x.m4s""#,
        r#"nor="//elsewhere.example/x.m4s""#,
        r#"nor="..%2F..%2F..%2Fescape.m4s""#,
    ] {
        assert_eq!(
            with_cmcd("/v/a/seg1.m4s", refused).await.unwrap().status,
            200
        );
    }
    let seen: Vec<String> = origin.seen().into_iter().map(|s| s.path).collect();
    assert!(
        seen.iter()
            .all(|p| !p.contains("elsewhere") && !p.contains("escape")),
        "{seen:?}"
    );
    let proxy = &d.stats().await["proxy"];
    assert_eq!(proxy["prefetch_refused"].as_u64(), Some(3), "{proxy}");
    assert_eq!(proxy["prefetched"].as_u64(), Some(2), "{proxy}");
    assert_eq!(proxy["prefetch_hits"].as_u64(), Some(1), "{proxy}");
}

/// `[prefetch]`'s budget: prefetches beyond `max_concurrent` are not made (the player's own request
/// fetches the object), and one nobody asks for within `unused_after` counts as wasted.
#[tokio::test(flavor = "multi_thread")]
async fn prefetches_beyond_the_budget_are_dropped_and_unasked_ones_wasted() {
    let newest = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(9));
    let origin = segment_origin(newest, Duration::from_millis(500)).await;
    let d = Daemon::with_config(
        origin.addr,
        "[[listen]]\naddress = \"127.0.0.1:0\"\n\
         [prefetch]\nmax_concurrent = 1\nunused_after = \"100ms\"\n\
         [[route]]\npath_prefix = \"/tv/\"\nprefetch = { playlist = 4 }\n",
    );
    assert_eq!(get(d.addr, "/tv/index.m3u8").await.status, 200);
    assert_eq!(get(d.addr, "/tv/seg0.ts").await.status, 200);
    let proxy = eventually(Duration::from_secs(5), || async {
        let stats = d.stats().await;
        let proxy = stats["proxy"].clone();
        (proxy["prefetched"].as_u64() == Some(1) && proxy["prefetch_dropped"].as_u64() == Some(3))
            .then_some(proxy)
    })
    .await;
    assert_eq!(proxy["prefetch_hits"].as_u64(), Some(0));
    // seg1 was prefetched and nobody asked for it; the next prefetch finds it expired.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(get(d.addr, "/tv/seg5.ts").await.status, 200);
    let proxy = eventually(Duration::from_secs(5), || async {
        let stats = d.stats().await;
        let proxy = stats["proxy"].clone();
        (proxy["prefetch_wasted"].as_u64() == Some(1)).then_some(proxy)
    })
    .await;
    assert_eq!(proxy["prefetched"].as_u64(), Some(2), "seg6: {proxy}");
    assert_eq!(origin.count("/tv/seg2.ts"), 0, "dropped, never fetched");
}

/// An origin that starts a part and never finishes it: every player joined on it gets an error once
/// `between_bytes_timeout` passes (never a short part taken for whole), nothing is stored, and the next
/// request asks the origin again.
#[tokio::test(flavor = "multi_thread")]
async fn a_part_the_origin_never_finishes_fails_every_player_and_is_not_stored() {
    let never = std::sync::Arc::new(tokio::sync::Notify::new());
    let origin = {
        let never = never.clone();
        Origin::start(move |_| {
            use lacquer_tests::Step;
            let steps = vec![
                Step::Data(part_body(0).slice(..1000)),
                Step::Gate(never.clone()),
            ];
            Reply::ok("")
                .header("cache-control", "max-age=60")
                .steps(steps, Some(PART_BYTES as usize))
        })
        .await
    };
    let d = Daemon::with_config(
        origin.addr,
        "[[listen]]\naddress = \"127.0.0.1:0\"\n[backend]\nbetween_bytes_timeout = \"500ms\"\n",
    );
    let players: Vec<_> = (0..10)
        .map(|_| {
            let addr = d.addr;
            tokio::spawn(async move {
                lacquer_tests::request(
                    addr,
                    http::Method::GET,
                    "/live/s0.p0.m4s",
                    &[],
                    Bytes::new(),
                )
                .await
            })
        })
        .collect();
    for p in players {
        let got = p.await.unwrap();
        assert!(got.is_err(), "a cut part ends in an error: {got:?}");
    }
    assert_eq!(
        origin.count("/live/s0.p0.m4s"),
        1,
        "the players shared one fetch"
    );
    never.notify_waiters();
    let _ = lacquer_tests::request(
        d.addr,
        http::Method::GET,
        "/live/s0.p0.m4s",
        &[],
        Bytes::new(),
    )
    .await;
    assert_eq!(origin.count("/live/s0.p0.m4s"), 2, "nothing was stored");
}

/// An origin that answers a blocking reload at once with an older playlist than the one asked for: that
/// answer is what every player waiting for the version gets, on one origin request, never asked again in
/// a loop.
#[tokio::test(flavor = "multi_thread")]
async fn an_old_playlist_answering_a_blocking_reload_is_served_not_looped_on() {
    let origin =
        Origin::start(|_| Reply::ok(playlist(3)).header("cache-control", "max-age=1")).await;
    let d = Daemon::start(origin.addr, &[]);
    let reloads: Vec<_> = (0..20)
        .map(|_| reload_of(d.addr, "/live/index.m3u8?_HLS_msn=50&_HLS_part=0"))
        .collect();
    for r in reloads {
        let r = r.await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(hinted(&r.body), 4, "the origin's playlist, as it sent it");
    }
    assert_eq!(origin.count("/live/index.m3u8?_HLS_msn=50&_HLS_part=0"), 1);
}
