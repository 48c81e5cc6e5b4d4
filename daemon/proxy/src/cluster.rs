//! What the data path asks of a cluster of nodes (the `lacquer-cluster` crate answers it; a single node has
//! none): whether this node can vouch for having every invalidation sent to the cluster, where an
//! invalidation goes before it is acknowledged, and which peer owns a key when the cluster routes itself.

use std::{future::Future, net::SocketAddr, pin::Pin};

use http::{request::Parts, HeaderName, HeaderValue};
use lacquer_admin::wire::ClusterView;
use lacquer_storage::{self as store, BanExpr, BanInfo, PurgeMode, Store, StoreError};

use crate::invalidation::{self, PurgeTarget};

/// Marks a request one node of the cluster sends another for a key the receiver owns: the receiver
/// answers it itself, never forwards it again (no loops), and the header never reaches the origin.
pub static FORWARDED_BY: HeaderName = HeaderName::from_static("lacquer-forwarded-by");

/// Goes with [`FORWARDED_BY`]: the forwarding member's proof (an HMAC under the cluster secret) that it
/// sent this request; without a valid one the mark is not believed. Never reaches the origin either.
pub static FORWARD_PROOF: HeaderName = HeaderName::from_static("lacquer-forward-proof");

/// An invalidation, as an operator or a `PURGE`/`BAN` request asked for it.
#[derive(Debug, Clone)]
pub enum Invalidation {
    /// Every object stored before it that matches is gone.
    Ban(BanExpr),
    /// Every variant of a key, or every object carrying a tag, removed or (`soft`) made stale.
    Purge {
        /// What is purged.
        target: PurgeTarget,
        /// Made stale (kept for grace and revalidation) rather than removed.
        soft: bool,
    },
}

/// What applying an invalidation on this node did.
#[derive(Debug, Clone)]
pub enum Applied {
    /// The ban as this node's ban list holds it.
    Ban(BanInfo),
    /// Stored objects removed (or, soft, made stale).
    Purged(usize),
}

/// Why an invalidation was not acknowledged.
#[derive(Debug, thiserror::Error)]
pub enum InvalidateError {
    /// This node's store failed to apply it.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The cluster's log could not take it (etcd unreachable, or this node could not apply it in time):
    /// not acknowledged, so the sender must retry.
    #[error("cluster: {0}")]
    Cluster(String),
}

/// Another node of the cluster, where a self-routed request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Its name in the cluster.
    pub node: String,
    /// Its client listener, as it advertises it.
    pub addr: SocketAddr,
}

/// Boxed so the trait stays object-safe: the daemon holds the cluster as `dyn Cluster`.
pub type InvalidateFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Applied, InvalidateError>> + Send + 'a>>;

/// The cluster as the data path sees it.
pub trait Cluster: Send + Sync + 'static {
    /// Whether this node has applied every invalidation the cluster has acknowledged, as far as it can
    /// tell within the configured lag bound; when not, stored objects are revalidated with the origin
    /// before they are served, and never stand in for a failing origin.
    fn vouched(&self) -> bool;

    /// Appends `inv` to the cluster's log and resolves once this node has applied it (every node applies
    /// it from the log).
    fn invalidate(&self, inv: Invalidation) -> InvalidateFuture<'_>;

    /// The live member that owns `key`, when the cluster routes itself and it is not this node.
    fn owner(&self, key: &str) -> Option<Peer>;

    /// The [`FORWARD_PROOF`] this node sends with the request of `parts` to the key's owner.
    fn forward_proof(&self, parts: &Parts) -> HeaderValue;

    /// Whether `proof` shows that member `by` forwarded the request of `parts` (as [`FORWARDED_BY`] and
    /// [`FORWARD_PROOF`] name them): only then is it answered here without routing. A source address
    /// proves nothing: whoever shares a member's network, or its host, could send from it.
    fn forwarded_by_member(&self, by: &HeaderValue, proof: &HeaderValue, parts: &Parts) -> bool;

    /// This node's name.
    fn node(&self) -> &str;

    /// This node's standing in the cluster, as `GET /v1/cluster` shows it; the data path's counters
    /// (revalidations, peer requests) are the caller's to fill in.
    fn view(&self) -> ClusterView;
}

/// Applies `inv` to this node's store alone: what a single node does, and what every node of a cluster
/// does with each entry of the log.
pub async fn apply(store: &Store, inv: Invalidation) -> Result<Applied, StoreError> {
    match inv {
        Invalidation::Ban(expr) => store.add_ban(expr).await.map(Applied::Ban),
        Invalidation::Purge { target, soft } => invalidation::purge(store, target, soft)
            .await
            .map(Applied::Purged),
    }
}

/// Applies `batch` to this node's store in order, with one journal sync and one metadata flush for all of
/// it, and records `revision` as the newest revision of the cluster's log applied here in that same flush:
/// what a node does with what it cannot replay (history etcd lost), which must be durable here before the
/// log moves on. Returns what each did, in order.
pub async fn apply_all(
    store: &Store,
    batch: Vec<Invalidation>,
    revision: u64,
) -> Result<Vec<Applied>, StoreError> {
    let done = store.invalidate(to_store(batch), Some(revision)).await?;
    Ok(from_store(done))
}

/// Applies `batch`, the entries of the cluster's log up to `revision`, to this node's store in order,
/// returning once they are in effect here, without waiting for a journal sync or a flush (see
/// [`Store::invalidate_deferred`]): etcd holds them durably, and the store records `revision` at its next
/// [`Store::checkpoint`]. What every node of a cluster does with the entries of the log it receives together.
/// Returns what each did, in order.
pub async fn apply_deferred(
    store: &Store,
    batch: Vec<Invalidation>,
    revision: u64,
) -> Result<Vec<Applied>, StoreError> {
    let done = store.invalidate_deferred(to_store(batch), revision).await?;
    Ok(from_store(done))
}

fn to_store(batch: Vec<Invalidation>) -> Vec<store::Invalidation> {
    let mode = |soft| match soft {
        true => PurgeMode::Soft,
        false => PurgeMode::Hard,
    };
    batch
        .into_iter()
        .map(|inv| match inv {
            Invalidation::Ban(expr) => store::Invalidation::Ban(expr),
            Invalidation::Purge {
                target: PurgeTarget::Key(primary),
                soft,
            } => store::Invalidation::Purge {
                primary,
                mode: mode(soft),
            },
            Invalidation::Purge {
                target: PurgeTarget::Tags(tags),
                soft,
            } => store::Invalidation::PurgeTags {
                tags,
                mode: mode(soft),
            },
        })
        .collect()
}

fn from_store(done: Vec<store::Invalidated>) -> Vec<Applied> {
    done.into_iter()
        .map(|d| match d {
            store::Invalidated::Ban(info) => Applied::Ban(info),
            store::Invalidated::Purged(n) => Applied::Purged(n),
        })
        .collect()
}
