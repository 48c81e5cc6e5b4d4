//! `[[rule]]`: what an operator writes in VCL, as plain data. A rule names the phase it acts in (`on`), a
//! `match` whose every given condition must hold, and actions; rules run in file order within each phase.
//! `lacquer-rules` compiles them (that is their validation) and docs/rules.md shows each VCL recipe beside
//! its rule.

use std::{collections::BTreeMap, net::IpAddr, time::Duration};

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

/// Where in the data path a rule acts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The client's request, before routing and lookup (VCL's `vcl_recv` and `vcl_hash`): what is changed
    /// here is what the key and variant are made of and what the origin receives.
    #[default]
    Request,
    /// The request as it leaves for the origin, on a fill, a revalidation or a pass (`vcl_backend_fetch`).
    BackendRequest,
    /// The origin's response, before it is stored (`vcl_backend_response`).
    BackendResponse,
    /// The response as it leaves for the client, hit or miss (`vcl_deliver`).
    Deliver,
    /// An error lacquerd answers itself because no backend answered (`vcl_synth`, `vcl_backend_error`).
    Error,
}

impl Phase {
    /// The name the file and the counters use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Request => "request",
            Self::BackendRequest => "backend_request",
            Self::BackendResponse => "backend_response",
            Self::Deliver => "deliver",
            Self::Error => "error",
        }
    }
}

