//! Client conditional requests answered from a stored or fetched 200 (RFC 9110 §13.1.2, §13.1.3, §13.2.2).

use http::{header, HeaderMap};

/// Splits an entity-tag list, keeping quoted tags whole (they may contain commas).
fn entity_tags(list: &str) -> Vec<&str> {
    let mut tags = Vec::new();
    let mut rest = list.trim();
    while !rest.is_empty() {
        // A `W/` prefix is skipped along with separators: the weak comparison ignores it.
        let Some(start) = rest.find(['"', '*']) else {
            break;
        };
        rest = &rest[start..];
        if let Some(after) = rest.strip_prefix('*') {
            tags.push("*");
            rest = after;
            continue;
        }
        let Some(end) = rest[1..].find('"').map(|i| i + 2) else {
            break;
        };
        tags.push(&rest[..end]);
        rest = rest[end..].trim_start_matches([',', ' ', '\t']);
    }
    tags
}

/// The opaque part of an entity-tag, for the weak comparison: `W/"x"` and `"x"` are equal.
fn opaque(tag: &str) -> &str {
    tag.trim().trim_start_matches("W/")
}

/// Whether a GET or HEAD with these headers gets `304 Not Modified` for a representation with the given
/// validators. `If-None-Match` decides when present; `If-Modified-Since` only otherwise, against
/// `Last-Modified`, or the response's `Date` when it has none (RFC 9111 §4.3.2).
pub fn not_modified(
    req: &HeaderMap,
    etag: Option<&str>,
    last_modified: Option<&str>,
    date: Option<&str>,
) -> bool {
    let inm: Vec<&str> = req
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    if !inm.is_empty() {
        return inm
            .iter()
            .flat_map(|v| entity_tags(v))
            .any(|tag| tag == "*" || etag.is_some_and(|current| opaque(current) == opaque(tag)));
    }
    let since = req
        .get(header::IF_MODIFIED_SINCE)
        .and_then(|v| v.to_str().ok())
        .and_then(crate::age::parse_date);
    let modified = last_modified.or(date).and_then(crate::age::parse_date);
    matches!((since, modified), (Some(since), Some(modified)) if modified <= since)
}

/// Headers a 304 carries over from the full response (RFC 9110 §15.4.5).
pub const NOT_MODIFIED_HEADERS: [header::HeaderName; 7] = [
    header::CACHE_CONTROL,
    header::CONTENT_LOCATION,
    header::DATE,
    header::ETAG,
    header::EXPIRES,
    header::VARY,
    header::LAST_MODIFIED,
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_headers as headers;
    use crate::Lines;

    #[test]
    fn table() {
        let lm = Some("Sun, 06 Nov 1994 08:49:37 GMT");
        let cases: &[(Lines<'_>, Option<&str>, bool)] = &[
            (&[], Some("\"a\""), false),
            (&[("if-none-match", "\"a\"")], Some("\"a\""), true),
            (&[("if-none-match", "W/\"a\"")], Some("\"a\""), true),
            (&[("if-none-match", "\"a\"")], Some("W/\"a\""), true),
            (&[("if-none-match", "\"b\", \"a\"")], Some("\"a\""), true),
            (
                &[("if-none-match", "\"b\""), ("if-none-match", "\"a\"")],
                Some("\"a\""),
                true,
            ),
            (
                &[("if-none-match", "\"x,y\", \"z\"")],
                Some("\"x,y\""),
                true,
            ),
            (&[("if-none-match", "\"b\"")], Some("\"a\""), false),
            (&[("if-none-match", "*")], Some("\"a\""), true),
            (&[("if-none-match", "\"a\"")], None, false),
            (
                &[
                    ("if-none-match", "\"b\""),
                    ("if-modified-since", "Sun, 06 Nov 1994 08:49:37 GMT"),
                ],
                Some("\"a\""),
                false,
            ),
            (
                &[("if-modified-since", "Sun, 06 Nov 1994 08:49:37 GMT")],
                Some("\"a\""),
                true,
            ),
            (
                &[("if-modified-since", "Sun, 06 Nov 1994 09:49:37 GMT")],
                None,
                true,
            ),
            (
                &[("if-modified-since", "Sun, 06 Nov 1994 07:49:37 GMT")],
                None,
                false,
            ),
            (&[("if-modified-since", "yesterday")], None, false),
            (&[("if-none-match", "abc")], Some("\"a\""), false),
            (&[("if-none-match", "W/")], Some("\"a\""), false),
            (&[("if-none-match", "\"unterminated")], Some("\"a\""), false),
            (&[("if-none-match", "\"")], Some("\"a\""), false),
            (&[("if-none-match", ", ,")], Some("\"a\""), false),
        ];
        for (h, etag, want) in cases {
            assert_eq!(
                not_modified(&headers(h), *etag, lm, None),
                *want,
                "{h:?} etag {etag:?}"
            );
        }
    }

    /// Without `Last-Modified`, `If-Modified-Since` is compared with the response's `Date`.
    #[test]
    fn if_modified_since_without_last_modified() {
        let date = Some("Sun, 06 Nov 1994 08:49:37 GMT");
        let cases: &[(&str, Option<&str>, Option<&str>, bool)] = &[
            ("Sun, 06 Nov 1994 09:49:37 GMT", None, date, true),
            ("Sun, 06 Nov 1994 08:49:37 GMT", None, date, true),
            ("Sun, 06 Nov 1994 07:49:37 GMT", None, date, false),
            ("Sun, 06 Nov 1994 09:49:37 GMT", None, None, false),
            (
                "Sun, 06 Nov 1994 09:49:37 GMT",
                None,
                Some("garbage"),
                false,
            ),
            // Last-Modified, when there is one, is what counts.
            (
                "Sun, 06 Nov 1994 09:49:37 GMT",
                Some("Sun, 06 Nov 1994 10:49:37 GMT"),
                date,
                false,
            ),
        ];
        for (since, lm, date, want) in cases {
            let req = headers(&[("if-modified-since", since)]);
            assert_eq!(
                not_modified(&req, None, *lm, *date),
                *want,
                "{since} lm {lm:?} date {date:?}"
            );
        }
    }
}
