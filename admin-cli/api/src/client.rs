//! The typed admin API client: one method per route, every failure one line that says what to do.

use std::{net::SocketAddr, path::PathBuf, pin::Pin, sync::OnceLock, time::Duration};

use bytes::Bytes;
use eventsource_stream::{EventStreamError, Eventsource};
use futures_util::{Stream, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::{body::Incoming, header, Method, Request, Response, StatusCode};
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::TokioExecutor,
};
use serde::{de::DeserializeOwned, Serialize};

use crate::{
    target::{io_reason, plain, Target},
    wire::{
        ApiError, BackendAdmin, BackendList, BackendView, BanList, BanView, CertificateList,
        ClusterView, ExplainRequest, Explanation, Health, Inspection, LogEntry, LogFilter, NewBan,
        ObjectQuery, PurgeTags, PurgeUrl, Purged, Reloaded, SetBackendHealth, Stats,
    },
};

/// How long a request may take before the daemon counts as unreachable.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The stream sends an event every second; this much silence means the daemon is gone.
const STREAM_SILENCE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("cannot reach lacquerd at {addr}: {reason} (is the service running?)")]
    Unreachable { addr: SocketAddr, reason: String },
    #[error("unauthorized: the secret in {path} does not match")]
    Unauthorized { path: PathBuf },
    #[error("cannot read the admin secret {path}: {reason} (run as root or the lacquer user, or pass --secret FILE)")]
    Secret { path: PathBuf, reason: String },
    #[error("{addr} does not answer like lacquerd's admin API: {reason} (is --admin the admin address?)")]
    NotAdminApi { addr: SocketAddr, reason: String },
    #[error("refused: {}", .error.message)]
    Refused { status: StatusCode, error: ApiError },
    #[error("lacquerd at {addr} is a single node: its configuration has no [cluster] section")]
    NotClustered { addr: SocketAddr },
}

impl AdminError {
    /// 1 when the daemon refused the operation (or is asked about a cluster it is not in), 3 when it cannot be
    /// used at all (down, wrong secret).
    pub fn exit_code(&self) -> u8 {
        match self {
            AdminError::Refused { .. } | AdminError::NotClustered { .. } => 1,
            _ => 3,
        }
    }
}

pub struct AdminClient {
    target: Target,
    http: Client<HttpConnector, Full<Bytes>>,
    secret: OnceLock<String>,
    timeout: Duration,
}

impl AdminClient {
    pub fn new(target: Target) -> Self {
        Self {
            target,
            http: Client::builder(TokioExecutor::new()).build_http(),
            secret: OnceLock::new(),
            timeout: TIMEOUT,
        }
    }

