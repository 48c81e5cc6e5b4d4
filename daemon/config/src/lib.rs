//! The configuration file (TOML) and the command-line flags that override it.

#![warn(missing_docs)]

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

mod compression;
mod listen;
mod protection;
mod routes;
mod rules;
mod upstream;

pub use self::{
    compression::{Coding, Compression, DictionaryCoding},
    listen::{Acme, AcmeChallenge, Certificate, Listen},
    protection::{Deny, Normalize, RateLimit},
    routes::{Cookies, Route, RoutePrefetch},
    rules::{
        BanFromRequest, Bucket, CookieFilter, Example, ExampleRequest, ExampleResponse, Expect,
        Match, Phase, PurgeScope, QueryRewrite, Respond, Rewrite, Rule, Signed, StatusPattern,
    },
    upstream::{Backend, Director, DirectorPolicy, Probe, Protocol},
};

/// A configuration problem, rendered as one line that names the key (and the file position when known).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl ConfigError {
    /// `setting` (as the file names it, `route[2].path_regex`) cannot be used, because of `reason`.
    pub fn setting(setting: impl std::fmt::Display, reason: impl std::fmt::Display) -> Self {
        Self(format!("{setting}: {reason}"))
    }
}

/// The statuses lacquerd answers itself when no backend answered, which `[error_pages]` may replace.
const ERROR_PAGE_STATUSES: [&str; 3] = ["502", "503", "504"];

/// The whole file, as plain data: every section defaults to what lacquerd runs on without a file. Building
/// the live settings from it is what validates the rest (routes, directors, deny rules, certificates).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Client listeners (`[[listen]]`). Default: one plain listener on `0.0.0.0:6081`.
    pub listen: Vec<Listen>,
    /// `[server]`: worker threads, shutdown, hit-for-miss memory, forwarding fields.
    pub server: Server,
    /// Origins (`[[backend]]`, or one `[backend]` table). The first takes what no route claims.
    #[serde(deserialize_with = "upstream::one_or_many")]
    pub backend: Vec<Backend>,
    /// Groups of backends (`[[director]]`). Default: none.
    pub director: Vec<Director>,
    /// Routing rules (`[[route]]`), in order. Default: none.
    pub route: Vec<Route>,
    /// Requests refused with 403 (`[[deny]]`). Default: none.
    pub deny: Vec<Deny>,
    /// Rules (`[[rule]]`) run at the data path's phases, in order (docs/rules.md). Default: none.
    pub rule: Vec<Rule>,
    /// `[normalize]`: query rewrites applied before rules, key and origin see the target. Default: none.
    pub normalize: Normalize,
    /// `[admin]`: the admin API's address and secret.
    pub admin: Admin,
    /// `[storage]`: where and how much the store holds.
    pub storage: Storage,
    /// `[cache]`: the HTTP caching policy every route starts from.
    pub cache: Cache,
    /// `[compression]`: content codings negotiated, stored once and converted on delivery. Default: on.
    pub compression: Compression,
    /// `[purge]`: `PURGE` and `BAN` on the client listeners. Default: off.
    pub purge: Purge,
    /// `[prefetch]`: the budget of the routes' `prefetch`. Default: as [`Prefetch`] says.
    pub prefetch: Prefetch,
    /// `[esi]`: the bounds of Edge Side Includes, where a route or rule turns them on. Default: as [`Esi`]
    /// says.
    pub esi: Esi,
    /// `[log]`: the daemon's own log level.
    pub log: Log,
    /// `[access_log]`: one line per request. Default: none written.
    pub access_log: AccessLog,
    /// `[error_pages]`: the page sent, by status (`503 = "/etc/lacquer/errors/503.html"`), when lacquerd
    /// answers itself for want of a backend's answer (502, 503, 504), as NGINX's `error_page`. Default:
    /// none, a generic page in HTML or plain text as the client's `Accept` prefers.
    pub error_pages: BTreeMap<String, PathBuf>,
    /// `[cluster]`: this node's membership of a cluster coordinated through etcd. Default: none (a single
    /// node, no etcd).
    pub cluster: Option<Cluster>,
    /// `[telemetry]`: OpenTelemetry traces exported over OTLP/HTTP. Default: off (no `endpoint`).
    pub telemetry: Telemetry,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: vec![Listen::default()],
            server: Server::default(),
            backend: vec![Backend::default()],
            director: Vec::new(),
            route: Vec::new(),
            deny: Vec::new(),
            rule: Vec::new(),
            normalize: Normalize::default(),
            admin: Admin::default(),
            storage: Storage::default(),
            cache: Cache::default(),
            compression: Compression::default(),
            purge: Purge::default(),
            prefetch: Prefetch::default(),
            esi: Esi::default(),
            log: Log::default(),
            access_log: AccessLog::default(),
            error_pages: BTreeMap::new(),
            cluster: None,
            telemetry: Telemetry::default(),
        }
    }
}

/// `[server]`: process-wide settings of the client side.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Server {
    /// Threads serving clients, each with its own listener socket (`SO_REUSEPORT`). 0: one per core.
    /// Default: 0.
    pub workers: usize,
    /// How long in-flight responses may take to finish on shutdown. Default: 30 s.
    #[serde(with = "humantime_serde")]
    pub shutdown_timeout: Duration,
    /// Memory for the keys that recently proved uncacheable (hit-for-miss); the oldest leave first when it
    /// is full. Default: 16 MiB.
    pub hit_for_miss_memory: ByteSize,
    /// What requests' forwarding fields (`X-Forwarded-Host`, `Forwarded`, `X-Original-URL`, …) become; a
    /// route's `forwarding_headers` overrides it. Default: `strip`.
    pub forwarding_headers: ForwardingHeaders,
}

impl Default for Server {
    fn default() -> Self {
        Self {
            workers: 0,
            shutdown_timeout: Duration::from_secs(30),
            hit_for_miss_memory: ByteSize::mib(16),
            forwarding_headers: ForwardingHeaders::Strip,
        }
    }
}

