//! `POST /v1/reload` (and `SIGHUP`): read the configuration file again.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What a reload changed. A configuration that does not load changes nothing and is answered 400.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Reloaded {
    /// The file read; none when the daemon runs on flags and defaults alone.
    pub config_file: Option<String>,
    /// Settings now in effect, e.g. `cache.default_ttl`.
    pub applied: Vec<String>,
    /// Settings that changed in the file but not in the running daemon, and why.
    pub not_applied: Vec<NotApplied>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NotApplied {
    pub setting: String,
    /// e.g. `takes effect on restart`.
    pub reason: String,
}
