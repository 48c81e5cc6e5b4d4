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
    /// What routing goes by: the operator's `admin` state when it is forced, else the probe's verdict
    /// when there is a probe, else judged from real traffic.
    pub health: BackendHealth,
    /// Forced by the operator (`PUT /v1/backends/{name}/health`), or `auto`.
    #[serde(default)]
    pub admin: BackendAdmin,
    pub requests: u64,
    pub errors: u64,
    /// Failed requests since the last success.
    pub consecutive_failures: u64,
    /// Unix seconds of the last successful response head.
    pub last_success: Option<u64>,
    pub last_error: Option<LastError>,
    /// The health probe's window; none when the backend has no probe.
    #[serde(default)]
    pub probe: Option<ProbeView>,
    /// Connections opened to the backend since start (every worker's pool and upgrade connections; not
    /// the probe's). With `protocol = "h2"` or `"h2c"`, about one per worker thread unless the origin
    /// closes them.
    #[serde(default)]
    pub connections: u64,
    /// HTTP/2 streams the backend reset (`RST_STREAM`) or cut off with a `GOAWAY` before they ended.
    #[serde(default)]
    pub streams_reset: u64,
    /// The backend's answers by status code (its response heads; failures without one are `errors`).
    #[serde(default)]
    pub responses: super::StatusCounts,
    /// From sending a request to the backend's response head (`ttfb`) and to the end of its body
    /// (`total`; bodies nobody read to the end are left out).
    #[serde(default)]
    pub latency: super::Latency,
}

/// A probe's recent polls, as `varnishadm backend.list -p` shows them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ProbeView {
    pub healthy: bool,
    /// Good polls in the window.
    pub good: u32,
    pub window: u32,
    /// Good polls needed to be healthy.
    pub threshold: u32,
    /// Oldest first: `H` a good poll, `-` a bad one.
    pub history: String,
    /// What the last poll got: a status, or why there was none.
    pub last: Option<String>,
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
    /// Its probe says so: it gets no requests until the probe says healthy again.
    Sick,
}

impl BackendHealth {
    /// As in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendHealth::Unknown => "unknown",
            BackendHealth::Healthy => "healthy",
            BackendHealth::Failing => "failing",
            BackendHealth::Sick => "sick",
        }
    }
}

/// Who decides a backend's health, as Varnish's `backend.set_health` sets it: kept until set again or
/// until lacquerd restarts, and across a reload that keeps a backend of the same name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BackendAdmin {
    /// The probe, or real traffic when there is no probe.
    #[default]
    Auto,
    /// Drained: no requests, whatever the probe says.
    Sick,
    /// Requests, whatever the probe says.
    Healthy,
}

impl BackendAdmin {
    /// As in JSON and on `cachectl backend`'s command line.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendAdmin::Auto => "auto",
            BackendAdmin::Sick => "sick",
            BackendAdmin::Healthy => "healthy",
        }
    }
}

/// `PUT /v1/backends/{name}/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetBackendHealth {
    pub health: BackendAdmin,
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
            BackendHealth::Sick,
        ] {
            assert_eq!(serde_json::to_value(h).unwrap(), h.as_str());
        }
        for a in [
            BackendAdmin::Auto,
            BackendAdmin::Sick,
            BackendAdmin::Healthy,
        ] {
            assert_eq!(serde_json::to_value(a).unwrap(), a.as_str());
        }
    }
}
