//! HTTP/3 over QUIC (quinn and h3): a listener's UDP side, from a client's first packet to the close of its
//! connection, and the answer to each request stream.
//!
//! Each worker has its own `SO_REUSEPORT` UDP socket and quinn endpoint on the listener's address; the
//! kernel hashes datagrams by their 4-tuple, so a connection stays on one worker (active migration is off,
//! as it would move a connection's datagrams to another worker's socket). The workers share one
//! [`quinn::ServerConfig`] and [`quinn::EndpointConfig`], hence one Retry token key and one stateless reset
//! key.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use bytes::Bytes;
use h3::{error::Code, server::RequestStream};
use http::{header, HeaderValue, Method, Request, Response};
use http_body_util::BodyExt;
use tokio::sync::watch;

use crate::{
    body::{H3Body, RequestBody},
    drain::{Drain, Watcher},
    stats::{add, dec, inc, ListenerStats},
    tls::{self, SniResolver},
    Client, Interim, Listener, Service,
};
use lacquer_config::Listen;

/// Unidirectional streams a client may have open: HTTP/3 needs three (control, QPACK encoder and decoder);
/// the rest leaves room for the reserved stream types clients send to exercise extensibility (RFC 9114
/// §6.2.3), which are read and discarded.
const UNI_STREAMS: u32 = 16;

/// Bytes one connection may send before the daemon has read them, all streams together (quinn's default is
/// no limit beyond each stream's window, 1.25 MB, times `quic_max_streams`): bounds what a client that sends
/// bodies or QPACK instructions nobody reads makes the daemon hold, while leaving an upload the window of
/// a 1 Gbit/s path with 100 ms of round trip.
const RECEIVE_WINDOW: u32 = 16 << 20;

/// HTTP/3's code for a close without error, used when the connection is closed here on a timeout.
const H3_NO_ERROR: quinn::VarInt = quinn::VarInt::from_u32(0x100);

/// What a listener's QUIC side shares across workers.
pub struct Quic {
    server: quinn::ServerConfig,
    endpoint: quinn::EndpointConfig,
    max_field_section_size: u64,
    zero_rtt: bool,
    retry_above: usize,
}

impl Quic {
    pub fn new(config: &Listen, resolver: Arc<SniResolver>) -> Self {
        let tls = tls::quic_server_config(resolver, config.quic_0rtt);
        let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
            .expect("ring offers TLS_AES_128_GCM_SHA256, which QUIC's initial packets need");
        let mut transport = quinn::TransportConfig::default();
        transport
            .max_concurrent_bidi_streams(config.quic_max_streams.into())
            .max_concurrent_uni_streams(UNI_STREAMS.into())
            .receive_window(RECEIVE_WINDOW.into())
            // Beyond QUIC's largest idle timeout (2^62 ms) is none.
            .max_idle_timeout(quinn::IdleTimeout::try_from(config.idle_timeout).ok());
        let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        server
            .transport_config(Arc::new(transport))
            .migration(false);
        Self {
            server,
            endpoint: quinn::EndpointConfig::default(),
            max_field_section_size: config.max_header_size.as_u64(),
            zero_rtt: config.quic_0rtt,
            retry_above: config.quic_retry_above,
        }
    }

    /// A worker's endpoint on its own socket; in the worker's runtime.
    pub fn endpoint(&self, socket: std::net::UdpSocket) -> std::io::Result<quinn::Endpoint> {
        quinn::Endpoint::new(
            self.endpoint.clone(),
            Some(self.server.clone()),
            socket,
            Arc::new(quinn::TokioRuntime),
        )
    }
}

/// The `Alt-Svc` field a TCP listener's responses advertise its HTTP/3 side with; `None` when `max_age` is
/// zero.
pub fn alt_svc(port: u16, max_age: Duration) -> Option<HeaderValue> {
    let seconds = max_age.as_secs();
    (seconds > 0).then(|| {
        HeaderValue::from_str(&format!("h3=\":{port}\"; ma={seconds}"))
            .expect("digits and quotes make a valid field")
    })
}

