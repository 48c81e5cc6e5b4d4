//! `GET /v1/stats`, `GET /v1/stats/stream` and `GET /metrics` all show these values. Each is declared once,
//! below, with what it means and how Prometheus sees it, so the JSON document, the metrics page and the
//! descriptions `cachectl stats` prints cannot disagree.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// How a value behaves over time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only grows (until a restart); a rate is meaningful.
    Counter,
    /// Goes up and down; shown as is.
    Gauge,
}

/// One value of a stats section.
#[derive(Debug)]
pub struct Field {
    /// The name in the JSON document.
    pub name: &'static str,
    help: &'static [&'static str],
    pub kind: Kind,
    /// The Prometheus metric family it belongs to.
    pub metric: &'static str,
    /// Its labels within that family: values that add up (hits by tier, results by kind) share a family.
    pub labels: &'static [(&'static str, &'static str)],
}

impl Field {
    /// The one-line description.
    pub fn help(&self) -> String {
        self.help
            .iter()
            .map(|line| line.trim())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

macro_rules! stats_section {
    (
        $(#[doc = $sdoc:literal])*
        pub struct $ty:ident {
            $(
                $(#[doc = $doc:literal])+
                $name:ident: $kind:ident $metric:literal $({ $($label:ident = $value:literal),* })?,
            )*
        }
    ) => {
        $(#[doc = $sdoc])*
        ///
        /// A value missing from a document (one from an older daemon) reads as 0.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
        #[serde(default)]
        pub struct $ty {
            $($(#[doc = $doc])+ pub $name: u64,)*
        }

        impl $ty {
            pub const FIELDS: &'static [Field] = &[$(Field {
                name: stringify!($name),
                help: &[$($doc),+],
                kind: Kind::$kind,
                metric: $metric,
                labels: &[$($((stringify!($label), $value)),*)?],
            }),*];

            /// Every field with its value, in declaration order.
            pub fn values(&self) -> impl Iterator<Item = (&'static Field, u64)> {
                Self::FIELDS.iter().zip([$(self.$name),*])
            }

            /// The value of the field called `name`.
            pub fn get(&self, name: &str) -> Option<u64> {
                self.values().find(|(f, _)| f.name == name).map(|(_, v)| v)
            }

            /// Adds every value of `other` to this one's, gauges included.
            pub fn add(&mut self, other: &Self) {
                $(self.$name = self.$name.saturating_add(other.$name);)*
            }
        }
    };
}

stats_section! {
    /// Counters and gauges of the proxy: client requests and what became of them.
    pub struct ProxyStats {
        /// Client requests received.
        requests: Counter "lacquer_client_requests_total",
        /// Requests answered from the store (stale ones included).
        hits: Counter "lacquer_cache_requests_total" { result = "hit" },
        /// Hits whose first chunk came from the memory tier.
        hits_memory: Counter "lacquer_cache_hits_total" { tier = "memory" },
        /// Hits whose first chunk came from the disk tier.
        hits_disk: Counter "lacquer_cache_hits_total" { tier = "disk" },
        /// Stale objects served within grace while a background fetch refreshed them.
        stale_served: Counter "lacquer_stale_served_total" { reason = "grace" },
        /// Stale objects served because the origin failed (refused, reset, timed out, or 5xx).
        stale_on_error: Counter "lacquer_stale_served_total" { reason = "backend_error" },
        /// Cacheable requests the store could not answer.
        misses: Counter "lacquer_cache_requests_total" { result = "miss" },
        /// Requests passed to the backend without lookup.
        passes: Counter "lacquer_cache_requests_total" { result = "pass" },
        /// Connection upgrades (WebSocket) a `pipe` rule tunnelled to the backend: answered `101` by it.
        pipes: Counter "lacquer_pipes_total",
        /// Tunnels open now.
        pipes_active: Gauge "lacquer_pipes_active",
        /// Bytes tunnels carried from clients to backends.
        pipe_bytes_to_backend: Counter "lacquer_pipe_bytes_total" { direction = "to_backend" },
        /// Bytes tunnels carried from backends to clients.
        pipe_bytes_to_client: Counter "lacquer_pipe_bytes_total" { direction = "to_client" },
        /// Requests that attached to a fetch already in flight instead of going to the backend.
        coalesced_waiters: Counter "lacquer_coalesced_requests_total",
        /// LL-HLS blocking playlist reloads (requests carrying `_HLS_msn`) that waited for the origin,
        /// which holds them until the playlist version they name exists.
        hls_reloads: Counter "lacquer_hls_reloads_total",
        /// Blocking reloads that joined another's origin request for the same playlist version.
        hls_reloads_joined: Counter "lacquer_hls_reloads_joined_total",
        /// Blocking reloads waiting for the origin now.
        hls_reloads_held: Gauge "lacquer_hls_reloads_held",
        /// Milliseconds blocking reloads waited for the origin's answer, all together: over
        /// `hls_reloads`, the mean hold.
        hls_reload_wait_ms: Counter "lacquer_hls_reload_wait_milliseconds_total",
        /// Blocking reloads answered `503` at once: `cache.blocking_reloads_per_playlist` distinct ones
        /// of their playlist were already at the origin.
        hls_reloads_refused: Counter "lacquer_hls_reloads_refused_total",
        /// Blocking reloads the origin held past `cache.blocking_reload_hold`: answered `503`.
        hls_reloads_timed_out: Counter "lacquer_hls_reloads_timed_out_total",
        /// Ranges of a body still arriving with no length known yet (a live segment growing), answered
        /// `206` with `Content-Range: bytes a-b/*` as its bytes arrived.
        ranges_growing: Counter "lacquer_ranges_growing_total",
        /// Objects fetched before a player asked for them (a route's `prefetch`).
        prefetched: Counter "lacquer_prefetches_total",
        /// Prefetched objects a client then asked for (counted at its first request).
        prefetch_hits: Counter "lacquer_prefetch_hits_total",
        /// Prefetched objects nobody asked for within `prefetch.unused_after`, or whose fetch failed.
        prefetch_wasted: Counter "lacquer_prefetch_wasted_total",
        /// Prefetches not made: `[prefetch]`'s budget (`max_concurrent`, `max_rate`) was spent.
        prefetch_dropped: Counter "lacquer_prefetch_dropped_total",
        /// Prefetches refused: a CMCD `nor` naming another host or leaving the site, or a target that is
        /// no cacheable GET once the request phase has run.
        prefetch_refused: Counter "lacquer_prefetch_refused_total",
        /// Misses sent straight to the backend because the key recently proved uncacheable.
        hit_for_miss: Counter "lacquer_hit_for_miss_total",
        /// Responses to cacheable requests that could not be stored.
        uncacheable: Counter "lacquer_uncacheable_responses_total",
        /// Requests sent to the backend (fetches and passes).
        backend_requests: Counter "lacquer_backend_requests_total",
        /// Backend requests that failed: refused, reset, timed out, or cut short.
        backend_errors: Counter "lacquer_backend_errors_total",
        /// Interim (1xx) responses backends sent before their final one (103 Early Hints, 102): never
        /// stored; forwarded to the client that waits (over HTTP/1 origin connections).
        interim_responses: Counter "lacquer_backend_interim_responses_total",
        /// Those sent on to a client (not to an HTTP/1.0 client, nor once the final response began).
        interim_forwarded: Counter "lacquer_interim_responses_total" { source = "origin" },
        /// `103 Early Hints` sent from rules' `early_hints` as requests went to the origin.
        early_hints_sent: Counter "lacquer_interim_responses_total" { source = "rule" },
        /// Backend fetches in flight.
        fetches_in_flight: Gauge "lacquer_backend_fetches_in_flight",
        /// Backend fetches stopped because every client reading them had gone (closed, or reset its HTTP/2
        /// stream) while the body was not being stored.
        fetches_cancelled: Counter "lacquer_backend_fetches_cancelled_total",
        /// Fetches that went on storing the body after every client reading them had gone (bounded by
        /// `max_object_size`).
        background_fills: Counter "lacquer_background_fills_total",
        /// Objects stored after a fetch (on a sliced route, each slice stored).
        objects_stored: Counter "lacquer_objects_stored_total",
        /// Stale objects the origin confirmed with a 304: headers and freshness refreshed, body not resent.
        revalidations: Counter "lacquer_revalidations_total",
        /// Store lookups that found metadata but not the whole body (evicted or lost in a crash).
        bodies_lost: Counter "lacquer_bodies_lost_total",
        /// Stored objects invalidated by unsafe methods (POST, PUT, DELETE, PATCH) sent through the proxy.
        invalidations: Counter "lacquer_unsafe_method_invalidations_total",
        /// `PURGE` and `BAN` requests accepted from allowed clients.
        purge_requests: Counter "lacquer_purge_requests_total" { outcome = "accepted" },
        /// `PURGE` and `BAN` requests refused (methods off, or client not in `purge.allow_from`).
        purge_requests_refused: Counter "lacquer_purge_requests_total" { outcome = "refused" },
        /// Body bytes received from backends.
        bytes_in: Counter "lacquer_backend_body_bytes_total",
        /// Body bytes sent to clients.
        bytes_out: Counter "lacquer_client_body_bytes_total",
        /// Body bytes compressed when stored (`[compression]`), before compression.
        compress_in: Counter "lacquer_compression_bytes_total" { stage = "before" },
        /// The same bodies' bytes after compression: `compress_out / compress_in` is the ratio.
        compress_out: Counter "lacquer_compression_bytes_total" { stage = "after" },
        /// Responses whose brotli body was decompressed on the way out, for a client that does not take br.
        decoded_br: Counter "lacquer_coding_conversions_total" { coding = "br" },
        /// Responses whose gzip body was decompressed on the way out.
        decoded_gzip: Counter "lacquer_coding_conversions_total" { coding = "gzip" },
        /// Responses whose zstd body was decompressed on the way out.
        decoded_zstd: Counter "lacquer_coding_conversions_total" { coding = "zstd" },
        /// Lookups sent to the origin as the client asked because the stored coding was not acceptable and
        /// could not be converted (`no-transform`, or a coding lacquerd does not decode).
        coding_forwarded: Counter "lacquer_coding_forwarded_total",
        /// Compressed bodies from the origin that did not decode (truncated or corrupt): never stored, and the
        /// clients' responses end in an error.
        corrupt_bodies: Counter "lacquer_coded_body_errors_total" { reason = "corrupt" },
        /// Compressed bodies that expanded past `max_object_size` (decompression bombs): not stored, and
        /// decoding on the way out is cut off at that size.
        decode_limit: Counter "lacquer_coded_body_errors_total" { reason = "too_large" },
        /// Bytes produced decoding bodies on the way out: what decoding costs, in output.
        decoded_bytes: Counter "lacquer_decoded_bytes_total",
        /// Memory held by the decoders of responses being decoded now, each counted at its most
        /// (`compression.decode_memory` bounds it).
        decode_memory: Gauge "lacquer_decode_memory_bytes",
        /// Requests answered 503 because the decoder they needed would have passed `decode_memory`.
        decodes_refused: Counter "lacquer_decodes_refused_total",
        /// Bodies cut on the way out for expanding more than `max_expansion` times (decompression bombs that
        /// would cost far more CPU than their size).
        decode_expansion: Counter "lacquer_coded_body_errors_total" { reason = "expansion" },
        /// Byte ranges of a decoded body answered with the whole body: beyond `range_decode`, or several.
        ranges_whole: Counter "lacquer_decoded_ranges_whole_total",
        /// Representations made from stored bodies and kept beside them (`compression.conversions`): an
        /// identity copy of a body stored compressed, a gzip copy of one stored in brotli.
        representations_made: Counter "lacquer_representations_total" { event = "made" },
        /// Responses sent from such a representation, as stored: no conversion on the way out.
        representations_served: Counter "lacquer_representations_total" { event = "served" },
        /// Representations found with their chunks gone (evicted), made again when next asked for.
        representations_evicted: Counter "lacquer_representations_total" { event = "evicted" },
        /// Representations not started because `compression.conversions` were being made: the client was
        /// served by converting on the way out.
        representations_deferred: Counter "lacquer_representations_total" { event = "deferred" },
        /// Representations started but not kept: the body could not be read or converted, or the store
        /// refused it.
        representations_failed: Counter "lacquer_representations_total" { event = "failed" },
        /// Compression dictionaries held (`Use-As-Dictionary` responses, `compression.dictionaries`).
        dictionaries_held: Gauge "lacquer_dictionaries",
        /// Memory they hold (`compression.dictionary_memory` bounds it).
        dictionary_memory: Gauge "lacquer_dictionary_memory_bytes",
        /// `Use-As-Dictionary` responses read and held as dictionaries.
        dictionaries_kept: Counter "lacquer_dictionary_events_total" { event = "kept" },
        /// `Use-As-Dictionary` responses not held: larger than `max_dictionary_size`, in a coding that does
        /// not decode, or whose body could not be read.
        dictionaries_refused: Counter "lacquer_dictionary_events_total" { event = "refused" },
        /// Dictionaries let go: past `dictionary_memory`, or their response purged, banned, replaced or
        /// evicted.
        dictionaries_dropped: Counter "lacquer_dictionary_events_total" { event = "dropped" },
        /// Responses sent compressed against a dictionary the client holds (`dcb`, `dcz`).
        dictionary_responses: Counter "lacquer_dictionary_responses_total",
        /// Bytes those responses saved against the stored representation the client would have been sent.
        dictionary_bytes_saved: Counter "lacquer_dictionary_saved_bytes_total",
        /// Slices of objects on a route with `slice` fetched from the origin (aligned range requests), and
        /// the gaps between the stored parts of other objects.
        slices_fetched: Counter "lacquer_slices_total" { source = "origin" },
        /// Slices (or the parts of them a response needed) served from the store.
        slices_served: Counter "lacquer_slices_total" { source = "store" },
        /// Objects stored in parts found changed at the origin (another entity-tag, `Last-Modified` or
        /// length than the parts stored or sent before): what was stored is dropped, and a response already
        /// begun ends in an error rather than mixing two versions.
        slice_mismatches: Counter "lacquer_slice_errors_total" { kind = "changed" },
        /// 206 answers that cannot be placed: to a slice's range, a `Content-Range` other than the one asked
        /// for, or none (never stored or sent as the slice); to a forwarded range, one that is malformed or
        /// disagrees with the body's length (passed on as sent, never stored).
        slice_errors: Counter "lacquer_slice_errors_total" { kind = "bad_range" },
        /// Responses parsed for Edge Side Includes as they were fetched (a route's or rule's `esi`).
        esi_pages: Counter "lacquer_esi_total" { event = "parsed" },
        /// Responses assembled with their fragments for a client (a HEAD or a 304 assembles nothing).
        esi_assemblies: Counter "lacquer_esi_total" { event = "assembled" },
        /// Fragment requests made for includes (each its own lookup: a hit, a miss or a pass).
        esi_fragments: Counter "lacquer_esi_total" { event = "fragment" },
        /// Includes that failed: an error status or failed body, another host, past `[esi]`'s depth or
        /// include bounds, a page including itself, a damaged template. Dropped with
        /// `onerror="continue"`; otherwise the page is cut off there.
        esi_errors: Counter "lacquer_esi_total" { event = "error" },
        /// Requests that found no backend to send to: every candidate sick, or busy at `max_connections`.
        backend_unavailable: Counter "lacquer_backend_unavailable_total",
        /// Backends their probe says are sick.
        backends_sick: Gauge "lacquer_backends_sick",
        /// Client connections accepted.
        connections: Counter "lacquer_client_connections_total",
        /// Client connections open now.
        connections_open: Gauge "lacquer_client_connections_open",
        /// Client connections that completed a TLS handshake.
        connections_tls: Counter "lacquer_client_tls_connections_total",
        /// Client connections speaking HTTP/2 (by ALPN or prior knowledge).
        connections_http2: Counter "lacquer_client_http2_connections_total",
        /// Client connections over a listener's `max_connections` or `max_connections_per_ip`, answered
        /// 503.
        connections_refused: Counter "lacquer_client_connection_errors_total" { reason = "limit" },
        /// Connections closed on a listener expecting PROXY for a missing or invalid header.
        proxy_protocol_errors: Counter "lacquer_client_connection_errors_total" { reason = "proxy_header" },
        /// TLS handshakes that failed.
        tls_handshake_errors: Counter "lacquer_client_connection_errors_total" { reason = "tls_handshake" },
        /// Connections closed for not sending a complete request head (or TLS handshake, or PROXY header)
        /// within `header_read_timeout`: slow clients and idle keep-alive connections.
        header_timeouts: Counter "lacquer_client_connection_errors_total" { reason = "header_timeout" },
        /// Connections closed after `idle_timeout` without activity.
        idle_timeouts: Counter "lacquer_client_connection_errors_total" { reason = "idle_timeout" },
        /// Requests refused with 431: head over `max_header_size` or more than `max_headers` fields.
        headers_too_large: Counter "lacquer_client_request_errors_total" { reason = "headers_too_large" },
        /// Client requests over HTTP/1.x.
        requests_http1: Counter "lacquer_client_protocol_requests_total" { protocol = "http1" },
        /// Client requests over HTTP/2.
        requests_http2: Counter "lacquer_client_protocol_requests_total" { protocol = "http2" },
        /// Client requests over HTTP/3.
        requests_http3: Counter "lacquer_client_protocol_requests_total" { protocol = "http3" },
        /// Response body bytes sent to clients over HTTP/1.x.
        bytes_out_http1: Counter "lacquer_client_protocol_sent_bytes_total" { protocol = "http1" },
        /// Response body bytes sent to clients over HTTP/2.
        bytes_out_http2: Counter "lacquer_client_protocol_sent_bytes_total" { protocol = "http2" },
        /// Response body bytes sent to clients over HTTP/3.
        bytes_out_http3: Counter "lacquer_client_protocol_sent_bytes_total" { protocol = "http3" },
        /// QUIC connections that got their HTTP/3 session up.
        connections_http3: Counter "lacquer_client_http3_connections_total",
        /// QUIC handshakes started: connections accepted within the listener's limits.
        quic_handshakes: Counter "lacquer_quic_handshakes_total",
        /// QUIC handshakes that failed (one that timed out counts in `header_timeouts`).
        quic_handshake_errors: Counter "lacquer_client_connection_errors_total" { reason = "quic_handshake" },
        /// New QUIC clients asked to prove their address with a Retry first (past `quic_retry_above`
        /// handshakes in progress on a worker).
        quic_retries: Counter "lacquer_quic_retries_total",
        /// HTTP/3 requests answered from TLS early data (0-RTT), before the handshake completed.
        quic_0rtt_accepted: Counter "lacquer_quic_early_requests_total" { result = "accepted" },
        /// HTTP/3 requests in early data refused with 425 Too Early: a method that is not safe.
        quic_0rtt_refused: Counter "lacquer_quic_early_requests_total" { result = "refused" },
        /// QUIC connections closed after `idle_timeout` without a packet.
        quic_errors_idle_timeout: Counter "lacquer_quic_connection_errors_total" { kind = "idle_timeout" },
        /// QUIC connections closed for an HTTP/3 error raised by either side: malformed or unexpected
        /// frames, QPACK errors.
        quic_errors_protocol: Counter "lacquer_quic_connection_errors_total" { kind = "h3" },
        /// QUIC connections closed for a QUIC transport error raised by either side: stream limits, flow
        /// control, malformed packets.
        quic_errors_transport: Counter "lacquer_quic_connection_errors_total" { kind = "transport" },
        /// QUIC connections ended by a stateless reset: the client lost the connection's state.
        quic_errors_reset: Counter "lacquer_quic_connection_errors_total" { kind = "reset" },
        /// Access log lines dropped because the writer fell behind (a slow disk).
        access_log_dropped: Counter "lacquer_access_log_dropped_total",
        /// Trace spans lost (`[telemetry]`): dropped while `telemetry.max_queue` were waiting for export, or
        /// in an export that failed or timed out (the collector down or slow).
        trace_spans_dropped: Counter "lacquer_trace_spans_dropped_total",
        /// Stored objects revalidated with the origin instead of served, because this cluster node could not
        /// vouch for having every invalidation (catching up, or cut off from etcd past `max_invalidation_lag`).
        cluster_revalidations: Counter "lacquer_cluster_unvouched_lookups_total",
        /// Requests this node sent to the peer owning their key (self-routing).
        peer_requests: Counter "lacquer_cluster_peer_requests_total" { direction = "out" },
        /// Requests for keys this node owns, forwarded by a peer.
        peer_requests_in: Counter "lacquer_cluster_peer_requests_total" { direction = "in" },
        /// Requests marked as forwarded by a peer without a valid proof (the cluster secret's HMAC): routed
        /// and answered as any client's.
        peer_requests_unproven: Counter "lacquer_cluster_peer_requests_unproven_total",
        /// Peer requests that failed (the owner down or unreachable): answered by this node itself.
        peer_failures: Counter "lacquer_cluster_peer_failures_total",
        /// Requests refused with 403 by a `[[deny]]` rule.
        denied: Counter "lacquer_client_request_errors_total" { reason = "denied" },
        /// Requests refused with 429 by a route's `rate_limit`.
        rate_limited: Counter "lacquer_client_request_errors_total" { reason = "rate_limited" },
        /// Requests refused with 413: body over `max_request_body`.
        bodies_too_large: Counter "lacquer_client_request_errors_total" { reason = "body_too_large" },
        /// Requests refused with 400: Host missing, repeated or invalid, `Connection` naming Host, or a
        /// malformed request body (bad chunked framing).
        bad_requests: Counter "lacquer_client_request_errors_total" { reason = "bad_request" },
    }
}

stats_section! {
    /// Counters and gauges of the store: objects, tiers, bans and purges. The store declares the same
    /// names once (`storage/src/store/stats.rs`), and `lacquerd` converts its snapshot into this type
    /// field by field from that list: a statistic added on one side only does not compile.
    pub struct StoreStats {
        /// Stored variants.
        objects: Gauge "lacquer_store_objects",
        /// Body bytes of stored variants.
        stored_bytes: Gauge "lacquer_store_object_bytes",
        /// Bytes of chunks in the memory tier.
        memory_bytes_used: Gauge "lacquer_store_memory_bytes",
        /// Size of the memory tier.
        memory_bytes_capacity: Gauge "lacquer_store_memory_capacity_bytes",
        /// Size of the disk tier.
        disk_bytes_capacity: Gauge "lacquer_store_disk_capacity_bytes",
        /// Bytes in disk-tier blocks that hold data (the tier fills and reclaims whole blocks).
        disk_bytes_used: Gauge "lacquer_store_disk_bytes",
        /// Bytes written to the disk tier since start.
        disk_bytes_written: Counter "lacquer_store_disk_written_bytes_total",
        /// Bytes read from the disk tier since start.
        disk_bytes_read: Counter "lacquer_store_disk_read_bytes_total",
        /// Objects made visible to lookups.
        objects_published: Counter "lacquer_store_objects_published_total",
        /// Published objects whose chunks have all reached the disk tier.
        objects_durable: Counter "lacquer_store_objects_durable_total",
        /// Objects the store removed at the proxy's request (unsafe-method invalidation).
        objects_removed: Counter "lacquer_store_objects_removed_total",
        /// Expired objects the sweeper removed.
        objects_swept: Counter "lacquer_store_objects_swept_total",
        /// Body chunks written.
        chunks_written: Counter "lacquer_store_chunks_written_total",
        /// Body bytes written in chunks.
        chunk_bytes_written: Counter "lacquer_store_chunk_written_bytes_total",
        /// Chunks read from the memory tier.
        chunk_reads_memory: Counter "lacquer_store_chunk_reads_total" { tier = "memory" },
        /// Chunks read from the disk tier.
        chunk_reads_disk: Counter "lacquer_store_chunk_reads_total" { tier = "disk" },
        /// Chunks of a large body one reader got from another reader's disk read (in flight, or one of the
        /// last few) instead of reading the device again.
        disk_reads_shared: Counter "lacquer_store_disk_reads_shared_total",
        /// Chunks the metadata promised but the tiers no longer held (evicted or lost in a crash).
        chunks_missing: Counter "lacquer_store_chunks_missing_total",
        /// Variants dropped because a key had more than `storage.max_variants`.
        variants_overflowed: Counter "lacquer_store_variants_overflowed_total",
        /// Chunk writes foyer dropped because its queues were full (should stay 0: writes wait instead).
        foyer_drops: Counter "lacquer_store_dropped_writes_total",
        /// Times the writer waited for the disk tier and flushed metadata, making objects durable.
        write_waits: Counter "lacquer_store_write_waits_total",
        /// Chunks the memory tier evicted to make room (they stay on disk).
        memory_evictions: Counter "lacquer_store_memory_evictions_total",
        /// Metadata records that could not be decoded (and were dropped).
        corrupt_records: Counter "lacquer_store_corrupt_records_total",
        /// Bans in the list, completed ones included.
        bans: Gauge "lacquer_bans",
        /// Bans the lurker has not finished with.
        bans_pending: Gauge "lacquer_bans_pending",
        /// Bans added.
        bans_added: Counter "lacquer_bans_added_total",
        /// Bans the lurker finished: every object stored before them was tested.
        bans_completed: Counter "lacquer_bans_completed_total",
        /// Objects removed by a ban when a lookup tested them.
        objects_banned: Counter "lacquer_objects_banned_total" { by = "lookup" },
        /// Objects removed by a ban when the lurker tested them.
        objects_lurked: Counter "lacquer_objects_banned_total" { by = "lurker" },
        /// Walks the ban lurker finished.
        lurker_walks: Counter "lacquer_ban_lurker_walks_total",
        /// Metadata records the ban lurker has tested.
        lurker_records_tested: Counter "lacquer_ban_lurker_records_tested_total",
        /// Purge operations (by URL or by tags).
        purges: Counter "lacquer_purges_total",
        /// Objects removed by hard purges.
        objects_purged: Counter "lacquer_objects_purged_total" { mode = "hard" },
        /// Objects expired by soft purges (still served within grace).
        objects_soft_purged: Counter "lacquer_objects_purged_total" { mode = "soft" },
        /// Fetches that completed after a purge or ban covering them, so were not stored.
        publishes_cancelled: Counter "lacquer_store_publishes_cancelled_total",
        /// 1 while the store's filesystem is below its free-space reserve: new objects are not stored,
        /// stored ones are still served.
        disk_full: Gauge "lacquer_store_disk_full",
        /// Fills not stored because the disk was full or a store task had died.
        fills_refused: Counter "lacquer_store_fills_refused_total",
        /// 1 when the store could not be opened at start: it was moved aside and lacquerd started empty.
        damaged_at_start: Gauge "lacquer_store_damaged_at_start",
        /// 1 when the store directory cannot be used at all: the store is memory-only.
        memory_only: Gauge "lacquer_store_memory_only",
        /// Store tasks (writer, sweeper, lurker, foyer's own) that died: new objects are no longer stored.
        tasks_failed: Counter "lacquer_store_tasks_failed_total",
        /// Entries in the invalidation journal (purges and bans not yet retired).
        journal_entries: Gauge "lacquer_store_journal_entries",
        /// Keys in the in-memory index of stored keys: a key it does not hold is a miss without a metadata
        /// read.
        key_index_keys: Gauge "lacquer_store_key_index_keys",
        /// Bytes the index of stored keys takes.
        key_index_bytes: Gauge "lacquer_store_key_index_bytes",
        /// 1 once the index of stored keys has been rebuilt after start; until then every miss reads the
        /// metadata.
        key_index_ready: Gauge "lacquer_store_key_index_ready",
        /// 1 once every object stored before the start has been checked against the invalidation journal;
        /// after a crash a walk in the background does it, and until it is done each object is checked when
        /// first read.
        journal_replayed: Gauge "lacquer_store_journal_replayed",
        /// Objects found at start that an acknowledged purge or ban covers (metadata rolled back by a crash
        /// or damage), removed again.
        objects_invalidated_at_start: Counter "lacquer_store_objects_invalidated_at_start_total",
        /// Objects dropped at start because the invalidation journal was damaged or missing.
        objects_unverified: Counter "lacquer_store_objects_unverified_total",
    }
}

stats_section! {
    /// The counters of one client listener (`[[listen]]`). The daemon's totals of the same names in
    /// [`ProxyStats`] are their sums.
    pub struct ListenerCounters {
        /// Connections accepted, TCP and QUIC.
        connections: Counter "lacquer_listener_connections_total",
        /// TCP connections that completed a TLS handshake.
        connections_tls: Counter "lacquer_listener_tls_handshakes_total",
        /// TLS handshakes over TCP that failed.
        tls_handshake_errors: Counter "lacquer_listener_handshake_errors_total" { protocol = "tls" },
        /// Requests over HTTP/1.x.
        requests_http1: Counter "lacquer_listener_requests_total" { protocol = "http1" },
        /// Requests over HTTP/2.
        requests_http2: Counter "lacquer_listener_requests_total" { protocol = "http2" },
        /// Requests over HTTP/3.
        requests_http3: Counter "lacquer_listener_requests_total" { protocol = "http3" },
        /// Response body bytes sent over HTTP/1.x.
        bytes_out_http1: Counter "lacquer_listener_sent_bytes_total" { protocol = "http1" },
        /// Response body bytes sent over HTTP/2.
        bytes_out_http2: Counter "lacquer_listener_sent_bytes_total" { protocol = "http2" },
        /// Response body bytes sent over HTTP/3.
        bytes_out_http3: Counter "lacquer_listener_sent_bytes_total" { protocol = "http3" },
        /// QUIC handshakes started: connections accepted within the listener's limits.
        quic_handshakes: Counter "lacquer_listener_quic_handshakes_total",
        /// QUIC handshakes that failed (one that timed out is not counted here).
        quic_handshake_errors: Counter "lacquer_listener_handshake_errors_total" { protocol = "quic" },
        /// HTTP/3 requests answered from TLS early data (0-RTT).
        quic_0rtt_accepted: Counter "lacquer_listener_quic_early_requests_total" { result = "accepted" },
        /// HTTP/3 requests in early data refused with 425 Too Early.
        quic_0rtt_refused: Counter "lacquer_listener_quic_early_requests_total" { result = "refused" },
        /// QUIC connections closed after `idle_timeout` without a packet.
        quic_errors_idle_timeout: Counter "lacquer_listener_quic_connection_errors_total" { kind = "idle_timeout" },
        /// QUIC connections closed for an HTTP/3 error raised by either side.
        quic_errors_protocol: Counter "lacquer_listener_quic_connection_errors_total" { kind = "h3" },
        /// QUIC connections closed for a QUIC transport error raised by either side.
        quic_errors_transport: Counter "lacquer_listener_quic_connection_errors_total" { kind = "transport" },
        /// QUIC connections ended by a stateless reset.
        quic_errors_reset: Counter "lacquer_listener_quic_connection_errors_total" { kind = "reset" },
    }
}

/// The label `/metrics` adds to every [`ListenerCounters`] series: the listener's address.
pub const LISTENER_LABEL: &str = "listener";

/// Descriptions of the per-listener metric families whose members carry labels besides [`LISTENER_LABEL`].
pub const LISTENER_FAMILY_HELP: &[(&str, &str)] = &[
    (
        "lacquer_listener_requests_total",
        "Client requests by listener and protocol: HTTP/1.x, HTTP/2, HTTP/3.",
    ),
    (
        "lacquer_listener_sent_bytes_total",
        "Response body bytes sent to clients, by listener and protocol.",
    ),
    (
        "lacquer_listener_handshake_errors_total",
        "Handshakes that failed, by listener and protocol: TLS over TCP, QUIC.",
    ),
    (
        "lacquer_listener_quic_early_requests_total",
        "HTTP/3 requests in TLS early data (0-RTT), by listener: answered (accepted), refused with 425 \
         (refused).",
    ),
    (
        "lacquer_listener_quic_connection_errors_total",
        "QUIC connections that ended badly, by listener and kind: idle timeout, HTTP/3 error, QUIC \
         transport error, stateless reset.",
    ),
];

/// One client listener and its counters. A listener is there for as long as the daemon runs: a reload
/// does not add or remove listeners (`listen` changes take effect on restart), so its counters go on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ListenerStats {
    /// The address it listens on: the configured one, with the port bound when that asked for port 0.
    pub address: String,
    /// It terminates TLS.
    #[serde(default)]
    pub tls: bool,
    /// It serves HTTP/3 over QUIC too.
    #[serde(default)]
    pub quic: bool,
    /// What it counted.
    #[serde(default)]
    pub counters: ListenerCounters,
}

/// Descriptions of the metric families whose members carry labels (a member's own description says what
/// its label value counts).
pub const FAMILY_HELP: &[(&str, &str)] = &[
    (
        "lacquer_client_protocol_requests_total",
        "Client requests by protocol: HTTP/1.x, HTTP/2, HTTP/3.",
    ),
    (
        "lacquer_client_protocol_sent_bytes_total",
        "Response body bytes sent to clients, by protocol: HTTP/1.x, HTTP/2, HTTP/3.",
    ),
    (
        "lacquer_quic_early_requests_total",
        "HTTP/3 requests in TLS early data (0-RTT): answered (accepted), refused with 425 (refused).",
    ),
    (
        "lacquer_quic_connection_errors_total",
        "QUIC connections that ended badly, by kind: idle timeout, HTTP/3 error, QUIC transport error, \
         stateless reset.",
    ),
    (
        "lacquer_cluster_peer_requests_total",
        "Self-routed requests: sent to the key's owner (out), answered for a peer (in).",
    ),
    (
        "lacquer_compression_bytes_total",
        "Body bytes compressed when stored, before and after compression.",
    ),
    (
        "lacquer_coding_conversions_total",
        "Responses decompressed on the way out, by the stored coding.",
    ),
    (
        "lacquer_representations_total",
        "Representations made from stored bodies and kept: made, served as stored, found evicted, \
         deferred past compression.conversions, failed.",
    ),
    (
        "lacquer_slice_errors_total",
        "Objects stored in parts found changed at the origin (changed), 206 answers that cannot be placed \
         (bad_range).",
    ),
    (
        "lacquer_esi_total",
        "Edge Side Includes: pages parsed as fetched, pages assembled for clients, fragment requests, \
         includes that failed.",
    ),
    (
        "lacquer_dictionary_events_total",
        "Compression dictionaries: Use-As-Dictionary responses held (kept), not held (refused), let go \
         (dropped).",
    ),
    (
        "lacquer_interim_responses_total",
        "Informational (1xx) responses sent to clients ahead of the answer: an origin's forwarded \
         (origin), a rule's early_hints (rule).",
    ),
    (
        "lacquer_slices_total",
        "Slices of objects on sliced routes: fetched from the origin, served from the store.",
    ),
    (
        "lacquer_coded_body_errors_total",
        "Compressed bodies that did not decode or expanded past max_object_size, by reason.",
    ),
    (
        "lacquer_cache_requests_total",
        "Client requests by cache result: hit, miss or pass.",
    ),
    (
        "lacquer_cache_hits_total",
        "Hits by the tier their first chunk came from.",
    ),
    (
        "lacquer_pipe_bytes_total",
        "Bytes pipe tunnels carried, by direction: to the backend, to the client.",
    ),
    (
        "lacquer_stale_served_total",
        "Stale objects served, by reason.",
    ),
    (
        "lacquer_purge_requests_total",
        "PURGE and BAN requests, by outcome.",
    ),
    (
        "lacquer_store_chunk_reads_total",
        "Body chunks read, by tier.",
    ),
    (
        "lacquer_objects_banned_total",
        "Objects removed by bans, by who tested them.",
    ),
    (
        "lacquer_objects_purged_total",
        "Objects invalidated by purges, by mode.",
    ),
    (
        "lacquer_client_connection_errors_total",
        "Client connections refused or closed early, by reason.",
    ),
    (
        "lacquer_client_request_errors_total",
        "Client requests refused (size, deny rules, rate limits), by reason.",
    ),
];

/// The Prometheus family of [`RuleMatches`]: one series per rule, labelled `rule` and `phase`. Apart from
/// [`FAMILY_HELP`] because its members come from the configuration, not from a declared field.
pub const RULE_MATCHES_METRIC: &str = "lacquer_rule_matches_total";

/// The description of [`RULE_MATCHES_METRIC`].
pub const RULE_MATCHES_HELP: &str =
    "Requests each [[rule]] matched in its phase, since the configuration holding it was loaded.";

/// How often one `[[rule]]` matched. A reload compiles the rules afresh, so the counts start again from 0
/// (as Varnish's VCL counters do when a new VCL is loaded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RuleMatches {
    /// Its `name`, or `rule[N]`.
    pub rule: String,
    /// `request`, `backend_request`, `backend_response`, `deliver` or `error`.
    pub phase: String,
    /// Requests (or responses) its conditions held for.
    pub matched: u64,
}

/// The whole statistics document: `GET /v1/stats`, and each event of `GET /v1/stats/stream`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Stats {
    pub version: String,
    pub uptime_seconds: u64,
    pub proxy: ProxyStats,
    pub store: StoreStats,
    /// Every `[[rule]]` in file order, with its matches. Absent from daemons without rules support.
    #[serde(default)]
    pub rules: Vec<RuleMatches>,
    /// Every client listener in configuration order, with its counters. Absent from daemons without
    /// per-listener counters.
    #[serde(default)]
    pub listeners: Vec<ListenerStats>,
    /// Client requests' time to the response head and to its end, by cache outcome (every outcome of
    /// [`OUTCOMES`](super::OUTCOMES), in that order). Absent from daemons without latency histograms.
    #[serde(default)]
    pub latency: Vec<super::OutcomeLatency>,
    /// Client responses by status code. Absent from daemons without them.
    #[serde(default)]
    pub responses: super::StatusCounts,
}

impl Stats {
    /// `proxy.hits`-style names with their fields and values, proxy first.
    pub fn values(&self) -> impl Iterator<Item = (String, &'static Field, u64)> + '_ {
        let proxy = self
            .proxy
            .values()
            .map(|(f, v)| (format!("proxy.{}", f.name), f, v));
        let store = self
            .store
            .values()
            .map(|(f, v)| (format!("store.{}", f.name), f, v));
        proxy.chain(store)
    }

    /// Every listener's values, named `listeners.ADDRESS.name` (`listeners.0.0.0.0:443.requests_http1`).
    pub fn listener_values(&self) -> impl Iterator<Item = (String, &'static Field, u64)> + '_ {
        self.listeners.iter().flat_map(|l| {
            l.counters
                .values()
                .map(move |(f, v)| (format!("listeners.{}.{}", l.address, f.name), f, v))
        })
    }

    /// The value called `section.name`, e.g. `proxy.hits`, or `listeners.ADDRESS.name`.
    pub fn get(&self, name: &str) -> Option<u64> {
        if let Some(listener) = name.strip_prefix("listeners.") {
            // The address has dots of its own; the field's name has none.
            let (address, field) = listener.rsplit_once('.')?;
            let l = self.listeners.iter().find(|l| l.address == address)?;
            return l.counters.get(field);
        }
        match name.split_once('.')? {
            ("proxy", field) => self.proxy.get(field),
            ("store", field) => self.store.get(field),
            _ => None,
        }
    }

    /// Per-second change of the value called `name` since `before`, taken `elapsed` earlier.
    pub fn rate_since(
        &self,
        name: &str,
        before: &Stats,
        elapsed: std::time::Duration,
    ) -> Option<f64> {
        let (now, then) = (self.get(name)?, before.get(name)?);
        (!elapsed.is_zero()).then(|| now.saturating_sub(then) as f64 / elapsed.as_secs_f64())
    }

    /// Several daemons' documents as one: every value summed, gauges included (objects and bytes add up
    /// across nodes; each node's ban list counts once per node; a 0/1 flag becomes the number of nodes
    /// raising it). The uptime is the shortest (every node has been up at least that long); the version,
    /// the distinct versions joined by `, `.
    pub fn sum<'a>(documents: impl IntoIterator<Item = &'a Stats>) -> Stats {
        let mut total = Stats::default();
        let mut versions: Vec<&str> = Vec::new();
        let mut uptime: Option<u64> = None;
        for stats in documents {
            total.proxy.add(&stats.proxy);
            total.store.add(&stats.store);
            for listener in &stats.listeners {
                let same = |l: &&mut ListenerStats| {
                    (&l.address, l.tls, l.quic) == (&listener.address, listener.tls, listener.quic)
                };
                match total.listeners.iter_mut().find(same) {
                    Some(l) => l.counters.add(&listener.counters),
                    None => total.listeners.push(listener.clone()),
                }
            }
            for rule in &stats.rules {
                match total
                    .rules
                    .iter_mut()
                    .find(|r| r.rule == rule.rule && r.phase == rule.phase)
                {
                    Some(r) => r.matched = r.matched.saturating_add(rule.matched),
                    None => total.rules.push(rule.clone()),
                }
            }
            for l in &stats.latency {
                match total.latency.iter_mut().find(|t| t.outcome == l.outcome) {
                    Some(t) => t.latency.add(&l.latency),
                    None => total.latency.push(l.clone()),
                }
            }
            for (code, n) in &stats.responses {
                *total.responses.entry(*code).or_default() += n;
            }
            if !versions.contains(&stats.version.as_str()) {
                versions.push(&stats.version);
            }
            uptime = Some(uptime.map_or(stats.uptime_seconds, |u| u.min(stats.uptime_seconds)));
        }
        total.version = versions.join(", ");
        total.uptime_seconds = uptime.unwrap_or(0);
        total
    }

    /// The matches of the rule called `rule` in `phase`.
    pub fn rule_matches(&self, rule: &str, phase: &str) -> Option<u64> {
        self.rules
            .iter()
            .find(|r| r.rule == rule && r.phase == phase)
            .map(|r| r.matched)
    }

    /// Per-second matches of the rule called `rule` in `phase` since `before`, taken `elapsed` earlier;
    /// none when either document lacks it. A count that went down (a reload restarted it) counts from 0.
    pub fn rule_rate_since(
        &self,
        rule: &str,
        phase: &str,
        before: &Stats,
        elapsed: std::time::Duration,
    ) -> Option<f64> {
        let (now, then) = (
            self.rule_matches(rule, phase)?,
            before.rule_matches(rule, phase)?,
        );
        let delta = if now >= then { now - then } else { now };
        (!elapsed.is_zero()).then(|| delta as f64 / elapsed.as_secs_f64())
    }

    /// Hits over hits, misses and passes, when there was any such request.
    pub fn hit_ratio(&self) -> Option<f64> {
        let p = &self.proxy;
        let total = p.hits + p.misses + p.passes;
        (total > 0).then(|| p.hits as f64 / total as f64)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use super::*;

    fn every_field() -> impl Iterator<Item = &'static Field> {
        ProxyStats::FIELDS.iter().chain(StoreStats::FIELDS)
    }

    #[test]
    fn the_table_describes_every_serialized_field() {
        let doc = serde_json::to_value(Stats::default()).unwrap();
        for (section, fields) in [("proxy", ProxyStats::FIELDS), ("store", StoreStats::FIELDS)] {
            let names: Vec<_> = doc[section].as_object().unwrap().keys().cloned().collect();
            let table: Vec<_> = fields.iter().map(|f| f.name.to_owned()).collect();
            assert_eq!(names, table, "{section}");
        }
    }

    #[test]
    fn values_line_up_with_names() {
        let stats = Stats {
            proxy: ProxyStats {
                hits: 7,
                connections: 3,
                ..Default::default()
            },
            store: StoreStats {
                objects_lurked: 5,
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(stats.get("proxy.hits"), Some(7));
        assert_eq!(stats.get("proxy.connections"), Some(3));
        assert_eq!(stats.get("store.objects_lurked"), Some(5));
        assert_eq!(stats.get("store.nope"), None);
        let doc = serde_json::to_value(&stats).unwrap();
        for (name, _, value) in stats.values() {
            let (section, field) = name.split_once('.').unwrap();
            assert_eq!(doc[section][field], value, "{name}");
        }
    }

    /// A document whose every value is distinct: `base` plus the field's position.
    fn numbered(base: u64, version: &str, uptime_seconds: u64) -> Stats {
        let mut doc = serde_json::to_value(Stats::default()).unwrap();
        let mut n = base;
        for section in ["proxy", "store"] {
            for value in doc[section].as_object_mut().unwrap().values_mut() {
                *value = n.into();
                n += 1;
            }
        }
        doc["version"] = version.into();
        doc["uptime_seconds"] = uptime_seconds.into();
        serde_json::from_value(doc).unwrap()
    }

    #[test]
    fn documents_sum_value_by_value() {
        // Each member's first value, version and uptime; the sum's version and uptime.
        type Member<'a> = (u64, &'a str, u64);
        let cases: [(&[Member], &str, u64); 4] = [
            (&[], "", 0),
            (&[(1, "0.1.0", 30)], "0.1.0", 30),
            (&[(1, "0.1.0", 30), (1_000, "0.1.0", 20)], "0.1.0", 20),
            (
                &[(1, "0.1.0", 30), (1_000, "0.2.0", 50), (7, "0.1.0", 40)],
                "0.1.0, 0.2.0",
                30,
            ),
        ];
        for (members, version, uptime) in cases {
            let docs: Vec<Stats> = members
                .iter()
                .map(|(base, v, up)| numbered(*base, v, *up))
                .collect();
            let total = Stats::sum(&docs);
            assert_eq!(total.version, version, "{members:?}");
            assert_eq!(total.uptime_seconds, uptime, "{members:?}");
            for (name, _, value) in total.values() {
                let want: u64 = docs.iter().map(|d| d.get(&name).unwrap()).sum();
                assert_eq!(value, want, "{name} of {members:?}");
            }
        }
        let full = Stats {
            proxy: ProxyStats {
                hits: u64::MAX - 1,
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(Stats::sum([&full, &full]).proxy.hits, u64::MAX, "saturates");
    }

    fn rules(counts: &[(&str, &str, u64)]) -> Stats {
        Stats {
            rules: counts
                .iter()
                .map(|(rule, phase, matched)| RuleMatches {
                    rule: rule.to_string(),
                    phase: phase.to_string(),
                    matched: *matched,
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn rule_counts_sum_by_rule_and_phase_and_rate_across_a_reload() {
        let a = rules(&[("static", "request", 5), ("hsts", "deliver", 2)]);
        let b = rules(&[("hsts", "deliver", 10), ("static", "deliver", 1)]);
        assert_eq!(
            Stats::sum([&a, &b]).rules,
            rules(&[
                ("static", "request", 5),
                ("hsts", "deliver", 12),
                ("static", "deliver", 1)
            ])
            .rules,
            "one entry per rule and phase, in the order first seen"
        );
        let later = rules(&[("static", "request", 25), ("hsts", "deliver", 1)]);
        let two = std::time::Duration::from_secs(2);
        assert_eq!(
            later.rule_rate_since("static", "request", &a, two),
            Some(10.0)
        );
        assert_eq!(
            later.rule_rate_since("hsts", "deliver", &a, two),
            Some(0.5),
            "a count that restarted counts from 0"
        );
        assert_eq!(later.rule_rate_since("new", "request", &a, two), None);
        let mut old = serde_json::to_value(Stats::default()).unwrap();
        old.as_object_mut().unwrap().remove("rules");
        let old: Stats = serde_json::from_value(old).unwrap();
        assert!(old.rules.is_empty(), "a document without rules reads");
    }

    /// The families `fields` make, checked against Prometheus' conventions, with the label names of each:
    /// `described` must describe exactly those with labels (beside `extra_labels`, which every series
    /// gets).
    fn families_of<'a>(
        fields: impl Iterator<Item = &'a Field>,
        described: &[(&str, &str)],
    ) -> HashMap<&'a str, (Kind, Vec<&'a str>)> {
        let name = |s: &str| {
            s.starts_with("lacquer_")
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        let mut families: HashMap<&str, (Kind, Vec<&str>)> = HashMap::new();
        let mut series = HashSet::new();
        for f in fields {
            assert!(name(f.metric), "{}", f.metric);
            assert_eq!(
                f.metric.ends_with("_total"),
                f.kind == Kind::Counter,
                "counters and only counters end in _total: {}",
                f.metric
            );
            assert!(
                !f.help().is_empty() && !f.help().contains("  "),
                "{}",
                f.name
            );
            let label_names: Vec<&str> = f.labels.iter().map(|(k, _)| *k).collect();
            let family = families
                .entry(f.metric)
                .or_insert((f.kind, label_names.clone()));
            assert_eq!(family.0, f.kind, "one kind per family: {}", f.metric);
            assert_eq!(
                family.1, label_names,
                "one label set per family: {}",
                f.metric
            );
            assert!(
                series.insert((f.metric, f.labels)),
                "two fields are one series: {}",
                f.name
            );
        }
        for (family, (_, labels)) in &families {
            let is_described = described.iter().any(|(n, _)| n == family);
            assert_eq!(is_described, !labels.is_empty(), "{family}");
        }
        assert_eq!(
            described.len(),
            families.values().filter(|(_, l)| !l.is_empty()).count()
        );
        families
    }

    #[test]
    fn metric_names_follow_prometheus_conventions() {
        let families = families_of(every_field(), FAMILY_HELP);
        let listeners = families_of(ListenerCounters::FIELDS.iter(), LISTENER_FAMILY_HELP);
        for (family, (_, labels)) in &listeners {
            assert!(family.starts_with("lacquer_listener_"), "{family}");
            assert!(
                !families.contains_key(family),
                "{family} is the listeners' alone"
            );
            assert!(!labels.contains(&LISTENER_LABEL), "{family}");
        }
        let name = |s: &str| s.starts_with("lacquer_") && s.ends_with("_total");
        assert!(name(RULE_MATCHES_METRIC));
        assert!(
            !families.contains_key(RULE_MATCHES_METRIC),
            "the rules' family is theirs alone"
        );
    }

    #[test]
    fn listeners_sum_by_address_and_an_older_document_reads() {
        let listener = |address: &str, quic: bool, requests: u64| ListenerStats {
            address: address.into(),
            tls: true,
            quic,
            counters: ListenerCounters {
                requests_http1: requests,
                ..Default::default()
            },
        };
        let a = Stats {
            listeners: vec![
                listener("0.0.0.0:443", true, 5),
                listener("0.0.0.0:80", false, 1),
            ],
            ..Default::default()
        };
        let b = Stats {
            listeners: vec![
                listener("0.0.0.0:443", true, 7),
                listener("0.0.0.0:8443", false, 2),
            ],
            ..Default::default()
        };
        assert_eq!(
            Stats::sum([&a, &b]).listeners,
            vec![
                listener("0.0.0.0:443", true, 12),
                listener("0.0.0.0:80", false, 1),
                listener("0.0.0.0:8443", false, 2)
            ]
        );
        let mut old = serde_json::to_value(&a).unwrap();
        old.as_object_mut().unwrap().remove("listeners");
        let old: Stats = serde_json::from_value(old).unwrap();
        assert!(old.listeners.is_empty());
        assert_eq!(a.get("listeners.0.0.0.0:443.requests_http1"), Some(5));
        assert_eq!(a.get("listeners.0.0.0.0:80.requests_http1"), Some(1));
        assert_eq!(a.get("listeners.0.0.0.0:81.requests_http1"), None);
        let named: Vec<_> = a.listener_values().map(|(n, _, v)| (n, v)).collect();
        assert_eq!(named.len(), 2 * ListenerCounters::FIELDS.len());
        assert!(named.contains(&("listeners.0.0.0.0:80.requests_http1".into(), 1)));
        let sparse: ListenerStats =
            serde_json::from_value(serde_json::json!({ "address": "[::]:80" })).unwrap();
        assert_eq!(sparse.counters, ListenerCounters::default());
    }
}
