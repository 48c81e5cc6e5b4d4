//! The store's statistics, each declared once below: either `kept` (a counter the store adds to as things
//! happen) or `read` (a value read from foyer, the ban list, the journal or the health record when a
//! snapshot is taken). The declaration makes the counters, the [`StoreStatsSnapshot`] the daemon reads, and
//! [`for_each_store_stat!`](crate::for_each_store_stat), which hands every name to the daemon's conversion
//! into the admin API's wire type: a statistic missing on either side does not compile. The wire type
//! (`lacquer_admin::wire::StoreStats`) gives each its Prometheus name and operator-facing description.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

use super::Store;

/// One counter the store keeps: lock-free and relaxed, since a snapshot only needs to be consistent enough
/// for monitoring.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`.
    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }

    /// Subtracts `n`, stopping at zero: a gauge the sweeper recounted may be lower than what is removed
    /// after the count.
    pub(crate) fn sub(&self, n: u64) {
        let _ = self
            .0
            .fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(n)));
    }

    /// Replaces the value (a gauge recounted from the records).
    pub(crate) fn set(&self, n: u64) {
        self.0.store(n, Relaxed);
    }

    fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

macro_rules! store_stats {
    (
        $d:tt
        kept { $($(#[doc = $kdoc:literal])+ $kept:ident,)* }
        read { $($(#[doc = $rdoc:literal])+ $read:ident,)* }
    ) => {
        /// The statistics the store counts itself, as things happen.
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $($(#[doc = $kdoc])+ pub(crate) $kept: Counter,)*
        }

        /// The statistics read when a snapshot is taken; building one names every such value, so none is
        /// forgotten.
        struct Read {
            $($read: u64,)*
        }

        /// A copy of the store's statistics, consistent enough for monitoring (each value is read on its
        /// own). Gauges say so; every other value only grows until a restart.
        #[derive(Debug, Clone, Default, Serialize)]
        pub struct StoreStatsSnapshot {
            $($(#[doc = $kdoc])+ pub $kept: u64,)*
            $($(#[doc = $rdoc])+ pub $read: u64,)*
        }

        impl Counters {
            fn snapshot(&self, read: Read) -> StoreStatsSnapshot {
                let Read { $($read),* } = read;
                StoreStatsSnapshot {
                    $($kept: self.$kept.get(),)*
                    $($read,)*
                }
            }
        }

        /// Calls the macro named `$callback` with the name of every field of
        /// [`StoreStatsSnapshot`](crate::StoreStatsSnapshot), comma-separated: how the daemon converts a
        /// snapshot into the admin API's wire type without writing the list out again.
        #[macro_export]
        macro_rules! for_each_store_stat {
            ($d callback:ident) => {
                $d callback! { $($kept,)* $($read,)* }
            };
        }
    };
}

store_stats! {
    $
    kept {
        /// Stored variants (gauge).
        objects,
        /// Body bytes of stored variants (gauge).
        stored_bytes,
        /// Objects made visible to lookups.
        objects_published,
        /// Published objects whose chunks foyer has finished writing to disk and whose record sled has
        /// flushed: they survive a `kill -9`.
        objects_durable,
        /// Objects removed at the proxy's request (unsafe-method invalidation, lost bodies).
        objects_removed,
        /// Variants the sweeper removed: past their keep time, or their body evicted.
        objects_swept,
        /// Body chunks given to foyer.
        chunks_written,
        /// Bytes of the body chunks given to foyer.
        chunk_bytes_written,
        /// Chunks read from the memory tier.
        chunk_reads_memory,
        /// Chunks read from the disk tier.
        chunk_reads_disk,
        /// Chunks of a large body one reader got from another's disk read (in flight, or a moment ago)
        /// instead of reading the device again.
        disk_reads_shared,
        /// Chunks that metadata promised but the body cache no longer had (evicted or lost in a crash), or
        /// had at another length.
        chunks_missing,
        /// Variants dropped because a key had more than `max_variants`.
        variants_overflowed,
        /// Times the writer waited for foyer's disk writes (and flushed sled): each makes the objects
        /// published before it durable.
        write_waits,
        /// Metadata and ban records that could not be decoded, and were dropped.
        corrupt_records,
        /// Bans added.
        bans_added,
        /// Bans the lurker finished: every object stored before them was tested.
        bans_completed,
        /// Objects removed by a ban when a lookup tested them.
        objects_banned,
        /// Objects removed by a ban when the lurker tested them.
        objects_lurked,
        /// Walks the ban lurker finished.
        lurker_walks,
        /// Metadata records the lurker has tested.
        lurker_records_tested,
        /// Purge operations (by URL or by tags).
        purges,
        /// Variants removed by hard purges.
        objects_purged,
        /// Variants made stale by soft purges (still served within grace).
        objects_soft_purged,
        /// Fetches that completed after a purge or ban covering them, so were not stored.
        publishes_cancelled,
        /// Fills not stored because the disk was full or a store task had died.
        fills_refused,
        /// Objects found at start that an acknowledged purge or ban covers (sled rolled back by a crash or
        /// damage), removed again.
        objects_invalidated_at_start,
        /// Objects dropped at start because the invalidation journal was damaged or missing, so they could not
        /// be proven not purged or banned.
        objects_unverified,
    }
    read {
        /// Bytes of chunks in the memory tier (gauge).
        memory_bytes_used,
        /// Bytes the memory tier may hold (gauge).
        memory_bytes_capacity,
        /// Bytes the disk tier may use, after fitting it to the free space at start (gauge).
        disk_bytes_capacity,
        /// Bytes in disk-tier blocks that hold data (gauge; the tier fills and reclaims whole blocks).
        disk_bytes_used,
        /// Bytes written to the disk device since start.
        disk_bytes_written,
        /// Bytes read from the disk device since start.
        disk_bytes_read,
        /// Entries foyer refused to write because its queues were full (should stay 0: the writer applies
        /// backpressure).
        foyer_drops,
        /// Chunks the memory tier evicted to make room.
        memory_evictions,
        /// Bans in the list, completed ones included (gauge).
        bans,
        /// Bans the lurker has not finished with (gauge).
        bans_pending,
        /// 1 while the store's filesystem is below its free-space reserve: new objects are not stored (gauge).
        disk_full,
        /// 1 when the store could not be opened at start and was moved aside: it started empty (gauge).
        damaged_at_start,
        /// 1 when the store directory could not be used at all: nothing is kept across restarts (gauge).
        memory_only,
        /// Store tasks (writer, sweeper, lurker, foyer's) that died; the store no longer stores new objects.
        tasks_failed,
        /// Entries in the invalidation journal (gauge; compacted by the sweeper).
        journal_entries,
        /// Keys in the in-memory index of stored keys, by hash (gauge): a key it does not hold is a miss
        /// without a metadata read.
        key_index_keys,
        /// Bytes the index of stored keys takes (gauge; 10 to 21 per key).
        key_index_bytes,
        /// 1 once the index of stored keys has been rebuilt after start; until then every miss reads the
        /// metadata (gauge).
        key_index_ready,
        /// 1 once every object stored before the start has been checked against the invalidation journal
        /// (after a crash the check walks the records in the background; until it is done each record is
        /// checked when first read) (gauge).
        journal_replayed,
    }
}

/// What foyer only reports through its metrics.
struct FoyerMetrics {
    /// Entries it ignored because a flush queue or buffer was full.
    drops: u64,
    memory_evictions: u64,
    /// Bytes in every disk block that is not clean.
    disk_bytes_used: u64,
}

impl Store {
    /// The store's statistics now. Cheap enough to take every second (atomics, and one gather of foyer's
    /// metrics registry); `lacquerd` takes one per `/v1/stats` request and per event of the stats stream.
    pub fn stats(&self) -> StoreStatsSnapshot {
        let inner = &self.inner;
        let foyer = self.foyer_metrics();
        let health = &inner.health;
        let (key_index_keys, key_index_bytes) = inner.keys.size();
        inner.counters.snapshot(Read {
            memory_bytes_used: inner.chunks.memory().usage() as u64,
            memory_bytes_capacity: inner.chunks.memory().capacity() as u64,
            disk_bytes_capacity: inner.config.disk_bytes as u64,
            disk_bytes_used: foyer.disk_bytes_used,
            disk_bytes_written: inner.chunks.statistics().disk_write_bytes() as u64,
            disk_bytes_read: inner.chunks.statistics().disk_read_bytes() as u64,
            foyer_drops: foyer.drops,
            memory_evictions: foyer.memory_evictions,
            bans: inner.bans.snapshot().len() as u64,
            bans_pending: inner.bans.pending() as u64,
            disk_full: u64::from(inner.disk.as_ref().is_some_and(|g| g.is_full())),
            damaged_at_start: u64::from(health.was_damaged_at_start()),
            memory_only: u64::from(health.is_memory_only()),
            tasks_failed: health.tasks_failed(),
            journal_entries: inner.journal.len() as u64,
            key_index_keys,
            key_index_bytes,
            key_index_ready: u64::from(inner.keys.is_complete()),
            journal_replayed: u64::from(!self.replay_pending()),
        })
    }

    fn foyer_metrics(&self) -> FoyerMetrics {
        let families = self.inner.registry.gather();
        let sum = |family: &str, label: &str, values: &[&str], gauge: bool| -> u64 {
            families
                .iter()
                .filter(|f| f.name() == family)
                .flat_map(|f| f.get_metric())
                .filter(|m| {
                    values.is_empty()
                        || m.get_label()
                            .iter()
                            .any(|l| l.name() == label && values.contains(&l.value()))
                })
                .map(|m| {
                    if gauge {
                        m.get_gauge().value() as u64
                    } else {
                        m.get_counter().value() as u64
                    }
                })
                .sum()
        };
        let used_blocks = sum(
            "foyer_storage_block_engine_block",
            "type",
            &["writing", "evictable", "reclaiming"],
            true,
        );
        let block_size = sum("foyer_storage_block_engine_block_size_bytes", "", &[], true);
        FoyerMetrics {
            drops: sum(
                "foyer_storage_inner_op_total",
                "op",
                &["buffer_overflow", "channel_overflow"],
                false,
            ),
            memory_evictions: sum("foyer_memory_op_total", "op", &["evict"], false),
            disk_bytes_used: used_blocks * block_size,
        }
    }

    /// The `objects` and `stored_bytes` gauges, as a clean close records them for the next start.
    pub(crate) fn counted(&self) -> (u64, u64) {
        (
            self.inner.counters.objects.get(),
            self.inner.counters.stored_bytes.get(),
        )
    }

    /// Replaces the `objects` and `stored_bytes` gauges with a count over the records (the sweeper's walk
    /// and the start-up replay): adds and subtracts as objects come and go drift when a crash loses some.
    pub(crate) fn recount(&self, objects: u64, bytes: u64) {
        self.inner.counters.objects.set(objects);
        self.inner.counters.stored_bytes.set(bytes);
    }
}