/// One rule: a phase, conditions and actions. Every action defaults to doing nothing.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Rule {
    /// Shown in errors, counters and `cachectl explain`. Default: `rule[N]`, N its place in the file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The phase it acts in. Default: `request`.
    pub on: Phase,
    /// The conditions, all of which must hold. Default: none (every request).
    #[serde(rename = "match")]
    pub when: Match,
    /// No later rule of this phase runs once this one matched. Default: false.
    pub stop: bool,

    /// Lower-cases `Host` and drops its port (request). Default: false.
    pub normalize_host: bool,
    /// Header names removed; a trailing `*` removes every name starting so (request, backend_request,
    /// backend_response, deliver). Default: none.
    pub unset_headers: Vec<String>,
    /// Headers set, replacing any value, from templates (see [`Rule::respond`] for what a template may
    /// hold); a template that renders empty removes the header. Default: none.
    pub set_headers: BTreeMap<String, String>,
    /// Headers appended to, joined to an existing value with `, ` (request, backend_request,
    /// backend_response, deliver). Default: none.
    pub append_headers: BTreeMap<String, String>,
    /// The query string rewritten (request). Default: as sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub query: Option<QueryRewrite>,
    /// The path rewritten by a regular expression (request): `{ from = "^/old/(.*)", to = "/new/$1" }`.
    /// Default: as sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rewrite_path: Option<Rewrite>,
    /// Cookies kept or dropped by name (request); `Cookie` goes when none is left. Default: all kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cookies: Option<CookieFilter>,
    /// `Cookie` removed from the request and `Set-Cookie` from its response (request), as a route's
    /// `cookies = "strip"`. Default: false.
    pub strip_cookies: bool,
    /// The request is looked up and its response stored although it carries `Cookie` (request): for
    /// cookies filtered down to what the origin does not vary on, or keyed with `key`. Default: false.
    pub cache_cookies: bool,
    /// Request header names the stored response varies on, as if its `Vary` named them (request):
    /// `cookie` after `cookies.keep`, `x-forwarded-proto`, a bucket's header. Default: none.
    pub key: Vec<String>,
    /// A request header's value replaced by the first case whose regular expression it matches
    /// (request): Accept-Language into languages, User-Agent into device classes. Default: none.
    pub buckets: Vec<Bucket>,
    /// Cookies whose values the stored response varies on (request), while every cookie is still
    /// forwarded: Varnish's `hash_data(<cookie value>)`, Magento's `X-Magento-Vary`. The request is
    /// looked up although it carries `Cookie`, and its answer shared with every request that sends the
    /// same values. Needs `forward_all_cookies = true`, the operator's promise that the origin's answer
    /// depends on these values only. Default: none.
    pub key_cookie_values: Vec<String>,
    /// With `key_cookie_values`: every cookie reaches the origin, and the operator promises the answer
    /// depends only on the keyed cookies' values (request). Default: false.
    pub forward_all_cookies: bool,
    /// Never looked up or stored (request). Default: false.
    pub pass: bool,
    /// A connection upgrade (`Upgrade: websocket`) tunnelled to the backend, bytes copied both ways
    /// (request). Default: false (upgrades are refused).
    pub pipe: bool,
    /// The backend or director the request goes to, instead of its route's (request). Default: the
    /// route's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// Answered by lacquerd without the origin (request), or the response replaced (deliver, error).
    /// Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub respond: Option<Respond>,
    /// `POST` requests looked up and stored (request), keyed by a digest of their body, for bodies of at
    /// most this size with a `Content-Length` (GraphQL queries); other bodies pass. Only a response with
    /// explicit freshness (`max-age`, `s-maxage`, `Expires`) is stored, and the rule's `match.methods`
    /// must be `["POST"]`. Default: none (a POST invalidates and passes, RFC 9111 §4.4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_body: Option<ByteSize>,
    /// `Link` fields sent to the client in a `103 Early Hints` response (request), as soon as the request
    /// goes to the origin (a miss or a pass), so a browser fetches the page's styles and scripts while
    /// the origin makes the page: NGINX's `early_hints`, with the hints written here (each one `Link`
    /// value, like `"</app.css>; rel=preload; as=style"`). An origin's own 103 is forwarded as well.
    /// Default: none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub early_hints: Vec<String>,
    /// The most stale an object in grace may be and still be answered at once (request, Varnish's
    /// `req.grace`); past it the request waits for the origin, and the object still stands in if the
    /// origin fails. Default: the object's grace.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub request_grace: Option<Duration>,
    /// The request turned into bans (request), each made of the request by a typed template, as
    /// Magento's and WordPress's purge requests expect: every entry whose request field is sent makes a
    /// ban, and the request is answered `200 Purged`; when none is sent, `400`. Only from
    /// `purge.allow_from` (`405` otherwise). Default: none.
    pub ban: Vec<BanFromRequest>,
    /// The request's URL purged (request): `"url"` (with its query) or `"path"` (without it), answered
    /// `200 Purged`. Only from `purge.allow_from` (`405` otherwise). Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub purge: Option<PurgeScope>,

    /// Freshness given whatever the headers say, server errors included when the rule matches their
    /// status (backend_response). Default: from the headers.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Duration>,
    /// Freshness when the origin gives none (no `Cache-Control` lifetime, `Expires` or `Last-Modified`)
    /// (backend_response). Default: `cache.default_ttl`.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub default_ttl: Option<Duration>,
    /// The least freshness a storable response gets (backend_response). Default: none.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub ttl_min: Option<Duration>,
    /// The most freshness a storable response gets (backend_response). Default: none.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub ttl_max: Option<Duration>,
    /// Grace given to the stored response (backend_response). Default: the route's.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub grace: Option<Duration>,
    /// How long it is kept past grace for revalidation (backend_response). Default: `cache.keep`.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub keep: Option<Duration>,
    /// `false`: the response is streamed to the client and not stored (backend_response). Default: as
    /// the policy decides.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<bool>,
    /// `true`: the stored response is compressed whatever its size and type (Varnish's `do_gzip`; a
    /// `200` the origin did not code and did not mark `no-transform`); `false`: never (backend_response).
    /// Default: as `[compression]` decides (`min_size`, `types`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compress: Option<bool>,
    /// `true`: Edge Side Includes in the response are processed (Varnish's `do_esi`): it is parsed as it
    /// is fetched, stored parsed, and assembled for each client; `false`: not, whatever the route says
    /// (backend_response). Default: the route's `esi`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub esi: Option<bool>,
    /// `X-Cache-Hits` (times the object was served from the cache) and `X-Cache-TTL` (seconds of
    /// freshness left) added (deliver). Default: false.
    pub debug_headers: bool,
    /// The request's URL must be signed (request): a valid signature that has not expired, checked before
    /// the rule's other actions; the signature and expiry parameters are then removed from the target (so
    /// from the key and from what the origin receives). Otherwise the request is answered `403` (or
    /// `signed.refuse`). Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signed: Option<Signed>,

    /// Requests the whole rule set is run against by `lacquerd --check` and at reload, each with what
    /// must come out. Default: none.
    pub examples: Vec<Example>,
}

