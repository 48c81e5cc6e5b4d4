//! Building what the configuration describes: listeners (with their certificates), backends, routes and
//! directors, deny rules, rate limits, the cache policy, the store's settings and the log filter. Building
//! them is the validation: `--check`, the start and a reload all run these functions, and every error
//! names the setting that cannot be used.

use std::{sync::Arc, time::Duration};

use lacquer_acme::Acme;
use lacquer_backends::{backend_set, BackendSet};
use lacquer_cluster::{EtcdTls, Secret, Settings as ClusterSettings};
use lacquer_config::{AcmeChallenge, Config, ConfigError};
use lacquer_edge::Listener;
use lacquer_proxy::{log_format::LogFormat, worker::Live};
use lacquer_storage::StoreBuilder;
use tracing_subscriber::EnvFilter;

use crate::secret;

/// Everything a start needs from the configuration, built once.
pub struct Settings {
    /// The client listeners, in `[[listen]]` order, certificates loaded.
    pub listeners: Vec<Listener>,
    /// The backends' states, in `[[backend]]` order.
    pub backends: BackendSet,
    /// Routes, directors, deny rules and the rest a reload replaces.
    pub live: Live,
    /// The store, ready to open.
    pub store: StoreBuilder,
    /// The log filter of `log.level`.
    pub log_filter: EnvFilter,
    /// `access_log.format`, compiled.
    pub access_format: LogFormat,
    /// `[cluster]`, when there is one; an advertised port 0 is the bound one, filled in at start.
    pub cluster: Option<ClusterSettings>,
    /// The certificates the listeners' `acme` keep, when any does: checked, nothing read or started.
    pub acme: Option<Arc<Acme>>,
}

/// Builds every setting of `config`.
pub fn compile(config: &Config) -> Result<Settings, ConfigError> {
    let backends = backend_set(config)?;
    let live = Live::new(config, &backends)?;
    let acme = acme(config)?;
    let listeners = listeners(config, acme.as_ref())?;
    let log_filter = log_filter(&config.log.level)?;
    let access_format = LogFormat::compile(&config.access_log.format)?;
    let store = store(config)?;
    let cluster = cluster(config)?;
    Ok(Settings {
        listeners,
        backends,
        live,
        store,
        log_filter,
        access_format,
        cluster,
        acme,
    })
}

/// `[cluster]`, checked: a node name others can address, etcd URLs, addresses peers can reach.
pub fn cluster(config: &Config) -> Result<Option<ClusterSettings>, ConfigError> {
    let Some(c) = &config.cluster else {
        return Ok(None);
    };
    let node = match &c.node {
        Some(node) => node.clone(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .map_err(|e| {
                ConfigError::setting("cluster.node", format!("no host name to default to: {e}"))
            })?,
    };
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
    if node.is_empty() || node.len() > 64 || !node.chars().all(valid) {
        return Err(ConfigError::setting(
            "cluster.node",
            format!("{node:?}: 1 to 64 letters, digits, '.', '-' or '_'"),
        ));
    }
    if c.etcd.is_empty() {
        return Err(ConfigError::setting(
            "cluster.etcd",
            "at least one etcd URL",
        ));
    }
    for url in &c.etcd {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| ConfigError::setting("cluster.etcd", format!("{url:?}: {e}")))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
            return Err(ConfigError::setting(
                "cluster.etcd",
                format!("{url:?}: give http://host:port or https://host:port"),
            ));
        }
    }
    if !c.prefix.starts_with('/') || c.prefix.len() < 2 {
        return Err(ConfigError::setting(
            "cluster.prefix",
            format!("{:?}: a key prefix such as /lacquer", c.prefix),
        ));
    }
    let listener = config.listen.first().map(|l| l.address);
    let advertise = c.advertise.or(listener).ok_or_else(|| {
        ConfigError::setting("cluster.advertise", "no [[listen]] address to default to")
    })?;
    let advertise_admin = c.advertise_admin.unwrap_or(config.admin.listen);
    for (setting, addr) in [
        ("cluster.advertise", advertise),
        ("cluster.advertise_admin", advertise_admin),
    ] {
        if addr.ip().is_unspecified() {
            return Err(ConfigError::setting(
                setting,
                format!("{addr} is a wildcard: give the address the other nodes reach this one at"),
            ));
        }
    }
    if c.lease_ttl < Duration::from_secs(2) || c.lease_ttl.subsec_nanos() != 0 {
        return Err(ConfigError::setting(
            "cluster.lease_ttl",
            "whole seconds, at least 2 (etcd's shortest lease)",
        ));
    }
    if c.max_invalidation_lag < Duration::from_secs(2) {
        return Err(ConfigError::setting(
            "cluster.max_invalidation_lag",
            "at least 2s: a node confirms it is current every second",
        ));
    }
    let secret = secret_file(c)?;
    let etcd_tls = etcd_tls(c)?;
    let etcd_user = etcd_user(c)?;
    let mut settings = ClusterSettings::new(node, advertise, advertise_admin, secret);
    settings.etcd_tls = etcd_tls;
    settings.etcd_user = etcd_user;
    settings.etcd = c.etcd.clone();
    settings.prefix = c.prefix.trim_end_matches('/').to_owned();
    settings.lease_ttl = c.lease_ttl;
    settings.max_invalidation_lag = c.max_invalidation_lag;
    settings.self_routing = c.self_routing;
    Ok(Some(settings))
}

