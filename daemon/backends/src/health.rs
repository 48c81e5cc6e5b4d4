//! What every worker and the probe know about one backend: its traffic, its probe window, its connection
//! limit.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed},
        Arc, Mutex,
    },
    time::Duration,
};

use lacquer_admin::wire::{self, BackendAdmin, BackendView, LastError, ProbeView};
use tokio::sync::{watch, Semaphore};

use lacquer_config::{self as config, ConfigError};

use crate::{tally, tls};

/// The backend's TLS configuration from its files; an error names the setting and the file. Missing system
/// roots are no mistake in the file: the backend is kept, and every connection to it fails, logged.
fn load_tls(config: &config::Backend, setting: &str) -> Result<tls::Loaded, ConfigError> {
    let files = tls::Files {
        ca: config.tls_ca.as_deref(),
        identity: config.tls_cert.as_deref().zip(config.tls_key.as_deref()),
    };
    let (loaded, roots_missing) = tls::client_config(files)
        .map_err(|e| ConfigError::setting(format!("{setting}.{}", e.setting), e.message))?;
    if let Some(why) = roots_missing {
        tracing::error!(backend = %config.name, "TLS to the backend cannot succeed: {why}");
    }
    Ok(loaded)
}

/// The most places `max_connections` may give: a bound far above any origin's, and below what a
/// semaphore can hold.
const MAX_CONNECTIONS: usize = 1_000_000;

/// One backend, shared by every worker and its probe. A reload keeps the state of a backend whose settings
/// did not change (its health and probe history go on) and retires the others; one whose TLS files changed
/// under the same names is renewed ([`BackendState::renewed`]): new connections, the same health.
#[derive(Debug)]
pub struct BackendState {
    /// The `[[backend]]` section it was built from; a reload keeps the state while this is unchanged.
    pub config: config::Backend,
    /// `host:port`.
    pub authority: String,
    /// For `https://` backends.
    pub tls: Option<tls::Loaded>,
    traffic: Arc<Traffic>,
    pub(crate) probe: Option<Arc<ProbeWindow>>,
    /// The operator's [`BackendAdmin`] as its discriminant; shared with the states that carry the same
    /// backend on through reloads, so a drain outlives them.
    admin: Arc<AtomicU8>,
    /// Places for requests in flight, when `max_connections` is set.
    pub limit: Option<Arc<Semaphore>>,
    retired: watch::Sender<bool>,
}

impl BackendState {
    /// Reads the address and the TLS files; errors start with `setting` (`backend`, `backend[n]`). No
    /// system roots is not an error: the backend is kept, every connection to it fails, logged.
    pub fn new(config: &config::Backend, setting: &str) -> Result<Self, ConfigError> {
        let address = config::backend_address(config.address.as_deref())
            .map_err(|e| ConfigError(format!("{setting}.{e}")))?;
        let https_only = |name: &str| {
            ConfigError::setting(format!("{setting}.{name}"), "only for https:// backends")
        };
        if !address.https {
            if config.tls_ca.is_some() {
                return Err(https_only("tls_ca"));
            }
            if config.tls_cert.is_some() {
                return Err(https_only("tls_cert"));
            }
            if config.tls_key.is_some() {
                return Err(https_only("tls_key"));
            }
        }
        match (&config.tls_cert, &config.tls_key) {
            (Some(_), None) => {
                return Err(ConfigError::setting(
                    format!("{setting}.tls_key"),
                    "required with tls_cert: the private key of the client certificate",
                ))
            }
            (None, Some(_)) => {
                return Err(ConfigError::setting(
                    format!("{setting}.tls_cert"),
                    "required with tls_key: the client certificate the key signs for",
                ))
            }
            _ => {}
        }
        match (config.protocol, address.https) {
            (config::Protocol::H2, false) => {
                return Err(ConfigError::setting(
                    format!("{setting}.protocol"),
                    "\"h2\" is HTTP/2 over TLS: it needs an https:// address (\"h2c\" is HTTP/2 over plain TCP)",
                ))
            }
            (config::Protocol::H2c, true) => {
                return Err(ConfigError::setting(
                    format!("{setting}.protocol"),
                    "\"h2c\" is HTTP/2 over plain TCP: it needs an http:// or bare address (\"h2\" is HTTP/2 over TLS)",
                ))
            }
            _ => {}
        }
        if config.h2_ping_interval.is_zero() || config.h2_ping_timeout.is_zero() {
            let which = if config.h2_ping_interval.is_zero() {
                "h2_ping_interval"
            } else {
                "h2_ping_timeout"
            };
            return Err(ConfigError::setting(
                format!("{setting}.{which}"),
                "must be above 0",
            ));
        }
        if let Some(p) = &config.probe {
            if !(1..=64).contains(&p.window) || p.threshold > p.window || p.initial() > p.window {
                return Err(ConfigError::setting(
                    format!("{setting}.probe"),
                    "window must be 1 to 64, threshold and initial at most window",
                ));
            }
            if !p.url.starts_with('/') || p.url.parse::<http::uri::PathAndQuery>().is_err() {
                return Err(ConfigError::setting(
                    format!("{setting}.probe.url"),
                    format!("{:?} is not a path", p.url),
                ));
            }
        }
        if config.max_connections > MAX_CONNECTIONS {
            return Err(ConfigError::setting(
                format!("{setting}.max_connections"),
                format!("at most {MAX_CONNECTIONS} (0: no limit)"),
            ));
        }
        let tls = if address.https {
            Some(load_tls(config, setting)?)
        } else {
            None
        };
        Ok(Self {
            config: config.clone(),
            authority: address.authority,
            tls,
            traffic: Arc::default(),
            probe: config.probe.as_ref().map(|p| Arc::new(ProbeWindow::new(p))),
            admin: Arc::default(),
            limit: (config.max_connections > 0)
                .then(|| Arc::new(Semaphore::new(config.max_connections))),
            retired: watch::Sender::new(false),
        })
    }