    /// Counts the daemon unreachable after `timeout` instead of the default 10 s.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    pub async fn health(&self) -> Result<Health, AdminError> {
        self.call(Method::GET, "/v1/health", None::<&()>, false)
            .await
    }

    pub async fn stats(&self) -> Result<Stats, AdminError> {
        self.call(Method::GET, "/v1/stats", None::<&()>, true).await
    }

    /// The stats document once a second, for as long as the daemon keeps sending it.
    pub async fn stats_stream(&self) -> Result<StatsStream, AdminError> {
        let resp = self
            .send(Method::GET, "/v1/stats/stream", None, true, self.timeout)
            .await?;
        let resp = self.check(resp).await?;
        let addr = self.target.addr;
        let events = resp.into_body().into_data_stream().eventsource();
        Ok(StatsStream {
            addr,
            events: Box::pin(events),
        })
    }

    /// Follows `GET /v1/log/stream`: every request as it completes, filtered.
    pub async fn log_stream(&self, filter: &LogFilter) -> Result<LogStream, AdminError> {
        let query = serde_urlencoded::to_string(filter).expect("a query of strings encodes");
        let resp = self
            .send(
                Method::GET,
                &format!("/v1/log/stream?{query}"),
                None,
                true,
                self.timeout,
            )
            .await?;
        let resp = self.check(resp).await?;
        Ok(LogStream {
            addr: self.target.addr,
            events: Box::pin(resp.into_body().into_data_stream().eventsource()),
        })
    }

    pub async fn bans(&self) -> Result<BanList, AdminError> {
        self.call(Method::GET, "/v1/bans", None::<&()>, true).await
    }

    pub async fn ban(&self, expression: &str) -> Result<BanView, AdminError> {
        let body = NewBan {
            expression: expression.to_owned(),
        };
        self.call(Method::POST, "/v1/bans", Some(&body), true).await
    }

    pub async fn purge_url(&self, purge: &PurgeUrl) -> Result<Purged, AdminError> {
        self.call(Method::POST, "/v1/purge", Some(purge), true)
            .await
    }

    pub async fn purge_tags(&self, purge: &PurgeTags) -> Result<Purged, AdminError> {
        self.call(Method::POST, "/v1/purge/tags", Some(purge), true)
            .await
    }

    pub async fn inspect(&self, query: &ObjectQuery) -> Result<Inspection, AdminError> {
        let query = serde_urlencoded::to_string(query).expect("a query of strings encodes");
        let path = format!("/v1/objects?{query}");
        self.call(Method::GET, &path, None::<&()>, true).await
    }

    /// `POST /v1/explain`: what the daemon would do with `request`; nothing reaches the origin.
    pub async fn explain(&self, request: &ExplainRequest) -> Result<Explanation, AdminError> {
        self.call(Method::POST, "/v1/explain", Some(request), true)
            .await
    }

    pub async fn backends(&self) -> Result<BackendList, AdminError> {
        self.call(Method::GET, "/v1/backends", None::<&()>, true)
            .await
    }

    /// `PUT /v1/backends/{name}/health`: forces the backend sick or healthy, or back to its probe.
    pub async fn set_backend_health(
        &self,
        name: &str,
        health: BackendAdmin,
    ) -> Result<BackendView, AdminError> {
        let path = format!("/v1/backends/{}/health", path_segment(name));
        self.call(Method::PUT, &path, Some(&SetBackendHealth { health }), true)
            .await
    }

    /// `GET /v1/cluster`; [`AdminError::NotClustered`] from a single node.
    pub async fn cluster(&self) -> Result<ClusterView, AdminError> {
        match self
            .call(Method::GET, "/v1/cluster", None::<&()>, true)
            .await
        {
            Err(AdminError::Refused { status, error })
                if status == StatusCode::NOT_FOUND && error.code == "cluster_disabled" =>
            {
                Err(AdminError::NotClustered {
                    addr: self.target.addr,
                })
            }
            answer => answer,
        }
    }

    /// `GET /v1/certificates`: the certificates obtained by ACME.
    pub async fn certificates(&self) -> Result<CertificateList, AdminError> {
        self.call(Method::GET, "/v1/certificates", None::<&()>, true)
            .await
    }

    /// `POST /v1/certificates/renew`: orders every ACME certificate now; answered when the orders end
    /// (the daemon waits up to 150 s for them).
    pub async fn renew_certificates(&self) -> Result<CertificateList, AdminError> {
        let timeout = self.timeout.max(Duration::from_secs(160));
        self.call_within(
            Method::POST,
            "/v1/certificates/renew",
            None::<&()>,
            true,
            timeout,
        )
        .await
    }

    pub async fn reload(&self) -> Result<Reloaded, AdminError> {
        self.call(Method::POST, "/v1/reload", None::<&()>, true)
            .await
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
        authorized: bool,
    ) -> Result<T, AdminError> {
        self.call_within(method, path, body, authorized, self.timeout)
            .await
    }

    /// As `call`, counting the daemon unreachable after `timeout`.
    async fn call_within<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
        authorized: bool,
        timeout: Duration,
    ) -> Result<T, AdminError> {
        let body = body.map(|b| serde_json::to_vec(b).expect("wire types serialize"));
        let resp = self.send(method, path, body, authorized, timeout).await?;
        let resp = self.check(resp).await?;
        let bytes = tokio::time::timeout(timeout, resp.into_body().collect())
            .await
            .map_err(|_| self.unreachable(format!("no answer within {timeout:?}")))?
            .map_err(|e| self.unreachable(root_cause(&e)))?
            .to_bytes();
        serde_json::from_slice(&bytes).map_err(|e| AdminError::NotAdminApi {
            addr: self.target.addr,
            reason: format!("unexpected answer to {path}: {e}"),
        })
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        authorized: bool,
        timeout: Duration,
    ) -> Result<Response<Incoming>, AdminError> {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.target.addr));
        if authorized {
            req = req.header(header::AUTHORIZATION, format!("Bearer {}", self.secret()?));
        }
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(body.map(Bytes::from).unwrap_or_default()))
            .expect("a valid request");
        tokio::time::timeout(timeout, self.http.request(req))
            .await
            .map_err(|_| self.unreachable(format!("no answer within {timeout:?}")))?
            .map_err(|e| self.unreachable(root_cause(&e)))
    }

    /// Turns an error status into the error it stands for.
    async fn check(&self, resp: Response<Incoming>) -> Result<Response<Incoming>, AdminError> {
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        if status == StatusCode::UNAUTHORIZED {
            return Err(AdminError::Unauthorized {
                path: self.target.secret_file.clone(),
            });
        }
        let body = tokio::time::timeout(self.timeout, resp.into_body().collect())
            .await
            .ok()
            .and_then(Result::ok)
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        match serde_json::from_slice::<ApiError>(&body) {
            Ok(error) => Err(AdminError::Refused { status, error }),
            Err(_) => Err(AdminError::NotAdminApi {
                addr: self.target.addr,
                reason: format!("answered {status} without an API error"),
            }),
        }
    }

    /// Read from the file on first use (routes that need no secret never read it), then kept.
    fn secret(&self) -> Result<&str, AdminError> {
        if let Some(secret) = self.secret.get() {
            return Ok(secret);
        }
        let path = &self.target.secret_file;
        let secret = std::fs::read_to_string(path).map_err(|e| AdminError::Secret {
            path: path.clone(),
            reason: io_reason(&e),
        })?;
        Ok(self.secret.get_or_init(|| secret.trim().to_owned()))
    }

    fn unreachable(&self, reason: String) -> AdminError {
        AdminError::Unreachable {
            addr: self.target.addr,
            reason,
        }
    }
}