/// `cluster.secret_file`, read: a cluster without a secret would let whoever reaches etcd join it.
fn secret_file(c: &lacquer_config::Cluster) -> Result<Secret, ConfigError> {
    const SETTING: &str = "cluster.secret_file";
    let path = c.secret_file.as_deref().ok_or_else(|| {
        ConfigError::setting(
            SETTING,
            "required: a file holding the secret every node of the cluster shares \
             (docs/cluster.md, \"Trust\")",
        )
    })?;
    let text = secret::read(path, "cluster secret")
        .and_then(|text| text.ok_or_else(|| anyhow::anyhow!("{} does not exist", path.display())))
        .and_then(|text| secret::long_enough(text, path, "cluster secret"))
        .map_err(|e| ConfigError::setting(SETTING, format!("{e:#}")))?;
    Ok(Secret::new(text.as_bytes()))
}

/// `cluster.etcd_ca_file`, `etcd_cert_file` and `etcd_key_file`, read, for `https://` etcd URLs.
fn etcd_tls(c: &lacquer_config::Cluster) -> Result<Option<EtcdTls>, ConfigError> {
    let https = c.etcd.iter().filter(|u| u.starts_with("https://")).count();
    if https != 0 && https != c.etcd.len() {
        return Err(ConfigError::setting(
            "cluster.etcd",
            "all http:// or all https://",
        ));
    }
    let read = |setting: &str, path: &std::path::Path| {
        std::fs::read(path)
            .map_err(|e| ConfigError::setting(setting, format!("{}: {e}", path.display())))
    };
    let identity = match (&c.etcd_cert_file, &c.etcd_key_file) {
        (Some(cert), Some(key)) => Some((
            read("cluster.etcd_cert_file", cert)?,
            read("cluster.etcd_key_file", key)?,
        )),
        (None, None) => None,
        (Some(_), None) => {
            return Err(ConfigError::setting(
                "cluster.etcd_key_file",
                "required with etcd_cert_file",
            ))
        }
        (None, Some(_)) => {
            return Err(ConfigError::setting(
                "cluster.etcd_cert_file",
                "required with etcd_key_file",
            ))
        }
    };
    match &c.etcd_ca_file {
        Some(ca) if https != 0 => Ok(Some(EtcdTls {
            ca: read("cluster.etcd_ca_file", ca)?,
            identity,
        })),
        None if https != 0 => Err(ConfigError::setting(
            "cluster.etcd_ca_file",
            "required with https:// etcd URLs: the CA etcd's certificate is checked against",
        )),
        _ if c.etcd_ca_file.is_some() || identity.is_some() => Err(ConfigError::setting(
            "cluster.etcd",
            "TLS settings are given: the etcd URLs must be https://",
        )),
        _ => Ok(None),
    }
}