    /// For a reload that keeps this backend's settings: its TLS files read again, and when their contents
    /// changed (a renewed client certificate or CA under the same names), a state that uses them and goes
    /// on with this one's health, probe window, counters and connection places, with the settings whose
    /// files changed (`tls_cert`). `None` when nothing changed. A file that no longer loads is an error,
    /// as at start.
    pub fn renewed(&self, setting: &str) -> Result<Option<(Self, Vec<String>)>, ConfigError> {
        let Some(current) = &self.tls else {
            return Ok(None);
        };
        if self.config.tls_ca.is_none() && self.config.tls_cert.is_none() {
            return Ok(None);
        }
        let tls = load_tls(&self.config, setting)?;
        let changed: Vec<String> = tls
            .files
            .iter()
            .filter(|file| !current.files.contains(file))
            .map(|(name, _)| format!("{setting}.{name}"))
            .collect();
        if changed.is_empty() {
            return Ok(None);
        }
        let state = Self {
            config: self.config.clone(),
            authority: self.authority.clone(),
            tls: Some(tls),
            traffic: self.traffic.clone(),
            probe: self.probe.clone(),
            admin: self.admin.clone(),
            limit: self.limit.clone(),
            retired: watch::Sender::new(false),
        };
        Ok(Some((state, changed)))
    }

    /// Out of the configuration after a reload: its probe stops, workers drop their pools for it.
    pub fn retire(&self) {
        self.retired.send_replace(true);
    }

    /// Retired by a reload: workers drop their pools for it.
    pub fn is_retired(&self) -> bool {
        *self.retired.borrow()
    }

    /// Changes to `true` when the backend is retired, for the probe to stop.
    pub(crate) fn retirement(&self) -> watch::Receiver<bool> {
        self.retired.subscribe()
    }

    /// Its `name`, as routes, directors, errors and the statistics use it.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Whether requests may go to the backend: as the operator forced it, else false only while a probe
    /// says the backend is sick.
    pub fn is_healthy(&self) -> bool {
        match self.admin() {
            BackendAdmin::Sick => false,
            BackendAdmin::Healthy => true,
            BackendAdmin::Auto => self.probe.as_ref().is_none_or(|p| p.healthy.load(Relaxed)),
        }
    }

    /// Forces the backend sick or healthy whatever its probe says, or (`Auto`) hands its health back to
    /// the probe. The probe keeps polling meanwhile, so `Auto` goes back to a current verdict.
    pub fn set_admin(&self, admin: BackendAdmin) {
        self.admin.store(admin as u8, Relaxed);
    }

    /// What the operator forced, or `Auto`.
    pub fn admin(&self) -> BackendAdmin {
        match self.admin.load(Relaxed) {
            x if x == BackendAdmin::Sick as u8 => BackendAdmin::Sick,
            x if x == BackendAdmin::Healthy as u8 => BackendAdmin::Healthy,
            _ => BackendAdmin::Auto,
        }
    }

