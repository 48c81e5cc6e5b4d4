//! The configuration file (TOML) and the command-line flags that override it.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

use crate::policy::Policy;

/// A configuration problem, rendered as one line that names the key (and the file position when known).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Client listeners (`[[listen]]`). Default: one plain listener on `0.0.0.0:6081`.
    pub listen: Vec<Listen>,
    pub server: Server,
    pub backend: Backend,
    pub admin: Admin,
    pub storage: Storage,
    pub cache: Cache,
    pub purge: Purge,
    pub log: Log,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: vec![Listen::default()],
            server: Server::default(),
            backend: Backend::default(),
            admin: Admin::default(),
            storage: Storage::default(),
            cache: Cache::default(),
            purge: Purge::default(),
            log: Log::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Server {
    /// Threads serving clients, each with its own listener socket (`SO_REUSEPORT`). 0: one per core.
    pub workers: usize,
    /// How long in-flight responses may take to finish on shutdown. Default: 30 s.
    #[serde(with = "humantime_serde")]
    pub shutdown_timeout: Duration,
}

impl Default for Server {
    fn default() -> Self {
        Self {
            workers: 0,
            shutdown_timeout: Duration::from_secs(30),
        }
    }
}

/// One client listener: where, how (TLS, PROXY protocol, HTTP/2) and within which limits.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Listen {
    /// Default: `0.0.0.0:6081`.
    pub address: SocketAddr,
    /// Certificate chains and keys (PEM files). Any given: the listener speaks TLS only, and picks the
    /// certificate by the name the client asks for (SNI), the first one when none matches. Default: none.
    pub tls: Vec<Certificate>,
    /// Every connection must start with a PROXY protocol header (v1 or v2, as HAProxy's `send-proxy` and
    /// `send-proxy-v2` write), whose client address is then used everywhere; one without is closed.
    /// Default: false.
    pub proxy_protocol: bool,
    /// Offer HTTP/2: by ALPN on TLS, by prior knowledge (h2c) on plain connections. Default: true.
    pub http2: bool,
    /// Connections open at once on this listener; past it a connection gets `503`. 0: no limit.
    /// Default: 65536.
    pub max_connections: usize,
    /// Connections open at once from one client address; past it a connection gets `503`. 0: no limit.
    /// Default: 0.
    pub max_connections_per_ip: usize,
    /// Time for a complete request head, counted from the connection's start or the end of the previous
    /// response, as Varnish's `timeout_idle`: slow senders (slowloris) and idle keep-alive HTTP/1.1
    /// connections are closed. It also bounds the TLS handshake and PROXY header. Default: 10 s.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// A connection with no request waiting for its response head and no byte moving either way for this
    /// long is closed: idle HTTP/2 connections, and clients that stopped reading. Default: 60 s.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Largest request head (HTTP/1.1) or header list (HTTP/2); larger gets `431`. Default: 32 KiB.
    pub max_header_size: ByteSize,
    /// Most header fields in a request (HTTP/1.1); more gets `431`. Default: 100.
    pub max_headers: usize,
    /// Largest request body sent on to a backend; larger gets `413`. Default: 100 MiB.
    pub max_request_body: ByteSize,
}

impl Default for Listen {
    fn default() -> Self {
        Self {
            address: SocketAddr::from(([0, 0, 0, 0], 6081)),
            tls: Vec::new(),
            proxy_protocol: false,
            http2: true,
            max_connections: 65536,
            max_connections_per_ip: 0,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_header_size: ByteSize::kib(32),
            max_headers: 100,
            max_request_body: ByteSize::mib(100),
        }
    }
}

impl Listen {
    pub fn plain(address: SocketAddr) -> Self {
        Self {
            address,
            ..Self::default()
        }
    }
}

/// A certificate chain (leaf first) and its private key, both PEM.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Certificate {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Backend {
    /// `host:port` or `http://host:port` of the origin. Required.
    pub address: Option<String>,
    /// Default: 3 s.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Time to the response head. Default: 60 s.
    #[serde(with = "humantime_serde")]
    pub first_byte_timeout: Duration,
    /// Longest silence while a body arrives. Default: 60 s.
    #[serde(with = "humantime_serde")]
    pub between_bytes_timeout: Duration,
    /// Idle keep-alive connections kept per worker thread. Default: 128.
    pub max_idle_connections: usize,
    /// How long an idle backend connection is kept. Default: 4 s, under the 5 s after which Node.js and
    /// Apache close idle connections, so a request is never sent on one the origin is closing.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
}

