//! The data path: hits, passes, invalidation, variants, and header handling, judged by what the client got
//! and what the origin saw.

use std::time::Duration;

use bytes::Bytes;
use http::Method;
use lacquer_tests::{get, request, Daemon, Origin, Reply};

fn cacheable(body: &str) -> Reply {
    Reply::ok(body.to_owned()).header("cache-control", "max-age=60")
}

#[tokio::test(flavor = "multi_thread")]
async fn second_request_is_a_hit_with_age() {
    let origin =
        Origin::start(|s| cacheable(&format!("body of {}", s.path)).header("age", "5")).await;
    let d = Daemon::start(origin.addr, &[]);
    let first = get(d.addr, "/a").await;
    assert_eq!((first.status.as_u16(), first.x_cache()), (200, "MISS"));
    assert_eq!(first.body, "body of /a");
    assert!(first.header("cache-status").contains("fwd=miss; stored"));
    let second = get(d.addr, "/a").await;
    assert_eq!(second.x_cache(), "HIT");
    assert_eq!(second.body, "body of /a");
    assert!(second
        .header("cache-status")
        .starts_with("lacquer; hit; ttl="));
    let age: u64 = second.header("age").parse().unwrap();
    assert!((5..60).contains(&age), "age {age}");
    assert_eq!(second.header("via"), "1.1 lacquer");
    assert_eq!(origin.count("/a"), 1);
    let head = request(d.addr, Method::HEAD, "/a", &[], Bytes::new())
        .await
        .unwrap();
    assert_eq!(
        (
            head.x_cache(),
            head.body.len(),
            head.header("content-length")
        ),
        ("HIT", 0, "10")
    );
    assert_eq!(origin.count("/a"), 1);
    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["hits"], 2);
    assert_eq!(stats["proxy"]["misses"], 1);
}

