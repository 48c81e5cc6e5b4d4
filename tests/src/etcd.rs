//! A real etcd (Debian's `etcd-server`) on loopback with a data directory of its own, and a relay that
//! can cut a node off from it the way a partition does: packets stop, connections stay open.

use std::{
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering::SeqCst},
        Arc,
    },
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

const ETCD: &str = "/usr/bin/etcd";
const ETCDCTL: &str = "/usr/bin/etcdctl";

pub struct Etcd {
    /// The client URL's `host:port`.
    pub addr: SocketAddr,
    peer: SocketAddr,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Etcd {
    /// A single-member etcd on loopback, ready to serve; `None` (with the reason printed) when Debian's
    /// etcd-server is not installed.
    pub fn start() -> Option<Etcd> {
        if !Path::new(ETCD).exists() || !Path::new(ETCDCTL).exists() {
            println!(
                "skipped: {ETCD} or {ETCDCTL} missing (apt-get install etcd-server etcd-client)"
            );
            return None;
        }
        let mut etcd = Etcd {
            addr: crate::unused_addr(),
            peer: crate::unused_addr(),
            child: None,
            dir: tempfile::tempdir().expect("etcd directory"),
        };
        etcd.launch();
        Some(etcd)
    }

    /// Replaces this etcd by an empty one on the same addresses, as a restore from an old backup (or a new
    /// cluster) would: its revision starts over.
    pub fn replace_with_empty(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        std::fs::remove_dir_all(self.dir.path().join("data")).expect("etcd data removed");
        self.launch();
    }

    fn launch(&mut self) {
        let (addr, peer, dir) = (self.addr, self.peer, &self.dir);
        let client_url = format!("http://{addr}");
        let peer_url = format!("http://{peer}");
        let child = Command::new(ETCD)
            .args(["--name", "t", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("t={peer_url}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.ctl(&["endpoint", "health"]).is_err() {
            assert!(Instant::now() < deadline, "etcd did not become healthy");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `http://host:port`, for `cluster.etcd`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Runs `etcdctl` against this etcd; its standard output, or its standard error as the error.
    pub fn ctl(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(ETCDCTL)
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.url(), "--command-timeout=3s"])
            .args(args)
            .output()
            .expect("etcdctl runs");
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        if out.status.success() {
            Ok(text(&out.stdout))
        } else {
            Err(text(&out.stderr))
        }
    }

    /// etcd's current revision.
    pub fn revision(&self) -> u64 {
        let out = self
            .ctl(&["endpoint", "status", "-w", "json"])
            .expect("endpoint status");
        let status: serde_json::Value = serde_json::from_str(&out).expect("status JSON");
        status[0]["Status"]["header"]["revision"]
            .as_u64()
            .expect("a revision")
    }

    /// The revision of the last invalidation in the log under `/test`, the tests' prefix.
    pub fn revision_of_log(&self) -> u64 {
        let out = self
            .ctl(&["get", "/test/invalidations", "-w", "json"])
            .expect("get");
        let got: serde_json::Value = serde_json::from_str(&out).expect("get JSON");
        got["kvs"][0]["mod_revision"].as_u64().unwrap_or(0)
    }

    /// Compacts the history up to the current revision: a watch from before it can no longer be served.
    pub fn compact_all(&self) {
        let revision = self.revision().to_string();
        self.ctl(&["compaction", &revision]).expect("compaction");
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A TCP relay to `target`; [`Relay::cut`] makes it a black hole (nothing passes either way, nothing is
/// closed), as a partitioned network is, until [`Relay::heal`].
pub struct Relay {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    pub async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("relay");
        let addr = listener.local_addr().expect("relay address");
        let cut = Arc::new(AtomicBool::new(false));
        let flag = cut.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let flag = flag.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(pipe(cr, sw, flag.clone()), pipe(sr, cw, flag));
                });
            }
        });
        Relay { addr, cut, task }
    }

    pub fn cut(&self) {
        self.cut.store(true, SeqCst);
    }

    pub fn heal(&self) {
        self.cut.store(false, SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to`, holding whatever arrives while the relay is cut (as a partition delays it) and
/// delivering nothing until it heals.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while cut.load(SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
