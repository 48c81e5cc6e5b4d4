//! Several backends end to end: directors, health probes, routing with per-route cache rules, connection
//! limits and reloading routes, through the real daemon in front of real origins.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::Method;
use lacquer_tests::{get, request, Daemon, Origin, Reply};

/// An origin answering `name` in the body, uncacheable unless the path starts with `/cached`, and
/// `/health` with 200 while `up` holds, else 503.
async fn origin(name: &'static str, up: Arc<AtomicBool>) -> Origin {
    Origin::start(move |seen| {
        if seen.path == "/health" {
            return if up.load(Ordering::SeqCst) {
                Reply::ok("ok")
            } else {
                Reply::ok("down").status(503)
            };
        }
        let reply = Reply::ok(name);
        if seen.path.starts_with("/cached") {
            reply.header("cache-control", "max-age=1")
        } else {
            reply
        }
    })
    .await
}

fn up() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(true))
}

fn backend(name: &str, origin: &Origin, probe: bool) -> String {
    let probe = if probe {
        "[backend.probe]\nurl = \"/health\"\ninterval = \"100ms\"\ntimeout = \"1s\"\nwindow = 3\nthreshold = 2\n"
    } else {
        ""
    };
    format!(
        "[[backend]]\nname = \"{name}\"\naddress = \"{}\"\n{probe}",
        origin.addr
    )
}

fn start(config: &str) -> Daemon {
    Daemon::with_config_only(&format!("[[listen]]\naddress = \"127.0.0.1:0\"\n{config}"))
}

async fn get_for(d: &Daemon, host: &str, path: &str) -> lacquer_tests::ClientReply {
    request(d.addr, Method::GET, path, &[("host", host)], Bytes::new())
        .await
        .unwrap_or_else(|e| panic!("{host}{path}: {e}; log:\n{}", d.log()))
}

async fn body_of(d: &Daemon, host: &str, path: &str) -> String {
    String::from_utf8_lossy(&get_for(d, host, path).await.body).into_owned()
}