/// Whether a request that came in early data (0-RTT, replayable by an attacker) may be answered before the
/// handshake completes: only methods that change nothing (RFC 9110 §9.2.1), and OPTIONS.
pub fn early_allowed(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Handshakes in progress on one worker, counted while each is held.
#[derive(Default)]
pub struct Handshaking(Arc<AtomicUsize>);

struct InHandshake(Arc<AtomicUsize>);

impl Handshaking {
    fn now(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    fn enter(&self) -> InHandshake {
        self.0.fetch_add(1, Ordering::Relaxed);
        InHandshake(self.0.clone())
    }
}

impl Drop for InHandshake {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Accepts a worker's QUIC connections until `shutdown`.
pub async fn accept<S: Service>(
    endpoint: quinn::Endpoint,
    listener: Arc<Listener>,
    quic: Arc<Quic>,
    service: Arc<S>,
    graceful: &Drain,
    mut shutdown: watch::Receiver<bool>,
) {
    let handshaking = Handshaking::default();
    loop {
        let incoming = tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => {
                // New clients are refused from now on; those connected finish with the drain.
                endpoint.set_server_config(None);
                return;
            }
            incoming = endpoint.accept() => match incoming {
                Some(incoming) => incoming,
                None => return,
            },
        };
        let stats = service.stats();
        // Quinn itself answers no more than three times what an unvalidated address sent (RFC 9000 §8.1);
        // under load a client proves its address first, so a flood of spoofed Initials costs one
        // stateless Retry each.
        if !incoming.remote_address_validated()
            && incoming.may_retry()
            && handshaking.now() >= quic.retry_above
        {
            inc(&stats.quic_retries);
            let _ = incoming.retry();
            continue;
        }
        let admitted = listener.limits.admit().and_then(|mut admitted| {
            let ip = incoming.remote_address().ip();
            listener
                .limits
                .admit_client(&mut admitted, ip)
                .then_some(admitted)
        });
        let Some(admitted) = admitted else {
            inc(&stats.connections_refused);
            incoming.refuse();
            continue;
        };
        let conn = Connection {
            service: service.clone(),
            listener: listener.clone(),
            quic: quic.clone(),
        };
        tokio::spawn(conn.serve(incoming, handshaking.enter(), admitted, graceful.watcher()));
    }
}

struct Connection<S> {
    service: Arc<S>,
    listener: Arc<Listener>,
    quic: Arc<Quic>,
}

/// How a QUIC connection that did not end cleanly ended, for the counters.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ended {
    IdleTimeout,
    /// An HTTP/3 error, raised by either side: a malformed frame, a QPACK failure, a protocol violation.
    Protocol,
    /// A QUIC transport error, raised by either side: flow control, stream limits, bad frames.
    Transport,
    /// A stateless reset: the peer lost the connection's state.
    Reset,
}

impl<S: Service> Connection<S> {
    async fn serve(
        self,
        incoming: quinn::Incoming,
        handshake: InHandshake,
        admitted: crate::limits::Admitted,
        watcher: Watcher,
    ) {
        let stats = self.service.stats();
        let counters = &self.listener.stats;
        inc(&counters.connections);
        inc(&stats.connections_open);
        inc(&counters.quic_handshakes);
        if let Some(conn) = self.handshake(incoming, handshake).await {
            if let Some(ended) = self.run(&conn, watcher).await {
                inc(match ended {
                    Ended::IdleTimeout => &counters.quic_errors_idle_timeout,
                    Ended::Protocol => &counters.quic_errors_protocol,
                    Ended::Transport => &counters.quic_errors_transport,
                    Ended::Reset => &counters.quic_errors_reset,
                });
            }
        }
        drop(admitted);
        dec(&stats.connections_open);
    }

    /// The connection, once it may carry requests: after the handshake, or at once with 0-RTT (whose
    /// handshake then completes while early requests are served: `Handshaken::confirmed`). `None` when it failed.
    async fn handshake(
        &self,
        incoming: quinn::Incoming,
        handshake: InHandshake,
    ) -> Option<Handshaken> {
        let stats = self.service.stats();
        let counters = &self.listener.stats;
        let timeout = self.listener.config.header_read_timeout;
        let connecting = match incoming.accept() {
            Ok(connecting) => connecting,
            Err(e) => {
                inc(&counters.quic_handshake_errors);
                tracing::debug!(error = %e, "QUIC connection refused");
                return None;
            }
        };
        let connecting = if self.quic.zero_rtt {
            match connecting.into_0rtt() {
                Ok((conn, done)) => {
                    let confirmed = Arc::new(AtomicBool::new(false));
                    let watching = confirmed.clone();
                    let early = conn.clone();
                    let service = self.service.clone();
                    let counters = counters.clone();
                    // The handshake still has `header_read_timeout` to complete, requests or not.
                    tokio::spawn(async move {
                        let completed = tokio::time::timeout(timeout, done).await;
                        drop(handshake);
                        let stats = service.stats();
                        match completed {
                            Ok(_) if early.close_reason().is_none() => {
                                watching.store(true, Ordering::Release)
                            }
                            Ok(_) => inc(&counters.quic_handshake_errors),
                            Err(_) => {
                                inc(&stats.header_timeouts);
                                early.close(H3_NO_ERROR, b"");
                            }
                        }
                    });
                    return Some(Handshaken { conn, confirmed });
                }
                Err(connecting) => connecting,
            }
        } else {
            connecting
        };
        let conn = match tokio::time::timeout(timeout, connecting).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => {
                inc(&counters.quic_handshake_errors);
                tracing::debug!(error = %e, "QUIC handshake failed");
                return None;
            }
            Err(_) => {
                inc(&stats.header_timeouts);
                return None;
            }
        };
        drop(handshake);
        Some(Handshaken {
            conn,
            confirmed: Arc::new(AtomicBool::new(true)),
        })
    }

    /// Serves the connection's requests until it closes, or until the drain, after which it finishes those
    /// it has (a GOAWAY tells the client which). Returns how it ended, when that was not cleanly.
    async fn run(&self, handshaken: &Handshaken, mut watcher: Watcher) -> Option<Ended> {
        let stats = self.service.stats();
        let conn = &handshaken.conn;
        let config = &self.listener.config;
        let mut builder = h3::server::builder();
        // No reserved frame types after a response's last DATA frame ("grease"): aioquic 1.2 then never
        // reports the stream's end to its application.
        builder
            .max_field_section_size(self.quic.max_field_section_size)
            .send_grease(false);
        let built = tokio::time::timeout(
            config.header_read_timeout,
            builder.build::<_, Bytes>(h3_quinn::Connection::new(conn.clone())),
        )
        .await;
        let mut h3 = match built {
            Ok(Ok(h3)) => h3,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "HTTP/3 connection failed");
                return ended(conn, &e);
            }
            Err(_) => {
                inc(&stats.header_timeouts);
                conn.close(H3_NO_ERROR, b"");
                return None;
            }
        };
        inc(&stats.connections_http3);
        let request = Arc::new(PerRequest {
            client: Client {
                ip: conn.remote_address().ip(),
                max_request_body: config.max_request_body.as_u64(),
                refused: false,
                secure: true,
                too_early: false,
            },
            listener: self.listener.stats.clone(),
            conn: conn.clone(),
            header_read_timeout: config.header_read_timeout,
            idle_timeout: config.idle_timeout,
        });
        let mut draining = false;
        let mut closed = std::pin::pin!(conn.closed());
        loop {
            tokio::select! {
                // First: once h3 sees the connection fail it closes it itself, after which quinn tells
                // only of that local close, not of what failed.
                biased;
                reason = &mut closed => return quic_ended(&reason),
                accepted = h3.accept() => match accepted {
                    Ok(Some(resolver)) => {
                        // Early: the stream came before the handshake completed, in 0-RTT packets an
                        // attacker may have replayed.
                        let early = !handshaken.confirmed.load(Ordering::Acquire);
                        tokio::spawn(answer(
                            self.service.clone(),
                            request.clone(),
                            resolver,
                            early,
                            watcher.clone(),
                        ));
                    }
                    Ok(None) => return None,
                    Err(e) => {
                        tracing::debug!(peer = %conn.remote_address(), error = %e, "HTTP/3 connection ended");
                        return ended(conn, &e);
                    }
                },
                _ = watcher.draining(), if !draining => {
                    draining = true;
                    if let Err(e) = h3.shutdown(0).await {
                        return ended(conn, &e);
                    }
                }
            }
        }
    }
}

