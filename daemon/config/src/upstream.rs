//! `[[backend]]` and `[[director]]`: the origins, their health probes, and how requests are spread over them.

use std::{path::PathBuf, time::Duration};

use serde::{Deserialize, Deserializer, Serialize};

/// One origin server.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Backend {
    /// What routes, directors and the statistics call it. Default: `default`.
    pub name: String,
    /// `host:port`, `http://host[:port]` or `https://host[:port]` (TLS to the origin, its name checked
    /// against the certificate). Required.
    pub address: Option<String>,
    /// For `https://` backends: a PEM file of the CAs to trust instead of the system's (a private CA).
    /// Default: the system's roots (`/etc/ssl/certs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<PathBuf>,
    /// For `https://` backends: a PEM file of the client certificate (and its chain) presented to an origin
    /// that asks for one (mutual TLS). Read again at every reload, so a renewed file takes effect; needs
    /// `tls_key`. Default: none (no certificate offered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of `tls_cert` (PKCS#8, PKCS#1 or SEC1). Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// What is spoken to the origin: `http1` (a keep-alive pool per worker thread), `h2` (HTTP/2 over TLS,
    /// ALPN `h2`; an `https://` address) or `h2c` (HTTP/2 with prior knowledge over plain TCP; an
    /// `http://` or bare address). HTTP/2 multiplexes every request of a worker thread on one connection.
    /// Default: `http1`.
    pub protocol: Protocol,
    /// HTTP/2 only: a PING is sent on a connection after this long without a frame from the origin, and
    /// the connection is dropped (its requests failing, later ones opening a new one) when the answer does
    /// not come within `h2_ping_timeout`: a dead origin or a silently dropped connection is found in
    /// seconds, not at the next request's `first_byte_timeout`. Default: 10 s.
    #[serde(with = "humantime_serde")]
    pub h2_ping_interval: Duration,
    /// HTTP/2 only: how long a PING's answer is waited for. Default: 5 s.
    #[serde(with = "humantime_serde")]
    pub h2_ping_timeout: Duration,
    /// Time to open a TCP connection, and to wait for a place under `max_connections`. Default: 3 s.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Time to the response head. Default: 60 s.
    #[serde(with = "humantime_serde")]
    pub first_byte_timeout: Duration,
    /// Longest silence while a body arrives. Default: 60 s.
    #[serde(with = "humantime_serde")]
    pub between_bytes_timeout: Duration,
    /// Requests in flight to this backend at once, across every worker, as Varnish's `.max_connections`:
    /// one more waits up to `connect_timeout` for a place, then fails as an unreachable backend would (503,
    /// or a stale object). It keeps a flood of misses or abandoned HTTP/2 streams from opening thousands of
    /// origin connections; with `protocol = "h2"` or `"h2c"` it bounds the streams open on the workers'
    /// connections together. 0: no limit. Default: 256.
    pub max_connections: usize,
    /// Idle keep-alive connections kept per worker thread (`http1` only). Default: 128.
    pub max_idle_connections: usize,
    /// How long an idle backend connection is kept. Default: 4 s, under the 5 s after which Node.js and
    /// Apache close idle connections, so a request is never sent on one the origin is closing.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// A health probe, as Varnish's; without one, health is judged from traffic and never stops requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe: Option<Probe>,
}

impl Default for Backend {
    fn default() -> Self {
        Self {
            name: "default".into(),
            address: None,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            protocol: Protocol::Http1,
            h2_ping_interval: Duration::from_secs(10),
            h2_ping_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(3),
            first_byte_timeout: Duration::from_secs(60),
            between_bytes_timeout: Duration::from_secs(60),
            max_connections: 256,
            max_idle_connections: 128,
            idle_timeout: Duration::from_secs(4),
            probe: None,
        }
    }
}

/// The protocol spoken to a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// HTTP/1.1, over TLS for `https://` addresses.
    Http1,
    /// HTTP/2 over TLS, agreed by ALPN.
    H2,
    /// HTTP/2 over plain TCP, with prior knowledge (RFC 9113 §3.3).
    H2c,
}

/// Polls a backend; it is healthy while at least `threshold` of the last `window` polls succeeded. A sick
/// backend gets no requests: directors skip it, and a route pointing at it serves stale objects or 503.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Probe {
    /// Path (and query) requested with `GET`. Default: `/`.
    pub url: String,
    /// Time between polls, the first made at start. Default: 5 s.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// A poll without a complete response head in this time fails. Default: 2 s.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// The status a good poll answers with; any other fails it. Default: 200.
    pub expected_status: u16,
    /// Polls remembered, at most 64. Default: 8.
    pub window: u32,
    /// Good polls in the window for the backend to be healthy. Default: 3.
    pub threshold: u32,
    /// Polls counted as good at start. Default: `threshold - 1`, as Varnish: sick until the first poll,
    /// made at once, succeeds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initial: Option<u32>,
}

impl Default for Probe {
    fn default() -> Self {
        Self {
            url: "/".into(),
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            expected_status: 200,
            window: 8,
            threshold: 3,
            initial: None,
        }
    }
}

impl Probe {
    /// Polls counted as good at start: `initial`, else `threshold - 1` (sick until the first good poll).
    pub fn initial(&self) -> u32 {
        self.initial.unwrap_or(self.threshold.saturating_sub(1))
    }
}

/// Spreads requests over several backends, skipping sick ones.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Director {
    /// What routes name as their `backend`; shares one namespace with the backends. Required.
    pub name: String,
    /// How a member is picked. Required.
    pub policy: DirectorPolicy,
    /// Names of `[[backend]]`s (not directors), at least one. Required.
    pub backends: Vec<String>,
}

/// How a director picks among its healthy members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DirectorPolicy {
    /// Each backend in turn.
    RoundRobin,
    /// Any backend, uniformly.
    Random,
    /// Consistent hashing of the cache key (Varnish's shard director): a URL always goes to the same
    /// backend, and a sick backend's URLs alone move.
    Hash,
}

/// `[backend]` (one table, as before several backends existed) or `[[backend]]` (an array of them), with
/// the errors of either kept (an untagged enum would replace them with "did not match any variant").
pub fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Backend>, D::Error> {
    struct Visitor;
    impl<'de> serde::de::Visitor<'de> for Visitor {
        type Value = Vec<Backend>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a [backend] table or [[backend]] tables")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            Backend::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(|b| vec![b])
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            Vec::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
        }
    }
    d.deserialize_any(Visitor)
}
