//! HTTP/2 to origins (`protocol = "h2"` / `"h2c"`) and client certificates (`tls_cert` / `tls_key`) end to
//! end: against Debian's NGINX (h2 over TLS with a client-certificate check, h2c by prior knowledge), and
//! against hand-made origins on the `h2` crate that misbehave as real ones do (GOAWAY or RST_STREAM
//! mid-response, a tiny flow-control window, an oversized header block) and that see their streams reset.

use std::{
    future::poll_fn,
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use bytes::Bytes;
use h2::{server::SendResponse, Reason, RecvStream};
use http::{Method, Response};
use lacquer_tests::{
    eventually, nginx::Nginx, pattern, request, run_tool, tls::TestCa, unused_addr, ClientReply,
    Daemon,
};
use serde_json::Value;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::mpsc,
};

const WORKERS: usize = 2;

/// A daemon with `WORKERS` worker threads in front of the one backend `backend` (its `[[backend]]` keys,
/// then any subtables).
fn daemon(backend: &str) -> Daemon {
    Daemon::with_config_only(&config(backend))
}

fn config(backend: &str) -> String {
    config_with(WORKERS, backend)
}

fn config_with(workers: usize, backend: &str) -> String {
    format!(
        "[server]\nworkers = {workers}\n\n[[listen]]\naddress = \"127.0.0.1:0\"\n\n[[backend]]\n{backend}\n"
    )
}

const PROBE: &str =
    "[backend.probe]\nurl = \"/health\"\ninterval = \"100ms\"\ntimeout = \"2s\"\nwindow = 2\nthreshold = 1\n";

async fn get_host(d: &Daemon, host: &str, path: &str) -> Result<ClientReply, String> {
    request(d.addr, Method::GET, path, &[("host", host)], Bytes::new()).await
}

async fn backend_view(d: &Daemon) -> Value {
    let r = d.admin_get("/v1/backends", Some(&d.secret())).await;
    let list: Value = serde_json::from_slice(&r.body).unwrap();
    list["backends"][0].clone()
}

/// The backend's view once its probe has polled and found it `want`.
async fn wait_for_health(d: &Daemon, want: &str) -> Value {
    let mut last = Value::Null;
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            last = backend_view(d).await;
            if last["health"] == want && !last["probe"]["last"].is_null() {
                return last.clone();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("backend not {want}: {last}; log:\n{}", d.log()))
}

async fn reload(d: &Daemon) -> ClientReply {
    d.admin_post("/v1/reload", serde_json::json!({})).await
}

/// An NGINX `location` block set answering `body of URI` (cacheable) and `/health`.
const LOCATIONS: &str =
    "location / { add_header Cache-Control \"max-age=60\"; return 200 \"body of $uri\\n\"; }\n\
                         location = /health { return 200 \"ok\\n\"; }";

#[tokio::test]
async fn nginx_h2c_carries_concurrent_misses_on_one_connection_per_worker() {
    if !Nginx::available() {
        return;
    }
    let port = unused_addr();
    let nginx = Nginx::start(
        &format!("server {{ listen {port} http2; {LOCATIONS} }}"),
        &[port],
    );
    let d = daemon(&format!(
        "address = \"http://{port}\"\nprotocol = \"h2c\"\n{PROBE}"
    ));
    // The probe speaks h2c too (NGINX's prior-knowledge port answers nothing else).
    wait_for_health(&d, "healthy").await;

    let fills = (0..50).map(|i| {
        let d = &d;
        async move {
            (
                i,
                get_host(d, "www.example.com", &format!("/item/{i}")).await,
            )
        }
    });
    for (i, reply) in futures_util::future::join_all(fills).await {
        let reply = reply.unwrap_or_else(|e| panic!("/item/{i}: {e}; log:\n{}", d.log()));
        assert_eq!(reply.status, 200, "/item/{i}");
        assert_eq!(reply.body, format!("body of /item/{i}\n"), "/item/{i}");
    }
    let hit = get_host(&d, "www.example.com", "/item/7").await.unwrap();
    assert_eq!(hit.x_cache(), "HIT");

    let items: Vec<Vec<String>> = nginx
        .requests()
        .into_iter()
        .filter(|r| r[1].starts_with("/item/"))
        .collect();
    assert_eq!(items.len(), 50, "{items:?}");
    let mut connections: Vec<&str> = items.iter().map(|r| r[0].as_str()).collect();
    connections.sort_unstable();
    connections.dedup();
    assert!(
        connections.len() <= WORKERS,
        "50 misses on {} connections: {items:?}",
        connections.len()
    );
    for r in &items {
        assert_eq!(r[3], "HTTP/2.0", "{r:?}");
        // The client's Host is the stream's :authority, which NGINX takes as the host.
        assert_eq!(r[5], "www.example.com", "{r:?}");
    }
    let view = backend_view(&d).await;
    let opened = view["connections"].as_u64().unwrap();
    assert!(
        (1..=WORKERS as u64).contains(&opened),
        "connections opened (probes not counted): {view}"
    );
    assert_eq!(view["streams_reset"], 0, "{view}");
}

