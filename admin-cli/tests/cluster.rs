//! The real `cachectl` binary against a cluster of three members: two answer with the contract's
//! `GET /v1/cluster` and with a real `lacquerd`'s `/v1/stats` document (numbers changed), the third is
//! listed but down. (The daemon's own endpoint comes with the cluster core; a test against real nodes follows
//! it.)

use lacquer_tests::{
    daemon_with_traffic,
    fake_admin::{view, FakeCluster, Member},
    run_tool, Origin, Reply,
};
use serde_json::Value;

fn cachectl(cluster: &FakeCluster, args: &[&str]) -> (i32, String, String) {
    let admin = cluster.admins[0].to_string();
    let secret = cluster.secret_file.to_str().unwrap().to_owned();
    let mut all = vec!["--admin", &admin, "--secret", &secret];
    all.extend_from_slice(args);
    run_tool(env!("CARGO_BIN_EXE_cachectl"), &all)
}

/// `template` (a real daemon's statistics) with these numbers.
fn stats(
    template: &Value,
    uptime: u64,
    [requests, hits, misses, passes]: [u64; 4],
    objects: u64,
) -> Value {
    let mut doc = template.clone();
    doc["uptime_seconds"] = uptime.into();
    for (name, value) in [
        ("requests", requests),
        ("hits", hits),
        ("misses", misses),
        ("passes", passes),
    ] {
        doc["proxy"][name] = value.into();
    }
    doc["store"]["objects"] = objects.into();
    doc
}

/// n1 serving, n2 catching up six revisions behind, n3 down; the statistics shaped by a real daemon's.
async fn three_members() -> (FakeCluster, Value) {
    let (_origin, d) = daemon_with_traffic().await;
    let template = d.stats().await;
    let cluster = FakeCluster::start(vec![
        Member::up(
            "n1",
            view("serving", 1240, 1240, 0.0, 3),
            stats(&template, 100, [1000, 900, 100, 0], 40),
        ),
        Member::up(
            "n2",
            view("catching_up", 1234, 1240, 0.0, 4),
            stats(&template, 50, [3000, 1500, 1400, 100], 60),
        ),
        Member::down("n3"),
    ])
    .await;
    (cluster, template)
}

fn json(out: &str) -> Value {
    serde_json::from_str(out)
        .unwrap_or_else(|e| panic!("--json output does not parse ({e}): {out}"))
}

/// The words of the line that starts with `first`.
fn row<'a>(text: &'a str, first: &str) -> Vec<&'a str> {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(first))
        .unwrap_or_else(|| panic!("no {first} row in\n{text}"))
        .split_whitespace()
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_lists_every_member_and_sums_those_that_answer() {
    let (cluster, template) = three_members().await;
    let [a1, a2, a3] = [0, 1, 2].map(|i| cluster.admins[i].to_string());

    let (code, out, err) = cachectl(&cluster, &["cluster"]);
    assert_eq!(code, 0, "a member down is shown, not an error: {err}");
    assert!(
        out.starts_with(&format!(
            "cluster seen from n1 at {a1}: 3 members, 2 answered, unreachable: n3; self-routing off\n"
        )),
        "{out}"
    );
    assert_eq!(
        row(&out, "n1"),
        ["n1", "127.0.0.1:8080", &a1, "serving", "1240", "0", "0.0"]
    );
    assert_eq!(
        row(&out, "n2"),
        [
            "n2",
            "127.0.0.1:8080",
            &a2,
            "catching_up",
            "1234",
            "6",
            "0.0"
        ]
    );
    assert_eq!(
        row(&out, "n3"),
        ["n3", "127.0.0.1:8080", &a3, "unreachable", "-", "-", "-"]
    );
    assert!(
        out.contains(&format!("  n3 at {a3}: connection refused\n")),
        "{out}"
    );
    assert!(
        out.contains("sum over the 2 members that answered\n"),
        "{out}"
    );
    assert!(
        out.contains("  hit ratio       60.0 % of 4000 lookups and passes\n"),
        "{out}"
    );
    let capacity = template["store"]["memory_bytes_capacity"].as_u64().unwrap();
    assert!(
        out.contains(&format!(
            "of {} (",
            lacquer_admin::format::bytes(2 * capacity)
        )),
        "the memory tiers add up: {out}"
    );
    assert_eq!(
        row(&out, "invalidations_sent"),
        ["invalidations_sent", "7", "3", "4", "-"]
    );
    assert_eq!(
        row(&out, "invalidations_applied"),
        ["invalidations_applied", "2474", "1240", "1234", "-"]
    );
    for member in cluster.members.iter().flatten() {
        assert_eq!(member.count("/v1/cluster"), 1, "each member asked once");
        assert_eq!(member.count("/v1/stats"), 1);
    }

    let (code, out, _) = cachectl(&cluster, &["--json", "cluster"]);
    assert_eq!(code, 0);
    let report = json(&out);
    assert_eq!(report["asked"], a1.as_str());
    assert_eq!(report["view"]["node"], "n1");
    assert_eq!(report["total"]["proxy"]["requests"], 4000);
    assert_eq!(report["total"]["store"]["objects"], 100);
    assert_eq!(report["counters"]["invalidations_sent"], 7);
    let members = report["members"].as_array().unwrap();
    let nodes: Vec<&str> = members
        .iter()
        .map(|m| m["node"].as_str().unwrap())
        .collect();
    assert_eq!(nodes, ["n1", "n2", "n3"]);
    assert_eq!(members[1]["cluster"]["lag_revisions"], 6);
    assert_eq!(members[1]["stats"]["proxy"]["hits"], 1500);
    assert_eq!(members[2]["cluster"], Value::Null);
    assert_eq!(members[2]["error"], "connection refused");
}

