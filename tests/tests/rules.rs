//! The recipes of docs/rules.md end to end: each rule in the real daemon, in front of a scripted origin,
//! with what the origin received and what the client got. Recipes that need nothing of their own share a
//! daemon (their rules are scoped by host, `rN.test` for recipe N), and a shared daemon runs every recipe
//! before it reports which failed.

use std::{
    net::SocketAddr,
    panic::AssertUnwindSafe,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst},
        Arc,
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use futures_util::FutureExt;
use http::Method;
use lacquer_tests::{
    check_config as check,
    origin::Seen,
    raw_status, request,
    tls::{self, TestCa},
    unused_addr, ClientReply, Daemon, Origin, Reply,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// An origin whose answer the path scripts, so one origin serves every recipe:
/// - `/status/NNN`: that status, without freshness (a `301` with a `Location`);
/// - `/cc/N`: `max-age=N`, `/public/` adds `public`; `/nocc/`: no freshness at all; `/nostore`:
///   `no-store`; otherwise `max-age=60` (not for `/status/`);
/// - `/img/`: `image/png`; `/big`: a 20 000-byte body; `/setcookie/`: a `Set-Cookie`; `/headers/`:
///   `Server` and `X-Powered-By`; `/vary/`: `Vary: X-UA-Device`;
/// - `/echo/NAME`: the body is the request's `NAME` header (`-` when absent); else a serial number, so
///   a response served twice from the cache shows the same number.
async fn scripted() -> Origin {
    let serial = AtomicUsize::new(0);
    Origin::start(move |seen| {
        let n = serial.fetch_add(1, SeqCst) + 1;
        let path = seen.path.split('?').next().unwrap_or("").to_owned();
        let body = match path.split_once("/echo/") {
            Some((_, name)) => header(seen, name.split('/').next().unwrap()).to_owned(),
            None if path.contains("/big") => "x".repeat(20_000),
            None => n.to_string(),
        };
        let body = if body.is_empty() { "-".into() } else { body };
        let mut reply = Reply::ok(body);
        let status = path
            .split_once("/status/")
            .map(|(_, s)| s[..3].parse::<u16>().unwrap());
        if let Some(s) = status {
            reply = reply.status(s);
            if s == 301 {
                reply = reply.header("location", "/moved");
            }
        }
        let public = if path.contains("/public/") {
            "public, "
        } else {
            ""
        };
        let cc = if let Some((_, n)) = path.split_once("/cc/") {
            Some(format!("{public}max-age={}", n.split('/').next().unwrap()))
        } else if path.contains("/nostore") {
            Some("no-store".into())
        } else if path.contains("/nocc/") || status.is_some() {
            None
        } else {
            Some(format!("{public}max-age=60"))
        };
        if let Some(cc) = cc {
            reply = reply.header("cache-control", &cc);
        }
        if path.contains("/img/") {
            reply = reply.header("content-type", "image/png");
        }
        if path.contains("/setcookie/") {
            reply = reply.header("set-cookie", "tracker=1; Path=/");
        }
        if path.contains("/headers/") {
            reply = reply
                .header("server", "nginx/1.25")
                .header("x-powered-by", "PHP/8.3");
        }
        if path.contains("/vary/") {
            reply = reply.header("vary", "X-UA-Device");
        }
        reply
    })
    .await
}

fn header<'a>(seen: &'a Seen, name: &str) -> &'a str {
    seen.headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// What the origin received for `host`, in order.
fn seen_by(origin: &Origin, host: &str) -> Vec<Seen> {
    origin
        .seen()
        .into_iter()
        .filter(|s| header(s, "host") == host)
        .collect()
}

/// The last request the origin received for `host` and `target`.
fn last(origin: &Origin, host: &str, target: &str) -> Seen {
    seen_by(origin, host)
        .into_iter()
        .rev()
        .find(|s| s.path == target)
        .unwrap_or_else(|| panic!("the origin never saw {host}{target}"))
}

async fn send(
    d: &Daemon,
    method: Method,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> ClientReply {
    let mut all = vec![("host", host)];
    all.extend_from_slice(headers);
    request(d.addr, method, path, &all, Bytes::new())
        .await
        .unwrap_or_else(|e| panic!("{host}{path}: {e}; log:\n{}", d.log()))
}

async fn get(d: &Daemon, host: &str, path: &str, headers: &[(&str, &str)]) -> ClientReply {
    send(d, Method::GET, host, path, headers).await
}

fn text(r: &ClientReply) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// The freshness left on a hit, from its `Cache-Status` (`lacquer; hit; ttl=N`).
fn hit_ttl(r: &ClientReply) -> i64 {
    let status = r.header("cache-status");
    assert!(status.contains("hit"), "not a hit: {status}");
    status
        .split(';')
        .find_map(|p| p.trim().strip_prefix("ttl="))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no ttl in {status:?}"))
}

fn assert_ttl(r: &ClientReply, want: i64, what: &str) {
    let ttl = hit_ttl(r);
    assert!(
        (want - 2..=want).contains(&ttl),
        "{what}: ttl {ttl}, wanted {want}"
    );
}

/// A raw HTTP/1.1 request through a PROXY-protocol listener, as if from `client`; the raw response.
async fn from(addr: SocketAddr, client: &str, method: &str, host: &str, path: &str) -> String {
    from_with(addr, client, method, host, path, "").await
}

async fn from_with(
    addr: SocketAddr,
    client: &str,
    method: &str,
    host: &str,
    path: &str,
    headers: &str,
) -> String {
    lacquer_tests::raw(addr, Some(client), method, host, path, headers).await
}

/// A header's value in a raw response, by name in any case ("" when absent).
fn raw_header<'a>(raw: &'a str, name: &str) -> &'a str {
    let head = raw.split("\r\n\r\n").next().unwrap_or("");
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map_or("", |(_, v)| v.trim())
}

/// Runs every recipe, then fails naming the ones that failed (their assertion is in the output above).
macro_rules! recipes {
    ($env:expr; $($recipe:ident),+ $(,)?) => {{
        let mut failed: Vec<&str> = Vec::new();
        $(
            if AssertUnwindSafe($recipe($env)).catch_unwind().await.is_err() {
                failed.push(stringify!($recipe));
            }
        )+
        assert!(failed.is_empty(), "recipes failed: {failed:?}\nlog:\n{}", $env.d.log());
    }};
}

/// One daemon in front of the scripted origin, with a plain listener, a PROXY-protocol one (for client
/// addresses) and a TLS one (for `${scheme}`).
struct Env {
    origin: Origin,
    d: Daemon,
    /// The PROXY-protocol listener.
    proxied: SocketAddr,
    /// The TLS listener, and a client that trusts it.
    tls: Option<(SocketAddr, Arc<rustls::ClientConfig>)>,
    /// Where the error pages and the certificate are, kept while the daemon may read them again.
    _pages: tempfile::TempDir,
}

const PAGE_403: &str = "<h1>403: not here</h1>\n";
const PAGE_500: &str = "<h1>500: the origin failed</h1>\n";
const PAGE_503: &str = "<h1>503: no backend answered</h1>\n";

