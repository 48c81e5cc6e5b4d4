//! Grace and stale-if-error: stale objects answer at once while one background fetch refreshes them, and
//! stand in for an origin that refuses, hangs or answers 5xx, unless the response forbade it.

use std::{
    sync::{
        atomic::{AtomicU8, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use lacquer_tests::{get, Daemon, Origin, Reply};

const OK: u8 = 0;
const SERVER_ERROR: u8 = 1;
const HANG: u8 = 2;
/// Answers `v{n}` only after 500 ms for n > 1, so that every request of a burst is looked up before a
/// background refresh can have replaced the stale object.
const SLOW_REFRESH: u8 = 3;

/// An origin whose n-th good answer is `v{n}`, and which can be switched to failing.
async fn origin(cache_control: &'static str) -> (Origin, Arc<AtomicU8>) {
    let mode = Arc::new(AtomicU8::new(OK));
    let served = Arc::new(AtomicUsize::new(0));
    let m = mode.clone();
    let origin = Origin::start(move |_| match m.load(Ordering::SeqCst) {
        SERVER_ERROR => Reply::ok("origin broken").status(503),
        HANG => Reply::ok("late").delay(Duration::from_secs(5)),
        _ => {
            let n = served.fetch_add(1, Ordering::SeqCst) + 1;
            let slow = m.load(Ordering::SeqCst) == SLOW_REFRESH && n > 1;
            Reply::ok(format!("v{n}"))
                .header("cache-control", cache_control)
                .header("etag", &format!("\"{n}\""))
                .delay(Duration::from_millis(if slow { 500 } else { 0 }))
        }
    })
    .await;
    (origin, mode)
}

fn short_timeouts() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lacquer.toml");
    std::fs::write(
        &path,
        "[backend]\nfirst_byte_timeout = \"500ms\"\nbetween_bytes_timeout = \"500ms\"\n",
    )
    .unwrap();
    let path = path.to_str().unwrap().to_owned();
    (dir, path)
}

#[tokio::test(flavor = "multi_thread")]
async fn grace_answers_stale_at_once_and_refreshes_once() {
    let (origin, mode) = origin("max-age=1, stale-while-revalidate=30").await;
    mode.store(SLOW_REFRESH, Ordering::SeqCst);
    let d = Daemon::start(origin.addr, &[]);
    assert_eq!(get(d.addr, "/g").await.body, "v1");
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let stale = futures_util::future::join_all((0..5).map(|_| get(d.addr, "/g"))).await;
    for r in &stale {
        assert_eq!((r.x_cache(), r.body.as_ref()), ("STALE", &b"v1"[..]));
        assert!(
            r.header("cache-status").contains("stale-while-revalidate"),
            "{}",
            r.header("cache-status")
        );
    }
    d.wait_for_stats("the refresh stored", |s| s["proxy"]["objects_stored"] == 2)
        .await;
    let fresh = get(d.addr, "/g").await;
    assert_eq!((fresh.x_cache(), fresh.body.as_ref()), ("HIT", &b"v2"[..]));
    assert_eq!(
        origin.count("/g"),
        2,
        "one background refresh for five stale answers"
    );
    assert_eq!(d.stats().await["proxy"]["stale_served"], 5);
}

#[tokio::test(flavor = "multi_thread")]
async fn stale_stands_in_for_a_failing_origin() {
    let (origin, mode) = origin("max-age=1, stale-while-revalidate=0").await;
    let (_dir, config) = short_timeouts();
    let d = Daemon::start(origin.addr, &["--config", &config]);
    assert_eq!(get(d.addr, "/e").await.body, "v1");
    tokio::time::sleep(Duration::from_millis(1300)).await;

    mode.store(SERVER_ERROR, Ordering::SeqCst);
    let r = get(d.addr, "/e").await;
    assert_eq!(
        (r.status.as_u16(), r.x_cache(), r.body.as_ref()),
        (200, "STALE", &b"v1"[..])
    );
    assert!(
        r.header("cache-status")
            .contains("fwd=stale; fwd-status=503"),
        "{}",
        r.header("cache-status")
    );

    mode.store(HANG, Ordering::SeqCst);
    let r = get(d.addr, "/e").await;
    assert_eq!((r.x_cache(), r.body.as_ref()), ("STALE", &b"v1"[..]));
    assert!(r.header("cache-status").contains("origin-unreachable"));

    origin.stop();
    let r = get(d.addr, "/e").await;
    assert_eq!((r.x_cache(), r.body.as_ref()), ("STALE", &b"v1"[..]));

    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["stale_on_error"], 3);
    assert_eq!(stats["proxy"]["backend_errors"], 3);
}

/// An origin that accepts connections and resets them before answering.
#[tokio::test(flavor = "multi_thread")]
async fn stale_stands_in_for_an_origin_that_resets() {
    let (origin, _) = origin("max-age=1, stale-while-revalidate=0").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let front = listener.local_addr().unwrap();
    let upstream = origin.addr;
    let resetting = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let relays: Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
    let (r, live) = (resetting.clone(), relays.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            if r.load(Ordering::SeqCst) {
                let _ = client.set_zero_linger();
                continue;
            }
            let relay = tokio::spawn(async move {
                let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
            live.lock().unwrap().push(relay.abort_handle());
        }
    });
    let d = Daemon::start(front, &[]);
    assert_eq!(get(d.addr, "/reset").await.body, "v1");
    tokio::time::sleep(Duration::from_millis(1300)).await;
    resetting.store(true, Ordering::SeqCst);
    // Connections the daemon keeps alive from before are cut too, as when an origin host goes down.
    for relay in relays.lock().unwrap().drain(..) {
        relay.abort();
    }
    let r = get(d.addr, "/reset").await;
    assert_eq!(
        (r.status.as_u16(), r.x_cache(), r.body.as_ref()),
        (200, "STALE", &b"v1"[..])
    );
    assert_eq!(d.stats().await["proxy"]["stale_on_error"], 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn must_revalidate_forbids_stale() {
    let (origin, mode) = origin("max-age=1, must-revalidate").await;
    let d = Daemon::start(origin.addr, &[]);
    assert_eq!(get(d.addr, "/m").await.body, "v1");
    tokio::time::sleep(Duration::from_millis(1300)).await;
    mode.store(SERVER_ERROR, Ordering::SeqCst);
    let r = get(d.addr, "/m").await;
    assert_eq!((r.status.as_u16(), r.x_cache()), (503, "MISS"));
    origin.stop();
    let r = get(d.addr, "/m").await;
    assert_eq!(r.status, 503);
    assert_eq!(d.stats().await["proxy"]["stale_on_error"], 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fetch_that_stalls_mid_body_stores_nothing() {
    let served = Arc::new(AtomicUsize::new(0));
    let s = served.clone();
    let origin = Origin::start(move |_| {
        let reply = Reply::ok("0123456789").header("cache-control", "max-age=60");
        if s.fetch_add(1, Ordering::SeqCst) == 0 {
            let steps = vec![
                lacquer_tests::Step::Data("01234".into()),
                lacquer_tests::Step::Sleep(Duration::from_secs(3)),
                lacquer_tests::Step::Data("56789".into()),
            ];
            reply.steps(steps, Some(10))
        } else {
            reply
        }
    })
    .await;
    let (_dir, config) = short_timeouts();
    let d = Daemon::start(origin.addr, &["--config", &config]);
    let first =
        lacquer_tests::request(d.addr, http::Method::GET, "/s", &[], Default::default()).await;
    assert!(
        first.is_err(),
        "the stalled body reaches the client as an error"
    );
    let again = get(d.addr, "/s").await;
    assert_eq!(
        (again.x_cache(), again.body.as_ref()),
        ("MISS", &b"0123456789"[..])
    );
    assert_eq!(origin.count("/s"), 2);
}

/// RFC 9111 §3: a server error with explicit freshness is stored and reused like any response; one with
/// `no-store, must-understand` and a status this cache does not know is not.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_error_with_freshness_is_stored() {
    let origin = Origin::start(|s| match s.path.as_str() {
        "/503" => Reply::ok("down for a minute")
            .status(503)
            .header("cache-control", "max-age=60"),
        "/599" => Reply::ok("unknown")
            .status(599)
            .header("cache-control", "max-age=60, no-store, must-understand"),
        _ => Reply::ok("down").status(503),
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    for path in ["/503", "/599", "/plain"] {
        get(d.addr, path).await;
    }
    let r = get(d.addr, "/503").await;
    assert_eq!(
        (r.status.as_u16(), r.x_cache(), r.body.as_ref()),
        (503, "HIT", &b"down for a minute"[..])
    );
    assert_eq!(origin.count("/503"), 1);
    let r = get(d.addr, "/599").await;
    assert_eq!((r.status.as_u16(), r.x_cache()), (599, "MISS"));
    assert_eq!(origin.count("/599"), 2);
    let r = get(d.addr, "/plain").await;
    assert_eq!((r.status.as_u16(), r.x_cache()), (503, "MISS"));
    assert_eq!(origin.count("/plain"), 2, "no freshness, not stored");
}

/// A server error, even a storable one, does not replace a stale object that stands in for it: every
/// request during the outage is answered stale and asks the origin again.
#[tokio::test(flavor = "multi_thread")]
async fn a_storable_server_error_does_not_replace_what_stands_in_for_it() {
    let failing = Arc::new(AtomicU8::new(OK));
    let f = failing.clone();
    let origin = Origin::start(move |_| {
        if f.load(Ordering::SeqCst) == SERVER_ERROR {
            Reply::ok("broken")
                .status(503)
                .header("cache-control", "max-age=60")
        } else {
            Reply::ok("v1").header("cache-control", "max-age=1")
        }
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    assert_eq!(get(d.addr, "/o").await.body, "v1");
    tokio::time::sleep(Duration::from_millis(1300)).await;
    failing.store(SERVER_ERROR, Ordering::SeqCst);
    for n in 2..=3 {
        let r = get(d.addr, "/o").await;
        assert_eq!(
            (r.status.as_u16(), r.x_cache(), r.body.as_ref()),
            (200, "STALE", &b"v1"[..]),
            "request {n}"
        );
        assert_eq!(origin.count("/o"), n);
    }
    assert_eq!(d.stats().await["proxy"]["stale_on_error"], 2);
    failing.store(OK, Ordering::SeqCst);
    let r = get(d.addr, "/o").await;
    assert_eq!((r.x_cache(), r.body.as_ref()), ("MISS", &b"v1"[..]));
}

/// An origin that closes the connection without answering, once the first answer for each path is out:
/// a stale object is served when its response allows it, and a 502 (an answer, not a dropped client
/// connection) when `must-revalidate`, `proxy-revalidate`, `no-cache` or `s-maxage` forbids it.
#[tokio::test(flavor = "multi_thread")]
async fn an_origin_that_closes_gets_stale_or_a_502() {
    use lacquer_tests::Raw;
    let answered = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let origin = Origin::raw(move |seen| {
        if !answered.lock().unwrap().insert(seen.path.clone()) {
            return vec![Raw::Close];
        }
        let cache_control = match seen.path.as_str() {
            "/must-revalidate" => "max-age=1, must-revalidate",
            "/proxy-revalidate" => "max-age=1, proxy-revalidate",
            "/no-cache" => "max-age=1, no-cache",
            "/s-maxage" => "s-maxage=1",
            _ => "max-age=1",
        };
        vec![Raw::write(format!(
            "HTTP/1.1 200 OK\r\ncache-control: {cache_control}\r\netag: \"1\"\r\ncontent-length: 2\r\n\r\nv1"
        ))]
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    let paths = [
        "/plain",
        "/must-revalidate",
        "/proxy-revalidate",
        "/no-cache",
        "/s-maxage",
    ];
    for path in paths {
        assert_eq!(get(d.addr, path).await.body, "v1", "{path}");
    }
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let r = get(d.addr, "/plain").await;
    assert_eq!(
        (r.status.as_u16(), r.x_cache(), r.body.as_ref()),
        (200, "STALE", &b"v1"[..])
    );
    for path in &paths[1..] {
        let r = lacquer_tests::request(d.addr, http::Method::GET, path, &[], Default::default())
            .await
            .unwrap_or_else(|e| panic!("{path}: the client got no answer: {e}"));
        assert_eq!((r.status.as_u16(), r.x_cache()), (502, "MISS"), "{path}");
        assert_ne!(r.body, "v1", "{path}");
    }
    assert_eq!(d.stats().await["proxy"]["stale_on_error"], 1);
}
