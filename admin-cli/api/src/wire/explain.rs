//! `POST /v1/explain`: what the running daemon's rules and policy would do with a request, without sending
//! anything to the origin.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::HeaderField;

/// A request to explain, as a client would send it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExplainRequest {
    /// `http://host/path?query`, or `/path?query` with a `Host` in `headers`.
    pub url: String,
    /// Default: `GET`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Request header fields, in order.
    #[serde(default)]
    pub headers: Vec<HeaderField>,
    /// The client's address. Default: `192.0.2.1` (documentation range: no client rule on a real network
    /// matches it by accident).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, example = "192.0.2.1")]
    pub client: Option<std::net::IpAddr>,
    /// As if it came over TLS (`${scheme}` is `https`). Default: false.
    #[serde(default)]
    pub secure: bool,
    /// The request's body (`Content-Length` is set from it unless given): for a `POST` a `cache_body`
    /// rule keys, whose variant is the body's SHA-256 as for the real request. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

/// One rule tried at one phase.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RuleStep {
    /// Its place in the file, from 0.
    pub index: usize,
    /// Its `name`, or `rule[N]`.
    pub name: String,
    /// `request`, `backend_request`, `backend_response`, `deliver` or `error`.
    pub phase: String,
    /// Its conditions held and its actions ran.
    pub matched: bool,
}

/// A response head: a synthetic answer, or what a client would be sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExplainedResponse {
    pub status: u16,
    pub headers: Vec<HeaderField>,
}

/// What the daemon would do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Explanation {
    /// `lookup`, `pass`, `pipe`, `synthetic`, `denied`, `invalidation` (PURGE, BAN, or an unsafe method
    /// passed on), `refused` (a bad head: `reason` says why).
    pub action: String,
    /// Why, when `action` is not `lookup`: `rule "static"`, `route`, `authorization`, `cookie`, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Every rule tried, in the order tried, every phase.
    pub rules: Vec<RuleStep>,
    /// The method the origin would be sent.
    pub method: String,
    /// The target (path and query) the origin would be sent.
    pub target: String,
    /// The request fields the origin would be sent (before `X-Forwarded-For` and `Via`, which are added
    /// as it leaves), after the backend-request rules.
    pub headers: Vec<HeaderField>,
    /// The route that applies: `route[N]`, or `default`.
    pub route: String,
    /// The backend or director the request would go to.
    pub backend: String,
    /// The cache key (absent on a pass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Request fields every stored response varies on, beyond its own `Vary` (rules' `key`, keyed
    /// forwarding fields, `accept-encoding` under compression).
    pub key_fields: Vec<String>,
    /// `Link` values a rule's `early_hints` sends in a `103 Early Hints` when the request goes to the
    /// origin (a miss or a pass).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub early_hints: Vec<String>,
    /// The answer a rule makes without the origin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synthetic: Option<ExplainedResponse>,
    /// The stored variant this request would be answered from, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored: Option<ExplainedObject>,
}

/// The stored variant a request selects, and what the rules make of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExplainedObject {
    /// `fresh`, `grace`, `stale` (fetched again; stands in if the origin fails) or `unusable`.
    pub state: String,
    /// Seconds of freshness left; negative once stale.
    pub ttl_seconds: i64,
    /// Whether its response, fetched again, would be stored (`backend_response` rules and the policy),
    /// and if not why.
    pub storable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_stored_because: Option<String>,
    /// The freshness it would be stored with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub would_ttl_seconds: Option<u64>,
    /// The grace it would be stored with (served stale while fetched again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub would_grace_seconds: Option<u64>,
    /// The origin's directive that forbids serving it stale, whatever grace a rule gives
    /// (`must-revalidate`, `proxy-revalidate`, `no-cache`, or `s-maxage` when no rule gives a grace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_forbidden_by: Option<String>,
    /// The response the client would get (after the deliver rules); a rule's replacement shows here.
    pub response: ExplainedResponse,
}
