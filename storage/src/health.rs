//! What is wrong with the store, for `/v1/health`, the statistics and the log. A store that lost a task or
//! its disk keeps serving what it safely can, but never silently: each problem is logged once at error level,
//! counted, and listed until it is gone.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
        Mutex,
    },
    time::Duration,
};

use crate::store::{Store, WeakStore};

/// Failures listed in full; later ones are only counted.
const LISTED: usize = 8;

#[derive(Default)]
pub(crate) struct Health {
    /// Set at open when the store could not be read and was moved aside.
    damaged_at_start: Option<String>,
    /// Set at open when the store directory could not be used at all.
    memory_only: Option<String>,
    failures: Mutex<Vec<String>>,
    tasks_failed: AtomicU64,
    /// A task the write path needs has died: fills are refused rather than queued for nobody.
    broken: AtomicBool,
}

impl Health {
    /// The health of a store that was moved aside at open (`reason` says why and where to) and started
    /// empty.
    pub(crate) fn damaged_at_start(reason: String) -> Self {
        Self {
            damaged_at_start: Some(reason),
            ..Self::default()
        }
    }

    /// The health of a store whose directory could not be used at all (`reason` says why).
    pub(crate) fn memory_only(reason: String) -> Self {
        Self {
            memory_only: Some(reason),
            ..Self::default()
        }
    }

    /// Whether the store started empty because it could not be opened.
    pub(crate) fn was_damaged_at_start(&self) -> bool {
        self.damaged_at_start.is_some()
    }

    /// Whether the store keeps nothing across restarts.
    pub(crate) fn is_memory_only(&self) -> bool {
        self.memory_only.is_some()
    }

    /// Whether a task the write path needs has died: fills are then refused.
    pub(crate) fn is_broken(&self) -> bool {
        self.broken.load(Relaxed)
    }

    /// Store tasks that died since start.
    pub(crate) fn tasks_failed(&self) -> u64 {
        self.tasks_failed.load(Relaxed)
    }

    /// Records that a store task died; fills stop, the rest keeps serving.
    pub(crate) fn task_failed(&self, task: &str, cause: &str) {
        tracing::error!(
            task,
            cause,
            "store task died: new objects are no longer stored; stored objects are still served; restart lacquerd"
        );
        self.tasks_failed.fetch_add(1, Relaxed);
        self.broken.store(true, Relaxed);
        let mut failures = self.failures.lock().expect("store health");
        if failures.len() < LISTED {
            failures.push(format!("store task {task} died: {cause}"));
        }
    }

    pub(crate) fn failures(&self) -> Vec<String> {
        self.failures.lock().expect("store health").clone()
    }
}

/// The text of a panic payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

/// Watches the writer task: if it ends while the store is open, the store says so.
pub(crate) fn supervise(
    store: WeakStore,
    task: &'static str,
    handle: tokio::task::JoinHandle<()>,
    runtime: &tokio::runtime::Handle,
) {
    runtime.spawn(async move {
        let cause = match handle.await {
            Ok(()) => "it stopped".to_owned(),
            Err(e) if e.is_panic() => panic_message(&*e.into_panic()),
            Err(e) => e.to_string(),
        };
        if let Some(store) = store.open() {
            store.health().task_failed(task, &cause);
        }
    });
}

impl Store {
    /// Reports a panic in foyer's own tasks (its flushers and reclaimers run on the store's runtime, out of
    /// the store's sight) as a failed store task. Installed once by the binary; chains to the previous hook.
    pub fn report_panics(&self) {
        let store = self.downgrade();
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            let Some(location) = info.location() else {
                return;
            };
            if !location.file().contains("foyer") {
                return;
            }
            if let Some(store) = store.upgrade() {
                let cause = format!("{} at {location}", panic_message(info.payload()));
                store.health().task_failed("body cache (foyer)", &cause);
            }
        }));
    }

    /// What is wrong with the store now, one sentence each; empty when nothing is.
    pub fn problems(&self) -> Vec<String> {
        let health = self.health();
        let mut problems = Vec::new();
        if let Some(reason) = &health.memory_only {
            problems.push(reason.clone());
        }
        if let Some(reason) = &health.damaged_at_start {
            problems.push(reason.clone());
        }
        if let Some(guard) = self.disk() {
            if guard.is_full() {
                problems.push(format!(
                    "store disk is full: {} MiB free, below the reserve of {} MiB; new objects are not stored",
                    guard.free() >> 20,
                    guard.reserve() >> 20
                ));
            }
        }
        problems.extend(health.failures());
        problems
    }
}

/// How often an idle store reads the free space, so that health shows a full disk (and its end) even when
/// nothing is being stored.
pub(crate) const DISK_POLL: Duration = Duration::from_secs(1);
