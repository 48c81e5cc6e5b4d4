//! Opening the store so that lacquerd always starts. A store that cannot be read is moved aside (kept once,
//! for inspection) and a new one started empty; a directory that cannot be used at all gives a memory-only
//! store. Either is logged at error level and shown by [`Store::problems`]: a cache that starts empty is an
//! inconvenience, a cache that does not start is an outage.
//!
//! At every start the invalidation journal is replayed over the metadata, so that no body an acknowledged
//! purge or ban removed is served again, whatever sled's files went through.

use std::{
    collections::HashMap,
    fs::File,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
        Arc, Mutex,
    },
};

use foyer::{
    BlockEngineConfig, CacheBuilder, DeviceBuilder, FsDeviceBuilder, HybridCacheBuilder,
    HybridCachePolicy, PsyncIoEngineConfig, RecoverMode, SieveConfig, Spawner,
};
use mixtrics::registry::prometheus_0_14::PrometheusMetricsRegistry;
use tokio::sync::mpsc;

use crate::{
    ban::{BanExpr, Bans, Subject},
    builder::StoreBuilder,
    chunk::ChunkKey,
    error::StoreError,
    health::Health,
    journal::{Entry, Journal, Readback, Target},
    meta::{ObjectMeta, ObjectSet},
    purge::Invalidations,
    space::{self, DiskGuard},
    stats::StoreStats,
    store::{Inner, Store},
};

