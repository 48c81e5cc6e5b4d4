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
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

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
    /// Two listeners' `acme` with other settings name the same domain: one certificate per name, and one
    /// challenge per name at a time.
    #[error("names {0:?}, as another listener's acme does with other settings: give both the same settings (they then share one certificate), or keep each name in one")]
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
    /// Failed orders in a row, kept across restarts (see [`Kept`]).
    failures: u32,
    /// An order runs now.
    ordering: bool,
}

/// What is kept beside a certificate of its orders, so that a restart (a crash loop too) keeps backing
/// off rather than ordering at once: the CA's rate limits count across restarts.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Kept {
    failures: u32,
    /// Unix seconds.
    last_attempt: u64,
    /// Why the last order failed, for the health check after a restart.
    last_error: Option<String>,
}

/// One certificate kept by ACME: its settings, what is held, and how renewal goes.
pub struct Managed {
    /// `configured`'s, in lower case.
    domains: Vec<String>,
    /// As configured: listeners with equal settings share this certificate.
    configured: lacquer_config::Acme,
    listeners: Vec<String>,
    file: PathBuf,
    /// [`Kept`], beside `file`.
    state_file: PathBuf,
    held: ArcSwapOption<Held>,
    progress: Mutex<Progress>,
    challenges: Arc<Challenges>,
    /// Orders asked for now, whatever the held certificate's age (`POST /v1/certificates/renew`): a
    /// count, so that asking while an order runs starts no other.
    asked: watch::Sender<u64>,
    /// Orders ended, so that one asked for can be waited on.
    ended: watch::Sender<u64>,
}

impl std::fmt::Debug for Managed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Managed")
            .field("domains", &self.domains)
            .field("directory", &self.configured.directory)
            .finish_non_exhaustive()
    }
}

/// After a failed order, the next waits this long, doubling up to [`MAX_BACKOFF`]: Let's Encrypt allows 5
/// failed validations per name per hour. Also the least time between two orders that succeeded, whatever
/// the certificate's life.
const FIRST_BACKOFF: Duration = Duration::from_secs(5 * 60);

const MAX_BACKOFF: Duration = Duration::from_secs(6 * 3600);

