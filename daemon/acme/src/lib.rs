//! Certificates by ACME (RFC 8555), as Let's Encrypt issues them, for lacquerd's listeners.
//!
//! Each `acme = { ... }` names one certificate ([`Managed`]): read back at start from the file beside the
//! store that keeps it, ordered when there is none, renewed two thirds through its life, and handed to the
//! listeners that serve it without a restart. A failed order keeps the certificate held (and retries,
//! backing off); counters, log lines and [`Acme::problems`] say so.
//!
//! The CA's challenges are answered by what serves clients: HTTP-01 by the proxy
//! ([`Challenges::http_01`]), TLS-ALPN-01 (RFC 8737) by the listener's certificate resolver
//! ([`Managed::challenge`]). Neither loosens caching: an answer is made here, never stored or forwarded.

#![warn(missing_docs)]

mod held;
mod order;
mod stored;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicUsize, Ordering::Relaxed},
        Arc, Mutex,
    },
    time::{Duration, SystemTime},
};

use arc_swap::ArcSwapOption;
use lacquer_admin::wire::{CertificateView, HeldCertificate};
use lacquer_config::AcmeChallenge;
use rustls::sign::CertifiedKey;
use tokio::sync::{watch, Notify};

use self::{held::Held, order::Accounts};

/// The ALPN protocol of TLS-ALPN-01 (RFC 8737 §6.2).
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// Where HTTP-01 asks (RFC 8555 §8.3).
pub const HTTP_01_PATH: &str = "/.well-known/acme-challenge/";

/// Why an `acme` setting cannot be used; [`SettingError::setting`] names the key under
/// `listen[n].acme`.
#[derive(Debug, thiserror::Error)]
pub enum SettingError {
    /// `domains` is empty.
    #[error("must name at least one domain")]
    NoDomains,
    /// A domain that is not a DNS name, or a wildcard.
    #[error("{0:?} is not a DNS name (a wildcard needs DNS-01, which lacquerd does not answer)")]
    Domain(String),
    /// The same domain twice.
    #[error("{0:?} is named twice")]
    DuplicateDomain(String),
    /// A contact that is not a `mailto:` URL.
    #[error("{0:?} is not a mailto: URL")]
    Contact(String),
    /// A directory that is not an `https://` URL (RFC 8555 §6.1).
    #[error("{0:?} is not an https:// URL")]
    Directory(String),
    /// `directory_ca` is missing or holds no PEM certificate.
    #[error("{0}")]
    DirectoryCa(String),
    /// Two listeners' `acme` share a first domain (which names the file) with other settings.
    #[error("names {0:?} first, as another listener's acme does with other settings; one file keeps one certificate: make them the same, or name another domain first")]
    Conflict(String),
}

impl SettingError {
    /// The key at fault, under `listen[n].acme`.
    pub fn setting(&self) -> &'static str {
        match self {
            Self::NoDomains | Self::Domain(_) | Self::DuplicateDomain(_) | Self::Conflict(_) => {
                "domains"
            }
            Self::Contact(_) => "contact",
            Self::Directory(_) => "directory",
            Self::DirectoryCa(_) => "directory_ca",
        }
    }
}

/// The challenges an order in progress waits on, by what the CA will ask.
#[derive(Debug, Default)]
pub struct Challenges {
    /// Key authorizations by token (HTTP-01).
    http: Mutex<HashMap<String, String>>,
    /// Challenge certificates by domain (TLS-ALPN-01).
    tls_alpn: Mutex<HashMap<String, Arc<CertifiedKey>>>,
    /// Entries in both: the proxy looks no further while it is 0.
    waiting: AtomicUsize,
}

impl Challenges {
    /// The body to answer `method` `path` with: the key authorization of a token an order waits on
    /// (RFC 8555 §8.3). `None` for anything else, which goes on as any request does.
    pub fn http_01(&self, method: &http::Method, path: &str) -> Option<String> {
        if self.waiting.load(Relaxed) == 0
            || !(method == http::Method::GET || method == http::Method::HEAD)
        {
            return None;
        }
        let token = path.strip_prefix(HTTP_01_PATH)?;
        self.http.lock().expect("challenges").get(token).cloned()
    }

