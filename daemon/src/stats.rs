//! The daemon's counters: lock-free on the hot path, read as one snapshot by the admin API.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident),* $(,)?) => {
        /// Counters and gauges of the proxy.
        #[derive(Debug, Default)]
        pub struct Stats {
            $($(#[doc = $doc])* pub $name: AtomicU64,)*
        }

        /// A copy of [`Stats`], as served by `GET /v1/stats`.
        #[derive(Debug, Clone, Default, Serialize)]
        pub struct ProxyStatsSnapshot {
            $($(#[doc = $doc])* pub $name: u64,)*
        }

        impl Stats {
            pub fn snapshot(&self) -> ProxyStatsSnapshot {
                ProxyStatsSnapshot { $($name: self.$name.load(Relaxed),)* }
            }
        }
    };
}

counters! {
    /// Client requests received.
    requests,
    /// Requests answered from the store.
    hits,
    /// Hits whose first chunk came from the memory tier.
    hits_memory,
    /// Hits whose first chunk came from the disk tier.
    hits_disk,
    /// Stale objects served within grace while a background fetch refreshed them.
    stale_served,
    /// Stale objects served because the origin failed (refused, reset, timed out, or 5xx).
    stale_on_error,
    /// Cacheable requests the store could not answer.
    misses,
    /// Requests passed to the backend without lookup.
    passes,
    /// Requests that attached to a fetch already in flight instead of going to the backend.
    coalesced_waiters,
    /// Misses sent straight to the backend because the key recently proved uncacheable.
    hit_for_miss,
    /// Responses to cacheable requests that could not be stored.
    uncacheable,
    /// Requests sent to the backend (fetches and passes).
    backend_requests,
    /// Backend requests that failed: refused, reset, timed out, or cut short.
    backend_errors,
    /// Backend fetches in flight (gauge).
    fetches_in_flight,
    /// Objects stored after a fetch.
    objects_stored,
    /// Stale objects the origin confirmed with a 304: headers and freshness refreshed, body not resent.
    revalidations,
    /// Store lookups that found metadata but not the whole body (evicted or lost in a crash).
    bodies_lost,
    /// Objects invalidated by unsafe methods.
    invalidations,
    /// `PURGE` and `BAN` requests accepted from allowed clients.
    purge_requests,
    /// `PURGE` and `BAN` requests refused (methods off, or client not in `purge.allow_from`).
    purge_requests_refused,
    /// Body bytes received from backends.
    bytes_in,
    /// Body bytes sent to clients.
    bytes_out,
    /// Client connections accepted.
    connections,
}

pub fn inc(counter: &AtomicU64) {
    counter.fetch_add(1, Relaxed);
}

pub fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Relaxed);
}

pub fn dec(counter: &AtomicU64) {
    counter.fetch_sub(1, Relaxed);
}
