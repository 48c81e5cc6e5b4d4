//! The backends: per-worker connection pools (HTTP/1.1 keep-alive, or one multiplexed HTTP/2 connection),
//! their shared health and probes, and the directors that spread requests over them.

#![warn(missing_docs)]

pub mod body;
mod director;
mod health;
mod http2;
pub mod probe;
pub mod protection;
pub mod routing;
pub mod tally;
pub mod tls;

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use http::{Request, Response, StatusCode, Uri};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::LengthLimitError;
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder, MaybeHttpsStream};
use hyper_util::{
    client::legacy::{connect::HttpConnector, Client},
    rt::{TokioExecutor, TokioIo, TokioTimer},
};
use tokio::{net::TcpStream, sync::OwnedSemaphorePermit};
use tower_service::Service;

pub use self::{director::Director, health::BackendState};

/// The configured backends, in order; routes and directors refer to them by index.
pub type BackendSet = Arc<Vec<Arc<BackendState>>>;

/// How the file names backend `n`: `backend` when there is only one (a `[backend]` table may stand for
/// the list), else `backend[n]`.
pub fn backend_setting(config: &Config, n: usize) -> String {
    if config.backend.len() == 1 {
        "backend".to_owned()
    } else {
        format!("backend[{n}]")
    }
}

/// Fresh states for every `[[backend]]` of `config`; the error names the backend that cannot be built.
pub fn backend_set(config: &Config) -> Result<BackendSet, ConfigError> {
    if config.backend.is_empty() {
        return Err(ConfigError::setting(
            "backend",
            "no backend given (use --backend HOST:PORT or [backend] address)",
        ));
    }
    let states = config
        .backend
        .iter()
        .enumerate()
        .map(|(n, b)| BackendState::new(b, &backend_setting(config, n)).map(Arc::new))
        .collect::<Result<_, _>>()?;
    Ok(Arc::new(states))
}
use lacquer_config::{Config, ConfigError};

use crate::body::Body;

/// Why a request to a backend got no response head. Those that are the backend's fault count against its
/// health; the message is what a client gets in the error page when no stale object stands in.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// No connection: refused, no TCP connection within `connect_timeout`, or the TLS handshake or
    /// certificate check failed. Answered `503`.
    #[error("backend {authority} unreachable: {reason}")]
    Connect {
        /// The backend's `host:port`.
        authority: String,
        /// The error and its sources, as [`error_chain`] writes them.
        reason: String,
    },
    /// No response head within `first_byte_timeout` of the request starting (connecting included).
    /// Answered `504`.
    #[error("backend {authority} sent no response head within {timeout:?}")]
    FirstByteTimeout {
        /// The backend's `host:port`.
        authority: String,
        /// The `first_byte_timeout` that ran out.
        timeout: Duration,
    },
    /// Connected, but the exchange broke before a usable response head (closed, reset, not HTTP).
    /// Answered `502`.
    #[error("backend {authority} failed: {reason}")]
    Failed {
        /// The backend's `host:port`.
        authority: String,
        /// The error and its sources, as [`error_chain`] writes them.
        reason: String,
    },
    /// The client's body went over the listener's `max_request_body` while it was being forwarded: the
    /// client's fault, not the backend's.
    #[error("request body too large")]
    RequestBodyTooLarge,
    /// Reading the client's body failed while it was being forwarded (bad chunked framing, a cut
    /// connection): the client's fault, not the backend's.
    #[error("malformed request body: {0}")]
    RequestBody(String),
    /// Nothing was sent: the backend is sick, or every one of its `max_connections` stayed busy.
    #[error("backend {name} unavailable: {reason}")]
    Unavailable {
        /// The backend or director the route targets.
        name: String,
        /// `sick`, or `every connection busy`.
        reason: &'static str,
    },
}