/// A test CA's files for an NGINX that checks client certificates: its server certificate for
/// `127.0.0.1`, the CA to check clients against, and a client certificate from that CA.
struct Pki {
    dir: tempfile::TempDir,
    ca: TestCa,
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new();
        ca.issue(dir.path(), "server", &["127.0.0.1"]);
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        ca.issue(dir.path(), "client", &["lacquer"]);
        Self { dir, ca }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// `client.pem` and `client.key` replaced by a certificate from `ca`.
    fn reissue_client(&self, ca: &TestCa) {
        ca.issue(self.dir.path(), "client", &["lacquer"]);
    }
}

fn nginx_mtls(pki: &Pki, port: SocketAddr) -> Nginx {
    Nginx::start(
        &format!(
            "server {{ listen {port} ssl http2;\n\
               ssl_certificate {}; ssl_certificate_key {};\n\
               ssl_verify_client on; ssl_client_certificate {};\n\
               {LOCATIONS} }}",
            pki.path("server.pem"),
            pki.path("server.key"),
            pki.path("ca.pem"),
        ),
        &[port],
    )
}

#[tokio::test]
async fn nginx_h2_over_tls_checks_the_client_certificate_and_a_reload_rotates_it() {
    if !Nginx::available() {
        return;
    }
    let pki = Pki::new();
    let port = unused_addr();
    let nginx = nginx_mtls(&pki, port);
    let tls = format!(
        "address = \"https://{port}\"\nprotocol = \"h2\"\ntls_ca = \"{}\"\n",
        pki.path("ca.pem")
    );

    // Without a certificate NGINX answers its probe 400 ("No required SSL certificate was sent"): sick,
    // and clients get 503.
    let bare = daemon(&format!("{tls}{PROBE}"));
    let sick = wait_for_health(&bare, "sick").await;
    assert_eq!(sick["probe"]["last"], "status 400", "{sick}");
    let refused = get_host(&bare, "www.example.com", "/a").await.unwrap();
    assert_eq!(refused.status, 503);
    let probes = nginx.requests();
    assert!(
        probes
            .iter()
            .any(|r| r[1] == "/health" && r[2] == "400" && r[3] == "HTTP/2.0" && r[4] == "NONE"),
        "{probes:?}"
    );
    drop(bare);

    // With one, the probe and the requests go through over HTTP/2, the certificate checked.
    let with_cert = format!(
        "{tls}tls_cert = \"{}\"\ntls_key = \"{}\"\n{PROBE}",
        pki.path("client.pem"),
        pki.path("client.key")
    );
    let d = daemon(&with_cert);
    wait_for_health(&d, "healthy").await;
    let reply = get_host(&d, "www.example.com", "/a").await.unwrap();
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.body, "body of /a\n");
    let seen = nginx.requests();
    let a = seen.iter().find(|r| r[1] == "/a").expect("NGINX saw /a");
    assert_eq!(a[3], "HTTP/2.0", "{a:?}");
    assert_eq!(a[4], "SUCCESS", "{a:?}");

    // The same file names, new contents from a CA NGINX does not trust: a reload reads them again, and
    // NGINX refuses the certificate.
    let stranger = TestCa::new();
    pki.reissue_client(&stranger);
    let r = reload(&d).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        body["applied"],
        serde_json::json!(["backend.tls_cert", "backend.tls_key"]),
        "{body}"
    );
    let sick = wait_for_health(&d, "sick").await;
    assert_eq!(sick["probe"]["last"], "status 400", "{sick}");
    assert!(
        nginx
            .requests()
            .iter()
            .any(|r| r[1] == "/health" && r[4].starts_with("FAILED")),
        "{:?}",
        nginx.requests()
    );
    // A certificate from the right CA again: healthy, requests through.
    pki.reissue_client(&pki.ca);
    assert_eq!(reload(&d).await.status, 200);
    wait_for_health(&d, "healthy").await;
    let reply = get_host(&d, "www.example.com", "/b").await.unwrap();
    assert_eq!(reply.status, 200, "{reply:?}");

    // A key that is no key: the reload is refused, naming the setting and the file; the running
    // configuration goes on.
    std::fs::write(pki.path("client.key"), "not a key\n").unwrap();
    let r = reload(&d).await;
    assert_eq!(r.status, 400, "{:?}", r.body);
    let text = String::from_utf8_lossy(&r.body);
    assert!(
        text.contains("backend.tls_key") && text.contains("client.key"),
        "{text}"
    );
    let reply = get_host(&d, "www.example.com", "/c").await.unwrap();
    assert_eq!(reply.status, 200, "{reply:?}");

    // And `--check` says the same.
    let (code, _, err) = run_tool(
        lacquer_tests::daemon::binary("lacquerd").to_str().unwrap(),
        &[
            "--check",
            "--config",
            d.config_file().to_str().unwrap(),
            // Not the default store directory: as root, checking would create /var/lib/lacquer.
            "--disk",
            d.dir.path().join("check").to_str().unwrap(),
        ],
    );
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains("backend.tls_key") && err.contains("client.key"),
        "{err}"
    );
}

