//! `pipe`: a connection upgrade (a WebSocket) tunnelled to the backend, bytes copied both ways until
//! either side closes or the tunnel goes quiet. HTTP/1.1 only: HTTP/2's extended CONNECT (RFC 8441) is
//! not offered.

use std::{
    io,
    net::IpAddr,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
        Arc,
    },
    task::{Context, Poll},
    time::Duration,
};

use http::{header, request::Parts, HeaderValue, Response, StatusCode, Version};
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use lacquer_backends::{
    body::{self, Body},
    BackendError, BackendState,
};
use lacquer_policy::headers::strip_hop_by_hop;
use lacquer_rules::Phase;

use crate::{
    fields, forward,
    phase::{self, Decided},
    respond::Outcome,
    stats::{dec, inc, Stats},
    store::CacheStore,
    worker::Worker,
};

/// A client's request to switch protocols, taken from its head before the hop-by-hop fields go.
pub(crate) struct Upgrade {
    /// The `Upgrade` field: the protocols the client asks for.
    protocol: HeaderValue,
    /// The client's connection, once it has been sent a `101`.
    client: OnUpgrade,
}

impl Upgrade {
    /// The upgrade `parts` asks for, taken out of it; `None` when it asks for none that can be tunnelled.
    pub(crate) fn take(parts: &mut Parts) -> Option<Self> {
        let protocol = requested(parts)?;
        let client = parts.extensions.remove::<OnUpgrade>()?;
        Some(Self { protocol, client })
    }

    /// The `Upgrade` field the client sent, for the request rules to match on.
    pub(crate) fn protocol(&self) -> &HeaderValue {
        &self.protocol
    }
}

/// The protocols a request asks to switch to: its `Upgrade`, when `Connection` has the `upgrade` option
/// (RFC 9110 §7.8), on HTTP/1.1, without a body (hyper would read one as the request's: it would never
/// reach the tunnel).
pub(crate) fn requested(parts: &Parts) -> Option<HeaderValue> {
    let h = &parts.headers;
    let asked = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|option| option.trim().eq_ignore_ascii_case("upgrade"));
    let body = h.contains_key(header::TRANSFER_ENCODING)
        || h.get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    if parts.version != Version::HTTP_11 || !asked || body {
        return None;
    }
    let mut lines = h.get_all(header::UPGRADE).iter();
    let first = lines.next()?;
    let mut joined = first.as_bytes().to_vec();
    for line in lines {
        joined.extend_from_slice(b", ");
        joined.extend_from_slice(line.as_bytes());
    }
    HeaderValue::from_bytes(&joined).ok()
}

/// Sends the request to `backend` on a connection of its own, asking for `upgrade`, with the backend
/// phases' rules run as for a pass. On `101` the client gets the backend's `101` and the two connections
/// are joined until either closes or no byte moves for the backend's `between_bytes_timeout`; any other
/// answer goes to the client as a pass's would (with `outcome`). `Err` with the status of the error to
/// answer when the backend could not be asked, or switched protocols unusably.
pub(crate) async fn tunnel<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    client: IpAddr,
    backend: &Arc<BackendState>,
    decided: &Decided,
    parts: Parts,
    upgrade: Upgrade,
    outcome: Outcome,
) -> Result<Response<Body>, StatusCode> {
    let stats = &worker.shared.stats;
    let live = worker.shared.live();
    let rules = &live.rules;
    // The head is handed to the origin request; the backend phases' rules match on a copy.
    let client_head = (rules.has(Phase::BackendRequest) || rules.has(Phase::BackendResponse))
        .then(|| parts.clone());
    inc(&stats.backend_requests);
    let key = lacquer_policy::key::primary_key(&parts);
    let mut req = forward::origin_request(
        parts.method,
        parts.uri,
        parts.headers,
        client,
        body::empty(),
    );
    if let Some(head) = &client_head {
        phase::backend_request(rules, head, client, decided, req.headers_mut());
    }
    let h = req.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    h.insert(header::UPGRADE, upgrade.protocol);
    // Boxed, as a pass's send is: see `flow::pass::forward`.
    let mut resp = match Box::pin(worker.pool(backend).upgrade(req)).await {
        Ok(resp) => resp,
        Err(e) => {
            if matches!(e, BackendError::Unavailable { .. }) {
                inc(&stats.backend_unavailable);
            } else {
                inc(&stats.backend_errors);
            }
            crate::repeats::WARNINGS.warn("pipe failed", &key, &e);
            return Err(e.status());
        }
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        // Refused by the origin: an ordinary answer, on a connection that goes with its body.
        inc(&stats.passes);
        let head = client_head.as_ref();
        return Ok(forward::answer(
            rules, head, client, decided, outcome, resp, stats, None,
        ));
    }
    let origin = hyper::upgrade::on(&mut resp);
    // The handshake's empty body goes, and with it the backend's place under `max_connections`.
    let (mut head, _) = resp.into_parts();
    let protocol = head.headers.get(header::UPGRADE).cloned();
    let (Some(protocol), Ok(origin)) = (protocol, origin.await) else {
        inc(&stats.backend_errors);
        tracing::warn!("backend switched protocols without a usable Upgrade");
        return Err(StatusCode::BAD_GATEWAY);
    };
    strip_hop_by_hop(&mut head.headers);
    head.headers
        .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    head.headers.insert(header::UPGRADE, protocol);
    fields::append(&mut head.headers, header::VIA, fields::VIA);
    inc(&stats.pipes);
    let open = Open::new(stats.clone());
    let idle = backend.config.between_bytes_timeout;
    tokio::spawn(join(upgrade.client, origin, idle, open));
    Ok(Response::from_parts(head, body::empty()))
}

