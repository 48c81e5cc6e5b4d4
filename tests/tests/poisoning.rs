//! Cache poisoning through the request head, end to end: each attack of issue 14 §2 sent on a raw socket
//! to the real daemon, with assertions on what the attacker got, what the origin saw, and what the next,
//! innocent client is served.

use std::net::SocketAddr;

use http::Method;
use lacquer_tests::{request, Daemon, Origin, Reply};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// A response as read off the socket.
struct Raw {
    status: u16,
    head: String,
    body: String,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// Sends `head` (request line and fields, without the blank line) with `Connection: close` on a new
/// connection and reads the whole response.
async fn send(addr: SocketAddr, head: &str) -> Raw {
    send_bytes(
        addr,
        format!("{head}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
}

async fn send_bytes(addr: SocketAddr, raw: &[u8]) -> Raw {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(raw).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("the daemon answers and closes")
        .unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let body = match head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        true => dechunk(body),
        false => body.to_owned(),
    };
    Raw {
        status,
        head: head.to_owned(),
        body,
    }
}

fn dechunk(mut text: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = text.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        text = &rest[n + 2..];
    }
    out
}

/// An origin whose cacheable answer says what it saw: every `Host` line, the target, and the fields an
/// attacker would like it to act on.
async fn echo_origin() -> Origin {
    Origin::start(|seen| {
        let field = |name: &str| {
            let values: Vec<_> = seen
                .headers
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap_or("?").to_owned())
                .collect();
            if values.is_empty() {
                "-".to_owned()
            } else {
                values.join("|")
            }
        };
        let body = format!(
            "host={} path={} lang={} xfh={} xfp={} xou={}",
            field("host"),
            seen.path,
            field("x-lang"),
            field("x-forwarded-host"),
            field("x-forwarded-proto"),
            field("x-original-url"),
        );
        let reply = Reply::ok(body).header("cache-control", "max-age=300");
        if seen.path.starts_with("/vary") {
            reply.header("vary", "X-Lang")
        } else {
            reply
        }
    })
    .await
}

fn daemon(origin: &Origin, config: &str) -> Daemon {
    Daemon::with_config(
        origin.addr,
        &format!("[[listen]]\naddress = \"127.0.0.1:0\"\n{config}"),
    )
}

fn hosts_seen(origin: &Origin) -> Vec<String> {
    origin
        .seen()
        .iter()
        .map(|s| {
            let hosts: Vec<_> = s
                .headers
                .get_all("host")
                .iter()
                .map(|v| v.to_str().unwrap().to_owned())
                .collect();
            format!("{} {}", hosts.join("|"), s.path)
        })
        .collect()
}

async fn bad_requests(d: &Daemon) -> u64 {
    d.stats().await["proxy"]["bad_requests"]
        .as_u64()
        .expect("bad_requests in the stats")
}

