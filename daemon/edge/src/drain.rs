//! Graceful shutdown of client connections, as hyper-util's `GracefulShutdown` does it: that one cannot
//! watch an HTTP/1 connection that may be upgraded (its trait is sealed, and not implemented for hyper's
//! `UpgradeableConnection`).

use std::{future::Future, pin::Pin};

use tokio::sync::watch;

/// Tells every connection of a worker to finish, and waits until they have.
pub struct Drain(watch::Sender<()>);

/// One connection's end of a [`Drain`], held for as long as the connection is served (by each of its
/// requests too, when they run apart from it).
#[derive(Clone)]
pub struct Watcher(watch::Receiver<()>);

impl Drain {
    pub fn new() -> Self {
        Self(watch::Sender::new(()))
    }

    pub fn watcher(&self) -> Watcher {
        Watcher(self.0.subscribe())
    }

    /// Tells every connection to finish, and waits until every [`Watcher`] is gone.
    pub async fn shutdown(self) {
        // No watcher left is no error: there is nothing to wait for.
        let _ = self.0.send(());
        self.0.closed().await;
    }
}

impl Watcher {
    /// Resolves once the drain has started.
    pub async fn draining(&mut self) {
        // A drain that is dropped without a shutdown ends the worker too.
        let _ = self.0.changed().await;
    }

    /// Serves `conn` to its end, starting its graceful shutdown (`finish`) once the drain starts.
    pub async fn watch<C: Future>(
        mut self,
        conn: C,
        finish: impl FnOnce(Pin<&mut C>),
    ) -> C::Output {
        let mut conn = std::pin::pin!(conn);
        tokio::select! {
            biased;
            out = conn.as_mut() => return out,
            // A drain that is dropped without a shutdown ends the worker too.
            _ = self.0.changed() => {}
        }
        finish(conn.as_mut());
        conn.await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_shutdown_finishes_connections_and_waits_for_them() {
        let drain = Drain::new();
        let (finished_tx, finished_rx) = tokio::sync::oneshot::channel::<()>();
        let conn = async move {
            finished_rx.await.ok();
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        let served = tokio::spawn(drain.watcher().watch(conn, move |_| {
            finished_tx.send(()).unwrap();
        }));
        let done = drain.watcher().watch(async {}, |_| panic!("already over"));
        done.await;
        let start = tokio::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(10), drain.shutdown())
            .await
            .expect("the connection was told to finish");
        assert!(start.elapsed() >= Duration::from_secs(1), "waited for it");
        served.await.unwrap();
    }
}
