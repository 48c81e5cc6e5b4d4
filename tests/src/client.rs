//! A minimal HTTP/1.1 client for tests.

use std::{net::SocketAddr, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};

#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    pub fn x_cache(&self) -> &str {
        self.header("x-cache")
    }
}

pub async fn get(addr: SocketAddr, path: &str) -> Reply {
    request(addr, Method::GET, path, &[], Bytes::new())
        .await
        .expect("request failed")
}

/// Sends one request on a fresh connection; an error when the response (including its body) fails.
pub async fn request(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Result<Reply, String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let req = req.body(Full::new(body)).unwrap();
    let fut = async {
        let resp = client
            .request(req)
            .await
            .map_err(|e| format!("request: {e:?}"))?;
        let (parts, body) = resp.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| format!("body: {e:?}"))?
            .to_bytes();
        Ok(Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    };
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .map_err(|_| "timed out".to_string())?
}

/// Sends a GET and returns as soon as the head arrives, leaving the body to be read frame by frame.
pub async fn open(addr: SocketAddr, path: &str) -> http::Response<hyper::body::Incoming> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = Request::builder()
        .uri(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), client.request(req))
        .await
        .expect("head in time")
        .expect("head")
}

/// One HTTP/1.1 request written by hand (`headers` as `Name: value\r\n` lines), on a connection of its own
/// that it closes; through a PROXY-protocol listener as if from `client` when one is given. The raw
/// response, head and body: for what a client library would refuse to send or would tidy up.
pub async fn raw(
    addr: SocketAddr,
    client: Option<&str>,
    method: &str,
    host: &str,
    path: &str,
    headers: &str,
) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let proxy = client.map_or(String::new(), |c| {
        format!("PROXY TCP4 {c} 192.0.2.1 40000 80\r\n")
    });
    let request = format!(
        "{proxy}{method} {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n"
    );
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut out))
        .await
        .expect("the response in time")
        .unwrap();
    out
}

/// The status of a raw response ([`raw`]).
pub fn raw_status(raw: &str) -> u16 {
    raw.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status: {raw:?}"))
}
