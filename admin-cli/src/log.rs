//! `cachectl log` and `cachectl trace`: requests as they complete, as access log lines or every step the
//! daemon took (or JSON records), until interrupted.

use std::time::Duration;

use lacquer_admin::{
    wire::{HeaderField, LogEntry, LogFilter},
    AdminClient, AdminError, LogEvent, LogStream,
};

use crate::{query::Query, Output};

/// The longest wait between two attempts to reach a daemon that went away.
const MOST_BETWEEN_ATTEMPTS: Duration = Duration::from_secs(5);

/// How `cachectl trace` shows requests: which (`-q`), and whether with their headers.
pub struct Traced {
    pub query: Option<Query>,
    pub headers: bool,
}

pub async fn follow(
    client: &AdminClient,
    out: Output,
    filter: LogFilter,
    traced: Option<Traced>,
) -> Result<(), AdminError> {
    let mut stream = client.log_stream(&filter).await?;
    loop {
        match (stream.next().await, &traced) {
            (Ok(LogEvent::Entry(entry)), Some(view)) => {
                if view.query.as_ref().is_none_or(|q| q.matches(&entry)) {
                    out.show(&*entry, |e| trace_lines(e, view.headers));
                }
            }
            (Ok(LogEvent::Entry(entry)), None) => out.show(&*entry, |e| e.ncsa_line()),
            (Ok(LogEvent::Lagged(missed)), _) => {
                eprintln!("cachectl: {missed} requests went by unshown (reading too slowly)")
            }
            // A restart or an upgrade of the daemon is no reason to stop watching it, as varnishlog does not.
            (Err(AdminError::Unreachable { addr, reason }), _) => {
                eprintln!("cachectl: lost the daemon at {addr} ({reason}); reconnecting");
                stream = reconnect(client, &filter).await?;
                eprintln!("cachectl: reconnected to {addr}; requests in between are not shown");
            }
            (Err(e), _) => return Err(e),
        }
    }
}

/// The log stream again once the daemon answers, trying ever less often; any answer but an unreachable
/// daemon (a new secret, say) ends the wait with its error.
async fn reconnect(client: &AdminClient, filter: &LogFilter) -> Result<LogStream, AdminError> {
    let mut wait = Duration::from_millis(200);
    loop {
        tokio::time::sleep(wait).await;
        match client.log_stream(filter).await {
            Ok(stream) => return Ok(stream),
            Err(AdminError::Unreachable { .. }) => wait = (wait * 2).min(MOST_BETWEEN_ATTEMPTS),
            Err(e) => return Err(e),
        }
    }
}

/// A traced request as `varnishlog` groups one: a line saying which request, a line per step with the
/// time since its arrival, then how it was answered.
fn trace_lines(e: &LogEntry, headers: bool) -> String {
    let url = match &e.host {
        Some(host) => format!("http://{host}{}", e.url),
        None => e.url.clone(),
    };
    let mut out = format!("* {} {url} {} from {}\n", e.method, e.protocol, e.client);
    let step = |out: &mut String, at_us: u64, tag: &str, detail: &str| {
        out.push_str(&format!(
            "- {:>9.3} ms  {tag:<9} {detail}\n",
            at_us as f64 / 1e3
        ));
    };
    let fields = |out: &mut String, tag: &str, fields: &[HeaderField]| {
        for f in fields {
            out.push_str(&format!(
                "-               {tag:<9} {}: {}\n",
                f.name, f.value
            ));
        }
    };
    if headers {
        fields(&mut out, "ReqHeader", &e.request_headers);
    }
    for s in &e.steps {
        step(&mut out, s.at_us, &s.tag, &s.detail);
    }
    let detail = e
        .detail
        .as_deref()
        .map_or_else(String::new, |d| format!(" ({d})"));
    step(
        &mut out,
        (e.ttfb * 1e6) as u64,
        "Response",
        &format!("{} {}{detail}", e.status, e.cache),
    );
    if headers {
        fields(&mut out, "RespHeader", &e.response_headers);
    }
    step(
        &mut out,
        (e.duration * 1e6) as u64,
        "End",
        &format!("{} body bytes", e.bytes),
    );
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use lacquer_admin::wire::TraceStep;

    use super::*;

    #[test]
    fn a_trace_reads_as_steps_in_time_order() {
        let entry = LogEntry {
            time_ms: 0,
            client: "127.0.0.1".into(),
            method: "GET".into(),
            url: "/a".into(),
            host: Some("example.com".into()),
            protocol: "HTTP/1.1".into(),
            status: 200,
            bytes: 4,
            referer: None,
            user_agent: None,
            cache: "MISS".into(),
            detail: Some("stored".into()),
            ttfb: 0.0021,
            duration: 0.0025,
            backend: Some("default".into()),
            route: Some("default".into()),
            request_headers: vec![HeaderField {
                name: "user-agent".into(),
                value: "curl/8.0".into(),
            }],
            response_headers: vec![HeaderField {
                name: "content-type".into(),
                value: "text/plain".into(),
            }],
            steps: vec![TraceStep {
                at_us: 120,
                tag: "Lookup".into(),
                detail: "nothing stored for this variant".into(),
            }],
        };
        assert_eq!(
            trace_lines(&entry, false),
            "* GET http://example.com/a HTTP/1.1 from 127.0.0.1\n\
             -     0.120 ms  Lookup    nothing stored for this variant\n\
             -     2.100 ms  Response  200 MISS (stored)\n\
             -     2.500 ms  End       4 body bytes\n\n"
        );
        assert_eq!(
            trace_lines(&entry, true),
            "* GET http://example.com/a HTTP/1.1 from 127.0.0.1\n\
             -               ReqHeader user-agent: curl/8.0\n\
             -     0.120 ms  Lookup    nothing stored for this variant\n\
             -     2.100 ms  Response  200 MISS (stored)\n\
             -               RespHeader content-type: text/plain\n\
             -     2.500 ms  End       4 body bytes\n\n"
        );
    }
}
