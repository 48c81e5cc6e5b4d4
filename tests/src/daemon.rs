//! The real `lacquerd` binary, started on ephemeral ports with a store directory of its own.

use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{mpsc, Arc, Mutex},
    time::{Duration, Instant},
};

use http::Method;

use crate::client::{request, Reply};

/// Path of a binary built by this workspace. `cargo test --workspace` builds a package's binaries when the
/// package has integration tests of its own (`daemon/tests/cli.rs` guarantees `lacquerd`), next to the
/// test executables.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target directory");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test --workspace`",
        path.display()
    );
    path
}

pub struct Daemon {
    /// The first client listener.
    pub addr: SocketAddr,
    /// Every client listener, in configuration order.
    pub listeners: Vec<SocketAddr>,
    pub admin: SocketAddr,
    pub dir: Arc<tempfile::TempDir>,
    backend: Option<SocketAddr>,
    extra: Vec<String>,
    /// Environment variables besides `RUST_LOG`, kept for a restart.
    env: Vec<(String, String)>,
    child: Option<Child>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Daemon {
    /// Starts `lacquerd` in front of `backend` with a fresh store.
    pub fn start(backend: SocketAddr, extra: &[&str]) -> Daemon {
        let dir = Arc::new(tempfile::tempdir().expect("store directory"));
        let mut args = vec!["--listen".to_owned(), "127.0.0.1:0".to_owned()];
        args.extend(extra.iter().map(|s| s.to_string()));
        Self::launch(Some(backend), dir, args, Vec::new())
    }

    /// Starts `lacquerd` in front of `backend` on a store directory prepared by the caller (`dir/store`, a
    /// mount point for instance).
    pub fn start_in(backend: SocketAddr, dir: Arc<tempfile::TempDir>, extra: &[&str]) -> Daemon {
        let mut args = vec!["--listen".to_owned(), "127.0.0.1:0".to_owned()];
        args.extend(extra.iter().map(|s| s.to_string()));
        Self::launch(Some(backend), dir, args, Vec::new())
    }

    /// Starts `lacquerd` with `config` as its configuration file, which names the listeners (port 0 for
    /// an ephemeral one); `dir` is replaced by the store directory's path in it.
    pub fn with_config(backend: SocketAddr, config: &str) -> Daemon {
        Self::configured(Some(backend), config)
    }

    /// As [`Daemon::with_config`], with the backends the file names (no `--backend`).
    pub fn with_config_only(config: &str) -> Daemon {
        Self::configured(None, config)
    }

    /// As [`Daemon::with_config`], with `env` set for the process (and its restarts).
    pub fn with_config_env(backend: SocketAddr, config: &str, env: &[(&str, &str)]) -> Daemon {
        let env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self::configured_env(Some(backend), config, env)
    }

    fn configured(backend: Option<SocketAddr>, config: &str) -> Daemon {
        Self::configured_env(backend, config, Vec::new())
    }

    fn configured_env(
        backend: Option<SocketAddr>,
        config: &str,
        env: Vec<(String, String)>,
    ) -> Daemon {
        let dir = Arc::new(tempfile::tempdir().expect("store directory"));
        let file = dir.path().join("lacquer.toml");
        let text = config.replace("{dir}", &dir.path().display().to_string());
        std::fs::write(&file, text).expect("config file");
        let args = vec!["--config".to_owned(), file.display().to_string()];
        Self::launch(backend, dir, args, env)
    }

    /// The configuration file of a daemon started [`Daemon::with_config`].
    pub fn config_file(&self) -> PathBuf {
        self.dir.path().join("lacquer.toml")
    }

    fn launch(
        backend: Option<SocketAddr>,
        dir: Arc<tempfile::TempDir>,
        extra: Vec<String>,
        env: Vec<(String, String)>,
    ) -> Daemon {
        let backend_flag = backend.map(|b| vec!["--backend".to_owned(), b.to_string()]);
        // A test that needs the admin port to stay across a restart names it in `extra`.
        let admin_flag =
            (!extra.iter().any(|a| a == "--admin")).then_some(["--admin", "127.0.0.1:0"]);
        let mut child = Command::new(binary("lacquerd"))
            .args(admin_flag.into_iter().flatten())
            .args(backend_flag.unwrap_or_default())
            .arg("--disk")
            .arg(dir.path().join("store"))
            .args(default_flag(&extra, "--memory", "64MiB"))
            .args(default_flag(&extra, "--disk-size", "256MiB"))
            .args(&extra)
            .env("RUST_LOG", "info")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("lacquerd starts");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let addr = |marker: &str| {
                    line.find(marker).and_then(|i| {
                        line[i + marker.len()..]
                            .split_whitespace()
                            .next()?
                            .parse()
                            .ok()
                    })
                };
                let event = if let Some(a) = addr("admin listening addr=") {
                    Some(("admin", Some(a)))
                } else if let Some(a) = addr(" listening addr=") {
                    Some(("client", Some(a)))
                } else {
                    line.contains("lacquerd ready").then_some(("ready", None))
                };
                // Kept before it is announced: whoever is told "ready" reads the ready line in the log.
                lines.lock().unwrap().push(line);
                if let Some(event) = event {
                    let _ = tx.send(event);
                }
            }
        });
        let (mut listeners, mut admin) = (Vec::new(), None);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(("admin", a)) => admin = a,
                Ok(("client", Some(a))) => listeners.push(a),
                Ok(_) => break,
                Err(_) => panic!(
                    "lacquerd did not start; log:\n{}",
                    log.lock().unwrap().join("\n")
                ),
            }
        }
        Daemon {
            addr: listeners[0],
            listeners,
            admin: admin.expect("admin listening before ready"),
            dir,
            backend,
            extra,
            env,
            child: Some(child),
            log,
        }
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// The log once it holds `needle` (its lines are read from the daemon's stderr by another thread, a
    /// moment after they are written); panics, showing the log, when it does not within 5 s.
    pub async fn wait_for_log(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let log = self.log();
            if log.contains(needle) {
                return log;
            }
            assert!(Instant::now() < deadline, "{needle:?} not logged:\n{log}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The admin secret's file, as the daemon's ready line names it (in its store directory unless that
    /// could not hold it).
    pub fn secret_file(&self) -> PathBuf {
        let log = self.log.lock().unwrap();
        log.iter()
            .filter(|line| line.contains("lacquerd ready"))
            .find_map(|line| {
                let at = line.find(" secret=")? + " secret=".len();
                line[at..].split_whitespace().next().map(PathBuf::from)
            })
            .unwrap_or_else(|| self.dir.path().join("store/secret"))
    }

    pub fn secret(&self) -> String {
        std::fs::read_to_string(self.secret_file())
            .expect("secret file")
            .trim()
            .to_owned()
    }

    pub async fn admin_get(&self, path: &str, secret: Option<&str>) -> Reply {
        let auth = secret.map(|s| format!("Bearer {s}"));
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("authorization", a.as_str())).collect();
        request(self.admin, Method::GET, path, &headers, Default::default())
            .await
            .expect("admin request")
    }

    /// POSTs a JSON document to the admin API with the daemon's secret.
    pub async fn admin_post(&self, path: &str, body: serde_json::Value) -> Reply {
        let auth = format!("Bearer {}", self.secret());
        let headers = [
            ("authorization", auth.as_str()),
            ("content-type", "application/json"),
        ];
        request(
            self.admin,
            Method::POST,
            path,
            &headers,
            body.to_string().into(),
        )
        .await
        .expect("admin request")
    }

    pub async fn stats(&self) -> serde_json::Value {
        let reply = self.admin_get("/v1/stats", Some(&self.secret())).await;
        assert_eq!(reply.status, 200, "stats: {:?}", reply.body);
        serde_json::from_slice(&reply.body).expect("stats JSON")
    }

    /// Waits until `check` holds for the stats, or panics after 20 s.
    pub async fn wait_for_stats(
        &self,
        what: &str,
        check: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let stats = self.stats().await;
            if check(&stats) {
                return stats;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; stats: {stats}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn signal(&mut self, signal: i32) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        // SAFETY: kill(2) on a child we started and have not reaped.
        unsafe { libc::kill(child.id() as i32, signal) };
        child.wait().expect("lacquerd exits")
    }

    /// The daemon's resident memory, in KiB.
    pub fn rss_kib(&self) -> u64 {
        let child = self.child.as_ref().expect("running");
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// SIGHUP: the daemon reads its configuration file again and keeps running.
    pub fn sighup(&self) {
        self.notify(libc::SIGHUP);
    }

    /// A signal the daemon handles and keeps running (SIGHUP, SIGUSR1).
    pub fn notify(&self, signal: i32) {
        let child = self.child.as_ref().expect("running");
        // SAFETY: kill(2) on a child we started and have not reaped.
        unsafe { libc::kill(child.id() as i32, signal) };
    }

    /// SIGTERM, then waits; the daemon must exit 0.
    pub fn stop(&mut self) {
        let status = self.signal(libc::SIGTERM);
        assert!(
            status.success(),
            "lacquerd exited with {status}; log:\n{}",
            self.log()
        );
    }

    pub fn kill9(&mut self) {
        self.signal(libc::SIGKILL);
    }

    /// SIGTERM, then waits; the exit status, whatever it is.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.signal(libc::SIGTERM)
    }

    /// A new process on the same store directory (and new ports).
    pub fn restart(&self) -> Daemon {
        assert!(self.child.is_none(), "stop or kill the daemon first");
        Self::launch(
            self.backend,
            self.dir.clone(),
            self.extra.clone(),
            self.env.clone(),
        )
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `flag value`, unless the test's own flags name `flag` (lacquerd refuses a flag given twice).
fn default_flag(extra: &[String], flag: &'static str, value: &'static str) -> Vec<&'static str> {
    if extra.iter().any(|a| a == flag) {
        vec![]
    } else {
        vec![flag, value]
    }
}
