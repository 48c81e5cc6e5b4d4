//! One ACME order (RFC 8555 §7.4): the account (kept beside the store, one per directory), the challenges
//! answered while the CA checks them, a new key and its certificate.

use std::{collections::HashMap, path::PathBuf, sync::Arc, time::Duration};

use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, Identifier, NewAccount,
    NewOrder, OrderStatus, RetryPolicy,
};
use lacquer_config::AcmeChallenge;
use rustls::{
    pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer},
    sign::CertifiedKey,
};
use std::sync::atomic::Ordering::Relaxed;

use crate::{held::Held, stored, Challenges, Managed};

/// Why an order ended without a certificate.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OrderError {
    /// What the CA answered, or why it could not be reached.
    #[error("{0}")]
    Acme(#[from] instant_acme::Error),
    /// The CA found a challenge unanswered or wrong.
    #[error("the CA refused the order: {0}")]
    Refused(String),
    /// What the CA issued cannot be served.
    #[error("the issued certificate cannot be used: {0}")]
    Issued(String),
    /// An account's key cannot be kept or read.
    #[error("{0}")]
    Account(String),
    /// The order did not end in time (a CA that accepts connections and then stalls).
    #[error("no answer from the CA within {0:?}")]
    TimedOut(Duration),
    /// The TLS-ALPN-01 certificate cannot be made.
    #[error("cannot make the tls-alpn-01 certificate: {0}")]
    Challenge(String),
}

/// How long the CA may take to check the challenges, then to issue: Let's Encrypt takes seconds.
const CHECKING: Duration = Duration::from_secs(120);

/// Orders a certificate for `m`'s domains, answering its challenges meanwhile, and keeps it in its file.
pub(crate) async fn obtain(m: &Managed, accounts: &Accounts) -> Result<Held, OrderError> {
    let account = accounts.get(m).await?;
    let outcome = order(m, &account).await;
    if let Err(OrderError::Acme(instant_acme::Error::Api(problem))) = &outcome {
        if problem
            .r#type
            .as_deref()
            .is_some_and(|t| t.ends_with(":accountDoesNotExist"))
        {
            // The CA forgot the account (a test CA restarted, or it was deactivated): a new one next time.
            accounts.forget(m).await;
        }
    }
    let (chain, key) = outcome?;
    let pem = format!("{chain}{key}");
    let held = Held::from_pem(pem.as_bytes(), &m.domains).map_err(OrderError::Issued)?;
    if let Err(e) = stored::write_async(m.file.clone(), pem.into_bytes()).await {
        // Served all the same; a restart without it orders again.
        tracing::warn!(
            certificate = m.name(),
            file = %m.file.display(),
            error = %e,
            "cannot keep the new certificate; serving it from memory"
        );
    }
    Ok(held)
}

/// The order itself: the chain and the new key, both PEM.
async fn order(m: &Managed, account: &Account) -> Result<(String, String), OrderError> {
    let identifiers: Vec<Identifier> = m.domains.iter().cloned().map(Identifier::Dns).collect();
    let mut order = account.new_order(&NewOrder::new(&identifiers)).await?;
    let mut answering = Answering::new(&m.challenges);
    let kind = match m.configured.challenge {
        AcmeChallenge::Http01 => ChallengeType::Http01,
        AcmeChallenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
    };
    let mut authorizations = order.authorizations();
    while let Some(authorization) = authorizations.next().await {
        let mut authorization = authorization?;
        match authorization.status {
            AuthorizationStatus::Pending => {}
            AuthorizationStatus::Valid => continue,
            other => {
                return Err(OrderError::Refused(format!(
                    "{}: authorization {other:?}",
                    authorization.identifier()
                )))
            }
        }
        let domain = authorization.identifier().to_string();
        let mut challenge = authorization.challenge(kind.clone()).ok_or_else(|| {
            OrderError::Refused(format!("{domain}: the CA offers no {kind:?} challenge"))
        })?;
        let key_authorization = challenge.key_authorization();
        match m.configured.challenge {
            AcmeChallenge::Http01 => answering.http(
                challenge.token.clone(),
                key_authorization.as_str().to_owned(),
            ),
            AcmeChallenge::TlsAlpn01 => {
                let certificate =
                    tls_alpn_certificate(&domain, key_authorization.digest().as_ref())
                        .map_err(OrderError::Challenge)?;
                answering.tls_alpn(domain, certificate);
            }
        }
        challenge.set_ready().await?;
    }
    let retries = RetryPolicy::new().timeout(CHECKING);
    let status = order.poll_ready(&retries).await?;
    if status != OrderStatus::Ready {
        return Err(OrderError::Refused(why_invalid(&mut order).await));
    }
    let key = order.finalize().await?;
    let chain = order.poll_certificate(&retries).await?;
    Ok((chain, key))
}

/// What the CA said of each failed challenge.
async fn why_invalid(order: &mut instant_acme::Order) -> String {
    let mut why = Vec::new();
    let mut authorizations = order.authorizations();
    while let Some(Ok(authorization)) = authorizations.next().await {
        for challenge in &authorization.challenges {
            if let Some(problem) = &challenge.error {
                why.push(format!("{}: {problem}", authorization.identifier()));
            }
        }
    }
    if why.is_empty() {
        "the order is invalid".to_owned()
    } else {
        why.join("; ")
    }
}

