use http::{HeaderMap, StatusCode};

use super::*;
use crate::{test_headers, Lines};

const PREFERENCE: [Coding; 3] = [Coding::Br, Coding::Gzip, Coding::Zstd];

fn accepts(value: Option<&str>) -> Accepts {
    match value {
        Some(v) => Accepts::from_headers(&test_headers(&[("accept-encoding", v)])),
        None => Accepts::from_headers(&HeaderMap::new()),
    }
}

#[test]
fn the_best_coding_for_real_accept_encoding_fields() {
    use Coding::*;
    // (Accept-Encoding, best of br/gzip/zstd, best of gzip only)
    let cases: &[(Option<&str>, Option<Coding>, Option<Coding>)] = &[
        (Some("gzip, deflate, br, zstd"), Some(Br), Some(Gzip)), // Chrome 123+
        (Some("gzip, deflate, br"), Some(Br), Some(Gzip)),       // Firefox, Safari 17
        (Some("gzip, deflate"), Some(Gzip), Some(Gzip)),         // curl --compressed, old Safari
        (Some("br;q=1.0, gzip;q=0.8, *;q=0.1"), Some(Br), Some(Gzip)),
        (
            Some("gzip;q=1.0, identity; q=0.5, *;q=0"),
            Some(Gzip),
            Some(Gzip),
        ),
        (Some("zstd"), Some(Zstd), None),
        (Some("gzip;q=0.5, zstd;q=0.9"), Some(Zstd), Some(Gzip)),
        (Some("GZIP, BR"), Some(Br), Some(Gzip)),
        (Some("x-gzip"), Some(Gzip), Some(Gzip)),
        (Some("*"), Some(Br), Some(Gzip)),
        (Some("*;q=0.5, br;q=0"), Some(Gzip), Some(Gzip)),
        (Some("br;q=0, gzip;q=0"), None, None),
        (Some("gzip;q=0.000"), None, None),
        (Some("gzip;q=0.001"), Some(Gzip), Some(Gzip)),
        (Some("identity"), None, None),
        (Some(""), None, None),
        (None, None, None),
        (Some("deflate, compress"), None, None),
        // A malformed quality makes the member ignored, not accepted at 1.
        (Some("br;q=2, gzip;q=abc, zstd;q=0.5x"), None, None),
        (Some("br;q=1.0001"), None, None),
        (Some("gzip ; q=0.7 , br ; q=0.6"), Some(Gzip), Some(Gzip)),
        // The first mention wins.
        (Some("gzip;q=0, gzip"), None, None),
    ];
    for (value, best, gzip_only) in cases {
        let a = accepts(*value);
        assert_eq!(a.best(&PREFERENCE), *best, "{value:?}");
        assert_eq!(a.best(&[Gzip]), *gzip_only, "{value:?} gzip only");
    }
}

#[test]
fn identity_is_acceptable_unless_refused() {
    for (value, ok) in [
        (None, true),
        (Some("gzip"), true),
        (Some("identity;q=0"), false),
        (Some("*;q=0"), false),
        (Some("*;q=0, identity"), true),
        (Some("br, *;q=0.5"), true),
    ] {
        assert_eq!(accepts(value).accepts(None), ok, "{value:?}");
    }
}

#[test]
fn a_field_of_ten_thousand_members_is_read_in_one_pass() {
    let mut value = String::new();
    for n in 0..10_000 {
        value.push_str(&format!("x-coding-{n};q=0.5, "));
    }
    value.push_str("gzip;q=0.4");
    let a = accepts(Some(&value));
    assert_eq!(a.best(&PREFERENCE), Some(Coding::Gzip));
    assert_eq!(a.others.len(), OTHERS_KEPT);
}