/// The newest entry id the metadata has seen appended to the journal (sled tree `state`): a journal that
/// ends before it has lost entries.
pub(crate) const JOURNAL_LAST: &[u8] = b"journal-last";
const LOCK: &str = "lock";
const DAMAGED_PREFIX: &str = "damaged-";
/// Ids handed out per millisecond of wall clock before the sequence runs ahead of it: ids start above
/// `now × this` after a restart, so they never go back even if sled and the journal both lost their tail.
const IDS_PER_MS: u64 = 4096;

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
                let health = Health {
                    damaged_at_start: Some(format!(
                        "the store could not be opened ({first}): it was moved aside to {} and lacquerd started empty",
                        aside.display()
                    )),
                    ..Health::default()
                };
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
        let db = sled::Config::new()
            .path(&meta_dir)
            .flush_every_ms(Some(200))
            .open()
            .map_err(|source| {
                // sled's own lock, still held by this process's previous handle: not damage.
                if source.to_string().contains("could not acquire lock") {
                    StoreError::Locked {
                        path: meta_dir.clone(),
                    }
                } else {
                    StoreError::OpenMetadata {
                        path: meta_dir.clone(),
                        source,
                    }
                }
            })?;
        let (journal, readback) = Journal::read(&config.dir)?;
        let device = FsDeviceBuilder::new(&body_dir)
            .with_capacity(config.disk_bytes)
            .build()
            .map_err(|source| StoreError::OpenBodies {
                path: body_dir.clone(),
                source,
            })?;
        let guard = DiskGuard::new(vec![meta_dir, body_dir], config.disk_reserve());
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
        let health = Health {
            memory_only: Some(reason),
            ..Health::default()
        };
        Self::assemble(
            config,
            &runtime,
            db,
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
        db: sled::Db,
        device: Option<Arc<dyn foyer::Device>>,
        (journal, readback): (Journal, Readback),
        disk: Option<DiskGuard>,
        health: Health,
    ) -> Result<Self, StoreError> {
        let objects = db.open_tree("objects")?;
        let tags = db.open_tree("tags")?;
        let state = db.open_tree("state")?;
        let (bans, unreadable_bans) = Bans::open(&db)?;
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
        let hot = CacheBuilder::new(config.metadata_cache_bytes)
            .with_eviction_config(SieveConfig)
            .with_weighter(|k: &String, v: &Arc<ObjectSet>| k.len() + v.approx_size())
            .build();
        let (jobs, rx) = mpsc::channel(64);
        let store = Store {
            inner: Arc::new(Inner {
                chunks,
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
                flush_tickets: AtomicU64::new(0),
                flushed: AtomicU64::new(0),
                flushing: tokio::sync::Mutex::new(()),
                hot,
                mutate: Mutex::new(()),
                jobs,
                stats: StoreStats::default(),
                config,
                registry,
                closed: AtomicBool::new(false),
                runtime: runtime.clone(),
            }),
        };
        StoreStats::add(&store.inner.stats.corrupt_records, unreadable_bans);
        store.recover(readback)?;
        let writer = runtime.spawn(crate::writer::run(store.clone(), rx, buffer_pool / 2));
        crate::health::supervise(Arc::downgrade(&store.inner), "writer", writer, runtime);
        crate::sweep::start(
            Arc::downgrade(&store.inner),
            store.inner.config.sweep_interval,
        )?;
        crate::ban::lurker::start(
            Arc::downgrade(&store.inner),
            store.inner.bans.lurker.clone(),
        )?;
        if store.inner.disk.is_some() {
            let weak = Arc::downgrade(&store.inner);
            runtime.spawn(async move {
                let mut every = tokio::time::interval(crate::health::DISK_POLL);
                loop {
                    every.tick().await;
                    let Some(inner) = weak.upgrade() else { return };
                    if inner.closed.load(Relaxed) {
                        return;
                    }
                    if let Some(guard) = &inner.disk {
                        guard.check();
                    }
                }
            });
        }
        Ok(store)
    }

    /// Replays the invalidation journal over every metadata record, drops what it covers (or everything,
    /// when the journal cannot vouch for the records), counts what is left, and starts the journal.
    fn recover(&self, readback: Readback) -> Result<(), StoreError> {
        let inner = &self.inner;
        let journal_last = inner.journal.last();
        // Every start with a journal notes it in sled: a store without that note comes from a version
        // before the journal, whose purges and bans were in sled before they were acknowledged; it is
        // kept, and the journal starts now.
        let marker = inner.state.get(JOURNAL_LAST)?;
        let seen_last = marker
            .as_ref()
            .and_then(|v| v.as_ref().try_into().ok().map(u64::from_be_bytes))
            .unwrap_or(0);
        let doubt = match &readback {
            Readback::Damaged(reason) => Some(format!("the invalidation journal is damaged ({reason})")),
            Readback::Missing if marker.is_some() && !inner.objects.is_empty() => {
                Some("the invalidation journal is missing".to_owned())
            }
            _ if seen_last > journal_last => Some(format!(
                "the invalidation journal ends at entry {journal_last} but the metadata saw entry {seen_last}"
            )),
            _ => None,
        };
        let replay = Replay::new(&inner.journal);
        let (mut dropped, mut softened, mut unreadable) = (Vec::new(), Vec::new(), 0u64);
        let (mut objects, mut bytes, mut newest) = (0u64, 0u64, 0u64);
        for item in inner.objects.iter() {
            let (key, value) = item?;
            let primary = String::from_utf8_lossy(&key).into_owned();
            let Ok(set) = ObjectSet::decode(&primary, &value) else {
                unreadable += 1;
                inner.objects.remove(&key)?;
                continue;
            };
            for meta in &set.variants {
                newest = newest.max(meta.generation).max(meta.ban_checked);
                match (&doubt, replay.verdict(&primary, meta)) {
                    (Some(_), _) | (None, Some(false)) => {
                        dropped.push((primary.clone(), meta.generation))
                    }
                    (None, Some(true)) => softened.push((primary.clone(), meta.generation)),
                    (None, None) => {
                        objects += 1;
                        bytes += meta.length;
                    }
                }
            }
        }
        for (primary, generation) in &dropped {
            self.retain(primary, |m| m.generation != *generation)?;
        }
        for (primary, generation) in &softened {
            self.soft_expire(primary, |m| m.generation == *generation)?;
        }
        inner.stats.objects.store(objects, Relaxed);
        inner.stats.stored_bytes.store(bytes, Relaxed);
        StoreStats::add(&inner.stats.corrupt_records, unreadable);

        let next = (lacquer_clock::now_ms() * IDS_PER_MS)
            .max(newest + 1)
            .max(journal_last + 1)
            .max(inner.db.generate_id()? + 1);
        let fresh = match (&doubt, &readback) {
            (Some(_), _) => Some(next),
            (None, Readback::Missing) => Some(0),
            _ => None,
        };
        inner.journal.start(next, fresh)?;
        inner
            .state
            .insert(JOURNAL_LAST, &inner.journal.last().to_be_bytes())?;
        inner.db.flush()?;
        if unreadable > 0 {
            tracing::error!(
                records = unreadable,
                "discarded unreadable metadata records at start; their objects will be fetched again"
            );
        }
        if let Some(doubt) = doubt {
            StoreStats::add(&inner.stats.objects_unverified, dropped.len() as u64);
            tracing::error!(
                objects = dropped.len(),
                "{doubt}: dropped every stored object, since none can be proven not purged or banned"
            );
        } else if !dropped.is_empty() || !softened.is_empty() {
            StoreStats::add(
                &inner.stats.objects_invalidated_at_start,
                (dropped.len() + softened.len()) as u64,
            );
            tracing::warn!(
                removed = dropped.len(),
                made_stale = softened.len(),
                "the metadata still held objects that acknowledged purges or bans cover (rolled back by a crash or damage): removed them again"
            );
        }
        tracing::info!(
            objects,
            journal_entries = inner.journal.len(),
            "store opened"
        );
        Ok(())
    }
}

