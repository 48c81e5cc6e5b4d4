//! The store outlives the process: after SIGTERM every fresh object is served from disk without the origin;
//! after `kill -9` nothing served is ever wrong or partial.

use std::net::SocketAddr;

use bytes::Bytes;
use http::Method;
use lacquer_tests::{request, ClientReply, Daemon, Origin, Reply};

/// A restarted daemon listens on a new port, so requests name a fixed host (the cache key includes it).
async fn get(addr: SocketAddr, path: &str) -> ClientReply {
    request(
        addr,
        Method::GET,
        path,
        &[("host", "www.example.test")],
        Bytes::new(),
    )
    .await
    .expect("request")
}

/// A body unique to `path`, of a size that spans zero, one or several 256 KiB chunks.
fn body_for(path: &str) -> Bytes {
    let n: usize = path.trim_start_matches("/o").parse().unwrap_or(0);
    let len = [0, 1, 2048, 300_000, 600_001][n % 5] + n;
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(n as u8))
        .collect::<Vec<_>>()
        .into()
}

async fn origin() -> Origin {
    Origin::start(|s| Reply::ok(body_for(&s.path)).header("cache-control", "max-age=3600")).await
}

#[tokio::test(flavor = "multi_thread")]
async fn after_a_clean_restart_objects_come_from_disk() {
    let origin = origin().await;
    let mut d = Daemon::start(origin.addr, &[]);
    for n in 0..10 {
        let path = format!("/o{n}");
        assert_eq!(get(d.addr, &path).await.body, body_for(&path));
    }
    d.stop();
    let d = d.restart();
    for n in 0..10 {
        let path = format!("/o{n}");
        let r = get(d.addr, &path).await;
        assert_eq!(r.x_cache(), "HIT", "{path} after restart");
        assert!(r.body == body_for(&path), "{path} body intact");
    }
    assert_eq!(
        origin.total(),
        10,
        "no request reached the origin after the restart"
    );
    let stats = d.stats().await;
    assert!(
        stats["proxy"]["hits_disk"].as_u64().unwrap() >= 8,
        "{stats}"
    );
    assert_eq!(stats["store"]["objects"], 10);
}

#[tokio::test(flavor = "multi_thread")]
async fn after_kill_9_bodies_are_whole_or_missing() {
    let origin = origin().await;
    let mut d = Daemon::start(origin.addr, &[]);
    for n in 0..20 {
        get(d.addr, &format!("/o{n}")).await;
    }
    d.wait_for_stats("20 durable objects", |s| {
        s["store"]["objects_durable"].as_u64() >= Some(20)
    })
    .await;
    // These are killed while their writes may still be in flight.
    for n in 20..30 {
        get(d.addr, &format!("/o{n}")).await;
    }
    d.kill9();
    let d = d.restart();
    for n in 0..30 {
        let path = format!("/o{n}");
        let r = get(d.addr, &path).await;
        assert_eq!(r.status, 200);
        assert!(
            r.body == body_for(&path),
            "{path}: a wrong or partial body after kill -9 ({})",
            r.x_cache()
        );
        if n < 20 {
            assert_eq!(r.x_cache(), "HIT", "{path} was durable before the kill");
            assert_eq!(origin.count(&path), 1);
        }
    }
}