/// Fields that make an origin act on another host, scheme, path or method than the request's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ForwardingHeaders {
    /// Removed from every request before it is routed, looked up or forwarded: no client can make the
    /// origin answer for another host or scheme and have that answer stored for everyone.
    #[default]
    Strip,
    /// Forwarded, and every stored response varies on them (as if its `Vary` named them): for a cache
    /// behind a trusted proxy that sets them.
    Key,
}

/// `[admin]`: the admin API (`cachectl`, `cachetop`, Prometheus), on its own listener.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Admin {
    /// Where the admin API listens; every route there but an open `/metrics` needs the secret. Default:
    /// `127.0.0.1:6082`.
    pub listen: SocketAddr,
    /// File holding the admin secret. Default: `<storage.dir>/secret`, generated on first start.
    pub secret_file: Option<PathBuf>,
    /// Serve `GET /metrics` without the secret, for a Prometheus that cannot read the secret file.
    /// Default: false.
    pub open_metrics: bool,
    /// Admin connections open at once; past it a new connection is closed at once. 0: no limit.
    /// Default: 256.
    pub max_connections: usize,
    /// Time for a complete request head, counted from the connection's start or the end of the previous
    /// response: connections with a partial head, and idle keep-alive ones, are closed. Default: 10 s.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// A connection with no request waiting for its response and no byte moving either way for this long
    /// is closed (a client that stopped reading a stream; the streams send a keep-alive every 15 s).
    /// Default: 60 s.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
}

impl Default for Admin {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 6082)),
            secret_file: None,
            open_metrics: false,
            max_connections: 256,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// `[storage]`: the store's directory and its memory and disk budgets.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Storage {
    /// Directory of the store (bodies, metadata, the generated secret); one that exists but cannot be
    /// written makes the store run memory-only (logged). Default: `$STATE_DIRECTORY`, else
    /// `/var/lib/lacquer` when writable, else `~/.local/state/lacquer`.
    pub dir: Option<PathBuf>,
    /// Body bytes held in memory. Default: 256 MiB.
    pub memory: ByteSize,
    /// Body bytes held on disk; never derived from free space, but reduced (with a warning) when it does
    /// not fit. Default: 1 GiB.
    pub disk_size: ByteSize,
    /// Bodies are stored and read in pieces of this size, so a range reads only the pieces that hold it
    /// (architecture.md has the measurement); a body announced 8 MiB or longer is stored in pieces of
    /// 1 MiB (or this size, if larger) where the tiers hold them, which costs a large body's reads less.
    /// Default: 256 KiB.
    pub chunk_size: ByteSize,
    /// Memory for hot object metadata, counted as what its entries take from the allocator (the cache's
    /// own record per entry, the key, every field, and the response head a hit prepares from the stored
    /// headers): about 2.5 KiB per hot object with a few headers, so the default holds about 26 000.
    /// Default: 64 MiB.
    pub metadata_cache: ByteSize,
    /// Memory for the metadata database's page cache (sled's; its own default is 1 GiB): what lookups of
    /// keys outside the hot metadata and the background walks read through. Default: 32 MiB.
    pub metadata_page_cache: ByteSize,
    /// `Vary` variants kept per URL; past it the oldest goes (counted). Default: 16.
    pub max_variants: usize,
    /// How often expired and evicted objects' metadata is dropped. Default: 60 s.
    #[serde(with = "humantime_serde")]
    pub sweep_interval: Duration,
}

impl Default for Storage {
    fn default() -> Self {
        Self {
            dir: None,
            memory: ByteSize::mib(256),
            disk_size: ByteSize::gib(1),
            chunk_size: ByteSize::kib(256),
            metadata_cache: ByteSize::mib(64),
            metadata_page_cache: ByteSize::mib(32),
            max_variants: 16,
            sweep_interval: Duration::from_secs(60),
        }
    }
}

