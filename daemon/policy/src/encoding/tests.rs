use http::{HeaderMap, StatusCode};

use super::*;
use crate::{test_headers, Lines};

fn accepts(value: Option<&str>) -> Accepts {
    match value {
        Some(v) => Accepts::from_headers(&test_headers(&[("accept-encoding", v)])),
        None => Accepts::from_headers(&HeaderMap::new()),
    }
}

/// The codings of br/gzip/zstd an `Accept-Encoding` accepts, as a string of their initials.
fn accepted(a: &Accepts) -> String {
    [(Coding::Br, 'b'), (Coding::Gzip, 'g'), (Coding::Zstd, 'z')]
        .iter()
        .filter(|(c, _)| a.accepts(Some(*c)))
        .map(|(_, l)| *l)
        .collect()
}

#[test]
fn what_real_accept_encoding_fields_accept() {
    let cases: &[(Option<&str>, &str)] = &[
        (Some("gzip, deflate, br, zstd"), "bgz"), // Chrome 123+
        (Some("gzip, deflate, br"), "bg"),        // Firefox, Safari 17
        (Some("gzip, deflate"), "g"),             // curl --compressed, old Safari
        (Some("br;q=1.0, gzip;q=0.8, *;q=0.1"), "bgz"),
        (Some("gzip;q=1.0, identity; q=0.5, *;q=0"), "g"),
        (Some("zstd"), "z"),
        (Some("GZIP, BR"), "bg"),
        (Some("x-gzip"), "g"),
        (Some("*"), "bgz"),
        (Some("*;q=0.5, br;q=0"), "gz"),
        (Some("br;q=0, gzip;q=0"), ""),
        (Some("gzip;q=0.000"), ""),
        (Some("gzip;q=0.001"), "g"),
        (Some("identity"), ""),
        (Some(""), ""),
        (None, ""),
        (Some("deflate, compress"), ""),
        // A malformed quality makes the member ignored, not accepted at 1.
        (Some("br;q=2, gzip;q=abc, zstd;q=0.5x"), ""),
        (Some("br;q=1.0001"), ""),
        (Some("gzip ; q=0.7 , br ; q=0.6"), "bg"),
        // The first mention wins.
        (Some("gzip;q=0, gzip"), ""),
    ];
    for (value, want) in cases {
        assert_eq!(accepted(&accepts(*value)), *want, "{value:?}");
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
    assert_eq!(accepted(&a), "g");
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
        (200, &[html], Some(Coding::Gzip)),
        (200, &[html, ("content-length", "5000")], Some(Coding::Gzip)),
        (
            200,
            &[("content-type", "Application/JSON")],
            Some(Coding::Gzip),
        ),
        (
            200,
            &[("content-type", "image/svg+xml")],
            Some(Coding::Gzip),
        ),
        (
            200,
            &[("content-type", "application/wasm")],
            Some(Coding::Gzip),
        ),
        (
            200,
            &[("content-type", "text/css;charset=utf-8")],
            Some(Coding::Gzip),
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
            compress_with(status, &test_headers(h), &settings, None),
            *want,
            "{status} {h:?}"
        );
    }
    let br_first = Compression {
        codings: vec![Coding::Br, Coding::Gzip],
        types: vec!["application/json".into()],
        ..Compression::default()
    };
    assert_eq!(
        compress_with(
            StatusCode::OK,
            &test_headers(&[("content-type", "application/json")]),
            &br_first,
            None
        ),
        Some(Coding::Br)
    );
    assert_eq!(
        compress_with(StatusCode::OK, &test_headers(&[html]), &br_first, None),
        None
    );
    // A rule's `compress` (Varnish's `do_gzip`): small and unlisted bodies too, or nothing; never what
    // must not be transformed, is coded already, or is not a whole 200.
    let small_json = [
        ("content-type", "application/json"),
        ("content-length", "40"),
    ];
    /// Status, headers, the rule's `compress`, the coding it is stored with.
    type Forced<'a> = (u16, &'a [(&'a str, &'a str)], Option<bool>, Option<Coding>);
    let forced: &[Forced<'_>] = &[
        (200, &small_json, None, None),
        (200, &small_json, Some(true), Some(Coding::Br)),
        (
            200,
            &[("content-type", "application/x-unlisted")],
            Some(true),
            Some(Coding::Br),
        ),
        (
            200,
            &[
                ("content-type", "application/json"),
                ("content-length", "4000"),
            ],
            Some(false),
            None,
        ),
        (
            200,
            &[html, ("cache-control", "no-transform")],
            Some(true),
            None,
        ),
        (200, &[html, ("content-encoding", "gzip")], Some(true), None),
        (404, &small_json, Some(true), None),
    ];
    for (status, h, force, want) in forced {
        let status = StatusCode::from_u16(*status).unwrap();
        assert_eq!(
            compress_with(status, &test_headers(h), &br_first, *force),
            *want,
            "{status} {h:?} {force:?}"
        );
    }
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
        (deflate, Some("gzip"), false, AsStored),
        (deflate, None, true, AsStored),
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
    assert_eq!(
        origin_accept_encoding(&Compression::default()),
        "gzip, br;q=0.9"
    );
    let three = Compression {
        codings: vec![Coding::Br, Coding::Zstd, Coding::Gzip],
        ..Compression::default()
    };
    assert_eq!(origin_accept_encoding(&three), "br, zstd;q=0.9, gzip;q=0.8");
}