impl Default for Backend {
    fn default() -> Self {
        Self {
            address: None,
            connect_timeout: Duration::from_secs(3),
            first_byte_timeout: Duration::from_secs(60),
            between_bytes_timeout: Duration::from_secs(60),
            max_idle_connections: 128,
            idle_timeout: Duration::from_secs(4),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Admin {
    /// Default: `127.0.0.1:6082`.
    pub listen: SocketAddr,
    /// File holding the admin secret. Default: `<storage.dir>/secret`, generated on first start.
    pub secret_file: Option<PathBuf>,
    /// Serve `GET /metrics` without the secret, for a Prometheus that cannot read the secret file.
    /// Default: false.
    pub open_metrics: bool,
}

impl Default for Admin {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 6082)),
            secret_file: None,
            open_metrics: false,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Storage {
    /// Default: `$STATE_DIRECTORY`, else `/var/lib/lacquer` when writable, else `~/.local/state/lacquer`.
    pub dir: Option<PathBuf>,
    /// Body bytes held in memory. Default: 256 MiB.
    pub memory: ByteSize,
    /// Body bytes held on disk. Default: 1 GiB.
    pub disk_size: ByteSize,
    /// Default: 256 KiB.
    pub chunk_size: ByteSize,
    /// Memory for hot object metadata. Default: 64 MiB.
    pub metadata_cache: ByteSize,
    /// Default: 16.
    pub max_variants: usize,
    /// Default: 60 s.
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
            max_variants: 16,
            sweep_interval: Duration::from_secs(60),
        }
    }
}

/// Mirrors [`Policy`]; see its fields for the defaults.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Cache {
    #[serde(with = "humantime_serde")]
    pub default_ttl: Duration,
    #[serde(with = "humantime_serde")]
    pub default_grace: Duration,
    #[serde(with = "humantime_serde")]
    pub keep: Duration,
    #[serde(with = "humantime_serde")]
    pub error_grace: Duration,
    pub heuristic_fraction: f64,
    #[serde(with = "humantime_serde")]
    pub heuristic_max: Duration,
    pub cache_authorized: bool,
    pub cache_cookie_requests: bool,
    pub cache_set_cookie: bool,
    #[serde(with = "humantime_serde")]
    pub hit_for_miss: Duration,
    pub max_object_size: ByteSize,
    pub targeted_cache_control: Vec<String>,
    pub surrogate_key_headers: Vec<String>,
}

impl Default for Cache {
    fn default() -> Self {
        let p = Policy::default();
        Self {
            default_ttl: p.default_ttl,
            default_grace: p.default_grace,
            keep: p.keep,
            error_grace: p.error_grace,
            heuristic_fraction: p.heuristic_fraction,
            heuristic_max: p.heuristic_max,
            cache_authorized: p.cache_authorized,
            cache_cookie_requests: p.cache_cookie_requests,
            cache_set_cookie: p.cache_set_cookie,
            hit_for_miss: p.hit_for_miss,
            max_object_size: ByteSize::b(p.max_object_size),
            targeted_cache_control: p.targeted_cache_control,
            surrogate_key_headers: p.surrogate_key_headers,
        }
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

/// Command-line values that override the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Vec<SocketAddr>,
    pub backend: Option<String>,
    pub admin: Option<SocketAddr>,
    pub secret: Option<PathBuf>,
    pub memory: Option<ByteSize>,
    pub disk: Option<PathBuf>,
    pub disk_size: Option<ByteSize>,
}

/// The origin, resolved from `backend.address`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// `host:port`, used to connect.
    pub authority: String,
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
            self.backend.address = o.backend;
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
        self.origin()?;
        if self.listen.is_empty() {
            return bad("listen", "at least one listener is required".into());
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
            crate::server::tls::Certificates::load(&listen.tls)
                .map_err(|e| ConfigError(format!("{key}.tls: {e}")))?;
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            return bad("log.level", format!("{:?}: {e}", self.log.level));
        }
        if !(0.0..=1.0).contains(&self.cache.heuristic_fraction) {
            return bad("cache.heuristic_fraction", "must be between 0 and 1".into());
        }
        if self.storage.dir.is_none() {
            self.storage.dir = Some(default_dir());
        }
        let dir = self.storage_dir();
        std::fs::create_dir_all(dir)
            .and_then(|_| tempfile_probe(dir))
            .or_else(|e| {
                bad(
                    "storage.dir",
                    format!("{} is not a writable directory: {e}", dir.display()),
                )
            })?;
        if self.admin.secret_file.is_none() {
            self.admin.secret_file = Some(dir.join("secret"));
        }
        self.store_builder()
            .validate()
            .map_err(|e| ConfigError(format!("storage: {e}")))?;
        Ok(())
    }

    pub fn origin(&self) -> Result<Origin, ConfigError> {
        let Some(address) = self.backend.address.as_deref() else {
            return Err(ConfigError(
                "backend.address: no backend given (use --backend HOST:PORT or [backend] address)"
                    .into(),
            ));
        };
        let authority = address
            .strip_prefix("http://")
            .unwrap_or(address)
            .trim_end_matches('/');
        if address.contains("://") && !address.starts_with("http://") {
            return Err(ConfigError(format!(
                "backend.address: {address:?}: only http:// origins are supported"
            )));
        }
        match authority.parse::<http::uri::Authority>() {
            Ok(a) if a.port_u16().is_some() && !a.host().is_empty() => Ok(Origin {
                authority: a.to_string(),
            }),
            _ => Err(ConfigError(format!(
                "backend.address: {address:?} is not HOST:PORT or http://HOST:PORT"
            ))),
        }
    }

    pub fn storage_dir(&self) -> &Path {
        self.storage.dir.as_deref().expect("set by validate")
    }

    pub fn secret_file(&self) -> &Path {
        self.admin.secret_file.as_deref().expect("set by validate")
    }

    pub fn policy(&self) -> Policy {
        let c = &self.cache;
        Policy {
            default_ttl: c.default_ttl,
            heuristic_fraction: c.heuristic_fraction,
            heuristic_max: c.heuristic_max,
            default_grace: c.default_grace,
            keep: c.keep,
            error_grace: c.error_grace,
            cache_authorized: c.cache_authorized,
            cache_cookie_requests: c.cache_cookie_requests,
            cache_set_cookie: c.cache_set_cookie,
            hit_for_miss: c.hit_for_miss,
            max_object_size: c.max_object_size.as_u64(),
            targeted_cache_control: c
                .targeted_cache_control
                .iter()
                .map(|t| t.to_ascii_lowercase())
                .collect(),
            surrogate_key_headers: c
                .surrogate_key_headers
                .iter()
                .map(|t| t.to_ascii_lowercase())
                .collect(),
        }
    }

    pub fn store_builder(&self) -> lacquer_storage::StoreBuilder {
        let s = &self.storage;
        lacquer_storage::StoreBuilder::new(self.storage_dir())
            .with_memory_bytes(s.memory.as_u64() as usize)
            .with_disk_bytes(s.disk_size.as_u64() as usize)
            .with_chunk_size(s.chunk_size.as_u64() as usize)
            .with_metadata_cache_bytes(s.metadata_cache.as_u64() as usize)
            .with_max_variants(s.max_variants)
            .with_sweep_interval(s.sweep_interval)
    }

    pub fn workers(&self) -> usize {
        match self.server.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }
}

