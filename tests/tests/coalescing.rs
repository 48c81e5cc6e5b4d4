//! Concurrent misses share one backend fetch and stream it; uncacheable and failed fetches never hold
//! clients back or get stored.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use futures_util::future::join_all;
use http_body_util::BodyExt;
use lacquer_tests::{get, open, Daemon, Origin, Reply, Step};
use tokio::sync::Notify;

fn pattern(len: usize) -> Bytes {
    lacquer_tests::pattern(len).into()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_clients_one_origin_fetch() {
    let body = pattern(1 << 20);
    let reply = Reply::ok(body.clone())
        .header("cache-control", "max-age=60")
        .delay(Duration::from_millis(300));
    let origin = Origin::start(move |_| reply.clone()).await;
    let d = Daemon::start(origin.addr, &[]);
    let replies =
        join_all((0..200).map(|_| {
            lacquer_tests::request(d.addr, http::Method::GET, "/cold", &[], Bytes::new())
        }))
        .await;
    for r in &replies {
        let r = r.as_ref().expect("every client completes");
        assert_eq!(r.status, 200);
        assert!(r.body == body, "every body is complete and correct");
    }
    assert_eq!(origin.count("/cold"), 1);
    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["backend_requests"], 1);
    let waiters = stats["proxy"]["coalesced_waiters"].as_u64().unwrap();
    let hits = stats["proxy"]["hits"].as_u64().unwrap();
    assert_eq!(waiters + hits, 199, "{stats}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_waiter_streams_bytes_before_the_origin_finishes() {
    let gate = Arc::new(Notify::new());
    let half = pattern(64 * 1024);
    let steps = vec![
        Step::Data(half.clone()),
        Step::Gate(gate.clone()),
        Step::Data(half.clone()),
    ];
    let reply = Reply::ok("")
        .header("cache-control", "max-age=60")
        .steps(steps, Some(2 * half.len()));
    let origin = Origin::start(move |_| reply.clone()).await;
    let d = Daemon::start(origin.addr, &[]);

    let mut leader = open(d.addr, "/live").await.into_body();
    let waiter = open(d.addr, "/live").await;
    assert!(waiter.headers()["cache-status"]
        .to_str()
        .unwrap()
        .contains("collapsed"));
    let mut waiter = waiter.into_body();
    assert!(
        read_at_least(&mut waiter, half.len()).await == half,
        "the waiter got the first half while the origin was paused"
    );
    assert!(read_at_least(&mut leader, half.len()).await == half);
    assert_eq!(origin.count("/live"), 1);

    gate.notify_one();
    assert!(waiter.collect().await.unwrap().to_bytes() == half);
    assert!(leader.collect().await.unwrap().to_bytes() == half);
    assert_eq!(origin.count("/live"), 1);
}

/// Reads frames until at least `n` bytes arrived; fails if they do not arrive within 10 s.
async fn read_at_least(body: &mut hyper::body::Incoming, n: usize) -> Bytes {
    let mut got = Vec::new();
    while got.len() < n {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("bytes arrive while the origin is paused")
            .expect("a frame")
            .expect("no error");
        if let Ok(data) = frame.into_data() {
            got.extend_from_slice(&data);
        }
    }
    got.into()
}

#[tokio::test(flavor = "multi_thread")]
async fn uncacheable_responses_do_not_serialise_clients() {
    let reply = Reply::ok("private data")
        .header("cache-control", "no-store")
        .delay(Duration::from_millis(300));
    let origin = Origin::start(move |_| reply.clone()).await;
    let d = Daemon::start(origin.addr, &[]);
    let wave = || join_all((0..20).map(|_| get(d.addr, "/u")));
    for r in wave().await {
        assert_eq!(
            (r.status.as_u16(), r.body.as_ref()),
            (200, &b"private data"[..])
        );
    }
    assert_eq!(origin.count("/u"), 20);
    assert!(
        origin.max_in_flight() >= 10,
        "waiters were released together, not one by one: {}",
        origin.max_in_flight()
    );
    for r in wave().await {
        assert_eq!(r.status, 200);
    }
    assert_eq!(origin.count("/u"), 40);
    let stats = d.stats().await;
    assert_eq!(
        stats["proxy"]["hit_for_miss"], 20,
        "the second wave skipped the queue: {stats}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_truncated_fetch_fails_its_readers_and_is_not_stored() {
    let gate = Arc::new(Notify::new());
    let first = std::sync::atomic::AtomicBool::new(true);
    let g = gate.clone();
    let origin = Origin::start(move |_| {
        let body = pattern(1000);
        let reply = Reply::ok(body.clone()).header("cache-control", "max-age=60");
        if first.swap(false, std::sync::atomic::Ordering::SeqCst) {
            let steps = vec![
                Step::Data(body.slice(..500)),
                Step::Gate(g.clone()),
                Step::Reset,
            ];
            reply.steps(steps, Some(1000))
        } else {
            reply
        }
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    let leader = open(d.addr, "/t").await;
    let waiter = open(d.addr, "/t").await;
    gate.notify_one();
    assert!(
        leader.into_body().collect().await.is_err(),
        "the leader sees the failure"
    );
    assert!(
        waiter.into_body().collect().await.is_err(),
        "the waiter sees the failure"
    );
    let again = get(d.addr, "/t").await;
    assert_eq!(
        (again.x_cache(), again.body.len()),
        ("MISS", 1000),
        "nothing partial was stored"
    );
    // Until the store has published it, a request is answered from the finished fetch, also without the origin.
    d.wait_for_stats("the object stored", |s| s["proxy"]["objects_stored"] == 1)
        .await;
    assert_eq!(get(d.addr, "/t").await.x_cache(), "HIT");
    assert_eq!(origin.count("/t"), 2);
    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["backend_errors"], 1);
}
