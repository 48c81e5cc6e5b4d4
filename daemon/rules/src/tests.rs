//! Rules as operators write them, run over real request and response heads.

use std::net::IpAddr;

use http::{request::Parts, HeaderMap, StatusCode};

use super::*;

fn rules(toml_text: &str) -> Result<Rules, RulesError> {
    let config = lacquer_config::Config::parse(toml_text, "test").expect("parses");
    Rules::compile(&config.rule, &["app", "api"])
}

fn request(uri: &str, headers: &[(&str, &str)]) -> Parts {
    let mut b = http::Request::builder().uri(uri);
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    b.body(()).unwrap().into_parts().0
}

fn client() -> IpAddr {
    "192.0.2.1".parse().unwrap()
}

fn run(r: &Rules, parts: &mut Parts) -> RequestVerdict {
    r.request(parts, client(), false, &|_, _| true, None)
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (n, v) in pairs {
        h.append(
            HeaderName::from_bytes(n.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    h
}

#[test]
fn request_rules_rewrite_the_head_the_origin_receives() {
    let r = rules(
        r#"
        [[rule]]
        name = "host"
        normalize_host = true
        [[rule]]
        unset_headers = ["proxy", "x-debug-*"]
        [[rule]]
        query = { sort = true, drop = ["utm_*", "gclid", "fbclid"] }
        [[rule]]
        cookies = { drop = ["_ga*", "_gid"] }
        [[rule]]
        match = { path_prefix = ["/old/"] }
        rewrite_path = { from = "^/old/(.*)$", to = "/new/$1" }
        [[rule]]
        set_headers = { "x-real-ip" = "${client_ip}" }
        append_headers = { "x-trail" = "lacquer" }
        "#,
    )
    .unwrap();
    let mut p = request(
        "/old/a/../b?z=1&utm_source=x&a=2&gclid=3",
        &[
            ("host", "Example.COM:8080"),
            ("proxy", "http://evil"),
            ("x-debug-token", "1"),
            ("x-debugger", "kept"),
            ("cookie", "_ga=1; sessionid=s; _gid=2"),
            ("x-trail", "client"),
        ],
    );
    let v = run(&r, &mut p);
    assert!(v.rerouted);
    assert_eq!(p.uri, "/new/b?a=2&z=1");
    let h = &p.headers;
    assert_eq!(h["host"], "example.com");
    assert!(!h.contains_key("proxy") && !h.contains_key("x-debug-token"));
    assert_eq!(h["x-debugger"], "kept");
    assert_eq!(h["cookie"], "sessionid=s");
    assert_eq!(h["x-real-ip"], "192.0.2.1");
    assert_eq!(h["x-trail"], "client, lacquer");

    let mut p = request("/a?", &[("cookie", "_ga=1")]);
    run(&r, &mut p);
    assert_eq!(p.uri, "/a");
    assert!(
        !p.headers.contains_key("cookie"),
        "no cookie left, no Cookie"
    );
}

#[test]
fn matches_pick_requests_by_method_path_header_cookie_query_and_client() {
    let r = rules(
        r#"
        [[rule]]
        name = "auth"
        match = { headers = { authorization = "" } }
        pass = true
        [[rule]]
        name = "post"
        match = { methods = ["post"], path_prefix = ["/api/"] }
        pass = true
        [[rule]]
        name = "session"
        match = { cookies = ["sess*"] }
        pass = true
        [[rule]]
        name = "office"
        match = { clients = ["10.0.0.0/8"], except_clients = ["10.9.0.0/16"], query = ["debug"] }
        pass = true
        [[rule]]
        name = "static"
        match = { extensions = ["css", "JS"], without_headers = ["x-keep"] }
        strip_cookies = true
        "#,
    )
    .unwrap();
    let pass = |uri: &str, h: &[(&str, &str)], ip: &str| {
        let mut p = request(uri, h);
        let v = r.request(&mut p, ip.parse().unwrap(), false, &|_, _| true, None);
        (v.pass, v.strip_set_cookie)
    };
    assert_eq!(
        pass("/", &[("authorization", "Basic x")], "192.0.2.1"),
        (true, false)
    );
    assert_eq!(pass("/api/x", &[], "192.0.2.1"), (false, false));
    let mut post = request("/api/x", &[]);
    post.method = http::Method::POST;
    assert!(
        r.request(&mut post, client(), false, &|_, _| true, None)
            .pass
    );
    assert_eq!(
        pass("/", &[("cookie", "a=1; session_id=2")], "192.0.2.1"),
        (true, false)
    );
    assert_eq!(
        pass("/", &[("cookie", "a=1; xsession=2")], "192.0.2.1"),
        (false, false)
    );
    assert_eq!(pass("/?debug", &[], "10.1.2.3"), (true, false));
    assert_eq!(pass("/?debug", &[], "10.9.2.3"), (false, false));
    assert_eq!(pass("/?nodebug", &[], "10.1.2.3"), (false, false));
    assert_eq!(
        pass("/a/site.CSS", &[("cookie", "a=1")], "192.0.2.1"),
        (false, true)
    );
    assert_eq!(
        pass("/a/site.css", &[("x-keep", "1")], "192.0.2.1"),
        (false, false)
    );
    assert_eq!(pass("/a.css/x", &[], "192.0.2.1"), (false, false));
    // A spelling only a lenient origin reads as `/api/x` passes as `/api/x` does.
    let mut post = request("/;/api/x", &[]);
    post.method = http::Method::POST;
    assert!(
        r.request(&mut post, client(), false, &|_, _| true, None)
            .pass
    );
    let mut post = request("/%2Fapi/x", &[]);
    post.method = http::Method::POST;
    assert!(
        r.request(&mut post, client(), false, &|_, _| true, None)
            .pass
    );
}

#[test]
fn buckets_keys_backends_and_stop() {
    let r = rules(
        r#"
        [[rule]]
        buckets = [
            { from = "accept-language", cases = [["fr", "^fr"], ["de", "^de"]], default = "en" },
            { from = "user-agent", to = "x-device", cases = [["tablet", "(?i)ipad|tablet"], ["mobile", "(?i)mobile|android"]], default = "desktop" },
        ]
        key = ["accept-language", "X-Device"]
        [[rule]]
        match = { headers = { "x-version" = "^2" } }
        backend = "api"
        stop = true
        [[rule]]
        backend = "app"
        "#,
    )
    .unwrap();
    let mut p = request(
        "/",
        &[
            ("accept-language", "fr-CA,fr;q=0.9"),
            ("user-agent", "Mozilla/5.0 (iPad; CPU OS 17_0)"),
            ("x-version", "2.1"),
        ],
    );
    let v = run(&r, &mut p);
    assert_eq!(p.headers["accept-language"], "fr");
    assert_eq!(p.headers["x-device"], "tablet");
    assert_eq!(v.key, ["accept-language", "x-device"]);
    assert_eq!(
        v.backend.as_deref(),
        Some("api"),
        "stop keeps the later rule out"
    );
    let mut p = request("/", &[]);
    let v = run(&r, &mut p);
    assert_eq!(p.headers["accept-language"], "en");
    assert_eq!(p.headers["x-device"], "desktop");
    assert_eq!(v.backend.as_deref(), Some("app"));
}

/// Magento's GraphQL port: the rule removes the `X-Magento-Authorized` a client sends and writes its own
/// from `Authorization`. The removal must never take the rule's own output (it once did, and served
/// authorized answers to anonymous callers).
#[test]
fn a_rule_never_removes_what_it_writes() {
    let r = rules(
        r#"
        [[rule]]
        unset_headers = ["x-magento-authorized", "authorization"]
        buckets = [{ from = "authorization", to = "x-magento-authorized", cases = [["1", "^Bearer "]], default = "0" }]
        key = ["x-magento-authorized"]
        "#,
    )
    .unwrap();
    let mut forged = request("/graphql", &[("x-magento-authorized", "1")]);
    run(&r, &mut forged);
    assert_eq!(
        forged.headers["x-magento-authorized"], "0",
        "the forged header is replaced"
    );
    let mut signed_in = request("/graphql", &[("authorization", "Bearer abc")]);
    run(&r, &mut signed_in);
    assert_eq!(signed_in.headers["x-magento-authorized"], "1");
    assert!(
        !signed_in.headers.contains_key("authorization"),
        "what the bucket read is still removed"
    );
}

#[test]
fn synthetic_responses_carry_the_captured_parts() {
    let r = rules(
        r#"
        [[rule]]
        match = { hosts = ["old.example.com"], path_regex = "^/(.*)$" }
        respond = { status = 301, location = "https://new.example.com/$1" }
        [[rule]]
        match = { path_prefix = ["/robots.txt"] }
        respond = { body = "User-agent: *\nDisallow: /private/\n" }
        [[rule]]
        match = { headers = { "user-agent" = "(?i)badbot" } }
        respond = { status = 403, body = "no\n" }
        "#,
    )
    .unwrap();
    let mut p = request("/a/b?c=1", &[("host", "old.example.com")]);
    let s = run(&r, &mut p).respond.unwrap();
    assert_eq!(s.status, StatusCode::MOVED_PERMANENTLY);
    assert_eq!(s.headers["location"], "https://new.example.com/a/b?c=1");
    let mut p = request("/robots.txt", &[("host", "example.com")]);
    let s = run(&r, &mut p).respond.unwrap();
    assert_eq!(s.status, StatusCode::OK);
    assert_eq!(&s.body[..], b"User-agent: *\nDisallow: /private/\n");
    assert_eq!(s.headers["content-type"], "text/plain; charset=utf-8");
    let mut p = request("/", &[("user-agent", "BadBot/1")]);
    assert_eq!(
        run(&r, &mut p).respond.unwrap().status,
        StatusCode::FORBIDDEN
    );
}

#[test]
fn response_rules_adjust_storing_and_edit_fields() {
    let r = rules(
        r#"
        [[rule]]
        on = "backend_response"
        match = { status = [404] }
        ttl = "15s"
        [[rule]]
        on = "backend_response"
        match = { status = ["5xx"] }
        store = false
        [[rule]]
        on = "backend_response"
        match = { path_prefix = ["/api/"] }
        set_headers = { "cache-control" = "max-age=300" }
        [[rule]]
        on = "backend_response"
        match = { content_types = ["image/*"] }
        ttl_min = "1h"
        [[rule]]
        on = "backend_response"
        match = { larger_than = "100MiB" }
        store = false
        [[rule]]
        on = "deliver"
        unset_headers = ["server", "x-powered-by"]
        set_headers = { "x-served-by" = "lacquer", "cache-control" = "" }
        [[rule]]
        on = "deliver"
        match = { headers = { "x-debug" = "" } }
        debug_headers = true
        "#,
    )
    .unwrap();
    let p = request("/api/users", &[]);
    let facts = Facts {
        parts: &p,
        client: client(),
        secure: false,
    };
    let mut h = headers(&[("cache-control", "no-store")]);
    let a = r.backend_response(facts, StatusCode::NOT_FOUND, &mut h, None);
    assert_eq!(a.ttl, Some(Duration::from_secs(15)));
    assert_eq!(h["cache-control"], "max-age=300");
    let mut h = headers(&[]);
    assert_eq!(
        r.backend_response(facts, StatusCode::BAD_GATEWAY, &mut h, None)
            .store,
        Some(false)
    );
    let mut h = headers(&[("content-type", "Image/PNG; q=1")]);
    let a = r.backend_response(facts, StatusCode::OK, &mut h, None);
    assert_eq!(a.ttl_min, Some(Duration::from_secs(3600)));
    let mut h = headers(&[("content-length", "209715200")]);
    assert_eq!(
        r.backend_response(facts, StatusCode::OK, &mut h, None)
            .store,
        Some(false)
    );

    let mut h = headers(&[
        ("server", "nginx"),
        ("x-powered-by", "PHP"),
        ("cache-control", "max-age=9"),
    ]);
    let debug = || Debug {
        hits: Some(3),
        ttl_s: Some(42),
        outcome: None,
    };
    assert!(r
        .deliver(facts, StatusCode::OK, &mut h, &debug, None)
        .is_none());
    assert!(!h.contains_key("server") && !h.contains_key("x-powered-by"));
    assert!(!h.contains_key("cache-control"));
    assert_eq!(h["x-served-by"], "lacquer");
    assert!(!h.contains_key("x-cache-hits"), "debug only on request");
    let p = request("/", &[("x-debug", "1")]);
    let facts = Facts { parts: &p, ..facts };
    let mut h = HeaderMap::new();
    r.deliver(facts, StatusCode::OK, &mut h, &debug, None);
    assert_eq!(
        (&h["x-cache-hits"], &h["x-cache-ttl"]),
        (
            &"3".parse::<HeaderValue>().unwrap(),
            &"42".parse::<HeaderValue>().unwrap()
        )
    );
}

/// Magento's `vcl_deliver`: with `X-Magento-Debug` in the response, its `Cache-Control` is copied into
/// `X-Magento-Cache-Control` before the cache rewrites it for browsers; without it, nothing is.
#[test]
fn response_rules_read_the_response_they_edit() {
    let r = rules(
        r#"
        [[rule]]
        on = "deliver"
        match = { response_headers = { "x-magento-debug" = "" } }
        set_headers = { "x-magento-cache-control" = "${resp.cache-control}" }
        [[rule]]
        on = "deliver"
        match = { response_headers = { "cache-control" = "^public" } }
        unset_headers = ["x-magento-tags"]
        set_headers = { "cache-control" = "no-store", "x-was" = "${resp.cache-control}" }
        [[rule]]
        on = "backend_response"
        match = { response_headers = { "x-magento-cache-id" = "" } }
        set_headers = { "x-cache-id-seen" = "${resp.x-magento-cache-id}" }
        "#,
    )
    .unwrap();
    let p = request("/p", &[]);
    let facts = Facts {
        parts: &p,
        client: client(),
        secure: false,
    };
    let deliver = |pairs: &[(&str, &str)]| {
        let mut h = headers(pairs);
        r.deliver(facts, StatusCode::OK, &mut h, &Debug::default, None);
        h
    };
    let h = deliver(&[
        ("x-magento-debug", "1"),
        ("cache-control", "public, max-age=86400"),
        ("x-magento-tags", "cat_p_1"),
    ]);
    assert_eq!(h["x-magento-cache-control"], "public, max-age=86400");
    assert_eq!(h["cache-control"], "no-store");
    assert_eq!(
        h["x-was"], "public, max-age=86400",
        "read before the rule edits"
    );
    assert!(!h.contains_key("x-magento-tags"));
    let h = deliver(&[("cache-control", "private")]);
    assert!(!h.contains_key("x-magento-cache-control"));
    assert_eq!(
        h["cache-control"], "private",
        "a private answer's is left alone"
    );
    let mut h = headers(&[("x-magento-cache-id", "abc")]);
    r.backend_response(facts, StatusCode::OK, &mut h, None);
    assert_eq!(h["x-cache-id-seen"], "abc");
    for (rule, error) in [
        (
            r#"set_headers = { "x-a" = "${resp.cache-control}" }"#,
            "rule[0].set_headers.x-a: reads the response",
        ),
        (
            r#"match = { response_headers = { "x-a" = "" } }
            pass = true"#,
            "rule[0].match.response_headers: not in the request phase",
        ),
        (
            r#"on = "error"
            respond = { status = 503, body = "${resp.x-a}" }"#,
            "rule[0].respond: reads the response",
        ),
    ] {
        let err = rules(&format!("[[rule]]\n{rule}")).unwrap_err().to_string();
        assert!(err.contains(error), "{err}");
    }
}

/// How the cache answered, as a deliver condition and a template value; refused where it is not known.
#[test]
fn deliver_rules_see_the_outcome() {
    let r = rules(
        r#"
        [[rule]]
        on = "deliver"
        match = { outcome = ["uncacheable", "pass"] }
        set_headers = { "x-not-cached" = "${outcome}" }
        [[rule]]
        on = "deliver"
        set_headers = { "x-magento-cache-debug" = "${outcome}" }
        "#,
    )
    .unwrap();
    let p = request("/p", &[]);
    let facts = Facts {
        parts: &p,
        client: client(),
        secure: false,
    };
    let deliver = |outcome| {
        let mut h = HeaderMap::new();
        let debug = move || Debug {
            outcome,
            ..Debug::default()
        };
        r.deliver(facts, StatusCode::OK, &mut h, &debug, None);
        h
    };
    let h = deliver(Some(Outcome::Uncacheable));
    assert_eq!(
        (&h["x-not-cached"], &h["x-magento-cache-debug"]),
        (
            &HeaderValue::from_static("uncacheable"),
            &HeaderValue::from_static("uncacheable")
        )
    );
    let h = deliver(Some(Outcome::Hit));
    assert!(!h.contains_key("x-not-cached"));
    assert_eq!(h["x-magento-cache-debug"], "hit");
    assert!(
        !deliver(None).contains_key("x-not-cached"),
        "unknown: no outcome matches"
    );
    for (rule, error) in [
        (
            r#"on = "backend_response"
            match = { outcome = ["hit"] }
            store = false"#,
            "rule[0].match.outcome: not in the backend_response phase",
        ),
        (
            r#"on = "deliver"
            match = { outcome = ["cached"] }
            set_headers = { x = "1" }"#,
            "\"cached\" is not an outcome",
        ),
        (
            r#"on = "backend_response"
            set_headers = { x = "${outcome}" }"#,
            "reads the outcome",
        ),
    ] {
        let err = rules(&format!("[[rule]]\n{rule}")).unwrap_err().to_string();
        assert!(err.contains(error), "{err}");
    }
}

/// Conditions that compare the request with the response, and a cookie's absence.
#[test]
fn the_request_and_the_response_compared() {
    let r = rules(
        r#"
        [[rule]]
        on = "backend_response"
        match = { different_headers = ["x-magento-cache-id"] }
        store = false
        [[rule]]
        on = "backend_response"
        match = { same_headers = ["x-tenant"], without_cookies = ["X-Magento-Vary"] }
        ttl = "1m"
        "#,
    )
    .unwrap();
    let decide = |request_headers: &[(&str, &str)], response: &[(&str, &str)]| {
        let p = request("/graphql", request_headers);
        let facts = Facts {
            parts: &p,
            client: client(),
            secure: false,
        };
        let mut h = headers(response);
        r.backend_response(facts, StatusCode::OK, &mut h, None)
    };
    let id = |v| ("x-magento-cache-id", v);
    assert_eq!(decide(&[id("a")], &[id("b")]).store, Some(false));
    assert_eq!(decide(&[id("a")], &[id("a")]).store, None);
    assert_eq!(decide(&[], &[]).store, None, "absent from both is alike");
    assert_eq!(decide(&[id("a")], &[]).store, Some(false));
    let ttl = Some(Duration::from_secs(60));
    assert_eq!(decide(&[("x-tenant", "t")], &[("x-tenant", "t")]).ttl, ttl);
    assert_eq!(decide(&[("x-tenant", "t")], &[("x-tenant", "u")]).ttl, None);
    assert_eq!(
        decide(&[("cookie", "a=1; X-Magento-Vary=g")], &[]).ttl,
        None,
        "the cookie is sent"
    );
    assert_eq!(decide(&[("cookie", "a=1")], &[]).ttl, ttl);
    let err = rules("[[rule]]\nmatch = { same_headers = [\"x\"] }\npass = true")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("rule[0].match.same_headers: not in the request phase"),
        "{err}"
    );
}

#[test]
fn counters_and_traces_follow_matches() {
    let r = rules(
        r#"
        [[rule]]
        name = "a"
        match = { path_prefix = ["/a"] }
        pass = true
        [[rule]]
        name = "b"
        set_headers = { x = "1" }
        "#,
    )
    .unwrap();
    let mut trace = Trace::default();
    let mut p = request("/b", &[]);
    r.request(&mut p, client(), false, &|_, _| true, Some(&mut trace));
    let mut p = request("/a", &[]);
    run(&r, &mut p);
    let steps: Vec<_> = trace.steps.iter().map(|s| (&*s.name, s.matched)).collect();
    assert_eq!(steps, [("a", false), ("b", true)]);
    let counts: Vec<_> = r.counters().map(|(n, _, c)| (n.to_owned(), c)).collect();
    assert_eq!(
        counts,
        [("a".to_owned(), 1), ("b".to_owned(), 1)],
        "a traced run (explain, an example) is not a request: it counts nothing"
    );
}

#[test]
fn bad_rules_are_refused_with_their_name_and_field() {
    let cases = [
        (
            r#"key_cookie_values = ["X-Magento-Vary"]"#,
            "rule[0].key_cookie_values: forwards every cookie: say so with forward_all_cookies = true",
        ),
        (
            r#"key_cookie_values = ["X-Magento-Vary"]
            forward_all_cookies = true
            cookies = { keep = ["X-Magento-Vary"] }"#,
            "rule[0].forward_all_cookies: and cookies: every cookie is forwarded, or not; pick one",
        ),
        (
            r#"key_cookie_values = ["a;b"]
            forward_all_cookies = true"#,
            "rule[0].key_cookie_values: \"a;b\" is not a cookie name",
        ),
        (
            r#"on = "deliver"
            purge = "url""#,
            "rule[0].purge: not in the deliver phase",
        ),
        (
            r#"ban = [{ object_header = "x-tags", url = true, regex_from = "x-pattern" }]"#,
            "rule[0].ban[0]: object_header and url: a ban matches one field; pick one",
        ),
        (
            r#"ban = [{ regex_from = "x-pattern" }]"#,
            "rule[0].ban[0]: matches nothing: give object_header, or url = true",
        ),
        (
            r#"ban = [{ object_header = "x tags", regex_from = "x-pattern" }]"#,
            "rule[0].ban[0].object_header",
        ),
        (
            r#"purge = "path"
            pass = true"#,
            "rule[0].purge: and pass: a request turned into an invalidation is answered here",
        ),
        (
            r#"on = "request"
            ttl = "1s""#,
            "rule[0].ttl: not in the request phase",
        ),
        (
            r#"match = { status = [404] }
            pass = true"#,
            "rule[0].match.status: not in the request phase",
        ),
        (
            r#"name = "x"
            match = { path_regex = "(" }
            pass = true"#,
            "rule[0] (\"x\").match.path_regex",
        ),
        (
            r#"match = { path_regex = "a{1000}{1000}" }
            pass = true"#,
            "too large once compiled",
        ),
        (
            r#"set_headers = { "x-a" = "a\r\nb" }"#,
            "rule[0].set_headers.x-a",
        ),
        (
            r#"rewrite_path = { from = "^/(.*)", to = "/a b/$1" }"#,
            "cannot be in a request target",
        ),
        (
            r#"rewrite_path = { from = "^/(.*)", to = "$1" }"#,
            "must start with `/`",
        ),
        (
            r#"rewrite_path = { from = "^/.*", to = "/$1" }"#,
            "group(s)",
        ),
        (
            r#"pass = true
            pipe = true"#,
            "rule[0].pipe",
        ),
        (
            r#"respond = { status = 200 }
            pass = true"#,
            "rule[0].respond: and pass",
        ),
        (
            r#"respond = { file = "/nonexistent/403.html" }"#,
            "rule[0].respond.file: /nonexistent/403.html",
        ),
        ("backend = \"nope\"", "no backend or director"),
        (r#"match = { hosts = ["a.com"] }"#, "has no action"),
        (
            r#"match = { clients = ["10.0.0.0/8"], except_clients = ["10.0.0.0/8"] }
            pass = true"#,
            "can never match",
        ),
        (
            r#"match = { headers = { cookie = "" }, without_headers = ["cookie"] }
            pass = true"#,
            "can never match",
        ),
        (
            r#"match = { path_prefix = ["api/"] }
            pass = true"#,
            "never matches",
        ),
        (
            r#"on = "backend_response"
            store = false
            ttl = "1s""#,
            "and store = false",
        ),
        (
            r#"on = "backend_response"
            match = { status = [999] }
            store = false"#,
            "not a status code",
        ),
        (
            r#"on = "deliver"
            set_headers = { "content-length" = "1" }"#,
            "frames the message",
        ),
        (
            r#"on = "deliver"
            set_headers = { host = "a" }"#,
            "Host is set in the request phase",
        ),
        (
            r#"unset_headers = ["x-a"]
            set_headers = { "x-a" = "1" }"#,
            "contradictory",
        ),
        (r#"query = {}"#, "changes nothing"),
    ];
    for (rule, want) in cases {
        let err = rules(&format!("[[rule]]\n{rule}\n"))
            .expect_err(rule)
            .to_string();
        assert!(err.contains(want), "{rule}: {err} (wanted {want:?})");
    }
    let big = format!(
        "[[rule]]\nrespond = {{ body = \"{}\" }}\n",
        "x".repeat(MAX_BODY + 1)
    );
    assert!(rules(&big).unwrap_err().to_string().contains("use `file`"));
    let twice = "[[rule]]\nname = \"a\"\npass = true\n[[rule]]\nname = \"a\"\npass = true\n";
    assert!(rules(twice)
        .unwrap_err()
        .to_string()
        .contains("rule[1] (\"a\").name"));
}

#[test]
fn a_host_a_rule_makes_from_the_path_must_still_be_a_host() {
    let r = rules(
        r#"
        [[rule]]
        match = { path_regex = "^/site/([^?]*)" }
        set_headers = { host = "$1" }
        "#,
    )
    .unwrap();
    let mut p = request("/site/a.example.com", &[("host", "example.com")]);
    assert!(run(&r, &mut p).rerouted);
    assert_eq!(p.headers["host"], "a.example.com");
    for bad in ["/site/a.com/evil", "/site/a.com:99999", "/site/"] {
        let mut p = request(bad, &[("host", "example.com")]);
        run(&r, &mut p);
        assert_eq!(p.headers["host"], "example.com", "{bad}");
    }
}

proptest::proptest! {
    /// Whatever a client sends, the head a full set of request rules leaves is one the rest of the data
    /// path takes: a valid head (one valid Host, a target that parses) whose key's first `/` ends the host.
    #[test]
    fn request_rules_leave_a_valid_head(
        path in "/[a-zA-Z0-9/._~%-]{0,24}",
        query in proptest::option::of("[a-zA-Z0-9=&_%.-]{0,24}"),
        host in "[a-zA-Z0-9.-]{1,12}(:[0-9]{1,5})?",
        cookie in "[a-zA-Z0-9=;_ -]{0,32}",
        lang in "[a-zA-Z,;=.0-9-]{0,16}",
    ) {
        let r = rules(
            r#"
            [[rule]]
            normalize_host = true
            unset_headers = ["x-*"]
            query = { sort = true, drop = ["utm_*"] }
            cookies = { drop = ["_ga*"] }
            buckets = [{ from = "accept-language", cases = [["fr", "^fr"]], default = "en" }]
            [[rule]]
            match = { path_regex = "^/([^/?]*)(.*)$" }
            rewrite_path = { from = "^/([^/]*)/(.*)$", to = "/$2/$1" }
            set_headers = { host = "$1", "x-real-ip" = "${client_ip}", "x-target" = "${target}" }
            "#,
        )
        .unwrap();
        let target = match &query {
            Some(q) => format!("{path}?{q}"),
            None => path.clone(),
        };
        let Ok(mut p) = http::Request::builder()
            .uri(target.as_str())
            .header("host", host.as_str())
            .header("cookie", cookie.as_str())
            .header("accept-language", lang.as_str())
            .body(())
            .map(|r| r.into_parts().0)
        else {
            return Ok(());
        };
        if lacquer_policy::head::check(&p).is_err() {
            return Ok(());
        }
        run(&r, &mut p);
        proptest::prop_assert!(lacquer_policy::head::check(&p).is_ok(), "{:?}", p);
        let key = lacquer_policy::key::primary_key(&p);
        let host_part = key.split('/').next().unwrap();
        proptest::prop_assert!(lacquer_policy::head::valid_host(host_part.as_bytes()), "{key}");
        proptest::prop_assert!(p.uri.path().starts_with('/'));
    }
}

/// A head the response-only deliver rules edited once (`prepare`), then delivered with the rest
/// (`deliver_prepared`), is the head the whole phase makes of the unedited one, and every rule is counted
/// and traced as the whole phase counts and traces it: for rules that prepare nothing, rules that end the
/// phase early, and rules that look at the request after those that do not.
#[test]
fn a_prepared_head_is_delivered_as_the_whole_phase_delivers_it() {
    let sets = [
        r#"
        [[rule]]
        name = "served-by"
        on = "deliver"
        set_headers = { "x-served-by" = "lacquer-1" }
        [[rule]]
        name = "hide"
        on = "deliver"
        unset_headers = ["server", "x-powered-*"]
        [[rule]]
        name = "html"
        on = "deliver"
        match = { content_types = ["text/html"] }
        set_headers = { "cache-control" = "max-age=60" }
        [[rule]]
        name = "big"
        on = "deliver"
        match = { status = ["2xx"] }
        append_headers = { "x-class" = "ok" }
        [[rule]]
        name = "secure"
        on = "deliver"
        match = { hosts = ["secure.test"] }
        set_headers = { "strict-transport-security" = "max-age=600" }
        [[rule]]
        name = "after"
        on = "deliver"
        set_headers = { "x-after" = "1" }
        "#,
        r#"
        [[rule]]
        name = "stopper"
        on = "deliver"
        match = { status = [200] }
        set_headers = { "x-a" = "1" }
        stop = true
        [[rule]]
        name = "never"
        on = "deliver"
        set_headers = { "x-b" = "1" }
        "#,
        r#"
        [[rule]]
        name = "by-path"
        on = "deliver"
        match = { path_prefix = ["/a"] }
        set_headers = { "x-a" = "1" }
        [[rule]]
        name = "later"
        on = "deliver"
        set_headers = { "x-b" = "1" }
        "#,
        r#"
        [[rule]]
        name = "age"
        on = "deliver"
        unset_headers = ["x-*"]
        [[rule]]
        name = "client"
        on = "deliver"
        set_headers = { "x-client" = "${client_ip}" }
        "#,
    ];
    let heads = [
        (
            StatusCode::OK,
            vec![
                ("content-type", "text/html; charset=utf-8"),
                ("content-length", "4096"),
                ("server", "origin"),
                ("x-powered-by", "php"),
                ("x-cache", "HIT"),
            ],
        ),
        (
            StatusCode::OK,
            vec![("content-type", "image/png"), ("content-length", "10")],
        ),
        (StatusCode::NOT_FOUND, vec![("content-length", "5000")]),
    ];
    let requests = [
        request("/a/page", &[("host", "secure.test")]),
        request("/b", &[("host", "www.test")]),
    ];
    for text in sets {
        for (status, fields) in &heads {
            for parts in &requests {
                let whole = rules(text).unwrap();
                let split = rules(text).unwrap();
                let facts = Facts {
                    parts,
                    client: client(),
                    secure: false,
                };
                let mut expected = headers(fields);
                let mut expected_trace = Trace::default();
                whole.deliver(
                    facts,
                    *status,
                    &mut expected,
                    &Debug::default,
                    Some(&mut expected_trace),
                );
                whole.deliver(facts, *status, &mut headers(fields), &Debug::default, None);

                let mut got = headers(fields);
                let ahead = split.prepare(*status, &mut got);
                let mut trace = Trace::default();
                let mut traced = got.clone();
                split.deliver_prepared(
                    facts,
                    *status,
                    &mut traced,
                    &Debug::default,
                    &ahead,
                    Some(&mut trace),
                );
                split.deliver_prepared(facts, *status, &mut got, &Debug::default, &ahead, None);
                let case = format!("{text}\n{status} {fields:?} {}", parts.uri);
                assert_eq!(got, expected, "{case}");
                assert_eq!(traced, expected, "{case}");
                assert_eq!(trace.steps, expected_trace.steps, "{case}");
                let counts = |r: &Rules| r.counters().map(|(_, _, n)| n).collect::<Vec<_>>();
                assert_eq!(counts(&split), counts(&whole), "{case}");
            }
        }
    }
    let r = rules(sets[0]).unwrap();
    assert!(r.prepares());
    assert!(
        !rules(sets[2]).unwrap().prepares(),
        "a rule on the path comes first"
    );
    assert!(!rules(sets[3]).unwrap().prepares(), "`x-*` takes X-Cache");
}

/// A head prepared under other rules (a reload that changed them came between) is given the whole phase
/// of the rules now; rules compiled again as they were (a reload of the same file) skip what it was
/// edited by, and count it.
#[test]
fn a_head_prepared_under_other_rules_gets_the_whole_phase() {
    let text = |value: &str| {
        format!(
            r#"
            [[rule]]
            on = "deliver"
            set_headers = {{ "x-a" = "{value}" }}
            [[rule]]
            on = "deliver"
            append_headers = {{ "x-b" = "1" }}
            "#
        )
    };
    let (old, same, new) = (
        rules(&text("1")).unwrap(),
        rules(&text("1")).unwrap(),
        rules(&text("2")).unwrap(),
    );
    assert_eq!(old.id(), same.id());
    assert_ne!(old.id(), new.id());
    assert_eq!(old.edited_fields(), Some(2));
    let parts = request("/", &[]);
    let facts = Facts {
        parts: &parts,
        client: client(),
        secure: false,
    };
    let deliver = |rules: &Rules| {
        let mut head = HeaderMap::new();
        let ahead = old.prepare(StatusCode::OK, &mut head);
        rules.deliver_prepared(
            facts,
            StatusCode::OK,
            &mut head,
            &Debug::default,
            &ahead,
            None,
        );
        head
    };
    let head = deliver(&same);
    assert_eq!(head.get("x-a").unwrap(), "1");
    assert_eq!(head.get("x-b").unwrap(), "1", "appended once");
    assert_eq!(
        same.counters().map(|(_, _, n)| n).collect::<Vec<_>>(),
        [1, 1]
    );
    let head = deliver(&new);
    assert_eq!(head.get("x-a").unwrap(), "2");
    assert_eq!(
        new.counters().map(|(_, _, n)| n).collect::<Vec<_>>(),
        [1, 1]
    );
}

/// The lenient reading of the target a rule's path condition asked for is read again once a rule
/// rewrites the target: a pass for what the target read as before the rewrite does not follow it.
#[test]
fn a_rewritten_target_is_read_leniently_anew() {
    let r = rules(
        r#"
        [[rule]]
        match = { path_prefix = ["/never/"] }
        pass = true
        [[rule]]
        rewrite_path = { from = "^/;/account/(.*)$", to = "/shop/$1" }
        [[rule]]
        name = "account"
        match = { path_prefix = ["/account/"] }
        pass = true
        "#,
    )
    .unwrap();
    let mut p = request("/;/account/cart", &[]);
    let v = run(&r, &mut p);
    assert_eq!(p.uri.path(), "/shop/cart");
    assert!(
        !v.pass,
        "the rewritten target is not /account/ however it is read"
    );
    let mut p = request("/%2Faccount/cart", &[]);
    assert!(run(&r, &mut p).pass, "a lenient spelling of /account/ is");
}

/// What loosens caching must hold for every reading of the path (docs/rules.md, "Tightening and
/// loosening"): the rules tell the data path whether the readings as sent and as a lenient origin reads
/// it agree on every rule's path condition, and an extension test never holds for a segment with `;`.
#[test]
fn path_readings_agree_or_not_for_every_rule_with_a_path_condition() {
    // As the data path asks: only for a target a lenient origin reads otherwise.
    let agrees = |r: &Rules, p: &Parts| {
        let target = p.uri.path_and_query().unwrap().as_str();
        lacquer_policy::normalize::lenient(target).is_none_or(|l| r.readings_agree(p, &l))
    };
    let r = rules(
        r#"
        [[rule]]
        name = "static"
        match = { extensions = ["css", "js"] }
        cache_cookies = true
        [[rule]]
        name = "assets"
        match = { path_prefix = ["/assets/"] }
        cache_cookies = true
        "#,
    )
    .unwrap();
    // (target, agree, `static` matches as sent)
    let cases = [
        ("/a/site.css", true, true),
        ("/a/site.css?v=1;2", true, true),
        // No reading is a `.css` file: the rule holds for neither.
        ("/account/me;x.css", true, false),
        ("/a/site.css;jsessionid=1", false, false),
        ("/assets/..;/account/me", false, false),
        ("/assets/a;v=1/b", true, false),
        ("/assets/%2e%2e;/account/me", false, false),
        ("/plain/page", true, false),
    ];
    for (target, agree, css) in cases {
        let p = request(target, &[]);
        assert_eq!(agrees(&r, &p), agree, "{target}");
        let mut p = request(target, &[("cookie", "s=1")]);
        let v = run(&r, &mut p);
        if css {
            assert!(v.cache_cookies, "{target}");
        }
    }
    let none = rules("[[rule]]\nname = \"h\"\nset_headers = { x-a = \"1\" }\n").unwrap();
    assert!(agrees(&none, &request("/assets/..;/account/me", &[])));
}

/// A `location` template that puts the client's bytes after a `/` never sends a browser to another host
/// (`//evil.example`, `/\evil.example`, `/<tab>/evil.example` are read as one).
#[test]
fn a_rendered_location_never_leaves_the_site() {
    let r = rules(
        r#"
        [[rule]]
        name = "go"
        match = { path_regex = "^/go/(.*)$" }
        respond = { location = "/$1" }
        "#,
    )
    .unwrap();
    let cases = [
        ("/go/\\evil.example", "/%5Cevil.example"),
        ("/go//evil.example", "/%2Fevil.example"),
        ("/go/%2F%2Fevil.example", "/%2F%2Fevil.example"),
        ("/go/shop/cart?x=1", "/shop/cart?x=1"),
    ];
    for (target, want) in cases {
        let mut p = request(target, &[]);
        let made = run(&r, &mut p).respond.expect("answered");
        assert_eq!(made.headers[http::header::LOCATION], want, "{target}");
    }
}
