//! The client side of lacquerd: listeners and the worker threads that serve them, everything before a
//! request reaches the data path (PROXY header, TLS, HTTP/1.1, HTTP/2 or HTTP/3 over QUIC, connection
//! limits and timeouts).
//!
//! Each worker is a current-thread runtime with its own `SO_REUSEPORT` socket per listener (and a UDP one
//! for a listener with QUIC), so the kernel spreads connections and a request never hops threads on the
//! hit path. The store runs on a separate
//! runtime (see `lacquerd`'s `main.rs`). What answers requests is a [`Service`], one per worker thread.
#![warn(missing_docs)]

mod body;
mod connection;
mod drain;
mod io;
mod limits;
mod proxy_protocol;
mod quic;
pub mod stats;
pub mod tls;

use std::{future::Future, net::IpAddr};

use bytes::Bytes;
use http::{Request, Response};

pub use self::body::{BoxError, H3Body, RequestBody};
pub use self::io::{Activity, IdleTimeout, WaitingGuard};
pub use self::stats::{EdgeStats, ListenerStats};

/// Who sent a request, and what its listener allows.
#[derive(Debug, Clone, Copy)]
pub struct Client {
    /// The peer, or the client a PROXY header named.
    pub ip: IpAddr,
    /// The listener's `max_request_body`, in bytes.
    pub max_request_body: u64,
    /// The connection came over `max_connections` or `max_connections_per_ip`: it is still served, with
    /// `503` to every request and no keep-alive, so the client learns why.
    pub refused: bool,
    /// The connection is TLS: the request's scheme is `https`.
    pub secure: bool,
    /// The request came in TLS early data (0-RTT), which an attacker may replay, and its method is not one
    /// that may be answered before the handshake completes: it is to be refused with `425 Too Early`.
    pub too_early: bool,
}

/// Sends informational (1xx) responses, such as `103 Early Hints`, to one request's client ahead of its
/// final response: over HTTP/1.1 and HTTP/2 through hyper (the vendored patch, vendor/README.md), over
/// HTTP/3 on the request's stream. An HTTP/1.0 request has none (RFC 9110 §15.2).
#[derive(Debug, Clone)]
pub enum Interim {
    /// HTTP/1.1 and HTTP/2.
    Hyper(hyper::ext::Interim),
    /// HTTP/3: sent by the stream's task while it waits for the final response.
    H3(tokio::sync::mpsc::Sender<Response<()>>),
}

impl Interim {
    /// Sends `res` (a 1xx other than 101) before the final response; `false` when it cannot be: the final
    /// response has begun, or a few are already waiting to be written.
    pub fn send(&self, res: Response<()>) -> bool {
        match self {
            Interim::Hyper(interim) => interim.send(res).is_ok(),
            Interim::H3(tx) => {
                let status = res.status();
                status.is_informational()
                    && status != http::StatusCode::SWITCHING_PROTOCOLS
                    && tx.try_send(res).is_ok()
            }
        }
    }
}

/// What answers the requests of one worker thread (made on that thread).
pub trait Service: Send + Sync + 'static {
    /// The response body (`Unpin`: the edge wraps it to count its bytes).
    type Body: http_body::Body<Data = Bytes, Error = Self::Error> + Send + Unpin + 'static;
    /// The response body's error.
    type Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send;
    /// Answers one request from `client`; `interim` sends informational responses ahead of the answer.
    fn call(
        self: std::sync::Arc<Self>,
        req: Request<RequestBody>,
        client: Client,
        interim: Option<Interim>,
    ) -> impl Future<Output = Response<Self::Body>> + Send + 'static;
    /// The counters the edge keeps.
    fn stats(&self) -> &EdgeStats;
}

use std::{
    net::{SocketAddr, TcpListener, UdpSocket},
    sync::Arc,
    thread::JoinHandle,
    time::Duration,
};

use anyhow::Context;
use futures_util::future::join_all;
use socket2::{Domain, Socket, Type};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use self::{
    connection::Protocols, drain::Drain, limits::ConnectionLimits, quic::Quic, tls::SniResolver,
};
use lacquer_acme::Managed;
use lacquer_config::Listen;

/// A listener's settings and the state its connections share across workers.
pub struct Listener {
    /// The `[[listen]]` section it was built from; a reload compares it to tell what changed.
    pub config: Listen,
    limits: Arc<ConnectionLimits>,
    tls: Option<TlsAcceptor>,
    /// The certificates a reload replaces.
    pub certificates: Option<Arc<SniResolver>>,
    /// The HTTP/3 side, with `quic`.
    quic: Option<Arc<Quic>>,
    stats: Arc<ListenerStats>,
}

