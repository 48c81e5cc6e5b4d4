//! The cluster's first shape: HAProxy hashing URLs onto three lacquerd nodes (no `[cluster]` section:
//! nothing is shared between the nodes), with the packaged `packaging/haproxy.cfg` as operators copy it.
//! Each URL must be fetched once and live on one node, and a node's loss must move its URLs only.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    time::{Duration, Instant},
};

use lacquer_tests::{
    haproxy::{self, Haproxy, Node},
    request, unused_addr, Daemon, Origin, Reply,
};

const URLS: usize = 300;
/// The health-check interval the test gives HAProxy (2 s in the packaged file).
const INTER: Duration = Duration::from_millis(200);

/// Every URL differs only in its query: without `balance uri whole` they would all hash alike.
fn url(i: usize) -> String {
    format!("/catalogue/item?id={i}")
}

/// A node listening as the packaged file's comment says: PROXY protocol on the client listener (the
/// server lines send it), the admin API for the health checks.
fn node(origin: SocketAddr) -> Daemon {
    Daemon::with_config(
        origin,
        "[[listen]]\naddress = \"127.0.0.1:0\"\nproxy_protocol = true\n",
    )
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Whether `node` holds `path` as requested through HAProxy (whose address is the Host).
async fn holds(node: &Daemon, front: SocketAddr, path: &str) -> bool {
    let query = percent_encode(&format!("http://{front}{path}"));
    let reply = node
        .admin_get(&format!("/v1/objects?url={query}"), Some(&node.secret()))
        .await;
    assert_eq!(reply.status, 200, "inspect {path}: {:?}", reply.body);
    let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    body["cached"].as_bool().unwrap()
}

/// Which nodes hold each URL.
async fn holders(nodes: &[Daemon], alive: &[usize], front: SocketAddr) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    for i in 0..URLS {
        let mut on = Vec::new();
        for &n in alive {
            if holds(&nodes[n], front, &url(i)).await {
                on.push(n);
            }
        }
        out.push(on);
    }
    out
}

/// How many failed, and the first few.
fn summary(failures: &[String]) -> String {
    format!(
        "{} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(3)]
    )
}

/// Every URL once, in `order`, through HAProxy; the failures, each as "url: what".
async fn pass(front: SocketAddr, order: impl Iterator<Item = usize>) -> Vec<String> {
    let mut failures = Vec::new();
    for i in order {
        let path = url(i);
        match request(front, http::Method::GET, &path, &[], Default::default()).await {
            Ok(r) if r.status == 200 && r.body == path.as_bytes() => {}
            Ok(r) => failures.push(format!("{path}: {} {:?}", r.status, r.body)),
            Err(e) => failures.push(format!("{path}: {e}")),
        }
    }
    failures
}

