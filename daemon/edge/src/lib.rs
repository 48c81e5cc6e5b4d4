//! The client side of lacquerd: listeners and the worker threads that serve them, everything before a
//! request reaches the data path (PROXY header, TLS, HTTP/1.1 or HTTP/2, connection limits and timeouts).
//!
//! Each worker is a current-thread runtime with its own `SO_REUSEPORT` socket per listener, so the kernel
//! spreads connections and a request never hops threads on the hit path. The store runs on a separate
//! runtime (see `lacquerd`'s `main.rs`). What answers requests is a [`Service`], one per worker thread.
#![warn(missing_docs)]

mod connection;
mod drain;
mod io;
mod limits;
mod proxy_protocol;
pub mod stats;
pub mod tls;

use std::{future::Future, net::IpAddr};

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;

pub use self::io::{Activity, IdleTimeout, WaitingGuard};
pub use self::stats::EdgeStats;

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
}

/// What answers the requests of one worker thread (made on that thread).
pub trait Service: Send + Sync + 'static {
    /// The response body.
    type Body: http_body::Body<Data = Bytes, Error = Self::Error> + Send + 'static;
    /// The response body's error.
    type Error: Into<Box<dyn std::error::Error + Send + Sync>>;
    /// Answers one request from `client`.
    fn call(
        self: std::sync::Arc<Self>,
        req: Request<Incoming>,
        client: Client,
    ) -> impl Future<Output = Response<Self::Body>> + Send + 'static;
    /// The counters the edge keeps.
    fn stats(&self) -> &EdgeStats;
}

use std::{
    net::{SocketAddr, TcpListener},
    sync::Arc,
    thread::JoinHandle,
    time::Duration,
};

use anyhow::Context;
use arc_swap::ArcSwap;
use futures_util::future::join_all;
use socket2::{Domain, Socket, Type};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use self::{connection::Protocols, drain::Drain, limits::ConnectionLimits, tls::SniResolver};
use lacquer_config::Listen;

/// A listener's settings and the state its connections share across workers.
pub struct Listener {
    /// The `[[listen]]` section it was built from; a reload compares it to tell what changed.
    pub config: Listen,
    limits: Arc<ConnectionLimits>,
    tls: Option<TlsAcceptor>,
    /// The certificates a reload replaces.
    pub certificates: Option<Arc<SniResolver>>,
}

impl Listener {
    /// Reads and checks the certificates, so a bad file fails `--check`, start or reload rather than a
    /// handshake; binds nothing (see [`bind`]).
    pub fn new(config: Listen) -> Result<Self, tls::TlsError> {
        let certificates = tls::Certificates::load(&config.tls)?;
        let resolver = (!certificates.is_empty())
            .then(|| Arc::new(SniResolver(ArcSwap::from_pointee(certificates))));
        Ok(Self {
            limits: ConnectionLimits::new(config.max_connections, config.max_connections_per_ip),
            tls: resolver
                .clone()
                .map(|r| TlsAcceptor::from(tls::server_config(r, config.http2))),
            certificates: resolver,
            config,
        })
    }
}

/// Binds `workers` sockets per address. A port of 0 is resolved by the first socket and reused by the rest.
/// Returns the sockets per worker and the addresses actually bound.
pub fn bind(
    addrs: &[SocketAddr],
    workers: usize,
) -> anyhow::Result<(Vec<Vec<TcpListener>>, Vec<SocketAddr>)> {
    let mut per_worker: Vec<Vec<TcpListener>> = (0..workers).map(|_| Vec::new()).collect();
    let mut bound = Vec::new();
    for &addr in addrs {
        let mut actual = addr;
        for sockets in per_worker.iter_mut() {
            let listener =
                reuseport_listener(actual).with_context(|| format!("cannot listen on {actual}"))?;
            actual = listener.local_addr()?;
            sockets.push(listener);
        }
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
    sockets: Vec<Vec<TcpListener>>,
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
    sockets: Vec<TcpListener>,
    shutdown: watch::Receiver<bool>,
) {
    let service = Arc::new(service);
    let graceful = Drain::new();
    join_all(
        listeners
            .into_iter()
            .zip(sockets)
            .map(|(listener, socket)| {
                let socket = tokio::net::TcpListener::from_std(socket)
                    .expect("listener registers with the runtime");
                accept(socket, listener, &service, &graceful, shutdown.clone())
            }),
    )
    .await;
    if tokio::time::timeout(settings.shutdown_timeout, graceful.shutdown())
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
    service: &Arc<S>,
    graceful: &Drain,
    mut shutdown: watch::Receiver<bool>,
) {
    let protocols = Protocols::new(&listener);
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