async fn env(rules: &str, with_tls: bool) -> Env {
    let origin = scripted().await;
    let pages = tempfile::tempdir().unwrap();
    for (name, body) in [
        ("403.html", PAGE_403),
        ("500.html", PAGE_500),
        ("503.html", PAGE_503),
    ] {
        std::fs::write(pages.path().join(name), body).unwrap();
    }
    let ca = TestCa::new();
    let tls_listener = if with_tls {
        let (cert, key) = ca.issue(pages.path(), "site", &["r9.test"]);
        format!("[[listen]]\naddress = \"127.0.0.1:0\"\ntls = [{{ cert = \"{cert}\", key = \"{key}\" }}]\n")
    } else {
        String::new()
    };
    let config = format!(
        "[[listen]]\naddress = \"127.0.0.1:0\"\n\
         [[listen]]\naddress = \"127.0.0.1:0\"\nproxy_protocol = true\n\
         {tls_listener}\
         [[backend]]\nname = \"origin\"\naddress = \"{}\"\n\
         [[backend]]\nname = \"down\"\naddress = \"{}\"\n",
        origin.addr,
        unused_addr()
    ) + &rules.replace("{pages}", &pages.path().display().to_string());
    let d = Daemon::with_config_only(&config);
    let proxied = d.listeners[1];
    let tls = with_tls.then(|| (d.listeners[2], ca.client(&["http/1.1"])));
    Env {
        origin,
        d,
        proxied,
        tls,
        _pages: pages,
    }
}

const REQUEST_RULES: &str = r#"
[[rule]]
name = "host"
match = { hosts = ["r1.test"] }
normalize_host = true

[[rule]]
name = "request-headers"
match = { hosts = ["r2.test"] }
unset_headers = ["proxy", "x-debug-*"]

[[rule]]
name = "query"
match = { hosts = ["r3.test"] }
query = { sort = true, drop = ["utm_*", "gclid", "fbclid"] }

[[rule]]
name = "cookies-cached"
match = { hosts = ["r4.test"] }
cache_cookies = true

[[rule]]
name = "admin"
match = { hosts = ["r4.test"], path_prefix = ["/admin/"] }
pass = true

[[rule]]
name = "authorized"
match = { hosts = ["r4.test"], headers = { authorization = "" } }
pass = true

[[rule]]
name = "logged-in"
match = { hosts = ["r4.test"], cookies = ["SESS*"] }
pass = true

[[rule]]
name = "tracking-cookies"
match = { hosts = ["r6.test"] }
cookies = { drop = ["_ga*", "_gid"] }

[[rule]]
name = "session-only"
match = { hosts = ["r6k.test"] }
cookies = { keep = ["sessionid"] }

[[rule]]
name = "static"
match = { hosts = ["r7.test"], extensions = ["css", "js"] }
strip_cookies = true

[[rule]]
name = "language-cookie"
match = { hosts = ["r8.test"] }
cookies = { keep = ["lang"] }
cache_cookies = true
key = ["cookie"]

[[rule]]
name = "api-version"
match = { hosts = ["r8.test"], path_prefix = ["/api/"] }
buckets = [{ from = "x-api-version", cases = [["2", "^2(\\.|$)"]], default = "1" }]
key = ["x-api-version"]

[[rule]]
name = "scheme"
match = { hosts = ["r9.test"] }
set_headers = { "x-forwarded-proto" = "${scheme}" }
key = ["x-forwarded-proto"]

[[rule]]
name = "client-address"
match = { hosts = ["r10.test"] }
unset_headers = ["x-forwarded-for"]
set_headers = { "x-real-ip" = "${client_ip}" }

[[rule]]
name = "buckets"
match = { hosts = ["r20.test"] }
buckets = [
  { from = "accept-language", cases = [["fr", "^fr"], ["de", "^de"]], default = "en" },
  { from = "user-agent", to = "x-ua-device", cases = [["tablet", "(?i)ipad|tablet"], ["mobile", "(?i)mobile|android|iphone"]], default = "desktop" },
]
key = ["accept-language", "x-ua-device"]

[[rule]]
name = "aliases"
match = { hosts = ["www.r24.test", "r24.example"] }
set_headers = { host = "r24.test" }

[[rule]]
name = "device-class"
match = { hosts = ["poison.test"] }
buckets = [{ from = "user-agent", to = "x-ua-device", cases = [["mobile", "(?i)mobile"]], default = "desktop" }]

[[rule]]
name = "tenant"
match = { hosts = ["poison.test"], path_prefix = ["/tenant/"] }
key = ["x-tenant"]
"#;

#[tokio::test(flavor = "multi_thread")]
async fn request_phase_recipes() {
    let env = env(REQUEST_RULES, true).await;
    recipes!(&env;
        r01_host_without_port_lower_case,
        r02_request_headers_unset_by_name_and_pattern,
        r03_query_sorted_tracking_dropped,
        r04_pass_by_path_authorization_and_cookie,
        r06_tracking_cookies_dropped_and_an_allow_list,
        r07_static_files_without_cookies,
        r08_a_cookie_and_a_normalised_header_in_the_key,
        r09_the_scheme_in_the_key,
        r10_x_forwarded_for_and_x_real_ip,
        r20_languages_and_devices_bucketed_for_vary,
        r24_aliases_share_objects,
        poisoning_a_rewritten_header_selects_the_variant,
        poisoning_a_key_field_keeps_clients_apart,
    );
}

async fn r01_host_without_port_lower_case(env: &Env) {
    let (d, o) = (&env.d, &env.origin);
    let first = get(d, "R1.Test:8080", "/h", &[]).await;
    assert_eq!(first.x_cache(), "MISS");
    assert_eq!(
        last(o, "r1.test", "/h").path,
        "/h",
        "the origin got the bare host"
    );
    let second = get(d, "r1.test", "/h", &[]).await;
    assert_eq!((second.x_cache(), text(&second)), ("HIT", text(&first)));
    // Without the rule, a port other than the default is kept, in the key and for the origin.
    get(d, "other.test:8080", "/h", &[]).await;
    assert_eq!(seen_by(o, "other.test:8080").len(), 1);
}

async fn r02_request_headers_unset_by_name_and_pattern(env: &Env) {
    let headers = [
        ("proxy", "http://evil.example:3128"),
        ("x-debug-token", "t"),
        ("x-debug-user", "u"),
        ("x-debugger", "kept: the pattern is x-debug-*"),
    ];
    assert_eq!(get(&env.d, "r2.test", "/u", &headers).await.status, 200);
    let seen = last(&env.origin, "r2.test", "/u");
    for gone in ["proxy", "x-debug-token", "x-debug-user"] {
        assert_eq!(header(&seen, gone), "", "{gone} reached the origin");
    }
    assert_eq!(
        header(&seen, "x-debugger"),
        "kept: the pattern is x-debug-*"
    );
}

async fn r03_query_sorted_tracking_dropped(env: &Env) {
    let (d, o) = (&env.d, &env.origin);
    let first = get(
        d,
        "r3.test",
        "/q?b=2&utm_source=news&a=1&gclid=x&fbclid=y",
        &[],
    )
    .await;
    assert_eq!(first.status, 200);
    last(o, "r3.test", "/q?a=1&b=2");
    let again = get(d, "r3.test", "/q?a=1&utm_medium=mail&b=2", &[]).await;
    assert_eq!((again.x_cache(), text(&again)), ("HIT", text(&first)));
    get(d, "r3.test", "/e?", &[]).await;
    last(o, "r3.test", "/e");
    // A fragment is never part of what the origin gets or the key is made of.
    let raw = from(
        env.proxied,
        "203.0.113.1",
        "GET",
        "r3.test",
        "/f?z=1&a=2#top",
    )
    .await;
    assert_eq!(raw_status(&raw), 200, "{raw}");
    last(o, "r3.test", "/f?a=2&z=1");
    assert!(seen_by(o, "r3.test").iter().all(|s| !s.path.contains('#')));
}

