//! Compression dictionaries (RFC 9842) through the real daemon: a `Use-As-Dictionary` response held as a
//! dictionary, later versions of the file sent compressed against it (`dcz`, `dcb`) to clients that hold it,
//! made once and kept beside the stored body; checked with independent decoders and with Chromium, and
//! with what the origin saw.

use std::time::Duration;

use base64::Engine;
use http::Method;
use lacquer_tests::{chromium, eventually, request, Daemon, Origin, Reply};

/// Version `n` of a script: most of it the same from one version to the next, as a bundle's is.
fn script(n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..3000 {
        let line = if i % 500 == 7 {
            format!(
                "export function changed{i}() {{ return {}; }}\n",
                n * 1000 + i
            )
        } else {
            format!(
                "export function f{i}(a, b) {{ return a * {i} + b - {}; }}\n",
                i % 13
            )
        };
        out.extend_from_slice(line.as_bytes());
    }
    out
}

fn sha256(bytes: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .to_vec()
}

/// `Available-Dictionary` for `dictionary`: its SHA-256 as a structured byte sequence.
fn available(dictionary: &[u8]) -> String {
    format!(
        ":{}:",
        base64::engine::general_purpose::STANDARD.encode(sha256(dictionary))
    )
}

/// The body of a `dcz` or `dcb` response, decoded against `dictionary` by decoders lacquerd does not use
/// to encode; the hash the stream names is checked too.
fn decode(reply: &lacquer_tests::client::Reply, dictionary: &[u8]) -> Vec<u8> {
    let body = &reply.body[..];
    let (magic, rest): (&[u8], _) = match reply.header("content-encoding") {
        "dcz" => (&[0x5e, 0x2a, 0x4d, 0x18, 0x20, 0, 0, 0], &body[8..]),
        "dcb" => (&[0xff, 0x44, 0x43, 0x42], &body[4..]),
        other => panic!("not a dictionary coding: {other:?}"),
    };
    assert_eq!(&body[..magic.len()], magic);
    assert_eq!(
        &rest[..32],
        &sha256(dictionary)[..],
        "the stream names its dictionary"
    );
    let mut out = Vec::new();
    if reply.header("content-encoding") == "dcz" {
        let mut r = zstd::stream::read::Decoder::with_dictionary(&rest[32..], dictionary).unwrap();
        std::io::Read::read_to_end(&mut r, &mut out).unwrap();
    } else {
        let mut r = brotli::Decompressor::new_with_custom_dict(
            &rest[32..],
            4096,
            dictionary.to_vec().into(),
        );
        std::io::Read::read_to_end(&mut r, &mut out).unwrap();
    }
    out
}

fn gunzip(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(body), &mut out).unwrap();
    out
}

async fn get(d: &Daemon, path: &str, headers: &[(&str, &str)]) -> lacquer_tests::client::Reply {
    request(d.addr, Method::GET, path, headers, Default::default())
        .await
        .unwrap()
}

/// A page that fetches version 1 (which Chromium keeps as a dictionary), then version 2 until Chromium has
/// stored the dictionary and names it, and shows the coding, length and SHA-256 of what it decoded.
/// Chromium stores a dictionary in the background; `/wait` spends real time between tries, which the
/// virtual-time budget would otherwise skip.
const PAGE: &str = r#"<html><body><script>
async function go() {
  await (await fetch('/js/app.v1.js')).text();
  let response, text;
  for (let i = 0; i < 40; i++) {
    await (await fetch('/wait', {cache: 'no-store'})).text();
    response = await fetch('/js/app.v2.js', {cache: 'no-store'});
    text = await response.text();
    if (response.headers.get('content-encoding') === 'dcz') break;
  }
  const hash = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(text));
  const hex = Array.from(new Uint8Array(hash)).map(b => b.toString(16).padStart(2, '0')).join('');
  document.body.setAttribute('data-coding', response.headers.get('content-encoding'));
  document.body.setAttribute('data-decoded', text.length + ':' + hex);
}
go().catch(e => document.body.setAttribute('data-decoded', 'error: ' + e));
</script></body></html>"#;

async fn scripts_origin() -> Origin {
    Origin::start(|seen| {
        if seen.path == "/" {
            return Reply::ok(PAGE)
                .header("content-type", "text/html")
                .header("cache-control", "no-store");
        }
        if seen.path == "/wait" {
            return Reply::ok("")
                .header("cache-control", "no-store")
                .delay(Duration::from_millis(250));
        }
        if !seen.path.starts_with("/js/") {
            // Chromium asks for /favicon.ico: had it a dictionary, Chromium would prefer the newer one.
            return Reply::ok("").status(404);
        }
        let version: usize = seen
            .path
            .trim_start_matches("/js/app.v")
            .trim_end_matches(".js")
            .parse()
            .unwrap_or(0);
        let reply = Reply::ok(script(version))
            .header("content-type", "application/javascript")
            .header("cache-control", "max-age=600");
        // Each version is the dictionary for the next, as a site that ships them does.
        reply.header("use-as-dictionary", "match=\"/js/app.v*.js\"")
    })
    .await
}

