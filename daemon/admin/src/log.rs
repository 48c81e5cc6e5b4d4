//! `GET /v1/log/stream`: the access log, live, as JSON records.

use std::{convert::Infallible, sync::Arc};

use axum::{
    extract::State,
    response::sse::{Event, KeepAlive, Sse},
};
use futures_util::{stream, Stream};
use lacquer_admin::wire::{ApiError, LogEntry, LogFilter};
use tokio::sync::broadcast::error::RecvError;

use super::{AdminError, AdminState, ApiQuery};

/// Every request as it completes, as server-sent events named `log` whose data is a log record, filtered
/// by URL, host, client and status, with every step the data path took when `trace=true`; `lagged` (with the number of records missed) when the client reads too slowly to
/// keep up. Works whether or not the access log file is on; ends when the daemon stops.
#[utoipa::path(get, path = "/v1/log/stream", tag = "status", security(("secret" = [])),
    params(LogFilter),
    responses(
        (status = 200, description = "`event: log` with a record as `data`, per request", content_type = "text/event-stream", body = LogEntry),
        (status = 400, description = "`invalid_query`: a status that is neither `404` nor `4xx`", body = ApiError),
        (status = 401, description = "Missing or wrong secret", body = ApiError),
    ))]
pub async fn stream(
    State(state): State<AdminState>,
    ApiQuery(filter): ApiQuery<LogFilter>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, AdminError> {
    let status = filter
        .status
        .as_deref()
        .map(StatusFilter::parse)
        .transpose()
        .map_err(|()| {
            AdminError::InvalidQuery(
                "status: a status such as 404, or a class such as 5xx".to_owned(),
            )
        })?;
    let tracing = filter.trace == Some(true);
    let (records, guard) = if tracing {
        let (records, guard) = state.shared.access_log.follow_traced();
        (records, Some(guard))
    } else {
        (state.shared.access_log.follow(), None)
    };
    let wanted = Arc::new(Wanted {
        url: filter.url,
        host: filter.host,
        client: filter.client,
        status,
    });
    let events = stream::unfold(
        (records, state.stopping.clone(), guard),
        move |(mut records, mut stopping, guard)| {
            let wanted = wanted.clone();
            async move {
                loop {
                    let record = tokio::select! {
                        r = records.recv() => r,
                        _ = stopping.wait_for(|s| *s) => return None,
                    };
                    let event = match record {
                        Ok(entry) if wanted.matches(&entry) => {
                            let event = Event::default().event("log");
                            // Another follower's trace is not this one's to carry.
                            if !tracing && !entry.steps.is_empty() {
                                let plain = LogEntry {
                                    steps: Vec::new(),
                                    request_headers: Vec::new(),
                                    response_headers: Vec::new(),
                                    ..(*entry).clone()
                                };
                                event.json_data(&plain)
                            } else {
                                event.json_data(&*entry)
                            }
                            .expect("records serialize")
                        }
                        Ok(_) => continue,
                        Err(RecvError::Lagged(missed)) => Event::default()
                            .event("lagged")
                            .data(format!("{{\"missed\":{missed}}}")),
                        Err(RecvError::Closed) => return None,
                    };
                    return Some((Ok::<_, Infallible>(event), (records, stopping, guard)));
                }
            }
        },
    );
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StatusFilter {
    Exact(u16),
    Class(u16),
}

impl StatusFilter {
    fn parse(s: &str) -> Result<Self, ()> {
        match s.as_bytes() {
            [c, b'x', b'x'] if (b'1'..=b'5').contains(c) => Ok(Self::Class(u16::from(c - b'0'))),
            _ => s
                .parse::<u16>()
                .ok()
                .filter(|n| (100..=599).contains(n))
                .map(Self::Exact)
                .ok_or(()),
        }
    }
}

/// Which records a stream sends ([`LogFilter`]).
struct Wanted {
    url: Option<String>,
    host: Option<String>,
    client: Option<String>,
    status: Option<StatusFilter>,
}

impl Wanted {
    fn matches(&self, entry: &LogEntry) -> bool {
        self.url.as_deref().is_none_or(|u| entry.url.contains(u))
            && self.host.as_deref().is_none_or(|h| {
                entry
                    .host
                    .as_deref()
                    .is_some_and(|host| host.to_ascii_lowercase().contains(&h.to_ascii_lowercase()))
            })
            && self.client.as_deref().is_none_or(|c| entry.client == c)
            && self.status.is_none_or(|s| match s {
                StatusFilter::Exact(n) => entry.status == n,
                StatusFilter::Class(c) => entry.status / 100 == c,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_filters() {
        assert_eq!(StatusFilter::parse("404"), Ok(StatusFilter::Exact(404)));
        assert_eq!(StatusFilter::parse("5xx"), Ok(StatusFilter::Class(5)));
        for bad in ["6xx", "99", "abc", "xx", ""] {
            assert!(StatusFilter::parse(bad).is_err(), "{bad}");
        }
    }
}
