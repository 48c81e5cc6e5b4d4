//! `GET /v1/backends`: the origins and how their requests have been going.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BackendList {
    pub backends: Vec<BackendView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BackendView {
    pub name: String,
    /// `host:port`.
    pub address: String,
    /// Judged from real traffic (there are no probes yet).
    pub health: BackendHealth,
    pub requests: u64,
    pub errors: u64,
    /// Failed requests since the last success.
    pub consecutive_failures: u64,
    /// Unix seconds of the last successful response head.
    pub last_success: Option<u64>,
    pub last_error: Option<LastError>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BackendHealth {
    /// No request has been sent yet.
    Unknown,
    /// The last request got a response.
    Healthy,
    /// The last request failed (refused, reset, timed out).
    Failing,
}

impl BackendHealth {
    /// As in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendHealth::Unknown => "unknown",
            BackendHealth::Healthy => "healthy",
            BackendHealth::Failing => "failing",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LastError {
    /// Unix seconds.
    pub at: u64,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_names_match_the_wire() {
        for h in [
            BackendHealth::Unknown,
            BackendHealth::Healthy,
            BackendHealth::Failing,
        ] {
            assert_eq!(serde_json::to_value(h).unwrap(), h.as_str());
        }
    }
}
