use std::{path::PathBuf, time::Duration};

use crate::{error::StoreError, store::Store};

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
/// foyer aligns entries to 4 KiB pages; blocks must hold a full chunk plus its entry header.
const PAGE: usize = 4 * KIB;

/// A body announced at least this many large chunks long is split into them
/// ([`StoreBuilder::with_large_chunk_size`]).
pub(crate) const LARGE_BODY_CHUNKS: usize = 8;

/// Settings of a [`Store`]. Every setting has a default chosen for a small appliance; see each method.
#[derive(Debug, Clone)]
pub struct StoreBuilder {
    pub(crate) dir: PathBuf,
    pub(crate) memory_bytes: usize,
    pub(crate) disk_bytes: usize,
    pub(crate) chunk_size: usize,
    pub(crate) large_chunk_size: usize,
    pub(crate) flushers: usize,
    pub(crate) metadata_cache_bytes: usize,
    pub(crate) metadata_page_cache_bytes: usize,
    pub(crate) max_variants: usize,
    pub(crate) sweep_interval: Duration,
}

impl StoreBuilder {
    /// A store in `dir`: sled metadata in `dir/meta`, foyer bodies in `dir/bodies`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            memory_bytes: 256 * MIB,
            disk_bytes: 1024 * MIB,
            chunk_size: 256 * KIB,
            large_chunk_size: MIB,
            flushers: 2,
            metadata_cache_bytes: 64 * MIB,
            metadata_page_cache_bytes: 32 * MIB,
            max_variants: 16,
            sweep_interval: Duration::from_secs(60),
        }
    }

    /// Bytes of body chunks held in the memory tier. Default: 256 MiB.
    pub fn with_memory_bytes(mut self, bytes: usize) -> Self {
        self.memory_bytes = bytes;
        self
    }

    /// Bytes of disk the body tier may use; never derived from free space. Default: 1 GiB.
    pub fn with_disk_bytes(mut self, bytes: usize) -> Self {
        self.disk_bytes = bytes;
        self
    }

    /// Size of the pieces bodies are split into: a range or a first byte reads one chunk. Default: 256 KiB
    /// (see `docs/architecture.md` for the measurement behind it).
    pub fn with_chunk_size(mut self, bytes: usize) -> Self {
        self.chunk_size = bytes;
        self
    }

    /// Size of the pieces of a large body: one whose announced length (`Content-Length`) is at least
    /// eight of them (8 MiB at the default), such as a download or a video file. A read from
    /// the disk tier costs foyer about the same CPU per entry whatever its size besides the bytes (a read on
    /// a blocking thread and four wake-ups, two allocations, an index lookup), and a large body is read
    /// whole far more often than its ranges are: with 1 MiB pieces a 200 MiB body read from disk cost
    /// 15-19 % less CPU per byte than with 256 KiB ones, back to back (bench/large.py). Used only where the disk tier's
    /// blocks hold four such pieces and the memory tier sixteen (with smaller tiers, large bodies use
    /// [`StoreBuilder::with_chunk_size`]); at most the chunk size, every body uses that. A segment of a few
    /// MiB keeps the smaller chunks, and with them its first byte and its ranges (see `docs/architecture.md`).
    /// Default: 1 MiB.
    pub fn with_large_chunk_size(mut self, bytes: usize) -> Self {
        self.large_chunk_size = bytes;
        self
    }

    /// The chunk size for a body announced `length` bytes long (`None`: not announced).
    pub(crate) fn chunk_size_for(&self, length: Option<u64>) -> usize {
        let large = self.large_chunk_size.max(self.chunk_size);
        let fits = self.block_size() >= 4 * (large + PAGE) && self.memory_bytes >= 16 * large;
        match length {
            Some(len) if fits && len >= (LARGE_BODY_CHUNKS * large) as u64 => large,
            _ => self.chunk_size,
        }
    }

    /// foyer flusher tasks writing blocks to disk concurrently. Default: 2.
    pub fn with_flushers(mut self, flushers: usize) -> Self {
        self.flushers = flushers;
        self
    }

    /// Bytes of object metadata kept in memory so that hits never touch sled, counted as what the entries
    /// take from the allocator, the head a hit prepares included (about 2.5 KiB for an object with a few
    /// headers; `store/hot.rs`). Default: 64 MiB.
    pub fn with_metadata_cache_bytes(mut self, bytes: usize) -> Self {
        self.metadata_cache_bytes = bytes;
        self
    }

    /// Bytes of sled's page cache, which lookups outside the hot metadata and the walks over every record
    /// read through (sled's own default, 1 GiB, would let memory grow with the number of objects).
    /// Default: 32 MiB.
    pub fn with_metadata_page_cache_bytes(mut self, bytes: usize) -> Self {
        self.metadata_page_cache_bytes = bytes;
        self
    }

    /// Most `Vary` variants kept per cache key; the oldest is dropped past it. Default: 16.
    pub fn with_max_variants(mut self, max: usize) -> Self {
        self.max_variants = max;
        self
    }

    /// How often expired metadata and metadata of evicted bodies is swept from sled. Default: 60 s.
    pub fn with_sweep_interval(mut self, interval: Duration) -> Self {
        self.sweep_interval = interval;
        self
    }

    /// Size of a foyer disk block: the unit of disk eviction. Sized so the disk holds at least 64 blocks (so
    /// eviction frees a small share at a time) and at most 16 MiB, foyer's default.
    pub(crate) fn block_size(&self) -> usize {
        let floor = align_up(4 * (self.chunk_size + PAGE));
        align_up(self.disk_bytes / 64).clamp(floor, (16 * MIB).max(floor))
    }

    /// Flush buffers: room for two blocks per flusher, so one fills while the other is written.
    pub(crate) fn buffer_pool_bytes(&self) -> usize {
        2 * self.flushers * self.block_size()
    }

    /// Free bytes the store must keep on its filesystem: what foyer may have in flight (its flush buffers)
    /// plus room for sled's log and the invalidation journal.
    pub(crate) fn disk_reserve(&self) -> u64 {
        self.buffer_pool_bytes() as u64 + crate::space::METADATA_RESERVE
    }

    /// The disk tier's size on a filesystem where `usable` bytes are free or already the tier's: the
    /// configured size when it fits with the reserve, otherwise the largest power of two MiB that does (a
    /// power of two, so that the block layout stays the same across restarts while free space wavers), but
    /// never under the 8 blocks the tier needs: the disk guard keeps even that from filling the disk.
    pub(crate) fn fitted_disk_bytes(&self, usable: u64) -> usize {
        if self.disk_bytes as u64 + self.disk_reserve() <= usable {
            return self.disk_bytes;
        }
        let mut fitted = self.clone();
        for _ in 0..4 {
            let room = usable.saturating_sub(fitted.disk_reserve()).max(MIB as u64);
            let pow2 = 1u64 << (63 - room.leading_zeros());
            fitted.disk_bytes = (pow2 as usize).clamp(MIB, self.disk_bytes);
        }
        let floor = 8 * fitted.block_size();
        fitted.disk_bytes.max(floor.min(self.disk_bytes))
    }

    /// Checks the settings without touching the disk (used by `lacquerd --check`).
    pub fn validate(&self) -> Result<(), StoreError> {
        let bad = |what: String| Err(StoreError::Config(what));
        if self.chunk_size < 4 * KIB || self.chunk_size > 4 * MIB {
            return bad(format!(
                "chunk size {} must be between 4 KiB and 4 MiB",
                self.chunk_size
            ));
        }
        if self.large_chunk_size > 4 * MIB {
            return bad(format!(
                "large chunk size {} must be at most 4 MiB",
                self.large_chunk_size
            ));
        }
        if self.memory_bytes < 4 * self.chunk_size {
            return bad(format!(
                "memory {} must hold at least four chunks of {}",
                self.memory_bytes, self.chunk_size
            ));
        }
        if self.disk_bytes < 8 * self.block_size() {
            return bad(format!(
                "disk size {} is too small: it must hold at least 8 blocks of {} bytes",
                self.disk_bytes,
                self.block_size()
            ));
        }
        if self.flushers == 0 || self.max_variants == 0 {
            return bad("flushers and max variants must be at least 1".into());
        }
        Ok(())
    }

    /// Opens (or creates) the store. Disk tasks, the write pipeline and the sweeper run on `runtime`, which
    /// should not be a runtime that serves clients.
    pub async fn open(self, runtime: tokio::runtime::Handle) -> Result<Store, StoreError> {
        self.validate()?;
        Store::open(self, runtime).await
    }
}

