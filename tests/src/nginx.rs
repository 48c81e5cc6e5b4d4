//! Debian's NGINX as an HTTP/2 origin (h2 over TLS, h2c by prior knowledge), configured by the test in a
//! directory of its own.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

const BINARY: &str = "/usr/sbin/nginx";

pub struct Nginx {
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Nginx {
    /// Whether NGINX is installed; prints why a test is skipped when it is not. In CI (`CI` set) a missing
    /// NGINX fails the test instead: CI installs it.
    pub fn available() -> bool {
        let there = Path::new(BINARY).exists();
        if !there {
            assert!(
                std::env::var_os("CI").is_none(),
                "{BINARY} is missing in CI (.ci/run installs Debian's nginx)"
            );
            eprintln!("skipped: {BINARY} is missing (Debian's nginx package; CI installs it)");
        }
        there
    }

    /// Starts NGINX in the foreground with `servers` (the `server { … }` blocks; `{dir}` stands for its
    /// directory) inside an `http` block that logs `$connection $request_uri $status $server_protocol
    /// $ssl_client_verify $host` per request to `access.log`; waits until every one of `ports` accepts
    /// connections.
    pub fn start(servers: &str, ports: &[SocketAddr]) -> Nginx {
        let dir = tempfile::tempdir().expect("nginx directory");
        let d = dir.path().display().to_string();
        let conf = format!(
            "worker_processes 1;\n\
             pid {d}/nginx.pid;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n\
               log_format conn '$connection $request_uri $status $server_protocol $ssl_client_verify $host';\n\
               access_log {d}/access.log conn;\n\
               client_body_temp_path {d}/body;\n\
               proxy_temp_path {d}/proxy;\n\
               fastcgi_temp_path {d}/fastcgi;\n\
               uwsgi_temp_path {d}/uwsgi;\n\
               scgi_temp_path {d}/scgi;\n\
               {}\n\
             }}\n",
            servers.replace("{dir}", &d)
        );
        let file = dir.path().join("nginx.conf");
        std::fs::write(&file, conf).expect("nginx.conf");
        let mut nginx = Nginx { dir, child: None };
        let check = nginx.command().arg("-t").output().expect("nginx -t runs");
        assert!(
            check.status.success(),
            "nginx -t: {}",
            String::from_utf8_lossy(&check.stderr)
        );
        let child = nginx
            .command()
            .args(["-g", "daemon off;"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx starts");
        nginx.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        for port in ports {
            while std::net::TcpStream::connect(port).is_err() {
                assert!(
                    Instant::now() < deadline,
                    "nginx did not listen on {port}: {}",
                    nginx.error_log()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        nginx
    }

    fn command(&self) -> Command {
        let mut c = Command::new(BINARY);
        c.arg("-p")
            .arg(self.dir.path())
            .arg("-e")
            .arg(self.path("error.log"))
            .arg("-c")
            .arg(self.path("nginx.conf"));
        c
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.path("error.log")).unwrap_or_default()
    }

    /// The access log's lines, split on spaces: connection, URI, status, protocol, client verification,
    /// host.
    pub fn requests(&self) -> Vec<Vec<String>> {
        std::fs::read_to_string(self.path("access.log"))
            .unwrap_or_default()
            .lines()
            .map(|l| l.split(' ').map(str::to_owned).collect())
            .collect()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGTERM to the master, which stops its workers (SIGKILL would leave them running).
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
        }
    }
}