#[test]
fn content_encoding_is_read_as_one_coding_or_other() {
    let cases: &[(Lines<'_>, Coded)] = &[
        (&[], Coded::Identity),
        (&[("content-encoding", "identity")], Coded::Identity),
        (&[("content-encoding", "")], Coded::Identity),
        (&[("content-encoding", "gzip")], Coded::With(Coding::Gzip)),
        (&[("content-encoding", "X-GZIP")], Coded::With(Coding::Gzip)),
        (&[("content-encoding", "br")], Coded::With(Coding::Br)),
        (&[("content-encoding", "zstd")], Coded::With(Coding::Zstd)),
        (&[("content-encoding", "deflate")], Coded::Other),
        (&[("content-encoding", "gzip, br")], Coded::Other),
        (
            &[("content-encoding", "gzip"), ("content-encoding", "gzip")],
            Coded::Other,
        ),
    ];
    for (h, want) in cases {
        assert_eq!(coded(&test_headers(h)), *want, "{h:?}");
    }
}

#[test]
fn what_is_compressed_when_stored() {
    let settings = Compression::default();
    let html = ("content-type", "text/html; charset=utf-8");
    let cases: &[(u16, Lines<'_>, Option<Coding>)] = &[
        (200, &[html], Some(Coding::Br)),
        (200, &[html, ("content-length", "5000")], Some(Coding::Br)),
        (
            200,
            &[("content-type", "Application/JSON")],
            Some(Coding::Br),
        ),
        (200, &[("content-type", "image/svg+xml")], Some(Coding::Br)),
        (
            200,
            &[("content-type", "application/wasm")],
            Some(Coding::Br),
        ),
        (
            200,
            &[("content-type", "text/css;charset=utf-8")],
            Some(Coding::Br),
        ),
        // Small, or coded already, or no-transform, or not text.
        (200, &[html, ("content-length", "1023")], None),
        (200, &[html, ("content-encoding", "gzip")], None),
        (200, &[html, ("content-encoding", "deflate")], None),
        (
            200,
            &[html, ("cache-control", "public, no-transform")],
            None,
        ),
        (200, &[html, ("cache-control", "No-Transform")], None),
        (200, &[("content-type", "image/png")], None),
        (200, &[("content-type", "video/mp4")], None),
        (200, &[("content-type", "application/zip")], None),
        (200, &[("content-type", "application/octet-stream")], None),
        (200, &[], None),
        (200, &[("content-type", "text")], None),
        // Only complete 200s: not partial content, not error pages.
        (206, &[html, ("content-range", "bytes 0-9/100")], None),
        (404, &[html], None),
    ];
    for (status, h, want) in cases {
        let status = StatusCode::from_u16(*status).unwrap();
        assert_eq!(
            compress_with(status, &test_headers(h), &settings),
            *want,
            "{status} {h:?}"
        );
    }
    let gzip_first = Compression {
        codings: vec![Coding::Gzip, Coding::Br],
        types: vec!["application/json".into()],
        ..Compression::default()
    };
    assert_eq!(
        compress_with(
            StatusCode::OK,
            &test_headers(&[("content-type", "application/json")]),
            &gzip_first
        ),
        Some(Coding::Gzip)
    );
    assert_eq!(
        compress_with(StatusCode::OK, &test_headers(&[html]), &gzip_first),
        None
    );
}

#[test]
fn how_a_stored_body_reaches_each_client() {
    use Delivery::*;
    let br = &[("content-encoding", "br")][..];
    let gzip = &[("content-encoding", "gzip")][..];
    let deflate = &[("content-encoding", "deflate")][..];
    // (stored, client's Accept-Encoding, no-transform, delivery)
    let cases: &[(Lines<'_>, Option<&str>, bool, Delivery)] = &[
        (&[], None, false, AsStored),
        (&[], Some("gzip"), true, AsStored),
        (br, Some("gzip, deflate, br"), false, AsStored),
        (br, Some("gzip, deflate"), false, Decode(Coding::Br)),
        (br, None, false, Decode(Coding::Br)),
        (br, Some("br;q=0"), false, Decode(Coding::Br)),
        (gzip, Some("*"), false, AsStored),
        (gzip, Some("identity"), false, Decode(Coding::Gzip)),
        (br, Some("gzip"), true, Forward),
        (deflate, Some("deflate, gzip"), false, AsStored),
        (deflate, Some("gzip"), false, Forward),
        (deflate, Some("*"), false, AsStored),
    ];
    for (stored, client, no_transform, want) in cases {
        let got = delivery(&test_headers(stored), &accepts(*client), *no_transform);
        assert_eq!(got, *want, "{stored:?} for {client:?}");
    }
}

#[test]
fn etags_turn_weak() {
    for (etag, want) in [
        ("\"abc\"", "W/\"abc\""),
        ("W/\"abc\"", "W/\"abc\""),
        ("\"\"", "W/\"\""),
        ("abc", "abc"),
    ] {
        assert_eq!(weak_etag(&HeaderValue::from_static(etag)), want);
    }
}

#[test]
fn the_origin_is_asked_for_every_configured_coding() {
    assert_eq!(origin_accept_encoding(&Compression::default()), "br, gzip");
}
