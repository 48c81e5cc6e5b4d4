//! Reading the configuration again (`POST /v1/reload`, `SIGHUP`): what can change while requests are served
//! changes; what cannot is reported, and takes effect on the next start.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
};

use lacquer_admin::wire::{NotApplied, Reloaded};
use serde_json::Value;

use crate::{
    backend::{probe::Probes, BackendSet, BackendState},
    config::{Config, ConfigError, Overrides},
    server::{
        tls::{Certificates, SniResolver},
        Listener,
    },
    worker::{Live, Shared},
};

/// Whether a reload applies `setting` at once: the cache policy, the purge access rules, the log level,
/// deny rules, normalisation, forwarding fields, backends (with their probes), directors and routes.
/// Listeners' certificates
/// too, when the listener is still there (see `load_certificates`).
fn is_live(setting: &str) -> bool {
    let live = [
        "cache.",
        "purge.",
        "backend",
        "director",
        "route",
        "deny",
        "normalize.",
    ];
    live.iter().any(|prefix| setting.starts_with(prefix))
        || setting == "log.level"
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

    /// Loads the file as a start would (a bad file changes nothing) and applies what can change live.
    pub fn reload(&self) -> Result<Reloaded, ConfigError> {
        let outcome = self.apply();
        match &outcome {
            Ok(r) => {
                tracing::info!(applied = ?r.applied, not_applied = ?r.not_applied, "configuration reloaded")
            }
            Err(e) => tracing::warn!(error = %e, "reload refused: the configuration does not load"),
        }
        outcome
    }

    fn apply(&self) -> Result<Reloaded, ConfigError> {
        let next = Config::load(self.path.as_deref(), self.overrides.clone())?;
        let mut running = self.running.lock().expect("reload mutex");
        let mut outcome = Reloaded {
            config_file: self.path.as_ref().map(|p| p.display().to_string()),
            applied: Vec::new(),
            not_applied: Vec::new(),
        };
        let certificates = self.load_certificates(&next)?;
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
        for c in certificates {
            if !outcome.applied.contains(&c.setting) {
                outcome.applied.push(c.setting);
            }
            c.resolver.0.store(Arc::new(c.loaded));
            running.listen[c.listener].tls = next.listen[c.listener].tls.clone();
        }
        running.cache = next.cache.clone();
        running.purge = next.purge.clone();
        running.route = next.route.clone();
        running.director = next.director.clone();
        running.backend = next.backend.clone();
        if outcome.applied.iter().any(|s| s == "log.level") {
            running.log = next.log.clone();
        }
        running.deny = next.deny.clone();
        running.normalize = next.normalize.clone();
        running.server.forwarding_headers = next.server.forwarding_headers;
        let backends = self.backends_for(&running);
        self.shared
            .live
            .store(Arc::new(Live::new(&running, &backends)));
        Ok(outcome)
    }
}

impl Reloader {
    /// The states for `config`'s backends: a backend whose settings did not change keeps its state (health,
    /// probe history, connection pools), the others get new ones with probes started, and the states no
    /// longer configured are retired (their probes stop; workers drop their pools).
    fn backends_for(&self, config: &Config) -> BackendSet {
        let running = self.shared.live.load().router.backends.clone();
        let next: BackendSet = Arc::new(
            config
                .backend
                .iter()
                .map(|b| {
                    running
                        .iter()
                        .find(|state| state.config == *b)
                        .cloned()
                        .unwrap_or_else(|| Arc::new(BackendState::new(b)))
                })
                .collect(),
        );
        let is_in = |set: &[Arc<BackendState>], s: &Arc<BackendState>| {
            set.iter().any(|o| Arc::ptr_eq(o, s))
        };
        let fresh: Vec<_> = next
            .iter()
            .filter(|s| !is_in(&running, s))
            .cloned()
            .collect();
        self.probes.start(&fresh);
        for gone in running.iter().filter(|s| !is_in(&next, s)) {
            gone.retire();
        }
        next
    }

    /// Every TLS listener's certificates, read again even when the paths are the same (a renewed
    /// certificate replaces the file), paired with the resolver they go to. A listener that moved, or
    /// stopped or started being TLS, changes on restart only.
    fn load_certificates(&self, next: &Config) -> Result<Vec<NewCertificates>, ConfigError> {
        let mut out = Vec::new();
        for (n, listener) in self.listeners.iter().enumerate() {
            let (Some(resolver), Some(wanted)) = (&listener.certificates, next.listen.get(n))
            else {
                continue;
            };
            if wanted.address != listener.config.address || wanted.tls.is_empty() {
                continue;
            }
            let setting = format!("listen[{n}].tls");
            let loaded = Certificates::load(&wanted.tls)
                .map_err(|e| ConfigError(format!("{setting}: {e}")))?;
            out.push(NewCertificates {
                listener: n,
                setting,
                resolver: resolver.clone(),
                loaded,
            });
        }
        Ok(out)
    }
}

struct NewCertificates {
    listener: usize,
    setting: String,
    resolver: Arc<SniResolver>,
    loaded: Certificates,
}

/// Dotted names of the settings whose values differ; lists of tables by index (`listen[0].address`), other
/// lists as one setting.
fn changed_settings(a: &Config, b: &Config) -> Vec<String> {
    fn walk(prefix: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => {
                for (key, av) in a {
                    let name = if prefix.is_empty() {
                        key.clone()
                    } else {
                        format!("{prefix}.{key}")
                    };
                    walk(&name, av, b.get(key).unwrap_or(&Value::Null), out);
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
        c.listen[0].tls.push(crate::config::Certificate {
            cert: "c.pem".into(),
            key: "c.key".into(),
        });
        assert_eq!(
            changed_settings(&a, &c),
            ["listen[0].tls", "listen[0].max_connections"]
        );
        c.listen.push(c.listen[0].clone());
        assert_eq!(changed_settings(&a, &c), ["listen"]);
    }
}