    /// The TLS-ALPN-01 certificate for `name`, while an order waits on it.
    fn tls_alpn_01(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        if self.waiting.load(Relaxed) == 0 {
            return None;
        }
        let name = name.to_ascii_lowercase();
        self.tls_alpn
            .lock()
            .expect("challenges")
            .get(&name)
            .cloned()
    }
}

/// How an order goes, for the admin API and the health check.
#[derive(Debug, Default)]
struct Progress {
    next_attempt: Option<SystemTime>,
    last_attempt: Option<SystemTime>,
    last_error: Option<String>,
    succeeded: u64,
    failed: u64,
}

/// One certificate kept by ACME: its settings, what is held, and how renewal goes.
pub struct Managed {
    domains: Vec<String>,
    contact: Vec<String>,
    directory: String,
    challenge: AcmeChallenge,
    directory_ca: Option<PathBuf>,
    /// As configured: listeners with equal settings share this certificate.
    configured: lacquer_config::Acme,
    listeners: Vec<String>,
    file: PathBuf,
    held: ArcSwapOption<Held>,
    progress: Mutex<Progress>,
    challenges: Arc<Challenges>,
    /// An order now, whatever the held certificate's age (`POST /v1/certificates/renew`).
    wake: Notify,
    /// Orders ended, so that one asked for can be waited on.
    ended: watch::Sender<u64>,
}

impl std::fmt::Debug for Managed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Managed")
            .field("domains", &self.domains)
            .field("directory", &self.directory)
            .finish_non_exhaustive()
    }
}

/// After a failed order, the next waits this long, doubling up to [`MAX_BACKOFF`]: Let's Encrypt allows 5
/// failed validations per name per hour.
const FIRST_BACKOFF: Duration = Duration::from_secs(5 * 60);
const MAX_BACKOFF: Duration = Duration::from_secs(6 * 3600);

/// A sleep until the next order is cut into pieces this long, so that a wall clock set forward (or a
/// machine woken from suspend) is noticed.
const RECHECK: Duration = Duration::from_secs(3600);

/// The health check warns when less than this is left, or a sixth of the certificate's life for short-lived
/// ones (renewal is due at a third): past it, renewals have been failing.
const WARN_BEFORE: Duration = Duration::from_secs(14 * 24 * 3600);

impl Managed {
    fn new(
        configured: &lacquer_config::Acme,
        dir: &Path,
        challenges: Arc<Challenges>,
    ) -> Result<Self, SettingError> {
        if configured.domains.is_empty() {
            return Err(SettingError::NoDomains);
        }
        let mut domains: Vec<String> = Vec::new();
        for domain in &configured.domains {
            let lower = domain.to_ascii_lowercase();
            let valid = !lower.contains('*')
                && lower.parse::<std::net::IpAddr>().is_err()
                && rustls::pki_types::DnsName::try_from(lower.as_str()).is_ok();
            if !valid {
                return Err(SettingError::Domain(domain.clone()));
            }
            if domains.contains(&lower) {
                return Err(SettingError::DuplicateDomain(domain.clone()));
            }
            domains.push(lower);
        }
        for contact in &configured.contact {
            let address = contact.strip_prefix("mailto:").unwrap_or_default();
            if !address.contains('@') || address.contains(char::is_whitespace) {
                return Err(SettingError::Contact(contact.clone()));
            }
        }
        let https = configured
            .directory
            .parse::<http::Uri>()
            .is_ok_and(|u| u.scheme_str() == Some("https") && u.host().is_some());
        if !https {
            return Err(SettingError::Directory(configured.directory.clone()));
        }
        if let Some(ca) = &configured.directory_ca {
            use rustls::pki_types::{pem::PemObject, CertificateDer};
            CertificateDer::from_pem_file(ca).map_err(|e| {
                SettingError::DirectoryCa(format!("cannot read {}: {e}", ca.display()))
            })?;
        }
        Ok(Self {
            file: dir.join(format!("{}.pem", domains[0])),
            domains,
            contact: configured.contact.clone(),
            directory: configured.directory.clone(),
            challenge: configured.challenge,
            directory_ca: configured.directory_ca.clone(),
            configured: configured.clone(),
            listeners: Vec::new(),
            held: ArcSwapOption::empty(),
            progress: Mutex::default(),
            challenges,
            wake: Notify::new(),
            ended: watch::channel(0).0,
        })
    }