#[tokio::test(flavor = "multi_thread")]
async fn stats_cluster_sums_the_values_with_a_breakdown_per_member() {
    let (cluster, _) = three_members().await;

    let (code, out, err) = cachectl(&cluster, &["stats", "--cluster"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("cluster seen from n1 at "), "{out}");
    assert!(
        out.contains("  hit ratio       60.0 % of 4000 lookups and passes\n"),
        "{out}"
    );
    assert_eq!(
        row(&out, "n1")[..7],
        ["n1", "serving", "1000", "900", "100", "0", "90.0"]
    );
    assert_eq!(
        row(&out, "n2")[..7],
        ["n2", "catching_up", "3000", "1500", "1400", "100", "50.0"]
    );
    assert_eq!(row(&out, "n3")[1..3], ["unreachable", "-"]);
    assert_eq!(
        row(&out, "SUM")[..6],
        ["SUM", "4000", "2400", "1500", "100", "60.0"]
    );
    // Each member's average since its own start, added up: 1000/100 s + 3000/50 s.
    assert_eq!(
        row(&out, "proxy.requests")[..3],
        ["proxy.requests", "4000", "70.00"]
    );
    assert_eq!(row(&out, "store.objects")[..2], ["store.objects", "100"]);

    let (code, out, _) = cachectl(&cluster, &["stats", "--cluster", "--filter", "proxy.hit"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("proxy.hits ") && !out.contains("proxy.requests "),
        "{out}"
    );

    let (code, out, _) = cachectl(&cluster, &["--json", "stats", "--cluster"]);
    assert_eq!(code, 0);
    let report = json(&out);
    assert_eq!(report["total"]["proxy"]["hits"], 2400);
    assert_eq!(report["members"][0]["stats"]["proxy"]["hits"], 900);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_single_node_says_it_is_not_in_a_cluster() {
    let single = Origin::start(|_| {
        Reply::ok(r#"{"code": "cluster_disabled", "message": "this node is not in a cluster"}"#)
            .status(404)
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "s\n").unwrap();
    let admin = single.addr.to_string();
    for command in [&["cluster"][..], &["stats", "--cluster"]] {
        let mut args = vec!["--admin", &admin, "--secret", secret.to_str().unwrap()];
        args.extend_from_slice(command);
        let (code, out, err) = run_tool(env!("CARGO_BIN_EXE_cachectl"), &args);
        assert_eq!((code, out.as_str()), (1, ""), "{command:?}");
        assert_eq!(
            err.trim(),
            format!("cachectl: lacquerd at {admin} is a single node: its configuration has no [cluster] section")
        );
    }
}

/// A node whose lease lapsed (cut off from etcd) is no longer a live member, but it is the one the operator
/// asked about, and the one in trouble: it is shown, first, with no advertised address.
#[tokio::test(flavor = "multi_thread")]
async fn the_asked_node_is_shown_when_its_lease_lapsed() {
    let (_origin, d) = daemon_with_traffic().await;
    let template = d.stats().await;
    let cluster = FakeCluster::start(vec![
        Member::up(
            "n1",
            view("lagging", 1200, 1200, 14.5, 0),
            stats(&template, 100, [10, 5, 5, 0], 1),
        )
        .unlisted(),
        Member::up(
            "n2",
            view("serving", 1240, 1240, 0.0, 2),
            stats(&template, 100, [30, 25, 5, 0], 2),
        ),
    ])
    .await;
    let (code, out, err) = cachectl(&cluster, &["cluster"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(&format!(
            "cluster seen from n1 at {}: 2 members, every one answered; self-routing off\n",
            cluster.admins[0]
        )),
        "{out}"
    );
    let a1 = cluster.admins[0].to_string();
    assert_eq!(
        row(&out, "n1"),
        ["n1", "-", &a1, "lagging", "1200", "0", "14.5"]
    );
    assert_eq!(row(&out, "n2")[3], "serving");
    assert!(
        out.contains("  hit ratio       75.0 % of 40 lookups and passes\n"),
        "{out}"
    );
}