/// A tunnel counted in `pipes_active` for as long as it lives.
struct Open(Arc<Stats>);

impl Open {
    fn new(stats: Arc<Stats>) -> Self {
        inc(&stats.pipes_active);
        Self(stats)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        dec(&self.0.pipes_active);
    }
}

/// Copies bytes both ways between the client (once its `101` is sent) and the origin until both have
/// closed, either fails, or neither sends a byte for `idle`.
async fn join(client: OnUpgrade, origin: Upgraded, idle: Duration, open: Open) {
    let stats = &open.0;
    let client = match client.await {
        Ok(io) => io,
        Err(e) => {
            tracing::debug!(error = %e, "client connection gone before its tunnel opened");
            return;
        }
    };
    let moved = AtomicBool::new(false);
    let mut client = Metered {
        io: TokioIo::new(client),
        moved: &moved,
        written: &stats.pipe_bytes_to_client,
    };
    let mut origin = Metered {
        io: TokioIo::new(origin),
        moved: &moved,
        written: &stats.pipe_bytes_to_backend,
    };
    tokio::select! {
        copied = tokio::io::copy_bidirectional(&mut client, &mut origin) => {
            if let Err(e) = copied {
                tracing::debug!(error = %e, "tunnel ended with an error");
            }
        }
        () = quiet(&moved, idle) => tracing::debug!(?idle, "tunnel closed: no byte either way"),
    }
}

/// Returns once `moved` has stayed unset for `idle`, clearing it as it looks: a timer ticks four times per
/// `idle`, as the edge's idle timeout does, so the bytes themselves never read the clock.
async fn quiet(moved: &AtomicBool, idle: Duration) {
    const TICKS: u32 = 4;
    let tick = (idle / TICKS).max(Duration::from_millis(1));
    let mut quiet_ticks = 0;
    while quiet_ticks < TICKS {
        tokio::time::sleep(tick).await;
        quiet_ticks = if moved.swap(false, Relaxed) {
            0
        } else {
            quiet_ticks + 1
        };
    }
}