    /// The certificate to present, once one is held.
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.held.load().as_ref().map(|h| h.key.clone())
    }

    /// The TLS-ALPN-01 certificate for `name` (the client's SNI), while an order of this certificate waits
    /// on it; `None` otherwise, and the handshake fails.
    pub fn challenge(&self, name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let name = name?;
        if self.challenge != AcmeChallenge::TlsAlpn01
            || !self.domains.iter().any(|d| d.eq_ignore_ascii_case(name))
        {
            return None;
        }
        self.challenges.tls_alpn_01(name)
    }

    /// Whether the listener offers ALPN `acme-tls/1` (TLS-ALPN-01).
    pub fn answers_tls_alpn(&self) -> bool {
        self.challenge == AcmeChallenge::TlsAlpn01
    }

    /// The first domain, which names it in logs and metrics.
    pub fn name(&self) -> &str {
        &self.domains[0]
    }

    /// Reads the kept certificate back: installed if it is whole, covers the domains and has not expired.
    fn load(&self) {
        match stored::read(&self.file) {
            Ok(None) => {}
            Ok(Some(pem)) => match Held::from_pem(&pem, &self.domains) {
                Ok(held) if held.not_after <= SystemTime::now() => tracing::warn!(
                    certificate = self.name(),
                    file = %self.file.display(),
                    "the kept certificate has expired; ordering a new one"
                ),
                Ok(held) => {
                    tracing::info!(
                        certificate = self.name(),
                        serial = %held.serial,
                        expires = %held::rfc3339(held.not_after),
                        "certificate read back"
                    );
                    self.held.store(Some(Arc::new(held)));
                }
                Err(e) => tracing::warn!(
                    certificate = self.name(),
                    file = %self.file.display(),
                    error = %e,
                    "the kept certificate cannot be used; ordering a new one"
                ),
            },
            Err(e) => tracing::warn!(
                certificate = self.name(),
                file = %self.file.display(),
                error = %e,
                "cannot read the kept certificate; ordering a new one"
            ),
        }
    }

    /// When the next order is due: now without a certificate, two thirds through the held one's life,
    /// or after a backoff following `failures` failed orders in a row.
    fn due(&self, failures: u32) -> SystemTime {
        let now = SystemTime::now();
        if failures > 0 {
            let backoff = FIRST_BACKOFF
                .saturating_mul(1 << (failures - 1).min(16))
                .min(MAX_BACKOFF);
            return now + backoff;
        }
        match &*self.held.load() {
            None => now,
            Some(held) => held.renew_at(),
        }
    }

    /// Orders until `stop`: whenever due, or asked.
    async fn keep(self: Arc<Self>, accounts: Arc<Accounts>, mut stop: watch::Receiver<bool>) {
        let mut failures = 0;
        loop {
            let due = self.due(failures);
            self.progress.lock().expect("progress").next_attempt = Some(due);
            let wait = due
                .duration_since(SystemTime::now())
                .unwrap_or_default()
                .min(RECHECK);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {
                    if SystemTime::now() < due {
                        continue;
                    }
                }
                _ = self.wake.notified() => {}
                _ = stop.wait_for(|stopping| *stopping) => return,
            }
            self.progress.lock().expect("progress").next_attempt = None;
            let outcome = tokio::select! {
                outcome = order::obtain(&self, &accounts) => outcome,
                _ = stop.wait_for(|stopping| *stopping) => return,
            };
            let mut progress = self.progress.lock().expect("progress");
            progress.last_attempt = Some(SystemTime::now());
            match outcome {
                Ok(held) => {
                    failures = 0;
                    progress.succeeded += 1;
                    progress.last_error = None;
                    tracing::info!(
                        certificate = self.name(),
                        serial = %held.serial,
                        expires = %held::rfc3339(held.not_after),
                        "certificate obtained"
                    );
                    self.held.store(Some(Arc::new(held)));
                }
                Err(e) => {
                    let e = with_causes(&e);
                    failures += 1;
                    progress.failed += 1;
                    progress.last_error = Some(e.clone());
                    let serving = match &*self.held.load() {
                        Some(held) => format!(
                            "serving the held certificate, which expires {}",
                            held::rfc3339(held.not_after)
                        ),
                        None => "no certificate to serve yet".to_owned(),
                    };
                    tracing::warn!(
                        certificate = self.name(),
                        error = %e,
                        "certificate order failed; {serving}"
                    );
                }
            }
            drop(progress);
            self.ended.send_modify(|n| *n += 1);
        }
    }

    fn view(&self) -> CertificateView {
        let unix = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        };
        let progress = self.progress.lock().expect("progress");
        CertificateView {
            domains: self.domains.clone(),
            directory: self.directory.clone(),
            challenge: match self.challenge {
                AcmeChallenge::Http01 => "http-01",
                AcmeChallenge::TlsAlpn01 => "tls-alpn-01",
            }
            .to_owned(),
            listeners: self.listeners.clone(),
            file: self.file.display().to_string(),
            held: self.held.load().as_ref().map(|h| HeldCertificate {
                serial: h.serial.clone(),
                issuer: h.issuer.clone(),
                not_before: unix(h.not_before),
                not_after: unix(h.not_after),
            }),
            next_attempt: progress.next_attempt.map(unix),
            orders_succeeded: progress.succeeded,
            orders_failed: progress.failed,
            last_error: progress.last_error.clone(),
            last_attempt: progress.last_attempt.map(unix),
        }
    }

    /// What the health check should say of this certificate, if anything.
    fn problem(&self, now: SystemTime) -> Option<String> {
        let progress = self.progress.lock().expect("progress");
        let why = progress
            .last_error
            .as_deref()
            .map_or_else(String::new, |e| format!("; the last order failed: {e}"));
        match &*self.held.load() {
            None => progress
                .last_error
                .is_some()
                .then(|| format!("acme: no certificate for {} yet{why}", self.name())),
            Some(held) => {
                let left = held.not_after.duration_since(now).unwrap_or_default();
                let life = held
                    .not_after
                    .duration_since(held.not_before)
                    .unwrap_or_default();
                (left < WARN_BEFORE.min(life / 6)).then(|| {
                    format!(
                        "acme: the certificate for {} expires in {} h ({}){why}",
                        self.name(),
                        left.as_secs() / 3600,
                        held::rfc3339(held.not_after)
                    )
                })
            }
        }
    }
}