async fn r04_pass_by_path_authorization_and_cookie(env: &Env) {
    let (d, o) = (&env.d, &env.origin);
    for _ in 0..2 {
        assert_eq!(get(d, "r4.test", "/admin/x", &[]).await.x_cache(), "PASS");
    }
    assert_eq!(o.count("/admin/x"), 2);
    // A public answer to an authorized request is not stored for others either.
    let auth = [("authorization", "Bearer t")];
    get(d, "r4.test", "/public/p", &auth).await;
    get(d, "r4.test", "/public/p", &auth).await;
    let after = get(d, "r4.test", "/public/p", &[]).await;
    assert_eq!(after.x_cache(), "MISS");
    assert_eq!(o.count("/public/p"), 3);
    for _ in 0..2 {
        get(d, "r4.test", "/c", &[("cookie", "SESSabc=1")]).await;
    }
    assert_eq!(o.count("/c"), 2, "a session cookie passes");
    let a = get(d, "r4.test", "/c2", &[("cookie", "theme=dark")]).await;
    let b = get(d, "r4.test", "/c2", &[("cookie", "theme=dark")]).await;
    assert_eq!(
        (b.x_cache(), text(&b)),
        ("HIT", text(&a)),
        "other cookies are cached"
    );
    // Methods other than GET and HEAD always reach the origin.
    for _ in 0..2 {
        send(d, Method::POST, "r4.test", "/m", &[]).await;
    }
    assert_eq!(o.count("/m"), 2);
}

async fn r06_tracking_cookies_dropped_and_an_allow_list(env: &Env) {
    let (d, o) = (&env.d, &env.origin);
    let r = get(
        d,
        "r6.test",
        "/c",
        &[("cookie", "_ga=GA1.2; sessionid=s1; _gid=x")],
    )
    .await;
    assert_eq!(r.x_cache(), "PASS", "sessionid is left: the request passes");
    assert_eq!(header(&last(o, "r6.test", "/c"), "cookie"), "sessionid=s1");
    let first = get(d, "r6.test", "/t", &[("cookie", "_ga=GA1.2; _gid=x")]).await;
    assert_eq!(
        header(&last(o, "r6.test", "/t"), "cookie"),
        "",
        "nothing left, no Cookie"
    );
    let second = get(d, "r6.test", "/t", &[("cookie", "_ga=GA1.9")]).await;
    assert_eq!((second.x_cache(), text(&second)), ("HIT", text(&first)));
    get(
        d,
        "r6k.test",
        "/k",
        &[("cookie", "a=1; sessionid=s2; _ga=3")],
    )
    .await;
    assert_eq!(header(&last(o, "r6k.test", "/k"), "cookie"), "sessionid=s2");
}

async fn r07_static_files_without_cookies(env: &Env) {
    let (d, o) = (&env.d, &env.origin);
    let first = get(
        d,
        "r7.test",
        "/setcookie/site.css",
        &[("cookie", "sessionid=s")],
    )
    .await;
    assert_eq!(
        header(&last(o, "r7.test", "/setcookie/site.css"), "cookie"),
        ""
    );
    assert_eq!(first.header("set-cookie"), "", "Set-Cookie removed");
    let second = get(
        d,
        "r7.test",
        "/setcookie/site.css",
        &[("cookie", "other=1")],
    )
    .await;
    assert_eq!((second.x_cache(), text(&second)), ("HIT", text(&first)));
    assert_eq!(second.header("set-cookie"), "");
    let page = get(
        d,
        "r7.test",
        "/setcookie/page.html",
        &[("cookie", "sessionid=s")],
    )
    .await;
    assert_eq!(page.x_cache(), "PASS");
    assert_eq!(
        header(&last(o, "r7.test", "/setcookie/page.html"), "cookie"),
        "sessionid=s"
    );
}

async fn r08_a_cookie_and_a_normalised_header_in_the_key(env: &Env) {
    let (d, o) = (&env.d, &env.origin);
    let fr = get(d, "r8.test", "/p", &[("cookie", "lang=fr; _ga=1")]).await;
    assert_eq!(fr.x_cache(), "MISS");
    assert_eq!(header(&last(o, "r8.test", "/p"), "cookie"), "lang=fr");
    let de = get(d, "r8.test", "/p", &[("cookie", "lang=de")]).await;
    assert_eq!(de.x_cache(), "MISS", "another cookie value, another object");
    assert_eq!(header(&last(o, "r8.test", "/p"), "cookie"), "lang=de");
    let none = get(d, "r8.test", "/p", &[]).await;
    assert_eq!(none.x_cache(), "MISS");
    let fr_again = get(d, "r8.test", "/p", &[("cookie", "x=1; lang=fr")]).await;
    assert_eq!((fr_again.x_cache(), text(&fr_again)), ("HIT", text(&fr)));
    assert_eq!(o.count("/p"), 3);

    let v2 = get(d, "r8.test", "/api/v", &[("x-api-version", "2.1")]).await;
    assert_eq!(header(&last(o, "r8.test", "/api/v"), "x-api-version"), "2");
    let v2b = get(d, "r8.test", "/api/v", &[("x-api-version", "2")]).await;
    assert_eq!((v2b.x_cache(), text(&v2b)), ("HIT", text(&v2)));
    let v1 = get(d, "r8.test", "/api/v", &[("x-api-version", "3")]).await;
    assert_eq!(v1.x_cache(), "MISS");
    assert_eq!(header(&last(o, "r8.test", "/api/v"), "x-api-version"), "1");
    let v1b = get(d, "r8.test", "/api/v", &[]).await;
    assert_eq!((v1b.x_cache(), text(&v1b)), ("HIT", text(&v1)));
}

async fn r09_the_scheme_in_the_key(env: &Env) {
    let (d, o) = (&env.d, &env.origin);
    let plain = get(d, "r9.test", "/s", &[("x-forwarded-proto", "https")]).await;
    assert_eq!(
        header(&last(o, "r9.test", "/s"), "x-forwarded-proto"),
        "http",
        "a client's claim is replaced by the connection's scheme"
    );
    let (addr, client) = env.tls.clone().expect("a TLS listener");
    let conn = tls::connect(addr, "r9.test", client).await.unwrap();
    let secure = tls::h1_request(conn, Method::GET, "r9.test", "/s", &[])
        .await
        .unwrap();
    assert_eq!(secure.x_cache(), "MISS", "https is another object");
    assert_ne!(text(&secure), text(&plain));
    assert_eq!(
        header(&last(o, "r9.test", "/s"), "x-forwarded-proto"),
        "https"
    );
    let again = get(d, "r9.test", "/s", &[]).await;
    assert_eq!((again.x_cache(), text(&again)), ("HIT", text(&plain)));
}

