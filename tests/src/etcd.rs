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
    tls: Option<Tls>,
    /// `root:<password>` once authentication is enabled.
    root: Option<String>,
}

/// The files of an etcd that serves TLS and asks clients for a certificate.
pub struct Tls {
    /// The test CA's certificate, that etcd's and the clients' certificates are signed by.
    pub ca: String,
    /// A client certificate (and its key) the CA signed, that etcd accepts.
    pub client_cert: String,
    pub client_key: String,
    server_cert: String,
    server_key: String,
}

impl Etcd {
    /// A single-member etcd on loopback, ready to serve; `None` (with the reason printed) when Debian's
    /// etcd-server is not installed.
    pub fn start() -> Option<Etcd> {
        Self::start_with(None, None)
    }

    /// As [`Etcd::start`], serving only TLS with client certificates signed by `ca` when given, and with
    /// authentication enabled for user `root` with `password` when given.
    pub fn start_with(ca: Option<&crate::tls::TestCa>, password: Option<&str>) -> Option<Etcd> {
        if !Path::new(ETCD).exists() || !Path::new(ETCDCTL).exists() {
            println!(
                "skipped: {ETCD} or {ETCDCTL} missing (apt-get install etcd-server etcd-client)"
            );
            return None;
        }
        let dir = tempfile::tempdir().expect("etcd directory");
        let tls = ca.map(|ca| {
            let pem = dir.path().join("ca.pem");
            std::fs::write(&pem, ca.pem()).expect("CA written");
            let (server_cert, server_key) = ca.issue(dir.path(), "server", &["127.0.0.1"]);
            let (client_cert, client_key) = ca.issue(dir.path(), "client", &["client"]);
            Tls {
                ca: pem.display().to_string(),
                client_cert,
                client_key,
                server_cert,
                server_key,
            }
        });
        let mut etcd = Etcd {
            addr: crate::unused_addr(),
            peer: crate::unused_addr(),
            child: None,
            dir,
            tls,
            root: None,
        };
        etcd.launch();
        if let Some(password) = password {
            etcd.ctl(&[
                "user",
                "add",
                "root",
                &format!("--new-user-password={password}"),
            ])
            .expect("user add");
            etcd.ctl(&["auth", "enable"]).expect("auth enable");
            etcd.root = Some(format!("root:{password}"));
        }
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
        let (peer, dir) = (self.peer, &self.dir);
        let client_url = self.url();
        let peer_url = format!("http://{peer}");
        let mut command = Command::new(ETCD);
        if let Some(tls) = &self.tls {
            command
                .args([
                    "--cert-file",
                    &tls.server_cert,
                    "--key-file",
                    &tls.server_key,
                ])
                .args(["--client-cert-auth", "--trusted-ca-file", &tls.ca]);
        }
        let child = command
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

    /// `http://host:port` (`https://` with TLS), for `cluster.etcd`.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// The certificate files, when this etcd serves TLS.
    pub fn tls(&self) -> Option<&Tls> {
        self.tls.as_ref()
    }

    /// Runs `etcdctl` against this etcd; its standard output, or its standard error as the error.
    pub fn ctl(&self, args: &[&str]) -> Result<String, String> {
        let mut command = Command::new(ETCDCTL);
        command
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.url(), "--command-timeout=3s"]);
        if let Some(tls) = &self.tls {
            command.args([
                "--cacert",
                &tls.ca,
                "--cert",
                &tls.client_cert,
                "--key",
                &tls.client_key,
            ]);
        }
        if let Some(root) = &self.root {
            command.args(["--user", root]);
        }
        let out = command.args(args).output().expect("etcdctl runs");
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
