//! TLS to origins (`https://` backends): rustls, trusting the system's roots or a configured CA file, the
//! origin's name checked against its certificate, and a client certificate for origins that ask for one.

use std::{path::Path, sync::Arc};

use rustls::{
    crypto::ring,
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    ClientConfig, RootCertStore,
};
use xxhash_rust::xxh3::xxh3_64;

/// Why a backend's TLS files cannot be used: the setting that names the file (`tls_ca`, `tls_cert`,
/// `tls_key`) and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct TlsError {
    /// `tls_ca`, `tls_cert` or `tls_key`.
    pub setting: &'static str,
    /// What is wrong, naming the file.
    pub message: String,
}

impl TlsError {
    fn new(setting: &'static str, message: String) -> Self {
        Self { setting, message }
    }
}

/// A backend's TLS client configuration, as built from its files.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// Without ALPN: each user offers its own protocols.
    pub config: Arc<ClientConfig>,
    /// Each file read (by the setting that names it) and a hash of its contents, so a reload can tell a
    /// renewed file under the same name.
    pub files: Vec<(&'static str, u64)>,
}

/// A backend's TLS files: the CAs to trust (the system's when `None`) and the client certificate and key
/// to present (none when `None`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Files<'a> {
    /// `tls_ca`.
    pub ca: Option<&'a Path>,
    /// `tls_cert` and `tls_key`.
    pub identity: Option<(&'a Path, &'a Path)>,
}

/// A client for one backend, from its files. No system roots is not an error (the file is not wrong):
/// `roots_missing` says so, and every connection fails its certificate check.
pub fn client_config(files: Files<'_>) -> Result<(Loaded, Option<String>), TlsError> {
    let mut read_files = Vec::new();
    let mut read = |setting: &'static str, path: &Path| {
        let bytes = std::fs::read(path)
            .map_err(|e| TlsError::new(setting, format!("cannot read {}: {e}", path.display())))?;
        read_files.push((setting, xxh3_64(&bytes)));
        Ok::<_, TlsError>(bytes)
    };
    let mut roots_missing = None;
    let roots = match files.ca {
        Some(ca) => trusting(ca, &read("tls_ca", ca)?)?,
        None => {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = RootCertStore::empty();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                roots_missing = Some(format!(
                    "no system CA certificates (install ca-certificates, or set tls_ca): {:?}",
                    found.errors
                ));
            }
            roots
        }
    };
    let builder = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots);
    // No ALPN here: the connectors and probes offer their protocols themselves (hyper-rustls refuses a
    // configuration that has some).
    let config = match files.identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = certificates(cert, &read("tls_cert", cert)?)?;
            let key_pem = read("tls_key", key)?;
            let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
                TlsError::new(
                    "tls_key",
                    format!("{} holds no usable private key: {e}", key.display()),
                )
            })?;
            builder.with_client_auth_cert(chain, private).map_err(|e| {
                TlsError::new(
                    "tls_key",
                    format!("{} cannot sign for {}: {e}", key.display(), cert.display()),
                )
            })?
        }
    };
    let loaded = Loaded {
        config: Arc::new(config),
        files: read_files,
    };
    Ok((loaded, roots_missing))
}

/// The roots in a PEM file; an error names the file.
fn trusting(ca: &Path, pem: &[u8]) -> Result<RootCertStore, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::new("tls_ca", format!("cannot read {}: {e}", ca.display())))?;
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(TlsError::new(
            "tls_ca",
            format!("{} holds no CA certificate", ca.display()),
        ));
    }
    Ok(roots)
}

/// The certificate chain in a PEM file, leaf first; an error names the file.
fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::new("tls_cert", format!("cannot read {}: {e}", path.display())))?;
    if chain.is_empty() {
        return Err(TlsError::new(
            "tls_cert",
            format!("{} holds no certificate", path.display()),
        ));
    }
    Ok(chain)
}

/// A client configuration that trusts nothing: what an `http://` backend's connector carries and never
/// uses.
pub fn trusting_nothing() -> Arc<ClientConfig> {
    Arc::new(
        ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(RootCertStore::empty())
            .with_no_client_auth(),
    )
}

/// `config` offering only `protocol` by ALPN, for the connections made without hyper-rustls (probes).
pub fn offering(config: &ClientConfig, protocol: &[u8]) -> Arc<ClientConfig> {
    let mut config = config.clone();
    config.alpn_protocols = vec![protocol.to_vec()];
    Arc::new(config)
}
