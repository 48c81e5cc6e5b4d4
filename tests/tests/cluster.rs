//! A cluster of real lacquerd nodes coordinated by a real etcd on loopback: invalidations sent to one node
//! reach every node, a node that missed some while stopped or cut off serves none of what they covered,
//! self-routing fetches each object once for the whole cluster, and history etcd compacted away is not
//! guessed at. Skipped, with the reason printed, where Debian's etcd-server is not installed.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering::SeqCst},
        Arc,
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::Method;
use lacquer_tests::{
    etcd::{Etcd, Relay},
    request, ClientReply, Daemon, Origin, Reply,
};
use serde_json::{json, Value};

const HOST: &str = "www.example.test";

/// One cluster at a time: each test runs an etcd and up to three daemons, and a lease (3 s) must not lapse
/// because the machine is busy with another test's cluster.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Every node names the same host, so a key is the same key on each and across restarts (new ports).
async fn try_get(addr: SocketAddr, path: &str) -> Result<ClientReply, String> {
    request(addr, Method::GET, path, &[("host", HOST)], Bytes::new()).await
}

async fn get(addr: SocketAddr, path: &str) -> ClientReply {
    try_get(addr, path).await.expect("request")
}

/// An origin whose bodies name the path and a version the test moves on when it invalidates: a body of
/// an older version served after the invalidation is one the cluster should have dropped.
struct Versioned {
    origin: Origin,
    version: Arc<AtomicU64>,
}

impl Versioned {
    async fn start() -> Versioned {
        let version = Arc::new(AtomicU64::new(1));
        let v = version.clone();
        let origin = Origin::start(move |s| {
            let tag = if s.path.starts_with("/b/") {
                "shelf-b"
            } else {
                "other"
            };
            Reply::ok(format!("{} v{}", s.path, v.load(SeqCst)))
                .header("cache-control", "max-age=3600")
                .header("surrogate-key", tag)
        })
        .await;
        Versioned { origin, version }
    }

    fn bump(&self) -> u64 {
        self.version.fetch_add(1, SeqCst) + 1
    }
}

fn version_of(reply: &ClientReply) -> u64 {
    let body = String::from_utf8_lossy(&reply.body);
    body.rsplit_once(" v")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("unexpected body {body:?}"))
}

/// The secret every node of these tests shares.
const CLUSTER_SECRET: &str = "the cluster secret of the tests, long enough";

/// The file holding [`CLUSTER_SECRET`], written once per test binary.
fn cluster_secret() -> &'static std::path::Path {
    static FILE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cluster-secret");
        lacquer_tests::secret_file(path, CLUSTER_SECRET)
    })
}

/// Node `n` of a cluster on 127.0.0.`n`.
fn node(origin: &Origin, n: u8, etcd: &str, self_routing: bool) -> Daemon {
    let secret = format!("secret_file = \"{}\"", cluster_secret().display());
    node_with(origin, n, etcd, self_routing, &secret)
}

/// Node `n` with `extra` lines in its `[cluster]` section (the secret among them).
fn node_with(origin: &Origin, n: u8, etcd: &str, self_routing: bool, extra: &str) -> Daemon {
    let config = format!(
        r#"
[[listen]]
address = "127.0.0.{n}:0"

[cluster]
node = "n{n}"
etcd = ["{etcd}"]
prefix = "/test"
lease_ttl = "3s"
max_invalidation_lag = "4s"
self_routing = {self_routing}
{extra}
"#
    );
    Daemon::with_config(origin.addr, &config)
}

async fn cluster_view(d: &Daemon) -> Value {
    let r = d.admin_get("/v1/cluster", Some(&d.secret())).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    serde_json::from_slice(&r.body).expect("cluster JSON")
}

