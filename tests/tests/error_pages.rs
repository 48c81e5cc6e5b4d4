//! What a client gets when no backend answers: a generic page (HTML for browsers, plain text for the
//! rest) that names no backend and no error, or the operator's `[error_pages]` file; the cause goes to the
//! log, once per cause every 10 s with the count of the failures like it.

use bytes::Bytes;
use futures_util::StreamExt;
use http::Method;
use lacquer_tests::{
    client::{request, Reply},
    daemon::{binary, Daemon},
    unused_addr,
};

async fn send(d: &Daemon, method: Method, accept: Option<&str>) -> Reply {
    let headers: Vec<(&str, &str)> = accept.map(|a| ("accept", a)).into_iter().collect();
    request(d.addr, method, "/x", &headers, Bytes::new())
        .await
        .unwrap()
}

fn body(r: &Reply) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// Nothing of the cause in the page: not the backend's address, not its port, not the connect error.
fn tells_nothing(r: &Reply, backend: std::net::SocketAddr) {
    let page = body(r).to_ascii_lowercase();
    for leak in [
        backend.to_string(),
        backend.port().to_string(),
        "127.0.0.1".into(),
        "refused".into(),
        "unreachable".into(),
        "backend".into(),
        "error".into(),
    ] {
        assert!(!page.contains(&leak), "{leak:?} in {page:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backend_down_gets_a_generic_page_in_html_or_text_as_accept_prefers() {
    let down = unused_addr();
    let d = Daemon::start(down, &[]);
    let browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";

    let text = send(&d, Method::GET, None).await;
    assert_eq!(text.status, 503);
    assert_eq!(text.header("content-type"), "text/plain; charset=utf-8");
    assert_eq!(text.header("cache-control"), "no-store");
    assert!(
        body(&text).starts_with("503 Service Unavailable"),
        "{text:?}"
    );
    tells_nothing(&text, down);

    let html = send(&d, Method::GET, Some(browser)).await;
    assert_eq!(html.status, 503);
    assert_eq!(html.header("content-type"), "text/html; charset=utf-8");
    assert!(
        body(&html).contains("<h1>503 Service Unavailable</h1>"),
        "{html:?}"
    );
    assert_eq!(
        html.header("content-length"),
        html.body.len().to_string(),
        "framed for its own body"
    );
    tells_nothing(&html, down);

    // A pass (POST) fails the same way.
    let pass = send(&d, Method::POST, Some("application/json")).await;
    assert_eq!(pass.status, 503);
    assert_eq!(pass.header("content-type"), "text/plain; charset=utf-8");
    tells_nothing(&pass, down);

    // The cause is the operator's: in the log, and the backend's last error (`cachectl backends`).
    d.wait_for_log(&down.to_string()).await;
    let backends = d.admin_get("/v1/backends", Some(&d.secret())).await;
    let backends: serde_json::Value = serde_json::from_slice(&backends.body).unwrap();
    let last = backends["backends"][0]["last_error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(last.contains("unreachable"), "{backends}");
}

/// 200 requests to a backend that is down: a handful of `WARN` lines, which count all 200.
#[tokio::test(flavor = "multi_thread")]
async fn failures_like_one_logged_are_counted_not_logged_each() {
    let down = unused_addr();
    let d = Daemon::start(down, &[]);
    let sent = futures_util::stream::iter(0..200)
        .map(|i| {
            let addr = d.addr;
            async move { lacquer_tests::client::get(addr, &format!("/down/{i}")).await }
        })
        .buffer_unordered(20)
        .collect::<Vec<_>>()
        .await;
    assert!(sent.iter().all(|r| r.status == 503));
    // The count is written when the 10 s window of the first line ends.
    tokio::time::sleep(std::time::Duration::from_secs(10)).await;
    let log = d.wait_for_log("more like it in the last 10 s").await;
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("fetch failed")).collect();
    assert!(lines.len() <= 3, "{lines:#?}");
    let counted: u64 = lines
        .iter()
        .map(|l| {
            l.split_once("(and ")
                .and_then(|(_, rest)| rest.split(' ').next()?.parse().ok())
                .unwrap_or(1)
        })
        .sum();
    assert_eq!(counted, 200, "{lines:#?}");
    assert!(
        lines.iter().all(|l| l.contains(&down.to_string())),
        "{lines:#?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_operators_page_is_served_for_its_status_and_reread_on_reload() {
    let pages = tempfile::tempdir().unwrap();
    let page = pages.path().join("503.html");
    std::fs::write(&page, "<p>We will be right back.</p>\n").unwrap();
    let down = unused_addr();
    let config = format!(
        "[[listen]]\naddress = \"127.0.0.1:0\"\n[backend]\naddress = \"{down}\"\n\
         [error_pages]\n503 = \"{}\"\n",
        page.display()
    );
    let d = Daemon::with_config_only(&config);

    for accept in [None, Some("text/html")] {
        let r = send(&d, Method::GET, accept).await;
        assert_eq!(r.status, 503);
        assert_eq!(r.header("content-type"), "text/html; charset=utf-8");
        assert_eq!(body(&r), "<p>We will be right back.</p>\n");
        assert!(r.header("cache-status").starts_with("lacquer"), "{r:?}");
    }

    // Read when the configuration is compiled: a reload reads it again, and a missing one is refused
    // (the old page stays).
    std::fs::write(&page, "<p>Back soon.</p>\n").unwrap();
    let r = d.admin_post("/v1/reload", serde_json::json!({})).await;
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        body(&send(&d, Method::GET, None).await),
        "<p>Back soon.</p>\n"
    );
    std::fs::remove_file(&page).unwrap();
    let r = d.admin_post("/v1/reload", serde_json::json!({})).await;
    assert_ne!(r.status, 200, "{r:?}");
    let why = body(&r);
    assert!(why.contains("error_pages.503"), "{why}");
    assert_eq!(
        body(&send(&d, Method::GET, None).await),
        "<p>Back soon.</p>\n"
    );
}

/// `lacquerd --check` reads the pages: a missing file or a status lacquerd never makes fails it, naming
/// the setting (and the path).
#[test]
fn check_names_the_error_page_that_cannot_be_used() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.html");
    let check = |entry: String| {
        let file = dir.path().join("lacquer.toml");
        std::fs::write(
            &file,
            format!("[backend]\naddress = \"127.0.0.1:9\"\n[error_pages]\n{entry}\n"),
        )
        .unwrap();
        let out = std::process::Command::new(binary("lacquerd"))
            .arg("--check")
            .arg("--config")
            .arg(&file)
            .arg("--disk")
            .arg(dir.path().join("store"))
            .env_remove("LACQUER_CONFIG")
            .output()
            .expect("lacquerd runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, stderr) = check(format!("502 = \"{}\"", missing.display()));
    assert!(!ok);
    assert!(
        stderr.contains(&format!("error_pages.502: {}", missing.display())),
        "{stderr}"
    );
    let (ok, stderr) = check(format!("404 = \"{}\"", missing.display()));
    assert!(!ok);
    assert!(stderr.contains("error_pages.404:"), "{stderr}");
    std::fs::write(&missing, "down\n").unwrap();
    let (ok, stderr) = check(format!("502 = \"{}\"", missing.display()));
    assert!(ok, "{stderr}");
}
