//! Edge Side Includes through the real daemon, in front of an origin that answers as Magento does with its
//! page cache set to Varnish: a page with blocks as `<esi:include>`, each block with its own TTL. What the
//! client gets, and what the origin saw.

use std::io::Read;

use http::Method;
use lacquer_tests::{request, Daemon, Origin, Reply};

/// A shop: the page includes the top menu (absolute, on the site, as Magento writes it), a relative
/// footer, a block that is gone, and holds text only a cache that does not do ESI would show.
async fn shop() -> Origin {
    // Each path counts its own requests: fragments are fetched in parallel, in no set order.
    let served = std::sync::Mutex::new(std::collections::HashMap::<String, usize>::new());
    Origin::start(move |seen| {
        let n = {
            let mut served = served.lock().unwrap();
            let n = served.entry(seen.path.clone()).or_default();
            *n += 1;
            *n
        };
        let html = |body: String| {
            Reply::ok(body)
                .header("content-type", "text/html; charset=UTF-8")
                .header("etag", "\"page-v1\"")
        };
        match seen.path.as_str() {
            "/" | "/index.html" => html(
                "<html><body>\
                 <esi:include src=\"http://shop.test/page_cache/block/esi/blocks/[%22catalog.topnav%22]/\" />\
                 <main>page #N</main>\
                 <esi:remove><a href=\"/nav\">menu</a></esi:remove>\
                 <!--esi <esi:include src=\"footer?x=1&amp;y=2\"/> -->\
                 <esi:include src=\"/gone\" onerror=\"continue\"/>\
                 <esi:comment text=\"the end\"/>\
                 </body></html>"
                    .replace('N', &n.to_string()),
            )
            .header("cache-control", "public, max-age=600"),
            p if p.starts_with("/page_cache/block/esi/blocks/") => {
                html(format!("<nav>menu #{n}</nav>")).header("cache-control", "max-age=2")
            }
            "/footer?x=1&y=2" => {
                html(format!("<footer>footer #{n}</footer>")).header("cache-control", "max-age=600")
            }
            "/gzipped" => {
                let page = "<p>compressed page <esi:include src=\"/footer?x=1&amp;y=2\"/></p>";
                let mut e =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                std::io::Write::write_all(&mut e, page.as_bytes()).unwrap();
                Reply::ok(e.finish().unwrap())
                    .header("content-type", "text/html")
                    .header("content-encoding", "gzip")
                    .header("cache-control", "max-age=600")
            }
            "/broken" => {
                html("<p>before <esi:include src=\"/gone\"/> after</p>".into())
                    .header("cache-control", "max-age=600")
            }
            "/loop" => html("<p>loop <esi:include src=\"/loop\" onerror=\"continue\"/>.</p>".into())
                .header("cache-control", "max-age=600"),
            "/elsewhere" => html(
                "<p>x<esi:include src=\"http://other.test/secret\" onerror=\"continue\"/>y</p>"
                    .into(),
            )
            .header("cache-control", "max-age=600"),
            "/gone" => Reply::ok("gone")
                .status(404)
                .header("cache-control", "no-store"),
            "/json" => Reply::ok("{\"a\": \"<esi:include src=\\\"/footer\\\"/>\"}")
                .header("content-type", "application/json")
                .header("cache-control", "max-age=600"),
            _ => Reply::ok("not found").status(404),
        }
    })
    .await
}

/// Magento's VCL: `set beresp.do_esi = true` when the content type is text.
fn config(origin: &Origin) -> String {
    format!(
        r#"
[[listen]]
address = "127.0.0.1:0"

[[backend]]
name = "magento"
address = "{}"

[[rule]]
name = "magento-esi"
on = "backend_response"
match.response_headers = {{ "content-type" = "^text/" }}
esi = true
"#,
        origin.addr
    )
}

async fn get(d: &Daemon, path: &str, headers: &[(&str, &str)]) -> lacquer_tests::client::Reply {
    let mut all = vec![("host", "shop.test")];
    all.extend_from_slice(headers);
    request(d.addr, Method::GET, path, &all, Default::default())
        .await
        .expect("response")
}

fn text(r: &lacquer_tests::client::Reply) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

const PAGE: &str =
    "<html><body><nav>menu #1</nav><main>page #1</main> <footer>footer #1</footer> </body></html>";

