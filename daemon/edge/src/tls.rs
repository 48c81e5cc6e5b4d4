//! TLS termination: certificates from PEM files, chosen per connection by SNI, with ALPN for HTTP/2; the
//! same certificates for QUIC (HTTP/3).

use std::{fmt, path::Path, sync::Arc};

use arc_swap::ArcSwap;
use rustls::{
    crypto::ring,
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
    ServerConfig,
};

use lacquer_acme::{Managed, ACME_TLS_ALPN};
use lacquer_config::Certificate;

/// Why a listener's certificates (or its QUIC settings, which depend on them) cannot be used; the message
/// names the file, [`TlsError::setting`] the setting.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate or key file is missing, unreadable or not PEM.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file, as configured.
        path: String,
        /// What reading or decoding it failed on.
        source: rustls::pki_types::pem::Error,
    },
    /// The `cert` file (named) is PEM but holds no certificate.
    #[error("{0} holds no certificate")]
    NoCertificate(String),
    /// The `key` file (named) is of an unsupported kind or does not match the chain's leaf.
    #[error("{0}: {1}")]
    Key(String, rustls::Error),
    /// `quic = true` on a listener without certificates: QUIC is always TLS.
    #[error("needs tls certificates on the listener (QUIC is always encrypted)")]
    QuicWithoutTls,
    /// `quic_max_streams = 0`: no request could ever be sent.
    #[error("must be at least 1")]
    NoStreams,
}

impl TlsError {
    /// The `[[listen]]` key at fault: `tls`, `quic` or `quic_max_streams`.
    pub fn setting(&self) -> &'static str {
        match self {
            Self::Read { .. } | Self::NoCertificate(_) | Self::Key(..) => "tls",
            Self::QuicWithoutTls => "quic",
            Self::NoStreams => "quic_max_streams",
        }
    }
}

/// A listener's certificates in the order configured: the first is the default.
#[derive(Debug)]
pub struct Certificates(Vec<Arc<CertifiedKey>>);

impl Certificates {
    /// Reads and checks every chain and key, so a bad file fails `--check` and a reload, not a handshake.
    pub fn load(configured: &[Certificate]) -> Result<Self, TlsError> {
        configured
            .iter()
            .map(load_one)
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// No certificate configured: the listener speaks plain HTTP.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The first certificate valid for `name` (wildcards included, as a client would check it), `obtained`
    /// (by ACME) before the files, else the first of them: a client without SNI, or asking for a name we
    /// do not have, gets the default and decides.
    fn select(
        &self,
        obtained: Option<Arc<CertifiedKey>>,
        name: Option<&str>,
    ) -> Option<Arc<CertifiedKey>> {
        let wanted = name.and_then(|n| ServerName::try_from(n).ok());
        let valid_for = |key: &CertifiedKey, name: &ServerName<'_>| {
            key.end_entity_cert()
                .ok()
                .and_then(|der| webpki::EndEntityCert::try_from(der).ok())
                .is_some_and(|cert| cert.verify_is_valid_for_subject_name(name).is_ok())
        };
        let mut candidates = obtained.iter().chain(&self.0);
        wanted
            .and_then(|name| candidates.clone().find(|key| valid_for(key, &name)))
            .or_else(|| candidates.next())
            .cloned()
    }
}

fn load_one(c: &Certificate) -> Result<Arc<CertifiedKey>, TlsError> {
    let read_err = |path: &Path| {
        let path = path.display().to_string();
        move |source| TlsError::Read { path, source }
    };
    let chain = CertificateDer::pem_file_iter(&c.cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(read_err(&c.cert))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate(c.cert.display().to_string()));
    }
    let key = PrivateKeyDer::from_pem_file(&c.key).map_err(read_err(&c.key))?;
    let key = CertifiedKey::from_der(chain, key, &ring::default_provider())
        .map_err(|e| TlsError::Key(c.key.display().to_string(), e))?;
    Ok(Arc::new(key))
}

/// Picks among the current certificates: the one obtained by ACME, if any, then the files (which a reload
/// swaps under running listeners); answers TLS-ALPN-01 (RFC 8737) while an order waits on it.
pub struct SniResolver {
    files: ArcSwap<Certificates>,
    acme: Option<Arc<Managed>>,
}

impl SniResolver {
    /// A resolver over `files` and `acme`'s certificate; `None` when there is neither, and the listener
    /// speaks plain HTTP.
    pub fn new(files: Certificates, acme: Option<Arc<Managed>>) -> Option<Self> {
        (!files.is_empty() || acme.is_some()).then(|| Self {
            files: ArcSwap::from_pointee(files),
            acme,
        })
    }

    /// Serves `files` from the next handshake on (a reload).
    pub fn replace_files(&self, files: Arc<Certificates>) {
        self.files.store(files);
    }

    /// The files now served: what a reload read.
    pub fn files(&self) -> Arc<Certificates> {
        self.files.load_full()
    }

    fn answers_tls_alpn(&self) -> bool {
        self.acme.as_ref().is_some_and(|a| a.answers_tls_alpn())
    }
}