async fn counter(node: &Daemon, name: &str) -> u64 {
    node.stats().await["proxy"][name].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn consistent_hashing_in_front_keeps_each_url_on_one_node_and_moves_only_a_dead_nodes_urls() {
    if !Haproxy::available() {
        return;
    }
    let origin =
        Origin::start(|seen| Reply::ok(seen.path.clone()).header("cache-control", "max-age=3600"))
            .await;
    let mut nodes: Vec<Daemon> = (0..3).map(|_| node(origin.addr)).collect();
    let front = unused_addr();
    let members: Vec<Node> = nodes
        .iter()
        .map(|d| Node {
            listen: d.addr,
            admin: d.admin,
        })
        .collect();
    let proxy = Haproxy::start(front, |dir| {
        haproxy::configure(&haproxy::packaged(), front, &members, INTER, dir)
    });
    for name in ["n1", "n2", "n3"] {
        proxy
            .wait_status("lacquer", name, "UP", Duration::from_secs(10))
            .await;
    }

    // First pass: every URL fetched once, by one node.
    let failures = pass(front, 0..URLS).await;
    assert!(
        failures.is_empty(),
        "first pass: {}\n{}",
        summary(&failures),
        proxy.log()
    );
    let counts = origin.counts();
    for i in 0..URLS {
        assert_eq!(
            counts.get(&url(i)),
            Some(&1),
            "origin fetches of {}",
            url(i)
        );
    }
    assert_eq!(origin.total(), URLS);
    let owners: Vec<usize> = holders(&nodes, &[0, 1, 2], front)
        .await
        .into_iter()
        .enumerate()
        .map(|(i, on)| {
            assert_eq!(on.len(), 1, "{} is stored on nodes {on:?}", url(i));
            on[0]
        })
        .collect();
    let mut share = [0usize; 3];
    for &o in &owners {
        share[o] += 1;
    }
    for (n, &s) in share.iter().enumerate() {
        assert!(
            s >= URLS / 10,
            "node {} holds {s} of {URLS} URLs ({share:?}): the hash does not spread them",
            n + 1
        );
    }

    // Second pass: each URL goes back to its node and is a hit there. In reverse order, because round
    // robin over three nodes would send a same-order pass of 300 URLs to the same nodes again.
    let mut hits_before = Vec::new();
    for d in &nodes {
        hits_before.push(counter(d, "hits").await);
    }
    let failures = pass(front, (0..URLS).rev()).await;
    assert!(failures.is_empty(), "second pass: {}", summary(&failures));
    assert_eq!(origin.total(), URLS, "the second pass reached the origin");
    for (n, d) in nodes.iter().enumerate() {
        assert_eq!(
            counter(d, "hits").await - hits_before[n],
            share[n] as u64,
            "hits on node {} in the second pass",
            n + 1
        );
    }

    // Node 1 stops. HAProxy's checks take it out of the ring within two failed checks; until then a
    // refused connection is retried on the next node, so requests keep working meanwhile too.
    let victim = 0;
    nodes[victim].stop();
    let stopped = Instant::now();
    // Two failed checks (the first one due within INTER, the second INTER / 2 later), and slack for a
    // loaded machine.
    let window = INTER + INTER / 2 + Duration::from_secs(2);
    let load = async {
        let mut failed = Vec::new();
        while stopped.elapsed() < window {
            failed.extend(pass(front, 0..URLS).await);
        }
        failed
    };
    let (down_after, in_window) =
        tokio::join!(proxy.wait_status("lacquer", "n1", "DOWN", window), load);
    eprintln!(
        "n1 DOWN in HAProxy {down_after:?} after its stop; requests failed before the window closed: {}",
        in_window.len()
    );

    // After the window no request fails; once the moved URLs have settled on their new nodes, no
    // request even tries the dead node (no retries) and none reaches the origin.
    let failures = pass(front, 0..URLS).await;
    assert!(
        failures.is_empty(),
        "after the window: {}",
        summary(&failures)
    );
    let retries = |p: &Haproxy| {
        let n = |c| p.stat_of("lacquer", "BACKEND", c).parse::<u64>().unwrap();
        (n("wretr"), n("wredis"), n("econ"))
    };
    let before = retries(&proxy);
    let origin_before = origin.total();
    let failures = pass(front, (0..URLS).rev()).await;
    assert!(
        failures.is_empty(),
        "after the window: {}",
        summary(&failures)
    );
    assert_eq!(
        retries(&proxy),
        before,
        "requests still tried the stopped node (retries, redispatches, connection errors)"
    );
    assert_eq!(origin.total(), origin_before, "URLs still moving");

    // The survivors' URLs stayed put: fetched once in all, still on their node. The victim's URLs were
    // fetched again (by their new node; perhaps once more by the node a retry reached in the window) and
    // now live on one survivor each.
    let counts = origin.counts();
    let survivors = [1, 2];
    let now = holders(&nodes, &survivors, front).await;
    let mut moved: BTreeMap<usize, usize> = BTreeMap::new();
    for i in 0..URLS {
        let fetches = counts[&url(i)];
        if owners[i] == victim {
            assert!(
                (2..=3).contains(&fetches),
                "{} (on the stopped node) fetched {fetches} times",
                url(i)
            );
            assert!(!now[i].is_empty(), "{} is on no survivor", url(i));
            *moved.entry(now[i].len()).or_default() += 1;
        } else {
            assert_eq!(
                fetches,
                1,
                "{} (on node {}) was fetched again",
                url(i),
                owners[i] + 1
            );
            assert!(
                now[i].contains(&owners[i]),
                "{} left node {}",
                url(i),
                owners[i] + 1
            );
        }
    }
    eprintln!(
        "share {share:?}; the stopped node's URLs by number of survivors holding them: {moved:?}"
    );

    // A last pass: every request a hit on the node that holds the URL; the survivors' own URLs are among them.
    let mut hits_before: HashMap<usize, u64> = HashMap::new();
    for &n in &survivors {
        hits_before.insert(n, counter(&nodes[n], "hits").await);
    }
    let failures = pass(front, 0..URLS).await;
    assert!(failures.is_empty(), "last pass: {}", summary(&failures));
    let mut hits = 0;
    for &n in &survivors {
        let delta = counter(&nodes[n], "hits").await - hits_before[&n];
        assert!(
            delta >= share[n] as u64,
            "node {} served {delta} hits, fewer than its own {} URLs",
            n + 1,
            share[n]
        );
        hits += delta;
    }
    assert_eq!(hits, URLS as u64, "the last pass was not all hits");
    assert_eq!(origin.total(), origin_before);
}
