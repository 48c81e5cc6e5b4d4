//! The store's background threads (ban lurker, sweeper, the index rebuild): plain threads in the kernel's
//! idle scheduling class
//! (`SCHED_IDLE`; nice 19 where that is refused), so that their walks over every record run on cores nobody
//! else wants and a client thread that wakes takes the core back at once (a nice 10 thread still kept it for
//! a scheduler slice: the hit p99 doubled during a walk), and never block a runtime thread that foyer's disk
//! tasks or the admin API need. The start-up replay's walk is the exception ([`Priority::Normal`]): it must
//! end.

use std::panic::AssertUnwindSafe;

use crate::{error::StoreError, store::WeakStore};

/// How a background thread is scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Priority {
    /// The idle class: walks that come back (the sweeper, the lurker) and may wait for a quiet core.
    Idle,
    /// As the client threads: a walk that must end (the start-up replay: until it does, the journal cannot
    /// be compacted, and a machine busy all the time would starve an idle-class thread for good).
    Normal,
}

/// Runs `work` on its own thread, holding the store weakly; a panic is reported as a failed store task
/// (unless the store is closing), so the daemon never goes on silently without it.
pub(crate) fn spawn(
    name: &'static str,
    priority: Priority,
    store: WeakStore,
    work: impl FnOnce(&WeakStore) + Send + 'static,
) -> Result<(), StoreError> {
    std::thread::Builder::new()
        .name(format!("lacquer-{name}"))
        .spawn(move || {
            if priority == Priority::Idle {
                lower_priority(name);
            }
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| work(&store)));
            if let (Err(panic), Some(store)) = (outcome, store.open()) {
                let cause = crate::health::panic_message(&*panic);
                store.health().task_failed(name, &cause);
            }
        })
        .map(drop)
        .map_err(|source| StoreError::Background { name, source })
}

/// Puts the calling thread in the idle scheduling class, or at nice 19 when that is refused.
fn lower_priority(name: &str) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: both calls change the scheduling of the calling thread (pid/who 0) only; `param` outlives
    // the call.
    let idle = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } == 0;
    if !idle && unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) } != 0 {
        tracing::debug!(thread = name, "cannot lower the thread's priority");
    }
}