#[test]
fn check_refuses_h2_without_tls_and_a_certificate_without_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lacquer.toml");
    let check = |backend: &str| {
        std::fs::write(&file, config(backend)).unwrap();
        run_tool(
            lacquer_tests::daemon::binary("lacquerd").to_str().unwrap(),
            &[
                "--check",
                "--config",
                file.to_str().unwrap(),
                "--disk",
                dir.path().join("store").to_str().unwrap(),
            ],
        )
    };
    let (code, _, err) = check("address = \"http://127.0.0.1:8080\"\nprotocol = \"h2\"\n");
    assert_ne!(code, 0);
    assert!(err.contains("backend.protocol"), "{err}");
    let (code, _, err) =
        check("address = \"https://127.0.0.1:8443\"\ntls_cert = \"/etc/lacquer/client.pem\"\n");
    assert_ne!(code, 0);
    assert!(err.contains("backend.tls_key"), "{err}");
    let (code, _, err) = check(
        "address = \"https://127.0.0.1:8443\"\ntls_cert = \"/nonexistent/client.pem\"\ntls_key = \"/nonexistent/client.key\"\n",
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("backend.tls_cert") && err.contains("/nonexistent/client.pem"),
        "{err}"
    );
    let (code, out, err) = check("address = \"http://127.0.0.1:8080\"\nprotocol = \"h2c\"\n");
    assert_eq!(code, 0, "{out}{err}");
}

/// What a hand-made origin does with one stream.
#[derive(Clone, Copy)]
enum Act {
    /// 200 with `pattern(len)` in 1 KiB frames, cacheable.
    Body(usize),
    /// As `Body`, fresh for 1 s, then usable stale if the origin fails.
    Short(usize),
    /// Half of `pattern(len)` (with the full length announced), then a GOAWAY and the end of the
    /// connection.
    GoAwayMidBody(usize),
    /// Half of `pattern(len)`, then RST_STREAM.
    ResetMidBody(usize),
    /// RST_STREAM before any head.
    ResetHead,
    /// 200 with a header block of about this many bytes.
    HugeHead(usize),
    /// 200 with `pattern(len)` in 1 KiB frames, one every 20 ms, cacheable.
    Slow(usize),
    /// 200, cacheable, announcing `Content-Length` of the first number and sending the second's bytes.
    Lying(usize, usize),
    /// Reads the request body (releasing window as it goes, 1 KiB at a time) and answers its length and
    /// checksum.
    Echo,
    /// Sends 16 KiB every 20 ms, uncacheable, until the stream is reset.
    Endless,
    /// Neither this stream nor anything else on its connection is read or answered again, PINGs
    /// included: an origin that froze with the connection open.
    Freeze,
}