    /// For a reload that rebuilds a backend of the same name with other settings: the operator's forced
    /// state goes on in the new state (shared, so setting either sets both).
    pub fn keep_admin_of(mut self, previous: &BackendState) -> Self {
        self.admin = previous.admin.clone();
        self
    }

    /// Counts a request answered below 500.
    pub(crate) fn succeeded(&self) {
        let t = &self.traffic;
        t.requests.fetch_add(1, Relaxed);
        t.consecutive_failures.store(0, Relaxed);
        t.last_success_ms.store(lacquer_clock::now_ms(), Relaxed);
    }

    /// Counts a failed request (no connection, a timeout, a 5xx) and keeps `message` as the last error.
    pub(crate) fn failed(&self, message: String) {
        self.traffic.requests.fetch_add(1, Relaxed);
        self.body_failed(message);
    }

    /// Counts a response whose body broke off (reset, closed, cut short of its length) after its head
    /// was counted as a success: an error, not another request.
    pub(crate) fn body_failed(&self, message: String) {
        let t = &self.traffic;
        t.errors.fetch_add(1, Relaxed);
        t.consecutive_failures.fetch_add(1, Relaxed);
        *t.last_error.lock().expect("health mutex") = Some(LastError {
            at: lacquer_clock::now_ms() / 1000,
            message,
        });
    }

    /// Health, traffic and probe history as `GET /v1/backends` shows them; without a probe, health is
    /// judged from traffic (`unknown` before the first request, `failing` while the latest requests fail).
    pub fn view(&self) -> BackendView {
        let t = &self.traffic;
        let requests = t.requests.load(Relaxed);
        let consecutive_failures = t.consecutive_failures.load(Relaxed);
        let last_success_ms = t.last_success_ms.load(Relaxed);
        let probe = self.probe.as_deref().map(ProbeWindow::view);
        let admin = self.admin();
        let health = match (&probe, requests, consecutive_failures) {
            _ if admin == BackendAdmin::Sick => wire::BackendHealth::Sick,
            _ if admin == BackendAdmin::Healthy => wire::BackendHealth::Healthy,
            (Some(p), _, _) if p.healthy => wire::BackendHealth::Healthy,
            (Some(_), _, _) => wire::BackendHealth::Sick,
            (None, 0, _) => wire::BackendHealth::Unknown,
            (None, _, 0) => wire::BackendHealth::Healthy,
            (None, _, _) => wire::BackendHealth::Failing,
        };
        BackendView {
            name: self.name().to_owned(),
            address: self.authority.clone(),
            health,
            admin,
            requests,
            errors: t.errors.load(Relaxed),
            consecutive_failures,
            last_success: (last_success_ms > 0).then_some(last_success_ms / 1000),
            last_error: t.last_error.lock().expect("health mutex").clone(),
            probe,
            connections: t.connections.load(Relaxed),
            streams_reset: t.streams_reset.load(Relaxed),
            responses: t.responses.view(),
            latency: t.latency.view(),
        }
    }

    /// Counts a response head from the backend, `took` after the request was sent.
    pub(crate) fn answered(&self, status: http::StatusCode, took: Duration) {
        self.traffic.responses.count(status);
        self.traffic.latency.ttfb.observe(took);
    }

    /// Counts a response body read to its end, `took` after the request was sent.
    pub(crate) fn body_ended(&self, took: Duration) {
        self.traffic.latency.total.observe(took);
    }

    /// Counts a connection opened to the backend (a pool's, an upgrade's; not a probe's).
    pub(crate) fn connection_opened(&self) {
        self.traffic.connections.fetch_add(1, Relaxed);
    }

    /// Counts an HTTP/2 stream the backend reset, or cut off by its GOAWAY.
    pub(crate) fn stream_reset(&self) {
        self.traffic.streams_reset.fetch_add(1, Relaxed);
    }
}

/// How requests to the backend have been going, judged from real traffic (every worker's). A 5xx answer
/// counts as a failure, as it does for `stale-if-error`.
#[derive(Debug, Default)]
struct Traffic {
    responses: tally::StatusCounts,
    latency: tally::Latency,
    connections: AtomicU64,
    streams_reset: AtomicU64,
    requests: AtomicU64,
    errors: AtomicU64,
    consecutive_failures: AtomicU64,
    last_success_ms: AtomicU64,
    last_error: Mutex<Option<LastError>>,
}