/// The self-signed certificate TLS-ALPN-01 presents for `domain` (RFC 8737 §3): the domain alone, and the
/// SHA-256 of the key authorization in a critical `acmeIdentifier` extension.
fn tls_alpn_certificate(domain: &str, digest: &[u8]) -> Result<Arc<CertifiedKey>, String> {
    let mut params =
        rcgen::CertificateParams::new(vec![domain.to_owned()]).map_err(|e| e.to_string())?;
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest)];
    let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let certificate = params.self_signed(&key).map_err(|e| e.to_string())?;
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    // Not `CertifiedKey::from_der`: its check that the key fits parses the certificate with webpki, which
    // refuses the critical extension it does not know. rcgen made both from the one key.
    let signing =
        rustls::crypto::ring::sign::any_supported_type(&der).map_err(|e| e.to_string())?;
    Ok(Arc::new(CertifiedKey::new(
        vec![certificate.der().clone()],
        signing,
    )))
}

/// The challenges one order answers, withdrawn when it ends however it ends.
pub(crate) struct Answering<'a> {
    challenges: &'a Challenges,
    tokens: Vec<String>,
    domains: Vec<String>,
}

impl<'a> Answering<'a> {
    pub(crate) fn new(challenges: &'a Challenges) -> Self {
        Self {
            challenges,
            tokens: Vec::new(),
            domains: Vec::new(),
        }
    }

    pub(crate) fn http(&mut self, token: String, key_authorization: String) {
        let mut http = self.challenges.http.lock().expect("challenges");
        if http.insert(token.clone(), key_authorization).is_none() {
            self.challenges.waiting.fetch_add(1, Relaxed);
        }
        self.tokens.push(token);
    }

    fn tls_alpn(&mut self, domain: String, certificate: Arc<CertifiedKey>) {
        let mut tls_alpn = self.challenges.tls_alpn.lock().expect("challenges");
        if tls_alpn.insert(domain.clone(), certificate).is_none() {
            self.challenges.waiting.fetch_add(1, Relaxed);
        }
        self.domains.push(domain);
    }
}

impl Drop for Answering<'_> {
    fn drop(&mut self) {
        let mut http = self.challenges.http.lock().expect("challenges");
        for token in &self.tokens {
            if http.remove(token).is_some() {
                self.challenges.waiting.fetch_sub(1, Relaxed);
            }
        }
        drop(http);
        let mut tls_alpn = self.challenges.tls_alpn.lock().expect("challenges");
        for domain in &self.domains {
            if tls_alpn.remove(domain).is_some() {
                self.challenges.waiting.fetch_sub(1, Relaxed);
            }
        }
    }
}

/// The ACME accounts, one per directory (and the root it is reached with), each made once and kept in
/// `account-<SHA-256 of the directory URL, first 12 hex>.json` beside the certificates.
pub(crate) struct Accounts {
    dir: PathBuf,
    open: tokio::sync::Mutex<HashMap<(String, Option<PathBuf>), Account>>,
}

impl std::fmt::Debug for Accounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accounts")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Accounts {
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            open: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    fn file(&self, directory: &str) -> PathBuf {
        self.dir
            .join(format!("account-{}.json", crate::directory_id(directory)))
    }

    /// `m`'s account: the one open, else the one kept, else a new one (agreeing to the CA's terms, which
    /// configuring `acme` is).
    async fn get(&self, m: &Managed) -> Result<Account, OrderError> {
        let mut open = self.open.lock().await;
        let id = Self::id(m);
        if let Some(account) = open.get(&id) {
            return Ok(account.clone());
        }
        let builder = || match &m.configured.directory_ca {
            Some(ca) => Account::builder_with_root(ca),
            None => Account::builder(),
        };
        let file = self.file(&m.configured.directory);
        let kept = stored::read_async(file.clone())
            .await
            .map_err(|e| OrderError::Account(format!("cannot read {}: {e}", file.display())))?;
        let account = match kept {
            Some(bytes) => {
                let credentials: AccountCredentials = serde_json::from_slice(&bytes)
                    .map_err(|e| OrderError::Account(format!("{}: {e}", file.display())))?;
                builder()?.from_credentials(credentials).await?
            }
            None => {
                let contact: Vec<&str> = m.configured.contact.iter().map(String::as_str).collect();
                let (account, credentials) = builder()?
                    .create(
                        &NewAccount {
                            contact: &contact,
                            terms_of_service_agreed: true,
                            only_return_existing: false,
                        },
                        m.configured.directory.clone(),
                        None,
                    )
                    .await?;
                tracing::info!(directory = %m.configured.directory, id = account.id(), "ACME account created");
                let json = serde_json::to_vec(&credentials).expect("credentials serialize");
                // Used all the same, so that the next order does not make yet another account.
                if let Err(e) = stored::write_async(file.clone(), json).await {
                    tracing::warn!(file = %file.display(), error = %e, "cannot keep the ACME account's key; a restart makes another account");
                }
                account
            }
        };
        open.insert(id, account.clone());
        Ok(account)
    }

    /// Drops `m`'s account, open and kept: the CA no longer knows it.
    async fn forget(&self, m: &Managed) {
        let mut open = self.open.lock().await;
        open.remove(&Self::id(m));
        let _ = tokio::fs::remove_file(self.file(&m.configured.directory)).await;
    }

    /// What tells `m`'s account from others: its directory, and the root it is reached with.
    fn id(m: &Managed) -> (String, Option<PathBuf>) {
        (
            m.configured.directory.clone(),
            m.configured.directory_ca.clone(),
        )
    }
}
