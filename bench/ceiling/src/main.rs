//! The hit path's ceiling. `bench-ceiling PORT [THREADS]` answers every request with the same 2 KiB body
//! (the bytes and cache headers of the origin's `/obj/2k`), held in memory, and does nothing else: no parsing
//! beyond hyper's, no lookup, no logging. One current-thread runtime per core (THREADS, default: the
//! available cores), each with its own SO_REUSEPORT listener, so the kernel spreads connections and no task
//! ever crosses threads. A cache that serves a stored 2 KiB object cannot be faster than this on the same
//! machine; bench/perf.py reports lacquerd's requests per second as a share of it.

use std::{convert::Infallible, net::SocketAddr, thread};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{server::conn::http1, service::service_fn, Request, Response};
use hyper_util::rt::TokioIo;
use socket2::{Domain, Protocol, Socket, Type};

fn listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_tcp_nodelay(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

async fn serve(listener: std::net::TcpListener, body: Bytes) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let body = body.clone();
        tokio::spawn(async move {
            let service = service_fn(move |_: Request<hyper::body::Incoming>| {
                let resp = Response::builder()
                    .header("cache-control", "max-age=3600")
                    .header("content-type", "application/octet-stream")
                    .header("etag", "\"2048\"")
                    .body(Full::new(body.clone()))
                    .expect("static response head");
                async move { Ok::<_, Infallible>(resp) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args
        .next()
        .and_then(|p| p.parse().ok())
        .expect("usage: bench-ceiling PORT [THREADS]");
    let threads = args
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| thread::available_parallelism().map_or(1, |n| n.get()));
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    // The same pattern as bench-origin's bodies, so the bytes on the wire match the proxies' answers.
    let body: Bytes = (0..2048)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<_>>()
        .into();
    // Every listener is bound before any thread runs, so the port answers as soon as the process is up.
    let listeners = (0..threads)
        .map(|_| listener(addr))
        .collect::<std::io::Result<Vec<_>>>()?;
    let workers: Vec<_> = listeners
        .into_iter()
        .map(|l| {
            let body = body.clone();
            thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("tokio runtime")
                    .block_on(serve(l, body))
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker thread")?;
    }
    Ok(())
}
