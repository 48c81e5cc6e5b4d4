//! Stale objects with validators are revalidated: a 304 refreshes stored headers and freshness without the
//! body being sent again; a 200 replaces the object.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use lacquer_tests::{get, Daemon, Origin, Reply};

const BODY: &str = "the same payload, sent once";

/// Answers 304 to `If-None-Match: "v1"` (with `refresh_cc` and a bumped `x-version`), else the body.
async fn origin(cc: &'static str, refresh_cc: &'static str) -> (Origin, Arc<AtomicUsize>) {
    let bodies = Arc::new(AtomicUsize::new(0));
    let b = bodies.clone();
    let version = AtomicUsize::new(1);
    let origin = Origin::start(move |s| {
        let v = version.fetch_add(1, Ordering::SeqCst);
        if s.headers
            .get("if-none-match")
            .is_some_and(|v| v == "\"v1\"")
        {
            let mut reply = Reply::ok("")
                .status(304)
                .header("cache-control", refresh_cc);
            reply.headers.retain(|(n, _)| n != "content-length");
            reply
                .header("x-version", &v.to_string())
                .header("etag", "\"v1\"")
        } else {
            b.fetch_add(1, Ordering::SeqCst);
            Reply::ok(BODY)
                .header("cache-control", cc)
                .header("etag", "\"v1\"")
                .header("x-version", &v.to_string())
        }
    })
    .await;
    (origin, bodies)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_304_refreshes_headers_and_freshness_without_the_body() {
    let (origin, bodies) = origin("max-age=1, stale-while-revalidate=0", "max-age=60").await;
    let d = Daemon::start(origin.addr, &[]);
    assert_eq!(get(d.addr, "/r").await.header("x-version"), "1");
    tokio::time::sleep(Duration::from_millis(1300)).await;

    let r = get(d.addr, "/r").await;
    assert_eq!((r.status.as_u16(), r.body.as_ref()), (200, BODY.as_bytes()));
    assert_eq!(
        r.header("x-version"),
        "2",
        "headers from the 304 replace the stored ones"
    );
    assert_eq!(origin.seen()[1].headers["if-none-match"], "\"v1\"");

    let r = get(d.addr, "/r").await;
    assert_eq!(
        (
            r.x_cache(),
            r.header("x-version"),
            r.header("cache-control")
        ),
        ("HIT", "2", "max-age=60")
    );
    assert_eq!(r.body, BODY);
    assert_eq!(
        (origin.total(), bodies.load(Ordering::SeqCst)),
        (2, 1),
        "the body crossed once"
    );
    assert_eq!(d.stats().await["proxy"]["revalidations"], 1);
}

/// A 304 whose headers leave the object without freshness (here `max-age=0`; in cache-tests'
/// conditional-etag-vary-headers an `Expires` before the 304's `Date`): the object is dropped, but only
/// once the clients waiting on the revalidation have read the confirmed body from the store.
#[tokio::test(flavor = "multi_thread")]
async fn a_304_that_leaves_the_object_stale_still_delivers_the_body() {
    let body = lacquer_tests::pattern(600_000);
    let served = body.clone();
    let origin = Origin::start(move |s| {
        if s.headers.contains_key("if-none-match") {
            let mut reply = Reply::ok("")
                .status(304)
                .header("cache-control", "max-age=0");
            reply.headers.retain(|(n, _)| n != "content-length");
            reply.header("etag", "\"v1\"")
        } else {
            Reply::ok(served.clone())
                .header("cache-control", "max-age=1")
                .header("etag", "\"v1\"")
        }
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    assert_eq!(get(d.addr, "/x").await.body.len(), body.len());
    d.wait_for_stats("stored", |s| s["proxy"]["objects_stored"] == 1)
        .await;
    tokio::time::sleep(Duration::from_millis(1300)).await;
    for n in 2..=3 {
        let r = lacquer_tests::request(d.addr, http::Method::GET, "/x", &[], Default::default())
            .await
            .unwrap_or_else(|e| panic!("request {n}: {e}"));
        assert_eq!(r.status, 200, "request {n}");
        assert!(r.body == body, "request {n}: the whole body");
        if n == 2 {
            d.wait_for_stats("dropped once read", |s| s["store"]["objects"] == 0)
                .await;
        }
    }
    let conditional: Vec<bool> = origin
        .seen()
        .iter()
        .map(|s| s.headers.contains_key("if-none-match"))
        .collect();
    assert_eq!(
        conditional,
        [false, true, false],
        "revalidated, then dropped once read"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn no_cache_objects_are_revalidated_on_every_request() {
    let (origin, bodies) = origin("no-cache", "no-cache").await;
    let d = Daemon::start(origin.addr, &[]);
    for i in 0..4 {
        let r = get(d.addr, "/n").await;
        assert_eq!((r.status.as_u16(), r.body.as_ref()), (200, BODY.as_bytes()));
        if i == 0 {
            // The client may have the last byte a moment before the store publishes the object.
            d.wait_for_stats("the object stored", |s| {
                s["store"]["objects_published"] == 1
            })
            .await;
        }
    }
    assert_eq!(
        origin.total(),
        4,
        "no-cache: the origin is asked every time"
    );
    assert_eq!(bodies.load(Ordering::SeqCst), 1, "but sends the body once");
    assert_eq!(d.stats().await["proxy"]["revalidations"], 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn grace_refresh_revalidates_in_the_background() {
    let (origin, bodies) = origin("max-age=1, stale-while-revalidate=30", "max-age=60").await;
    let d = Daemon::start(origin.addr, &[]);
    get(d.addr, "/g").await;
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let r = get(d.addr, "/g").await;
    assert_eq!((r.x_cache(), r.header("x-version")), ("STALE", "1"));
    d.wait_for_stats("the background revalidation", |s| {
        s["proxy"]["revalidations"] == 1
    })
    .await;
    let r = get(d.addr, "/g").await;
    assert_eq!(
        (r.x_cache(), r.header("x-version"), r.body.as_ref()),
        ("HIT", "2", BODY.as_bytes())
    );
    assert_eq!(bodies.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_200_to_a_revalidation_replaces_the_object() {
    let origin = Origin::start(|s| {
        let n = s.headers.get("if-none-match").map_or("1", |_| "2");
        Reply::ok(format!("body {n}"))
            .header("cache-control", "max-age=1, stale-while-revalidate=0")
            .header("etag", &format!("\"v{n}\""))
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    assert_eq!(get(d.addr, "/x").await.body, "body 1");
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(get(d.addr, "/x").await.body, "body 2");
    let r = get(d.addr, "/x").await;
    assert_eq!(
        (r.x_cache(), r.body.as_ref(), r.header("etag")),
        ("HIT", &b"body 2"[..], "\"v2\"")
    );
}

/// Six requests for a stale object at once, and the origin confirms it with a 304 that sets a session
/// cookie: a response that may not be stored is the answer for one request, so each client gets one of
/// its own, with its own cookie (before, all six got the cookie of the one fetch they were coalesced on).
#[tokio::test(flavor = "multi_thread")]
async fn a_304_with_set_cookie_is_not_shared_by_coalesced_requests() {
    const CLIENTS: usize = 6;
    let n = Arc::new(AtomicUsize::new(0));
    let origin = Origin::start(move |s| {
        let i = n.fetch_add(1, Ordering::SeqCst);
        if i == 0 {
            return Reply::ok(BODY)
                .header("cache-control", "max-age=1, stale-while-revalidate=0")
                .header("etag", "\"v1\"");
        }
        let reply = if s.headers.contains_key("if-none-match") {
            let mut reply = Reply::ok("").status(304);
            reply.headers.retain(|(n, _)| n != "content-length");
            reply.header("etag", "\"v1\"")
        } else {
            Reply::ok(BODY)
        };
        // Slow enough for every request to arrive while the first one's fetch is in flight.
        reply
            .delay(Duration::from_millis(300))
            .header("cache-control", "max-age=60")
            .header("set-cookie", &format!("sess={i}"))
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    get(d.addr, "/session").await;
    tokio::time::sleep(Duration::from_millis(1300)).await;

    let got = futures_util::future::join_all((0..CLIENTS).map(|_| get(d.addr, "/session"))).await;
    let mut cookies: Vec<&str> = got.iter().map(|r| r.header("set-cookie")).collect();
    for r in &got {
        assert_eq!((r.status.as_u16(), r.body.as_ref()), (200, BODY.as_bytes()));
    }
    assert_eq!(
        origin.total(),
        1 + CLIENTS,
        "each client's request went to the origin"
    );
    cookies.sort_unstable();
    cookies.dedup();
    assert_eq!(
        cookies.len(),
        CLIENTS,
        "each client got its own cookie: {cookies:?}"
    );
    assert!(
        cookies
            .iter()
            .all(|c| c.starts_with("sess=") && c != &"sess=0"),
        "{cookies:?}"
    );
}