/// The `[cache]` section: the HTTP caching policy every route starts from. Defaults follow RFC 9111 and
/// what a Varnish or NGINX operator expects.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Cache {
    /// Freshness for responses without any freshness information. Default: 0 (not cached).
    #[serde(with = "humantime_serde")]
    pub default_ttl: Duration,
    /// Grace when the response has no `stale-while-revalidate`. Default: 0, because RFC 9111 §4.2.4 lets a
    /// cache serve stale only when the origin allows it; set 10 s for Varnish's behaviour.
    #[serde(with = "humantime_serde")]
    pub default_grace: Duration,
    /// How long objects are kept past grace so that a miss can revalidate them (`If-None-Match`,
    /// `If-Modified-Since`) instead of fetching the body again. Default: 0.
    #[serde(with = "humantime_serde")]
    pub keep: Duration,
    /// How long past freshness an object may stand in for a failing origin when the response has no
    /// `stale-if-error`. Default: 6 h.
    #[serde(with = "humantime_serde")]
    pub error_grace: Duration,
    /// Share of the `Last-Modified` age used as heuristic freshness, from 0 to 1. Default: 0.1
    /// (RFC 9111 §4.2.2).
    pub heuristic_fraction: f64,
    /// Cap on heuristic freshness. Default: 1 day.
    #[serde(with = "humantime_serde")]
    pub heuristic_max: Duration,
    /// Look up requests carrying `Authorization`. Default: false: a GET with it always goes to the origin,
    /// and its response is stored for other requests only when `public` or `s-maxage` allow it (true also
    /// takes `must-revalidate` as leave to share, as RFC 9111 §3.5 does).
    pub cache_authorized: bool,
    /// Look up and store requests carrying `Cookie`. Default: false (pass).
    pub cache_cookie_requests: bool,
    /// Largest body of a `QUERY` request (RFC 10008: safe, with the query in its body) looked up and
    /// stored, keyed by the body's SHA-256 and its `Content-Type`; a larger one, or one sent without a
    /// `Content-Length`, is passed. 0 passes every `QUERY`. Default: 64 KiB.
    pub max_query_body: ByteSize,
    /// Store responses carrying `Set-Cookie`. Default: false (pass).
    pub cache_set_cookie: bool,
    /// How long a key whose response was uncacheable bypasses request coalescing. Default: 120 s, as
    /// Varnish.
    #[serde(with = "humantime_serde")]
    pub hit_for_miss: Duration,
    /// Largest body stored; larger ones are passed. On a route with `slice`, the largest slice. Default:
    /// 256 MiB.
    pub max_object_size: ByteSize,
    /// Largest object stored in parts (a sliced route's slices together, or the ranges of one forwarded to
    /// the origin); larger ones are passed. Default: 64 GiB.
    pub max_sliced_object_size: ByteSize,
    /// Send a single-range request for an object not stored to the origin as that range, and store the
    /// 206 as a part of the object, when the range asks for the last bytes (`bytes=-500`, where a video's
    /// index often is) or begins `forward_ranges_from` or further in and ends (`bytes=a-b`); an open range
    /// (`bytes=a-`) only once the whole is known not to be stored. Otherwise, and with this false, the whole
    /// object is fetched from its first byte and the range sent as it arrives (NGINX's and Varnish's way).
    /// Default: true.
    pub forward_ranges: bool,
    /// Where a forwarded range may begin at the earliest (see `forward_ranges`). Default: 1 MiB.
    pub forward_ranges_from: ByteSize,
    /// Body bytes one fetch holds in memory for its readers (at least two chunks while storing). Readers
    /// further behind read what the store holds; when the body is not stored, the origin is read no faster
    /// than the slowest reader. Default: 4 MiB.
    pub transit_buffer: ByteSize,
    /// Targeted cache-control fields (RFC 9213) this cache obeys, in precedence order (lower-cased when
    /// read); the first present replaces `Cache-Control` and `Expires`. Default: `cdn-cache-control`.
    #[serde(deserialize_with = "lower_case")]
    pub targeted_cache_control: Vec<String>,
    /// Response headers carrying surrogate keys (tags for purging), lower-cased when read. Default:
    /// `surrogate-key`, `xkey`, `cache-tag` (Fastly, Varnish's xkey, Cloudflare).
    #[serde(deserialize_with = "lower_case")]
    pub surrogate_key_headers: Vec<String>,
    /// The `surrogate_key_headers` are sent on to clients (as Varnish's xkey leaves them). Default: false,
    /// removed from every response to a client as Fastly does with `Surrogate-Key`: the tags are the
    /// operator's, for purging, and tell the public how the site is organised. They are stored and purged by
    /// all the same; a cache in front of this one that purges by tag needs `true`.
    pub expose_surrogate_keys: bool,
    /// How long an LL-HLS blocking playlist reload (a request carrying `_HLS_msn`) waits for the origin's
    /// answer, which the origin holds until the playlist version exists; past it the client gets `503`
    /// and the origin request is dropped. Longer than the origin's own hold (RFC 8216bis has servers hold
    /// up to three target durations); at most the backend's `first_byte_timeout`. Default: 20 s.
    #[serde(with = "humantime_serde")]
    pub blocking_reload_hold: Duration,
    /// Distinct blocking reloads of one playlist (the same URL but for its `_HLS_*` parameters) sent to
    /// the origin at once; one more is answered `503` at once. Players at the live edge all ask for the
    /// next one or two versions; thousands of distinct `_HLS_msn` values are an attack on the origin's
    /// connections. Default: 8.
    pub blocking_reloads_per_playlist: usize,
    /// Blocking reloads one client address has at the origin at once, whatever the playlists; one more is
    /// answered `503` at once. A player waits on one or two; one client holding a reload of each of many
    /// playlists would otherwise take the backend's every connection (`max_connections`), of which
    /// blocking reloads together may hold half at most. Default: 4.
    pub blocking_reloads_per_client: usize,
}

impl Default for Cache {
    fn default() -> Self {
        Self {
            default_ttl: Duration::ZERO,
            default_grace: Duration::ZERO,
            keep: Duration::ZERO,
            error_grace: Duration::from_secs(6 * 3600),
            heuristic_fraction: 0.1,
            heuristic_max: Duration::from_secs(86_400),
            cache_authorized: false,
            cache_cookie_requests: false,
            max_query_body: ByteSize::kib(64),
            cache_set_cookie: false,
            hit_for_miss: Duration::from_secs(120),
            max_object_size: ByteSize::mib(256),
            max_sliced_object_size: ByteSize::gib(64),
            forward_ranges: true,
            forward_ranges_from: ByteSize::mib(1),
            transit_buffer: ByteSize::mib(4),
            targeted_cache_control: vec!["cdn-cache-control".into()],
            surrogate_key_headers: vec!["surrogate-key".into(), "xkey".into(), "cache-tag".into()],
            expose_surrogate_keys: false,
            blocking_reload_hold: Duration::from_secs(20),
            blocking_reloads_per_playlist: 8,
            blocking_reloads_per_client: 4,
        }
    }
}

/// Header names compare case-insensitively: they are lower-cased once, when the file is read.
fn lower_case<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let names = Vec::<String>::deserialize(d)?;
    Ok(names.into_iter().map(|n| n.to_ascii_lowercase()).collect())
}

/// `[prefetch]`: what the routes' `prefetch` (objects fetched into the store before players ask for them)
/// may cost the origin, across all routes. A prefetch beyond the budget is not made (counted as
/// `prefetch_dropped`): the player's own request fetches it, as without prefetch.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Prefetch {
    /// Prefetches fetching at once (each an origin request). Default: 32: a couple ahead for each of a
    /// dozen or more streams being watched at once.
    pub max_concurrent: usize,
    /// Body bytes prefetches may bring per second, on average: a bucket holding one second's worth, emptied
    /// as bytes arrive (each prefetch takes 64 KiB of it as it starts) and into debt; none start until it
    /// is filled again. Default: 64 MiB.
    pub max_rate: ByteSize,
    /// How long a prefetched object waits for its first request before it counts as wasted
    /// (`prefetch_wasted`). Default: 60 s.
    #[serde(with = "humantime_serde")]
    pub unused_after: Duration,
}

impl Default for Prefetch {
    fn default() -> Self {
        Self {
            max_concurrent: 32,
            max_rate: ByteSize::mib(64),
            unused_after: Duration::from_secs(60),
        }
    }
}

