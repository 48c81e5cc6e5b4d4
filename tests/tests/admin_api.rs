//! The admin API as documented: the OpenAPI document lists exactly the routes served and describes what
//! they answer, `/metrics` parses as Prometheus text, the statistics stream streams, errors are JSON.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::Method;
use lacquer_admin::{AdminClient, Target};
use lacquer_tests::{get, request, Daemon, Origin, Reply};
use serde_json::Value;

async fn cacheable() -> (Origin, Daemon) {
    let origin = Origin::start(|_| {
        Reply::ok("body")
            .header("cache-control", "max-age=60")
            .header("xkey", "t1")
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    (origin, d)
}

async fn call(d: &Daemon, method: Method, path: &str, body: &str) -> lacquer_tests::ClientReply {
    let auth = format!("Bearer {}", d.secret());
    let headers = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
    ];
    request(
        d.admin,
        method,
        path,
        &headers,
        Bytes::from(body.to_owned()),
    )
    .await
    .expect("admin request")
}

/// Whether `value` has the shape `schema` describes (types, required and known properties, enums), with
/// `$ref`s resolved in `doc`.
fn conforms(doc: &Value, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    if let Some(reference) = schema["$ref"].as_str() {
        let name = reference.trim_start_matches("#/components/schemas/");
        return conforms(doc, &doc["components"]["schemas"][name], value, at);
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(options) = schema[key].as_array() {
            return options
                .iter()
                .find(|o| conforms(doc, o, value, at).is_ok())
                .map(drop)
                .ok_or_else(|| format!("{at}: {value} matches none of {key}"));
        }
    }
    if let Some(all) = schema["allOf"].as_array() {
        return all.iter().try_for_each(|s| conforms(doc, s, value, at));
    }
    let type_ok = |t: &str| match t {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        other => panic!("schema type {other} at {at}"),
    };
    let ok = match &schema["type"] {
        Value::String(t) => type_ok(t),
        Value::Array(ts) => ts.iter().any(|t| type_ok(t.as_str().unwrap())),
        _ => true,
    };
    if !ok {
        return Err(format!("{at}: {value} is not {}", schema["type"]));
    }
    if let Some(values) = schema["enum"].as_array() {
        if !values.contains(value) {
            return Err(format!("{at}: {value} not in {values:?}"));
        }
    }
    if let (Some(object), Some(properties)) = (value.as_object(), schema["properties"].as_object())
    {
        for key in object.keys() {
            if !properties.contains_key(key) {
                return Err(format!("{at}.{key} is not documented"));
            }
        }
        for required in schema["required"].as_array().into_iter().flatten() {
            let key = required.as_str().unwrap();
            if !object.contains_key(key) {
                return Err(format!("{at}.{key} is documented as required but missing"));
            }
        }
        for (key, property) in properties {
            if let Some(v) = object.get(key) {
                conforms(doc, property, v, &format!("{at}.{key}"))?;
            }
        }
    }
    if let (Some(items), Some(schema)) = (value.as_array(), schema.get("items")) {
        for (i, item) in items.iter().enumerate() {
            conforms(doc, schema, item, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

/// `(METHOD, path)` of every documented operation.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .map(move |m| (m.to_uppercase(), path.clone()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_openapi_document_matches_the_routes_and_the_answers() {
    let (_origin, d) = cacheable().await;
    get(d.addr, "/a").await;
    d.wait_for_stats("/a stored", |s| s["store"]["objects_published"] == 1)
        .await;
    call(
        &d,
        Method::POST,
        "/v1/bans",
        r#"{"expression": "req.url ~ ^/nothing"}"#,
    )
    .await;

    let reply = d.admin_get("/v1/openapi.json", None).await;
    assert_eq!(reply.status, 200, "the document needs no secret");
    let doc: Value = serde_json::from_slice(&reply.body).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    assert_eq!(
        doc["components"]["securitySchemes"]["secret"]["scheme"],
        "bearer"
    );

    let documented = operations(&doc);
    let guide =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/admin-api.md"))
            .unwrap();
    let in_guide: BTreeSet<(String, String)> = guide
        .lines()
        .filter_map(|l| l.strip_prefix("### `")?.strip_suffix('`'))
        .filter_map(|route| {
            let (method, path) = route.split_once(' ')?;
            Some((method.to_owned(), path.split('?').next()?.to_owned()))
        })
        .collect();
    assert_eq!(
        documented, in_guide,
        "docs/admin-api.md has a section for every route"
    );

    let host = d.addr.to_string();
    for (method, path) in &documented {
        let method: Method = method.parse().unwrap();
        if path.ends_with("/stream") {
            continue; // never ends; checked below and in access_log.rs
        }
        let target = match path.as_str() {
            "/v1/objects" => format!("/v1/objects?url=http://{host}/a"),
            "/v1/backends/{name}/health" => "/v1/backends/default/health".to_owned(),
            other => other.to_owned(),
        };
        let body = if path == "/v1/purge" {
            format!(r#"{{"url": "http://{host}/nothing"}}"#)
        } else if path == "/v1/purge/tags" {
            r#"{"tags": ["none"]}"#.to_owned()
        } else if path == "/v1/explain" {
            format!(r#"{{"url": "http://{host}/a"}}"#)
        } else if path == "/v1/backends/{name}/health" {
            r#"{"health": "auto"}"#.to_owned()
        } else if path == "/v1/bans" && method == Method::POST {
            r#"{"expression": "obj.status == 599"}"#.to_owned()
        } else {
            String::new()
        };
        let reply = call(&d, method.clone(), &target, &body).await;
        // A single node has no cluster to show, and one without `acme` no certificates: their documented
        // 404s are checked like any answer.
        let single_node =
            (path == "/v1/cluster" || path.starts_with("/v1/certificates")) && reply.status == 404;
        assert!(
            reply.status.is_success() || single_node,
            "{method} {target}: {} {:?}",
            reply.status,
            reply.body
        );
        let operation = &doc["paths"][path][method.as_str().to_lowercase()];
        let documented = &operation["responses"][reply.status.as_str()];
        assert!(
            !documented.is_null(),
            "{method} {path} answered an undocumented {}",
            reply.status
        );
        let Some(schema) = documented["content"]["application/json"].get("schema") else {
            continue;
        };
        let value: Value = serde_json::from_slice(&reply.body).unwrap();
        conforms(&doc, schema, &value, path)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}\n{value}"));
    }

    let client = AdminClient::new(Target {
        addr: d.admin,
        secret_file: d.secret_file(),
    });
    let mut stream = client.stats_stream().await.unwrap();
    let event = serde_json::to_value(stream.next().await.unwrap()).unwrap();
    let schema = &doc["paths"]["/v1/stats/stream"]["get"]["responses"]["200"]["content"]
        ["text/event-stream"]["schema"];
    conforms(&doc, schema, &event, "stream").unwrap();

    let inspection: Value = serde_json::from_slice(
        &call(
            &d,
            Method::GET,
            &format!("/v1/objects?url=http://{host}/a"),
            "",
        )
        .await
        .body,
    )
    .unwrap();
    assert_eq!(
        inspection["variants"][0]["tags"],
        serde_json::json!(["t1"]),
        "{inspection}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_parse_and_carry_every_value() {
    let (_origin, d) = cacheable().await;
    for path in ["/a", "/a", "/b"] {
        get(d.addr, path).await;
    }
    // Quiet from here on: both objects stored and on disk, so only the scrapes move the counters.
    d.wait_for_stats("both objects durable", |s| {
        s["store"]["objects_durable"] == 2
    })
    .await;
    let reply = d.admin_get("/metrics", None).await;
    assert_eq!(reply.status, 401, "the secret guards metrics by default");
    let reply = call(&d, Method::GET, "/metrics", "").await;
    assert_eq!(reply.status, 200);
    assert!(reply
        .header("content-type")
        .starts_with("text/plain; version=0.0.4"));
    let stats: lacquer_admin::wire::Stats = serde_json::from_value(d.stats().await).unwrap();
    let text = String::from_utf8(reply.body.to_vec()).unwrap();
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("Prometheus text parses");

    let sample = |metric: &str, labels: &[(&str, &str)]| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => v,
                ref other => panic!("{metric}: {other:?}"),
            })
    };
    assert_eq!(
        sample("lacquer_cache_requests_total", &[("result", "hit")]),
        Some(1.0)
    );
    assert_eq!(
        sample("lacquer_cache_requests_total", &[("result", "miss")]),
        Some(2.0)
    );
    assert_eq!(sample("lacquer_store_objects", &[]), Some(2.0));
    for (name, field, value) in stats.values() {
        let got = sample(field.metric, field.labels)
            .unwrap_or_else(|| panic!("{name} ({}) missing", field.metric));
        assert_eq!(got, value as f64, "{name}");
        assert!(
            scrape.docs.contains_key(field.metric),
            "{} has no HELP",
            field.metric
        );
    }
    assert_eq!(stats.listeners.len(), 1);
    let listener = &stats.listeners[0].address;
    for (name, field, value) in stats.listener_values() {
        let mut labels = vec![("listener", listener.as_str())];
        labels.extend(field.labels);
        let got = sample(field.metric, &labels)
            .unwrap_or_else(|| panic!("{name} ({}) missing", field.metric));
        assert_eq!(got, value as f64, "{name}");
    }
    assert_eq!(
        sample("lacquer_listener_requests_total", &[("protocol", "http1")]),
        Some(3.0)
    );
    assert!(
        scrape
            .samples
            .iter()
            .any(|s| s.metric.starts_with("foyer_")),
        "foyer's own metrics follow"
    );
    assert_eq!(
        sample(
            "lacquer_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn open_metrics_serves_prometheus_without_the_secret() {
    let origin = Origin::start(|_| Reply::ok("x")).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("lacquer.toml");
    std::fs::write(&config, "[admin]\nopen_metrics = true\n").unwrap();
    let d = Daemon::start(origin.addr, &["--config", config.to_str().unwrap()]);
    let reply = d.admin_get("/metrics", None).await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        d.admin_get("/v1/stats", None).await.status,
        401,
        "only metrics are open"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_stream_sends_a_document_every_second_and_ends_on_shutdown() {
    let (_origin, mut d) = cacheable().await;
    let client = AdminClient::new(Target {
        addr: d.admin,
        secret_file: d.secret_file(),
    });
    let mut stream = client.stats_stream().await.unwrap();
    let first = stream.next().await.unwrap();
    get(d.addr, "/a").await;
    let started = Instant::now();
    let second = stream.next().await.unwrap();
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    assert_eq!(first.proxy.requests, 0);
    assert_eq!(second.proxy.requests, 1);
    assert!(second.uptime_seconds >= first.uptime_seconds);

    let stopping = Instant::now();
    d.stop();
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "a connected stream does not hold up shutdown"
    );
    assert!(stream.next().await.is_err(), "the stream ends");
}

#[tokio::test(flavor = "multi_thread")]
async fn errors_are_json_with_stable_codes() {
    let (_origin, d) = cacheable().await;
    let code = |reply: &lacquer_tests::ClientReply| -> String {
        let v: Value = serde_json::from_slice(&reply.body).unwrap_or_else(|_| panic!("{reply:?}"));
        v["code"].as_str().unwrap().to_owned()
    };
    let cases: [(Method, &str, &str, u16, &str); 10] = [
        (Method::GET, "/v1/nope", "", 404, "not_found"),
        (Method::DELETE, "/v1/stats", "", 405, "method_not_allowed"),
        (Method::GET, "/v1/objects", "", 400, "invalid_query"),
        (Method::GET, "/v1/objects?url=/a", "", 400, "missing_host"),
        (
            Method::GET,
            "/v1/objects?url=http://a/&nope=1",
            "",
            400,
            "invalid_query",
        ),
        (Method::POST, "/v1/bans", "{", 400, "invalid_body"),
        (
            Method::POST,
            "/v1/bans",
            r#"{"expr": "x"}"#,
            422,
            "invalid_body",
        ),
        (Method::POST, "/v1/reload", "", 200, ""),
        (
            Method::PUT,
            "/v1/backends/nope/health",
            r#"{"health": "sick"}"#,
            404,
            "unknown_backend",
        ),
        (
            Method::PUT,
            "/v1/backends/default/health",
            r#"{"health": "drained"}"#,
            422,
            "invalid_body",
        ),
    ];
    for (method, path, body, status, want) in cases {
        let reply = call(&d, method.clone(), path, body).await;
        assert_eq!(reply.status.as_u16(), status, "{method} {path}: {reply:?}");
        if !want.is_empty() {
            assert_eq!(code(&reply), want, "{method} {path}");
        }
    }
    let big = format!(r#"{{"expression": "{}"}}"#, "x".repeat(70_000));
    let reply = call(&d, Method::POST, "/v1/bans", &big).await;
    assert_eq!(
        (reply.status.as_u16(), code(&reply)),
        (413, "body_too_large".into())
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn inspect_tells_memory_from_disk() {
    let origin =
        Origin::start(|_| Reply::ok(vec![7u8; 600 * 1024]).header("cache-control", "max-age=600"))
            .await;
    let mut d = Daemon::start(origin.addr, &[]);
    get(d.addr, "/big").await;
    d.wait_for_stats("durable", |s| s["store"]["objects_durable"] == 1)
        .await;
    let url = format!("/v1/objects?url=/big&host={}", d.addr);
    let before: Value =
        serde_json::from_slice(&call(&d, Method::GET, &url, "").await.body).unwrap();
    let tiers = &before["variants"][0]["tiers"];
    assert_eq!(
        tiers,
        &serde_json::json!({"chunks": 3, "in_memory": 3, "on_disk": 3}),
        "{before}"
    );

    d.stop();
    let d = d.restart();
    let after: Value = serde_json::from_slice(&call(&d, Method::GET, &url, "").await.body).unwrap();
    assert_eq!(after["key"], before["key"]);
    let tiers = &after["variants"][0]["tiers"];
    assert_eq!(
        tiers,
        &serde_json::json!({"chunks": 3, "in_memory": 0, "on_disk": 3}),
        "{after}"
    );
}

/// Whether the peer closes `stream` within `within` (an answer before the close, such as a 408, counts).
async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// The admin listener is bounded as the client listeners are: connections with a partial request head
/// are closed after `header_read_timeout`, those past `max_connections` at once, and the API answers
/// again once they have gone (before, each stayed open for good, with its memory and descriptor).
#[tokio::test]
async fn the_admin_listener_closes_partial_heads_and_caps_its_connections() {
    use tokio::io::AsyncWriteExt;
    const CAP: usize = 20;
    let origin = Origin::start(|_| Reply::ok("body")).await;
    let d = Daemon::with_config(
        origin.addr,
        &format!(
            "[[listen]]\naddress = \"127.0.0.1:0\"\n[admin]\nmax_connections = {CAP}\n\
             header_read_timeout = \"1s\"\nidle_timeout = \"30s\""
        ),
    );
    let started = Instant::now();
    let mut partial = Vec::new();
    for _ in 0..CAP {
        let mut s = tokio::net::TcpStream::connect(d.admin).await.unwrap();
        s.write_all(b"GET /v1/health HTTP/1.1\r\nHost: admin\r\n")
            .await
            .unwrap();
        partial.push(s);
    }
    // Every one is accepted before the next connections count against the cap.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for n in 0..5 {
        let mut over = tokio::net::TcpStream::connect(d.admin).await.unwrap();
        let _ = over
            .write_all(b"GET /v1/health HTTP/1.1\r\nHost: admin\r\n\r\n")
            .await;
        assert!(
            closed_within(&mut over, Duration::from_millis(500)).await,
            "connection {n} past the cap is closed at once"
        );
    }
    for (n, s) in partial.iter_mut().enumerate() {
        assert!(
            closed_within(s, Duration::from_secs(3)).await,
            "partial head {n} is closed after header_read_timeout"
        );
    }
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "closed by the timeout, not at once: {:?}",
        started.elapsed()
    );
    let health = d.admin_get("/v1/health", None).await;
    assert_eq!(health.status.as_u16(), 200, "the API answers again");
}

#[tokio::test(flavor = "multi_thread")]
async fn latency_histograms_tell_hits_from_slow_misses_and_count_status_codes() {
    let origin = Origin::start(|seen| match seen.path.as_str() {
        "/slow" => Reply::ok("slow body")
            .header("cache-control", "max-age=60")
            .delay(Duration::from_millis(120)),
        _ => Reply::ok("gone").status(404),
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    for path in ["/slow", "/slow", "/missing"] {
        get(d.addr, path).await;
    }
    let stats: lacquer_admin::wire::Stats = serde_json::from_value(
        d.wait_for_stats("three responses timed to their end", |s| {
            s["latency"].as_array().map(|l| {
                l.iter()
                    .flat_map(|o| o["latency"]["total"]["counts"].as_array().unwrap().iter())
                    .map(|c| c.as_u64().unwrap())
                    .sum::<u64>()
            }) == Some(3)
        })
        .await,
    )
    .unwrap();
    let outcome = |name: &str| {
        &stats
            .latency
            .iter()
            .find(|l| l.outcome == name)
            .unwrap_or_else(|| panic!("{name} in {:?}", stats.latency))
            .latency
    };
    let (hit, miss) = (outcome("hit"), outcome("miss"));
    assert_eq!((hit.ttfb.count(), miss.ttfb.count()), (1, 2));
    // The slow miss waited 120 ms for the origin: its bucket's bound is at least 250 ms.
    assert!(
        miss.ttfb.quantile_bound_us(1.0) >= Some(250_000),
        "{miss:?}"
    );
    assert!(
        hit.ttfb.sum_us < 120_000,
        "a hit never waits for the origin: {hit:?}"
    );
    for other in ["pass", "stale", "synth"] {
        assert_eq!(outcome(other).ttfb.count(), 0, "{other}");
    }
    assert_eq!(stats.responses, [(200, 2), (404, 1)].into());

    let backends: lacquer_admin::wire::BackendList =
        serde_json::from_slice(&d.admin_get("/v1/backends", Some(&d.secret())).await.body).unwrap();
    let backend = &backends.backends[0];
    assert_eq!(backend.responses, [(200, 1), (404, 1)].into());
    assert_eq!(backend.latency.ttfb.count(), 2);
    assert!(backend.latency.ttfb.sum_us >= 120_000, "{backend:?}");
    assert_eq!(backend.latency.total.count(), 2);

    let text =
        String::from_utf8(call(&d, Method::GET, "/metrics", "").await.body.to_vec()).unwrap();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .expect("Prometheus text parses");
    let histogram = |metric: &str, label: (&str, &str)| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == metric && s.labels.get(label.0) == Some(label.1))
            .map(|s| match &s.value {
                prometheus_parse::Value::Histogram(buckets) => {
                    buckets.last().map(|b| b.count).unwrap_or_default()
                }
                other => panic!("{metric}: {other:?}"),
            })
    };
    assert_eq!(
        histogram("lacquer_client_ttfb_seconds", ("outcome", "miss")),
        Some(2.0)
    );
    assert_eq!(
        histogram(
            "lacquer_backend_duration_seconds",
            ("backend", &backend.name)
        ),
        Some(2.0)
    );
    let counter = |metric: &str, labels: &[(&str, &str)]| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v) => v,
                ref other => panic!("{metric}: {other:?}"),
            })
    };
    assert_eq!(
        counter("lacquer_client_responses_total", &[("code", "404")]),
        Some(1.0)
    );
    assert_eq!(
        counter(
            "lacquer_backend_responses_total",
            &[("backend", &backend.name), ("code", "200")]
        ),
        Some(1.0)
    );
}
