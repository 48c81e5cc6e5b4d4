//! The admin API: health is open, everything else needs the secret.

use std::os::unix::fs::PermissionsExt;

use lacquer_tests::{get, Daemon, Origin, Reply};

#[tokio::test(flavor = "multi_thread")]
async fn secret_guards_everything_but_health() {
    let origin = Origin::start(|_| Reply::ok("x").header("cache-control", "max-age=60")).await;
    let d = Daemon::start(origin.addr, &[]);
    let secret_file = d.dir.path().join("store/secret");
    assert_eq!(
        std::fs::metadata(&secret_file)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );

    let health = d.admin_get("/v1/health", None).await;
    assert_eq!(health.status, 200);
    let health: serde_json::Value = serde_json::from_slice(&health.body).unwrap();
    assert_eq!(health["status"], "ok");

    for secret in [None, Some("wrong-secret-wrong-secret")] {
        let r = d.admin_get("/v1/stats", secret).await;
        assert_eq!(r.status, 401, "{secret:?}");
        let err: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(err["code"], "unauthorized");
    }

    get(d.addr, "/a").await;
    get(d.addr, "/a").await;
    // The second request may be served by the finished fetch before the store publishes the object.
    let stats = d
        .wait_for_stats("the object published", |s| s["store"]["objects"] == 1)
        .await;
    assert_eq!(stats["proxy"]["requests"], 2);
    assert_eq!(stats["proxy"]["hits"], 1);
    assert_eq!(stats["store"]["objects"], 1);
    assert_eq!(stats["store"]["foyer_drops"], 0);
    assert!(stats["proxy"]["bytes_out"].as_u64().unwrap() >= 2);

    let missing = d.admin_get("/v1/nope", Some(&d.secret())).await;
    assert_eq!(missing.status, 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_given_secret_file_is_used() {
    let origin = Origin::start(|_| Reply::ok("x")).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secret");
    std::fs::write(&file, "correct-horse-battery-staple\n").unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let d = Daemon::start(origin.addr, &["--secret", file.to_str().unwrap()]);
    assert_eq!(
        d.admin_get("/v1/stats", Some("correct-horse-battery-staple"))
            .await
            .status,
        200
    );
    assert_eq!(
        d.admin_get("/v1/stats", Some("correct-horse-battery-stapl"))
            .await
            .status,
        401
    );
}
