//! The request flow, as one loop over named steps: [`receive`] admits a request and says where it goes,
//! then each step returns the next until one answers:
//!
//! ```text
//! receive ─┬─ lookup ─┬─ hit ─────────────────────┐
//!          │    ▲     └─ miss ─┬──────────────────┤
//!          │    └── look again ┘                  │
//!          ├─ pass ───────────────────────────────┼─ deliver ─┐
//!          ├─ pipe ───────────────────────────────┘           │
//!          ├─ peer ─┬─ the owner's answer ────────────────────┼─ observed, out
//!          │        └─ owner gone: lookup                     │
//!          └─ answered here: refusals, purges, rules' answers ┘
//! ```
//!
//! A response that is an ESI page's template (stored, or a fill's) is then assembled ([`assemble`]):
//! each include is a request of its own ([`fragment`]) through these same steps, one level deeper.
//!
//! One [`Txn`] carries the request through them: who sent it, its head (owned once, from the moment the
//! request phase has made it what the origin receives), its route, the rules' decisions, its key, and
//! what the steps learn on the way (the outcome, debug counts, the deliver rules already applied). The
//! last step is [`observe`]: the one layer that follows the response body out for the counters, the
//! access log and the span.

mod deliver;
mod hit;
mod lookup;
mod miss;
mod observe;
mod pass;
mod pipe;
mod receive;
pub(crate) mod step;
pub(crate) mod stored;

use std::sync::Arc;

use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use lacquer_backends::body::{self, Body};
use lacquer_edge::{Client, EdgeStats, Interim, RequestBody};

pub use self::observe::Observed;
use self::step::{Step, Txn};
use lacquer_telemetry::Trace;

use crate::{access_log::Note, error_page, respond, stats::inc, timing, worker::Worker};

impl lacquer_edge::Service for Worker {
    type Body = Observed;
    type Error = lacquer_backends::body::BoxError;

    fn call(
        self: Arc<Self>,
        req: Request<RequestBody>,
        client: Client,
        interim: Option<Interim>,
    ) -> impl std::future::Future<Output = Response<Observed>> + Send + 'static {
        let (observing, note, trace) = observe::Observing::begin(&self.shared, &req, client.ip);
        // Read only for an error page of lacquerd's own: kept as sent (a count of the connection's buffer
        // per line; nothing for a client that sends none), not parsed for every request.
        let accept: Vec<HeaderValue> = req
            .headers()
            .get_all(header::ACCEPT)
            .iter()
            .cloned()
            .collect();
        let head_only = req.method() == Method::HEAD;
        async move {
            let (resp, txn) = if client.refused {
                (too_many_connections(), None)
            } else if client.too_early {
                inc(&self.shared.stats.requests);
                (too_early(), None)
            } else {
                run(&self, client, req, (note, trace), interim).await
            };
            // A refused connection's 503 is lacquerd's own too: the same page.
            let failure = client.refused || txn.as_ref().is_some_and(|t| t.failure);
            let replaced = txn.as_ref().is_some_and(|t| t.replaced);
            let resp = if failure && !replaced {
                let html = error_page::wants_html(&accept);
                self.shared.live.load().error_pages.apply(html, resp)
            } else {
                resp
            };
            // Whatever step answered (an error page, a pass, a stored object), a HEAD response has no body:
            // HTTP/2 sending one breaks the stream (RFC 9113 §8.1.1), HTTP/1.1 the connection.
            let resp = if head_only {
                resp.map(|_| body::empty())
            } else {
                resp
            };
            let collapsed = match &txn {
                Some(Txn {
                    outcome: Some(respond::Outcome::Miss { collapsed, .. }),
                    ..
                }) => *collapsed,
                // The owner's verdict, as its `Cache-Status` says it.
                Some(Txn {
                    owner_answered: true,
                    ..
                }) => resp
                    .headers()
                    .get(crate::fields::CACHE_STATUS)
                    .is_some_and(|v| v.as_bytes().windows(9).any(|w| w == b"collapsed")),
                _ => false,
            };
            let outcome = match txn {
                _ if failure => timing::Outcome::SYNTH,
                Some(Txn {
                    outcome: Some(outcome),
                    ..
                }) => timing::Outcome::from(outcome),
                // The owner's `X-Cache` is its verdict, sent over the wire.
                Some(Txn {
                    owner_answered: true,
                    ..
                }) => timing::Outcome::from_x_cache(resp.headers()),
                _ => timing::Outcome::SYNTH,
            };
            observing.respond(self, resp, outcome, collapsed)
        }
    }

    fn stats(&self) -> &EdgeStats {
        &self.shared.stats.edge
    }
}