async fn r10_x_forwarded_for_and_x_real_ip(env: &Env) {
    let o = &env.origin;
    let raw = from_with(
        env.proxied,
        "198.51.100.7",
        "GET",
        "r10.test",
        "/ip",
        "X-Forwarded-For: 203.0.113.66\r\n",
    )
    .await;
    assert_eq!(raw_status(&raw), 200, "{raw}");
    let seen = last(o, "r10.test", "/ip");
    assert_eq!(header(&seen, "x-real-ip"), "198.51.100.7");
    assert_eq!(
        header(&seen, "x-forwarded-for"),
        "198.51.100.7",
        "the claim dropped"
    );
    // Without the rule, lacquerd appends the client to the chain it was sent.
    let raw = from_with(
        env.proxied,
        "198.51.100.7",
        "GET",
        "other.test",
        "/ip",
        "X-Forwarded-For: 203.0.113.66\r\n",
    )
    .await;
    assert_eq!(raw_status(&raw), 200, "{raw}");
    let seen = last(o, "other.test", "/ip");
    assert_eq!(
        header(&seen, "x-forwarded-for"),
        "203.0.113.66, 198.51.100.7"
    );
    assert_eq!(header(&seen, "x-real-ip"), "");
}

async fn r20_languages_and_devices_bucketed_for_vary(env: &Env) {
    let (d, o) = (&env.d, &env.origin);
    let iphone = "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0) Mobile/15E148";
    let fr_mobile = get(
        d,
        "r20.test",
        "/l",
        &[
            ("accept-language", "fr-CA,fr;q=0.9"),
            ("user-agent", iphone),
        ],
    )
    .await;
    let seen = last(o, "r20.test", "/l");
    assert_eq!(
        (
            header(&seen, "accept-language"),
            header(&seen, "x-ua-device")
        ),
        ("fr", "mobile")
    );
    let same = get(
        d,
        "r20.test",
        "/l",
        &[
            ("accept-language", "fr-FR"),
            ("user-agent", "Mozilla/5.0 (Linux; Android 14) Mobile"),
        ],
    )
    .await;
    assert_eq!((same.x_cache(), text(&same)), ("HIT", text(&fr_mobile)));
    let de_desktop = get(
        d,
        "r20.test",
        "/l",
        &[
            ("accept-language", "de"),
            ("user-agent", "Mozilla/5.0 (X11; Linux)"),
        ],
    )
    .await;
    assert_eq!(de_desktop.x_cache(), "MISS");
    let seen = last(o, "r20.test", "/l");
    assert_eq!(
        (
            header(&seen, "accept-language"),
            header(&seen, "x-ua-device")
        ),
        ("de", "desktop")
    );
    let en_tablet = get(d, "r20.test", "/l", &[("user-agent", "iPad")]).await;
    assert_eq!(en_tablet.x_cache(), "MISS");
    assert_eq!(header(&last(o, "r20.test", "/l"), "accept-language"), "en");
    assert_eq!(o.count("/l"), 3);
}

async fn r24_aliases_share_objects(env: &Env) {
    let (d, o) = (&env.d, &env.origin);
    let www = get(d, "www.r24.test", "/a", &[]).await;
    assert_eq!(www.x_cache(), "MISS");
    assert_eq!(
        seen_by(o, "www.r24.test").len(),
        0,
        "the origin got the canonical host"
    );
    last(o, "r24.test", "/a");
    for alias in ["r24.test", "r24.example", "WWW.r24.test"] {
        let r = get(d, alias, "/a", &[]).await;
        assert_eq!((r.x_cache(), text(&r)), ("HIT", text(&www)), "{alias}");
    }
    assert_eq!(o.count("/a"), 1);
}

/// A rule that rewrites a header the response varies on: the variant is chosen by the value the origin
/// received, so what a client sends of its own never selects (or fills) another class's object.
async fn poisoning_a_rewritten_header_selects_the_variant(env: &Env) {
    let (d, o) = (&env.d, &env.origin);
    let path = "/vary/echo/x-ua-device";
    let mobile = get(d, "poison.test", path, &[("user-agent", "Phone Mobile")]).await;
    assert_eq!(text(&mobile), "mobile");
    // A desktop browser claiming to be the mobile class: the rule overwrites the claim.
    let forged = get(
        d,
        "poison.test",
        path,
        &[("user-agent", "Desktop"), ("x-ua-device", "mobile")],
    )
    .await;
    assert_eq!(text(&forged), "desktop", "{:?}", forged.headers);
    assert_eq!(
        header(&last(o, "poison.test", path), "x-ua-device"),
        "desktop"
    );
    let desktop = get(d, "poison.test", path, &[("user-agent", "Desktop")]).await;
    assert_eq!(
        (desktop.x_cache(), text(&desktop)),
        ("HIT", "desktop".into())
    );
    let mobile_again = get(
        d,
        "poison.test",
        path,
        &[("user-agent", "Phone Mobile"), ("x-ua-device", "desktop")],
    )
    .await;
    assert_eq!(
        (mobile_again.x_cache(), text(&mobile_again)),
        ("HIT", "mobile".into())
    );
    assert_eq!(o.count(path), 2);
}

/// A `key` field the origin does not name in `Vary`: each value (and its absence) is an object of its
/// own, filled with what the origin received for that value.
async fn poisoning_a_key_field_keeps_clients_apart(env: &Env) {
    let (d, o) = (&env.d, &env.origin);
    let path = "/tenant/echo/x-tenant";
    let a = get(d, "poison.test", path, &[("x-tenant", "a")]).await;
    assert_eq!(text(&a), "a");
    let b = get(d, "poison.test", path, &[("x-tenant", "b")]).await;
    assert_eq!((b.x_cache(), text(&b)), ("MISS", "b".into()));
    let none = get(d, "poison.test", path, &[]).await;
    assert_eq!((none.x_cache(), text(&none)), ("MISS", "-".into()));
    let a_again = get(d, "poison.test", path, &[("x-tenant", "a")]).await;
    assert_eq!((a_again.x_cache(), text(&a_again)), ("HIT", "a".into()));
    assert_eq!(o.count(path), 3);
}

const RESPONSE_RULES: &str = r#"
[purge]
http_methods = true
allow_from = ["127.0.0.1/32", "10.0.0.0/8"]

[[route]]
host = "r17down.test"
backend = "down"

[[route]]
host = "r22.test"
rate_limit = { requests = 1, per = "10s", burst = 2 }

[[rule]]
name = "news"
on = "backend_response"
match = { hosts = ["r11.test"], path_prefix = ["/news/"] }
ttl = "5m"

[[rule]]
name = "static-ttl"
on = "backend_response"
match = { hosts = ["r11.test"], extensions = ["css"] }
ttl = "7d"

[[rule]]
name = "images"
on = "backend_response"
match = { hosts = ["r11.test"], content_types = ["image/*"] }
ttl = "2h"

[[rule]]
name = "redirects"
on = "backend_response"
match = { hosts = ["r11.test"], status = [301] }
ttl = "1h"

[[rule]]
name = "bounds"
on = "backend_response"
match = { hosts = ["r11.test"] }
default_ttl = "2m"
ttl_min = "30s"
ttl_max = "1d"

[[rule]]
name = "api"
on = "backend_response"
match = { hosts = ["r11.test"], path_prefix = ["/api/"] }
set_headers = { "cache-control" = "max-age=300" }

[[rule]]
name = "not-found"
on = "backend_response"
match = { hosts = ["r12.test"], status = [404] }
ttl = "15s"

[[rule]]
name = "server-errors"
on = "backend_response"
match = { hosts = ["r12.test"], status = ["5xx"] }
store = false

[[rule]]
name = "server-errors-briefly"
on = "backend_response"
match = { hosts = ["r12b.test"], status = ["5xx"] }
ttl = "1s"

