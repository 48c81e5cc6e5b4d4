//! Memory stays bounded by configuration whatever clients and origins do: a fetch holds at most
//! `transit_buffer` bytes of a body, reads an unstored body no faster than its client takes it, stops when its
//! clients leave, and a reader that falls behind a stored body reads it back from the store.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use lacquer_tests::{pattern, Daemon, Origin, Reply, Step};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpSocket, TcpStream},
};

const MIB: usize = 1024 * 1024;

const CONFIG: &str = r#"
[[listen]]
address = "127.0.0.1:0"

[cache]
transit_buffer = "1MiB"
"#;

/// A client that asks for `path` and then reads nothing, behind a small receive buffer.
async fn stalled_client(addr: std::net::SocketAddr, path: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(64 * 1024).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    stream
}

/// Waits until `f` holds, for at most `within`.
async fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unstored_body_is_read_no_faster_than_its_client_takes_it() {
    const LEN: usize = 128 * MIB;
    let origin = Origin::start(|_| Reply::large(LEN).header("cache-control", "no-store")).await;
    let d = Daemon::with_config(origin.addr, CONFIG);
    let mut client = stalled_client(d.addr, "/download.iso").await;
    let mut first = vec![0u8; 1024];
    client.read_exact(&mut first).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // What the origin can have handed over: the 1 MiB window, hyper's buffers and the kernel's socket
    // buffers on both sides (a few MiB each on loopback).
    let taken = origin.body_bytes();
    assert!(
        taken < 32 * MIB,
        "the origin was read ahead of the client: {} MiB of {} MiB",
        taken / MIB,
        LEN / MIB
    );
    let body = read_response_rest(&mut client, &first, LEN).await;
    assert!(body == pattern(LEN), "every byte arrives, in order");
    assert_eq!(origin.count("/download.iso"), 1);
}

/// The rest of a response whose first bytes (`first`, from the start of the head) were read already.
async fn read_response_rest(stream: &mut TcpStream, first: &[u8], len: usize) -> Vec<u8> {
    let mut joined = first.to_vec();
    let mut chunk = vec![0u8; 256 * 1024];
    let head_end = loop {
        if let Some(end) = joined.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let n = stream.read(&mut chunk).await.unwrap();
        joined.extend_from_slice(&chunk[..n]);
    };
    let mut body = joined.split_off(head_end);
    while body.len() < len {
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "body cut short at {} of {len}", body.len());
        body.extend_from_slice(&chunk[..n]);
    }
    body
}

/// A chunked body that turns out larger than `max_object_size` stops being stored half-way: from then on
/// the origin waits for the client, and the client still gets every byte (the first ones back from the
/// chunks stored before the limit was crossed).
#[tokio::test(flavor = "multi_thread")]
async fn a_body_that_outgrows_the_store_is_read_at_its_clients_pace() {
    const LEN: usize = 96 * MIB;
    let origin = Origin::start(|_| {
        let whole = Reply::large(LEN);
        let steps = whole.body.clone();
        whole
            .steps(steps, None)
            .header("cache-control", "max-age=600")
    })
    .await;
    let config = format!("{CONFIG}max_object_size = \"8MiB\"\n");
    let d = Daemon::with_config(origin.addr, &config);
    let mut client = stalled_client(d.addr, "/growing.bin").await;
    let mut first = vec![0u8; 1024];
    client.read_exact(&mut first).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let taken = origin.body_bytes();
    assert!(
        taken < 40 * MIB,
        "the origin was read ahead of the client: {} MiB",
        taken / MIB
    );
    let body = read_chunked_rest(&mut client, &first).await;
    assert_eq!(body.len(), LEN);
    assert!(body == pattern(LEN), "every byte arrives, in order");
    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["objects_stored"], 0, "{stats}");
}

/// The body of a chunked response whose first bytes (`first`, from the start of the head) were read.
async fn read_chunked_rest(stream: &mut TcpStream, first: &[u8]) -> Vec<u8> {
    let mut raw = first.to_vec();
    let mut chunk = vec![0u8; 256 * 1024];
    while !raw.ends_with(b"\r\n0\r\n\r\n") {
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "connection closed before the last chunk");
        raw.extend_from_slice(&chunk[..n]);
    }
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let mut rest = &raw[head_end..];
    let mut body = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n").unwrap();
        let size =
            usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap(), 16).unwrap();
        rest = &rest[line_end + 2..];
        if size == 0 {
            return body;
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_leaves_stops_an_unstored_fetch() {
    const LEN: usize = 128 * MIB;
    let origin = Origin::start(|_| Reply::large(LEN).header("cache-control", "no-store")).await;
    let d = Daemon::with_config(origin.addr, CONFIG);
    let mut client = stalled_client(d.addr, "/movie.mp4").await;
    let mut first = vec![0u8; 64 * 1024];
    client.read_exact(&mut first).await.unwrap();
    drop(client);
    assert!(
        eventually(Duration::from_secs(5), || origin.in_flight() == 0).await,
        "the origin is still sending: {} MiB taken",
        origin.body_bytes() / MIB
    );
    assert!(origin.body_bytes() < 32 * MIB);
    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["fetches_cancelled"], 1, "{stats}");
    assert_eq!(stats["proxy"]["backend_errors"], 0, "{stats}");
}

