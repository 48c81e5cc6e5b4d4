//! Every class of request over every client protocol: HTTP/1.1, cleartext HTTP/2 and HTTP/2 over TLS.
//! The origin speaks HTTP/1.1 whatever the client spoke; a request that reached it with the client's
//! HTTP/2 head once failed in hyper's client, so every pass, miss, invalidation and revalidation of an
//! HTTP/2 client answered 502 and only fills (built afresh) worked.

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use lacquer_tests::{
    tls::{TestCa, Transport},
    Daemon, Origin, Reply,
};

/// One request and what must come of it.
struct Case {
    name: &'static str,
    method: Method,
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    body: &'static str,
    /// The `X-Cache` the client is answered with.
    x_cache: &'static str,
    /// The requests the origin sees for the case's path, as `METHOD body cookie`, in order.
    origin_saw: &'static [&'static str],
}

const CASES: &[Case] = &[
    Case {
        name: "cacheable GET",
        method: Method::GET,
        path: "/cacheable",
        headers: &[],
        body: "",
        x_cache: "MISS",
        origin_saw: &["GET  -"],
    },
    Case {
        name: "the same GET again",
        method: Method::GET,
        path: "/cacheable",
        headers: &[],
        body: "",
        x_cache: "HIT",
        origin_saw: &["GET  -"],
    },
    Case {
        name: "HEAD of a stored object",
        method: Method::HEAD,
        path: "/cacheable",
        headers: &[],
        body: "",
        x_cache: "HIT",
        origin_saw: &["GET  -"],
    },
    Case {
        name: "GET with two cookie fields",
        method: Method::GET,
        path: "/cookie",
        headers: &[("cookie", "a=1"), ("cookie", "b=2")],
        body: "",
        x_cache: "PASS",
        origin_saw: &["GET  a=1; b=2"],
    },
    Case {
        name: "GET with no-store",
        method: Method::GET,
        path: "/no-store",
        headers: &[("cache-control", "no-store")],
        body: "",
        x_cache: "PASS",
        origin_saw: &["GET  -"],
    },
    Case {
        name: "GET with Authorization",
        method: Method::GET,
        path: "/authorized",
        headers: &[("authorization", "Bearer t")],
        body: "",
        x_cache: "MISS",
        origin_saw: &["GET  -"],
    },
    Case {
        name: "HEAD with Authorization",
        method: Method::HEAD,
        path: "/authorized-head",
        headers: &[("authorization", "Bearer t")],
        body: "",
        x_cache: "PASS",
        origin_saw: &["HEAD  -"],
    },
    Case {
        name: "POST with a body",
        method: Method::POST,
        path: "/form",
        headers: &[("content-type", "application/x-www-form-urlencoded")],
        body: "user=a&password=b",
        x_cache: "PASS",
        origin_saw: &["POST user=a&password=b -"],
    },
    Case {
        name: "PUT",
        method: Method::PUT,
        path: "/cacheable",
        headers: &[],
        body: "new",
        x_cache: "PASS",
        origin_saw: &["GET  -", "PUT new -"],
    },
    Case {
        name: "the GET after the PUT invalidated it",
        method: Method::GET,
        path: "/cacheable",
        headers: &[],
        body: "",
        x_cache: "MISS",
        origin_saw: &["GET  -", "PUT new -", "GET  -"],
    },
    Case {
        name: "DELETE",
        method: Method::DELETE,
        path: "/gone",
        headers: &[],
        body: "",
        x_cache: "PASS",
        origin_saw: &["DELETE  -"],
    },
    Case {
        name: "OPTIONS",
        method: Method::OPTIONS,
        path: "/cacheable-options",
        headers: &[],
        body: "",
        x_cache: "PASS",
        origin_saw: &["OPTIONS  -"],
    },
    Case {
        name: "first GET of an object stored with no-cache",
        method: Method::GET,
        path: "/revalidated",
        headers: &[],
        body: "",
        x_cache: "MISS",
        origin_saw: &["GET  -"],
    },
    Case {
        name: "GET revalidating it (304)",
        method: Method::GET,
        path: "/revalidated",
        headers: &[],
        body: "",
        x_cache: "MISS",
        origin_saw: &["GET  -", "GET  - \"v1\""],
    },
];

fn origin_reply(seen: &lacquer_tests::origin::Seen) -> Reply {
    let path = seen.path.split('/').nth(2).unwrap_or("");
    if path == "revalidated" {
        if seen
            .headers
            .get("if-none-match")
            .is_some_and(|v| v == "\"v1\"")
        {
            return Reply::ok("")
                .status(304)
                .header("etag", "\"v1\"")
                .header("cache-control", "no-cache");
        }
        return Reply::ok(format!("{} {}", seen.method, seen.path))
            .header("etag", "\"v1\"")
            .header("cache-control", "no-cache");
    }
    Reply::ok(format!("{} {}", seen.method, seen.path)).header("cache-control", "max-age=60")
}

