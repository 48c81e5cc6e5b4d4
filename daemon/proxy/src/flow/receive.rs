//! The first step: the head checked and made what the origin receives, the request phase run, the body of
//! a POST keyed by it read, the rate limit applied; then where the request goes.

use std::sync::Arc;

use http::{header, request::Parts, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use lacquer_backends::body::{self, Body, BoxError};
use lacquer_backends::ClientBodyError;
use lacquer_edge::{Client, RequestBody};
use lacquer_policy::{
    head,
    headers::strip_hop_by_hop,
    key::primary_key,
    request::{answered_here, host_from_authority, AnsweredHere, RequestClass},
};
use lacquer_telemetry::Trace;

use super::step::{Miss, Step, Txn};
use crate::{
    access_log::Note,
    cluster,
    coding::Negotiated,
    esi::Within,
    phase::{self, Admitted, Answered},
    pipe, prefetch, purge_method,
    respond::{body_too_large, refused},
    stats::inc,
    store::CacheStore,
    worker::Worker,
};

/// Admits the request and says which step takes it; `Err` with the answer when it goes no further.
pub(super) async fn receive(
    worker: &Arc<Worker>,
    client: Client,
    req: Request<RequestBody>,
    (note, trace): (Option<Arc<Note>>, Option<Trace>),
    within: Option<Arc<Within>>,
) -> Result<(Txn, Step), Response<Body>> {
    let stats = &worker.shared.stats;
    inc(&stats.requests);
    let (mut parts, body) = req.into_parts();
    if let Err(e) = head::check(&parts) {
        inc(&stats.bad_requests);
        return Err(refused(e.status(), &e.to_string(), None));
    }
    if let Some(what) = answered_here(&parts) {
        return Err(own_answer(what));
    }
    if let Some(acme) = &worker.shared.acme {
        // Before the rules: one that redirects to HTTPS, denies or rewrites must not stop the CA's check.
        if let Some(key_authorization) = acme.challenges().http_01(&parts.method, parts.uri.path())
        {
            return Err(acme_answer(key_authorization));
        }
    }
    host_from_authority(&mut parts);
    // Taken before the hop-by-hop fields go: a `pipe` rule's tunnel sends them on.
    let upgrade = pipe::Upgrade::take(&mut parts);
    // From here on the head is the one the origin receives: the key, the variant, the class and every
    // rule are made from it, never from fields that are not forwarded.
    strip_hop_by_hop(&mut parts.headers);
    // Only a cluster's members mark requests as forwarded, and prove it; neither header reaches the origin.
    let forwarded_by = parts.headers.remove(&cluster::FORWARDED_BY);
    let forward_proof = parts.headers.remove(&cluster::FORWARD_PROOF);
    for field in &phase::PSEUDO_FIELDS {
        parts.headers.remove(field);
    }
    let Client {
        ip: client,
        max_request_body,
        secure,
        ..
    } = client;
    let (admitted, delivers, asked) = {
        // A guard, not a counted reference: nothing is awaited while it is held.
        let live = worker.shared.live.load();
        // Prefetches are the requests players would send: made from the head as this one was sent (its
        // CMCD data too, which a `[normalize]` may strip from the key), and run through the request phase
        // once, as theirs would be.
        let asked = live.prefetching.then(|| Arc::new(parts.clone()));
        let shown = upgrade.as_ref().map(pipe::Upgrade::protocol);
        let admitted = phase::request(&live, &mut parts, client, secure, shown, None);
        (admitted, phase::delivers(&live.rules), asked)
    };
    let Admitted {
        route,
        mut decided,
        class,
        body_cap,
        pipe,
    } = match admitted {
        Ok(admitted) => admitted,
        Err(Answered::Denied) => {
            inc(&stats.denied);
            return Err(refused(StatusCode::FORBIDDEN, "denied", None));
        }
        Err(Answered::Synthetic(made)) => return Err(phase::synthetic(*made)),
        Err(Answered::Invalidate(invalidation)) => {
            return Err(purge_method::from_rule(worker, client, &parts, &invalidation).await)
        }
    };
    if let Some(note) = &note {
        note.route(|| worker.shared.live().router.describe(&route));
        note.step("Class", || match class {
            RequestClass::Lookup => "lookup".to_owned(),
            RequestClass::Miss(why) => format!("miss without lookup: {why}"),
            RequestClass::Pass(why) => format!("pass: {why}"),
            RequestClass::Invalidate => format!("pass: {} invalidates on success", parts.method),
        });
    }
    if purge_method::is_invalidation(&parts.method) {
        return Err(purge_method::handle(worker, client, &parts).await);
    }
    let body = match body_cap {
        Some(cap) => match Limited::new(body, cap as usize).collect().await {
            Ok(read) => {
                phase::key_body(&mut parts, &mut decided, read.to_bytes());
                None
            }
            Err(_) => {
                inc(&stats.bad_requests);
                return Err(refused(
                    StatusCode::BAD_REQUEST,
                    "request body failed",
                    None,
                ));
            }
        },
        None => Some(body),
    };
    // A page's fragments are the page's request, already counted against its client's rate.
    let rate = route.rate_limit.as_ref().filter(|_| within.is_none());
    if let Some(Err(wait)) = rate.map(|l| l.check(client)) {
        inc(&stats.rate_limited);
        return Err(refused(
            StatusCode::TOO_MANY_REQUESTS,
            "too many requests",
            Some(wait),
        ));
    }
    let looked_up = matches!(class, RequestClass::Lookup | RequestClass::Miss(_));
    let mut txn = Txn::admitted(client, secure, route, decided, class, delivers);
    (txn.note, txn.trace) = (note, trace);
    txn.within = within;
    if looked_up {
        txn.key = primary_key(&parts);
    }
    if let Some(upgrade) = upgrade.filter(|_| pipe) {
        txn.head = Some(Arc::new(parts));
        return Ok((txn, Step::Pipe(upgrade)));
    }
    if !looked_up {
        txn.head = Some(Arc::new(parts));
        let body = body.expect("only a looked-up POST has its body read");
        return Ok(match limited(body, txn.head(), max_request_body) {
            Some(body) => (txn, Step::Pass(body)),
            None => {
                inc(&stats.bodies_too_large);
                (txn, Step::Deliver(body_too_large()))
            }
        });
    }
    if let Some(cluster) = &worker.shared.cluster {
        let forwarded = forwarded_by.as_ref().is_some_and(|by| {
            let member = forward_proof
                .as_ref()
                .is_some_and(|proof| cluster.forwarded_by_member(by, proof, &parts));
            if !member {
                // Routed as any client's request: a mark anyone could send must not pin a key here.
                inc(&stats.peer_requests_unproven);
            }
            member
        });
        if forwarded {
            // Never forwarded twice: whatever this node thinks of the ring, it answers.
            inc(&stats.peer_requests_in);
        } else if let Some(peer) = cluster.owner(&txn.key) {
            let proof = cluster.forward_proof(&parts);
            txn.head = Some(Arc::new(parts));
            txn.asked = asked;
            return Ok((txn, Step::Peer(peer, proof)));
        }
    }
    txn.asked = asked;
    let step = lookup(worker, &mut txn, parts);
    Ok((txn, step))
}

/// The request's way into the lookup: prefetches started from it, and its `Accept-Encoding` replaced by
/// the one the origin is sent and the variant is made from (the client's own decides only how the body
/// leaves).
pub(super) fn lookup<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    txn: &mut Txn,
    mut parts: Parts,
) -> Step {
    let prefetching = txn.route.prefetch;
    let class = txn.class;
    txn.asked = txn.asked.take().filter(|_| {
        class == RequestClass::Lookup && (prefetching.playlist > 0 || prefetching.cmcd)
    });
    if let Some(asked) = &txn.asked {
        prefetch::on_request(
            worker,
            asked,
            txn.client,
            txn.secure,
            prefetching.playlist,
            prefetching.cmcd,
        );
    }
    txn.step("Key", || txn.key.clone());
    worker.shared.prefetch.claim(&txn.key, &worker.shared.stats);
    txn.negotiated = txn
        .route
        .policy
        .compression
        .as_ref()
        .map(|negotiation| Negotiated::take(&mut parts.headers, negotiation));
    txn.head = Some(Arc::new(parts));
    match txn.class {
        RequestClass::Miss(_) => Step::Miss(Miss::alone()),
        _ => Step::Lookup { again: false },
    }
}

/// The methods an `Allow` field names: those this proxy forwards or answers (its routes may refuse some).
const ALLOWED: HeaderValue =
    HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE");

/// The answer to a request that is not forwarded ([`AnsweredHere`]).
fn own_answer(what: AnsweredHere) -> Response<Body> {
    let mut resp = match what {
        AnsweredHere::ServerOptions => Response::new(body::empty()),
        AnsweredHere::Connect => refused(
            StatusCode::METHOD_NOT_ALLOWED,
            "CONNECT is not supported",
            None,
        ),
    };
    resp.headers_mut().insert(header::ALLOW, ALLOWED);
    resp
}

/// The answer to the CA's HTTP-01 check (RFC 8555 §8.3): made here, stored nowhere.
fn acme_answer(key_authorization: String) -> Response<Body> {
    let mut resp = Response::new(body::full(key_authorization));
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// The request body to forward, cut off past `max` bytes; `None` when its declared length is over `max`.
fn limited(body: RequestBody, parts: &Parts, max: u64) -> Option<Body> {
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > max) {
        return None;
    }
    Some(
        Limited::new(body.map_err(ClientBodyError), max as usize)
            .map_err(BoxError::from)
            .boxed_unsync(),
    )
}
