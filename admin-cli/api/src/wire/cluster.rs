//! `GET /v1/cluster`: this node's place in the cluster: its state, how far it is behind the invalidation
//! log, the live members, and the cluster's counters. A single node (no `[cluster]` section) answers 404
//! `cluster_disabled`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ClusterView {
    /// This node's name, unique in the cluster.
    pub node: String,
    pub state: ClusterState,
    /// The last etcd revision of the invalidation log applied here (persisted in the store).
    pub applied_revision: u64,
    /// The newest etcd revision of the invalidation log this node has heard of.
    pub seen_revision: u64,
    /// Invalidations seen but not yet applied (0 when caught up).
    pub lag_revisions: u64,
    /// How long this node has been unable to vouch for being current (0 while connected).
    pub lag_seconds: f64,
    /// Whether this node hashes keys onto the live members and fetches from the owner.
    pub self_routing: bool,
    /// The live members (whose lease is held), this node among them.
    pub members: Vec<ClusterMember>,
    pub counters: ClusterCounters,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClusterState {
    /// Caught up with the invalidation log and watching it: hits are served.
    Serving,
    /// Starting: the backlog of invalidations is not applied yet.
    CatchingUp,
    /// The watch has been broken longer than `max_invalidation_lag`: hits are revalidated with the origin.
    Lagging,
    /// etcd cannot be reached, still within `max_invalidation_lag`.
    Disconnected,
}

impl ClusterState {
    /// As in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterState::Serving => "serving",
            ClusterState::CatchingUp => "catching_up",
            ClusterState::Lagging => "lagging",
            ClusterState::Disconnected => "disconnected",
        }
    }
}

/// A live member, as registered under `<prefix>/members/<node>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClusterMember {
    pub node: String,
    /// `host:port` where peers reach its client listener.
    pub advertise: String,
    /// `host:port` where `cachectl` reaches its admin API.
    pub advertise_admin: String,
    /// Whether this member is the node that answered.
    pub this: bool,
}

/// Counted since this node started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClusterCounters {
    /// Invalidations this node appended to the log (bans, purges, tag purges it took).
    pub invalidations_sent: u64,
    /// Log entries applied to this node's store.
    pub invalidations_applied: u64,
    /// Times the history this node needed had been compacted away, so what it stored before was
    /// invalidated or revalidated.
    pub compactions: u64,
    /// Times the watch on the log broke.
    pub watch_breaks: u64,
    /// Hits revalidated with the origin because this node was lagging.
    pub hits_revalidated_for_lag: u64,
    /// Requests this node fetched from the key's owner (self-routing).
    pub peer_fetches: u64,
    /// Fetches from an owner that failed.
    pub peer_failures: u64,
    /// Requests a peer forwarded to this node, as the key's owner.
    pub forwarded_in: u64,
    /// Member entries and log entries in etcd not signed with the cluster secret: ignored. Absent from
    /// nodes older than it.
    #[serde(default)]
    pub rejected_entries: u64,
}

impl ClusterCounters {
    /// Every counter by its JSON name, in document order.
    pub fn values(&self) -> [(&'static str, u64); 9] {
        [
            ("invalidations_sent", self.invalidations_sent),
            ("invalidations_applied", self.invalidations_applied),
            ("compactions", self.compactions),
            ("watch_breaks", self.watch_breaks),
            ("hits_revalidated_for_lag", self.hits_revalidated_for_lag),
            ("peer_fetches", self.peer_fetches),
            ("peer_failures", self.peer_failures),
            ("forwarded_in", self.forwarded_in),
            ("rejected_entries", self.rejected_entries),
        ]
    }

    /// Adds `other`'s counters to these.
    pub fn add(&mut self, other: &ClusterCounters) {
        let Self {
            invalidations_sent,
            invalidations_applied,
            compactions,
            watch_breaks,
            hits_revalidated_for_lag,
            peer_fetches,
            peer_failures,
            forwarded_in,
            rejected_entries,
        } = other;
        // Destructured, so a counter added to the struct and not here does not compile.
        for (sum, add) in [
            (&mut self.invalidations_sent, invalidations_sent),
            (&mut self.invalidations_applied, invalidations_applied),
            (&mut self.compactions, compactions),
            (&mut self.watch_breaks, watch_breaks),
            (&mut self.hits_revalidated_for_lag, hits_revalidated_for_lag),
            (&mut self.peer_fetches, peer_fetches),
            (&mut self.peer_failures, peer_failures),
            (&mut self.forwarded_in, forwarded_in),
            (&mut self.rejected_entries, rejected_entries),
        ] {
            *sum = sum.saturating_add(*add);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The contract's example document, as `lacquerd` sends it.
    const EXAMPLE: &str = r#"{
        "node": "n1",
        "state": "catching_up",
        "applied_revision": 1234,
        "seen_revision": 1240,
        "lag_revisions": 6,
        "lag_seconds": 0.0,
        "self_routing": false,
        "members": [
            {"node": "n1", "advertise": "127.0.0.2:8080", "advertise_admin": "127.0.0.2:8081", "this": true},
            {"node": "n2", "advertise": "127.0.0.3:8080", "advertise_admin": "127.0.0.3:8081", "this": false}
        ],
        "counters": {"invalidations_sent": 1, "invalidations_applied": 2, "compactions": 3, "watch_breaks": 4,
                     "hits_revalidated_for_lag": 5, "peer_fetches": 6, "peer_failures": 7, "forwarded_in": 8,
                     "rejected_entries": 9}
    }"#;

    #[test]
    fn the_contract_document_reads_and_writes_back_the_same() {
        let view: ClusterView = serde_json::from_str(EXAMPLE).unwrap();
        assert_eq!(view.state, ClusterState::CatchingUp);
        assert_eq!(view.lag_revisions, 6);
        assert_eq!(view.members[1].advertise_admin, "127.0.0.3:8081");
        assert!(view.members[0].this);
        assert_eq!(view.counters.forwarded_in, 8);
        let written = serde_json::to_value(&view).unwrap();
        let example: serde_json::Value = serde_json::from_str(EXAMPLE).unwrap();
        assert_eq!(written, example);
        let names: Vec<&str> = view.counters.values().iter().map(|(n, _)| *n).collect();
        let wire: Vec<&str> = example["counters"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(names, wire, "values() lists every counter by its name");
        let values: Vec<u64> = view.counters.values().iter().map(|(_, v)| *v).collect();
        assert_eq!(values, [1, 2, 3, 4, 5, 6, 7, 8, 9]);
    }

    #[test]
    fn state_names_match_the_wire() {
        for s in [
            ClusterState::Serving,
            ClusterState::CatchingUp,
            ClusterState::Lagging,
            ClusterState::Disconnected,
        ] {
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
    }

    #[test]
    fn counters_add_up_one_by_one() {
        let example: ClusterView = serde_json::from_str(EXAMPLE).unwrap();
        let mut sum = example.counters.clone();
        sum.add(&example.counters);
        sum.add(&ClusterCounters {
            compactions: u64::MAX,
            ..Default::default()
        });
        let values: Vec<u64> = sum.values().iter().map(|(_, v)| *v).collect();
        assert_eq!(values, [2, 4, u64::MAX, 8, 10, 12, 14, 16, 18]);
    }
}
