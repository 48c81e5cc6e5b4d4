//! A cluster of lacquerd nodes that act as one cache, built on etcd rather than a consensus of our own.
//!
//! - **Invalidations**: every ban and purge any node takes is put to one etcd key
//!   (`<prefix>/invalidations`), and acknowledged once this node has applied it. Those a node takes while
//!   its previous put is in flight go together in the next: one revision of the key, holding them in order.
//!   Every node watches the key and applies each revision once, in revision order, whatever the watch
//!   delivered meanwhile in one store batch, without waiting for its local journal sync or metadata flush:
//!   etcd's commit is the durability point. A background checkpoint (every 100 ms at most) syncs the
//!   journal, then persists the last revision applied; after a stop or a crash the node replays the history
//!   from there before it vouches for its stored objects again, so whatever a crash lost here is applied
//!   again. History etcd compacted away is not guessed at: everything stored before is banned.
//! - **The lag bound**: a node that cannot show it is current (its watch broken, or silent to progress
//!   requests) for longer than `max_invalidation_lag` stops vouching: the data path then revalidates stored
//!   objects with the origin before serving them.
//! - **Membership**: each node puts its addresses under `<prefix>/members/<node>` with a lease it keeps
//!   alive; a node whose lease lapses leaves every member's list within the lease's TTL. The live list is
//!   the ring self-routing hashes keys onto.
//! - **Trust**: reaching etcd is not enough to join. Member entries and invalidations carry an HMAC under
//!   the cluster secret every node shares, and so do the requests a node forwards to a key's owner;
//!   whatever fails the check is ignored, logged and counted. etcd itself can be reached over TLS with a
//!   client certificate and with a user and password.

mod auth;
mod entry;
mod log;
mod members;
mod ring;

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
        Arc, Mutex, RwLock,
    },
    time::{Duration, Instant},
};

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use http::{request::Parts, HeaderValue};
use lacquer_admin::wire::{ClusterCounters, ClusterMember, ClusterState, ClusterView};
use lacquer_proxy::cluster::{Cluster as DataPath, InvalidateFuture, Invalidation, Peer};
use lacquer_storage::Store;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

pub use auth::Secret;
pub use entry::Entry;

/// Why the cluster could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// An etcd endpoint that is not a URL.
    #[error("cluster.etcd: {0}")]
    Endpoint(String),
    /// The store could not tell which revision of the log it applied last.
    #[error("reading the applied revision: {0}")]
    Store(#[from] lacquer_storage::StoreError),
}

/// What a node needs to join a cluster; [`Settings::new`] documents the defaults.
#[derive(Debug, Clone)]
pub struct Settings {
    /// This node's name, unique in the cluster.
    pub node: String,
    /// etcd's client URLs.
    pub etcd: Vec<String>,
    /// Every key of this cluster lives under it.
    pub prefix: String,
    /// Where peers reach this node's client listener.
    pub advertise: SocketAddr,
    /// Where `cachectl` reaches this node's admin API.
    pub advertise_admin: SocketAddr,
    /// The membership lease: a node that stops leaves the ring within it.
    pub lease_ttl: Duration,
    /// How long this node may be unable to show it has every invalidation before it stops serving stored
    /// objects without revalidating them.
    pub max_invalidation_lag: Duration,
    /// Keys are hashed onto the live members and fetched from their owner.
    pub self_routing: bool,
    /// The secret every member shares: it signs member entries, invalidations and forwarded requests.
    pub secret: Secret,
    /// etcd over TLS (`https://` URLs): the CA its certificate is checked against and this node's
    /// client certificate.
    pub etcd_tls: Option<EtcdTls>,
    /// etcd's user and password, when etcd has authentication enabled.
    pub etcd_user: Option<(String, String)>,
}

/// How this node reaches an etcd that serves TLS.
#[derive(Debug, Clone)]
pub struct EtcdTls {
    /// PEM certificates of the authority etcd's certificate is checked against.
    pub ca: Vec<u8>,
    /// This node's client certificate chain and key (PEM), for an etcd that asks for one.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl Settings {
    /// Settings for `node`, reachable at `advertise` and `advertise_admin`, sharing `secret`, with the
    /// defaults: etcd at `http://127.0.0.1:2379` without TLS or a user, prefix `/lacquer`, a 5 s lease,
    /// a 10 s lag bound, no self-routing.
    pub fn new(
        node: String,
        advertise: SocketAddr,
        advertise_admin: SocketAddr,
        secret: Secret,
    ) -> Self {
        Self {
            node,
            etcd: vec!["http://127.0.0.1:2379".into()],
            prefix: "/lacquer".into(),
            advertise,
            advertise_admin,
            lease_ttl: Duration::from_secs(5),
            max_invalidation_lag: Duration::from_secs(10),
            self_routing: false,
            secret,
            etcd_tls: None,
            etcd_user: None,
        }
    }