/// `cluster.etcd_user` and its `etcd_password_file`, read.
fn etcd_user(c: &lacquer_config::Cluster) -> Result<Option<(String, String)>, ConfigError> {
    const SETTING: &str = "cluster.etcd_password_file";
    match (&c.etcd_user, &c.etcd_password_file) {
        (None, None) => Ok(None),
        (Some(user), Some(path)) => {
            let password = secret::read(path, "etcd password")
                .and_then(|p| p.ok_or_else(|| anyhow::anyhow!("{} does not exist", path.display())))
                .map_err(|e| ConfigError::setting(SETTING, format!("{e:#}")))?;
            if password.is_empty() {
                return Err(ConfigError::setting(
                    SETTING,
                    format!("{} is empty", path.display()),
                ));
            }
            Ok(Some((user.clone(), password)))
        }
        (Some(_), None) => Err(ConfigError::setting(SETTING, "required with etcd_user")),
        (None, Some(_)) => Err(ConfigError::setting(
            "cluster.etcd_user",
            "required with etcd_password_file",
        )),
    }
}

/// The listeners of `config`, certificates read and checked.
pub fn listeners(config: &Config, acme: Option<&Arc<Acme>>) -> Result<Vec<Listener>, ConfigError> {
    config
        .listen
        .iter()
        .enumerate()
        .map(|(n, l)| {
            Listener::new(l.clone(), acme.and_then(|a| a.for_listener(n)))
                .map_err(|e| ConfigError::setting(format!("listen[{n}].{}", e.setting()), e))
        })
        .collect()
}

/// The listeners' `acme`, checked; kept in `<store>/acme`. HTTP-01 needs a plain listener: the CA asks on
/// port 80.
pub fn acme(config: &Config) -> Result<Option<Arc<Acme>>, ConfigError> {
    let configured: Vec<_> = config
        .listen
        .iter()
        .enumerate()
        .filter_map(|(n, l)| Some((n, l.acme.as_ref()?)))
        .collect();
    if configured.is_empty() {
        return Ok(None);
    }
    let acme = Acme::new(config.storage_dir().join("acme"), configured)
        .map_err(|(n, e)| ConfigError::setting(format!("listen[{n}].acme.{}", e.setting()), e))?;
    let plain = config
        .listen
        .iter()
        .any(|l| l.tls.is_empty() && l.acme.is_none());
    if acme.uses_http_01() && !plain {
        let n = config
            .listen
            .iter()
            .position(|l| {
                l.acme
                    .as_ref()
                    .is_some_and(|a| a.challenge == AcmeChallenge::Http01)
            })
            .unwrap_or_default();
        return Err(ConfigError::setting(
            format!("listen[{n}].acme.challenge"),
            "http-01 needs a listener without TLS, reached on port 80 (the CA asks for \
             http://<domain>/.well-known/acme-challenge/); add one, or use tls-alpn-01",
        ));
    }
    Ok(Some(Arc::new(acme)))
}

/// The filter of a `log.level`.
pub fn log_filter(level: &str) -> Result<EnvFilter, ConfigError> {
    EnvFilter::try_new(level)
        .map_err(|e| ConfigError::setting("log.level", format!("{level:?}: {e}")))
}

