//! Bans, purges, soft purges and surrogate keys through the admin API and the PURGE/BAN methods, proved by
//! what the origin is asked again and what survives a `kill -9`.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use bytes::Bytes;
use http::Method;
use lacquer_tests::{request, ClientReply, Daemon, Origin, Reply};
use serde_json::{json, Value};

async fn get(addr: SocketAddr, host: &str, path: &str, headers: &[(&str, &str)]) -> ClientReply {
    let mut all = vec![("host", host)];
    all.extend_from_slice(headers);
    request(addr, Method::GET, path, &all, Bytes::new())
        .await
        .expect("request")
}

/// Answers every path with a body naming the host, path and how many requests the origin has served, so a
/// refetch is visible in the body.
async fn origin(extra: fn(&str) -> Vec<(&'static str, String)>) -> Origin {
    let served = Arc::new(AtomicUsize::new(0));
    Origin::start(move |s| {
        let n = served.fetch_add(1, Ordering::SeqCst);
        let host = s
            .headers
            .get("host")
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let mut reply = Reply::ok(format!("{host}{} #{n}", s.path));
        for (name, value) in extra(&s.path) {
            reply = reply.header(name, &value);
        }
        reply
    })
    .await
}

fn cacheable(_: &str) -> Vec<(&'static str, String)> {
    vec![("cache-control", "max-age=3600".into())]
}

fn json_body(r: &ClientReply) -> Value {
    serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{e}: {:?}", r.body))
}

/// Waits until `objects` fetched objects are stored: a miss's client may have its last byte a moment before
/// the store publishes the object, and a purge before that counts one object fewer.
async fn published(d: &Daemon, objects: u64) {
    d.wait_for_stats("objects published", |s| {
        s["store"]["objects_published"].as_u64() >= Some(objects)
    })
    .await;
}

async fn durable(d: &Daemon, objects: u64) {
    d.wait_for_stats("objects durable", |s| {
        s["store"]["objects_durable"].as_u64() >= Some(objects)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_regex_ban_removes_exactly_the_matching_objects() {
    let origin = origin(cacheable).await;
    let d = Daemon::start(origin.addr, &[]);
    let paths: Vec<String> = (0..5)
        .flat_map(|i| [format!("/news/{i}"), format!("/sport/{i}")])
        .collect();
    for p in &paths {
        assert_eq!(get(d.addr, "a.test", p, &[]).await.x_cache(), "MISS");
    }
    assert_eq!(
        get(d.addr, "b.test", "/news/b", &[]).await.x_cache(),
        "MISS"
    );
    published(&d, 11).await;

    let r = d
        .admin_post(
            "/v1/bans",
            json!({"expression": "req.http.host == a.test && req.url ~ ^/news/"}),
        )
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let ban = json_body(&r);
    assert!(ban["id"].as_u64().unwrap() > 0);
    assert_eq!(
        ban["expression"],
        r#"req.http.host == "a.test" && req.url ~ "^/news/""#
    );
    assert_eq!(
        ban["to_test"], 11,
        "its progress is measured against what was stored"
    );

    for p in &paths {
        let r = get(d.addr, "a.test", p, &[]).await;
        let want = if p.starts_with("/news/") {
            "MISS"
        } else {
            "HIT"
        };
        assert_eq!(r.x_cache(), want, "{p}");
        assert_eq!(origin.count(p), if want == "MISS" { 2 } else { 1 }, "{p}");
    }
    assert_eq!(
        get(d.addr, "b.test", "/news/b", &[]).await.x_cache(),
        "HIT",
        "another host"
    );

    // Both: the lurker marks the ban completed (no longer pending) a moment before it counts it.
    d.wait_for_stats("the lurker", |s| {
        s["store"]["bans_pending"] == 0 && s["store"]["bans_completed"] == 1
    })
    .await;
    let list = d.admin_get("/v1/bans", Some(&d.secret())).await;
    let list = json_body(&list);
    let ban = &list["bans"][0];
    assert_eq!(ban["completed"], true);
    assert_eq!(ban["removed"], 5);
    assert!(ban["tested"].as_u64().unwrap() >= 5, "{ban}");
    assert_eq!(ban["to_test"], 11, "{ban}");
}

#[tokio::test(flavor = "multi_thread")]
async fn banned_objects_stay_banned_after_kill_9() {
    let origin = origin(cacheable).await;
    let mut d = Daemon::start(origin.addr, &[]);
    for i in 0..10 {
        get(d.addr, "k.test", &format!("/k/{i}"), &[]).await;
    }
    durable(&d, 10).await;
    let r = d
        .admin_post("/v1/bans", json!({"expression": "req.url ~ ^/k/[0-4]$"}))
        .await;
    assert_eq!(r.status, 201);
    // Killed at once: neither a lookup nor (probably) the lurker has applied the ban yet.
    d.kill9();
    let d = d.restart();
    for i in 0..10 {
        let path = format!("/k/{i}");
        let r = get(d.addr, "k.test", &path, &[]).await;
        let banned = i < 5;
        assert_eq!(r.x_cache(), if banned { "MISS" } else { "HIT" }, "{path}");
        assert_eq!(origin.count(&path), if banned { 2 } else { 1 }, "{path}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_purge_removes_every_variant_and_stays_removed_after_kill_9() {
    fn varying(_: &str) -> Vec<(&'static str, String)> {
        vec![
            ("cache-control", "max-age=3600".into()),
            ("vary", "accept-language".into()),
        ]
    }
    let origin = origin(varying).await;
    let mut d = Daemon::start(origin.addr, &[]);
    for enc in ["en", "de", "fr"] {
        get(d.addr, "shop.test", "/page", &[("accept-language", enc)]).await;
    }
    get(d.addr, "shop.test", "/other", &[]).await;
    durable(&d, 4).await;
    assert_eq!(origin.count("/page"), 3);

    let r = d
        .admin_post("/v1/purge", json!({"url": "http://shop.test/page"}))
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(json_body(&r), json!({"purged": 3, "soft": false}));
    d.kill9();
    let d = d.restart();
    for enc in ["en", "de", "fr"] {
        let r = get(d.addr, "shop.test", "/page", &[("accept-language", enc)]).await;
        assert_eq!(r.x_cache(), "MISS", "{enc}");
    }
    assert_eq!(origin.count("/page"), 6);
    published(&d, 3).await;
    assert_eq!(
        get(d.addr, "shop.test", "/other", &[]).await.x_cache(),
        "HIT"
    );

    let r = d.admin_post("/v1/purge", json!({"url": "/page"})).await;
    assert_eq!(r.status, 400);
    assert_eq!(json_body(&r)["code"], "missing_host");
    let r = d
        .admin_post("/v1/purge", json!({"url": "/page", "host": "shop.test"}))
        .await;
    assert_eq!(json_body(&r)["purged"], 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_soft_purge_serves_stale_once_then_refreshes() {
    fn graced(_: &str) -> Vec<(&'static str, String)> {
        vec![(
            "cache-control",
            "max-age=3600, stale-while-revalidate=60".into(),
        )]
    }
    let origin = origin(graced).await;
    let d = Daemon::start(origin.addr, &[]);
    let first = get(d.addr, "s.test", "/soft", &[]).await;
    assert_eq!(first.x_cache(), "MISS");
    published(&d, 1).await;

    let r = d
        .admin_post(
            "/v1/purge",
            json!({"url": "http://s.test/soft", "soft": true}),
        )
        .await;
    assert_eq!(json_body(&r), json!({"purged": 1, "soft": true}));

    let stale = get(d.addr, "s.test", "/soft", &[]).await;
    assert_eq!(stale.x_cache(), "STALE");
    assert_eq!(stale.body, first.body, "the old copy, at once");
    for _ in 0..100 {
        if origin.count("/soft") == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(origin.count("/soft"), 2, "refreshed in the background");
    // The refresh publishes just after the origin answers.
    let mut fresh = get(d.addr, "s.test", "/soft", &[]).await;
    for _ in 0..50 {
        if fresh.x_cache() == "HIT" && fresh.body != first.body {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        fresh = get(d.addr, "s.test", "/soft", &[]).await;
    }
    assert_eq!(fresh.x_cache(), "HIT");
    assert_ne!(fresh.body, first.body);
    assert_eq!(origin.count("/soft"), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tag_purge_reaches_across_hosts() {
    fn tagged(path: &str) -> Vec<(&'static str, String)> {
        let id = path.rsplit('/').next().unwrap_or("").to_owned();
        vec![
            ("cache-control", "max-age=3600".into()),
            ("surrogate-key", format!("product-{id} all-products")),
            (
                "xkey",
                format!("shelf-{}", id.parse::<u32>().unwrap_or(0) % 2),
            ),
        ]
    }
    let origin = origin(tagged).await;
    let d = Daemon::start(origin.addr, &[]);
    for host in ["a.test", "b.test"] {
        for id in 1..=4 {
            get(d.addr, host, &format!("/p/{id}"), &[]).await;
        }
    }
    published(&d, 8).await;
    let r = d
        .admin_post("/v1/purge/tags", json!({"tags": ["product-1", "shelf-0"]}))
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    // product-1 on both hosts, shelf-0 (ids 2 and 4) on both hosts.
    assert_eq!(json_body(&r)["purged"], 6);
    for host in ["a.test", "b.test"] {
        for id in 1..=4 {
            let r = get(d.addr, host, &format!("/p/{id}"), &[]).await;
            let purged = id != 3;
            assert_eq!(
                r.x_cache(),
                if purged { "MISS" } else { "HIT" },
                "{host} {id}"
            );
        }
    }
    assert_eq!(origin.count("/p/3"), 2, "one per host, never refetched");
    assert_eq!(origin.count("/p/1"), 4);

    let r = d.admin_post("/v1/purge/tags", json!({"tags": []})).await;
    assert_eq!(
        (r.status.as_u16(), json_body(&r)["code"].clone()),
        (400, json!("no_tags"))
    );
}

/// Tags are the operator's: clients get no `Surrogate-Key`, `xkey` or `Cache-Tag` (miss, hit or pass), and
/// the store keeps them for purging; `cache.expose_surrogate_keys` sends them on.
#[tokio::test(flavor = "multi_thread")]
async fn surrogate_keys_are_withheld_from_clients_unless_exposed() {
    fn tagged(_: &str) -> Vec<(&'static str, String)> {
        vec![
            ("cache-control", "max-age=3600".into()),
            ("surrogate-key", "product-1 all".into()),
            ("xkey", "shelf-1".into()),
            ("cache-tag", "cf-1".into()),
        ]
    }
    let tags = ["surrogate-key", "xkey", "cache-tag"];
    let origin = origin(tagged).await;
    let d = Daemon::start(origin.addr, &[]);
    let miss = get(d.addr, "t.test", "/p", &[]).await;
    published(&d, 1).await;
    let hit = get(d.addr, "t.test", "/p", &[]).await;
    let pass = get(d.addr, "t.test", "/p", &[("cookie", "s=1")]).await;
    for (what, r, x_cache) in [
        ("miss", &miss, "MISS"),
        ("hit", &hit, "HIT"),
        ("pass", &pass, "PASS"),
    ] {
        assert_eq!(r.x_cache(), x_cache, "{what}");
        for name in tags {
            assert!(r.headers.get(name).is_none(), "{what}: {name} sent");
        }
    }
    let r = d
        .admin_post("/v1/purge/tags", json!({"tags": ["product-1"]}))
        .await;
    assert_eq!(json_body(&r)["purged"], 1, "stored with its tags");
    assert_eq!(get(d.addr, "t.test", "/p", &[]).await.x_cache(), "MISS");

    let exposed = Daemon::with_config(
        origin.addr,
        "[[listen]]\naddress = \"127.0.0.1:0\"\n[cache]\nexpose_surrogate_keys = true\n",
    );
    let miss = get(exposed.addr, "t.test", "/p", &[]).await;
    published(&exposed, 1).await;
    let hit = get(exposed.addr, "t.test", "/p", &[]).await;
    for r in [&miss, &hit] {
        assert_eq!(r.header("surrogate-key"), "product-1 all");
        assert_eq!(r.header("xkey"), "shelf-1");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_invalidation_errors_are_clear_json() {
    let origin = origin(cacheable).await;
    let d = Daemon::start(origin.addr, &[]);
    let r = d
        .admin_post("/v1/bans", json!({"expression": "req.url ~ \"^/a"}))
        .await;
    assert_eq!(r.status, 400);
    let e = json_body(&r);
    assert_eq!(e["code"], "invalid_ban");
    assert_eq!(e["message"], "unclosed quote at 11");
    let r = d
        .admin_post("/v1/bans", json!({"expression": "req.url ~ ("}))
        .await;
    let message = json_body(&r)["message"].clone();
    assert!(
        message
            .as_str()
            .unwrap()
            .starts_with("invalid regex at 11: "),
        "{message}"
    );
    let r = d.admin_post("/v1/bans", json!({"expr": "x"})).await;
    assert_eq!(
        (r.status.as_u16(), json_body(&r)["code"].clone()),
        (422, json!("invalid_body"))
    );
    let big = "x".repeat(100 * 1024);
    let r = d.admin_post("/v1/purge", json!({"url": big})).await;
    assert_eq!(r.status, 413);
    assert_eq!(json_body(&r)["code"], "body_too_large");
    let r = request(
        d.admin,
        Method::POST,
        "/v1/purge",
        &[("content-type", "application/json")],
        Bytes::from_static(b"{\"url\":\"/a\",\"host\":\"h\"}"),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 401, "purges need the secret");
    assert_eq!(d.stats().await["store"]["purges"], 0);
}

/// A `PURGE` or `BAN` request.
async fn invalidate(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> ClientReply {
    let method = Method::from_bytes(method.as_bytes()).unwrap();
    request(addr, method, path, headers, Bytes::new())
        .await
        .expect("request")
}

fn config_file(d: &tempfile::TempDir, text: &str) -> String {
    let path = d.path().join("lacquer.toml");
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn purge_and_ban_methods_are_off_by_default_and_limited_to_allowed_networks() {
    let origin = origin(cacheable).await;
    let off = Daemon::start(origin.addr, &[]);
    get(off.addr, "m.test", "/x", &[]).await;
    let r = invalidate(off.addr, "PURGE", "/x", &[("host", "m.test")]).await;
    assert_eq!(r.status, 405);
    assert!(r.header("allow").contains("GET"));
    assert_eq!(get(off.addr, "m.test", "/x", &[]).await.x_cache(), "HIT");
    assert_eq!(
        origin.total(),
        1,
        "a refused PURGE never reaches the origin"
    );

    let dir = tempfile::tempdir().unwrap();
    let elsewhere = config_file(
        &dir,
        "[purge]\nhttp_methods = true\nallow_from = [\"10.0.0.0/8\"]\n",
    );
    let refused = Daemon::start(origin.addr, &["--config", &elsewhere]);
    let r = invalidate(refused.addr, "BAN", "/", &[("host", "m.test")]).await;
    assert_eq!(r.status, 405);

    let dir = tempfile::tempdir().unwrap();
    let on = config_file(&dir, "[purge]\nhttp_methods = true\n");
    let d = Daemon::start(origin.addr, &["--config", &on]);
    for p in ["/a", "/b/1", "/b/2", "/c"] {
        get(d.addr, "m.test", p, &[]).await;
    }
    published(&d, 4).await;
    let r = invalidate(d.addr, "PURGE", "/a", &[("host", "m.test")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(json_body(&r), json!({"purged": 1, "soft": false}));
    let r = invalidate(d.addr, "BAN", "/b/.*", &[("host", "m.test")]).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        json_body(&r)["expression"],
        r#"req.http.host == "m.test" && req.url ~ "/b/.*""#
    );
    for (p, want) in [
        ("/a", "MISS"),
        ("/b/1", "MISS"),
        ("/b/2", "MISS"),
        ("/c", "HIT"),
    ] {
        assert_eq!(get(d.addr, "m.test", p, &[]).await.x_cache(), want, "{p}");
    }
    let r = invalidate(
        d.addr,
        "BAN",
        "/",
        &[("host", "m.test"), ("x-ban", "req.url ~ (")],
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(json_body(&r)["code"], "invalid_ban");
    let r = invalidate(
        d.addr,
        "PURGE",
        "/",
        &[("host", "m.test"), ("xkey-purge", "nothing-tagged")],
    )
    .await;
    assert_eq!(json_body(&r)["purged"], 0);
    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["purge_requests"], 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_bans_leave_a_bounded_list_once_the_lurker_has_run() {
    let origin = origin(cacheable).await;
    let d = Daemon::start(origin.addr, &[]);
    for i in 0..20 {
        get(d.addr, "l.test", &format!("/o/{i}"), &[]).await;
    }
    let d = Arc::new(d);
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let d = d.clone();
        tasks.push(tokio::spawn(async move {
            for i in (worker..10_000).step_by(8) {
                let r = d
                    .admin_post(
                        "/v1/bans",
                        json!({"expression": format!("req.url == /gone/{i}")}),
                    )
                    .await;
                assert_eq!(r.status, 201);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let stats = d
        .wait_for_stats("the lurker", |s| s["store"]["bans_pending"] == 0)
        .await;
    assert_eq!(stats["store"]["bans_added"], 10_000);
    assert!(
        stats["store"]["bans"].as_u64().unwrap() <= 100,
        "{}",
        stats["store"]
    );
    let list = json_body(&d.admin_get("/v1/bans", Some(&d.secret())).await);
    assert!(list["bans"].as_array().unwrap().len() <= 100);
    for i in 0..20 {
        assert_eq!(
            get(d.addr, "l.test", &format!("/o/{i}"), &[])
                .await
                .x_cache(),
            "HIT"
        );
    }
}
