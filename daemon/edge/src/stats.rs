//! The edge's counters: connections and what ended them. They are part of the proxy's statistics
//! (`ProxyStats` in the wire crate documents each); `lacquer_proxy::stats` reads them into its snapshot.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counters and gauges of client connections.
#[derive(Debug, Default)]
pub struct EdgeStats {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections open now (a gauge).
    pub connections_open: AtomicU64,
    /// Connections that completed a TLS handshake.
    pub connections_tls: AtomicU64,
    /// Connections that speak HTTP/2.
    pub connections_http2: AtomicU64,
    /// Connections over `max_connections` or `max_connections_per_ip`, answered 503.
    pub connections_refused: AtomicU64,
    /// Connections closed for a missing or malformed PROXY header.
    pub proxy_protocol_errors: AtomicU64,
    /// Connections whose TLS handshake failed.
    pub tls_handshake_errors: AtomicU64,
    /// Connections closed because a request head (or the TLS handshake, or the PROXY header) took longer
    /// than `header_read_timeout`.
    pub header_timeouts: AtomicU64,
    /// Connections closed after `idle_timeout` without progress.
    pub idle_timeouts: AtomicU64,
    /// Requests refused with 431 for a head over `max_header_size` or `max_headers`.
    pub headers_too_large: AtomicU64,
}

pub(crate) fn inc(counter: &AtomicU64) {
    counter.fetch_add(1, Relaxed);
}

pub(crate) fn dec(counter: &AtomicU64) {
    counter.fetch_sub(1, Relaxed);
}