impl BackendError {
    /// The status a client gets when no stale object can stand in.
    pub fn status(&self) -> StatusCode {
        match self {
            BackendError::FirstByteTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            BackendError::Connect { .. } | BackendError::Unavailable { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            BackendError::Failed { .. } => StatusCode::BAD_GATEWAY,
            BackendError::RequestBodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            BackendError::RequestBody(_) => StatusCode::BAD_REQUEST,
        }
    }
}

/// An error reading the client's request body, marked so that a forwarding failure it causes is not put
/// down to the backend.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ClientBodyError(#[source] pub body::BoxError);

/// One worker's pool of connections to one backend (cloning shares the pool).
#[derive(Clone)]
pub struct Backend {
    pool: Pool,
    /// What [`Backend::upgrade`] connects with, outside the pool: HTTP/1.1 whatever the backend's
    /// protocol, since an upgrade is an HTTP/1.1 mechanism.
    upgrades: Counted,
    /// What every worker shares about the backend: settings, health, traffic, connection limit.
    pub state: Arc<BackendState>,
    connect_timeout: Duration,
    first_byte_timeout: Duration,
    /// Longest silence while the body arrives; whoever reads the body after [`Backend::send`] enforces it.
    pub between_bytes_timeout: Duration,
}

/// How a worker's requests reach the backend.
#[derive(Clone)]
enum Pool {
    /// Keep-alive connections, one request at a time on each.
    Http1(Box<Client<Counted, Body>>),
    /// One connection carrying every request as a stream.
    Http2(Arc<http2::Connection>),
}

impl Backend {
    /// An empty pool for this worker, with the backend's protocol, timeouts and TLS; connections are
    /// opened by requests, and (HTTP/1.1) kept alive per `max_idle_connections` and `idle_timeout`.
    pub fn new(state: Arc<BackendState>) -> Self {
        let cfg = &state.config;
        let mut tcp = HttpConnector::new();
        tcp.set_connect_timeout(Some(cfg.connect_timeout));
        tcp.set_nodelay(true);
        tcp.set_keepalive(Some(Duration::from_secs(60)));
        // The scheme of each request (the backend's) decides whether TLS is spoken.
        tcp.enforce_http(false);
        let tls = state
            .tls
            .as_ref()
            .map_or_else(tls::trusting_nothing, |t| t.config.clone());
        let http1 = Counted {
            inner: HttpsConnectorBuilder::new()
                .with_tls_config((*tls).clone())
                .https_or_http()
                .enable_http1()
                .wrap_connector(tcp.clone()),
            state: state.clone(),
        };
        let pool = match cfg.protocol {
            lacquer_config::Protocol::Http1 => Pool::Http1(Box::new(
                Client::builder(TokioExecutor::new())
                    .timer(TokioTimer::new())
                    .pool_timer(TokioTimer::new())
                    .pool_idle_timeout(cfg.idle_timeout)
                    .pool_max_idle_per_host(cfg.max_idle_connections)
                    .build(http1.clone()),
            )),
            lacquer_config::Protocol::H2 | lacquer_config::Protocol::H2c => {
                let connector = Counted {
                    inner: HttpsConnectorBuilder::new()
                        .with_tls_config((*tls).clone())
                        .https_or_http()
                        .enable_http2()
                        .wrap_connector(tcp),
                    state: state.clone(),
                };
                Pool::Http2(Arc::new(http2::Connection::new(connector, &state)))
            }
        };
        Self {
            pool,
            upgrades: http1,
            connect_timeout: cfg.connect_timeout,
            first_byte_timeout: cfg.first_byte_timeout,
            between_bytes_timeout: cfg.between_bytes_timeout,
            state,
        }
    }

    /// Sends a request whose URI holds only the path and query; the backend's authority is filled in here.
    /// The response body holds the backend's connection place (`max_connections`) until it is dropped.
    pub async fn send(&self, req: Request<Body>) -> Result<Response<BackendBody>, BackendError> {
        let permit = self.place().await?;
        let sent = lacquer_clock::monotonic();
        let result = self.request(req).await;
        self.account(&result, sent);
        result.map(|resp| {
            resp.map(|inner| BackendBody {
                inner,
                permit,
                state: self.state.clone(),
                sent: Some(sent),
            })
        })
    }

