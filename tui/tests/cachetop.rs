//! `cachetop --once` against a real `lacquerd` after some traffic.

use lacquer_tests::{daemon_with_traffic, run_tool, unused_addr};

fn cachetop(args: &[&str]) -> (i32, String, String) {
    run_tool(env!("CARGO_BIN_EXE_cachetop"), args)
}

#[tokio::test(flavor = "multi_thread")]
async fn once_prints_the_request_and_hit_counts() {
    let (_origin, d) = daemon_with_traffic().await;
    let admin = d.admin.to_string();
    let secret = d.secret_file();
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

    let free = unused_addr().to_string();
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
