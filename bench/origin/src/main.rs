//! Benchmark origin. `bench-origin PORT` serves:
//! - `/obj/2k`, `/obj/4m`: 2 KiB and 4 MiB bodies, cacheable for an hour;
//! - `/burst/ID`: 4 MiB after a 300 ms delay (a cold object per ID);
//! - `/__count/PATH`: how many times PATH was requested, as a plain number.

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{server::conn::http1, service::service_fn, Request, Response};
use hyper_util::rt::TokioIo;

fn body(len: usize) -> Bytes {
    (0..len).map(|i| (i % 251) as u8).collect::<Vec<_>>().into()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let port: u16 = std::env::args()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("usage: bench-origin PORT");
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("bind");
    let small = body(2048);
    let large = body(4 * 1024 * 1024);
    let counts: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (small, large, counts) = (small.clone(), large.clone(), counts.clone());
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                let (small, large, counts) = (small.clone(), large.clone(), counts.clone());
                async move {
                    let path = req.uri().path().to_owned();
                    if let Some(counted) = path.strip_prefix("/__count") {
                        let n = counts.lock().unwrap().get(counted).copied().unwrap_or(0);
                        return Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(
                            n.to_string(),
                        ))));
                    }
                    *counts.lock().unwrap().entry(path.clone()).or_default() += 1;
                    let data = match path.as_str() {
                        "/obj/2k" => small,
                        p if p.starts_with("/burst/") => {
                            tokio::time::sleep(Duration::from_millis(300)).await;
                            large
                        }
                        _ => large,
                    };
                    let resp = Response::builder()
                        .header("cache-control", "max-age=3600")
                        .header("content-type", "application/octet-stream")
                        .header("etag", format!("\"{}\"", data.len()))
                        .body(Full::new(data))
                        .unwrap();
                    Ok(resp)
                }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
