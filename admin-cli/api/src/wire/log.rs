//! `GET /v1/log/stream`: every request as it completes, the access log's fields as JSON.

use chrono::{Local, TimeZone};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::HeaderField;

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
    /// Why, beside `cache`: the `detail` of the response's `Cache-Status` (`no-store`, `private`,
    /// `backend-error`, `stale-while-revalidate`…; docs/configuration.md, "What every response carries").
    #[serde(default)]
    pub detail: Option<String>,
    /// Seconds from the request's arrival to its response head.
    pub ttfb: f64,
    /// Seconds from the request's arrival to its last body byte (or to the client going away).
    pub duration: f64,
    /// The backend the request was sent to (a director's member); none for a hit, a request that waited
    /// on another's fetch, or one answered at the edge.
    #[serde(default)]
    pub backend: Option<String>,
    /// The route taken, `route[N]` or `default`; none for a request refused before routing.
    #[serde(default)]
    pub route: Option<String>,
    /// Every request header as the client sent it: only in the records of a stream that asked for the
    /// steps (`trace=true`), empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub request_headers: Vec<HeaderField>,
    /// Every response header as the client got it: only in traced records, as `request_headers`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub response_headers: Vec<HeaderField>,
    /// Every step the data path took for the request, in order: only in the records of a stream that asked
    /// for them (`trace=true`, what `cachectl trace` shows), empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<TraceStep>,
}

/// One step of a traced request, as `varnishlog` shows a tag and its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TraceStep {
    /// Microseconds from the request's arrival.
    pub at_us: u64,
    /// What happened: `Route`, `Class`, `Key`, `Lookup`, `Join`, `Backend`, `Fetch`, `Store`, `Stale`,
    /// `Revalidate`, `Error`.
    pub tag: String,
    /// Its particulars, one line for a person.
    pub detail: String,
}

impl LogEntry {
    /// `%h %l %u %t "%r" %>s %b "%{Referer}i" "%{User-agent}i"` (NCSA combined, local time, the request
    /// line with the full URL as varnishncsa writes it), then the cache result, time to first byte and total
    /// time in seconds, and the cache result's detail (`-` when none): `access_log.format = "default"`, which
    /// lacquerd's own tests hold to this line.
    pub fn ncsa_line(&self) -> String {
        let e = self;
        let time = Local
            .timestamp_millis_opt(e.time_ms as i64)
            .single()
            .map_or_else(
                || "-".into(),
                |t| t.format("%d/%b/%Y:%H:%M:%S %z").to_string(),
            );
        let bytes = if e.bytes == 0 {
            "-".to_owned()
        } else {
            e.bytes.to_string()
        };
        let quoted = |v: &Option<String>| v.as_deref().map_or_else(|| "-".into(), escape);
        let url = match &e.host {
            Some(host) => format!("http://{}{}", escape(host), escape(&e.url)),
            None => escape(&e.url),
        };
        format!(
            "{} - - [{time}] \"{} {url} {}\" {} {bytes} \"{}\" \"{}\" {} {:.6} {:.6} {}\n",
            escape(&e.client),
            escape(&e.method),
            escape(&e.protocol),
            e.status,
            quoted(&e.referer),
            quoted(&e.user_agent),
            escape(&e.cache),
            e.ttfb,
            e.duration,
            e.detail.as_deref().map_or_else(|| "-".into(), escape),
        )
    }
}

/// As NGINX does: quotes, backslashes and control bytes as `\xHH`, so a client cannot forge fields or lines.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '"' || c == '\\' || c.is_control() {
            for b in c.to_string().bytes() {
                out.push_str(&format!("\\x{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Which requests the stream sends: all given conditions must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LogFilter {
    /// Only URLs (path and query) containing this.
    pub url: Option<String>,
    /// Only this status, or a class such as `5xx`.
    pub status: Option<String>,
    /// Only hosts containing this.
    pub host: Option<String>,
    /// Only this client address.
    pub client: Option<String>,
    /// Each record with the steps the data path took (`steps`). Tracing costs the traced requests a
    /// little; it stops when the last tracing stream closes.
    pub trace: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_is_ncsa_combined_with_cache_fields_and_cannot_be_forged() {
        let entry = LogEntry {
            time_ms: 1_796_016_974_123,
            client: "203.0.113.7".into(),
            method: "GET".into(),
            url: "/a?b=1".into(),
            host: Some("example.com".into()),
            protocol: "HTTP/1.1".into(),
            status: 200,
            bytes: 2048,
            referer: None,
            user_agent: Some("evil\" \"injected\n203.0.113.9 - - [".into()),
            cache: "MISS".into(),
            detail: Some("no-store".into()),
            ttfb: 0.000123,
            duration: 0.0045,
            backend: Some("app1".into()),
            route: None,
            request_headers: Vec::new(),
            response_headers: Vec::new(),
            steps: Vec::new(),
        };
        let line = entry.ncsa_line();
        let time = Local
            .timestamp_millis_opt(entry.time_ms as i64)
            .unwrap()
            .format("%d/%b/%Y:%H:%M:%S %z");
        assert_eq!(
            line,
            format!(
                "203.0.113.7 - - [{time}] \"GET http://example.com/a?b=1 HTTP/1.1\" 200 2048 \"-\" \
                 \"evil\\x22 \\x22injected\\x0A203.0.113.9 - - [\" MISS 0.000123 0.004500 no-store\n"
            )
        );
        assert_eq!(line.matches('\n').count(), 1);
        let empty = LogEntry {
            bytes: 0,
            status: 304,
            host: None,
            ..entry
        };
        assert!(empty
            .ncsa_line()
            .contains("\"GET /a?b=1 HTTP/1.1\" 304 - \""));
    }
}