const CHROME: &str = "gzip, deflate, br, zstd, dcb, dcz";

/// Asks for `path` holding `dictionary` until the representation against it is made and sent.
async fn until_compressed_against(
    d: &Daemon,
    path: &str,
    accept_encoding: &str,
    dictionary: &[u8],
) -> lacquer_tests::client::Reply {
    let have = available(dictionary);
    eventually(Duration::from_secs(10), || async {
        let r = get(
            d,
            path,
            &[
                ("accept-encoding", accept_encoding),
                ("available-dictionary", &have),
            ],
        )
        .await;
        r.header("content-encoding").starts_with("dc").then_some(r)
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_holding_a_version_gets_the_next_compressed_against_it() {
    let origin = scripts_origin().await;
    let d = Daemon::start(origin.addr, &[]);
    let (v1, v2) = (script(1), script(2));

    // The first version: an ordinary response (gzip'd once when stored), and held as a dictionary.
    let r = get(&d, "/js/app.v1.js", &[("accept-encoding", "gzip, br")]).await;
    assert_eq!(r.header("content-encoding"), "gzip");
    assert_eq!(gunzip(&r.body), v1);
    assert_eq!(r.header("use-as-dictionary"), "match=\"/js/app.v*.js\"");
    d.wait_for_stats("the dictionary held", |s| {
        s["proxy"]["dictionaries_held"].as_u64() == Some(1)
    })
    .await;

    // A client that holds it: the first answer is the ordinary one while the representation against it
    // is made from the stored body; then every such client is sent that.
    let r = get(
        &d,
        "/js/app.v2.js",
        &[
            ("accept-encoding", CHROME),
            ("available-dictionary", &available(&v1)),
        ],
    )
    .await;
    assert_eq!(r.header("content-encoding"), "gzip");
    let r = until_compressed_against(&d, "/js/app.v2.js", CHROME, &v1).await;
    assert_eq!(r.header("content-encoding"), "dcz");
    assert_eq!(decode(&r, &v1), v2);
    let vary: Vec<_> = r
        .headers
        .get_all("vary")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    let vary = vary.join(", ").to_ascii_lowercase();
    assert!(
        vary.contains("accept-encoding") && vary.contains("available-dictionary"),
        "{vary}"
    );
    assert!(r.header("etag").is_empty() || r.header("etag").starts_with("W/"));
    assert_eq!(r.header("content-length"), r.body.len().to_string());
    let gzip_len = {
        let g = get(&d, "/js/app.v2.js", &[("accept-encoding", "gzip")]).await;
        assert_eq!(g.header("content-encoding"), "gzip");
        g.body.len()
    };
    println!(
        "v2: {} bytes, {gzip_len} gzip'd, {} against v1 (dcz)",
        v2.len(),
        r.body.len()
    );
    assert!(
        r.body.len() * 20 < gzip_len,
        "{} vs {gzip_len}",
        r.body.len()
    );

    // Only `dcb` taken: brotli against the dictionary, made once too.
    let r = until_compressed_against(&d, "/js/app.v2.js", "gzip, br, dcb", &v1).await;
    assert_eq!(r.header("content-encoding"), "dcb");
    assert_eq!(decode(&r, &v1), v2);

    // A dictionary not held, or announced without a coding that uses it, changes nothing.
    for headers in [
        vec![
            ("accept-encoding", CHROME),
            (
                "available-dictionary",
                ":AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=:",
            ),
        ],
        vec![
            ("accept-encoding", "gzip, br"),
            ("available-dictionary", &*available(&v1)),
        ],
        vec![
            ("accept-encoding", CHROME),
            ("available-dictionary", "not a byte sequence"),
        ],
        // A client that says `no-transform` gets the stored coding, never one made for it.
        vec![
            ("accept-encoding", CHROME),
            ("available-dictionary", &*available(&v1)),
            ("cache-control", "no-transform"),
        ],
    ] {
        let r = get(&d, "/js/app.v2.js", &headers).await;
        assert_eq!(r.header("content-encoding"), "gzip", "{headers:?}");
        assert_eq!(gunzip(&r.body), v2);
    }
    // Nor is it used for another host's files, though the path is the same.
    let other_host = [
        ("host", "other.test"),
        ("accept-encoding", CHROME),
        ("available-dictionary", &*available(&v1)),
    ];
    for _ in 0..3 {
        let r = get(&d, "/js/app.v2.js", &other_host).await;
        assert_eq!(r.header("content-encoding"), "gzip");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The origin was asked once per file and host: the representations are made from stored bodies, and
    // it never saw the dictionary fields.
    assert_eq!(origin.count("/js/app.v1.js"), 1);
    assert_eq!(origin.count("/js/app.v2.js"), 2);
    assert!(origin
        .seen()
        .iter()
        .all(|s| !s.headers.contains_key("available-dictionary")));
    let stats = d.stats().await;
    assert!(stats["proxy"]["dictionary_responses"].as_u64() >= Some(2));
    assert!(stats["proxy"]["dictionary_bytes_saved"].as_u64() > Some(0));

    // Purged, the dictionary is never used again: a newer version is not compressed against it.
    let r = d
        .admin_post(
            "/v1/purge",
            serde_json::json!({ "url": format!("http://{}/js/app.v1.js", d.addr) }),
        )
        .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v3_asked = [
        ("accept-encoding", CHROME),
        ("available-dictionary", &*available(&v1)),
    ];
    for _ in 0..5 {
        let r = get(&d, "/js/app.v3.js", &v3_asked).await;
        assert_eq!(r.header("content-encoding"), "gzip");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["dictionaries_dropped"].as_u64(), Some(1));
    // What was made against it before stays right: it lives and dies with the body it was made from.
    let r = get(&d, "/js/app.v2.js", &v3_asked).await;
    assert_eq!(r.header("content-encoding"), "dcz");
    assert_eq!(decode(&r, &v1), v2);
}

#[tokio::test(flavor = "multi_thread")]
async fn chromium_decodes_what_it_is_sent_against_its_dictionary() {
    if !chromium::available() {
        return;
    }
    let origin = scripts_origin().await;
    let d = Daemon::start(origin.addr, &[]);
    let (v1, v2) = (script(1), script(2));
    // Both versions stored and the representation against v1 made, so Chromium's request is a hit on it
    // (under the host it sends).
    let host = format!("localhost:{}", d.addr.port());
    get(
        &d,
        "/js/app.v1.js",
        &[("accept-encoding", "gzip"), ("host", &host)],
    )
    .await;
    d.wait_for_stats("the dictionary held", |s| {
        s["proxy"]["dictionaries_held"].as_u64() == Some(1)
    })
    .await;
    let have = available(&v1);
    let asked = [
        ("accept-encoding", CHROME),
        ("available-dictionary", &*have),
        ("host", &*host),
    ];
    eventually(Duration::from_secs(10), || async {
        let r = get(&d, "/js/app.v2.js", &asked).await;
        (r.header("content-encoding") == "dcz").then_some(())
    })
    .await;
    let before = d.stats().await["proxy"]["dictionary_responses"]
        .as_u64()
        .unwrap();

    // `localhost` is a secure context, where Chromium uses dictionaries over plain HTTP.
    let url = format!("http://localhost:{}/", d.addr.port());
    let (dom, printed) = chromium::dump_dom(&url, &[]).await;
    let want = format!(
        "data-decoded=\"{}:{}\"",
        v2.len(),
        sha256(&v2)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    assert!(dom.contains(&want), "{dom}\n{printed}");
    assert!(dom.contains("data-coding=\"dcz\""), "{dom}\n{printed}");
    // What it decoded was sent against its dictionary, not in an ordinary coding.
    let after = d.stats().await["proxy"]["dictionary_responses"]
        .as_u64()
        .unwrap();
    assert_eq!(after, before + 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn what_was_made_survives_a_restart_and_a_dictionary_is_held_again_once_served() {
    let origin = scripts_origin().await;
    let mut d = Daemon::start(origin.addr, &[]);
    let (v1, v2, v3) = (script(1), script(2), script(3));
    let host = ("host", "scripts.test");
    let have = available(&v1);
    let asked = [
        ("accept-encoding", CHROME),
        ("available-dictionary", &*have),
        host,
    ];
    get(&d, "/js/app.v1.js", &[("accept-encoding", "gzip"), host]).await;
    d.wait_for_stats("the dictionary held", |s| {
        s["proxy"]["dictionaries_held"].as_u64() == Some(1)
    })
    .await;
    let made = eventually(Duration::from_secs(10), || async {
        let r = get(&d, "/js/app.v2.js", &asked).await;
        (r.header("content-encoding") == "dcz").then_some(r.body)
    })
    .await;
    d.stop();
    let d = d.restart();

    // The representation is stored beside its body: sent at once, as before.
    let r = get(&d, "/js/app.v2.js", &asked).await;
    assert_eq!((r.header("content-encoding"), r.x_cache()), ("dcz", "HIT"));
    assert_eq!(r.body, made);
    assert_eq!(decode(&r, &v1), v2);
    // The dictionary itself is held again once its file is served: until then a new file goes in the
    // ordinary codings.
    for _ in 0..3 {
        let r = get(&d, "/js/app.v3.js", &asked).await;
        assert_eq!(r.header("content-encoding"), "gzip");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = get(&d, "/js/app.v1.js", &[("accept-encoding", "gzip"), host]).await;
    assert_eq!(r.x_cache(), "HIT");
    let r = eventually(Duration::from_secs(10), || async {
        let r = get(&d, "/js/app.v3.js", &asked).await;
        (r.header("content-encoding") == "dcz").then_some(r)
    })
    .await;
    assert_eq!(decode(&r, &v1), v3);
    assert_eq!(origin.count("/js/app.v1.js"), 1);
    assert_eq!(origin.count("/js/app.v2.js"), 1);
    assert_eq!(origin.count("/js/app.v3.js"), 1);
}
