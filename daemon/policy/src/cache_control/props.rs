//! Property tests (the fuzz target `cache_control`): any value parses without panicking, and a generated
//! list of directives, rendered the many ways origins write them, parses to what it says, first
//! occurrence winning.

use proptest::prelude::*;

use super::*;

const KNOWN: &[&str] = &[
    "no-store",
    "no-cache",
    "private",
    "public",
    "must-revalidate",
    "proxy-revalidate",
    "must-understand",
    "immutable",
    "only-if-cached",
    "max-age",
    "s-maxage",
    "stale-while-revalidate",
    "stale-if-error",
    "min-fresh",
    "max-stale",
];

#[derive(Debug, Clone)]
enum Arg {
    None,
    Number(u128),
    QuotedNumber(u128),
    Token(String),
    Quoted(String),
}

impl Arg {
    fn render(&self) -> String {
        match self {
            Arg::None => String::new(),
            Arg::Number(n) => format!("={n}"),
            Arg::QuotedNumber(n) => format!("=\"{n}\""),
            Arg::Token(t) => format!("={t}"),
            Arg::Quoted(q) => format!("=\"{}\"", q.replace('\\', "\\\\").replace('"', "\\\"")),
        }
    }

    /// The argument as delta-seconds (RFC 9111 §1.2.2), the quoted form included.
    fn seconds(&self) -> Option<u64> {
        match self {
            Arg::Number(n) | Arg::QuotedNumber(n) => {
                Some(u64::try_from(*n).map_or(DELTA_SECONDS_MAX, |n| n.min(DELTA_SECONDS_MAX)))
            }
            Arg::Quoted(q) => parse_delta_seconds(q),
            Arg::Token(t) => parse_delta_seconds(t),
            Arg::None => None,
        }
    }
}

/// The oracle: what one directive means, written from RFC 9111 §5.2 independently of `apply`.
fn expect(cc: &mut CacheControl, name: &str, arg: &Arg) {
    let or_stale = arg.seconds().or(Some(0));
    match name {
        "no-store" => cc.no_store = true,
        "no-cache" => cc.no_cache = true,
        "private" => cc.private = true,
        "public" => cc.public = true,
        "must-revalidate" => cc.must_revalidate = true,
        "proxy-revalidate" => cc.proxy_revalidate = true,
        "must-understand" => cc.must_understand = true,
        "immutable" => cc.immutable = true,
        "only-if-cached" => cc.only_if_cached = true,
        "max-age" => cc.max_age = or_stale,
        "s-maxage" => cc.s_maxage = or_stale,
        "stale-while-revalidate" => cc.stale_while_revalidate = arg.seconds(),
        "stale-if-error" => cc.stale_if_error = arg.seconds(),
        "min-fresh" => cc.min_fresh = arg.seconds(),
        "max-stale" => cc.max_stale = Some(arg.seconds()),
        _ => {}
    }
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(KNOWN).prop_flat_map(|n| {
            // Directive names are case-insensitive: flip the case of some letters.
            prop::collection::vec(any::<bool>(), n.len()).prop_map(move |upper| {
                n.chars()
                    .zip(upper)
                    .map(|(c, u)| if u { c.to_ascii_uppercase() } else { c })
                    .collect()
            })
        }),
        1 => "[a-z][a-z0-9!#$%&'*+.^_`|~-]{0,12}",
    ]
}

fn arg() -> impl Strategy<Value = Arg> {
    prop_oneof![
        3 => Just(Arg::None),
        3 => prop_oneof![0u128..100_000, any::<u128>()].prop_map(Arg::Number),
        1 => (0u128..100_000).prop_map(Arg::QuotedNumber),
        1 => "[a-zA-Z0-9!#$%&'*+.^_`|~-]{1,10}".prop_map(Arg::Token),
        1 => "[ -~]{0,16}".prop_map(Arg::Quoted),
    ]
}

fn separator() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just(","),
        Just(", "),
        Just(" ,"),
        Just(",\t"),
        Just(", ,"),
        Just(",,")
    ]
}

proptest! {
    #[test]
    fn fuzz_cache_control_round_trip(
        directives in prop::collection::vec((name(), arg(), separator()), 0..12),
        lines in 1usize..4,
        padding in prop_oneof![Just(""), Just(" "), Just("\t"), Just(", ")],
    ) {
        let mut want = CacheControl::default();
        let mut seen: Vec<String> = Vec::new();
        for (name, arg, _) in &directives {
            let name = name.to_ascii_lowercase();
            if !seen.contains(&name) {
                expect(&mut want, &name, arg);
                seen.push(name);
            }
        }
        // The same list written over one to three header lines.
        let per_line = directives.len().div_ceil(lines).max(1);
        let mut h = HeaderMap::new();
        for chunk in directives.chunks(per_line) {
            let mut line = padding.to_string();
            for (i, (name, arg, sep)) in chunk.iter().enumerate() {
                if i > 0 {
                    line.push_str(sep);
                }
                line.push_str(name);
                line.push_str(&arg.render());
            }
            line.push_str(padding);
            h.append(CACHE_CONTROL, line.parse().unwrap());
        }
        prop_assert_eq!(CacheControl::from_headers(&h), want, "{:?}", h);
    }

    #[test]
    fn fuzz_cache_control_arbitrary(values in prop::collection::vec(
        prop_oneof![
            any::<Vec<u8>>(),
            "[a-z=\", \\\\-]{0,40}".prop_map(String::into_bytes),
            "(max-age|no-cache|private|s-maxage)(=\"?[0-9a-z, \\\\\"]{0,8})?(, )?".prop_map(String::into_bytes),
        ],
        1..4,
    )) {
        let mut h = HeaderMap::new();
        for v in values {
            if let Ok(v) = http::HeaderValue::from_bytes(&v) {
                h.append(CACHE_CONTROL, v.clone());
                h.append("cdn-cache-control", v);
            }
        }
        let cc = CacheControl::from_headers(&h);
        for d in [cc.max_age, cc.s_maxage, cc.stale_while_revalidate, cc.stale_if_error, cc.min_fresh] {
            prop_assert!(d.is_none_or(|d| d <= DELTA_SECONDS_MAX));
        }
        CacheControl::governing(&h, &["cdn-cache-control".to_string()]);
    }
}

#[test]
fn fuzz_cache_control_corpus() {
    for (at, value) in lacquer_corpus::text_cases("cache_control") {
        let mut h = HeaderMap::new();
        h.append(
            CACHE_CONTROL,
            value.parse().unwrap_or_else(|e| panic!("{at}: {e}")),
        );
        let cc = CacheControl::from_headers(&h);
        assert!(
            cc.max_age.is_none_or(|d| d <= DELTA_SECONDS_MAX),
            "{at}: {cc:?}"
        );
    }
}
