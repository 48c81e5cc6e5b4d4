//! The deliver step: the deliver rules (or, for an error lacquerd made, the error rules) on the response
//! leaving for the client, then the surrogate keys withheld.

use std::sync::Arc;

use http::{Response, StatusCode};
use lacquer_backends::body::Body;

use super::step::Txn;
use crate::{
    phase::{self, Delivering},
    respond,
    store::CacheStore,
    worker::Worker,
};

/// Runs the deliver phase on `resp`. A tunnel's `101` is no response the rules could edit or replace: the
/// connection is the origin's from here on.
pub(super) fn deliver<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    txn: &mut Txn,
    resp: Response<Body>,
) -> Response<Body> {
    let ruled = txn
        .head
        .as_ref()
        .filter(|_| txn.delivers && resp.status() != StatusCode::SWITCHING_PROTOCOLS);
    let mut resp = match ruled {
        Some(head) => {
            let live = worker.shared.live.load();
            let delivering = Delivering {
                own_error: txn.own_error,
                debug: lacquer_rules::Debug {
                    outcome: txn.outcome.map(respond::Outcome::delivered),
                    ..txn.debug.unwrap_or_default()
                },
                ahead: txn.ahead,
            };
            let (resp, made) =
                phase::deliver(&live.rules, head, txn.client, txn.secure, delivering, resp);
            // A rule's own answer replaces lacquerd's error page too.
            txn.replaced = made;
            resp
        }
        None => resp,
    };
    // After the deliver rules, which see the response as the origin sent it (a hit's head prepared ahead
    // of them holds its tags).
    respond::withhold_tags(resp.headers_mut(), &txn.route.policy.cache);
    resp
}
