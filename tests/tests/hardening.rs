//! Hardening III (issue 41), end to end: each finding tried as the attacker did, through the real daemon
//! in front of a scripted origin, with what the victim and the origin saw.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use bytes::Bytes;
use http::Method;
use lacquer_tests::{request, ClientReply, Daemon, Origin, Reply};

fn text(r: &ClientReply) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

async fn send(d: &Daemon, method: Method, path: &str, headers: &[(&str, &str)]) -> ClientReply {
    let body = match method {
        Method::POST => Bytes::from_static(br#"{"query":"{ me { name } }"}"#),
        _ => Bytes::new(),
    };
    let mut all = vec![("host", "shop.test")];
    all.extend_from_slice(headers);
    request(d.addr, method, path, &all, body)
        .await
        .unwrap_or_else(|e| panic!("{path}: {e}; log:\n{}", d.log()))
}

fn daemon(origin: &Origin, config: &str) -> Daemon {
    Daemon::with_config_only(&format!(
        "[[listen]]\naddress = \"127.0.0.1:0\"\n[[backend]]\nname = \"app\"\naddress = \"{}\"\n{config}",
        origin.addr
    ))
}

/// Finding 1: `cache_body` keys a POST on its body's SHA-256. The variant the store shows for a POST is
/// made of exactly that digest (a fast hash's 128 bits, which an attacker could collide, are not it).
#[tokio::test(flavor = "multi_thread")]
async fn a_post_is_keyed_by_the_sha256_of_its_body() {
    let origin = Origin::start(|seen| {
        Reply::ok(format!("answer to {}", String::from_utf8_lossy(&seen.body)))
            .header("cache-control", "max-age=60")
    })
    .await;
    let d = daemon(
        &origin,
        "[[rule]]\nname = \"graphql\"\nmatch = { methods = [\"POST\"], path_prefix = [\"/graphql\"] }\n\
         cache_body = \"64KiB\"\n",
    );
    let body = br#"{"query":"{ me { name } }"}"#;
    let first = send(&d, Method::POST, "/graphql", &[]).await;
    let again = send(&d, Method::POST, "/graphql", &[]).await;
    assert_eq!((first.x_cache(), again.x_cache()), ("MISS", "HIT"));
    assert_eq!(origin.total(), 1);

    let objects = d
        .admin_get(
            "/v1/objects?url=http%3A%2F%2Fshop.test%2Fgraphql",
            Some(&d.secret()),
        )
        .await;
    let objects: serde_json::Value = serde_json::from_slice(&objects.body).unwrap();
    let digest = objects["variants"][0]["vary"]
        .as_array()
        .unwrap_or_else(|| panic!("{objects}"))
        .iter()
        .find(|f| f["name"] == "lacquer-body-digest")
        .and_then(|f| f["value"].as_str())
        .unwrap_or_else(|| panic!("no body digest in {objects}"))
        .to_owned();
    let want: String = ring::digest::digest(&ring::digest::SHA256, body)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(digest, want, "the variant is the body's SHA-256");
}

/// Finding 2: recipe 11's `api` rule as it was documented (rewriting `Cache-Control` to `public` in
/// `backend_response`) must not share Alice's `private, no-store` answer with an anonymous client.
#[tokio::test(flavor = "multi_thread")]
async fn a_rule_that_rewrites_cache_control_never_shares_an_authorized_answer() {
    let origin = Origin::start(|seen| match seen.headers.get("authorization") {
        Some(who) => Reply::ok(format!("account of {}", who.to_str().unwrap()))
            .header("cache-control", "private, no-store"),
        None => Reply::ok("please log in").header("cache-control", "no-store"),
    })
    .await;
    let d = daemon(
        &origin,
        "[[rule]]\nname = \"api\"\non = \"backend_response\"\nmatch = { path_prefix = [\"/api/\"] }\n\
         set_headers = { \"cache-control\" = \"public, max-age=300\" }\n",
    );
    let alice = send(
        &d,
        Method::GET,
        "/api/me",
        &[("authorization", "Bearer alice")],
    )
    .await;
    assert_eq!(text(&alice), "account of Bearer alice");
    let anonymous = send(&d, Method::GET, "/api/me", &[]).await;
    assert_eq!(
        text(&anonymous),
        "please log in",
        "Alice's answer was shared ({})",
        anonymous.x_cache()
    );
    assert_eq!(
        origin.total(),
        2,
        "the anonymous request went to the origin"
    );
    // The rule still does what it is for: an answer to a request without credentials is shared.
    let again = send(&d, Method::GET, "/api/me", &[]).await;
    assert_eq!(
        (again.x_cache(), text(&again).as_str()),
        ("HIT", "please log in")
    );

    // `explain` says the same as the data path.
    let explained = d
        .admin_post(
            "/v1/explain",
            serde_json::json!({"url": "http://shop.test/api/me",
                               "headers": [{"name": "authorization", "value": "Bearer bob"}]}),
        )
        .await;
    let explained: serde_json::Value = serde_json::from_slice(&explained.body).unwrap();
    assert_ne!(explained["stored"]["storable"], true, "{explained}");
}

/// A path as Tomcat resolves it: each segment's `;` parameters dropped, `%2e` decoded, then dot segments.
fn tomcat_reads(path: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    for segment in path.split('?').next().unwrap_or("").split('/').skip(1) {
        let segment = segment.split(';').next().unwrap_or("");
        match segment.to_ascii_lowercase().replace("%2e", ".").as_str() {
            "." => {}
            ".." => {
                out.pop();
            }
            other => out.push(other.to_owned()),
        }
    }
    format!("/{}", out.join("/"))
}

/// An origin that reads paths as Tomcat does (`;` parameters dropped, so `/static/..;/account/me` is
/// `/account/me`) and whose account page says nothing about caching: a careless but common origin.
async fn tomcat() -> Origin {
    let serial = AtomicUsize::new(0);
    Origin::start(move |seen| {
        let n = serial.fetch_add(1, SeqCst) + 1;
        let read = tomcat_reads(&seen.path);
        let cookie = seen
            .headers
            .get("cookie")
            .map_or("-", |c| c.to_str().unwrap());
        let reply = if read.starts_with("/account/") {
            Reply::ok(format!("account page of {cookie}"))
        } else {
            Reply::ok(format!("static #{n}"))
        };
        reply.header("cache-control", "max-age=60")
    })
    .await
}

/// Finding 3: web cache deception through the lenient reading of a path. A route that stores whatever
/// the cookies (`cookies = "cache"`) must not store `/static/..;/account/me`, which the origin reads as
/// the victim's account page; a plain static path is still stored with cookies.
#[tokio::test(flavor = "multi_thread")]
async fn a_route_that_loosens_does_not_apply_to_a_path_that_reads_two_ways() {
    let origin = tomcat().await;
    let d = daemon(
        &origin,
        "[[route]]\npath_prefix = \"/static/\"\nbackend = \"app\"\ncookies = \"cache\"\nttl = \"60s\"\n",
    );
    let victim = ("cookie", "session=victim");
    for path in ["/static/..;/account/me", "/static/%2e%2e;/account/me"] {
        let stolen = send(&d, Method::GET, path, &[victim]).await;
        assert_eq!(text(&stolen), "account page of session=victim", "{path}");
        let attacker = send(&d, Method::GET, path, &[]).await;
        assert_eq!(
            text(&attacker),
            "account page of -",
            "{path}: the victim's page was served from the cache ({})",
            attacker.x_cache()
        );
    }
    // The route still loosens where both readings agree.
    let css = send(&d, Method::GET, "/static/app.css", &[victim]).await;
    let css_again = send(&d, Method::GET, "/static/app.css", &[]).await;
    assert_eq!(css_again.x_cache(), "HIT");
    assert_eq!(text(&css_again), text(&css));
}

/// Finding 3, by a rule: `extensions` with `cache_cookies` must not store `/account/me;x.css`.
#[tokio::test(flavor = "multi_thread")]
async fn an_extension_rule_that_loosens_does_not_match_a_parameter_in_the_last_segment() {
    let origin = tomcat().await;
    let d = daemon(
        &origin,
        "[[rule]]\nname = \"static\"\nmatch = { extensions = [\"css\", \"js\"] }\ncache_cookies = true\n",
    );
    let victim = ("cookie", "session=victim");
    let stolen = send(&d, Method::GET, "/account/me;x.css", &[victim]).await;
    assert_eq!(text(&stolen), "account page of session=victim");
    let attacker = send(&d, Method::GET, "/account/me;x.css", &[]).await;
    assert_eq!(
        text(&attacker),
        "account page of -",
        "the victim's page was served from the cache ({})",
        attacker.x_cache()
    );
    let explained = d
        .admin_post(
            "/v1/explain",
            serde_json::json!({"url": "http://shop.test/account/me;x.css",
                               "headers": [{"name": "cookie", "value": "session=victim"}]}),
        )
        .await;
    let explained: serde_json::Value = serde_json::from_slice(&explained.body).unwrap();
    assert_eq!(explained["action"], "pass", "{explained}");
    // A real stylesheet is still stored whatever its cookies.
    let css = send(&d, Method::GET, "/s/app.css", &[victim]).await;
    let css_again = send(&d, Method::GET, "/s/app.css", &[]).await;
    assert_eq!((css_again.x_cache(), text(&css_again)), ("HIT", text(&css)));
}

/// Finding 13: an `https://` backend that accepts TCP and never answers the ClientHello fails the request
/// at `connect_timeout` as unreachable (503), not at `first_byte_timeout` as a backend that sent no head.
#[tokio::test(flavor = "multi_thread")]
async fn a_tls_handshake_that_never_completes_is_under_connect_timeout() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            open.push(s);
        }
    });
    let d = Daemon::with_config_only(&format!(
        "[[listen]]\naddress = \"127.0.0.1:0\"\n[[backend]]\nname = \"app\"\n\
         address = \"https://{addr}\"\nconnect_timeout = \"500ms\"\nfirst_byte_timeout = \"20s\"\n"
    ));
    let started = std::time::Instant::now();
    let r = send(&d, Method::GET, "/", &[]).await;
    let took = started.elapsed();
    assert_eq!(r.status, 503, "{}", text(&r));
    assert!(
        took < std::time::Duration::from_secs(5),
        "answered after {took:?}, not at connect_timeout"
    );
    d.wait_for_log("connect_timeout").await;
    held.abort();
}