#[tokio::test(flavor = "multi_thread")]
async fn a_page_is_assembled_from_fragments_each_stored_on_its_own() {
    let origin = shop().await;
    let d = Daemon::with_config_only(&config(&origin));
    let first = get(&d, "/", &[]).await;
    assert_eq!(first.status, 200);
    assert_eq!(text(&first), PAGE);
    assert_eq!(
        first.header("content-length"),
        "",
        "the assembled length is not known"
    );
    assert_eq!(
        first.header("etag"),
        "W/\"page-v1\"",
        "weakened, as Varnish does"
    );
    assert_eq!(first.header("lacquer-esi"), "", "internal");
    // Each fragment was one request to the origin, made with the client's head (its Host).
    let seen = origin.seen();
    let paths: Vec<&str> = seen.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(paths.len(), 4, "{paths:?}");
    assert!(paths.contains(&"/footer?x=1&y=2"), "{paths:?}");
    assert!(paths.contains(&"/gone"), "{paths:?}");
    assert!(seen.iter().all(|s| s.headers["host"] == "shop.test"));
    d.wait_for_stats("page and fragments stored", |s| {
        s["store"]["objects_published"].as_u64() >= Some(3)
    })
    .await;
    // `cachectl inspect` (the admin API under it) lists the stored page's includes.
    let inspected = d
        .admin_get("/v1/objects?url=http://shop.test/", Some(&d.secret()))
        .await;
    let inspected: serde_json::Value = serde_json::from_slice(&inspected.body).unwrap();
    assert_eq!(
        inspected["variants"][0]["esi_includes"],
        serde_json::json!([
            {"src": "http://shop.test/page_cache/block/esi/blocks/[%22catalog.topnav%22]/", "continue_on_error": false},
            {"src": "footer?x=1&y=2", "continue_on_error": false},
            {"src": "/gone", "continue_on_error": true},
        ]),
        "{inspected}"
    );
    // Stored: the page is served again without the origin, its blocks too.
    let again = get(&d, "/", &[]).await;
    assert_eq!(text(&again), PAGE);
    assert_eq!(again.x_cache(), "HIT");
    assert_eq!(origin.count("/"), 1);
    assert_eq!(origin.count("/footer?x=1&y=2"), 1);
    assert_eq!(origin.count("/gone"), 2, "not stored: asked again");
    // The menu's own TTL (2 s) runs out before the page's (600 s): only the menu is fetched again.
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    let later = get(&d, "/", &[]).await;
    let menus = origin
        .seen()
        .iter()
        .filter(|s| s.path.starts_with("/page_cache/"))
        .count();
    assert!(menus >= 2);
    assert!(
        text(&later).contains(&format!("<nav>menu #{menus}</nav>")),
        "{}",
        text(&later)
    );
    assert!(text(&later).contains("<main>page #1</main>"));
    assert_eq!(origin.count("/"), 1);
    assert_eq!(origin.count("/footer?x=1&y=2"), 1);
    // Three pages assembled, each with its menu and footer (parsed too: the rule turns ESI on for all
    // text), each with its three includes; the missing block left out each time.
    let stats = d.stats().await;
    assert!(stats["proxy"]["esi_pages"].as_u64() >= Some(4), "{stats}");
    assert_eq!(stats["proxy"]["esi_assemblies"], 9, "{stats}");
    assert_eq!(stats["proxy"]["esi_fragments"], 9);
    assert_eq!(stats["proxy"]["esi_errors"], 3);
    let metrics = d.admin_get("/metrics", Some(&d.secret())).await;
    assert!(
        String::from_utf8_lossy(&metrics.body).contains("lacquer_esi_total{event=\"assembled\"} 9"),
        "{}",
        String::from_utf8_lossy(&metrics.body)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn compressed_pages_are_parsed_decoded_and_sent_as_each_client_takes_them() {
    let origin = shop().await;
    let d = Daemon::with_config_only(&config(&origin));
    let page = "<p>compressed page <footer>footer #1</footer></p>";
    for _ in 0..2 {
        let gzip = get(&d, "/gzipped", &[("accept-encoding", "gzip, deflate, br")]).await;
        assert_eq!(gzip.header("content-encoding"), "gzip");
        assert!(gzip
            .header("vary")
            .to_ascii_lowercase()
            .contains("accept-encoding"));
        let mut decoded = String::new();
        flate2::read::MultiGzDecoder::new(&gzip.body[..])
            .read_to_string(&mut decoded)
            .unwrap();
        assert_eq!(decoded, page);
        let plain = get(&d, "/gzipped", &[]).await;
        assert_eq!(plain.header("content-encoding"), "");
        assert_eq!(text(&plain), page);
        d.wait_for_stats("stored", |s| {
            s["store"]["objects_published"].as_u64() >= Some(2)
        })
        .await;
    }
    assert_eq!(origin.count("/gzipped"), 1);
    assert_eq!(origin.count("/footer?x=1&y=2"), 1);
    // A type the rule does not turn ESI on for is sent as the origin sent it.
    let json = get(&d, "/json", &[]).await;
    assert_eq!(
        text(&json),
        "{\"a\": \"<esi:include src=\\\"/footer\\\"/>\"}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn range_conditional_and_head_behave_as_varnish() {
    let origin = shop().await;
    let d = Daemon::with_config_only(&config(&origin));
    assert_eq!(text(&get(&d, "/", &[]).await), PAGE);
    d.wait_for_stats("stored", |s| {
        s["store"]["objects_published"].as_u64() >= Some(3)
    })
    .await;
    // A range is answered with the whole page (Varnish: no ranges on ESI responses).
    let ranged = get(&d, "/", &[("range", "bytes=0-9")]).await;
    assert_eq!(ranged.status, 200);
    assert!(text(&ranged).starts_with("<html><body><nav>menu #"));
    assert_eq!(ranged.header("accept-ranges"), "");
    // A conditional on the page's own (weak) validator is a 304, as Varnish answers at the top level.
    let cond = get(&d, "/", &[("if-none-match", "W/\"page-v1\"")]).await;
    assert_eq!(cond.status, 304);
    assert!(cond.body.is_empty());
    // HEAD fetches no fragment.
    let before = origin.total();
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    let head = request(
        d.addr,
        Method::HEAD,
        "/",
        &[("host", "shop.test")],
        Default::default(),
    )
    .await
    .unwrap();
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    assert_eq!(
        origin.total(),
        before,
        "the expired menu is not fetched for a HEAD"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn failing_includes_are_left_out_or_cut_the_page_off() {
    let origin = shop().await;
    let d = Daemon::with_config_only(&config(&origin));
    // Without onerror="continue", a 404 fragment cuts the page: the client sees a response that did not
    // end, never a page that looks whole.
    let cut = request(
        d.addr,
        Method::GET,
        "/broken",
        &[("host", "shop.test")],
        Default::default(),
    )
    .await;
    assert!(cut.is_err(), "{cut:?}");
    // A page that includes itself, and one that names another host: left out (onerror="continue"), and
    // the other host is never asked.
    assert_eq!(text(&get(&d, "/loop", &[]).await), "<p>loop .</p>");
    assert_eq!(text(&get(&d, "/elsewhere", &[]).await), "<p>xy</p>");
    assert_eq!(origin.count("/loop"), 1);
    assert!(origin.seen().iter().all(|s| s.path != "/secret"));
    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["esi_errors"], 3, "{stats}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_route_turns_esi_on_and_fragments_nest_within_the_depth() {
    // Each level includes the next: /d0 → /d1 → … The depth bound (2 here) stops the third.
    let origin = Origin::start(|seen| {
        let level: usize = seen.path.trim_start_matches("/d").parse().unwrap_or(0);
        Reply::ok(format!(
            "[{level}<esi:include src=\"/d{}\" onerror=\"continue\"/>]",
            level + 1
        ))
        .header("cache-control", "max-age=60")
    })
    .await;
    let d = Daemon::with_config_only(&format!(
        r#"
[[listen]]
address = "127.0.0.1:0"

[[backend]]
name = "origin"
address = "{}"

[esi]
max_depth = 2

[[route]]
path_prefix = "/d"
esi = true
"#,
        origin.addr
    ));
    let r = request(d.addr, Method::GET, "/d0", &[], Default::default())
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&r.body), "[0[1[2]]]");
    assert_eq!(origin.count("/d3"), 0, "past the depth, never fetched");
}

/// A shared page, and the signed-in customer's own block in it: the page is stored once for everyone,
/// the block fetched for each with their cookie, as Magento's private content is. A passed page is
/// assembled too, fragments come in the page's order however they are fetched, and a purged fragment is
/// fetched again while the page stays stored.
#[tokio::test(flavor = "multi_thread")]
async fn fragments_carry_the_clients_head_run_in_parallel_and_are_purged_on_their_own() {
    let origin = Origin::start(|seen| {
        let cookie = seen
            .headers
            .get("cookie")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none")
            .to_owned();
        match seen.path.as_str() {
            "/page" => Reply::ok(
                "<h1>shared</h1><esi:include src=\"/customer\"/>\
                 <esi:include src=\"/slow/1\"/><esi:include src=\"/slow/2\"/><esi:include src=\"/slow/3\"/>",
            )
            .header("cache-control", "public, max-age=600"),
            "/customer" => Reply::ok(format!("<p>hello {cookie}</p>"))
                .header("cache-control", "private, no-store"),
            p if p.starts_with("/slow/") => Reply::ok(format!("<{p}>"))
                .header("cache-control", "max-age=600")
                .delay(std::time::Duration::from_millis(300)),
            "/account" => Reply::ok("<h1>yours</h1><esi:include src=\"/slow/1\"/>"),
            _ => Reply::ok("").status(404),
        }
    })
    .await;
    let d = Daemon::with_config_only(&format!(
        r#"
[[listen]]
address = "127.0.0.1:0"

[[backend]]
name = "shop"
address = "{}"

[purge]
http_methods = true

[[route]]
path_prefix = "/account"
pass = true
esi = true

[[route]]
esi = true

# The shared page is stored whoever asks, and keeps the cookie for its fragments.
[[rule]]
name = "page"
match.path_regex = "^/page$"
cache_cookies = true

# The request phase runs for each fragment as for a client's request: the shared blocks lose the cookie
# (and are stored), the customer's block keeps it (and is passed, as any request with a cookie).
[[rule]]
name = "shared-blocks"
match.path_prefix = ["/slow/"]
strip_cookies = true
"#,
        origin.addr
    ));
    let page = |user: &'static str| {
        let addr = d.addr;
        async move {
            let cookie = format!("session={user}");
            let r = request(
                addr,
                Method::GET,
                "/page",
                &[("cookie", &cookie)],
                Default::default(),
            )
            .await
            .unwrap();
            String::from_utf8_lossy(&r.body).into_owned()
        }
    };
    let fragments = "</slow/1></slow/2></slow/3>";
    assert_eq!(
        page("alice").await,
        format!("<h1>shared</h1><p>hello session=alice</p>{fragments}")
    );
    assert!(
        origin.max_in_flight() >= 3,
        "the three slow fragments were fetched at once ({})",
        origin.max_in_flight()
    );
    d.wait_for_stats("stored", |s| {
        s["store"]["objects_published"].as_u64() >= Some(4)
    })
    .await;
    assert_eq!(
        page("bob").await,
        format!("<h1>shared</h1><p>hello session=bob</p>{fragments}")
    );
    assert_eq!(origin.count("/page"), 1, "the page is shared");
    assert_eq!(origin.count("/customer"), 2, "the block is each customer's");
    // A passed page is assembled as a stored one is.
    let account = request(d.addr, Method::GET, "/account", &[], Default::default())
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&account.body),
        "<h1>yours</h1></slow/1>"
    );
    // Purging a fragment: the next page fetches it again, the page itself stays stored.
    let purged = request(
        d.addr,
        Method::from_bytes(b"PURGE").unwrap(),
        "/slow/2",
        &[],
        Default::default(),
    )
    .await
    .unwrap();
    assert_eq!(purged.status, 200);
    assert_eq!(
        page("carol").await,
        format!("<h1>shared</h1><p>hello session=carol</p>{fragments}")
    );
    assert_eq!(origin.count("/slow/2"), 2);
    assert_eq!(origin.count("/slow/1"), 1);
    assert_eq!(origin.count("/page"), 1);
}