[[rule]]
name = "articles-in-cache"
on = "backend_response"
match = { hosts = ["r13.test"], path_prefix = ["/articles/"] }
ttl = "1h"

[[rule]]
name = "articles-in-browsers"
on = "deliver"
match = { hosts = ["r13.test"], path_prefix = ["/articles/"] }
set_headers = { "cache-control" = "public, max-age=60" }
unset_headers = ["age"]

[[rule]]
name = "large"
on = "backend_response"
match = { hosts = ["r15.test"], larger_than = "16KiB" }
store = false

[[rule]]
name = "downloads"
on = "backend_response"
match = { hosts = ["r15.test"], path_prefix = ["/downloads/"] }
store = false

[[rule]]
name = "moved"
match = { hosts = ["old.r16.test"], path_regex = "^/(.*)$" }
respond = { status = 301, location = "https://new.r16.test/$1" }

[[rule]]
name = "robots"
match = { hosts = ["r16.test"], path_regex = "^/robots\\.txt$" }
respond = { body = "User-agent: *\nDisallow: /private/\n" }

[[rule]]
name = "private"
match = { hosts = ["r16.test"], path_prefix = ["/private/"] }
respond = { status = 403, file = "{pages}/403.html" }

[[rule]]
name = "no-backend"
on = "error"
match = { hosts = ["r17down.test"], status = [502, 503, 504] }
respond = { file = "{pages}/503.html" }

[[rule]]
name = "origin-500"
on = "deliver"
match = { hosts = ["r17.test"], status = [500] }
respond = { file = "{pages}/500.html" }

[[rule]]
name = "served-by"
on = "deliver"
match = { hosts = ["r18.test"] }
set_headers = { "x-served-by" = "cache-1" }
unset_headers = ["server", "x-powered-by"]

[[rule]]
name = "debug-on-request"
on = "deliver"
match = { hosts = ["r18.test"], headers = { "x-debug" = "" } }
debug_headers = true

[[rule]]
name = "debug-for-admins"
on = "deliver"
match = { hosts = ["r18.test"], clients = ["10.0.0.0/8"] }
debug_headers = true

[[rule]]
name = "scanners"
match = { hosts = ["r21.test"], headers = { "user-agent" = "(?i)sqlmap|nikto|masscan" } }
respond = { status = 403, body = "Forbidden\n" }

[[rule]]
name = "blocked-networks"
match = { hosts = ["r21.test"], clients = ["198.51.100.0/24"] }
respond = { status = 403, body = "Forbidden\n" }

[[rule]]
name = "purge-acl"
match = { hosts = ["r23.test"], methods = ["PURGE", "BAN"], except_clients = ["127.0.0.1/32", "10.0.0.0/8"] }
respond = { status = 403, body = "Not allowed\n" }
"#;

#[tokio::test(flavor = "multi_thread")]
async fn response_phase_and_synthetic_recipes() {
    let env = env(RESPONSE_RULES, false).await;
    recipes!(&env;
        r11_ttl_by_path_extension_type_and_status_with_bounds,
        r12_negative_caching,
        r13_browsers_get_another_cache_control,
        r15_large_files_streamed_not_stored,
        r16_redirects_robots_and_a_403_page,
        r17_error_pages,
        r18_response_headers_and_debug_headers,
        r21_deny_by_user_agent_and_network,
        r22_rate_limits_per_route,
        r23_purge_and_ban_acl,
    );
}

/// Fetches `path` twice: the second must be a hit; returns it.
async fn stored(env: &Env, host: &str, path: &str) -> ClientReply {
    let first = get(&env.d, host, path, &[]).await;
    let second = get(&env.d, host, path, &[]).await;
    assert_eq!(
        (second.x_cache(), text(&second)),
        ("HIT", text(&first)),
        "{host}{path} stored"
    );
    second
}

async fn r11_ttl_by_path_extension_type_and_status_with_bounds(env: &Env) {
    for (path, want, what) in [
        ("/news/cc/1", 300, "path: 5m whatever the origin said"),
        ("/s/site.css", 86_400, "extension: 7d, capped by ttl_max"),
        ("/img/cc/600", 7_200, "content type"),
        ("/status/301", 3_600, "status"),
        ("/nocc/x", 120, "default_ttl when the origin says nothing"),
        ("/cc/5", 30, "ttl_min floors the origin's"),
        ("/api/nostore", 300, "the origin's Cache-Control replaced"),
    ] {
        let r = stored(env, "r11.test", path).await;
        assert_ttl(&r, want, &format!("{path}: {what}"));
    }
    let api = get(&env.d, "r11.test", "/api/nostore", &[]).await;
    assert_eq!(api.header("cache-control"), "max-age=300");
    assert_eq!(env.origin.count("/api/nostore"), 1);
    assert_eq!(seen_by(&env.origin, "r11.test").len(), 7);
}

async fn r12_negative_caching(env: &Env) {
    let (d, o) = (&env.d, &env.origin);
    let r = stored(env, "r12.test", "/status/404").await;
    assert_ttl(&r, 15, "404");
    // A server error the origin marks cacheable is not stored under the rule, and is without it.
    for _ in 0..2 {
        let r = get(d, "r12.test", "/status/500/cc/60", &[]).await;
        assert_eq!((r.status.as_u16(), r.x_cache()), (500, "MISS"));
    }
    assert_eq!(seen_by(o, "r12.test").len(), 3);
    stored(env, "other.test", "/status/500/cc/60").await;
    // Or stored one second, to absorb a burst.
    stored(env, "r12b.test", "/status/503").await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    get(d, "r12b.test", "/status/503", &[]).await;
    assert_eq!(seen_by(o, "r12b.test").len(), 2);
}

async fn r13_browsers_get_another_cache_control(env: &Env) {
    let first = get(&env.d, "r13.test", "/articles/cc/5", &[]).await;
    assert_eq!(first.header("cache-control"), "public, max-age=60");
    let hit = stored(env, "r13.test", "/articles/cc/5").await;
    assert_eq!(hit.header("cache-control"), "public, max-age=60");
    assert_eq!(
        hit.header("age"),
        "",
        "Age is not counted against the browser's max-age"
    );
    assert_ttl(&hit, 3_600, "the cache keeps its own TTL");
    assert_eq!(seen_by(&env.origin, "r13.test").len(), 1);
}

async fn r15_large_files_streamed_not_stored(env: &Env) {
    let (d, o) = (&env.d, &env.origin);
    for _ in 0..2 {
        let r = get(d, "r15.test", "/big", &[]).await;
        assert_eq!((r.status.as_u16(), r.body.len()), (200, 20_000));
        assert_eq!(r.x_cache(), "MISS");
    }
    assert_eq!(o.count("/big"), 2);
    stored(env, "r15.test", "/small").await;
    for _ in 0..2 {
        get(d, "r15.test", "/downloads/f", &[]).await;
    }
    assert_eq!(o.count("/downloads/f"), 2);
    // The same large body on another host is stored.
    stored(env, "other.test", "/big").await;
}

