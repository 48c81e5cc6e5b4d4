//! Caching policy as plain functions over request and response heads: what may be looked up, what may be
//! stored and for how long, which key and variant an object lives under. No I/O happens here.

#![warn(missing_docs)]

pub mod age;
pub mod cache_control;
pub mod conditional;
pub mod encoding;
pub mod freshness;
pub mod head;
pub mod headers;
pub mod hls;
pub mod host;
pub mod key;
pub mod normalize;
pub mod range;
pub mod request;
pub mod stale;
pub mod storable;
pub mod surrogate;
pub mod vary;

use std::time::Duration;

pub use lacquer_config::Cache;

/// The policy one route applies: the `[cache]` section as read, and what the route replaces.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Policy {
    /// The `[cache]` section; its fields document their defaults.
    pub cache: Cache,
    /// Freshness given to every storable response whatever its headers say (a route's `ttl`). Default:
    /// none.
    pub ttl_override: Option<Duration>,
    /// Grace given to every stored response (a route's `grace`). Default: none.
    pub grace_override: Option<Duration>,
    /// Request fields every stored response varies on, as if its `Vary` named them, lower-case: the
    /// forwarding fields when a route keys on them. Default: none.
    pub key_headers: Vec<String>,
    /// `[compression]` when it applies to the route: `Accept-Encoding` negotiated by lacquerd, bodies
    /// compressed when stored and decoded on delivery. Default: none (the field varies like any other).
    pub compression: Option<encoding::Negotiation>,
}

impl Policy {
    /// The policy of `[cache]` with no route's overrides.
    pub fn new(cache: Cache) -> Self {
        Self {
            cache,
            ..Self::default()
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
            "accept-encoding",
            "content-encoding",
            "content-type",
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
            request::classify(&Method::GET, &h, &policy, false);
            vary::selection(&["range".to_string()], &h);
            conditional::not_modified(&h, Some(value), None, Some(value));
            range::evaluate(&h, 1000, Some(value), Some(value));
            range::evaluate(&h, 0, None, None);
            let accepts = encoding::Accepts::from_headers(&h);
            accepts.accepts(Some(encoding::Coding::Br));
            encoding::delivery(&h, &accepts, false);
            encoding::compress_with(StatusCode::OK, &h, &encoding::Compression::default(), None);
            headers::strip_hop_by_hop(&mut h);
        }
    }
}