    fn log_key(&self) -> String {
        format!("{}/invalidations", self.prefix.trim_end_matches('/'))
    }

    fn members_prefix(&self) -> String {
        format!("{}/members/", self.prefix.trim_end_matches('/'))
    }
}

/// One member as it registers itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Its name.
    pub node: String,
    /// Its client listener.
    pub advertise: SocketAddr,
    /// Its admin API.
    pub advertise_admin: SocketAddr,
}

/// Where this node stands with the cluster's invalidations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Since start, not yet shown to have applied the log up to etcd's present: stored objects are
    /// revalidated.
    CatchingUp,
    /// Current: stored objects are served.
    Serving,
    /// etcd out of reach, but for less than `max_invalidation_lag`: stored objects are still served.
    Disconnected,
    /// Unable to show it is current for longer than `max_invalidation_lag`: stored objects are
    /// revalidated until it has caught up again.
    Lagging,
}

impl NodeState {
    /// The name `GET /v1/cluster` and the logs use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CatchingUp => "catching_up",
            Self::Serving => "serving",
            Self::Disconnected => "disconnected",
            Self::Lagging => "lagging",
        }
    }
}

/// The cluster's counters, since start.
#[derive(Debug, Default)]
pub struct Counters {
    /// Invalidations this node put to the log.
    pub invalidations_sent: AtomicU64,
    /// Entries of the log applied here, whoever sent them.
    pub invalidations_applied: AtomicU64,
    /// Times the history this node needed was compacted away and everything stored before was banned.
    pub compactions: AtomicU64,
    /// Times the watch on the log broke (etcd out of reach, or the stream ended).
    pub watch_breaks: AtomicU64,
    /// Signed entries this node could not read (a newer version's): each bans everything stored.
    pub unreadable_entries: AtomicU64,
    /// Entries of the log or member entries not signed with the cluster secret: ignored.
    pub rejected_entries: AtomicU64,
}

/// This node's membership of the cluster; cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

struct Inner {
    settings: Settings,
    store: Store,
    client: Client,
    /// The newest revision of the log applied here; waiters for an acknowledgement watch it.
    applied: watch::Sender<u64>,
    /// The newest etcd revision this node has heard of.
    seen: AtomicU64,
    /// The newest revision of the log this node knows exists: what it is behind is the difference.
    log_head: AtomicU64,
    currency: Currency,
    members: RwLock<Arc<Vec<Member>>>,
    counters: Counters,
    /// Entries on their way to the log (`log::write` takes them).
    outbox: mpsc::Sender<log::Queued>,
    /// Acknowledgements waiting for their entry to be applied here, by entry id.
    pending: Mutex<HashMap<String, log::Waiter>>,
    /// Entry ids are `<node>-<incarnation>-<n>`: unique across restarts.
    incarnation: u64,
    next_entry: AtomicU64,
    /// This node's membership lease, once granted.
    lease: Mutex<Option<i64>>,
}

/// How far this node can vouch for having every invalidation. Every lookup reads it, so it is two atomics;
/// only the task following the log writes them.
#[derive(Debug)]
struct Currency {
    /// The watch is up and has delivered the log up to etcd's present at least once since (re)connecting.
    connected: AtomicBool,
    /// The last moment this node knew it had applied everything etcd held, in milliseconds after `since`
    /// plus one; 0 until it first caught up after start.
    current_at: AtomicU64,
    since: Instant,
}

impl Currency {
    fn new() -> Self {
        Self {
            connected: AtomicBool::new(false),
            current_at: AtomicU64::new(0),
            since: Instant::now(),
        }
    }

    /// How long ago this node was last current; `None` if never since start.
    fn age(&self) -> Option<Duration> {
        let at = self.current_at.load(Relaxed).checked_sub(1)?;
        let now = self.since.elapsed().as_millis() as u64;
        Some(Duration::from_millis(now.saturating_sub(at)))
    }
}

