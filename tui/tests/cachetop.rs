//! `cachetop` against a real `lacquerd`: one frame as text, and the live screen in a real pseudo-terminal
//! (util-linux `script`), read back through a terminal emulator (`vt100`).

use std::{
    io::{Read, Write},
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicU64, Ordering::SeqCst},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use lacquer_admin::wire::{ProxyStats, Stats};
use lacquer_tests::{
    daemon_with_traffic,
    fake_admin::{view, FakeCluster, Member},
    run_tool, unused_addr, Daemon, Origin, Reply,
};

const ROWS: u16 = 30;
const COLS: u16 = 100;

fn cachetop(args: &[&str]) -> (i32, String, String) {
    run_tool(env!("CARGO_BIN_EXE_cachetop"), args)
}

/// The number after `label` on the screen line that starts with `│label`.
fn total(screen: &str, label: &str) -> Option<String> {
    let line = screen
        .lines()
        .find(|l| l.starts_with(&format!("│{label} ")))?;
    line.split_whitespace().nth(2).map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread")]
async fn once_prints_the_request_and_hit_counts() {
    let (_origin, d) = daemon_with_traffic().await;
    let admin = d.admin.to_string();
    let secret = d.secret_file();
    let secret = secret.to_str().unwrap();
    let (code, out, err) = cachetop(&[
        "--admin",
        &admin,
        "--secret",
        secret,
        "--once",
        "--no-color",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(total(&out, "requests").as_deref(), Some("3"), "{out}");
    assert_eq!(total(&out, "hits").as_deref(), Some("2"), "{out}");
    assert!(out.contains("hit ratio 66.7 %"), "{out}");
    assert!(out.contains("default 127.0.0.1:"), "backends shown: {out}");
    let rate = |label: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("│{label} ")))
            .and_then(|l| l.split_whitespace().nth(1))
            .map(str::to_owned)
    };
    assert_eq!(
        rate("requests").as_deref(),
        Some("0.0/s"),
        "two samples make a rate: {out}"
    );
    assert!(
        out.contains("0.0/s fetches"),
        "the backends' rates too: {out}"
    );

    let free = unused_addr().to_string();
    let (code, _, err) = cachetop(&["--admin", &free, "--secret", secret, "--once"]);
    assert_eq!(code, 3);
    assert!(err.contains("cannot reach lacquerd"), "{err}");
}

/// `cachetop` on a pseudo-terminal of ROWS × COLS, its output collected as it comes.
struct Live {
    child: Child,
    output: Arc<Mutex<Vec<u8>>>,
}

impl Live {
    fn start(d: &Daemon) -> Live {
        Self::start_at(d.admin, &d.secret_file())
    }

