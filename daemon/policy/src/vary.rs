//! `Vary` (RFC 9111 §4.1): which request headers select among variants of one URL.

use http::{header::VARY, HeaderMap};

/// A response's `Vary`, read from all its lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Vary {
    /// The response does not vary.
    None,
    /// Lower-cased header names, in order, deduplicated.
    Headers(Vec<String>),
    /// `Vary: *`: no stored response can ever be selected.
    Any,
}

/// Reads every `Vary` line; a value that is not visible ASCII counts as `*`, the safe reading.
pub fn parse(headers: &HeaderMap) -> Vary {
    let mut names: Vec<String> = Vec::new();
    for value in headers.get_all(VARY) {
        let Ok(value) = value.to_str() else {
            return Vary::Any;
        };
        for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if name == "*" {
                return Vary::Any;
            }
            let name = name.to_ascii_lowercase();
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    if names.is_empty() {
        Vary::None
    } else {
        Vary::Headers(names)
    }
}

/// Fields whose values are case-insensitive throughout (language ranges, RFC 9110 §12.5.4, RFC 4647 §2), so
/// `en, de` and `eN, De` select the same variant. The order of the members is kept: without q-values it is
/// how clients say which they prefer.
const CASELESS: [&str; 1] = ["accept-language"];

/// The request's value for one varying header: all its lines joined, whitespace around commas normalised, so
/// `gzip,br` and `gzip, br` select the same variant; lower-cased for the [`CASELESS`] fields. An absent
/// header is the empty string.
fn request_value(req: &HeaderMap, name: &str) -> String {
    let mut out = String::new();
    let caseless = CASELESS.contains(&name);
    for value in req.get_all(name) {
        for part in String::from_utf8_lossy(value.as_bytes()).split(',') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            if !out.is_empty() {
                out.push_str(", ");
            }
            if caseless {
                out.push_str(&part.to_ascii_lowercase());
            } else {
                out.push_str(part);
            }
        }
    }
    out
}

/// The variant selection a request makes under the given `Vary` names.
pub fn selection(names: &[String], req: &HeaderMap) -> Vec<(String, String)> {
    names
        .iter()
        .map(|n| (n.clone(), request_value(req, n)))
        .collect()
}

/// Whether a stored selection is the one this request makes.
pub fn matches(stored: &[(String, String)], req: &HeaderMap) -> bool {
    stored
        .iter()
        .all(|(name, value)| request_value(req, name) == *value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_headers as headers;

    #[test]
    fn parse_table() {
        let names = |v: &[&str]| Vary::Headers(v.iter().map(|s| s.to_string()).collect());
        let cases: &[(&[(&str, &str)], Vary)] = &[
            (&[], Vary::None),
            (&[("vary", "")], Vary::None),
            (&[("vary", "Accept-Encoding")], names(&["accept-encoding"])),
            (
                &[("vary", "  accept-encoding ,ACCEPT-LANGUAGE,, ")],
                names(&["accept-encoding", "accept-language"]),
            ),
            (&[("vary", "a"), ("vary", "b, A")], names(&["a", "b"])),
            (&[("vary", "*")], Vary::Any),
            (&[("vary", "accept, *")], Vary::Any),
            (&[("vary", "accept"), ("vary", " * ")], Vary::Any),
        ];
        for (h, want) in cases {
            assert_eq!(parse(&headers(h)), *want, "{h:?}");
        }
    }

    #[test]
    fn selection_and_matching() {
        let names = vec!["accept-encoding".to_string(), "x-lang".to_string()];
        let req = headers(&[("accept-encoding", "gzip,br"), ("accept-encoding", "zstd")]);
        let sel = selection(&names, &req);
        assert_eq!(
            sel,
            vec![
                ("accept-encoding".into(), "gzip, br, zstd".into()),
                ("x-lang".into(), "".into())
            ]
        );
        assert!(matches(
            &sel,
            &headers(&[("accept-encoding", "gzip, br, zstd")])
        ));
        assert!(!matches(&sel, &headers(&[("accept-encoding", "gzip")])));
        assert!(!matches(
            &sel,
            &headers(&[("accept-encoding", "gzip, br, zstd"), ("x-lang", "de")])
        ));
        assert!(matches(&[], &headers(&[("x", "y")])));
    }

    #[test]
    fn accept_language_is_caseless_but_ordered() {
        let names = vec!["accept-language".to_string(), "x-tag".to_string()];
        let sel = selection(
            &names,
            &headers(&[("accept-language", "en-US, de;q=0.5"), ("x-tag", "Ab")]),
        );
        assert_eq!(sel[0].1, "en-us, de;q=0.5");
        let cases: &[(&[(&str, &str)], bool)] = &[
            (
                &[("accept-language", "en-US, de;q=0.5"), ("x-tag", "Ab")],
                true,
            ),
            (
                &[("accept-language", "EN-us,DE;Q=0.5"), ("x-tag", "Ab")],
                true,
            ),
            (
                &[
                    ("accept-language", "en-us"),
                    ("accept-language", "de;q=0.5"),
                    ("x-tag", "Ab"),
                ],
                true,
            ),
            (
                &[("accept-language", "de;q=0.5, en-US"), ("x-tag", "Ab")],
                false,
            ),
            (
                &[("accept-language", "en-US, de;q=0.5"), ("x-tag", "ab")],
                false,
            ),
        ];
        for (h, want) in cases {
            assert_eq!(matches(&sel, &headers(h)), *want, "{h:?}");
        }
    }
}
