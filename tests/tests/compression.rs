//! `[compression]` through the real daemon: Accept-Encoding negotiated so that one origin fetch serves every
//! client, text compressed once when stored, stored codings decoded on the way out, and hostile bodies
//! (truncated, corrupt, bombs) never stored. Every body is checked with decoders lacquerd does not use.

use std::{
    io::{Read, Write},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::Method;
use lacquer_tests::{request, ClientReply, Daemon, Origin, Reply};

/// Twenty `Accept-Encoding` fields as real clients send them, and the coding each gets from a page stored
/// in gzip (the default preference): gzip when it takes it, otherwise the page decoded.
const CLIENTS: [(&str, &str); 20] = [
    ("gzip, deflate, br, zstd", "gzip"),       // Chrome, Edge
    ("gzip, deflate, br", "gzip"),             // Firefox, Safari 17
    ("gzip, deflate", "gzip"),                 // curl --compressed, old Safari
    ("br;q=1.0, gzip;q=0.8, *;q=0.1", "gzip"), // Chrome on Android, some CDNs
    ("gzip", "gzip"),                          // Googlebot, wget
    ("deflate, gzip", "gzip"),                 // Java HttpURLConnection
    ("gzip;q=1.0, identity; q=0.5, *;q=0", "gzip"),
    ("identity", ""), // download managers
    ("", ""),         // an empty field
    ("*", "gzip"),
    ("br", ""), // takes only brotli: the gzip body decoded
    ("zstd", ""),
    ("x-gzip", "gzip"),
    ("gzip, deflate, sdch, br", "gzip"), // Chrome 50
    ("BR, GZIP", "gzip"),
    ("gzip;q=0, br", ""),
    ("gzip;q=0, br;q=0", ""),
    ("compress, gzip", "gzip"),
    ("deflate", ""),
    ("bzip2, lzma", ""),
];

/// About 200 KiB of HTML that compresses as real pages do (5 to 8 times).
fn page() -> Bytes {
    let mut out = String::from("<!doctype html><html><head><title>lacquer</title></head><body>\n");
    let mut n: u64 = 1;
    while out.len() < 200 * 1024 {
        n = n
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        out.push_str(&format!(
            "<div class=\"item item-{}\"><a href=\"/p/{}\">Product {}</a><span>{} EUR</span></div>\n",
            n % 7,
            n % 100_000,
            n % 977,
            n % 1000
        ));
    }
    out.push_str("</body></html>\n");
    Bytes::from(out)
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// The body as the client would read it, decoded by `Content-Encoding` with independent decoders.
fn decoded(r: &ClientReply) -> Vec<u8> {
    let mut out = Vec::new();
    match r.header("content-encoding") {
        "" => out.extend_from_slice(&r.body),
        "gzip" => {
            flate2::read::MultiGzDecoder::new(&r.body[..])
                .read_to_end(&mut out)
                .expect("gzip decodes");
        }
        "br" => {
            brotli::Decompressor::new(&r.body[..], 4096)
                .read_to_end(&mut out)
                .expect("br decodes");
        }
        "zstd" => out = zstd::decode_all(&r.body[..]).expect("zstd decodes"),
        other => panic!("unexpected content-encoding {other:?}"),
    }
    out
}

async fn get(d: &Daemon, path: &str, headers: &[(&str, &str)]) -> ClientReply {
    request(d.addr, Method::GET, path, headers, Bytes::new())
        .await
        .expect("request")
}

fn html(body: Bytes) -> Reply {
    Reply::ok(body)
        .header("content-type", "text/html; charset=utf-8")
        .header("cache-control", "max-age=3600")
        .header("etag", "\"page-1\"")
        .header("vary", "Accept-Encoding")
}

#[tokio::test(flavor = "multi_thread")]
async fn twenty_accept_encodings_cost_one_origin_fetch() {
    let page = page();
    let served = page.clone();
    let origin = Origin::start(move |_| html(served.clone())).await;
    let d = Daemon::start(origin.addr, &[]);
    for (ae, want) in CLIENTS {
        let headers: Vec<(&str, &str)> = if ae.is_empty() {
            vec![]
        } else {
            vec![("accept-encoding", ae)]
        };
        let r = get(&d, "/page.html", &headers).await;
        assert_eq!(r.status, 200, "{ae}");
        assert_eq!(r.header("content-encoding"), want, "{ae}");
        assert_eq!(decoded(&r), page, "{ae}: the body decodes to the origin's");
        assert!(
            r.header("vary")
                .to_ascii_lowercase()
                .contains("accept-encoding"),
            "{ae}"
        );
        // The body was transformed (compressed when stored), so its entity-tag is weak.
        assert_eq!(r.header("etag"), "W/\"page-1\"", "{ae}");
        if want.is_empty() {
            assert_eq!(
                r.body, page,
                "{ae}: identity clients get the origin's bytes"
            );
            assert_eq!(r.header("content-length"), page.len().to_string(), "{ae}");
        } else {
            assert!(
                r.body.len() * 4 < page.len(),
                "{ae}: {} bytes",
                r.body.len()
            );
        }
    }
    assert_eq!(
        origin.count("/page.html"),
        1,
        "one origin fetch for twenty clients"
    );
    let seen = origin.seen();
    assert_eq!(seen[0].headers["accept-encoding"], "gzip, br;q=0.9");
    let stats = d.stats().await;
    let p = &stats["proxy"];
    assert!(p["compress_in"].as_u64().unwrap() >= page.len() as u64);
    assert!(p["compress_out"].as_u64().unwrap() * 4 < page.len() as u64);
    // The clients that take no gzip were served from the gzip body: decoded on the way out until its
    // identity representation was made from it (once), stored bytes after that.
    let identity = CLIENTS.iter().filter(|(_, want)| want.is_empty()).count();
    let sent = |p: &serde_json::Value| {
        p["decoded_gzip"].as_u64().unwrap() + p["representations_served"].as_u64().unwrap()
    };
    assert_eq!(sent(p), identity as u64, "{p}");
    d.wait_for_stats("the identity representation made", |s| {
        s["proxy"]["representations_made"] == 1
    })
    .await;
    let r = get(&d, "/page.html", &[]).await;
    assert_eq!(r.body, page);
    let stats = d.stats().await;
    assert!(stats["proxy"]["representations_served"].as_u64().unwrap() >= 1);
    assert_eq!(sent(&stats["proxy"]), identity as u64 + 1);
    assert_eq!(origin.count("/page.html"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_origin_gzip_body_is_stored_as_sent_and_decoded_for_the_rest() {
    let page = page();
    let coded = Bytes::from(gzip(&page));
    let sent = coded.clone();
    let origin =
        Origin::start(move |_| html(sent.clone()).header("content-encoding", "gzip")).await;
    let d = Daemon::start(origin.addr, &[]);
    let r = get(&d, "/g.html", &[("accept-encoding", "gzip, deflate, br")]).await;
    assert_eq!((r.header("content-encoding"), &r.body), ("gzip", &coded));
    assert_eq!(
        r.header("etag"),
        "\"page-1\"",
        "bytes as the origin sent them keep a strong tag"
    );
    d.wait_for_stats("stored", |s| s["proxy"]["objects_stored"] == 1)
        .await;

    let identity = get(&d, "/g.html", &[]).await;
    assert_eq!(identity.x_cache(), "HIT");
    assert_eq!(identity.header("content-encoding"), "");
    assert_eq!(identity.body, page);
    assert_eq!(identity.header("content-length"), page.len().to_string());
    assert_eq!(identity.header("etag"), "W/\"page-1\"");
    assert!(identity
        .header("vary")
        .to_ascii_lowercase()
        .contains("accept-encoding"));

    // HEAD says what GET says.
    let head = request(d.addr, Method::HEAD, "/g.html", &[], Bytes::new())
        .await
        .unwrap();
    for name in [
        "content-length",
        "content-encoding",
        "etag",
        "vary",
        "content-type",
    ] {
        assert_eq!(head.header(name), identity.header(name), "{name}");
    }
    let head = request(
        d.addr,
        Method::HEAD,
        "/g.html",
        &[("accept-encoding", "gzip")],
        Bytes::new(),
    )
    .await
    .unwrap();
    assert_eq!(head.header("content-length"), coded.len().to_string());
    assert_eq!(head.header("content-encoding"), "gzip");

    // Conditionals match the weak tag the identity client was given, and the strong one.
    for tag in ["W/\"page-1\"", "\"page-1\""] {
        let r = get(&d, "/g.html", &[("if-none-match", tag)]).await;
        assert_eq!(r.status, 304, "{tag}");
    }
    // A range of the decoded body, for the identity client; of the gzip bytes, for the gzip one.
    let r = get(&d, "/g.html", &[("range", "bytes=1000-1999")]).await;
    assert_eq!(r.status, 206);
    assert_eq!(
        r.header("content-range"),
        format!("bytes 1000-1999/{}", page.len())
    );
    assert_eq!(r.body, page.slice(1000..2000));
    let r = get(
        &d,
        "/g.html",
        &[("range", "bytes=-100"), ("accept-encoding", "gzip")],
    )
    .await;
    assert_eq!(r.status, 206);
    assert_eq!(r.body, coded.slice(coded.len() - 100..));
    // Several ranges of the identity representation, once it is made from the gzip body: a multipart
    // 206 of its bytes.
    d.wait_for_stats("the identity representation made", |s| {
        s["proxy"]["representations_made"] == 1
    })
    .await;
    let r = get(&d, "/g.html", &[("range", "bytes=0-9,100000-100009")]).await;
    assert_eq!(r.status, 206);
    assert!(r.header("content-type").starts_with("multipart/byteranges"));
    let text = String::from_utf8_lossy(&r.body);
    for (a, b) in [(0, 9), (100_000, 100_009)] {
        assert!(text.contains(&format!("Content-Range: bytes {a}-{b}/{}", page.len())));
        assert!(r.body.windows(10).any(|w| w == &page[a..=b]));
    }
    assert_eq!(origin.count("/g.html"), 1);
    assert_eq!(
        d.stats().await["proxy"]["compress_in"],
        0,
        "a coded body is not compressed again"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn no_transform_and_compressed_types_are_left_alone() {
    let page = page();
    let body = page.clone();
    let origin = Origin::start(move |seen| match seen.path.as_str() {
        "/nt.html" => html(body.clone()).header("cache-control", "max-age=60, no-transform"),
        "/nt-gzip.html" => html(Bytes::from(gzip(&body)))
            .header("cache-control", "max-age=60, no-transform")
            .header("content-encoding", "gzip"),
        "/img.png" => Reply::ok(body.clone())
            .header("content-type", "image/png")
            .header("cache-control", "max-age=60"),
        _ => Reply::ok("x").status(404),
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    let br = [("accept-encoding", "gzip, deflate, br")];
    for path in ["/nt.html", "/img.png"] {
        let r = get(&d, path, &br).await;
        assert_eq!(
            (r.header("content-encoding"), &r.body),
            ("", &page),
            "{path}"
        );
        assert!(!r.header("etag").starts_with("W/"), "{path}");
    }
    // A no-transform gzip body cannot be decoded for an identity client: its request goes to the origin
    // as it was sent, uncompressed and unstored.
    let r = get(&d, "/nt-gzip.html", &br).await;
    assert_eq!(r.header("content-encoding"), "gzip");
    d.wait_for_stats("stored", |s| s["proxy"]["objects_stored"] == 3)
        .await;
    let identity = get(&d, "/nt-gzip.html", &[("accept-encoding", "identity")]).await;
    assert_eq!(identity.x_cache(), "PASS");
    let last = origin.seen().pop().unwrap();
    assert_eq!(
        last.headers["accept-encoding"], "identity",
        "the client's own field went to the origin"
    );
    assert_eq!(origin.count("/nt-gzip.html"), 2);
    assert_eq!(d.stats().await["proxy"]["coding_forwarded"], 1);
    // A client that says no-transform gets the stored coding when it takes it, and never a conversion.
    let r = get(&d, "/nt.html", &[("cache-control", "no-transform")]).await;
    assert_eq!(r.x_cache(), "HIT");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_truncated_or_corrupt_gzip_body_is_never_stored_or_sent_as_complete() {
    let page = page();
    let mut cut = gzip(&page);
    cut.truncate(cut.len() / 2);
    let mut flipped = gzip(&page);
    let at = flipped.len() / 2;
    flipped[at] ^= 0xff;
    flipped[at + 1] ^= 0xff;
    let (cut, flipped) = (Bytes::from(cut), Bytes::from(flipped));
    let origin = Origin::start(move |seen| {
        let body = if seen.path == "/cut" {
            cut.clone()
        } else {
            flipped.clone()
        };
        html(body).header("content-encoding", "gzip")
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    for path in ["/cut", "/flipped"] {
        for ae in ["gzip", "identity"] {
            let r = request(
                d.addr,
                Method::GET,
                path,
                &[("accept-encoding", ae)],
                Bytes::new(),
            )
            .await;
            assert!(
                r.is_err(),
                "{path} {ae}: the response must end in an error, got {:?}\n{}",
                r.map(|r| (r.status, r.headers, r.body.len())),
                d.log()
            );
        }
        assert_eq!(
            origin.count(path),
            2,
            "{path}: not stored, so fetched again"
        );
    }
    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["objects_stored"], 0);
    assert_eq!(stats["proxy"]["corrupt_bodies"], 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_decompression_bomb_is_cut_off_at_max_object_size() {
    let zeros = vec![0u8; 64 << 20];
    let bomb = Bytes::from(gzip(&zeros));
    assert!(bomb.len() < 200 * 1024);
    let origin = Origin::start(move |_| {
        Reply::ok(bomb.clone())
            .header("content-type", "text/plain")
            .header("content-encoding", "gzip")
            .header("cache-control", "max-age=60")
    })
    .await;
    let d = Daemon::with_config(
        origin.addr,
        "[[listen]]\naddress = \"127.0.0.1:0\"\n[cache]\nmax_object_size = \"1MiB\"\n",
    );
    // A gzip client gets the bytes as sent: they are small, and it decodes at its own risk.
    let r = get(&d, "/bomb", &[("accept-encoding", "gzip")]).await;
    assert_eq!(r.header("content-encoding"), "gzip");
    let started = Instant::now();
    let r = request(d.addr, Method::GET, "/bomb", &[], Bytes::new()).await;
    assert!(
        r.is_err(),
        "decoding stops at max_object_size with an error"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["objects_stored"], 0, "a bomb is not stored");
    assert!(
        stats["proxy"]["decode_limit"].as_u64().unwrap() >= 2,
        "{}",
        stats["proxy"]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_accept_encoding_of_ten_thousand_members_is_answered() {
    let page = page();
    let body = page.clone();
    let origin = Origin::start(move |_| html(body.clone())).await;
    let d = Daemon::with_config(
        origin.addr,
        "[[listen]]\naddress = \"127.0.0.1:0\"\nmax_header_size = \"256KiB\"\n",
    );
    let mut ae = "a, ".repeat(10_000);
    ae.push_str("gzip;q=0.5");
    let started = Instant::now();
    let r = get(&d, "/p", &[("accept-encoding", &ae)]).await;
    assert_eq!(
        (r.status.as_u16(), r.header("content-encoding")),
        (200, "gzip")
    );
    assert_eq!(decoded(&r), page);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_route_without_compression_and_a_reload_of_the_type_list() {
    let page = page();
    let body = page.clone();
    let origin = Origin::start(move |seen| {
        let t = if seen.path.ends_with(".json") {
            "application/json"
        } else {
            "text/html"
        };
        Reply::ok(body.clone())
            .header("content-type", t)
            .header("cache-control", "max-age=60")
            .header("vary", "Accept-Encoding")
    })
    .await;
    let config = |types: &str| {
        format!(
            "[[listen]]\naddress = \"127.0.0.1:0\"\n[compression]\ntypes = [{types}]\n\
             [[route]]\npath_prefix = \"/raw/\"\ncompression = false\n"
        )
    };
    let d = Daemon::with_config(origin.addr, &config("\"text/html\""));
    let br = [("accept-encoding", "gzip, deflate, br")];
    assert_eq!(get(&d, "/a.json", &br).await.header("content-encoding"), "");
    assert_eq!(
        get(&d, "/a.html", &br).await.header("content-encoding"),
        "gzip"
    );
    // The route without compression forwards the client's own field (in its one form: configuration.md,
    // "The request head") and varies on it.
    let r = get(&d, "/raw/a.html", &br).await;
    assert_eq!((r.header("content-encoding"), &r.body), ("", &page));
    assert_eq!(
        origin.seen().pop().unwrap().headers["accept-encoding"],
        "gzip,deflate,br"
    );
    get(&d, "/raw/a.html", &[("accept-encoding", "gzip")]).await;
    assert_eq!(
        origin.count("/raw/a.html"),
        2,
        "two client fields, two variants"
    );

    std::fs::write(
        d.config_file(),
        config("\"text/html\", \"application/json\"").replace("{dir}", ""),
    )
    .unwrap();
    let r = d.admin_post("/v1/reload", serde_json::json!({})).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let applied = String::from_utf8_lossy(&r.body).to_string();
    assert!(applied.contains("compression.types"), "{applied}");
    let r = get(&d, "/b.json", &br).await;
    assert_eq!(r.header("content-encoding"), "gzip");
    assert_eq!(decoded(&r), page);
}

#[tokio::test(flavor = "multi_thread")]
async fn bodies_are_compressed_and_decoded_as_they_stream() {
    use http_body_util::BodyExt;
    use lacquer_tests::{open, Step};
    use std::sync::Arc;
    use tokio::sync::Notify;

    // 4 MiB of text, the first MiB sent at once, the rest once the test opens the gate.
    let mut text = Vec::new();
    while text.len() < 4 << 20 {
        text.extend_from_slice(&page());
    }
    text.truncate(4 << 20);
    let text = Bytes::from(text);
    let gate = Arc::new(Notify::new());
    let (body, g) = (text.clone(), gate.clone());
    let origin = Origin::start(move |_| {
        let mut steps: Vec<Step> = body
            .slice(..1 << 20)
            .chunks(64 * 1024)
            .map(|c| Step::Data(Bytes::copy_from_slice(c)))
            .collect();
        steps.push(Step::Gate(g.clone()));
        steps.extend(
            body.slice(1 << 20..)
                .chunks(64 * 1024)
                .map(|c| Step::Data(Bytes::copy_from_slice(c))),
        );
        html(Bytes::new()).steps(steps, Some(body.len()))
    })
    .await;
    let d = Daemon::start(origin.addr, &[]);
    // An identity client: the body is compressed into the store and decoded for it as it arrives.
    let resp = open(d.addr, "/big.html").await;
    assert_eq!(resp.headers().get("content-encoding"), None);
    let mut body = resp.into_body();
    let mut got = Vec::new();
    while got.len() < 256 * 1024 {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("decoded bytes before the origin's body ends")
            .expect("a frame")
            .expect("no error");
        if let Ok(data) = frame.into_data() {
            got.extend_from_slice(&data);
        }
    }
    assert_eq!(&got[..], &text[..got.len()]);
    // A gzip client joins the fetch in flight.
    let joined = tokio::spawn({
        let addr = d.addr;
        async move {
            request(
                addr,
                Method::GET,
                "/big.html",
                &[("accept-encoding", "gzip")],
                Bytes::new(),
            )
            .await
            .expect("joined")
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    gate.notify_one();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("no error").into_data() {
            got.extend_from_slice(&data);
        }
    }
    assert!(got == text, "the identity client's body is the origin's");
    let joined = joined.await.unwrap();
    assert_eq!(joined.header("content-encoding"), "gzip");
    assert!(
        decoded(&joined) == text,
        "the joined gzip body decodes to the origin's"
    );
    assert_eq!(origin.count("/big.html"), 1);
}

/// Clients without `Accept-Encoding` that join one fill of a body stored gzip'd (players asking for the
/// same playlist reload at once) share one decode of it: each gets the origin's bytes with their length,
/// and the body is decoded once, not once per client.
#[tokio::test(flavor = "multi_thread")]
async fn identity_clients_joining_one_fill_share_one_decode() {
    const CLIENTS: usize = 20;
    let page = page();
    let served = page.clone();
    // The origin's delay lets every client join the fill before its answer comes.
    let origin =
        Origin::start(move |_| html(served.clone()).delay(Duration::from_millis(1000))).await;
    let d = Daemon::start(origin.addr, &[]);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let addr = d.addr;
            tokio::spawn(async move {
                request(addr, Method::GET, "/page.html", &[], Bytes::new()).await
            })
        })
        .collect();
    // A client whose response was made before the whole body was in hand (its head came apart from the
    // body on a busy machine) decodes as it reads, and is sent without a length: counted apart.
    let mut shared = 0;
    for client in clients {
        let r = client.await.unwrap().expect("request");
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-encoding"), "");
        assert_eq!(r.body, page, "the origin's bytes");
        assert_eq!(r.header("etag"), "W/\"page-1\"");
        shared += usize::from(r.header("content-length") == page.len().to_string());
    }
    assert!(
        shared >= CLIENTS / 2,
        "{shared} of {CLIENTS} shared the decode"
    );
    assert_eq!(origin.count("/page.html"), 1, "one fill for all");
    let stats = d.stats().await;
    let p = &stats["proxy"];
    // Each response is a conversion on the way out; the bytes were decoded once for all that shared it.
    assert_eq!(p["decoded_gzip"], CLIENTS as u64, "{p}");
    let decodes = 1 + (CLIENTS - shared) as u64;
    assert_eq!(p["decoded_bytes"], decodes * page.len() as u64, "{p}");
    assert_eq!(p["representations_served"], 0, "{p}");
}

/// A rule's `compress` (Varnish's `do_gzip`): a small JSON answer, under `min_size`, is stored compressed
/// and decoded for clients that take no coding; `compress = false` keeps a listed type identity.
#[tokio::test(flavor = "multi_thread")]
async fn a_rules_compress_overrides_the_size_and_type_lists() {
    let json = Bytes::from(format!("{{\"items\":[{}]}}", "1,".repeat(60) + "1"));
    assert!(json.len() < 1024, "under the default min_size");
    let body = json.clone();
    let origin = Origin::start(move |seen| {
        let reply = match seen.path.as_str() {
            "/api/small.json" => Reply::ok(body.clone()).header("content-type", "application/json"),
            _ => html(page()),
        };
        reply.header("cache-control", "max-age=3600")
    })
    .await;
    let d = Daemon::with_config(
        origin.addr,
        r#"
[[rule]]
on = "backend_response"
match = { content_types = ["application/json"] }
compress = true

[[rule]]
on = "backend_response"
match = { path_prefix = ["/raw/"] }
compress = false
"#,
    );
    let gzip = get(&d, "/api/small.json", &[("accept-encoding", "gzip")]).await;
    d.wait_for_stats("stored", |s| {
        s["store"]["objects_published"].as_u64() >= Some(1)
    })
    .await;
    assert_eq!(gzip.header("content-encoding"), "gzip");
    assert_eq!(decoded(&gzip), json);
    let plain = get(&d, "/api/small.json", &[]).await;
    assert_eq!(
        (plain.header("content-encoding"), plain.x_cache()),
        ("", "HIT")
    );
    assert_eq!(plain.body, json);
    let raw = get(&d, "/raw/page", &[("accept-encoding", "gzip")]).await;
    assert_eq!(raw.header("content-encoding"), "", "compress = false");
    assert_eq!(raw.body, page());
    assert_eq!(origin.count("/api/small.json"), 1);
}

/// Varnish's `do_gzip` compresses a passed answer too: a rule's `compress = true` on a request that is
/// never stored compresses it on its way to a client that takes gzip, and only to such a client.
#[tokio::test(flavor = "multi_thread")]
async fn a_rules_compress_holds_for_a_passed_answer() {
    let json = Bytes::from(format!("{{\"items\":[{}]}}", "1,".repeat(60) + "1"));
    let body = json.clone();
    let origin = Origin::start(move |_| {
        Reply::ok(body.clone())
            .header("content-type", "application/json")
            .header("etag", "\"v1\"")
    })
    .await;
    let d = Daemon::with_config(
        origin.addr,
        r#"
[[route]]
path_prefix = "/api/"
pass = true

[[rule]]
on = "backend_response"
match = { content_types = ["application/json"] }
compress = true
"#,
    );
    let gzip = get(
        &d,
        "/api/me.json",
        &[("accept-encoding", "gzip, deflate, br")],
    )
    .await;
    assert_eq!(gzip.header("content-encoding"), "gzip");
    assert_eq!(
        gzip.header("etag"),
        "W/\"v1\"",
        "another representation: a weak validator"
    );
    assert!(gzip
        .header("vary")
        .to_ascii_lowercase()
        .contains("accept-encoding"));
    assert_eq!(decoded(&gzip), json);
    let plain = get(&d, "/api/me.json", &[]).await;
    assert_eq!(plain.header("content-encoding"), "");
    assert_eq!(plain.body, json);
    assert_eq!(origin.count("/api/me.json"), 2, "passed: never stored");
}
