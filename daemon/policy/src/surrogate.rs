//! Surrogate keys: the tags an origin attaches to a response (`Surrogate-Key`, `xkey`, `Cache-Tag`) so that
//! purging one tag purges every object carrying it.

use http::HeaderMap;

/// Tags kept per object; a response with more keeps the first ones (a hostile origin cannot grow the index
/// without bound).
pub const MAX_TAGS: usize = 64;
/// Longer tags are ignored.
pub const MAX_TAG_LEN: usize = 256;

/// The tags in the headers named by `names` (lower-case), split on spaces and commas, first occurrence
/// first, without duplicates.
pub fn tags(headers: &HeaderMap, names: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for name in names {
        for value in headers.get_all(name.as_str()) {
            let Ok(value) = value.to_str() else { continue };
            for tag in value.split([' ', ',', '\t']).filter(|t| !t.is_empty()) {
                if tag.len() > MAX_TAG_LEN || out.iter().any(|t| t == tag) {
                    continue;
                }
                if out.len() == MAX_TAGS {
                    return out;
                }
                out.push(tag.to_owned());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_headers;
    use crate::Lines;

    fn defaults() -> Vec<String> {
        crate::Policy::default().cache.surrogate_key_headers
    }

    #[test]
    fn table() {
        let long = "x".repeat(MAX_TAG_LEN + 1);
        let cases: &[(Lines<'_>, &[&str])] = &[
            (&[], &[]),
            (&[("Surrogate-Key", "a b  c")], &["a", "b", "c"]),
            (&[("xkey", "p-1, p-2,p-3")], &["p-1", "p-2", "p-3"]),
            (
                &[("Cache-Tag", "one"), ("cache-tag", "two one")],
                &["one", "two"],
            ),
            (&[("Surrogate-Key", "a"), ("xkey", "a b")], &["a", "b"]),
            (&[("Surrogate-Key", &long), ("xkey", "short")], &["short"]),
            (&[("X-Other", "ignored")], &[]),
            (&[("Surrogate-Key", " \t, ")], &[]),
        ];
        for (headers, want) in cases {
            assert_eq!(
                tags(&test_headers(headers), &defaults()),
                *want,
                "{headers:?}"
            );
        }
    }

    #[test]
    fn bounded() {
        let many: Vec<String> = (0..200).map(|i| format!("t{i}")).collect();
        let headers = test_headers(&[("surrogate-key", &many.join(" "))]);
        assert_eq!(tags(&headers, &defaults()).len(), MAX_TAGS);
        let only_xkey = vec!["xkey".to_string()];
        assert!(tags(&headers, &only_xkey).is_empty());
    }
}
