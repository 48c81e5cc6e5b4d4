//! `cachectl cluster` against real lacquerd nodes sharing one secret and a real etcd on loopback: every
//! member found through the node asked, the statistics summed, a ban sent through one node counted applied
//! on all, and a member whose secret differs shown unreachable with the reason. Skipped, with the reason
//! printed, where Debian's etcd-server is not installed.

use std::time::{Duration, Instant};

use lacquer_tests::{etcd::Etcd, get, run_tool, Daemon, Origin, Reply};
use serde_json::Value;

/// Node `n`, with `secret` as its admin secret and `cluster_secret` as the secret the members share.
fn node(
    origin: &Origin,
    n: u8,
    etcd: &str,
    secret: &std::path::Path,
    cluster_secret: &std::path::Path,
) -> Daemon {
    let config = format!(
        r#"
[[listen]]
address = "127.0.0.{n}:0"

[admin]
secret_file = "{secret}"

[cluster]
node = "n{n}"
etcd = ["{etcd}"]
prefix = "/tools"
lease_ttl = "3s"
max_invalidation_lag = "4s"
secret_file = "{cluster_secret}"
"#,
        secret = secret.display(),
        cluster_secret = cluster_secret.display()
    );
    Daemon::with_config(origin.addr, &config)
}

#[tokio::test(flavor = "multi_thread")]
async fn cachectl_cluster_against_real_nodes() {
    let Some(etcd) = Etcd::start() else { return };
    let origin = Origin::start(|_| Reply::ok("x").header("cache-control", "max-age=60")).await;
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "0123456789abcdef0123456789abcdef\n").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let nodes: Vec<Daemon> = (1..=3)
        .map(|n| node(&origin, n, &etcd.url(), &secret, &secret))
        .collect();
    let cachectl = |args: &[&str]| {
        let admin = nodes[0].admin.to_string();
        let mut all = vec!["--admin", &admin, "--secret", secret.to_str().unwrap()];
        all.extend_from_slice(args);
        run_tool(env!("CARGO_BIN_EXE_cachectl"), &all)
    };
    // `cachectl --json cluster` once `done` holds for it (within 20 s).
    let report_once = |done: &dyn Fn(&Value) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (code, out, err) = cachectl(&["--json", "cluster"]);
            assert_eq!(code, 0, "{err}");
            let report: Value = serde_json::from_str(&out).unwrap();
            if done(&report) {
                break report;
            }
            assert!(Instant::now() < deadline, "{report:#}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    // A member still joining vouches for nothing it stored, so its hits would be misses: the requests
    // start once every member serves.
    let serving = |report: &Value| {
        let members = report["members"].as_array().unwrap();
        members.len() == 3 && members.iter().all(|m| m["cluster"]["state"] == "serving")
    };
    report_once(&serving);
    for (i, d) in nodes.iter().enumerate() {
        for _ in 0..=i {
            get(d.addr, "/a").await;
        }
    }
    let report = report_once(&|r| serving(r) && r["total"]["proxy"]["requests"] == 6);
    assert_eq!(report["total"]["proxy"]["hits"], 3);
    let (code, out, err) = cachectl(&["stats", "--cluster", "--filter", "proxy.req"]);
    assert_eq!(code, 0, "{err}");
    let sum = out
        .lines()
        .find(|l| l.starts_with("SUM "))
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(sum.split_whitespace().nth(1), Some("6"), "{out}");

    let (code, out, err) = cachectl(&["ban", "req.url ~ ^/a"]);
    assert_eq!(code, 0, "{out}{err}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, out, _) = cachectl(&["--json", "cluster"]);
        let report: Value = serde_json::from_str(&out).unwrap();
        let applied: Vec<&Value> = report["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| &m["cluster"]["counters"]["invalidations_applied"])
            .collect();
        if applied.iter().all(|a| **a == 1) {
            assert_eq!(report["counters"]["invalidations_sent"], 1);
            assert_eq!(report["counters"]["invalidations_applied"], 3);
            break;
        }
        assert!(Instant::now() < deadline, "{report:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let other = dir.path().join("other");
    std::fs::write(&other, "another-secret-0123456789abcdef0123\n").unwrap();
    std::fs::set_permissions(&other, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let n4 = node(&origin, 4, &etcd.url(), &other, &secret);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (code, out, err) = cachectl(&["cluster"]);
        assert_eq!(code, 0, "{err}");
        if out.contains("n4") {
            assert!(
                out.contains("unauthorized: its secret is not the one in"),
                "{out}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "{out}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(n4);
}