/// `max_includes` bounds the client's page and every fragment below it together, so nesting cannot
/// multiply what one request costs the origin; and fragments do not count against the client's rate limit.
#[tokio::test(flavor = "multi_thread")]
async fn one_budget_of_includes_for_the_whole_page_and_no_rate_limit_on_fragments() {
    // Each level includes the next twice: without one budget, 2 + 4 + 8 + … fragments.
    let origin = Origin::start(|seen| {
        let level: usize = seen.path.trim_start_matches("/t").parse().unwrap_or(0);
        let next = level + 1;
        Reply::ok(format!(
            "({level}<esi:include src=\"/t{next}\" onerror=\"continue\"/><esi:include src=\"/t{next}\" onerror=\"continue\"/>)"
        ))
        .header("cache-control", "no-store")
    })
    .await;
    let d = Daemon::with_config_only(&format!(
        r#"
[[listen]]
address = "127.0.0.1:0"

[[backend]]
name = "origin"
address = "{}"

[esi]
max_includes = 5

[[route]]
path_prefix = "/t"
esi = true
rate_limit = {{ requests = 1, per = "10s", burst = 1 }}
"#,
        origin.addr
    ));
    let r = request(d.addr, Method::GET, "/t0", &[], Default::default())
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let body = String::from_utf8_lossy(&r.body).into_owned();
    // The page and five fragments in all, whatever their depth.
    assert_eq!(body.matches('(').count(), 6, "{body}");
    assert_eq!(origin.total(), 6);
    let stats = d.stats().await;
    assert_eq!(stats["proxy"]["esi_fragments"], 5, "{stats}");
    assert_eq!(stats["proxy"]["rate_limited"], 0, "{stats}");
    // The client's own next request is limited, as before.
    let again = request(d.addr, Method::GET, "/t0", &[], Default::default())
        .await
        .unwrap();
    assert_eq!(again.status, 429);
}
