//! The QUERY method (RFC 10008) through the real daemon, sent by a real client (curl `-X QUERY --data`):
//! looked up and stored by default, keyed by its body's SHA-256 and its `Content-Type`, coalesced, and
//! revalidated with the same body; what the client got and what the origin saw.

use std::{sync::Arc, time::Duration};

use lacquer_tests::{origin::Seen, Daemon, Origin, Reply};

/// `curl -X QUERY` of `body` as `content_type` to `path`: the status, `X-Cache` and the body.
async fn query(d: &Daemon, path: &str, content_type: &str, body: &str) -> (u16, String, String) {
    let url = format!("http://{}{path}", d.addr);
    let (content_type, body) = (content_type.to_owned(), body.to_owned());
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new("curl")
            .args(["-s", "-i", "-X", "QUERY", "-H"])
            .arg(format!("content-type: {content_type}"))
            .args(["--data-binary", &body, &url])
            .output()
            .expect("curl runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let x_cache = head
            .lines()
            .find_map(|l| l.strip_prefix("x-cache: "))
            .unwrap_or("")
            .to_owned();
        (status, x_cache, body.to_owned())
    })
    .await
    .unwrap()
}

fn queries(origin: &Origin) -> Vec<Seen> {
    origin
        .seen()
        .into_iter()
        .filter(|s| s.method == "QUERY")
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn queries_are_stored_by_their_content_coalesced_and_revalidated_with_it() {
    let origin = Origin::start(|seen| {
        if seen.headers.contains_key("if-none-match") {
            return Reply::ok("").status(304).header("etag", "\"r1\"");
        }
        let body = String::from_utf8_lossy(&seen.body).into_owned();
        Reply::ok(format!("rows for {body}"))
            .header("cache-control", "max-age=1")
            .header("etag", "\"r1\"")
            .header(
                "accept-query",
                "application/x-www-form-urlencoded, application/sql",
            )
            .delay(Duration::from_millis(200))
    })
    .await;
    let d = Arc::new(Daemon::with_config(
        origin.addr,
        "[cache]\nmax_query_body = \"1KiB\"\n",
    ));
    let form = "application/x-www-form-urlencoded";
    // Five clients at once with the same query: the origin answers one.
    let crowd: Vec<_> = (0..5)
        .map(|_| {
            let d = d.clone();
            tokio::spawn(async move { query(&d, "/orders", form, "status=open").await })
        })
        .collect();
    for client in crowd {
        let (status, _, body) = client.await.unwrap();
        assert_eq!((status, body.as_str()), (200, "rows for status=open"));
    }
    assert_eq!(
        queries(&origin).len(),
        1,
        "one request for many identical ones"
    );
    assert_eq!(&queries(&origin)[0].body[..], b"status=open");
    d.wait_for_stats("stored", |s| {
        s["store"]["objects_published"].as_u64() >= Some(1)
    })
    .await;
    assert_eq!(
        query(&d, "/orders", form, "status=open").await,
        (200, "HIT".into(), "rows for status=open".into())
    );
    // Another body, or the same bytes as another media type, is another query: never the stored answer.
    assert_eq!(
        query(&d, "/orders", form, "status=closed").await.2,
        "rows for status=closed"
    );
    assert_eq!(
        query(&d, "/orders", "application/sql", "status=open")
            .await
            .2,
        "rows for status=open"
    );
    assert_eq!(queries(&origin).len(), 3);
    // Stale, it is revalidated with a QUERY carrying the same body.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        query(&d, "/orders", form, "status=open").await.2,
        "rows for status=open"
    );
    let revalidation = queries(&origin).pop().unwrap();
    assert!(revalidation.headers.contains_key("if-none-match"));
    assert_eq!(&revalidation.body[..], b"status=open");
    // Past `max_query_body`, a query is passed: sent on, never stored, and it invalidates nothing.
    let large = "x".repeat(2000);
    for _ in 0..2 {
        let (status, x_cache, body) = query(&d, "/orders", form, &large).await;
        assert_eq!((status, x_cache.as_str()), (200, "PASS"));
        assert_eq!(body.len(), "rows for ".len() + 2000);
    }
    // The same bytes in another coding are another query too: stored and fresh, a query is not the answer
    // to the same bytes sent with a Content-Encoding.
    assert_eq!(query(&d, "/orders", form, "status=held").await.1, "MISS");
    d.wait_for_stats("stored", |s| {
        s["store"]["objects_published"].as_u64() >= Some(4)
    })
    .await;
    assert_eq!(query(&d, "/orders", form, "status=held").await.1, "HIT");
    let before = queries(&origin).len();
    let coded = lacquer_tests::request(
        d.addr,
        http::Method::from_bytes(b"QUERY").unwrap(),
        "/orders",
        &[("content-type", form), ("content-encoding", "identity")],
        bytes::Bytes::from_static(b"status=held"),
    )
    .await
    .unwrap();
    assert_eq!(coded.x_cache(), "MISS");
    assert_eq!(queries(&origin).len(), before + 1);
    let stats = d.stats().await;
    assert_eq!(
        stats["proxy"]["invalidations"], 0,
        "a passed QUERY is safe: it invalidates nothing ({stats})"
    );
}
