//! Recipe 27 of docs/rules.md, the port of a WordPress VCL, run as documented (its TOML read from the
//! page, so the port and this test cannot drift apart) through the real daemon, in front of an origin that
//! answers as WordPress does: what the client got and what the origin saw, behaviour by behaviour. Its
//! purges are in `purge_rules.rs`.

use http::Method;
use lacquer_tests::{origin::Seen, request, Daemon, Origin, Reply};

/// The TOML of recipe 27.
fn recipe() -> String {
    let doc = include_str!("../../docs/rules.md");
    let at = doc.find("### 27.").expect("recipe 27");
    let section = &doc[at..];
    let start = section.find("```toml\n").expect("its TOML") + "```toml\n".len();
    let end = section[start..].find("```").expect("closed");
    section[start..start + end].to_owned()
}

fn cookie(seen: &Seen) -> String {
    seen.headers
        .get("cookie")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// Posts are public for five minutes; a signed-in user's page is their own (WordPress sends it
/// `no-cache`); the admin is private.
async fn wordpress() -> Origin {
    let serial = std::sync::atomic::AtomicUsize::new(0);
    Origin::start(move |seen| {
        let n = serial.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let user = cookie(seen)
            .split(';')
            .find_map(|c| c.trim().strip_prefix("wordpress_logged_in_abc="))
            .map(str::to_owned);
        if seen.path.starts_with("/wp-admin") || seen.path.contains("preview=true") {
            return Reply::ok(format!("admin #{n}")).header("cache-control", "private, max-age=0");
        }
        if seen.path.ends_with(".css") {
            return Reply::ok(format!("body {{}} /* #{n} */"))
                .header("content-type", "text/css")
                .header("cache-control", "max-age=86400");
        }
        match user {
            // WordPress sends a signed-in user's pages as cacheable as anyone's: only the VCL keeps
            // them apart.
            Some(user) => {
                Reply::ok(format!("post for {user} #{n}")).header("cache-control", "max-age=300")
            }
            None => Reply::ok(format!("post #{n}")).header("cache-control", "max-age=300"),
        }
    })
    .await
}

async fn get(d: &Daemon, path: &str, cookie: &str) -> (String, String) {
    let mut headers = vec![("host", "blog.example")];
    if !cookie.is_empty() {
        headers.push(("cookie", cookie));
    }
    let r = request(d.addr, Method::GET, path, &headers, Default::default())
        .await
        .unwrap();
    (
        r.x_cache().to_owned(),
        String::from_utf8_lossy(&r.body).into_owned(),
    )
}

async fn stored(d: &Daemon, n: u64) {
    d.wait_for_stats("objects stored", |s| {
        s["store"]["objects_published"].as_u64() >= Some(n)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_wordpress_port_behaves_as_its_vcl() {
    let origin = wordpress().await;
    let d = Daemon::with_config_only(&format!(
        "[[listen]]\naddress = \"127.0.0.1:0\"\n\n[[backend]]\nname = \"blog\"\naddress = \"{}\"\n\n{}",
        origin.addr,
        recipe()
    ));

    // Readers with only tracking cookies share one stored post, and the origin never sees those cookies.
    assert_eq!(
        get(&d, "/2026/post", "_ga=GA1.2.1; has_js=1").await,
        ("MISS".into(), "post #1".into())
    );
    stored(&d, 1).await;
    assert_eq!(
        get(&d, "/2026/post", "__utmz=1; _gid=GA1").await,
        ("HIT".into(), "post #1".into())
    );
    assert_eq!(
        get(&d, "/2026/post", "").await,
        ("HIT".into(), "post #1".into())
    );
    assert_eq!(
        cookie(&origin.seen()[0]),
        "",
        "tracking cookies never reach WordPress"
    );

    // A signed-in user (or a commenter) passes, with their cookies, every time; their page is never
    // anyone else's, and never replaces what readers get.
    let signed_in = "_ga=GA1.2.1; wordpress_logged_in_abc=alice";
    assert_eq!(
        get(&d, "/2026/post", signed_in).await,
        ("PASS".into(), "post for alice #2".into())
    );
    assert_eq!(
        get(&d, "/2026/post", signed_in).await.1,
        "post for alice #3"
    );
    assert!(cookie(&origin.seen()[2]).contains("wordpress_logged_in_abc=alice"));
    assert_eq!(
        get(&d, "/2026/post", "comment_author_x=bob").await.1,
        "post #4",
        "a commenter passes too"
    );
    assert_eq!(
        get(&d, "/2026/post", "").await,
        ("HIT".into(), "post #1".into())
    );

    // The admin, the login page and previews pass.
    assert_eq!(get(&d, "/wp-admin/edit.php", "").await.1, "admin #5");
    assert_eq!(get(&d, "/wp-admin/edit.php", "").await.1, "admin #6");
    assert_eq!(get(&d, "/2026/post?preview=true", "").await.1, "admin #7");

    // Static files lose their cookies (a plugin's session, which would pass a page) and are stored for
    // everyone.
    assert_eq!(
        get(&d, "/wp-content/style.css", "PHPSESSID=s1").await.1,
        "body {} /* #8 */"
    );
    stored(&d, 2).await;
    assert_eq!(
        get(&d, "/wp-content/style.css", "").await,
        ("HIT".into(), "body {} /* #8 */".into())
    );
    assert_eq!(cookie(origin.seen().last().unwrap()), "");
    assert_eq!(origin.total(), 8);
}
