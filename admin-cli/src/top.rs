//! `cachectl top`: the most frequent URLs, hosts, misses, origin fetches, statuses or backends among the
//! requests of a sliding window, live, as `varnishtop` shows them; counted here from the log stream, so the
//! daemon keeps no tables for it.

use std::{
    io::IsTerminal,
    time::{Duration, Instant},
};

use lacquer_admin::{
    top::{By, Row, Window},
    wire::{LogEntry, LogFilter},
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
/// What `cachectl top` counts by: one of [`By`]'s, or a request header's value (`header:NAME`).
#[derive(Debug, Clone)]
pub enum Key {
    Field(By),
    /// The value of this request header (lower-cased name); requests without it are not counted.
    Header(String),
}

impl Key {
    /// `url`, `host`, … or `header:NAME`.
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Some(name) = text.strip_prefix("header:") {
            let valid = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            return match valid {
                true => Ok(Key::Header(name.to_ascii_lowercase())),
                false => Err(format!("{name:?} is not a header name")),
            };
        }
        <By as clap::ValueEnum>::from_str(text, true)
            .map(Key::Field)
            .map_err(|_| "give url, host, miss, fetch, status, backend or header:NAME".to_owned())
    }

    fn name(&self) -> String {
        match self {
            Key::Field(by) => by.name().to_owned(),
            Key::Header(name) => format!("header:{name}"),
        }
    }

    fn key(&self, e: &LogEntry) -> Option<String> {
        match self {
            Key::Field(by) => by.key(e),
            Key::Header(name) => {
                let values: Vec<&str> = e
                    .request_headers
                    .iter()
                    .filter(|f| f.name.eq_ignore_ascii_case(name))
                    .map(|f| f.value.as_str())
                    .collect();
                (!values.is_empty()).then(|| values.join(", "))
            }
        }
    }
}

pub async fn run(
    client: &AdminClient,
    out: Output,
    by: Key,
    window: Duration,
    limit: usize,
    duration: Option<Duration>,
) -> Result<(), AdminError> {
    // Only traced records carry headers.
    let filter = LogFilter {
        trace: matches!(by, Key::Header(_)).then_some(true),
        ..LogFilter::default()
    };
    let mut stream = client.log_stream(&filter).await?;
    let started = Instant::now();
    let mut counted = Window::new(window, started);
    let clear = duration.is_none() && !out.json && std::io::stdout().is_terminal();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let name = by.name();
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