impl Listener {
    /// Reads and checks the certificates, so a bad file fails `--check`, start or reload rather than a
    /// handshake; binds nothing (see [`bind`]). With `acme` (its certificate, obtained by ACME) the listener
    /// speaks TLS even before one is held.
    pub fn new(config: Listen, acme: Option<Arc<Managed>>) -> Result<Self, tls::TlsError> {
        let certificates = tls::Certificates::load(&config.tls)?;
        let resolver = SniResolver::new(certificates, acme).map(Arc::new);
        let quic = match (&resolver, config.quic) {
            (_, false) => None,
            (None, true) => return Err(tls::TlsError::QuicWithoutTls),
            (Some(_), true) if config.quic_max_streams == 0 => {
                return Err(tls::TlsError::NoStreams)
            }
            (Some(resolver), true) => Some(Arc::new(Quic::new(&config, resolver.clone()))),
        };
        let stats = ListenerStats::new(config.address, resolver.is_some(), quic.is_some());
        Ok(Self {
            stats: Arc::new(stats),
            quic,
            limits: ConnectionLimits::new(config.max_connections, config.max_connections_per_ip),
            tls: resolver
                .clone()
                .map(|r| TlsAcceptor::from(tls::server_config(r, config.http2))),
            certificates: resolver,
            config,
        })
    }
}

/// One worker's sockets for one listener.
pub struct Sockets {
    tcp: TcpListener,
    /// With `quic`: on the same address and port.
    udp: Option<UdpSocket>,
}

/// Binds `workers` sockets per listener (TCP, and UDP for one with `quic`). A port of 0 is resolved by
/// the first socket and reused by the rest. Returns the sockets per worker and the addresses actually
/// bound.
pub fn bind(
    listeners: &[Arc<Listener>],
    workers: usize,
) -> anyhow::Result<(Vec<Vec<Sockets>>, Vec<SocketAddr>)> {
    let mut per_worker: Vec<Vec<Sockets>> = (0..workers).map(|_| Vec::new()).collect();
    let mut bound = Vec::new();
    for listener in listeners {
        let mut actual = listener.config.address;
        for sockets in per_worker.iter_mut() {
            let tcp =
                reuseport_listener(actual).with_context(|| format!("cannot listen on {actual}"))?;
            actual = tcp.local_addr()?;
            let udp = listener
                .quic
                .as_ref()
                .map(|_| quic::reuseport_socket(actual))
                .transpose()
                .with_context(|| format!("cannot listen on {actual} (UDP, for quic)"))?;
            sockets.push(Sockets { tcp, udp });
        }
        listener.stats.bound(actual);
        bound.push(actual);
    }
    Ok((per_worker, bound))
}

/// Bytes an accepted socket may hold unsent beyond what the client's TCP window has taken
/// (`TCP_NOTSENT_LOWAT`).
///
/// Without a limit the kernel takes a response body held in memory whole (up to `tcp_wmem`'s 4 MiB), and the
/// worker thread spends the copy on its CPU before it lets go of it: the client, woken on that CPU by the
/// head, waits for the whole copy, and a 4 MiB hit's first byte came about 1 ms after a 2 KiB hit's. With
/// it a write stops once this much is waiting, the worker serves other connections or sleeps, and the rest of
/// the body stays in the response's read-ahead, which is bounded already. It also bounds the kernel memory a
/// client that reads slowly or not at all holds. 128 KiB keeps a socket's window full between two wake-ups.
const NOTSENT_LOWAT: u32 = 128 * 1024;

/// Sets up an accepted client socket.
fn tune(stream: &tokio::net::TcpStream) {
    // A head or a last frame goes out when it is written, not after the client's delayed ACK.
    let _ = stream.set_nodelay(true);
    let _ = socket2::SockRef::from(stream).set_tcp_notsent_lowat(NOTSENT_LOWAT);
}

fn reuseport_listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// What every worker thread is told.
pub struct WorkerSettings {
    /// How long in-flight responses may take to finish on shutdown.
    pub shutdown_timeout: Duration,
}

/// Starts one worker thread per element of `sockets`; `sockets[worker][n]` is that worker's socket for
/// `listeners[n]`. `service` makes each worker's [`Service`], on its thread.
pub fn spawn_workers<S: Service>(
    service: Arc<dyn Fn() -> S + Send + Sync>,
    settings: Arc<WorkerSettings>,
    listeners: Vec<Arc<Listener>>,
    sockets: Vec<Vec<Sockets>>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    sockets
        .into_iter()
        .enumerate()
        .map(|(n, sockets)| {
            let (service, settings, shutdown) =
                (service.clone(), settings.clone(), shutdown.clone());
            let listeners = listeners.clone();
            std::thread::Builder::new()
                .name(format!("lacquer-worker-{n}"))
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("worker runtime");
                    runtime.block_on(serve(service(), settings, listeners, sockets, shutdown));
                })
                .context("cannot start worker thread")
        })
        .collect()
}