/// The journal indexed for the start-up replay: by cache key, by tag, and the bans.
struct Replay {
    floor: u64,
    kept: std::collections::HashSet<u64>,
    keys: HashMap<String, Vec<(u64, bool)>>,
    tags: HashMap<String, Vec<(u64, bool)>>,
    /// A ban whose expression no longer parses covers everything older than it.
    bans: Vec<(u64, Option<BanExpr>)>,
}

impl Replay {
    fn new(journal: &Journal) -> Self {
        let state = journal.state.lock().expect("journal state");
        let mut replay = Replay {
            floor: state.floor,
            kept: state.kept.clone(),
            keys: HashMap::new(),
            tags: HashMap::new(),
            bans: Vec::new(),
        };
        for entry in &state.entries {
            match entry {
                Entry::Purge {
                    id,
                    target: Target::Key(key),
                    soft,
                } => replay
                    .keys
                    .entry(key.clone())
                    .or_default()
                    .push((*id, *soft)),
                Entry::Purge {
                    id,
                    target: Target::Tags(tags),
                    soft,
                } => {
                    for tag in tags {
                        replay
                            .tags
                            .entry(tag.clone())
                            .or_default()
                            .push((*id, *soft));
                    }
                }
                Entry::Ban { id, expression } => {
                    replay.bans.push((*id, BanExpr::parse(expression).ok()))
                }
                Entry::Checkpoint { .. } => {}
            }
        }
        replay
    }

    /// `Some(false)`: an entry removes the body; `Some(true)`: a soft purge makes it stale; `None`: nothing
    /// covers it.
    fn verdict(&self, primary: &str, meta: &ObjectMeta) -> Option<bool> {
        let generation = meta.generation;
        if generation < self.floor && !self.kept.contains(&generation) {
            return Some(false);
        }
        let subject = Subject::new(primary, meta);
        let banned = self.bans.iter().any(|(id, expr)| {
            *id > generation && expr.as_ref().is_none_or(|e| e.matches(&subject))
        });
        if banned {
            return Some(false);
        }
        let purges = self
            .keys
            .get(primary)
            .into_iter()
            .chain(meta.tags.iter().filter_map(|t| self.tags.get(t)))
            .flatten()
            .filter(|(id, _)| *id > generation);
        let mut soft = None;
        for (_, is_soft) in purges {
            if !is_soft {
                return Some(false);
            }
            soft = Some(true);
        }
        soft
    }
}
