//! The data path (lookup, coalescing, fetch, respond) against an in-memory store and a scripted origin on
//! a real socket: what the client gets, what the origin saw, and what the store holds.

use std::{
    net::{IpAddr, Ipv4Addr},
    sync::{
        atomic::{AtomicUsize, Ordering::SeqCst},
        Arc,
    },
    time::Duration,
};

use bytes::Bytes;
use futures_util::FutureExt;
use http::{request::Parts, HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use lacquer_backends::{backend_set, body::Body};
use lacquer_config::Config;
use lacquer_tests::{pattern, Origin, Raw, Reply, Step};
use tokio::sync::Notify;

use crate::{
    access_log::AccessLog,
    coding::Negotiated,
    flow::step::{Step as Next, Txn},
    memory::MemoryStore,
    phase,
    phase::Decided,
    stats::Stats,
    worker::{Live, Shared, Worker},
};

const HOST: &str = "example.test";
const CLIENT: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A worker serving from `store`, in front of `origin`, with the default configuration.
fn worker(origin: &Origin, store: &MemoryStore) -> Arc<Worker<MemoryStore>> {
    worker_with(origin, store, |_| {})
}

/// A worker serving from `store`, in front of `origin`, with the defaults as `configure` changes them.
fn worker_with(
    origin: &Origin,
    store: &MemoryStore,
    configure: impl FnOnce(&mut Config),
) -> Arc<Worker<MemoryStore>> {
    worker_of(origin, store, configure, None)
}

/// As [`worker_with`], a member of `cluster`.
fn worker_of(
    origin: &Origin,
    store: &MemoryStore,
    configure: impl FnOnce(&mut Config),
    cluster: Option<Arc<dyn crate::cluster::Cluster>>,
) -> Arc<Worker<MemoryStore>> {
    // Built from the defaults in memory: `Config::load` would resolve (and create) the default store
    // directory, which these tests never use.
    let mut config = Config::default();
    configure(&mut config);
    config.backend[0].address = Some(origin.addr.to_string());
    let backends = backend_set(&config).expect("backends");
    let live = Live::new(&config, &backends).expect("live settings");
    let stats = Arc::new(Stats::default());
    let format = crate::log_format::LogFormat::compile(&config.access_log.format).expect("format");
    let (access_log, _) =
        AccessLog::start(&config.access_log, format, stats.clone()).expect("no file");
    let mut shared = Shared::new(live, store.clone(), stats, access_log);
    if let Some(cluster) = cluster {
        shared = shared.with_cluster(cluster);
    }
    Arc::new(Worker::new(Arc::new(shared)))
}

/// A request the request phase admitted to the lookup with `decided`, as `receive` leaves it.
fn looked_up(
    worker: &Worker<MemoryStore>,
    client: IpAddr,
    route: Arc<lacquer_backends::routing::Route>,
    decided: Decided,
    mut parts: Parts,
) -> Txn {
    let negotiated = route
        .policy
        .compression
        .as_ref()
        .map(|negotiation| Negotiated::take(&mut parts.headers, negotiation));
    let class = lacquer_policy::request::RequestClass::Lookup;
    let delivers = phase::delivers(&worker.shared.live.load().rules);
    let mut txn = Txn::admitted(client, false, route, decided, class, delivers);
    txn.key = lacquer_policy::key::primary_key(&parts);
    txn.negotiated = negotiated;
    txn.head = Some(Arc::new(parts));
    txn
}

/// What a client got.
struct Got {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Got {
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .map_or("", |v| v.to_str().expect("text"))
    }

    fn x_cache(&self) -> &str {
        self.header("x-cache")
    }
}

fn parts(path: &str, headers: &[(&str, &str)]) -> Parts {
    let mut req = Request::get(path).header("host", HOST);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(()).expect("request").into_parts().0
}

/// The response to a GET for `path` on [`HOST`] through the lookup path, its body not read yet.
async fn respond(
    worker: &Arc<Worker<MemoryStore>>,
    path: &str,
    headers: &[(&str, &str)],
) -> Response<Body> {
    let parts = parts(path, headers);
    let route = worker.shared.live.load().router.route(&parts).clone();
    let mut txn = looked_up(worker, CLIENT, route, Decided::default(), parts);
    crate::flow::steps(worker, &mut txn, Next::Lookup { again: false }).await
}

/// A GET for `path` on [`HOST`] through the lookup path, its body read to the end.
async fn get(worker: &Arc<Worker<MemoryStore>>, path: &str, headers: &[(&str, &str)]) -> Got {
    let (head, body) = respond(worker, path, headers).await.into_parts();
    let body = body.collect().await.expect("a whole body").to_bytes();
    Got {
        status: head.status,
        headers: head.headers,
        body,
    }
}

fn key(path: &str) -> String {
    format!("{HOST}{path}")
}

/// Waits until no fill is running (each counts itself out once it has published, or not, what it stored).
async fn fills_done(worker: &Worker<MemoryStore>) {
    let stats = &worker.shared.stats;
    for _ in 0..500 {
        if stats.fetches_in_flight.load(SeqCst) == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("a fill is still running");
}

/// An origin that holds every response until `gate` lets it go, then writes `reply` (raw HTTP/1.1).
async fn gated(reply: &'static str) -> (Origin, Arc<Notify>) {
    let gate = Arc::new(Notify::new());
    let held = gate.clone();
    let origin = Origin::raw(move |_| vec![Raw::Gate(held.clone()), Raw::write(reply)]).await;
    (origin, gate)
}

/// Waits until the origin has seen `n` requests.
async fn origin_saw(origin: &Origin, n: usize) {
    for _ in 0..500 {
        if origin.total() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the origin saw {} requests, not {n}", origin.total());
}

/// A request index per origin request, for scripts whose answer changes over time.
fn counter() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

/// A client that took every byte of a body of known length may ask again at once: the fetch is complete
/// as its last bytes reach the readers, so the next request is a hit on it, not a waiter for the store.
#[tokio::test]
async fn a_body_whose_last_bytes_were_sent_is_complete_before_the_store_takes_them() {
    let origin = Origin::start(|_| Reply::ok("hello").header("cache-control", "max-age=60")).await;
    let store = MemoryStore::new(4);
    let w = worker(&origin, &store);
    let held = store.hold_writes().await;
    let busy = Duration::from_secs(5);
    let first = tokio::time::timeout(busy, get(&w, "/a", &[]))
        .await
        .expect("the whole body while the store is busy");
    assert_eq!((first.x_cache(), &first.body[..]), ("MISS", &b"hello"[..]));
    let second = tokio::time::timeout(busy, get(&w, "/a", &[]))
        .await
        .expect("answered while the store is busy");
    assert_eq!((second.x_cache(), &second.body[..]), ("HIT", &b"hello"[..]));
    drop(held);
    fills_done(&w).await;
    assert_eq!(origin.count("/a"), 1);
    assert_eq!(store.variants(&key("/a")).len(), 1);
}

/// The conformance suite's `cc-resp-no-cache-revalidate-fresh`, about once in three runs: the second request
/// came while the first's no-cache response was complete but not yet published, and was fetched whole. It
/// must wait for the publication and revalidate what was stored.
#[tokio::test]
async fn a_request_just_before_a_no_cache_object_is_published_revalidates_it() {
    let origin = Origin::start(|seen| {
        if seen.headers.contains_key("if-none-match") {
            Reply::ok("").status(304).header("etag", "\"v1\"")
        } else {
            Reply::ok("hello")
                .header("cache-control", "no-cache")
                .header("etag", "\"v1\"")
        }
    })
    .await;
    let store = MemoryStore::new(4);
    let w = worker(&origin, &store);
    let held = store.hold_writes().await;
    let first = get(&w, "/a", &[]).await;
    assert_eq!((first.x_cache(), &first.body[..]), ("MISS", &b"hello"[..]));
    let second = tokio::spawn({
        let w = w.clone();
        async move { get(&w, "/a", &[]).await }
    });
    // The second request is in, the object still unpublished.
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(held);
    let second = second.await.expect("second request");
    assert_eq!(
        (second.status, &second.body[..]),
        (StatusCode::OK, &b"hello"[..])
    );
    let seen = origin.seen();
    assert_eq!(seen.len(), 2, "one fetch, one revalidation");
    assert_eq!(
        seen[1]
            .headers
            .get("if-none-match")
            .map(|v| v.to_str().expect("text")),
        Some("\"v1\""),
        "the second request validated the stored object"
    );
}

#[tokio::test]
async fn a_miss_is_fetched_streamed_and_stored() {
    let origin = Origin::start(|_| {
        Reply::ok("hello")
            .header("cache-control", "max-age=60")
            .header("etag", "\"v1\"")
    })
    .await;
    let store = MemoryStore::new(4);
    let w = worker(&origin, &store);

    let got = get(&w, "/a", &[]).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.body, "hello");
    assert_eq!(got.x_cache(), "MISS");
    assert_eq!(got.header("cache-status"), "lacquer; fwd=miss; stored");
    assert_eq!(origin.count("/a"), 1);
    let seen = &origin.seen()[0];
    assert_eq!(seen.method, "GET");
    assert_eq!(seen.headers["host"], HOST);
    assert!(
        !seen.headers.contains_key("if-none-match"),
        "a miss with nothing stored asks unconditionally"
    );

    fills_done(&w).await;
    let stored = store.variants(&key("/a"));
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].length, 5);
    assert_eq!(stored[0].chunk_count(), 2, "4-byte chunks");
    assert_eq!(stored[0].ttl_ms, 60_000);
    assert_eq!(w.shared.stats.misses.load(SeqCst), 1);
    assert_eq!(w.shared.stats.objects_stored.load(SeqCst), 1);
}

