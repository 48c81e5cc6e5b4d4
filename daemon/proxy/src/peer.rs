//! Self-routing: a request for a key another member of the cluster owns is answered by that owner, which
//! fetches from the origin once for the whole cluster and caches; this node stores nothing of it.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http::{request::Parts, HeaderValue, Response};
use lacquer_backends::{
    body::{self, Body},
    Backend, BackendState,
};
use lacquer_policy::headers::strip_hop_by_hop;
use lacquer_telemetry::Trace;

use crate::{
    cluster::{Peer, FORWARDED_BY, FORWARD_PROOF},
    forward,
    stats::{inc, Stats},
};

/// A dead owner is noticed at connect (refused at once on a LAN) or, when it hangs, within this; its
/// keys are then answered here until its lease lapses and the ring moves them.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// One worker's connections to the peers, by address.
#[derive(Default)]
pub struct Peers(HashMap<SocketAddr, Backend>);

impl Peers {
    fn pool(&mut self, addr: SocketAddr) -> Option<Backend> {
        if let Some(pool) = self.0.get(&addr) {
            return Some(pool.clone());
        }
        let config = lacquer_config::Backend {
            name: format!("peer {addr}"),
            address: Some(format!("http://{addr}")),
            connect_timeout: CONNECT_TIMEOUT,
            ..Default::default()
        };
        let state = BackendState::new(&config, "cluster peer").ok()?;
        let pool = Backend::new(Arc::new(state));
        self.0.insert(addr, pool.clone());
        Some(pool)
    }
}

/// The owner's answer to the request, marked as forwarded by this node (with `proof`, the cluster's
/// [`crate::cluster::Cluster::forward_proof`] of `parts`) so that the owner answers it itself; `None`
/// when the owner cannot be reached, and this node answers (a dead owner must not fail requests while
/// its lease runs out).
pub(crate) async fn ask(
    peers: &Mutex<Peers>,
    stats: &Stats,
    node: &str,
    client: IpAddr,
    (peer, proof): (&Peer, HeaderValue),
    (parts, keyed_body): (&Parts, Option<&Bytes>),
    trace: Option<&Trace>,
) -> Option<Response<Body>> {
    inc(&stats.peer_requests);
    let pool = peers.lock().expect("peers lock").pool(peer.addr)?;
    // A request keyed by its body (a QUERY, a `cache_body` POST) goes with that body: the owner keys it
    // the same way. Any other's body was not read.
    let body = keyed_body.map_or_else(body::empty, |b| body::full(b.clone()));
    let mut req = forward::origin_request(
        parts.method.clone(),
        parts.uri.clone(),
        parts.headers.clone(),
        client,
        body,
    );
    req.headers_mut()
        .insert(FORWARDED_BY.clone(), HeaderValue::from_str(node).ok()?);
    req.headers_mut().insert(FORWARD_PROOF.clone(), proof);
    // The owner's spans, when it traces, continue this request's trace: the proof covers no header of it.
    let fetching = trace.map(|t| {
        let span = t.fetch(&parts.method, pool.state.name(), &pool.state.authority);
        span.set("lacquer.peer", peer.node.clone());
        span.inject(req.headers_mut());
        span
    });
    // Boxed: hyper's client future is ten kilobytes, rarely needed by a lookup that carries it.
    let sent = Box::pin(pool.send(req)).await;
    if let Some(span) = &fetching {
        match &sent {
            Ok(resp) => span.status(resp.status()),
            Err(_) => span.fail("peer_error"),
        }
    }
    match sent {
        Ok(resp) => {
            let (mut head, body) = resp.into_parts();
            strip_hop_by_hop(&mut head.headers);
            Some(Response::from_parts(head, body::incoming(body)))
        }
        Err(e) => {
            inc(&stats.peer_failures);
            tracing::debug!(peer = %peer.node, error = %e, "peer request failed; answering here");
            None
        }
    }
}