/// One side of a tunnel: notes that bytes moved, and counts those written to it.
struct Metered<'a, IO> {
    io: IO,
    moved: &'a AtomicBool,
    written: &'a AtomicU64,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Metered<'_, IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.moved.store(true, Relaxed);
        }
        read
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Metered<'_, IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            self.moved.store(true, Relaxed);
            self.written.fetch_add(n as u64, Relaxed);
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use http::Request;

    use super::*;

    /// A request's version and fields, and the protocols it asks to switch to.
    type Case<'a> = (Version, &'a [(&'a str, &'a str)], Option<&'a str>);

    #[test]
    fn only_a_bodiless_http11_upgrade_with_its_connection_option_is_tunnelled() {
        let websocket = [("connection", "Upgrade"), ("upgrade", "websocket")];
        let cases: &[Case<'_>] = &[
            (Version::HTTP_11, &websocket, Some("websocket")),
            (
                Version::HTTP_11,
                &[
                    ("connection", "keep-alive, upgrade"),
                    ("upgrade", "websocket"),
                ],
                Some("websocket"),
            ),
            (
                Version::HTTP_11,
                &[
                    ("connection", "upgrade"),
                    ("upgrade", "foo/2"),
                    ("upgrade", "websocket"),
                ],
                Some("foo/2, websocket"),
            ),
            // `Upgrade` alone, or `Connection: upgrade` alone, asks for nothing (RFC 9110 §7.8).
            (Version::HTTP_11, &[("upgrade", "websocket")], None),
            (Version::HTTP_11, &[("connection", "upgrade")], None),
            (
                Version::HTTP_11,
                &[("connection", "upgraded"), ("upgrade", "websocket")],
                None,
            ),
            (Version::HTTP_10, &websocket, None),
            (Version::HTTP_2, &websocket, None),
            (
                Version::HTTP_11,
                &[
                    ("connection", "upgrade"),
                    ("upgrade", "h2c"),
                    ("content-length", "5"),
                ],
                None,
            ),
            (
                Version::HTTP_11,
                &[
                    ("connection", "upgrade"),
                    ("upgrade", "h2c"),
                    ("transfer-encoding", "chunked"),
                ],
                None,
            ),
            (
                Version::HTTP_11,
                &[
                    ("connection", "upgrade"),
                    ("upgrade", "websocket"),
                    ("content-length", "0"),
                ],
                Some("websocket"),
            ),
        ];
        for (version, fields, want) in cases {
            let mut req = Request::builder().version(*version).uri("/chat");
            for (name, value) in *fields {
                req = req.header(*name, *value);
            }
            let (parts, ()) = req.body(()).unwrap().into_parts();
            let got = requested(&parts);
            assert_eq!(
                got.as_ref().map(|v| v.to_str().unwrap()),
                *want,
                "{version:?} {fields:?}"
            );
        }
    }

    /// A `pipe` rule whose examples say what is tunnelled, and `expect`, the third example's verdict.
    fn pipe_rule(expect: bool) -> String {
        format!(
            r#"
[backend]
address = "127.0.0.1:9"

[[rule]]
match = {{ headers = {{ upgrade = "(?i)websocket" }} }}
pipe = true
examples = [
  {{ request = {{ url = "http://chat.test/ws", headers = {{ connection = "Upgrade", upgrade = "websocket" }} }}, expect = {{ pipe = true }} }},
  {{ request = {{ url = "http://chat.test/page" }}, expect = {{ pipe = false, pass = false }} }},
  {{ request = {{ url = "http://chat.test/ws", headers = {{ upgrade = "websocket" }} }}, expect = {{ pipe = {expect} }} }},
]
"#
        )
    }

    #[test]
    fn request_rules_see_the_upgrade_a_request_asks_for() {
        let live = |text: &str| {
            let config = lacquer_config::Config::parse(text, "t").unwrap();
            let backends = lacquer_backends::backend_set(&config).unwrap();
            crate::worker::Live::new(&config, &backends).map(|_| ())
        };
        live(&pipe_rule(false)).expect("the examples hold");
        let e = live(&pipe_rule(true)).expect_err("`Upgrade` alone asks for nothing");
        assert!(e.to_string().contains("rule[0].examples[2]"), "{e}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_tunnel_is_quiet_after_idle_without_a_byte() {
        let moved = AtomicBool::new(false);
        let idle = Duration::from_secs(60);
        let start = tokio::time::Instant::now();
        let busy = async {
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_secs(20)).await;
                moved.store(true, Relaxed);
            }
        };
        tokio::select! {
            () = quiet(&moved, idle) => panic!("quiet while bytes moved"),
            () = busy => {}
        }
        assert_eq!(start.elapsed(), Duration::from_secs(200));
        quiet(&moved, idle).await;
        let waited = start.elapsed() - Duration::from_secs(200);
        assert!(
            waited >= idle && waited <= idle + idle / 4,
            "quiet after {waited:?}"
        );
    }
}