/// The last `window` polls as bits, newest lowest, as Varnish keeps them.
#[derive(Debug)]
pub struct ProbeWindow {
    window: u32,
    threshold: u32,
    bits: AtomicU64,
    healthy: AtomicBool,
    last: Mutex<Option<String>>,
}

impl ProbeWindow {
    fn new(p: &config::Probe) -> Self {
        let bits = mask(p.initial());
        Self {
            window: p.window,
            threshold: p.threshold,
            bits: AtomicU64::new(bits),
            healthy: AtomicBool::new(bits.count_ones() >= p.threshold),
            last: Mutex::new(None),
        }
    }

    /// Records a poll; returns the health before and after. Only the backend's probe task records.
    pub fn record(&self, good: bool, what: String) -> (bool, bool) {
        let bits = ((self.bits.load(Relaxed) << 1) | u64::from(good)) & mask(self.window);
        self.bits.store(bits, Relaxed);
        *self.last.lock().expect("probe mutex") = Some(what);
        let healthy = bits.count_ones() >= self.threshold;
        (self.healthy.swap(healthy, Relaxed), healthy)
    }

    fn view(&self) -> ProbeView {
        let bits = self.bits.load(Relaxed);
        ProbeView {
            healthy: self.healthy.load(Relaxed),
            good: bits.count_ones(),
            window: self.window,
            threshold: self.threshold,
            // Oldest first, as varnishadm backend.list -p prints it.
            history: (0..self.window)
                .rev()
                .map(|i| if bits >> i & 1 == 1 { 'H' } else { '-' })
                .collect(),
            last: self.last.lock().expect("probe mutex").clone(),
        }
    }
}