#[tokio::test]
async fn two_host_headers_are_refused_and_do_not_poison_the_victim() {
    let origin = echo_origin().await;
    let d = daemon(&origin, "");
    let attack = send(
        d.addr,
        "GET /page HTTP/1.1\r\nHost: victim.test\r\nHost: evil.test",
    )
    .await;
    assert_eq!(attack.status, 400, "{}", attack.head);
    assert!(attack.body.contains("Host"), "says why: {}", attack.body);
    assert_eq!(origin.total(), 0, "the origin never saw the attack");

    let victim = send(d.addr, "GET /page HTTP/1.1\r\nHost: victim.test").await;
    assert_eq!(victim.status, 200);
    assert_eq!(
        victim.body,
        "host=victim.test path=/page lang=- xfh=- xfp=- xou=-"
    );
    assert_eq!(hosts_seen(&origin), ["victim.test /page"]);
    assert_eq!(bad_requests(&d).await, 1);

    let metrics = d.admin_get("/metrics", Some(&d.secret())).await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        text.contains("lacquer_client_request_errors_total{reason=\"bad_request\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn a_host_carrying_a_path_is_refused() {
    let origin = echo_origin().await;
    let d = daemon(&origin, "");
    let attack = send(d.addr, "GET /evil HTTP/1.1\r\nHost: victim.test/page").await;
    assert_eq!(attack.status, 400, "{}", attack.head);
    assert_eq!(origin.total(), 0);

    let victim = send(d.addr, "GET /page/evil HTTP/1.1\r\nHost: victim.test").await;
    assert_eq!(victim.status, 200);
    assert_eq!(
        victim.body,
        "host=victim.test path=/page/evil lang=- xfh=- xfp=- xou=-"
    );
    assert_eq!(hosts_seen(&origin), ["victim.test /page/evil"]);
}

#[tokio::test]
async fn the_host_is_forwarded_as_it_is_keyed() {
    let origin = echo_origin().await;
    let d = daemon(&origin, "");
    // Keyed as `victim.test`: forwarded with its port, an origin reflecting it in links would have
    // `:443` served to every client of victim.test.
    let attack = send(d.addr, "GET /page HTTP/1.1\r\nHost: Victim.TEST:443").await;
    assert_eq!(attack.status, 200, "{}", attack.head);
    let victim = send(d.addr, "GET /page HTTP/1.1\r\nHost: victim.test").await;
    assert_eq!(victim.header("x-cache"), Some("HIT"));
    assert_eq!(
        victim.body,
        "host=victim.test path=/page lang=- xfh=- xfp=- xou=-"
    );
    let other_port = send(d.addr, "GET /page HTTP/1.1\r\nHost: victim.test:8080").await;
    assert_eq!(other_port.header("x-cache"), Some("MISS"));
    assert_eq!(
        hosts_seen(&origin),
        ["victim.test /page", "victim.test:8080 /page"]
    );
}

#[tokio::test]
async fn connection_cannot_remove_host() {
    let origin = echo_origin().await;
    let d = daemon(&origin, "");
    let attack = send(
        d.addr,
        "GET /page HTTP/1.1\r\nHost: victim.test\r\nConnection: host",
    )
    .await;
    assert_eq!(attack.status, 400, "{}", attack.head);
    assert!(attack.body.contains("Host"), "says why: {}", attack.body);
    assert_eq!(origin.total(), 0);

    let victim = send(d.addr, "GET /page HTTP/1.1\r\nHost: victim.test").await;
    assert_eq!(
        victim.body,
        "host=victim.test path=/page lang=- xfh=- xfp=- xou=-"
    );
    assert_eq!(hosts_seen(&origin), ["victim.test /page"]);
}

#[tokio::test]
async fn connection_naming_a_vary_field_cannot_store_one_variant_as_another() {
    let origin = echo_origin().await;
    let d = daemon(&origin, "");
    // The field `Connection` names is gone before the key and variant are chosen: the attacker's request
    // is, for the cache as for the origin, a request without X-Lang.
    let attack = send(
        d.addr,
        "GET /vary HTTP/1.1\r\nHost: victim.test\r\nX-Lang: fr\r\nConnection: x-lang",
    )
    .await;
    assert_eq!(attack.status, 200);
    assert_eq!(
        attack.body,
        "host=victim.test path=/vary lang=- xfh=- xfp=- xou=-"
    );

    let french = send(
        d.addr,
        "GET /vary HTTP/1.1\r\nHost: victim.test\r\nX-Lang: fr",
    )
    .await;
    assert_eq!(
        french.body, "host=victim.test path=/vary lang=fr xfh=- xfp=- xou=-",
        "the French reader gets the French page"
    );
    let plain = send(d.addr, "GET /vary HTTP/1.1\r\nHost: victim.test").await;
    assert_eq!(
        plain.body,
        "host=victim.test path=/vary lang=- xfh=- xfp=- xou=-"
    );
    assert_eq!(plain.header("x-cache"), Some("HIT"), "{}", plain.head);
    let langs: Vec<String> = origin
        .seen()
        .iter()
        .map(|s| {
            s.headers
                .get("x-lang")
                .map_or("-".into(), |v| v.to_str().unwrap().to_owned())
        })
        .collect();
    assert_eq!(langs, ["-", "fr"]);
}

#[tokio::test]
async fn host_is_required_valid_and_loses_to_an_absolute_target() {
    let origin = echo_origin().await;
    let d = daemon(&origin, "");
    for bad in [
        "GET /a HTTP/1.1",
        "GET /a HTTP/1.1\r\nHost: ",
        "GET /a HTTP/1.1\r\nHost: a b.test",
        "GET /a HTTP/1.1\r\nHost: user@victim.test",
        "GET /a HTTP/1.1\r\nHost: victim.test:80x",
        "GET /a HTTP/1.1\r\nHost: victim.test?x",
        "GET /a HTTP/1.1\r\nHost: [::1",
        "GET http://victim.test/a HTTP/1.1\r\nHost: a\r\nHost: b",
    ] {
        let reply = send(d.addr, bad).await;
        assert_eq!(reply.status, 400, "{bad:?}: {}", reply.head);
    }
    assert_eq!(origin.total(), 0);
    assert_eq!(bad_requests(&d).await, 8);

    let absolute = send(
        d.addr,
        "GET http://Victim.test/a HTTP/1.1\r\nHost: evil.test",
    )
    .await;
    assert_eq!(absolute.status, 200);
    assert_eq!(
        absolute.body,
        "host=victim.test path=/a lang=- xfh=- xfp=- xou=-"
    );
    let again = send(d.addr, "GET /a HTTP/1.1\r\nHost: victim.test").await;
    assert_eq!(again.header("x-cache"), Some("HIT"));
    assert_eq!(again.body, absolute.body);
    // HTTP/1.0 may omit Host (the origin then gets its own address, and the key has no host); IP
    // literals and ports are hosts.
    assert_eq!(send(d.addr, "GET /b HTTP/1.0").await.status, 200);
    assert_eq!(
        send(d.addr, "GET /c HTTP/1.1\r\nHost: [::1]:8080")
            .await
            .status,
        200
    );
    assert_eq!(
        send(d.addr, "GET /d HTTP/1.1\r\nHost: 192.0.2.1")
            .await
            .status,
        200
    );
    let own = format!("{} /b", origin.addr);
    assert_eq!(
        hosts_seen(&origin),
        ["victim.test /a", &own, "[::1]:8080 /c", "192.0.2.1 /d"]
    );
}

#[tokio::test]
async fn deny_rules_and_routes_see_the_normalised_path() {
    let origin = echo_origin().await;
    let d = daemon(
        &origin,
        "[[deny]]\npath_regex = \"^/admin\"\n\n[[route]]\npath_prefix = \"/live/\"\npass = true\n",
    );
    for target in [
        "/admin",
        "/%61dmin",
        "/%61%64%6D%69%6e/x",
        "//admin",
        "/./admin",
        "/x/../admin",
        "/x/%2e%2E/admin",
        "/../admin",
        "///x//..//admin",
    ] {
        let reply = send(d.addr, &format!("GET {target} HTTP/1.1\r\nHost: t")).await;
        assert_eq!(reply.status, 403, "{target}: {}", reply.head);
    }
    assert_eq!(origin.total(), 0, "no bypass reached the origin");

    // What is forwarded is the normalised target, so the origin acts on the path the rules saw.
    let reply = send(
        d.addr,
        "GET /a/./b/../c//d%7E%2f?q=/../x HTTP/1.1\r\nHost: t",
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(origin.seen()[0].path, "/a/c/d~%2F?q=/../x");
    // One key for equivalent targets: the second is a hit.
    let again = send(d.addr, "GET /a//c/d%7e%2F?q=/../x HTTP/1.1\r\nHost: t").await;
    assert_eq!(again.header("x-cache"), Some("HIT"), "{}", again.head);

    // A route's path matches the normalised path too: `//live/x` is passed, never cached.
    for _ in 0..2 {
        let reply = send(d.addr, "GET //live/./x HTTP/1.1\r\nHost: t").await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("x-cache"), Some("PASS"), "{}", reply.head);
    }
    assert_eq!(origin.count("/live/x"), 2);
}

/// Fields an origin (or a framework) may act on that a cache does not key on by default.
const FORWARDING: &str = "X-Forwarded-Host: evil.test\r\nX-Forwarded-Proto: http\r\n\
    X-Original-URL: /admin\r\nX-Rewrite-URL: /admin\r\nForwarded: host=evil.test;proto=http\r\n\
    X-HTTP-Method-Override: DELETE\r\nX-Forwarded-Port: 1\r\nX-Host: evil.test\r\n\
    X-Forwarded-Uri: /admin\r\nX-Original-URI: /admin\r\nX-Forwarded-Path: /admin\r\n\
    X-Scheme: http\r\nX-Forwarded-Protocol: http\r\nX-Forwarded-Prefix: /evil\r\n\
    X-Forwarded-Ssl: off\r\nFront-End-Https: off\r\nX-Url-Scheme: http";

#[tokio::test]
async fn forwarding_fields_are_stripped_by_default() {
    let origin = echo_origin().await;
    let d = daemon(&origin, "");
    let attack = send(
        d.addr,
        &format!("GET /page HTTP/1.1\r\nHost: victim.test\r\n{FORWARDING}"),
    )
    .await;
    assert_eq!(attack.status, 200);
    assert_eq!(
        attack.body,
        "host=victim.test path=/page lang=- xfh=- xfp=- xou=-"
    );
    let seen = &origin.seen()[0];
    for name in [
        "x-forwarded-host",
        "x-forwarded-proto",
        "x-original-url",
        "x-rewrite-url",
        "forwarded",
        "x-http-method-override",
        "x-forwarded-port",
        "x-host",
        "x-forwarded-uri",
        "x-original-uri",
        "x-forwarded-path",
        "x-scheme",
        "x-forwarded-protocol",
        "x-forwarded-prefix",
        "x-forwarded-ssl",
        "front-end-https",
        "x-url-scheme",
    ] {
        assert!(
            !seen.headers.contains_key(name),
            "{name} reached the origin"
        );
    }
    let victim = send(d.addr, "GET /page HTTP/1.1\r\nHost: victim.test").await;
    assert_eq!(victim.header("x-cache"), Some("HIT"));
    assert_eq!(victim.body, attack.body);
    assert_eq!(origin.total(), 1);
}

#[tokio::test]
async fn forwarding_fields_can_be_keyed_per_server_or_route() {
    let origin = echo_origin().await;
    let d = daemon(
        &origin,
        "[[route]]\npath_prefix = \"/stripped/\"\nforwarding_headers = \"strip\"\n\n\
         [server]\nforwarding_headers = \"key\"\n",
    );
    let victim_page = "host=victim.test path=/page lang=- xfh=- xfp=- xou=-";
    let keyed = send(
        d.addr,
        "GET /page HTTP/1.1\r\nHost: victim.test\r\nX-Forwarded-Host: evil.test\r\nX-Forwarded-Proto: http",
    )
    .await;
    assert_eq!(
        keyed.body, "host=victim.test path=/page lang=- xfh=evil.test xfp=http xou=-",
        "keyed: the origin sees them"
    );
    let victim = send(d.addr, "GET /page HTTP/1.1\r\nHost: victim.test").await;
    assert_eq!(
        victim.body, victim_page,
        "but their answer is not another client's"
    );
    assert_eq!(victim.header("x-cache"), Some("MISS"));
    let same = send(
        d.addr,
        "GET /page HTTP/1.1\r\nHost: victim.test\r\nX-Forwarded-Proto: http\r\nX-Forwarded-Host: evil.test",
    )
    .await;
    assert_eq!(same.header("x-cache"), Some("HIT"));
    assert_eq!(same.body, keyed.body);
    let other = send(
        d.addr,
        "GET /page HTTP/1.1\r\nHost: victim.test\r\nX-Forwarded-Host: evil.test",
    )
    .await;
    assert_eq!(
        other.header("x-cache"),
        Some("MISS"),
        "X-Forwarded-Proto differs"
    );
    assert_eq!(origin.total(), 3);

    // The route overrides the server: stripped there.
    let stripped = send(
        d.addr,
        "GET /stripped/x HTTP/1.1\r\nHost: victim.test\r\nX-Forwarded-Host: evil.test",
    )
    .await;
    assert_eq!(
        stripped.body,
        "host=victim.test path=/stripped/x lang=- xfh=- xfp=- xou=-"
    );
    let victim = send(d.addr, "GET /stripped/x HTTP/1.1\r\nHost: victim.test").await;
    assert_eq!(victim.header("x-cache"), Some("HIT"));
    assert_eq!(origin.total(), 4);
}

#[tokio::test]
async fn a_malformed_chunked_request_body_is_the_clients_fault() {
    let origin = Origin::start(|_| Reply::ok("stored")).await;
    let d = daemon(&origin, "");
    let reply = send_bytes(
        d.addr,
        b"POST /form HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
          5\r\nhello\r\nzz\r\n",
    )
    .await;
    assert_eq!(reply.status, 400, "{}", reply.head);
    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["backend_errors"], 0, "{stats}");
    assert_eq!(stats["proxy"]["bad_requests"], 1, "{stats}");
    let backends = d.admin_get("/v1/backends", Some(&d.secret())).await;
    let backends: serde_json::Value = serde_json::from_slice(&backends.body).unwrap();
    let backend = &backends["backends"][0];
    assert_eq!(backend["errors"], 0, "the backend is not blamed: {backend}");
    assert_eq!(backend["consecutive_failures"], 0, "{backend}");
    assert!(backend["last_error"].is_null(), "{backend}");
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let origin = echo_origin().await;
    let d = daemon(&origin, "");
    let secret = d.secret();
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let auth = format!("{scheme} {secret}");
        let reply = request(
            d.admin,
            Method::GET,
            "/v1/stats",
            &[("authorization", &auth)],
            Default::default(),
        )
        .await
        .unwrap();
        assert_eq!(reply.status, 200, "{scheme}");
    }
    let wrong = request(
        d.admin,
        Method::GET,
        "/v1/stats",
        &[("authorization", &format!("Basic {secret}"))],
        Default::default(),
    )
    .await
    .unwrap();
    assert_eq!(wrong.status, 401);
}