async fn r16_redirects_robots_and_a_403_page(env: &Env) {
    let d = &env.d;
    let r = get(d, "old.r16.test", "/a/b?c=1", &[]).await;
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), "https://new.r16.test/a/b?c=1");
    let robots = get(d, "r16.test", "/robots.txt", &[]).await;
    assert_eq!(robots.status, 200);
    assert_eq!(text(&robots), "User-agent: *\nDisallow: /private/\n");
    assert_eq!(robots.header("content-type"), "text/plain; charset=utf-8");
    let private = get(d, "r16.test", "/private/x", &[]).await;
    assert_eq!(private.status, 403);
    assert_eq!(text(&private), PAGE_403);
    assert_eq!(private.header("content-type"), "text/html; charset=utf-8");
    assert!(seen_by(&env.origin, "old.r16.test").is_empty());
    assert!(seen_by(&env.origin, "r16.test").is_empty());
    // Not matched: to the origin.
    assert_eq!(get(d, "r16.test", "/public/x", &[]).await.status, 200);
    assert_eq!(seen_by(&env.origin, "r16.test").len(), 1);
}

async fn r17_error_pages(env: &Env) {
    let d = &env.d;
    let r = get(d, "r17down.test", "/x", &[]).await;
    assert!((502..=504).contains(&r.status.as_u16()), "{}", r.status);
    assert_eq!(text(&r), PAGE_503);
    assert_eq!(r.header("content-type"), "text/html; charset=utf-8");
    let r = get(d, "r17.test", "/status/500", &[]).await;
    assert_eq!(r.status, 500);
    assert_eq!(text(&r), PAGE_500);
    assert_eq!(
        seen_by(&env.origin, "r17.test").len(),
        1,
        "the origin answered"
    );
    // Other statuses are delivered as the origin sent them.
    let r = get(d, "r17.test", "/status/404", &[]).await;
    assert_eq!(r.status, 404);
    assert!(
        text(&r).parse::<usize>().is_ok(),
        "the origin's body: {}",
        text(&r)
    );
}

async fn r18_response_headers_and_debug_headers(env: &Env) {
    let d = &env.d;
    let first = get(d, "r18.test", "/headers/a", &[]).await;
    assert_eq!(first.header("server"), "");
    assert_eq!(first.header("x-powered-by"), "");
    assert_eq!(first.header("x-served-by"), "cache-1");
    assert_eq!(
        first.header("x-cache-hits"),
        "",
        "debug headers only on request"
    );
    let hit = get(d, "r18.test", "/headers/a", &[("x-debug", "1")]).await;
    assert_eq!(hit.x_cache(), "HIT");
    assert_eq!(hit.header("x-cache-hits"), "1");
    let ttl: i64 = hit.header("x-cache-ttl").parse().unwrap();
    assert!((58..=60).contains(&ttl), "{ttl}");
    assert_eq!(hit.header("server"), "", "nor on a hit");
    let admin = from(env.proxied, "10.1.2.3", "GET", "r18.test", "/headers/a").await;
    assert_eq!(raw_header(&admin, "x-cache-hits"), "2", "{admin}");
    let stranger = from(env.proxied, "198.51.100.7", "GET", "r18.test", "/headers/a").await;
    assert_eq!(raw_header(&stranger, "x-cache-hits"), "", "{stranger}");
    assert_eq!(raw_header(&stranger, "x-served-by"), "cache-1");
    // Other hosts keep the origin's headers.
    let other = get(d, "other.test", "/headers/a", &[]).await;
    assert_eq!(other.header("x-powered-by"), "PHP/8.3");
}

async fn r21_deny_by_user_agent_and_network(env: &Env) {
    let d = &env.d;
    let r = get(d, "r21.test", "/", &[("user-agent", "sqlmap/1.7")]).await;
    assert_eq!((r.status.as_u16(), text(&r).as_str()), (403, "Forbidden\n"));
    let raw = from(env.proxied, "198.51.100.7", "GET", "r21.test", "/").await;
    assert_eq!(raw_status(&raw), 403, "{raw}");
    assert!(seen_by(&env.origin, "r21.test").is_empty());
    let raw = from(env.proxied, "203.0.113.1", "GET", "r21.test", "/").await;
    assert_eq!(raw_status(&raw), 200, "{raw}");
    assert_eq!(seen_by(&env.origin, "r21.test").len(), 1);
}

async fn r22_rate_limits_per_route(env: &Env) {
    let d = &env.d;
    for _ in 0..2 {
        assert_eq!(get(d, "r22.test", "/search", &[]).await.status, 200);
    }
    let limited = get(d, "r22.test", "/search", &[]).await;
    assert_eq!(limited.status, 429);
    assert!(!limited.header("retry-after").is_empty());
    assert_eq!(get(d, "other.test", "/search", &[]).await.status, 200);
}

async fn r23_purge_and_ban_acl(env: &Env) {
    let (d, o) = (&env.d, &env.origin);
    stored(env, "r23.test", "/p").await;
    let refused = from(env.proxied, "198.51.100.7", "PURGE", "r23.test", "/p").await;
    assert_eq!(raw_status(&refused), 403, "{refused}");
    assert!(refused.ends_with("Not allowed\n"), "{refused}");
    assert_eq!(get(d, "r23.test", "/p", &[]).await.x_cache(), "HIT");
    // On a host without the rule, the built-in allow-list answers 405.
    let refused = from(env.proxied, "198.51.100.7", "PURGE", "other.test", "/p").await;
    assert_eq!(raw_status(&refused), 405, "{refused}");
    let purged = from(env.proxied, "10.0.0.5", "PURGE", "r23.test", "/p").await;
    assert_eq!(raw_status(&purged), 200, "{purged}");
    assert_eq!(get(d, "r23.test", "/p", &[]).await.x_cache(), "MISS");
    assert_eq!(seen_by(o, "r23.test").len(), 2);
}

/// Recipe 14: grace per route, and a stale object served at once only a little past its TTL while the
/// backend is healthy, but for the whole grace while it is sick.
#[tokio::test(flavor = "multi_thread")]
async fn r14_grace_and_stale_only_while_the_backend_is_sick() {
    let up = Arc::new(AtomicBool::new(true));
    let serial = Arc::new(AtomicUsize::new(0));
    let (health, count) = (up.clone(), serial.clone());
    let origin = Origin::start(move |seen| {
        if seen.path == "/health" {
            return match health.load(SeqCst) {
                true => Reply::ok("ok"),
                false => Reply::ok("down").status(503),
            };
        }
        let n = count.fetch_add(1, SeqCst) + 1;
        // As Magento sends its pages: `s-maxage`, which alone forbids serving stale (RFC 9111).
        let cc = match seen.path.ends_with("/magento") {
            true => "public, max-age=1, s-maxage=1",
            false => "max-age=1",
        };
        Reply::ok(n.to_string()).header("cache-control", cc)
    })
    .await;
    let d = Daemon::with_config_only(&format!(
        r#"
[[listen]]
address = "127.0.0.1:0"

[[backend]]
name = "app"
address = "{}"
[backend.probe]
url = "/health"
interval = "100ms"
timeout = "1s"
window = 3
threshold = 2

[[rule]]
name = "catalog-grace"
on = "backend_response"
match = {{ path_prefix = ["/catalog/"] }}
grace = "6h"

[[rule]]
name = "grace-when-healthy"
match = {{ backend_healthy = true }}
request_grace = "2s"
"#,
        origin.addr
    ));
    let at = |path: &'static str| {
        let d = &d;
        async move { get(d, "t", path, &[]).await }
    };
    wait_for_health(&d, "app", "healthy").await;
    let first = at("/catalog/x").await;
    assert_eq!((first.x_cache(), text(&first).as_str()), ("MISS", "1"));
    let magento = text(&at("/catalog/magento").await);
    assert_eq!(at("/other/magento").await.x_cache(), "MISS");
    assert_eq!(serial.load(SeqCst), 3);
    // Half a second stale: within the request's grace, answered at once and refreshed behind it.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let stale = at("/catalog/x").await;
    assert_eq!((stale.x_cache(), text(&stale).as_str()), ("STALE", "1"));
    wait_until("the refresh", || origin.count("/catalog/x") == 2).await;
    // Well past the request's grace while the backend is healthy: the client waits for the origin.
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    let fresh = at("/catalog/x").await;
    assert_eq!((fresh.x_cache(), text(&fresh).as_str()), ("MISS", "5"));
    // Sick: the whole grace is served, and the origin gets nothing.
    up.store(false, SeqCst);
    wait_for_health(&d, "app", "sick").await;
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let r = at("/catalog/x").await;
    assert_eq!(
        (r.x_cache(), text(&r).as_str()),
        ("STALE", "5"),
        "{:?}",
        r.headers
    );
    assert_eq!(origin.count("/catalog/x"), 3);
    // The rule's grace holds under `s-maxage`, as Varnish's does; without a rule it stays RFC-strict:
    // the built-in 503, which says when to try again.
    let r = at("/catalog/magento").await;
    assert_eq!(
        (r.x_cache(), text(&r)),
        ("STALE", magento),
        "{:?}",
        r.headers
    );
    let r = at("/other/magento").await;
    assert_eq!(
        (r.status, r.header("retry-after")),
        (http::StatusCode::SERVICE_UNAVAILABLE, "5")
    );
}