/// Every given condition must hold. Lists match when any of their entries does.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Match {
    /// `example.com` or `*.example.com` (any name under it); port and letter case ignored. Default: any.
    pub hosts: Vec<String>,
    /// The path starts with one of these. Default: any.
    pub path_prefix: Vec<String>,
    /// A regular expression searched in the path and query; its groups are `$1`… in templates. Default:
    /// any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_regex: Option<String>,
    /// The path's last segment ends in `.` and one of these (`css`, `js`; letter case ignored). Default:
    /// any.
    pub extensions: Vec<String>,
    /// One of these methods. Default: any.
    pub methods: Vec<String>,
    /// Request headers that must be present, each with a regular expression searched in its value (`""`
    /// for presence alone). Default: none.
    pub headers: BTreeMap<String, String>,
    /// Request headers that must be absent. Default: none.
    pub without_headers: Vec<String>,
    /// One of these cookies is sent (a trailing `*` matches any suffix). Default: any.
    pub cookies: Vec<String>,
    /// None of these cookies is sent (a trailing `*` matches any suffix). Default: none.
    pub without_cookies: Vec<String>,
    /// One of these query parameters is present. Default: any.
    pub query: Vec<String>,
    /// The client is in one of these networks. Default: any client.
    pub clients: Vec<ipnet::IpNet>,
    /// The client is in none of these networks. Default: none.
    pub except_clients: Vec<ipnet::IpNet>,
    /// The route's backend is healthy (`true`) or sick (`false`). Default: either.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend_healthy: Option<bool>,
    /// The response's status: a code (`404`) or a class (`"5xx"`) (backend_response, deliver, error).
    /// Default: any.
    pub status: Vec<StatusPattern>,
    /// The response's media type, `text/html` or `image/*`, parameters ignored (backend_response,
    /// deliver). Default: any.
    pub content_types: Vec<String>,
    /// Response headers that must be present, each with a regular expression searched in its value (`""`
    /// for presence alone) (backend_response, deliver): the origin's `X-Magento-Debug`, say. Default: none.
    pub response_headers: BTreeMap<String, String>,
    /// Headers the request and the response carry alike: the same values, or absent from both
    /// (backend_response, deliver). Default: none.
    pub same_headers: Vec<String>,
    /// Headers the request and the response do not carry alike (backend_response, deliver): Magento's
    /// GraphQL answers, not stored under the request's key when their `X-Magento-Cache-Id` differs from
    /// the request's. Default: none.
    pub different_headers: Vec<String>,
    /// How the cache answered the response (deliver): `hit`, `stale` (served in grace or for a failing
    /// origin), `miss` (fetched and stored), `uncacheable` (fetched, not stored) or `pass`. Default: any.
    pub outcome: Vec<String>,
    /// The response's `Content-Length` is larger than this (backend_response). Default: any size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub larger_than: Option<ByteSize>,
}

/// A status code, or a class of them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum StatusPattern {
    /// One code.
    Code(u16),
    /// `"4xx"`, `"5xx"`, or a code written as a string.
    Text(String),
}

/// How the query string is rewritten; parameters keep their order unless `sort`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueryRewrite {
    /// Sorted by name (stable). Default: false.
    pub sort: bool,
    /// With `sort`, parameters of the same name sorted by value too (`a=2&a=1` becomes `a=1&a=2`), as
    /// Varnish's `std.querysort` does; only for an origin that reads repeated names in any order.
    /// Default: false (their order is kept: `a=2&a=1` and `a=1&a=2` are different pages).
    pub sort_values: bool,
    /// Parameters removed by name; a trailing `*` matches any suffix (`utm_*`). Default: none.
    pub drop: Vec<String>,
    /// Only these parameters kept (after `drop`). Default: all.
    pub keep: Vec<String>,
    /// The whole query removed. Default: false.
    pub remove: bool,
}

/// A regular expression and its replacement template (`$1`, `${host}`, …).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Rewrite {
    /// Searched in the path. Required.
    pub from: String,
    /// What the matched part becomes. Required.
    pub to: String,
}

/// Cookie names kept or dropped (a trailing `*` matches any suffix).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CookieFilter {
    /// Only these kept (an allow-list). Default: all.
    pub keep: Vec<String>,
    /// These removed. Default: none.
    pub drop: Vec<String>,
}

/// One ban a request makes (a rule's `ban`): the regular expression is the value of the request header
/// `regex_from` (or the request's path and query, `regex_from = "path"`), matched against the stored
/// response header `object_header` (Magento: `{ object_header = "X-Magento-Tags", regex_from =
/// "X-Magento-Tags-Pattern" }`), or with `url = true` against the stored URLs of the request's host
/// (WordPress's `X-Purge-Method: regex`: `{ url = true, regex_from = "path" }`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BanFromRequest {
    /// The stored response's header the expression is matched against. One of this and `url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_header: Option<String>,
    /// The expression is matched against the stored URLs (path and query) of the request's host.
    /// Default: false.
    #[serde(default)]
    pub url: bool,
    /// The request header whose value is the expression, or `"path"` for the request's path and query.
    /// Required.
    pub regex_from: String,
}

