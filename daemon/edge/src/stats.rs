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
    /// Requests over HTTP/1.x.
    pub requests_http1: AtomicU64,
    /// Requests over HTTP/2.
    pub requests_http2: AtomicU64,
    /// Requests over HTTP/3.
    pub requests_http3: AtomicU64,
    /// Response body bytes sent over HTTP/3.
    pub bytes_out_http3: AtomicU64,
    /// QUIC connections that got their HTTP/3 session up.
    pub connections_http3: AtomicU64,
    /// QUIC handshakes started (connections accepted within the listener's limits).
    pub quic_handshakes: AtomicU64,
    /// QUIC handshakes that failed (a timeout counts in `header_timeouts`).
    pub quic_handshake_errors: AtomicU64,
    /// New QUIC clients asked to prove their address with a Retry first.
    pub quic_retries: AtomicU64,
    /// Requests answered from TLS early data (0-RTT), before the handshake completed.
    pub quic_0rtt_accepted: AtomicU64,
    /// Requests in early data refused with 425 Too Early (a method that is not safe).
    pub quic_0rtt_refused: AtomicU64,
    /// QUIC connections closed after `idle_timeout` without a packet.
    pub quic_errors_idle_timeout: AtomicU64,
    /// QUIC connections closed for an HTTP/3 error by either side (malformed frames, QPACK errors).
    pub quic_errors_protocol: AtomicU64,
    /// QUIC connections closed for a QUIC transport error by either side (stream limits, flow control).
    pub quic_errors_transport: AtomicU64,
    /// QUIC connections ended by a stateless reset (the peer lost their state).
    pub quic_errors_reset: AtomicU64,
}

pub(crate) fn inc(counter: &AtomicU64) {
    counter.fetch_add(1, Relaxed);
}

pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Relaxed);
}

pub(crate) fn dec(counter: &AtomicU64) {
    counter.fetch_sub(1, Relaxed);
}