/// An origin on the `h2` crate, counting connections and recording the resets it saw.
struct H2Origin {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    resets: Arc<Mutex<Vec<Reason>>>,
}

impl H2Origin {
    /// Answers each stream as `act` says for its path; `window` is the stream window it advertises.
    async fn start(window: u32, act: fn(&str) -> Act) -> H2Origin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = H2Origin {
            addr: listener.local_addr().unwrap(),
            connections: Arc::default(),
            requests: Arc::default(),
            resets: Arc::default(),
        };
        let (connections, requests, resets) = (
            origin.connections.clone(),
            origin.requests.clone(),
            origin.resets.clone(),
        );
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                connections.fetch_add(1, Ordering::SeqCst);
                let (requests, resets) = (requests.clone(), resets.clone());
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::Builder::new()
                        .initial_window_size(window)
                        .max_send_buffer_size(1 << 20)
                        .handshake::<_, Bytes>(tcp)
                        .await
                    else {
                        return;
                    };
                    let (goaway, mut goaways) = mpsc::unbounded_channel();
                    let frozen = loop {
                        tokio::select! {
                            next = conn.accept() => {
                                let Some(Ok((req, respond))) = next else { return };
                                requests.fetch_add(1, Ordering::SeqCst);
                                let todo = act(req.uri().path());
                                if let Act::Freeze = todo {
                                    break respond;
                                }
                                tokio::spawn(serve(todo, req.into_body(), respond, goaway.clone(), resets.clone()));
                            }
                            Some(()) = goaways.recv() => conn.abrupt_shutdown(Reason::INTERNAL_ERROR),
                        }
                    };
                    // Held, never polled again.
                    let _held = (conn, frozen);
                    std::future::pending::<()>().await;
                });
            }
        });
        origin
    }

    fn resets(&self) -> Vec<Reason> {
        self.resets.lock().unwrap().clone()
    }
}

