//! Protection end to end: per-client rate limits on a route, deny rules, and the normalisation that keeps
//! equivalent URLs on one cached object, through the real daemon.

use std::net::SocketAddr;

use lacquer_tests::{get, request, Daemon, Origin, Reply};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// A GET sent through a PROXY-expecting listener as if from `client`; returns the raw response.
async fn from(addr: SocketAddr, client: &str, path: &str, headers: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let raw = format!(
        "PROXY TCP4 {client} 192.0.2.1 40000 80\r\nGET {path} HTTP/1.1\r\nHost: t\r\n{headers}Connection: close\r\n\r\n"
    );
    s.write_all(raw.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

fn status(raw: &str) -> u16 {
    raw.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn start(origin: &Origin, config: &str) -> Daemon {
    Daemon::with_config(
        origin.addr,
        &format!(
            "[[listen]]\naddress = \"127.0.0.1:0\"\n[[listen]]\naddress = \"127.0.0.1:0\"\nproxy_protocol = true\n\
             {config}"
        ),
    )
}

#[tokio::test]
async fn rate_limits_count_per_client_and_answer_429_with_retry_after() {
    let origin = Origin::start(|_| Reply::ok("x").header("cache-control", "max-age=60")).await;
    let d = start(
        &origin,
        "[[route]]\npath_prefix = \"/search\"\nrate_limit = { requests = 1, per = \"10s\", burst = 3 }\n",
    );
    let proxied = d.listeners[1];
    for _ in 0..3 {
        assert_eq!(
            status(&from(proxied, "203.0.113.1", "/search?q=a", "").await),
            200
        );
    }
    let limited = from(proxied, "203.0.113.1", "/search?q=a", "").await;
    assert_eq!(status(&limited), 429, "{limited}");
    let retry: u64 = limited
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("retry-after: ")
                .map(str::to_owned)
        })
        .expect("Retry-After")
        .trim()
        .parse()
        .unwrap();
    assert!((1..=10).contains(&retry), "{retry}");
    // Another client has its own bucket; other routes are not limited.
    assert_eq!(
        status(&from(proxied, "203.0.113.2", "/search?q=a", "").await),
        200
    );
    for _ in 0..5 {
        assert_eq!(
            status(&from(proxied, "203.0.113.1", "/other", "").await),
            200
        );
    }
    assert_eq!(d.stats().await["proxy"]["rate_limited"], 1);
}

#[tokio::test]
async fn deny_rules_answer_403_before_anything_reaches_the_origin() {
    let origin = Origin::start(|_| Reply::ok("x")).await;
    let d = start(
        &origin,
        "[[deny]]\nmethods = [\"TRACE\"]\n\
         [[deny]]\nheader = \"User-Agent\"\nheader_regex = \"(?i)sqlmap\"\n\
         [[deny]]\npath_regex = \"^/admin\"\nexcept_clients = [\"10.0.0.0/8\"]\n",
    );
    let proxied = d.listeners[1];
    let trace = request(d.addr, http::Method::TRACE, "/", &[], Default::default())
        .await
        .unwrap();
    assert_eq!(trace.status, 403);
    let scanner = from(proxied, "198.51.100.7", "/", "User-Agent: sqlmap/1.7\r\n").await;
    assert_eq!(status(&scanner), 403);
    assert_eq!(
        status(&from(proxied, "198.51.100.7", "/admin/x", "").await),
        403
    );
    assert_eq!(
        status(&from(proxied, "10.9.8.7", "/admin/x", "").await),
        200
    );
    assert_eq!(
        status(&from(proxied, "198.51.100.7", "/", "User-Agent: curl\r\n").await),
        200
    );
    assert_eq!(origin.count("/admin/x"), 1, "only the office's request");
    assert_eq!(origin.total(), 2);
    assert_eq!(d.stats().await["proxy"]["denied"], 3);

    // A rule added to the file applies after a reload, without a restart.
    let file = d.config_file();
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        format!("{text}[[deny]]\npath_regex = \"^/blocked\"\n"),
    )
    .unwrap();
    let r = d.admin_post("/v1/reload", serde_json::json!({})).await;
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["applied"], serde_json::json!(["deny"]), "{body}");
    assert_eq!(get(d.addr, "/blocked").await.status, 403);
}

#[tokio::test]
async fn rules_see_the_paths_lenient_origins_resolve() {
    let origin =
        Origin::start(|s| Reply::ok(s.path.clone()).header("cache-control", "max-age=60")).await;
    let d = start(
        &origin,
        "[[deny]]\npath_regex = \"^/admin\"\n\
         [[route]]\npath_prefix = \"/account/\"\npass = true\n",
    );
    let outside = d.listeners[1];
    // Tomcat, Spring and IIS resolve each of these to `/admin`.
    for spelling in [
        "/%2Fadmin",
        "/%2fadmin/x",
        "/\\admin",
        "/%5Cadmin",
        "/;/admin",
        "/.;/admin",
    ] {
        let reply = from(outside, "198.51.100.7", spelling, "").await;
        assert_eq!(status(&reply), 403, "{spelling}: {reply}");
    }
    assert_eq!(origin.total(), 0, "{:?}", origin.counts());
    // A route that keeps per-user pages out of the cache is not escaped by a `;` parameter either.
    for spelling in ["/account/me", "/;/account/me", "/account;x=1/me"] {
        for _ in 0..2 {
            let reply = from(outside, "198.51.100.7", spelling, "").await;
            assert_eq!(status(&reply), 200, "{spelling}: {reply}");
            assert!(
                reply.contains("X-Cache: PASS") || reply.contains("x-cache: PASS"),
                "{spelling}: {reply}"
            );
        }
    }
    assert_eq!(origin.total(), 6);
    assert_eq!(
        status(&from(outside, "198.51.100.7", "/public;v=1", "").await),
        200
    );
}

#[tokio::test]
async fn normalisation_keeps_equivalent_urls_on_one_object() {
    let origin = Origin::start(|_| Reply::ok("x").header("cache-control", "max-age=60")).await;
    let d = start(
        &origin,
        "[normalize]\nsort_query = true\nstrip_query_params = [\"utm_*\", \"gclid\"]\n",
    );
    let first = request(
        d.addr,
        http::Method::GET,
        "/p?b=2&utm_source=mail&a=1",
        &[("host", "Shop.Test:80")],
        Default::default(),
    )
    .await
    .unwrap();
    assert_eq!(first.x_cache(), "MISS");
    for (host, path) in [
        ("shop.test", "/p?a=1&b=2"),
        ("SHOP.test", "/p?gclid=9&a=1&b=2&utm_medium=x"),
    ] {
        let r = request(
            d.addr,
            http::Method::GET,
            path,
            &[("host", host)],
            Default::default(),
        )
        .await
        .unwrap();
        assert_eq!(r.x_cache(), "HIT", "{host}{path}");
    }
    let seen = origin.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/p?a=1&b=2");
    assert_eq!(
        seen[0].headers["host"], "shop.test",
        "Host goes on as it is keyed"
    );
    assert_eq!(
        get(d.addr, "/p?b=2").await.x_cache(),
        "MISS",
        "different parameters stay apart"
    );
}
