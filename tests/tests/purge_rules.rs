//! Invalidation from a request, typed (a rule's `ban` and `purge`): the purge contracts of Magento's and
//! WordPress's Varnish templates, through the real daemon, as those platforms send them.

use std::net::SocketAddr;

use lacquer_tests::{raw as send, raw_status as status, Daemon, Origin, Reply};

/// A `PURGE /` for shop.test with `headers`, from the local client.
async fn purge_shop(addr: SocketAddr, headers: &str) -> String {
    send(addr, None, "PURGE", "shop.test", "/", headers).await
}

/// Waits until the daemon has stored `n` objects: a fill is published just after its response ends.
async fn published(d: &Daemon, n: u64) {
    d.wait_for_stats("objects stored", |s| {
        s["store"]["objects_published"].as_u64() >= Some(n)
    })
    .await;
}

fn body(raw: &str) -> &str {
    raw.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

const CONFIG: &str = r#"
[purge]
allow_from = ["127.0.0.1/32"]

# Magento 2's varnish6.vcl: `ban("obj.http.X-Magento-Tags ~ " + req.http.X-Magento-Tags-Pattern)`, and the
# same for X-Pool; 400 when neither is sent.
[[rule]]
name = "magento-purge"
match = { hosts = ["shop.test"], methods = ["PURGE"] }
ban = [
  { object_header = "X-Magento-Tags", regex_from = "X-Magento-Tags-Pattern" },
  { object_header = "X-Pool", regex_from = "X-Pool" },
]

# WordPress purge plugins: the URL, or with `X-Purge-Method: regex` every URL its path matches.
[[rule]]
name = "wp-purge"
match = { hosts = ["blog.test"], methods = ["PURGE"] }
purge = "url"

[[rule]]
name = "wp-regex-purge"
match = { hosts = ["blog.test"], methods = ["PURGE"], headers = { "x-purge-method" = "^regex$" } }
ban = [{ url = true, regex_from = "path" }]
"#;

/// Pages as the platforms send them: Magento's carry `X-Magento-Tags` (and `/pool` an `X-Pool`); every
/// body is a serial number, so a page served from the cache shows the number it was stored with.
async fn platform() -> Origin {
    let serial = std::sync::atomic::AtomicUsize::new(0);
    Origin::start(move |seen| {
        let n = serial.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let tags = match seen.path.as_str() {
            "/p1" => "cat_p_1,cat_c_2",
            "/p2" => "cat_p_2",
            _ => "",
        };
        let mut reply = Reply::ok(n.to_string()).header("cache-control", "public, max-age=600");
        if !tags.is_empty() {
            reply = reply.header("x-magento-tags", tags);
        }
        if seen.path == "/pool" {
            reply = reply.header("x-pool", "pool_a");
        }
        reply
    })
    .await
}

async fn daemon(origin: &Origin) -> (Daemon, SocketAddr, SocketAddr) {
    let d = Daemon::with_config_only(&format!(
        "[[listen]]\naddress = \"127.0.0.1:0\"\n\
         [[listen]]\naddress = \"127.0.0.1:0\"\nproxy_protocol = true\n\
         [[backend]]\nname = \"origin\"\naddress = \"{}\"\n{CONFIG}",
        origin.addr
    ));
    let (plain, proxied) = (d.listeners[0], d.listeners[1]);
    (d, plain, proxied)
}

async fn cache(addr: SocketAddr, host: &str, path: &str) -> String {
    let raw = send(addr, None, "GET", host, path, "").await;
    let state = raw
        .lines()
        .find_map(|l| {
            l.strip_prefix("X-Cache: ")
                .or_else(|| l.strip_prefix("x-cache: "))
        })
        .unwrap_or("?")
        .to_owned();
    state
}

#[tokio::test(flavor = "multi_thread")]
async fn magentos_purge_bans_by_tag_pattern_and_pool_and_answers_as_its_vcl() {
    let origin = platform().await;
    let (d, plain, proxied) = daemon(&origin).await;
    for (n, path) in (1..).zip(["/p1", "/p2", "/pool"]) {
        assert_eq!(cache(plain, "shop.test", path).await, "MISS");
        published(&d, n).await;
        assert_eq!(cache(plain, "shop.test", path).await, "HIT");
    }
    // Neither field: 400, and nothing is invalidated.
    let r = purge_shop(plain, "").await;
    assert_eq!(status(&r), 400, "{r}");
    assert_eq!(
        body(&r),
        "x-magento-tags-pattern or x-pool header required\n"
    );
    // From outside the purge ACL: 405, as the template's `client.ip !~ purge`.
    let r = send(
        proxied,
        Some("198.51.100.7"),
        "PURGE",
        "shop.test",
        "/",
        "X-Magento-Tags-Pattern: .*\r\n",
    )
    .await;
    assert_eq!(status(&r), 405, "{r}");
    assert_eq!(cache(plain, "shop.test", "/p2").await, "HIT");
    // A pattern that is not a regex: 400 naming the field.
    let r = purge_shop(plain, "X-Magento-Tags-Pattern: (\r\n").await;
    assert_eq!(status(&r), 400, "{r}");
    assert!(
        body(&r).starts_with("x-magento-tags-pattern: invalid regex"),
        "{r}"
    );
    // A pattern that tries to add a condition is a pattern, and matches no tag.
    let r = purge_shop(plain, "X-Magento-Tags-Pattern: none\" && req.url ~ \".\r\n").await;
    assert_eq!(status(&r), 200, "{r}");
    assert_eq!(cache(plain, "shop.test", "/p2").await, "HIT");
    // As Magento sends it: the product's tag.
    let r = purge_shop(plain, "X-Magento-Tags-Pattern: ((^|,)cat_p_1(,|$))\r\n").await;
    assert_eq!((status(&r), body(&r)), (200, "Purged\n"), "{r}");
    assert_eq!(cache(plain, "shop.test", "/p1").await, "MISS");
    assert_eq!(cache(plain, "shop.test", "/p2").await, "HIT");
    assert_eq!(cache(plain, "shop.test", "/pool").await, "HIT");
    let r = purge_shop(plain, "X-Pool: ^pool_a$\r\n").await;
    assert_eq!(status(&r), 200, "{r}");
    assert_eq!(cache(plain, "shop.test", "/pool").await, "MISS");
    assert_eq!(cache(plain, "shop.test", "/p2").await, "HIT");
    assert_eq!(origin.count("/p1"), 2);
    assert_eq!(origin.count("/p2"), 1);
    assert!(
        origin.seen().iter().all(|s| s.method != "PURGE"),
        "a purge never reaches the origin"
    );
    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["purge_requests_refused"], 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn wordpress_purges_a_url_or_every_url_its_regex_matches() {
    let origin = platform().await;
    let (d, plain, _) = daemon(&origin).await;
    for path in ["/2026/post", "/2026/post?amp=1", "/about"] {
        assert_eq!(cache(plain, "blog.test", path).await, "MISS");
    }
    assert_eq!(cache(plain, "shop.test", "/2026/post").await, "MISS");
    published(&d, 4).await;
    let r = send(plain, None, "PURGE", "blog.test", "/2026/post", "").await;
    assert_eq!((status(&r), body(&r)), (200, "Purged\n"), "{r}");
    assert_eq!(cache(plain, "blog.test", "/2026/post").await, "MISS");
    assert_eq!(
        cache(plain, "blog.test", "/2026/post?amp=1").await,
        "HIT",
        "the URL only"
    );
    let r = send(
        plain,
        None,
        "PURGE",
        "blog.test",
        "/2026/.*",
        "X-Purge-Method: regex\r\n",
    )
    .await;
    assert_eq!(status(&r), 200, "{r}");
    assert_eq!(cache(plain, "blog.test", "/2026/post?amp=1").await, "MISS");
    assert_eq!(cache(plain, "blog.test", "/about").await, "HIT");
    assert_eq!(
        cache(plain, "shop.test", "/2026/post").await,
        "HIT",
        "another host's URLs are not this host's to ban"
    );
}
