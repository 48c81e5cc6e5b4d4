//! Building what the configuration describes: listeners (with their certificates), backends, routes and
//! directors, deny rules, rate limits, the cache policy, the store's settings and the log filter. Building
//! them is the validation: `--check`, the start and a reload all run these functions, and every error
//! names the setting that cannot be used.

use lacquer_backends::{backend_set, BackendSet};
use lacquer_config::{Config, ConfigError};
use lacquer_edge::Listener;
use lacquer_proxy::worker::Live;
use lacquer_storage::StoreBuilder;
use tracing_subscriber::EnvFilter;

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
}

/// Builds every setting of `config`.
pub fn compile(config: &Config) -> Result<Settings, ConfigError> {
    let backends = backend_set(config)?;
    let live = Live::new(config, &backends)?;
    let listeners = listeners(config)?;
    let log_filter = log_filter(&config.log.level)?;
    let store = store(config)?;
    Ok(Settings {
        listeners,
        backends,
        live,
        store,
        log_filter,
    })
}

/// The listeners of `config`, certificates read and checked.
pub fn listeners(config: &Config) -> Result<Vec<Listener>, ConfigError> {
    config
        .listen
        .iter()
        .enumerate()
        .map(|(n, l)| {
            Listener::new(l.clone())
                .map_err(|e| ConfigError::setting(format!("listen[{n}].tls"), e))
        })
        .collect()
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
            ("[[route]]\npath_regex = \"(\"\n", "route[0].path_regex: regex parse error"),
            ("[compression]\nbrotli_level = 12\n", "compression.brotli_level: must be between 0 and 11"),
            ("[compression]\ngzip_level = 0\n", "compression.gzip_level: "),
            ("[compression]\ncodings = []\n", "compression.codings: at least one"),
            ("[compression]\ncodings = [\"br\", \"br\"]\n", "compression.codings: br is listed twice"),
            ("[compression]\ntypes = [\"html\"]\n", "compression.types: \"html\" is not a media type"),
            ("[[deny]]\npath_regex = \"[\"\n", "deny[0]: "),
        ];
        for (text, want) in cases {
            let got = error(text);
            assert!(got.starts_with(want), "{text}: {got}");
            assert!(!got.contains('\n'), "one line: {got:?}");
        }
    }
}
