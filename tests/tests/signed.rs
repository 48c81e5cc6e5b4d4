//! Signed URLs through the real daemon: links made by `cachectl sign`, checked by a rule's `signed`, the
//! signature and expiry kept out of the key and away from the origin; what the client got and what the
//! origin saw.

use http::Method;
use lacquer_tests::{daemon::binary, request, run_tool, Daemon, Origin, Reply};

fn sign(secret: &std::path::Path, url: &str, expires: &str) -> String {
    let (status, out, err) = run_tool(
        binary("cachectl").to_str().unwrap(),
        &[
            "sign",
            url,
            "--expires",
            expires,
            "--secret-file",
            secret.to_str().unwrap(),
        ],
    );
    assert_eq!(status, 0, "{err}");
    out.trim().to_owned()
}

async fn get(d: &Daemon, target: &str) -> lacquer_tests::client::Reply {
    request(d.addr, Method::GET, target, &[], Default::default())
        .await
        .unwrap()
}

/// A daemon with `rules` (where `{secret}` names a file holding `secret`) in front of an origin that
/// answers every path with its name, stored for ten minutes; the folder holding the secret.
async fn signing_daemon(secret: &str, rules: &str) -> (tempfile::TempDir, Origin, Daemon) {
    let secrets = tempfile::tempdir().unwrap();
    let file = secrets.path().join("secret");
    std::fs::write(&file, format!("{secret}\n")).unwrap();
    let origin = Origin::start(|seen| {
        Reply::ok(format!("file {}", seen.path)).header("cache-control", "max-age=600")
    })
    .await;
    let d = Daemon::with_config_only(&format!(
        "[[listen]]\naddress = \"127.0.0.1:0\"\n\n[[backend]]\nname = \"files\"\naddress = \"{}\"\n{}",
        origin.addr,
        rules.replace("{secret}", &file.display().to_string())
    ));
    (secrets, origin, d)
}

#[tokio::test(flavor = "multi_thread")]
async fn signed_links_are_checked_and_share_one_object() {
    let (secrets, origin, d) = signing_daemon(
        "a secret the site and the cache share",
        r#"
[[rule]]
name = "signed-videos"
match = { path_prefix = ["/video/"] }
signed = { secret_file = "{secret}" }

[[rule]]
name = "signed-downloads"
match = { path_prefix = ["/dl/"] }
signed = { secret_file = "{secret}", param = "token", refuse = { status = 410, body = "this link is gone" } }
"#,
    )
    .await;
    let secret = secrets.path().join("secret");
    let first = sign(&secret, "http://cdn.test/video/a.mp4?user=7", "1h");
    let target = first.strip_prefix("http://cdn.test").unwrap();
    assert!(
        target.contains("&exp=") && target.contains("&sig="),
        "{target}"
    );
    let r = get(&d, target).await;
    assert_eq!(r.status, 200);
    // The origin is sent the link without its signature and expiry: they are not the key either.
    assert_eq!(String::from_utf8_lossy(&r.body), "file /video/a.mp4?user=7");
    d.wait_for_stats("stored", |s| {
        s["store"]["objects_published"].as_u64() >= Some(1)
    })
    .await;
    // Another link to the same object, signed to live longer, shares it.
    let second = sign(&secret, "/video/a.mp4?user=7", "2h");
    let r = get(&d, &second).await;
    assert_eq!((r.status.as_u16(), r.x_cache()), (200, "HIT"));
    assert_eq!(origin.total(), 1);

    // Refused, and the origin never asked: no signature, a changed parameter, an expired link.
    let unsigned = get(&d, "/video/a.mp4?user=7").await;
    assert_eq!(unsigned.status, 403);
    assert_eq!(
        String::from_utf8_lossy(&unsigned.body),
        "forbidden: this link is not signed\n"
    );
    let tampered = get(&d, &second.replace("user=7", "user=8")).await;
    assert_eq!(tampered.status, 403);
    assert_eq!(
        String::from_utf8_lossy(&tampered.body),
        "forbidden: this link's signature is wrong\n"
    );
    let expired = get(&d, &sign(&secret, "/video/a.mp4?user=7", "0s")).await;
    assert_eq!(expired.status, 403);
    assert_eq!(
        String::from_utf8_lossy(&expired.body),
        "forbidden: this link has expired\n"
    );
    // A rule's own answer, and its own parameter name.
    let gone = get(&d, "/dl/setup.exe").await;
    assert_eq!(gone.status, 410);
    assert_eq!(String::from_utf8_lossy(&gone.body), "this link is gone");
    let (status, out, _) = run_tool(
        binary("cachectl").to_str().unwrap(),
        &[
            "sign",
            "/dl/setup.exe",
            "--expires",
            "10m",
            "--secret-file",
            secret.to_str().unwrap(),
            "--param",
            "token",
        ],
    );
    assert_eq!(status, 0);
    let r = get(&d, out.trim()).await;
    assert_eq!(String::from_utf8_lossy(&r.body), "file /dl/setup.exe");
    assert_eq!(origin.total(), 2);
}