fn tempfile_probe(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(".lacquer-write-probe");
    std::fs::write(&probe, b"")?;
    std::fs::remove_file(&probe)
}

fn default_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("STATE_DIRECTORY") {
        return PathBuf::from(dir);
    }
    let system = PathBuf::from("/var/lib/lacquer");
    if std::fs::create_dir_all(&system)
        .and_then(|_| tempfile_probe(&system))
        .is_ok()
    {
        return system;
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".local/state/lacquer")
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(c.backend.first_byte_timeout, Duration::from_secs(5));
        assert_eq!(c.storage.memory, ByteSize::gib(1));
        assert_eq!(c.storage.disk_size, ByteSize::gib(20));
        assert_eq!(c.policy().default_ttl, Duration::from_secs(120));
        assert_eq!(c.origin().unwrap().authority, "origin:8080");
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
    fn backend_forms() {
        let origin = |a: &str| {
            let mut c = Config::default();
            c.backend.address = Some(a.into());
            c.origin().map(|o| o.authority)
        };
        assert_eq!(origin("127.0.0.1:8080").unwrap(), "127.0.0.1:8080");
        assert_eq!(origin("http://example.com:80/").unwrap(), "example.com:80");
        assert!(origin("example.com").is_err());
        assert!(origin("https://example.com:443").is_err());
        assert!(origin("").is_err());
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
        assert_eq!(
            c.listen,
            vec![Listen::plain("127.0.0.1:0".parse().unwrap())]
        );
    }

    /// The configuration the Debian package installs: it loads, and it lists every setting, commented out
    /// with its default value except the few the package sets.
    #[test]
    fn the_packaged_configuration_lists_every_setting_with_its_default() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../packaging/lacquer.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let packaged = Config::parse(&text, path).unwrap();
        assert_eq!(packaged.backend.address.as_deref(), Some("127.0.0.1:8080"));
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
                let line = line
                    .strip_prefix("# ")
                    .filter(|l| assignment(l))
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
        let defaults = serde_json::to_value(Config::default()).unwrap();
        let set_by_the_package = ["backend.address", "admin.secret_file", "storage.dir"];
        // `[[listen]]` is listed once, for the one listener there is by default.
        fn first(v: &serde_json::Value) -> &serde_json::Value {
            v.as_array().map_or(v, |a| &a[0])
        }
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
    fn a_log_level_tracing_cannot_use_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("lacquer.toml");
        std::fs::write(&file, "[log]\nlevel = \"lacquerd=loud\"\n").unwrap();
        let o = Overrides {
            backend: Some("127.0.0.1:9".into()),
            disk: Some(dir.path().join("store")),
            ..Default::default()
        };
        let e = Config::load(Some(&file), o).unwrap_err().to_string();
        assert!(e.starts_with("log.level: \"lacquerd=loud\": "), "{e}");
    }

    #[test]
    fn unusable_directory_and_tiny_disk_are_rejected() {
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
        let dir = tempfile::tempdir().unwrap();
        let e = Config::load(
            None,
            Overrides {
                disk: Some(dir.path().into()),
                disk_size: Some(ByteSize::mib(1)),
                ..o()
            },
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("storage:"), "{e}");
    }
}