async fn wait_for_health(d: &Daemon, name: &str, want: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = d.admin_get("/v1/backends", Some(&d.secret())).await;
        let list: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let b = list["backends"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == name)
            .cloned()
            .unwrap();
        if b["health"] == want {
            return b;
        }
        assert!(Instant::now() < deadline, "{name} never {want}: {b}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn directors_spread_requests_over_healthy_backends() {
    let (a, b) = (origin("a", up()).await, origin("b", up()).await);
    let d = start(&format!(
        "{}{}[[director]]\nname = \"rr\"\npolicy = \"round_robin\"\nbackends = [\"a\", \"b\"]\n\
         [[director]]\nname = \"sharded\"\npolicy = \"hash\"\nbackends = [\"a\", \"b\"]\n\
         [[director]]\nname = \"any\"\npolicy = \"random\"\nbackends = [\"a\", \"b\"]\n\
         [[route]]\nhost = \"rr.test\"\nbackend = \"rr\"\n\
         [[route]]\nhost = \"hash.test\"\nbackend = \"sharded\"\n\
         [[route]]\nhost = \"random.test\"\nbackend = \"any\"\n",
        backend("a", &a, false),
        backend("b", &b, false)
    ));
    let mut bodies = Vec::new();
    for i in 0..10 {
        bodies.push(body_of(&d, "rr.test", &format!("/rr/{i}")).await);
    }
    assert_eq!(bodies.iter().filter(|b| *b == "a").count(), 5, "{bodies:?}");
    assert_eq!(bodies.iter().filter(|b| *b == "b").count(), 5, "{bodies:?}");

    // The same URL always lands on the same backend; different URLs spread.
    let mut spread = std::collections::HashMap::<String, usize>::new();
    for i in 0..40 {
        let path = format!("/h/{i}");
        let first = body_of(&d, "hash.test", &path).await;
        for _ in 0..3 {
            assert_eq!(body_of(&d, "hash.test", &path).await, first, "{path}");
        }
        *spread.entry(first).or_default() += 1;
    }
    assert!(spread.values().all(|&n| n >= 8), "{spread:?}");

    let mut random = std::collections::HashMap::<String, usize>::new();
    for i in 0..40 {
        *random
            .entry(body_of(&d, "random.test", &format!("/r/{i}")).await)
            .or_default() += 1;
    }
    assert!(
        random.len() == 2 && random.values().all(|&n| n >= 5),
        "{random:?}"
    );
    assert_eq!(a.total() + b.total(), 10 + 160 + 40);
}

#[tokio::test]
async fn a_probe_takes_a_sick_backend_out_and_brings_it_back() {
    let a_up = up();
    let (a, b) = (origin("a", a_up.clone()).await, origin("b", up()).await);
    let d = start(&format!(
        "{}{}[[director]]\nname = \"rr\"\npolicy = \"round_robin\"\nbackends = [\"a\", \"b\"]\n\
         [[route]]\nbackend = \"rr\"\n",
        backend("a", &a, true),
        backend("b", &b, true)
    ));
    let view = wait_for_health(&d, "a", "healthy").await;
    assert_eq!(view["probe"]["threshold"], 2);
    a_up.store(false, Ordering::SeqCst);
    let view = wait_for_health(&d, "a", "sick").await;
    assert!(
        view["probe"]["last"].as_str().unwrap().contains("503"),
        "{view}"
    );
    assert_eq!(d.stats().await["proxy"]["backends_sick"], 1);
    let before = a.count("/x");
    for _ in 0..6 {
        assert_eq!(body_of(&d, "t", "/x").await, "b");
    }
    assert_eq!(a.count("/x"), before, "a sick backend gets no requests");
    a_up.store(true, Ordering::SeqCst);
    wait_for_health(&d, "a", "healthy").await;
    let mut bodies = Vec::new();
    for _ in 0..4 {
        bodies.push(body_of(&d, "t", "/x").await);
    }
    assert!(bodies.contains(&"a".to_owned()), "{bodies:?}");
    assert_eq!(d.stats().await["proxy"]["backends_sick"], 0);
}

/// How many requests `origin` saw whose path starts with `prefix`.
fn requests_under(origin: &Origin, prefix: &str) -> usize {
    origin
        .seen()
        .iter()
        .filter(|s| s.path.starts_with(prefix))
        .count()
}

/// `PUT /v1/backends/{name}/health` with the daemon's secret: the status and the JSON answer.
async fn set_health(d: &Daemon, name: &str, health: &str) -> (u16, serde_json::Value) {
    let auth = format!("Bearer {}", d.secret());
    let r = request(
        d.admin,
        Method::PUT,
        &format!("/v1/backends/{name}/health"),
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        Bytes::from(format!(r#"{{"health": "{health}"}}"#)),
    )
    .await
    .unwrap();
    (r.status.as_u16(), serde_json::from_slice(&r.body).unwrap())
}

#[tokio::test]
async fn the_operator_drains_a_backend_and_hands_it_back_to_its_probe() {
    let a_up = up();
    let (a, b) = (origin("a", a_up.clone()).await, origin("b", up()).await);
    let d = start(&format!(
        "{}{}[[director]]\nname = \"rr\"\npolicy = \"round_robin\"\nbackends = [\"a\", \"b\"]\n\
         [[route]]\nhost = \"only-a.test\"\nbackend = \"a\"\n\
         [[route]]\nbackend = \"rr\"\n",
        backend("a", &a, true),
        backend("b", &b, true)
    ));
    wait_for_health(&d, "a", "healthy").await;
    wait_for_health(&d, "b", "healthy").await;

    let (status, view) = set_health(&d, "a", "sick").await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(
        (&view["health"], &view["admin"]),
        (&"sick".into(), &"sick".into())
    );
    assert_eq!(
        view["probe"]["healthy"], true,
        "the probe's own verdict: {view}"
    );
    for i in 0..6 {
        assert_eq!(body_of(&d, "t", &format!("/drained/{i}")).await, "b");
    }
    let r = get_for(&d, "only-a.test", "/direct").await;
    assert_eq!(r.status, 503, "as when its probe says sick");
    // The cause goes to the log, never to the client.
    assert!(!String::from_utf8_lossy(&r.body).contains("backend a"));
    d.wait_for_log("backend a unavailable: sick").await;
    assert_eq!(
        requests_under(&a, "/drained") + a.count("/direct"),
        0,
        "a drained backend gets nothing"
    );
    assert_eq!(requests_under(&b, "/drained"), 6);
    assert_eq!(d.stats().await["proxy"]["backends_sick"], 1);

    // Forced healthy: a failing probe no longer takes it out.
    let (status, _) = set_health(&d, "a", "healthy").await;
    assert_eq!(status, 200);
    a_up.store(false, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let view = wait_for_health(&d, "a", "healthy").await;
        if view["probe"]["healthy"] == false {
            assert_eq!(view["admin"], "healthy", "{view}");
            break;
        }
        assert!(Instant::now() < deadline, "the probe never failed: {view}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in 0..4 {
        body_of(&d, "t", &format!("/forced/{i}")).await;
    }
    assert_eq!(
        requests_under(&a, "/forced"),
        2,
        "round robin over both again"
    );

    // `auto`: the probe's verdict (sick) decides again.
    let (_, view) = set_health(&d, "a", "auto").await;
    assert_eq!(
        (&view["health"], &view["admin"]),
        (&"sick".into(), &"auto".into())
    );
    for i in 0..4 {
        assert_eq!(body_of(&d, "t", &format!("/auto/{i}")).await, "b");
    }
    assert_eq!(requests_under(&a, "/auto"), 0);

    // A drain outlives a reload that changes the backend's settings, and a backend the reload keeps.
    a_up.store(true, Ordering::SeqCst);
    wait_for_health(&d, "a", "healthy").await;
    set_health(&d, "a", "sick").await;
    set_health(&d, "b", "healthy").await;
    let file = d.config_file();
    let text = std::fs::read_to_string(&file).unwrap();
    let changed = text.replacen("window = 3", "window = 4", 1);
    assert_ne!(text, changed);
    std::fs::write(&file, changed).unwrap();
    let r = d.admin_post("/v1/reload", serde_json::json!({})).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let list = d.admin_get("/v1/backends", Some(&d.secret())).await;
    let list: serde_json::Value = serde_json::from_slice(&list.body).unwrap();
    assert_eq!(
        list["backends"][0]["probe"]["window"], 4,
        "a was rebuilt: {list}"
    );
    assert_eq!(list["backends"][0]["admin"], "sick", "{list}");
    assert_eq!(list["backends"][1]["admin"], "healthy", "{list}");
    for i in 0..4 {
        assert_eq!(body_of(&d, "t", &format!("/reloaded/{i}")).await, "b");
    }
    assert_eq!(requests_under(&a, "/reloaded"), 0);

    let (status, error) = set_health(&d, "nope", "sick").await;
    assert_eq!(status, 404);
    assert_eq!(error["code"], "unknown_backend");
    assert_eq!(
        error["message"],
        "no backend is named \"nope\" (the backends are a, b)"
    );
    let (status, error) = set_health(&d, "a", "drained").await;
    assert_eq!(
        (status, error["code"].as_str()),
        (422, Some("invalid_body")),
        "{error}"
    );
}

#[tokio::test]
async fn a_sick_backends_objects_are_served_stale_and_the_rest_get_503() {
    let a_up = up();
    let a = origin("a", a_up.clone()).await;
    let d = start(&backend("a", &a, true));
    wait_for_health(&d, "a", "healthy").await;
    assert_eq!(get(d.addr, "/cached/1").await.x_cache(), "MISS");
    a_up.store(false, Ordering::SeqCst);
    wait_for_health(&d, "a", "sick").await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = get(d.addr, "/cached/1").await;
    assert_eq!((r.status.as_u16(), r.x_cache()), (200, "STALE"));
    assert_eq!(&r.body[..], b"a");
    assert_eq!(
        a.count("/cached/1"),
        1,
        "nothing was sent to the sick backend"
    );
    let r = get(d.addr, "/never-cached").await;
    assert_eq!(r.status, 503);
    assert!(!String::from_utf8_lossy(&r.body).contains("sick"), "{r:?}");
    assert_eq!(a.count("/never-cached"), 0);
    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["backend_unavailable"], 2, "{stats}");
}

#[tokio::test]
async fn routes_choose_the_backend_and_the_cache_rules() {
    let (app, assets) = (
        Origin::start(|seen| {
            Reply::ok(format!("app {}", seen.headers.contains_key("cookie")))
                .header("cache-control", "max-age=60")
        })
        .await,
        Origin::start(|seen| {
            Reply::ok(format!("assets {}", seen.headers.contains_key("cookie")))
                .header("cache-control", "no-cache")
                .header("set-cookie", "tracking=1")
        })
        .await,
    );
    let d = start(&format!(
        "[[backend]]\nname = \"app\"\naddress = \"{}\"\n[[backend]]\nname = \"assets\"\naddress = \"{}\"\n\
         [[route]]\nhost = \"*.static.test\"\nbackend = \"assets\"\nttl = \"1h\"\ncookies = \"strip\"\n\
         [[route]]\npath_prefix = \"/api/\"\npass = true\n\
         [[route]]\npath_regex = \"^/account\"\ncookies = \"cache\"\n",
        app.addr, assets.addr
    ));
    let get_with_cookie = |host: &'static str, path: &'static str| {
        let addr = d.addr;
        async move {
            request(
                addr,
                Method::GET,
                path,
                &[("host", host), ("cookie", "s=1")],
                Bytes::new(),
            )
            .await
            .unwrap()
        }
    };
    // Static host: the cookie is stripped, Set-Cookie too, and no-cache is overridden by the route's TTL.
    let first = get_with_cookie("img.static.test", "/logo.png").await;
    assert_eq!(&first.body[..], b"assets false");
    assert_eq!(first.header("set-cookie"), "");
    let second = get_with_cookie("img.static.test", "/logo.png").await;
    assert_eq!(second.x_cache(), "HIT");
    assert_eq!(assets.count("/logo.png"), 1);
    assert!(!assets.seen()[0].headers.contains_key("cookie"));
    // An API path passes although the response is cacheable.
    for _ in 0..2 {
        assert_eq!(get(d.addr, "/api/cart").await.x_cache(), "PASS");
    }
    assert_eq!(app.count("/api/cart"), 2);
    // Elsewhere a cookie makes a request pass, except where the route caches with it.
    for _ in 0..2 {
        assert_eq!(
            get_with_cookie("shop.test", "/home").await.x_cache(),
            "PASS"
        );
        get_with_cookie("shop.test", "/account/1").await;
    }
    assert_eq!(app.count("/home"), 2);
    assert_eq!(app.count("/account/1"), 1);
    assert_eq!(get(d.addr, "/home").await.x_cache(), "MISS");
}

#[tokio::test]
async fn max_connections_turns_the_excess_away_instead_of_queueing_forever() {
    let slow = Origin::start(|_| Reply::ok("slow").delay(Duration::from_millis(1500))).await;
    let d = start(&format!(
        "[[backend]]\nname = \"slow\"\naddress = \"{}\"\nmax_connections = 1\nconnect_timeout = \"300ms\"\n",
        slow.addr
    ));
    let (one, two) = tokio::join!(get(d.addr, "/a"), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        get(d.addr, "/b").await
    });
    assert_eq!(one.status, 200);
    assert_eq!(two.status, 503, "{:?}", two.body);
    assert_eq!(slow.max_in_flight(), 1);
    assert_eq!(d.stats().await["proxy"]["backend_unavailable"], 1);
    // The place is free again once the first response is over.
    assert_eq!(get(d.addr, "/c").await.status, 200);
}

#[tokio::test]
async fn reload_changes_routes_and_backends_without_a_restart() {
    let (a, b) = (origin("a", up()).await, origin("b", up()).await);
    let backends = format!("{}{}", backend("a", &a, false), backend("b", &b, false));
    let d = start(&format!(
        "{backends}[[route]]\npath_prefix = \"/x\"\nbackend = \"a\"\n"
    ));
    assert_eq!(body_of(&d, "t", "/x").await, "a");
    let file = d.config_file();
    let reload = || async {
        let r = d.admin_post("/v1/reload", serde_json::json!({})).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        serde_json::from_slice::<serde_json::Value>(&r.body).unwrap()
    };
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace("backend = \"a\"", "backend = \"b\"")).unwrap();
    let body = reload().await;
    assert_eq!(
        body["applied"],
        serde_json::json!(["route[0].backend"]),
        "{body}"
    );
    assert_eq!(body_of(&d, "t", "/x").await, "b");

    // A new backend, with a probe, and a route to it: live as well.
    let c = origin("c", up()).await;
    let text = std::fs::read_to_string(&file).unwrap();
    let text =
        format!("{text}{}", backend("c", &c, true)).replace("backend = \"b\"", "backend = \"c\"");
    std::fs::write(&file, text).unwrap();
    let body = reload().await;
    assert_eq!(
        body["applied"],
        serde_json::json!(["backend", "route[0].backend"]),
        "{body}"
    );
    wait_for_health(&d, "c", "healthy").await;
    assert_eq!(body_of(&d, "t", "/x").await, "c");
    let list = d.admin_get("/v1/backends", Some(&d.secret())).await;
    let list: serde_json::Value = serde_json::from_slice(&list.body).unwrap();
    assert_eq!(
        list["backends"][1]["requests"], 1,
        "b kept its history: {list}"
    );

    // Removed: its probe stops and it is gone from the list.
    let text = std::fs::read_to_string(&file).unwrap();
    let (kept, _) = text.split_once("[[backend]]\nname = \"c\"").unwrap();
    std::fs::write(&file, kept.replace("backend = \"c\"", "backend = \"a\"")).unwrap();
    reload().await;
    assert_eq!(body_of(&d, "t", "/x").await, "a");
    let polls = c.count("/health");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        c.count("/health"),
        polls,
        "the retired backend's probe stopped"
    );
    let list = d.admin_get("/v1/backends", Some(&d.secret())).await;
    let list: serde_json::Value = serde_json::from_slice(&list.body).unwrap();
    assert_eq!(list["backends"].as_array().unwrap().len(), 2, "{list}");
}

