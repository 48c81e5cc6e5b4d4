//! Opening the store so that lacquerd always starts. A store that cannot be read is moved aside (kept once,
//! for inspection) and a new one started empty; a directory that cannot be used at all gives a memory-only
//! store. Either is logged at error level and shown by [`Store::problems`]: a cache that starts empty is an
//! inconvenience, a cache that does not start is an outage.
//!
//! Opening wires the parts together: sled (metadata, bans, the journal's high-water mark), foyer (bodies,
//! memory tier in front of a disk tier fitted to the free space), the journal, the disk guard; then the
//! start-up replay (`recover`) begins before anything can read (its walk over every record may go on in
//! the background), and the writer task, the sweeper and the ban lurker start.

use std::{
    fs::File,
    path::{Path, PathBuf},
    sync::{atomic::AtomicU64, Arc, Mutex},
};

use arc_swap::ArcSwapOption;

use foyer::{
    BlockEngineConfig, DeviceBuilder, FsDeviceBuilder, HybridCacheBuilder, HybridCachePolicy,
    PsyncIoEngineConfig, RecoverMode, SieveConfig, Spawner,
};
use mixtrics::registry::prometheus_0_14::PrometheusMetricsRegistry;
use tokio::sync::mpsc;

use crate::{
    ban::Bans,
    builder::StoreBuilder,
    chunk::ChunkKey,
    error::StoreError,
    health::Health,
    journal::{Journal, Readback},
    purge::Invalidations,
    space::{self, DiskGuard},
};

use super::{Counters, GroupCommit, Inner, Store};

/// The newest entry id the metadata has seen appended to the journal (sled tree `state`): a journal that
/// ends before it has lost entries.
pub(crate) const JOURNAL_LAST: &[u8] = b"journal-last";
const LOCK: &str = "lock";
const DAMAGED_PREFIX: &str = "damaged-";

/// What the store holds on disk, moved aside together: bodies without their metadata are garbage.
fn parts(dir: &Path) -> [PathBuf; 3] {
    [
        dir.join("meta"),
        dir.join("bodies"),
        dir.join(crate::journal::FILE),
    ]
}

/// Takes the store directory for this process: two daemons on one store would corrupt it, and the
/// recovery below must never move aside a store another process is using.
fn lock(dir: &Path) -> Result<File, StoreError> {
    use fs4::fs_std::FileExt;
    std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
        path: dir.to_owned(),
        source,
    })?;
    let path = dir.join(LOCK);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| StoreError::CreateDir {
            path: path.clone(),
            source,
        })?;
    match file.try_lock_exclusive() {
        Ok(true) => Ok(file),
        Ok(false) => Err(StoreError::Locked {
            path: dir.to_owned(),
        }),
        Err(source) => Err(StoreError::CreateDir { path, source }),
    }
}

/// Moves the store's files into `dir/damaged-<unix seconds>`, removing older such directories first so a
/// crash loop cannot fill the disk; returns where they went.
fn move_aside(dir: &Path) -> std::io::Result<PathBuf> {
    for entry in std::fs::read_dir(dir)?.flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(DAMAGED_PREFIX)
        {
            std::fs::remove_dir_all(entry.path())?;
        }
    }
    let aside = dir.join(format!(
        "{DAMAGED_PREFIX}{}",
        lacquer_clock::now_ms() / 1000
    ));
    std::fs::create_dir(&aside)?;
    for part in parts(dir) {
        if part.exists() {
            std::fs::rename(&part, aside.join(part.file_name().expect("named")))?;
        }
    }
    File::open(dir)?.sync_all()?;
    Ok(aside)
}