    /// Sends an upgrade request (`Connection: upgrade`) on a connection of its own, opened as the pool's
    /// are (TLS, timeouts) but never pooled: once the backend answers `101` the connection carries another
    /// protocol, which `hyper::upgrade::on` on the response hands over. Any other answer is an ordinary
    /// response, and the connection goes with its body. The backend's place under `max_connections` is
    /// held until the body is dropped, as [`Backend::send`] holds it: for the handshake, not for the
    /// tunnel, so long-lived tunnels never starve its misses. An HTTP/2 backend gets the upgrade on an
    /// HTTP/1.1 connection of its own too (over TLS without ALPN for `h2`, plain for `h2c`): the origin
    /// must also speak HTTP/1.1 on its address for WebSockets to pass.
    pub async fn upgrade(&self, req: Request<Body>) -> Result<Response<BackendBody>, BackendError> {
        let permit = self.place().await?;
        let sent = lacquer_clock::monotonic();
        let result = match tokio::time::timeout(self.first_byte_timeout, self.handshake(req)).await
        {
            Ok(result) => result,
            Err(_) => Err(BackendError::FirstByteTimeout {
                authority: self.state.authority.clone(),
                timeout: self.first_byte_timeout,
            }),
        };
        self.account(&result, sent);
        result.map(|resp| {
            resp.map(|inner| BackendBody {
                inner,
                permit,
                state: self.state.clone(),
                // A tunnel's length is the client's doing, no measure of the backend.
                sent: None,
            })
        })
    }

    async fn handshake(&self, mut req: Request<Body>) -> Result<Response<Incoming>, BackendError> {
        let authority = &self.state.authority;
        let failed = |e: &dyn std::error::Error| BackendError::Failed {
            authority: authority.clone(),
            reason: error_chain(e),
        };
        let uri = self.target("/")?;
        let mut connector = self.upgrades.clone();
        let connecting = async {
            std::future::poll_fn(|cx| connector.poll_ready(cx)).await?;
            connector.call(uri).await
        };
        let io = connecting.await.map_err(|e| BackendError::Connect {
            authority: authority.clone(),
            reason: error_chain(&*e),
        })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| failed(&e))?;
        // The connection's task ends with the exchange, or hands the connection over on a `101`.
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(error = %e, "upgrade connection to the backend ended with an error");
            }
        });
        // Origin-form, with the client's `Host`: this connection speaks to the origin, not to a proxy.
        let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
        *req.uri_mut() = path.parse().map_err(|e| failed(&e))?;
        sender.send_request(req).await.map_err(|e| failed(&e))
    }

    /// The backend's URI for a request target.
    fn target(&self, path: &str) -> Result<Uri, BackendError> {
        let authority = &self.state.authority;
        let scheme = if self.state.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{authority}{path}")
            .parse()
            .map_err(|e| BackendError::Failed {
                authority: authority.clone(),
                reason: format!("bad request target: {e}"),
            })
    }

    /// A place under `max_connections`, waited for up to `connect_timeout`; `None` without a limit.
    async fn place(&self) -> Result<Option<OwnedSemaphorePermit>, BackendError> {
        let Some(limit) = &self.state.limit else {
            return Ok(None);
        };
        match tokio::time::timeout(self.connect_timeout, limit.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(Some(permit)),
            _ => Err(BackendError::Unavailable {
                name: self.state.name().to_owned(),
                reason: "every connection busy",
            }),
        }
    }

    /// Counts an exchange in the backend's health: the client's faults never count against it.
    fn account<B>(&self, result: &Result<Response<B>, BackendError>, sent: Instant) {
        let state = &self.state;
        if let Ok(resp) = result {
            state.answered(resp.status(), sent.elapsed());
        }
        match &result {
            Ok(resp) if resp.status().is_server_error() => state.failed(format!(
                "backend {} answered {}",
                state.authority,
                resp.status()
            )),
            Ok(_) => state.succeeded(),
            Err(BackendError::RequestBodyTooLarge | BackendError::RequestBody(_)) => {}
            Err(e) => state.failed(e.to_string()),
        }
    }

    async fn request(&self, mut req: Request<Body>) -> Result<Response<Incoming>, BackendError> {
        let authority = &self.state.authority;
        let sent = match &self.pool {
            Pool::Http1(client) => {
                let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
                *req.uri_mut() = self.target(path)?;
                let sending = async {
                    client.request(req).await.map_err(|e| {
                        if e.is_connect() {
                            BackendError::Connect {
                                authority: authority.clone(),
                                reason: error_chain(&e),
                            }
                        } else {
                            self.exchange_failed(&e)
                        }
                    })
                };
                tokio::time::timeout(self.first_byte_timeout, sending).await
            }
            Pool::Http2(connection) => {
                let scheme = if self.state.tls.is_some() {
                    "https"
                } else {
                    "http"
                };
                http2::prepare(&mut req, scheme, authority).map_err(|e| BackendError::Failed {
                    authority: authority.clone(),
                    reason: format!("bad request target: {e}"),
                })?;
                let sending = connection.send(req, |e| self.exchange_failed(e));
                tokio::time::timeout(self.first_byte_timeout, sending).await
            }
        };
        sent.unwrap_or_else(|_| {
            Err(BackendError::FirstByteTimeout {
                authority: authority.clone(),
                timeout: self.first_byte_timeout,
            })
        })
    }

    /// Why an exchange on an open connection failed: the client's body, else the backend (counting a
    /// stream it reset or cut off).
    fn exchange_failed(&self, e: &(dyn std::error::Error + 'static)) -> BackendError {
        if caused_by::<LengthLimitError>(e) {
            return BackendError::RequestBodyTooLarge;
        }
        if caused_by::<ClientBodyError>(e) {
            return BackendError::RequestBody(error_chain(e));
        }
        if http2::reset_by_origin(e) {
            self.state.stream_reset();
        }
        BackendError::Failed {
            authority: self.state.authority.clone(),
            reason: error_chain(e),
        }
    }
}

