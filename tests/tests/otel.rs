//! `[telemetry]` end to end: a collector in the test receives lacquerd's OTLP/HTTP exports and decodes them;
//! the origin shows the `traceparent` it was sent. Spans are flushed when the daemon stops, so each test
//! reads them after stopping it.

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use lacquer_tests::{get, request, Daemon, Origin, Reply};
use opentelemetry_proto::tonic::{
    collector::trace::v1::ExportTraceServiceRequest,
    common::v1::{any_value::Value, AnyValue},
    trace::v1::{span::SpanKind, Span},
};
use prost::Message;

/// A span as received, with the `service.name` of its resource.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    span: Span,
}

/// An OTLP/HTTP collector: what it was sent, and the `Content-Type` and path of each export.
struct Collector {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Received>>>,
    exports: Arc<Mutex<Vec<(String, String)>>>,
}

impl Collector {
    async fn start() -> Collector {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans: Arc<Mutex<Vec<Received>>> = Arc::default();
        let exports: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let (keep, seen) = (spans.clone(), exports.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (keep, seen) = (keep.clone(), seen.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let (keep, seen) = (keep.clone(), seen.clone());
                        async move {
                            let kind = req
                                .headers()
                                .get("content-type")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("")
                                .to_owned();
                            seen.lock()
                                .unwrap()
                                .push((req.uri().path().to_owned(), kind));
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let export = ExportTraceServiceRequest::decode(body).unwrap();
                            for resource in export.resource_spans {
                                let service = resource
                                    .resource
                                    .iter()
                                    .flat_map(|r| &r.attributes)
                                    .find(|a| a.key == "service.name")
                                    .and_then(|a| text(a.value.as_ref()))
                                    .unwrap_or_default();
                                for scope in resource.scope_spans {
                                    for span in scope.spans {
                                        keep.lock().unwrap().push(Received {
                                            service: service.clone(),
                                            span,
                                        });
                                    }
                                }
                            }
                            Ok::<_, Infallible>(
                                Response::builder()
                                    .header("content-type", "application/x-protobuf")
                                    .body(Full::new(Bytes::new()))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Collector {
            addr,
            spans,
            exports,
        }
    }

    fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }
}

fn text(value: Option<&AnyValue>) -> Option<String> {
    match value?.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        Value::BoolValue(b) => Some(b.to_string()),
        Value::DoubleValue(d) => Some(d.to_string()),
        _ => None,
    }
}

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| text(a.value.as_ref()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn origin() -> Origin {
    Origin::start(|_| Reply::ok("hello").header("cache-control", "max-age=60")).await
}

fn start(origin: &Origin, telemetry: &str) -> Daemon {
    Daemon::with_config(
        origin.addr,
        &format!("[[listen]]\naddress = \"127.0.0.1:0\"\n{telemetry}"),
    )
}

/// SIGTERM: the daemon exports what it holds before it exits. Blocking, so the collector (another of the
/// runtime's threads) keeps answering meanwhile.
fn stop(d: &mut Daemon) {
    tokio::task::block_in_place(|| d.stop());
}

/// The `traceparent` each request the origin saw carried (`None` for none).
fn traceparents(origin: &Origin) -> Vec<Option<String>> {
    origin
        .seen()
        .iter()
        .map(|s| {
            s.headers
                .get("traceparent")
                .map(|v| v.to_str().unwrap().to_owned())
        })
        .collect()
}

fn children<'a>(spans: &'a [Received], parent: &Span) -> Vec<&'a Span> {
    spans
        .iter()
        .map(|r| &r.span)
        .filter(|s| s.trace_id == parent.trace_id && s.parent_span_id == parent.span_id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_miss_and_a_hit_are_traced_and_the_origin_continues_the_fetch_span() {
    let collector = Collector::start().await;
    let origin = origin().await;
    let mut d = start(
        &origin,
        &format!(
            "[telemetry]\nendpoint = \"http://{}/v1/traces\"\n",
            collector.addr
        ),
    );
    assert_eq!(get(d.addr, "/a").await.x_cache(), "MISS");
    d.wait_for_stats("the object published", |s| s["store"]["objects"] == 1)
        .await;
    assert_eq!(get(d.addr, "/a").await.x_cache(), "HIT");
    stop(&mut d);

    let exports = collector.exports.lock().unwrap().clone();
    assert!(!exports.is_empty(), "nothing exported:\n{}", d.log());
    for (path, kind) in &exports {
        assert_eq!(
            (path.as_str(), kind.as_str()),
            ("/v1/traces", "application/x-protobuf")
        );
    }
    let spans = collector.spans();
    assert!(spans.iter().all(|r| r.service == "lacquerd"), "{spans:?}");
    let servers: Vec<&Span> = spans
        .iter()
        .map(|r| &r.span)
        .filter(|s| s.kind == SpanKind::Server as i32)
        .collect();
    assert_eq!(servers.len(), 2, "{spans:#?}");
    let by_cache = |cache: &str| {
        *servers
            .iter()
            .find(|s| attr(s, "lacquer.cache").as_deref() == Some(cache))
            .unwrap_or_else(|| panic!("no {cache} span: {servers:#?}"))
    };
    let (miss, hit) = (by_cache("miss"), by_cache("hit"));
    for span in [miss, hit] {
        assert_eq!(span.name, "GET");
        assert!(span.parent_span_id.is_empty(), "a root span: {span:?}");
        assert_ne!(miss.trace_id, hit.trace_id, "a trace per request");
        assert_eq!(attr(span, "http.request.method").as_deref(), Some("GET"));
        assert_eq!(attr(span, "url.path").as_deref(), Some("/a"));
        assert_eq!(
            attr(span, "http.response.status_code").as_deref(),
            Some("200")
        );
        assert_eq!(attr(span, "server.address").as_deref(), Some("127.0.0.1"));
        assert_eq!(attr(span, "client.address").as_deref(), Some("127.0.0.1"));
        assert_eq!(
            attr(span, "network.protocol.version").as_deref(),
            Some("1.1")
        );
        assert!(span.end_time_unix_nano >= span.start_time_unix_nano);
    }

    let names = |spans: Vec<&Span>| {
        let mut names: Vec<String> = spans.iter().map(|s| s.name.clone()).collect();
        names.sort();
        names
    };
    assert_eq!(names(children(&spans, miss)), ["fetch", "lookup", "store"]);
    assert_eq!(names(children(&spans, hit)), ["lookup"]);
    let found = |span: &Span| {
        let lookup = children(&spans, span)
            .into_iter()
            .find(|c| c.name == "lookup")
            .unwrap();
        attr(lookup, "lacquer.found")
    };
    assert_eq!(found(miss).as_deref(), Some("false"));
    assert_eq!(found(hit).as_deref(), Some("true"));

    let fetch = children(&spans, miss)
        .into_iter()
        .find(|c| c.name == "fetch")
        .unwrap();
    assert_eq!(fetch.kind, SpanKind::Client as i32);
    assert_eq!(
        attr(fetch, "http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(attr(fetch, "lacquer.backend").as_deref(), Some("default"));
    assert_eq!(attr(fetch, "server.address").as_deref(), Some("127.0.0.1"));
    assert_eq!(
        attr(fetch, "server.port"),
        Some(origin.addr.port().to_string())
    );

    // The origin's one request carries the fetch span's context, sampled.
    assert_eq!(
        traceparents(&origin),
        [Some(format!(
            "00-{}-{}-01",
            hex(&miss.trace_id),
            hex(&fetch.span_id)
        ))]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_trace_is_continued_to_the_origin() {
    let collector = Collector::start().await;
    let origin = origin().await;
    let mut d = start(
        &origin,
        &format!(
            "[telemetry]\nendpoint = \"http://{}/v1/traces\"\nsample_ratio = 0.0\nservice_name = \"edge-cache\"\n\
             trust_client_trace = [\"127.0.0.0/8\"]\n",
            collector.addr
        ),
    );
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let sent = [("traceparent", caller), ("tracestate", "vendor=opaque")];
    let reply = request(d.addr, Method::GET, "/b", &sent, Bytes::new())
        .await
        .unwrap();
    assert_eq!(reply.x_cache(), "MISS");
    stop(&mut d);

    // Sampled by its caller: traced, though the ratio is 0 (the parent's decision stands).
    let spans = collector.spans();
    assert!(spans.iter().all(|r| r.service == "edge-cache"), "{spans:?}");
    let server = spans
        .iter()
        .map(|r| &r.span)
        .find(|s| s.kind == SpanKind::Server as i32)
        .unwrap_or_else(|| panic!("no server span: {spans:#?}"));
    assert_eq!(hex(&server.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(hex(&server.parent_span_id), "00f067aa0ba902b7");
    assert_eq!(server.trace_state, "vendor=opaque");
    let fetch = children(&spans, server)
        .into_iter()
        .find(|c| c.name == "fetch")
        .unwrap();
    let seen = origin.seen();
    assert_eq!(
        traceparents(&origin),
        [Some(format!(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-{}-01",
            hex(&fetch.span_id)
        ))]
    );
    assert_eq!(seen[0].headers["tracestate"], "vendor=opaque");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sample_ratio_zero_exports_nothing_and_sends_no_traceparent_of_its_own() {
    let collector = Collector::start().await;
    let origin = origin().await;
    let mut d = start(
        &origin,
        &format!(
            "[telemetry]\nendpoint = \"http://{}/v1/traces\"\nsample_ratio = 0\n",
            collector.addr
        ),
    );
    assert_eq!(get(d.addr, "/c").await.x_cache(), "MISS");
    // A caller that did not sample: neither does lacquerd, and its `traceparent` goes on as it came.
    let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
    let reply = request(
        d.addr,
        Method::GET,
        "/d",
        &[("traceparent", unsampled)],
        Bytes::new(),
    )
    .await
    .unwrap();
    assert_eq!(reply.x_cache(), "MISS");
    stop(&mut d);
    assert_eq!(traceparents(&origin), [None, Some(unsampled.to_owned())]);
    assert!(collector.spans().is_empty(), "{:#?}", collector.spans());
}

/// A client outside `trust_client_trace` (by default, every client) cannot force tracing: its sampled
/// `traceparent` at `sample_ratio = 0` exports nothing and is not followed under the trace id it chose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_clients_sampled_traceparent_forces_no_trace() {
    let collector = Collector::start().await;
    let origin = origin().await;
    let mut d = start(
        &origin,
        &format!(
            "[telemetry]\nendpoint = \"http://{}/v1/traces\"\nsample_ratio = 0\n",
            collector.addr
        ),
    );
    let forced = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    for path in ["/f1", "/f2", "/f3"] {
        let reply = request(
            d.addr,
            Method::GET,
            path,
            &[("traceparent", forced)],
            Bytes::new(),
        )
        .await
        .unwrap();
        assert_eq!(reply.x_cache(), "MISS");
    }
    stop(&mut d);
    assert!(collector.spans().is_empty(), "{:#?}", collector.spans());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_by_default_a_clients_traceparent_passes_unchanged_and_turning_it_on_needs_a_restart() {
    let origin = origin().await;
    let mut d = start(&origin, "");
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    get(d.addr, "/e").await;
    request(
        d.addr,
        Method::GET,
        "/f",
        &[("traceparent", caller)],
        Bytes::new(),
    )
    .await
    .unwrap();
    // Turned on in the file, it waits for a restart: a reload says so.
    let file = d.config_file();
    let text = std::fs::read_to_string(&file).unwrap();
    let on = format!("{text}\n[telemetry]\nendpoint = \"http://127.0.0.1:4318/v1/traces\"\n");
    std::fs::write(&file, on).unwrap();
    let reload = d.admin_post("/v1/reload", serde_json::json!({})).await;
    assert_eq!(reload.status, 200, "{:?}", reload.body);
    let body: serde_json::Value = serde_json::from_slice(&reload.body).unwrap();
    assert_eq!(
        body["not_applied"],
        serde_json::json!([{ "setting": "telemetry.endpoint", "reason": "takes effect on restart" }])
    );
    get(d.addr, "/e-again").await;
    stop(&mut d);
    assert_eq!(traceparents(&origin), [None, Some(caller.to_owned()), None]);
    assert!(!d.log().contains("exporting traces"), "{}", d.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_hangs_neither_slows_requests_nor_holds_spans_without_bound() {
    // Accepts connections and never answers: every export waits for its timeout.
    let hanging = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = hanging.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = hanging.accept().await {
            held.push(stream);
        }
    });
    let origin = origin().await;
    let mut d = start(
        &origin,
        &format!(
            "[telemetry]\nendpoint = \"http://{addr}/v1/traces\"\nmax_queue = 8\nexport_timeout = \"3s\"\n"
        ),
    );
    for n in 0..30 {
        let began = Instant::now();
        let reply = get(d.addr, &format!("/g{n}")).await;
        assert_eq!(reply.status, 200);
        assert!(
            began.elapsed() < Duration::from_secs(2),
            "request {n} took {:?}",
            began.elapsed()
        );
    }
    // Four spans a miss, eight held at most: the rest are dropped, and counted.
    d.wait_for_stats("spans dropped", |s| {
        s["proxy"]["trace_spans_dropped"].as_u64() >= Some(100)
    })
    .await;
    let stopping = Instant::now();
    stop(&mut d);
    assert!(
        stopping.elapsed() < Duration::from_secs(15),
        "stopping took {:?}",
        stopping.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_waits_for_anothers_fetch_does_not_claim_it() {
    let collector = Collector::start().await;
    let origin = Origin::start(|_| {
        Reply::ok("slow")
            .header("cache-control", "max-age=60")
            .delay(Duration::from_millis(500))
    })
    .await;
    let mut d = start(
        &origin,
        &format!(
            "[telemetry]\nendpoint = \"http://{}/v1/traces\"\n",
            collector.addr
        ),
    );
    let first = get(d.addr, "/h");
    let second = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        get(d.addr, "/h").await
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!((first.x_cache(), second.x_cache()), ("MISS", "MISS"));
    assert_eq!(origin.count("/h"), 1);
    stop(&mut d);

    let spans = collector.spans();
    let servers: Vec<&Span> = spans
        .iter()
        .map(|r| &r.span)
        .filter(|s| s.kind == SpanKind::Server as i32)
        .collect();
    assert_eq!(servers.len(), 2, "{spans:#?}");
    let fetches = |s: &Span| {
        children(&spans, s)
            .iter()
            .filter(|c| c.name == "fetch")
            .count()
    };
    let (leader, waiter) = match fetches(servers[0]) {
        1 => (servers[0], servers[1]),
        _ => (servers[1], servers[0]),
    };
    assert_eq!((fetches(leader), fetches(waiter)), (1, 0), "{spans:#?}");
    assert_eq!(attr(waiter, "lacquer.collapsed").as_deref(), Some("true"));
    assert_eq!(attr(leader, "lacquer.collapsed"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_is_traced_to_the_origin_too() {
    let collector = Collector::start().await;
    let origin = origin().await;
    let mut d = start(
        &origin,
        &format!(
            "[telemetry]\nendpoint = \"http://{}/v1/traces\"\n",
            collector.addr
        ),
    );
    let reply = request(d.addr, Method::POST, "/p", &[], Bytes::from("form"))
        .await
        .unwrap();
    assert_eq!(reply.x_cache(), "PASS");
    stop(&mut d);

    let spans = collector.spans();
    let server = spans
        .iter()
        .map(|r| &r.span)
        .find(|s| s.kind == SpanKind::Server as i32)
        .unwrap_or_else(|| panic!("no server span: {spans:#?}"));
    assert_eq!(server.name, "POST");
    assert_eq!(attr(server, "lacquer.cache").as_deref(), Some("pass"));
    let kids = children(&spans, server);
    assert_eq!(kids.len(), 1, "a pass looks nothing up: {kids:#?}");
    assert_eq!(kids[0].name, "fetch");
    assert_eq!(
        traceparents(&origin),
        [Some(format!(
            "00-{}-{}-01",
            hex(&server.trace_id),
            hex(&kids[0].span_id)
        ))]
    );
}

/// Waits until the node serves in a cluster of `members`.
async fn serving(d: &Daemon, members: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = d.admin_get("/v1/cluster", Some(&d.secret())).await;
        let view: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
        if view["state"] == "serving" && view["members"].as_array().map_or(0, Vec::len) == members {
            return;
        }
        assert!(Instant::now() < deadline, "not serving: {view}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_routed_to_the_owning_peer_is_one_trace_across_both_nodes() {
    let Some(etcd) = lacquer_tests::etcd::Etcd::start() else {
        return;
    };
    let collector = Collector::start().await;
    let origin = origin().await;
    let secret = lacquer_tests::secret_file(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("otel-cluster-secret"),
        "the cluster secret of the otel test, long enough",
    );
    let mut nodes: Vec<Daemon> = (1..=2)
        .map(|n| {
            Daemon::with_config(
                origin.addr,
                &format!(
                    "[[listen]]\naddress = \"127.0.0.{n}:0\"\n\
                     [cluster]\nnode = \"n{n}\"\netcd = [\"{}\"]\nprefix = \"/otel\"\n\
                     self_routing = true\nsecret_file = \"{}\"\n\
                     [telemetry]\nendpoint = \"http://{}/v1/traces\"\nservice_name = \"n{n}\"\n\
                     trust_client_trace = [\"127.0.0.0/8\"]\n",
                    etcd.url(),
                    secret.display(),
                    collector.addr
                ),
            )
        })
        .collect();
    for d in &nodes {
        serving(d, 2).await;
    }
    // Enough keys that some are the other node's.
    for n in 0..16 {
        assert_eq!(get(nodes[0].addr, &format!("/k{n}")).await.status, 200);
    }
    for d in &mut nodes {
        stop(d);
    }

    let spans = collector.spans();
    let peer_fetches: Vec<&Received> = spans
        .iter()
        .filter(|r| r.service == "n1" && attr(&r.span, "lacquer.peer").as_deref() == Some("n2"))
        .collect();
    assert!(!peer_fetches.is_empty(), "no key went to n2: {spans:#?}");
    for fetch in peer_fetches {
        assert_eq!(fetch.span.name, "fetch");
        assert_eq!(
            attr(&fetch.span, "http.response.status_code").as_deref(),
            Some("200")
        );
        // n2's server span is the child of n1's fetch, and n2 fetched from the origin in the same trace.
        let owner = spans
            .iter()
            .find(|r| {
                r.service == "n2"
                    && r.span.kind == SpanKind::Server as i32
                    && r.span.parent_span_id == fetch.span.span_id
            })
            .unwrap_or_else(|| panic!("n2 did not continue {fetch:#?}"));
        assert_eq!(owner.span.trace_id, fetch.span.trace_id);
        let origin_fetch = children(&spans, &owner.span)
            .into_iter()
            .find(|c| c.name == "fetch")
            .expect("the owner fetched from the origin");
        assert_eq!(attr(origin_fetch, "lacquer.peer"), None);
    }
}
