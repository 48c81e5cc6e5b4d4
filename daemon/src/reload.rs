//! Reading the configuration again (`POST /v1/reload`, `SIGHUP`): what can change while requests are served
//! changes; what cannot is reported, and takes effect on the next start.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
};

use lacquer_admin::wire::{NotApplied, Reloaded};
use serde_json::Value;

use lacquer_backends::{backend_setting, probe::Probes, BackendSet, BackendState};
use lacquer_config::{Config, ConfigError, Overrides};
use lacquer_edge::{
    tls::{Certificates, SniResolver},
    Listener,
};
use lacquer_proxy::{
    log_format::LogFormat,
    worker::{Live, Shared},
};

use crate::settings;

/// Whether a reload applies `setting` at once: the cache policy, the purge access rules, the log level,
/// deny rules, normalisation, forwarding fields, backends (with their probes), directors and routes.
/// Listeners' certificates
/// too, when the listener is still there (see `load_certificates`).
fn is_live(setting: &str) -> bool {
    let live = [
        "cache.",
        "compression.",
        "purge.",
        "backend",
        "director",
        "route",
        "deny",
        "rule",
        "normalize.",
    ];
    live.iter().any(|prefix| setting.starts_with(prefix))
        || setting == "log.level"
        || setting == "access_log.format"
        || setting == "server.forwarding_headers"
}

/// Replaces the log filter; `Err` says why the level cannot be used.
pub type SetLogLevel = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

pub struct Reloader {
    path: Option<PathBuf>,
    /// The command line still wins over the file after a reload.
    overrides: Overrides,
    /// What is in effect: the loaded file with only the applied settings changed since the start.
    running: Mutex<Config>,
    shared: Arc<Shared>,
    listeners: Vec<Arc<Listener>>,
    probes: Probes,
    set_log_level: SetLogLevel,
}

impl Reloader {
    pub fn new(
        path: Option<PathBuf>,
        overrides: Overrides,
        running: Config,
        shared: Arc<Shared>,
        listeners: Vec<Arc<Listener>>,
        probes: Probes,
        set_log_level: SetLogLevel,
    ) -> Self {
        Self {
            path,
            overrides,
            running: Mutex::new(running),
            shared,
            listeners,
            probes,
            set_log_level,
        }
    }
}

impl lacquer_admin_server::Reload for Reloader {
    /// Loads and builds the file as a start would (a bad file changes nothing) and applies what can change
    /// live.
    fn reload(&self) -> Result<Reloaded, ConfigError> {
        let outcome = self.apply();
        match &outcome {
            Ok(r) => {
                tracing::info!(applied = ?r.applied, not_applied = ?r.not_applied, "configuration reloaded")
            }
            Err(e) => tracing::warn!(error = %e, "reload refused: the configuration does not load"),
        }
        outcome
    }
}

