//! Debian's `pebble`, the ACME test CA, and `pebble-challtestsrv` as its DNS server: every name resolves to
//! the test's loopback address, where the CA checks its challenges on the ports it is given (lacquerd's listeners).

use std::{
    net::{Ipv4Addr, SocketAddr},
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

/// A port free now on `ip`, for a server that must be told its neighbours' ports before they start. Give
/// each test a loopback address of its own (127.0.0.N, which no other test binds): a port released here
/// cannot then be taken by another test's daemon, which would share it silently (`SO_REUSEPORT`).
pub fn free_port(ip: Ipv4Addr) -> u16 {
    std::net::TcpListener::bind((ip, 0))
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
    /// pebble-challtestsrv's management port: up once its DNS server is.
    dns_admin: SocketAddr,
    ca: TestCa,
    spawn: Box<dyn Fn() -> Vec<Child> + Send + Sync>,
    children: Vec<Child>,
    _dir: tempfile::TempDir,
}

impl Pebble {
    /// Starts a CA on `ip` whose DNS resolves every name to `ip`, and that checks HTTP-01 on `http_port`
    /// and TLS-ALPN-01 on `tls_port` there, issuing certificates valid for `validity`.
    pub async fn start(ip: Ipv4Addr, http_port: u16, tls_port: u16, validity: Duration) -> Pebble {
        let dir = tempfile::tempdir().expect("pebble's directory");
        let ca = TestCa::new();
        let (cert, key) = ca.issue(dir.path(), "pebble", &[&ip.to_string()]);
        let directory_ca = dir.path().join("directory-ca.pem");
        std::fs::write(&directory_ca, ca.pem()).unwrap();
        let port = free_port(ip);
        let (management, dns, dns_admin) = (free_port(ip), free_port(ip), free_port(ip));
        let config = serde_json::json!({
            "pebble": {
                "listenAddress": format!("{ip}:{port}"),
                "managementListenAddress": format!("{ip}:{management}"),
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
                .args(["-dns01", &format!("{ip}:{dns}")])
                .args(["-http01", "", "-https01", "", "-tlsalpn01", ""])
                .args(["-management", &format!("{ip}:{dns_admin}")])
                .args(["-defaultIPv4", &ip.to_string(), "-defaultIPv6", ""])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let mut pebble = Command::new(PEBBLE);
            pebble
                .arg("-config")
                .arg(&file)
                .args(["-dnsserver", &format!("{ip}:{dns}")])
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
        let addr: SocketAddr = (ip, port).into();
        let mut pebble = Pebble {
            directory: format!("https://{ip}:{port}/dir"),
            directory_ca,
            addr,
            management: (ip, management).into(),
            dns_admin: (ip, dns_admin).into(),
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
        for addr in [self.addr, self.management, self.dns_admin] {
            while tokio::net::TcpStream::connect(addr).await.is_err() {
                assert!(Instant::now() < deadline, "pebble did not listen on {addr}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// The root pebble issues under (made at its start), as PEM: what a client of lacquerd trusts.
    pub async fn issuing_root(&self) -> String {
        let ip = self.addr.ip().to_string();
        let tls = connect(self.management, &ip, self.ca.client(&["http/1.1"]))
            .await
            .expect("pebble's management interface");
        let reply = h1_request(tls, Method::GET, &ip, "/roots/0", &[])
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
