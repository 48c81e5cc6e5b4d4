//! The daemon's counters: lock-free on the hot path, read as one snapshot by the admin API. What each one
//! means is declared once, with the wire type ([`ProxyStats`]).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use lacquer_admin::wire::{
    ListenerCounters, ListenerStats, OutcomeLatency, ProxyStats, StatusCounts as StatusView,
    OUTCOMES,
};
use lacquer_backends::tally::{Latency, StatusCounts};
use lacquer_edge::EdgeStats;

macro_rules! counters {
    (
        $($name:ident),* $(,)?;
        edge: $($edge:ident),* $(,)?;
        listeners: $($listener:ident),* $(,)?
    ) => {
        /// Counters and gauges of the proxy; see [`ProxyStats`] for what each counts.
        #[derive(Debug, Default)]
        pub struct Stats {
            $(#[allow(missing_docs)] pub $name: AtomicU64,)*
            /// The connection counters, kept by the edge.
            pub edge: EdgeStats,
            /// Client requests' latency, by cache outcome in the order of [`OUTCOMES`].
            pub latency: [Latency; OUTCOMES.len()],
            /// Client responses by status code.
            pub responses: StatusCounts,
        }

        impl Stats {
            /// The counters, and every listener's. The listeners' are read once: the totals of
            /// [`ProxyStats`] that are theirs are their sums.
            ///
            /// Naming every field of [`ProxyStats`] and [`ListenerCounters`] here keeps the types in step:
            /// a counter missing on either side does not compile.
            pub fn snapshot(&self) -> (ProxyStats, Vec<ListenerStats>) {
                let listeners: Vec<ListenerStats> = self
                    .edge
                    .listeners()
                    .iter()
                    .map(|l| ListenerStats {
                        address: l.address().to_string(),
                        tls: l.tls,
                        quic: l.quic,
                        counters: ListenerCounters {
                            $($listener: l.$listener.load(Relaxed),)*
                        },
                    })
                    .collect();
                let mut sum = ListenerCounters::default();
                for l in &listeners {
                    sum.add(&l.counters);
                }
                let proxy = ProxyStats {
                    $($name: self.$name.load(Relaxed),)*
                    $($edge: self.edge.$edge.load(Relaxed),)*
                    $($listener: sum.$listener,)*
                };
                (proxy, listeners)
            }
        }
    };
}

counters! {
    requests,
    hits,
    hits_memory,
    hits_disk,
    stale_served,
    stale_on_error,
    misses,
    passes,
    pipes,
    pipes_active,
    pipe_bytes_to_backend,
    pipe_bytes_to_client,
    coalesced_waiters,
    hls_reloads,
    hls_reloads_joined,
    hls_reloads_held,
    hls_reload_wait_ms,
    hls_reloads_refused,
    hls_reloads_timed_out,
    ranges_growing,
    prefetched,
    prefetch_hits,
    prefetch_wasted,
    prefetch_dropped,
    prefetch_refused,
    hit_for_miss,
    uncacheable,
    backend_requests,
    backend_errors,
    interim_responses,
    interim_forwarded,
    early_hints_sent,
    fetches_in_flight,
    fetches_cancelled,
    background_fills,
    objects_stored,
    revalidations,
    bodies_lost,
    invalidations,
    purge_requests,
    purge_requests_refused,
    bytes_in,
    bytes_out,
    compress_in,
    compress_out,
    decoded_br,
    decoded_gzip,
    decoded_zstd,
    coding_forwarded,
    corrupt_bodies,
    decode_limit,
    decoded_bytes,
    decode_memory,
    decodes_refused,
    decode_expansion,
    ranges_whole,
    representations_made,
    representations_served,
    representations_evicted,
    representations_deferred,
    representations_failed,
    dictionaries_held,
    dictionary_memory,
    dictionaries_kept,
    dictionaries_refused,
    dictionaries_dropped,
    dictionary_responses,
    dictionary_bytes_saved,
    slices_fetched,
    slices_served,
    slice_mismatches,
    slice_errors,
    esi_pages,
    esi_assemblies,
    esi_fragments,
    esi_errors,
    backend_unavailable,
    backends_sick,
    bodies_too_large,
    bad_requests,
    denied,
    rate_limited,
    access_log_dropped,
    trace_spans_dropped,
    cluster_revalidations,
    peer_requests,
    peer_requests_in,
    peer_requests_unproven,
    peer_failures;
    edge:
    connections_open,
    connections_http2,
    connections_refused,
    proxy_protocol_errors,
    header_timeouts,
    idle_timeouts,
    headers_too_large,
    connections_http3,
    quic_retries;
    listeners:
    connections,
    connections_tls,
    tls_handshake_errors,
    requests_http1,
    requests_http2,
    requests_http3,
    bytes_out_http1,
    bytes_out_http2,
    bytes_out_http3,
    quic_handshakes,
    quic_handshake_errors,
    quic_0rtt_accepted,
    quic_0rtt_refused,
    quic_errors_idle_timeout,
    quic_errors_protocol,
    quic_errors_transport,
    quic_errors_reset,
}

impl Stats {
    /// Client requests' latency by outcome, every outcome of [`OUTCOMES`] in that order.
    pub fn latency(&self) -> Vec<OutcomeLatency> {
        OUTCOMES
            .iter()
            .zip(&self.latency)
            .map(|(outcome, l)| OutcomeLatency {
                outcome: (*outcome).to_owned(),
                latency: l.view(),
            })
            .collect()
    }

    /// Client responses by status code.
    pub fn responses(&self) -> StatusView {
        self.responses.view()
    }
}

/// Counts one (relaxed: counters order nothing).
pub fn inc(counter: &AtomicU64) {
    counter.fetch_add(1, Relaxed);
}

/// Counts `n`.
pub fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Relaxed);
}

/// Takes `n` off a gauge.
pub fn sub(counter: &AtomicU64, n: u64) {
    counter.fetch_sub(n, Relaxed);
}

/// Takes one off a gauge.
pub fn dec(counter: &AtomicU64) {
    counter.fetch_sub(1, Relaxed);
}
