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
use crate::{error_chain, http2, tls};
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

/// One poll: the status, or why there was none. Over TLS for `https://` backends (with the backend's client
/// certificate), and in the backend's protocol, checked as requests are.
async fn poll(state: &BackendState, probe: &config::Probe) -> Result<u16, String> {
    let authority = state.authority.as_str();
    let h2 = state.config.protocol != config::Protocol::Http1;
    let exchange = async {
        let tcp = TcpStream::connect(authority)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        match &state.tls {
            None => request(tcp, state, probe).await,
            Some(tls) => {
                let host = authority
                    .rsplit_once(':')
                    .map_or(authority, |(h, _)| h)
                    .trim_matches(['[', ']']);
                let name = ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())?;
                let config = if h2 {
                    tls::offering(&tls.config, b"h2")
                } else {
                    tls.config.clone()
                };
                let tls = TlsConnector::from(config)
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("TLS: {e}"))?;
                if h2 && tls.get_ref().1.alpn_protocol() != Some(b"h2") {
                    return Err("the origin did not agree to HTTP/2 (no ALPN h2)".into());
                }
                request(tls, state, probe).await
            }
        }
    };
    tokio::time::timeout(probe.timeout, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("no response within {:?}", probe.timeout)))
}

async fn request<IO>(io: IO, state: &BackendState, probe: &config::Probe) -> Result<u16, String>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let authority = state.authority.as_str();
    let io = TokioIo::new(io);
    let resp = if state.config.protocol == config::Protocol::Http1 {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let req = Request::get(probe.url.as_str())
            .header(header::HOST, authority)
            .header(header::CONNECTION, "close")
            .header(header::USER_AGENT, "lacquer-probe")
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        send.send_request(req).await
    } else {
        let (mut send, conn) = http2::probe_builder()
            .handshake(io)
            .await
            .map_err(|e| error_chain(&e))?;
        tokio::spawn(conn);
        // HTTP/2 names the target in `:scheme` and `:authority`, and has no `Connection`: the connection
        // goes when the poll is over and `send` is dropped.
        let scheme = if state.tls.is_some() { "https" } else { "http" };
        let req = Request::get(format!("{scheme}://{authority}{}", probe.url))
            .header(header::USER_AGENT, "lacquer-probe")
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        send.send_request(req).await
    };
    Ok(resp.map_err(|e| error_chain(&e))?.status().as_u16())
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