impl Cluster {
    /// Joins the cluster: connects lazily (an etcd out of reach does not stop the daemon: the node starts
    /// catching up and keeps trying), registers this node, and starts watching the log from the revision
    /// the store last applied. Tasks run on `runtime`.
    pub async fn start(
        settings: Settings,
        store: Store,
        runtime: &tokio::runtime::Handle,
    ) -> Result<Cluster, ClusterError> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            // HTTP/2 pings notice a peer gone silent (a partition) long before TCP would.
            .with_keep_alive(Duration::from_secs(1), Duration::from_secs(2))
            .with_keep_alive_while_idle(true);
        if let Some(tls) = &settings.etcd_tls {
            let mut config = TlsOptions::new().ca_certificate(Certificate::from_pem(&tls.ca));
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(Identity::from_pem(cert, key));
            }
            options = options.with_tls(config);
        }
        // The user is not given here: the client would authenticate at once, and an etcd out of reach
        // must not stop the daemon. Each task authenticates before it talks to etcd (`authenticate`).
        let endpoints = settings.etcd.clone();
        // The channel connects on first use and reconnects by itself.
        let client = Client::connect(endpoints, Some(options))
            .await
            .map_err(|e| ClusterError::Endpoint(e.to_string()))?;
        let applied = store.cluster_revision()?;
        let (outbox, queue) = mpsc::channel(log::QUEUE);
        let cluster = Cluster {
            inner: Arc::new(Inner {
                settings,
                store,
                client,
                applied: watch::Sender::new(applied),
                seen: AtomicU64::new(applied),
                log_head: AtomicU64::new(applied),
                currency: Currency::new(),
                members: RwLock::default(),
                counters: Counters::default(),
                outbox,
                pending: Mutex::default(),
                incarnation: lacquer_clock::now_ms(),
                next_entry: AtomicU64::new(0),
                lease: Mutex::default(),
            }),
        };
        tracing::info!(
            node = %cluster.inner.settings.node,
            applied_revision = applied,
            "cluster: catching up with the invalidation log before serving stored objects"
        );
        runtime.spawn(log::follow(cluster.clone()));
        runtime.spawn(log::checkpoints(cluster.clone()));
        runtime.spawn(log::write(cluster.clone(), queue));
        runtime.spawn(members::register(cluster.clone()));
        runtime.spawn(members::follow(cluster.clone()));
        Ok(cluster)
    }

    /// Gets etcd a token for `cluster.etcd_user`, when there is one: before each (re)connection of a
    /// task, and again when a put is refused, since etcd's tokens expire.
    async fn authenticate(&self) -> Result<(), String> {
        let Some((user, password)) = &self.inner.settings.etcd_user else {
            return Ok(());
        };
        // The token is shared by every clone of the client.
        let mut client = self.inner.client.clone();
        tokio::time::timeout(
            Duration::from_secs(3),
            client.update_user(Some((user.clone(), password.clone()))),
        )
        .await
        .map_err(|_| "etcd did not answer the authentication".to_string())?
        .map_err(|e| format!("cannot authenticate to etcd as {user:?}: {}", describe(&e)))
    }

    /// `error`, with what it most likely means when etcd speaks TLS and the connection was cut short:
    /// a client certificate etcd refuses shows as no more than that.
    fn explain(&self, error: String) -> String {
        // Cut short after connecting: refused with an alert (BadCertificate, CertificateRequired), or
        // closed at once; under TLS 1.3 the client learns it only on its first request.
        let cut_short = error.contains("tonic::transport::Error(Transport")
            && !error.contains("tcp connect error");
        if self.inner.settings.etcd_tls.is_some() && cut_short {
            format!(
                "{error} (etcd closed the TLS connection: does it accept this node's client certificate? \
                 cluster.etcd_cert_file must be signed by a CA in etcd's --trusted-ca-file)"
            )
        } else {
            error
        }
    }

    /// Leaves the ring at once (a clean stop): revokes this node's lease.
    pub async fn leave(&self) {
        members::leave(self).await;
    }

    /// The cluster's counters.
    pub fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    /// The live members, this node included once its registration is seen, sorted by name.
    pub fn members(&self) -> Arc<Vec<Member>> {
        self.inner.members.read().expect("members lock").clone()
    }

    fn state(&self) -> (NodeState, Duration) {
        let currency = &self.inner.currency;
        let Some(since) = currency.age() else {
            return (NodeState::CatchingUp, Duration::ZERO);
        };
        let state = if since > self.inner.settings.max_invalidation_lag {
            NodeState::Lagging
        } else if currency.connected.load(Relaxed) {
            NodeState::Serving
        } else {
            NodeState::Disconnected
        };
        // Progress is asked for every second: less than that is not lag.
        let lag = if since > Duration::from_millis(1500) {
            since
        } else {
            Duration::ZERO
        };
        (state, lag)
    }

    fn mark_current(&self) {
        let was = self.state().0 == NodeState::Serving;
        let currency = &self.inner.currency;
        let now = currency.since.elapsed().as_millis() as u64 + 1;
        currency.current_at.store(now, Relaxed);
        currency.connected.store(true, Relaxed);
        if !was {
            tracing::info!(
                applied_revision = *self.inner.applied.borrow(),
                "cluster: current with the invalidation log; serving stored objects"
            );
        }
    }

    /// Whether it was connected until now.
    fn mark_disconnected(&self) -> bool {
        self.inner.currency.connected.swap(false, Relaxed)
    }
}

