//! One client connection, from accept to close: limits, PROXY header, TLS, the protocol, and counting how it
//! ended.

use std::{convert::Infallible, net::SocketAddr, sync::Arc};

use bytes::{Bytes, BytesMut};
use http::{header::ALT_SVC, HeaderValue};
use hyper::{
    server::conn::{http1, http2},
    service::service_fn,
};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite},
    net::TcpStream,
};

use super::{
    body::Counted,
    drain::Watcher,
    io::{Activity, IdleTimeout, Prefixed},
    limits::Admitted,
    proxy_protocol, quic, Listener,
};
use crate::{
    stats::{dec, inc, EdgeStats, ListenerStats},
    Client, Interim, RequestBody, Service,
};

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HYPER_DEFAULT_MAX_HEADERS: usize = 100;

/// The protocol builders of one listener, made once per worker.
#[derive(Clone)]
pub struct Protocols {
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
    /// The listener's HTTP/3 side, advertised on every response: with `quic` and an `alt_svc_max_age`.
    alt_svc: Option<HeaderValue>,
}

impl Protocols {
    /// `port`: the one bound, which the listener's UDP socket shares.
    pub fn new(listener: &Listener, port: u16) -> Self {
        let c = &listener.config;
        let mut h1 = http1::Builder::new();
        // Flattening head and body into one write: 0.97x NGINX's hits per second on a 2 KiB object, against
        // 0.84x queued for writev (bench/hotpath.py, 2026-12-03). Its cost was memory: hyper's buffer kept
        // the capacity of the most it flattened for the connection's life, ~0.8 MiB once it sent a 4 MiB
        // body; the vendored hyper gives an idle connection's buffers back (vendor/README.md). While a
        // response is written it holds up to hyper's `max_buf_size` (~400 KiB) plus one stored chunk:
        // 64 KiB frames and buffer cut that to a fifth for a stalled reader, and a 200 MiB read from disk
        // to 0.5-0.8x the speed (bench/RESULTS.md, 2026-12-04 third session).
        // Each request can send `103 Early Hints` (an origin's, or a rule's) before its answer.
        h1.timer(TokioTimer::new())
            .informational_responses(true)
            .keep_alive(true)
            .writev(false)
            .header_read_timeout(c.header_read_timeout)
            .max_header_size(c.max_header_size.as_u64() as usize);
        // Any explicit count, even hyper's own default of 100, makes hyper fill a header array for every
        // request (`SmallVec::from_elem`), where its default leaves the array uninitialised.
        if c.max_headers != HYPER_DEFAULT_MAX_HEADERS {
            h1.max_headers(c.max_headers);
        }
        let mut h2 = http2::Builder::new(TokioExecutor::new());
        h2.timer(TokioTimer::new())
            .informational_responses(true)
            .max_header_list_size(c.max_header_size.as_u64() as u32);
        Self {
            http1: h1,
            http2: h2,
            alt_svc: listener
                .quic
                .as_ref()
                .and_then(|_| quic::alt_svc(port, c.alt_svc_max_age)),
        }
    }
}

/// Ends when the connection is closed. `admitted` is `None` when the listener was full: the connection is
/// still served, with `503` to every request, so the client learns why.
pub async fn serve<S: Service>(
    service: Arc<S>,
    listener: Arc<Listener>,
    protocols: Protocols,
    stream: TcpStream,
    peer: SocketAddr,
    admitted: Option<Admitted>,
    watcher: Watcher,
) {
    let stats = service.stats();
    inc(&listener.stats.connections);
    inc(&stats.connections_open);
    let timeout = listener.config.header_read_timeout;
    let opened = tokio::time::timeout(timeout, open(&listener, stream, peer, admitted, stats));
    let Ok(opened) = opened.await else {
        inc(&stats.header_timeouts);
        dec(&stats.connections_open);
        return;
    };
    if let Some(Opened {
        io,
        http2,
        client,
        refused,
        _admitted,
    }) = opened
    {
        let client = Client {
            ip: client.ip(),
            max_request_body: listener.config.max_request_body.as_u64(),
            refused,
            secure: matches!(io, Stream::Tls(_)),
            too_early: false,
        };
        let handler = Handler {
            service: service.clone(),
            listener: listener.stats.clone(),
            client,
        };
        let idle = listener.config.idle_timeout;
        let activity = Arc::new(Activity::default());
        let result = match io {
            Stream::Tls(io) => {
                handler
                    .run(io, http2, &protocols, idle, &activity, watcher)
                    .await
            }
            Stream::Plain(io) => {
                handler
                    .run(io, http2, &protocols, idle, &activity, watcher)
                    .await
            }
        };
        if activity.timed_out() {
            inc(&stats.idle_timeouts);
        } else if let Err(e) = &result {
            if e.is_timeout() {
                inc(&stats.header_timeouts);
            } else if e.is_parse_too_large() {
                inc(&stats.headers_too_large);
            }
        }
        if let Err(e) = result {
            tracing::debug!(%peer, error = %e, "client connection ended with an error");
        }
    }
    dec(&stats.connections_open);
}

enum Stream {
    Plain(Prefixed<TcpStream>),
    Tls(Box<tokio_rustls::server::TlsStream<Prefixed<TcpStream>>>),
}