/// One HTTP/2 request (cleartext, prior knowledge) with extra fields; the status and body.
async fn h2_request(addr: SocketAddr, uri: &str, headers: &[(&str, &str)]) -> (u16, String) {
    use http_body_util::BodyExt;

    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let mut req = http::Request::get(uri);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let resp = send
        .send_request(req.body(String::new()).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn http2_carries_the_host_in_its_authority() {
    let origin = echo_origin().await;
    let d = daemon(&origin, "");
    // No Host field at all: `:authority` is the host, and it is not "an HTTP/1.1 request without Host".
    let (status, body) = h2_request(d.addr, "http://victim.test/page", &[]).await;
    assert_eq!(status, 200);
    assert_eq!(body, "host=victim.test path=/page lang=- xfh=- xfp=- xou=-");
    // A Host field beside it loses, as in absolute form: key and origin both use the authority.
    let (status, body) =
        h2_request(d.addr, "http://victim.test/other", &[("host", "evil.test")]).await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        "host=victim.test path=/other lang=- xfh=- xfp=- xou=-"
    );
    let again = send(d.addr, "GET /other HTTP/1.1\r\nHost: victim.test").await;
    assert_eq!(again.header("x-cache"), Some("HIT"));
    assert_eq!(
        hosts_seen(&origin),
        ["victim.test /page", "victim.test /other"]
    );
    // An authority that is not a host is refused like a bad Host.
    let (status, _) = h2_request(d.addr, "http://user@victim.test/x", &[]).await;
    assert_eq!(status, 400);
    assert_eq!(origin.total(), 2);
}

/// A response varying on `X-Lang` is selected by exactly the lines the origin saw: a request whose field
/// differs in any byte (a trailing comma, an empty member, the lines it is split into, case, a non-UTF-8
/// byte) is another request to the origin, and a variant stored for one is never served to the other
/// (before, `X-Lang: en,` was stored and then served to `X-Lang: en`).
#[tokio::test]
async fn a_variant_is_served_only_for_the_bytes_the_origin_saw() {
    let origin = echo_origin().await;
    let d = daemon(&origin, "");
    let cases: &[(&[u8], &[u8], &str, &str)] = &[
        (b"X-Lang: en,", b"X-Lang: en", "en,", "en"),
        (b"X-Lang: en,,de", b"X-Lang: en, de", "en,,de", "en, de"),
        (
            b"X-Lang: en, de",
            b"X-Lang: en\r\nX-Lang: de",
            "en, de",
            "en|de",
        ),
        (b"X-Lang: EN", b"X-Lang: en", "EN", "en"),
        (b"X-Lang: caf\xe9", b"X-Lang: caf\xef", "?", "?"),
    ];
    for (n, (first, second, first_seen, second_seen)) in cases.iter().enumerate() {
        let path = format!("/vary/{n}");
        let raw = |field: &[u8]| {
            let mut raw = format!("GET {path} HTTP/1.1\r\nHost: victim.test\r\n").into_bytes();
            raw.extend_from_slice(field);
            raw.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
            raw
        };
        let case = String::from_utf8_lossy(first).into_owned();
        let a = send_bytes(d.addr, &raw(first)).await;
        assert!(
            a.body
                .ends_with(&format!("lang={first_seen} xfh=- xfp=- xou=-")),
            "{case}: {}",
            a.body
        );
        let b = send_bytes(d.addr, &raw(second)).await;
        assert_eq!(b.header("x-cache"), Some("MISS"), "{case}: {}", b.head);
        assert!(
            b.body.contains(&format!("lang={second_seen} ")),
            "{case}: {}",
            b.body
        );
        assert_eq!(origin.count(&path), 2, "{case}: each went to the origin");
        let seen: Vec<Vec<Vec<u8>>> = origin
            .seen()
            .iter()
            .filter(|s| s.path == path)
            .map(|s| {
                s.headers
                    .get_all("x-lang")
                    .iter()
                    .map(|v| v.as_bytes().to_vec())
                    .collect()
            })
            .collect();
        let lines = |field: &[u8]| -> Vec<Vec<u8>> {
            field
                .split(|&b| b == b'\n')
                .map(|l| {
                    l.strip_prefix(b"X-Lang: ")
                        .unwrap()
                        .strip_suffix(b"\r")
                        .unwrap_or(l.strip_prefix(b"X-Lang: ").unwrap())
                        .to_vec()
                })
                .collect()
        };
        assert_eq!(
            seen,
            [lines(first), lines(second)],
            "{case}: the origin saw the bytes sent"
        );
        for (field, body) in [(first, &a.body), (second, &b.body)] {
            let again = send_bytes(d.addr, &raw(field)).await;
            assert_eq!(
                again.header("x-cache"),
                Some("HIT"),
                "{case}: {}",
                again.head
            );
            assert_eq!(&again.body, body, "{case}");
        }
        assert_eq!(origin.count(&path), 2, "{case}");
    }
}
