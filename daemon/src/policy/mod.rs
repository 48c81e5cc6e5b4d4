//! Caching policy as plain functions over request and response heads: what may be looked up, what may be
//! stored and for how long, which key and variant an object lives under. No I/O happens here.

pub mod age;
pub mod cache_control;
pub mod conditional;
pub mod freshness;
pub mod headers;
pub mod key;
pub mod range;
pub mod request;
pub mod stale;
pub mod storable;
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
    /// Grace when the response has no `stale-while-revalidate`. Default: 10 s, as Varnish.
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
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            default_ttl: Duration::ZERO,
            heuristic_fraction: 0.1,
            heuristic_max: Duration::from_secs(86_400),
            default_grace: Duration::from_secs(10),
            keep: Duration::ZERO,
            error_grace: Duration::from_secs(6 * 3600),
            cache_authorized: false,
            cache_cookie_requests: false,
            cache_set_cookie: false,
            hit_for_miss: Duration::from_secs(120),
            max_object_size: 256 * 1024 * 1024,
        }
    }
}

/// Builds a header map from `(name, value)` pairs, repeating names as separate lines.
#[cfg(test)]
pub(crate) fn test_headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            http::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    h
}
