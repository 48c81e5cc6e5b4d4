//! TLS to origins (`https://` backends): rustls, trusting the system's roots or a configured CA file, the
//! origin's name checked against its certificate.

use std::{path::Path, sync::Arc};

use rustls::{
    crypto::ring,
    pki_types::{pem::PemObject, CertificateDer},
    ClientConfig, RootCertStore,
};

/// The roots in a PEM file; an error names the file.
fn trusting(ca: &Path) -> Result<RootCertStore, String> {
    let certs = CertificateDer::pem_file_iter(ca)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read {}: {e}", ca.display()))?;
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(format!("{} holds no CA certificate", ca.display()));
    }
    Ok(roots)
}

/// A client for one backend: `ca` when given, else the system's roots.
pub fn client_config(ca: Option<&Path>) -> Result<Arc<ClientConfig>, String> {
    let roots = match ca {
        Some(ca) => trusting(ca)?,
        None => {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = RootCertStore::empty();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(format!(
                    "no system CA certificates (install ca-certificates, or set tls_ca): {:?}",
                    found.errors
                ));
            }
            roots
        }
    };
    // No ALPN here: the connector offers `http/1.1` itself (and refuses a configuration that has some).
    let config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// A client configuration that trusts nothing: what an `http://` backend's connector carries and never
/// uses, and what an `https://` backend without any roots fails with.
pub fn trusting_nothing() -> Arc<ClientConfig> {
    Arc::new(
        ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(RootCertStore::empty())
            .with_no_client_auth(),
    )
}
