//! `103 Early Hints` through the real daemon: an origin's 103 forwarded ahead of its answer, and a rule's
//! `early_hints` sent as a request goes to the origin; seen by curl over HTTP/1.1 and HTTP/2 (HTTP/3 is
//! in http3.rs), with what the origin saw.

use std::time::Duration;

use lacquer_tests::{origin::Raw, Daemon, Origin};

/// An origin that answers every request with a 103 carrying a preload hint, and 300 ms later its page.
async fn hinting_origin() -> Origin {
    Origin::raw(|seen| {
        let body = format!("page {}", seen.path);
        vec![
            Raw::write(
                "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload; as=style\r\n\
                 Set-Cookie: session=origin\r\n\r\n",
            ),
            Raw::Sleep(Duration::from_millis(300)),
            Raw::write(format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nCache-Control: max-age=600\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                body.len()
            )),
        ]
    })
    .await
}

/// What curl printed of every response it got for `path` (`-v`: each status line and field as `< …`),
/// and the body.
async fn curl(d: &Daemon, args: &[&str], path: &str) -> (Vec<String>, String) {
    let url = format!("http://{}{path}", d.addr);
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new("curl")
            .args(["-s", "-v"])
            .args(&args)
            .arg(&url)
            .output()
            .expect("curl runs");
        let received = String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter_map(|l| l.strip_prefix("< "))
            .map(|l| l.trim_end().to_ascii_lowercase())
            .collect();
        (received, String::from_utf8_lossy(&out.stdout).into_owned())
    })
    .await
    .unwrap()
}

fn statuses(received: &[String]) -> Vec<String> {
    received
        .iter()
        .filter(|l| l.starts_with("http/"))
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_origins_early_hints_reach_the_client_before_its_answer() {
    let origin = hinting_origin().await;
    let d = Daemon::with_config(
        origin.addr,
        r#"
[[listen]]
address = "127.0.0.1:0"

[[rule]]
name = "hint-the-shop"
match = { path_prefix = ["/shop/"] }
early_hints = ["</app.js>; rel=preload; as=script", "</shop.css>; rel=preload; as=style"]
"#,
    );

    // HTTP/1.1: the origin's 103 as it sent it (less its cookie), then the page.
    let (received, body) = curl(&d, &[], "/a").await;
    assert_eq!(
        statuses(&received),
        ["http/1.1 103 early hints", "http/1.1 200 ok"]
    );
    assert!(received.contains(&"link: </style.css>; rel=preload; as=style".to_owned()));
    assert!(
        !received.iter().any(|l| l.contains("session=origin")),
        "{received:?}"
    );
    assert_eq!(body, "page /a");
    // Stored: a hit is answered at once, with no hint (the origin is not asked).
    let (received, body) = curl(&d, &[], "/a").await;
    assert_eq!(statuses(&received), ["http/1.1 200 ok"]);
    assert_eq!(body, "page /a");

    // HTTP/2: the same, as HEADERS frames ahead of the answer's.
    let (received, body) = curl(&d, &["--http2-prior-knowledge"], "/b").await;
    assert_eq!(statuses(&received), ["http/2 103", "http/2 200"]);
    assert!(received.contains(&"link: </style.css>; rel=preload; as=style".to_owned()));
    assert_eq!(body, "page /b");

    // HTTP/1.0: never sent a 1xx (RFC 9110 §15.2).
    let (received, body) = curl(&d, &["--http1.0"], "/c").await;
    assert_eq!(statuses(&received), ["http/1.0 200 ok"]);
    assert_eq!(body, "page /c");

    // A rule's hints go out as the request goes to the origin, before the origin's own.
    let (received, body) = curl(&d, &[], "/shop/cart").await;
    assert_eq!(
        statuses(&received),
        [
            "http/1.1 103 early hints",
            "http/1.1 103 early hints",
            "http/1.1 200 ok"
        ]
    );
    let links: Vec<_> = received.iter().filter(|l| l.starts_with("link:")).collect();
    assert_eq!(
        links,
        [
            "link: </app.js>; rel=preload; as=script",
            "link: </shop.css>; rel=preload; as=style",
            "link: </style.css>; rel=preload; as=style"
        ]
    );
    assert_eq!(body, "page /shop/cart");
    let (received, _) = curl(&d, &["--http2-prior-knowledge"], "/shop/list").await;
    assert_eq!(
        statuses(&received),
        ["http/2 103", "http/2 103", "http/2 200"]
    );

    // `cachectl explain` shows the hints a request would be sent.
    let admin = d.admin.to_string();
    let secret = d.secret_file();
    let (status, out, err) = lacquer_tests::run_tool(
        lacquer_tests::daemon::binary("cachectl").to_str().unwrap(),
        &[
            "--admin",
            &admin,
            "--secret",
            secret.to_str().unwrap(),
            "explain",
            "http://shop.test/shop/checkout",
        ],
    );
    assert_eq!(status, 0, "{err}");
    assert!(
        out.contains("early hints </app.js>; rel=preload; as=script\n")
            && out.contains("            </shop.css>; rel=preload; as=style\n"),
        "{out}"
    );

    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["early_hints_sent"].as_u64(), Some(2));
    assert_eq!(stats["proxy"]["interim_forwarded"].as_u64(), Some(4));
    assert_eq!(stats["proxy"]["interim_responses"].as_u64(), Some(5));
    // The origin was asked once per page: hints are never stored, never answered from the store.
    assert_eq!(origin.total(), 5);
}

#[test]
fn a_hint_that_is_not_a_link_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lacquer.toml");
    std::fs::write(
        &file,
        "[backend]\naddress = \"127.0.0.1:8080\"\n\n\
         [[rule]]\nname = \"bad\"\nearly_hints = [\"/app.css; rel=preload\"]\n",
    )
    .unwrap();
    let (status, _, err) = lacquer_tests::run_tool(
        lacquer_tests::daemon::binary("lacquerd").to_str().unwrap(),
        &["--config", file.to_str().unwrap(), "--check"],
    );
    assert_ne!(status, 0);
    assert!(
        err.contains("early_hints[0]") && err.contains("angle brackets"),
        "{err}"
    );
}
