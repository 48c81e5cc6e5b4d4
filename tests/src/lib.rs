//! End-to-end test harness: a scripted origin that counts what it sees, the real `lacquerd` binary on
//! ephemeral ports with its own store directory, a small HTTP client, and HAProxy running the packaged
//! example configuration.

pub mod chromium;
pub mod client;
pub mod daemon;
pub mod etcd;
pub mod fake_admin;
pub mod h3;
pub mod haproxy;
pub mod nginx;
pub mod origin;
pub mod pebble;
pub mod tls;

pub use client::{get, open, raw, raw_status, request, Reply as ClientReply};
pub use daemon::Daemon;
pub use origin::{pattern, ranged, Origin, Raw, Reply, Step};

/// What `probe` finds once it finds something, asked every 20 ms for at most `within`; fails the test
/// past it.
pub async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    within: std::time::Duration,
    mut probe: impl FnMut() -> F,
) -> T {
    let until = std::time::Instant::now() + within;
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(std::time::Instant::now() < until, "not within {within:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Runs a command-line tool to completion without the admin environment variables of the caller; returns
/// the exit code, stdout and stderr.
pub fn run_tool(path: &str, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(path)
        .args(args)
        .env_remove("LACQUER_ADMIN")
        .env_remove("LACQUER_SECRET_FILE")
        .env_remove("LACQUER_CONFIG")
        .output()
        .expect("the tool runs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// Writes `secret` to `path` with mode 0600, as lacquerd requires of a secret file; returns `path`.
pub fn secret_file(path: std::path::PathBuf, secret: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(&path, format!("{secret}\n")).expect("secret written");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("mode 0600");
    path
}

/// An address on which nothing listens (bound once, then released).
pub fn unused_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A daemon in front of a cacheable origin after three requests for `/a`: one miss, two hits.
pub async fn daemon_with_traffic() -> (Origin, Daemon) {
    let origin = Origin::start(|_| Reply::ok("x").header("cache-control", "max-age=60")).await;
    let d = Daemon::start(origin.addr, &[]);
    for _ in 0..3 {
        get(d.addr, "/a").await;
    }
    (origin, d)
}

/// `lacquerd --check` of `config`, written to `dir` (the store under it): its exit status and what it said.
pub fn check_config(dir: &std::path::Path, config: &str) -> (Option<i32>, String) {
    let file = dir.join("lacquer.toml");
    std::fs::write(&file, config).unwrap();
    let out = std::process::Command::new(daemon::binary("lacquerd"))
        .arg("--check")
        .arg("--config")
        .arg(&file)
        .arg("--disk")
        .arg(dir.join("store"))
        .env_remove("LACQUER_CONFIG")
        .output()
        .expect("lacquerd runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