/// A stored body is read from the origin at the store's pace, not the client's; the slow client then
/// reads what the window no longer holds back from the store, byte for byte.
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_reader_of_a_stored_body_reads_it_back_from_the_store() {
    const LEN: usize = 40 * MIB;
    let origin = Origin::start(|_| Reply::large(LEN).header("cache-control", "max-age=600")).await;
    let d = Daemon::with_config(origin.addr, CONFIG);
    let mut slow = stalled_client(d.addr, "/segment.ts").await;
    let mut first = vec![0u8; 1024];
    slow.read_exact(&mut first).await.unwrap();
    d.wait_for_stats("the body to be stored while the client waits", |s| {
        s["proxy"]["objects_stored"] == 1
    })
    .await;
    let hit = lacquer_tests::get(d.addr, "/segment.ts").await;
    assert_eq!(hit.x_cache(), "HIT", "{}", d.stats().await);
    let body = read_response_rest(&mut slow, &first, LEN).await;
    assert!(
        body == pattern(LEN),
        "the slow client got every byte, in order"
    );
    assert_eq!(origin.count("/segment.ts"), 1);
    let stats = d.stats().await;
    assert!(
        stats["store"]["chunk_reads_memory"].as_u64().unwrap()
            + stats["store"]["chunk_reads_disk"].as_u64().unwrap()
            > 0,
        "{stats}"
    );
}

/// HTTP/2 clients that open streams and reset them at once take their origin fetches with them, and
/// the backend's default connection limit caps what reaches the origin meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn reset_http2_streams_release_their_origin_fetches() {
    let drip: Vec<Step> = (0..200)
        .flat_map(|_| {
            [
                Step::Data(Bytes::from(vec![b'x'; 1024])),
                Step::Sleep(Duration::from_millis(50)),
            ]
        })
        .collect();
    let origin = Origin::start(move |_| {
        Reply::ok("")
            .header("cache-control", "no-store")
            .steps(drip.clone(), Some(200 * 1024))
    })
    .await;
    let d = Daemon::with_config(origin.addr, CONFIG);
    let mut tasks = Vec::new();
    for conn in 0..10 {
        let tcp = TcpStream::connect(d.addr).await.unwrap();
        let (send, connection) = http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(connection);
        for stream in 0..100 {
            let mut send = send.clone();
            tasks.push(tokio::spawn(async move {
                let req = http::Request::builder()
                    .uri(format!("http://example.test/live/{conn}/{stream}"))
                    .body(Empty::<Bytes>::new())
                    .unwrap();
                // Dropping the response future (or its body) resets the stream.
                if let Ok(Ok(resp)) =
                    tokio::time::timeout(Duration::from_millis(300), send.send_request(req)).await
                {
                    let mut body = resp.into_body();
                    let _ = tokio::time::timeout(Duration::from_millis(10), body.frame()).await;
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert!(
        eventually(Duration::from_secs(3), || origin.in_flight() == 0).await,
        "{} origin requests still running after every stream was reset",
        origin.in_flight()
    );
    // The origin learns that a cancelled request ended when its connection closes, a moment after the
    // proxy released that request's connection permit: a few requests may overlap in its count (260 and
    // 298 seen in loaded runs of the whole suite). Without the cap it counts every one of the 1000.
    assert!(
        origin.max_in_flight() <= 256 + 64,
        "the default backend limit caps origin requests: {}",
        origin.max_in_flight()
    );
    // The origin sees the requests end before the proxy has counted every cancellation.
    d.wait_for_stats("fetches cancelled", |s| {
        s["proxy"]["fetches_cancelled"].as_u64().unwrap() > 0
    })
    .await;
}

/// Overlapping ranges are coalesced: 16 × `0-` is one part, not sixteen copies of the body.
#[tokio::test(flavor = "multi_thread")]
async fn overlapping_ranges_cost_one_body_at_most() {
    const LEN: usize = MIB;
    let origin = Origin::start(|_| Reply::large(LEN).header("cache-control", "max-age=600")).await;
    let d = Daemon::start(origin.addr, &[]);
    let stored = lacquer_tests::get(d.addr, "/file.bin").await;
    assert_eq!(stored.body.len(), LEN);
    let many = format!("bytes={}", vec!["0-"; 16].join(","));
    let r = lacquer_tests::request(
        d.addr,
        http::Method::GET,
        "/file.bin",
        &[("range", &many)],
        Bytes::new(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 206);
    assert_eq!(
        r.header("content-range"),
        format!("bytes 0-{}/{LEN}", LEN - 1)
    );
    assert_eq!(r.body.len(), LEN);
    let spread = format!(
        "bytes={}",
        (0..16)
            .map(|i| format!("{}-{}", i * 1000, i * 1000 + 999))
            .collect::<Vec<_>>()
            .join(",")
    );
    let r = lacquer_tests::request(
        d.addr,
        http::Method::GET,
        "/file.bin",
        &[("range", &spread)],
        Bytes::new(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 206);
    assert_eq!(r.body.len(), 16_000, "adjacent ranges are one part");
    assert!(r.body == pattern(LEN)[..16_000]);
}