/// The connector of a worker's pool, counting the connections it opens in the backend's traffic.
#[derive(Clone)]
struct Counted {
    inner: HttpsConnector<HttpConnector>,
    state: Arc<BackendState>,
}

/// No connection, TLS handshake included, within `connect_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("no connection (TCP and TLS handshakes) within connect_timeout ({0:?})")]
struct ConnectTimedOut(Duration);

/// A connection to a backend, TLS or not.
type Stream = MaybeHttpsStream<TokioIo<TcpStream>>;

impl Service<Uri> for Counted {
    type Response = Stream;
    type Error = body::BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Stream, body::BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let state = self.state.clone();
        // The TCP connector's own timeout ends at the TCP handshake: a backend that accepts and never
        // answers the ClientHello would hold each request until `first_byte_timeout` (60 s), reported as
        // "no response head". The TLS handshake is part of connecting, as NGINX's
        // `proxy_connect_timeout` has it.
        let within = state.config.connect_timeout;
        Box::pin(async move {
            let io = tokio::time::timeout(within, connecting)
                .await
                .map_err(|_| ConnectTimedOut(within))??;
            state.connection_opened();
            Ok(io)
        })
    }
}

/// A backend's response body, holding the backend's connection place until it is dropped. Dropped before
/// its end, it closes its HTTP/1.1 connection or resets its HTTP/2 stream (`CANCEL`): the origin stops
/// sending what nobody reads. A body that breaks off counts against the backend's health.
pub struct BackendBody {
    inner: Incoming,
    permit: Option<OwnedSemaphorePermit>,
    state: Arc<BackendState>,
    /// When the request went out, for the backend's latency; none for an upgrade's.
    sent: Option<Instant>,
}

impl HttpBody for BackendBody {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        match &frame {
            // The response is over: the place is free for the next request.
            Poll::Ready(None) => {
                self.permit = None;
                if let Some(sent) = self.sent.take() {
                    self.state.body_ended(sent.elapsed());
                }
            }
            Poll::Ready(Some(Err(e))) => {
                if http2::reset_by_origin(e) {
                    self.state.stream_reset();
                }
                self.state.body_failed(format!(
                    "backend {} body broke off: {}",
                    self.state.authority,
                    error_chain(e)
                ));
                self.permit = None;
            }
            _ => {}
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for BackendBody {
    fn drop(&mut self) {
        // Readers stop at the last frame of a body whose length says it is complete, without polling for
        // its end.
        if let Some(sent) = self.sent.filter(|_| self.inner.is_end_stream()) {
            self.state.body_ended(sent.elapsed());
        }
    }
}

fn caused_by<E: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(e), |e| e.source()).any(|e| e.is::<E>())
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
