//! Property tests (the fuzz target `range`): whatever the `Range` header, `evaluate` never panics, and what
//! it answers is a set of parts a multipart response can be built from safely.

use proptest::prelude::*;

use super::*;
use crate::test_headers as headers;

/// What a satisfiable answer must be: parts inside the body, in ascending order, further apart than a
/// part's own head (so the response is never much larger than the body), and covering every byte the
/// satisfiable range-specs asked for (and, besides them, only the gaps merged between them).
fn check_parts(
    parts: &[(u64, u64)],
    len: u64,
    asked: Option<&[(u64, u64)]>,
) -> Result<(), TestCaseError> {
    prop_assert!(!parts.is_empty());
    for &(first, last) in parts {
        prop_assert!(first <= last && last < len, "{parts:?} outside 0..{len}");
    }
    for pair in parts.windows(2) {
        prop_assert!(
            pair[0].1 + PART_OVERHEAD < pair[1].0,
            "{parts:?}: parts out of order, overlapping or too close"
        );
    }
    let total: u64 = parts.iter().map(|(a, b)| b - a + 1).sum();
    prop_assert!(
        total <= len,
        "{parts:?}: {total} bytes of a {len}-byte body"
    );
    if let Some(asked) = asked {
        let covered = |set: &[(u64, u64)], at: u64| set.iter().any(|&(a, b)| a <= at && at <= b);
        let edges = asked
            .iter()
            .chain(parts)
            .flat_map(|&(a, b)| [a.saturating_sub(1), a, b, b + 1]);
        for at in edges.filter(|&at| at < len) {
            prop_assert!(
                !covered(asked, at) || covered(parts, at),
                "byte {}: parts {:?}, asked {:?}",
                at,
                parts,
                asked
            );
        }
        for &(first, last) in parts {
            prop_assert!(
                covered(asked, first) && covered(asked, last),
                "part {:?} does not start and end on asked bytes: asked {:?}",
                (first, last),
                asked
            );
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Spec {
    Span(u64, u64),
    From(u64),
    Suffix(u64),
}

impl Spec {
    fn render(&self) -> String {
        match self {
            Spec::Span(a, b) => format!("{a}-{b}"),
            Spec::From(a) => format!("{a}-"),
            Spec::Suffix(n) => format!("-{n}"),
        }
    }

    /// The bytes this spec asks for in a body of `len` bytes, if any (RFC 9110 §14.1.2).
    fn satisfiable(&self, len: u64) -> Option<(u64, u64)> {
        match *self {
            Spec::Span(a, b) => (a < len).then(|| (a, b.min(len - 1))),
            Spec::From(a) => (a < len).then(|| (a, len - 1)),
            Spec::Suffix(n) => (n > 0 && len > 0).then(|| (len - n.min(len), len - 1)),
        }
    }
}

fn position() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 0u64..2_000, 1 => any::<u64>()]
}

fn spec() -> impl Strategy<Value = Spec> {
    prop_oneof![
        (position(), position()).prop_map(|(a, b)| Spec::Span(a.min(b), a.max(b))),
        position().prop_map(Spec::From),
        position().prop_map(Spec::Suffix),
    ]
}

fn space() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just(""), Just(" "), Just("\t"), Just("  ")]
}

proptest! {
    #[test]
    fn fuzz_range_well_formed(
        len in prop_oneof![Just(0u64), 1u64..2_000],
        specs in prop::collection::vec((spec(), space(), space()), 1..24),
    ) {
        let value = format!(
            "bytes={}",
            specs
                .iter()
                .map(|(s, before, after)| format!("{before}{}{after}", s.render()))
                .collect::<Vec<_>>()
                .join(",")
        );
        let asked: Vec<(u64, u64)> = specs.iter().filter_map(|(s, ..)| s.satisfiable(len)).collect();
        match evaluate(&headers(&[("range", &value)]), len, None, None) {
            Ranges::Whole => prop_assert!(specs.len() > MAX_RANGES, "{value}: ignored"),
            Ranges::Unsatisfiable => {
                prop_assert!(specs.len() <= MAX_RANGES && asked.is_empty(), "{value}: 416")
            }
            Ranges::Parts(parts) => {
                prop_assert!(specs.len() <= MAX_RANGES);
                check_parts(&parts, len, Some(&asked))?;
            }
        }
    }

    #[test]
    fn fuzz_range_arbitrary(
        len in prop_oneof![Just(0u64), 1u64..2_000, Just(u64::MAX)],
        value in prop_oneof![
            any::<Vec<u8>>(),
            "bytes=[-0-9, \t]{0,40}".prop_map(String::into_bytes),
            "[bB][yY][tT][eE][sS] ?= ?[-0-9,a-z ]{0,40}".prop_map(String::into_bytes),
        ],
        if_range in prop::option::of(".{0,40}"),
    ) {
        let Ok(value) = http::HeaderValue::from_bytes(&value) else { return Ok(()) };
        let mut h = HeaderMap::new();
        h.insert(header::RANGE, value);
        if let Some(if_range) = if_range.as_deref().and_then(|v| v.parse().ok()) {
            h.insert(header::IF_RANGE, if_range);
        }
        if let Ranges::Parts(parts) = evaluate(&h, len, Some("\"v1\""), Some("Sun, 06 Nov 1994 08:49:37 GMT")) {
            check_parts(&parts, len, None)?;
        }
    }
}

#[test]
fn fuzz_range_corpus() {
    for (at, value) in lacquer_corpus::text_cases("range") {
        for len in [0, 1, 500, 10_000, u64::MAX] {
            if let Ranges::Parts(parts) = evaluate(&headers(&[("range", &value)]), len, None, None)
            {
                check_parts(&parts, len, None)
                    .unwrap_or_else(|e| panic!("{at}, length {len}: {e}"));
            }
        }
    }
}
