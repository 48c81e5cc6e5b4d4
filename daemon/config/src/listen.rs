//! `[[listen]]`: the client listeners.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

/// One client listener: where, how (TLS, PROXY protocol, HTTP/2, HTTP/3) and within which limits.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Listen {
    /// Default: `0.0.0.0:6081`.
    pub address: SocketAddr,
    /// Certificate chains and keys (PEM files). Any given: the listener speaks TLS only, and picks the
    /// certificate by the name the client asks for (SNI), the first one when none matches. Default: none.
    pub tls: Vec<Certificate>,
    /// Obtain and renew a certificate for this listener by ACME (RFC 8555), from Let's Encrypt by default:
    /// the listener then speaks TLS, with that certificate first and any `tls` files after it. Default:
    /// none.
    pub acme: Option<Acme>,
    /// Every connection must start with a PROXY protocol header (v1 or v2, as HAProxy's `send-proxy` and
    /// `send-proxy-v2` write), whose client address is then used everywhere; one without is closed.
    /// Default: false.
    pub proxy_protocol: bool,
    /// Offer HTTP/2: by ALPN on TLS, by prior knowledge (h2c) on plain connections. Default: true.
    pub http2: bool,
    /// Connections open at once on this listener; past it a connection gets `503`. 0: no limit.
    /// Default: 65536.
    pub max_connections: usize,
    /// Connections open at once from one client address (the PROXY protocol's, on listeners that expect
    /// it); past it a connection gets `503`. 0: no limit. Default: 4096, far above a browser's or a
    /// player's few, and a bound on what one address can hold (a port range's worth of idle connections
    /// is about 28 000). Behind a load balancer that sends no PROXY header every client is its address:
    /// raise it, or 0.
    pub max_connections_per_ip: usize,
    /// Time for a complete request head, counted from the connection's start or the end of the previous
    /// response, as Varnish's `timeout_idle`: slow senders (slowloris) and idle keep-alive HTTP/1.1
    /// connections are closed. It also bounds the TLS handshake and PROXY header. Default: 10 s.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// A connection with no request waiting for its response head and no byte moving either way for this
    /// long is closed: idle HTTP/2 connections, and clients that stopped reading. Default: 60 s.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Largest request head (HTTP/1.1) or header list (HTTP/2); larger gets `431`. Default: 32 KiB.
    pub max_header_size: ByteSize,
    /// Most header fields in a request (HTTP/1.1); more gets `431`. Default: 100.
    pub max_headers: usize,
    /// Largest request body sent on to a backend; larger gets `413`. Default: 100 MiB.
    pub max_request_body: ByteSize,
    /// Serve HTTP/3 too: bind UDP on the same address and port, with the same `tls` certificates (required)
    /// and ALPN `h3`. The listener's limits apply to it: `max_connections` and `max_connections_per_ip`
    /// (a QUIC connection over them is refused before its handshake), `header_read_timeout` (the handshake,
    /// and each request head), `idle_timeout` (QUIC's idle timeout, and a response stream the client stops
    /// reading), `max_header_size` (the header section) and `max_request_body`. Default: false.
    pub quic: bool,
    /// Accept TLS 1.3 early data (0-RTT) on resumed QUIC connections: a request that arrives before the
    /// handshake completes is served only if its method is safe (GET, HEAD, OPTIONS), others get `425 Too
    /// Early` and the client sends them again after the handshake. Early data can be replayed by an
    /// attacker. Default: false.
    pub quic_0rtt: bool,
    /// Requests one HTTP/3 connection may have open at once (QUIC's bidirectional stream limit).
    /// Default: 100.
    pub quic_max_streams: u32,
    /// QUIC handshakes in progress on one worker above which a new client must first prove it owns its
    /// address (a Retry round trip), so spoofed sources cannot make the listener work or send for them.
    /// 0: always. Default: 64.
    pub quic_retry_above: usize,
    /// How long a client may remember the HTTP/3 offer this listener's TCP responses advertise with
    /// `Alt-Svc` (its `ma`), when `quic` is on. 0: no `Alt-Svc`. Default: 24 h.
    #[serde(with = "humantime_serde")]
    pub alt_svc_max_age: Duration,
}

impl Default for Listen {
    fn default() -> Self {
        Self {
            address: SocketAddr::from(([0, 0, 0, 0], 6081)),
            tls: Vec::new(),
            acme: None,
            proxy_protocol: false,
            http2: true,
            max_connections: 65536,
            max_connections_per_ip: 4096,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_header_size: ByteSize::kib(32),
            max_headers: 100,
            max_request_body: ByteSize::mib(100),
            quic: false,
            quic_0rtt: false,
            quic_max_streams: 100,
            quic_retry_above: 64,
            alt_svc_max_age: Duration::from_secs(24 * 3600),
        }
    }
}

impl Listen {
    /// A listener on `address` with every other setting at its default: plain HTTP, what `--listen` makes.
    pub fn plain(address: SocketAddr) -> Self {
        Self {
            address,
            ..Self::default()
        }
    }
}

/// A certificate chain (leaf first) and its private key, both PEM.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Certificate {
    /// PEM chain, leaf first; read again on every reload, so a renewed file at the same path is served.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1, ECDSA or RSA) that must match the leaf.
    pub key: PathBuf,
}

/// `acme = { ... }` on a listener: one certificate for `domains`, obtained from `directory` and renewed
/// there.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Acme {
    /// The DNS names the certificate is for, the first its subject. Required. Wildcards need DNS-01, which
    /// lacquerd does not answer.
    pub domains: Vec<String>,
    /// The account's contact URLs (`mailto:ops@example.com`). Default: none.
    #[serde(default)]
    pub contact: Vec<String>,
    /// The CA's ACME directory (HTTPS). Default: Let's Encrypt's production directory,
    /// `https://acme-v02.api.letsencrypt.org/directory`.
    #[serde(default = "Acme::letsencrypt")]
    pub directory: String,
    /// How the CA checks that this machine answers for the names. Default: `http-01`.
    #[serde(default)]
    pub challenge: AcmeChallenge,
    /// A PEM file of the root the directory's own HTTPS certificate chains to, for a private or test CA.
    /// Default: none (the system's roots).
    #[serde(default)]
    pub directory_ca: Option<PathBuf>,
}

impl Acme {
    /// Let's Encrypt's production directory.
    pub const LETSENCRYPT: &'static str = "https://acme-v02.api.letsencrypt.org/directory";

    fn letsencrypt() -> String {
        Self::LETSENCRYPT.to_owned()
    }
}

/// The ACME challenge a listener answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum AcmeChallenge {
    /// The CA fetches `http://<domain>/.well-known/acme-challenge/<token>` on port 80: a plain listener
    /// (any, reached on port 80) answers it.
    #[default]
    #[serde(rename = "http-01")]
    Http01,
    /// The CA opens TLS to `<domain>` on port 443 asking for ALPN `acme-tls/1` (RFC 8737): this listener
    /// answers it, reached on port 443.
    #[serde(rename = "tls-alpn-01")]
    TlsAlpn01,
}
