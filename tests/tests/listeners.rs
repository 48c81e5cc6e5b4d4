//! Client listeners end to end: TLS with SNI and ALPN, HTTP/2 over TLS and cleartext, the PROXY protocol,
//! and the limits against abuse, through the real daemon on real sockets.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;
use lacquer_tests::{
    eventually, request,
    tls::{self, TestCa},
    Daemon, Origin, Reply,
};
use ppp::v2;
use serde_json::json;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

fn cacheable() -> Reply {
    Reply::ok("cached body").header("cache-control", "max-age=60")
}

/// The names in the leaf certificate a server presented.
fn leaf_names(conn: &tokio_rustls::client::TlsStream<TcpStream>) -> String {
    let (_, certs) = tls::negotiated(conn);
    let der = &certs[0];
    // Good enough to tell test certificates apart: their names appear in the DER as plain ASCII.
    ["a.test", "shop.test", ".cdn.test", "renewed.test"]
        .into_iter()
        .filter(|n| der.windows(n.len()).any(|w| w == n.as_bytes()))
        .collect::<Vec<_>>()
        .join(",")
}

/// A daemon in front of `origin` with one listener, on an ephemeral port, with `settings`.
fn one_listener(origin: &Origin, settings: &str) -> Daemon {
    Daemon::with_config(
        origin.addr,
        &format!("[[listen]]\naddress = \"127.0.0.1:0\"\n{settings}\n"),
    )
}

/// Sends `raw` on a new connection and reads until the daemon closes it (or 10 s pass).
async fn raw_exchange(addr: std::net::SocketAddr, raw: &[u8]) -> (String, Duration) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(raw).await.unwrap();
    let start = Instant::now();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    (String::from_utf8_lossy(&out).into_owned(), start.elapsed())
}