/// The store's settings, checked (sizes that foyer cannot use are refused here, not when it opens).
pub fn store(config: &Config) -> Result<StoreBuilder, ConfigError> {
    let s = &config.storage;
    let builder = StoreBuilder::new(config.storage_dir())
        .with_memory_bytes(s.memory.as_u64() as usize)
        .with_disk_bytes(s.disk_size.as_u64() as usize)
        .with_chunk_size(s.chunk_size.as_u64() as usize)
        .with_metadata_cache_bytes(s.metadata_cache.as_u64() as usize)
        .with_metadata_page_cache_bytes(s.metadata_page_cache.as_u64() as usize)
        .with_max_variants(s.max_variants)
        .with_sweep_interval(s.sweep_interval);
    builder
        .validate()
        .map_err(|e| ConfigError::setting("storage", e))?;
    Ok(builder)
}

#[cfg(test)]
mod props;

#[cfg(test)]
mod tests {
    use lacquer_config::Overrides;

    use super::*;

    fn loaded(dir: &std::path::Path, text: &str) -> Config {
        let file = dir.join("lacquer.toml");
        std::fs::write(&file, text).unwrap();
        let overrides = Overrides {
            backend: Some("127.0.0.1:9".into()),
            disk: Some(dir.join("store")),
            ..Default::default()
        };
        Config::load(Some(&file), overrides).unwrap()
    }

    fn error(text: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        match compile(&loaded(dir.path(), text)) {
            Ok(_) => panic!("{text:?} compiled"),
            Err(e) => e.to_string(),
        }
    }