fn mask(n: u32) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn backend(address: &str, more: impl FnOnce(&mut config::Backend)) -> config::Backend {
        let mut b = config::Backend {
            address: Some(address.into()),
            ..Default::default()
        };
        more(&mut b);
        b
    }

    fn error(b: &config::Backend) -> String {
        BackendState::new(b, "backend[1]").unwrap_err().to_string()
    }

    /// A self-signed certificate and its key in `dir` as `<stem>.pem` and `<stem>.key`.
    fn identity(dir: &std::path::Path, stem: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["lacquer".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let (c, k) = (
            dir.join(format!("{stem}.pem")),
            dir.join(format!("{stem}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    #[test]
    fn the_protocol_must_fit_the_scheme() {
        let h2 = |b: &mut config::Backend| b.protocol = config::Protocol::H2;
        let h2c = |b: &mut config::Backend| b.protocol = config::Protocol::H2c;
        for address in ["http://origin:8080", "origin:8080"] {
            let e = error(&backend(address, h2));
            assert!(e.starts_with("backend[1].protocol:"), "{e}");
            assert!(e.contains("https://"), "{e}");
            assert!(BackendState::new(&backend(address, h2c), "backend").is_ok());
        }
        let e = error(&backend("https://origin", h2c));
        assert!(e.starts_with("backend[1].protocol:"), "{e}");
        let e = error(&backend("http://origin", |b| {
            b.h2_ping_timeout = Duration::ZERO;
        }));
        assert!(e.starts_with("backend[1].h2_ping_timeout:"), "{e}");
    }

    #[test]
    fn a_client_certificate_needs_its_key_and_tls() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = identity(dir.path(), "client");
        let e = error(&backend("https://origin", |b| {
            b.tls_cert = Some(cert.clone())
        }));
        assert!(e.starts_with("backend[1].tls_key: required"), "{e}");
        let e = error(&backend("https://origin", |b| {
            b.tls_key = Some(key.clone())
        }));
        assert!(e.starts_with("backend[1].tls_cert: required"), "{e}");
        let e = error(&backend("http://origin", |b| {
            b.tls_cert = Some(cert.clone());
            b.tls_key = Some(key.clone());
        }));
        assert!(
            e.starts_with("backend[1].tls_cert: only for https://"),
            "{e}"
        );

        let (_, other_key) = identity(dir.path(), "other");
        let e = error(&backend("https://origin", |b| {
            b.tls_cert = Some(cert.clone());
            b.tls_key = Some(other_key.clone());
        }));
        assert!(e.starts_with("backend[1].tls_key:"), "{e}");
        assert!(e.contains("other.key"), "{e}");
        std::fs::write(&other_key, "not a key").unwrap();
        let e = error(&backend("https://origin", |b| {
            b.tls_cert = Some(cert.clone());
            b.tls_key = Some(other_key.clone());
        }));
        assert!(
            e.starts_with("backend[1].tls_key:") && e.contains("other.key"),
            "{e}"
        );
        let e = error(&backend("https://origin", |b| {
            b.tls_cert = Some(dir.path().join("missing.pem"));
            b.tls_key = Some(key.clone());
        }));
        assert!(e.starts_with("backend[1].tls_cert: cannot read"), "{e}");
        assert!(e.contains("missing.pem"), "{e}");
    }

    #[test]
    fn a_renewed_certificate_renews_the_state_and_keeps_its_health() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = identity(dir.path(), "client");
        let b = backend("https://origin", |b| {
            b.tls_cert = Some(cert.clone());
            b.tls_key = Some(key.clone());
        });
        let state = BackendState::new(&b, "backend").unwrap();
        state.failed("refused".into());
        assert!(state.renewed("backend").unwrap().is_none(), "same files");

        identity(dir.path(), "client");
        let (renewed, changed) = state.renewed("backend").unwrap().expect("new contents");
        assert_eq!(changed, ["backend.tls_cert", "backend.tls_key"]);
        assert_eq!(renewed.view().errors, 1, "health goes on");
        assert!(!Arc::ptr_eq(
            &renewed.tls.as_ref().unwrap().config,
            &state.tls.as_ref().unwrap().config
        ));

        std::fs::write(&key, "garbage").unwrap();
        let e = state.renewed("backend").unwrap_err().to_string();
        assert!(e.starts_with("backend.tls_key:"), "{e}");
    }

    #[test]
    fn the_operator_overrides_the_probe_until_auto() {
        let b = backend("origin:80", |b| {
            b.probe = Some(config::Probe {
                window: 2,
                threshold: 2,
                initial: Some(2),
                ..Default::default()
            })
        });
        let state = BackendState::new(&b, "backend").unwrap();
        assert!(state.is_healthy());
        state.set_admin(BackendAdmin::Sick);
        assert!(!state.is_healthy());
        let view = state.view();
        assert_eq!(
            (view.health, view.admin),
            (wire::BackendHealth::Sick, BackendAdmin::Sick)
        );
        assert!(
            view.probe.unwrap().healthy,
            "the probe's own verdict is still shown"
        );

        let probe = state.probe.as_ref().unwrap();
        probe.record(false, "503".into());
        state.set_admin(BackendAdmin::Healthy);
        assert!(state.is_healthy(), "forced healthy ignores the probe");
        assert_eq!(state.view().health, wire::BackendHealth::Healthy);
        state.set_admin(BackendAdmin::Auto);
        assert!(!state.is_healthy(), "auto is the probe's verdict again");

        state.set_admin(BackendAdmin::Sick);
        let rebuilt = BackendState::new(&backend("origin:81", |_| {}), "backend")
            .unwrap()
            .keep_admin_of(&state);
        assert_eq!(
            rebuilt.admin(),
            BackendAdmin::Sick,
            "a drain outlives a reload"
        );
        assert!(!rebuilt.is_healthy());
    }

    #[test]
    fn the_window_decides_health() {
        let p = config::Probe {
            window: 4,
            threshold: 3,
            ..Default::default()
        };
        let w = ProbeWindow::new(&p);
        assert!(
            !w.healthy.load(Relaxed),
            "initial = threshold - 1: sick at start"
        );
        assert_eq!(w.view().history, "--HH");
        assert_eq!(w.record(true, "200".into()), (false, true));
        assert_eq!(w.record(false, "503".into()), (true, true));
        assert_eq!(w.view().history, "HHH-");
        assert_eq!(w.record(false, "refused".into()), (true, false));
        assert_eq!(w.view().good, 2);
        assert_eq!(w.view().last.as_deref(), Some("refused"));
        assert_eq!(w.record(true, "200".into()), (false, false));
        assert_eq!(
            w.record(true, "200".into()),
            (false, false),
            "the old failures still count"
        );
        assert_eq!(w.record(true, "200".into()), (false, true));
        let full = ProbeWindow::new(&config::Probe {
            window: 64,
            threshold: 64,
            initial: Some(64),
            ..Default::default()
        });
        assert!(full.healthy.load(Relaxed));
        assert_eq!(full.record(false, "x".into()), (true, false));
    }
}
