//! The settings a reload can change while requests are served, compiled once.

use lacquer_backends::{protection::DenyRule, routing::Router};
use lacquer_config::{Esi, Normalize, Prefetch, Purge};
use lacquer_rules::Rules;

use crate::error_page::ErrorPages;

/// The settings a reload can change while requests are served.
#[derive(Debug)]
pub struct Live {
    /// Routes (each with its cache policy and rate limit) and directors.
    pub router: Router,
    /// Who may send `PURGE` and `BAN` to the client listeners.
    pub purge: Purge,
    /// Requests refused with 403 before anything else.
    pub deny: Vec<DenyRule>,
    /// How request targets and headers are normalised before the key is made.
    pub normalize: Normalize,
    /// `[[rule]]`s, with their counters (a reload starts them afresh, as Varnish's VCL counters).
    pub rules: Rules,
    /// `[prefetch]`: the budget of the routes' `prefetch`.
    pub prefetch: Prefetch,
    /// Some route prefetches: the head of every request is kept as sent, before the request phase.
    pub prefetching: bool,
    /// `[esi]`: how far Edge Side Includes go.
    pub esi: Esi,
    /// `[error_pages]`, read: what a client gets when lacquerd answers a 5xx itself.
    pub error_pages: ErrorPages,
}