struct Handshaken {
    conn: quinn::Connection,
    /// The handshake has completed: requests are no longer early data.
    confirmed: Arc<AtomicBool>,
}

/// How `conn` ended, when that was not a clean close by either side (`None`), given the error HTTP/3 ended
/// with: one raised here (h3 closed the connection for it), or else quinn's account.
fn ended(conn: &quinn::Connection, h3: &h3::error::ConnectionError) -> Option<Ended> {
    use h3::error::{ConnectionError, LocalError};
    match h3 {
        ConnectionError::Local {
            error: LocalError::Application { code, .. },
            ..
        } if *code != Code::H3_NO_ERROR => Some(Ended::Protocol),
        _ => quic_ended(&conn.close_reason()?),
    }
}

/// How a QUIC connection ended, by quinn's account.
fn quic_ended(e: &quinn::ConnectionError) -> Option<Ended> {
    use quinn::ConnectionError as E;
    match e {
        E::TimedOut => Some(Ended::IdleTimeout),
        E::ApplicationClosed(close) if close.error_code == H3_NO_ERROR => None,
        E::ApplicationClosed(_) => Some(Ended::Protocol),
        E::LocallyClosed => None,
        E::ConnectionClosed(close) if close.error_code == quinn::TransportErrorCode::NO_ERROR => {
            None
        }
        E::ConnectionClosed(_) | E::TransportError(_) | E::VersionMismatch | E::CidsExhausted => {
            Some(Ended::Transport)
        }
        E::Reset => Some(Ended::Reset),
    }
}

