//! Serving the admin API on its listener with the bounds the client listeners have: a request head must
//! arrive within `header_read_timeout` (a partial head, or a keep-alive connection left idle, is closed), a
//! connection on which nothing moves for `idle_timeout` is closed, and past `max_connections` a new
//! connection is closed at once. Without them, every connection left open with a partial head held its
//! memory and descriptor for good.

use std::{convert::Infallible, sync::Arc};

use axum::{body::Body, extract::Request, Router};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::{conn::auto, graceful::GracefulShutdown},
};
use lacquer_config::Admin;
use lacquer_edge::{Activity, IdleTimeout};
use tokio::{
    net::TcpListener,
    sync::{watch, Semaphore},
};
use tower_service::Service;

/// Serves `app` on `listener` under `settings`' limits until `stopping` turns true, then lets the
/// connections open finish their requests.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    settings: &Admin,
    mut stopping: watch::Receiver<bool>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let open =
        (settings.max_connections > 0).then(|| Arc::new(Semaphore::new(settings.max_connections)));
    let graceful = GracefulShutdown::new();
    let stop = async move { drop(stopping.wait_for(|stop| *stop).await) };
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Typically EMFILE: back off instead of spinning.
                    tracing::warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let admitted = match &open {
            Some(open) => match open.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    tracing::debug!(%peer, "admin connection over max_connections; closed");
                    continue;
                }
            },
            None => None,
        };
        let activity = Arc::new(Activity::default());
        let io = TokioIo::new(IdleTimeout::new(
            stream,
            settings.idle_timeout,
            activity.clone(),
        ));
        let app = app.clone();
        // A request waiting for its handler (a reload reading files) is not idle.
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let waiting = activity.enter();
            let mut app = app.clone();
            async move {
                let response = app.call(req.map(Body::new)).await;
                drop(waiting);
                Ok::<_, Infallible>(response.unwrap_or_else(|never| match never {}))
            }
        });
        let connection = builder.serve_connection_with_upgrades(io, service);
        let connection = graceful.watch(connection.into_owned());
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(%peer, error = %e, "admin connection ended with an error");
            }
            drop(admitted);
        });
    }
    graceful.shutdown().await;
}