/// A signed URL's check (a rule's `signed`): `sig` is the HMAC-SHA256, keyed by the secret, of the path
/// and the query's other parameters (the expiry included) in name order, base64url without padding
/// (`cachectl sign` makes one).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Signed {
    /// The file holding the secret, read when the rules are compiled (at least 16 bytes; a trailing
    /// newline is not part of it). Required.
    pub secret_file: std::path::PathBuf,
    /// The query parameter carrying the signature. Default: `sig`.
    #[serde(default = "sig")]
    pub param: String,
    /// The query parameter carrying the expiry, in unix seconds: a link is refused from then on. Default:
    /// `exp`.
    #[serde(default = "exp")]
    pub expires: String,
    /// `hmac-sha256`, or `nginx-md5` for links made for NGINX's `secure_link_md5`: the MD5 of
    /// `expression` in base64url, as NGINX checks it. Default: `hmac-sha256`.
    #[serde(default = "hmac_sha256")]
    pub algorithm: String,
    /// What an `nginx-md5` link's MD5 is of, in NGINX's `secure_link_md5` syntax: text and the variables
    /// `$secure_link_expires` (the expiry as sent), `$uri` (the path, percent-decoded), `$remote_addr`
    /// (the client's address) and `$secret` (the secret file's content, which NGINX's configuration writes
    /// inline). Default: `"$secure_link_expires$uri$remote_addr $secret"`, NGINX's documented example.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expression: Option<String>,
    /// The answer to a request whose signature is missing, wrong or expired. Default: `403`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refuse: Option<Respond>,
}

fn sig() -> String {
    "sig".into()
}

fn exp() -> String {
    "exp".into()
}

fn hmac_sha256() -> String {
    "hmac-sha256".into()
}

/// What a rule's `purge` removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PurgeScope {
    /// The request's URL, query included: the one object (every variant) stored under it.
    Url,
    /// The request's URL without its query.
    Path,
}

/// A request header's value mapped to a class.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Bucket {
    /// The request header read. Required.
    pub from: String,
    /// The request header written. Default: `from`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// `[value, regex]` pairs, tried in order. Required.
    pub cases: Vec<(String, String)>,
    /// The value when no case matches (or the header is absent). Required.
    pub default: String,
}

/// A response made by lacquerd. Templates may hold `$1`…`$9` (the `path_regex` groups), `${host}`,
/// `${path}`, `${query}`, `${target}` (path and query), `${scheme}`, `${client_ip}`, `${method}` and
/// `${status}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Respond {
    /// The status. Default: 200, or 302 with `location`; on deliver and error, the response's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// `Location`, a template. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// The body, a template (at most 64 KiB). Default: empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// A file whose bytes are the body, read when the rules are compiled (at most 1 MiB). Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<std::path::PathBuf>,
    /// `Content-Type`. Default: `text/html; charset=utf-8` for a file ending in `.html`, else
    /// `text/plain; charset=utf-8`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// Other response headers, templates. Default: none.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// A request run through every rule, and what must come out of it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Example {
    /// The request. Required.
    pub request: ExampleRequest,
    /// The origin's response, for the response phases. Default: `200` with no headers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<ExampleResponse>,
    /// What must come out. Required.
    pub expect: Expect,
}

/// A client's request in an example.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExampleRequest {
    /// `http://host/path?query`, or a path with `Host` in `headers`. Required.
    pub url: String,
    /// Default: `GET`.
    #[serde(default = "get")]
    pub method: String,
    /// Request headers. Default: none.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The client's address. Default: `192.0.2.1`.
    #[serde(default = "documentation_address")]
    pub client: IpAddr,
}

/// The origin's response in an example.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExampleResponse {
    /// Default: 200.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Response headers. Default: none.
    pub headers: BTreeMap<String, String>,
}

/// What an example must produce; only what is given is checked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Expect {
    /// The target (path and query) the origin is sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Request headers the origin is sent (`""`: absent).
    pub headers: BTreeMap<String, String>,
    /// Passed (never looked up or stored).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass: Option<bool>,
    /// Tunnelled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pipe: Option<bool>,
    /// The backend chosen by a rule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// The status of the answer lacquerd makes itself (a synthetic response).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Whether the example's response is stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stored: Option<bool>,
    /// The freshness it is stored with.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Duration>,
    /// The grace it is stored with: a rule's `grace` the example's response voids (`must-revalidate`,
    /// say) fails here, naming the directive.
    #[serde(with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub grace: Option<Duration>,
    /// Headers the client's response carries (`""`: absent).
    pub response_headers: BTreeMap<String, String>,
    /// Request header names the variant is keyed on, beyond the response's `Vary`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<Vec<String>>,
}

fn get() -> String {
    "GET".into()
}

fn documentation_address() -> IpAddr {
    IpAddr::from([192, 0, 2, 1])
}