#[tokio::test]
async fn tls_picks_the_certificate_by_sni_and_speaks_h2_by_alpn() {
    let origin = Origin::start(|_| cacheable()).await;
    let ca = TestCa::new();
    let certs = tempfile::tempdir().unwrap();
    let (a_cert, a_key) = ca.issue(certs.path(), "a", &["a.test"]);
    let (s_cert, s_key) = ca.issue(certs.path(), "shop", &["shop.test", "*.cdn.test"]);
    let d = Daemon::with_config(
        origin.addr,
        &format!(
            r#"
            [[listen]]
            address = "127.0.0.1:0"
            tls = [{{ cert = "{a_cert}", key = "{a_key}" }}, {{ cert = "{s_cert}", key = "{s_key}" }}]
            [[listen]]
            address = "127.0.0.1:0"
            [access_log]
            path = "{{dir}}/access.log"
            "#
        ),
    );
    let addr = d.addr;
    let plain = d.listeners[1];
    let cleartext = lacquer_tests::get(plain, "/page").await;
    assert_eq!(cleartext.status, 200);

    let h2 = tls::connect(addr, "a.test", ca.client(&["h2", "http/1.1"]))
        .await
        .expect("handshake for a.test");
    let (alpn, _) = tls::negotiated(&h2);
    assert_eq!(alpn.as_deref(), Some("h2"));
    assert_eq!(leaf_names(&h2), "a.test");
    let first = tls::h2_get(h2, "https://a.test/page").await.unwrap();
    assert_eq!(first.status, 200);
    assert_eq!(&first.body[..], b"cached body");
    assert_eq!(first.x_cache(), "MISS");

    // SNI picks the second certificate, wildcards included; HTTP/1.1 when the client offers only that.
    let h1 = tls::connect(addr, "img.cdn.test", ca.client(&["http/1.1"]))
        .await
        .expect("handshake for img.cdn.test");
    assert_eq!(tls::negotiated(&h1).0.as_deref(), Some("http/1.1"));
    assert_eq!(leaf_names(&h1), "shop.test,.cdn.test");
    let second = tls::h1_request(h1, Method::GET, "a.test", "/page", &[])
        .await
        .unwrap();
    assert_eq!(second.status, 200);
    assert_eq!(
        second.x_cache(),
        "HIT",
        "HTTP/2 and HTTP/1.1 share the cache key"
    );
    assert_eq!(origin.count("/page"), 2);
    let seen = &origin.seen()[1];
    assert_eq!(seen.headers["host"], "a.test", ":authority became Host");

    // A name we have no certificate for gets the first one, which the client rightly refuses.
    let Err(e) = tls::connect(addr, "other.test", ca.client(&["h2"])).await else {
        panic!("the default certificate is not valid for other.test");
    };
    assert!(e.contains("not valid for name"), "{e}");
    // Plain HTTP on a TLS listener is not answered as HTTP.
    let (reply, _) = raw_exchange(addr, b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n").await;
    assert!(!reply.contains("HTTP/1.1 200"), "{reply:?}");

    let stats = d
        .wait_for_stats("handshake errors counted", |s| {
            s["proxy"]["tls_handshake_errors"] == 2
        })
        .await;
    assert_eq!(stats["proxy"]["connections_tls"], 2);
    assert_eq!(stats["proxy"]["connections_http2"], 1);
    // Per listener, in configuration order, named by the address bound; each counts its own only.
    let (tls, clear) = (&stats["listeners"][0], &stats["listeners"][1]);
    assert_eq!(tls["address"], addr.to_string(), "{tls}");
    assert_eq!((&tls["tls"], &tls["quic"]), (&json!(true), &json!(false)));
    let c = &tls["counters"];
    assert_eq!(c["connections"], 4, "{tls}");
    assert_eq!(c["connections_tls"], 2, "{tls}");
    assert_eq!(c["tls_handshake_errors"], 2, "{tls}");
    assert_eq!(
        (&c["requests_http1"], &c["requests_http2"]),
        (&json!(1), &json!(1))
    );
    let body = b"cached body".len() as u64;
    assert_eq!(c["bytes_out_http1"], body, "{tls}");
    assert_eq!(c["bytes_out_http2"], body, "{tls}");
    assert_eq!(clear["address"], plain.to_string());
    assert_eq!(clear["tls"], false);
    let c = &clear["counters"];
    assert_eq!(c["connections"], 1, "{clear}");
    assert_eq!(
        (&c["requests_http1"], &c["requests_http2"]),
        (&json!(1), &json!(0))
    );
    assert_eq!(c["bytes_out_http1"], body, "{clear}");
    assert_eq!(
        (&c["connections_tls"], &c["tls_handshake_errors"]),
        (&json!(0), &json!(0))
    );
    let proxy = &stats["proxy"];
    assert_eq!(
        proxy["requests_http1"], 2,
        "the totals are the listeners' sums"
    );
    assert_eq!(proxy["bytes_out_http1"], 2 * body);
    assert_eq!(proxy["bytes_out_http2"], body);
    let metrics = d.admin_get("/metrics", Some(&d.secret())).await;
    let text = String::from_utf8_lossy(&metrics.body);
    for line in [
        format!("lacquer_listener_requests_total{{listener=\"{addr}\",protocol=\"http2\"}} 1"),
        format!("lacquer_listener_requests_total{{listener=\"{plain}\",protocol=\"http2\"}} 0"),
        format!(
            "lacquer_listener_handshake_errors_total{{listener=\"{addr}\",protocol=\"tls\"}} 2"
        ),
        format!(
            "lacquer_listener_sent_bytes_total{{listener=\"{plain}\",protocol=\"http1\"}} {body}"
        ),
        "lacquer_client_protocol_requests_total{protocol=\"http1\"} 2".to_owned(),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line} missing from:\n{text}"
        );
    }
    let log_file = d.dir.path().join("access.log");
    let log = eventually(Duration::from_secs(5), || {
        let text = std::fs::read_to_string(&log_file).unwrap_or_default();
        async move { (text.lines().count() >= 3).then_some(text) }
    })
    .await;
    let protocols: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split('"').nth(1)?.rsplit(' ').next())
        .collect();
    assert_eq!(
        protocols,
        ["HTTP/1.1", "HTTP/2.0", "HTTP/1.1"],
        "the access log names each request's protocol:\n{log}"
    );
}