/// Answers one request: receives it, then runs the steps it leads to until one answers. The request's
/// context comes back with the response, for what observes it.
pub(crate) async fn run(
    worker: &Arc<Worker>,
    client: Client,
    req: Request<RequestBody>,
    noted: (Option<Arc<Note>>, Option<Trace>),
    interim: Option<Interim>,
) -> (Response<Body>, Option<Txn>) {
    let (mut txn, first) = match receive::receive(worker, client, req, noted, None).await {
        Ok(received) => received,
        Err(resp) => return (resp, None),
    };
    txn.interim = interim;
    let resp = steps(worker, &mut txn, first).await;
    let resp = assemble(worker, &txn, resp, client);
    (resp, Some(txn))
}

/// The last step of a request whose response is an ESI page's template: the page assembled with its
/// fragments (see [`crate::esi::assemble`]); any other response as it is.
fn assemble(
    worker: &Arc<Worker>,
    txn: &Txn,
    resp: Response<Body>,
    client: Client,
) -> Response<Body> {
    if !txn.assembles || txn.failure {
        return resp;
    }
    let Some(page) = &txn.head else {
        return resp;
    };
    // A fragment is fetched uncompressed: only the client's page is compressed for it.
    let compression = txn
        .route
        .policy
        .compression
        .as_ref()
        .filter(|_| txn.within.is_none())
        .map(|n| {
            (
                &n.settings,
                txn.negotiated.as_ref().is_some_and(|n| n.takes_gzip()),
            )
        });
    crate::esi::assemble(
        worker,
        fragment,
        resp,
        page,
        client,
        txn.within.as_ref(),
        compression,
    )
}

/// A request lacquerd makes for an include of an ESI page: received and run through the steps as a
/// client's would be (its own key, variant, rules, coalescing and store), one level deeper. Not logged
/// or traced on its own: the page's request is.
fn fragment(
    worker: Arc<Worker>,
    client: Client,
    req: Request<RequestBody>,
    within: Arc<crate::esi::Within>,
) -> crate::esi::Fragment {
    Box::pin(async move {
        let noted = (None, None);
        let (mut txn, first) =
            match receive::receive(&worker, client, req, noted, Some(within)).await {
                Ok(received) => received,
                Err(resp) => return resp,
            };
        let resp = steps(&worker, &mut txn, first).await;
        assemble(&worker, &txn, resp, client)
    })
}

/// Runs the steps from `step` until one answers.
pub(crate) async fn steps<S: crate::store::CacheStore>(
    worker: &Arc<Worker<S>>,
    txn: &mut Txn,
    mut step: Step,
) -> Response<Body> {
    loop {
        step = match step {
            Step::Lookup { again } => lookup::lookup(worker, txn, again).await,
            Step::Hit(found) => hit::hit(worker, txn, found).await,
            Step::Miss(miss) => miss::miss(worker, txn, miss).await,
            Step::Pass(body) => pass::pass(worker, txn, body).await,
            Step::Pipe(upgrade) => self::pipe::pipe(worker, txn, upgrade).await,
            Step::Peer(peer, proof) => {
                match ask_owner(worker, txn, (&peer, proof)).await {
                    Some(resp) => {
                        txn.owner_answered = true;
                        Step::Done(resp)
                    }
                    // The owner cannot be reached: this node answers while its lease runs out.
                    None => {
                        let head = txn.head.take().expect("a peer is asked with the head");
                        receive::lookup(worker, txn, Arc::unwrap_or_clone(head))
                    }
                }
            }
            Step::Deliver(resp) => return deliver::deliver(worker, txn, resp),
            Step::Done(resp) => return resp,
        }
    }
}

/// The owner's answer, through this worker's connections to the cluster's members.
async fn ask_owner<S: crate::store::CacheStore>(
    worker: &Worker<S>,
    txn: &Txn,
    owner: (&crate::cluster::Peer, HeaderValue),
) -> Option<Response<Body>> {
    let node = worker.shared.cluster.as_ref()?.node();
    let stats = &worker.shared.stats;
    let (client, trace) = (txn.client, txn.trace.as_ref());
    let head = (&**txn.head(), txn.decided.body.as_ref());
    crate::peer::ask(&worker.peers, stats, node, client, owner, head, trace).await
}

fn too_many_connections() -> Response<Body> {
    let mut resp = Response::new(body::empty());
    *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

/// The answer to a request in TLS early data that may not be answered before the handshake completes: the
/// client sends it again once it has (RFC 8470).
fn too_early() -> Response<Body> {
    let mut resp = Response::new(body::empty());
    *resp.status_mut() = StatusCode::TOO_EARLY;
    resp
}
