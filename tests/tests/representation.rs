//! Which representation of a stored object a client is sent, on every path that answers from the cache:
//! {identity, gzip, br client} × {fresh hit, miss, stale being revalidated, stale on error} × {full, range,
//! multi-range, HEAD}. Whatever the path, the bytes a client gets decode (by the `Content-Encoding` it is
//! told) to the origin's, ranges are ranges of the representation named, and `Content-Length` and
//! `Content-Range` agree with the bytes. Then what decoding on the way out may cost: ranges, memory, ratio.

use std::{
    io::Read,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use bytes::Bytes;
use http::Method;
use lacquer_tests::{request, ClientReply, Daemon, Origin, Reply};

/// Compressible text (about 6 times), as pages are.
fn page(len: usize) -> Bytes {
    let mut out = String::from("<!doctype html><html><body>\n");
    let mut n: u64 = 1;
    while out.len() < len {
        n = n
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        out.push_str(&format!(
            "<div class=\"item-{}\"><a href=\"/p/{}\">Product {}</a><span>{} EUR</span></div>\n",
            n % 7,
            n % 100_000,
            n % 977,
            n % 1000
        ));
    }
    Bytes::from(out)
}

/// The client classes, by what they send and the coding they must get from an object stored in gzip.
const CLIENTS: [(&str, Option<&str>, &str); 3] = [
    ("identity", None, ""),
    ("gzip", Some("gzip"), "gzip"),
    // Takes only brotli: the stored gzip is decoded for it.
    ("br", Some("br"), ""),
];

const SHAPES: [&str; 4] = ["full", "range", "multi-range", "HEAD"];
const RANGE: (usize, usize) = (5, 20);
const MULTI: [(usize, usize); 2] = [(5, 20), (1000, 1100)];

fn decode(coding: &str, body: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    match coding {
        "" => out.extend_from_slice(body),
        "gzip" => {
            flate2::read::MultiGzDecoder::new(body)
                .read_to_end(&mut out)
                .map_err(|e| format!("gzip does not decode: {e}"))?;
        }
        "br" => {
            brotli::Decompressor::new(body, 4096)
                .read_to_end(&mut out)
                .map_err(|e| format!("br does not decode: {e}"))?;
        }
        other => return Err(format!("unexpected content-encoding {other:?}")),
    }
    Ok(out)
}

/// `bytes a-b/len` of a `Content-Range`.
fn content_range(value: &str) -> Result<(usize, usize, usize), String> {
    let bad = || format!("bad Content-Range {value:?}");
    let rest = value.strip_prefix("bytes ").ok_or_else(bad)?;
    let (span, len) = rest.split_once('/').ok_or_else(bad)?;
    let (a, b) = span.split_once('-').ok_or_else(bad)?;
    let n = |s: &str| s.parse::<usize>().map_err(|_| bad());
    Ok((n(a)?, n(b)?, n(len)?))
}

/// The parts of a `multipart/byteranges` body: each one's `Content-Range` and bytes.
fn multipart(content_type: &str, body: &[u8]) -> Result<Vec<(String, Vec<u8>)>, String> {
    let boundary = content_type
        .split_once("boundary=")
        .map(|(_, b)| b.trim_matches('"'))
        .ok_or_else(|| format!("no boundary in {content_type:?}"))?;
    let delimiter = format!("\r\n--{boundary}").into_bytes();
    let mut cuts = Vec::new();
    let mut i = 0;
    while i + delimiter.len() <= body.len() {
        if body[i..].starts_with(&delimiter) {
            cuts.push(i);
            i += delimiter.len();
        } else {
            i += 1;
        }
    }
    if cuts.first() != Some(&0)
        || !body[*cuts.last().unwrap() + delimiter.len()..].starts_with(b"--")
    {
        return Err("the body is not framed by its boundary".into());
    }
    let mut parts = Vec::new();
    for pair in cuts.windows(2) {
        let segment = &body[pair[0] + delimiter.len()..pair[1]];
        let segment = segment
            .strip_prefix(b"\r\n")
            .ok_or("a part does not start on a new line")?;
        let split = segment
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or("a part without headers")?;
        let head = String::from_utf8_lossy(&segment[..split]).to_string();
        let range = head
            .lines()
            .find_map(|l| {
                l.split_once(':')
                    .filter(|(n, _)| n.eq_ignore_ascii_case("content-range"))
                    .map(|(_, v)| v.trim().to_owned())
            })
            .ok_or("a part without Content-Range")?;
        parts.push((range, segment[split + 4..].to_vec()));
    }
    Ok(parts)
}

/// What is wrong with `r`, the answer to `shape` for a client expecting `coding`, given the origin's bytes
/// and lacquerd's gzip representation of them.
fn check(
    r: &ClientReply,
    shape: &str,
    coding: &str,
    origin: &[u8],
    gzip: &[u8],
) -> Result<(), String> {
    let got_coding = r.header("content-encoding");
    if got_coding != coding {
        return Err(format!(
            "Content-Encoding {got_coding:?}, expected {coding:?}"
        ));
    }
    if !r
        .header("vary")
        .to_ascii_lowercase()
        .contains("accept-encoding")
    {
        return Err(format!("Vary {:?}", r.header("vary")));
    }
    let representation = if coding == "gzip" { gzip } else { origin };
    let length = r
        .headers
        .get("content-length")
        .map(|v| v.to_str().unwrap().parse::<usize>().unwrap());
    if shape == "HEAD" {
        if r.status != 200 || !r.body.is_empty() {
            return Err(format!("HEAD: {} with {} bytes", r.status, r.body.len()));
        }
        return match length {
            Some(n) if n != representation.len() => Err(format!(
                "HEAD: Content-Length {n}, the representation has {}",
                representation.len()
            )),
            _ => Ok(()),
        };
    }
    if let Some(n) = length.filter(|n| *n != r.body.len()) {
        return Err(format!(
            "Content-Length {n} with {} bytes sent",
            r.body.len()
        ));
    }
    match r.status.as_u16() {
        // A whole representation answers any request (RFC 9110 §14.2: a range may be ignored).
        200 => {
            if !r.header("content-range").is_empty() {
                return Err("a 200 with Content-Range".into());
            }
            if decode(coding, &r.body)? != origin {
                return Err("the body does not decode to the origin's".into());
            }
            Ok(())
        }
        206 if shape == "range" => {
            let (a, b, len) = content_range(r.header("content-range"))?;
            if (a, b) != RANGE || len != representation.len() {
                return Err(format!(
                    "Content-Range {a}-{b}/{len} for {RANGE:?} of {} bytes",
                    representation.len()
                ));
            }
            if r.body[..] != representation[a..=b] {
                return Err(format!(
                    "bytes {a}-{b} are not the representation's: {:02x?}",
                    &r.body[..r.body.len().min(8)]
                ));
            }
            Ok(())
        }
        206 if shape == "multi-range" => {
            let parts = multipart(r.header("content-type"), &r.body)?;
            let mut spans = Vec::new();
            for (range, data) in parts {
                let (a, b, len) = content_range(&range)?;
                if len != representation.len() || data[..] != representation[a..=b] {
                    return Err(format!("part {range} is not the representation's"));
                }
                spans.push((a, b));
            }
            if spans != MULTI {
                return Err(format!("parts {spans:?} for {MULTI:?}"));
            }
            Ok(())
        }
        status => Err(format!("status {status}")),
    }
}

async fn ask(
    d: &Daemon,
    path: &str,
    shape: &str,
    accept: Option<&str>,
) -> Result<ClientReply, String> {
    let mut headers = Vec::new();
    if let Some(ae) = accept {
        headers.push(("accept-encoding", ae));
    }
    let multi = MULTI
        .iter()
        .map(|(a, b)| format!("{a}-{b}"))
        .collect::<Vec<_>>()
        .join(",");
    let range = format!("bytes={}-{}", RANGE.0, RANGE.1);
    let multi = format!("bytes={multi}");
    match shape {
        "range" => headers.push(("range", &range)),
        "multi-range" => headers.push(("range", &multi)),
        _ => {}
    }
    let method = if shape == "HEAD" {
        Method::HEAD
    } else {
        Method::GET
    };
    request(d.addr, method, path, &headers, Bytes::new()).await
}

#[tokio::test(flavor = "multi_thread")]
async fn every_path_sends_the_representation_it_names() {
    let body = page(48 * 1024);
    let served = body.clone();
    let failing = Arc::new(AtomicBool::new(false));
    let fail = failing.clone();
    let origin = Origin::start(move |s| {
        let text = |cc: &str| {
            Reply::ok(served.clone())
                .header("content-type", "text/html; charset=utf-8")
                .header("cache-control", cc)
                .header("etag", "\"page\"")
        };
        if s.path.starts_with("/reval/") && s.headers.contains_key("if-none-match") {
            let mut reply = Reply::ok("")
                .status(304)
                .header("cache-control", "max-age=3600");
            reply.headers.retain(|(n, _)| n != "content-length");
            reply.header("etag", "\"page\"")
        } else if s.path.starts_with("/error/") && fail.load(Ordering::SeqCst) {
            Reply::ok("broken").status(500)
        } else if s.path.starts_with("/reval/") || s.path.starts_with("/error/") {
            text("max-age=1, stale-while-revalidate=0")
        } else {
            text("max-age=3600")
        }
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);

    // lacquerd's gzip of the page, which every gzip range is a range of.
    let first = ask(&d, "/hit/page", "full", Some("gzip")).await.unwrap();
    assert_eq!(first.header("content-encoding"), "gzip");
    let gzip = first.body.to_vec();
    assert_eq!(decode("gzip", &gzip).unwrap(), body);

    let cells: Vec<(&str, &str, Option<&str>, &str)> = CLIENTS
        .iter()
        .flat_map(|&(name, accept, coding)| SHAPES.map(|shape| (name, shape, accept, coding)))
        .collect();
    let url = |class: &str, name: &str, shape: &str| format!("/{class}/{name}-{shape}");
    // Every stale cell has its own object, stored now and stale once the others have been asked.
    for class in ["reval", "error"] {
        for &(name, shape, ..) in &cells {
            let r = ask(&d, &url(class, name, shape), "full", None)
                .await
                .unwrap();
            assert_eq!(r.body, body);
        }
    }
    d.wait_for_stats("stored", |s| {
        s["proxy"]["objects_stored"] == 1 + 2 * cells.len() as u64
    })
    .await;
    let stale_from = std::time::Instant::now() + Duration::from_millis(1300);

    let mut failures = Vec::new();
    let mut record = |class: &str,
                      cell: &(&str, &str, Option<&str>, &str),
                      r: Result<ClientReply, String>,
                      want_cache: &str| {
        let (name, shape, _, coding) = *cell;
        let result = r.and_then(|r| {
            check(&r, shape, coding, &body, &gzip)?;
            match r.x_cache() {
                cache if cache == want_cache => Ok(()),
                cache => Err(format!("X-Cache {cache}, expected {want_cache}")),
            }
        });
        if let Err(e) = result {
            failures.push(format!("{class} × {name} client × {shape}: {e}"));
        }
    };
    for cell in &cells {
        let r = ask(&d, "/hit/page", cell.1, cell.2).await;
        record("fresh hit", cell, r, "HIT");
    }
    for cell in &cells {
        let r = ask(&d, &url("miss", cell.0, cell.1), cell.1, cell.2).await;
        record("miss", cell, r, "MISS");
    }
    tokio::time::sleep_until(stale_from.into()).await;
    for cell in &cells {
        let r = ask(&d, &url("reval", cell.0, cell.1), cell.1, cell.2).await;
        record("revalidated", cell, r, "MISS");
    }
    failing.store(true, Ordering::SeqCst);
    for cell in &cells {
        let r = ask(&d, &url("error", cell.0, cell.1), cell.1, cell.2).await;
        record("stale on error", cell, r, "STALE");
    }
    assert!(
        failures.is_empty(),
        "{} of {} cells wrong:\n{}",
        failures.len(),
        4 * cells.len(),
        failures.join("\n")
    );
    let revalidated = origin
        .seen()
        .iter()
        .filter(|s| s.path.starts_with("/reval/") && s.headers.contains_key("if-none-match"))
        .count();
    assert_eq!(revalidated, cells.len(), "every stale cell was revalidated");
    assert_eq!(
        d.stats().await["proxy"]["revalidations"],
        cells.len() as u64
    );
}

fn text_origin(body: Bytes) -> impl Fn(&lacquer_tests::origin::Seen) -> Reply + Send + Sync {
    move |_| {
        Reply::ok(body.clone())
            .header("content-type", "text/plain; charset=utf-8")
            .header("cache-control", "max-age=3600")
    }
}

fn counter(stats: &serde_json::Value, name: &str) -> u64 {
    stats["proxy"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {name} in {}", stats["proxy"]))
}

/// A range of a body decoded on the way out decodes what it needs and no more: a range near the start
/// costs about one piece; one far into a large body (`bytes=-1`) is answered with the whole body, so the
/// bytes decoded never exceed the bytes sent by more than a piece.
#[tokio::test(flavor = "multi_thread")]
async fn a_range_of_a_decoded_body_costs_what_it_sends() {
    let body = page(8 << 20);
    let origin = Origin::start(text_origin(body.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    // Decoding on the way out is what is measured: no identity representation is made.
    let config = budget_config(&dir, "conversions = 0");
    let d = Daemon::start(origin.addr, &["--config", &config]);
    let stored = ask(&d, "/big", "full", Some("gzip")).await.unwrap();
    assert_eq!(stored.header("content-encoding"), "gzip");
    d.wait_for_stats("stored", |s| s["proxy"]["objects_stored"] == 1)
        .await;
    let identity = |range: &'static str| {
        let d = &d;
        async move {
            let before = counter(&d.stats().await, "decoded_bytes");
            let r = request(
                d.addr,
                Method::GET,
                "/big",
                &[("range", range)],
                Bytes::new(),
            )
            .await
            .unwrap();
            let decoded = counter(&d.stats().await, "decoded_bytes") - before;
            (r, decoded)
        }
    };
    let (r, decoded) = identity("bytes=0-99").await;
    assert_eq!(r.status, 206);
    assert_eq!(
        r.header("content-range"),
        format!("bytes 0-99/{}", body.len())
    );
    assert!(r.body == body[..100]);
    assert!(decoded <= 64 * 1024, "100 bytes sent, {decoded} decoded");

    let (r, decoded) = identity("bytes=-1").await;
    assert_eq!(
        r.status, 200,
        "the last byte is answered with the whole body"
    );
    assert!(r.body == body);
    assert!(
        decoded <= r.body.len() as u64 + 64 * 1024,
        "{} bytes sent, {decoded} decoded",
        r.body.len()
    );
    let stats = d.stats().await;
    assert_eq!(counter(&stats, "ranges_whole"), 1);
    assert_eq!(
        counter(&stats, "decode_memory"),
        0,
        "every decoder gave its memory back"
    );
}

fn budget_config(dir: &tempfile::TempDir, section: &str) -> String {
    let path = dir.path().join("lacquer.toml");
    std::fs::write(&path, format!("[compression]\n{section}\n")).unwrap();
    path.to_str().unwrap().to_owned()
}

/// Decoders hold memory as long as their clients take to read: past `decode_memory` a request that needs
/// one is answered 503 with `Retry-After` and counted, a client that takes the stored coding is served
/// as ever, and the memory comes back as the readers go.
#[tokio::test(flavor = "multi_thread")]
async fn decoders_past_the_budget_are_refused() {
    let body = page(16 << 20);
    let origin = Origin::start(text_origin(body.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    // Room for four gzip decoders, all for clients: no representation is made.
    let config = budget_config(&dir, "decode_memory = \"512KiB\"\nconversions = 0");
    let d = Daemon::start(origin.addr, &["--config", &config]);
    let gzip = ask(&d, "/big", "full", Some("gzip")).await.unwrap();
    assert_eq!(gzip.header("content-encoding"), "gzip");
    d.wait_for_stats("stored", |s| s["proxy"]["objects_stored"] == 1)
        .await;

    // Four identity clients that read nothing: their decoders wait on their sockets.
    let mut stalled = Vec::new();
    for _ in 0..4 {
        let resp = lacquer_tests::open(d.addr, "/big").await;
        assert_eq!(resp.status(), 200);
        stalled.push(resp);
    }
    d.wait_for_stats("four decoders held", |s| {
        s["proxy"]["decode_memory"] == 512 * 1024
    })
    .await;
    let refused = request(d.addr, Method::GET, "/big", &[], Bytes::new())
        .await
        .unwrap();
    assert_eq!(refused.status, 503);
    assert_eq!(refused.header("retry-after"), "1");
    let r = ask(&d, "/big", "full", Some("gzip")).await.unwrap();
    assert_eq!(
        (r.status.as_u16(), r.header("content-encoding")),
        (200, "gzip"),
        "the stored coding needs no decoder"
    );
    let head = ask(&d, "/big", "HEAD", None).await.unwrap();
    assert_eq!(head.status, 200, "a HEAD needs no decoder");
    assert_eq!(counter(&d.stats().await, "decodes_refused"), 1);

    drop(stalled.pop());
    d.wait_for_stats("a decoder given back", |s| {
        s["proxy"]["decode_memory"] == 384 * 1024
    })
    .await;
    let r = ask(&d, "/big", "range", None).await.unwrap();
    assert_eq!(r.status, 206, "room again");
    assert!(r.body == body[RANGE.0..=RANGE.1]);
    drop(stalled);
    d.wait_for_stats("every decoder given back", |s| {
        s["proxy"]["decode_memory"] == 0
    })
    .await;
    assert_eq!(origin.total(), 1);
}

/// A small brotli body that expands thousands of times (decoding costs CPU by the bytes it expands to) is
/// cut once it has expanded `max_expansion` times past its first MiB, counted and logged; a client that
/// takes brotli gets it as stored.
#[tokio::test(flavor = "multi_thread")]
async fn a_body_that_expands_past_the_ratio_is_cut() {
    let zeros = vec![0u8; 16 << 20];
    let mut bomb = Vec::new();
    {
        let mut w = brotli::CompressorWriter::new(&mut bomb, 4096, 5, 22);
        std::io::Write::write_all(&mut w, &zeros).unwrap();
    }
    assert!(bomb.len() < 4096, "{}", bomb.len());
    let bomb = Bytes::from(bomb);
    let served = bomb.clone();
    let origin = Origin::start(move |_| {
        Reply::ok(served.clone())
            .header("content-type", "text/plain")
            .header("content-encoding", "br")
            .header("cache-control", "max-age=3600")
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    let r = ask(&d, "/bomb", "full", Some("br")).await.unwrap();
    assert_eq!((r.header("content-encoding"), r.body.clone()), ("br", bomb));
    d.wait_for_stats("stored", |s| s["proxy"]["objects_stored"] == 1)
        .await;
    let before = counter(&d.stats().await, "decoded_bytes");
    let r = request(d.addr, Method::GET, "/bomb", &[], Bytes::new()).await;
    assert!(
        r.is_err(),
        "the decoded body is cut: {:?}",
        r.map(|r| r.status)
    );
    let stats = d.stats().await;
    let decoded = counter(&stats, "decoded_bytes") - before;
    assert!(decoded <= 2 << 20, "{decoded} bytes decoded");
    assert_eq!(counter(&stats, "decode_expansion"), 1);
    // The daemon's log is read by a thread of the test's: the line may come a moment after the stats.
    d.wait_for_log("decoding for a client cut off").await;
    // Its identity representation cannot be made either, and is not tried again for the next client.
    d.wait_for_stats("the representation given up", |s| {
        s["proxy"]["representations_failed"] == 1
    })
    .await;
    let again = request(d.addr, Method::GET, "/bomb", &[], Bytes::new()).await;
    assert!(again.is_err());
    let stats = d.stats().await;
    assert_eq!(counter(&stats, "representations_failed"), 1);
    assert_eq!(counter(&stats, "representations_made"), 0);
}

/// What a client without `Accept-Encoding` costs once the identity representation of a gzip'd object is
/// made: stored bytes, no decoding (the players, libraries and load generators that send nothing).
fn proxy(stats: &serde_json::Value) -> (u64, u64, u64) {
    (
        counter(stats, "decoded_gzip"),
        counter(stats, "representations_made"),
        counter(stats, "representations_served"),
    )
}

async fn identity(d: &Daemon, path: &str, headers: &[(&str, &str)]) -> ClientReply {
    request(d.addr, Method::GET, path, headers, Bytes::new())
        .await
        .unwrap()
}

/// The first identity client is served by decoding while the identity representation is made, once, from
/// the stored gzip bytes; every identity client after it is sent stored bytes (ranges of them too, even
/// far into the body and several at once), and after a restart as well. The origin sees one fetch.
#[tokio::test(flavor = "multi_thread")]
async fn an_identity_representation_is_made_once_and_served_after() {
    // Larger than a chunk once decoded: the representation spans several.
    let body = page(700 * 1024);
    let origin = Origin::start(text_origin(body.clone())).await;
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let mut d = Daemon::start_in(origin.addr, dir.clone(), &[]);
    // A name of its own: the key must not change with the port of the restarted daemon.
    let host = ("host", "shop.test");
    let gzip = identity(&d, "/page", &[host, ("accept-encoding", "gzip")]).await;
    assert_eq!(gzip.header("content-encoding"), "gzip");
    d.wait_for_stats("stored", |s| s["proxy"]["objects_stored"] == 1)
        .await;

    let first = identity(&d, "/page", &[host]).await;
    assert!(first.body == body);
    assert_eq!(proxy(&d.stats().await).0, 1, "the first one is decoded");
    d.wait_for_stats("made", |s| s["proxy"]["representations_made"] == 1)
        .await;
    for headers in [&[host][..], &[host, ("accept-encoding", "br")][..]] {
        let r = identity(&d, "/page", headers).await;
        assert_eq!((r.status.as_u16(), r.x_cache()), (200, "HIT"));
        assert_eq!(r.header("content-encoding"), "");
        assert_eq!(r.header("content-length"), body.len().to_string());
        assert_eq!(r.header("etag"), gzip.header("etag"));
        assert!(r.body == body);
    }
    // A range far into the body, which decoding would answer whole, is a range of stored bytes.
    let r = identity(&d, "/page", &[host, ("range", "bytes=-100")]).await;
    assert_eq!(r.status, 206);
    assert!(r.body == body[body.len() - 100..]);
    let r = identity(&d, "/page", &[host, ("range", "bytes=0-9,600000-600009")]).await;
    assert_eq!(r.status, 206);
    assert!(r.header("content-type").starts_with("multipart/byteranges"));
    assert_eq!(
        proxy(&d.stats().await),
        (1, 1, 4),
        "decoded once, made once"
    );
    // A gzip client still gets the stored gzip bytes.
    let r = identity(&d, "/page", &[host, ("accept-encoding", "gzip")]).await;
    assert_eq!(
        (r.header("content-encoding"), &r.body),
        ("gzip", &gzip.body)
    );

    d.stop();
    let d = d.restart();
    let r = identity(&d, "/page", &[host]).await;
    assert_eq!(
        (r.x_cache(), r.header("content-encoding")),
        ("HIT", ""),
        "{}",
        d.log()
    );
    assert!(r.body == body);
    assert_eq!(
        proxy(&d.stats().await),
        (0, 0, 1),
        "the representation survived the restart"
    );
    // An operator sees it beside its variant.
    let inspected = d
        .admin_get("/v1/objects?url=http://shop.test/page", Some(&d.secret()))
        .await;
    let v: serde_json::Value = serde_json::from_slice(&inspected.body).unwrap();
    let variant = &v["variants"][0];
    assert_eq!(variant["size"], gzip.body.len());
    let made = &variant["representations"];
    assert_eq!(made.as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(made[0]["coding"], "identity");
    assert_eq!(made[0]["size"], body.len());
    assert_eq!(made[0]["tiers"]["chunks"], body.len().div_ceil(256 * 1024));
    assert_ne!(made[0]["generation"], variant["generation"]);
    assert_eq!(origin.total(), 1);
}

/// A representation lives and dies with its object: after a purge, a ban, a tag purge or a new body from
/// the origin, no identity client is ever sent the old one.
#[tokio::test(flavor = "multi_thread")]
async fn a_representation_goes_with_its_object() {
    let versions = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let current = versions.clone();
    let origin = Origin::start(move |s| {
        let version = current.load(Ordering::SeqCst);
        let mut text = format!("version {version} of {}\n", s.path).repeat(200);
        text.push_str(&String::from_utf8_lossy(&page(8 * 1024)));
        let cache_control = if s.path == "/short" {
            "max-age=1, stale-while-revalidate=0"
        } else {
            "max-age=3600"
        };
        Reply::ok(text)
            .header("content-type", "text/plain")
            .header("cache-control", cache_control)
            .header("surrogate-key", "all")
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    let host = [("host", "shop.test")];
    let version_of = |r: &ClientReply| {
        let text = String::from_utf8_lossy(&r.body);
        text.split(" of ").next().unwrap_or_default().to_owned()
    };
    let invalidations: [(&str, serde_json::Value); 3] = [
        (
            "/v1/purge",
            serde_json::json!({"url": "http://shop.test/x"}),
        ),
        (
            "/v1/bans",
            serde_json::json!({"expression": "req.url == \"/x\""}),
        ),
        ("/v1/purge/tags", serde_json::json!({"tags": ["all"]})),
    ];
    let mut made = 0;
    for (n, (path, body)) in invalidations.iter().enumerate() {
        let version = versions.load(Ordering::SeqCst);
        // Stored (gzip), then its identity representation made and served.
        let gz = identity(&d, "/x", &[host[0], ("accept-encoding", "gzip")]).await;
        assert_eq!(gz.header("content-encoding"), "gzip", "{path}");
        d.wait_for_stats("stored", |s| s["proxy"]["objects_stored"] == n as u64 + 1)
            .await;
        identity(&d, "/x", &host).await;
        made += 1;
        d.wait_for_stats("made", |s| s["proxy"]["representations_made"] == made)
            .await;
        let r = identity(&d, "/x", &host).await;
        assert_eq!(version_of(&r), format!("version {version}"), "{path}");
        let served = counter(&d.stats().await, "representations_served");

        versions.store(version + 1, Ordering::SeqCst);
        let reply = d.admin_post(path, body.clone()).await;
        assert!(reply.status.is_success(), "{path}: {:?}", reply.body);
        let r = identity(&d, "/x", &host).await;
        assert_eq!(r.x_cache(), "MISS", "{path}");
        assert_eq!(version_of(&r), format!("version {}", version + 1), "{path}");
        assert_eq!(origin.count("/x"), n + 2, "{path}");
        assert_eq!(
            counter(&d.stats().await, "representations_served"),
            served,
            "{path}: the old representation is never sent"
        );
    }

    // A new body from the origin (the object expired and was fetched again) leaves the old
    // representation behind: identity clients get the new bytes.
    let version = versions.load(Ordering::SeqCst);
    identity(&d, "/short", &[host[0], ("accept-encoding", "gzip")]).await;
    d.wait_for_stats("stored", |s| s["proxy"]["objects_stored"] == 5)
        .await;
    identity(&d, "/short", &host).await;
    made += 1;
    d.wait_for_stats("made", |s| s["proxy"]["representations_made"] == made)
        .await;
    let r = identity(&d, "/short", &host).await;
    assert_eq!(version_of(&r), format!("version {version}"));
    versions.store(version + 1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = identity(&d, "/short", &host).await;
    assert_eq!(r.x_cache(), "MISS");
    assert_eq!(version_of(&r), format!("version {}", version + 1));
    d.wait_for_stats("fetched again and stored", |s| {
        s["proxy"]["objects_stored"] == 6
    })
    .await;
    let r = identity(&d, "/short", &host).await;
    assert_eq!(r.x_cache(), "HIT");
    assert_eq!(version_of(&r), format!("version {}", version + 1));
    assert_eq!(origin.count("/short"), 2);
}

/// Past `conversions` representations being made at once, an identity client is served by decoding on
/// the way out, as before, and that is counted; its representation is made later, when there is room.
#[tokio::test(flavor = "multi_thread")]
async fn a_full_conversion_budget_serves_clients_by_decoding() {
    let big = page(8 << 20);
    let small = page(64 * 1024);
    let (b, s) = (big.clone(), small.clone());
    let origin = Origin::start(move |seen| {
        let body = if seen.path == "/big" {
            b.clone()
        } else {
            s.clone()
        };
        Reply::ok(body)
            .header("content-type", "text/plain")
            .header("cache-control", "max-age=3600")
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = budget_config(&dir, "conversions = 1");
    let d = Daemon::start(origin.addr, &["--config", &config]);
    for path in ["/big", "/small"] {
        let r = ask(&d, path, "full", Some("gzip")).await.unwrap();
        assert_eq!(r.header("content-encoding"), "gzip");
    }
    d.wait_for_stats("stored", |s| s["proxy"]["objects_stored"] == 2)
        .await;
    // The big body's representation takes a while to make; the small one's client comes meanwhile.
    let reading = lacquer_tests::open(d.addr, "/big").await;
    assert_eq!(reading.status(), 200);
    let r = identity(&d, "/small", &[]).await;
    assert!(r.body == small, "served by decoding");
    let stats = d.stats().await;
    assert_eq!(counter(&stats, "representations_deferred"), 1, "{stats}");
    drop(reading);
    d.wait_for_stats("the big one made", |s| {
        s["proxy"]["representations_made"] == 1
    })
    .await;
    let r = identity(&d, "/small", &[]).await;
    assert!(r.body == small);
    d.wait_for_stats("the small one made", |s| {
        s["proxy"]["representations_made"] == 2
    })
    .await;
    let r = identity(&d, "/big", &[]).await;
    assert!(r.body == big);
    assert_eq!(counter(&d.stats().await, "representations_served"), 1);
    assert_eq!(origin.total(), 2);
}

/// A body the origin sent in brotli is stored so; a client that takes gzip but not brotli is served
/// identity the first time, then the gzip representation made from the brotli bytes, once.
#[tokio::test(flavor = "multi_thread")]
async fn a_gzip_representation_is_made_for_a_body_stored_in_brotli() {
    let text = page(300 * 1024);
    let mut br = Vec::new();
    {
        let mut w = brotli::CompressorWriter::new(&mut br, 4096, 5, 20);
        std::io::Write::write_all(&mut w, &text).unwrap();
    }
    let br = Bytes::from(br);
    let sent = br.clone();
    let origin = Origin::start(move |_| {
        Reply::ok(sent.clone())
            .header("content-type", "text/html")
            .header("content-encoding", "br")
            .header("cache-control", "max-age=3600")
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    let stored = ask(&d, "/br", "full", Some("br")).await.unwrap();
    assert_eq!(
        (stored.header("content-encoding"), &stored.body),
        ("br", &br)
    );
    d.wait_for_stats("stored", |s| s["proxy"]["objects_stored"] == 1)
        .await;
    let first = ask(&d, "/br", "full", Some("gzip")).await.unwrap();
    assert_eq!(
        first.header("content-encoding"),
        "",
        "decoded the first time"
    );
    assert!(first.body == text);
    d.wait_for_stats("made", |s| s["proxy"]["representations_made"] == 1)
        .await;
    for shape in ["full", "range", "HEAD"] {
        let r = ask(&d, "/br", shape, Some("gzip")).await.unwrap();
        assert_eq!(r.header("content-encoding"), "gzip", "{shape}");
        let gzip = ask(&d, "/br", "full", Some("gzip")).await.unwrap().body;
        if let Err(e) = check(&r, shape, "gzip", &text, &gzip) {
            panic!("{shape}: {e}");
        }
    }
    // Identity clients get identity: another representation, made on its own.
    let r = ask(&d, "/br", "full", None).await.unwrap();
    assert_eq!(r.header("content-encoding"), "");
    assert!(r.body == text);
    assert_eq!(origin.total(), 1);
}