#[tokio::test]
async fn a_stored_object_is_a_hit_without_the_origin() {
    let origin =
        Origin::start(|_| Reply::ok(pattern(1000)).header("cache-control", "max-age=60")).await;
    let store = MemoryStore::new(64);
    let w = worker(&origin, &store);
    get(&w, "/h", &[]).await;
    fills_done(&w).await;
    store.take_reads();

    let got = get(&w, "/h", &[]).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.x_cache(), "HIT");
    assert!(got.header("cache-status").starts_with("lacquer; hit; ttl="));
    assert_eq!(got.header("content-length"), "1000");
    assert!(got.body == pattern(1000), "the stored bytes, in order");
    assert_eq!(origin.count("/h"), 1, "a hit does not reach the origin");
    let reads: Vec<u32> = store.take_reads().into_iter().map(|(_, i)| i).collect();
    assert_eq!(
        reads,
        (0..16).collect::<Vec<_>>(),
        "every chunk once, in order"
    );
    assert_eq!(w.shared.stats.hits.load(SeqCst), 1);
}

/// Two requests that miss together make one origin request; the one that joined is told so.
#[tokio::test]
async fn concurrent_misses_share_one_fetch() {
    let origin = Origin::start(|_| {
        Reply::ok("")
            .header("cache-control", "max-age=60")
            .delay(Duration::from_millis(50))
            .steps(
                vec![
                    Step::Data(Bytes::from_static(b"first half, ")),
                    Step::Sleep(Duration::from_millis(20)),
                    Step::Data(Bytes::from_static(b"second half")),
                ],
                Some(23),
            )
    })
    .await;
    let store = MemoryStore::new(8);
    let w = worker(&origin, &store);

    // Both are polled before the fill task runs: both miss and the second joins the first's fetch.
    let (a, b) = tokio::join!(get(&w, "/c", &[]), get(&w, "/c", &[]));
    assert_eq!(origin.count("/c"), 1, "one origin fetch for both");
    for got in [&a, &b] {
        assert_eq!(got.status, StatusCode::OK);
        assert_eq!(got.body, "first half, second half");
        assert_eq!(got.x_cache(), "MISS");
    }
    assert_eq!(a.header("cache-status"), "lacquer; fwd=miss; stored");
    assert_eq!(
        b.header("cache-status"),
        "lacquer; fwd=miss; stored; collapsed"
    );
    assert_eq!(w.shared.stats.coalesced_waiters.load(SeqCst), 1);
    fills_done(&w).await;
    assert_eq!(store.published(), 1);
}

/// With `Vary: Accept-Encoding`, a request for the other variant that waited on a fetch looks up again and
/// fetches its own; each variant is then a hit with its own body.
#[tokio::test]
async fn variants_are_fetched_and_served_apart() {
    let origin = Origin::start(|seen| {
        let german = seen
            .headers
            .get("accept-language")
            .is_some_and(|v| v.as_bytes() == b"de");
        let reply = if german {
            Reply::ok("Hallo").header("content-language", "de")
        } else {
            Reply::ok("Hello")
        };
        reply
            .header("cache-control", "max-age=60")
            .header("vary", "Accept-Language")
            .delay(Duration::from_millis(20))
    })
    .await;
    let store = MemoryStore::new(4);
    let w = worker(&origin, &store);
    let german = [("accept-language", "de")];
    let english = [("accept-language", "en")];

    let (a, b) = tokio::join!(get(&w, "/v", &german), get(&w, "/v", &english));
    assert_eq!(a.body, "Hallo");
    assert_eq!(a.header("content-language"), "de");
    assert_eq!(b.body, "Hello", "not the variant the other fetch brought");
    assert_eq!(b.header("content-language"), "");
    assert_eq!(b.x_cache(), "MISS");
    assert_eq!(origin.count("/v"), 2, "one fetch per variant");
    let asked: Vec<_> = origin
        .seen()
        .iter()
        .map(|s| s.headers["accept-language"].clone())
        .collect();
    assert_eq!(asked, ["de", "en"]);
    fills_done(&w).await;
    assert_eq!(store.variants(&key("/v")).len(), 2);

    for (headers, body) in [(&english, "Hello"), (&german, "Hallo")] {
        let got = get(&w, "/v", headers).await;
        assert_eq!(got.x_cache(), "HIT");
        assert_eq!(got.body, body);
    }
    assert_eq!(origin.count("/v"), 2);
}

/// Under `[compression]` (on by default) every client's `Accept-Encoding` selects the one stored object:
/// text is compressed into the store once, sent as stored to clients that take its coding and decoded for
/// the others.
#[tokio::test]
async fn one_compressed_body_serves_every_accept_encoding() {
    let text: Bytes = "<p>lacquer</p>\n".repeat(400).into();
    let served = text.clone();
    let origin = Origin::start(move |_| {
        Reply::ok(served.clone())
            .header("content-type", "text/html")
            .header("cache-control", "max-age=60")
            .header("etag", "\"t\"")
    })
    .await;
    let store = MemoryStore::new(1024);
    let w = worker(&origin, &store);
    let gz = get(&w, "/t", &[("accept-encoding", "gzip, deflate, br")]).await;
    assert_eq!(gz.header("content-encoding"), "gzip");
    assert!(gz.body.len() < text.len() / 10);
    assert_eq!(gz.header("etag"), "W/\"t\"");
    fills_done(&w).await;
    let stored = store.variants(&key("/t"));
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].length, gz.body.len() as u64);
    assert_eq!(
        stored[0].variant,
        [("accept-encoding".to_owned(), "\ngzip, br;q=0.9".to_owned())]
    );
    for ae in ["br", "identity", "gzip;q=0, br"] {
        let got = get(&w, "/t", &[("accept-encoding", ae)]).await;
        assert_eq!(got.x_cache(), "HIT", "{ae}");
        assert_eq!(got.header("content-encoding"), "", "{ae}");
        assert_eq!(got.body, text, "{ae}");
        assert_eq!(got.header("content-length"), text.len().to_string(), "{ae}");
    }
    let again = get(&w, "/t", &[("accept-encoding", "x-gzip")]).await;
    assert_eq!(again.body, gz.body);
    assert_eq!(origin.count("/t"), 1);
    assert_eq!(
        origin.seen()[0].headers["accept-encoding"],
        "gzip, br;q=0.9"
    );
    // Decoded on the way out until the identity representation was made from the stored body.
    let stats = &w.shared.stats;
    let sent = || stats.decoded_gzip.load(SeqCst) + stats.representations_served.load(SeqCst);
    assert_eq!(sent(), 3);
    assert_eq!(stats.compress_in.load(SeqCst), text.len() as u64);
    let made = async {
        while stats.representations_made.load(SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), made)
        .await
        .expect("the identity representation is made");
    let served = stats.representations_served.load(SeqCst);
    let got = get(&w, "/t", &[]).await;
    assert_eq!((got.x_cache(), &got.body), ("HIT", &text));
    assert_eq!(got.header("content-length"), text.len().to_string());
    assert_eq!(got.header("etag"), "W/\"t\"");
    assert_eq!(stats.representations_served.load(SeqCst), served + 1);
    let sibling = &store.set(&key("/t")).expect("stored").siblings;
    assert_eq!(sibling.len(), 1);
    assert_eq!(sibling[0].coding, None);
    assert_eq!(sibling[0].body.length, text.len() as u64);
    assert_eq!(origin.count("/t"), 1);
}

