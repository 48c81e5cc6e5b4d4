//! A certificate as held: its chain and key ready for rustls, and what renewal and the admin API read.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use rustls::{
    crypto::ring,
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName},
    sign::CertifiedKey,
};

pub(crate) struct Held {
    pub key: Arc<CertifiedKey>,
    pub serial: String,
    pub issuer: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl Held {
    /// A chain (leaf first) and its key, both PEM in `pem`, checked: the key matches the leaf, and the leaf
    /// is valid for every one of `domains`.
    pub fn from_pem(pem: &[u8], domains: &[String]) -> Result<Self, String> {
        let chain = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("not PEM: {e}"))?;
        let leaf = chain.first().ok_or("holds no certificate")?.clone();
        let key = PrivateKeyDer::from_pem_slice(pem).map_err(|e| format!("no key: {e}"))?;
        let key = CertifiedKey::from_der(chain, key, &ring::default_provider())
            .map_err(|e| format!("the key does not fit the certificate: {e}"))?;
        let end_entity = webpki::EndEntityCert::try_from(&leaf)
            .map_err(|e| format!("not a certificate: {e}"))?;
        for domain in domains {
            let name = ServerName::try_from(domain.as_str()).map_err(|e| e.to_string())?;
            end_entity
                .verify_is_valid_for_subject_name(&name)
                .map_err(|_| format!("is not for {domain}"))?;
        }
        let (_, x509) = x509_parser::parse_x509_certificate(&leaf)
            .map_err(|e| format!("not a certificate: {e}"))?;
        let time = |t: &x509_parser::time::ASN1Time| {
            SystemTime::UNIX_EPOCH + Duration::from_secs(t.timestamp().max(0) as u64)
        };
        Ok(Self {
            key: Arc::new(key),
            serial: crate::hex(x509.raw_serial()),
            issuer: x509.issuer().to_string(),
            not_before: time(&x509.validity().not_before),
            not_after: time(&x509.validity().not_after),
        })
    }

    /// Two thirds through its life, as Let's Encrypt advises (30 days before a 90-day certificate ends,
    /// two before a 6-day one).
    pub fn renew_at(&self) -> SystemTime {
        let life = self
            .not_after
            .duration_since(self.not_before)
            .unwrap_or_default();
        self.not_before + life * 2 / 3
    }
}

/// `t` as RFC 3339, UTC, to the second.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
