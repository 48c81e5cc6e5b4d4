//! A test certificate authority, and clients that speak TLS (with SNI and ALPN) and HTTP/2 to the daemon.

use std::{net::SocketAddr, path::Path, sync::Arc};

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::{
    pki_types::{CertificateDer, ServerName},
    ClientConfig, RootCertStore,
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
};
use tokio_rustls::{client::TlsStream, TlsConnector};

use crate::client::Reply;

pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

impl TestCa {
    pub fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "Lacquer test CA");
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Self { issuer }
    }

    /// `params` signed by this CA for `key`.
    pub fn sign(&self, params: CertificateParams, key: &KeyPair) -> rcgen::Certificate {
        params.signed_by(key, &self.issuer).unwrap()
    }

    /// A leaf certificate for `names` signed by this CA, and its key.
    fn leaf(&self, names: &[&str]) -> (rcgen::Certificate, KeyPair) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &self.issuer)
            .unwrap();
        (cert, key)
    }

    /// Writes `<stem>.pem` (leaf, then this CA) and `<stem>.key` for `names` into `dir`; returns the paths.
    pub fn issue(&self, dir: &Path, stem: &str, names: &[&str]) -> (String, String) {
        let (cert, key) = self.leaf(names);
        let cert_path = dir.join(format!("{stem}.pem"));
        let key_path = dir.join(format!("{stem}.key"));
        std::fs::write(&cert_path, cert.pem() + &self.issuer.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (
            cert_path.display().to_string(),
            key_path.display().to_string(),
        )
    }

    /// The CA's certificate as PEM, for a client to trust.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A TLS server in front of `plain` (a test origin) presenting a certificate for `names`; returns its
    /// address. Bytes are copied both ways, so the origin sees what the TLS client sent.
    pub async fn front(&self, names: &[&str], plain: SocketAddr) -> SocketAddr {
        let (cert, key) = self.leaf(names);
        let key = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Ok(mut origin) = TcpStream::connect(plain).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut origin).await;
                });
            }
        });
        addr
    }

    /// A client configuration that trusts only this CA and offers `alpn`.
    pub fn client(&self, alpn: &[&str]) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(self.issuer.der().clone()).unwrap();
        let mut config =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
        Arc::new(config)
    }
}

/// Connects and completes a TLS handshake asking for `sni`; the error is the handshake's, as text.
pub async fn connect(
    addr: SocketAddr,
    sni: &str,
    config: Arc<ClientConfig>,
) -> Result<TlsStream<TcpStream>, String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from(sni.to_owned()).map_err(|e| e.to_string())?;
    TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())
}

/// The protocol ALPN settled on, and the names in the certificate the server presented.
pub fn negotiated(tls: &TlsStream<TcpStream>) -> (Option<String>, Vec<CertificateDer<'static>>) {
    let conn = tls.get_ref().1;
    let alpn = conn
        .alpn_protocol()
        .map(|p| String::from_utf8_lossy(p).into_owned());
    let certs = conn.peer_certificates().unwrap_or_default().to_vec();
    (alpn, certs)
}

/// One GET over HTTP/2 on `io` for `uri` (absolute: its authority is sent as `:authority`).
pub async fn h2_get<IO>(io: IO, uri: &str) -> Result<Reply, String>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let req = Request::builder()
        .uri(uri)
        .body(Full::new(Bytes::new()))
        .unwrap();
    send_h2(io, req).await
}

/// One request over HTTP/1.1 on `io`.
pub async fn h1_request<IO>(
    io: IO,
    method: Method,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Reply, String>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", host);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    send_h1(io, req.body(Full::new(Bytes::new())).unwrap()).await
}

async fn collect(resp: http::Response<hyper::body::Incoming>) -> Result<Reply, String> {
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok(Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

/// How a test client reaches the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// HTTP/1.1 over TCP.
    Http1,
    /// Cleartext HTTP/2 by prior knowledge.
    H2c,
    /// HTTP/2 over TLS, chosen by ALPN.
    TlsH2,
}

impl Transport {
    pub const ALL: [Transport; 3] = [Transport::Http1, Transport::H2c, Transport::TlsH2];

    /// Sends `req` on a new connection to `addr` (for TLS, trusting `ca` and asking for `sni`): its target
    /// is sent in origin form with its `Host` on HTTP/1.1, as `:authority` on HTTP/2.
    pub async fn send(
        self,
        addr: SocketAddr,
        ca: &TestCa,
        sni: &str,
        req: Request<Full<Bytes>>,
    ) -> Result<Reply, String> {
        let fut = async {
            match self {
                Transport::Http1 => {
                    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
                    send_h1(tcp, req).await
                }
                Transport::H2c => {
                    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
                    send_h2(tcp, req).await
                }
                Transport::TlsH2 => {
                    let tls = connect(addr, sni, ca.client(&["h2"])).await?;
                    send_h2(tls, req).await
                }
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(30), fut)
            .await
            .map_err(|_| "timed out".to_string())?
    }
}

async fn send_h1<IO>(io: IO, mut req: Request<Full<Bytes>>) -> Result<Reply, String>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut send, conn) = http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    if let Some(authority) = req.uri().authority().cloned() {
        if !req.headers().contains_key(http::header::HOST) {
            req.headers_mut()
                .insert(http::header::HOST, authority.as_str().parse().unwrap());
        }
        let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
        *req.uri_mut() = target.parse().unwrap();
    }
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    collect(resp).await
}

async fn send_h2<IO>(io: IO, req: Request<Full<Bytes>>) -> Result<Reply, String>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut send, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    collect(resp).await
}