async fn serve(
    act: Act,
    mut body: RecvStream,
    mut respond: SendResponse<Bytes>,
    goaway: mpsc::UnboundedSender<()>,
    resets: Arc<Mutex<Vec<Reason>>>,
) {
    let head = |len: Option<usize>, cache_control: &str| {
        let mut r = Response::builder().status(200);
        if let Some(len) = len {
            r = r.header("content-length", len);
        }
        r.header("cache-control", cache_control).body(()).unwrap()
    };
    const CACHEABLE: &str = "max-age=60";
    let send_chunks = |send: &mut h2::SendStream<Bytes>, data: &[u8], end: bool| {
        let chunks: Vec<&[u8]> = data.chunks(1024).collect();
        let n = chunks.len();
        for (i, c) in chunks.into_iter().enumerate() {
            send.send_data(Bytes::copy_from_slice(c), end && i + 1 == n)
                .unwrap();
        }
    };
    match act {
        Act::Freeze => unreachable!("a frozen connection serves nothing"),
        Act::Body(len) | Act::Short(len) => {
            let cache_control = match act {
                Act::Short(_) => "max-age=1, stale-if-error=60",
                _ => CACHEABLE,
            };
            let mut send = respond
                .send_response(head(Some(len), cache_control), false)
                .unwrap();
            send_chunks(&mut send, &pattern(len), true);
            // Held until the client has the last byte: dropping the stream early would reset it.
            let _ = poll_fn(|cx| send.poll_reset(cx)).await;
        }
        Act::GoAwayMidBody(len) | Act::ResetMidBody(len) => {
            let mut send = respond
                .send_response(head(Some(len), CACHEABLE), false)
                .unwrap();
            send_chunks(&mut send, &pattern(len)[..len / 2], false);
            // Let the half reach the client before the break.
            tokio::time::sleep(Duration::from_millis(200)).await;
            if let Act::GoAwayMidBody(_) = act {
                goaway.send(()).unwrap();
                let _ = poll_fn(|cx| send.poll_reset(cx)).await;
            } else {
                send.send_reset(Reason::INTERNAL_ERROR);
            }
        }
        Act::ResetHead => respond.send_reset(Reason::REFUSED_STREAM),
        Act::Lying(announced, sent) => {
            let mut send = respond
                .send_response(head(Some(announced), CACHEABLE), false)
                .unwrap();
            let _ = send.send_data(Bytes::from(pattern(sent)), true);
            let _ = poll_fn(|cx| send.poll_reset(cx)).await;
        }
        Act::Slow(len) => {
            let mut send = respond
                .send_response(head(Some(len), CACHEABLE), false)
                .unwrap();
            let body = pattern(len);
            let n = body.chunks(1024).count();
            for (i, c) in body.chunks(1024).enumerate() {
                tokio::time::sleep(Duration::from_millis(20)).await;
                if send
                    .send_data(Bytes::copy_from_slice(c), i + 1 == n)
                    .is_err()
                {
                    return;
                }
            }
            let _ = poll_fn(|cx| send.poll_reset(cx)).await;
        }
        Act::HugeHead(size) => {
            let mut r = head(Some(2), CACHEABLE);
            let value = "v".repeat(1000);
            for i in 0..size / 1000 {
                r.headers_mut().insert(
                    format!("x-big-{i}").parse::<http::HeaderName>().unwrap(),
                    value.parse().unwrap(),
                );
            }
            if let Ok(mut send) = respond.send_response(r, false) {
                let _ = send.send_data(Bytes::from_static(b"ok"), true);
                let _ = poll_fn(|cx| send.poll_reset(cx)).await;
            }
        }
        Act::Echo => {
            let (mut len, mut sum) = (0usize, 0u32);
            while let Some(data) = body.data().await {
                let data = data.unwrap();
                // Window handed back a kilobyte at a time: the client's sending is paced by it.
                for piece in data.chunks(1024) {
                    len += piece.len();
                    sum = piece
                        .iter()
                        .fold(sum, |s, b| s.wrapping_mul(31).wrapping_add(u32::from(*b)));
                    body.flow_control().release_capacity(piece.len()).unwrap();
                }
            }
            let text = format!("{len} {sum}");
            let mut send = respond
                .send_response(head(Some(text.len()), "no-store"), false)
                .unwrap();
            send.send_data(Bytes::from(text), true).unwrap();
            let _ = poll_fn(|cx| send.poll_reset(cx)).await;
        }
        Act::Endless => {
            let mut send = respond
                .send_response(head(None, "no-store"), false)
                .unwrap();
            let chunk = Bytes::from(vec![b'e'; 16 * 1024]);
            let reason = loop {
                tokio::select! {
                    reason = poll_fn(|cx| send.poll_reset(cx)) => break reason.ok(),
                    () = tokio::time::sleep(Duration::from_millis(20)) => {
                        if let Err(e) = send.send_data(chunk.clone(), false) {
                            break e.reason();
                        }
                    }
                }
            };
            if let Some(reason) = reason {
                resets.lock().unwrap().push(reason);
            }
        }
    }
}

/// A daemon with one worker (so one connection to the origin) in front of `origin` over h2c.
fn h2c(origin: &H2Origin) -> Daemon {
    Daemon::with_config_only(&config_with(
        1,
        &format!("address = \"http://{}\"\nprotocol = \"h2c\"\n", origin.addr),
    ))
}