/// What the origin saw of one request, as the cases write it.
fn seen_line(seen: &lacquer_tests::origin::Seen) -> String {
    let text = |name: &str| {
        seen.headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    let mut line = format!(
        "{} {} {}",
        seen.method,
        String::from_utf8_lossy(&seen.body),
        text("cookie").unwrap_or_else(|| "-".into())
    );
    if let Some(tag) = text("if-none-match") {
        line.push(' ');
        line.push_str(&tag);
    }
    line
}

#[tokio::test]
async fn every_request_class_over_http1_h2c_and_tls_h2() {
    let origin = Origin::start(origin_reply).await;
    let ca = TestCa::new();
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = ca.issue(certs.path(), "site", &["site.test"]);
    let d = Daemon::with_config(
        origin.addr,
        &format!(
            r#"
            [[listen]]
            address = "127.0.0.1:0"

            [[listen]]
            address = "127.0.0.1:0"
            tls = [{{ cert = "{cert}", key = "{key}" }}]
            "#
        ),
    );
    let (plain, tls) = (d.listeners[0], d.listeners[1]);
    for transport in Transport::ALL {
        let addr = if transport == Transport::TlsH2 {
            tls
        } else {
            plain
        };
        let scheme = if transport == Transport::TlsH2 {
            "https"
        } else {
            "http"
        };
        let prefix = format!("/{transport:?}");
        for case in CASES {
            if case.origin_saw.len() > 1 && case.path == "/revalidated" {
                // The first answer is stored once its fill publishes; a request that comes before finds
                // the fill finished but spent (no-cache) and fetches the whole body again.
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            }
            let path = format!("{prefix}{}", case.path);
            let mut req = Request::builder()
                .method(case.method.clone())
                .uri(format!("{scheme}://site.test{path}"));
            for (name, value) in case.headers {
                req = req.header(*name, *value);
            }
            let req = req.body(Full::new(Bytes::from(case.body))).unwrap();
            let what = format!("{transport:?} {}", case.name);
            let reply = transport
                .send(addr, &ca, "site.test", req)
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(
                reply.status.is_success(),
                "{what}: {} {:?}",
                reply.status,
                reply.body
            );
            assert_eq!(reply.x_cache(), case.x_cache, "{what}");
            let want_body = if case.method == Method::HEAD {
                String::new()
            } else {
                format!("{} {path}", case.method)
            };
            assert_eq!(String::from_utf8_lossy(&reply.body), want_body, "{what}");
            let saw: Vec<String> = origin
                .seen()
                .iter()
                .filter(|s| s.path == path)
                .map(seen_line)
                .collect();
            assert_eq!(saw, case.origin_saw, "{what}: what the origin saw");
        }
        for seen in origin.seen() {
            assert_eq!(seen.headers["host"], "site.test", "{transport:?}");
        }
    }
}

/// Sends `raw` on a new connection and returns what comes back until the daemon closes it or 5 s pass.
async fn raw_exchange(addr: std::net::SocketAddr, raw: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(raw).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn asterisk_targets_connect_and_transfer_codings_are_answered_here() {
    let origin = Origin::start(|s| Reply::ok(format!("{} {}", s.method, s.path))).await;
    let d = Daemon::start(origin.addr, &[]);
    // Forwarded, `GET *` became `http://backend*`: port 80 of the backend's host, whose failures marked
    // the backend down for everyone.
    for _ in 0..25 {
        let reply = raw_exchange(
            d.addr,
            b"GET * HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(reply.starts_with("HTTP/1.1 400 "), "{reply}");
    }
    let options = raw_exchange(
        d.addr,
        b"OPTIONS * HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(options.starts_with("HTTP/1.1 200 "), "{options}");
    assert!(
        options
            .to_ascii_lowercase()
            .contains("\r\nallow: get, head"),
        "{options}"
    );
    let connect = raw_exchange(
        d.addr,
        b"CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(connect.starts_with("HTTP/1.1 405 "), "{connect}");
    assert!(
        connect.to_ascii_lowercase().contains("\r\nallow: "),
        "{connect}"
    );
    // Only the chunked framing would have been removed: the origin would take gzip bytes as the body.
    let coded = raw_exchange(
        d.addr,
        b"POST /upload HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: gzip, chunked\r\n\
          Connection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    )
    .await;
    assert!(coded.starts_with("HTTP/1.1 501 "), "{coded}");
    assert_eq!(origin.total(), 0, "none of them reached the origin");

    let after = lacquer_tests::get(d.addr, "/after").await;
    assert_eq!(after.status, 200, "the backend is not marked failing");
    assert_eq!(&after.body[..], b"GET /after");
    assert_eq!(origin.total(), 1);
}

#[tokio::test]
async fn head_answers_have_no_body_over_http2_even_on_errors() {
    let origin = Origin::start(|_| Reply::ok("x")).await;
    let d = Daemon::start(origin.addr, &[]);
    origin.stop();
    let ca = TestCa::new();
    for (what, headers) in [
        ("a lookup", &[][..]),
        ("a pass", &[("authorization", "Bearer t")][..]),
    ] {
        let mut req = Request::builder()
            .method(Method::HEAD)
            .uri("http://site.test/down");
        for (n, v) in headers {
            req = req.header(*n, *v);
        }
        let req = req.body(Full::new(Bytes::new())).unwrap();
        let reply = Transport::H2c
            .send(d.addr, &ca, "site.test", req)
            .await
            .unwrap_or_else(|e| panic!("HEAD as {what}: {e}"));
        assert!(reply.status.is_server_error(), "{what}: {}", reply.status);
        assert!(reply.body.is_empty(), "{what}: {:?}", reply.body);
    }
}