#[tokio::test]
async fn cleartext_h2_by_prior_knowledge_and_http1_share_one_listener() {
    let origin = Origin::start(|_| cacheable()).await;
    let d = Daemon::start(origin.addr, &[]);
    let tcp = TcpStream::connect(d.addr).await.unwrap();
    let reply = tls::h2_get(tcp, "http://example.test/x").await.unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.x_cache(), "MISS");
    let again = request(
        d.addr,
        Method::GET,
        "/x",
        &[("host", "example.test")],
        Bytes::new(),
    )
    .await
    .unwrap();
    assert_eq!(again.x_cache(), "HIT");
    assert_eq!(origin.count("/x"), 1);
    assert_eq!(origin.seen()[0].headers["host"], "example.test");
    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["connections_http2"], 1);

    // With http2 off, the preface is just a bad HTTP/1.1 request.
    let plain = one_listener(&origin, "http2 = false");
    let tcp = TcpStream::connect(plain.addr).await.unwrap();
    assert!(tls::h2_get(tcp, "http://example.test/x").await.is_err());
}

fn proxy_v2(src: &str, dst: &str) -> Vec<u8> {
    let addresses: v2::Addresses = (src.parse().unwrap(), dst.parse().unwrap()).into();
    v2::Builder::with_addresses(
        v2::Version::Two | v2::Command::Proxy,
        v2::Protocol::Stream,
        addresses,
    )
    .build()
    .unwrap()
}

#[tokio::test]
async fn proxy_protocol_names_the_client_and_is_required_where_configured() {
    let origin = Origin::start(|_| Reply::ok("x")).await;
    let d = Daemon::with_config(
        origin.addr,
        r#"
        [[listen]]
        address = "127.0.0.1:0"
        proxy_protocol = true
        header_read_timeout = "1s"
        [[listen]]
        address = "127.0.0.1:0"
        "#,
    );
    let (proxied, plain) = (d.listeners[0], d.listeners[1]);
    let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");

    let v1 = format!(
        "PROXY TCP4 203.0.113.7 192.0.2.1 51234 80\r\n{}",
        get("/v1")
    );
    let (reply, _) = raw_exchange(proxied, v1.as_bytes()).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let mut v2 = proxy_v2("[2001:db8::9]:4000", "[2001:db8::1]:80");
    v2.extend_from_slice(get("/v2").as_bytes());
    let (reply, _) = raw_exchange(proxied, &v2).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");

    let xff = |path: &str| {
        origin
            .seen()
            .iter()
            .find(|s| s.path == path)
            .map(|s| s.headers["x-forwarded-for"].to_str().unwrap().to_owned())
    };
    assert_eq!(xff("/v1").as_deref(), Some("203.0.113.7"));
    assert_eq!(xff("/v2").as_deref(), Some("2001:db8::9"));

    // Without a header, with garbage, or with a truncated one (closed at header_read_timeout): closed
    // without an answer or a fetch.
    let truncated = &proxy_v2("198.51.100.1:1", "192.0.2.1:80")[..20];
    for bad in [
        get("/none").as_bytes(),
        truncated,
        b"PROXY TCP4 nonsense\r\n",
    ] {
        let (reply, _) = raw_exchange(proxied, bad).await;
        assert_eq!(reply, "", "{bad:?}");
    }
    // A header sent where none is expected is a bad request, and spoofs nothing.
    let spoof = format!("PROXY TCP4 6.6.6.6 192.0.2.1 1 80\r\n{}", get("/spoof"));
    let (reply, _) = raw_exchange(plain, spoof.as_bytes()).await;
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    assert_eq!(origin.total(), 2, "{:?}", origin.counts());
    let stats = d
        .wait_for_stats("PROXY errors counted", |s| {
            s["proxy"]["proxy_protocol_errors"] == 2
        })
        .await;
    assert_eq!(stats["proxy"]["header_timeouts"], 1, "{stats}");
}

