//! The real `cachectl` binary against a real `lacquerd`.

use lacquer_tests::{daemon_with_traffic, run_tool, unused_addr, Daemon, Origin, Reply};

fn cachectl(args: &[&str]) -> (i32, String, String) {
    run_tool(env!("CARGO_BIN_EXE_cachectl"), args)
}

#[tokio::test(flavor = "multi_thread")]
async fn stats_as_json_and_as_a_table() {
    let (_origin, d) = daemon_with_traffic().await;
    let admin = d.admin.to_string();
    let secret = d.secret_file();
    let secret = secret.to_str().unwrap();

    let (code, out, err) = cachectl(&["--admin", &admin, "--secret", secret, "stats", "--json"]);
    assert_eq!(code, 0, "{err}");
    let stats: serde_json::Value = serde_json::from_str(&out).expect("--json output parses");
    assert_eq!(stats["proxy"]["requests"], 3);
    assert_eq!(stats["proxy"]["hits"], 2);

    let (code, out, _) = cachectl(&["--admin", &admin, "--secret", secret, "stats"]);
    assert_eq!(code, 0);
    assert!(
        out.lines()
            .any(|l| l.starts_with("proxy.hits") && l.trim_end().ends_with(" 2")),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn clear_errors_for_a_wrong_secret_and_a_missing_daemon() {
    let origin = Origin::start(|_| Reply::ok("x")).await;
    let d = Daemon::start(origin.addr, &[]);
    let dir = tempfile::tempdir().unwrap();
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "not-the-secret-at-all\n").unwrap();
    let admin = d.admin.to_string();

    let (code, _, err) = cachectl(&[
        "--admin",
        &admin,
        "--secret",
        wrong.to_str().unwrap(),
        "stats",
    ]);
    assert_eq!(code, 3);
    assert_eq!(
        err.trim(),
        format!(
            "cachectl: unauthorized: the secret in {} does not match",
            wrong.display()
        )
    );

    let (code, out, _) = cachectl(&["--admin", &admin, "health"]);
    assert_eq!(code, 0, "health needs no secret");
    assert!(out.contains("ok"));

    let free = unused_addr().to_string();
    let (code, _, err) = cachectl(&[
        "--admin",
        &free,
        "--secret",
        wrong.to_str().unwrap(),
        "stats",
    ]);
    assert_eq!(code, 3);
    assert_eq!(
        err.trim(),
        format!("cachectl: cannot reach lacquerd at {free}: connection refused (is the service running?)")
    );

    let (code, _, err) = cachectl(&["frobnicate"]);
    assert_eq!(code, 2, "{err}");
}
