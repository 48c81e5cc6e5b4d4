//! Hostile references and CMCD data for `hls::resolve` and `hls::next_request`: whatever `resolve`
//! returns becomes a prefetch's request target (`target.parse::<Uri>()`), which must name no host.

use lacquer_policy::hls::{next_request, resolve};

#[test]
fn no_resolved_reference_parses_as_a_target_naming_a_host() {
    let bases = [
        "/live/a/index.m3u8",
        "/a.m3u8",
        "/",
        "//x/y.m3u8",
        "/live/a/s0.m4s?x=1",
    ];
    let references = [
        "/.//evil.example/x",
        "..//evil.example/x",
        ".//evil.example/x",
        "./..//evil.example/x",
        "/..//evil.example/x",
        "%2F%2Fevil.example/x",
        "\\\\evil.example\\x",
        "/\\evil.example/x",
        "http:evil.example/x",
        "http:/evil.example/x",
        "HTTP://evil.example/x",
        "//evil.example",
        "///evil.example/x",
        "../_/x",
        "../../_x",
        "?q=1",
        "#frag",
        "s1.m4s#frag",
        "s1.m4s?a=1#f",
        ".",
        "..",
        "%2e%2e/%2e%2e/%2e%2e/x",
        "a:b",
        "./a:b",
        "@evil.example/x",
        "x@evil.example",
        "//user@evil.example/x",
        "/live/../../x",
    ];
    for base in bases {
        for reference in references {
            let Some(target) = resolve(base, reference) else {
                continue;
            };
            let uri: Result<http::Uri, _> = target.parse();
            if let Ok(uri) = uri {
                assert!(
                    uri.authority().is_none() && uri.scheme().is_none(),
                    "{base} + {reference} -> {target}: {:?}",
                    uri.authority()
                );
                assert!(
                    uri.path().starts_with('/'),
                    "{base} + {reference} -> {target}"
                );
            }
        }
    }
}

#[test]
fn cmcd_with_odd_data_names_nothing_or_something_sane() {
    let mut headers = http::HeaderMap::new();
    for value in [
        r#"nor="%2F%2Fevil.example%2Fx""#,
        r#"nor="%25%32%46%25%32%46evil""#,
        r#"nrr="0-18446744073709551615""#,
        r#"nrr="18446744073709551615-""#,
        r#"nrr="-5""#,
        r#"nor="a", nor="b""#,
    ] {
        headers.insert("cmcd-request", value.parse().unwrap());
        let next = next_request(&headers, None);
        if let Some(object) = &next.object {
            if let Some(t) = resolve("/live/a.m4s", object) {
                let uri: http::Uri = t.parse().unwrap();
                assert!(uri.authority().is_none(), "{value} -> {t}");
            }
        }
    }
}