#[tokio::test]
async fn a_goaway_mid_response_fails_the_client_and_stores_nothing() {
    let origin = H2Origin::start(65_535, |_| Act::GoAwayMidBody(256 * 1024)).await;
    let d = h2c(&origin);
    let cut = get_host(&d, "www.example.com", "/g").await;
    assert!(cut.is_err(), "a truncated body is no answer: {cut:?}");
    let again = get_host(&d, "www.example.com", "/g").await;
    assert!(again.is_err(), "{again:?}");
    assert_eq!(
        origin.requests.load(Ordering::SeqCst),
        2,
        "nothing was stored: the second request went to the origin"
    );
    let view = backend_view(&d).await;
    assert!(view["errors"].as_u64().unwrap() >= 2, "{view}");
    assert!(
        view["last_error"]["message"]
            .as_str()
            .unwrap()
            .contains("body broke off"),
        "{view}"
    );
    assert_eq!(
        view["streams_reset"], 2,
        "each stream the GOAWAY cut off counts: {view}"
    );
    assert_eq!(
        origin.connections.load(Ordering::SeqCst),
        2,
        "a connection the origin went away from is not used again"
    );
}

#[tokio::test]
async fn a_reset_stream_fails_the_client_or_leaves_the_stale_object() {
    let origin = H2Origin::start(65_535, |path| match path {
        "/mid" => Act::ResetMidBody(256 * 1024),
        "/head" => Act::ResetHead,
        _ => Act::Body(1000),
    })
    .await;
    let d = h2c(&origin);
    let cut = get_host(&d, "www.example.com", "/mid").await;
    assert!(cut.is_err(), "{cut:?}");
    let refused = get_host(&d, "www.example.com", "/head").await.unwrap();
    assert_eq!(refused.status, 502, "{refused:?}");
    let view = backend_view(&d).await;
    // A fill whose request failed is sent once more (a connection may have closed under it): the
    // origin refused /head twice.
    assert_eq!(origin.requests.load(Ordering::SeqCst), 3);
    assert_eq!(view["streams_reset"], 3, "{view}");
    assert_eq!(view["errors"], 3, "{view}");
    // The one connection carried all of it: a reset stream leaves the connection in use.
    assert_eq!(origin.connections.load(Ordering::SeqCst), 1);
    let again = get_host(&d, "www.example.com", "/mid").await;
    assert!(
        again.is_err(),
        "nothing stored from the cut body: {again:?}"
    );
}

#[tokio::test]
async fn a_stale_object_stands_in_for_a_reset_stream() {
    static RESET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let origin = H2Origin::start(65_535, |_| {
        if RESET.load(Ordering::SeqCst) {
            Act::ResetHead
        } else {
            Act::Short(1000)
        }
    })
    .await;
    let d = h2c(&origin);
    let first = get_host(&d, "www.example.com", "/s").await.unwrap();
    assert_eq!(first.body, pattern(1000));
    RESET.store(true, Ordering::SeqCst);
    // Past its max-age: the origin resets the refetch, and the stale copy answers (stale-if-error).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let stale = get_host(&d, "www.example.com", "/s").await.unwrap();
    assert_eq!(stale.status, 200);
    assert_eq!(stale.body, pattern(1000));
    // The refetch was refused, and sent once more (as any failed fill is), refused again.
    assert_eq!(origin.requests.load(Ordering::SeqCst), 3);
    assert_eq!(backend_view(&d).await["streams_reset"], 2);
}

#[tokio::test]
async fn an_origin_that_stops_answering_pings_is_dropped_and_the_fill_goes_to_a_new_connection() {
    static FROZEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let origin = H2Origin::start(65_535, |path| match path {
        "/freeze" if !FROZEN.swap(true, Ordering::SeqCst) => Act::Freeze,
        _ => Act::Body(1000),
    })
    .await;
    let d = Daemon::with_config_only(&config_with(
        1,
        &format!(
            "address = \"http://{}\"\nprotocol = \"h2c\"\nh2_ping_interval = \"500ms\"\n\
             h2_ping_timeout = \"500ms\"\nfirst_byte_timeout = \"120s\"\n",
            origin.addr
        ),
    ));
    let warm = get_host(&d, "www.example.com", "/warm").await.unwrap();
    assert_eq!(warm.status, 200);
    let started = std::time::Instant::now();
    let answered = get_host(&d, "www.example.com", "/freeze").await.unwrap();
    // The frozen connection is given up on its unanswered PING, not after first_byte_timeout (120 s);
    // the fill then goes once more, on a new connection, which answers.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(answered.status, 200, "{answered:?}");
    assert!(answered.body == pattern(1000));
    assert_eq!(origin.connections.load(Ordering::SeqCst), 2);
    assert_eq!(origin.requests.load(Ordering::SeqCst), 3);
    let view = backend_view(&d).await;
    assert_eq!(view["errors"], 1, "the dead connection counts: {view}");
    assert_eq!(
        view["streams_reset"], 0,
        "the origin cut nothing off: {view}"
    );
    assert_eq!(view["health"], "healthy", "{view}");
    let after = get_host(&d, "www.example.com", "/after").await.unwrap();
    assert_eq!(after.status, 200);
    assert_eq!(
        origin.connections.load(Ordering::SeqCst),
        2,
        "the new connection stays in use"
    );
}