async fn wait_until(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_for_health(d: &Daemon, name: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = d.admin_get("/v1/backends", Some(&d.secret())).await;
        let list: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let health = list["backends"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == name)
            .map(|b| b["health"].clone());
        if health.as_ref().is_some_and(|h| h == want) {
            return;
        }
        assert!(Instant::now() < deadline, "{name} never {want}: {list}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Recipe 19: routes choose by host and path, rules by a header or a cookie's value; the header that
/// chose the backend is in the key, so one backend's object is never served for the other's requests.
#[tokio::test(flavor = "multi_thread")]
async fn r19_backend_selection_by_host_path_header_and_cookie() {
    let mut origins = Vec::new();
    for name in ["app", "api", "static", "beta"] {
        origins.push(
            Origin::start(move |_| Reply::ok(name).header("cache-control", "max-age=60")).await,
        );
    }
    let mut config = "[[listen]]\naddress = \"127.0.0.1:0\"\n".to_owned();
    for (name, o) in ["app", "api", "static", "beta"].iter().zip(&origins) {
        config += &format!("[[backend]]\nname = \"{name}\"\naddress = \"{}\"\n", o.addr);
    }
    config += r#"
[[route]]
host = "api.example.com"
backend = "api"

[[route]]
path_prefix = "/static/"
backend = "static"

[[rule]]
name = "beta-header"
match = { headers = { "x-beta" = "" } }
backend = "beta"
key = ["x-beta"]

[[rule]]
name = "beta-cookie"
match = { headers = { cookie = "(^|;\\s*)beta=1(;|$)" } }
backend = "beta"
"#;
    let d = Daemon::with_config_only(&config);
    let body = |r: ClientReply| text(&r);
    assert_eq!(body(get(&d, "api.example.com", "/x", &[]).await), "api");
    assert_eq!(
        body(get(&d, "www.example.com", "/static/a.css", &[]).await),
        "static"
    );
    assert_eq!(
        body(get(&d, "www.example.com", "/page", &[("x-beta", "1")]).await),
        "beta"
    );
    let plain = get(&d, "www.example.com", "/page", &[]).await;
    assert_eq!((plain.x_cache(), text(&plain).as_str()), ("MISS", "app"));
    let cookie = get(&d, "www.example.com", "/page", &[("cookie", "a=2; beta=1")]).await;
    assert_eq!(text(&cookie), "beta");
    let not_beta = get(&d, "www.example.com", "/page", &[("cookie", "beta=10")]).await;
    assert_eq!(text(&not_beta), "app");
    let counts: Vec<usize> = origins.iter().map(Origin::total).collect();
    assert_eq!(counts, [2, 1, 1, 2], "app, api, static, beta");
}

/// Recipe 5: a WebSocket upgrade tunnelled to the backend, bytes copied both ways.
#[tokio::test(flavor = "multi_thread")]
async fn r05_websocket_upgrades_are_piped() {
    // An origin that accepts one upgrade and echoes what it reads, after recording the head it got.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = listener.local_addr().unwrap();
    let (head_tx, head_rx) = tokio::sync::oneshot::channel::<String>();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            if s.read(&mut b).await.unwrap() == 0 {
                return;
            }
            head.push(b[0]);
        }
        let _ = head_tx.send(String::from_utf8_lossy(&head).into_owned());
        s.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
              Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n",
        )
        .await
        .unwrap();
        let mut buf = [0u8; 1024];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => s.write_all(&buf[..n]).await.unwrap(),
            }
        }
    });
    let d = Daemon::with_config_only(&format!(
        "[[listen]]\naddress = \"127.0.0.1:0\"\n[[backend]]\nname = \"app\"\naddress = \"{origin}\"\n\
         [[rule]]\nname = \"websocket\"\nmatch = {{ headers = {{ upgrade = \"(?i)websocket\" }} }}\npipe = true\n"
    ));
    let mut c = TcpStream::connect(d.addr).await.unwrap();
    c.write_all(
        b"GET /chat HTTP/1.1\r\nHost: ws.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    let read_head = async {
        while !got.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            assert_eq!(c.read(&mut b).await.unwrap(), 1, "closed: {got:?}");
            got.push(b[0]);
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read_head)
        .await
        .unwrap_or_else(|_| panic!("no 101; log:\n{}", d.log()));
    let head = String::from_utf8_lossy(&got).into_owned();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let seen = head_rx.await.unwrap().to_ascii_lowercase();
    assert!(seen.contains("upgrade: websocket"), "{seen}");
    assert!(
        seen.contains("sec-websocket-key: dghlihnhbxbszsbub25jzq=="),
        "{seen}"
    );
    c.write_all(b"\x81\x04ping").await.unwrap();
    let mut echo = [0u8; 6];
    tokio::time::timeout(Duration::from_secs(10), c.read_exact(&mut echo))
        .await
        .expect("the echo in time")
        .unwrap();
    assert_eq!(&echo, b"\x81\x04ping");
}

/// An origin answering `METHOD BODY #N`, with `max-age=60` unless the path says `nocc`, behind a daemon
/// with recipe 25's rule (a 1 KiB cap).
async fn graphql() -> (Origin, Daemon) {
    let serial = AtomicUsize::new(0);
    let origin = Origin::start(move |seen| {
        let n = serial.fetch_add(1, SeqCst) + 1;
        let body = format!(
            "{} {} #{n}",
            seen.method,
            String::from_utf8_lossy(&seen.body)
        );
        let reply = Reply::ok(body);
        if seen.path.contains("nocc") {
            reply
        } else {
            reply.header("cache-control", "max-age=60")
        }
    })
    .await;
    let d = Daemon::with_config_only(&format!(
        "[[listen]]\naddress = \"127.0.0.1:0\"\n[[backend]]\nname = \"app\"\naddress = \"{}\"\n\
         [[rule]]\nname = \"graphql\"\nmatch = {{ methods = [\"POST\"], path_prefix = [\"/graphql\"] }}\n\
         cache_body = \"1KiB\"\n",
        origin.addr
    ));
    (origin, d)
}