impl DataPath for Cluster {
    fn vouched(&self) -> bool {
        matches!(self.state().0, NodeState::Serving | NodeState::Disconnected)
    }

    fn invalidate(&self, inv: Invalidation) -> InvalidateFuture<'_> {
        Box::pin(log::submit(self, inv))
    }

    fn owner(&self, key: &str) -> Option<Peer> {
        if !self.inner.settings.self_routing {
            return None;
        }
        let members = self.members();
        let owner = ring::owner(&members, key)?;
        (owner.node != self.inner.settings.node).then(|| Peer {
            node: owner.node.clone(),
            addr: owner.advertise,
        })
    }

    fn forward_proof(&self, parts: &Parts) -> HeaderValue {
        let settings = &self.inner.settings;
        settings
            .secret
            .forward_proof(&settings.node, parts, lacquer_clock::now_ms())
    }

    fn forwarded_by_member(&self, by: &HeaderValue, proof: &HeaderValue, parts: &Parts) -> bool {
        by.to_str().is_ok_and(|node| {
            node != self.inner.settings.node
                && self.inner.settings.secret.verify_forward(
                    node,
                    proof,
                    parts,
                    lacquer_clock::now_ms(),
                )
        })
    }

    fn node(&self) -> &str {
        &self.inner.settings.node
    }

    fn view(&self) -> ClusterView {
        let (state, lag) = self.state();
        let inner = &self.inner;
        let applied = *inner.applied.borrow();
        let seen = inner.seen.load(Relaxed).max(applied);
        let c = &inner.counters;
        ClusterView {
            node: inner.settings.node.clone(),
            state: match state {
                NodeState::CatchingUp => ClusterState::CatchingUp,
                NodeState::Serving => ClusterState::Serving,
                NodeState::Disconnected => ClusterState::Disconnected,
                NodeState::Lagging => ClusterState::Lagging,
            },
            applied_revision: applied,
            seen_revision: seen,
            lag_revisions: inner.log_head.load(Relaxed).saturating_sub(applied),
            lag_seconds: lag.as_secs_f64(),
            self_routing: inner.settings.self_routing,
            members: self
                .members()
                .iter()
                .map(|m| ClusterMember {
                    node: m.node.clone(),
                    advertise: m.advertise.to_string(),
                    advertise_admin: m.advertise_admin.to_string(),
                    this: m.node == inner.settings.node,
                })
                .collect(),
            counters: ClusterCounters {
                invalidations_sent: c.invalidations_sent.load(Relaxed),
                invalidations_applied: c.invalidations_applied.load(Relaxed),
                compactions: c.compactions.load(Relaxed),
                watch_breaks: c.watch_breaks.load(Relaxed),
                rejected_entries: c.rejected_entries.load(Relaxed),
                ..ClusterCounters::default()
            },
        }
    }
}

/// An etcd error with its causes: a TLS handshake refused, say, shows as more than "transport error".
pub(crate) fn describe(e: &etcd_client::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let line = cause.to_string();
        if !text.contains(&line) {
            text = format!("{text}: {line}");
        }
        source = std::error::Error::source(cause);
    }
    text
}
