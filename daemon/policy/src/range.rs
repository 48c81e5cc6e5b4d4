//! Byte ranges (RFC 9110 §14): which parts of a representation of known length a request asks for.

use http::{header, HeaderMap};

/// More ranges than this in one request are ignored (answered 200), as a guard against range abuse.
pub const MAX_RANGES: usize = 16;

/// Ranges separated by fewer bytes than this are sent as one part: a part's own head (boundary,
/// `Content-Type`, `Content-Range`) costs about as much (RFC 9110 §15.3.7.2).
const PART_OVERHEAD: u64 = 80;

/// How to answer a request's `Range` for a representation of known length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ranges {
    /// No usable `Range` (absent, not bytes, malformed, too many, or `If-Range` did not match): send 200.
    Whole,
    /// `416` with `Content-Range: bytes */len`.
    Unsatisfiable,
    /// Inclusive `(first, last)` byte positions, clamped to the length. Several ranges come back in
    /// ascending order, none overlapping, with ranges closer than a part's own head merged, so a multipart
    /// answer is never much larger than the body (RFC 9110 §14.2, §15.3.7.2); one range keeps its place.
    Parts(Vec<(u64, u64)>),
}

/// `If-Range` holds when it names the current strong entity-tag, or exactly the current `Last-Modified`.
fn if_range_holds(value: &str, etag: Option<&str>, last_modified: Option<&str>) -> bool {
    let value = value.trim();
    if value.starts_with('"') {
        return etag.is_some_and(|e| !e.starts_with("W/") && e.trim() == value);
    }
    if value.starts_with("W/") {
        return false;
    }
    match (
        httpdate::parse_http_date(value),
        last_modified.map(|l| httpdate::parse_http_date(l.trim())),
    ) {
        (Ok(a), Some(Ok(b))) => a == b,
        _ => false,
    }
}

/// The answer to `req`'s `Range` (and `If-Range`) for a body of `len` bytes whose current validators are
/// `etag` and `last_modified`; only the `bytes` unit is understood, anything unusable means [`Ranges::Whole`].
pub fn evaluate(
    req: &HeaderMap,
    len: u64,
    etag: Option<&str>,
    last_modified: Option<&str>,
) -> Ranges {
    let Some(range) = req.get(header::RANGE).and_then(|v| v.to_str().ok()) else {
        return Ranges::Whole;
    };
    if let Some(if_range) = req.get(header::IF_RANGE) {
        if !if_range
            .to_str()
            .is_ok_and(|v| if_range_holds(v, etag, last_modified))
        {
            return Ranges::Whole;
        }
    }
    let Some((unit, specs)) = range.split_once('=') else {
        return Ranges::Whole;
    };
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return Ranges::Whole;
    }
    let mut parts = Vec::new();
    let mut count = 0;
    for spec in specs.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        count += 1;
        let Some((first, last)) = spec.split_once('-') else {
            return Ranges::Whole;
        };
        let number = |s: &str| -> Option<u64> {
            let s = s.trim();
            (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse().unwrap_or(u64::MAX))
        };
        match (first.trim().is_empty(), number(first), number(last)) {
            (true, _, Some(suffix)) => {
                if suffix > 0 && len > 0 {
                    parts.push((len - suffix.min(len), len - 1));
                }
            }
            (false, Some(first), None) if last.trim().is_empty() => {
                if first < len {
                    parts.push((first, len - 1));
                }
            }
            (false, Some(first), Some(last)) if first <= last => {
                if first < len {
                    parts.push((first, last.min(len - 1)));
                }
            }
            _ => return Ranges::Whole,
        }
    }
    if count == 0 || count > MAX_RANGES {
        return Ranges::Whole;
    }
    if parts.is_empty() {
        Ranges::Unsatisfiable
    } else {
        Ranges::Parts(coalesce(parts))
    }
}

