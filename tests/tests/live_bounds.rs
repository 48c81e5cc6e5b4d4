//! The bounds of the live-streaming paths under hostile clients and origins: what prefetch remembers, the
//! blocking reloads at the origin, what a prefetch may cost and become, and ranges of a growing body at
//! their edges. Each was found broken by an attacker's review of the first build, and fails without its fix.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use lacquer_tests::{eventually, get, Daemon, Origin, Reply, Step};

/// An origin that holds every blocking reload 4 s, longer than the hold the daemons here allow, and
/// decodes the query as every origin does (`%5FHLS_msn` is `_HLS_msn` to it).
async fn holding_origin() -> Origin {
    Origin::start(|seen| {
        let reply = Reply::ok("#EXTM3U\n").header("cache-control", "max-age=1");
        if seen.path.replace("%5F", "_").contains("_HLS_msn") {
            reply.delay(Duration::from_secs(4))
        } else {
            reply
        }
    })
    .await
}

/// A daemon letting `limit` blocking reloads of a playlist to the origin at once, each held 1 s at most.
fn bounded_reloads(origin: &Origin, limit: usize) -> Daemon {
    Daemon::with_config(
        origin.addr,
        &format!(
            "[[listen]]\naddress = \"127.0.0.1:0\"\n\
             [cache]\nblocking_reloads_per_playlist = {limit}\nblocking_reload_hold = \"1s\"\n"
        ),
    )
}

/// A 6000-byte segment sent chunked: its first 3000 bytes at once, the rest once `gate` opens.
async fn growing_origin(gate: Arc<tokio::sync::Notify>) -> Origin {
    Origin::start(move |_| {
        let steps = vec![
            Step::Data(Bytes::from(vec![b'a'; 3000])),
            Step::Gate(gate.clone()),
            Step::Data(Bytes::from(vec![b'b'; 3000])),
        ];
        Reply::ok("")
            .header("cache-control", "max-age=60")
            .header("content-type", "video/mp4")
            .steps(steps, None)
    })
    .await
}