/// Waits until `check` holds for the node's `/v1/cluster`, or panics after `within`.
async fn wait_cluster(
    d: &Daemon,
    what: &str,
    within: Duration,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let view = cluster_view(d).await;
        if check(&view) {
            return view;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {view}\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn serving_with(d: &Daemon, members: usize) -> Value {
    wait_cluster(
        d,
        "serving with every member",
        Duration::from_secs(20),
        |v| v["state"] == "serving" && v["members"].as_array().map_or(0, Vec::len) == members,
    )
    .await
}

async fn applied(d: &Daemon, revision: u64) -> Value {
    wait_cluster(d, "the revision applied", Duration::from_secs(10), |v| {
        v["applied_revision"].as_u64().unwrap() >= revision
    })
    .await
}

async fn ban(d: &Daemon, expression: &str) -> Value {
    let r = d
        .admin_post("/v1/bans", json!({ "expression": expression }))
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    serde_json::from_slice(&r.body).unwrap()
}

async fn purge(d: &Daemon, path: &str) {
    let url = format!("http://{HOST}{path}");
    let r = d.admin_post("/v1/purge", json!({ "url": url })).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
}

/// Fetches each path through `d` and waits until it is stored (a publish lands just after the response).
async fn fill(d: &Daemon, paths: &[String]) {
    for p in paths {
        get(d.addr, p).await;
        let deadline = Instant::now() + Duration::from_secs(5);
        while get(d.addr, p).await.x_cache() != "HIT" {
            assert!(Instant::now() < deadline, "{p} was never stored");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn paths(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// A platform's purge request (a rule's `ban`, Magento's contract) sent to one node bans on every node, as
/// every ban does: through the cluster's log, acknowledged once in it.
#[tokio::test(flavor = "multi_thread")]
async fn a_purge_request_a_rule_turns_into_a_ban_reaches_every_node() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(etcd) = Etcd::start() else { return };
    let o = Versioned::start().await;
    let extra = format!(
        "secret_file = \"{}\"\n\n[purge]\nallow_from = [\"127.0.0.0/8\"]\n\n\
         [[rule]]\nmatch = {{ methods = [\"PURGE\"] }}\n\
         ban = [{{ object_header = \"surrogate-key\", regex_from = \"x-tags-pattern\" }}]\n",
        cluster_secret().display()
    );
    let nodes: Vec<Daemon> = (1..=2)
        .map(|n| node_with(&o.origin, n, &etcd.url(), false, &extra))
        .collect();
    for d in &nodes {
        serving_with(d, 2).await;
    }
    let (b, c) = (paths("/b/", 3), paths("/c/", 3));
    for d in &nodes {
        fill(d, &[b.clone(), c.clone()].concat()).await;
    }
    o.bump();
    let r = request(
        nodes[0].addr,
        Method::from_bytes(b"PURGE").unwrap(),
        "/",
        &[("host", HOST), ("x-tags-pattern", "^shelf-b$")],
        Bytes::new(),
    )
    .await
    .unwrap();
    assert_eq!((r.status.as_u16(), &r.body[..]), (200, &b"Purged\n"[..]));
    let head = etcd.revision_of_log();
    for (i, d) in nodes.iter().enumerate() {
        applied(d, head).await;
        for p in &b {
            let r = get(d.addr, p).await;
            assert_ne!(r.x_cache(), "HIT", "n{}: {p} was banned", i + 1);
            assert_eq!(version_of(&r), 2, "{p}");
        }
        for p in &c {
            assert_eq!(get(d.addr, p).await.x_cache(), "HIT", "n{}: {p}", i + 1);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bans_and_tag_purges_sent_to_one_node_reach_every_node() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(etcd) = Etcd::start() else { return };
    let o = Versioned::start().await;
    let nodes: Vec<Daemon> = (1..=3)
        .map(|n| node(&o.origin, n, &etcd.url(), false))
        .collect();
    for d in &nodes {
        serving_with(d, 3).await;
    }
    let (a, b, c) = (paths("/a/", 5), paths("/b/", 5), paths("/c/", 5));
    for d in &nodes {
        fill(d, &[a.clone(), b.clone(), c.clone()].concat()).await;
    }
    assert_eq!(o.origin.total(), 45, "each node fetched each object once");

    o.bump();
    ban(&nodes[0], "req.url ~ ^/a/").await;
    let first = etcd.revision_of_log();
    let r = nodes[1]
        .admin_post("/v1/purge/tags", json!({ "tags": ["shelf-b"] }))
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let head = etcd.revision_of_log();
    assert!(head > first, "each invalidation is an entry of the log");
    for (i, d) in nodes.iter().enumerate() {
        let view = applied(d, head).await;
        assert_eq!(view["counters"]["invalidations_applied"], 2, "{view}");
        let sent = if i < 2 { 1 } else { 0 };
        assert_eq!(view["counters"]["invalidations_sent"], sent, "{view}");
        assert_eq!(view["lag_revisions"], 0, "{view}");
        for p in a.iter().chain(&b) {
            let r = get(d.addr, p).await;
            assert_ne!(r.x_cache(), "HIT", "n{}: {p} was invalidated", i + 1);
            assert_eq!(version_of(&r), 2, "{p}");
        }
        for p in &c {
            let r = get(d.addr, p).await;
            assert_eq!(r.x_cache(), "HIT", "n{}: {p} was not invalidated", i + 1);
            assert_eq!(version_of(&r), 1);
        }
    }
    for p in a.iter().chain(&b) {
        assert_eq!(
            o.origin.count(p),
            6,
            "{p}: once per node before, once per node after"
        );
    }
    let metrics = nodes[2]
        .admin_get("/metrics", Some(&nodes[2].secret()))
        .await;
    let text = String::from_utf8_lossy(&metrics.body);
    for line in [
        "lacquer_cluster_members 3",
        "lacquer_cluster_lagging 0",
        "lacquer_cluster_lag_revisions 0",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
}

/// Invalidations sent all at once to every node go to etcd in batches (fewer revisions than
/// invalidations), and still: each is acknowledged only once applied on the node that took it, and every
/// node applies every one.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_invalidations_are_batched_and_every_node_applies_every_one() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(etcd) = Etcd::start() else { return };
    let o = Versioned::start().await;
    let nodes: Vec<Daemon> = (1..=3)
        .map(|n| node(&o.origin, n, &etcd.url(), false))
        .collect();
    for d in &nodes {
        serving_with(d, 3).await;
    }
    const N: usize = 90;
    let (m, kept) = (paths("/m/", N), paths("/k/", 3));
    for d in &nodes {
        fill(d, &[m.clone(), kept.clone()].concat()).await;
    }
    assert_eq!(o.origin.total(), 3 * (N + 3));
    let before = etcd.revision_of_log();

    o.bump();
    // Bans and purges alternating, each path's invalidation sent to one node, all at once.
    let sent = m.iter().enumerate().map(|(i, p)| {
        let d = &nodes[i % 3];
        async move {
            let r = if i % 2 == 0 {
                let expression = format!("req.url ~ ^{p}$");
                d.admin_post("/v1/bans", json!({ "expression": expression }))
                    .await
            } else {
                let url = format!("http://{HOST}{p}");
                d.admin_post("/v1/purge", json!({ "url": url })).await
            };
            assert!(r.status.is_success(), "{p}: {:?}", r.body);
            // Acknowledged means applied on the node that took it.
            let r = get(d.addr, p).await;
            assert_ne!(r.x_cache(), "HIT", "{p} on the node that took it");
            assert_eq!(version_of(&r), 2, "{p}");
        }
    });
    futures_util::future::join_all(sent).await;
    let head = etcd.revision_of_log();
    assert!(
        head - before < N as u64,
        "{N} invalidations sent together took {} revisions: none was batched",
        head - before
    );
    for (i, d) in nodes.iter().enumerate() {
        let view = applied(d, head).await;
        assert_eq!(view["counters"]["invalidations_applied"], N, "{view}");
        assert_eq!(view["counters"]["invalidations_sent"], N / 3, "{view}");
        assert_eq!(view["lag_revisions"], 0, "{view}");
        for p in &m {
            let r = get(d.addr, p).await;
            assert_eq!(version_of(&r), 2, "n{}: {p} was invalidated", i + 1);
        }
        for p in &kept {
            let r = get(d.addr, p).await;
            assert_eq!(r.x_cache(), "HIT", "n{}: {p} was not invalidated", i + 1);
            assert_eq!(version_of(&r), 1);
        }
    }
    for p in &m {
        assert_eq!(
            o.origin.count(p),
            6,
            "{p}: once per node before, once after"
        );
    }
    for p in &kept {
        assert_eq!(o.origin.count(p), 3, "{p}: once per node");
    }
}

/// A node stopped while 100 bans and purges go to the others serves none of what they covered once it
/// is back, not even to requests racing its start: until it has caught up it revalidates what it stores.
async fn stopped_node_misses_nothing(kill: bool) {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(etcd) = Etcd::start() else { return };
    let o = Versioned::start().await;
    let mut nodes: Vec<Daemon> = (1..=3)
        .map(|n| node(&o.origin, n, &etcd.url(), false))
        .collect();
    for d in &nodes {
        serving_with(d, 3).await;
    }
    let (purged, banned, kept) = (paths("/p/", 50), paths("/k/", 50), paths("/keep/", 10));
    fill(
        &nodes[2],
        &[purged.clone(), banned.clone(), kept.clone()].concat(),
    )
    .await;
    if kill {
        // Durable first, as an object must be for a crash to keep it.
        nodes[2]
            .wait_for_stats("durable objects", |s| {
                s["store"]["objects_durable"].as_u64() >= Some(110)
            })
            .await;
        nodes[2].kill9();
    } else {
        nodes[2].stop();
    }
    o.bump();
    for i in 0..50 {
        purge(&nodes[i % 2], &purged[i]).await;
        ban(&nodes[(i + 1) % 2], &format!("req.url == /k/{i}")).await;
    }
    let head = etcd.revision_of_log();

    let back = nodes[2].restart();
    // Requests race the catch-up: none may get an invalidated body.
    let racing: Vec<_> = purged
        .iter()
        .chain(&banned)
        .map(|p| {
            let (addr, p) = (back.addr, p.clone());
            tokio::spawn(async move { (p.clone(), get(addr, &p).await) })
        })
        .collect();
    for r in racing {
        let (p, reply) = r.await.unwrap();
        assert_eq!(
            version_of(&reply),
            2,
            "{p} served from before its invalidation: {reply:?}"
        );
    }
    let view = applied(&back, head).await;
    assert_eq!(view["state"], "serving", "{view}");
    assert_eq!(view["counters"]["compactions"], 0, "{view}");
    for p in purged.iter().chain(&banned) {
        assert_eq!(version_of(&get(back.addr, p).await), 2, "{p}");
    }
    for p in &kept {
        let r = get(back.addr, p).await;
        assert_eq!(
            r.x_cache(),
            "HIT",
            "{p} is not covered and still served once caught up"
        );
        assert_eq!(version_of(&r), 1);
    }
    nodes[2] = back;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_stopped_while_invalidations_are_sent_serves_none_of_them_after_restart() {
    stopped_node_misses_nothing(false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_killed_while_invalidations_are_sent_serves_none_of_them_after_restart() {
    stopped_node_misses_nothing(true).await;
}

/// A node acknowledges an invalidation once it has applied it, before its journal sync and metadata flush
/// (etcd holds it): killed right after the acknowledgement, the acknowledging node and the other one serve
/// nothing it covered when they are back, because they replay the log from the older revision they had
/// made durable. Rounds until a kill landed before a checkpoint at least once (most do: one runs every
/// 100 ms at most).
#[tokio::test(flavor = "multi_thread")]
async fn nodes_killed_right_after_an_acknowledgement_replay_it_and_serve_nothing_it_covered() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(etcd) = Etcd::start() else { return };
    let o = Versioned::start().await;
    let mut nodes: Vec<Daemon> = (1..=2)
        .map(|n| node(&o.origin, n, &etcd.url(), false))
        .collect();
    let kept = paths("/keep/", 5);
    let mut replays = 0;
    for round in 0..5 {
        for d in &nodes {
            serving_with(d, 2).await;
        }
        let purged = paths(&format!("/p{round}/"), 10);
        let banned = paths(&format!("/k{round}/"), 10);
        let covered = [purged.clone(), banned.clone()].concat();
        for d in &nodes {
            let base = d.stats().await["store"]["objects_durable"]
                .as_u64()
                .unwrap();
            fill(d, &[covered.clone(), kept.clone()].concat()).await;
            // Durable first, as an object must be for a crash to keep it.
            d.wait_for_stats("durable objects", |s| {
                s["store"]["objects_durable"].as_u64() >= Some(base + covered.len() as u64)
            })
            .await;
        }
        let version = o.bump();
        for (p, k) in purged.iter().zip(&banned) {
            purge(&nodes[0], p).await;
            ban(&nodes[0], &format!("req.url == {k}")).await;
        }
        // Right after the last acknowledgement.
        for d in nodes.iter_mut() {
            d.kill9();
        }
        let head = etcd.revision_of_log();
        nodes = nodes.iter().map(Daemon::restart).collect();
        for (n, d) in nodes.iter().enumerate() {
            let view = applied(d, head).await;
            serving_with(d, 2).await;
            let replayed = view["counters"]["invalidations_applied"].as_u64().unwrap();
            if n == 0 && replayed > 0 {
                replays += 1;
            }
            for p in &covered {
                let first = get(d.addr, p).await;
                assert_eq!(
                    (first.x_cache(), version_of(&first)),
                    ("MISS", version),
                    "node {n}, round {round}: {p} served from before its invalidation: {first:?}"
                );
                let again = get(d.addr, p).await;
                assert_eq!((again.x_cache(), version_of(&again)), ("HIT", version));
            }
            for p in &kept {
                let r = get(d.addr, p).await;
                assert_eq!(
                    (r.x_cache(), version_of(&r)),
                    ("HIT", 1),
                    "node {n}: {p} is not covered and survived the kill"
                );
            }
        }
        if replays > 0 {
            return;
        }
    }
    panic!("no kill landed before the acknowledging node's checkpoint in 5 rounds");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_cut_off_from_etcd_revalidates_within_the_lag_bound_and_serves_again_once_healed() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(etcd) = Etcd::start() else { return };
    let relay = Relay::start(etcd.addr).await;
    let o = Versioned::start().await;
    let n1 = node(&o.origin, 1, &etcd.url(), false);
    let n2 = node(&o.origin, 2, &format!("http://{}", relay.addr), false);
    serving_with(&n1, 2).await;
    serving_with(&n2, 2).await;
    fill(&n2, &paths("/a/", 3)).await;

    relay.cut();
    o.bump();
    ban(&n1, "req.url ~ ^/a/").await;
    let cut_at = Instant::now();
    let view = wait_cluster(&n2, "lagging", Duration::from_secs(8), |v| {
        v["state"] == "lagging"
    })
    .await;
    assert!(
        cut_at.elapsed() < Duration::from_secs(4 + 2),
        "lagging within max_invalidation_lag (4 s) and a progress interval: {:?}",
        cut_at.elapsed()
    );
    assert!(
        view["applied_revision"].as_u64() < Some(etcd.revision_of_log()),
        "the ban did not arrive: {view}"
    );
    let health: Value =
        serde_json::from_slice(&n2.admin_get("/v1/health", None).await.body).unwrap();
    assert_eq!(health["status"], "degraded", "{health}");
    for p in paths("/a/", 3) {
        let r = get(n2.addr, &p).await;
        assert_ne!(
            r.x_cache(),
            "HIT",
            "{p}: not served unrevalidated while lagging"
        );
        assert_eq!(version_of(&r), 2, "{p}");
    }
    assert!(n2.stats().await["proxy"]["cluster_revalidations"].as_u64() >= Some(3));

    relay.heal();
    let view = wait_cluster(&n2, "serving again", Duration::from_secs(15), |v| {
        v["state"] == "serving"
    })
    .await;
    assert_eq!(
        view["applied_revision"].as_u64(),
        Some(etcd.revision_of_log()),
        "{view}"
    );
    get(n2.addr, "/a/0").await;
    let r = get(n2.addr, "/a/0").await;
    assert_eq!(r.x_cache(), "HIT", "hits served again once caught up");
    assert_eq!(version_of(&r), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn self_routing_fetches_each_object_once_and_a_dead_owner_is_replaced_within_the_lease() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(etcd) = Etcd::start() else { return };
    let o = Versioned::start().await;
    let mut nodes: Vec<Daemon> = (1..=3)
        .map(|n| node(&o.origin, n, &etcd.url(), true))
        .collect();
    for d in &nodes {
        serving_with(d, 3).await;
    }
    let objects = paths("/o/", 1000);
    for (i, p) in objects.iter().enumerate() {
        for k in 0..3 {
            let r = get(nodes[(i + k) % 3].addr, p).await;
            assert_eq!(r.status, 200, "{p}");
        }
    }
    // HTTP/2 clients' requests go to the owner too: forwarded with their HTTP/2 head, they once failed in
    // the HTTP/1.1 client, and the node each reached fetched the object itself.
    let h2_objects = paths("/h2/", 60);
    for (i, p) in h2_objects.iter().enumerate() {
        for k in 0..3 {
            let tcp = tokio::net::TcpStream::connect(nodes[(i + k) % 3].addr)
                .await
                .unwrap();
            let r = lacquer_tests::tls::h2_get(tcp, &format!("http://cluster.test{p}"))
                .await
                .unwrap();
            assert_eq!(r.status, 200, "{p} over h2c");
        }
    }
    // A QUERY is keyed by its body: forwarded to the owner with that body, fetched once for the cluster.
    let queries = paths("/q/", 30);
    for (i, p) in queries.iter().enumerate() {
        for k in 0..3 {
            let r = lacquer_tests::request(
                nodes[(i + k) % 3].addr,
                http::Method::from_bytes(b"QUERY").unwrap(),
                p,
                &[("host", "cluster.test"), ("content-type", "text/plain")],
                bytes::Bytes::from(format!("select {i}")),
            )
            .await
            .unwrap();
            assert_eq!(r.status, 200, "QUERY {p}");
        }
    }
    for d in &nodes {
        let stats = d.stats().await;
        assert_eq!(stats["proxy"]["peer_failures"], 0, "{}", stats["proxy"]);
        assert_eq!(
            stats["proxy"]["cluster_revalidations"], 0,
            "{}",
            stats["proxy"]
        );
    }
    for p in objects.iter().chain(&h2_objects).chain(&queries) {
        if o.origin.count(p) != 1 {
            let seen: Vec<_> = o
                .origin
                .seen()
                .into_iter()
                .filter(|s| &s.path == p)
                .collect();
            panic!("{p}: one fetch for the whole cluster, not {seen:?}");
        }
    }
    let owned_in: Vec<u64> = {
        let mut v = Vec::new();
        for d in &nodes {
            v.push(
                d.stats().await["proxy"]["peer_requests_in"]
                    .as_u64()
                    .unwrap(),
            );
        }
        v
    };
    assert!(
        owned_in.iter().all(|n| *n > 300),
        "each node owns a share: {owned_in:?}"
    );

    // Which objects n3 owns: those it answered for the others.
    let before: std::collections::HashMap<String, usize> = o.origin.counts();
    nodes[2].kill9();
    let killed_at = Instant::now();
    let mut errors = 0;
    while killed_at.elapsed() < Duration::from_secs(5) {
        for p in objects.iter().step_by(37) {
            for d in &nodes[..2] {
                match try_get(d.addr, p).await {
                    Ok(r) if r.status == 200 => {}
                    _ => errors += 1,
                }
            }
        }
    }
    assert_eq!(errors, 0, "a dead owner's keys are answered by the others");
    for d in &nodes[..2] {
        serving_with(d, 2).await;
    }
    let settled = o.origin.counts();
    for p in &objects {
        for d in &nodes[..2] {
            assert_eq!(get(d.addr, p).await.status, 200);
        }
    }
    let mut moved = 0;
    for p in &objects {
        let after = o.origin.count(p);
        assert!(
            after <= settled[p] + 1,
            "{p}: at most one fetch by its new owner"
        );
        moved += usize::from(after > before[p]);
    }
    assert!(moved > 250, "n3's share moved to the others: {moved}");
    assert!(killed_at.elapsed() < Duration::from_secs(30));
}

#[tokio::test(flavor = "multi_thread")]
async fn history_compacted_past_a_stopped_node_bans_everything_it_stored() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(etcd) = Etcd::start() else { return };
    let o = Versioned::start().await;
    let n1 = node(&o.origin, 1, &etcd.url(), false);
    let mut n2 = node(&o.origin, 2, &etcd.url(), false);
    serving_with(&n1, 2).await;
    serving_with(&n2, 2).await;
    let (banned, other) = (paths("/a/", 5), paths("/z/", 5));
    fill(&n2, &[banned.clone(), other.clone()].concat()).await;
    n2.stop();
    o.bump();
    ban(&n1, "req.url ~ ^/a/").await;
    ban(&n1, "req.url ~ ^/a/0").await;
    etcd.compact_all();

    let back = n2.restart();
    let view = wait_cluster(
        &back,
        "serving after the compaction",
        Duration::from_secs(15),
        |v| v["state"] == "serving",
    )
    .await;
    assert_eq!(view["counters"]["compactions"], 1, "{view}");
    for p in banned.iter().chain(&other) {
        let r = get(back.addr, p).await;
        assert_ne!(
            r.x_cache(),
            "HIT",
            "{p}: nothing stored before the gap is vouched for"
        );
        assert_eq!(version_of(&r), 2);
    }
    assert!(
        back.log()
            .contains("compacted past the last revision applied here"),
        "{}",
        back.log()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_etcd_restored_behind_a_stopped_node_makes_it_ban_everything_and_follow_the_new_log() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut etcd) = Etcd::start() else {
        return;
    };
    let o = Versioned::start().await;
    let mut n1 = node(&o.origin, 1, &etcd.url(), false);
    serving_with(&n1, 1).await;
    let kept = paths("/z/", 5);
    fill(&n1, &kept).await;
    for i in 0..20 {
        ban(&n1, &format!("req.url == /gone/{i}")).await;
    }
    n1.stop();
    etcd.replace_with_empty();
    o.bump();

    let back = n1.restart();
    let view = wait_cluster(
        &back,
        "serving on the new etcd",
        Duration::from_secs(15),
        |v| v["state"] == "serving",
    )
    .await;
    assert_eq!(view["counters"]["compactions"], 1, "{view}");
    for p in &kept {
        let r = get(back.addr, p).await;
        assert_ne!(
            r.x_cache(),
            "HIT",
            "{p}: the invalidations after the backup are lost: nothing old is vouched for"
        );
        assert_eq!(version_of(&r), 2);
    }
    fill(&back, &kept).await;
    ban(&back, "req.url ~ ^/z/").await;
    assert_ne!(
        get(back.addr, &kept[0]).await.x_cache(),
        "HIT",
        "the new log is followed"
    );
}

/// `value` as lacquerd signs an entry for `key`, but with `secret`: the hex HMAC-SHA256, a space, `value`.
fn signed_with(secret: &str, key: &str, value: &str) -> String {
    let key_ = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = ring::hmac::sign(&key_, format!("lacquer-entry\n{key}\n{value}").as_bytes());
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex} {value}")
}

async fn proxy_stat(d: &Daemon, name: &str) -> u64 {
    d.stats().await["proxy"][name].as_u64().unwrap()
}

/// Whoever can write to etcd (no TLS, no auth: anyone who reaches it) puts members of its own: one
/// unsigned, one signed with another secret. Neither is routed to, and each is logged.
#[tokio::test(flavor = "multi_thread")]
async fn member_entries_not_signed_with_the_cluster_secret_get_no_requests() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(etcd) = Etcd::start() else { return };
    let o = Versioned::start().await;
    let fake =
        Origin::start(|_| Reply::ok("from the fake member").header("cache-control", "max-age=60"))
            .await;
    let n1 = node(&o.origin, 1, &etcd.url(), true);
    serving_with(&n1, 1).await;
    for (name, sign) in [
        ("evil", None),
        ("evil2", Some("another secret, just as long")),
    ] {
        let key = format!("/test/members/{name}");
        let member = json!({ "node": name, "advertise": fake.addr, "advertise_admin": fake.addr })
            .to_string();
        let value = match sign {
            Some(secret) => signed_with(secret, &key, &member),
            None => member,
        };
        etcd.ctl(&["put", &key, &value]).expect("put");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while n1
        .log()
        .matches("ignored a member entry not signed with the cluster secret")
        .count()
        < 2
    {
        assert!(Instant::now() < deadline, "not logged:\n{}", n1.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let view = cluster_view(&n1).await;
    assert_eq!(view["members"].as_array().unwrap().len(), 1, "{view}");
    assert!(
        view["counters"]["rejected_entries"].as_u64().unwrap() >= 2,
        "{view}"
    );
    for p in paths("/m/", 20) {
        let r = request(
            n1.addr,
            Method::GET,
            &p,
            &[("host", HOST), ("authorization", "Bearer a client's")],
            Bytes::new(),
        )
        .await
        .expect("request");
        assert_eq!(r.status, 200);
        assert_ne!(&r.body[..], b"from the fake member", "{p}");
    }
    assert_eq!(fake.total(), 0, "the fake member saw {:?}", fake.seen());
    assert_eq!(o.origin.total(), 20);
    assert_eq!(proxy_stat(&n1, "peer_requests").await, 0);
}

/// A garbage entry and a well-formed but unsigned ban put straight into the log: neither bans anything
/// (before, the garbage banned every stored object on every node), and both are logged.
#[tokio::test(flavor = "multi_thread")]
async fn invalidations_not_signed_with_the_cluster_secret_ban_nothing() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(etcd) = Etcd::start() else { return };
    let o = Versioned::start().await;
    let nodes: Vec<Daemon> = (1..=2)
        .map(|n| node(&o.origin, n, &etcd.url(), false))
        .collect();
    for d in &nodes {
        serving_with(d, 2).await;
        fill(d, &paths("/a/", 3)).await;
    }
    let fetched = o.origin.total();
    let unsigned =
        json!({ "id": "x-1-0", "from": "evil", "op": "ban", "expression": "req.url ~ ." });
    etcd.ctl(&["put", "/test/invalidations", "garbage"])
        .expect("put");
    etcd.ctl(&["put", "/test/invalidations", &unsigned.to_string()])
        .expect("put");
    let revision = etcd.revision_of_log();
    for d in &nodes {
        let view = applied(d, revision).await;
        assert_eq!(view["counters"]["rejected_entries"], 2, "{view}");
        for p in paths("/a/", 3) {
            let r = get(d.addr, &p).await;
            assert_eq!(r.x_cache(), "HIT", "{p}: {}", d.log());
        }
        assert_eq!(
            d.log()
                .matches("ignored an invalidation not signed with the cluster secret")
                .count(),
            2,
            "{}",
            d.log()
        );
    }
    assert_eq!(o.origin.total(), fetched);
    // A signed invalidation still goes through.
    let v = o.bump();
    ban(&nodes[0], "req.url ~ ^/a/").await;
    applied(&nodes[1], etcd.revision_of_log()).await;
    assert_eq!(version_of(&get(nodes[1].addr, "/a/0").await), v);
}

/// One HTTP/1.1 GET to `to` from `from` (a member's address), with `headers`; the status line and headers.
async fn get_from(
    from: std::net::IpAddr,
    to: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let mut stream = socket.connect(to).await.unwrap();
    let mut head = format!("GET {path} HTTP/1.1\r\nhost: {HOST}\r\nconnection: close\r\n");
    for (name, value) in headers {
        head += &format!("{name}: {value}\r\n");
    }
    stream
        .write_all(format!("{head}\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = Vec::new();
    stream.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// `Lacquer-Forwarded-By` from a member's own address, without the proof or with a forged one: the
/// request is routed as any client's (to the key's owner), never answered as a peer's.
#[tokio::test(flavor = "multi_thread")]
async fn a_forwarded_mark_without_a_valid_proof_is_not_trusted_even_from_a_members_address() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(etcd) = Etcd::start() else { return };
    let o = Versioned::start().await;
    let n1 = node(&o.origin, 1, &etcd.url(), true);
    let n2 = node(&o.origin, 2, &etcd.url(), true);
    serving_with(&n1, 2).await;
    serving_with(&n2, 2).await;
    // Keys n2 owns, as n1 routes them.
    let mut owned_by_n2 = Vec::new();
    for p in paths("/f/", 40) {
        let before = proxy_stat(&n1, "peer_requests").await;
        get(n1.addr, &p).await;
        if proxy_stat(&n1, "peer_requests").await > before {
            owned_by_n2.push(p);
        }
    }
    assert!(owned_by_n2.len() >= 2, "{owned_by_n2:?}");
    let from_n2 = n2.addr.ip();
    let forged = format!("{}.{}", unix_ms(), "00".repeat(32));
    let attempts: [&[(&str, &str)]; 2] = [
        &[("lacquer-forwarded-by", "n2")],
        &[
            ("lacquer-forwarded-by", "n2"),
            ("lacquer-forward-proof", &forged),
        ],
    ];
    let in_before = proxy_stat(&n1, "peer_requests_in").await;
    let out_before = proxy_stat(&n1, "peer_requests").await;
    for (headers, p) in attempts.iter().zip(&owned_by_n2) {
        let reply = get_from(from_n2, n1.addr, p, headers).await;
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    }
    assert_eq!(
        proxy_stat(&n1, "peer_requests_in").await,
        in_before,
        "trusted as a peer's"
    );
    assert_eq!(
        proxy_stat(&n1, "peer_requests").await,
        out_before + 2,
        "not routed to the owner"
    );
    assert_eq!(proxy_stat(&n1, "peer_requests_unproven").await, 2);
    // The real members' forwarded requests are still answered by their owner.
    assert!(proxy_stat(&n2, "peer_requests_in").await >= owned_by_n2.len() as u64 + 2);
    // Each object was fetched once, by its owner: the marks did not pin a copy on n1.
    for p in &owned_by_n2 {
        assert_eq!(o.origin.count(p), 1, "{p}");
    }
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// etcd over TLS asking for client certificates, with authentication enabled: nodes with the CA, a client
/// certificate and the password share invalidations; one without a client certificate and one with a
/// wrong password do not join, and say why.
#[tokio::test(flavor = "multi_thread")]
async fn etcd_over_tls_with_client_certificates_and_a_password() {
    let _one = ONE_AT_A_TIME.lock().await;
    let ca = lacquer_tests::tls::TestCa::new();
    let Some(etcd) = Etcd::start_with(Some(&ca), Some("etcd-root-password")) else {
        return;
    };
    let tls = etcd.tls().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let password = lacquer_tests::secret_file(dir.path().join("password"), "etcd-root-password");
    let wrong = lacquer_tests::secret_file(dir.path().join("wrong"), "not-the-password");
    let secret = cluster_secret().display().to_string();
    let settings = |cert: bool, password: &std::path::Path| {
        let mut lines = format!(
            "secret_file = \"{secret}\"\netcd_ca_file = \"{}\"\netcd_user = \"root\"\netcd_password_file = \"{}\"\n",
            tls.ca,
            password.display()
        );
        if cert {
            lines += &format!(
                "etcd_cert_file = \"{}\"\netcd_key_file = \"{}\"\n",
                tls.client_cert, tls.client_key
            );
        }
        lines
    };
    let o = Versioned::start().await;
    let n1 = node_with(&o.origin, 1, &etcd.url(), false, &settings(true, &password));
    let n2 = node_with(&o.origin, 2, &etcd.url(), false, &settings(true, &password));
    serving_with(&n1, 2).await;
    serving_with(&n2, 2).await;
    fill(&n2, &paths("/a/", 1)).await;
    let v = o.bump();
    ban(&n1, "req.url ~ ^/a/").await;
    applied(&n2, etcd.revision_of_log()).await;
    assert_eq!(version_of(&get(n2.addr, "/a/0").await), v);

    let no_cert = node_with(
        &o.origin,
        3,
        &etcd.url(),
        false,
        &settings(false, &password),
    );
    let bad_password = node_with(&o.origin, 4, &etcd.url(), false, &settings(true, &wrong));
    let deadline = Instant::now() + Duration::from_secs(10);
    for (d, why) in [
        (&no_cert, "does it accept this node's client certificate?"),
        (&bad_password, "authentication failed"),
    ] {
        loop {
            let log = d.log();
            let line = log
                .lines()
                .find(|l| l.contains("cannot keep this node registered"));
            if let Some(line) = line {
                assert!(line.contains(why), "{line}");
                break;
            }
            assert!(Instant::now() < deadline, "{log}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let view = cluster_view(&n1).await;
    assert_eq!(view["members"].as_array().unwrap().len(), 2, "{view}");
}