/// Overlapping ranges and ranges closer than a part's own head merged, in ascending order (RFC 9110 §14.2
/// and §15.3.7.2 allow it whatever the request's order), so that no byte is sent twice: `0-,0-,…` must not
/// multiply the body.
fn coalesce(mut parts: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    parts.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(parts.len());
    for (first, last) in parts {
        match merged.last_mut() {
            Some((_, end)) if first <= end.saturating_add(PART_OVERHEAD) => *end = (*end).max(last),
            _ => merged.push((first, last)),
        }
    }
    merged
}

/// The byte range a 206 says it carries: `Content-Range: bytes first-last/complete` (RFC 9110 §14.4), as
/// inclusive positions and the representation's whole length. `None` for anything else: another unit, an
/// unsatisfied-range form, a complete length not known (`*`), a last position before the first or past the
/// end: such a part cannot be placed in a representation.
pub fn content_range(value: &[u8]) -> Option<(u64, u64, u64)> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let (unit, rest) = value.split_once(' ')?;
    if !unit.eq_ignore_ascii_case("bytes") {
        return None;
    }
    let (span, complete) = rest.trim().split_once('/')?;
    let (first, last) = span.split_once('-')?;
    let number = |s: &str| -> Option<u64> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let (first, last, complete) = (number(first)?, number(last)?, number(complete)?);
    (first <= last && last < complete).then_some((first, last, complete))
}

/// A response's validators as stored or received: its `ETag` and `Last-Modified` values.
pub type Validators<'a> = (Option<&'a [u8]>, Option<&'a [u8]>);

/// Whether two responses' validators say they carry the same representation, so that byte ranges of one
/// can be joined with byte ranges of the other (RFC 9111 §3.4): the same strong entity-tag, or, where
/// neither has an entity-tag, the same `Last-Modified`. A weak or missing validator never proves it.
pub fn same_representation(a: Validators<'_>, b: Validators<'_>) -> bool {
    let strong = |etag: &[u8]| !etag.starts_with(b"W/");
    match (a.0, b.0) {
        (Some(x), Some(y)) => strong(x) && x == y,
        (None, None) => a.1.is_some() && a.1 == b.1,
        _ => false,
    }
}

/// A response's validators as proof of which representation it carries (RFC 9110 §8.8.2.2): its
/// `Last-Modified` only when that is a strong date, at least a second before its `Date`; within the same
/// second the origin may have changed the representation without changing the date.
pub fn proving<'a>((etag, last_modified): Validators<'a>, date: Option<&[u8]>) -> Validators<'a> {
    let parse = |v: &[u8]| httpdate::parse_http_date(std::str::from_utf8(v).ok()?.trim()).ok();
    let strong = |modified: &&[u8]| {
        let at = parse(modified);
        let date = date.and_then(parse);
        matches!((at, date), (Some(at), Some(date)) if at + std::time::Duration::from_secs(1) <= date)
    };
    (etag, last_modified.filter(strong))
}

/// The validator a cache may send as `If-Range` for a response it holds part of (RFC 9110 §13.1.5): its
/// strong entity-tag, or, without an entity-tag, a strong `Last-Modified` ([`proving`]). A weak
/// entity-tag, or a date that may name two versions, none.
pub fn if_range<'a>(validators: Validators<'a>, date: Option<&[u8]>) -> Option<&'a [u8]> {
    match proving(validators, date) {
        (Some(etag), _) => (!etag.starts_with(b"W/")).then_some(etag),
        (None, modified) => modified,
    }
}

/// Where the bytes a request's `Range` asks for begin, when that is known without the representation's
/// length: the lowest first position of a `bytes` range set of explicit positions. `None` without a
/// usable `Range`, or when a suffix range (`-500`) needs the length to be placed.
pub fn first_wanted(req: &HeaderMap) -> Option<u64> {
    let range = req.get(header::RANGE)?.to_str().ok()?;
    let (unit, specs) = range.split_once('=')?;
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return None;
    }
    let mut lowest: Option<u64> = None;
    for spec in specs.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (first, _) = spec.split_once('-')?;
        let first = first.trim();
        if first.is_empty() || !first.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let first = first.parse().ok()?;
        lowest = Some(lowest.map_or(first, |l: u64| l.min(first)));
    }
    lowest
}