/// Finding 15: `explain` of a POST a `cache_body` rule keys, given its body, says what the data path does
/// with it: a lookup whose key fields name the body's digest, not an invalidation.
#[tokio::test(flavor = "multi_thread")]
async fn explain_keys_a_post_by_its_body_as_the_data_path_does() {
    let origin = Origin::start(|_| Reply::ok("answer").header("cache-control", "max-age=60")).await;
    let d = daemon(
        &origin,
        "[[rule]]\nname = \"graphql\"\nmatch = { methods = [\"POST\"], path_prefix = [\"/graphql\"] }\n\
         cache_body = \"64KiB\"\n",
    );
    let explained = d
        .admin_post(
            "/v1/explain",
            serde_json::json!({"url": "http://shop.test/graphql", "method": "POST",
                               "body": "{\"query\":\"{a}\"}"}),
        )
        .await;
    let explained: serde_json::Value = serde_json::from_slice(&explained.body).unwrap();
    assert_eq!(explained["action"], "lookup", "{explained}");
    let fields = explained["key_fields"].as_array().unwrap();
    assert!(
        fields.iter().any(|f| f == "lacquer-body-digest"),
        "{explained}"
    );
    assert!(
        !explained["headers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["name"] == "lacquer-body-digest"),
        "the digest is never sent: {explained}"
    );
    // And cachectl's `-d` sends it.
    let (code, out, err) = lacquer_tests::run_tool(
        lacquer_tests::daemon::binary("cachectl").to_str().unwrap(),
        &[
            "--admin",
            &d.admin.to_string(),
            "--secret",
            d.secret_file().to_str().unwrap(),
            "explain",
            "http://shop.test/graphql",
            "-X",
            "POST",
            "-d",
            "{\"query\":\"{a}\"}",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("lacquer-body-digest"), "{out}");
}

/// Finding 10: a reload that adds `key = ["cookie"]` (how an operator stops one cookie's object being
/// served for another) applies to objects stored before it: they no longer answer.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_that_keys_on_more_fields_reaches_objects_stored_before_it() {
    let origin = Origin::start(|seen| {
        let cookie = seen
            .headers
            .get("cookie")
            .map_or("-", |c| c.to_str().unwrap());
        Reply::ok(format!("page for {cookie}")).header("cache-control", "max-age=300")
    })
    .await;
    let rules = "[[rule]]\nname = \"lang\"\ncache_cookies = true\n";
    let d = daemon(&origin, rules);
    let fr = send(&d, Method::GET, "/home", &[("cookie", "lang=fr")]).await;
    assert_eq!(text(&fr), "page for lang=fr");
    let leak = send(&d, Method::GET, "/home", &[("cookie", "lang=de")]).await;
    assert_eq!(
        leak.x_cache(),
        "HIT",
        "the leak the operator sets out to stop"
    );

    let config = std::fs::read_to_string(d.config_file()).unwrap();
    std::fs::write(
        d.config_file(),
        config.replace(
            "cache_cookies = true\n",
            "cache_cookies = true\nkey = [\"cookie\"]\n",
        ),
    )
    .unwrap();
    let reloaded = d.admin_post("/v1/reload", serde_json::Value::Null).await;
    assert_eq!(reloaded.status, 200, "{:?}", reloaded.body);
    let de = send(&d, Method::GET, "/home", &[("cookie", "lang=de")]).await;
    assert_eq!(text(&de), "page for lang=de", "{}", de.x_cache());
    let fr = send(&d, Method::GET, "/home", &[("cookie", "lang=fr")]).await;
    assert_eq!(text(&fr), "page for lang=fr", "{}", fr.x_cache());
    let de_again = send(&d, Method::GET, "/home", &[("cookie", "lang=de")]).await;
    assert_eq!(
        (de_again.x_cache(), text(&de_again).as_str()),
        ("HIT", "page for lang=de")
    );
    // A client cannot send the field that carries the keying.
    let forged = send(
        &d,
        Method::GET,
        "/home",
        &[("cookie", "lang=fr"), ("lacquer-key-rules", "0")],
    )
    .await;
    assert_eq!(text(&forged), "page for lang=fr");
    assert!(origin
        .seen()
        .iter()
        .all(|s| !s.headers.contains_key("lacquer-key-rules")));
}

/// Finding 5: an idle HTTP/1.1 connection keeps little after a large hit (774 KiB each before: hyper's
/// flattened write buffer kept its largest size). 100 connections each read a 4 MiB hit, one after the
/// other, and stay open: what the daemon grew by is what they keep.
#[tokio::test(flavor = "multi_thread")]
async fn an_idle_connection_gives_back_what_a_large_hit_took() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const LEN: usize = 4 << 20;
    let origin = Origin::start(|_| Reply::large(LEN).header("cache-control", "max-age=600")).await;
    let d = daemon(&origin, "");
    let get = async |s: &mut tokio::net::TcpStream| {
        s.write_all(b"GET /segment HTTP/1.1\r\nHost: shop.test\r\n\r\n")
            .await
            .unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut got = Vec::new();
        let head_end = loop {
            let n = s.read(&mut buf).await.unwrap();
            assert_ne!(n, 0, "closed");
            got.extend_from_slice(&buf[..n]);
            if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
        };
        let mut body = got.len() - head_end;
        while body < LEN {
            let n = s.read(&mut buf).await.unwrap();
            assert_ne!(n, 0, "closed mid-body");
            body += n;
        }
    };
    // Warm: stored, and the daemon's own buffers made.
    for _ in 0..3 {
        let mut s = tokio::net::TcpStream::connect(d.addr).await.unwrap();
        get(&mut s).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let before = d.rss_kib();
    let mut open = Vec::new();
    for _ in 0..100 {
        let mut s = tokio::net::TcpStream::connect(d.addr).await.unwrap();
        get(&mut s).await;
        open.push(s);
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let per_connection = d.rss_kib().saturating_sub(before) / 100;
    assert!(
        per_connection <= 128,
        "{per_connection} KiB kept per idle connection after a 4 MiB hit"
    );
}
