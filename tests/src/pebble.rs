//! Debian's `pebble`, the ACME test CA, and `pebble-challtestsrv` as its DNS server: every name resolves to
//! 127.0.0.1, where the CA checks its challenges on the ports it is given (lacquerd's listeners).

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use http::Method;

use crate::tls::{connect, h1_request, TestCa};

pub const PEBBLE: &str = "/usr/bin/pebble";
pub const CHALLTESTSRV: &str = "/usr/bin/pebble-challtestsrv";

/// Whether pebble is installed; prints why a test is skipped when it is not.
pub fn available() -> bool {
    let there = Path::new(PEBBLE).exists() && Path::new(CHALLTESTSRV).exists();
    if !there {
        eprintln!("skipped: {PEBBLE} is missing (Debian's pebble package)");
    }
    there
}

/// A port free now on 127.0.0.1, for a server that must be told its neighbours' ports before they start.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("an ephemeral port")
        .port()
}

pub struct Pebble {
    /// The ACME directory URL.
    pub directory: String,
    /// The root the directory's HTTPS certificate chains to (lacquerd's `directory_ca`).
    pub directory_ca: PathBuf,
    /// Where pebble listens (the directory's host and port).
    pub addr: SocketAddr,
    management: SocketAddr,
    ca: TestCa,
    spawn: Box<dyn Fn() -> Vec<Child> + Send + Sync>,
    children: Vec<Child>,
    _dir: tempfile::TempDir,
}

impl Pebble {
    /// Starts a CA that checks HTTP-01 on `http_port` and TLS-ALPN-01 on `tls_port` of 127.0.0.1, issuing
    /// certificates valid for `validity`.
    pub async fn start(http_port: u16, tls_port: u16, validity: Duration) -> Pebble {
        let dir = tempfile::tempdir().expect("pebble's directory");
        let ca = TestCa::new();
        let (cert, key) = ca.issue(dir.path(), "pebble", &["localhost", "127.0.0.1"]);
        let directory_ca = dir.path().join("directory-ca.pem");
        std::fs::write(&directory_ca, ca.pem()).unwrap();
        let port = free_port();
        let (management, dns, dns_admin) = (free_port(), free_port(), free_port());
        let config = serde_json::json!({
            "pebble": {
                "listenAddress": format!("127.0.0.1:{port}"),
                "managementListenAddress": format!("127.0.0.1:{management}"),
                "certificate": cert,
                "privateKey": key,
                "httpPort": http_port,
                "tlsPort": tls_port,
                "ocspResponderURL": "",
                "externalAccountBindingRequired": false,
                "certificateValidityPeriod": validity.as_secs(),
            }
        });
        let file = dir.path().join("pebble.json");
        std::fs::write(&file, config.to_string()).unwrap();
        let spawn = move || {
            let mut dns_server = Command::new(CHALLTESTSRV);
            dns_server
                .args(["-dns01", &format!("127.0.0.1:{dns}")])
                .args(["-http01", "", "-https01", "", "-tlsalpn01", ""])
                .args(["-management", &format!("127.0.0.1:{dns_admin}")])
                .args(["-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let mut pebble = Command::new(PEBBLE);
            pebble
                .arg("-config")
                .arg(&file)
                .args(["-dnsserver", &format!("127.0.0.1:{dns}")])
                // No random sleeps before checking, no valid nonce refused at random, no reuse of an
                // authorization: every order is checked anew, as a renewal at Let's Encrypt is after 30
                // days.
                .env("PEBBLE_VA_NOSLEEP", "1")
                .env("PEBBLE_WFE_NONCEREJECT", "0")
                .env("PEBBLE_AUTHZREUSE", "0")
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            vec![
                dns_server.spawn().expect("pebble-challtestsrv starts"),
                pebble.spawn().expect("pebble starts"),
            ]
        };
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut pebble = Pebble {
            directory: format!("https://localhost:{port}/dir"),
            directory_ca,
            addr,
            management: ([127, 0, 0, 1], management).into(),
            ca,
            spawn: Box::new(spawn),
            children: Vec::new(),
            _dir: dir,
        };
        pebble.restart().await;
        pebble
    }

    /// Starts it again (after [`Pebble::stop`]) on the same ports with the same HTTPS certificate; it
    /// remembers nothing of before (accounts, orders, its issuing root).
    pub async fn restart(&mut self) {
        self.stop();
        self.children = (self.spawn)();
        let deadline = Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(self.addr).await.is_err() {
            assert!(
                Instant::now() < deadline,
                "pebble did not listen on {}",
                self.addr
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The root pebble issues under (made at its start), as PEM: what a client of lacquerd trusts.
    pub async fn issuing_root(&self) -> String {
        let tls = connect(self.management, "localhost", self.ca.client(&["http/1.1"]))
            .await
            .expect("pebble's management interface");
        let reply = h1_request(tls, Method::GET, "localhost", "/roots/0", &[])
            .await
            .expect("pebble's root");
        assert_eq!(reply.status, 200);
        String::from_utf8(reply.body.to_vec()).unwrap()
    }

    pub fn stop(&mut self) {
        for mut child in self.children.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Pebble {
    fn drop(&mut self) {
        self.stop();
    }
}
