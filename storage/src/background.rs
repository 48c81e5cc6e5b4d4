//! The store's background threads (ban lurker, sweeper): plain threads at a lower CPU priority (nice 10),
//! so that on a small machine their walks over every record yield to the threads serving clients, and never
//! block a runtime thread that foyer's disk tasks or the admin API need.

use std::panic::AssertUnwindSafe;

use crate::{error::StoreError, store::WeakStore};

/// Runs `work` on its own thread, holding the store weakly; a panic is reported as a failed store task
/// (unless the store is closing), so the daemon never goes on silently without it.
pub(crate) fn spawn(
    name: &'static str,
    store: WeakStore,
    work: impl FnOnce(&WeakStore) + Send + 'static,
) -> Result<(), StoreError> {
    std::thread::Builder::new()
        .name(format!("lacquer-{name}"))
        .spawn(move || {
            // SAFETY: setpriority on the calling thread (who = 0) only changes its own scheduling.
            if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) } != 0 {
                tracing::debug!(thread = name, "cannot lower the thread's priority");
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
