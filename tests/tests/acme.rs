//! Certificates by ACME through the real daemon, against Debian's `pebble` (a real ACME CA for tests) on
//! loopback: obtained by HTTP-01 and by TLS-ALPN-01, served, kept beside the store (0600) and read back at
//! start, renewed without a restart, and a certificate held through a dead CA with the health check
//! warning before it expires.

use std::{net::Ipv4Addr, os::unix::fs::PermissionsExt, sync::Arc, time::Duration};

use http::Method;
use lacquer_admin::wire::{CertificateList, CertificateView};
use lacquer_tests::{
    eventually,
    pebble::{self, free_port, Pebble},
    tls::{connect, h1_request, TestCa},
    Daemon, Origin, Reply,
};
use rustls::{
    pki_types::{pem::PemObject, CertificateDer},
    ClientConfig, RootCertStore,
};

const DAYS: u64 = 24 * 3600;

/// Each test's loopback address, bound by no other test: see [`free_port`].
const HTTP_01: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 61);
const TLS_ALPN_01: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 62);
const DEAD_CA: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 63);

async fn certificates(d: &Daemon) -> Vec<CertificateView> {
    let reply = d.admin_get("/v1/certificates", Some(&d.secret())).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    serde_json::from_slice::<CertificateList>(&reply.body)
        .unwrap()
        .certificates
}

/// The certificate once one is held (the first order runs at start).
async fn held(d: &Daemon) -> CertificateView {
    eventually(Duration::from_secs(60), || async {
        let c = certificates(d).await.remove(0);
        c.held.is_some().then_some(c)
    })
    .await
}

