//! Origins that break mid-body: a body shorter than its `Content-Length`, a chunked body cut before its last
//! chunk, an origin that drips bytes and one that stalls. A broken body reaches no client as a complete
//! one (not the client that caused the fetch, not the ones coalesced on it), is never stored, and counts
//! as a backend error; a slow but complete body is stored whole.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::BodyExt;
use lacquer_tests::{get, open, Daemon, Origin, Raw};
use tokio::sync::Notify;

fn pattern(len: usize) -> Bytes {
    (0..len)
        .map(|i| b'a' + (i % 26) as u8)
        .collect::<Vec<_>>()
        .into()
}

fn head(framing: &str) -> String {
    format!("HTTP/1.1 200 OK\r\ncache-control: max-age=60\r\n{framing}\r\n\r\n")
}

/// The whole body, `Content-Length` framed, for every request after the first.
fn complete(body: &Bytes) -> Vec<Raw> {
    vec![
        Raw::write(head(&format!("content-length: {}", body.len()))),
        Raw::Write(body.clone()),
    ]
}

/// An origin whose first answer is `first` and every later one the complete body.
async fn failing_once(first: Vec<Raw>, body: Bytes) -> Origin {
    let answered = AtomicUsize::new(0);
    Origin::raw(move |_| {
        if answered.fetch_add(1, Ordering::SeqCst) == 0 {
            first.clone()
        } else {
            complete(&body)
        }
    })
    .await
}

/// A daemon whose backend fails a fetch after `between_bytes` without a byte.
fn daemon(origin: &Origin, between_bytes: &str) -> Daemon {
    Daemon::with_config(
        origin.addr,
        &format!(
            "[[listen]]\naddress = \"127.0.0.1:0\"\n[backend]\nbetween_bytes_timeout = \"{between_bytes}\"\n"
        ),
    )
}

/// Two clients on one fetch, the second coalesced on the first; the origin's first answer breaks once
/// `gate` is opened. Both must see an error, the next request must go to the origin and get the whole
/// body, and the failure must be counted.
async fn broken_fetch_fails_its_readers(
    origin: &Origin,
    d: &Daemon,
    gate: Option<&Notify>,
    body: &Bytes,
) {
    let leader = open(d.addr, "/obj").await;
    let waiter = open(d.addr, "/obj").await;
    assert!(
        waiter.headers()["cache-status"]
            .to_str()
            .unwrap()
            .contains("collapsed"),
        "the second client joined the fetch: {:?}",
        waiter.headers()
    );
    if let Some(gate) = gate {
        gate.notify_one();
    }
    for (who, reply) in [("leader", leader), ("waiter", waiter)] {
        let got = tokio::time::timeout(Duration::from_secs(20), reply.into_body().collect())
            .await
            .unwrap_or_else(|_| panic!("the {who}'s body neither ended nor failed"));
        assert!(
            got.is_err(),
            "the {who} got a truncated body as complete: {} bytes",
            got.unwrap().to_bytes().len()
        );
    }
    let again = get(d.addr, "/obj").await;
    assert_eq!(
        (again.status.as_u16(), again.x_cache(), &again.body),
        (200, "MISS", body),
        "nothing of the broken fetch was stored"
    );
    assert_eq!(origin.count("/obj"), 2);
    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["backend_errors"], 1, "{stats}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_shorter_than_its_content_length_fails_and_is_not_stored() {
    let body = pattern(1000);
    let gate = Arc::new(Notify::new());
    let first = vec![
        Raw::write(head("content-length: 1000")),
        Raw::Write(body.slice(..500)),
        Raw::Gate(gate.clone()),
        Raw::Close,
    ];
    let origin = failing_once(first, body.clone()).await;
    let d = daemon(&origin, "60s");
    broken_fetch_fails_its_readers(&origin, &d, Some(&gate), &body).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chunked_body_cut_before_its_last_chunk_fails_and_is_not_stored() {
    let body = pattern(1000);
    let gate = Arc::new(Notify::new());
    let first = vec![
        Raw::write(head("transfer-encoding: chunked")),
        Raw::write(format!("{:x}\r\n", 500)),
        Raw::Write(body.slice(..500)),
        Raw::write("\r\n"),
        Raw::Gate(gate.clone()),
        Raw::Close,
    ];
    let origin = failing_once(first, body.clone()).await;
    let d = daemon(&origin, "60s");
    broken_fetch_fails_its_readers(&origin, &d, Some(&gate), &body).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_origin_stalled_past_between_bytes_timeout_fails_and_is_not_stored() {
    let body = pattern(1000);
    let first = vec![
        Raw::write(head("content-length: 1000")),
        Raw::Write(body.slice(..500)),
        Raw::Sleep(Duration::from_secs(4)),
        Raw::Write(body.slice(500..)),
    ];
    let origin = failing_once(first, body.clone()).await;
    let d = daemon(&origin, "1s");
    broken_fetch_fails_its_readers(&origin, &d, None, &body).await;
    d.wait_for_log("no body bytes for 1s").await;
}

/// An origin that drips its body, each gap well within the 1 s `between_bytes_timeout` and the whole
/// longer than it: a byte every 50 ms with `Content-Length`, every 10 ms with chunked framing (the
/// framing dripped too, 305 bytes).
#[tokio::test(flavor = "multi_thread")]
async fn a_dripped_body_is_served_and_stored_whole() {
    let body = pattern(50);
    let gap = Duration::from_millis(50);
    let mut chunked = Vec::new();
    for b in body.iter() {
        chunked.extend_from_slice(format!("1\r\n{}\r\n", *b as char).as_bytes());
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let dripped = Arc::new(chunked);
    let plain = body.clone();
    let origin = Origin::raw(move |seen| {
        if seen.path == "/chunked" {
            let mut steps = vec![Raw::write(head("transfer-encoding: chunked"))];
            steps.extend(Raw::drip(&dripped, gap / 5));
            steps
        } else {
            let mut steps = vec![Raw::write(head("content-length: 50"))];
            steps.extend(Raw::drip(&plain, gap));
            steps
        }
    })
    .await;
    let d = daemon(&origin, "1s");
    for path in ["/length", "/chunked"] {
        let (first, second) = tokio::join!(get(d.addr, path), async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            get(d.addr, path).await
        });
        for r in [&first, &second] {
            assert_eq!((r.status.as_u16(), &r.body), (200, &body), "{path}");
        }
        assert_eq!(
            origin.count(path),
            1,
            "{path}: the second client was coalesced"
        );
    }
    d.wait_for_stats("both objects stored", |s| s["proxy"]["objects_stored"] == 2)
        .await;
    for path in ["/length", "/chunked"] {
        let hit = get(d.addr, path).await;
        assert_eq!((hit.x_cache(), &hit.body), ("HIT", &body), "{path}");
        assert_eq!(origin.count(path), 1);
    }
    assert_eq!(d.stats().await["proxy"]["backend_errors"], 0);
}
