//! Conditional requests and byte ranges answered from the cache, on hits and on misses.

use bytes::Bytes;
use http::Method;
use lacquer_tests::{request, ClientReply, Daemon, Origin, Reply};

const LEN: usize = 600_000;

fn body() -> Bytes {
    (0..LEN).map(|i| (i % 251) as u8).collect::<Vec<_>>().into()
}

async fn origin() -> Origin {
    Origin::start(|_| {
        Reply::ok(body())
            .header("cache-control", "max-age=60")
            .header("etag", "\"v1\"")
            .header("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT")
            .header("content-type", "video/mp2t")
    })
    .await
}

async fn get(d: &Daemon, path: &str, headers: &[(&str, &str)]) -> ClientReply {
    request(d.addr, Method::GET, path, headers, Bytes::new())
        .await
        .expect("request")
}

#[tokio::test(flavor = "multi_thread")]
async fn conditionals_and_ranges_from_a_stored_object() {
    let origin = origin().await;
    let d = Daemon::start(origin.addr, &[]);
    let full = get(&d, "/seg.ts", &[]).await;
    assert_eq!(full.body, body());
    d.wait_for_stats("stored", |s| s["proxy"]["objects_stored"] == 1)
        .await;

    let r = get(&d, "/seg.ts", &[("if-none-match", "W/\"v1\"")]).await;
    assert_eq!(
        (r.status.as_u16(), r.x_cache(), r.body.len()),
        (304, "HIT", 0)
    );
    assert_eq!(r.header("etag"), "\"v1\"");
    assert_eq!(
        r.header("content-type"),
        "",
        "304 carries no representation metadata"
    );
    assert_eq!(
        get(&d, "/seg.ts", &[("if-none-match", "\"v0\"")])
            .await
            .status,
        200
    );
    let r = get(
        &d,
        "/seg.ts",
        &[("if-modified-since", "Mon, 07 Nov 1994 08:49:37 GMT")],
    )
    .await;
    assert_eq!(r.status, 304);
    let r = get(
        &d,
        "/seg.ts",
        &[("if-modified-since", "Sat, 05 Nov 1994 08:49:37 GMT")],
    )
    .await;
    assert_eq!(r.status, 200);

    let cases: &[(&str, usize, usize)] = &[
        ("bytes=0-99", 0, 99),
        ("bytes=262000-262500", 262000, 262500),
        ("bytes=-100", LEN - 100, LEN - 1),
        ("bytes=599990-", LEN - 10, LEN - 1),
    ];
    for &(range, first, last) in cases {
        let r = get(&d, "/seg.ts", &[("range", range)]).await;
        assert_eq!((r.status.as_u16(), r.x_cache()), (206, "HIT"), "{range}");
        assert_eq!(
            r.header("content-range"),
            format!("bytes {first}-{last}/{LEN}"),
            "{range}"
        );
        assert!(r.body == body().slice(first..=last), "{range}: body");
    }

    let r = get(&d, "/seg.ts", &[("range", "bytes=600000-")]).await;
    assert_eq!(
        (r.status.as_u16(), r.header("content-range")),
        (416, "bytes */600000")
    );

    let r = get(&d, "/seg.ts", &[("range", "bytes=0-9,300000-300009")]).await;
    assert_eq!(r.status, 206);
    let ct = r.header("content-type").to_owned();
    let boundary = ct
        .strip_prefix("multipart/byteranges; boundary=")
        .expect("multipart");
    let text = String::from_utf8_lossy(&r.body);
    assert!(text.contains(&format!(
        "--{boundary}\r\nContent-Type: video/mp2t\r\nContent-Range: bytes 0-9/600000\r\n\r\n"
    )));
    assert!(text.contains("Content-Range: bytes 300000-300009/600000"));
    assert!(text.ends_with(&format!("\r\n--{boundary}--\r\n")));
    assert_eq!(r.header("content-length"), r.body.len().to_string());
    let marker = b"Content-Range: bytes 300000-300009/600000\r\n\r\n";
    let at = r
        .body
        .windows(marker.len())
        .position(|w| w == marker)
        .unwrap()
        + marker.len();
    assert_eq!(&r.body[at..at + 10], &body()[300000..300010]);

    let r = get(
        &d,
        "/seg.ts",
        &[("range", "bytes=0-9"), ("if-range", "\"v0\"")],
    )
    .await;
    assert_eq!(
        (r.status.as_u16(), r.body.len()),
        (200, LEN),
        "a stale If-Range gets the whole body"
    );
    let r = get(
        &d,
        "/seg.ts",
        &[("range", "bytes=0-9"), ("if-range", "\"v1\"")],
    )
    .await;
    assert_eq!(r.status, 206);
    assert_eq!(origin.count("/seg.ts"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn ranges_and_conditionals_on_a_miss() {
    let origin = origin().await;
    let d = Daemon::start(origin.addr, &[]);
    let r = get(&d, "/a.ts", &[("range", "bytes=0-")]).await;
    assert_eq!(
        (r.status.as_u16(), r.x_cache()),
        (206, "MISS"),
        "bytes=0- on a miss is a 206"
    );
    assert_eq!(
        r.header("content-range"),
        format!("bytes 0-{}/{LEN}", LEN - 1)
    );
    assert!(r.body == body());

    let r = get(&d, "/b.ts", &[("range", "bytes=300000-300099")]).await;
    assert_eq!((r.status.as_u16(), r.body.len()), (206, 100));
    assert!(r.body == body().slice(300000..300100));
    assert!(
        origin
            .seen()
            .iter()
            .all(|s| !s.headers.contains_key("range")),
        "the fill fetched whole objects"
    );
    let whole = get(&d, "/b.ts", &[]).await;
    assert!(whole.body == body(), "the whole object was stored");

    // An origin that ignores the client's If-None-Match sends the whole object: stored, and the client's
    // conditional answered from it.
    let r = get(&d, "/c.ts", &[("if-none-match", "\"v1\"")]).await;
    assert_eq!((r.status.as_u16(), r.body.len()), (304, 0));
    assert_eq!(get(&d, "/c.ts", &[]).await.body.len(), LEN);
    assert_eq!(origin.total(), 3);
}

/// With nothing stored to validate with, a client's own `If-None-Match`/`If-Modified-Since` goes to the
/// origin and its 304 answers that client; nothing is stored, the URL is not marked uncacheable, and a
/// request coalesced on that fetch gets the whole object all the same.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_conditional_goes_to_the_origin_when_nothing_is_stored() {
    let origin = Origin::start(|s| {
        let matched = s
            .headers
            .get("if-none-match")
            .is_some_and(|v| v == "\"v1\"")
            || s.headers
                .get("if-modified-since")
                .is_some_and(|v| v == "Sun, 06 Nov 1994 08:49:37 GMT");
        let reply = if matched {
            Reply::ok("").status(304)
        } else {
            Reply::ok("whole")
        };
        reply
            .header("cache-control", "max-age=60")
            .header("etag", "\"v1\"")
            .header("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT")
            .delay(std::time::Duration::from_millis(300))
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    for (path, condition) in [
        ("/inm", ("if-none-match", "\"v1\"")),
        (
            "/ims",
            ("if-modified-since", "Sun, 06 Nov 1994 08:49:37 GMT"),
        ),
    ] {
        let r = get(&d, path, &[condition]).await;
        assert_eq!(
            (r.status.as_u16(), r.x_cache(), r.body.len()),
            (304, "MISS", 0),
            "{path}"
        );
        let seen = origin.seen();
        let sent = seen.iter().rfind(|s| s.path == path).unwrap();
        assert_eq!(sent.headers[condition.0], condition.1, "{path}");
    }
    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["objects_stored"], 0);
    assert_eq!(stats["proxy"]["uncacheable"], 0);

    // A conditional request leads the fetch and an unconditional one joins it: the 304 is for the first
    // alone, the second fetches the whole object for itself, which is stored.
    let conditional = get(&d, "/both", &[("if-none-match", "\"v1\"")]);
    let plain = async {
        // Once the origin has the conditional fetch (it answers 300 ms later), the plain one joins it.
        let asked = async {
            while origin.count("/both") == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), asked)
            .await
            .expect("the conditional request reaches the origin");
        get(&d, "/both", &[]).await
    };
    let (conditional, plain) = tokio::join!(conditional, plain);
    assert_eq!(conditional.status, 304);
    assert_eq!(
        (plain.status.as_u16(), plain.body.as_ref()),
        (200, &b"whole"[..])
    );
    assert_eq!(origin.count("/both"), 2);
    // The plain client has every byte before the store has published them: a request in between joins
    // the finishing fetch (a MISS, collapsed); once published, both are hits.
    d.wait_for_stats("the whole object stored", |s| {
        s["proxy"]["objects_stored"] == 1
    })
    .await;
    let r = get(&d, "/both", &[("if-none-match", "\"v1\"")]).await;
    assert_eq!((r.status.as_u16(), r.x_cache()), (304, "HIT"));
    let r = get(&d, "/both", &[]).await;
    assert_eq!((r.x_cache(), r.body.as_ref()), ("HIT", &b"whole"[..]));
    assert_eq!(origin.count("/both"), 2);
    let unconditional = origin
        .seen()
        .iter()
        .filter(|s| s.path == "/both" && !s.headers.contains_key("if-none-match"))
        .count();
    assert_eq!(unconditional, 1);
}