/// What every request of a connection shares.
struct PerRequest {
    client: Client,
    listener: Arc<ListenerStats>,
    conn: quinn::Connection,
    header_read_timeout: Duration,
    idle_timeout: Duration,
}

type Resolver = h3::server::RequestResolver<h3_quinn::Connection, Bytes>;
type SendHalf = RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;

/// Reads one request's head, answers it, and sends the answer; gives up the response body at once when the
/// client stops the stream or the connection ends (which releases an origin fetch nobody else reads).
async fn answer<S: Service>(
    service: Arc<S>,
    shared: Arc<PerRequest>,
    resolver: Resolver,
    early: bool,
    _watcher: Watcher,
) {
    let stats = service.stats();
    let resolved =
        tokio::time::timeout(shared.header_read_timeout, resolver.resolve_request()).await;
    let (req, stream) = match resolved {
        Ok(Ok(resolved)) => resolved,
        Ok(Err(h3::error::StreamError::HeaderTooBig { .. })) => {
            // h3 has answered 431.
            inc(&stats.headers_too_large);
            return;
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "HTTP/3 request refused");
            return;
        }
        Err(_) => {
            inc(&stats.header_timeouts);
            return;
        }
    };
    let counters = &shared.listener;
    inc(&counters.requests_http3);
    let (mut send, recv) = stream.split();
    let mut client = shared.client;
    if early {
        if early_allowed(req.method()) {
            inc(&counters.quic_0rtt_accepted);
        } else {
            // Answered by the service, so that the refusal is logged and counted as any request.
            inc(&counters.quic_0rtt_refused);
            client.too_early = true;
        }
    }
    let head_only = req.method() == Method::HEAD;
    let length = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let req: Request<RequestBody> =
        req.map(|()| RequestBody::H3(Box::new(H3Body::new(recv, length))));
    // Informational responses wait here for the stream to send them, a few at most.
    let (interim, mut interims) = tokio::sync::mpsc::channel(INTERIM_QUEUED);
    // Boxed: the data path's future is many kilobytes, moved otherwise at every await of this one.
    let mut answering = Box::pin(
        service
            .clone()
            .call(req, client, Some(Interim::H3(interim))),
    );
    let resp = loop {
        tokio::select! {
            biased;
            resp = &mut answering => break resp,
            Some(res) = interims.recv() => {
                // Another HEADERS frame before the final one (RFC 9114 §4.1).
                if let Err(e) = within(shared.idle_timeout, send.send_response(res)).await {
                    tracing::debug!(error = %e, "HTTP/3 informational response not sent");
                    return;
                }
            }
            _ = shared.conn.closed() => return,
        }
    };
    // None after the final response.
    drop(interims);
    if let Err(e) = respond(&mut send, resp, head_only, &shared).await {
        tracing::debug!(error = %e, "HTTP/3 response not completed");
    }
}