type Events = Pin<
    Box<
        dyn Stream<Item = Result<eventsource_stream::Event, EventStreamError<hyper::Error>>> + Send,
    >,
>;

/// `GET /v1/stats/stream`, read one document at a time.
pub struct StatsStream {
    addr: SocketAddr,
    events: Events,
}

impl StatsStream {
    /// The next document; an error when the daemon went away or fell silent.
    pub async fn next(&mut self) -> Result<Stats, AdminError> {
        let unreachable = |reason: String| AdminError::Unreachable {
            addr: self.addr,
            reason,
        };
        let event = tokio::time::timeout(STREAM_SILENCE, self.events.next())
            .await
            .map_err(|_| unreachable(format!("no statistics for {STREAM_SILENCE:?}")))?
            .ok_or_else(|| unreachable("the stream ended".into()))?
            .map_err(|e| unreachable(e.to_string()))?;
        serde_json::from_str(&event.data).map_err(|e| AdminError::NotAdminApi {
            addr: self.addr,
            reason: format!("unexpected statistics event: {e}"),
        })
    }
}

/// What the log stream sends.
#[derive(Debug)]
pub enum LogEvent {
    Entry(Box<LogEntry>),
    /// This many records went by while the reader was too slow.
    Lagged(u64),
}

pub struct LogStream {
    addr: SocketAddr,
    events: Events,
}

impl LogStream {
    /// The next record, however long traffic takes; an error when the daemon goes away.
    pub async fn next(&mut self) -> Result<LogEvent, AdminError> {
        let unreachable = |reason: String| AdminError::Unreachable {
            addr: self.addr,
            reason,
        };
        let event = self
            .events
            .next()
            .await
            .ok_or_else(|| unreachable("the stream ended".into()))?
            .map_err(|e| unreachable(e.to_string()))?;
        let unexpected = |e: serde_json::Error| AdminError::NotAdminApi {
            addr: self.addr,
            reason: format!("unexpected log event: {e}"),
        };
        if event.event == "lagged" {
            let lagged: serde_json::Value =
                serde_json::from_str(&event.data).map_err(unexpected)?;
            return Ok(LogEvent::Lagged(lagged["missed"].as_u64().unwrap_or(0)));
        }
        serde_json::from_str(&event.data)
            .map(|entry| LogEvent::Entry(Box::new(entry)))
            .map_err(unexpected)
    }
}

/// `text` as one path segment: every byte but RFC 3986's unreserved ones percent-encoded, so a backend
/// named with a `/` or a space still names one route.
fn path_segment(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The innermost error: "connection refused" rather than hyper's "client error (Connect)".
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    plain(&cur.to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_name_is_one_path_segment() {
        assert_eq!(super::path_segment("app-1.x_y~"), "app-1.x_y~");
        assert_eq!(super::path_segment("a/b c%"), "a%2Fb%20c%25");
    }
}
