//! The store's background threads (ban lurker, sweeper): plain threads at a lower CPU priority (nice 10),
//! so that on a small machine their walks over every record yield to the threads serving clients, and never
//! block a runtime thread that foyer's disk tasks or the admin API need.

use crate::error::StoreError;

pub(crate) fn spawn(
    name: &'static str,
    work: impl FnOnce() + Send + 'static,
) -> Result<(), StoreError> {
    std::thread::Builder::new()
        .name(format!("lacquer-{name}"))
        .spawn(move || {
            // SAFETY: setpriority on the calling thread (who = 0) only changes its own scheduling.
            if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) } != 0 {
                tracing::debug!(thread = name, "cannot lower the thread's priority");
            }
            work();
        })
        .map(drop)
        .map_err(|source| StoreError::Background { name, source })
}
