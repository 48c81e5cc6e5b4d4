//! The origin connection pool: one per worker thread, HTTP/1.1 keep-alive.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc, Mutex,
    },
    time::Duration,
};

use http::{Request, Response, StatusCode};
use http_body_util::LengthLimitError;
use hyper::body::Incoming;
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::{TokioExecutor, TokioTimer},
};

use lacquer_admin::wire::{self, BackendView, LastError};

use crate::{body::Body, config, proxy::now_ms};

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("backend {authority} unreachable: {reason}")]
    Connect { authority: String, reason: String },
    #[error("backend {authority} sent no response head within {timeout:?}")]
    FirstByteTimeout {
        authority: String,
        timeout: Duration,
    },
    #[error("backend {authority} failed: {reason}")]
    Failed { authority: String, reason: String },
    /// The client's body went over the listener's `max_request_body` while it was being forwarded: the
    /// client's fault, not the backend's.
    #[error("request body too large")]
    RequestBodyTooLarge,
}

impl BackendError {
    /// The status a client gets when no stale object can stand in.
    pub fn status(&self) -> StatusCode {
        match self {
            BackendError::FirstByteTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            BackendError::Connect { .. } => StatusCode::SERVICE_UNAVAILABLE,
            BackendError::Failed { .. } => StatusCode::BAD_GATEWAY,
            BackendError::RequestBodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        }
    }
}

pub struct Backend {
    client: Client<HttpConnector, Body>,
    health: Arc<BackendHealth>,
    authority: String,
    first_byte_timeout: Duration,
    pub between_bytes_timeout: Duration,
}

impl Backend {
    pub fn new(origin: &config::Origin, cfg: &config::Backend, health: Arc<BackendHealth>) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(cfg.connect_timeout));
        connector.set_nodelay(true);
        connector.set_keepalive(Some(Duration::from_secs(60)));
        let client = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(cfg.idle_timeout)
            .pool_max_idle_per_host(cfg.max_idle_connections)
            .build(connector);
        Self {
            client,
            health,
            authority: origin.authority.clone(),
            first_byte_timeout: cfg.first_byte_timeout,
            between_bytes_timeout: cfg.between_bytes_timeout,
        }
    }

    /// Sends a request whose URI holds only the path and query; the origin's authority is filled in here.
    pub async fn send(&self, req: Request<Body>) -> Result<Response<Incoming>, BackendError> {
        let result = self.request(req).await;
        match &result {
            Ok(resp) if resp.status().is_server_error() => self.health.failed(format!(
                "backend {} answered {}",
                self.authority,
                resp.status()
            )),
            Ok(_) => self.health.succeeded(),
            Err(BackendError::RequestBodyTooLarge) => {}
            Err(e) => self.health.failed(e.to_string()),
        }
        result
    }

    async fn request(&self, mut req: Request<Body>) -> Result<Response<Incoming>, BackendError> {
        let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
        *req.uri_mut() = format!("http://{}{}", self.authority, path)
            .parse()
            .map_err(|e| BackendError::Failed {
                authority: self.authority.clone(),
                reason: format!("bad request target: {e}"),
            })?;
        match tokio::time::timeout(self.first_byte_timeout, self.client.request(req)).await {
            Err(_) => Err(BackendError::FirstByteTimeout {
                authority: self.authority.clone(),
                timeout: self.first_byte_timeout,
            }),
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) if e.is_connect() => Err(BackendError::Connect {
                authority: self.authority.clone(),
                reason: error_chain(&e),
            }),
            Ok(Err(e)) if caused_by::<LengthLimitError>(&e) => {
                Err(BackendError::RequestBodyTooLarge)
            }
            Ok(Err(e)) => Err(BackendError::Failed {
                authority: self.authority.clone(),
                reason: error_chain(&e),
            }),
        }
    }
}

fn caused_by<E: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(e), |e| e.source()).any(|e| e.is::<E>())
}

/// How requests to the origin have been going, judged from real traffic (every worker's), for
/// `GET /v1/backends`. A 5xx answer counts as a failure, as it does for `stale-if-error`.
#[derive(Debug, Default)]
pub struct BackendHealth {
    requests: AtomicU64,
    errors: AtomicU64,
    consecutive_failures: AtomicU64,
    last_success_ms: AtomicU64,
    last_error: Mutex<Option<LastError>>,
}

impl BackendHealth {
    fn succeeded(&self) {
        self.requests.fetch_add(1, Relaxed);
        self.consecutive_failures.store(0, Relaxed);
        self.last_success_ms.store(now_ms(), Relaxed);
    }

    fn failed(&self, message: String) {
        self.requests.fetch_add(1, Relaxed);
        self.errors.fetch_add(1, Relaxed);
        self.consecutive_failures.fetch_add(1, Relaxed);
        *self.last_error.lock().expect("health mutex") = Some(LastError {
            at: now_ms() / 1000,
            message,
        });
    }

    pub fn view(&self, name: &str, address: &str) -> BackendView {
        let requests = self.requests.load(Relaxed);
        let consecutive_failures = self.consecutive_failures.load(Relaxed);
        let last_success_ms = self.last_success_ms.load(Relaxed);
        BackendView {
            name: name.to_owned(),
            address: address.to_owned(),
            health: match (requests, consecutive_failures) {
                (0, _) => wire::BackendHealth::Unknown,
                (_, 0) => wire::BackendHealth::Healthy,
                _ => wire::BackendHealth::Failing,
            },
            requests,
            errors: self.errors.load(Relaxed),
            consecutive_failures,
            last_success: (last_success_ms > 0).then_some(last_success_ms / 1000),
            last_error: self.last_error.lock().expect("health mutex").clone(),
        }
    }
}

/// `a: b: c` from an error and its sources: hyper's top-level messages alone say little.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