#[tokio::test]
async fn a_tiny_window_paces_bodies_without_losing_a_byte() {
    let origin = H2Origin::start(1024, |path| match path {
        "/echo" => Act::Echo,
        _ => Act::Body(1 << 20),
    })
    .await;
    let d = h2c(&origin);
    let big = get_host(&d, "www.example.com", "/big").await.unwrap();
    assert_eq!(big.status, 200);
    assert!(
        big.body == pattern(1 << 20),
        "the 1 MiB body arrives intact"
    );

    // A 1 MiB request body through the origin's 1 KiB stream window.
    let upload = pattern(1 << 20);
    let sum = upload
        .iter()
        .fold(0u32, |s, b| s.wrapping_mul(31).wrapping_add(u32::from(*b)));
    let echo = request(
        d.addr,
        Method::POST,
        "/echo",
        &[("host", "www.example.com")],
        Bytes::from(upload),
    )
    .await
    .unwrap();
    assert_eq!(echo.status, 200);
    assert_eq!(echo.body, format!("{} {sum}", 1 << 20));
}

#[tokio::test]
async fn an_oversized_header_block_is_refused() {
    let origin = H2Origin::start(65_535, |path| match path {
        "/huge" => Act::HugeHead(128 * 1024),
        _ => Act::HugeHead(16 * 1024),
    })
    .await;
    let d = h2c(&origin);
    let fine = get_host(&d, "www.example.com", "/fine").await.unwrap();
    assert_eq!(fine.status, 200, "16 KiB of headers are taken");
    let huge = get_host(&d, "www.example.com", "/huge").await.unwrap();
    assert_eq!(huge.status, 502, "{huge:?}");
    // Refused on the fill and on its one retry; the h2 crate takes a header block this far over the
    // limit for a flood of CONTINUATION frames, and drops the connection each time.
    let view = backend_view(&d).await;
    assert_eq!(view["errors"], 2, "{view}");
    let again = get_host(&d, "www.example.com", "/huge").await.unwrap();
    assert_eq!(again.status, 502, "nothing stored");
}