/// Every certificate lacquerd keeps by ACME, and the challenges their orders wait on.
#[derive(Debug)]
pub struct Acme {
    certificates: Vec<Arc<Managed>>,
    /// Which certificate each listener (by index) serves.
    by_listener: Vec<(usize, Arc<Managed>)>,
    challenges: Arc<Challenges>,
    accounts: Arc<Accounts>,
}

impl Acme {
    /// Checks every listener's `acme` (by `[[listen]]` index) and makes one certificate per distinct
    /// setting, kept in `dir` (created when the first is written). `Err` names the listener at fault.
    /// Reads nothing and starts nothing: building it is the validation (`--check`, a reload).
    pub fn new<'a>(
        dir: PathBuf,
        configured: impl IntoIterator<Item = (usize, &'a lacquer_config::Acme)>,
    ) -> Result<Self, (usize, SettingError)> {
        let challenges = Arc::new(Challenges::default());
        let mut certificates: Vec<Managed> = Vec::new();
        let mut by_listener = Vec::new();
        for (n, acme) in configured {
            let made = Managed::new(acme, &dir, challenges.clone()).map_err(|e| (n, e))?;
            let at = match certificates.iter().position(|c| c.configured == *acme) {
                Some(at) => at,
                None => {
                    if certificates.iter().any(|c| c.file == made.file) {
                        return Err((n, SettingError::Conflict(made.domains[0].clone())));
                    }
                    certificates.push(made);
                    certificates.len() - 1
                }
            };
            certificates[at].listeners.push(format!("listen[{n}]"));
            by_listener.push((n, at));
        }
        let certificates: Vec<Arc<Managed>> = certificates.into_iter().map(Arc::new).collect();
        Ok(Self {
            by_listener: by_listener
                .into_iter()
                .map(|(n, at)| (n, certificates[at].clone()))
                .collect(),
            certificates,
            challenges,
            accounts: Arc::new(Accounts::new(dir)),
        })
    }