impl Reloader {
    /// Builds everything first, so that a file a start would refuse changes nothing; then applies.
    fn apply(&self) -> Result<Reloaded, ConfigError> {
        let next = Config::load(self.path.as_deref(), self.overrides.clone())?;
        settings::log_filter(&next.log.level)?;
        let access_format = LogFormat::compile(&next.access_log.format)?;
        settings::store(&next)?;
        let acme = settings::acme(&next)?;
        let built = settings::listeners(&next, acme.as_ref())?;
        let mut running = self.running.lock().expect("reload mutex");
        let mut candidate = running.clone();
        candidate.cache = next.cache.clone();
        candidate.compression = next.compression.clone();
        candidate.purge = next.purge.clone();
        candidate.route = next.route.clone();
        candidate.director = next.director.clone();
        candidate.backend = next.backend.clone();
        candidate.deny = next.deny.clone();
        candidate.rule = next.rule.clone();
        candidate.normalize = next.normalize.clone();
        candidate.server.forwarding_headers = next.server.forwarding_headers;
        let backends = self.backends_for(&candidate)?;
        let live = Live::new(&candidate, &backends.set)?;

        let mut outcome = Reloaded {
            config_file: self.path.as_ref().map(|p| p.display().to_string()),
            applied: Vec::new(),
            not_applied: Vec::new(),
        };
        let certificates = self.new_certificates(&next, &built);
        for setting in changed_settings(&running, &next) {
            let certificates_reloaded = certificates.iter().any(|c| c.setting == setting);
            let refusal = if certificates_reloaded {
                None
            } else if !is_live(&setting) {
                Some("takes effect on restart".to_owned())
            } else if setting == "log.level" {
                if std::env::var_os("RUST_LOG").is_some() {
                    Some("RUST_LOG overrides it".to_owned())
                } else {
                    (self.set_log_level)(&next.log.level).err()
                }
            } else {
                None
            };
            match refusal {
                None => outcome.applied.push(setting),
                Some(reason) => outcome.not_applied.push(NotApplied { setting, reason }),
            }
        }
        for setting in &backends.renewed {
            if !outcome.applied.contains(setting) {
                outcome.applied.push(setting.clone());
            }
        }
        for c in certificates {
            if !outcome.applied.contains(&c.setting) {
                outcome.applied.push(c.setting);
            }
            c.resolver.replace_files(c.loaded);
            candidate.listen[c.listener].tls = next.listen[c.listener].tls.clone();
        }
        if outcome.applied.iter().any(|s| s == "log.level") {
            candidate.log = next.log.clone();
        }
        if outcome.applied.iter().any(|s| s == "access_log.format") {
            candidate.access_log.format = next.access_log.format.clone();
            self.shared.access_log.set_format(access_format);
        }
        self.probes.start(&backends.fresh);
        for gone in &backends.gone {
            gone.retire();
        }
        self.shared
            .store
            .weigh_edited_heads(live.rules.edited_fields());
        self.shared.live.store(Arc::new(live));
        *running = candidate;
        Ok(outcome)
    }

    /// The states for `config`'s backends: a backend whose settings did not change keeps its state (health,
    /// probe history, connection pools) unless its TLS files changed (a renewed client certificate: the
    /// state is renewed, new connections use the new files, health goes on), the others get new ones (with
    /// the operator's forced health of a backend of the same name), whose
    /// probes start when the reload is applied; the states no longer configured are to be retired then
    /// (their probes stop; workers drop their pools).
    fn backends_for(&self, config: &Config) -> Result<NextBackends, ConfigError> {
        let running = self.shared.live.load().router.backends.clone();
        let mut renewed = Vec::new();
        let set: BackendSet = Arc::new(
            config
                .backend
                .iter()
                .enumerate()
                .map(|(n, b)| {
                    let setting = backend_setting(config, n);
                    match running.iter().find(|state| state.config == *b) {
                        Some(kept) => match kept.renewed(&setting)? {
                            Some((state, changed)) => {
                                renewed.extend(changed);
                                Ok(Arc::new(state))
                            }
                            None => Ok(kept.clone()),
                        },
                        None => {
                            let state = BackendState::new(b, &setting)?;
                            // The name is the operator's handle on a drain: it outlives new settings.
                            Ok(Arc::new(
                                match running.iter().find(|s| s.name() == b.name) {
                                    Some(previous) => state.keep_admin_of(previous),
                                    None => state,
                                },
                            ))
                        }
                    }
                })
                .collect::<Result<_, ConfigError>>()?,
        );
        let is_in = |set: &[Arc<BackendState>], s: &Arc<BackendState>| {
            set.iter().any(|o| Arc::ptr_eq(o, s))
        };
        let fresh = set
            .iter()
            .filter(|s| !is_in(&running, s))
            .cloned()
            .collect();
        let gone = running
            .iter()
            .filter(|s| !is_in(&set, s))
            .cloned()
            .collect();
        Ok(NextBackends {
            set,
            fresh,
            gone,
            renewed,
        })
    }