/// A client that trusts only `root` (PEM).
fn trusting(root: &str) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(root.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    Arc::new(
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// GET `path` over TLS asking for `name`, verified against `root`; the reply and the leaf presented.
async fn get_tls(
    addr: std::net::SocketAddr,
    name: &str,
    root: &str,
    path: &str,
) -> (lacquer_tests::ClientReply, CertificateDer<'static>) {
    let tls = connect(addr, name, trusting(root))
        .await
        .unwrap_or_else(|e| panic!("TLS to {name}: {e}"));
    let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    let reply = h1_request(tls, Method::GET, name, path, &[]).await.unwrap();
    (reply, leaf)
}

/// `cachectl certificates` and its arguments against `d`: exit status and output.
fn cachectl(d: &Daemon, args: &[&str]) -> (i32, String) {
    let (admin, secret) = (d.admin.to_string(), d.secret_file());
    let mut all = vec![
        "--admin",
        &admin,
        "--secret",
        secret.to_str().unwrap(),
        "certificates",
    ];
    all.extend(args);
    let (status, out, err) = lacquer_tests::run_tool(
        lacquer_tests::daemon::binary("cachectl").to_str().unwrap(),
        &all,
    );
    (status, format!("{out}{err}"))
}

fn origin_script(seen: &lacquer_tests::origin::Seen) -> Reply {
    Reply::ok(format!("origin: {}", seen.path)).header("cache-control", "max-age=60")
}

#[tokio::test(flavor = "multi_thread")]
async fn http_01_obtains_a_certificate_serves_it_keeps_it_and_reads_it_back() {
    if !pebble::available() {
        return;
    }
    let origin = Origin::start(origin_script).await;
    let (plain, secure) = (free_port(HTTP_01), free_port(HTTP_01));
    let ca = Pebble::start(HTTP_01, plain, secure, Duration::from_secs(90 * DAYS)).await;
    let config = format!(
        r#"
        [[listen]]
        address = "{HTTP_01}:{plain}"
        [[listen]]
        address = "{HTTP_01}:{secure}"
        acme = {{ domains = ["shop.test", "www.shop.test"], contact = ["mailto:ops@shop.test"], directory = "{}", directory_ca = "{}" }}
        "#,
        ca.directory,
        ca.directory_ca.display()
    );
    let mut d = Daemon::with_config(origin.addr, &config);
    let first = held(&d).await;
    assert_eq!(first.domains, ["shop.test", "www.shop.test"]);
    assert_eq!(first.listeners, ["listen[1]"]);
    assert_eq!((first.orders_succeeded, first.orders_failed), (1, 0));
    let root = ca.issuing_root().await;
    let secure_addr = d.listeners[1];
    for name in ["shop.test", "www.shop.test"] {
        let (reply, _) = get_tls(secure_addr, name, &root, "/product/1").await;
        assert_eq!(reply.status, 200);
        assert_eq!(&reply.body[..], b"origin: /product/1");
    }
    // The CA's check was answered here: nothing of it reached the origin, nor was stored.
    assert!(
        origin
            .seen()
            .iter()
            .all(|s| !s.path.starts_with("/.well-known/")),
        "{:?}",
        origin
            .seen()
            .iter()
            .map(|s| s.path.clone())
            .collect::<Vec<_>>()
    );
    // A token no order waits on is any request: it goes to the origin.
    let stray = "/.well-known/acme-challenge/not-a-token";
    let reply = lacquer_tests::get(d.addr, stray).await;
    assert_eq!(&reply.body[..], format!("origin: {stray}").as_bytes());
    assert_eq!(origin.count(stray), 1);
    // Kept beside the store, for this user only: the chain, then its key.
    let file = std::path::PathBuf::from(&first.file);
    assert!(file.starts_with(d.dir.path().join("store").join("acme")));
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(file.parent().unwrap()), 0o700);
    let kept = std::fs::read_to_string(&file).unwrap();
    assert!(kept.contains("BEGIN CERTIFICATE") && kept.contains("PRIVATE KEY"));
    let metrics = d.admin_get("/metrics", Some(&d.secret())).await;
    let metrics = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        metrics.contains(&format!(
            "lacquer_certificate_expiry_timestamp_seconds{{certificate=\"shop.test\"}} {}",
            first.held.as_ref().unwrap().not_after
        )),
        "{metrics}"
    );
    assert!(metrics
        .contains("lacquer_acme_orders_total{certificate=\"shop.test\",result=\"succeeded\"} 1"));

    let (status, out) = cachectl(&d, &[]);
    assert_eq!(status, 0, "{out}");
    let row = out.lines().nth(1).unwrap();
    let serial = &first.held.as_ref().unwrap().serial;
    for cell in [
        "shop.test,www.shop.test",
        "listen[1]",
        "http-01",
        serial,
        "in 89d",
        "1/0",
    ] {
        assert!(row.contains(cell), "{cell}: {out}");
    }

    // A reload keeps it (it reads the `tls` files again, not this).
    let reloaded = d.admin_post("/v1/reload", serde_json::json!({})).await;
    assert_eq!(reloaded.status, 200);
    let (_, leaf) = get_tls(secure_addr, "shop.test", &root, "/").await;
    let kept_leaf = CertificateDer::pem_slice_iter(kept.as_bytes())
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(leaf, kept_leaf);

    // A restart reads it back and serves it at once, without an order.
    d.stop();
    let d = d.restart();
    let again = certificates(&d).await.remove(0);
    assert_eq!(again.held, first.held);
    assert_eq!(again.orders_succeeded + again.orders_failed, 0);
    let (reply, leaf) = get_tls(d.listeners[1], "www.shop.test", &root, "/").await;
    assert_eq!(reply.status, 200);
    assert_eq!(leaf, kept_leaf);
    // Renewal is due two thirds through its life: 60 days from now.
    let next = again.next_attempt.unwrap();
    let h = first.held.unwrap();
    assert_eq!(next, h.not_before + (h.not_after - h.not_before) * 2 / 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_alpn_01_is_answered_by_the_tls_listener_alone() {
    if !pebble::available() {
        return;
    }
    let origin = Origin::start(origin_script).await;
    let secure = free_port(TLS_ALPN_01);
    // No plain listener is needed (nor asked: its port has nothing).
    let ca = Pebble::start(
        TLS_ALPN_01,
        free_port(TLS_ALPN_01),
        secure,
        Duration::from_secs(90 * DAYS),
    )
    .await;
    let config = format!(
        r#"
        [[listen]]
        address = "{TLS_ALPN_01}:{secure}"
        acme = {{ domains = ["api.test"], directory = "{}", challenge = "tls-alpn-01" }}
        "#,
        ca.directory
    );
    // No `directory_ca`: the system's roots, as in production; here the test CA's, by the variable the
    // system's root store reads (rustls-native-certs, OpenSSL).
    let roots = ca.directory_ca.display().to_string();
    let d = Daemon::with_config_env(origin.addr, &config, &[("SSL_CERT_FILE", &roots)]);
    let got = held(&d).await;
    assert_eq!(got.challenge, "tls-alpn-01");
    let root = ca.issuing_root().await;
    let (reply, _) = get_tls(d.addr, "api.test", &root, "/v1/items").await;
    assert_eq!(&reply.body[..], b"origin: /v1/items");
    // With no order waiting, a client offering `acme-tls/1` gets no certificate at all.
    let mut alpn = (*trusting(&root)).clone();
    alpn.alpn_protocols = vec![b"acme-tls/1".to_vec()];
    assert!(connect(d.addr, "api.test", Arc::new(alpn)).await.is_err());
}

/// A certificate for `names` signed by `ca`, issued `age` ago and ending in `left`: the chain and key as
/// one PEM file, as lacquerd keeps them.
fn aged_certificate(ca: &TestCa, names: &[&str], age: Duration, left: Duration) -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap();
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - age;
    params.not_after = now + left;
    let cert = ca.sign(params, &key);
    format!("{}{}{}", cert.pem(), ca.pem(), key.serialize_pem())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_ca_keeps_the_held_certificate_served_and_health_warns_before_it_expires() {
    if !pebble::available() {
        return;
    }
    let origin = Origin::start(origin_script).await;
    let (plain, secure) = (free_port(DEAD_CA), free_port(DEAD_CA));
    // The CA, stopped: its address answers nothing.
    let mut ca = Pebble::start(DEAD_CA, plain, secure, Duration::from_secs(90 * DAYS)).await;
    ca.stop();
    let (directory, directory_ca) = (ca.directory.clone(), ca.directory_ca.clone());
    let config = format!(
        r#"
        [[listen]]
        address = "{DEAD_CA}:{plain}"
        [[listen]]
        address = "{DEAD_CA}:{secure}"
        acme = {{ domains = ["shop.test"], directory = "{directory}", directory_ca = "{}" }}
        # The CA's check is answered before deny rules (and rules, and routes).
        [[deny]]
        path_regex = "^/\\.well-known/"
        "#,
        directory_ca.display()
    );
    let mut d = Daemon::with_config(origin.addr, &config);
    // Nothing held and the first order failed: the health check says so.
    let failed = eventually(Duration::from_secs(30), || async {
        let c = certificates(&d).await.remove(0);
        (c.orders_failed > 0).then_some(c)
    })
    .await;
    assert!(failed.held.is_none());
    // Said with its cause, not only "client error (Connect)".
    let why = failed.last_error.clone().unwrap();
    assert!(why.contains("Connection refused"), "{why}");
    let health: serde_json::Value =
        serde_json::from_slice(&d.admin_get("/v1/health", None).await.body).unwrap();
    assert_eq!(health["status"], "degraded");
    assert!(
        health["problems"][0]
            .as_str()
            .unwrap()
            .starts_with("acme: no certificate for shop.test yet; the last order failed: "),
        "{health}"
    );
    d.wait_for_log("certificate order failed; no certificate to serve yet")
        .await;

    // A certificate issued 80 days ago that ends in 2 days, kept from before; the CA still dead.
    d.stop();
    let old_ca = TestCa::new();
    let pem = aged_certificate(
        &old_ca,
        &["shop.test"],
        Duration::from_secs(80 * DAYS),
        Duration::from_secs(2 * DAYS),
    );
    let file = std::path::Path::new(&failed.file);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(file, &pem).unwrap();
    let d = d.restart();
    let (reply, old_leaf) = get_tls(d.listeners[1], "shop.test", &old_ca.pem(), "/").await;
    assert_eq!(reply.status, 200);
    // The failure before the restart still counts: the next order waits out its backoff (5 minutes from
    // it), and the health check says why the certificate was not renewed.
    let kept = certificates(&d).await.remove(0);
    assert_eq!(kept.orders_failed, 0, "{kept:?}");
    assert_eq!(kept.next_attempt, Some(failed.last_attempt.unwrap() + 300));
    let health: serde_json::Value =
        serde_json::from_slice(&d.admin_get("/v1/health", None).await.body).unwrap();
    assert_eq!(health["status"], "degraded");
    let problem = health["problems"][0].as_str().unwrap();
    let hours: u64 = problem
        .strip_prefix("acme: the certificate for shop.test expires in ")
        .and_then(|rest| rest.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{problem}"));
    assert!(matches!(hours, 47 | 48), "{problem}");
    assert!(
        problem.contains("; the last order failed: ") && problem.contains("Connection refused"),
        "{problem}"
    );
    // The operator's renewal with the CA still dead: it fails, and the held certificate stays served.
    let (status, out) = cachectl(&d, &["--renew"]);
    assert_eq!(status, 0, "{out}");
    assert!(out.contains("Connection refused"), "{out}");
    d.wait_for_log("certificate order failed; serving the held certificate, which expires")
        .await;
    let (_, leaf) = get_tls(d.listeners[1], "shop.test", &old_ca.pem(), "/").await;
    assert_eq!(leaf, old_leaf);
    assert_eq!(certificates(&d).await[0].orders_failed, 1);

    // The CA back: the operator's renewal replaces it under the running listener.
    ca.restart().await;
    let renewed = d
        .admin_post("/v1/certificates/renew", serde_json::json!({}))
        .await;
    assert_eq!(renewed.status, 200);
    let renewed: CertificateList = serde_json::from_slice(&renewed.body).unwrap();
    let renewed = &renewed.certificates[0];
    assert!(
        renewed.orders_succeeded == 1 && renewed.last_error.is_none(),
        "{renewed:?}"
    );
    let root = ca.issuing_root().await;
    let (reply, leaf) = get_tls(d.listeners[1], "shop.test", &root, "/").await;
    assert_eq!(reply.status, 200);
    assert_ne!(leaf, old_leaf);
    let health: serde_json::Value =
        serde_json::from_slice(&d.admin_get("/v1/health", None).await.body).unwrap();
    assert_eq!(health["status"], "ok", "{health}");
    // The deny rule holds for everything else there.
    let stray = lacquer_tests::get(d.addr, "/.well-known/acme-challenge/not-a-token").await;
    assert_eq!(stray.status, 403);
}
