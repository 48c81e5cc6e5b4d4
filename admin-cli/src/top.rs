//! `cachectl top`: the most frequent URLs, hosts, misses, origin fetches, statuses or backends among the
//! requests of a sliding window, live, as `varnishtop` shows them; counted here from the log stream, so the
//! daemon keeps no tables for it.

use std::{
    io::IsTerminal,
    time::{Duration, Instant},
};

pub use lacquer_admin::top::By;
use lacquer_admin::{
    top::{Row, Window},
    wire::LogFilter,
    AdminClient, AdminError, LogEvent,
};
use serde::Serialize;

use crate::Output;

#[derive(Serialize)]
struct Top {
    by: String,
    /// The seconds the counts span: the window asked for, or less until it has filled.
    window_seconds: f64,
    rows: Vec<Row>,
}

fn render(top: &Top) -> String {
    let mut text = format!(
        "top {} over the last {}s\n{:>8} {:>9}  {}\n",
        top.by, top.window_seconds, "COUNT", "PER SEC", "KEY"
    );
    for row in &top.rows {
        text += &format!("{:>8} {:>9.2}  {}\n", row.count, row.per_second, row.key);
    }
    text
}

/// Shows the table every second until interrupted, or once after `duration`.
pub async fn run(
    client: &AdminClient,
    out: Output,
    by: By,
    window: Duration,
    limit: usize,
    duration: Option<Duration>,
) -> Result<(), AdminError> {
    let mut stream = client.log_stream(&LogFilter::default()).await?;
    let started = Instant::now();
    let mut counted = Window::new(window, started);
    let clear = duration.is_none() && !out.json && std::io::stdout().is_terminal();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let name = by.name().to_owned();
    let show = |counted: &Window| {
        let now = Instant::now();
        let top = Top {
            by: name.clone(),
            window_seconds: counted.span(now).as_secs_f64().round(),
            rows: counted.top(limit, now),
        };
        if clear {
            crate::write_out("\x1b[2J\x1b[H");
        }
        out.show(&top, render);
    };
    loop {
        tokio::select! {
            event = stream.next() => {
                if let LogEvent::Entry(entry) = event? {
                    if let Some(key) = by.key(&entry) {
                        counted.add(Instant::now(), key);
                    }
                }
            }
            _ = tick.tick() => {
                counted.expire(Instant::now());
                match duration {
                    Some(d) if started.elapsed() >= d => {
                        show(&counted);
                        return Ok(());
                    }
                    Some(_) => {}
                    None => show(&counted),
                }
            }
        }
    }
}
