//! State shared by every worker thread, and what each worker owns.

use std::{
    sync::{Arc, Mutex},
    time::Instant,
};

use arc_swap::ArcSwap;
use lacquer_storage::{BanExpr, BanInfo, Store};

use lacquer_backends::{Backend, BackendState};

pub use crate::live::Live;
use crate::{
    access_log::AccessLog,
    cluster::{self, Applied, Cluster, InvalidateError, Invalidation},
    coalesce::Coalescer,
    dictionary::Dictionaries,
    hls::BlockingReloads,
    invalidation::PurgeTarget,
    peer::Peers,
    prefetch::budget::Prefetcher,
    siblings::Making,
    stats::Stats,
    store::CacheStore,
};

/// What every worker thread and the admin API share: the live settings, the store, the counters and the
/// fetches in flight. `S` is the store the data path serves from (the real one but in unit tests).
pub struct Shared<S: CacheStore = Store> {
    /// Routes, backends, rules: what a reload replaces.
    pub live: ArcSwap<Live>,
    /// Where requests are recorded.
    pub access_log: Arc<AccessLog>,
    /// The object store.
    pub store: S,
    /// The proxy's counters.
    pub stats: Arc<Stats>,
    /// The fetches in flight by key, which concurrent misses join.
    pub(crate) coalescer: Coalescer<S>,
    /// When the daemon started (monotonic), for the uptime.
    pub started: Instant,
    /// The cluster this node belongs to; `None` on a single node.
    pub cluster: Option<Arc<dyn Cluster>>,
    /// The representations being made from stored bodies.
    pub(crate) making: Arc<Making>,
    /// The compression dictionaries held.
    pub(crate) dictionaries: Arc<Dictionaries>,
    /// What the routes' `prefetch` has in flight, waiting and listed.
    pub(crate) prefetch: Prefetcher,
    /// LL-HLS blocking reloads at the origin, by playlist.
    pub(crate) blocking: BlockingReloads,
    /// `[telemetry]`: the tracer requests' spans are made with, or nothing.
    pub telemetry: lacquer_telemetry::Telemetry,
    /// The certificates kept by ACME, whose HTTP-01 challenges requests may be; `None` without `acme`.
    pub acme: Option<Arc<lacquer_acme::Acme>>,
}

/// What a worker cannot do without: [`Shared::new`]'s defaults cover the rest.
const HIT_FOR_MISS_MEMORY: usize = 1 << 20;

impl<S: CacheStore> Shared<S> {
    /// The proxy serving `live` from `store`, counting in `stats` and recording requests in `access_log`.
    /// Defaults: a single node (no cluster), no telemetry, and 1 MiB for the keys `hit_for_miss`
    /// remembers; nothing in flight.
    pub fn new(live: Live, store: S, stats: Arc<Stats>, access_log: Arc<AccessLog>) -> Self {
        Self {
            live: ArcSwap::from_pointee(live),
            access_log,
            store,
            stats,
            coalescer: Coalescer::new(HIT_FOR_MISS_MEMORY),
            started: lacquer_clock::monotonic(),
            cluster: None,
            making: Arc::default(),
            dictionaries: Arc::default(),
            prefetch: Prefetcher::default(),
            blocking: BlockingReloads::default(),
            telemetry: lacquer_telemetry::Telemetry::default(),
            acme: None,
        }
    }

    /// Remembers the keys found uncacheable (`hit_for_miss`) in at most `bytes`
    /// (`server.hit_for_miss_memory`; default 1 MiB).
    pub fn with_hit_for_miss_memory(mut self, bytes: usize) -> Self {
        self.coalescer = Coalescer::new(bytes);
        self
    }

    /// Serves as a member of `cluster` (default: a single node).
    pub fn with_cluster(mut self, cluster: Arc<dyn Cluster>) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// Answers the HTTP-01 challenges of `acme`'s orders.
    pub fn with_acme(mut self, acme: Arc<lacquer_acme::Acme>) -> Self {
        self.acme = Some(acme);
        self
    }

    /// Why the key was last found uncacheable, while `hit_for_miss` remembers it.
    pub fn uncacheable(&self, key: &str) -> Option<crate::coalesce::Uncacheable> {
        self.coalescer.uncacheable(key)
    }

    /// Traces requests with `telemetry` (default: off).
    pub fn with_telemetry(mut self, telemetry: lacquer_telemetry::Telemetry) -> Self {
        self.telemetry = telemetry;
        self
    }
}

impl Shared<Store> {
    /// Runs an invalidation: on a single node, on its store; in a cluster, through the cluster's log,
    /// acknowledged once this node has applied it. Durable when it returns: in the store's journal on a
    /// single node, in etcd in a cluster (this node's journal follows at its next checkpoint).
    async fn invalidate(&self, inv: Invalidation) -> Result<Applied, InvalidateError> {
        match &self.cluster {
            Some(cluster) => cluster.invalidate(inv).await,
            None => Ok(cluster::apply(&self.store, inv).await?),
        }
    }

    /// Adds a ban (see [`Shared::invalidate`]).
    pub async fn ban(&self, expr: BanExpr) -> Result<BanInfo, InvalidateError> {
        match self.invalidate(Invalidation::Ban(expr)).await? {
            Applied::Ban(info) => Ok(info),
            Applied::Purged(_) => unreachable!("a ban is applied as a ban"),
        }
    }

    /// Purges `target`, hard or `soft`; how many stored objects it affected on this node.
    pub async fn purge(&self, target: PurgeTarget, soft: bool) -> Result<usize, InvalidateError> {
        match self
            .invalidate(Invalidation::Purge { target, soft })
            .await?
        {
            Applied::Purged(n) => Ok(n),
            Applied::Ban(_) => unreachable!("a purge is applied as a purge"),
        }
    }
}

impl<S: CacheStore> Shared<S> {
    /// The live settings as of now, for work that awaits while it uses them: it keeps the copy it started
    /// with. Synchronous uses read `live.load()`, which counts no reference.
    pub fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }
}

/// One client-serving thread: its own runtime, listener sockets and backend connection pools.
pub struct Worker<S: CacheStore = Store> {
    /// What it shares with the other workers.
    pub shared: Arc<Shared<S>>,
    /// One pool per backend in use; only this worker's thread locks it, on misses and passes.
    pools: Mutex<Vec<Backend>>,
    /// Connections to the cluster's other members, for self-routed requests.
    pub(crate) peers: Mutex<Peers>,
}

impl<S: CacheStore> Worker<S> {
    /// A worker with no backend connection yet.
    pub fn new(shared: Arc<Shared<S>>) -> Self {
        Self {
            shared,
            pools: Mutex::default(),
            peers: Mutex::default(),
        }
    }

    /// This worker's pool for `backend`, made on first use; pools of backends a reload retired go then.
    pub fn pool(&self, backend: &Arc<BackendState>) -> Backend {
        let mut pools = self.pools.lock().expect("pools mutex");
        if let Some(pool) = pools.iter().find(|p| Arc::ptr_eq(&p.state, backend)) {
            return pool.clone();
        }
        pools.retain(|p| !p.state.is_retired());
        let pool = Backend::new(backend.clone());
        pools.push(pool.clone());
        pool
    }
}