/// A HEAD that misses, or finds a stale object, goes to the origin as a GET that fills the cache (a
/// conditional GET when the stale object has validators), as Varnish does: the HEAD gets the headers, the
/// next GET is a hit. The origin never sees a HEAD for a looked-up request, so no HEAD response ever
/// updates a stored one (RFC 9111 §4.3.5 does not arise).
#[tokio::test(flavor = "multi_thread")]
async fn a_head_that_misses_fills_with_a_get() {
    let origin = Origin::start(|s| {
        if s.headers.get("if-none-match").is_some_and(|v| v == "\"1\"") {
            Reply::ok("")
                .status(304)
                .header("cache-control", "max-age=1")
        } else {
            Reply::ok("the body")
                .header("cache-control", "max-age=1")
                .header("etag", "\"1\"")
        }
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    let head = request(d.addr, Method::HEAD, "/h", &[], Bytes::new())
        .await
        .unwrap();
    assert_eq!(
        (head.status.as_u16(), head.x_cache(), head.body.len()),
        (200, "MISS", 0)
    );
    assert_eq!(head.header("content-length"), "8");
    let r = get(d.addr, "/h").await;
    assert_eq!((r.x_cache(), r.body.as_ref()), ("HIT", &b"the body"[..]));

    tokio::time::sleep(Duration::from_millis(1300)).await;
    let head = request(d.addr, Method::HEAD, "/h", &[], Bytes::new())
        .await
        .unwrap();
    assert_eq!((head.status.as_u16(), head.body.len()), (200, 0));
    assert_eq!(head.header("content-length"), "8");
    let r = get(d.addr, "/h").await;
    assert_eq!((r.x_cache(), r.body.as_ref()), ("HIT", &b"the body"[..]));

    let seen = origin.seen();
    let sent: Vec<_> = seen
        .iter()
        .map(|s| (s.method.as_str(), s.headers.contains_key("if-none-match")))
        .collect();
    assert_eq!(sent, [("GET", false), ("GET", true)]);
}

#[tokio::test(flavor = "multi_thread")]
async fn forwarding_headers() {
    let origin = Origin::start(|_| cacheable("x")).await;
    let d = Daemon::start(origin.addr, &[]);
    request(
        d.addr,
        Method::GET,
        "/h?q=1",
        &[
            ("host", "Example.com"),
            ("x-forwarded-for", "203.0.113.9"),
            ("connection", "x-hop"),
            ("x-hop", "1"),
        ],
        Bytes::new(),
    )
    .await
    .unwrap();
    let seen = &origin.seen()[0];
    assert_eq!(seen.path, "/h?q=1");
    assert_eq!(seen.headers["host"], "example.com", "as it is keyed");
    assert_eq!(seen.headers["x-forwarded-for"], "203.0.113.9, 127.0.0.1");
    assert_eq!(seen.headers["via"], "1.1 lacquer");
    assert!(!seen.headers.contains_key("x-hop"));
}

#[tokio::test(flavor = "multi_thread")]
async fn uncacheable_responses_and_requests_pass() {
    let origin = Origin::start(|s| match s.path.as_str() {
        "/nostore" => Reply::ok("n").header("cache-control", "no-store, max-age=60"),
        "/private" => Reply::ok("p").header("cache-control", "private, max-age=60"),
        "/cookie" => cacheable("c").header("set-cookie", "session=1"),
        "/nofresh" => Reply::ok("f"),
        "/varystar" => cacheable("v").header("vary", "*"),
        _ => cacheable("ok"),
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    // Cache-Status says why each was not stored (RFC 9211 `detail`).
    for (path, why) in [
        ("/nostore", "no-store"),
        ("/private", "private"),
        ("/cookie", "set-cookie"),
        ("/nofresh", "not-fresh"),
        ("/varystar", "vary-star"),
    ] {
        for _ in 0..3 {
            let r = get(d.addr, path).await;
            assert_eq!(r.status, 200, "{path}");
            assert_eq!(r.x_cache(), "MISS", "{path}");
            assert_eq!(
                r.header("cache-status"),
                format!("lacquer; fwd=miss; detail=\"{why}\""),
                "{path}"
            );
        }
        assert_eq!(
            origin.count(path),
            3,
            "{path} must reach the origin every time"
        );
    }
    // A request with Cookie passes; one with Authorization is a miss of its own, whose response is not
    // stored unless it says it may be shared (below).
    for (name, value, x_cache, status) in [
        (
            "cookie",
            "a=b",
            "PASS",
            "lacquer; fwd=bypass; detail=\"cookie\"",
        ),
        (
            "authorization",
            "Bearer t",
            "MISS",
            "lacquer; fwd=miss; detail=\"authorization\"",
        ),
    ] {
        let path = format!("/req-{name}");
        for _ in 0..2 {
            let r = request(d.addr, Method::GET, &path, &[(name, value)], Bytes::new())
                .await
                .unwrap();
            assert_eq!(r.x_cache(), x_cache);
            assert_eq!(r.header("cache-status"), status);
        }
        assert_eq!(origin.count(&path), 2);
        assert_eq!(
            origin
                .seen()
                .iter()
                .filter(|s| s.headers.get(name).is_some())
                .count()
                % 2,
            0
        );
    }
}

/// RFC 9111 §3.5: a response to a request with `Authorization` is stored when it says it may be shared
/// (`public`, `s-maxage`, `must-revalidate`) and then answers requests without it; a request with
/// `Authorization` is never answered from the cache (`cache_authorized = false`) nor coalesced.
#[tokio::test(flavor = "multi_thread")]
async fn a_shareable_answer_to_an_authorized_request_is_stored_for_others() {
    let origin = Origin::start(|s| {
        let cache_control = match s.path.as_str() {
            "/public" => "max-age=60, public",
            "/s-maxage" => "s-maxage=60",
            "/must-revalidate" => "max-age=60, must-revalidate",
            _ => "max-age=60",
        };
        let who = s
            .headers
            .get("authorization")
            .map_or("anonymous", |v| v.to_str().unwrap());
        Reply::ok(format!("{} for {who}", s.path)).header("cache-control", cache_control)
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    let auth = [("authorization", "Bearer t")];
    for path in ["/public", "/s-maxage", "/must-revalidate", "/plain"] {
        let r = request(d.addr, Method::GET, path, &auth, Bytes::new())
            .await
            .unwrap();
        assert_eq!(
            (r.x_cache(), r.body.clone()),
            ("MISS", Bytes::from(format!("{path} for Bearer t"))),
            "{path}"
        );
    }
    for path in ["/public", "/s-maxage"] {
        let r = get(d.addr, path).await;
        assert_eq!(
            (r.x_cache(), r.body.clone()),
            ("HIT", Bytes::from(format!("{path} for Bearer t"))),
            "{path}"
        );
        assert_eq!(origin.count(path), 1, "{path}");
    }
    // must-revalidate is on personal pages too: not shared unless the operator looks up authorized
    // requests (cache_authorized).
    for path in ["/plain", "/must-revalidate"] {
        let r = get(d.addr, path).await;
        assert_eq!(
            (r.x_cache(), r.body.clone()),
            ("MISS", Bytes::from(format!("{path} for anonymous"))),
            "{path}"
        );
    }
    // Stored, yet a request with Authorization still goes to the origin.
    let r = request(d.addr, Method::GET, "/public", &auth, Bytes::new())
        .await
        .unwrap();
    assert_eq!(r.x_cache(), "MISS");
    assert_eq!(origin.count("/public"), 2);
    assert_eq!(d.stats().await["proxy"]["coalesced_waiters"], 0);
}

/// Interim responses (103 Early Hints, 102) from the origin are counted and never stored: neither the
/// final response nor the stored one carries their fields. (They cannot be forwarded: hyper's server
/// cannot send a 1xx, hyper#3815.)
#[tokio::test(flavor = "multi_thread")]
async fn interim_responses_are_counted_and_never_stored() {
    let origin = lacquer_tests::Origin::raw(|_| {
        vec![lacquer_tests::Raw::write(
            "HTTP/1.1 102 Processing\r\n\r\n\
             HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\nx-hint: 1\r\n\r\n\
             HTTP/1.1 200 OK\r\ncache-control: max-age=60\r\ncontent-length: 5\r\n\r\nfinal",
        )]
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    let first = get(d.addr, "/early").await;
    let second = get(d.addr, "/early").await;
    for (r, x_cache) in [(&first, "MISS"), (&second, "HIT")] {
        assert_eq!(
            (r.status.as_u16(), r.x_cache(), r.body.as_ref()),
            (200, x_cache, &b"final"[..])
        );
        assert!(
            !r.headers.contains_key("link") && !r.headers.contains_key("x-hint"),
            "{:?}",
            r.headers
        );
    }
    assert_eq!(origin.total(), 1);
    let pass = request(d.addr, Method::POST, "/early", &[], Bytes::new())
        .await
        .unwrap();
    assert_eq!(pass.status, 200);
    assert_eq!(d.stats().await["proxy"]["interim_responses"], 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn successful_unsafe_methods_invalidate() {
    let origin = Origin::start(|s| match s.method.as_str() {
        "POST" => Reply::ok(format!("echo {}", String::from_utf8_lossy(&s.body)))
            .header("location", "/other"),
        "DELETE" => Reply::ok("no").status(500),
        _ => cacheable(&format!("v{}", s.path)),
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    for path in ["/doc", "/other", "/doc"] {
        get(d.addr, path).await;
    }
    assert_eq!(get(d.addr, "/doc").await.x_cache(), "HIT");
    let failed = request(d.addr, Method::DELETE, "/doc", &[], Bytes::new())
        .await
        .unwrap();
    assert_eq!((failed.status.as_u16(), failed.x_cache()), (500, "PASS"));
    assert_eq!(
        get(d.addr, "/doc").await.x_cache(),
        "HIT",
        "a failed DELETE invalidates nothing"
    );
    let post = request(
        d.addr,
        Method::POST,
        "/doc",
        &[],
        Bytes::from_static(b"payload"),
    )
    .await
    .unwrap();
    assert_eq!(post.body, "echo payload");
    assert_eq!(post.header("cache-status"), "lacquer; fwd=method");
    assert_eq!(get(d.addr, "/doc").await.x_cache(), "MISS");
    assert_eq!(
        get(d.addr, "/other").await.x_cache(),
        "MISS",
        "Location target invalidated"
    );
    assert_eq!(origin.count("/doc"), 2 + 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn vary_keeps_one_variant_per_selection() {
    let origin = Origin::start(|s| {
        let lang = s
            .headers
            .get("accept-language")
            .map_or("none", |v| v.to_str().unwrap())
            .to_owned();
        cacheable(&format!("hello in {lang}")).header("vary", "Accept-Language")
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    let get_lang = |lang: &'static str| {
        let addr = d.addr;
        async move {
            request(
                addr,
                Method::GET,
                "/v",
                &[("accept-language", lang)],
                Bytes::new(),
            )
            .await
            .unwrap()
        }
    };
    assert_eq!(get_lang("en").await.x_cache(), "MISS");
    assert_eq!(get_lang("de").await.x_cache(), "MISS");
    let en = get_lang("en").await;
    let de = get_lang("de").await;
    assert_eq!(
        (en.x_cache(), en.body.as_ref()),
        ("HIT", &b"hello in en"[..])
    );
    assert_eq!(
        (de.x_cache(), de.body.as_ref()),
        ("HIT", &b"hello in de"[..])
    );
    let none = get(d.addr, "/v").await;
    assert_eq!(
        (none.x_cache(), none.body.as_ref()),
        ("MISS", &b"hello in none"[..])
    );
    assert_eq!(origin.count("/v"), 3);
}

/// Spelled in case or spacing differently, a selecting field selects one variant: the origin is asked in
/// one form, and the variant is made of that form (cache-tests' vary-normalise), never of two readings.
#[tokio::test(flavor = "multi_thread")]
async fn a_selecting_field_spelled_differently_selects_one_variant() {
    let origin = Origin::start(|s| {
        let lang = s
            .headers
            .get_all("accept-language")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect::<Vec<_>>()
            .join("|");
        cacheable(&format!("hello in {lang}")).header("vary", "Accept-Language")
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    let get_lang = |langs: &'static [&'static str]| {
        let addr = d.addr;
        async move {
            let headers: Vec<(&str, &str)> =
                langs.iter().map(|l| ("accept-language", *l)).collect();
            request(addr, Method::GET, "/v", &headers, Bytes::new())
                .await
                .unwrap()
        }
    };
    let first = get_lang(&["en-US, fr;q=0.5"]).await;
    assert_eq!(
        (first.x_cache(), first.body.as_ref()),
        ("MISS", &b"hello in en-us,fr;q=0.5"[..]),
        "the origin is asked in the one form"
    );
    d.wait_for_stats("stored", |s| {
        s["store"]["objects_published"].as_u64() >= Some(1)
    })
    .await;
    for spelled in [
        &["en-us,fr; q=0.5"][..],
        &["EN-US ,FR;q=0.5"],
        &["en-US", "fr;q=0.5"],
    ] {
        let r = get_lang(spelled).await;
        assert_eq!(
            (r.x_cache(), r.body.as_ref()),
            ("HIT", &b"hello in en-us,fr;q=0.5"[..]),
            "{spelled:?}"
        );
    }
    assert_eq!(
        get_lang(&["fr, en-US;q=0.5"]).await.x_cache(),
        "MISS",
        "another order is another question"
    );
    assert_eq!(origin.count("/v"), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn backend_down_is_a_clear_error() {
    let unused = lacquer_tests::unused_addr();
    let d = Daemon::start(unused, &[]);
    let r = get(d.addr, "/x").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.header("retry-after"), "5", "as Varnish's built-in 503");
    // Clear to the operator (the log), not to the public: the page names no backend.
    assert!(
        !String::from_utf8_lossy(&r.body).contains(&unused.to_string()),
        "{:?}",
        r.body
    );
    d.wait_for_log("unreachable").await;
    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["backend_errors"], 1);
    tokio::time::sleep(Duration::from_millis(10)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cdn_cache_control_overrides_cache_control() {
    let origin = Origin::start(|_| {
        Reply::ok("targeted")
            .header("cache-control", "no-store")
            .header("cdn-cache-control", "max-age=60")
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    assert_eq!(get(d.addr, "/t").await.x_cache(), "MISS");
    let hit = get(d.addr, "/t").await;
    assert_eq!(
        (hit.x_cache(), hit.body.as_ref()),
        ("HIT", &b"targeted"[..])
    );
    assert_eq!(
        hit.header("cache-control"),
        "no-store",
        "downstream caches still see Cache-Control"
    );
    assert_eq!(origin.count("/t"), 1);
}
