//! `cachetop --once` against a real `lacquerd` after some traffic.

use lacquer_tests::{get, run_tool, Daemon, Origin, Reply};

fn cachetop(args: &[&str]) -> (i32, String, String) {
    run_tool(env!("CARGO_BIN_EXE_cachetop"), args)
}

#[tokio::test(flavor = "multi_thread")]
async fn once_prints_the_request_and_hit_counts() {
    let origin = Origin::start(|_| Reply::ok("x").header("cache-control", "max-age=60")).await;
    let d = Daemon::start(origin.addr, &[]);
    for _ in 0..3 {
        get(d.addr, "/a").await;
    }
    let admin = d.admin.to_string();
    let secret = d.dir.path().join("store/secret");
    let (code, out, err) = cachetop(&[
        "--admin",
        &admin,
        "--secret",
        secret.to_str().unwrap(),
        "--once",
        "--no-color",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines()
            .any(|l| l.contains("requests") && l.contains(" 3")),
        "{out}"
    );
    assert!(
        out.lines().any(|l| l.contains("hits ") && l.contains(" 2")),
        "{out}"
    );
    assert!(out.contains("66.7 %"), "{out}");

    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let (code, _, err) = cachetop(&[
        "--admin",
        &free,
        "--secret",
        secret.to_str().unwrap(),
        "--once",
    ]);
    assert_eq!(code, 3);
    assert!(err.contains("cannot reach lacquerd"), "{err}");
}