/// A link as NGINX's documentation makes one for `secure_link_md5`, with openssl.
fn nginx_link(path: &str, expires: u64, client: &str, secret: &str) -> String {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "printf '%s' '{expires}{path}{client} {secret}' | openssl md5 -binary | openssl base64 \
             | tr +/ -_ | tr -d ="
        ))
        .output()
        .expect("openssl runs");
    let md5 = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert_eq!(md5.len(), 22, "openssl made an MD5");
    format!("{path}?md5={md5}&expires={expires}")
}

#[tokio::test(flavor = "multi_thread")]
async fn links_made_for_nginxs_secure_link_md5_check_as_nginx_checks_them() {
    let (secrets, origin, d) = signing_daemon(
        "the secret nginx.conf held inline",
        r#"
[[rule]]
name = "moved-from-nginx"
match = { path_prefix = ["/s/"] }
signed = { secret_file = "{secret}", algorithm = "nginx-md5", param = "md5", expires = "expires" }
"#,
    )
    .await;
    let secret = secrets.path().join("secret");
    let later = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    let inline = "the secret nginx.conf held inline";
    // The test client connects from 127.0.0.1: the link NGINX would have checked for it.
    let link = nginx_link("/s/link", later, "127.0.0.1", inline);
    let r = get(&d, &link).await;
    assert_eq!(r.status, 200);
    assert_eq!(String::from_utf8_lossy(&r.body), "file /s/link");
    // Another client's link, an expired one, one for another path: refused, the origin not asked.
    for (wrong, why) in [
        (nginx_link("/s/link", later, "10.0.0.9", inline), "wrong"),
        (nginx_link("/s/link", 1_000, "127.0.0.1", inline), "expired"),
        (
            nginx_link("/s/link", later, "127.0.0.1", inline).replace("/s/link", "/s/other"),
            "wrong",
        ),
    ] {
        let r = get(&d, &wrong).await;
        assert_eq!(r.status, 403, "{wrong}");
        assert!(String::from_utf8_lossy(&r.body).contains(why), "{wrong}");
    }
    // `cachectl sign --algorithm nginx-md5` makes the same link.
    let (status, out, err) = run_tool(
        binary("cachectl").to_str().unwrap(),
        &[
            "sign",
            "/s/link",
            "--expires",
            "1h",
            "--secret-file",
            secret.to_str().unwrap(),
            "--algorithm",
            "nginx-md5",
            "--param",
            "md5",
            "--expires-param",
            "expires",
        ],
    );
    assert_eq!(status, 0, "{err}");
    let r = get(&d, out.trim()).await;
    assert_eq!((r.status.as_u16(), r.x_cache()), (200, "HIT"));
    assert_eq!(origin.total(), 1);
}
