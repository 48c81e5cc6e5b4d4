//! The real `cachectl` binary against a real `lacquerd`: what an operator types, what they read, and the
//! exit status a script sees.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::Duration,
};

use lacquer_tests::{daemon_with_traffic, get, run_tool, unused_addr, Daemon, Origin, Reply, Step};

fn cachectl(args: &[&str]) -> (i32, String, String) {
    run_tool(env!("CARGO_BIN_EXE_cachectl"), args)
}

/// `cachectl` pointed at `d` by flags, running `args`.
fn ctl(d: &Daemon, args: &[&str]) -> (i32, String, String) {
    let admin = d.admin.to_string();
    let secret = d.secret_file();
    let mut all = vec!["--admin", &admin, "--secret", secret.to_str().unwrap()];
    all.extend_from_slice(args);
    cachectl(&all)
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out)
        .unwrap_or_else(|e| panic!("--json output does not parse ({e}): {out}"))
}

/// An origin whose `/p/N` pages are fresh for a minute, then served stale for 30 s while refreshed, and
/// tagged `product-N` and `catalog`.
async fn catalog() -> (Origin, Daemon) {
    let origin = Origin::start(|seen| {
        let n = seen.path.trim_start_matches("/p/").to_owned();
        Reply::ok(format!("page {n}"))
            .header("cache-control", "max-age=60, stale-while-revalidate=30")
            .header("surrogate-key", &format!("product-{n} catalog"))
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    (origin, d)
}

#[tokio::test(flavor = "multi_thread")]
async fn stats_as_json_and_as_a_table() {
    let (_origin, d) = daemon_with_traffic().await;

    let (code, out, err) = ctl(&d, &["stats", "--json"]);
    assert_eq!(code, 0, "{err}");
    let stats = json(&out);
    assert_eq!(stats["proxy"]["requests"], 3);
    assert_eq!(stats["proxy"]["hits"], 2);

    let (code, out, _) = ctl(&d, &["stats"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("hit ratio       66.7 % of 3 lookups and passes"),
        "{out}"
    );
    let hits = out
        .lines()
        .find(|l| l.starts_with("proxy.hits "))
        .expect("a proxy.hits row");
    assert_eq!(hits.split_whitespace().nth(1), Some("2"), "{out}");
    assert!(
        hits.ends_with("  Requests answered from the store (stale ones included)."),
        "{out}"
    );

    let (code, out, _) = ctl(&d, &["stats", "--filter", "store.ban"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("store.bans_added") && !out.contains("proxy.hits "),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_prints_a_document_per_interval() {
    let (_origin, d) = daemon_with_traffic().await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_cachectl"))
        .args(["--admin", &d.admin.to_string(), "--secret"])
        .arg(d.secret_file())
        .args(["stats", "--json", "--watch", "0.2"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = json(&lines.next().unwrap().unwrap());
    let second = json(&lines.next().unwrap().unwrap());
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(first["proxy"]["hits"], 2);
    assert_eq!(second["proxy"]["hits"], 2);

    let (code, _, err) = ctl(&d, &["stats", "--watch", "0"]);
    assert_eq!(code, 2, "{err}");
}

/// `inspect` shows a stored object's effective grace and what voids it: a Magento page's `s-maxage` does
/// not void a rule's grace; `must-revalidate` does, and says so.
#[tokio::test(flavor = "multi_thread")]
async fn inspect_says_which_directive_voids_grace() {
    let origin = Origin::start(|seen| match seen.path.as_str() {
        "/strict" => Reply::ok("s").header("cache-control", "public, max-age=60, must-revalidate"),
        _ => Reply::ok("m").header("cache-control", "public, max-age=60, s-maxage=60"),
    })
    .await;
    let d = Daemon::with_config(
        origin.addr,
        "[[rule]]\non = \"backend_response\"\ngrace = \"3d\"\n",
    );
    get(d.addr, "/strict").await;
    get(d.addr, "/magento").await;
    d.wait_for_stats("both stored", |s| {
        s["store"]["objects_published"].as_u64() >= Some(2)
    })
    .await;
    let host = d.addr.to_string();
    let (code, out, err) = ctl(&d, &["inspect", "/strict", "--host", &host]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(
            "grace 0s, keep 0s, stale-if-error 0s, never served stale (the origin's must-revalidate forbids it"
        ),
        "{out}"
    );
    let (_, out, _) = ctl(&d, &["--json", "inspect", "/magento", "--host", &host]);
    let variant = &json(&out)["variants"][0];
    assert_eq!(variant["grace_seconds"], 3 * 86_400, "{variant}");
    assert!(variant.get("stale_forbidden_by").is_none(), "{variant}");
}

#[tokio::test(flavor = "multi_thread")]
async fn inspect_says_why_the_last_response_was_not_stored() {
    let origin = Origin::start(|seen| match seen.path.as_str() {
        "/account" => Reply::ok("mine").header("cache-control", "private, max-age=60"),
        // No Content-Length: found too large only as the body comes.
        _ => Reply::ok("")
            .header("cache-control", "max-age=60")
            .steps(vec![Step::Data(vec![b'x'; 4096].into()); 4], None),
    })
    .await;
    let d = Daemon::with_config(origin.addr, "[cache]\nmax_object_size = \"8KiB\"\n");
    assert_eq!(get(d.addr, "/account").await.status, 200);
    assert_eq!(get(d.addr, "/grows").await.status, 200);
    let host = d.addr.to_string();
    let (code, out, err) = ctl(&d, &["inspect", &format!("http://{host}/account")]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(&format!("not cached: {host}/account\nnot stored private (")),
        "{out}"
    );
    assert!(out.contains("; requests bypass the cache for "), "{out}");
    let (code, out, _) = ctl(&d, &["--json", "inspect", "/account", "--host", &host]);
    assert_eq!(code, 0);
    let bypass = json(&out)["not_stored"]["bypass_seconds"].as_u64().unwrap();
    assert!(
        (100..=120).contains(&bypass),
        "hit-for-miss, 120 s by default: {out}"
    );
    let (code, out, _) = ctl(&d, &["--json", "inspect", "/grows", "--host", &host]);
    assert_eq!(code, 0);
    let inspection = json(&out);
    assert_eq!(inspection["cached"], false);
    assert_eq!(
        inspection["not_stored"]["reason"], "too-large",
        "{inspection}"
    );
    let (code, out, _) = ctl(&d, &["--json", "inspect", "/never", "--host", &host]);
    assert_eq!(code, 0);
    assert!(json(&out).get("not_stored").is_none(), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn ban_inspect_and_purge_change_what_the_origin_sees() {
    let (origin, d) = catalog().await;
    for n in 1..=4 {
        get(d.addr, &format!("/p/{n}")).await;
    }
    let host = d.addr.to_string();
    let url = |n: u32| format!("http://{host}/p/{n}");
    d.wait_for_stats("4 objects stored", |s| s["store"]["objects_published"] == 4)
        .await;

    let (code, out, err) = ctl(&d, &["inspect", &url(1)]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(&format!("{host}/p/1: 1 variant\n")),
        "{out}"
    );
    assert!(out.contains("  status     200, 6 B\n"), "{out}");
    assert!(out.contains("  where      1 chunk: 1 in memory"), "{out}");
    assert!(out.contains("  freshness  fresh: age "), "{out}");
    assert!(out.contains("  tags       product-1 catalog\n"), "{out}");
    assert!(
        out.contains("cache-control: max-age=60, stale-while-revalidate=30"),
        "{out}"
    );
    let (code, out, _) = ctl(&d, &["--json", "inspect", "/p/1", "--host", &host]);
    assert_eq!(code, 0);
    let inspection = json(&out);
    assert_eq!(inspection["cached"], true);
    assert_eq!(inspection["variants"][0]["size"], 6);
    assert_eq!(inspection["variants"][0]["state"], "fresh");

    let (code, out, err) = ctl(&d, &["ban", "req.url", "~", "^/p/1$"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("ban ") && out.trim_end().ends_with("added: req.url ~ \"^/p/1$\""),
        "{out}"
    );
    let (code, out, _) = ctl(&d, &["inspect", &url(1)]);
    assert_eq!((code, out), (0, format!("not cached: {host}/p/1\n")));
    let (code, out, _) = ctl(&d, &["bans"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("ID  ") || out.contains("  ID  "), "{out}");
    assert!(out.contains("req.url ~ \"^/p/1$\""), "{out}");

    let (code, out, err) = ctl(&d, &["purge", &url(2)]);
    assert_eq!(
        (code, out.as_str()),
        (0, format!("purged 1 object {}\n", url(2)).as_str()),
        "{err}"
    );
    let (code, out, _) = ctl(&d, &["--json", "purge", "--tag", "product-3", "--soft"]);
    assert_eq!(code, 0);
    assert_eq!(json(&out), serde_json::json!({"purged": 1, "soft": true}));
    let (code, out, _) = ctl(&d, &["inspect", &url(3)]);
    assert_eq!(code, 0);
    assert!(
        out.contains("  freshness  grace: "),
        "a soft purge keeps grace: {out}"
    );

    for n in 1..=4 {
        get(d.addr, &format!("/p/{n}")).await;
    }
    assert_eq!(origin.count("/p/1"), 2, "banned");
    assert_eq!(origin.count("/p/2"), 2, "purged");
    assert_eq!(origin.count("/p/4"), 1, "untouched");
    d.wait_for_stats("the soft-purged page refreshed", |s| {
        s["proxy"]["objects_stored"] == 7
    })
    .await;
    assert_eq!(
        origin.count("/p/3"),
        2,
        "soft-purged: served stale, refreshed once"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_operations_exit_1_with_the_reason() {
    let (_origin, d) = catalog().await;
    let (code, out, err) = ctl(&d, &["ban", "req.url ~ \"(^/x\""]);
    assert_eq!((code, out.as_str()), (1, ""));
    assert_eq!(
        err.trim(),
        "cachectl: refused: invalid regex at 11: unclosed group"
    );
    let (code, _, err) = ctl(&d, &["purge", "--tag", "has space"]);
    assert_eq!(code, 1, "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_path_without_a_host_is_bad_usage() {
    let (_origin, d) = catalog().await;
    for args in [
        &["purge", "/no-host"][..],
        &["inspect", "/no-host"],
        &["explain", "/no-host"],
    ] {
        let (code, out, err) = ctl(&d, args);
        assert_eq!((code, out.as_str()), (2, ""), "{args:?}: {err}");
        assert!(
            err.starts_with("cachectl: /no-host has no host: give http://host/path or "),
            "{err}"
        );
    }
    let (code, _, err) = ctl(&d, &["inspect", "/no-host", "--host", "www.example.com"]);
    assert_eq!(code, 0, "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_json_errors_are_json_on_stderr() {
    let (_origin, d) = catalog().await;
    let error = |err: &str| -> serde_json::Value {
        assert_eq!(err.lines().count(), 1, "{err}");
        json(err)["error"].clone()
    };
    let (code, out, err) = ctl(&d, &["--json", "ban", "req.url ~ \"(^/x\""]);
    assert_eq!((code, out.as_str()), (1, ""));
    let e = error(&err);
    assert_eq!(
        (e["code"].as_str(), e["exit_status"].as_u64()),
        (Some("invalid_ban"), Some(1))
    );
    assert_eq!(e["message"], "refused: invalid regex at 11: unclosed group");

    let (code, _, err) = ctl(&d, &["--json", "purge", "/no-host"]);
    assert_eq!((code, error(&err)["code"].as_str()), (2, Some("usage")));
    let (code, _, err) = ctl(&d, &["--json", "backend", "default", "drain"]);
    let e = error(&err);
    assert_eq!((code, e["code"].as_str()), (2, Some("usage")), "{err}");
    assert!(e["message"].as_str().unwrap().contains("drain"), "{err}");

    let free = unused_addr().to_string();
    let (code, out, err) = cachectl(&[
        "--json",
        "--admin",
        &free,
        "--secret",
        "/nonexistent",
        "stats",
    ]);
    assert_eq!((code, out.as_str()), (3, ""));
    assert_eq!(error(&err)["code"], "secret", "{err}");
}

#[test]
fn disk_finds_the_secret_of_a_daemon_started_with_disk() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secret"), "s3cret\n").unwrap();
    let free = unused_addr().to_string();
    let disk = dir.path().to_str().unwrap();
    // Unreachable, so the secret was read: without it the error is about the secret file.
    let (code, _, err) = cachectl(&["--admin", &free, "--disk", disk, "stats"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("cannot reach lacquerd"), "{err}");
    let (code, _, err) = cachectl(&["--admin", &free, "--disk", "/nonexistent", "stats"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("/nonexistent/secret"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn clear_errors_for_a_wrong_secret_and_a_missing_daemon() {
    let origin = Origin::start(|_| Reply::ok("x")).await;
    let d = Daemon::start(origin.addr, &[]);
    let dir = tempfile::tempdir().unwrap();
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "not-the-secret-at-all\n").unwrap();
    let admin = d.admin.to_string();
    let wrong = wrong.to_str().unwrap();

    let (code, _, err) = cachectl(&["--admin", &admin, "--secret", wrong, "stats"]);
    assert_eq!(code, 3);
    assert_eq!(
        err.trim(),
        format!("cachectl: unauthorized: the secret in {wrong} does not match")
    );

    let missing = dir.path().join("missing");
    let missing = missing.to_str().unwrap();
    let (code, _, err) = cachectl(&["--admin", &admin, "--secret", missing, "bans"]);
    assert_eq!(code, 3);
    assert_eq!(
        err.trim(),
        format!("cachectl: cannot read the admin secret {missing}: no such file or directory (run as root or the lacquer user, or pass --secret FILE)")
    );

    let (code, out, _) = cachectl(&["--admin", &admin, "health"]);
    assert_eq!(code, 0, "health needs no secret");
    assert!(
        out.starts_with(&format!(
            "ok: lacquerd {} at {admin}, up ",
            env!("CARGO_PKG_VERSION")
        )),
        "{out}"
    );

    let free = unused_addr().to_string();
    let (code, _, err) = cachectl(&["--admin", &free, "--secret", wrong, "stats"]);
    assert_eq!(code, 3);
    assert_eq!(
        err.trim(),
        format!("cachectl: cannot reach lacquerd at {free}: connection refused (is the service running?)")
    );

    // The proxy port is not the admin port.
    let (code, _, err) = cachectl(&["--admin", &d.addr.to_string(), "--secret", wrong, "stats"]);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("does not answer like lacquerd's admin API"),
        "{err}"
    );

    for usage in [
        &["frobnicate"][..],
        &["purge"],
        &["purge", "/a", "--tag", "t"],
        &["ban"],
    ] {
        let (code, _, err) = cachectl(usage);
        assert_eq!(code, 2, "{usage:?}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_config_file_says_where_the_daemon_is() {
    let (_origin, d) = daemon_with_traffic().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("lacquer.toml");
    std::fs::write(
        &config,
        format!(
            "[backend]\naddress = \"127.0.0.1:9\"\n\n[admin]\nlisten = \"{}\"\nsecret_file = \"{}\"\n",
            d.admin,
            d.secret_file().display()
        ),
    )
    .unwrap();
    let (code, out, err) = cachectl(&["--config", config.to_str().unwrap(), "--json", "stats"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["proxy"]["hits"], 2);

    let store_only = dir.path().join("store-only.toml");
    let store = d.secret_file().parent().unwrap().to_owned();
    std::fs::write(
        &store_only,
        format!(
            "[admin]\nlisten = \"{}\"\n[storage]\ndir = \"{}\"\n",
            d.admin,
            store.display()
        ),
    )
    .unwrap();
    let (code, _, err) = cachectl(&["--config", store_only.to_str().unwrap(), "bans"]);
    assert_eq!(code, 0, "the secret is found in the store directory: {err}");

    let broken = dir.path().join("broken.toml");
    std::fs::write(&broken, "[admin]\nlisten = 6082\n").unwrap();
    let (code, _, err) = cachectl(&["--config", broken.to_str().unwrap(), "stats"]);
    assert_eq!(code, 2);
    assert!(
        err.starts_with(&format!("cachectl: {}:2: ", broken.display())),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn log_follows_requests_as_access_log_lines() {
    let origin = Origin::start(|s| match s.path.as_str() {
        "/missing" => Reply::ok("no").status(404),
        _ => Reply::ok("x"),
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    // Each follower's lines arrive through a channel, so the test can keep making requests until the
    // follower is connected.
    let follow = |args: &[&str]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cachectl"))
            .args(["--admin", &d.admin.to_string(), "--secret"])
            .arg(d.secret_file())
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        (child, rx)
    };
    let (mut text, text_lines) = follow(&["log", "--status", "4xx"]);
    let (mut records, record_lines) = follow(&["--json", "log", "--url", "/a"]);
    let (mut line, mut record) = (None, None);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while line.is_none() || record.is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "followers silent for 10 s"
        );
        get(d.addr, "/a").await;
        get(d.addr, "/missing").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        line = line.or_else(|| text_lines.try_recv().ok());
        record = record.or_else(|| record_lines.try_recv().ok());
    }
    let line = line.unwrap();
    assert!(
        line.starts_with("127.0.0.1 - - [") && line.contains("/missing HTTP/1.1\" 404 "),
        "{line}"
    );
    let record = json(&record.unwrap());
    assert_eq!(
        (record["url"].as_str(), record["status"].as_u64()),
        (Some("/a"), Some(200))
    );
    for child in [&mut text, &mut records] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let (code, _, err) = ctl(&d, &["log", "--status", "9xx"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("status"), "{err}");
}

/// `cachectl log | head -1` and `cachectl stats | true`: a reader that goes away ends cachectl quietly,
/// with status 0, as `head` expects of the command before it.
#[tokio::test(flavor = "multi_thread")]
async fn a_closed_pipe_ends_cachectl_quietly() {
    let origin = Origin::start(|_| Reply::ok("x")).await;
    let d = Daemon::start(origin.addr, &[]);
    for args in [&["stats"][..], &["log"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cachectl"))
            .args(["--admin", &d.admin.to_string(), "--secret"])
            .arg(d.secret_file())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader is gone before anything is written.
        drop(child.stdout.take());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{args:?} still running"
            );
            get(d.addr, "/a").await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!((status.code(), err.as_str()), (Some(0), ""), "{args:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn top_counts_requests_by_url_and_by_status_over_its_window() {
    let origin = Origin::start(|s| match s.path.as_str() {
        "/gone" => Reply::ok("no").status(404),
        _ => Reply::ok("x").header("cache-control", "max-age=60"),
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    let top = |by: &str| {
        Command::new(env!("CARGO_BIN_EXE_cachectl"))
            .args(["--admin", &d.admin.to_string(), "--secret"])
            .arg(d.secret_file())
            .args(["--json", "top", "--by", by, "--for", "3", "--window", "60"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (by_url, by_status) = (top("url"), top("status"));
    // Twice as many for /a as for /gone, for as long as the followers count.
    let until = std::time::Instant::now() + Duration::from_millis(2500);
    while std::time::Instant::now() < until {
        get(d.addr, "/a").await;
        get(d.addr, "/a").await;
        get(d.addr, "/gone").await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let table = |child: std::process::Child| {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        json(&String::from_utf8(out.stdout).unwrap())
    };
    let urls = table(by_url);
    let rows = urls["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{urls}");
    assert!(rows[0]["key"].as_str().unwrap().ends_with("/a"), "{urls}");
    assert!(
        rows[1]["key"].as_str().unwrap().ends_with("/gone"),
        "{urls}"
    );
    let (a, gone) = (
        rows[0]["count"].as_u64().unwrap(),
        rows[1]["count"].as_u64().unwrap(),
    );
    assert!(gone >= 5 && a >= 2 * gone - 2, "{urls}");
    // Three seconds counted of a 60 s window: the rate is over those three.
    let span = urls["window_seconds"].as_f64().unwrap();
    assert!((2.0..=4.0).contains(&span), "{urls}");
    let rate = rows[0]["per_second"].as_f64().unwrap();
    // `window_seconds` is rounded to the second; the rate is over the span itself.
    assert!((rate * span / a as f64 - 1.0).abs() < 0.2, "{urls}");
    let statuses = table(by_status);
    let keys: Vec<&str> = statuses["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["200", "404"], "{statuses}");
}

/// `cachectl trace` shows each matching request as varnishlog groups one: a request line, a line per step,
/// then the response.
#[tokio::test(flavor = "multi_thread")]
async fn trace_shows_the_steps_of_matching_requests() {
    let origin = Origin::start(|_| Reply::ok("x").header("cache-control", "max-age=60")).await;
    let d = Daemon::start(origin.addr, &[]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_cachectl"))
        .args(["--admin", &d.admin.to_string(), "--secret"])
        .arg(d.secret_file())
        .args(["trace", "--url", "/traced", "--client", "127.0.0.1"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut lines = Vec::new();
    // Until one whole request has been shown: its block ends with an empty line.
    while !lines.iter().any(|l: &String| l.is_empty()) {
        assert!(
            std::time::Instant::now() < deadline,
            "no trace in 10 s: {lines:?}"
        );
        get(d.addr, "/other").await;
        get(d.addr, "/traced").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        lines.extend(rx.try_iter());
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let block: Vec<&String> = lines.iter().take_while(|l| !l.is_empty()).collect();
    assert!(
        block[0].starts_with("* GET http://127.0.0.1:")
            && block[0].ends_with("/traced HTTP/1.1 from 127.0.0.1"),
        "{block:#?}"
    );
    let tags: Vec<&str> = block[1..]
        .iter()
        .map(|l| {
            let mut words = l.split_whitespace();
            assert_eq!((words.next(), words.nth(1)), (Some("-"), Some("ms")), "{l}");
            words.next().unwrap()
        })
        .collect();
    for tag in ["Route", "Class", "Key", "Lookup", "Response", "End"] {
        assert!(tags.contains(&tag), "{tag} missing: {block:#?}");
    }
    assert!(
        !lines.iter().any(|l| l.contains("/other")),
        "only the matching requests: {lines:#?}"
    );
}

/// `cachectl trace -q` selects by any field, headers included, as `varnishlog -q`; `--headers` shows them;
/// `cachectl top --by header:NAME` counts by a request header's value, as `varnishtop -i ReqHeader`.
#[tokio::test(flavor = "multi_thread")]
async fn trace_queries_and_headers_and_top_by_a_header() {
    let origin = Origin::start(|seen| match seen.path.as_str() {
        "/missing" => Reply::ok("no").status(404).header("x-why", "gone"),
        _ => Reply::ok("x").header("cache-control", "max-age=60"),
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    let spawn = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_cachectl"))
            .args(["--admin", &d.admin.to_string(), "--secret"])
            .arg(d.secret_file())
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut child = spawn(&[
        "trace",
        "-q",
        "status >= 400 and resp.http.x-why ~ gone and req.http.x-device == tablet",
        "--headers",
    ]);
    let top = spawn(&["--json", "top", "--by", "header:X-Device", "--for", "3"]);
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let ask = |path: &'static str, device: &'static str| {
        let addr = d.addr;
        async move {
            lacquer_tests::request(
                addr,
                http::Method::GET,
                path,
                &[("x-device", device)],
                Default::default(),
            )
            .await
            .unwrap()
        }
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut lines = Vec::new();
    while !lines.iter().any(|l: &String| l.is_empty()) {
        assert!(
            std::time::Instant::now() < deadline,
            "no trace in 10 s: {lines:?}"
        );
        ask("/missing", "phone").await;
        ask("/found", "tablet").await;
        ask("/missing", "tablet").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        lines.extend(rx.try_iter());
    }
    // Counted for at least the three seconds `top` runs.
    let until = std::time::Instant::now() + Duration::from_millis(3200);
    while std::time::Instant::now() < until {
        ask("/found", "tablet").await;
        ask("/found", "tablet").await;
        ask("/found", "phone").await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let block: Vec<&String> = lines.iter().take_while(|l| !l.is_empty()).collect();
    assert!(
        block[0].ends_with("/missing HTTP/1.1 from 127.0.0.1"),
        "{block:#?}"
    );
    assert!(
        block
            .iter()
            .any(|l| l.contains("ReqHeader x-device: tablet")),
        "{block:#?}"
    );
    assert!(
        block.iter().any(|l| l.contains("RespHeader x-why: gone")),
        "{block:#?}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("/found") || l.contains("x-device: phone")),
        "only what the query selects: {lines:#?}"
    );
    let out = top.wait_with_output().unwrap();
    assert!(out.status.success());
    let table = json(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(table["by"], "header:x-device", "{table}");
    let rows = table["rows"].as_array().unwrap();
    assert_eq!(rows[0]["key"], "tablet", "{table}");
    assert_eq!(rows[1]["key"], "phone", "{table}");
    let (tablets, phones) = (
        rows[0]["count"].as_u64().unwrap(),
        rows[1]["count"].as_u64().unwrap(),
    );
    assert!(tablets >= 2 * phones - 2 && phones >= 5, "{table}");
}

/// varnishlog goes on through a restart of varnishd; `cachectl log` went away with exit status 3.
#[tokio::test(flavor = "multi_thread")]
async fn log_goes_on_through_a_restart_of_the_daemon() {
    let origin = Origin::start(|_| Reply::ok("x")).await;
    let admin = unused_addr().to_string();
    let mut d = Daemon::start(origin.addr, &["--admin", &admin]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_cachectl"))
        .args(["--admin", &admin, "--secret"])
        .arg(d.secret_file())
        .arg("log")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = |pipe: Box<dyn std::io::Read + Send>| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        rx
    };
    let out = lines(Box::new(child.stdout.take().unwrap()));
    let err = lines(Box::new(child.stderr.take().unwrap()));
    // Requests until the follower shows one whose path says which daemon answered it.
    async fn seen(d: &Daemon, path: &str, out: &std::sync::mpsc::Receiver<String>) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "no {path} line in 20 s"
            );
            get(d.addr, path).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            if out.try_iter().any(|l| l.contains(path)) {
                return;
            }
        }
    }
    seen(&d, "/before", &out).await;
    d.stop();
    let d = d.restart();
    seen(&d, "/after", &out).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "cachectl log still follows"
    );
    let said: Vec<String> = err.try_iter().collect();
    assert!(
        said.iter().any(|l| l.contains("reconnecting"))
            && said.iter().any(|l| l.contains("reconnected")),
        "{said:?}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn backends_show_health_from_real_traffic() {
    let origin = Origin::start(|_| Reply::ok("x")).await;
    let d = Daemon::start(origin.addr, &[]);
    let (code, out, _) = ctl(&d, &["--json", "backends"]);
    assert_eq!(code, 0);
    assert_eq!(json(&out)["backends"][0]["health"], "unknown");
    get(d.addr, "/a").await;
    let (_, out, _) = ctl(&d, &["backends"]);
    let row: Vec<&str> = out.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        row[..8],
        [
            "default",
            &origin.addr.to_string(),
            "healthy",
            "auto",
            "-",
            "1",
            "0",
            "0"
        ],
        "{out}"
    );

    origin.stop();
    get(d.addr, "/b").await;
    let (_, out, _) = ctl(&d, &["--json", "backends"]);
    let backend = &json(&out)["backends"][0];
    assert_eq!(backend["health"], "failing", "{backend}");
    // 2 when the fill first tried a pooled connection the stopped origin had just closed (then retried).
    let failures = backend["consecutive_failures"].as_u64().unwrap();
    assert!((1..=2).contains(&failures), "{backend}");
    let message = backend["last_error"]["message"].as_str().unwrap();
    assert!(message.contains("unreachable"), "{message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn backend_forces_health_and_backends_shows_it() {
    let origin = Origin::start(|_| Reply::ok("x")).await;
    let d = Daemon::start(origin.addr, &[]);
    let (code, out, err) = ctl(&d, &["backend", "default", "sick"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "backend default: forced sick (it has no probe; `cachectl backend default auto` hands it back)\n"
    );
    let (_, out, _) = ctl(&d, &["backends"]);
    let row: Vec<&str> = out.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[2..4], ["sick", "sick"], "{out}");
    let r = get(d.addr, "/a").await;
    assert_eq!(r.status, 503);
    assert_eq!(origin.total(), 0, "a drained backend gets nothing");

    let (code, out, _) = ctl(&d, &["--json", "backend", "default", "auto"]);
    assert_eq!(code, 0);
    let view = json(&out);
    assert_eq!(
        (&view["admin"], &view["health"]),
        (&"auto".into(), &"unknown".into()),
        "{view}"
    );
    assert_eq!(get(d.addr, "/a").await.status, 200);
    assert_eq!(origin.total(), 1);

    let (code, out, err) = ctl(&d, &["backend", "nope", "sick"]);
    assert_eq!((code, out.as_str()), (1, ""));
    assert_eq!(
        err,
        "cachectl: refused: no backend is named \"nope\" (the backends are default)\n"
    );
    let (code, _, err) = ctl(&d, &["backend", "default", "drain"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("give sick, healthy or auto"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn reload_applies_the_cache_policy_and_reports_the_rest() {
    let origin = Origin::start(|_| Reply::ok("no freshness information")).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("lacquer.toml");
    let write = |ttl: &str, sweep: &str| {
        std::fs::write(
            &config,
            format!("[cache]\ndefault_ttl = \"{ttl}\"\n[storage]\nsweep_interval = \"{sweep}\"\n"),
        )
        .unwrap()
    };
    write("0s", "60s");
    let d = Daemon::start(origin.addr, &["--config", config.to_str().unwrap()]);
    get(d.addr, "/a").await;
    get(d.addr, "/a").await;
    assert_eq!(origin.count("/a"), 2, "not cached without a default TTL");

    write("5m", "30s");
    let (code, out, err) = ctl(&d, &["reload"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        format!(
            "reloaded {}\n  applied      cache.default_ttl\n  not applied  storage.sweep_interval (takes effect on restart)\n",
            config.display()
        )
    );
    get(d.addr, "/b").await;
    assert_eq!(get(d.addr, "/b").await.x_cache(), "HIT");
    assert_eq!(origin.count("/b"), 1, "cached with the new default TTL");

    std::fs::write(&config, "[cache]\ndefault_ttl = \"soon\"\n").unwrap();
    let (code, _, err) = ctl(&d, &["reload"]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with(&format!(
            "cachectl: refused: {}:2:15: cache.default_ttl:",
            config.display()
        )),
        "{err}"
    );
    get(d.addr, "/c").await;
    get(d.addr, "/c").await;
    assert_eq!(origin.count("/c"), 1, "a bad file changes nothing");

    write("0s", "30s");
    d.sighup();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    // The first reload, through the API, logged the same line.
    while d.log().matches("applied=[\"cache.default_ttl\"]").count() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "SIGHUP did not reload: {}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    get(d.addr, "/d").await;
    get(d.addr, "/d").await;
    assert_eq!(
        origin.count("/d"),
        2,
        "SIGHUP applied default_ttl = 0 again"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn explain_reads_like_a_report_and_asks_nothing_of_the_origin() {
    let origin = Origin::start(|_| Reply::ok("page").header("cache-control", "max-age=60")).await;
    let d = Daemon::with_config(
        origin.addr,
        r#"
        [[listen]]
        address = "127.0.0.1:0"
        [[rule]]
        name = "old"
        match = { path_regex = "^/old/(.*)$" }
        respond = { status = 301, location = "/new/$1" }
        [[rule]]
        name = "device"
        match = { headers = { "x-device" = "" } }
        key = ["x-device"]
        "#,
    );
    get(d.addr, "/page").await;
    d.wait_for_stats("/page stored", |s| s["store"]["objects_published"] == 1)
        .await;
    let seen = origin.total();
    let url = format!("http://{}/page", d.addr);

    let (code, out, err) = ctl(&d, &["explain", &url, "-H", "X-Device: mobile"]);
    assert_eq!(code, 0, "{err}");
    for line in [
        "action      lookup\n".to_owned(),
        format!("key         {}/page\n", d.addr),
        "key fields  x-device, accept-encoding\n".to_owned(),
        "rules       request           old     -\n".to_owned(),
        "            request           device  matched\n".to_owned(),
        "to origin   GET /page\n".to_owned(),
        "            x-device: mobile\n".to_owned(),
    ] {
        assert!(out.contains(&line), "{line:?} not in\n{out}");
    }

    let (code, out, err) = ctl(&d, &["explain", &url, "--json"]);
    assert_eq!(code, 0, "{err}");
    let doc = json(&out);
    assert_eq!(doc["action"], "lookup");
    assert_eq!(doc["stored"]["state"], "fresh", "{doc}");
    assert_eq!(doc["stored"]["response"]["status"], 200, "{doc}");

    let old = format!("http://{}/old/x", d.addr);
    let (code, out, err) = ctl(&d, &["explain", &old, "-X", "HEAD", "--client", "10.1.2.3"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("action      synthetic\n"), "{out}");
    assert!(
        out.contains("synthetic   301\n") && out.contains("            location: /new/x\n"),
        "{out}"
    );
    assert!(
        !out.contains("to origin"),
        "nothing leaves for the origin: {out}"
    );

    let (code, _, err) = ctl(&d, &["explain", "/page"]);
    assert_eq!(code, 2, "bad usage: {err}");
    assert!(err.contains("has no host"), "{err}");
    let (code, _, err) = ctl(&d, &["explain", &url, "-H", "no colon"]);
    assert_eq!(code, 2, "bad usage: {err}");
    assert!(err.contains("'Name: value'"), "{err}");

    assert_eq!(
        origin.total(),
        seen,
        "explain sends nothing: {:?}",
        origin.seen()
    );
}

#[test]
fn completions_for_the_usual_shells() {
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, err) = cachectl(&["completions", shell]);
        assert_eq!(code, 0, "{err}");
        assert!(
            out.contains("cachectl")
                && out.contains("purge")
                && out.contains("cluster")
                && out.contains("explain")
                && out.contains("header"),
            "{shell}"
        );
    }
}

/// `cachectl warm`: a list (and an access log) fetched through the cache at the rate and concurrency given,
/// then what happened to each URL, from `Cache-Status`; what is stored is served to the next client.
#[tokio::test(flavor = "multi_thread")]
async fn warm_fetches_a_list_through_the_cache_and_says_what_was_stored() {
    let origin = Origin::start(|seen| {
        let reply = Reply::ok(format!("page {}", seen.path)).delay(Duration::from_millis(50));
        match seen.path.as_str() {
            "/account" => reply.header("cache-control", "private"),
            _ => reply.header("cache-control", "max-age=600"),
        }
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("urls.txt");
    std::fs::write(
        &list,
        "# the shop\nhttp://shop.test/\nhttp://shop.test/p/1\n/p/2\nhttp://shop.test/account\nhttp://shop.test/p/1\n",
    )
    .unwrap();
    let via = d.addr.to_string();
    let args = |extra: &[&'static str]| {
        let mut all = vec![
            "warm",
            list.to_str().unwrap(),
            "--host",
            "shop.test",
            "--via",
            &via,
            "--concurrency",
            "1",
        ];
        all.extend_from_slice(extra);
        all.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let run = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            cachectl(&refs)
        })
    };
    let (status, out, err) = run(args(&["--rate", "20"])).await.unwrap();
    assert_eq!(status, 0, "{err}");
    assert!(
        out.starts_with("4 URLs in ")
            && out.contains(": 0 already cached, 3 stored, 1 not stored, 0 failed"),
        "{out}"
    );
    assert!(out.contains("  not stored: private: 1"), "{out}");
    assert_eq!(origin.max_in_flight(), 1, "--concurrency 1");
    assert_eq!(origin.total(), 4, "each URL once");
    d.wait_for_stats("stored", |s| {
        s["store"]["objects_published"].as_u64() >= Some(3)
    })
    .await;
    // What was warmed is a hit for the next client, and for the next warm run.
    let hit = lacquer_tests::request(
        d.addr,
        http::Method::GET,
        "/p/2",
        &[("host", "shop.test")],
        Default::default(),
    )
    .await
    .unwrap();
    assert_eq!(hit.x_cache(), "HIT");
    let (status, out, _) = run(args(&["--json"])).await.unwrap();
    assert_eq!(status, 0);
    let summary = json(&out);
    assert_eq!(summary["cached"], 3, "{summary}");
    assert_eq!(summary["not_stored"]["private"], 1);
    // From an access log in lacquerd's own format: its GETs, each once.
    let log = dir.path().join("access.log");
    std::fs::write(
        &log,
        "203.0.113.7 - - [30/Nov/2026:07:36:14 +0000] \"GET http://shop.test/p/3 HTTP/1.1\" 200 5 \"-\" \"x\" MISS 0.01 0.01 -\n\
         203.0.113.7 - - [30/Nov/2026:07:36:15 +0000] \"POST http://shop.test/cart HTTP/1.1\" 200 5 \"-\" \"x\" PASS 0.01 0.01 -\n\
         203.0.113.7 - - [30/Nov/2026:07:36:16 +0000] \"GET http://shop.test/p/3 HTTP/1.1\" 200 5 \"-\" \"x\" HIT 0.0 0.0 -\n",
    )
    .unwrap();
    let from_log = vec![
        "warm".to_owned(),
        "--from-log".to_owned(),
        log.to_str().unwrap().to_owned(),
        "--via".to_owned(),
        via.clone(),
    ];
    let (status, out, err) = run(from_log).await.unwrap();
    assert_eq!(status, 0, "{err}");
    assert!(
        out.starts_with("1 URLs in ") && out.contains("1 stored"),
        "{out}"
    );
    assert_eq!(origin.count("/p/3"), 1);
    assert_eq!(origin.count("/cart"), 0, "only GETs are warmed");
}

#[tokio::test(flavor = "multi_thread")]
async fn warm_reads_a_sitemap_index_and_its_gzipped_sitemaps() {
    let gzipped = {
        let urlset = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
            <urlset xmlns=\"http://www.sitemaps.org/schemas/sitemap/0.9\">\n\
            <url><loc>http://shop.test/p/1?ref=map&amp;x=1</loc></url>\n\
            <url><loc>http://shop.test/p/2</loc></url>\n\
            <url><loc>http://shop.test/</loc></url>\n\
            </urlset>\n";
        let mut gzip = std::process::Command::new("gzip")
            .arg("-c")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("gzip runs");
        use std::io::Write;
        gzip.stdin
            .take()
            .unwrap()
            .write_all(urlset.as_bytes())
            .unwrap();
        gzip.wait_with_output().unwrap().stdout
    };
    let origin = Origin::start(move |seen| {
        let xml = |body: String| {
            Reply::ok(body)
                .header("content-type", "application/xml")
                .header("cache-control", "no-store")
        };
        match seen.path.as_str() {
            "/sitemap.xml" => xml(
                "<sitemapindex xmlns=\"http://www.sitemaps.org/schemas/sitemap/0.9\">\n\
                 <sitemap><loc>http://shop.test/sitemap-pages.xml</loc></sitemap>\n\
                 <sitemap><loc>http://shop.test/sitemap-products.xml.gz</loc></sitemap>\n\
                 </sitemapindex>"
                    .into(),
            ),
            "/sitemap-pages.xml" => xml(
                "<urlset xmlns=\"http://www.sitemaps.org/schemas/sitemap/0.9\">\n\
                 <url><loc>http://shop.test/</loc></url>\n\
                 <url><loc>http://shop.test/about</loc></url>\n\
                 </urlset>"
                    .into(),
            ),
            // A `.xml.gz` file as a web server sends one: gzip'd bytes, no `Content-Encoding`.
            "/sitemap-products.xml.gz" => Reply::ok(gzipped.clone())
                .header("content-type", "application/gzip")
                .header("cache-control", "no-store"),
            _ => Reply::ok(format!("page {}", seen.path)).header("cache-control", "max-age=600"),
        }
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    let via = d.addr.to_string();
    let warm = |via: String| {
        tokio::task::spawn_blocking(move || {
            cachectl(&[
                "warm",
                "--sitemap",
                "http://shop.test/sitemap.xml",
                "--via",
                &via,
                "--rate",
                "50",
            ])
        })
    };
    let (status, out, err) = warm(via.clone()).await.unwrap();
    assert_eq!(status, 0, "{err}");
    assert!(
        out.starts_with("4 URLs in ") && out.contains(": 0 already cached, 4 stored, 0 not stored"),
        "{out}"
    );
    // Each page once, the entity in the query resolved; the sitemaps themselves were read once each.
    for path in ["/", "/about", "/p/1?ref=map&x=1", "/p/2"] {
        assert_eq!(origin.count(path), 1, "{path}");
    }
    assert_eq!(origin.count("/sitemap-products.xml.gz"), 1);
    let (status, out, _) = warm(via.clone()).await.unwrap();
    assert_eq!(status, 0);
    assert!(out.contains(": 4 already cached, 0 stored"), "{out}");
    // Not a sitemap: said so, exit 1.
    let (status, _, err) = tokio::task::spawn_blocking(move || {
        cachectl(&["warm", "--sitemap", "http://shop.test/p/2", "--via", &via])
    })
    .await
    .unwrap();
    assert_eq!(status, 1);
    assert!(err.contains("not a sitemap"), "{err}");
}
