//! Reading server-sent events from the admin API.

use std::net::SocketAddr;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// An event stream being read: `next` gives `(event, data)` pairs in order.
pub struct Events {
    body: Incoming,
    buf: String,
}

/// Opens `path` on the admin API with the secret; panics unless it answers 200.
pub async fn open(admin: SocketAddr, path: &str, secret: &str) -> Events {
    let tcp = TcpStream::connect(admin).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", admin.to_string())
        .header("authorization", format!("Bearer {secret}"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200, "{path}");
    Events {
        body: resp.into_body(),
        buf: String::new(),
    }
}

impl Events {
    /// The next event that is not a keep-alive comment; `None` when the stream ends.
    pub async fn next(&mut self) -> Option<(String, String)> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let field = |name: &str| {
                    block
                        .lines()
                        .filter_map(|l| l.strip_prefix(name))
                        .map(|v| v.trim_start().to_owned())
                        .collect::<Vec<_>>()
                        .join("\n")
                };
                let (event, data) = (field("event:"), field("data:"));
                if event.is_empty() && data.is_empty() {
                    continue;
                }
                return Some((event, data));
            }
            let frame = self.body.frame().await?.ok()?;
            if let Some(data) = frame.data_ref() {
                self.buf.push_str(&String::from_utf8_lossy(data));
            }
        }
    }
}