    /// The certificate listener `n` serves, if it has `acme`.
    pub fn for_listener(&self, n: usize) -> Option<Arc<Managed>> {
        self.by_listener
            .iter()
            .find(|(at, _)| *at == n)
            .map(|(_, m)| m.clone())
    }

    /// Whether any certificate is validated by HTTP-01, which a plain listener answers.
    pub fn uses_http_01(&self) -> bool {
        self.certificates
            .iter()
            .any(|c| c.challenge == AcmeChallenge::Http01)
    }

    /// The challenges the proxy answers (HTTP-01).
    pub fn challenges(&self) -> &Arc<Challenges> {
        &self.challenges
    }

    /// Reads the kept certificates back, before the listeners accept: a restart serves at once.
    pub fn load(&self) {
        for certificate in &self.certificates {
            certificate.load();
        }
    }

    /// Starts keeping every certificate on `runtime` until `stop`: an order at once for one not held.
    pub fn start(&self, runtime: &tokio::runtime::Handle, stop: watch::Receiver<bool>) {
        for certificate in &self.certificates {
            runtime.spawn(
                certificate
                    .clone()
                    .keep(self.accounts.clone(), stop.clone()),
            );
        }
    }

    /// Orders every certificate now, whatever their age, and waits up to `timeout` for the orders to end.
    pub async fn renew(&self, timeout: Duration) -> Vec<CertificateView> {
        let waits: Vec<_> = self
            .certificates
            .iter()
            .map(|c| {
                let mut ended = c.ended.subscribe();
                let before = *ended.borrow_and_update();
                c.wake.notify_one();
                async move {
                    let _ = ended.wait_for(|n| *n > before).await;
                }
            })
            .collect();
        let _ = tokio::time::timeout(timeout, futures_join(waits)).await;
        self.views()
    }

    /// Every certificate, for `GET /v1/certificates`.
    pub fn views(&self) -> Vec<CertificateView> {
        self.certificates.iter().map(|c| c.view()).collect()
    }

    /// What the health check reports: a certificate close to expiry (less than 14 days left, or a sixth of
    /// its life) and why it was not renewed, or none obtained after an order failed.
    pub fn problems(&self) -> Vec<String> {
        let now = SystemTime::now();
        self.certificates
            .iter()
            .filter_map(|c| c.problem(now))
            .collect()
    }
}

/// `e` and what caused it, each once: a refused connection or a certificate the CA's server presented is
/// named, not only "client error (Connect)".
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

/// Waits for every future (few: one per certificate).
async fn futures_join(waits: Vec<impl std::future::Future<Output = ()>>) {
    for wait in waits {
        wait.await;
    }
}

#[cfg(test)]
mod tests;
