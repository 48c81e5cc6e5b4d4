//! Sliced routes end to end: a range-honouring origin serving a 1 GiB object, a route with 8 MiB slices,
//! and what the origin is asked for as well as what the clients get.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering::SeqCst},
        Arc,
    },
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderMap, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use lacquer_tests::{ranged, request, Daemon, Origin, Reply, Step};
use serde_json::json;
use tokio::sync::Notify;

const GIB: u64 = 1 << 30;
const SLICE: u64 = 8 << 20;

/// An origin serving `len` bytes at every path; `version` picks the pattern's shift and entity-tag, so
/// a test can change the object under a client.
async fn origin(len: u64, version: Arc<AtomicU64>) -> Origin {
    Origin::start(move |seen| {
        let v = version.load(SeqCst);
        ranged(seen, len, v * 7, &format!("\"v{v}\""))
    })
    .await
}

fn config(extra: &str) -> String {
    format!(
        "[[listen]]\naddress = \"127.0.0.1:0\"\n\
         [storage]\nmemory = \"64MiB\"\ndisk_size = \"2GiB\"\n\
         [cache]\nmax_object_size = \"16MiB\"\n{extra}\n\
         [[route]]\npath_prefix = \"/big/\"\nslice = \"8MiB\"\n"
    )
}

/// What a client read: status, head, and whether every byte was the pattern of one version.
struct Got {
    status: u16,
    headers: HeaderMap,
    len: u64,
    /// The first byte that was not where the pattern puts it (for the version the first byte shows).
    wrong_at: Option<u64>,
    /// The version the body is of (its shift over 7).
    shift: Option<u64>,
    /// The body ended in an error.
    failed: Option<String>,
}

impl Got {
    /// Status, bytes read, the first wrong byte and how the body failed: `(200, len, None, None)` for a
    /// whole body read right.
    fn exact(&self) -> (u16, u64, Option<u64>, Option<String>) {
        (self.status, self.len, self.wrong_at, self.failed.clone())
    }

    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

/// GETs `path` (with `range`), reading and checking the body as it streams: positions start at the
/// `Content-Range`'s first byte.
async fn fetch(addr: SocketAddr, path: &str, range: Option<&str>) -> Got {
    fetch_some(addr, path, range, u64::MAX).await
}

/// [`fetch`], leaving (closing the connection) once `limit` bytes were read.
async fn fetch_some(addr: SocketAddr, path: &str, range: Option<&str>, limit: u64) -> Got {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    // One host whatever port the daemon listens on: the key stays the same across restarts.
    let mut req = Request::builder()
        .uri(format!("http://{addr}{path}"))
        .header("host", "files.test");
    if let Some(range) = range {
        req = req.header("range", range);
    }
    let resp = tokio::time::timeout(
        Duration::from_secs(60),
        client.request(req.body(Full::new(Bytes::new())).unwrap()),
    )
    .await
    .expect("head in time")
    .expect("response");
    let (parts, mut body) = resp.into_parts();
    let mut pos = parts
        .headers
        .get("content-range")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes "))
        .and_then(|v| v.split('-').next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    let mut got = Got {
        status: parts.status.as_u16(),
        headers: parts.headers,
        len: 0,
        wrong_at: None,
        shift: None,
        failed: None,
    };
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(60), body.frame())
            .await
            .expect("body in time");
        let data = match frame {
            None => break,
            Some(Err(e)) => {
                got.failed = Some(format!("{e:?}"));
                break;
            }
            Some(Ok(frame)) => frame.into_data().unwrap_or_default(),
        };
        for &b in data.iter() {
            let shift = *got
                .shift
                .get_or_insert_with(|| (u64::from(b) + 251 - pos % 251) % 251);
            if got.wrong_at.is_none() && u64::from(b) != (pos + shift) % 251 {
                got.wrong_at = Some(pos);
            }
            pos += 1;
        }
        got.len += data.len() as u64;
        if got.len >= limit {
            break;
        }
    }
    got
}