/// Compression dictionaries (RFC 9842) on the data path: a stored `Use-As-Dictionary` response is held; a
/// client announcing it is sent the next version in `dcz`, made once from the stored body; a dictionary
/// response that varies on a cookie is never held, and a purged one is let go.
#[tokio::test]
async fn a_dictionary_held_compresses_the_next_version_for_its_holders() {
    use base64::Engine;
    let v1: String = (0..2000)
        .map(|i| format!("function f{i}() {{ return {i}; }}\n"))
        .collect();
    let v2 = format!("{v1}function added() {{}}\n");
    let (a, b) = (Bytes::from(v1.clone()), Bytes::from(v2.clone()));
    let origin = Origin::start(move |seen| {
        let script = |body: &Bytes| {
            Reply::ok(body.clone())
                .header("content-type", "application/javascript")
                .header("cache-control", "max-age=60")
        };
        match seen.path.as_str() {
            "/v1.js" => script(&a).header("use-as-dictionary", "match=\"/v*.js\""),
            "/mine.js" => script(&a)
                .header("use-as-dictionary", "match=\"/v*.js\"")
                .header("vary", "cookie"),
            "/fixed.js" => Reply::ok(b.clone())
                .header("content-type", "application/javascript")
                .header("cache-control", "max-age=60, no-transform"),
            _ => script(&b),
        }
    })
    .await;
    let store = MemoryStore::new(1024);
    let w = worker(&origin, &store);
    let stats = &w.shared.stats;
    get(&w, "/mine.js", &[("cookie", "user=7")]).await;
    get(&w, "/v1.js", &[]).await;
    fills_done(&w).await;
    for _ in 0..500 {
        if stats.dictionaries_held.load(SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        stats.dictionaries_held.load(SeqCst),
        1,
        "the dictionary held"
    );
    // The same bytes under a cookie's variant were never held: one dictionary.
    assert_eq!(stats.dictionaries_kept.load(SeqCst), 1);

    let digest = ring::digest::digest(&ring::digest::SHA256, v1.as_bytes());
    let have = format!(
        ":{}:",
        base64::engine::general_purpose::STANDARD.encode(digest)
    );
    let asked = [
        ("accept-encoding", "gzip, br, zstd, dcb, dcz"),
        ("available-dictionary", have.as_str()),
    ];
    let first = get(&w, "/v2.js", &asked).await;
    assert_eq!(first.header("content-encoding"), "gzip");
    fills_done(&w).await;
    // The first hit starts the representation; the ones after it are sent it.
    let mut sent = None;
    for _ in 0..500 {
        let got = get(&w, "/v2.js", &asked).await;
        if got.header("content-encoding") == "dcz" {
            sent = Some(got);
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let sent = sent.expect("a dcz representation");
    assert_eq!(&sent.body[..8], &[0x5e, 0x2a, 0x4d, 0x18, 0x20, 0, 0, 0]);
    assert_eq!(&sent.body[8..40], digest.as_ref());
    let mut decoded = Vec::new();
    let mut r =
        zstd::stream::read::Decoder::with_dictionary(&sent.body[40..], v1.as_bytes()).unwrap();
    std::io::Read::read_to_end(&mut r, &mut decoded).unwrap();
    assert_eq!(decoded, v2.as_bytes());
    let kept = &store.set(&key("/v2.js")).expect("stored").siblings;
    assert_eq!(kept.len(), 1);
    assert!(kept[0]
        .coding
        .as_deref()
        .is_some_and(|c| c.starts_with("dcz:")));
    // A response that says `no-transform` is never sent in a coding made for the client.
    for _ in 0..20 {
        let got = get(&w, "/fixed.js", &asked).await;
        assert_ne!(got.header("content-encoding"), "dcz");
        fills_done(&w).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The origin never saw the dictionary, and was asked once per file.
    assert_eq!(origin.count("/v2.js"), 1);
    assert!(origin
        .seen()
        .iter()
        .all(|s| !s.headers.contains_key("available-dictionary")));

    // Purged, it is let go when next looked for: v3 is not compressed against it.
    crate::store::CacheStore::invalidate(&store, &key("/v1.js")).unwrap();
    for _ in 0..3 {
        let got = get(&w, "/v3.js", &asked).await;
        assert_eq!(got.header("content-encoding"), "gzip");
        fills_done(&w).await;
    }
    assert_eq!(stats.dictionaries_dropped.load(SeqCst), 1);
    assert_eq!(stats.dictionaries_held.load(SeqCst), 0);
}

/// An object within `stale-while-revalidate` is served at once while one background fetch refreshes it.
#[tokio::test]
async fn stale_while_revalidate_serves_at_once_and_refreshes_once() {
    let n = counter();
    let gate = Arc::new(Notify::new());
    let script = {
        let (n, gate) = (n.clone(), gate.clone());
        move |_: &lacquer_tests::origin::Seen| {
            let version = n.fetch_add(1, SeqCst) + 1;
            let reply = Reply::ok(format!("version {version}"))
                .header("cache-control", "max-age=1, stale-while-revalidate=60")
                .header("etag", &format!("\"v{version}\""));
            if version == 1 {
                return reply;
            }
            // The refresh is held at the origin: the stale answers must not wait for it.
            let body = Bytes::from(format!("version {version}"));
            reply.steps(vec![Step::Gate(gate.clone()), Step::Data(body)], Some(9))
        }
    };
    let origin = Origin::start(script).await;
    let store = MemoryStore::new(4);
    let w = worker(&origin, &store);
    get(&w, "/s", &[]).await;
    fills_done(&w).await;
    store.age(&key("/s"), 2_000);

    for _ in 0..2 {
        let got = tokio::time::timeout(Duration::from_secs(2), get(&w, "/s", &[]))
            .await
            .expect("a stale answer does not wait for the origin");
        assert_eq!(got.x_cache(), "STALE");
        assert_eq!(got.body, "version 1");
        assert!(
            got.header("cache-status")
                .ends_with("detail=\"stale-while-revalidate\""),
            "{}",
            got.header("cache-status")
        );
    }
    origin_saw(&origin, 2).await;
    assert_eq!(origin.seen()[1].headers["if-none-match"], "\"v1\"");
    gate.notify_one();
    fills_done(&w).await;
    assert_eq!(origin.total(), 2, "one refresh for both stale answers");
    assert_eq!(w.shared.stats.stale_served.load(SeqCst), 2);

    let got = get(&w, "/s", &[]).await;
    assert_eq!(got.x_cache(), "HIT");
    assert_eq!(got.body, "version 2");
    assert_eq!(origin.total(), 2);
}

/// An object past freshness but within `stale-if-error` stands in for an origin that fails (5xx) or cannot
/// be reached, and says which.
#[tokio::test]
async fn stale_if_error_stands_in_for_a_failing_origin() {
    let n = counter();
    let script = {
        let n = n.clone();
        move |_: &lacquer_tests::origin::Seen| match n.fetch_add(1, SeqCst) {
            0 => Reply::ok("kept body")
                .header("cache-control", "max-age=1, stale-if-error=600")
                .header("etag", "\"k\""),
            _ => Reply::ok("down").status(503),
        }
    };
    let origin = Origin::start(script).await;
    let store = MemoryStore::new(4);
    let w = worker(&origin, &store);
    get(&w, "/e", &[]).await;
    fills_done(&w).await;
    store.age(&key("/e"), 2_000);

    let got = get(&w, "/e", &[]).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.body, "kept body");
    assert_eq!(got.x_cache(), "STALE");
    assert!(
        got.header("cache-status")
            .starts_with("lacquer; fwd=stale; fwd-status=503; ttl=-"),
        "{}",
        got.header("cache-status")
    );
    assert_eq!(origin.count("/e"), 2, "the origin was asked first");

    origin.stop();
    let got = get(&w, "/e", &[]).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.body, "kept body");
    assert!(
        got.header("cache-status")
            .ends_with("detail=\"origin-unreachable\""),
        "{}",
        got.header("cache-status")
    );
    assert_eq!(w.shared.stats.stale_on_error.load(SeqCst), 2);
    assert_eq!(
        store.variants(&key("/e"))[0].length,
        9,
        "the stale object is kept"
    );
}

/// A stale object with a validator is revalidated: the origin's 304 refreshes its headers and freshness,
/// and the stored body, not sent again, is what the client gets.
#[tokio::test]
async fn a_304_refreshes_the_stored_object_and_keeps_its_body() {
    let n = counter();
    let script = {
        let n = n.clone();
        move |_: &lacquer_tests::origin::Seen| match n.fetch_add(1, SeqCst) {
            0 => Reply::ok(pattern(50))
                .header("cache-control", "max-age=1")
                .header("etag", "\"e1\"")
                .header("x-version", "old"),
            _ => Reply::ok("")
                .status(304)
                .steps(vec![], None)
                .header("cache-control", "max-age=300")
                .header("etag", "\"e1\"")
                .header("x-version", "new"),
        }
    };
    let origin = Origin::start(script).await;
    let store = MemoryStore::new(16);
    let w = worker(&origin, &store);
    get(&w, "/r", &[]).await;
    fills_done(&w).await;
    let before = store.variants(&key("/r"))[0].clone();
    store.age(&key("/r"), 5_000);

    let got = get(&w, "/r", &[]).await;
    assert_eq!(
        got.status,
        StatusCode::OK,
        "the client asked unconditionally"
    );
    assert_eq!(got.body, pattern(50));
    assert_eq!(got.header("x-version"), "new");
    assert_eq!(got.header("content-length"), "50");
    let asked = &origin.seen()[1];
    assert_eq!(asked.headers["if-none-match"], "\"e1\"");
    fills_done(&w).await;
    assert_eq!(w.shared.stats.revalidations.load(SeqCst), 1);

    let after = store.variants(&key("/r"));
    assert_eq!(after.len(), 1);
    let after = &after[0];
    assert_eq!(after.generation, before.generation, "the same body");
    assert_eq!(after.length, 50);
    assert_eq!(after.ttl_ms, 300_000);
    assert!(after.stored_at_ms > before.stored_at_ms - 5_000);
    assert_eq!(after.header("x-version"), Some(&b"new"[..]));
    assert_eq!(store.published(), 1, "nothing new was written");

    let got = get(&w, "/r", &[]).await;
    assert_eq!(got.x_cache(), "HIT");
    assert_eq!(got.body, pattern(50));
    assert_eq!(origin.total(), 2);
}

/// A compressed object confirmed by a 304 is sent to an identity client as the decoded representation
/// on every shape of request: a range is of the decoded bytes (it was of the stored gzip bytes, labelled
/// identity), several ranges get the whole decoded body.
#[tokio::test]
async fn a_range_of_a_revalidated_compressed_object_is_of_the_decoded_bytes() {
    let text: Bytes = "<p>lacquer revalidated</p>\n".repeat(200).into();
    let served = text.clone();
    let origin = Origin::start(move |s: &lacquer_tests::origin::Seen| {
        if s.headers.contains_key("if-none-match") {
            Reply::ok("")
                .status(304)
                .steps(vec![], None)
                .header("cache-control", "max-age=1")
                .header("etag", "W/\"t\"")
        } else {
            Reply::ok(served.clone())
                .header("content-type", "text/html")
                .header("cache-control", "max-age=1")
                .header("etag", "\"t\"")
        }
    })
    .await;
    let store = MemoryStore::new(1024);
    let w = worker(&origin, &store);
    let gz = get(&w, "/t", &[("accept-encoding", "gzip")]).await;
    assert_eq!(gz.header("content-encoding"), "gzip");
    fills_done(&w).await;
    let len = text.len();
    for (range, status, want) in [
        ("bytes=5-20", StatusCode::PARTIAL_CONTENT, &text[5..=20]),
        ("bytes=5-20,1000-1100", StatusCode::OK, &text[..]),
    ] {
        store.age(&key("/t"), 5_000);
        let got = get(&w, "/t", &[("range", range)]).await;
        assert_eq!(got.status, status, "{range}");
        assert_eq!(got.header("content-encoding"), "", "{range}");
        assert_eq!(got.body, want, "{range}");
        assert_eq!(
            got.header("content-length"),
            want.len().to_string(),
            "{range}"
        );
        if status == StatusCode::PARTIAL_CONTENT {
            assert_eq!(got.header("content-range"), format!("bytes 5-20/{len}"));
        }
        fills_done(&w).await;
    }
    assert_eq!(w.shared.stats.revalidations.load(SeqCst), 2);
    assert_eq!(w.shared.stats.ranges_whole.load(SeqCst), 1);
}

/// A response that may not be stored is an answer for the request it was fetched for alone: concurrent
/// requests coalesced on its fetch each fetch for themselves, whether the origin sent it whole (200) or
/// confirmed a stale object with it (304). Before, a 304 carrying `Set-Cookie` gave every waiter the
/// leader's session cookie.
#[tokio::test]
async fn a_response_that_may_not_be_stored_is_not_shared_with_waiters() {
    const WAITERS: usize = 4;
    // Each "not storable" reason: the headers that give it, and the request headers that go with it.
    type Lines<'a> = &'a [(&'a str, &'a str)];
    let reasons: &[(&str, Lines<'_>, Lines<'_>)] = &[
        ("no-store", &[("cache-control", "no-store")], &[]),
        ("private", &[("cache-control", "private, max-age=60")], &[]),
        (
            "set-cookie",
            &[("cache-control", "max-age=60"), ("set-cookie", "sess=")],
            &[],
        ),
        (
            "authorization",
            &[("cache-control", "max-age=60")],
            &[("authorization", "Bearer t")],
        ),
        (
            "vary *",
            &[("cache-control", "max-age=60"), ("vary", "*")],
            &[],
        ),
        ("not fresh", &[("cache-control", "max-age=0")], &[]),
    ];
    for &(reason, refusing, request) in reasons {
        for revalidating in [false, true] {
            let n = counter();
            let script = {
                let n = n.clone();
                move |seen: &lacquer_tests::origin::Seen| {
                    let i = n.fetch_add(1, SeqCst);
                    // The first answer is a storable object to revalidate; every later one refuses storing,
                    // marked with its own number.
                    let reply = if revalidating && i == 0 {
                        Reply::ok("stored body")
                            .header("cache-control", "public, max-age=1")
                            .header("etag", "\"e1\"")
                    } else if seen.headers.contains_key("if-none-match") {
                        Reply::ok("").status(304).steps(vec![], None)
                    } else {
                        Reply::ok("fresh body")
                    };
                    let reply = reply.delay(Duration::from_millis(30));
                    if revalidating && i == 0 {
                        return reply;
                    }
                    let reply = refusing.iter().fold(reply, |r, (name, value)| {
                        let value = if *name == "set-cookie" {
                            format!("{value}{i}")
                        } else {
                            value.to_string()
                        };
                        r.header(name, &value)
                    });
                    reply.header("x-answer", &i.to_string())
                }
            };
            let origin = Origin::start(script).await;
            let store = MemoryStore::new(16);
            let w = worker_with(&origin, &store, |c| c.cache.cache_authorized = true);
            let case = format!("{reason}, revalidating: {revalidating}");
            let first = if revalidating {
                get(&w, "/s", request).await;
                fills_done(&w).await;
                store.age(&key("/s"), 5_000);
                1
            } else {
                0
            };

            let got =
                futures_util::future::join_all((0..WAITERS).map(|_| get(&w, "/s", request))).await;
            fills_done(&w).await;
            assert_eq!(
                origin.total() - first,
                WAITERS,
                "{case}: each request fetched for itself"
            );
            let mut answers: Vec<&str> = got.iter().map(|g| g.header("x-answer")).collect();
            answers.sort_unstable();
            answers.dedup();
            assert_eq!(answers.len(), WAITERS, "{case}: each got its own answer");
            for g in &got {
                assert_eq!(g.status, StatusCode::OK, "{case}");
                let body = if revalidating && g.headers.get("etag").is_some() {
                    "stored body"
                } else {
                    "fresh body"
                };
                assert_eq!(g.body, body, "{case}");
                if reason == "set-cookie" {
                    assert_eq!(
                        g.header("set-cookie"),
                        format!("sess={}", g.header("x-answer")),
                        "{case}: the cookie of the answer the client got"
                    );
                }
            }
        }
    }
}

/// A range spanning three chunks of a stored body reads only those chunks and answers 206 with exactly the
/// bytes asked for; a range of a body still arriving is cut from the fetch the same way.
#[tokio::test]
async fn a_range_across_chunk_boundaries() {
    let origin =
        Origin::start(|_| Reply::ok(pattern(100)).header("cache-control", "max-age=60")).await;
    let store = MemoryStore::new(10);
    let w = worker(&origin, &store);

    let got = get(&w, "/g", &[("range", "bytes=5-12")]).await;
    assert_eq!(got.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(got.x_cache(), "MISS");
    assert_eq!(got.header("content-range"), "bytes 5-12/100");
    assert_eq!(got.body, pattern(100)[5..=12]);
    assert!(
        !origin.seen()[0].headers.contains_key("range"),
        "a fill asks for the whole body"
    );
    fills_done(&w).await;
    store.take_reads();

    let got = get(&w, "/g", &[("range", "bytes=15-37")]).await;
    assert_eq!(got.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(got.x_cache(), "HIT");
    assert_eq!(got.header("content-range"), "bytes 15-37/100");
    assert_eq!(got.header("content-length"), "23");
    assert_eq!(got.header("accept-ranges"), "bytes");
    assert_eq!(got.body, pattern(100)[15..=37]);
    let reads: Vec<u32> = store.take_reads().into_iter().map(|(_, i)| i).collect();
    assert_eq!(
        reads,
        [0, 1, 2, 3],
        "chunk 0 proves the body, then the three the range spans"
    );

    let got = get(&w, "/g", &[("range", "bytes=90-")]).await;
    assert_eq!(got.header("content-range"), "bytes 90-99/100");
    assert_eq!(got.body, pattern(100)[90..]);
    assert_eq!(origin.total(), 1);
}

/// A ban that lands after a fill started, before the origin answered, keeps what the fill brings out of the
/// store: the next request goes to the origin again.
#[tokio::test]
async fn a_ban_during_a_fill_keeps_its_object_out_of_the_store() {
    let (origin, gate) =
        gated("HTTP/1.1 200 OK\r\ncache-control: max-age=60\r\ncontent-length: 6\r\n\r\nbanned")
            .await;
    let store = MemoryStore::new(4);
    let w = worker(&origin, &store);

    let first = tokio::spawn({
        let w = w.clone();
        async move { get(&w, "/b", &[]).await }
    });
    origin_saw(&origin, 1).await;
    store.ban(|primary, _| primary == key("/b"));
    gate.notify_one();
    let got = first.await.expect("the request task");
    assert_eq!(
        got.body, "banned",
        "the request that started the fill still gets its answer"
    );
    fills_done(&w).await;
    assert_eq!(store.publishes_cancelled(), 1);
    assert!(store.variants(&key("/b")).is_empty(), "nothing published");

    let again = tokio::spawn({
        let w = w.clone();
        async move { get(&w, "/b", &[]).await }
    });
    origin_saw(&origin, 2).await;
    gate.notify_one();
    let got = again.await.expect("the request task");
    assert_eq!(got.x_cache(), "MISS", "the banned body was not served");
    fills_done(&w).await;
    assert_eq!(
        store.variants(&key("/b")).len(),
        1,
        "a fill after the ban is stored"
    );
}

/// A ban that lands while the body streams in, after the store started taking it, discards it too.
#[tokio::test]
async fn a_ban_while_the_body_arrives_discards_the_body() {
    let gate = Arc::new(Notify::new());
    let held = gate.clone();
    let origin = Origin::start(move |_| {
        Reply::ok("").header("cache-control", "max-age=60").steps(
            vec![
                Step::Data(Bytes::from_static(b"0123456789")),
                Step::Gate(held.clone()),
                Step::Data(Bytes::from_static(b"abcdef")),
            ],
            Some(16),
        )
    })
    .await;
    let store = MemoryStore::new(4);
    let w = worker(&origin, &store);

    let first = tokio::spawn({
        let w = w.clone();
        async move { get(&w, "/m", &[]).await }
    });
    origin_saw(&origin, 1).await;
    // The first bytes are in: some chunks of the body are stored already.
    for _ in 0..500 {
        if w.shared.stats.bytes_in.load(SeqCst) >= 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    store.ban(|primary, meta| primary == key("/m") && meta.status == 200);
    gate.notify_one();
    assert_eq!(first.await.unwrap().body, "0123456789abcdef");
    fills_done(&w).await;
    assert_eq!(store.publishes_cancelled(), 1);
    assert!(store.variants(&key("/m")).is_empty());
    assert_eq!(store.chunks(), 0, "no chunk of it is left behind");
}

/// A purge while a fill waits for its origin keeps the fill's body out of the store, and a request after the
/// purge does not join the fetch from before it.
#[tokio::test]
async fn a_purge_during_a_fill_is_not_undone_by_it() {
    let (origin, gate) =
        gated("HTTP/1.1 200 OK\r\ncache-control: max-age=60\r\ncontent-length: 3\r\n\r\nold").await;
    let store = MemoryStore::new(4);
    let w = worker(&origin, &store);

    let before = tokio::spawn({
        let w = w.clone();
        async move { get(&w, "/p", &[]).await }
    });
    origin_saw(&origin, 1).await;
    store.purge(&key("/p"));
    let after = tokio::spawn({
        let w = w.clone();
        async move { get(&w, "/p", &[]).await }
    });
    origin_saw(&origin, 2).await;
    gate.notify_waiters();
    let (before, after) = (before.await.unwrap(), after.await.unwrap());
    assert_eq!(before.body, "old");
    assert_eq!(
        after.header("cache-status"),
        "lacquer; fwd=miss; stored",
        "a fetch of its own, not the one from before the purge"
    );
    fills_done(&w).await;
    assert_eq!(
        store.publishes_cancelled(),
        1,
        "the fill from before the purge"
    );
    assert_eq!(store.published(), 1, "the fill from after it");
}

/// An unsafe method that succeeds while a fill for its URL waits for the origin: the fill's body, fetched
/// before the change, is not stored after the invalidation (seen under load: the fill published after the
/// POST had removed nothing, and the next GET was a hit on the old body).
/// An invalidation of another key (a `POST` elsewhere on the site invalidates its own URL) leaves a fill in
/// flight joinable: coalescing holds. A purge of the key itself does not: later requests fetch again.
#[tokio::test]
async fn only_an_invalidation_that_may_cover_the_key_stops_newcomers_joining_its_fill() {
    let gate = Arc::new(Notify::new());
    let held = gate.clone();
    let origin = Origin::raw(move |_| {
        vec![
            Raw::Gate(held.clone()),
            Raw::write(
                "HTTP/1.1 200 OK\r\ncache-control: max-age=60\r\ncontent-length: 3\r\n\r\nold",
            ),
        ]
    })
    .await;
    let store = MemoryStore::new(4);
    let w = worker(&origin, &store);
    let request = |w: &Arc<Worker<MemoryStore>>| {
        let w = w.clone();
        tokio::spawn(async move { get(&w, "/p", &[]).await })
    };
    let first = request(&w);
    origin_saw(&origin, 1).await;
    store.purge(&key("/elsewhere"));
    let second = request(&w);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(origin.count("/p"), 1, "the second request joined the fill");
    store.purge(&key("/p"));
    let third = request(&w);
    origin_saw(&origin, 2).await;
    gate.notify_waiters();
    for r in [first, second, third] {
        assert_eq!(r.await.unwrap().body, "old");
    }
    assert_eq!(
        origin.count("/p"),
        2,
        "after a purge of /p, a fetch of its own"
    );
}

#[tokio::test]
async fn a_post_during_a_fill_is_not_undone_by_it() {
    let gate = Arc::new(Notify::new());
    let held = gate.clone();
    let origin = Origin::raw(move |seen| match seen.method.as_str() {
        "POST" => vec![Raw::write("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")],
        _ => vec![
            Raw::Gate(held.clone()),
            Raw::write(
                "HTTP/1.1 200 OK\r\ncache-control: max-age=60\r\ncontent-length: 3\r\n\r\nold",
            ),
        ],
    })
    .await;
    let store = MemoryStore::new(4);
    let w = worker(&origin, &store);
    let before = tokio::spawn({
        let w = w.clone();
        async move { get(&w, "/p", &[]).await }
    });
    origin_saw(&origin, 1).await;
    let mut post = parts("/p", &[]);
    post.method = http::Method::POST;
    let route = w.shared.live.load().router.route(&post).clone();
    let mut txn = looked_up(&w, CLIENT, route, Decided::default(), post);
    txn.class = lacquer_policy::request::RequestClass::Invalidate;
    let body = lacquer_backends::body::empty();
    let resp = crate::flow::steps(&w, &mut txn, Next::Pass(body)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    gate.notify_waiters();
    assert_eq!(before.await.unwrap().body, "old");
    fills_done(&w).await;
    assert_eq!(
        (store.published(), store.publishes_cancelled()),
        (0, 1),
        "the fill from before the POST is not stored"
    );
}

/// A stored body missing a chunk is never served short: the request is a miss, the origin sends the body
/// again, and the damaged copy is replaced.
#[tokio::test]
async fn a_body_missing_a_chunk_is_fetched_again() {
    let origin =
        Origin::start(|_| Reply::ok(pattern(40)).header("cache-control", "max-age=60")).await;
    let store = MemoryStore::new(8);
    let w = worker(&origin, &store);
    get(&w, "/l", &[]).await;
    fills_done(&w).await;
    let lost = store.variants(&key("/l"))[0].generation;
    store.lose_chunk(lost, 3);

    let got = get(&w, "/l", &[]).await;
    assert_eq!(got.x_cache(), "MISS");
    assert_eq!(got.body, pattern(40));
    assert_eq!(origin.count("/l"), 2);
    assert_eq!(w.shared.stats.bodies_lost.load(SeqCst), 1);
    fills_done(&w).await;
    let stored = store.variants(&key("/l"));
    assert_eq!(stored.len(), 1);
    assert_ne!(stored[0].generation, lost, "the damaged body is gone");
    assert_eq!(get(&w, "/l", &[]).await.x_cache(), "HIT");
}

/// Two ranges of a stored body, each across a chunk boundary, answered as `multipart/byteranges`.
#[tokio::test]
async fn several_ranges_of_a_stored_body_are_a_multipart_answer() {
    let origin = Origin::start(|_| {
        Reply::ok(pattern(100))
            .header("cache-control", "max-age=60")
            .header("content-type", "application/octet-stream")
    })
    .await;
    let store = MemoryStore::new(10);
    let w = worker(&origin, &store);
    get(&w, "/mp", &[]).await;
    fills_done(&w).await;

    let got = get(&w, "/mp", &[("range", "bytes=8-12,95-")]).await;
    assert_eq!(got.status, StatusCode::PARTIAL_CONTENT);
    let boundary = got
        .header("content-type")
        .strip_prefix("multipart/byteranges; boundary=")
        .expect("a multipart answer")
        .to_owned();
    let mut want = Vec::new();
    for (first, last) in [(8, 12), (95, 99)] {
        want.extend_from_slice(
            format!(
                "\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\
                 Content-Range: bytes {first}-{last}/100\r\n\r\n"
            )
            .as_bytes(),
        );
        want.extend_from_slice(&pattern(100)[first..=last]);
    }
    want.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    assert!(got.body == want, "{:?}", got.body);
    assert_eq!(got.header("content-length"), want.len().to_string());
    assert_eq!(origin.total(), 1);
}

/// The chunk indexes the store was asked for since the last call, in order.
fn chunk_reads(store: &MemoryStore) -> Vec<u32> {
    store.take_reads().into_iter().map(|(_, i)| i).collect()
}

/// The next data frame of `body`, which must have one.
async fn next_data(body: &mut Body) -> Bytes {
    body.frame()
        .await
        .expect("a frame")
        .expect("no error")
        .into_data()
        .expect("data")
}

const CHUNK: usize = 256 * 1024;

/// Chunks asked for ahead of the one being sent.
const AHEAD: u32 = (crate::respond::READ_AHEAD / CHUNK as u64) as u32;

/// A worker whose store holds `/big`: 9 chunks of [`CHUNK`] bytes (the last one short).
async fn stored_big_body() -> (Origin, MemoryStore, Arc<Worker<MemoryStore>>, Vec<u8>) {
    let body = pattern(8 * CHUNK + 100);
    let served = body.clone();
    let origin =
        Origin::start(move |_| Reply::ok(served.clone()).header("cache-control", "max-age=60"))
            .await;
    let store = MemoryStore::new(CHUNK as u64);
    let w = worker(&origin, &store);
    assert!(get(&w, "/big", &[]).await.body == body);
    fills_done(&w).await;
    store.take_reads();
    (origin, store, w, body)
}

/// While one chunk of a stored body is sent, the store is already asked for the next `READ_AHEAD` bytes,
/// never more: each chunk once, in order. The stream lets go of its thread before every chunk, so the
/// connection writes the head, then each chunk, before it takes the next.
#[tokio::test]
async fn a_stored_body_is_read_ahead_of_what_is_sent_and_no_further() {
    assert_eq!(AHEAD, 2);
    let (_origin, store, w, body) = stored_big_body().await;
    let resp = respond(&w, "/big", &[]).await;
    assert_eq!(resp.headers()["x-cache"], "HIT");
    assert_eq!(chunk_reads(&store), [0], "chunk 0 proves the body");
    let mut stream = resp.into_body();
    let mut got = Vec::new();
    for index in 0..9u32 {
        assert!(
            stream.frame().now_or_never().is_none(),
            "the stream yields before chunk {index}"
        );
        got.extend_from_slice(&next_data(&mut stream).await);
        let want: Vec<u32> = if index == 0 {
            (1..=AHEAD).collect()
        } else {
            (index + AHEAD..=8).take(1).collect()
        };
        assert_eq!(chunk_reads(&store), want, "asked for after chunk {index}");
    }
    assert!(stream.frame().await.is_none(), "the end");
    assert!(got == body, "every byte, in order");
}

/// A client that leaves mid-body stops the reads: nothing past what was asked for ahead is read.
#[tokio::test]
async fn a_client_that_leaves_stops_the_read_ahead() {
    let (_origin, store, w, body) = stored_big_body().await;
    let mut stream = respond(&w, "/big", &[]).await.into_body();
    assert!(next_data(&mut stream).await == body[..CHUNK]);
    assert!(next_data(&mut stream).await == body[CHUNK..2 * CHUNK]);
    assert_eq!(chunk_reads(&store), [0, 1, 2, 3]);
    drop(stream);
    tokio::task::yield_now().await;
    assert_eq!(
        chunk_reads(&store),
        [] as [u32; 0],
        "no read after the client left"
    );
}

/// A range in the middle of a stored body reads chunk 0 (the proof) and the chunks the range spans, ahead
/// of sending them, and nothing else.
#[tokio::test]
async fn a_range_in_the_middle_reads_ahead_only_its_own_chunks() {
    let (_origin, store, w, body) = stored_big_body().await;
    let (first, last) = (CHUNK + 10, 4 * CHUNK + 5);
    let got = get(&w, "/big", &[("range", &format!("bytes={first}-{last}"))]).await;
    assert_eq!(got.status, StatusCode::PARTIAL_CONTENT);
    assert!(got.body == body[first..=last], "exactly the range");
    assert_eq!(chunk_reads(&store), [0, 1, 2, 3, 4]);
}

/// A chunk lost while the body is sent ends the response with an error after exactly the bytes before it,
/// never a short body taken for whole, and the body is not served again.
#[tokio::test]
async fn a_chunk_lost_mid_body_ends_the_response_with_an_error() {
    let (origin, store, w, body) = stored_big_body().await;
    let mut stream = respond(&w, "/big", &[]).await.into_body();
    let mut got = next_data(&mut stream).await.to_vec();
    let generation = store.variants(&key("/big"))[0].generation;
    store.lose_chunk(generation, 5);
    let error = loop {
        match stream.frame().await.expect("an error before the end") {
            Ok(frame) => got.extend_from_slice(&frame.into_data().expect("data")),
            Err(e) => break e,
        }
    };
    assert!(error.to_string().contains("chunk 5"), "{error}");
    assert!(got == body[..5 * CHUNK], "the bytes before the lost chunk");
    assert!(stream.frame().await.is_none(), "nothing after the error");
    assert_eq!(get(&w, "/big", &[]).await.x_cache(), "MISS");
    assert_eq!(origin.count("/big"), 2);
}

/// A body of one chunk costs what it did before read-ahead: its stream reads nothing past the chunk that
/// proved the body and never yields, so the head and the body leave in one write.
#[tokio::test]
async fn a_one_chunk_body_is_sent_at_once() {
    let origin =
        Origin::start(|_| Reply::ok(pattern(1000)).header("cache-control", "max-age=60")).await;
    let store = MemoryStore::new(CHUNK as u64);
    let w = worker(&origin, &store);
    get(&w, "/one", &[]).await;
    fills_done(&w).await;
    store.take_reads();
    let mut stream = respond(&w, "/one", &[]).await.into_body();
    let frame = stream.frame().now_or_never().expect("ready at once");
    let data = frame
        .expect("a frame")
        .expect("no error")
        .into_data()
        .expect("data");
    assert!(data == pattern(1000));
    assert!(stream.frame().now_or_never().expect("ready").is_none());
    assert_eq!(chunk_reads(&store), [0], "only the proof");
}

/// A cluster node that finishes catching up at the first look at whether it vouches: the invalidation it
/// applies just before (a ban of `key`) is one a lookup already under way may not have seen.
struct CaughtUpDuringTheLookup {
    store: MemoryStore,
    key: String,
    caught_up: std::sync::atomic::AtomicBool,
}

impl crate::cluster::Cluster for CaughtUpDuringTheLookup {
    fn vouched(&self) -> bool {
        if !self.caught_up.swap(true, SeqCst) {
            let key = self.key.clone();
            self.store.ban(move |primary, _| primary == key);
        }
        true
    }

    fn invalidate(&self, _: crate::cluster::Invalidation) -> crate::cluster::InvalidateFuture<'_> {
        unreachable!("the test sends no invalidation")
    }

    fn owner(&self, _: &str) -> Option<crate::cluster::Peer> {
        None
    }

    fn forward_proof(&self, _: &Parts) -> http::HeaderValue {
        unreachable!("nothing is routed to a peer")
    }

    fn forwarded_by_member(&self, _: &http::HeaderValue, _: &http::HeaderValue, _: &Parts) -> bool {
        false
    }

    fn node(&self) -> &str {
        "n1"
    }

    fn view(&self) -> lacquer_admin::wire::ClusterView {
        unreachable!("the admin API is not asked")
    }
}

/// Whether the node vouches is read before the store: read after, a node that caught up in between (an
/// invalidation applied, then vouching) would vouch for what the lookup found before the invalidation.
#[tokio::test]
async fn a_lookup_vouched_for_saw_every_invalidation_applied_before() {
    let version = Arc::new(AtomicUsize::new(0));
    let v = version.clone();
    let origin = Origin::start(move |_| {
        let n = v.fetch_add(1, SeqCst) + 1;
        Reply::ok(format!("v{n}")).header("cache-control", "max-age=60")
    })
    .await;
    let store = MemoryStore::new(1024);
    let single = worker(&origin, &store);
    assert_eq!(get(&single, "/x", &[]).await.body, "v1");
    fills_done(&single).await;
    let cluster = Arc::new(CaughtUpDuringTheLookup {
        store: store.clone(),
        key: key("/x"),
        caught_up: false.into(),
    });
    let member = worker_of(&origin, &store, |_| {}, Some(cluster));
    let got = get(&member, "/x", &[]).await;
    assert_eq!(
        got.body,
        "v2",
        "{}: the banned object was served",
        got.x_cache()
    );
    assert_eq!(origin.total(), 2);
}

/// A GET for `path` on [`HOST`] as `answer` takes it: the request phase (rules included), the lookup and
/// the deliver phase.
async fn get_ruled(w: &Arc<Worker<MemoryStore>>, path: &str, headers: &[(&str, &str)]) -> Got {
    let mut parts = parts(path, headers);
    let admitted = {
        let live = w.shared.live.load();
        crate::phase::request(&live, &mut parts, CLIENT, false, None, None)
    };
    let Ok(admitted) = admitted else {
        panic!("answered by the request phase");
    };
    let mut txn = looked_up(w, CLIENT, admitted.route, admitted.decided, parts);
    let resp = crate::flow::steps(w, &mut txn, Next::Lookup { again: false }).await;
    let (head, body) = resp.into_parts();
    let body = body.collect().await.expect("a whole body").to_bytes();
    Got {
        status: head.status,
        headers: head.headers,
        body,
    }
}

fn rules(text: &str) -> impl FnOnce(&mut Config) + '_ {
    move |c| c.rule = Config::parse(text, "test").expect("rules parse").rule
}

/// A bucket rule rewrites the request field and keys on it: the origin sees the bucket, each bucket is its
/// own object, and no client's own spelling selects another bucket's answer.
#[tokio::test]
async fn a_rewritten_and_keyed_field_is_what_the_origin_saw_and_what_selects() {
    let origin = Origin::start(|seen| {
        let lang = seen.headers["accept-language"].to_str().unwrap().to_owned();
        Reply::ok(format!("in {lang}")).header("cache-control", "max-age=60")
    })
    .await;
    let store = MemoryStore::new(4);
    let w = worker_with(
        &origin,
        &store,
        rules(
            r#"
            [[rule]]
            buckets = [{ from = "accept-language", cases = [["fr", "^fr"]], default = "en" }]
            key = ["accept-language"]
            [[rule]]
            on = "deliver"
            set_headers = { "x-served-by" = "lacquer" }
            "#,
        ),
    );
    let fr = get_ruled(&w, "/l", &[("accept-language", "fr-CA,fr;q=0.9")]).await;
    assert_eq!(fr.body, "in fr");
    assert_eq!(fr.header("x-served-by"), "lacquer");
    fills_done(&w).await;
    let en = get_ruled(&w, "/l", &[("accept-language", "de")]).await;
    assert_eq!(en.body, "in en", "another bucket is another object");
    fills_done(&w).await;
    let fr_again = get_ruled(&w, "/l", &[("accept-language", "fr")]).await;
    assert_eq!(
        (fr_again.x_cache(), &fr_again.body[..]),
        ("HIT", &b"in fr"[..])
    );
    let asked: Vec<_> = origin
        .seen()
        .iter()
        .map(|s| s.headers["accept-language"].clone())
        .collect();
    assert_eq!(
        asked,
        ["fr", "en"],
        "the origin saw the buckets, never the clients' values"
    );
    assert_eq!(store.variants(&key("/l")).len(), 2);
}

/// A backend-request rule that changes a field the response varies on would store an answer under a
/// value the origin never saw: it is served, and not stored.
#[tokio::test]
async fn a_response_varying_on_a_field_a_backend_request_rule_changed_is_not_stored() {
    let origin = Origin::start(|seen| {
        let v = seen
            .headers
            .get("x-tier")
            .map_or("none".to_owned(), |v| v.to_str().unwrap().to_owned());
        Reply::ok(format!("tier {v}"))
            .header("cache-control", "max-age=60")
            .header("vary", "X-Tier")
    })
    .await;
    let store = MemoryStore::new(4);
    let w = worker_with(
        &origin,
        &store,
        rules(
            r#"
            [[rule]]
            on = "backend_request"
            set_headers = { "x-tier" = "gold" }
            "#,
        ),
    );
    let got = get_ruled(&w, "/t", &[("x-tier", "free")]).await;
    assert_eq!(got.body, "tier gold");
    fills_done(&w).await;
    assert!(
        store.variants(&key("/t")).is_empty(),
        "not stored under x-tier: free"
    );
    let again = get_ruled(&w, "/t", &[("x-tier", "free")]).await;
    assert_eq!(again.x_cache(), "MISS");
    assert_eq!(origin.count("/t"), 2);
}

/// Backend-response rules act before the store decides: a forced `Cache-Control` stores what the origin
/// marked `no-store`, a negative TTL stores a 404, and `store = false` keeps a response out.
#[tokio::test]
async fn backend_response_rules_decide_what_is_stored_and_for_how_long() {
    let origin = Origin::start(|seen| match seen.path.as_str() {
        "/api/u" => Reply::ok("user").header("cache-control", "no-store"),
        "/missing" => Reply::ok("gone").status(404),
        _ => Reply::ok("big").header("cache-control", "max-age=60"),
    })
    .await;
    let store = MemoryStore::new(4);
    let w = worker_with(
        &origin,
        &store,
        rules(
            r#"
            [[rule]]
            on = "backend_response"
            match = { path_prefix = ["/api/"] }
            set_headers = { "cache-control" = "max-age=300" }
            [[rule]]
            on = "backend_response"
            match = { status = [404] }
            ttl = "15s"
            [[rule]]
            on = "backend_response"
            match = { path_prefix = ["/video/"] }
            store = false
            "#,
        ),
    );
    for path in ["/api/u", "/missing", "/video/a"] {
        get_ruled(&w, path, &[]).await;
        fills_done(&w).await;
    }
    let api = store.variants(&key("/api/u"));
    assert_eq!(api.len(), 1);
    assert_eq!(api[0].ttl_ms, 300_000);
    let missing = store.variants(&key("/missing"));
    assert_eq!((missing[0].status, missing[0].ttl_ms), (404, 15_000));
    assert!(store.variants(&key("/video/a")).is_empty());
    assert_eq!(get_ruled(&w, "/api/u", &[]).await.x_cache(), "HIT");
}

/// Building the live settings runs every rule's examples through the phases: right ones pass, a wrong one
/// fails naming the rule, the example and what came out instead.
#[test]
fn rules_examples_run_when_the_settings_are_built() {
    let build = |text: &str| {
        let mut config = Config::parse(text, "test").expect("parses");
        config.backend[0].address = Some("127.0.0.1:1".into());
        let backends = backend_set(&config).expect("backends");
        Live::new(&config, &backends).map(drop)
    };
    let good = r#"
        [[rule]]
        name = "old"
        match = { hosts = ["old.test"], path_regex = "^/(.*)$" }
        respond = { status = 301, location = "https://new.test/$1" }
        examples = [{ request = { url = "http://old.test/a?b" }, expect = { status = 301, response_headers = { location = "https://new.test/a?b" } } }]
        [[rule]]
        name = "proto"
        set_headers = { "x-forwarded-proto" = "${scheme}" }
        key = ["x-forwarded-proto"]
        examples = [{ request = { url = "http://a.test/" }, expect = { key = ["x-forwarded-proto"], headers = { "x-forwarded-proto" = "http" } } }]
        [[rule]]
        name = "negative"
        on = "backend_response"
        match = { status = [404] }
        ttl = "15s"
        examples = [{ request = { url = "http://a.test/x" }, response = { status = 404 }, expect = { stored = true, ttl = "15s" } }]
    "#;
    build(good).expect("the examples hold");
    let wrong = good.replace(r#"ttl = "15s" } }]"#, r#"ttl = "20s" } }]"#);
    let err = build(&wrong).expect_err("a wrong example").to_string();
    assert!(
        err.contains(r#"rule[2] ("negative").examples[0]"#)
            && err.contains("ttl: expected \"20s\", got \"15s\""),
        "{err}"
    );
    let wrong = good.replace(
        "location = \"https://new.test/a?b\"",
        "location = \"https://new.test/\"",
    );
    let err = build(&wrong).expect_err("a wrong redirect").to_string();
    assert!(err.contains("response header location"), "{err}");
    // A rule's grace holds under `s-maxage` and is voided by `must-revalidate`: an example that expects
    // it there fails, naming the directive.
    let graced = r#"
        [[rule]]
        name = "grace"
        on = "backend_response"
        grace = "3d"
        examples = [{ request = { url = "http://a.test/p" }, response = { headers = { cache-control = "public, max-age=60, s-maxage=60" } }, expect = { grace = "3d" } }]
    "#;
    build(graced).expect("grace under s-maxage");
    let err = build(&graced.replace("s-maxage=60", "must-revalidate"))
        .expect_err("voided grace")
        .to_string();
    assert!(
        err.contains("grace: expected \"259200s\", got \"0s (the origin's must-revalidate forbids serving it stale)\""),
        "{err}"
    );
}

/// A sliced route against the in-memory store: a range costs its slice, the whole is made of the stored
/// slice and the others fetched once each, and a later whole read is all from the store.
#[tokio::test]
async fn a_sliced_object_is_assembled_from_its_parts() {
    let origin = Origin::start(|seen| lacquer_tests::ranged(seen, 100, 0, "\"s\"")).await;
    let store = MemoryStore::new(10);
    let w = worker_with(&origin, &store, |c| {
        c.storage.chunk_size = bytesize::ByteSize::b(10);
        c.cache.max_sliced_object_size = bytesize::ByteSize::b(1000);
        c.route.push(lacquer_config::Route {
            slice: Some(bytesize::ByteSize::b(40)),
            ..lacquer_config::Route::default()
        });
    });
    let got = get(&w, "/s", &[("range", "bytes=45-50")]).await;
    assert_eq!(got.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(got.header("content-range"), "bytes 45-50/100");
    assert_eq!(got.body, pattern(100)[45..=50]);
    fills_done(&w).await;
    let set = store.set(&key("/s")).expect("stored");
    let partial = set.partial(set.variants[0].generation).expect("in parts");
    assert_eq!(partial.total, 100);
    assert_eq!(
        partial
            .parts
            .iter()
            .map(|p| (p.start, p.body.length))
            .collect::<Vec<_>>(),
        [(40, 40)]
    );

    let got = get(&w, "/s", &[]).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.header("content-length"), "100");
    assert_eq!(got.body, pattern(100));
    fills_done(&w).await;
    let mut asked: Vec<String> = origin
        .seen()
        .iter()
        .map(|s| s.headers["range"].to_str().unwrap().to_owned())
        .collect();
    asked.sort();
    assert_eq!(asked, ["bytes=0-39", "bytes=40-79", "bytes=80-119"]);

    let got = get(&w, "/s", &[]).await;
    assert_eq!(
        (got.x_cache(), got.body.clone()),
        ("HIT", Bytes::from(pattern(100)))
    );
    assert_eq!(origin.total(), 3, "the whole from its stored parts");
}

/// A route without `slice` against the in-memory store: a range far in is forwarded and its 206 stored as
/// a part, a range within it is a hit, and the whole is the part and the gap before it, asked for once with
/// `If-Range`; then all of it is stored.
#[tokio::test]
async fn a_forwarded_range_is_stored_and_completed_by_the_gap_before_it() {
    let origin = Origin::start(|seen| lacquer_tests::ranged(seen, 100, 0, "\"f\"")).await;
    let store = MemoryStore::new(10);
    let w = worker_with(&origin, &store, |c| {
        c.storage.chunk_size = bytesize::ByteSize::b(10);
        c.cache.forward_ranges_from = bytesize::ByteSize::b(50);
    });
    let near = get(&w, "/n", &[("range", "bytes=10-19")]).await;
    assert_eq!(near.body, pattern(100)[10..20]);
    let got = get(&w, "/f", &[("range", "bytes=60-99")]).await;
    assert_eq!(got.status, StatusCode::PARTIAL_CONTENT);
    assert_eq!(got.header("content-range"), "bytes 60-99/100");
    assert_eq!(got.body, pattern(100)[60..]);
    fills_done(&w).await;
    let set = store.set(&key("/f")).expect("stored");
    let partial = set.partial(set.variants[0].generation).expect("in parts");
    assert_eq!((partial.total, partial.parts.len()), (100, 1));
    assert_eq!(
        (partial.parts[0].start, partial.parts[0].body.length),
        (60, 40)
    );

    let within = get(&w, "/f", &[("range", "bytes=-5")]).await;
    assert_eq!(
        (within.x_cache(), &within.body[..]),
        ("HIT", &pattern(100)[95..])
    );
    let whole = get(&w, "/f", &[]).await;
    assert_eq!(
        (whole.status, whole.body.clone()),
        (StatusCode::OK, Bytes::from(pattern(100)))
    );
    fills_done(&w).await;
    let asked: Vec<(String, String)> = origin
        .seen()
        .iter()
        .map(|s| {
            let field = |name| {
                s.headers
                    .get(name)
                    .map_or("", |v| v.to_str().unwrap())
                    .to_owned()
            };
            (field("range"), field("if-range"))
        })
        .collect();
    assert_eq!(
        asked,
        [
            (String::new(), String::new()),
            ("bytes=60-99".into(), String::new()),
            ("bytes=0-59".into(), "\"f\"".into()),
        ],
        "near the start the whole; far in the range; then the gap, if still the same version"
    );
    let set = store.set(&key("/f")).expect("stored");
    assert!(set
        .partial(set.variants[0].generation)
        .unwrap()
        .is_complete());
    let again = get(&w, "/f", &[]).await;
    assert_eq!((again.x_cache(), again.body.len()), ("HIT", 100));
    assert_eq!(origin.total(), 3);
}

/// An origin serving a `len`-byte text object that honours ranges, at version `version` (its entity-tag
/// and byte shift); `date_as_modified` sends no entity-tag and a `Last-Modified` equal to its `Date`.
async fn versioned_text(len: u64, version: Arc<AtomicUsize>, date_as_modified: bool) -> Origin {
    Origin::start(move |seen| {
        let v = version.load(SeqCst) as u64;
        let etag = if date_as_modified {
            String::new()
        } else {
            format!("\"v{v}\"")
        };
        let mut reply = lacquer_tests::ranged(seen, len, v * 7, &etag);
        reply.headers.retain(|(n, _)| n != "content-type");
        reply = reply.header("content-type", "text/plain");
        if date_as_modified {
            let now = httpdate::fmt_http_date(std::time::SystemTime::now());
            reply = reply.header("date", &now).header("last-modified", &now);
        }
        reply
    })
    .await
}

/// What `origin` was asked for: each request's `Range` (empty for the whole).
fn ranges_seen(origin: &Origin) -> Vec<String> {
    origin
        .seen()
        .iter()
        .map(|s| {
            s.headers
                .get("range")
                .map_or("", |v| v.to_str().unwrap())
                .to_owned()
        })
        .collect()
}

/// A body cut up by many small ranges is not completed a gap at a time: the whole is fetched once.
#[tokio::test]
async fn a_body_of_many_small_parts_is_fetched_whole_not_gap_by_gap() {
    let origin = Origin::start(|seen| lacquer_tests::ranged(seen, 100, 0, "\"m\"")).await;
    let store = MemoryStore::new(10);
    let w = worker_with(&origin, &store, |c| {
        c.storage.chunk_size = bytesize::ByteSize::b(10);
        c.cache.forward_ranges_from = bytesize::ByteSize::b(0);
    });
    for at in [10, 25, 40, 55, 70, 85] {
        let range = format!("bytes={at}-{at}");
        let got = get(&w, "/m", &[("range", &range)]).await;
        assert_eq!(got.body, pattern(100)[at..=at]);
        fills_done(&w).await;
    }
    let whole = get(&w, "/m", &[]).await;
    assert_eq!(
        (whole.status, whole.body.clone()),
        (StatusCode::OK, Bytes::from(pattern(100)))
    );
    assert_eq!(origin.total(), 7, "six ranges, then the whole once");
    assert_eq!(ranges_seen(&origin)[6], "");
}

/// A gap whose `If-Range` no longer holds brings the new version whole, compressed for the store: a client
/// that takes no coding gets it decoded, as any miss.
#[tokio::test]
async fn the_whole_fetched_for_a_gap_leaves_in_a_coding_the_client_takes() {
    let version = Arc::new(AtomicUsize::new(0));
    let origin = versioned_text(4000, version.clone(), false).await;
    let store = MemoryStore::new(10);
    let w = worker_with(&origin, &store, |c| {
        c.cache.forward_ranges_from = bytesize::ByteSize::b(1000);
    });
    let part = get(&w, "/t", &[("range", "bytes=3000-3099")]).await;
    assert_eq!(part.status, StatusCode::PARTIAL_CONTENT);
    fills_done(&w).await;
    version.store(1, SeqCst);
    let whole = get(&w, "/t", &[]).await;
    assert_eq!(whole.status, StatusCode::OK);
    assert_eq!(whole.header("content-encoding"), "");
    let want: Vec<u8> = (0..4000u64).map(|i| ((i + 7) % 251) as u8).collect();
    assert_eq!(whole.body, want, "the new version, decoded");
    assert_eq!(ranges_seen(&origin), ["bytes=3000-3099", "bytes=0-2999"]);
}

/// A `Last-Modified` no older than its `Date` proves nothing: parts that carry only it are never joined
/// (the object may have changed within that second), and the whole is fetched instead.
#[tokio::test]
async fn parts_with_only_a_weak_last_modified_are_never_joined() {
    let version = Arc::new(AtomicUsize::new(0));
    let origin = versioned_text(100, version.clone(), true).await;
    let store = MemoryStore::new(10);
    let w = worker_with(&origin, &store, |c| {
        c.storage.chunk_size = bytesize::ByteSize::b(10);
        c.cache.forward_ranges_from = bytesize::ByteSize::b(50);
    });
    let part = get(&w, "/w", &[("range", "bytes=60-99")]).await;
    assert_eq!(part.body, pattern(100)[60..]);
    fills_done(&w).await;
    version.store(1, SeqCst);
    let whole = get(&w, "/w", &[("accept-encoding", "identity")]).await;
    let want: Vec<u8> = (0..100u64).map(|i| ((i + 7) % 251) as u8).collect();
    assert_eq!(
        whole.body, want,
        "one version, never the old part after new bytes"
    );
    let seen = origin.seen();
    assert!(
        seen[1].headers.get("if-range").is_none(),
        "nothing to send as If-Range"
    );
    assert_eq!(ranges_seen(&origin), ["bytes=60-99", "bytes=0-59", ""]);
}

/// The size of what `f` returns, a future, without making one.
fn future_size<A, F: std::future::Future>(_: impl FnOnce(A) -> F) -> usize {
    std::mem::size_of::<F>()
}

/// The request flow's futures, measured (bench/RESULTS.md records them beside the flow's before): the edge
/// boxes the whole request's once, and every step's lives inside it, so a step that grows makes every
/// request's allocation grow.
#[test]
fn the_flow_futures_sizes() {
    type Service = crate::worker::Worker;
    let call = future_size(
        |(w, req, client): (
            Arc<Service>,
            Request<lacquer_edge::RequestBody>,
            lacquer_edge::Client,
        )| { lacquer_edge::Service::call(w, req, client, None) },
    );
    let steps = future_size(|(w, txn): (Arc<Worker<MemoryStore>>, Txn)| async move {
        let mut txn = txn;
        crate::flow::steps(&w, &mut txn, Next::Lookup { again: false }).await
    });
    let fill = future_size(
        |(w, f, fill): (
            Arc<Worker<MemoryStore>>,
            Arc<crate::coalesce::Fetch<MemoryStore>>,
            crate::fetch::Fill,
        )| { crate::prefetch::fill(w, f, fill) },
    );
    println!(
        "futures: Service::call {call} B, the steps of one request {steps} B, a fill task {fill} B"
    );
    // Hyper's client future (ten kilobytes) is boxed where a step sends to the origin: unboxed, every
    // request's future and every fill task carried it, copied whole into their memory (13 KB and 12 KB).
    // A tripwire for a step that grows by kilobytes again (sizes of a debug build; a release's are smaller).
    assert!(call < 8 * 1024, "Service::call's future is {call} B");
    assert!(fill < 8 * 1024, "a fill task's future is {fill} B");
}

/// The modules a source file of this crate imports: every `crate::`, `super::` and (in a `mod.rs`)
/// `self::` path, groups included, resolved to the longest prefix that is a module of its own file.
fn imports(module: &str, text: &str, modules: &std::collections::BTreeSet<String>) -> Vec<String> {
    let code: String = text
        .split("#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or_default()
        .lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
    let mut paths = Vec::new();
    let bases = [("crate::", ""), ("super::", parent), ("self::", module)];
    for (prefix, base) in bases {
        for (at, _) in code.match_indices(prefix) {
            let word_start =
                at == 0 || !code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_');
            if word_start {
                expand(base, &code[at + prefix.len()..], &mut paths);
            }
        }
    }
    let mut found: Vec<String> = paths
        .iter()
        .filter_map(|path| {
            let parts: Vec<&str> = path.split("::").collect();
            (1..=parts.len())
                .rev()
                .map(|n| parts[..n].join("::"))
                .find(|candidate| modules.contains(candidate))
        })
        .filter(|m| m != module)
        .collect();
    found.sort();
    found.dedup();
    found
}

/// The paths `rest` (what follows `crate::` or the like) names, each joined to `base`: `a::b`, or each of
/// the group in `a::{b, c::{d, e}}`.
fn expand(base: &str, rest: &str, out: &mut Vec<String>) {
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(rest.len());
    let path = &rest[..end];
    let joined = match (base, path.trim_end_matches(':')) {
        (b, "") => b.to_owned(),
        ("", p) => p.to_owned(),
        (b, p) => format!("{b}::{p}"),
    };
    let Some(group) = rest[end..]
        .strip_prefix('{')
        .filter(|_| path.is_empty() || path.ends_with("::"))
    else {
        if !path.is_empty() {
            out.push(joined);
        }
        return;
    };
    let (mut depth, mut item) = (0, String::new());
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                expand(&joined, item.trim(), out);
                item.clear();
                continue;
            }
            _ => {}
        }
        item.push(c);
    }
    expand(&joined, item.trim(), out);
}

/// The crate's files import no module that imports them back, through any chain: each concern can be read,
/// and changed, from its own imports down (issue 42 found eleven files in one circle).
#[test]
fn no_module_imports_one_that_imports_it_back() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&root).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            for inner in std::fs::read_dir(&path).unwrap() {
                files.push(inner.unwrap().path());
            }
        } else {
            files.push(path);
        }
    }
    let module_of = |path: &std::path::Path| {
        let relative = path.strip_prefix(&root).unwrap().with_extension("");
        let name = relative.to_string_lossy().replace('/', "::");
        name.strip_suffix("::mod")
            .map_or(name.clone(), str::to_owned)
    };
    let tests_only = ["lib", "tests", "memory"];
    let sources: Vec<(String, String)> = files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| (module_of(p), std::fs::read_to_string(p).unwrap()))
        .filter(|(m, _)| !tests_only.contains(&m.as_str()))
        .collect();
    let modules: std::collections::BTreeSet<String> =
        sources.iter().map(|(m, _)| m.clone()).collect();
    let graph: std::collections::BTreeMap<&str, Vec<String>> = sources
        .iter()
        .map(|(m, text)| (m.as_str(), imports(m, text, &modules)))
        .collect();
    // A depth-first walk from every module: reaching a module still on the path is a circle.
    fn walk<'a>(
        at: &'a str,
        graph: &'a std::collections::BTreeMap<&str, Vec<String>>,
        path: &mut Vec<&'a str>,
        done: &mut std::collections::BTreeSet<&'a str>,
    ) {
        if done.contains(at) {
            return;
        }
        if let Some(start) = path.iter().position(|m| *m == at) {
            panic!("import circle: {} -> {at}", path[start..].join(" -> "));
        }
        path.push(at);
        for next in &graph[at] {
            walk(next, graph, path, done);
        }
        path.pop();
        done.insert(at);
    }
    let mut done = std::collections::BTreeSet::new();
    for module in graph.keys() {
        walk(module, &graph, &mut Vec::new(), &mut done);
    }
    assert!(
        graph["flow::miss"].contains(&"fetch".to_owned()),
        "the walk sees imports: {graph:?}"
    );
}