#[test]
fn what_real_fields_say_of_dictionaries() {
    // Chromium 156 with a dictionary for the URL (captured), then variations.
    let chromium = test_headers(&[
        ("accept-encoding", "gzip, deflate, br, zstd, dcb, dcz"),
        (
            "available-dictionary",
            ":gt9yVRbR2aRfZXFEuDdv7LT9O+WsPPV5cY0qHxHTqBw=:",
        ),
    ]);
    let a = Accepts::from_headers(&chromium);
    assert!(
        a.accepts_dictionary(DictionaryCoding::Dcb) && a.accepts_dictionary(DictionaryCoding::Dcz)
    );
    let hash = available_dictionary(&chromium).expect("a hash");
    assert_eq!(&hash[..4], &[0x82, 0xdf, 0x72, 0x55]);
    for (ae, dcb, dcz) in [
        ("gzip, deflate, br, zstd", false, false),
        ("*", false, false),
        ("dcz;q=0, dcb", true, false),
        ("DCZ;q=0.5", false, true),
        ("dcb;q=abc", false, false),
    ] {
        let a = accepts(Some(ae));
        assert_eq!(
            (
                a.accepts_dictionary(DictionaryCoding::Dcb),
                a.accepts_dictionary(DictionaryCoding::Dcz)
            ),
            (dcb, dcz),
            "{ae}"
        );
    }
    for bad in [
        vec!["gt9yVRbR2aRfZXFEuDdv7LT9O+WsPPV5cY0qHxHTqBw="],
        vec![":AAEC:"],
        vec!["\"sha-256\""],
        vec![
            ":gt9yVRbR2aRfZXFEuDdv7LT9O+WsPPV5cY0qHxHTqBw=:",
            ":gt9yVRbR2aRfZXFEuDdv7LT9O+WsPPV5cY0qHxHTqBw=:",
        ],
    ] {
        let lines: Vec<_> = bad.iter().map(|v| ("available-dictionary", *v)).collect();
        assert_eq!(available_dictionary(&test_headers(&lines)), None, "{bad:?}");
    }
    // Parameters on the item are allowed and ignored.
    let with_param = test_headers(&[(
        "available-dictionary",
        ":gt9yVRbR2aRfZXFEuDdv7LT9O+WsPPV5cY0qHxHTqBw=:;x=1",
    )]);
    assert_eq!(available_dictionary(&with_param), Some(hash));
}