    /// The cluster's secret and etcd's credentials: files read at compile time, each error naming its
    /// setting.
    #[test]
    fn cluster_secrets_and_etcd_credentials_name_their_settings() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str, mode: u32| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            path.display().to_string()
        };
        let secret = file("secret", "0123456789abcdef0123\n", 0o600);
        let short = file("short", "0123\n", 0o600);
        let open = file("open", "0123456789abcdef0123\n", 0o644);
        let pem = file("ca.pem", "-----BEGIN CERTIFICATE-----\n", 0o644);
        let head = "[cluster]\nnode = \"n1\"\nadvertise = \"10.0.0.1:80\"\n";
        let cases = [
            (format!("secret_file = \"{short}\"\n"), "cluster.secret_file: cluster secret in "),
            (format!("secret_file = \"{open}\"\n"), "cluster.secret_file: cluster secret "),
            (format!("secret_file = \"{secret}\"\netcd = [\"https://10.0.0.5:2379\"]\n"),
                "cluster.etcd_ca_file: required with https://"),
            (format!("secret_file = \"{secret}\"\netcd_ca_file = \"{pem}\"\n"),
                "cluster.etcd: TLS settings are given"),
            (format!("secret_file = \"{secret}\"\netcd = [\"https://a:1\", \"http://b:1\"]\n"),
                "cluster.etcd: all http:// or all https://"),
            (format!("secret_file = \"{secret}\"\netcd = [\"https://a:1\"]\netcd_ca_file = \"{pem}\"\netcd_cert_file = \"{pem}\"\n"),
                "cluster.etcd_key_file: required with etcd_cert_file"),
            (format!("secret_file = \"{secret}\"\netcd_user = \"lacquer\"\n"),
                "cluster.etcd_password_file: required with etcd_user"),
            (format!("secret_file = \"{secret}\"\netcd_user = \"lacquer\"\netcd_password_file = \"{open}\"\n"),
                "cluster.etcd_password_file: etcd password "),
        ];
        for (lines, want) in cases {
            let text = format!("{head}{lines}");
            let got = error(&text);
            assert!(got.starts_with(want), "{text}: {got}");
        }
        let good = format!(
            "{head}secret_file = \"{secret}\"\netcd = [\"https://a:1\"]\netcd_ca_file = \"{pem}\"\n\
             etcd_user = \"lacquer\"\netcd_password_file = \"{secret}\"\n"
        );
        let settings = cluster(&loaded(dir.path(), &good)).unwrap().unwrap();
        assert_eq!(settings.etcd_tls.unwrap().identity, None);
        assert_eq!(
            settings.etcd_user,
            Some(("lacquer".into(), "0123456789abcdef0123".into()))
        );
    }

    #[test]
    fn a_good_file_compiles() {
        let dir = tempfile::tempdir().unwrap();
        let c = loaded(
            dir.path(),
            "[[route]]\npath_prefix = \"/api/\"\npass = true\n",
        );
        let s = compile(&c).unwrap();
        assert_eq!(s.listeners.len(), 1);
        assert_eq!(s.backends.len(), 1);
    }

    #[test]
    fn every_error_names_its_setting() {
        let cases = [
            ("[log]\nlevel = \"lacquerd=loud\"\n", "log.level: \"lacquerd=loud\": "),
            ("[storage]\ndisk_size = \"1MiB\"\n", "storage: "),
            ("[[listen]]\naddress = \"127.0.0.1:0\"\ntls = [{ cert = \"/nonexistent.pem\", key = \"/nonexistent.key\" }]\n",
                "listen[0].tls: "),
            ("[[listen]]\naddress = \"127.0.0.1:0\"\nquic = true\n", "listen[0].quic: needs tls certificates"),
            ("[[listen]]\naddress = \"127.0.0.1:0\"\nacme = { domains = [\"shop.example\"] }\n",
                "listen[0].acme.challenge: http-01 needs a listener without TLS"),
            ("[[listen]]\naddress = \"127.0.0.1:0\"\n[[listen]]\naddress = \"127.0.0.1:0\"\nacme = { domains = [\"*.shop.example\"] }\n",
                "listen[1].acme.domains: \"*.shop.example\" is not a DNS name"),
            ("[[route]]\npath_regex = \"(\"\n", "route[0].path_regex: regex parse error"),
            ("[compression]\nbrotli_level = 12\n", "compression.brotli_level: must be between 0 and 11"),
            ("[compression]\ngzip_level = 0\n", "compression.gzip_level: "),
            ("[compression]\ncodings = []\n", "compression.codings: at least one"),
            ("[compression]\ncodings = [\"br\", \"br\"]\n", "compression.codings: br is listed twice"),
            ("[compression]\ntypes = [\"html\"]\n", "compression.types: \"html\" is not a media type"),
            ("[compression]\ndecode_memory = \"64KiB\"\n", "compression.decode_memory: must be at least 128KiB"),
            ("[compression]\nmax_expansion = 5\n", "compression.max_expansion: must be at least 20"),
            ("[[deny]]\npath_regex = \"[\"\n", "deny[0]: "),
            ("[cluster]\nnode = \"a b\"\n", "cluster.node: \"a b\""),
            ("[cluster]\nnode = \"n1\"\netcd = []\n", "cluster.etcd: "),
            ("[cluster]\nnode = \"n1\"\netcd = [\"127.0.0.1:2379\"]\n", "cluster.etcd: "),
            ("[cluster]\nnode = \"n1\"\nprefix = \"lacquer\"\n", "cluster.prefix: "),
            ("[cluster]\nnode = \"n1\"\n", "cluster.advertise: 0.0.0.0:6081 is a wildcard"),
            ("[cluster]\nnode = \"n1\"\nadvertise = \"10.0.0.1:80\"\nlease_ttl = \"500ms\"\n", "cluster.lease_ttl: "),
            ("[cluster]\nnode = \"n1\"\nadvertise = \"10.0.0.1:80\"\nmax_invalidation_lag = \"1s\"\n", "cluster.max_invalidation_lag: "),
            ("[cluster]\nnode = \"n1\"\nadvertise = \"10.0.0.1:80\"\n", "cluster.secret_file: required: "),
            ("[cluster]\nnode = \"n1\"\nadvertise = \"10.0.0.1:80\"\nsecret_file = \"/nonexistent\"\n",
                "cluster.secret_file: /nonexistent does not exist"),
        ];
        for (text, want) in cases {
            let got = error(text);
            assert!(got.starts_with(want), "{text}: {got}");
            assert!(!got.contains('\n'), "one line: {got:?}");
        }
    }
}