fn align_up(n: usize) -> usize {
    n.div_ceil(PAGE) * PAGE
}

#[cfg(test)]
impl StoreBuilder {
    /// A store small enough for unit tests: 8 MiB of memory, 64 MiB of disk, 64 KiB chunks.
    pub(crate) fn small(dir: impl Into<PathBuf>) -> Self {
        Self::new(dir)
            .with_memory_bytes(8 << 20)
            .with_disk_bytes(64 << 20)
            .with_chunk_size(64 << 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_size_follows_disk_and_chunk() {
        let b = StoreBuilder::new("/x");
        assert_eq!(b.block_size(), 16 * MIB);
        let small = StoreBuilder::new("/x").with_disk_bytes(64 * MIB);
        assert_eq!(small.block_size(), 4 * (256 * KIB + PAGE));
        let big_chunks = StoreBuilder::new("/x").with_chunk_size(4 * MIB);
        assert!(big_chunks.block_size() >= 4 * 4 * MIB);
        assert!(small.validate().is_ok());
    }

    #[test]
    fn large_bodies_take_large_chunks_where_the_tiers_hold_them() {
        let b = StoreBuilder::new("/x").with_memory_bytes(64 * MIB);
        assert_eq!(b.chunk_size_for(None), 256 * KIB, "no length announced");
        assert_eq!(
            b.chunk_size_for(Some(4 * MIB as u64)),
            256 * KIB,
            "an HLS segment"
        );
        assert_eq!(b.chunk_size_for(Some(8 * MIB as u64 - 1)), 256 * KIB);
        assert_eq!(b.chunk_size_for(Some(8 * MIB as u64)), MIB);
        assert_eq!(b.chunk_size_for(Some(200 * MIB as u64)), MIB);
        // Blocks of 4 MiB hold four 1 MiB chunks but not their entry headers; 8 MiB of memory not sixteen.
        let small_disk = b.clone().with_disk_bytes(256 * MIB);
        assert_eq!(small_disk.chunk_size_for(Some(200 * MIB as u64)), 256 * KIB);
        let small_memory = b.clone().with_memory_bytes(8 * MIB);
        assert_eq!(
            small_memory.chunk_size_for(Some(200 * MIB as u64)),
            256 * KIB
        );
        // Off: no larger than the chunk size.
        let off = b.clone().with_large_chunk_size(256 * KIB);
        assert_eq!(off.chunk_size_for(Some(200 * MIB as u64)), 256 * KIB);
        let big = b
            .clone()
            .with_chunk_size(2 * MIB)
            .with_memory_bytes(256 * MIB);
        assert_eq!(big.chunk_size_for(Some(200 * MIB as u64)), 2 * MIB);
        assert!(big.validate().is_ok());
        assert!(b.with_large_chunk_size(8 * MIB).validate().is_err());
    }

    #[test]
    fn an_oversized_disk_is_fitted_to_the_free_space() {
        let b = StoreBuilder::new("/x").with_disk_bytes(256 * MIB);
        assert_eq!(b.fitted_disk_bytes(10 << 30), 256 * MIB, "fits");
        let fitted = b.fitted_disk_bytes(31 * MIB as u64);
        assert_eq!(fitted, 16 * MIB);
        let small = b.clone().with_disk_bytes(fitted);
        assert!(small.validate().is_ok());
        assert!(fitted as u64 + small.disk_reserve() <= 31 * MIB as u64);
        assert_eq!(
            b.fitted_disk_bytes(33 * MIB as u64),
            fitted,
            "free space wavering a little keeps the size"
        );
        let floor = b.fitted_disk_bytes(0);
        assert!(b.clone().with_disk_bytes(floor).validate().is_ok());
    }

    #[test]
    fn rejects_settings_that_cannot_work() {
        assert!(StoreBuilder::new("/x")
            .with_disk_bytes(MIB)
            .validate()
            .is_err());
        assert!(StoreBuilder::new("/x")
            .with_chunk_size(100)
            .validate()
            .is_err());
        assert!(StoreBuilder::new("/x")
            .with_memory_bytes(10 * KIB)
            .validate()
            .is_err());
    }
}
