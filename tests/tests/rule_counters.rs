//! Each `[[rule]]`'s match counter, as `/v1/stats` and `/metrics` show it: N requests matching a rule are
//! N, whatever became of them (miss, hit), and a reload starts the counts again from 0.

use http::Method;
use lacquer_tests::{get, request, Daemon, Origin, Reply};
use serde_json::{json, Value};

const RULES: &str = r#"
[[listen]]
address = "127.0.0.1:0"

[[rule]]
name = "static"
match = { extensions = ["css"] }
strip_cookies = true

[[rule]]
match = { path_prefix = ["/never/"] }
pass = true

[[rule]]
name = "hsts"
on = "deliver"
set_headers = { "strict-transport-security" = "max-age=300" }
"#;

/// The daemon's rules as `/v1/stats` lists them: name, phase and count.
async fn counts(d: &Daemon) -> Value {
    d.stats().await["rules"].clone()
}

fn expected(css: u64, never: u64, delivered: u64) -> Value {
    json!([
        {"rule": "static", "phase": "request", "matched": css},
        {"rule": "rule[1]", "phase": "request", "matched": never},
        {"rule": "hsts", "phase": "deliver", "matched": delivered},
    ])
}

/// `lacquer_rule_matches_total` by rule and phase, parsed from `/metrics`.
async fn metric(d: &Daemon, rule: &str, phase: &str) -> Option<f64> {
    let auth = format!("Bearer {}", d.secret());
    let reply = request(
        d.admin,
        Method::GET,
        "/metrics",
        &[("authorization", &auth)],
        Default::default(),
    )
    .await
    .unwrap();
    let text = String::from_utf8(reply.body.to_vec()).unwrap();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .expect("Prometheus text parses");
    assert!(
        scrape.docs.contains_key("lacquer_rule_matches_total"),
        "HELP"
    );
    scrape
        .samples
        .iter()
        .find(|s| {
            s.metric == "lacquer_rule_matches_total"
                && s.labels.get("rule") == Some(rule)
                && s.labels.get("phase") == Some(phase)
        })
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) => v,
            ref other => panic!("not a counter: {other:?}"),
        })
}

#[tokio::test(flavor = "multi_thread")]
async fn counts_follow_traffic_and_restart_on_reload() {
    const N: u64 = 5;
    let origin = Origin::start(|_| Reply::ok("x").header("cache-control", "max-age=60")).await;
    let d = Daemon::with_config(origin.addr, RULES);
    assert_eq!(counts(&d).await, expected(0, 0, 0), "every rule, from 0");
    for _ in 0..N {
        let reply = get(d.addr, "/site.css").await;
        assert_eq!(reply.header("strict-transport-security"), "max-age=300");
    }
    get(d.addr, "/page").await;
    assert_eq!(origin.count("/site.css"), 1, "one miss, then hits");
    assert_eq!(counts(&d).await, expected(N, 0, N + 1));
    assert_eq!(metric(&d, "static", "request").await, Some(N as f64));
    assert_eq!(metric(&d, "rule[1]", "request").await, Some(0.0));
    assert_eq!(metric(&d, "hsts", "deliver").await, Some((N + 1) as f64));

    let reloaded = d.admin_post("/v1/reload", Value::Null).await;
    assert_eq!(reloaded.status, 200, "{:?}", reloaded.body);
    assert_eq!(
        counts(&d).await,
        expected(0, 0, 0),
        "a reload starts afresh"
    );
    assert_eq!(metric(&d, "static", "request").await, Some(0.0));
    get(d.addr, "/site.css").await;
    assert_eq!(counts(&d).await, expected(1, 0, 1));
    assert_eq!(metric(&d, "hsts", "deliver").await, Some(1.0));
}

/// A plain hit is sent the head its response-only deliver rules edited once: the rule is counted on every
/// hit, a rule on the request after it still runs per request, and a reload that changes the rule is
/// seen on the next hit of an object stored before it.
#[tokio::test(flavor = "multi_thread")]
async fn hits_of_an_object_stored_before_a_reload_get_the_reloaded_deliver_rules() {
    let origin = Origin::start(|_| {
        Reply::ok("x")
            .header("cache-control", "max-age=60")
            .header("server", "origin/1.0")
    })
    .await;
    let config = |served_by: &str| {
        format!(
            r#"
[[listen]]
address = "127.0.0.1:0"

[[rule]]
name = "served-by"
on = "deliver"
set_headers = {{ "x-served-by" = "{served_by}" }}

[[rule]]
name = "hide-server"
on = "deliver"
unset_headers = ["server"]

[[rule]]
name = "debug"
on = "deliver"
match = {{ headers = {{ "x-debug" = "" }} }}
set_headers = {{ "x-debugged" = "yes" }}
"#
        )
    };
    let d = Daemon::with_config(origin.addr, &config("one"));
    for n in 0..4 {
        let reply = get(d.addr, "/a").await;
        assert_eq!(reply.header("x-served-by"), "one", "response {n}");
        assert!(reply.headers.get("server").is_none(), "response {n}");
        assert!(reply.headers.get("x-debugged").is_none(), "response {n}");
    }
    let debugged = request(
        d.addr,
        Method::GET,
        "/a",
        &[("x-debug", "1")],
        Default::default(),
    )
    .await
    .unwrap();
    assert_eq!(debugged.header("x-cache"), "HIT");
    assert_eq!(debugged.header("x-served-by"), "one");
    assert_eq!(debugged.header("x-debugged"), "yes");
    assert_eq!(origin.count("/a"), 1);
    assert_eq!(
        counts(&d).await,
        json!([
            {"rule": "served-by", "phase": "deliver", "matched": 5},
            {"rule": "hide-server", "phase": "deliver", "matched": 5},
            {"rule": "debug", "phase": "deliver", "matched": 1},
        ])
    );

    std::fs::write(d.config_file(), config("two")).unwrap();
    let reloaded = d.admin_post("/v1/reload", Value::Null).await;
    assert_eq!(reloaded.status, 200, "{:?}", reloaded.body);
    let reply = get(d.addr, "/a").await;
    assert_eq!(reply.header("x-cache"), "HIT");
    assert_eq!(reply.header("x-served-by"), "two");
    assert!(reply.headers.get("server").is_none());
    assert_eq!(origin.count("/a"), 1);
}