/// One byte range a request asks for, read without the representation's length: what a cache can forward
/// to the origin for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Single {
    /// Bytes from the first position given, to the last given or (`None`) to the end.
    From(u64, Option<u64>),
    /// The last this many bytes (`bytes=-500`); never 0.
    Suffix(u64),
}

impl Single {
    /// The range as a `Range` value, written anew from the numbers read: what the origin is sent is never
    /// the client's own bytes.
    pub fn header(self) -> String {
        match self {
            Single::From(first, Some(last)) => format!("bytes={first}-{last}"),
            Single::From(first, None) => format!("bytes={first}-"),
            Single::Suffix(n) => format!("bytes=-{n}"),
        }
    }

    /// Where it begins when that is known without the length: a suffix range begins nowhere known.
    pub fn first(self) -> Option<u64> {
        match self {
            Single::From(first, _) => Some(first),
            Single::Suffix(_) => None,
        }
    }
}

/// The one byte range `req`'s `Range` asks for: `None` without one, for another unit, for several ranges
/// (answered from the whole) and for anything malformed (a last position before the first, a suffix of
/// nothing, a number too large).
pub fn single(req: &HeaderMap) -> Option<Single> {
    let range = req.get(header::RANGE)?.to_str().ok()?;
    let (unit, spec) = range.split_once('=')?;
    if !unit.trim().eq_ignore_ascii_case("bytes") || spec.contains(',') {
        return None;
    }
    let (first, last) = spec.trim().split_once('-')?;
    let number = |s: &str| -> Option<Option<u64>> {
        let s = s.trim();
        if s.is_empty() {
            return Some(None);
        }
        s.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| s.parse().ok().map(Some))
            .flatten()
    };
    match (number(first)?, number(last)?) {
        (None, Some(n)) if n > 0 => Some(Single::Suffix(n)),
        (Some(first), None) => Some(Single::From(first, None)),
        (Some(first), Some(last)) if first <= last => Some(Single::From(first, Some(last))),
        _ => None,
    }
}

