//! The edge's counters: connections and what ended them. They are part of the proxy's statistics
//! (`ProxyStats` in the wire crate documents each); `lacquer_proxy::stats` reads them into its snapshot.
//!
//! What can be told apart by listener is kept per listener only ([`ListenerStats`]), and the daemon's totals
//! are their sums: a request costs one counter, not one per view of it.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc, Mutex, OnceLock,
    },
};

/// Counters and gauges of client connections that are not kept per listener.
#[derive(Debug, Default)]
pub struct EdgeStats {
    /// Connections open now (a gauge).
    pub connections_open: AtomicU64,
    /// Connections that speak HTTP/2.
    pub connections_http2: AtomicU64,
    /// Connections over `max_connections` or `max_connections_per_ip`, answered 503.
    pub connections_refused: AtomicU64,
    /// Connections closed for a missing or malformed PROXY header.
    pub proxy_protocol_errors: AtomicU64,
    /// Connections closed because a request head (or the TLS handshake, or the PROXY header) took longer
    /// than `header_read_timeout`.
    pub header_timeouts: AtomicU64,
    /// Connections closed after `idle_timeout` without progress.
    pub idle_timeouts: AtomicU64,
    /// Requests refused with 431 for a head over `max_header_size` or `max_headers`.
    pub headers_too_large: AtomicU64,
    /// QUIC connections that got their HTTP/3 session up.
    pub connections_http3: AtomicU64,
    /// New QUIC clients asked to prove their address with a Retry first.
    pub quic_retries: AtomicU64,
    /// The counters of every listener served, each once.
    listeners: Mutex<Vec<Arc<ListenerStats>>>,
}

impl EdgeStats {
    /// Adds a listener's counters to those [`EdgeStats::listeners`] reads; one already there is not added
    /// again (every worker registers the listeners it serves).
    pub fn register(&self, listener: &Arc<ListenerStats>) {
        let mut listeners = self.listeners.lock().expect("listener list");
        if !listeners.iter().any(|l| Arc::ptr_eq(l, listener)) {
            listeners.push(listener.clone());
        }
    }

    /// The listeners' counters, in the order they were registered (the configuration's).
    pub fn listeners(&self) -> Vec<Arc<ListenerStats>> {
        self.listeners.lock().expect("listener list").clone()
    }
}

/// The counters of one `[[listen]]` section, shared by every worker serving it and kept for as long as the
/// daemon runs (a reload does not rebuild listeners).
#[derive(Debug)]
pub struct ListenerStats {
    configured: SocketAddr,
    bound: OnceLock<SocketAddr>,
    /// The listener terminates TLS.
    pub tls: bool,
    /// The listener serves HTTP/3 over QUIC too.
    pub quic: bool,
    /// Connections accepted, TCP and QUIC.
    pub connections: AtomicU64,
    /// Connections that completed a TLS handshake (over TCP).
    pub connections_tls: AtomicU64,
    /// Connections whose TLS handshake failed (over TCP).
    pub tls_handshake_errors: AtomicU64,
    /// Requests over HTTP/1.x.
    pub requests_http1: AtomicU64,
    /// Requests over HTTP/2.
    pub requests_http2: AtomicU64,
    /// Requests over HTTP/3.
    pub requests_http3: AtomicU64,
    /// Response body bytes sent over HTTP/1.x.
    pub bytes_out_http1: AtomicU64,
    /// Response body bytes sent over HTTP/2.
    pub bytes_out_http2: AtomicU64,
    /// Response body bytes sent over HTTP/3.
    pub bytes_out_http3: AtomicU64,
    /// QUIC handshakes started (connections accepted within the listener's limits).
    pub quic_handshakes: AtomicU64,
    /// QUIC handshakes that failed (a timeout counts in `header_timeouts`).
    pub quic_handshake_errors: AtomicU64,
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

impl ListenerStats {
    /// The counters of a listener configured on `address`.
    pub fn new(address: SocketAddr, tls: bool, quic: bool) -> Self {
        Self {
            configured: address,
            bound: OnceLock::new(),
            tls,
            quic,
            connections: AtomicU64::new(0),
            connections_tls: AtomicU64::new(0),
            tls_handshake_errors: AtomicU64::new(0),
            requests_http1: AtomicU64::new(0),
            requests_http2: AtomicU64::new(0),
            requests_http3: AtomicU64::new(0),
            bytes_out_http1: AtomicU64::new(0),
            bytes_out_http2: AtomicU64::new(0),
            bytes_out_http3: AtomicU64::new(0),
            quic_handshakes: AtomicU64::new(0),
            quic_handshake_errors: AtomicU64::new(0),
            quic_0rtt_accepted: AtomicU64::new(0),
            quic_0rtt_refused: AtomicU64::new(0),
            quic_errors_idle_timeout: AtomicU64::new(0),
            quic_errors_protocol: AtomicU64::new(0),
            quic_errors_transport: AtomicU64::new(0),
            quic_errors_reset: AtomicU64::new(0),
        }
    }

    /// The address that names the listener: the one bound, which is the configured one unless that asked
    /// for port 0.
    pub fn address(&self) -> SocketAddr {
        self.bound.get().copied().unwrap_or(self.configured)
    }

    pub(crate) fn bound(&self, address: SocketAddr) {
        let _ = self.bound.set(address);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_registers_once_and_is_named_by_its_bound_address() {
        let configured: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let a = Arc::new(ListenerStats::new(configured, true, false));
        let b = Arc::new(ListenerStats::new(
            "[::1]:443".parse().unwrap(),
            false,
            false,
        ));
        let edge = EdgeStats::default();
        for _worker in 0..3 {
            edge.register(&a);
            edge.register(&b);
        }
        let listed = edge.listeners();
        assert_eq!(listed.len(), 2);
        assert!(Arc::ptr_eq(&listed[0], &a) && Arc::ptr_eq(&listed[1], &b));
        assert_eq!(a.address(), configured);
        a.bound("127.0.0.1:8443".parse().unwrap());
        assert_eq!(a.address().to_string(), "127.0.0.1:8443");
        assert_eq!(b.address().to_string(), "[::1]:443");
    }
}
