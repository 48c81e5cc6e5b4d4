//! Health probes, as Varnish's: a `GET` on a fresh connection every `interval`; the backend is healthy while
//! `threshold` of the last `window` polls got `expected_status` within `timeout`.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, Request};
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use tokio::{net::TcpStream, sync::watch};

use super::BackendState;
use crate::{
    config,
    stats::{dec, inc, Stats},
};

/// Polls until `stop` turns true. The first poll is made at once.
pub async fn run(
    state: Arc<BackendState>,
    probe: config::Probe,
    stats: Arc<Stats>,
    mut stop: watch::Receiver<bool>,
) {
    let window = state.probe.as_ref().expect("a backend with a probe");
    loop {
        let (good, what) = match poll(&state.authority, &probe).await {
            Ok(status) if status == probe.expected_status => (true, status.to_string()),
            Ok(status) => (false, format!("status {status}")),
            Err(e) => (false, e),
        };
        let (was, now) = window.record(good, what.clone());
        if was != now {
            if now {
                dec(&stats.backends_sick);
                tracing::info!(backend = %state.name, "backend healthy: {what}");
            } else {
                inc(&stats.backends_sick);
                tracing::warn!(backend = %state.name, "backend sick: {what}");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(probe.interval) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// One poll: the status, or why there was none.
async fn poll(authority: &str, probe: &config::Probe) -> Result<u16, String> {
    let exchange = async {
        let tcp = TcpStream::connect(authority)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let req = Request::get(probe.url.as_str())
            .header(header::HOST, authority)
            .header(header::CONNECTION, "close")
            .header(header::USER_AGENT, "lacquer-probe")
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
        Ok(resp.status().as_u16())
    };
    tokio::time::timeout(probe.timeout, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("no response within {:?}", probe.timeout)))
}