#[cfg(test)]
mod props;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_headers as headers;

    #[test]
    fn content_ranges() {
        type Placed = Option<(u64, u64, u64)>;
        let cases: &[(&str, Placed)] = &[
            ("bytes 0-499/1234", Some((0, 499, 1234))),
            (
                "bytes 8388608-16777215/1073741824",
                Some((8_388_608, 16_777_215, 1 << 30)),
            ),
            ("BYTES 5-5/6", Some((5, 5, 6))),
            (" bytes 1-2/3 ", Some((1, 2, 3))),
            ("bytes 0-499/*", None),
            ("bytes */1234", None),
            ("bytes 10-5/20", None),
            ("bytes 0-20/20", None),
            ("bytes 0-+5/20", None),
            ("bytes -1-5/20", None),
            ("items 0-1/2", None),
            ("bytes 0-99999999999999999999/1", None),
            ("", None),
        ];
        for (value, want) in cases {
            assert_eq!(content_range(value.as_bytes()), *want, "{value:?}");
        }
    }

    #[test]
    fn representations_joined_only_on_strong_validators() {
        let lm: &[u8] = b"Tue, 01 Dec 2026 10:00:00 GMT";
        let other_lm: &[u8] = b"Wed, 02 Dec 2026 10:00:00 GMT";
        let cases: &[(Validators<'_>, Validators<'_>, bool)] = &[
            ((Some(b"\"a\""), None), (Some(b"\"a\""), None), true),
            (
                (Some(b"\"a\""), Some(lm)),
                (Some(b"\"a\""), Some(other_lm)),
                true,
            ),
            ((Some(b"\"a\""), None), (Some(b"\"b\""), None), false),
            ((Some(b"W/\"a\""), None), (Some(b"W/\"a\""), None), false),
            ((Some(b"\"a\""), None), (Some(b"W/\"a\""), None), false),
            ((None, Some(lm)), (None, Some(lm)), true),
            ((None, Some(lm)), (None, Some(other_lm)), false),
            ((Some(b"\"a\""), Some(lm)), (None, Some(lm)), false),
            ((None, None), (None, None), false),
        ];
        for (a, b, want) in cases {
            assert_eq!(same_representation(*a, *b), *want, "{a:?} {b:?}");
        }
    }

    #[test]
    fn first_wanted_without_a_length() {
        let cases: &[(&str, Option<u64>)] = &[
            ("bytes=100-199", Some(100)),
            ("bytes=300-", Some(300)),
            ("bytes=500-600, 20-30", Some(20)),
            ("bytes=-500", None),
            ("bytes=0-1, -5", None),
            ("items=0-1", None),
            ("bytes=x-1", None),
        ];
        for (value, want) in cases {
            assert_eq!(
                first_wanted(&headers(&[("range", value)])),
                *want,
                "{value:?}"
            );
        }
        assert_eq!(first_wanted(&headers(&[])), None);
    }

    #[test]
    fn if_range_only_with_a_strong_validator() {
        let lm = b"Tue, 01 Dec 2026 10:00:00 GMT".as_slice();
        let later = b"Tue, 01 Dec 2026 10:00:01 GMT".as_slice();
        type Case<'a> = (Validators<'a>, Option<&'a [u8]>, Option<&'a [u8]>);
        let cases: &[Case<'_>] = &[
            ((Some(b"\"a\""), Some(lm)), Some(later), Some(b"\"a\"")),
            ((Some(b"W/\"a\""), Some(lm)), Some(later), None),
            ((None, Some(lm)), Some(later), Some(lm)),
            ((None, Some(lm)), Some(lm), None),
            ((None, Some(lm)), None, None),
            ((None, Some(b"yesterday")), Some(later), None),
            ((None, None), Some(later), None),
        ];
        for (validators, date, want) in cases {
            assert_eq!(
                if_range(*validators, *date),
                *want,
                "{validators:?} {date:?}"
            );
        }
    }

    #[test]
    fn one_range_read_without_a_length() {
        let cases: &[(&str, Option<Single>, &str)] = &[
            (
                "bytes=100-199",
                Some(Single::From(100, Some(199))),
                "bytes=100-199",
            ),
            ("bytes= 300 -", Some(Single::From(300, None)), "bytes=300-"),
            ("BYTES=-500", Some(Single::Suffix(500)), "bytes=-500"),
            ("bytes=0-0", Some(Single::From(0, Some(0))), "bytes=0-0"),
            ("bytes=-0", None, ""),
            ("bytes=9-1", None, ""),
            ("bytes=0-1, 5-6", None, ""),
            ("bytes=0-1,", None, ""),
            ("items=0-1", None, ""),
            ("bytes=x-1", None, ""),
            ("bytes=+1-2", None, ""),
            ("bytes=-", None, ""),
            ("bytes=99999999999999999999-", None, ""),
        ];
        for (value, want, sent) in cases {
            let got = single(&headers(&[("range", value)]));
            assert_eq!(got, *want, "{value:?}");
            if let Some(got) = got {
                assert_eq!(got.header(), *sent, "{value:?}");
            }
        }
        assert_eq!(single(&headers(&[])), None);
        assert_eq!(Single::Suffix(5).first(), None);
        assert_eq!(Single::From(7, None).first(), Some(7));
    }

    #[test]
    fn table() {
        let p = |v: &[(u64, u64)]| Ranges::Parts(v.to_vec());
        let cases: &[(&[(&str, &str)], Ranges)] = &[
            (&[], Ranges::Whole),
            (&[("range", "bytes=0-499")], p(&[(0, 499)])),
            (&[("range", "bytes=0-")], p(&[(0, 999)])),
            (&[("range", "bytes=-200")], p(&[(800, 999)])),
            (&[("range", "bytes=-5000")], p(&[(0, 999)])),
            (&[("range", "bytes=900-5000")], p(&[(900, 999)])),
            (
                &[("range", "Bytes = 1-2, 500-600")],
                p(&[(1, 2), (500, 600)]),
            ),
            (&[("range", "bytes=500-600, 1-2")], p(&[(1, 2), (500, 600)])),
            (&[("range", "bytes=1-2, 5-6")], p(&[(1, 6)])),
            (&[("range", "bytes=0-,0-,0-,0-")], p(&[(0, 999)])),
            (
                &[("range", "bytes=0-99,50-149,900-")],
                p(&[(0, 149), (900, 999)]),
            ),
            (&[("range", "bytes=-100,0-10")], p(&[(0, 10), (900, 999)])),
            (&[("range", "bytes=1000-")], Ranges::Unsatisfiable),
            (&[("range", "bytes=-0")], Ranges::Unsatisfiable),
            (&[("range", "bytes=1000-2000, 5-6")], p(&[(5, 6)])),
            (&[("range", "bytes=10-20, 1000-2000")], p(&[(10, 20)])),
            (&[("range", "bytes=5-6, 1-2")], p(&[(1, 6)])),
            (&[("range", "bytes=0-,0-,0-")], p(&[(0, 999)])),
            (&[("range", "bytes=0-0,-1,0-0")], p(&[(0, 0), (999, 999)])),
            (&[("range", "bytes=10-20,15-30,31-40")], p(&[(10, 40)])),
            (&[("range", "bytes=5-1")], Ranges::Whole),
            (&[("range", "bytes=a-b")], Ranges::Whole),
            (&[("range", "items=0-1")], Ranges::Whole),
            (&[("range", "bytes=")], Ranges::Whole),
            (
                &[("range", "bytes=0-499"), ("if-range", "\"v1\"")],
                p(&[(0, 499)]),
            ),
            (
                &[("range", "bytes=0-499"), ("if-range", "\"v2\"")],
                Ranges::Whole,
            ),
            (
                &[("range", "bytes=0-499"), ("if-range", "W/\"v1\"")],
                Ranges::Whole,
            ),
            (
                &[
                    ("range", "bytes=0-499"),
                    ("if-range", "Sun, 06 Nov 1994 08:49:37 GMT"),
                ],
                p(&[(0, 499)]),
            ),
            (
                &[
                    ("range", "bytes=0-499"),
                    ("if-range", "Sun, 06 Nov 1994 08:49:38 GMT"),
                ],
                Ranges::Whole,
            ),
        ];
        for (h, want) in cases {
            let got = evaluate(
                &headers(h),
                1000,
                Some("\"v1\""),
                Some("Sun, 06 Nov 1994 08:49:37 GMT"),
            );
            assert_eq!(&got, want, "{h:?}");
        }
        let many = format!(
            "bytes={}",
            (0..17)
                .map(|i| format!("{i}-{i}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert_eq!(
            evaluate(&headers(&[("range", &many)]), 1000, None, None),
            Ranges::Whole
        );
        assert_eq!(
            evaluate(&headers(&[("range", "bytes=0-")]), 0, None, None),
            Ranges::Unsatisfiable
        );
    }

    /// Whatever ranges are asked for, the parts sent never add up to more than the body, and with their
    /// heads a multipart answer stays within the body plus one part's overhead per part that survives.
    #[test]
    fn parts_never_exceed_the_body() {
        let len = 1 << 20;
        for spec in [
            vec!["0-"; 16].join(","),
            (0..16)
                .map(|i| format!("{}-", i * 1000))
                .collect::<Vec<_>>()
                .join(","),
            (0..16)
                .map(|i| format!("-{}", 1000 + i))
                .collect::<Vec<_>>()
                .join(","),
            (0..16)
                .map(|i| format!("{}-{}", i * 100, i * 100 + 99))
                .collect::<Vec<_>>()
                .join(","),
        ] {
            let Ranges::Parts(parts) = evaluate(
                &headers(&[("range", &format!("bytes={spec}"))]),
                len,
                None,
                None,
            ) else {
                panic!("{spec}: satisfiable")
            };
            let sent: u64 = parts.iter().map(|(a, b)| b - a + 1).sum();
            assert!(sent <= len, "{spec}: {sent} bytes of parts");
            assert!(
                parts.windows(2).all(|w| w[0].1 + PART_OVERHEAD < w[1].0),
                "{spec}: {parts:?}"
            );
        }
    }
}
