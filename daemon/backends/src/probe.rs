//! Health probes, as Varnish's: a `GET` on a fresh connection every `interval`; the backend is healthy while
//! `threshold` of the last `window` polls got `expected_status` within `timeout`.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, Request};
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::{net::TcpStream, sync::watch};
use tokio_rustls::TlsConnector;

use super::BackendState;
use lacquer_config as config;

/// Polls until `stop` turns true or the backend is retired by a reload. The first poll is made at once.
pub async fn run(state: Arc<BackendState>, mut stop: watch::Receiver<bool>) {
    let window = state.probe.as_ref().expect("a backend with a probe");
    let probe = state.config.probe.clone().expect("a backend with a probe");
    let mut retired = state.retirement();
    loop {
        let (good, what) = match poll(&state, &probe).await {
            Ok(status) if status == probe.expected_status => (true, status.to_string()),
            Ok(status) => (false, format!("status {status}")),
            Err(e) => (false, e),
        };
        let (was, now) = window.record(good, what.clone());
        if *retired.borrow() {
            return;
        }
        if was != now {
            if now {
                tracing::info!(backend = %state.name(), "backend healthy: {what}");
            } else {
                tracing::warn!(backend = %state.name(), "backend sick: {what}");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(probe.interval) => {}
            _ = stop.wait_for(|s| *s) => return,
            _ = retired.wait_for(|r| *r) => return,
        }
    }
}

/// One poll: the status, or why there was none. Over TLS for `https://` backends, checked as requests are.
async fn poll(state: &BackendState, probe: &config::Probe) -> Result<u16, String> {
    let authority = state.authority.as_str();
    let exchange = async {
        let tcp = TcpStream::connect(authority)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        match &state.tls {
            None => request(tcp, authority, probe).await,
            Some(config) => {
                let host = authority
                    .rsplit_once(':')
                    .map_or(authority, |(h, _)| h)
                    .trim_matches(['[', ']']);
                let name = ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())?;
                let tls = TlsConnector::from(config.clone())
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("TLS: {e}"))?;
                request(tls, authority, probe).await
            }
        }
    };
    tokio::time::timeout(probe.timeout, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("no response within {:?}", probe.timeout)))
}

async fn request<IO>(io: IO, authority: &str, probe: &config::Probe) -> Result<u16, String>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
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
}

/// Starts probes on the store runtime: at start, and for the backends a reload brings.
#[derive(Clone)]
pub struct Probes {
    /// Where probe tasks are spawned: the store's runtime, not a worker's.
    pub runtime: tokio::runtime::Handle,
    /// Shutdown.
    pub stop: watch::Receiver<bool>,
}

impl Probes {
    /// Starts a probe for each of `backends` that has one; each stops at shutdown or when its backend is
    /// retired.
    pub fn start(&self, backends: &[Arc<BackendState>]) {
        for backend in backends.iter().filter(|b| b.probe.is_some()) {
            self.runtime.spawn(run(backend.clone(), self.stop.clone()));
        }
    }
}