/// `[esi]`: how far Edge Side Includes go on a page a route's `esi` or a rule's `esi` turns them on for
/// (Varnish's `do_esi`). Each bound holds whatever the pages and fragments say.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Esi {
    /// How deep includes nest: a fragment of a page is depth 1, a fragment of that fragment 2. An include
    /// deeper than this fails (as its `onerror` says). Default: 5 (Varnish's `max_esi_depth`).
    pub max_depth: usize,
    /// Includes one client's page assembles in all, its fragments' own includes counted too (so nesting
    /// cannot multiply it); those past it fail. Default: 100.
    pub max_includes: usize,
    /// Fragments of one page fetched at once, ahead of the one being sent. Default: 8.
    pub parallel: usize,
    /// Page text an assembly reads ahead of the fragment it waits for, to find the next includes to fetch.
    /// With `parallel` fragments' first bytes, what one assembly holds. Default: 256 KiB.
    pub read_ahead: ByteSize,
}

impl Default for Esi {
    fn default() -> Self {
        Self {
            max_depth: 5,
            max_includes: 100,
            parallel: 8,
            read_ahead: ByteSize::kib(256),
        }
    }
}

impl Esi {
    /// Checks the values; `key` is where the section is (`esi`).
    pub fn check(&self, key: &str) -> Result<(), ConfigError> {
        if self.max_depth == 0 || self.max_depth > 20 {
            return Err(ConfigError::setting(
                format!("{key}.max_depth"),
                "must be 1 to 20",
            ));
        }
        if self.parallel == 0 || self.parallel > 64 {
            return Err(ConfigError::setting(
                format!("{key}.parallel"),
                "must be 1 to 64",
            ));
        }
        if self.max_includes == 0 {
            return Err(ConfigError::setting(
                format!("{key}.max_includes"),
                "must be at least 1",
            ));
        }
        if self.read_ahead.as_u64() < 1024 {
            return Err(ConfigError::setting(
                format!("{key}.read_ahead"),
                "must be at least 1KiB",
            ));
        }
        Ok(())
    }
}

/// Invalidation through the client listeners, the VCL idiom: `PURGE` and `BAN` requests.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Purge {
    /// Honour `PURGE` and `BAN` requests from `allow_from`; otherwise they are answered 405. Default: false.
    pub http_methods: bool,
    /// Client networks allowed to send them. Default: `127.0.0.1/32` and `::1/128`.
    pub allow_from: Vec<ipnet::IpNet>,
}

impl Default for Purge {
    fn default() -> Self {
        Self {
            http_methods: false,
            allow_from: vec![
                "127.0.0.1/32".parse().expect("valid network"),
                "::1/128".parse().expect("valid network"),
            ],
        }
    }
}

/// `[cluster]`: several nodes acting as one cache, coordinated through etcd (docs/cluster.md).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Cluster {
    /// This node's name, unique in the cluster: letters, digits, `.`, `-`, `_`. Default: the host name.
    pub node: Option<String>,
    /// etcd's client URLs: all `http://host:2379`, or all `https://` (then `etcd_ca_file` is needed).
    /// Default: `["http://127.0.0.1:2379"]`.
    pub etcd: Vec<String>,
    /// File holding the cluster secret (at least 16 characters, mode 0600), the same on every node: it
    /// signs member entries, invalidations and forwarded requests, so that reaching etcd is not enough to
    /// join. Default: none, and a `[cluster]` section without it is refused.
    pub secret_file: Option<PathBuf>,
    /// PEM certificates of the authority etcd's server certificate is checked against; needed for
    /// `https://` etcd URLs. Default: none.
    pub etcd_ca_file: Option<PathBuf>,
    /// This node's client certificate (PEM, the chain) for an etcd started with `--client-cert-auth`;
    /// goes with `etcd_key_file`. Default: none.
    pub etcd_cert_file: Option<PathBuf>,
    /// The key of `etcd_cert_file` (PEM). Default: none.
    pub etcd_key_file: Option<PathBuf>,
    /// The etcd user, for an etcd with authentication enabled; goes with `etcd_password_file`.
    /// Default: none.
    pub etcd_user: Option<String>,
    /// File holding `etcd_user`'s password (mode 0600). Default: none.
    pub etcd_password_file: Option<PathBuf>,
    /// Every key of this cluster lives under it in etcd. Default: `/lacquer`.
    pub prefix: String,
    /// Where the other nodes reach this node's client listener. Default: the first `[[listen]]` address
    /// (which must then not be a wildcard such as `0.0.0.0`).
    pub advertise: Option<std::net::SocketAddr>,
    /// Where `cachectl` reaches this node's admin API. Default: `admin.listen`.
    pub advertise_admin: Option<std::net::SocketAddr>,
    /// The membership lease: a node that dies leaves every member's list within it. Default: 5 s.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// How long this node may go without showing it has every invalidation (etcd out of reach) before it
    /// stops serving stored objects without revalidating them with the origin. Default: 10 s.
    #[serde(with = "humantime_serde")]
    pub max_invalidation_lag: Duration,
    /// Hash each key onto the live members and fetch it from its owner: the origin sees one fetch per
    /// object per cluster whatever balancer is in front. Default: false.
    pub self_routing: bool,
}

impl Default for Cluster {
    fn default() -> Self {
        Self {
            node: None,
            etcd: vec!["http://127.0.0.1:2379".into()],
            secret_file: None,
            etcd_ca_file: None,
            etcd_cert_file: None,
            etcd_key_file: None,
            etcd_user: None,
            etcd_password_file: None,
            prefix: "/lacquer".into(),
            advertise: None,
            advertise_admin: None,
            lease_ttl: Duration::from_secs(5),
            max_invalidation_lag: Duration::from_secs(10),
            self_routing: false,
        }
    }
}

/// `[log]`: the daemon's own log (standard error, the journal under systemd).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Log {
    /// A `tracing` filter such as `info` or `lacquerd=debug`; `RUST_LOG` overrides it. Default: `info`.
    pub level: String,
}

impl Default for Log {
    fn default() -> Self {
        Self {
            level: "info".into(),
        }
    }
}

/// One line per request, in a format of `varnishncsa -F`'s fields.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AccessLog {
    /// File appended to (reopened on `SIGUSR1`, for logrotate); `-` for standard output. Default: none, no
    /// access log (`GET /v1/log/stream` works either way).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// Share of requests written, from 0 to 1. Default: 1.
    pub sample: f64,
    /// `default` (NCSA combined as varnishncsa writes it, the host in the request line, then the cache
    /// result, time to first byte and total time), `combined` (NCSA combined as NGINX writes it), `json`
    /// (one JSON document per line), or a format string of `%` fields (docs/configuration.md lists them).
    /// Default: `default`.
    pub format: String,
}

