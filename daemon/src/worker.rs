//! State shared by every worker thread, and what each worker owns.

use std::{sync::Arc, time::Instant};

use lacquer_storage::Store;

use crate::{backend::Backend, coalesce::Coalescer, config::Purge, policy::Policy, stats::Stats};

pub struct Shared {
    pub policy: Policy,
    pub purge: Purge,
    pub store: Store,
    pub stats: Arc<Stats>,
    pub coalescer: Coalescer,
    pub started: Instant,
}

/// One client-serving thread: its own runtime, listener sockets and backend connection pool.
pub struct Worker {
    pub shared: Arc<Shared>,
    pub backend: Backend,
}
