//! The pipe step: a `pipe` rule's upgrade request tunnelled to the backend (see [`crate::pipe`]).

use std::sync::Arc;

use lacquer_policy::key::primary_key;

use super::step::{Step, Txn};
use crate::{pipe, repeats, respond::Outcome, stats::inc, store::CacheStore, worker::Worker};

/// Tunnels the request: the backend's `101` joins the connections, any other answer is a pass's.
pub(super) async fn pipe<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    txn: &mut Txn,
    upgrade: pipe::Upgrade,
) -> Step {
    let outcome = Outcome::Pass {
        unsafe_method: false,
        detail: None,
    };
    let head = txn.head();
    let key = primary_key(head);
    let backend = match txn.route.pick_from(txn.decided.target.as_ref(), &key) {
        Ok(backend) => backend,
        Err(e) => {
            inc(&worker.shared.stats.backend_unavailable);
            repeats::WARNINGS.warn("nothing to tunnel to", &key, &e);
            return txn.failed(e.status(), outcome);
        }
    };
    if let Some(note) = &txn.note {
        note.backend(backend.name());
    }
    let parts = http::request::Parts::clone(head);
    let sent = pipe::tunnel(
        worker,
        txn.client,
        backend,
        &txn.decided,
        parts,
        upgrade,
        outcome,
    );
    match sent.await {
        // The connection is the origin's from here on: no verdict of the cache's (`synth`, as lacquerd's
        // own answers are counted).
        Ok(resp) if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS => Step::Deliver(resp),
        Ok(resp) => txn.answered(resp, outcome),
        Err(status) => txn.failed(status, outcome),
    }
}
