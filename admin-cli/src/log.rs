//! `cachectl log`: requests as they complete, as access log lines or JSON records, until interrupted.

use std::time::Duration;

use lacquer_admin::{wire::LogFilter, AdminClient, AdminError, LogEvent, LogStream};

use crate::Output;

/// The longest wait between two attempts to reach a daemon that went away.
const MOST_BETWEEN_ATTEMPTS: Duration = Duration::from_secs(5);

pub async fn follow(
    client: &AdminClient,
    out: Output,
    filter: LogFilter,
) -> Result<(), AdminError> {
    let mut stream = client.log_stream(&filter).await?;
    loop {
        match stream.next().await {
            Ok(LogEvent::Entry(entry)) => out.show(&*entry, |e| e.ncsa_line()),
            Ok(LogEvent::Lagged(missed)) => {
                eprintln!("cachectl: {missed} requests went by unshown (reading too slowly)")
            }
            // A restart or an upgrade of the daemon is no reason to stop watching it, as varnishlog does not.
            Err(AdminError::Unreachable { addr, reason }) => {
                eprintln!("cachectl: lost the daemon at {addr} ({reason}); reconnecting");
                stream = reconnect(client, &filter).await?;
                eprintln!("cachectl: reconnected to {addr}; requests in between are not shown");
            }
            Err(e) => return Err(e),
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
