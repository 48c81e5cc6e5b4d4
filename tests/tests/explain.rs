//! `POST /v1/explain` against a real daemon with rules: a pass, a rule's redirect and a lookup of a stored
//! object are explained as the data path would handle them, and the origin sees nothing of it.

use lacquer_admin::{
    wire::{ExplainRequest, Explanation, HeaderField},
    AdminClient, AdminError, Target,
};
use lacquer_tests::{get, Daemon, Origin, Reply};

const RULES: &str = r#"
[[listen]]
address = "127.0.0.1:0"

[[rule]]
name = "api"
match = { path_prefix = ["/api/"] }
pass = true

[[rule]]
name = "old"
match = { path_regex = "^/old/(.*)$" }
respond = { status = 301, location = "/new/$1" }

[[rule]]
name = "hsts"
on = "deliver"
set_headers = { "strict-transport-security" = "max-age=300" }
"#;

fn client(d: &Daemon) -> AdminClient {
    AdminClient::new(Target {
        addr: d.admin,
        secret_file: d.secret_file(),
    })
}

async fn explain(d: &Daemon, url: &str, headers: &[(&str, &str)]) -> Explanation {
    let request = ExplainRequest {
        url: url.to_owned(),
        method: None,
        headers: headers
            .iter()
            .map(|(n, v)| HeaderField {
                name: n.to_string(),
                value: v.to_string(),
            })
            .collect(),
        client: None,
        secure: false,
        body: None,
    };
    client(d)
        .explain(&request)
        .await
        .unwrap_or_else(|e| panic!("explain {url}: {e}"))
}

fn matched(e: &Explanation) -> Vec<(&str, &str)> {
    e.rules
        .iter()
        .filter(|r| r.matched)
        .map(|r| (r.name.as_str(), r.phase.as_str()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn explain_shows_a_pass_a_redirect_and_a_stored_object_without_the_origin() {
    let origin = Origin::start(|_| {
        Reply::ok("page")
            .header("cache-control", "max-age=60")
            .header("surrogate-key", "pages")
    })
    .await;
    let d = Daemon::with_config(origin.addr, RULES);
    let stored = get(d.addr, "/page").await;
    assert_eq!(stored.header("strict-transport-security"), "max-age=300");
    d.wait_for_stats("/page stored", |s| s["store"]["objects_published"] == 1)
        .await;
    let counts_before = d.stats().await["rules"].clone();
    let seen_before = origin.total();
    let base = format!("http://{}", d.addr);

    let pass = explain(&d, &format!("{base}/api/x?q=1"), &[]).await;
    assert_eq!(pass.action, "pass", "{pass:?}");
    assert_eq!(pass.reason.as_deref(), Some("rule"), "{pass:?}");
    assert_eq!(pass.key, None, "a pass is not looked up: {pass:?}");
    assert_eq!(
        (pass.method.as_str(), pass.target.as_str()),
        ("GET", "/api/x?q=1")
    );
    assert!(matched(&pass).contains(&("api", "request")), "{pass:?}");
    assert!(
        pass.stored.is_none() && pass.synthetic.is_none(),
        "{pass:?}"
    );

    let redirect = explain(&d, &format!("{base}/old/a?b=1"), &[]).await;
    assert_eq!(redirect.action, "synthetic", "{redirect:?}");
    let answer = redirect.synthetic.as_ref().expect("the rule's answer");
    assert_eq!(answer.status, 301);
    let location: Vec<&str> = answer
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("location"))
        .map(|h| h.value.as_str())
        .collect();
    assert_eq!(location, ["/new/a?b=1"], "{redirect:?}");
    assert!(
        matched(&redirect).contains(&("old", "request")),
        "{redirect:?}"
    );

    let lookup = explain(&d, &format!("{base}/page"), &[]).await;
    assert_eq!(lookup.action, "lookup", "{lookup:?}");
    assert_eq!(
        lookup.key.as_deref(),
        Some(&*format!("{}/page", d.addr)),
        "{lookup:?}"
    );
    assert_eq!(lookup.target, "/page");
    let object = lookup.stored.as_ref().expect("the stored object");
    assert_eq!(object.state, "fresh", "{object:?}");
    assert!((1..=60).contains(&object.ttl_seconds), "{object:?}");
    assert!(object.storable, "{object:?}");
    assert_eq!(object.response.status, 200);
    assert!(
        object
            .response
            .headers
            .iter()
            .any(|h| h.name.eq_ignore_ascii_case("strict-transport-security")
                && h.value == "max-age=300"),
        "the deliver rule's field is in the response: {object:?}"
    );
    assert!(
        !object
            .response
            .headers
            .iter()
            .any(|h| h.name.eq_ignore_ascii_case("surrogate-key")),
        "the tags are withheld from clients, as the data path does: {object:?}"
    );
    assert!(
        matched(&lookup).contains(&("hsts", "deliver")),
        "{lookup:?}"
    );

    let path_only = explain(&d, "/page", &[("Host", &d.addr.to_string())]).await;
    assert_eq!(
        path_only.key, lookup.key,
        "a path with a Host is the same request"
    );

    match client(&d)
        .explain(&ExplainRequest {
            url: "/page".into(),
            method: None,
            headers: vec![],
            client: None,
            secure: false,
            body: None,
        })
        .await
    {
        Err(AdminError::Refused { status, error }) => {
            assert_eq!(
                (status.as_u16(), error.code.as_str()),
                (400, "missing_host")
            );
        }
        other => panic!("a path without a Host: {other:?}"),
    }

    assert_eq!(
        origin.total(),
        seen_before,
        "explain sends nothing to the origin: {:?}",
        origin.seen()
    );
    assert_eq!(
        d.stats().await["rules"],
        counts_before,
        "explain is not traffic: the rules' counters do not move"
    );
}