impl Store {
    pub(crate) async fn open(
        config: StoreBuilder,
        runtime: tokio::runtime::Handle,
    ) -> Result<Self, StoreError> {
        let lock = match lock(&config.dir) {
            Ok(lock) => lock,
            Err(e @ StoreError::Locked { .. }) => return Err(e),
            Err(e) => return Self::memory_only(config, runtime, e).await,
        };
        let first = match Self::open_dir(&config, &runtime, &lock, Health::default()).await {
            Ok(store) => return Ok(store.holding(lock)),
            Err(e @ StoreError::Locked { .. }) => return Err(e),
            Err(e) => e,
        };
        tracing::error!(
            error = %first,
            dir = %config.dir.display(),
            "the store cannot be opened: moving it aside and starting empty"
        );
        let second = match move_aside(&config.dir) {
            Ok(aside) => {
                let health = Health::damaged_at_start(format!(
                    "the store could not be opened ({first}): it was moved aside to {} and lacquerd started empty",
                    aside.display()
                ));
                match Self::open_dir(&config, &runtime, &lock, health).await {
                    Ok(store) => return Ok(store.holding(lock)),
                    Err(e) => e,
                }
            }
            Err(source) => StoreError::CreateDir {
                path: config.dir.clone(),
                source,
            },
        };
        Self::memory_only(config, runtime, second).await
    }

    fn holding(self, lock: File) -> Self {
        *self.inner.lock.lock().expect("store lock") = Some(lock);
        self
    }