/// Hardening III, finding 6: one response's header bomb (over four times the h2 crate's limit, where it
/// sends `GOAWAY`) fails that fill alone; fills sharing the connection finish, byte for byte.
#[tokio::test]
async fn a_header_bomb_fails_its_own_fill_not_the_others_on_the_connection() {
    let origin = H2Origin::start(65_535, |path| match path {
        "/bomb" => Act::HugeHead(300 * 1024),
        _ => Act::Slow(30 * 1024),
    })
    .await;
    let d = h2c(&origin);
    let slow: Vec<_> = (0..3)
        .map(|n| {
            let addr = d.addr;
            tokio::spawn(async move {
                lacquer_tests::request(
                    addr,
                    Method::GET,
                    &format!("/slow/{n}"),
                    &[("host", "www.example.com")],
                    Bytes::new(),
                )
                .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let bomb = get_host(&d, "www.example.com", "/bomb").await.unwrap();
    assert_eq!(bomb.status, 502, "{bomb:?}");
    for s in slow {
        let r = s
            .await
            .unwrap()
            .expect("a fill sharing the connection finished");
        assert_eq!(r.status, 200);
        assert_eq!(&r.body[..], &pattern(30 * 1024)[..], "cut off by the bomb");
    }
    assert_eq!(origin.connections.load(Ordering::SeqCst), 1);
}

/// What held in the hardening III audit: an h2 origin whose body is shorter or longer than its
/// `Content-Length` fails the client's response, stores nothing, and leaves the connection to the others.
#[tokio::test]
async fn a_body_that_belies_its_content_length_fails_and_is_not_stored() {
    let origin = H2Origin::start(65_535, |path| match path {
        "/short" => Act::Lying(2000, 1000),
        "/long" => Act::Lying(1000, 2000),
        _ => Act::Body(1000),
    })
    .await;
    let d = h2c(&origin);
    for path in ["/short", "/long"] {
        for _ in 0..2 {
            // An error mid-body is as good as a 502: the client never takes the body for whole.
            if let Ok(r) = get_host(&d, "www.example.com", path).await {
                assert!(
                    r.status == 502 || r.body.len() != 1000 && r.body.len() != 2000,
                    "{path}: {} with {} bytes",
                    r.status,
                    r.body.len()
                );
            }
        }
    }
    assert_eq!(
        origin.requests.load(Ordering::SeqCst),
        4,
        "nothing stored: each request went to the origin"
    );
    let fine = get_host(&d, "www.example.com", "/fine").await.unwrap();
    assert_eq!((fine.status.as_u16(), fine.body.len()), (200, 1000));
}

/// Opens `method path` on a raw connection, reads some of the body, and leaves.
async fn read_some_and_leave(addr: SocketAddr, method: &str, path: &str) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let body = if method == "POST" {
        "content-length: 0\r\n"
    } else {
        ""
    };
    tcp.write_all(
        format!("{method} {path} HTTP/1.1\r\nhost: www.example.com\r\n{body}\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = vec![0; 64 * 1024];
    let mut got = 0;
    while got < 32 * 1024 {
        let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf))
            .await
            .expect("body bytes")
            .unwrap();
        assert!(n > 0, "the body flows");
        got += n;
    }
}

#[tokio::test]
async fn a_fetch_nobody_reads_resets_its_stream_at_the_origin() {
    let origin = H2Origin::start(65_535, |_| Act::Endless).await;
    let d = h2c(&origin);
    // An uncacheable miss, then a pass (POST): each client leaves mid-body.
    read_some_and_leave(d.addr, "GET", "/endless").await;
    eventually(Duration::from_secs(10), || async {
        (origin.resets().len() == 1).then_some(())
    })
    .await;
    read_some_and_leave(d.addr, "POST", "/endless").await;
    eventually(Duration::from_secs(10), || async {
        (origin.resets().len() == 2).then_some(())
    })
    .await;
    assert_eq!(origin.resets(), [Reason::CANCEL, Reason::CANCEL]);
    // Cancelling streams is not a connection's end: both went on the one connection.
    assert_eq!(origin.connections.load(Ordering::SeqCst), 1);
    let view = backend_view(&d).await;
    assert_eq!(
        view["errors"], 0,
        "leaving is not the origin's fault: {view}"
    );
    assert_eq!(view["streams_reset"], 0, "{view}");
}

#[tokio::test]
async fn an_origin_that_does_not_agree_to_h2_fails_clearly() {
    // A TLS origin offering no ALPN protocol: HTTP/2 is not spoken to it.
    let ca = TestCa::new();
    let plain = lacquer_tests::Origin::start(|_| lacquer_tests::Reply::ok("h1 only")).await;
    let front = ca.front(&["127.0.0.1"], plain.addr).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let d = daemon(&format!(
        "address = \"https://{front}\"\nprotocol = \"h2\"\ntls_ca = \"{}\"\n",
        ca_file.display()
    ));
    let reply = get_host(&d, "www.example.com", "/").await.unwrap();
    assert_eq!(reply.status, 503);
    // Clearly to the operator (the log); the client's page names no cause.
    assert!(
        !String::from_utf8_lossy(&reply.body).contains("HTTP/2"),
        "{reply:?}"
    );
    d.wait_for_log("did not agree to HTTP/2").await;
    assert_eq!(plain.total(), 0);
}