#[tokio::test]
async fn https_backends_are_checked_against_the_configured_ca() {
    let origin = Origin::start(|seen| {
        Reply::ok(format!(
            "over tls for {}",
            seen.headers["host"].to_str().unwrap()
        ))
        .header("cache-control", "max-age=60")
    })
    .await;
    let ca = lacquer_tests::tls::TestCa::new();
    let front = ca.front(&["localhost"], origin.addr).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let d = start(&format!(
        "[[backend]]\nname = \"trusted\"\naddress = \"https://localhost:{port}\"\ntls_ca = \"{ca}\"\n\
         [backend.probe]\nurl = \"/health\"\ninterval = \"100ms\"\ntimeout = \"1s\"\n\
         [[backend]]\nname = \"untrusted\"\naddress = \"https://localhost:{port}\"\n\
         [[route]]\npath_prefix = \"/untrusted\"\nbackend = \"untrusted\"\n",
        port = front.port(),
        ca = ca_file.display()
    ));
    wait_for_health(&d, "trusted", "healthy").await;
    let first = get_for(&d, "shop.test", "/page").await;
    assert_eq!(
        (first.status.as_u16(), &first.body[..]),
        (200, &b"over tls for shop.test"[..])
    );
    assert_eq!(first.x_cache(), "MISS");
    let again = get_for(&d, "shop.test", "/page").await;
    assert_eq!(again.x_cache(), "HIT");
    assert_eq!(origin.count("/page"), 1);

    // The same origin, its certificate checked against the system's roots: refused, nothing sent.
    let refused = get(d.addr, "/untrusted").await;
    assert_eq!(refused.status, 503, "{:?}", refused.body);
    // Why is the operator's to read (the log), not the client's.
    let page = String::from_utf8_lossy(&refused.body);
    assert!(!page.contains("certificate"), "{page}");
    d.wait_for_log("certificate").await;
    assert_eq!(origin.count("/untrusted"), 0);
}