impl Default for AccessLog {
    fn default() -> Self {
        Self {
            path: None,
            sample: 1.0,
            format: "default".into(),
        }
    }
}

/// `[telemetry]`: a trace per request (a server span, with `lookup`, `fetch` and `store` children), sent to
/// an OpenTelemetry collector over OTLP/HTTP (protobuf). Read at start only: a reload reports a change as
/// taking effect on restart.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Telemetry {
    /// The collector's OTLP/HTTP traces URL, `http://127.0.0.1:4318/v1/traces` (or `https://`). Default:
    /// none, and tracing is off: requests pay one branch, and a client's `traceparent` goes to the origin
    /// unchanged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Share of requests traced, from 0 to 1, by trace id. A request from a trusted client
    /// (`trust_client_trace`) whose `traceparent` says its caller sampled it is traced whatever this says,
    /// one whose caller did not is not. Default: 1.
    pub sample_ratio: f64,
    /// Clients whose `traceparent` is followed (their sampling decision, their trace id): the networks of
    /// a load balancer or of this cluster's nodes. Anyone else's is ignored and the request is sampled
    /// by `sample_ratio` under a trace id of lacquerd's own: a client that could choose would force every
    /// request traced (filling `max_queue`, so real spans are dropped) under ids it picked. Default: none.
    pub trust_client_trace: Vec<ipnet::IpNet>,
    /// `service.name` of the spans. Default: `lacquerd`.
    pub service_name: String,
    /// Finished spans held for export at most; past it, while the collector is slow or down, spans are
    /// dropped and counted (`lacquer_trace_spans_dropped_total`). Default: 2048.
    pub max_queue: usize,
    /// How long one export to the collector may take before its spans are given up. Default: 10s.
    #[serde(with = "humantime_serde")]
    pub export_timeout: Duration,
}

impl Default for Telemetry {
    fn default() -> Self {
        Self {
            endpoint: None,
            sample_ratio: 1.0,
            trust_client_trace: Vec::new(),
            service_name: "lacquerd".into(),
            max_queue: 2048,
            export_timeout: Duration::from_secs(10),
        }
    }
}

impl Telemetry {
    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, why: &str| Err(ConfigError::setting(format!("telemetry.{key}"), why));
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return bad("sample_ratio", "must be between 0 and 1");
        }
        if self.service_name.is_empty() {
            return bad("service_name", "must not be empty");
        }
        if self.max_queue == 0 {
            return bad("max_queue", "must be at least 1");
        }
        if self.export_timeout.is_zero() {
            return bad("export_timeout", "must be above zero");
        }
        if let Some(endpoint) = &self.endpoint {
            let uri = endpoint.parse::<http::Uri>().ok();
            let usable = uri.as_ref().is_some_and(|u| {
                matches!(u.scheme_str(), Some("http" | "https")) && u.authority().is_some()
            });
            if !usable {
                return bad(
                    "endpoint",
                    "must be an http:// or https:// URL, as http://127.0.0.1:4318/v1/traces",
                );
            }
        }
        Ok(())
    }
}

/// Command-line values that override the file; `None` (or empty) leaves the file's value.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--listen`: replaces every `[[listen]]` with plain listeners on these addresses, default limits.
    pub listen: Vec<SocketAddr>,
    /// `--backend`: the first backend's `address` (one is added when the file has none).
    pub backend: Option<String>,
    /// `--admin`: `admin.listen`.
    pub admin: Option<SocketAddr>,
    /// `--secret`: `admin.secret_file`.
    pub secret: Option<PathBuf>,
    /// `--memory`: `storage.memory`.
    pub memory: Option<ByteSize>,
    /// `--disk`: `storage.dir`.
    pub disk: Option<PathBuf>,
    /// `--disk-size`: `storage.disk_size`.
    pub disk_size: Option<ByteSize>,
}

