//! Caching policy as plain functions over request and response heads: what may be looked up, what may be
//! stored and for how long, which key and variant an object lives under. No I/O happens here.

pub mod age;
pub mod cache_control;
pub mod conditional;
pub mod freshness;
pub mod head;
pub mod headers;
pub mod key;
pub mod normalize;
pub mod range;
pub mod request;
pub mod stale;
pub mod storable;
pub mod surrogate;
pub mod vary;

use std::time::Duration;

/// Operator-tunable policy. Defaults follow RFC 9111 and what a Varnish or NGINX operator expects.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Freshness for responses without any freshness information. Default: 0 (not cached).
    pub default_ttl: Duration,
    /// Share of the `Last-Modified` age used as heuristic freshness. Default: 0.1 (RFC 9111 §4.2.2).
    pub heuristic_fraction: f64,
    /// Cap on heuristic freshness. Default: 1 day.
    pub heuristic_max: Duration,
    /// Grace when the response has no `stale-while-revalidate`. Default: 0, because RFC 9111 §4.2.4 lets a
    /// cache serve stale only when the origin allows it; set 10 s for Varnish's behaviour.
    pub default_grace: Duration,
    /// How long objects are kept past grace for revalidation. Default: 0.
    pub keep: Duration,
    /// How long past freshness an object may stand in for a failing origin when the response has no
    /// `stale-if-error`. Default: 6 h.
    pub error_grace: Duration,
    /// Look up and store requests carrying `Authorization`. Default: false (pass).
    pub cache_authorized: bool,
    /// Look up and store requests carrying `Cookie`. Default: false (pass).
    pub cache_cookie_requests: bool,
    /// Store responses carrying `Set-Cookie`. Default: false (pass).
    pub cache_set_cookie: bool,
    /// How long a key whose response was uncacheable bypasses request coalescing. Default: 120 s, as Varnish.
    pub hit_for_miss: Duration,
    /// Largest body stored; larger ones are passed. Default: 256 MiB.
    pub max_object_size: u64,
    /// Body bytes one fetch holds in memory for its readers (at least two chunks while storing). Readers
    /// further behind read what the store holds; when the body is not stored, the origin is read no faster
    /// than the slowest reader. Default: 4 MiB.
    pub transit_buffer: u64,
    /// Targeted cache-control fields (RFC 9213) this cache obeys, in precedence order, lower-case; the first
    /// present replaces `Cache-Control` and `Expires`. Default: `cdn-cache-control`.
    pub targeted_cache_control: Vec<String>,
    /// Response headers carrying surrogate keys (tags for purging), lower-case. Default: `surrogate-key`,
    /// `xkey`, `cache-tag` (Fastly, Varnish's xkey, Cloudflare).
    pub surrogate_key_headers: Vec<String>,
    /// Freshness given to every storable response whatever its headers say (a route's `ttl`). Default:
    /// none.
    pub ttl_override: Option<Duration>,
    /// Grace given to every stored response (a route's `grace`). Default: none.
    pub grace_override: Option<Duration>,
    /// Request fields every stored response varies on, as if its `Vary` named them, lower-case: the
    /// forwarding fields when a route keys on them. Default: none.
    pub key_headers: Vec<String>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            default_ttl: Duration::ZERO,
            heuristic_fraction: 0.1,
            heuristic_max: Duration::from_secs(86_400),
            default_grace: Duration::ZERO,
            keep: Duration::ZERO,
            error_grace: Duration::from_secs(6 * 3600),
            cache_authorized: false,
            cache_cookie_requests: false,
            cache_set_cookie: false,
            hit_for_miss: Duration::from_secs(120),
            max_object_size: 256 * 1024 * 1024,
            transit_buffer: 4 * 1024 * 1024,
            targeted_cache_control: vec!["cdn-cache-control".into()],
            surrogate_key_headers: vec!["surrogate-key".into(), "xkey".into(), "cache-tag".into()],
            ttl_override: None,
            grace_override: None,
            key_headers: Vec::new(),
        }
    }
}

/// Header lines as the policy tables write them: `(name, value)` pairs.
#[cfg(test)]
pub(crate) type Lines<'a> = &'a [(&'a str, &'a str)];

/// Builds a header map from `(name, value)` pairs, repeating names as separate lines.
#[cfg(test)]
pub(crate) fn test_headers(pairs: Lines<'_>) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            http::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    h
}

/// Every parser here meets hostile header values (they come from clients and origins alike): none may panic.
#[cfg(test)]
mod hostile {
    use std::time::SystemTime;

    use http::{Method, StatusCode};

    use super::*;

    const NASTY: &[&str] = &[
        "",
        " ",
        ",",
        ",,,",
        "\"",
        "\"\"",
        "\"a",
        "W/",
        "W/\"",
        "*",
        "=",
        "==",
        "a=",
        "=a",
        "a=\"",
        "a=\"\\",
        "\\",
        "-",
        "--",
        "-1",
        "1-",
        "bytes=",
        "bytes=-",
        "bytes=--1",
        "bytes=1--2",
        "bytes=,",
        "bytes=99999999999999999999-",
        "bytes=-99999999999999999999",
        "max-age=",
        "max-age=\"",
        "max-age=99999999999999999999999",
        "é",
        "ü,é;ß",
        "\t",
        "Sun, 06 Nov 1994 08:49:37",
        "0, 0",
        "1;a=b",
        "*, \"a\"",
        "s-maxage=-1, max-age=",
    ];

    #[test]
    fn parsers_survive_hostile_values() {
        let names = [
            "cache-control",
            "age",
            "expires",
            "date",
            "last-modified",
            "vary",
            "range",
            "if-range",
            "if-none-match",
            "if-modified-since",
            "etag",
            "connection",
            "host",
        ];
        for value in NASTY {
            let pairs: Vec<(&str, &str)> = names.iter().map(|n| (*n, *value)).collect();
            let Ok(mut h) = std::panic::catch_unwind(|| test_headers(&pairs)) else {
                continue;
            };
            let now = SystemTime::now();
            let policy = Policy::default();
            cache_control::CacheControl::from_headers(&h);
            age::corrected_initial_age(&h, now, now);
            storable::decide(true, StatusCode::OK, &h, &policy, now);
            request::classify(&Method::GET, &h, &policy);
            vary::selection(&["range".to_string()], &h);
            conditional::not_modified(&h, Some(value), Some(value));
            range::evaluate(&h, 1000, Some(value), Some(value));
            range::evaluate(&h, 0, None, None);
            headers::strip_hop_by_hop(&mut h);
        }
    }
}
