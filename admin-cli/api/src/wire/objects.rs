//! `GET /v1/objects?url=…`: what the store holds for one URL.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// The URL to inspect: absolute, or a path with `host`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ObjectQuery {
    /// `http://host/path?query`, or `/path?query` with `host`.
    pub url: String,
    /// The host, when `url` has none (or to override it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// Every stored variant of a URL's cache key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Inspection {
    /// The cache key the URL maps to.
    pub key: String,
    /// Whether any variant is stored; a lookup would still fetch a variant whose body is gone.
    pub cached: bool,
    /// Newest first.
    pub variants: Vec<StoredVariant>,
    /// The key's last response was not stored, and requests for it go straight to the backend for a
    /// while (`cache.hit_for_miss`): why and when. Absent otherwise, and from older daemons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_stored: Option<NotStoredNote>,
}

/// Why a key's last response was not stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NotStoredNote {
    /// The `Cache-Status` `detail` token: `private`, `no-store`, `too-large`, `store-refused`…
    pub reason: String,
    /// Unix seconds when the response came.
    pub at: u64,
    /// How much longer requests for the key bypass the cache (hit-for-miss).
    pub bypass_seconds: u64,
}

/// One stored response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StoredVariant {
    /// The request headers the response's `Vary` selected on, with the values this variant was fetched with.
    pub vary: Vec<HeaderField>,
    pub status: u16,
    /// Body bytes.
    pub size: u64,
    /// Where the body's chunks are.
    pub tiers: Tiers,
    /// `fresh`, `grace` (stale, served while refreshed), `keep` (stale, kept for revalidation) or
    /// `expired` (waiting for the sweeper).
    pub state: String,
    /// Unix seconds when it was received.
    pub stored_at: u64,
    pub age_seconds: u64,
    /// Freshness left; negative once stale.
    pub ttl_seconds: i64,
    pub grace_seconds: u64,
    pub keep_seconds: u64,
    pub stale_if_error_seconds: u64,
    /// Never served stale (`must-revalidate`, `no-cache`…).
    pub no_stale: bool,
    /// The stored `Cache-Control` directive that keeps it from being served stale, whatever grace a rule
    /// gave (`must-revalidate`, `proxy-revalidate`, `no-cache`, or `s-maxage` when no rule gave a grace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_forbidden_by: Option<String>,
    /// Surrogate keys.
    pub tags: Vec<String>,
    /// Response headers as stored.
    pub headers: Vec<HeaderField>,
    /// Unique per stored body.
    pub generation: u64,
    /// The representations lacquerd made of the body for clients that do not take its coding (an identity
    /// copy of a body stored gzip'd), sent under this variant's headers. Absent from older daemons.
    #[serde(default)]
    pub representations: Vec<Representation>,
    /// When the body is stored in parts (a sliced route's slices, the byte ranges an origin sent): the
    /// representation's whole length; `size` is then what the parts hold. Absent otherwise, and from older
    /// daemons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
    /// The parts held, in order of their first byte.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<StoredPart>,
    /// An ESI page's includes, in the order the page has them (stored parsed: a route's or rule's
    /// `esi`). Absent for any other body, and from older daemons; empty for a page without includes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub esi_includes: Option<Vec<EsiInclude>>,
}

/// One include of a stored ESI page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EsiInclude {
    /// Its `src`, as the page wrote it (entities decoded).
    pub src: String,
    /// `onerror="continue"`: left out when it fails, rather than cutting the page off.
    pub continue_on_error: bool,
}

/// A representation made of a stored variant's body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Representation {
    /// Its content coding: `identity`, `gzip`…
    pub coding: String,
    /// Body bytes.
    pub size: u64,
    /// Where its chunks are.
    pub tiers: Tiers,
    /// Unique per stored body.
    pub generation: u64,
}

/// One byte range of a body stored in parts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StoredPart {
    /// Its first byte's position in the representation.
    pub start: u64,
    /// Bytes.
    pub size: u64,
    /// Where its chunks are.
    pub tiers: Tiers,
    /// Unique per stored part.
    pub generation: u64,
}

/// Chunk counts by tier (a chunk held by both counts in both).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Tiers {
    pub chunks: u32,
    pub in_memory: u32,
    pub on_disk: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HeaderField {
    pub name: String,
    /// Lossily decoded as UTF-8.
    pub value: String,
}
