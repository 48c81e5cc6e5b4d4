//! `[[route]]`: which backend a request goes to, and how its responses are cached, by host and path.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Routes are tried in order; the first whose every given condition holds applies. A request no route
/// matches goes to the first backend under `[cache]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Route {
    /// `example.com`, or `*.example.com` for any name under it (not `example.com` itself); the port and
    /// letter case are ignored. Default: any host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The normalised target (path and query) starts with it. Default: any path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// A regular expression searched in the path and query. Default: any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_regex: Option<String>,
    /// A backend or director name. Default: the first backend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// Never look up or store: every request goes to the backend. Default: false.
    pub pass: bool,
    /// Freshness given to every storable response, whatever its headers say (Varnish's `beresp.ttl`).
    /// Default: from the headers, then `cache.default_ttl`.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Duration>,
    /// Grace given to every stored response (Varnish's `beresp.grace`). Default: `stale-while-revalidate`,
    /// then `cache.default_grace`.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub grace: Option<Duration>,
    /// What a request with `Cookie` does. Default: as `cache.cache_cookie_requests` says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cookies: Option<Cookies>,
    /// Requests per client address on this route, e.g. `{ requests = 10, per = "1s", burst = 20 }`; past
    /// it, `429` with `Retry-After`. Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<super::RateLimit>,
    /// `strip` or `key` the forwarding fields on this route. Default: `server.forwarding_headers`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forwarding_headers: Option<super::ForwardingHeaders>,
    /// `false` turns `[compression]` off on this route: `Accept-Encoding` is forwarded as sent and varies
    /// the cache, bodies are stored and sent as the origin sent them. Default: `compression.enabled`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compression: Option<bool>,
    /// Fetch and store this route's objects in slices of this size (`"8MiB"`: a multiple of
    /// `storage.chunk_size`, at most `cache.max_object_size`, and at least `cache.max_sliced_object_size`
    /// over 8192), each an aligned range request to the origin
    /// (`Range: bytes=k×size-…`) stored and coalesced on its own: a client's range costs the origin the
    /// slices it covers, and objects larger than `cache.max_object_size` (up to
    /// `cache.max_sliced_object_size`) are cached. Bodies on such a route are the origin's bytes:
    /// `[compression]` does not apply. Default: none (objects are fetched whole).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slice: Option<bytesize::ByteSize>,
    /// Process Edge Side Includes in this route's responses (Varnish's `do_esi` on every response): the
    /// page is parsed once as it is fetched, stored parsed, and assembled with its fragments for each
    /// client, within `[esi]`'s bounds. A `backend_response` rule's `esi` decides per response instead.
    /// Default: false.
    pub esi: bool,
    /// Fetch into the store, in the background, what this route's players will ask for next, within
    /// `[prefetch]`'s budget, e.g. `{ playlist = 2, cmcd = true }`. Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<RoutePrefetch>,
}

/// A route's `prefetch`: what is fetched before it is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutePrefetch {
    /// When a player asks for a segment (or an LL-HLS part) that a media playlist of this route lists,
    /// the next this many it lists after it; when a new version of the playlist arrives, those after the
    /// newest one asked for. At most 16. Default: 0 (none).
    pub playlist: usize,
    /// The object (`nor`) or byte range (`nrr`) a request's CMCD data (the `CMCD-Request` header or the
    /// `CMCD` query parameter, CTA-5004) says the player asks for next: only on the same host, and only a
    /// relative path that stays within the site (not above its root). Default: false.
    pub cmcd: bool,
}

/// What a route does with `Cookie` on requests (and `Set-Cookie` on responses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cookies {
    /// Sent to the backend, never cached.
    Pass,
    /// Removed from the request (and `Set-Cookie` from the response) before anything else: static
    /// content that cookies must not fragment, the `unset req.http.Cookie` of VCL.
    Strip,
    /// Looked up and cached with the cookie sent on: for backends that ignore it.
    Cache,
}
