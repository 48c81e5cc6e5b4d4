//! Behaviours of Magento 2's `varnish6.vcl`, ported to rules and run through the real daemon in front of
//! an origin that answers as Magento does: keying on a cookie's value while every cookie is forwarded
//! (`hash_data(X-Magento-Vary)`), and deliver rules that read the response (`X-Magento-Debug`).

use http::Method;
use lacquer_tests::{origin::Seen, request, Daemon, Origin, Reply};

fn cookie(seen: &Seen, name: &str) -> Option<String> {
    seen.headers
        .get_all("cookie")
        .iter()
        .filter_map(|l| l.to_str().ok())
        .flat_map(|l| l.split(';'))
        .filter_map(|p| p.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.to_owned())
}

/// Catalogue pages differ by customer group (the `X-Magento-Vary` cookie) and are public; the wishlist
/// is the signed-in customer's own (`PHPSESSID`), never stored, and without the session a redirect to
/// the login page.
async fn magento() -> Origin {
    let serial = std::sync::atomic::AtomicUsize::new(0);
    Origin::start(move |seen| {
        let n = serial.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        match seen.path.as_str() {
            "/wishlist" => match cookie(seen, "PHPSESSID") {
                Some(session) => Reply::ok(format!("wishlist of {session}"))
                    .header("cache-control", "no-store, no-cache, must-revalidate"),
                None => Reply::ok("")
                    .status(302)
                    .header("location", "/customer/account/login"),
            },
            "/debug" => Reply::ok(format!("debug #{n}"))
                .header("cache-control", "public, max-age=600, s-maxage=600")
                .header("x-magento-debug", "1")
                .header("x-magento-tags", "cat_p_1"),
            _ => {
                let group = cookie(seen, "X-Magento-Vary").unwrap_or_else(|| "none".into());
                Reply::ok(format!("{group} #{n}"))
                    .header("cache-control", "public, max-age=600, s-maxage=600")
                    .header("x-magento-tags", "cat_p_1")
            }
        }
    })
    .await
}

/// Waits until the daemon has stored `n` objects: a fill is published just after its response ends.
async fn published(d: &Daemon, n: u64) {
    d.wait_for_stats("objects stored", |s| {
        s["store"]["objects_published"].as_u64() >= Some(n)
    })
    .await;
}

