//! Free space on the store's filesystem. foyer 0.22 panics in its flusher when a write fails with ENOSPC, so
//! the store never lets it get there: below a reserve of free space new bodies are not stored (what is stored
//! keeps being served), and storing resumes once there is room again.

use std::{
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
        Mutex,
    },
    time::{Duration, Instant},
};

/// How long a free-space reading is trusted while chunks are written.
const RECHECK: Duration = Duration::from_millis(100);
/// Room for sled's log and the invalidation journal beyond what foyer may have in flight.
pub(crate) const METADATA_RESERVE: u64 = 4 << 20;

pub(crate) struct DiskGuard {
    /// The metadata and body directories: either may be a mount of its own.
    dirs: Vec<PathBuf>,
    /// Below this many free bytes the disk counts as full; it counts as having room again above 1.5 times it,
    /// so that a disk hovering at the limit does not flap.
    reserve: u64,
    full: AtomicBool,
    free: AtomicU64,
    checked: Mutex<Option<Instant>>,
}

/// Bytes the filesystem holding `path` has free for an unprivileged writer.
pub(crate) fn available(path: &Path) -> std::io::Result<u64> {
    fs4::available_space(path)
}

/// Bytes the files under `dir` occupy on disk (not their apparent length: foyer's block files are sparse).
pub(crate) fn allocated(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| if m.is_dir() { 0 } else { m.blocks() * 512 })
        .sum()
}

impl DiskGuard {
    pub(crate) fn new(dirs: Vec<PathBuf>, reserve: u64) -> Self {
        Self {
            dirs,
            reserve,
            full: AtomicBool::new(false),
            free: AtomicU64::new(u64::MAX),
            checked: Mutex::new(None),
        }
    }

    pub(crate) fn reserve(&self) -> u64 {
        self.reserve
    }

    /// Free bytes at the last reading.
    pub(crate) fn free(&self) -> u64 {
        self.free.load(Relaxed)
    }

    pub(crate) fn is_full(&self) -> bool {
        self.full.load(Relaxed)
    }

    /// Whether a chunk may be written now: reads the free space again when the last reading is older than
    /// [`RECHECK`].
    pub(crate) fn room(&self) -> bool {
        {
            let mut checked = self.checked.lock().expect("disk guard");
            if checked.is_some_and(|at| at.elapsed() < RECHECK) {
                return !self.is_full();
            }
            *checked = Some(Instant::now());
        }
        self.check()
    }

    /// Reads the free space now; logs when the disk becomes full and when it has room again.
    pub(crate) fn check(&self) -> bool {
        let mut free = u64::MAX;
        for dir in &self.dirs {
            match available(dir) {
                Ok(n) => free = free.min(n),
                Err(e) => {
                    tracing::debug!(error = %e, dir = %dir.display(), "cannot read free space");
                    return !self.is_full();
                }
            }
        }
        self.free.store(free, Relaxed);
        let was_full = self.is_full();
        let full = if was_full {
            free < self.reserve + self.reserve / 2
        } else {
            free < self.reserve
        };
        // Only the reader that flips the state logs it, so each change is logged once.
        if full != was_full
            && self
                .full
                .compare_exchange(was_full, full, Relaxed, Relaxed)
                .is_ok()
        {
            let (free_mib, reserve_mib) = (free >> 20, self.reserve >> 20);
            if full {
                tracing::error!(
                    dir = %self.dirs[0].display(),
                    free_mib,
                    reserve_mib,
                    "store disk is full: new objects are not stored until there is room again; stored objects are still served"
                );
            } else {
                tracing::warn!(
                    dir = %self.dirs[0].display(),
                    free_mib,
                    "store disk has room again: storing new objects"
                );
            }
        }
        !full
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_below_the_reserve_and_room_again_above_one_and_a_half_times_it() {
        let dir = tempfile::tempdir().unwrap();
        let free = available(dir.path()).unwrap();
        let roomy = DiskGuard::new(vec![dir.path().to_owned()], free / 4);
        assert!(roomy.check() && !roomy.is_full());
        let tight = DiskGuard::new(vec![dir.path().to_owned()], free.saturating_mul(2));
        assert!(!tight.check() && tight.is_full());
        assert!(!tight.room(), "the reading is reused");
    }
}
