//! The pass step: the request sent to the origin with its body, nothing looked up or stored; an unsafe
//! method that succeeds invalidates what it names.

use std::sync::Arc;

use http::request::Parts;
use lacquer_backends::{
    body::{self, Body},
    BackendError,
};
use lacquer_policy::{key::primary_key, request::RequestClass};
use lacquer_rules::Phase;

use super::step::{Step, Txn};
use crate::{
    forward, phase, repeats,
    respond::{body_too_large, refused, Outcome},
    stats::{add, inc},
    store::CacheStore,
    worker::Worker,
};

/// Passes the request: its head is handed to the origin request (a copy stays for the deliver phase).
pub(super) async fn pass<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    txn: &mut Txn,
    body: Body,
) -> Step {
    let outcome = match txn.class {
        RequestClass::Pass(why) => Outcome::Pass {
            unsafe_method: false,
            detail: Some(why),
        },
        _ => Outcome::Pass {
            unsafe_method: true,
            detail: None,
        },
    };
    // The head stays for the deliver rules, and for the fragments of a page that may be assembled.
    let may_assemble = txn.route.esi || worker.shared.live.load().rules.turns_on_esi();
    let parts = if txn.delivers || may_assemble {
        Parts::clone(txn.head())
    } else {
        Arc::unwrap_or_clone(txn.head.take().expect("a pass takes the head once"))
    };
    forward(worker, txn, parts, body, outcome).await
}

/// Sends the request to the origin as the client sent it, `Accept-Encoding` included: nothing stored or
/// fetched is in a coding this client may get.
pub(super) async fn forward_as_sent<S: CacheStore>(worker: &Arc<Worker<S>>, txn: &mut Txn) -> Step {
    let mut parts = Parts::clone(txn.head());
    if let Some(n) = &txn.negotiated {
        n.restore(&mut parts.headers);
    }
    let outcome = Outcome::Pass {
        unsafe_method: false,
        detail: None,
    };
    forward(worker, txn, parts, body::empty(), outcome).await
}

/// Sends `parts` and `body` to the origin for the request, and answers with what the origin sends back,
/// or with an error of lacquerd's own.
pub(crate) async fn forward<S: CacheStore>(
    worker: &Worker<S>,
    txn: &mut Txn,
    parts: Parts,
    body: Body,
    outcome: Outcome,
) -> Step {
    txn.send_early_hints(&worker.shared.stats);
    let (client, route, decided) = (txn.client, &txn.route, &txn.decided);
    let shared = &worker.shared;
    inc(&shared.stats.passes);
    let unsafe_method = matches!(
        outcome,
        Outcome::Pass {
            unsafe_method: true,
            ..
        }
    );
    let invalidation_target = unsafe_method.then(|| parts.clone());
    let live = shared.live();
    let rules = &live.rules;
    // The head is handed to the origin request; the backend phases' rules match on a copy.
    let client_head = (rules.has(Phase::BackendRequest) || rules.has(Phase::BackendResponse))
        .then(|| parts.clone());
    let key = primary_key(&parts);
    let mut fetching = None;
    let sent = match route.pick_from(decided.target.as_ref(), &key) {
        Ok(backend) => {
            if let Some(note) = &txn.note {
                note.backend(backend.name());
            }
            inc(&shared.stats.backend_requests);
            fetching = txn
                .trace
                .as_ref()
                .map(|t| t.fetch(&parts.method, backend.name(), &backend.authority));
            let mut req =
                forward::origin_request(parts.method, parts.uri, parts.headers, client, body);
            if let Some(head) = &client_head {
                phase::backend_request(rules, head, client, decided, req.headers_mut());
            }
            if let Some(span) = &fetching {
                span.inject(req.headers_mut());
            }
            forward::forward_interim(&mut req, &shared.stats, txn.interim.as_ref());
            // Boxed: hyper's client future is ten kilobytes, and every step that may pass (a hit, a
            // miss sending a request as it came) would carry it unboxed, copied with each request.
            Box::pin(worker.pool(backend).send(req)).await
        }
        Err(e) => Err(e),
    };
    if let Some(span) = &fetching {
        match &sent {
            Ok(resp) => span.status(resp.status()),
            Err(_) => span.fail("backend_error"),
        }
    }
    let resp = match sent {
        Ok(resp) => resp,
        Err(BackendError::RequestBodyTooLarge) => {
            inc(&shared.stats.bodies_too_large);
            return Step::Deliver(body_too_large());
        }
        Err(e @ BackendError::RequestBody(_)) => {
            inc(&shared.stats.bad_requests);
            return Step::Deliver(refused(e.status(), &e.to_string(), None));
        }
        Err(e @ BackendError::Unavailable { .. }) => {
            inc(&shared.stats.backend_unavailable);
            repeats::WARNINGS.warn("nothing to pass to", &key, &e);
            return txn.failed(e.status(), outcome);
        }
        Err(e) => {
            inc(&shared.stats.backend_errors);
            repeats::WARNINGS.warn("pass failed", &key, &e);
            return txn.failed(e.status(), outcome);
        }
    };
    txn.step("Origin", || resp.status().to_string());
    let status = resp.status();
    let invalidated =
        invalidation_target.filter(|_| status.is_success() || status.is_redirection());
    if let Some(target) = invalidated {
        for key in forward::invalidation_keys(&target, resp.headers()) {
            match shared.store.invalidate(&key) {
                Ok(n) => add(&shared.stats.invalidations, n as u64),
                Err(e) => tracing::warn!(key, error = %e, "invalidation failed"),
            }
        }
    }
    let esi = forward::PassEsi {
        route: route.esi,
        limit: route.policy.cache.max_object_size.as_u64(),
        gzip_level: route
            .policy
            .compression
            .as_ref()
            .map(|n| n.settings.gzip_level),
    };
    let resp = forward::answer(
        rules,
        client_head.as_ref(),
        client,
        decided,
        outcome,
        resp,
        &shared.stats,
        Some(esi),
    );
    txn.answered(resp, outcome)
}