async fn serve<S: Service>(
    service: S,
    settings: Arc<WorkerSettings>,
    listeners: Vec<Arc<Listener>>,
    sockets: Vec<Sockets>,
    shutdown: watch::Receiver<bool>,
) {
    let service = Arc::new(service);
    let graceful = Drain::new();
    let mut endpoints = Vec::new();
    let mut quic = Vec::new();
    let mut tcp = Vec::new();
    for (listener, Sockets { tcp: socket, udp }) in listeners.into_iter().zip(sockets) {
        service.stats().register(&listener.stats);
        let port = socket.local_addr().map_or(0, |a| a.port());
        if let (Some(udp), Some(config)) = (udp, &listener.quic) {
            match config.endpoint(udp) {
                Ok(endpoint) => {
                    endpoints.push(endpoint.clone());
                    quic.push(quic::accept(
                        endpoint,
                        listener.clone(),
                        config.clone(),
                        service.clone(),
                        &graceful,
                        shutdown.clone(),
                    ));
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot serve QUIC on {}", listener.config.address)
                }
            }
        }
        let socket =
            tokio::net::TcpListener::from_std(socket).expect("listener registers with the runtime");
        tcp.push(accept(
            socket,
            listener,
            port,
            &service,
            &graceful,
            shutdown.clone(),
        ));
    }
    tokio::join!(join_all(tcp), join_all(quic));
    let drained = async {
        graceful.shutdown().await;
        // The CONNECTION_CLOSE frames of the connections just finished go out before the sockets close.
        for endpoint in &endpoints {
            endpoint.close(0u32.into(), b"");
        }
        join_all(endpoints.iter().map(|e| e.wait_idle())).await;
    };
    if tokio::time::timeout(settings.shutdown_timeout, drained)
        .await
        .is_err()
    {
        tracing::warn!(
            "connections still open after {:?}; closing them",
            settings.shutdown_timeout
        );
    }
}

async fn accept<S: Service>(
    socket: tokio::net::TcpListener,
    listener: Arc<Listener>,
    port: u16,
    service: &Arc<S>,
    graceful: &Drain,
    mut shutdown: watch::Receiver<bool>,
) {
    let protocols = Protocols::new(&listener, port);
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => return,
            accepted = socket.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Typically EMFILE: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        tune(&stream);
        let admitted = listener.limits.admit();
        tokio::spawn(connection::serve(
            service.clone(),
            listener.clone(),
            protocols.clone(),
            stream,
            peer,
            admitted,
            graceful.watcher(),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quic_settings_are_checked_with_the_listener() {
        let dir = tempfile::tempdir().unwrap();
        let certified = rcgen::generate_simple_self_signed(vec!["a.test".to_owned()]).unwrap();
        let cert = lacquer_config::Certificate {
            cert: dir.path().join("a.pem"),
            key: dir.path().join("a.key"),
        };
        std::fs::write(&cert.cert, certified.cert.pem()).unwrap();
        std::fs::write(&cert.key, certified.signing_key.serialize_pem()).unwrap();
        let plain = Listen {
            quic: true,
            ..Listen::default()
        };
        let e = Listener::new(plain.clone(), None).err().unwrap();
        assert_eq!(e.setting(), "quic");
        let no_streams = Listen {
            tls: vec![cert.clone()],
            quic_max_streams: 0,
            ..plain.clone()
        };
        let e = Listener::new(no_streams, None).err().unwrap();
        assert_eq!(
            (e.setting(), e.to_string().as_str()),
            ("quic_max_streams", "must be at least 1")
        );
        let tls = Listen {
            tls: vec![cert],
            ..plain
        };
        assert!(Listener::new(tls.clone(), None).unwrap().quic.is_some());
        let off = Listen { quic: false, ..tls };
        assert!(Listener::new(off, None).unwrap().quic.is_none());
    }

    /// A client that reads nothing: how much of a 16 MiB write the kernel takes before it blocks.
    #[tokio::test]
    async fn a_client_that_reads_nothing_holds_little_of_a_large_write() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // A small receive buffer, whatever the system's default (`tcp_rmem`): the client's window is then small.
        let client = tokio::net::TcpSocket::new_v4().unwrap();
        client.set_recv_buffer_size(64 * 1024).unwrap();
        let (client, accepted) = tokio::join!(client.connect(addr), listener.accept());
        let (_client, (server, _)) = (client.unwrap(), accepted.unwrap());
        tune(&server);
        assert!(server.nodelay().unwrap());
        let body = vec![7u8; 16 << 20];
        let mut taken = 0;
        // The kernel sends what the client's window takes as it is written: a few attempts let it settle.
        for _ in 0..20 {
            match server.try_write(&body[taken..]) {
                Ok(n) => taken += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                Err(e) => panic!("write failed: {e}"),
            }
        }
        // The client's receive buffer (its window) plus the limit, with room for the kernel's rounding; without
        // the limit the kernel takes megabytes (4 MiB here, `tcp_wmem`'s default maximum).
        assert!(taken < 1 << 20, "the kernel took {taken} bytes");
    }
}