    /// Every TLS listener's certificates, as just read again from `built` (a renewed certificate replaces
    /// the file, so they are read even when the paths are the same), paired with the resolver they go to. A
    /// listener that moved, or stopped or started being TLS, changes on restart only.
    fn new_certificates(&self, next: &Config, built: &[Listener]) -> Vec<NewCertificates> {
        let mut out = Vec::new();
        for (n, listener) in self.listeners.iter().enumerate() {
            let (Some(resolver), Some(wanted), Some(loaded)) = (
                &listener.certificates,
                next.listen.get(n),
                built.get(n).and_then(|b| b.certificates.as_ref()),
            ) else {
                continue;
            };
            if wanted.address != listener.config.address {
                continue;
            }
            out.push(NewCertificates {
                listener: n,
                setting: format!("listen[{n}].tls"),
                resolver: resolver.clone(),
                loaded: loaded.files(),
            });
        }
        out
    }
}

/// The backend states of a reloaded configuration.
struct NextBackends {
    set: BackendSet,
    /// New states, whose probes start.
    fresh: Vec<Arc<BackendState>>,
    /// States no longer configured, to retire.
    gone: Vec<Arc<BackendState>>,
    /// The TLS file settings of kept backends whose files changed, read again (`backend[0].tls_cert`).
    renewed: Vec<String>,
}

struct NewCertificates {
    listener: usize,
    setting: String,
    resolver: Arc<SniResolver>,
    loaded: Arc<Certificates>,
}

/// Dotted names of the settings whose values differ; lists of tables by index (`listen[0].address`), other
/// lists as one setting.
fn changed_settings(a: &Config, b: &Config) -> Vec<String> {
    fn walk(prefix: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => {
                let name = |key: &str| {
                    if prefix.is_empty() {
                        key.to_owned()
                    } else {
                        format!("{prefix}.{key}")
                    }
                };
                for (key, av) in a {
                    walk(&name(key), av, b.get(key).unwrap_or(&Value::Null), out);
                }
                // Settings left out when unset (`telemetry.endpoint`, `access_log.path`) and set now.
                for key in b.keys().filter(|key| !a.contains_key(*key)) {
                    out.push(name(key));
                }
            }
            (Value::Array(a), Value::Array(b))
                if a.len() == b.len() && a.iter().chain(b).all(Value::is_object) =>
            {
                for (n, (av, bv)) in a.iter().zip(b).enumerate() {
                    walk(&format!("{prefix}[{n}]"), av, bv, out);
                }
            }
            (a, b) if a != b => out.push(prefix.to_owned()),
            _ => {}
        }
    }
    let a = serde_json::to_value(a).expect("the configuration serializes");
    let b = serde_json::to_value(b).expect("the configuration serializes");
    let mut out = Vec::new();
    walk("", &a, &b, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn changed_settings_are_named_by_their_keys() {
        let a = Config::default();
        let mut b = a.clone();
        b.cache.default_ttl = Duration::from_secs(90);
        b.purge.allow_from.push("10.0.0.0/8".parse().unwrap());
        b.storage.memory = bytesize::ByteSize::gib(2);
        assert_eq!(
            changed_settings(&a, &b),
            ["storage.memory", "cache.default_ttl", "purge.allow_from"]
        );
        assert!(changed_settings(&a, &a.clone()).is_empty());
        let mut c = a.clone();
        c.listen[0].max_connections = 10;
        c.listen[0].tls.push(lacquer_config::Certificate {
            cert: "c.pem".into(),
            key: "c.key".into(),
        });
        assert_eq!(
            changed_settings(&a, &c),
            ["listen[0].tls", "listen[0].max_connections"]
        );
        c.listen.push(c.listen[0].clone());
        assert_eq!(changed_settings(&a, &c), ["listen"]);
        let mut d = a.clone();
        d.telemetry.endpoint = Some("http://127.0.0.1:4318/v1/traces".into());
        assert_eq!(changed_settings(&a, &d), ["telemetry.endpoint"]);
        assert_eq!(changed_settings(&d, &a), ["telemetry.endpoint"]);
    }
}