/// Memory is bounded by configuration whatever clients and origins do: what prefetch remembers of the
/// playlists it reads is bounded in bytes, and hosts are kept by their hash. One request with a long `Host`
/// (valid: a reg-name has no length limit, and a route without `host` takes any) for a playlist of 16 000
/// references once made lacquerd keep 16 000 × 3 copies of that host (+635 MiB).
#[tokio::test(flavor = "multi_thread")]
async fn a_long_host_asking_for_a_long_playlist_costs_no_memory_to_speak_of() {
    let origin = Origin::start(|seen| {
        let (path, _) = seen.path.split_once('?').unwrap_or((&seen.path, ""));
        if path.ends_with("/index.m3u8") {
            let mut text = String::from("#EXTM3U\n#EXT-X-TARGETDURATION:2\n");
            for k in 0..16_000 {
                text += &format!("#EXTINF:2.0,\ns{k}.ts\n");
            }
            return Reply::ok(text)
                .header("content-type", "application/vnd.apple.mpegurl")
                .header("cache-control", "max-age=60");
        }
        Reply::ok("segment").header("cache-control", "max-age=60")
    })
    .await;
    let d = Daemon::with_config(
        origin.addr,
        "[[listen]]\naddress = \"127.0.0.1:0\"\n\
         [[route]]\npath_prefix = \"/tv/\"\nprefetch = { playlist = 2 }\n",
    );
    // Warm up, then measure.
    assert_eq!(get(d.addr, "/tv/warm/index.m3u8").await.status, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = d.rss_kib();
    let host = "a".repeat(12_000);
    let r = lacquer_tests::request(
        d.addr,
        http::Method::GET,
        "/tv/index.m3u8",
        &[("host", &host)],
        Bytes::new(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = d.rss_kib();
    let grown_mib = after.saturating_sub(before) / 1024;
    eprintln!("RSS before {before} KiB, after {after} KiB: +{grown_mib} MiB for one request");
    assert!(
        grown_mib < 64,
        "one request grew lacquerd by {grown_mib} MiB (--memory 64MiB)"
    );
}

/// Blocking reloads are bounded: distinct ones of one playlist at the origin at once
/// (`cache.blocking_reloads_per_playlist`: one more is refused at once), and how long one is held
/// (`cache.blocking_reload_hold`: then `503`, and the origin request is dropped).
#[tokio::test(flavor = "multi_thread")]
async fn blocking_reloads_are_bounded_per_playlist_and_in_time() {
    let origin = holding_origin().await;
    let d = bounded_reloads(&origin, 2);
    let asked = Instant::now();
    let reload = |msn: u32| {
        let addr = d.addr;
        tokio::spawn(async move { get(addr, &format!("/live/index.m3u8?_HLS_msn={msn}")).await })
    };
    let (a, b) = (reload(100), reload(101));
    eventually(Duration::from_secs(5), || async {
        (origin.in_flight() == 2).then_some(())
    })
    .await;
    // A joiner of a reload at the origin takes no place of its own.
    let joiner = reload(100);
    let refused = get(d.addr, "/live/index.m3u8?_HLS_msn=102").await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.header("retry-after"), "1");
    // Another playlist has its own places.
    let other = {
        let addr = d.addr;
        tokio::spawn(async move { get(addr, "/other/index.m3u8?_HLS_msn=7").await })
    };
    for held in [a, b, joiner, other] {
        let r = held.await.unwrap();
        assert_eq!(r.status, 503, "held past the hold");
    }
    assert!(
        asked.elapsed() < Duration::from_secs(4),
        "the hold ended them, not the origin"
    );
    eventually(Duration::from_secs(5), || async {
        (origin.in_flight() == 0).then_some(())
    })
    .await;
    let proxy = &d.stats().await["proxy"];
    assert_eq!(proxy["hls_reloads_refused"].as_u64(), Some(1), "{proxy}");
    assert_eq!(proxy["hls_reloads_timed_out"].as_u64(), Some(4), "{proxy}");
    assert_eq!(proxy["hls_reloads_held"].as_u64(), Some(0), "{proxy}");
    // The places were given back.
    assert_eq!(reload(103).await.unwrap().status, 503);
    assert_eq!(
        origin.count("/live/index.m3u8?_HLS_msn=102"),
        0,
        "refused before it was sent"
    );
    assert_eq!(origin.count("/live/index.m3u8?_HLS_msn=103"), 1);
}

/// `blocking_reloads_per_playlist` bounds the blocking reloads of one playlist at the origin, and
/// `blocking_reload_hold` how long one is held, however the parameter's name is encoded: `%5FHLS_msn` (what
/// every origin framework decodes to `_HLS_msn`) is a blocking reload too.
#[tokio::test(flavor = "multi_thread")]
async fn an_encoded_hls_msn_is_bounded_and_held_as_any() {
    let origin = holding_origin().await;
    let d = bounded_reloads(&origin, 2);
    let asked = Instant::now();
    let reloads: Vec<_> = (0..6)
        .map(|msn| {
            let addr = d.addr;
            tokio::spawn(
                async move { get(addr, &format!("/live/index.m3u8?%5FHLS_msn={msn}")).await },
            )
        })
        .collect();
    let mut statuses = Vec::new();
    for r in reloads {
        statuses.push(r.await.unwrap().status.as_u16());
    }
    eprintln!(
        "statuses {statuses:?}, origin held at most {} at once, answered after {:?}",
        origin.max_in_flight(),
        asked.elapsed()
    );
    assert!(
        origin.max_in_flight() <= 2,
        "{} blocking reloads of one playlist at the origin at once (bound: 2)",
        origin.max_in_flight()
    );
}

/// A reload's place is the origin request's, kept until the origin answers it or it is given up: a client
/// that joined it keeps the place taken after the first client timed out or left, so no other reload of
/// the playlist gets past the bound meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_keeps_its_place_while_any_client_waits_on_it() {
    let origin = holding_origin().await;
    let d = bounded_reloads(&origin, 1);
    let reload = |msn: u32| {
        let addr = d.addr;
        tokio::spawn(async move { get(addr, &format!("/live/index.m3u8?_HLS_msn={msn}")).await })
    };
    let first = reload(1);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let joiner = reload(1);
    // The first times out at 1 s and gives its place back; the joiner holds the origin request until 1.6 s.
    assert_eq!(first.await.unwrap().status, 503);
    let second = reload(2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let at_once = origin.max_in_flight();
    let _ = (joiner.await, second.await);
    assert!(
        at_once <= 1,
        "{at_once} blocking reloads of one playlist at the origin at once (bound: 1)"
    );
}

/// A prefetch is a background fill of its own, never bounded as a player's blocking reload is: a CMCD `nor`
/// naming one (`index.m3u8?_HLS_msn=N`) is refused, or clients each naming another `_HLS_msn` would keep
/// `[prefetch] max_concurrent` reloads of one playlist at the origin for as long as it holds them.
#[tokio::test(flavor = "multi_thread")]
async fn a_blocking_reload_is_never_prefetched() {
    let origin = Origin::start(|seen| {
        if seen.path.contains("_HLS_msn") {
            return Reply::ok("#EXTM3U\n")
                .header("cache-control", "max-age=60")
                .delay(Duration::from_secs(4));
        }
        Reply::ok("segment").header("cache-control", "max-age=60")
    })
    .await;
    let d = Daemon::with_config(
        origin.addr,
        "[[listen]]\naddress = \"127.0.0.1:0\"\n\
         [cache]\nblocking_reloads_per_playlist = 1\nblocking_reload_hold = \"1s\"\n\
         [[route]]\npath_prefix = \"/live/\"\nprefetch = { cmcd = true }\n",
    );
    for msn in 0..6 {
        let cmcd = format!(r#"nor="index.m3u8%3F_HLS_msn%3D{msn}""#);
        let r = lacquer_tests::request(
            d.addr,
            http::Method::GET,
            &format!("/live/seg{msn}.ts"),
            &[("cmcd-request", &cmcd)],
            Bytes::new(),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let held = origin.in_flight();
    eprintln!(
        "held at the origin 1.5 s later: {held}; at most {}",
        origin.max_in_flight()
    );
    assert!(
        origin.max_in_flight() <= 1 && held == 0,
        "{} blocking reloads of one playlist at the origin at once (bound: 1), {held} still held past the 1 s hold",
        origin.max_in_flight()
    );
}

/// `max_rate` counts body bytes as they arrive, and each prefetch takes some of it as it starts: four 1 MiB
/// prefetches set off together under `max_rate = "1KiB"` are one, not four (counted only once finished,
/// every one admitted before the first ended started).
#[tokio::test(flavor = "multi_thread")]
async fn the_prefetch_rate_holds_for_prefetches_set_off_together() {
    let origin = Origin::start(|seen| {
        let (path, _) = seen.path.split_once('?').unwrap_or((&seen.path, ""));
        if path.ends_with("/index.m3u8") {
            let mut text = String::from("#EXTM3U\n#EXT-X-TARGETDURATION:2\n");
            for k in 0..10 {
                text += &format!("#EXTINF:2.0,\nseg{k}.ts\n");
            }
            return Reply::ok(text)
                .header("content-type", "application/vnd.apple.mpegurl")
                .header("cache-control", "no-store");
        }
        // 1 MiB, sent over one second.
        let chunk = Bytes::from(vec![b'x'; 256 * 1024]);
        let steps = (0..4)
            .flat_map(|_| {
                [
                    Step::Data(chunk.clone()),
                    Step::Sleep(Duration::from_millis(250)),
                ]
            })
            .collect();
        Reply::ok("")
            .header("cache-control", "max-age=60")
            .steps(steps, Some(1 << 20))
    })
    .await;
    let d = Daemon::with_config(
        origin.addr,
        "[[listen]]\naddress = \"127.0.0.1:0\"\n\
         [prefetch]\nmax_concurrent = 8\nmax_rate = \"1KiB\"\n\
         [[route]]\npath_prefix = \"/tv/\"\nprefetch = { playlist = 4 }\n",
    );
    assert_eq!(get(d.addr, "/tv/index.m3u8").await.status, 200);
    let started = Instant::now();
    let _ = lacquer_tests::open(d.addr, "/tv/seg0.ts").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let prefetching: Vec<usize> = (1..=4)
        .map(|k| origin.count(&format!("/tv/seg{k}.ts")))
        .collect();
    eprintln!(
        "within {:?}: prefetches started {prefetching:?}",
        started.elapsed()
    );
    let started_at_once = prefetching.iter().sum::<usize>();
    assert!(
        started_at_once <= 1,
        "{started_at_once} prefetches of 1 MiB started within half a second under max_rate = 1KiB"
    );
}

/// `bytes=0-18446744073709551615` (a valid range: a last position past the end is allowed, RFC 9110
/// §14.1.2; RFC 8673 asks for a body of indeterminate length so) of a growing body is answered as it grows,
/// without a length. Its length was once computed unchecked: a debug build panicked, a release build would
/// have sent `Content-Length: 0` on a 206 with a body.
#[tokio::test(flavor = "multi_thread")]
async fn a_growing_range_to_the_last_position_is_answered() {
    let gate = Arc::new(tokio::sync::Notify::new());
    let origin = growing_origin(gate.clone()).await;
    let d = Daemon::start(origin.addr, &[]);
    // A first request starts the fetch, which grows.
    let leader = {
        let addr = d.addr;
        tokio::spawn(async move { get(addr, "/seg/s0.mp4").await })
    };
    eventually(Duration::from_secs(5), || async {
        (origin.count("/seg/s0.mp4") == 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ranged = {
        let addr = d.addr;
        tokio::spawn(async move {
            lacquer_tests::request(
                addr,
                http::Method::GET,
                "/seg/s0.mp4",
                &[("range", "bytes=0-18446744073709551615")],
                Bytes::new(),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    gate.notify_one();
    let ranged = ranged.await.unwrap();
    let _ = leader.await;
    eprintln!("{ranged:?}");
    for line in d
        .log()
        .lines()
        .filter(|l| l.contains("panick") || l.contains("overflow"))
    {
        eprintln!("lacquerd: {line}");
    }
    let r = ranged.expect("an answer, not a dropped connection");
    assert!(
        r.status == 200 || r.header("content-length") != "0",
        "{} with Content-Length {:?} and {} bytes",
        r.status,
        r.header("content-length"),
        r.body.len()
    );
}

/// A range of a growing body waits for its first byte (a closed one, its last) before it is answered: a
/// range past the body's end (`bytes=5000-9999` of a 6000-byte segment) gets the bytes there are with the
/// length, and one starting past it (`bytes=90000-`) a 416, as a stored body does, never a short 206.
#[tokio::test(flavor = "multi_thread")]
async fn a_growing_range_past_the_end_is_not_a_short_206() {
    let gate = Arc::new(tokio::sync::Notify::new());
    let origin = growing_origin(gate.clone()).await;
    let d = Daemon::start(origin.addr, &[]);
    let leader = {
        let addr = d.addr;
        tokio::spawn(async move { get(addr, "/seg/s0.mp4").await })
    };
    eventually(Duration::from_secs(5), || async {
        (origin.count("/seg/s0.mp4") == 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
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
        })
    };
    let (closed, open) = (ranged("bytes=5000-9999"), ranged("bytes=90000-"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    gate.notify_one();
    let (closed, open) = (closed.await.unwrap(), open.await.unwrap());
    let _ = leader.await;
    eprintln!("closed: {closed:?}\nopen: {open:?}");
    let closed = closed.expect("a complete answer, not a broken transfer");
    let open = open.expect("a complete answer");
    assert!(
        !(open.status == 206 && open.body.is_empty()),
        "an empty 206 for a range past the end: {open:?}"
    );
    assert_eq!(
        closed.header("content-length"),
        closed.body.len().to_string(),
        "{closed:?}"
    );
}

/// A prefetch is the request a player would send, run through the request phase once: made from the head
/// as the client sent it, so a `rewrite_path` is applied once and the prefetch is stored under the key a
/// player looks up.
#[tokio::test(flavor = "multi_thread")]
async fn a_prefetch_is_rewritten_once_as_a_players_request() {
    let newest = Arc::new(AtomicU64::new(5));
    let origin = {
        let newest = newest.clone();
        Origin::start(move |seen| {
            let (path, _) = seen.path.split_once('?').unwrap_or((&seen.path, ""));
            if path.ends_with("/index.m3u8") {
                let n = newest.load(Ordering::SeqCst);
                let mut text = String::from("#EXTM3U\n#EXT-X-TARGETDURATION:2\n");
                for k in 0..=n {
                    text += &format!("#EXTINF:2.0,\nseg{k}.ts\n");
                }
                return Reply::ok(text)
                    .header("content-type", "application/vnd.apple.mpegurl")
                    .header("cache-control", "no-store");
            }
            Reply::ok(format!("segment {path}")).header("cache-control", "max-age=60")
        })
        .await
    };
    let d = Daemon::with_config(
        origin.addr,
        "[[listen]]\naddress = \"127.0.0.1:0\"\n\
         [[route]]\npath_prefix = \"/tv/\"\nprefetch = { playlist = 1 }\n\
         [[rule]]\nmatch.path_prefix = [\"/tv/\"]\nrewrite_path = { from = \"^/tv/(.*)$\", to = \"/tv/origin/$1\" }\n",
    );
    assert_eq!(get(d.addr, "/tv/index.m3u8").await.status, 200);
    assert_eq!(get(d.addr, "/tv/seg0.ts").await.status, 200);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let seen: Vec<String> = origin.seen().into_iter().map(|s| s.path).collect();
    eprintln!("origin saw {seen:?}");
    assert!(
        seen.iter().all(|p| !p.contains("/origin/origin/")),
        "rewritten twice: {seen:?}"
    );
    assert_eq!(origin.count("/tv/origin/seg1.ts"), 1, "{seen:?}");
    assert_eq!(get(d.addr, "/tv/seg1.ts").await.x_cache(), "HIT");
}

/// A closed range larger than a fetch's transit buffer, of a body the origin sends chunked and that is not
/// stored: the fetch waits for this reader to take bytes before more come, so waiting for the range's
/// last byte before answering would hold the client and the origin's connection forever. It is answered.
#[tokio::test(flavor = "multi_thread")]
async fn a_range_beyond_the_transit_buffer_of_an_unstored_body_is_answered() {
    const MIB: usize = 1 << 20;
    let origin = Origin::start(|_| {
        let frame = Bytes::from(vec![b'z'; 64 * 1024]);
        let steps = (0..(8 * MIB / frame.len()))
            .map(|_| Step::Data(frame.clone()))
            .collect();
        Reply::ok("")
            .header("cache-control", "no-store")
            .steps(steps, None)
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    let asked = lacquer_tests::request(
        d.addr,
        http::Method::GET,
        "/stream/s0",
        &[("range", "bytes=0-6291455")],
        Bytes::new(),
    );
    let r = tokio::time::timeout(Duration::from_secs(10), asked)
        .await
        .expect("answered, not held")
        .expect("a response");
    assert_eq!(r.status, 206);
    assert_eq!(r.header("content-range"), "bytes 0-6291455/*");
    assert_eq!(r.body.len(), 6 * MIB);
}

/// Hardening III, finding 7: CMCD prefetch neither skips rate limits nor reaches routes that do not
/// prefetch. `nor="/search?q=N"` on segment requests made the origin see every `/search` where direct
/// requests got 429; a prefetch now follows `nor` only to a route that prefetches CMCD's next requests
/// itself, and is charged to the rate limit of the client that set it off.
#[tokio::test(flavor = "multi_thread")]
async fn a_cmcd_prefetch_is_charged_to_its_client_and_stays_on_prefetching_routes() {
    let origin = Origin::start(|_| Reply::ok("x").header("cache-control", "max-age=60")).await;
    let d = Daemon::with_config(
        origin.addr,
        "[[listen]]\naddress = \"127.0.0.1:0\"\n\
         [[route]]\npath_prefix = \"/search\"\nrate_limit = { requests = 1, per = \"60s\", burst = 1 }\n\
         [[route]]\npath_prefix = \"/w/\"\nprefetch = { cmcd = true }\n\
         rate_limit = { requests = 1, per = \"60s\", burst = 2 }\n\
         [[route]]\npath_prefix = \"/v/\"\nprefetch = { cmcd = true }\n",
    );
    let ask = |path: String, cmcd: String| {
        let addr = d.addr;
        async move {
            lacquer_tests::request(
                addr,
                http::Method::GET,
                &path,
                &[("cmcd-request", &cmcd)],
                Bytes::new(),
            )
            .await
            .unwrap()
        }
    };
    for n in 0..20 {
        let r = ask(format!("/v/seg{n}.ts"), format!(r#"nor="/search?q={n}""#)).await;
        assert_eq!(r.status, 200);
    }
    // The client's own request, and its prefetch of the next segment on the same rate-limited route:
    // two of the burst of two, so its next request is refused.
    let first = ask("/w/seg1.ts".into(), r#"nor="seg2.ts""#.into()).await;
    assert_eq!(first.status, 200);
    lacquer_tests::eventually(Duration::from_secs(5), || async {
        (origin.count("/w/seg2.ts") == 1).then_some(())
    })
    .await;
    let next = ask("/w/seg3.ts".into(), r#"nor="seg4.ts""#.into()).await;
    assert_eq!(
        next.status, 429,
        "the prefetch was not charged to its client"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let searches = origin
        .seen()
        .iter()
        .filter(|s| s.path.starts_with("/search"))
        .count();
    assert_eq!(searches, 0, "nor reached a route that does not prefetch");
    assert_eq!(origin.count("/w/seg4.ts"), 0);
}

/// Hardening III, finding 8: held blocking reloads are bounded per client address
/// (`blocking_reloads_per_client`), and together take at most half of a backend's `max_connections`, so
/// an unrelated miss still gets a connection. One held reload of each of 40 playlists took all 16 places
/// and the miss got 503 after `connect_timeout`.
#[tokio::test(flavor = "multi_thread")]
async fn held_reloads_are_bounded_per_client_and_leave_the_backend_connections() {
    let origin = holding_origin().await;
    for (per_client, at_origin) in [(4, 4), (100, 8)] {
        let d = Daemon::with_config_only(&format!(
            "[[listen]]\naddress = \"127.0.0.1:0\"\n\
             [[backend]]\nname = \"live\"\naddress = \"{}\"\nmax_connections = 16\nconnect_timeout = \"1s\"\n\
             [cache]\nblocking_reloads_per_client = {per_client}\nblocking_reload_hold = \"3s\"\n",
            origin.addr
        ));
        let reloads: Vec<_> = (0..40)
            .map(|n| {
                let addr = d.addr;
                tokio::spawn(
                    async move { get(addr, &format!("/p{n}/index.m3u8?_HLS_msn=5")).await },
                )
            })
            .collect();
        eventually(Duration::from_secs(5), || async {
            (origin.in_flight() == at_origin).then_some(())
        })
        .await;
        let asked = Instant::now();
        let other = get(d.addr, &format!("/plain/{per_client}.m3u8")).await;
        assert_eq!(
            other.status, 200,
            "an unrelated miss while reloads are held"
        );
        assert!(asked.elapsed() < Duration::from_millis(900));
        let mut refused = 0;
        for r in reloads {
            if r.await.unwrap().status == 503 {
                refused += 1;
            }
        }
        assert_eq!(refused, 40, "the held ones at the hold, the others at once");
        assert!(
            origin.max_in_flight() <= at_origin + 1,
            "{} at the origin at once; bound {at_origin}",
            origin.max_in_flight()
        );
        eventually(Duration::from_secs(5), || async {
            (origin.in_flight() == 0).then_some(())
        })
        .await;
    }
}
