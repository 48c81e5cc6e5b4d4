//! A real HAProxy running the packaged example configuration (`packaging/haproxy.cfg`) with the test's
//! addresses put in, so that a test through it proves the file operators copy.

use std::{
    io::{Read, Write},
    net::SocketAddr,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

pub const BINARY: &str = "/usr/sbin/haproxy";

/// The packaged example configuration, as operators get it.
pub fn packaged() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../packaging/haproxy.cfg");
    std::fs::read_to_string(path).expect("packaging/haproxy.cfg")
}

/// One lacquerd node as the server lines name it: its client listener and its admin listener.
#[derive(Debug, Clone, Copy)]
pub struct Node {
    pub listen: SocketAddr,
    pub admin: SocketAddr,
}

/// `config` (the packaged text, or a variant of it) with: the frontend bound to `frontend`; the example's
/// server lines `n1`, `n2`, … pointed at `nodes` (client address and health-check port); checks every
/// `inter` (half that after a failure); and what a test process cannot or must not touch replaced (the
/// chroot, the user, daemon mode and maxconn; the log goes to standard error, the stats socket to `dir`). Panics when the file no
/// longer has what is substituted, so that a change to it is a change to this test.
pub fn configure(
    config: &str,
    frontend: SocketAddr,
    nodes: &[Node],
    inter: Duration,
    dir: &Path,
) -> String {
    let mut out = String::new();
    let mut servers = 0;
    let mut socket = false;
    for line in config.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let line = match words.as_slice() {
            ["chroot", ..] | ["user", ..] | ["group", ..] | ["daemon"] => continue,
            ["log", "/dev/log", ..] => "    log stderr format short local0".to_owned(),
            // HAProxy raises its descriptor limit to twice this, past what a test process may have.
            ["maxconn", _] => "    maxconn 1000".to_owned(),
            ["stats", "socket", ..] => {
                socket = true;
                format!(
                    "    stats socket {} mode 600 level admin",
                    dir.join("admin.sock").display()
                )
            }
            ["bind", ":80"] => format!("    bind {frontend}"),
            ["server", name, example, "id", id, "check", "port", _] => {
                let index: usize = id.parse().expect("server id");
                let node = nodes.get(index - 1);
                let Some(node) = node else { continue };
                assert!(example.starts_with("10.0.0."), "example address {example}");
                servers += 1;
                format!(
                    "    server {name} {} id {id} check addr {} port {}",
                    node.listen,
                    node.admin.ip(),
                    node.admin.port()
                )
            }
            ["default-server", "inter", "2s", "fastinter", "500ms", "downinter", "5s", rest @ ..] =>
            {
                let ms = inter.as_millis();
                format!(
                    "    default-server inter {ms}ms fastinter {}ms downinter {ms}ms {}",
                    (ms / 2).max(1),
                    rest.join(" ")
                )
            }
            _ => line.to_owned(),
        };
        out.push_str(&line);
        out.push('\n');
    }
    assert_eq!(servers, nodes.len(), "packaging/haproxy.cfg: server lines");
    assert!(socket, "packaging/haproxy.cfg: no stats socket line");
    assert!(
        out.contains(&format!("bind {frontend}")),
        "packaging/haproxy.cfg: no `bind :80`"
    );
    assert!(
        out.contains(&format!("default-server inter {}ms", inter.as_millis())),
        "packaging/haproxy.cfg: the default-server line changed"
    );
    out
}

pub struct Haproxy {
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Haproxy {
    /// Whether HAProxy is installed; prints why a test is skipped when it is not.
    pub fn available() -> bool {
        let there = Path::new(BINARY).exists();
        if !there {
            eprintln!("skipped: {BINARY} is missing (Debian's haproxy package; CI installs it)");
        }
        there
    }

    /// Checks `config` with `haproxy -c`, then starts HAProxy in the foreground on it and waits until the
    /// frontend `addr` accepts connections. `config` is made by `configure` with `dir` (this `TempDir`'s
    /// path) for the stats socket, hence the closure.
    pub fn start(addr: SocketAddr, config: impl FnOnce(&Path) -> String) -> Haproxy {
        let dir = tempfile::tempdir().expect("haproxy directory");
        let file = dir.path().join("haproxy.cfg");
        std::fs::write(&file, config(dir.path())).expect("haproxy.cfg");
        let check = Command::new(BINARY)
            .args(["-c", "-f"])
            .arg(&file)
            .output()
            .expect("haproxy -c runs");
        assert!(
            check.status.success(),
            "haproxy -c: {}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        let log = std::fs::File::create(dir.path().join("haproxy.log")).expect("log file");
        let child = Command::new(BINARY)
            .arg("-db")
            .arg("-f")
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("haproxy starts");
        let proxy = Haproxy {
            addr,
            dir,
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        // Its stats socket too: haproxy may open the listener before it, and a test asks it at once.
        while std::net::TcpStream::connect(addr).is_err()
            || UnixStream::connect(proxy.socket()).is_err()
        {
            assert!(
                Instant::now() < deadline,
                "haproxy did not listen on {addr} and its stats socket: {}",
                proxy.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        proxy
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("haproxy.log")).unwrap_or_default()
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("admin.sock")
    }

    /// `show stat` on the stats socket: one map from column name to value per proxy and server row.
    pub fn stat(&self) -> Vec<std::collections::HashMap<String, String>> {
        let mut stream = UnixStream::connect(self.socket()).expect("haproxy stats socket");
        stream.write_all(b"show stat\n").expect("show stat");
        let mut text = String::new();
        stream.read_to_string(&mut text).expect("show stat answer");
        let mut lines = text.lines();
        let header = lines.next().expect("show stat header");
        let names: Vec<&str> = header.trim_start_matches("# ").split(',').collect();
        lines
            .filter(|l| !l.is_empty())
            .map(|l| {
                names
                    .iter()
                    .zip(l.split(','))
                    .map(|(n, v)| (n.to_string(), v.to_owned()))
                    .collect()
            })
            .collect()
    }

    /// A column of one row of `show stat` (`server` is a server's name, or `BACKEND`).
    pub fn stat_of(&self, backend: &str, server: &str, column: &str) -> String {
        self.stat()
            .into_iter()
            .find(|row| row["pxname"] == backend && row["svname"] == server)
            .unwrap_or_else(|| panic!("no {backend}/{server} in show stat"))[column]
            .clone()
    }

    /// Waits until `server` of `backend` has the status `status` (`UP`, `DOWN`); returns how long it took.
    pub async fn wait_status(
        &self,
        backend: &str,
        server: &str,
        status: &str,
        timeout: Duration,
    ) -> Duration {
        let start = Instant::now();
        loop {
            let now = self.stat_of(backend, server, "status");
            if now == status {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < timeout,
                "{backend}/{server} still {now}, not {status}, after {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
