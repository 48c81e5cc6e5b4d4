//! State shared by every worker thread, and what each worker owns.

use std::{sync::Arc, time::Instant};

use arc_swap::ArcSwap;
use lacquer_storage::Store;

use crate::{
    access_log::AccessLog,
    backend::{Backend, BackendState},
    coalesce::Coalescer,
    config::{Config, Normalize, Purge},
    protection::DenyRule,
    routing::Router,
    stats::Stats,
};

/// The settings a reload can change while requests are served.
#[derive(Debug)]
pub struct Live {
    /// Routes (each with its cache policy and rate limit) and directors.
    pub router: Router,
    pub purge: Purge,
    pub deny: Vec<DenyRule>,
    pub normalize: Normalize,
}

impl Live {
    /// From a validated configuration, with the daemon's backends.
    pub fn new(config: &Config, backends: &[Arc<BackendState>]) -> Self {
        Self {
            router: Router::new(config, backends),
            purge: config.purge.clone(),
            deny: config
                .deny
                .iter()
                .map(|d| DenyRule::compile(d).expect("validated"))
                .collect(),
            normalize: config.normalize.clone(),
        }
    }
}

pub struct Shared {
    pub live: ArcSwap<Live>,
    pub access_log: Arc<AccessLog>,
    /// In configuration order; routes and directors refer to them by index.
    pub backends: Vec<Arc<BackendState>>,
    pub store: Store,
    pub stats: Arc<Stats>,
    pub coalescer: Coalescer,
    pub started: Instant,
}

impl Shared {
    /// The live settings as of now, for work that awaits while it uses them: it keeps the copy it started
    /// with. Synchronous uses read `live.load()`, which counts no reference.
    pub fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }
}

/// One client-serving thread: its own runtime, listener sockets and backend connection pools.
pub struct Worker {
    pub shared: Arc<Shared>,
    /// One pool per backend, in the order of `shared.backends`.
    pub backends: Vec<Backend>,
}