fn slice_range(k: u64) -> String {
    format!("bytes={}-{}", k * SLICE, (k + 1) * SLICE - 1)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_range_in_the_middle_costs_the_origin_one_slice_and_a_later_range_in_it_none() {
    let origin = origin(GIB, Arc::default()).await;
    let d = Daemon::with_config(origin.addr, &config(""));
    let first = 500_000_000u64;
    let got = fetch(
        d.addr,
        "/big/a.iso",
        Some(&format!("bytes={first}-{}", first + 65_535)),
    )
    .await;
    assert_eq!((got.status, got.len, got.wrong_at), (206, 65_536, None));
    assert_eq!(
        got.header("content-range"),
        format!("bytes {first}-{}/{GIB}", first + 65_535)
    );
    assert_eq!(got.header("etag"), "\"v0\"");
    assert_eq!(origin.ranges(), vec![slice_range(first / SLICE)]);
    let r = &origin.seen()[0];
    assert!(
        r.headers.get("accept-encoding").is_none(),
        "a slice asks for the origin's own bytes"
    );

    d.wait_for_stats("the slice stored", |s| s["proxy"]["objects_stored"] == 1)
        .await;
    let again = fetch(
        d.addr,
        "/big/a.iso",
        Some(&format!("bytes={}-{}", first + 100, first + 1_000_099)),
    )
    .await;
    assert_eq!(
        (again.status, again.len, again.wrong_at),
        (206, 1_000_000, None)
    );
    assert_eq!(again.header("x-cache"), "HIT");
    assert_eq!(origin.total(), 1, "the stored slice answers");
    let fresh = request(
        d.addr,
        Method::GET,
        "/big/a.iso",
        &[("host", "files.test"), ("if-none-match", "\"v0\"")],
        Bytes::new(),
    )
    .await
    .unwrap();
    assert_eq!((fresh.status.as_u16(), fresh.body.len()), (304, 0));
    assert_eq!(fresh.header("etag"), "\"v0\"");
    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["slices_served"], 1);
    assert_eq!(stats["proxy"]["slices_fetched"], 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_get_fetches_every_slice_once_and_is_exact_then_hits_after_a_restart() {
    // Larger than the memory tier (64 MiB) and max_object_size (16 MiB): cached slice by slice.
    let len = 200 * (1 << 20) + 12_345;
    let origin = origin(len, Arc::default()).await;
    let mut d = Daemon::with_config(origin.addr, &config(""));
    let got = fetch(d.addr, "/big/game.pak", None).await;
    assert_eq!(got.exact(), (200, len, None, None));
    assert_eq!(got.header("content-length"), len.to_string());
    let slices = len.div_ceil(SLICE);
    let mut asked = origin.ranges();
    asked.sort();
    let mut want: Vec<String> = (0..slices).map(slice_range).collect();
    want.sort();
    assert_eq!(asked, want, "each slice once, nothing else");

    d.wait_for_stats("every slice stored", |s| {
        s["proxy"]["objects_stored"] == slices
    })
    .await;
    d.stop();
    let d = d.restart();
    let again = fetch(d.addr, "/big/game.pak", None).await;
    assert_eq!(again.exact(), (200, len, None, None));
    assert_eq!(again.header("x-cache"), "HIT");
    assert_eq!(
        origin.total() as u64,
        slices,
        "served from the store after the restart"
    );
    let stats = d.stats().await;
    assert!(
        stats["store"]["chunk_reads_disk"].as_u64().unwrap() > 0,
        "{stats}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_ranges_of_a_cold_object_cost_each_covered_slice_once() {
    let origin = origin(GIB, Arc::default()).await;
    let d = Daemon::with_config(origin.addr, &config(""));
    let mut tasks = Vec::new();
    for i in 0..200u64 {
        let addr = d.addr;
        // Twenty slices, ten clients each, at different places in them.
        let first = (i % 20) * 5 * SLICE + (i / 20) * 700_001;
        tasks.push(tokio::spawn(async move {
            let range = format!("bytes={first}-{}", first + 65_535);
            (first, fetch(addr, "/big/cold.bin", Some(&range)).await)
        }));
    }
    for task in tasks {
        let (first, got) = task.await.unwrap();
        assert_eq!(
            (got.status, got.len, got.wrong_at),
            (206, 65_536, None),
            "at {first}"
        );
    }
    let asked = origin.ranges();
    let mut unique = asked.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(asked.len(), unique.len(), "a slice asked twice: {asked:?}");
    assert!(
        asked.len() <= 40,
        "{} slices for ranges in 20 (or the next)",
        asked.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_object_changed_at_the_origin_is_never_mixed_into_one_body() {
    let version = Arc::new(AtomicU64::new(1));
    let len = 64 << 20;
    let origin = origin(len, version.clone()).await;
    let d = Daemon::with_config(origin.addr, &config(""));
    // Version 1's first slice is stored; then the object changes.
    let got = fetch(d.addr, "/big/v.bin", Some("bytes=0-99")).await;
    assert_eq!((got.status, got.shift), (206, Some(7)));
    d.wait_for_stats("stored", |s| s["proxy"]["objects_stored"] == 1)
        .await;
    version.store(2, SeqCst);
    let whole = fetch(d.addr, "/big/v.bin", None).await;
    // Slice 0 came from the store (version 1); slice 1 is version 2: the body stops there, in an error.
    assert_eq!(whole.status, 200);
    assert!(whole.failed.is_some(), "a mixed body was not cut");
    assert_eq!(whole.wrong_at, None, "no byte of version 2 after version 1");
    assert!(whole.len <= SLICE, "{} bytes sent", whole.len);
    let stats = d.stats().await;
    assert!(stats["proxy"]["slice_mismatches"].as_u64().unwrap() >= 1);
    // The next client gets version 2 whole: its first slice replaced what was stored.
    let next = fetch(d.addr, "/big/v.bin", None).await;
    assert_eq!(
        (next.status, next.len, next.wrong_at, next.failed.is_none()),
        (200, len, None, true)
    );
    assert_eq!(next.shift, Some(14));
    assert_eq!(next.header("etag"), "\"v2\"");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_object_that_changes_before_the_first_byte_starts_over_cleanly() {
    let version = Arc::new(AtomicU64::new(1));
    let len = 40 << 20;
    let origin = origin(len, version.clone()).await;
    let d = Daemon::with_config(origin.addr, &config(""));
    let got = fetch(d.addr, "/big/w.bin", Some("bytes=0-99")).await;
    assert_eq!(got.shift, Some(7));
    d.wait_for_stats("stored", |s| s["proxy"]["objects_stored"] == 1)
        .await;
    version.store(2, SeqCst);
    // The range lies in a slice not stored: its fetch shows version 2 before any byte is sent.
    let r = fetch(d.addr, "/big/w.bin", Some("bytes=20000000-20000099")).await;
    assert_eq!(r.exact(), (206, 100, None, None));
    assert_eq!((r.shift, r.header("etag")), (Some(14), "\"v2\""));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_origin_that_ignores_ranges_is_answered_and_stored_whole() {
    let body: Bytes = lacquer_tests::pattern(3 << 20).into();
    let served = body.clone();
    let origin = Origin::start(move |_| {
        Reply::ok(served.clone())
            .header("cache-control", "max-age=60")
            .header("etag", "\"whole\"")
    })
    .await;
    let d = Daemon::with_config(origin.addr, &config(""));
    let r = request(
        d.addr,
        Method::GET,
        "/big/x",
        &[("range", "bytes=1000-1999")],
        Bytes::new(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 206);
    assert_eq!(r.body, body.slice(1000..2000));
    d.wait_for_stats("stored whole", |s| s["proxy"]["objects_stored"] == 1)
        .await;
    let r = request(d.addr, Method::GET, "/big/x", &[], Bytes::new())
        .await
        .unwrap();
    assert_eq!((r.status.as_u16(), r.x_cache()), (200, "HIT"));
    assert_eq!(r.body, body);
    assert_eq!(origin.total(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_purge_removes_every_slice() {
    let origin = origin(GIB, Arc::default()).await;
    let d = Daemon::with_config(origin.addr, &config(""));
    for k in [0, 3, 9] {
        let got = fetch(
            d.addr,
            "/big/p.iso",
            Some(&format!("bytes={}-{}", k * SLICE, k * SLICE + 9)),
        )
        .await;
        assert_eq!((got.status, got.wrong_at), (206, None));
    }
    d.wait_for_stats("three slices", |s| s["proxy"]["objects_stored"] == 3)
        .await;
    let url = "http://files.test/big/p.iso";
    let inspected = d
        .admin_get(&format!("/v1/objects?url={url}"), Some(&d.secret()))
        .await;
    assert_eq!(inspected.status, 200);
    let shown: serde_json::Value = serde_json::from_slice(&inspected.body).unwrap();
    assert_eq!(
        shown["variants"][0]["parts"].as_array().map(Vec::len),
        Some(3),
        "{shown}"
    );

    let r = d.admin_post("/v1/purge", json!({ "url": url })).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    for k in [0, 3, 9] {
        let got = fetch(
            d.addr,
            "/big/p.iso",
            Some(&format!("bytes={}-{}", k * SLICE, k * SLICE + 9)),
        )
        .await;
        assert_eq!((got.status, got.wrong_at), (206, None));
        assert_eq!(got.header("x-cache"), "MISS");
    }
    assert_eq!(origin.total(), 6, "every slice fetched again");
}

#[tokio::test(flavor = "multi_thread")]
async fn stored_slices_are_completed_by_later_ranges_into_the_whole() {
    let len = 30 << 20;
    let origin = origin(len, Arc::default()).await;
    let d = Daemon::with_config(origin.addr, &config(""));
    let got = fetch(d.addr, "/big/c.bin", Some("bytes=9000000-9000099")).await;
    assert_eq!((got.status, got.wrong_at), (206, None));
    d.wait_for_stats("stored", |s| s["proxy"]["objects_stored"] == 1)
        .await;
    let whole = fetch(d.addr, "/big/c.bin", None).await;
    assert_eq!(whole.exact(), (200, len, None, None));
    // Slice 1 was stored; the others (0, 2, 3) were fetched for the whole, once each (the next one asked
    // for while one is sent: in any order).
    let mut asked = origin.ranges();
    assert_eq!(asked.remove(0), slice_range(1));
    asked.sort();
    assert_eq!(asked, vec![slice_range(0), slice_range(2), slice_range(3)]);
    d.wait_for_stats("all stored", |s| s["proxy"]["objects_stored"] == 4)
        .await;
    let hit = fetch(d.addr, "/big/c.bin", None).await;
    assert_eq!(
        (hit.len, hit.wrong_at, hit.header("x-cache")),
        (len, None, "HIT")
    );
    assert_eq!(origin.total(), 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_object_without_validators_is_passed_as_the_client_asked() {
    let len = 20 << 20;
    let origin = Origin::start(move |seen| ranged(seen, len, 0, "")).await;
    let d = Daemon::with_config(origin.addr, &config(""));
    let whole = fetch(d.addr, "/big/plain.bin", None).await;
    assert_eq!((whole.status, whole.len, whole.wrong_at), (200, len, None));
    assert!(whole.failed.is_none());
    let part = fetch(d.addr, "/big/plain.bin", Some("bytes=9000000-9000009")).await;
    assert_eq!((part.status, part.len, part.wrong_at), (206, 10, None));
    // The first request: its first slice, then the request as sent; the next ones as sent alone.
    assert_eq!(
        origin.ranges(),
        vec![
            slice_range(0),
            "whole".to_owned(),
            "bytes=9000000-9000009".to_owned()
        ]
    );
    assert_eq!(d.stats().await["proxy"]["hit_for_miss"], 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn clients_resuming_at_random_offsets_share_the_slices_they_cross() {
    let len = 200 << 20;
    let origin = origin(len, Arc::default()).await;
    let d = Daemon::with_config(origin.addr, &config(""));
    let mut tasks = Vec::new();
    for i in 0..20u64 {
        let addr = d.addr;
        // Offsets spread over the object, several inside one slice, none on a slice boundary.
        let first = (i * 9_973_117) % (len - (20 << 20));
        tasks.push(tokio::spawn(async move {
            let range = format!("bytes={first}-");
            (
                first,
                fetch_some(addr, "/big/resume.bin", Some(&range), 12 << 20).await,
            )
        }));
    }
    for task in tasks {
        let (first, got) = task.await.unwrap();
        assert_eq!(got.status, 206, "at {first}");
        assert_eq!(
            got.header("content-range"),
            format!("bytes {first}-{}/{len}", len - 1)
        );
        assert!(got.len >= 12 << 20, "{} bytes at {first}", got.len);
        assert_eq!((got.wrong_at, got.failed), (None, None), "at {first}");
    }
    let asked = origin.ranges();
    let mut unique = asked.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(asked.len(), unique.len(), "a slice asked twice: {asked:?}");
    let slices: Vec<String> = (0..len.div_ceil(SLICE)).map(slice_range).collect();
    assert!(
        asked.iter().all(|r| slices.contains(r)),
        "only aligned slices: {asked:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_private_answer_to_a_slice_is_never_handed_to_another_request() {
    let served = Arc::new(AtomicU64::new(0));
    let counter = served.clone();
    let origin = Origin::start(move |seen| {
        let n = counter.fetch_add(1, SeqCst);
        let mut reply = ranged(seen, 20 << 20, 0, "\"p\"")
            .header("set-cookie", &format!("session=user{n}"))
            .delay(Duration::from_millis(500));
        reply.headers.retain(|(name, _)| name != "cache-control");
        reply.header("cache-control", "private")
    })
    .await;
    let d = Daemon::with_config(origin.addr, &config(""));
    let (a, b) = tokio::join!(
        fetch(d.addr, "/big/private.bin", Some("bytes=0-99")),
        fetch(d.addr, "/big/private.bin", Some("bytes=100-199"))
    );
    assert_eq!(
        (a.status, a.wrong_at, b.status, b.wrong_at),
        (206, None, 206, None)
    );
    assert_ne!(
        a.header("set-cookie"),
        b.header("set-cookie"),
        "one client's session went to the other"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_range_past_the_end_is_answered_416_and_stores_nothing() {
    let len = 20 << 20;
    let origin = origin(len, Arc::default()).await;
    let d = Daemon::with_config(origin.addr, &config(""));
    let past = fetch(d.addr, "/big/e.bin", Some("bytes=999999999999-")).await;
    assert_eq!(past.status, 416);
    let whole = fetch(d.addr, "/big/e.bin", None).await;
    assert_eq!((whole.status, whole.len, whole.wrong_at), (200, len, None));
    let range = fetch(d.addr, "/big/e.bin", Some("bytes=0-99")).await;
    assert_eq!((range.status, range.len, range.wrong_at), (206, 100, None));
    // A huge first byte does not overflow the slice arithmetic either.
    let last = fetch(d.addr, "/big/e.bin", Some("bytes=18446744073709551615-")).await;
    assert_eq!(last.status, 416);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_origin_that_stops_honouring_ranges_is_answered_from_its_whole() {
    let whole_now = Arc::new(AtomicU64::new(0));
    let switch = whole_now.clone();
    let len = 40 << 20;
    let origin = Origin::start(move |seen| {
        if switch.load(SeqCst) == 1 {
            // Larger than max_object_size: not stored, read at its readers' pace.
            let mut plain = seen.clone();
            plain.headers.remove("range");
            ranged(&plain, len, 0, "\"r\"")
        } else {
            ranged(seen, len, 0, "\"r\"")
        }
    })
    .await;
    let d = Daemon::with_config(origin.addr, &config(""));
    let first = fetch(d.addr, "/big/r.bin", Some("bytes=0-99")).await;
    assert_eq!((first.status, first.wrong_at), (206, None));
    d.wait_for_stats("stored", |s| s["proxy"]["objects_stored"] == 1)
        .await;
    whole_now.store(1, SeqCst);
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        fetch(d.addr, "/big/r.bin", Some("bytes=10000000-10000099")),
    )
    .await
    .expect("answered, not held");
    assert_eq!(
        (r.status, r.len, r.wrong_at, r.failed),
        (206, 100, None, None)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stale_sliced_object_is_revalidated_once_as_a_whole() {
    let len = 30 << 20;
    let origin = Origin::start(move |seen| {
        if seen
            .headers
            .get("if-none-match")
            .is_some_and(|v| v == "\"s\"")
        {
            return Reply::ok("")
                .status(304)
                .header("etag", "\"s\"")
                .header("cache-control", "max-age=1")
                .steps(Vec::new(), None);
        }
        let mut reply = ranged(seen, len, 0, "\"s\"");
        reply.headers.retain(|(name, _)| name != "cache-control");
        reply.header("cache-control", "max-age=1")
    })
    .await;
    let d = Daemon::with_config(origin.addr, &config(""));
    let whole = fetch(d.addr, "/big/s.bin", None).await;
    assert_eq!((whole.status, whole.len, whole.wrong_at), (200, len, None));
    d.wait_for_stats("stored", |s| s["proxy"]["objects_stored"] == 4)
        .await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    // Stale: one conditional request for the object, then every slice from the store.
    let again = fetch(d.addr, "/big/s.bin", None).await;
    assert_eq!(again.exact(), (200, len, None, None));
    let seen = origin.seen();
    let conditional: Vec<_> = seen
        .iter()
        .filter(|s| s.headers.contains_key("if-none-match"))
        .collect();
    assert_eq!(conditional.len(), 1, "one revalidation for the object");
    assert!(
        conditional[0].headers.contains_key("range"),
        "a slice's range asks it"
    );
    assert_eq!(seen.len(), 5, "four slices, then the revalidation alone");
    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["revalidations"], 1);
}

// Partial responses stored on a route without `slice`: ranges forwarded to the origin
// (`cache.forward_ranges`), their 206s kept as parts and completed with the bytes between them.

#[tokio::test(flavor = "multi_thread")]
async fn a_range_far_into_a_cold_object_is_forwarded_and_its_206_answers_ranges_within_it() {
    // Larger than max_object_size (16 MiB): never stored whole, but its ranges are.
    let len = 40 << 20;
    let origin = origin(len, Arc::default()).await;
    let d = Daemon::with_config(origin.addr, &config(""));
    let got = fetch(d.addr, "/files/v.mp4", Some("bytes=20000000-20999999")).await;
    assert_eq!(got.exact(), (206, 1_000_000, None, None));
    assert_eq!(
        got.header("content-range"),
        format!("bytes 20000000-20999999/{len}")
    );
    d.wait_for_stats("the part stored", |s| s["proxy"]["objects_stored"] == 1)
        .await;
    // The part told the length: the last bytes are asked for where they are, with If-Range.
    let tail = fetch(d.addr, "/files/v.mp4", Some("bytes=-1000")).await;
    assert_eq!(tail.exact(), (206, 1000, None, None));
    assert_eq!(
        tail.header("content-range"),
        format!("bytes {}-{}/{len}", len - 1000, len - 1)
    );
    assert_eq!(
        origin.ranges(),
        vec![
            "bytes=20000000-20999999".to_owned(),
            format!("bytes={}-", len - 1000)
        ],
        "the client's range, then the bytes not stored"
    );
    assert!(origin.seen()[0].headers.get("accept-encoding").is_none());
    assert_eq!(origin.seen()[1].headers["if-range"], "\"v0\"");
    d.wait_for_stats("both parts stored", |s| s["proxy"]["objects_stored"] == 2)
        .await;

    for (range, first, n) in [
        ("bytes=20000100-20000199", 20_000_100, 100),
        ("bytes=-10", len - 10, 10),
        ("bytes=20999999-20999999", 20_999_999, 1),
    ] {
        let hit = fetch(d.addr, "/files/v.mp4", Some(range)).await;
        assert_eq!(hit.exact(), (206, n, None, None), "{range}");
        assert_eq!(hit.header("x-cache"), "HIT", "{range}");
        assert_eq!(
            hit.header("content-range"),
            format!("bytes {first}-{}/{len}", first + n - 1)
        );
    }
    assert_eq!(origin.total(), 2, "ranges within the parts are hits");
    let url = "http://files.test/files/v.mp4";
    let inspected = d
        .admin_get(&format!("/v1/objects?url={url}"), Some(&d.secret()))
        .await;
    let shown: serde_json::Value = serde_json::from_slice(&inspected.body).unwrap();
    assert_eq!(
        shown["variants"][0]["parts"].as_array().map(Vec::len),
        Some(2),
        "{shown}"
    );

    // Near the start, the whole is fetched (and, past max_object_size, not stored).
    let near = fetch(d.addr, "/files/w.mp4", Some("bytes=100-199")).await;
    assert_eq!(near.exact(), (206, 100, None, None));
    assert_eq!(origin.ranges()[2], "whole");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stored_206_is_completed_by_a_second_range_into_the_whole() {
    let len = 3_000_000;
    let origin = origin(len, Arc::default()).await;
    let d = Daemon::with_config(origin.addr, &config(""));
    let part = fetch(d.addr, "/files/doc.bin", Some("bytes=2000000-2999999")).await;
    assert_eq!(part.exact(), (206, 1_000_000, None, None));
    d.wait_for_stats("the part stored", |s| s["proxy"]["objects_stored"] == 1)
        .await;

    let whole = fetch(d.addr, "/files/doc.bin", None).await;
    assert_eq!(whole.exact(), (200, len, None, None));
    assert_eq!(whole.header("content-length"), len.to_string());
    assert_eq!(
        origin.ranges(),
        vec![
            "bytes=2000000-2999999".to_owned(),
            "bytes=0-1999999".to_owned()
        ],
        "only the bytes not stored"
    );
    assert_eq!(
        origin.seen()[1]
            .headers
            .get("if-range")
            .map(|v| v.to_str().unwrap()),
        Some("\"v0\""),
        "joined only if still the same version"
    );
    d.wait_for_stats("both parts stored", |s| s["proxy"]["objects_stored"] == 2)
        .await;
    let hit = fetch(d.addr, "/files/doc.bin", None).await;
    assert_eq!(hit.exact(), (200, len, None, None));
    assert_eq!(hit.header("x-cache"), "HIT");
    let across = fetch(d.addr, "/files/doc.bin", Some("bytes=1999000-2000999")).await;
    assert_eq!(across.exact(), (206, 2000, None, None));
    assert_eq!(across.header("x-cache"), "HIT");
    assert_eq!(origin.total(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_part_of_an_object_changed_since_is_never_joined_to_the_new_version() {
    let len = 3_000_000;
    let version = Arc::new(AtomicU64::new(0));
    let origin = origin(len, version.clone()).await;
    let d = Daemon::with_config(origin.addr, &config(""));
    let part = fetch(d.addr, "/files/c.bin", Some("bytes=2000000-2999999")).await;
    assert_eq!(
        (part.status, part.wrong_at, part.shift),
        (206, None, Some(0))
    );
    d.wait_for_stats("the part stored", |s| s["proxy"]["objects_stored"] == 1)
        .await;
    version.store(1, SeqCst);
    // The gap is asked for with If-Range "v0": the origin, now at "v1", sends the whole of v1.
    let whole = fetch(d.addr, "/files/c.bin", None).await;
    assert_eq!(whole.exact(), (200, len, None, None));
    assert_eq!((whole.shift, whole.header("etag")), (Some(7), "\"v1\""));
    d.wait_for_stats("v1 stored", |s| s["proxy"]["objects_stored"] == 2)
        .await;
    for range in [None, Some("bytes=2000000-2000099")] {
        let hit = fetch(d.addr, "/files/c.bin", range).await;
        assert_eq!(
            (hit.wrong_at, hit.shift, hit.header("x-cache")),
            (None, Some(7), "HIT")
        );
    }
    assert_eq!(origin.total(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_part_without_validators_answers_ranges_within_it_and_is_never_joined() {
    let len = 3_000_000;
    let origin = Origin::start(move |seen| ranged(seen, len, 0, "")).await;
    let d = Daemon::with_config(origin.addr, &config(""));
    let tail = fetch(d.addr, "/files/n.bin", Some("bytes=-1000")).await;
    assert_eq!(tail.exact(), (206, 1000, None, None));
    d.wait_for_stats("the part stored", |s| s["proxy"]["objects_stored"] == 1)
        .await;
    let within = fetch(d.addr, "/files/n.bin", Some("bytes=-10")).await;
    assert_eq!(
        (within.exact(), within.header("x-cache")),
        ((206, 10, None, None), "HIT")
    );
    // The bytes before it are asked for, but nothing proves them the same version: the whole is fetched.
    let whole = fetch(d.addr, "/files/n.bin", None).await;
    assert_eq!(whole.exact(), (200, len, None, None));
    assert_eq!(
        origin.ranges(),
        vec![
            "bytes=-1000".to_owned(),
            format!("bytes=0-{}", len - 1001),
            "whole".to_owned()
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_206_whose_content_range_disagrees_with_its_body_is_passed_on_and_never_stored() {
    let origin = Origin::start(|_| {
        Reply::ok("01234")
            .status(206)
            .header("cache-control", "max-age=3600")
            .header("etag", "\"x\"")
            .header("content-range", "bytes 4-9/10")
    })
    .await;
    let d = Daemon::with_config(origin.addr, &config(""));
    for _ in 0..2 {
        let r = request(
            d.addr,
            Method::GET,
            "/files/bad",
            &[("range", "bytes=-5")],
            Bytes::new(),
        )
        .await
        .unwrap();
        assert_eq!((r.status.as_u16(), &r.body[..]), (206, &b"01234"[..]));
        assert_eq!(r.x_cache(), "MISS");
        // The real reason, not "a status never stored".
        assert!(
            r.header("cache-status")
                .contains("detail=\"part-unplaced\""),
            "{}",
            r.header("cache-status")
        );
    }
    assert_eq!(origin.total(), 2, "nothing stored");
    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["slice_errors"], 2, "{stats}");
    assert_eq!(stats["proxy"]["objects_stored"], 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forwarded_range_its_client_left_keeps_the_bytes_read_and_stops_the_origin() {
    let len = 40_000_000;
    // The range's answer stops after 2 MiB until the client has left: then the fill sees it gone.
    let gate = Arc::new(Notify::new());
    let held = gate.clone();
    let origin = Origin::start(move |seen| {
        let mut reply = ranged(seen, len, 0, "\"v0\"");
        if seen.headers.contains_key("range") {
            reply.body.insert(32, Step::Gate(held.clone()));
        }
        reply
    })
    .await;
    let d = Daemon::with_config(origin.addr, &config(""));
    // Its part (the rest of the object) fits max_object_size: it is stored as far as it was read.
    let first = 30_000_000;
    // An open range is forwarded once the whole is known not to be stored: here, past max_object_size.
    let whole = fetch(d.addr, "/files/s.mp4", None).await;
    assert_eq!(whole.exact(), (200, len, None, None));
    d.wait_for_stats("found too large", |s| s["proxy"]["uncacheable"] == 1)
        .await;
    let some = fetch_some(d.addr, "/files/s.mp4", Some("bytes=30000000-"), 1 << 20).await;
    assert_eq!((some.status, some.wrong_at), (206, None));
    gate.notify_one();
    d.wait_for_stats("what was read kept", |s| s["proxy"]["objects_stored"] == 1)
        .await;
    let url = "http://files.test/files/s.mp4";
    let inspected = d
        .admin_get(&format!("/v1/objects?url={url}"), Some(&d.secret()))
        .await;
    let shown: serde_json::Value = serde_json::from_slice(&inspected.body).unwrap();
    let part = &shown["variants"][0]["parts"][0];
    let kept = part["size"].as_u64().unwrap();
    assert_eq!(part["start"], first, "{shown}");
    assert!(
        (1 << 20) <= kept && kept < len - first,
        "the bytes read and those in transit, not the rest of the object: {kept}"
    );
    let hit = fetch(d.addr, "/files/s.mp4", Some("bytes=30000000-30999999")).await;
    assert_eq!(
        (hit.exact(), hit.header("x-cache")),
        ((206, 1_000_000, None, None), "HIT")
    );
    assert_eq!(
        origin.ranges(),
        vec!["whole".to_owned(), "bytes=30000000-".to_owned()]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn clients_resuming_an_object_not_stored_share_one_fetch_of_the_whole() {
    let len = 12_000_000;
    let origin = origin(len, Arc::default()).await;
    let d = Daemon::with_config(origin.addr, &config(""));
    let mut tasks = Vec::new();
    for i in 0..5u64 {
        let addr = d.addr;
        let range = format!("bytes={}-", 2_000_000 + i * 1_500_000);
        tasks.push(tokio::spawn(async move {
            fetch(addr, "/files/r.bin", Some(&range)).await
        }));
    }
    for task in tasks {
        let got = task.await.unwrap();
        assert_eq!((got.status, got.wrong_at, got.failed), (206, None, None));
    }
    assert_eq!(origin.ranges(), vec!["whole".to_owned()]);
}

/// Hardening III, finding 9: once a sliced object is known not to be stored (`no-store` here, or past
/// `max_sliced_object_size`), a one-byte range costs the origin that byte, not a whole slice each time.
#[tokio::test(flavor = "multi_thread")]
async fn a_range_of_an_object_that_is_not_stored_is_forwarded_as_asked() {
    let len = 20 << 20;
    let origin = Origin::start(move |seen| {
        let reply = ranged(seen, len, 0, "\"v0\"");
        if seen.path.contains("nostore") {
            reply.header("cache-control", "no-store")
        } else {
            reply
        }
    })
    .await;
    let d = Daemon::with_config(origin.addr, &config("max_sliced_object_size = \"16MiB\"\n"));
    for path in ["/big/nostore.bin", "/big/huge.bin"] {
        for _ in 0..3 {
            let got = fetch(d.addr, path, Some("bytes=100-100")).await;
            assert_eq!(
                (got.status, got.len, got.wrong_at),
                (206, 1, None),
                "{path}"
            );
        }
    }
    let once: [String; 3] = [
        slice_range(0),
        "bytes=100-100".into(),
        "bytes=100-100".into(),
    ];
    assert_eq!(
        origin.ranges(),
        [once.clone(), once].concat(),
        "the first request learns the object is not stored; the next go as asked"
    );
}

/// Hardening III, finding 14: right after a slice showed the object changed (another length), the next
/// request never starts the old version's body with its old length: 1 MiB slices, so the mismatching
/// slice's fetch is still being stored when the next request looks (1 run in 3 was a hit on the old first
/// slice, cut at 1 MiB).
#[tokio::test(flavor = "multi_thread")]
async fn the_request_after_a_length_change_is_the_new_version_whole() {
    let version = Arc::new(AtomicU64::new(1));
    let v = version.clone();
    let origin = Origin::start(move |seen| {
        let v = v.load(SeqCst);
        let mut reply = ranged(seen, (3 << 20) + v * 100_000, v * 7, &format!("\"v{v}\""));
        // The new version's slices take a while after their head, as a real origin's 1 MiB does: the
        // mismatching slice is not stored yet when the next request looks.
        if v == 2 && reply.body.len() > 1 {
            reply
                .body
                .insert(1, Step::Sleep(Duration::from_millis(400)));
        }
        reply
    })
    .await;
    let d = Daemon::with_config(
        origin.addr,
        &config("max_sliced_object_size = \"1GiB\"\n")
            .replace("slice = \"8MiB\"", "slice = \"1MiB\""),
    );
    for round in 0..4u64 {
        let path = format!("/big/len{round}.bin");
        version.store(1, SeqCst);
        let first = fetch(d.addr, &path, Some("bytes=0-99")).await;
        assert_eq!(first.shift, Some(7));
        lacquer_tests::eventually(Duration::from_secs(5), || async {
            let again = fetch(d.addr, &path, Some("bytes=0-99")).await;
            (again.header("x-cache") == "HIT").then_some(())
        })
        .await;
        version.store(2, SeqCst);
        // Slice 0 from the store, slice 1 of another length: cut.
        let cut = fetch(d.addr, &path, None).await;
        assert!(
            cut.failed.is_some() || cut.shift == Some(14),
            "round {round}"
        );
        let next = fetch(d.addr, &path, None).await;
        let len = (3 << 20) + 200_000;
        assert_eq!(next.exact(), (200, len, None, None), "round {round}");
        assert_eq!(next.shift, Some(14), "round {round}");
    }
}