impl Config {
    /// Reads `path` (when given), applies the overrides and validates the result.
    pub fn load(path: Option<&Path>, overrides: Overrides) -> Result<Self, ConfigError> {
        let mut config = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    ConfigError(format!("cannot read config file {}: {e}", path.display()))
                })?;
                Self::parse(&text, &path.display().to_string())?
            }
            None => Config::default(),
        };
        config.apply(overrides);
        config.validate()?;
        Ok(config)
    }

    /// Reads TOML `text` without overrides or validation; errors start with `origin` (the file name), the
    /// line and column, and the key, as `--check` prints them.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        serde_path_to_error::deserialize(toml::Deserializer::new(text)).map_err(|e| {
            let position = e.inner().span().map(|span| {
                let before = &text[..span.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                format!(":{line}:{column}")
            });
            let key = e.path().to_string();
            let key = if key == "." {
                String::new()
            } else {
                format!(" {key}:")
            };
            ConfigError(format!(
                "{origin}{}:{key} {}",
                position.unwrap_or_default(),
                e.inner().message().trim().replace('\n', "; ")
            ))
        })
    }

    fn apply(&mut self, o: Overrides) {
        if !o.listen.is_empty() {
            self.listen = o.listen.into_iter().map(Listen::plain).collect();
        }
        if o.backend.is_some() {
            if self.backend.is_empty() {
                self.backend.push(Backend::default());
            }
            self.backend[0].address = o.backend;
        }
        if let Some(a) = o.admin {
            self.admin.listen = a;
        }
        if o.secret.is_some() {
            self.admin.secret_file = o.secret;
        }
        if let Some(m) = o.memory {
            self.storage.memory = m;
        }
        if o.disk.is_some() {
            self.storage.dir = o.disk;
        }
        if let Some(s) = o.disk_size {
            self.storage.disk_size = s;
        }
    }

    fn validate(&mut self) -> Result<(), ConfigError> {
        let bad = |key: &str, why: String| Err(ConfigError(format!("{key}: {why}")));
        if self.listen.is_empty() {
            return bad("listen", "at least one listener is required".into());
        }
        if let Some(status) = self
            .error_pages
            .keys()
            .find(|s| !ERROR_PAGE_STATUSES.contains(&s.as_str()))
        {
            return bad(
                &format!("error_pages.{status}"),
                "lacquerd answers only 502, 503 and 504 itself (an origin's own errors: a deliver rule)"
                    .into(),
            );
        }
        for (n, listen) in self.listen.iter().enumerate() {
            let key = format!("listen[{n}]");
            let earlier = &self.listen[..n];
            if listen.address.port() != 0 && earlier.iter().any(|l| l.address == listen.address) {
                return bad(&key, format!("{} is listed twice", listen.address));
            }
            if listen.max_header_size < ByteSize::kib(8) {
                return bad(&key, "max_header_size must be at least 8KiB".into());
            }
            if listen.header_read_timeout.is_zero() || listen.idle_timeout.is_zero() {
                return bad(&key, "timeouts must be above zero".into());
            }
        }
        if self.admin.header_read_timeout.is_zero() {
            return bad("admin.header_read_timeout", "must be above zero".into());
        }
        if self.admin.max_connections > 1_000_000 {
            return bad("admin.max_connections", "at most 1000000".into());
        }
        if self.admin.idle_timeout.is_zero() {
            return bad("admin.idle_timeout", "must be above zero".into());
        }
        if !(0.0..=1.0).contains(&self.access_log.sample) {
            return bad("access_log.sample", "must be between 0 and 1".into());
        }
        self.telemetry.validate()?;
        if !(0.0..=1.0).contains(&self.cache.heuristic_fraction) {
            return bad("cache.heuristic_fraction", "must be between 0 and 1".into());
        }
        if self.storage.dir.is_none() {
            self.storage.dir = Some(default_dir());
        }
        let dir = &self.storage_dir();
        match probe_dir(dir) {
            Ok(()) => {}
            // A directory that exists but cannot be written (a filesystem remounted read-only after errors,
            // say) is a failing disk, not a mistake: the store runs memory-only and says so.
            Err(e) if dir.is_dir() => tracing::warn!(
                dir = %dir.display(),
                error = %e,
                "storage.dir is not writable: the store will run memory-only"
            ),
            Err(e) => {
                return bad(
                    "storage.dir",
                    format!("{} is not a writable directory: {e}", dir.display()),
                )
            }
        }
        if self.admin.secret_file.is_none() {
            self.admin.secret_file = Some(dir.join("secret"));
        }
        Ok(())
    }

    /// The store directory: `storage.dir`, which [`Config::load`] fills in when the file leaves it out.
    pub fn storage_dir(&self) -> PathBuf {
        self.storage.dir.clone().unwrap_or_else(default_dir)
    }

    /// The admin secret file: `admin.secret_file`, which [`Config::load`] fills in when the file leaves it
    /// out.
    pub fn secret_file(&self) -> PathBuf {
        self.admin
            .secret_file
            .clone()
            .unwrap_or_else(|| self.storage_dir().join("secret"))
    }

    /// What the first backend is reached at, for messages.
    pub fn first_backend(&self) -> String {
        backend_address(self.backend[0].address.as_deref())
            .map(|a| a.authority)
            .unwrap_or_default()
    }

    /// Worker threads to start: `server.workers`, or the available cores when it is 0.
    pub fn workers(&self) -> usize {
        match self.server.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }
}

/// Where a backend is: `host:port` and whether it speaks TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendAddress {
    /// `https://`: connections to it are TLS, the certificate checked against the host.
    pub https: bool,
    /// `host:port`, the port filled in for `http://` (80) and `https://` (443) when left out.
    pub authority: String,
}

/// Reads a backend address: `host:port`, `http://host[:port]` or `https://host[:port]`; the error starts
/// with the key.
pub fn backend_address(address: Option<&str>) -> Result<BackendAddress, String> {
    let Some(address) = address else {
        return Err(
            "address: no backend given (use --backend HOST:PORT or [backend] address)".into(),
        );
    };
    let (https, rest, default_port) = match address.split_once("://") {
        Some(("http", rest)) => (false, rest, Some(80)),
        Some(("https", rest)) => (true, rest, Some(443)),
        Some(_) => {
            return Err(format!(
                "address: {address:?}: only http:// and https:// origins are supported"
            ))
        }
        None => (false, address, None),
    };
    let bad = || {
        format!("address: {address:?} is not HOST:PORT, http://HOST[:PORT] or https://HOST[:PORT]")
    };
    let a = rest
        .trim_end_matches('/')
        .parse::<http::uri::Authority>()
        .map_err(|_| bad())?;
    let port = a.port_u16().or(default_port).ok_or_else(bad)?;
    if a.host().is_empty() {
        return Err(bad());
    }
    Ok(BackendAddress {
        https,
        authority: format!("{}:{port}", a.host()),
    })
}

/// Whether the store could use `dir`: a file made and removed in it when it exists, else a directory made
/// and removed in its nearest existing parent (creating the rest of the path needs no more). Checking a
/// configuration (`--check`, a reload) leaves nothing behind, and never creates `dir` itself even for a
/// moment: two checks at once (or a check beside a packaging script) would otherwise each take the other's
/// directory for one that was there before, and one could leave it behind, root's, with the wrong mode.
/// The names are unique, so neither can remove the other's probe. The store creates `dir` when it opens.
fn probe_dir(dir: &Path) -> std::io::Result<()> {
    let mut probe = tempfile::Builder::new();
    probe.prefix(".lacquer-probe-");
    if dir.is_dir() {
        return probe.tempfile_in(dir)?.close();
    }
    let parent = dir
        .ancestors()
        .find(|a| a.exists())
        .unwrap_or_else(|| Path::new("."));
    probe.tempdir_in(parent)?.close()
}