impl fmt::Debug for SniResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SniResolver").finish_non_exhaustive()
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name();
        if let Some(acme) = &self.acme {
            // The CA's validation offers `acme-tls/1` alone; it gets the challenge's certificate or none.
            if hello
                .alpn()
                .is_some_and(|mut offered| offered.any(|p| p == ACME_TLS_ALPN))
            {
                return acme.challenge(name);
            }
        }
        let obtained = self.acme.as_ref().and_then(|a| a.current());
        self.files.load().select(obtained, name)
    }
}

/// The server side of a TLS listener: TLS 1.2 and 1.3 with ring (whose handshakes measured 15 % faster
/// than aws-lc's built without its assembly, in bench/edge.py's handshake test), session tickets for
/// resumption (keys rotated every 6 hours, as NGINX's `ssl_session_tickets` default), `h2` offered before
/// `http/1.1` when HTTP/2 is on.
/// With TLS-ALPN-01, `acme-tls/1` is offered last.
pub fn server_config(resolver: Arc<SniResolver>, http2: bool) -> Arc<ServerConfig> {
    let resolver_answers_tls_alpn = resolver.answers_tls_alpn();
    let mut config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.ticketer = ring::Ticketer::new().expect("the ticket key is generated");
    config.alpn_protocols = if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    // Chosen only by a client that offers nothing else: the CA's TLS-ALPN-01 validation.
    if resolver_answers_tls_alpn {
        config.alpn_protocols.push(ACME_TLS_ALPN.to_vec());
    }
    Arc::new(config)
}

/// TLS resumptions remembered for QUIC clients. Stateful resumption is what rustls requires for 0-RTT, and
/// it makes each ticket single-use across every worker (the cache is shared): an early-data flight replayed
/// to this process is refused. An entry is a few hundred bytes: a few MiB in all.
const QUIC_SESSIONS: usize = 16 * 1024;

/// The server side of a QUIC listener: TLS 1.3 only (QUIC requires it), the same certificates as the TCP
/// listener through the same resolver (a reload that swaps them applies to both), ALPN `h3`; early data
/// accepted only with `zero_rtt` (QUIC allows no limit other than none or all of it).
pub fn quic_server_config(resolver: Arc<SniResolver>, zero_rtt: bool) -> Arc<ServerConfig> {
    let mut config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("ring supports TLS 1.3")
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.session_storage = rustls::server::ServerSessionMemoryCache::new(QUIC_SESSIONS);
    config.alpn_protocols = vec![b"h3".to_vec()];
    config.max_early_data_size = if zero_rtt { u32::MAX } else { 0 };
    Arc::new(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issue(dir: &Path, stem: &str, names: &[&str]) -> Certificate {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let certified = rcgen::generate_simple_self_signed(names).unwrap();
        let cert = dir.join(format!("{stem}.pem"));
        let key = dir.join(format!("{stem}.key"));
        std::fs::write(&cert, certified.cert.pem()).unwrap();
        std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
        Certificate { cert, key }
    }

    fn leaf_names(key: &CertifiedKey) -> Vec<String> {
        let der = key.end_entity_cert().unwrap();
        let cert = webpki::EndEntityCert::try_from(der).unwrap();
        cert.valid_dns_names().map(str::to_owned).collect()
    }

    #[test]
    fn sni_selects_by_name_wildcards_included_and_falls_back_to_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let certs = Certificates::load(&[
            issue(dir.path(), "default", &["default.test"]),
            issue(dir.path(), "shop", &["shop.test", "www.shop.test"]),
            issue(dir.path(), "wild", &["*.cdn.test"]),
        ])
        .unwrap();
        let cases = [
            (Some("shop.test"), "shop.test"),
            (Some("WWW.shop.test"), "shop.test"),
            (Some("img.cdn.test"), "*.cdn.test"),
            (Some("a.b.cdn.test"), "default.test"),
            (Some("cdn.test"), "default.test"),
            (Some("other.test"), "default.test"),
            (None, "default.test"),
        ];
        for (sni, want) in cases {
            let got = certs.select(None, sni).unwrap();
            assert_eq!(leaf_names(&got)[0], want, "{sni:?}");
        }
    }

    #[test]
    fn bad_files_are_reported_with_their_path() {
        let dir = tempfile::tempdir().unwrap();
        let a = issue(dir.path(), "a", &["a.test"]);
        let b = issue(dir.path(), "b", &["b.test"]);
        let missing = Certificate {
            cert: dir.path().join("nope.pem"),
            key: a.key.clone(),
        };
        let e = Certificates::load(&[missing]).unwrap_err().to_string();
        assert!(
            e.starts_with("cannot read ") && e.contains("nope.pem"),
            "{e}"
        );
        let mismatched = Certificate {
            cert: a.cert.clone(),
            key: b.key.clone(),
        };
        let e = Certificates::load(&[mismatched]).unwrap_err().to_string();
        assert!(e.contains("b.key") && e.contains("match"), "{e}");
        let key_as_cert = Certificate {
            cert: a.key.clone(),
            key: a.key.clone(),
        };
        let e = Certificates::load(&[key_as_cert]).unwrap_err().to_string();
        assert!(e.contains("holds no certificate"), "{e}");
    }
}
