//! HTTP/2 to a backend (`protocol = "h2"` or `"h2c"`): one connection per worker thread carrying every
//! request of that worker as a stream, opened by the first request and again by the first after it closed.
//!
//! Not hyper-util's pooling client: it takes a stream's `:authority` from the address it connects to, so
//! every request would name the backend's address where the origin expects the client's `Host` (an HTTP/2
//! origin routes virtual hosts on `:authority`, and may refuse a `Host` that differs from it).

use std::{error::Error, future::poll_fn};

use http::{header, uri::Authority, Request, Response, Uri, Version};
use hyper::{
    body::Incoming,
    client::conn::http2::{Builder, SendRequest},
};
use hyper_util::{
    client::legacy::connect::Connection as _,
    rt::{TokioExecutor, TokioTimer},
};
use tokio::sync::Mutex;
use tower_service::Service;

use crate::{body::Body, error_chain, BackendError, BackendState, Counted};

/// Each stream's receive window. The default 64 KiB lets an origin send 64 KiB per round trip: a 4 MiB
/// fill 10 ms away would take 640 ms whatever the bandwidth. 4 MiB is what a fetch holds of its body
/// anyway (`cache.transit_buffer`), so the window never has the origin send more than a fetch takes.
const STREAM_WINDOW: u32 = 4 << 20;
/// The connection's receive window, shared by its streams: several fills at full speed, while what
/// readers have not taken yet stays bounded per connection (hyper hands window back as bodies are read).
const CONNECTION_WINDOW: u32 = 16 << 20;
/// The largest response header block taken from an origin (decoded, as RFC 9113 counts it: each field's
/// name and value plus 32 bytes). A larger one fails the request (`502`): it is no answer a cache stores.
pub const MAX_RESPONSE_HEADERS: u32 = 64 << 10;
/// The limit the h2 crate is given, far above [`MAX_RESPONSE_HEADERS`], which is checked on each decoded
/// head instead: the h2 crate answers a block over four times its own limit (an HPACK bomb, a flood of
/// CONTINUATION frames) with `GOAWAY`, which cuts every fill sharing the connection; one hostile or
/// reflecting response must fail alone. It still bounds what one block can make a worker buffer.
const H2_HEADER_LIST_LIMIT: u32 = 1 << 20;

/// A worker's connection to one HTTP/2 backend.
pub(crate) struct Connection {
    connector: Counted,
    /// `https://host:port` or `http://host:port`: where the connector goes.
    address: Uri,
    authority: String,
    tls: bool,
    builder: Builder<TokioExecutor>,
    /// The connection in use and its number, so that a request that found it closed replaces only it.
    current: Mutex<(u64, Option<SendRequest<Body>>)>,
}

impl Connection {
    pub(crate) fn new(connector: Counted, state: &BackendState) -> Self {
        let cfg = &state.config;
        let tls = state.tls.is_some();
        let scheme = if tls { "https" } else { "http" };
        let address = format!("{scheme}://{}/", state.authority)
            .parse()
            .expect("a backend's address is a valid authority");
        let mut builder = Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_header_list_size(H2_HEADER_LIST_LIMIT)
            .keep_alive_interval(cfg.h2_ping_interval)
            .keep_alive_timeout(cfg.h2_ping_timeout)
            // An idle connection is the one the next miss uses: it is checked before then, not by that
            // miss's `first_byte_timeout`.
            .keep_alive_while_idle(true);
        Self {
            connector,
            address,
            authority: state.authority.clone(),
            tls,
            builder,
            current: Mutex::new((0, None)),
        }
    }