    fn start_at(admin: SocketAddr, secret: &Path) -> Live {
        let command = format!(
            "stty rows {ROWS} cols {COLS}; exec {} --admin {admin} --secret {} --no-color",
            env!("CARGO_BIN_EXE_cachetop"),
            secret.display()
        );
        let mut child = Command::new("script")
            .args(["--quiet", "--return", "--command", &command, "/dev/null"])
            .env("TERM", "xterm-256color")
            .env_remove("LACQUER_CONFIG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("util-linux script runs");
        let mut stdout = child.stdout.take().unwrap();
        let output = Arc::new(Mutex::new(Vec::new()));
        let sink = output.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Live { child, output }
    }

    /// What a terminal shows after everything written so far.
    fn screen(&self) -> (String, bool) {
        let mut parser = vt100::Parser::new(ROWS, COLS, 0);
        parser.process(&self.output.lock().unwrap());
        let screen = parser.screen();
        (screen.contents(), screen.alternate_screen())
    }

    fn wait_for(&self, what: &str, check: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (screen, _) = self.screen();
            if check(&screen) {
                return screen;
            }
            assert!(Instant::now() < deadline, "no {what} on screen:\n{screen}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn keys(&mut self, keys: &[u8]) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(keys).unwrap();
        stdin.flush().unwrap();
    }

    fn exit_code(&mut self) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(
                Instant::now() < deadline,
                "cachetop did not exit:\n{}",
                self.screen().0
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Some(cachetop) = cachetop_pid(&self.child) {
            // SAFETY: kill(2) on a process this test started.
            unsafe { libc::kill(cachetop, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_live_screen_follows_the_daemon_and_restores_the_terminal() {
    let (_origin, mut d) = daemon_with_traffic().await;
    let mut live = Live::start(&d);
    let screen = live.wait_for("the request count", |s| {
        s.contains("lacquerd ")
            && s.lines()
                .any(|l| l.starts_with("│requests ") && l.contains(" 3 "))
    });
    assert!(screen.contains("hit ratio 66.7 %"), "{screen}");
    assert!(live.screen().1, "drawn on the alternate screen");

    for _ in 0..3 {
        lacquer_tests::get(d.addr, "/a").await;
    }
    live.wait_for("the new traffic", |s| {
        s.lines()
            .any(|l| l.starts_with("│requests ") && l.contains(" 6 "))
    });

    live.keys(b"\t");
    live.wait_for("the counters view", |s| s.contains("values; / to filter"));
    live.keys(b"/bans_p");
    let screen = live.wait_for("a filtered list", |s| s.contains("filter \"bans_p\": 1 of"));
    assert!(screen.contains("│store.bans_pending"), "{screen}");
    live.keys(b"\r?");
    live.wait_for("help", |s| s.contains(" cachetop help "));
    live.keys(b" \t");

    d.stop();
    live.wait_for("the lost daemon", |s| s.contains("disconnected — retrying"));

    live.keys(b"q");
    assert_eq!(live.exit_code(), 0);
    let (_, alternate) = live.screen();
    assert!(!alternate, "back on the main screen");
    let output = live.output.lock().unwrap().clone();
    let tail = String::from_utf8_lossy(&output[output.len().saturating_sub(200)..]).into_owned();
    assert!(
        tail.contains("\x1b[?25h"),
        "the cursor is shown again: {tail:?}"
    );
}

/// The process `script` runs on the pseudo-terminal: after the shell's `exec`, cachetop itself.
/// The top view follows the log stream while it is shown, and the latency view draws the daemon's
/// histograms.
#[tokio::test(flavor = "multi_thread")]
async fn the_top_and_latency_views_show_live_requests() {
    let (_origin, d) = daemon_with_traffic().await;
    let mut live = Live::start(&d);
    live.wait_for("the first frame", |s| s.contains("traffic"));
    live.keys(b"l");
    let screen = live.wait_for("the latency view", |s| {
        s.contains(" latency to the response head")
    });
    assert!(
        screen.contains("| hit ") && screen.contains("# miss "),
        "{screen}"
    );
    live.keys(b"t");
    live.wait_for("the top view", |s| s.contains(" top url over the last "));
    // Requests until the stream, opened when the view showed, has carried some to the screen.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        lacquer_tests::get(d.addr, "/top-of-the-list").await;
        let (screen, _) = live.screen();
        if screen.contains("/top-of-the-list") {
            break;
        }
        assert!(Instant::now() < deadline, "no top row in 20 s: {screen}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    live.keys(b"b");
    live.wait_for("the top hosts", |s| s.contains(" top host over the last "));
    live.keys(b"q");
    assert_eq!(live.exit_code(), 0);
}

fn cachetop_pid(script: &Child) -> Option<i32> {
    let script = script.id();
    let children =
        std::fs::read_to_string(format!("/proc/{script}/task/{script}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| !stat.contains(") Z "))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_terminal_that_goes_away_ends_it() {
    let (_origin, d) = daemon_with_traffic().await;
    let mut live = Live::start(&d);
    live.wait_for("the first frame", |s| s.contains("traffic"));
    let cachetop = cachetop_pid(&live.child).unwrap();
    // Killing `script` closes the pseudo-terminal, as a dropped SSH session or a closed window does.
    live.child.kill().unwrap();
    live.child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(cachetop) {
        if Instant::now() > deadline {
            // SAFETY: kill(2) on a process this test started.
            unsafe { libc::kill(cachetop, libc::SIGKILL) };
            panic!("cachetop outlived its terminal");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_and_sigterm_leave_cleanly() {
    let (_origin, d) = daemon_with_traffic().await;
    let mut live = Live::start(&d);
    live.wait_for("the first frame", |s| s.contains("traffic"));
    live.keys(b"\x03");
    assert_eq!(live.exit_code(), 0);
    assert!(!live.screen().1, "back on the main screen");

    let mut live = Live::start(&d);
    live.wait_for("the first frame", |s| s.contains("traffic"));
    let cachetop = cachetop_pid(&live.child).unwrap();
    // SAFETY: kill(2) on a process this test started.
    unsafe { libc::kill(cachetop, libc::SIGTERM) };
    assert_eq!(live.exit_code(), 0);
    assert!(!live.screen().1, "SIGTERM restores the terminal too");
}

/// An admin API without the statistics stream (an older daemon): the screen polls `/v1/stats` instead.
#[tokio::test(flavor = "multi_thread")]
async fn without_the_stream_it_polls_once_a_second() {
    let polls = Arc::new(AtomicU64::new(0));
    let counter = polls.clone();
    let older = Origin::start(move |seen| match seen.path.as_str() {
        "/v1/stats" => {
            let n = counter.fetch_add(1, SeqCst) + 1;
            let stats = Stats {
                version: "0.0.9".into(),
                uptime_seconds: n,
                proxy: ProxyStats {
                    requests: 100 * n,
                    ..Default::default()
                },
                ..Default::default()
            };
            Reply::ok(serde_json::to_vec(&stats).unwrap())
        }
        "/v1/backends" => Reply::ok(r#"{"backends": []}"#),
        _ => Reply::ok(r#"{"code": "not_found", "message": "no such admin route"}"#).status(404),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "0123456789abcdef0123456789abcdef\n").unwrap();
    let live = Live::start_at(older.addr, &secret);
    let screen = live.wait_for("polled statistics with a rate", |s| {
        s.contains("lacquerd 0.0.9")
            && s.lines().any(|l| {
                l.starts_with("│requests ")
                    && l.split_whitespace().nth(1).is_some_and(|rate| rate != "-")
            })
    });
    assert!(polls.load(SeqCst) >= 2, "{screen}");
    assert!(
        older.count("/v1/stats/stream") >= 1,
        "the stream was asked for first"
    );
}

/// The words of the screen line for cluster member `node` (its `│` borders dropped).
fn member_row(screen: &str, node: &str) -> Option<Vec<String>> {
    let line = screen
        .lines()
        .find(|l| l.trim_start_matches('│').split_whitespace().next() == Some(node))?;
    Some(
        line.split_whitespace()
            .map(|w| w.trim_matches('│').to_owned())
            .filter(|w| !w.is_empty())
            .collect(),
    )
}

/// Three members (the contract's `/v1/cluster`, a real daemon's `/v1/stats` document with other numbers),
/// the third down: `c` shows a row for each, the totals, and request rates as the counters move.
#[tokio::test(flavor = "multi_thread")]
async fn the_cluster_view_follows_every_member() {
    let (_origin, d) = daemon_with_traffic().await;
    let template = d.stats().await;
    let stats = |requests: u64, hits: u64, objects: u64| {
        let mut doc = template.clone();
        doc["proxy"]["requests"] = requests.into();
        doc["proxy"]["hits"] = hits.into();
        doc["proxy"]["misses"] = (requests - hits).into();
        doc["proxy"]["passes"] = 0.into();
        doc["store"]["objects"] = objects.into();
        doc
    };
    let cluster = FakeCluster::start(vec![
        Member::up("n1", view("serving", 50, 50, 0.0, 1), stats(1_000, 900, 40)),
        Member::up(
            "n2",
            view("lagging", 44, 50, 12.5, 0),
            stats(3_000, 1_500, 60),
        ),
        Member::down("n3"),
    ])
    .await;
    let mut live = Live::start_at(cluster.admins[0], &cluster.secret_file);
    live.wait_for("the first frame", |s| s.contains("traffic"));
    live.keys(b"c");
    let screen = live.wait_for("every member", |s| {
        ["n1", "n2", "n3", "total"]
            .iter()
            .all(|n| member_row(s, n).is_some())
    });
    let row = |node: &str| member_row(&screen, node).unwrap();
    assert_eq!(
        row("n1")[..7],
        ["n1", "*", "serving", "0", "0.0", "90.0", "%"]
    );
    assert_eq!(row("n2")[..6], ["n2", "lagging", "6", "12.5", "50.0", "%"]);
    assert_eq!(row("n3"), ["n3", "unreachable", "-", "-", "-", "-", "-"]);
    assert_eq!(
        row("total")[..7],
        ["total", "1/3", "serving", "6", "12.5", "60.0", "%"]
    );
    assert_eq!(row("total").last().unwrap(), "100", "objects summed");
    assert!(screen.contains("n3: connection refused"), "{screen}");

    cluster.set_stats(0, stats(1_600, 1_400, 45));
    let screen = live.wait_for("n1's request rate", |s| {
        member_row(s, "n1").is_some_and(|r| r.last().is_some_and(|o| o == "45"))
            && member_row(s, "n1").is_some_and(|r| r[7] != "-")
    });
    let n1 = member_row(&screen, "n1").unwrap();
    let n2 = member_row(&screen, "n2").unwrap();
    let total = member_row(&screen, "total").unwrap();
    let per_sec = |cell: &str| -> f64 {
        let number = cell.strip_suffix("/s").unwrap_or_else(|| panic!("{cell}"));
        number.parse().unwrap_or_else(|_| panic!("{cell}"))
    };
    // 600 more requests over one polling interval: 2 s, timed when each answer reaches the screen, so give
    // or take a loaded machine's scheduling.
    let rate = per_sec(&n1[7]);
    assert!((100.0..=600.0).contains(&rate), "{screen}");
    assert_eq!(n2[6], "0.0/s", "n2's counters did not move: {screen}");
    assert_eq!(
        total[7], n1[7],
        "the total is n1's rate plus n2's 0: {screen}"
    );
    assert_eq!(total.last().unwrap(), "105", "{screen}");

    live.keys(b"c");
    live.wait_for("the overview again", |s| s.contains("traffic"));
    live.keys(b"q");
    assert_eq!(live.exit_code(), 0);
}
