//! `cachectl log`: requests as they complete, as access log lines or JSON records, until interrupted.

use lacquer_admin::{wire::LogFilter, AdminClient, AdminError, LogEvent};

use crate::Output;

pub async fn follow(
    client: &AdminClient,
    out: Output,
    filter: LogFilter,
) -> Result<(), AdminError> {
    let mut stream = client.log_stream(&filter).await?;
    loop {
        match stream.next().await? {
            LogEvent::Entry(entry) => out.show(&*entry, |e| e.ncsa_line()),
            LogEvent::Lagged(missed) => {
                eprintln!("cachectl: {missed} requests went by unshown (reading too slowly)")
            }
        }
    }
}
