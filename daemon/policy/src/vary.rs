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

/// The request's value for one varying header, exactly as it goes to the origin: every line, in order,
/// byte for byte, each preceded by a newline. No header value holds a newline, so lines cannot run into one
/// another, and a value recorded by the older, normalising selection (trimmed, so never starting with one)
/// matches no request that carries the header: a miss, never another request's variant. Bytes outside
/// visible ASCII, space and tab, and `%` itself, are written `%XX`, so non-UTF-8 bytes survive in a
/// string. An absent header is the empty string, as before.
///
/// Nothing is normalised here: the origin chose its answer from these bytes, so `en,` and `en` (or `EN`)
/// are other requests to it. A field the proxy normalises before sending (`Accept-Encoding`, replaced by
/// the value every client shares) is already normalised in the headers this is read from.
fn request_value(req: &HeaderMap, name: &str) -> String {
    let mut out = Vec::new();
    encode(req, name, |piece| {
        out.extend_from_slice(piece);
        true
    });
    String::from_utf8(out).expect("the encoding is ASCII")
}

/// Whether the request's value for `name` is `recorded`, compared as [`request_value`] would write it,
/// without writing it: every lookup compares each stored variant's values.
fn value_is(req: &HeaderMap, name: &str, recorded: &str) -> bool {
    let mut rest = recorded.as_bytes();
    let whole = encode(req, name, |piece| match rest.strip_prefix(piece) {
        Some(after) => {
            rest = after;
            true
        }
        None => false,
    });
    whole && rest.is_empty()
}

/// Gives [`request_value`]'s encoding to `put` piece by piece, stopping (and returning false) as soon as
/// `put` does.
fn encode(req: &HeaderMap, name: &str, mut put: impl FnMut(&[u8]) -> bool) -> bool {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for value in req.get_all(name) {
        if !put(b"\n") {
            return false;
        }
        for &b in value.as_bytes() {
            let kept = (b' '..=b'~').contains(&b) && b != b'%' || b == b'\t';
            let fits = if kept {
                put(&[b])
            } else {
                put(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]])
            };
            if !fits {
                return false;
            }
        }
    }
    true
}

/// The lines of a value [`selection`] recorded, as the request sent them: for showing a stored variant.
/// A value recorded before selections kept the bytes sent is shown as it was recorded.
pub fn sent_lines(recorded: &str) -> Vec<Vec<u8>> {
    let Some(lines) = recorded.strip_prefix('\n') else {
        return if recorded.is_empty() {
            Vec::new()
        } else {
            vec![recorded.as_bytes().to_vec()]
        };
    };
    lines
        .split('\n')
        .map(|line| {
            let mut out = Vec::with_capacity(line.len());
            let mut bytes = line.bytes();
            while let Some(b) = bytes.next() {
                let escaped = (b == b'%')
                    .then(|| {
                        let hex = [bytes.next()?, bytes.next()?];
                        u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()
                    })
                    .flatten();
                out.push(escaped.unwrap_or(b));
            }
            out
        })
        .collect()
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
        .all(|(name, value)| value_is(req, name, value))
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

    /// Each request as the origin saw it, and whether a variant fetched for the first matches it.
    #[test]
    fn a_variant_is_selected_by_exactly_the_bytes_sent() {
        let names = vec!["x-lang".to_string(), "accept-language".to_string()];
        let fetched = |lines: &[(&str, &[u8])]| {
            let mut h = HeaderMap::new();
            for (name, value) in lines {
                h.append(
                    http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    http::HeaderValue::from_bytes(value).unwrap(),
                );
            }
            h
        };
        type Case<'a> = (&'a [(&'a str, &'a [u8])], &'a [(&'a str, &'a [u8])], bool);
        let cases: &[Case<'_>] = &[
            (&[("x-lang", b"en")], &[("x-lang", b"en")], true),
            (&[("x-lang", b"en,")], &[("x-lang", b"en")], false),
            (&[("x-lang", b"en")], &[("x-lang", b"en,")], false),
            (&[("x-lang", b"en,,de")], &[("x-lang", b"en, de")], false),
            (&[("x-lang", b"en, , de")], &[("x-lang", b"en, de")], false),
            (&[("x-lang", b"en,de")], &[("x-lang", b"en, de")], false),
            (&[("x-lang", b"en, de")], &[("x-lang", b"en, de")], true),
            (&[("x-lang", b"")], &[], false),
            (&[("x-lang", b"")], &[("x-lang", b"")], true),
            (&[], &[], true),
            (
                &[("x-lang", b"en"), ("x-lang", b"de")],
                &[("x-lang", b"en, de")],
                false,
            ),
            (
                &[("x-lang", b"en, de")],
                &[("x-lang", b"en"), ("x-lang", b"de")],
                false,
            ),
            (
                &[("x-lang", b"en"), ("x-lang", b"de")],
                &[("x-lang", b"en"), ("x-lang", b"de")],
                true,
            ),
            (
                &[("x-lang", b"en"), ("x-lang", b"de")],
                &[("x-lang", b"de"), ("x-lang", b"en")],
                false,
            ),
            (
                &[("x-lang", b"en"), ("x-lang", b"")],
                &[("x-lang", b"en")],
                false,
            ),
            (
                &[("accept-language", b"en-US")],
                &[("accept-language", b"en-us")],
                false,
            ),
            (
                &[("accept-language", b"en-US")],
                &[("accept-language", b"en-US")],
                true,
            ),
            (&[("x-lang", b"caf\xe9")], &[("x-lang", b"caf\xe9")], true),
            (&[("x-lang", b"caf\xe9")], &[("x-lang", b"caf\xef")], false),
            (
                &[("x-lang", b"caf\xe9")],
                &[("x-lang", "caf\u{fffd}".as_bytes())],
                false,
            ),
            (&[("x-lang", b"caf\xe9")], &[("x-lang", b"caf%E9")], false),
            (&[("x-lang", b"a\tb")], &[("x-lang", b"a b")], false),
        ];
        for (sent, asked, want) in cases {
            let sel = selection(&names, &fetched(sent));
            assert_eq!(
                matches(&sel, &fetched(asked)),
                *want,
                "{sent:?} / {asked:?}"
            );
            let lines: Vec<Vec<u8>> = sent
                .iter()
                .filter(|(n, _)| *n == "x-lang")
                .map(|(_, v)| v.to_vec())
                .collect();
            assert_eq!(sent_lines(&sel[0].1), lines, "{sent:?} shown as sent");
        }
        assert!(matches(&[], &fetched(&[("x", b"y")])));
    }

    /// A variant recorded by the normalising selection of earlier versions matches no request carrying the
    /// header (a miss), and still reads back for display.
    #[test]
    fn a_variant_recorded_before_matches_no_request_with_the_header() {
        let old = vec![("x-lang".to_string(), "en, de".to_string())];
        assert!(!matches(&old, &headers(&[("x-lang", "en, de")])));
        assert!(!matches(&old, &headers(&[("x-lang", "en,de")])));
        assert_eq!(sent_lines("en, de"), vec![b"en, de".to_vec()]);
        let absent = vec![("x-lang".to_string(), String::new())];
        assert!(matches(&absent, &headers(&[])));
    }
}
