//! `GET /v1/log/stream`: every request as it completes, the access log's fields as JSON.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// One completed request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LogEntry {
    /// Unix milliseconds when the request arrived.
    pub time_ms: u64,
    /// The client address (the PROXY protocol's client where a listener expects it).
    pub client: String,
    pub method: String,
    /// Path and query, as received.
    pub url: String,
    pub host: Option<String>,
    /// `HTTP/1.1`, `HTTP/2.0`.
    pub protocol: String,
    pub status: u16,
    /// Body bytes sent to the client.
    pub bytes: u64,
    pub referer: Option<String>,
    pub user_agent: Option<String>,
    /// `HIT`, `MISS`, `PASS`, `STALE`, or `-` when the request went no further than the edge (refused,
    /// denied, rate limited).
    pub cache: String,
    /// Seconds from the request's arrival to its response head.
    pub ttfb: f64,
    /// Seconds from the request's arrival to its last body byte (or to the client going away).
    pub duration: f64,
}

/// Which requests the stream sends: all given conditions must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LogFilter {
    /// Only URLs (path and query) containing this.
    pub url: Option<String>,
    /// Only this status, or a class such as `5xx`.
    pub status: Option<String>,
}