async fn post(d: &Daemon, path: &str, body: &str) -> ClientReply {
    request(
        d.addr,
        Method::POST,
        path,
        &[("host", "t"), ("content-type", "application/json")],
        Bytes::from(body.to_owned()),
    )
    .await
    .unwrap_or_else(|e| panic!("POST {path}: {e}; log:\n{}", d.log()))
}

/// Recipe 25: POSTs to /graphql cached by a digest of a bounded body; a different body is another object,
/// a larger one passes, an answer without explicit freshness is not stored.
#[tokio::test(flavor = "multi_thread")]
async fn r25_post_requests_cached_by_a_digest_of_their_body() {
    let (origin, d) = graphql().await;
    let a = post(&d, "/graphql", r#"{"query":"{a}"}"#).await;
    assert_eq!(text(&a), r#"POST {"query":"{a}"} #1"#);
    let seen = origin.seen().pop().unwrap();
    assert_eq!(
        (seen.method.as_str(), &seen.body[..]),
        ("POST", &br#"{"query":"{a}"}"#[..]),
        "the fill sends the POST and its body"
    );
    let a_again = post(&d, "/graphql", r#"{"query":"{a}"}"#).await;
    assert_eq!((a_again.x_cache(), text(&a_again)), ("HIT", text(&a)));
    let b = post(&d, "/graphql", r#"{"query":"{b}"}"#).await;
    assert_eq!(
        (b.x_cache(), text(&b)),
        ("MISS", r#"POST {"query":"{b}"} #2"#.into())
    );
    assert_eq!(origin.total(), 2);
    let large = format!(r#"{{"query":"{}"}}"#, "x".repeat(2_000));
    for _ in 0..2 {
        assert_ne!(post(&d, "/graphql", &large).await.x_cache(), "HIT");
    }
    assert_eq!(origin.total(), 4, "a body past the cap passes");
    for _ in 0..2 {
        post(&d, "/graphql/nocc", "{}").await;
    }
    assert_eq!(origin.total(), 6, "no explicit freshness, not stored");
}

/// Recipe 25's poisoning proof: the object a GET stored for the URL is never the answer to a POST keyed
/// by its body (it does not vary on the digest, so a lookup that ignores the method would take it).
#[tokio::test(flavor = "multi_thread")]
async fn r25_a_gets_object_is_never_the_answer_to_a_post() {
    let (origin, d) = graphql().await;
    let page = get(&d, "t", "/graphql", &[]).await;
    assert_eq!(text(&page), "GET  #1");
    let a = post(&d, "/graphql", r#"{"query":"{a}"}"#).await;
    assert_eq!(
        text(&a),
        r#"POST {"query":"{a}"} #2"#,
        "the POST got the GET's object"
    );
    let page_again = get(&d, "t", "/graphql", &[]).await;
    assert_eq!(
        text(&page_again),
        text(&page),
        "and the GET never gets a POST's"
    );
    assert_eq!(origin.total(), 2);
}

/// A reload whose rules do not compile keeps the rules that were running; a good one replaces them.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_with_broken_rules_keeps_the_old_ones() {
    let origin = scripted().await;
    let rule = |value: &str| {
        format!(
            "[[listen]]\naddress = \"127.0.0.1:0\"\n[[backend]]\nname = \"app\"\naddress = \"{}\"\n\
             [[rule]]\nname = \"mark\"\nset_headers = {{ \"x-rules\" = \"{value}\" }}\n",
            origin.addr
        )
    };
    let d = Daemon::with_config_only(&rule("v1"));
    get(&d, "t", "/nocc/1", &[]).await;
    assert_eq!(header(&last(&origin, "t", "/nocc/1"), "x-rules"), "v1");

    let file = d.config_file();
    let broken =
        rule("v2") + "[[rule]]\nname = \"broken\"\nmatch = { path_regex = \"(\" }\npass = true\n";
    std::fs::write(&file, broken).unwrap();
    let r = d.admin_post("/v1/reload", serde_json::json!({})).await;
    let reason = text(&r);
    assert_ne!(r.status, 200, "{reason}");
    assert!(
        reason.contains("broken") && reason.contains("match.path_regex"),
        "the error names the rule and field: {reason}"
    );
    get(&d, "t", "/nocc/2", &[]).await;
    assert_eq!(
        header(&last(&origin, "t", "/nocc/2"), "x-rules"),
        "v1",
        "the old rules still run"
    );

    std::fs::write(&file, rule("v2")).unwrap();
    let r = d.admin_post("/v1/reload", serde_json::json!({})).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    get(&d, "t", "/nocc/3", &[]).await;
    assert_eq!(header(&last(&origin, "t", "/nocc/3"), "x-rules"), "v2");
}

/// `lacquerd --check` runs the rules' examples: one that fails fails the check, naming the rule.
#[test]
fn check_fails_naming_the_rule_whose_example_fails() {
    let dir = tempfile::tempdir().unwrap();
    let config = |expected: &str| {
        format!(
            r#"
[[backend]]
name = "app"
address = "127.0.0.1:9"

[[rule]]
name = "tracking"
query = {{ sort = true, drop = ["utm_*"] }}
examples = [
  {{ request = {{ url = "http://example.com/a?z=1&utm_source=x&a=2" }}, expect = {{ target = "{expected}" }} }},
]
"#
        )
    };
    let (ok, stderr) = check(dir.path(), &config("/a?a=2&z=1"));
    assert_eq!(ok, Some(0), "{stderr}");
    let (failed, stderr) = check(dir.path(), &config("/a?z=1&a=2"));
    assert_eq!(failed, Some(2), "{stderr}");
    assert!(stderr.contains("rule[0] (\"tracking\")"), "{stderr}");
    assert!(stderr.contains("/a?a=2&z=1"), "what came out: {stderr}");
}

/// Every ```toml block of docs/rules.md passes `lacquerd --check`: its rules compile against the real
/// configuration and their examples hold.
#[test]
fn every_block_of_docs_rules_md_passes_check() {
    let doc = include_str!("../../docs/rules.md");
    let dir = tempfile::tempdir().unwrap();
    let mut blocks = 0;
    let mut lines = doc.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        if line != "```toml" {
            continue;
        }
        let block: Vec<&str> = lines
            .by_ref()
            .map(|(_, l)| l)
            .take_while(|l| *l != "```")
            .collect();
        let mut config = block.join("\n") + "\n";
        for page in ["403.html", "500.html", "503.html"] {
            let at = dir.path().join(page);
            std::fs::write(&at, "<h1>error</h1>\n").unwrap();
            config = config.replace(&format!("/etc/lacquer/{page}"), &at.display().to_string());
        }
        let secret = dir.path().join("url-secret");
        std::fs::write(&secret, "a secret of sixteen bytes or more\n").unwrap();
        config = config.replace("/etc/lacquer/url-secret", &secret.display().to_string());
        if !config.contains("[[backend]]") {
            config = format!("[[backend]]\nname = \"app\"\naddress = \"127.0.0.1:9\"\n{config}");
        }
        let (status, stderr) = check(dir.path(), &config);
        assert_eq!(
            status,
            Some(0),
            "docs/rules.md:{}: {stderr}\n{config}",
            n + 1
        );
        blocks += 1;
    }
    assert!(blocks >= 25, "{blocks} blocks");
}
