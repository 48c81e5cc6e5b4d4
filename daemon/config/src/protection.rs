//! `[[deny]]`, `[normalize]` and routes' `rate_limit`: what protects the origin and the cache key.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Requests matching every condition given are answered `403` and go no further. At least one condition.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Deny {
    /// Any of these methods. Default: any method.
    pub methods: Vec<String>,
    /// A regular expression searched in the path and query. Default: any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_regex: Option<String>,
    /// A request header that must be present (and match `header_regex`, when given). Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// Searched in every value of `header`. Default: any value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header_regex: Option<String>,
    /// Client networks (the PROXY protocol's client where a listener expects it). Default: any client.
    pub clients: Vec<ipnet::IpNet>,
    /// Client networks the rule never applies to, e.g. the office for `^/admin`. Default: none.
    pub except_clients: Vec<ipnet::IpNet>,
}

/// Query rewrites that keep equivalent URLs on one cache key. (The key always lower-cases the host and
/// drops its default port.)
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Normalize {
    /// Sort query parameters by name (stable: repeated names keep their order). Default: false.
    pub sort_query: bool,
    /// Query parameters removed before lookup and before the request goes on, e.g. `["utm_*", "gclid",
    /// "fbclid"]`; a trailing `*` matches any suffix. Default: none.
    pub strip_query_params: Vec<String>,
}

/// A token bucket per client address: `requests` per `per`, with room for `burst` at once. Past it, `429`
/// with `Retry-After`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Requests allowed every `per`, on average. Required.
    pub requests: u32,
    /// The period `requests` are counted over. Default: 1 s.
    #[serde(with = "humantime_serde", default = "one_second")]
    pub per: Duration,
    /// Requests a quiet client may send at once before the rate applies. Default: `requests`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
}

fn one_second() -> Duration {
    Duration::from_secs(1)
}