/// Informational responses one request may have waiting to be sent.
const INTERIM_QUEUED: usize = 8;

/// Why a response was not sent to its end.
#[derive(Debug, thiserror::Error)]
enum Unsent {
    #[error("{0}")]
    Stream(#[from] h3::error::StreamError),
    #[error("the client read nothing for idle_timeout")]
    Stalled,
    #[error("the response body failed: {0}")]
    Body(crate::body::BoxError),
    #[error("the connection closed")]
    Closed,
}

/// Fields that mean something for one HTTP/1.1 connection only, and make an HTTP/3 message malformed
/// (RFC 9114 §4.2).
const CONNECTION_FIELDS: [&str; 5] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

async fn respond<B>(
    send: &mut SendHalf,
    resp: Response<B>,
    head_only: bool,
    shared: &PerRequest,
) -> Result<(), Unsent>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<crate::body::BoxError>,
{
    let idle = shared.idle_timeout;
    let (mut parts, body) = resp.into_parts();
    for name in CONNECTION_FIELDS {
        parts.headers.remove(name);
    }
    // As hyper does: a body is done once it has sent its declared length or says it is at its end; a
    // body still being stored may only say so later.
    let mut left = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    within(idle, send.send_response(Response::from_parts(parts, ()))).await?;
    if !head_only && left != Some(0) && !body.is_end_stream() {
        let mut body = std::pin::pin!(body);
        loop {
            let frame = tokio::select! {
                frame = body.frame() => frame,
                _ = shared.conn.closed() => return Err(Unsent::Closed),
            };
            let Some(frame) = frame else { break };
            let frame = match frame {
                Ok(frame) => frame,
                Err(e) => {
                    send.stop_stream(Code::H3_INTERNAL_ERROR);
                    return Err(Unsent::Body(e.into()));
                }
            };
            match frame.into_data() {
                Ok(data) => {
                    let len = data.len() as u64;
                    if let Err(e) = within(idle, send.send_data(data)).await {
                        send.stop_stream(Code::H3_REQUEST_CANCELLED);
                        return Err(e);
                    }
                    add(&shared.listener.bytes_out_http3, len);
                    left = left.map(|left| left.saturating_sub(len));
                    if left == Some(0) || body.is_end_stream() {
                        break;
                    }
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        within(idle, send.send_trailers(trailers)).await?;
                        break;
                    }
                }
            }
        }
    }
    within(idle, send.finish()).await
}

/// A send that must progress within `idle` (the listener's `idle_timeout`): a client that stops reading
/// leaves it blocked on flow control.
async fn within(
    idle: Duration,
    sent: impl std::future::Future<Output = Result<(), h3::error::StreamError>>,
) -> Result<(), Unsent> {
    match tokio::time::timeout(idle, sent).await {
        Ok(result) => result.map_err(Unsent::Stream),
        Err(_) => Err(Unsent::Stalled),
    }
}

/// Binds a worker's UDP socket for a QUIC listener, beside its TCP socket on the same address.
pub fn reuseport_socket(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alt_svc_names_the_port_and_age_and_zero_advertises_nothing() {
        let value = alt_svc(8443, Duration::from_secs(86_400)).unwrap();
        assert_eq!(value, "h3=\":8443\"; ma=86400");
        assert!(alt_svc(443, Duration::ZERO).is_none());
        assert!(
            alt_svc(443, Duration::from_millis(900)).is_none(),
            "under a second rounds to none"
        );
    }

    #[test]
    fn early_data_may_only_read() {
        for method in [Method::GET, Method::HEAD, Method::OPTIONS] {
            assert!(early_allowed(&method), "{method}");
        }
        let purge = Method::from_bytes(b"PURGE").unwrap();
        for method in [
            Method::POST,
            Method::PUT,
            Method::DELETE,
            Method::PATCH,
            purge,
        ] {
            assert!(!early_allowed(&method), "{method}");
        }
    }
}