    /// The store in its directory, with its disk tier fitted to the free space.
    async fn open_dir(
        config: &StoreBuilder,
        runtime: &tokio::runtime::Handle,
        _lock: &File,
        health: Health,
    ) -> Result<Self, StoreError> {
        let [meta_dir, body_dir, _] = parts(&config.dir);
        for dir in [&meta_dir, &body_dir] {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
                path: dir.clone(),
                source,
            })?;
        }
        let mut config = config.clone();
        let free = space::available(&body_dir).map_err(|source| StoreError::CreateDir {
            path: body_dir.clone(),
            source,
        })?;
        let usable = free + space::allocated(&body_dir);
        let fitted = config.fitted_disk_bytes(usable);
        if fitted != config.disk_bytes {
            tracing::warn!(
                configured_mib = config.disk_bytes >> 20,
                used_mib = fitted >> 20,
                usable_mib = usable >> 20,
                dir = %config.dir.display(),
                "storage.disk_size does not fit the free space of the store's filesystem: using less"
            );
            config.disk_bytes = fitted;
        }
        // sled reads its whole index at open, and so does foyer: with a million objects each takes a
        // second or more, so sled opens on a blocking thread while foyer recovers (in `assemble`).
        let sled_config = sled::Config::new()
            .path(&meta_dir)
            .flush_every_ms(Some(200))
            .cache_capacity(config.metadata_page_cache_bytes as u64);
        let sled_dir = meta_dir.clone();
        let db = runtime.spawn_blocking(move || {
            sled_config.open().map_err(|source| {
                // sled's own lock, still held by this process's previous handle: not damage.
                if source.to_string().contains("could not acquire lock") {
                    StoreError::Locked { path: sled_dir }
                } else {
                    StoreError::OpenMetadata {
                        path: sled_dir,
                        source,
                    }
                }
            })
        });
        let db = async move {
            db.await.unwrap_or_else(|e| {
                Err(StoreError::OpenMetadata {
                    path: meta_dir,
                    source: sled::Error::ReportableBug(format!("opening sled failed: {e}")),
                })
            })
        };
        let (journal, readback) = Journal::read(&config.dir)?;
        let device = FsDeviceBuilder::new(&body_dir)
            .with_capacity(config.disk_bytes)
            .build()
            .map_err(|source| StoreError::OpenBodies {
                path: body_dir.clone(),
                source,
            })?;
        let guard = DiskGuard::new(
            vec![config.dir.join("meta"), body_dir],
            config.disk_reserve(),
        );
        guard.check();
        Self::assemble(
            config,
            runtime,
            db,
            Some(device),
            (journal, readback),
            Some(guard),
            health,
        )
        .await
    }

    /// A store that keeps nothing across restarts: sled in a temporary file, no disk tier.
    async fn memory_only(
        config: StoreBuilder,
        runtime: tokio::runtime::Handle,
        why: StoreError,
    ) -> Result<Self, StoreError> {
        let reason = format!(
            "the store directory {} cannot be used ({why}): running with a memory-only store, nothing is kept across restarts",
            config.dir.display()
        );
        tracing::error!("{reason}");
        let db = sled::Config::new().temporary(true).open()?;
        let health = Health::memory_only(reason);
        Self::assemble(
            config,
            &runtime,
            std::future::ready(Ok(db)),
            None,
            (Journal::volatile(), Readback::Intact),
            None,
            health,
        )
        .await
    }

    async fn assemble(
        config: StoreBuilder,
        runtime: &tokio::runtime::Handle,
        db: impl std::future::Future<Output = Result<sled::Db, StoreError>>,
        device: Option<Arc<dyn foyer::Device>>,
        (journal, readback): (Journal, Readback),
        disk: Option<DiskGuard>,
        health: Health,
    ) -> Result<Self, StoreError> {
        let registry = prometheus::Registry::new();
        let buffer_pool = config.buffer_pool_bytes();
        let mut storage = HybridCacheBuilder::new()
            .with_name("bodies")
            .with_policy(HybridCachePolicy::WriteOnInsertion)
            .with_metrics_registry(Box::new(PrometheusMetricsRegistry::new(registry.clone())))
            .memory(config.memory_bytes)
            .with_eviction_config(SieveConfig)
            .with_weighter(|_: &ChunkKey, v: &bytes::Bytes| v.len() + 64)
            .storage()
            .with_io_engine_config(PsyncIoEngineConfig::new());
        // Without a device foyer's default engine keeps nothing: a memory-only store.
        if let Some(device) = device {
            storage = storage.with_engine_config(
                BlockEngineConfig::new(device)
                    .with_block_size(config.block_size())
                    .with_flushers(config.flushers)
                    .with_buffer_pool_size(buffer_pool)
                    .with_submit_queue_size_threshold(2 * buffer_pool),
            );
        }
        let chunks = storage
            .with_recover_mode(RecoverMode::Quiet)
            .with_spawner(Spawner::from(runtime.clone()))
            .build()
            .await
            .map_err(|source| StoreError::OpenBodies {
                path: config.dir.join("bodies"),
                source,
            })?;
        let metadata = async {
            let db = db.await?;
            let trees = (
                db.open_tree("objects")?,
                db.open_tree("tags")?,
                db.open_tree("state")?,
            );
            let bans = Bans::open(&db)?;
            Ok::<_, StoreError>((db, trees, bans))
        };
        // A store that fails here is moved aside and opened again: foyer lets go of its files first.
        let (db, (objects, tags, state), (bans, unreadable_bans)) = match metadata.await {
            Ok(metadata) => metadata,
            Err(e) => {
                chunks.close().await.ok();
                return Err(e);
            }
        };
        let edited_heads = super::hot::EditedHeads::default();
        let hot = super::hot::hot_copy(config.metadata_cache_bytes, edited_heads.clone());
        let (jobs, rx) = mpsc::channel(64);
        let store = Store {
            inner: Arc::new(Inner {
                chunks,
                disk_reads: Arc::default(),
                db,
                objects,
                tags,
                state,
                bans,
                invalidations: Invalidations::default(),
                journal,
                disk,
                health,
                lock: Mutex::new(None),
                flushes: GroupCommit::default(),
                deferred: Default::default(),
                edited_heads,
                hot,
                records: super::records::Records::default(),
                keys: super::index::KeyIndex::default(),
                jobs,
                counters: Counters::default(),
                config,
                registry,
                closed: Arc::default(),
                runtime: runtime.clone(),
                replay: ArcSwapOption::empty(),
                id_ceiling: AtomicU64::new(0),
                raising: Mutex::new(()),
            }),
        };
        store.counters().corrupt_records.add(unreadable_bans);
        match store.recover(readback)? {
            Some(pending) => store.replay_in_background(pending)?,
            None if !store.inner.keys.is_complete() => store.rebuild_key_index()?,
            None => {}
        }
        let writer = runtime.spawn(crate::writer::run(store.clone(), rx, buffer_pool / 2));
        crate::health::supervise(store.downgrade(), "writer", writer, runtime);
        crate::sweep::start(store.downgrade(), store.inner.config.sweep_interval)?;
        crate::ban::lurker::start(store.downgrade(), store.inner.bans.lurker.clone())?;
        if store.inner.disk.is_some() {
            let weak = store.downgrade();
            runtime.spawn(async move {
                let mut every = tokio::time::interval(crate::health::DISK_POLL);
                loop {
                    every.tick().await;
                    let Some(store) = weak.open() else { return };
                    if let Some(guard) = store.disk() {
                        guard.check();
                    }
                }
            });
        }
        Ok(store)
    }
}
