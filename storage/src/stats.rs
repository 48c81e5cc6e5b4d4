use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

/// Counters the store keeps; read with [`StoreStats::snapshot`].
#[derive(Debug, Default)]
pub struct StoreStats {
    pub(crate) objects: AtomicU64,
    pub(crate) stored_bytes: AtomicU64,
    pub(crate) objects_published: AtomicU64,
    pub(crate) objects_durable: AtomicU64,
    pub(crate) objects_removed: AtomicU64,
    pub(crate) objects_swept: AtomicU64,
    pub(crate) chunks_written: AtomicU64,
    pub(crate) chunk_bytes_written: AtomicU64,
    pub(crate) chunk_reads_memory: AtomicU64,
    pub(crate) chunk_reads_disk: AtomicU64,
    pub(crate) chunks_missing: AtomicU64,
    pub(crate) variants_overflowed: AtomicU64,
    pub(crate) write_waits: AtomicU64,
    pub(crate) corrupt_records: AtomicU64,
    pub(crate) bans_added: AtomicU64,
    pub(crate) bans_completed: AtomicU64,
    pub(crate) objects_banned: AtomicU64,
    pub(crate) objects_lurked: AtomicU64,
    pub(crate) lurker_walks: AtomicU64,
    pub(crate) lurker_records_tested: AtomicU64,
    pub(crate) purges: AtomicU64,
    pub(crate) objects_purged: AtomicU64,
    pub(crate) objects_soft_purged: AtomicU64,
    pub(crate) publishes_cancelled: AtomicU64,
    pub(crate) fills_refused: AtomicU64,
    pub(crate) objects_invalidated_at_start: AtomicU64,
    pub(crate) objects_unverified: AtomicU64,
}

/// A consistent-enough copy of the store's counters and gauges.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StoreStatsSnapshot {
    /// Stored variants (gauge).
    pub objects: u64,
    /// Body bytes of stored variants (gauge).
    pub stored_bytes: u64,
    /// Bytes of chunks in the memory tier (gauge).
    pub memory_bytes_used: u64,
    pub memory_bytes_capacity: u64,
    pub disk_bytes_capacity: u64,
    /// Bytes in disk-tier blocks that hold data (gauge; the tier fills and reclaims whole blocks).
    pub disk_bytes_used: u64,
    /// Bytes written to the disk device since start.
    pub disk_bytes_written: u64,
    /// Bytes read from the disk device since start.
    pub disk_bytes_read: u64,
    pub objects_published: u64,
    /// Published objects whose chunks foyer has finished writing to disk.
    pub objects_durable: u64,
    pub objects_removed: u64,
    pub objects_swept: u64,
    pub chunks_written: u64,
    pub chunk_bytes_written: u64,
    pub chunk_reads_memory: u64,
    pub chunk_reads_disk: u64,
    /// Chunks that metadata promised but the body cache no longer had (evicted or lost in a crash).
    pub chunks_missing: u64,
    pub variants_overflowed: u64,
    /// Entries foyer refused to write because its queues were full (should stay 0: the writer applies
    /// backpressure).
    pub foyer_drops: u64,
    pub write_waits: u64,
    /// Chunks the memory tier evicted to make room.
    pub memory_evictions: u64,
    pub corrupt_records: u64,
    /// Bans in the list, completed ones included (gauge).
    pub bans: u64,
    /// Bans the lurker has not finished with (gauge).
    pub bans_pending: u64,
    pub bans_added: u64,
    /// Bans the lurker finished: every object stored before them was tested.
    pub bans_completed: u64,
    /// Objects removed by a ban when a lookup tested them.
    pub objects_banned: u64,
    /// Objects removed by a ban when the lurker tested them.
    pub objects_lurked: u64,
    pub lurker_walks: u64,
    /// Metadata records the lurker has tested.
    pub lurker_records_tested: u64,
    /// Purge operations (by URL or by tags).
    pub purges: u64,
    pub objects_purged: u64,
    pub objects_soft_purged: u64,
    /// Fetches that completed after a purge or ban covering them, so were not stored.
    pub publishes_cancelled: u64,
    /// 1 while the store's filesystem is below its free-space reserve: new objects are not stored (gauge).
    pub disk_full: u64,
    /// Fills not stored because the disk was full or a store task had died.
    pub fills_refused: u64,
    /// 1 when the store could not be opened at start and was moved aside: it started empty (gauge).
    pub damaged_at_start: u64,
    /// 1 when the store directory could not be used at all: nothing is kept across restarts (gauge).
    pub memory_only: u64,
    /// Store tasks (writer, sweeper, lurker, foyer's) that died; the store no longer stores new objects.
    pub tasks_failed: u64,
    /// Entries in the invalidation journal (gauge; compacted by the sweeper).
    pub journal_entries: u64,
    /// Objects found at start that an acknowledged purge or ban covers (sled rolled back by a crash or
    /// damage), removed again.
    pub objects_invalidated_at_start: u64,
    /// Objects dropped at start because the invalidation journal was damaged or missing, so they could not
    /// be proven not purged or banned.
    pub objects_unverified: u64,
}

impl StoreStats {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }

    pub(crate) fn sub(counter: &AtomicU64, n: u64) {
        let _ = counter.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(n)));
    }

    pub(crate) fn fill(&self, s: &mut StoreStatsSnapshot) {
        let get = |c: &AtomicU64| c.load(Relaxed);
        s.objects = get(&self.objects);
        s.stored_bytes = get(&self.stored_bytes);
        s.objects_published = get(&self.objects_published);
        s.objects_durable = get(&self.objects_durable);
        s.objects_removed = get(&self.objects_removed);
        s.objects_swept = get(&self.objects_swept);
        s.chunks_written = get(&self.chunks_written);
        s.chunk_bytes_written = get(&self.chunk_bytes_written);
        s.chunk_reads_memory = get(&self.chunk_reads_memory);
        s.chunk_reads_disk = get(&self.chunk_reads_disk);
        s.chunks_missing = get(&self.chunks_missing);
        s.variants_overflowed = get(&self.variants_overflowed);
        s.write_waits = get(&self.write_waits);
        s.corrupt_records = get(&self.corrupt_records);
        s.bans_added = get(&self.bans_added);
        s.bans_completed = get(&self.bans_completed);
        s.objects_banned = get(&self.objects_banned);
        s.objects_lurked = get(&self.objects_lurked);
        s.lurker_walks = get(&self.lurker_walks);
        s.lurker_records_tested = get(&self.lurker_records_tested);
        s.purges = get(&self.purges);
        s.objects_purged = get(&self.objects_purged);
        s.objects_soft_purged = get(&self.objects_soft_purged);
        s.publishes_cancelled = get(&self.publishes_cancelled);
        s.fills_refused = get(&self.fills_refused);
        s.objects_invalidated_at_start = get(&self.objects_invalidated_at_start);
        s.objects_unverified = get(&self.objects_unverified);
    }
}