struct Opened {
    io: Stream,
    http2: bool,
    client: SocketAddr,
    refused: bool,
    _admitted: Option<Admitted>,
}

/// Everything before HTTP: the PROXY header, the per-client limit, the TLS handshake or the h2c preface.
/// `None` when the connection is given up (counted).
async fn open(
    listener: &Listener,
    mut stream: TcpStream,
    peer: SocketAddr,
    mut admitted: Option<Admitted>,
    stats: &EdgeStats,
) -> Option<Opened> {
    let mut client = peer;
    let mut read_ahead = Bytes::new();
    if listener.config.proxy_protocol {
        match proxy_protocol::read(&mut stream).await {
            Ok(header) => {
                client = header.client.unwrap_or(peer);
                read_ahead = header.rest;
            }
            Err(e) => {
                inc(&stats.proxy_protocol_errors);
                tracing::debug!(%peer, error = %e, "connection closed");
                return None;
            }
        }
    }
    let refused = match admitted.as_mut() {
        Some(a) => !listener.limits.admit_client(a, client.ip()),
        None => true,
    };
    if refused {
        inc(&stats.connections_refused);
    }
    let (io, http2) = match &listener.tls {
        Some(tls) => match tls.accept(Prefixed::new(read_ahead, stream)).await {
            Ok(io) => {
                let alpn = io.get_ref().1.alpn_protocol();
                if alpn == Some(lacquer_acme::ACME_TLS_ALPN) {
                    // The CA's TLS-ALPN-01 check ends with the handshake; it sends no request.
                    return None;
                }
                inc(&listener.stats.connections_tls);
                let h2 = alpn == Some(b"h2");
                (Stream::Tls(Box::new(io)), h2)
            }
            Err(e) => {
                inc(&listener.stats.tls_handshake_errors);
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                return None;
            }
        },
        None if listener.config.http2 => {
            let (prefix, h2) = sniff_preface(&mut stream, read_ahead).await?;
            (Stream::Plain(Prefixed::new(prefix, stream)), h2)
        }
        None => (Stream::Plain(Prefixed::new(read_ahead, stream)), false),
    };
    if http2 {
        inc(&stats.connections_http2);
    }
    Some(Opened {
        io,
        http2,
        client,
        refused,
        _admitted: admitted,
    })
}

/// Reads until the bytes either are the HTTP/2 preface or cannot become it (one read for an HTTP/1 request,
/// whose first byte already differs); returns what was read, to be served again.
async fn sniff_preface(stream: &mut TcpStream, read_ahead: Bytes) -> Option<(Bytes, bool)> {
    let mut buf = BytesMut::from(&read_ahead[..]);
    loop {
        let n = buf.len().min(H2_PREFACE.len());
        if buf[..n] != H2_PREFACE[..n] {
            return Some((buf.freeze(), false));
        }
        if n == H2_PREFACE.len() {
            return Some((buf.freeze(), true));
        }
        match stream.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

struct Handler<S> {
    service: Arc<S>,
    listener: Arc<ListenerStats>,
    client: Client,
}

impl<S: Service> Handler<S> {
    async fn run<IO>(
        self,
        io: IO,
        http2: bool,
        protocols: &Protocols,
        idle_timeout: std::time::Duration,
        activity: &Arc<Activity>,
        watcher: Watcher,
    ) -> Result<(), hyper::Error>
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let io = TokioIo::new(IdleTimeout::new(io, idle_timeout, activity.clone()));
        let waiting = activity.clone();
        let Handler {
            service,
            listener,
            client,
        } = self;
        let refused = client.refused;
        let alt_svc = protocols.alt_svc.clone();
        let service = service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
            let in_wait = waiting.enter();
            inc(if http2 {
                &listener.requests_http2
            } else {
                &listener.requests_http1
            });
            // Boxed: hyper moves the future into its dispatcher by value, and the data path's is many
            // kilobytes, one memcpy per request (5 % of a hit's CPU in perf).
            let interim = req
                .extensions_mut()
                .remove::<hyper::ext::Interim>()
                .map(Interim::Hyper);
            let answer = Box::pin(service.clone().call(
                req.map(RequestBody::Http),
                client,
                interim,
            ));
            let alt_svc = alt_svc.clone();
            let listener = listener.clone();
            async move {
                let mut resp = answer.await.map(|body| Counted::new(body, listener, http2));
                drop(in_wait);
                if let Some(alt_svc) = alt_svc {
                    resp.headers_mut().insert(ALT_SVC, alt_svc);
                }
                Ok::<_, Infallible>(resp)
            }
        });
        if http2 {
            let conn = protocols.http2.serve_connection(io, service);
            watcher.watch(conn, |c| c.graceful_shutdown()).await
        } else {
            let mut http1 = protocols.http1.clone();
            http1.keep_alive(!refused);
            // A `101` hands the connection to the data path (a `pipe` rule's tunnel). It costs an ordinary
            // request nothing: hyper polls the same dispatcher, and prepares an upgrade only for a request
            // that asks for one, with or without this.
            let conn = http1.serve_connection(io, service).with_upgrades();
            watcher.watch(conn, |c| c.graceful_shutdown()).await
        }
    }
}