async fn as_customer(d: &Daemon, path: &str, cookies: &str) -> (String, String) {
    let headers: Vec<(&str, &str)> = match cookies {
        "" => vec![],
        c => vec![("cookie", c)],
    };
    let r = request(d.addr, Method::GET, path, &headers, Default::default())
        .await
        .unwrap();
    (
        r.x_cache().to_owned(),
        String::from_utf8_lossy(&r.body).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn pages_are_shared_by_customer_group_and_every_cookie_reaches_the_origin() {
    let origin = magento().await;
    let d = Daemon::with_config_only(&format!(
        r#"
[[listen]]
address = "127.0.0.1:0"

[[backend]]
name = "magento"
address = "{}"

[[rule]]
name = "magento-vary"
key_cookie_values = ["X-Magento-Vary"]
forward_all_cookies = true
"#,
        origin.addr
    ));
    let alice = "PHPSESSID=alice; X-Magento-Vary=g1";
    assert_eq!(
        as_customer(&d, "/p", alice).await,
        ("MISS".into(), "g1 #1".into())
    );
    published(&d, 1).await;
    let seen = origin.seen();
    assert_eq!(
        cookie(seen.last().unwrap(), "PHPSESSID").as_deref(),
        Some("alice"),
        "every cookie reaches the origin"
    );
    // Another customer of the same group shares the page; other groups and guests get their own.
    let bob = "X-Magento-Vary=g1; PHPSESSID=bob";
    assert_eq!(
        as_customer(&d, "/p", bob).await,
        ("HIT".into(), "g1 #1".into())
    );
    assert_eq!(
        as_customer(&d, "/p", "PHPSESSID=carol; X-Magento-Vary=g2").await,
        ("MISS".into(), "g2 #2".into())
    );
    assert_eq!(
        as_customer(&d, "/p", "").await,
        ("MISS".into(), "none #3".into())
    );
    published(&d, 3).await;
    assert_eq!(
        as_customer(&d, "/p", "").await,
        ("HIT".into(), "none #3".into())
    );
    assert_eq!(
        as_customer(&d, "/p", "PHPSESSID=dave").await,
        ("HIT".into(), "none #3".into()),
        "a session without a group is a guest's page"
    );
    // The signed-in customer's own page keeps its session: it is never a guest's.
    let (_, wishlist) = as_customer(&d, "/wishlist", alice).await;
    assert_eq!(wishlist, "wishlist of alice");
    let (_, wishlist) = as_customer(&d, "/wishlist", bob).await;
    assert_eq!(wishlist, "wishlist of bob", "not stored");
    // Two values for the group read two ways: not looked up, not stored.
    let twice = "X-Magento-Vary=g1; X-Magento-Vary=g2";
    let (state, _) = as_customer(&d, "/p", twice).await;
    assert_ne!(state, "HIT");
    assert_eq!(
        as_customer(&d, "/p", alice).await,
        ("HIT".into(), "g1 #1".into())
    );
    assert!(
        origin
            .seen()
            .iter()
            .all(|s| !s.headers.contains_key("lacquer-key-cookies")),
        "the key's field never reaches the origin"
    );
}

/// `vcl_deliver`: in debug mode the page's `Cache-Control` is kept as `X-Magento-Cache-Control` and the
/// outcome shown as `X-Magento-Cache-Debug`; browsers always get `no-store` for a public page, and never
/// the tags.
#[tokio::test(flavor = "multi_thread")]
async fn deliver_rules_read_the_response_and_its_outcome() {
    let origin = magento().await;
    let d = Daemon::with_config_only(&format!(
        r#"
[[listen]]
address = "127.0.0.1:0"

[[backend]]
name = "magento"
address = "{}"

[[rule]]
name = "debug"
on = "deliver"
match = {{ response_headers = {{ "x-magento-debug" = "" }} }}
set_headers = {{ "x-magento-cache-control" = "${{resp.cache-control}}", "x-magento-cache-debug" = "${{resp.x-cache}}" }}

[[rule]]
name = "not-cached"
on = "deliver"
match = {{ outcome = ["uncacheable", "pass"] }}
set_headers = {{ "x-not-cached" = "${{outcome}}" }}

[[rule]]
name = "browsers"
on = "deliver"
match = {{ response_headers = {{ "cache-control" = "^public" }} }}
unset_headers = ["x-magento-tags", "x-magento-debug"]
set_headers = {{ "cache-control" = "no-store, no-cache, must-revalidate, max-age=0" }}
"#,
        origin.addr
    ));
    let get = |path: &'static str| {
        let addr = d.addr;
        async move {
            request(addr, Method::GET, path, &[], Default::default())
                .await
                .unwrap()
        }
    };
    let first = get("/debug").await;
    published(&d, 1).await;
    assert_eq!(first.header("x-magento-cache-debug"), "MISS");
    assert_eq!(
        first.header("x-magento-cache-control"),
        "public, max-age=600, s-maxage=600"
    );
    assert_eq!(
        first.header("cache-control"),
        "no-store, no-cache, must-revalidate, max-age=0"
    );
    assert_eq!(first.header("x-magento-tags"), "");
    let second = get("/debug").await;
    assert_eq!(second.header("x-magento-cache-debug"), "HIT");
    assert_eq!(
        second.header("x-magento-cache-control"),
        "public, max-age=600, s-maxage=600",
        "the stored page's own, not what the last delivery wrote"
    );
    // Without debug mode, only the browsers' rule.
    let page = get("/p").await;
    published(&d, 2).await;
    assert_eq!(page.header("x-magento-cache-debug"), "");
    assert_eq!(
        page.header("cache-control"),
        "no-store, no-cache, must-revalidate, max-age=0"
    );
    assert_eq!(get("/p").await.x_cache(), "HIT");
    assert_eq!(page.header("x-not-cached"), "", "stored");
    // A guest's wishlist is a redirect to the login page without freshness: fetched, not stored. With a
    // session cookie (and no rule keying on cookies) the request is not looked up at all.
    assert_eq!(get("/wishlist").await.header("x-not-cached"), "uncacheable");
    let signed_in = request(
        d.addr,
        Method::GET,
        "/wishlist",
        &[("cookie", "PHPSESSID=alice")],
        Default::default(),
    )
    .await
    .unwrap();
    assert_eq!(signed_in.header("x-not-cached"), "pass");
}

/// `vcl_backend_response`: a GraphQL answer whose `X-Magento-Cache-Id` is not the request's is not stored
/// under the request's key; a page that sets `X-Magento-Vary` for a request without one is not stored
/// (its group is not the key's); every other cacheable page is stored without its `Set-Cookie`.
#[tokio::test(flavor = "multi_thread")]
async fn backend_response_rules_compare_the_request_and_look_inside_set_cookie() {
    let origin = Origin::start(|seen| {
        let asked = seen
            .headers
            .get("x-magento-cache-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        match seen.path.split('?').next().unwrap_or("") {
            // The id Magento computes for the customer it sees: "guest" unless the request proves more.
            "/graphql" => Reply::ok(format!("graphql for {asked}"))
                .header("cache-control", "public, max-age=600")
                .header("x-magento-cache-id", "guest"),
            "/store-switch" => Reply::ok("switched")
                .header("cache-control", "public, max-age=600")
                .header("set-cookie", "X-Magento-Vary=de; path=/"),
            _ => Reply::ok("page")
                .header("cache-control", "public, max-age=600")
                .header("set-cookie", "mage-messages=; path=/"),
        }
    })
    .await;
    let d = Daemon::with_config_only(&format!(
        r#"
[[listen]]
address = "127.0.0.1:0"

[[backend]]
name = "magento"
address = "{}"

[[rule]]
name = "magento-vary"
key_cookie_values = ["X-Magento-Vary"]
forward_all_cookies = true

[[rule]]
name = "graphql-cache-id"
on = "backend_response"
match = {{ path_prefix = ["/graphql"], headers = {{ "x-magento-cache-id" = "" }}, different_headers = ["x-magento-cache-id"] }}
store = false

[[rule]]
name = "vary-set-for-a-request-without"
on = "backend_response"
match = {{ without_cookies = ["X-Magento-Vary"], response_headers = {{ "set-cookie" = "X-Magento-Vary=" }} }}
store = false

[[rule]]
name = "no-set-cookie-in-the-cache"
on = "backend_response"
match = {{ methods = ["GET", "HEAD"] }}
unset_headers = ["set-cookie"]
"#,
        origin.addr
    ));
    let get = |path: &'static str, headers: Vec<(&'static str, &'static str)>| {
        let addr = d.addr;
        async move {
            request(addr, Method::GET, path, &headers, Default::default())
                .await
                .unwrap()
        }
    };
    let cache_id = |id| vec![("x-magento-cache-id", id)];
    get("/graphql?q=1", cache_id("guest")).await;
    published(&d, 1).await;
    assert_eq!(
        get("/graphql?q=1", cache_id("guest")).await.x_cache(),
        "HIT"
    );
    get("/graphql?q=2", cache_id("customer-7")).await;
    assert_eq!(
        get("/graphql?q=2", cache_id("customer-7")).await.x_cache(),
        "MISS",
        "the answer was another customer's: not stored"
    );
    get("/store-switch", vec![]).await;
    assert_eq!(get("/store-switch", vec![]).await.x_cache(), "MISS");
    let with_group = vec![("cookie", "X-Magento-Vary=de")];
    get("/store-switch", with_group.clone()).await;
    published(&d, 2).await;
    let hit = get("/store-switch", with_group).await;
    assert_eq!((hit.x_cache(), hit.header("set-cookie")), ("HIT", ""));
    get("/page", vec![]).await;
    published(&d, 3).await;
    let hit = get("/page", vec![]).await;
    assert_eq!(
        (hit.x_cache(), hit.header("set-cookie")),
        ("HIT", ""),
        "stored without its Set-Cookie"
    );
    assert_eq!(origin.count("/page"), 1);
}