    /// Sends `req` (made ready by [`prepare`]) as a stream. A request the connection took no more (it
    /// closed after a `GOAWAY` or an unanswered ping before the request was written) goes once more on
    /// a fresh connection; `failed` says why any other exchange failed.
    pub(crate) async fn send(
        &self,
        req: Request<Body>,
        failed: impl Fn(&(dyn Error + 'static)) -> BackendError,
    ) -> Result<Response<Incoming>, BackendError> {
        let (number, mut sender) = self.sender(None).await?;
        let resp = match sender.try_send_request(req).await {
            Ok(resp) => resp,
            Err(mut e) => match e.take_message() {
                Some(req) => {
                    let (_, mut sender) = self.sender(Some(number)).await?;
                    sender.send_request(req).await.map_err(|e| failed(&e))?
                }
                None => return Err(failed(&e.into_error())),
            },
        };
        // Dropped, the response resets its stream alone (`CANCEL`); the connection carries on.
        let size = header_list_size(resp.headers());
        if size > MAX_RESPONSE_HEADERS as usize {
            return Err(BackendError::Failed {
                authority: self.authority.clone(),
                reason: format!(
                    "a response header block of {size} bytes, over the {MAX_RESPONSE_HEADERS} taken"
                ),
            });
        }
        Ok(resp)
    }

    /// The connection in use, or a new one when there is none, it closed, or it is `stale` (a request
    /// found it would take no more). Requests arriving while it connects wait for it, rather than each
    /// opening its own.
    async fn sender(&self, stale: Option<u64>) -> Result<(u64, SendRequest<Body>), BackendError> {
        let mut current = self.current.lock().await;
        let (number, open) = &mut *current;
        if let Some(sender) = open.as_ref() {
            if !sender.is_closed() && stale != Some(*number) {
                return Ok((*number, sender.clone()));
            }
        }
        *open = None;
        let unreachable = |reason: String| BackendError::Connect {
            authority: self.authority.clone(),
            reason,
        };
        let mut connector = self.connector.clone();
        let io = async {
            poll_fn(|cx| connector.poll_ready(cx)).await?;
            connector.call(self.address.clone()).await
        }
        .await
        .map_err(|e| unreachable(error_chain(&*e)))?;
        if self.tls && !io.connected().is_negotiated_h2() {
            return Err(unreachable(
                "the origin did not agree to HTTP/2 (no ALPN h2); use protocol = \"http1\"".into(),
            ));
        }
        let (sender, connection) = self
            .builder
            .handshake(io)
            .await
            .map_err(|e| unreachable(error_chain(&e)))?;
        let authority = self.authority.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(backend = %authority, error = %error_chain(&e), "HTTP/2 connection to the backend ended");
            }
        });
        *number += 1;
        *open = Some(sender.clone());
        Ok((*number, sender))
    }
}

/// A header block's size as RFC 9113 §6.5.2 counts it: each field's name and value, plus 32 bytes.
fn header_list_size(headers: &http::HeaderMap) -> usize {
    headers
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 32)
        .sum()
}

/// Makes a request bound for a backend ready for HTTP/2: the client's `Host` becomes its `:authority` (the
/// backend's address when the client sent none), with the backend's scheme, and `Host` goes (RFC 9113
/// §8.3.1: an intermediary sends the authority as `:authority`).
pub(crate) fn prepare(
    req: &mut Request<Body>,
    scheme: &str,
    backend: &str,
) -> Result<(), http::Error> {
    let host = req.headers_mut().remove(header::HOST);
    let authority = host
        .as_ref()
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.parse::<Authority>().ok())
        .or_else(|| req.uri().authority().cloned());
    let authority = match authority {
        Some(a) => a,
        None => backend.parse()?,
    };
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    *req.uri_mut() = Uri::builder()
        .scheme(scheme)
        .authority(authority)
        .path_and_query(path)
        .build()?;
    *req.version_mut() = Version::HTTP_2;
    Ok(())
}

/// Whether `e` comes from the origin resetting an HTTP/2 stream, or from its `GOAWAY` or the end of its
/// connection cutting one off. An origin that sends `GOAWAY` with an error and closes leaves the streams
/// it had begun with the connection's I/O error (a broken pipe), not with the `GOAWAY`'s code.
pub(crate) fn reset_by_origin(e: &(dyn Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return h2.is_io() || h2.is_remote() && (h2.is_reset() || h2.is_go_away());
        }
        next = e.source();
    }
    false
}

/// How probes speak HTTP/2: the same header limit as requests, no pings (each poll is one short exchange
/// on a fresh connection, bounded by the probe's `timeout`).
pub(crate) fn probe_builder() -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_RESPONSE_HEADERS);
    builder
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_host_becomes_the_authority() {
        let mut req = Request::get("/a?b=1")
            .header(header::HOST, "www.example.com")
            .body(crate::body::empty())
            .unwrap();
        prepare(&mut req, "https", "10.0.0.1:443").unwrap();
        assert_eq!(req.uri(), "https://www.example.com/a?b=1");
        assert!(req.headers().get(header::HOST).is_none());
        assert_eq!(req.version(), Version::HTTP_2);

        let mut bare = Request::get("/").body(crate::body::empty()).unwrap();
        prepare(&mut bare, "http", "10.0.0.1:8080").unwrap();
        assert_eq!(bare.uri(), "http://10.0.0.1:8080/");
    }
}