#[tokio::test]
async fn connection_limits_answer_503_and_release_on_close() {
    let origin = Origin::start(|_| Reply::ok("x")).await;
    let d = Daemon::with_config(
        origin.addr,
        r#"
        [[listen]]
        address = "127.0.0.1:0"
        max_connections_per_ip = 2
        [[listen]]
        address = "127.0.0.1:0"
        max_connections = 1
        "#,
    );
    for (addr, allowed) in [(d.listeners[0], 2), (d.listeners[1], 1)] {
        let mut open = Vec::new();
        for _ in 0..allowed {
            let tcp = TcpStream::connect(addr).await.unwrap();
            let (mut send, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                    .await
                    .unwrap();
            tokio::spawn(conn);
            let req = http::Request::get("/")
                .header("host", "t")
                .body(String::new())
                .unwrap();
            assert_eq!(send.send_request(req).await.unwrap().status(), 200);
            open.push(send);
        }
        let (reply, _) = raw_exchange(addr, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").await;
        assert!(reply.starts_with("HTTP/1.1 503"), "{addr}: {reply}");
        assert!(
            reply.to_ascii_lowercase().contains("retry-after: 1"),
            "{reply}"
        );
        drop(open);
        // Closing frees the places (the daemon notices the close a moment later).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r = request(addr, Method::GET, "/", &[], Bytes::new())
                .await
                .unwrap();
            if r.status == 200 {
                break;
            }
            assert!(Instant::now() < deadline, "{addr}: still {}", r.status);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let stats = d.stats().await;
    assert!(
        stats["proxy"]["connections_refused"].as_u64() >= Some(2),
        "{stats}"
    );
}

#[tokio::test]
async fn slow_and_idle_clients_are_closed() {
    let origin = Origin::start(|_| Reply::ok("x")).await;
    let d = one_listener(
        &origin,
        "header_read_timeout = \"1s\"\nidle_timeout = \"2s\"",
    );
    // Slowloris: a head that never ends.
    let (reply, took) = raw_exchange(d.addr, b"GET / HTTP/1.1\r\nHost: t\r\nX-a: b\r\n").await;
    assert_eq!(reply, "");
    assert!(took < Duration::from_secs(5), "closed after {took:?}");
    // Nothing at all: the same.
    let (_, took) = raw_exchange(d.addr, b"").await;
    assert!(took < Duration::from_secs(5), "closed after {took:?}");
    // An idle HTTP/2 connection goes after idle_timeout.
    let tcp = TcpStream::connect(d.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    let conn = tokio::spawn(conn);
    let req = http::Request::get("http://t/").body(String::new()).unwrap();
    assert_eq!(send.send_request(req).await.unwrap().status(), 200);
    let start = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(10), conn).await;
    assert!(ended.is_ok(), "the idle HTTP/2 connection is still open");
    assert!(
        start.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        start.elapsed()
    );
    let stats = d
        .wait_for_stats("timeouts counted", |s| s["proxy"]["idle_timeouts"] == 1)
        .await;
    assert_eq!(stats["proxy"]["header_timeouts"], 2, "{stats}");
}

#[tokio::test]
async fn oversized_heads_get_431_and_bodies_413() {
    let origin = Origin::start(|_| Reply::ok("x")).await;
    let settings = "max_header_size = \"8KiB\"\nmax_headers = 20\nmax_request_body = \"1KiB\"";
    let d = one_listener(&origin, settings);
    let big = "v".repeat(9000);
    let r = request(d.addr, Method::GET, "/", &[("x-big", &big)], Bytes::new())
        .await
        .unwrap();
    assert_eq!(r.status, 431);
    let many: Vec<(String, String)> = (0..30).map(|n| (format!("x-h{n}"), "v".into())).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    let r = request(d.addr, Method::GET, "/", &many, Bytes::new())
        .await
        .unwrap();
    assert_eq!(r.status, 431);

    let post = |len: usize| {
        request(
            d.addr,
            Method::POST,
            "/up",
            &[],
            Bytes::from(vec![b'x'; len]),
        )
    };
    let r = post(2000).await.unwrap();
    assert_eq!(r.status, 413);
    assert_eq!(origin.count("/up"), 0, "refused before the backend");
    // A chunked body has no declared length: cut off when it passes the limit.
    let chunked =
        b"POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
        400\r\n";
    let mut raw = chunked.to_vec();
    raw.extend(vec![b'y'; 0x400]);
    raw.extend(b"\r\n400\r\n");
    raw.extend(vec![b'y'; 0x400]);
    raw.extend(b"\r\n0\r\n\r\n");
    let (reply, _) = raw_exchange(d.addr, &raw).await;
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    let small = post(1000).await.unwrap();
    assert_eq!(small.status, 200);
    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["headers_too_large"], 2, "{stats}");
    assert_eq!(stats["proxy"]["bodies_too_large"], 2, "{stats}");
    let backends = d.admin_get("/v1/backends", Some(&d.secret())).await;
    let backends: serde_json::Value = serde_json::from_slice(&backends.body).unwrap();
    assert_eq!(
        backends["backends"][0]["errors"], 0,
        "a client's body is not the backend's failure: {backends}"
    );
}

#[tokio::test]
async fn reload_reads_renewed_certificates_and_refuses_broken_ones() {
    let origin = Origin::start(|_| Reply::ok("x")).await;
    let ca = TestCa::new();
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = ca.issue(certs.path(), "site", &["a.test"]);
    let d = one_listener(
        &origin,
        &format!("tls = [{{ cert = \"{cert}\", key = \"{key}\" }}]"),
    );
    let client = ca.client(&["http/1.1"]);
    let held = tls::connect(d.addr, "a.test", client.clone())
        .await
        .unwrap();
    assert_eq!(leaf_names(&held), "a.test");

    // Renewed in place (same paths), as certbot does: a reload serves it to new connections.
    ca.issue(certs.path(), "site", &["a.test", "renewed.test"]);
    let reload = d.admin_post("/v1/reload", serde_json::json!({})).await;
    assert_eq!(reload.status, 200, "{:?}", reload.body);
    let body: serde_json::Value = serde_json::from_slice(&reload.body).unwrap();
    assert_eq!(body["applied"], serde_json::json!(["listen[0].tls"]));
    let renewed = tls::connect(d.addr, "renewed.test", client.clone())
        .await
        .unwrap();
    assert_eq!(leaf_names(&renewed), "a.test,renewed.test");

    // A broken file is refused and the running certificate stays.
    std::fs::write(&key, "not a key").unwrap();
    let refused = d.admin_post("/v1/reload", serde_json::json!({})).await;
    assert_eq!(refused.status, 400);
    let text = String::from_utf8_lossy(&refused.body);
    assert!(
        text.contains("listen[0].tls") && text.contains("site.key"),
        "{text}"
    );
    let still = tls::connect(d.addr, "renewed.test", client).await.unwrap();
    assert_eq!(leaf_names(&still), "a.test,renewed.test");
    // The connection opened before any of it still works.
    let r = tls::h1_request(held, Method::GET, "a.test", "/", &[])
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    // The listener's counters went on through both reloads: a reload does not rebuild listeners. (The
    // last handshake may complete on this side before the daemon's: TLS 1.3's client speaks last.)
    let stats = d
        .wait_for_stats("the last handshake counted", |s| {
            s["listeners"][0]["counters"]["connections_tls"] == 3
        })
        .await;
    let c = &stats["listeners"][0]["counters"];
    assert_eq!(c["connections"], 3, "{c}");
    assert_eq!(c["connections_tls"], 3, "{c}");
    assert_eq!(c["requests_http1"], 1, "{c}");
}