fn default_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("STATE_DIRECTORY") {
        return PathBuf::from(dir);
    }
    let system = PathBuf::from("/var/lib/lacquer");
    if probe_dir(&system).is_ok() {
        return system;
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".local/state/lacquer")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probing_a_store_directory_leaves_nothing_behind_and_never_makes_it() {
        let root = tempfile::tempdir().unwrap();
        let missing = root.path().join("a/b/store");
        probe_dir(&missing).unwrap();
        assert!(!root.path().join("a").exists(), "the probe made the path");
        probe_dir(root.path()).unwrap();
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
        // A file where a parent should be: nothing can create the directory.
        std::fs::write(root.path().join("file"), b"").unwrap();
        assert!(probe_dir(&root.path().join("file/store")).is_err());
        // Many checks at once (as the test suite, or a reload beside a packaging script, runs them): every
        // one succeeds and none leaves the directory behind, as the fixed-name probe once could.
        let dir = root.path().join("shared");
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..200 {
                        probe_dir(&dir).unwrap();
                    }
                });
            }
        });
        assert!(!dir.exists(), "a probe left the directory behind");
    }

    fn err(text: &str) -> String {
        Config::parse(text, "lacquer.toml").unwrap_err().to_string()
    }

    #[test]
    fn parses_a_full_file() {
        let c = Config::parse(
            r#"
            [[listen]]
            address = "127.0.0.1:80"
            [[listen]]
            address = "[::1]:8443"
            proxy_protocol = true
            max_connections_per_ip = 50
            tls = [{ cert = "/etc/lacquer/a.pem", key = "/etc/lacquer/a.key" }]
            [backend]
            address = "http://origin:8080"
            first_byte_timeout = "5s"
            [storage]
            memory = "1GiB"
            disk_size = "20 GiB"
            [cache]
            default_ttl = "2m"
            "#,
            "t",
        )
        .unwrap();
        assert_eq!(c.listen.len(), 2);
        assert_eq!(c.listen[0], Listen::plain("127.0.0.1:80".parse().unwrap()));
        assert!(c.listen[1].proxy_protocol && c.listen[1].http2);
        assert_eq!(c.listen[1].max_connections_per_ip, 50);
        assert_eq!(c.listen[1].tls[0].key, Path::new("/etc/lacquer/a.key"));
        assert_eq!(c.backend[0].first_byte_timeout, Duration::from_secs(5));
        assert_eq!(c.storage.memory, ByteSize::gib(1));
        assert_eq!(c.storage.disk_size, ByteSize::gib(20));
        assert_eq!(c.cache.default_ttl, Duration::from_secs(120));
        assert_eq!(c.first_backend(), "origin:8080");
    }

    #[test]
    fn errors_name_the_key_and_position() {
        let cases = [
            (
                "[server]\nlistn = []",
                "lacquer.toml:2:1: server.listn: unknown field `listn`",
            ),
            (
                "[storage]\nmemory = \"12 parsecs\"",
                "lacquer.toml:2:10: storage.memory:",
            ),
            (
                "[cache]\ndefault_ttl = \"soon\"",
                "lacquer.toml:2:15: cache.default_ttl:",
            ),
            ("[nope]\n", "unknown field `nope`"),
            ("[server\n", "lacquer.toml:1:"),
        ];
        for (text, want) in cases {
            let got = err(text);
            assert!(
                got.starts_with(want) || got.contains(want),
                "{text:?}: {got}"
            );
            assert!(!got.contains('\n'), "one line: {got:?}");
        }
    }

    #[test]
    fn error_pages_are_for_the_statuses_lacquerd_makes() {
        let c = Config::parse(
            "[error_pages]\n503 = \"/etc/lacquer/errors/503.html\"\n504 = \"/e/504.txt\"",
            "t",
        )
        .unwrap();
        assert_eq!(
            c.error_pages["503"],
            Path::new("/etc/lacquer/errors/503.html")
        );
        let invalid = |status: &str| {
            let mut c =
                Config::parse(&format!("[error_pages]\n{status} = \"/e/x.html\""), "t").unwrap();
            c.validate().unwrap_err().to_string()
        };
        let got = invalid("500");
        assert!(
            got.starts_with("error_pages.500: lacquerd answers only 502, 503 and 504"),
            "{got}"
        );
        assert!(invalid("five").starts_with("error_pages.five:"));
    }

    #[test]
    fn telemetry_is_off_by_default_and_checked_when_on() {
        let c = Config::parse("", "t").unwrap();
        assert_eq!(c.telemetry.endpoint, None);
        assert_eq!(c.telemetry.sample_ratio, 1.0);
        assert_eq!(c.telemetry.service_name, "lacquerd");
        let on = Config::parse(
            "[telemetry]\nendpoint = \"http://127.0.0.1:4318/v1/traces\"\nsample_ratio = 0.25",
            "t",
        )
        .unwrap();
        on.telemetry.validate().unwrap();
        assert_eq!(on.telemetry.sample_ratio, 0.25);
        let invalid = |text: &str| {
            let c = Config::parse(&format!("[telemetry]\n{text}"), "t").unwrap();
            c.telemetry.validate().unwrap_err().to_string()
        };
        assert_eq!(
            invalid("sample_ratio = 1.5"),
            "telemetry.sample_ratio: must be between 0 and 1"
        );
        assert!(invalid("endpoint = \"127.0.0.1:4318\"").starts_with("telemetry.endpoint: must be"));
        assert!(
            invalid("endpoint = \"ftp://collector/v1/traces\"").starts_with("telemetry.endpoint:")
        );
        assert!(invalid("max_queue = 0").starts_with("telemetry.max_queue:"));
        assert!(invalid("export_timeout = \"0s\"").starts_with("telemetry.export_timeout:"));
        assert!(invalid("service_name = \"\"").starts_with("telemetry.service_name:"));
    }

    #[test]
    fn admin_timeouts_must_be_above_zero() {
        for key in ["header_read_timeout", "idle_timeout"] {
            let mut c = Config::parse(&format!("[admin]\n{key} = \"0s\""), "t").unwrap();
            assert_eq!(
                c.validate().unwrap_err().to_string(),
                format!("admin.{key}: must be above zero")
            );
        }
        let c = Config::parse(
            "[admin]\nmax_connections = 8\nheader_read_timeout = \"2s\"",
            "t",
        );
        let admin = c.unwrap().admin;
        assert_eq!(
            (
                admin.max_connections,
                admin.header_read_timeout,
                admin.idle_timeout
            ),
            (8, Duration::from_secs(2), Duration::from_secs(60))
        );
    }

    #[test]
    fn backend_forms() {
        let address = |a: &str| backend_address(Some(a)).map(|a| (a.https, a.authority));
        let ok = |https, authority: &str| Ok((https, authority.to_owned()));
        assert_eq!(address("127.0.0.1:8080"), ok(false, "127.0.0.1:8080"));
        assert_eq!(
            address("http://example.com:80/"),
            ok(false, "example.com:80")
        );
        assert_eq!(address("http://example.com"), ok(false, "example.com:80"));
        assert_eq!(address("https://example.com"), ok(true, "example.com:443"));
        assert_eq!(address("https://[::1]:8443"), ok(true, "[::1]:8443"));
        assert!(address("example.com").is_err());
        assert!(address("ftp://example.com:21")
            .unwrap_err()
            .contains("only http:// and https://"));
        assert!(address("").is_err());
    }

    #[test]
    fn overrides_win_and_validation_fills_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let c = Config::load(
            None,
            Overrides {
                backend: Some("127.0.0.1:9".into()),
                disk: Some(dir.path().join("store")),
                disk_size: Some(ByteSize::mib(512)),
                listen: vec!["127.0.0.1:0".parse().unwrap()],
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(c.storage.disk_size, ByteSize::mib(512));
        assert_eq!(c.secret_file(), dir.path().join("store/secret"));
        assert!(
            !dir.path().join("store").exists(),
            "loading the configuration creates no store directory"
        );
        assert_eq!(
            c.listen,
            vec![Listen::plain("127.0.0.1:0".parse().unwrap())]
        );
    }

    #[test]
    fn a_store_directory_that_cannot_be_made_is_refused_and_nothing_is_left_behind() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let load = |disk: PathBuf| {
            Config::load(
                None,
                Overrides {
                    backend: Some("127.0.0.1:9".into()),
                    disk: Some(disk),
                    ..Default::default()
                },
            )
        };
        let e = load(file.join("store")).unwrap_err().to_string();
        assert!(
            e.contains("storage.dir") && e.contains("not a writable directory"),
            "{e}"
        );
        load(dir.path().join("a/b/c")).unwrap();
        assert!(!dir.path().join("a").exists());
    }

    /// The configuration the Debian package installs: it loads, and it lists every setting, commented out
    /// with its default value except the few the package sets.
    #[test]
    fn the_packaged_configuration_lists_every_setting_with_its_default() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../packaging/lacquer.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let packaged = Config::parse(&text, path).unwrap();
        assert_eq!(
            packaged.backend[0].address.as_deref(),
            Some("127.0.0.1:8080")
        );
        assert_eq!(
            packaged.admin.secret_file.as_deref(),
            Some(Path::new("/etc/lacquer/secret"))
        );
        let assignment = |line: &str| {
            line.split_once(" = ").is_some_and(|(k, _)| {
                !k.is_empty()
                    && k.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            })
        };
        let mut section = String::new();
        let mut listed = Vec::new();
        let uncommented: Vec<&str> = text
            .lines()
            .map(|line| {
                // `[cluster]` is off by default: its header is commented out too.
                let line = line
                    .strip_prefix("# ")
                    .filter(|l| assignment(l) || *l == "[cluster]")
                    .unwrap_or(line);
                if line.starts_with('[') && line.ends_with(']') {
                    section = line.trim_matches(['[', ']']).to_owned();
                } else if assignment(line) {
                    listed.push(format!("{section}.{}", line.split_once(" = ").unwrap().0));
                }
                line
            })
            .collect();
        let every = Config::parse(&uncommented.join("\n"), "uncommented").unwrap();
        let every = serde_json::to_value(&every).unwrap();
        let mut defaults = serde_json::to_value(Config::default()).unwrap();
        defaults["cluster"] = serde_json::to_value(Cluster::default()).unwrap();
        // The package sets these; the cluster's and `acme` are examples (the cluster's defaults come from
        // the host; `acme` has none: off).
        let set_by_the_package = [
            "listen.acme",
            "backend.address",
            "admin.secret_file",
            "storage.dir",
            "cluster.node",
            "cluster.advertise",
            "cluster.advertise_admin",
            "cluster.secret_file",
            "cluster.etcd_ca_file",
            "cluster.etcd_cert_file",
            "cluster.etcd_key_file",
            "cluster.etcd_user",
            "cluster.etcd_password_file",
        ];
        // `[[listen]]` is listed once, for the one listener there is by default.
        fn first(v: &serde_json::Value) -> &serde_json::Value {
            v.as_array().map_or(v, |a| &a[0])
        }
        // `[[director]]` and `[[route]]` have no default entry: the file shows them in comments.
        let defaults = serde_json::Value::Object(
            defaults
                .as_object()
                .unwrap()
                .iter()
                .filter(|(_, v)| v.as_array().is_none_or(|a| !a.is_empty()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        );
        for (name, settings) in defaults.as_object().unwrap() {
            for (key, default) in first(settings).as_object().unwrap() {
                let setting = format!("{name}.{key}");
                assert!(listed.contains(&setting), "{setting} is not in {path}");
                if !set_by_the_package.contains(&setting.as_str()) {
                    assert_eq!(
                        &first(&every[name])[key],
                        default,
                        "{setting}: the listed value is not the default"
                    );
                }
            }
        }
    }

    #[test]
    fn unknown_policies_and_fields_are_refused_when_read() {
        let bad_policy = Config::parse(
            "[[director]]\nname = \"d\"\npolicy = \"fastest\"\nbackends = []\n",
            "t",
        );
        assert!(bad_policy
            .unwrap_err()
            .to_string()
            .contains("unknown variant `fastest`"));
        let typo = Config::parse("[backend]\nadress = \"x\"\n", "t")
            .unwrap_err()
            .to_string();
        assert!(typo.contains("unknown field `adress`"), "{typo}");
    }

    #[test]
    fn an_unusable_directory_is_rejected() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let o = || Overrides {
            backend: Some("127.0.0.1:9".into()),
            ..Default::default()
        };
        let e = Config::load(
            None,
            Overrides {
                disk: Some(file.path().join("x")),
                ..o()
            },
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("storage.dir:"), "{e}");
    }
}
