//! What every admin route takes and returns. `lacquerd`'s handlers serve these types, `cachectl` and
//! `cachetop` read them, and the OpenAPI document is generated from them.

mod backends;
mod certificates;
mod cluster;
mod explain;
mod invalidation;
mod latency;
mod log;
mod objects;
mod reload;
mod stats;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use backends::{
    BackendAdmin, BackendHealth, BackendList, BackendView, LastError, ProbeView, SetBackendHealth,
};
pub use certificates::{CertificateList, CertificateView, HeldCertificate};
pub use cluster::{ClusterCounters, ClusterMember, ClusterState, ClusterView};
pub use explain::{ExplainRequest, ExplainedObject, ExplainedResponse, Explanation, RuleStep};
pub use invalidation::{BanList, BanView, NewBan, PurgeTags, PurgeUrl, Purged};
pub use latency::{
    Histogram, Latency, OutcomeLatency, StatusCounts, LATENCY_BOUNDS_US, LATENCY_BUCKETS, OUTCOMES,
};
pub use log::{LogEntry, LogFilter, TraceStep};
pub use objects::{
    EsiInclude, HeaderField, Inspection, NotStoredNote, ObjectQuery, Representation, StoredPart,
    StoredVariant, Tiers,
};
pub use reload::{NotApplied, Reloaded};
pub use stats::{
    Field, Kind, ListenerCounters, ListenerStats, ProxyStats, RuleMatches, Stats, StoreStats,
    FAMILY_HELP, LISTENER_FAMILY_HELP, LISTENER_LABEL, RULE_MATCHES_HELP, RULE_MATCHES_METRIC,
};

/// `GET /v1/health`: answered without the secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok`, or `degraded` when the daemon serves but something is wrong (see `problems`): a full disk, a
    /// store that was damaged at start or cannot be used, a store task that died.
    pub status: String,
    pub version: String,
    pub uptime_seconds: u64,
    /// What is wrong, one sentence each; empty when the status is `ok`.
    #[serde(default)]
    pub problems: Vec<String>,
}

/// Every error the admin API returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiError {
    /// Stable, for scripts: `unauthorized`, `not_found`, `method_not_allowed`, `invalid_body`,
    /// `body_too_large`, `invalid_query`, `invalid_ban`, `invalid_url`, `missing_host`, `invalid_host`, `no_tags`,
    /// `invalid_tag`, `too_many_tags`, `invalid_config`, `invalid_request` (`POST /v1/explain` of a request no
    /// client could send), `store_error`, `cluster_disabled` (`GET /v1/cluster` on a single node), `unknown_backend`.
    pub code: String,
    /// One line for a person.
    pub message: String,
}