/// An order that has not ended in this long (a CA that accepts connections and then stalls) fails.
const ORDER_TIMEOUT: Duration = Duration::from_secs(5 * 60);

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
        let stem = format!("{}-{}", domains[0], directory_id(&configured.directory));
        Ok(Self {
            file: dir.join(format!("{stem}.pem")),
            state_file: dir.join(format!("{stem}.json")),
            domains,
            configured: configured.clone(),
            listeners: Vec::new(),
            held: ArcSwapOption::empty(),
            progress: Mutex::default(),
            challenges,
            asked: watch::channel(0).0,
            ended: watch::channel(0).0,
        })
    }

    /// The certificate to present, once one is held and until it expires (then the listener's `tls` files,
    /// if any, are presented instead).
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.held
            .load()
            .as_ref()
            .filter(|h| h.not_after > SystemTime::now())
            .map(|h| h.key.clone())
    }

    /// The TLS-ALPN-01 certificate for `name` (the client's SNI), while an order of this certificate waits
    /// on it; `None` otherwise, and the handshake fails.
    pub fn challenge(&self, name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let name = name?;
        if !self.answers_tls_alpn() || !self.domains.iter().any(|d| d.eq_ignore_ascii_case(name)) {
            return None;
        }
        self.challenges.tls_alpn_01(name)
    }

    /// Whether the listener offers ALPN `acme-tls/1` (TLS-ALPN-01).
    pub fn answers_tls_alpn(&self) -> bool {
        self.configured.challenge == AcmeChallenge::TlsAlpn01
    }

    /// The first domain, which names it in logs and metrics.
    pub fn name(&self) -> &str {
        &self.domains[0]
    }

    /// Reads the kept certificate back (installed if it is whole, covers the domains and has not expired),
    /// and how its last orders went.
    fn load(&self) {
        if let Ok(Some(bytes)) = stored::read(&self.state_file) {
            if let Ok(kept) = serde_json::from_slice::<Kept>(&bytes) {
                let mut progress = self.progress.lock().expect("progress");
                progress.failures = kept.failures;
                progress.last_error = kept.last_error;
                progress.last_attempt =
                    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(kept.last_attempt));
            }
        }
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

    /// When the next order is due, after `failures` failed ones in a row, the last of which ended at
    /// `last`: after a backoff from a failure; else two thirds through the held certificate's life (but
    /// not sooner than [`FIRST_BACKOFF`] after the last order); at once without a certificate.
    fn next_due(&self, failures: u32, last: Option<SystemTime>) -> SystemTime {
        let now = SystemTime::now();
        if failures > 0 {
            let backoff = FIRST_BACKOFF
                .saturating_mul(1 << (failures - 1).min(16))
                .min(MAX_BACKOFF);
            return last.unwrap_or(now) + backoff;
        }
        match (&*self.held.load(), last) {
            (None, _) => now,
            (Some(held), None) => held.renew_at(),
            (Some(held), Some(last)) => held.renew_at().max(last + FIRST_BACKOFF),
        }
    }

    /// Orders until `stop`: whenever due, or asked.
    async fn keep(self: Arc<Self>, accounts: Arc<Accounts>, mut stop: watch::Receiver<bool>) {
        let mut asked = self.asked.subscribe();
        loop {
            let due = {
                let mut progress = self.progress.lock().expect("progress");
                let due = self.next_due(progress.failures, progress.last_attempt);
                progress.next_attempt = Some(due);
                due
            };
            // Slept in pieces, so that a wall clock set forward is noticed.
            loop {
                let wait = due
                    .duration_since(SystemTime::now())
                    .unwrap_or_default()
                    .min(RECHECK);
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {
                        if SystemTime::now() >= due {
                            break;
                        }
                    }
                    changed = asked.changed() => match changed {
                        Ok(()) => break,
                        Err(_) => return,
                    },
                    _ = stop.wait_for(|stopping| *stopping) => return,
                }
            }
            {
                // Under the lock `Acme::renew` asks under: an ask from now on waits for this order.
                let mut progress = self.progress.lock().expect("progress");
                progress.next_attempt = None;
                progress.ordering = true;
                asked.borrow_and_update();
            }
            let ordered = tokio::time::timeout(ORDER_TIMEOUT, order::obtain(&self, &accounts));
            let outcome = tokio::select! {
                outcome = ordered => outcome.unwrap_or(Err(order::OrderError::TimedOut(ORDER_TIMEOUT))),
                _ = stop.wait_for(|stopping| *stopping) => return,
            };
            let kept = self.ended_with(outcome);
            let bytes = serde_json::to_vec(&kept).expect("the state serializes");
            if let Err(e) = stored::write_async(self.state_file.clone(), bytes).await {
                tracing::warn!(file = %self.state_file.display(), error = %e, "cannot keep the ACME order state");
            }
            self.ended.send_modify(|n| *n += 1);
        }
    }

    /// Records how an order ended, installs what it obtained, and says so in the log.
    fn ended_with(&self, outcome: Result<Held, order::OrderError>) -> Kept {
        let now = SystemTime::now();
        let mut progress = self.progress.lock().expect("progress");
        progress.ordering = false;
        progress.last_attempt = Some(now);
        match outcome {
            Ok(held) => {
                progress.failures = 0;
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
                progress.failures += 1;
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
        Kept {
            failures: progress.failures,
            last_error: progress.last_error.clone(),
            last_attempt: now
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
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
            directory: self.configured.directory.clone(),
            challenge: match self.configured.challenge {
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
    dir: PathBuf,
    /// Why nothing can be kept in `dir`, found at start: every restart then orders anew.
    unkept: Mutex<Option<String>>,
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
                    let shared = made
                        .domains
                        .iter()
                        .find(|d| certificates.iter().any(|c| c.domains.contains(d)));
                    if let Some(domain) = shared {
                        return Err((n, SettingError::Conflict(domain.clone())));
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
            accounts: Arc::new(Accounts::new(dir.clone())),
            dir,
            unkept: Mutex::new(None),
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
            .any(|c| c.configured.challenge == AcmeChallenge::Http01)
    }

    /// The challenges the proxy answers (HTTP-01).
    pub fn challenges(&self) -> &Arc<Challenges> {
        &self.challenges
    }

    /// Reads the kept certificates back, before the listeners accept: a restart serves at once. Checks
    /// that new ones can be kept: without that, every restart orders again, into the CA's rate limits.
    pub fn load(&self) {
        if let Err(e) = stored::writable(&self.dir) {
            let why = format!(
                "cannot keep certificates in {}: {e}; each start orders them anew",
                self.dir.display()
            );
            tracing::error!("acme: {why}");
            *self.unkept.lock().expect("unkept") = Some(why);
        }
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

    /// Orders every certificate now, whatever their age (an order already running counts), and waits up to
    /// `timeout` for the orders to end.
    pub async fn renew(&self, timeout: Duration) -> Vec<CertificateView> {
        let waits: Vec<_> = self
            .certificates
            .iter()
            .map(|c| {
                let mut ended = c.ended.subscribe();
                let before = *ended.borrow_and_update();
                let progress = c.progress.lock().expect("progress");
                if !progress.ordering {
                    c.asked.send_modify(|n| *n += 1);
                }
                drop(progress);
                async move {
                    let _ = ended.wait_for(|n| *n > before).await;
                }
            })
            .collect();
        let _ = tokio::time::timeout(timeout, futures_util::future::join_all(waits)).await;
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
        let unkept = self.unkept.lock().expect("unkept").clone();
        unkept
            .map(|why| format!("acme: {why}"))
            .into_iter()
            .chain(self.certificates.iter().filter_map(|c| c.problem(now)))
            .collect()
    }
}

/// What names a directory in file names: the first 6 bytes of its URL's SHA-256, in hexadecimal. A
/// certificate from Let's Encrypt's staging directory is never read back for its production one.
fn directory_id(directory: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, directory.as_bytes());
    hex(&digest.as_ref()[..6])
}

/// `bytes` in lower-case hexadecimal.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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

#[cfg(test)]
mod tests;
