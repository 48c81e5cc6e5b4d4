//! `GET /v1/certificates` and `POST /v1/certificates/renew`: the certificates lacquerd obtains by ACME.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Every certificate obtained by ACME, in the order of the listeners that first name them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CertificateList {
    pub certificates: Vec<CertificateView>,
}

/// One certificate kept by ACME: what is held, and how its renewal goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CertificateView {
    /// The names it is for, the first its subject.
    pub domains: Vec<String>,
    /// The CA's directory URL.
    pub directory: String,
    /// `http-01` or `tls-alpn-01`.
    pub challenge: String,
    /// The listeners that serve it (`listen[0]`).
    pub listeners: Vec<String>,
    /// Where it is kept (mode 0600): the chain, then its key.
    pub file: String,
    /// What is served now; none until the first certificate is obtained.
    pub held: Option<HeldCertificate>,
    /// Unix seconds of the next order: when the held one is two thirds through its life, or the retry
    /// after a failure; none while an order runs.
    pub next_attempt: Option<u64>,
    /// Orders that ended with a certificate, since start.
    pub orders_succeeded: u64,
    /// Orders that failed, since start.
    pub orders_failed: u64,
    /// The last order's failure, while no later order has succeeded.
    pub last_error: Option<String>,
    /// Unix seconds of the last order's end.
    pub last_attempt: Option<u64>,
}

/// The certificate a listener presents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HeldCertificate {
    /// Hexadecimal.
    pub serial: String,
    /// The issuer's distinguished name.
    pub issuer: String,
    /// Unix seconds.
    pub not_before: u64,
    /// Unix seconds.
    pub not_after: u64,
}
