//! `cachectl stats`: every value with its rate and description, under a summary of the ratios that matter.

use std::{
    future::Future,
    io::IsTerminal,
    time::{Duration, Instant},
};

use lacquer_admin::{
    cluster::ClusterReport,
    format::{bytes, duration},
    wire::{Kind, Stats},
    AdminClient, AdminError,
};
use serde::Serialize;

use crate::{
    table::{render as table, Align},
    Output,
};

pub async fn run(
    client: &AdminClient,
    out: Output,
    watch: Option<f64>,
    filter: Option<String>,
    cluster: bool,
) -> Result<(), AdminError> {
    let filter = filter.as_deref();
    if cluster {
        return repeat(
            out,
            watch,
            || ClusterReport::gather(client),
            |r, previous| crate::cluster::render_stats(r, previous, filter),
        )
        .await;
    }
    let addr = client.target().addr.to_string();
    repeat(
        out,
        watch,
        || client.stats(),
        |s, previous| render(s, previous, filter, &addr),
    )
    .await
}

/// Shows what `fetch` gets once, or with `watch` every so many seconds until interrupted, clearing a
/// terminal between documents; `render` gets the previous document and how long before it was taken.
async fn repeat<T: Serialize, F: Future<Output = Result<T, AdminError>>>(
    out: Output,
    watch: Option<f64>,
    fetch: impl Fn() -> F,
    render: impl Fn(&T, Option<(&T, Duration)>) -> String,
) -> Result<(), AdminError> {
    let Some(seconds) = watch else {
        let document = fetch().await?;
        out.show(&document, |d| render(d, None));
        return Ok(());
    };
    let interval = Duration::from_secs_f64(seconds);
    let clear = !out.json && std::io::stdout().is_terminal();
    let mut previous: Option<(T, Instant)> = None;
    loop {
        let document = fetch().await?;
        let now = Instant::now();
        let since = previous.as_ref().map(|(p, at)| (p, now - *at));
        if clear {
            crate::write_out("\x1b[2J\x1b[H");
        }
        out.show(&document, |d| render(d, since) + "\n");
        previous = Some((document, now));
        tokio::time::sleep(interval).await;
    }
}

/// The summary and the table; rates over the time since `previous` when given, else averages since start.
fn render(
    stats: &Stats,
    previous: Option<(&Stats, Duration)>,
    filter: Option<&str>,
    addr: &str,
) -> String {
    let header = format!(
        "lacquerd {} at {addr}, up {}\n\n",
        stats.version,
        duration(stats.uptime_seconds)
    );
    let rate = |name: &str, value: u64| -> Option<f64> {
        match previous {
            Some((before, elapsed)) => stats.rate_since(name, before, elapsed),
            None if stats.uptime_seconds > 0 => Some(value as f64 / stats.uptime_seconds as f64),
            None => None,
        }
    };
    header
        + &summary_text(stats)
        + "\n"
        + &values(stats, filter, previous.is_some(), rate)
        + &rules(stats, previous, filter)
        + &listeners(stats, filter)
}

/// Each listener's counters (whose `listeners.ADDRESS` contains `filter`), after a blank line; nothing from a
/// daemon that does not report them. Totals only: the document has every value, `/metrics` their rates.
pub fn listeners(stats: &Stats, filter: Option<&str>) -> String {
    let rows: Vec<Vec<String>> = stats
        .listeners
        .iter()
        .filter(|l| filter.is_none_or(|f| format!("listeners.{}", l.address).contains(f)))
        .map(|l| {
            let c = &l.counters;
            let kind = match (l.tls, l.quic) {
                (true, true) => "tls+quic",
                (true, false) => "tls",
                (false, _) => "plain",
            };
            let quic_errors = c.quic_errors_idle_timeout
                + c.quic_errors_protocol
                + c.quic_errors_transport
                + c.quic_errors_reset;
            vec![
                l.address.clone(),
                kind.to_owned(),
                c.connections.to_string(),
                c.requests_http1.to_string(),
                c.requests_http2.to_string(),
                c.requests_http3.to_string(),
                bytes(c.bytes_out_http1 + c.bytes_out_http2 + c.bytes_out_http3),
                (c.tls_handshake_errors + c.quic_handshake_errors).to_string(),
                format!("{}/{}", c.quic_0rtt_accepted, c.quic_0rtt_refused),
                quic_errors.to_string(),
            ]
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    "\n".to_owned()
        + &table(
            &[
                ("LISTENER", Align::Left),
                ("KIND", Align::Left),
                ("CONNS", Align::Right),
                ("HTTP/1", Align::Right),
                ("HTTP/2", Align::Right),
                ("HTTP/3", Align::Right),
                ("SENT", Align::Right),
                ("HANDSHAKE ERRS", Align::Right),
                ("0-RTT OK/425", Align::Right),
                ("QUIC ERRS", Align::Right),
            ],
            &rows,
        )
}

/// Each `[[rule]]`'s matches (whose `rules.NAME.PHASE` contains `filter`), after a blank line; nothing
/// without rules. Rates only over an interval: a reload restarts the counts, so an average since start
/// would mislead.
pub fn rules(stats: &Stats, previous: Option<(&Stats, Duration)>, filter: Option<&str>) -> String {
    let rows: Vec<Vec<String>> = stats
        .rules
        .iter()
        .filter(|r| filter.is_none_or(|f| format!("rules.{}.{}", r.rule, r.phase).contains(f)))
        .map(|r| {
            let rate = previous
                .and_then(|(before, elapsed)| {
                    stats.rule_rate_since(&r.rule, &r.phase, before, elapsed)
                })
                .map_or_else(String::new, |r| format!("{r:.2}"));
            vec![r.rule.clone(), r.phase.clone(), r.matched.to_string(), rate]
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    "\n".to_owned()
        + &table(
            &[
                ("RULE", Align::Left),
                ("PHASE", Align::Left),
                ("MATCHED", Align::Right),
                ("PER SEC (NOW)", Align::Right),
            ],
            &rows,
        )
}

/// The summary lines, indented.
pub fn summary_text(stats: &Stats) -> String {
    summary(stats)
        .into_iter()
        .map(|(label, value)| format!("  {label:<16}{value}\n"))
        .collect()
}

/// Every value (whose name contains `filter`) with the per-second `rate` of counters and its description;
/// `now` when rates are over the last interval rather than averages since start.
pub fn values(
    stats: &Stats,
    filter: Option<&str>,
    now: bool,
    rate: impl Fn(&str, u64) -> Option<f64>,
) -> String {
    let rows: Vec<Vec<String>> = stats
        .values()
        .filter(|(name, _, _)| filter.is_none_or(|f| name.contains(f)))
        .map(|(name, field, value)| {
            let per_sec = match field.kind {
                Kind::Counter => rate(&name, value).map_or_else(String::new, |r| format!("{r:.2}")),
                Kind::Gauge => String::new(),
            };
            vec![name, value.to_string(), per_sec, field.help()]
        })
        .collect();
    let per_sec = if now {
        "PER SEC (NOW)"
    } else {
        "PER SEC (AVG)"
    };
    table(
        &[
            ("NAME", Align::Left),
            ("VALUE", Align::Right),
            (per_sec, Align::Right),
            ("DESCRIPTION", Align::Left),
        ],
        &rows,
    )
}

fn summary(stats: &Stats) -> Vec<(&'static str, String)> {
    let (p, s) = (&stats.proxy, &stats.store);
    let percent = |part: u64, whole: u64| {
        if whole == 0 {
            "-".to_owned()
        } else {
            format!("{:.1} %", part as f64 * 100.0 / whole as f64)
        }
    };
    vec![
        (
            "hit ratio",
            format!(
                "{} of {} lookups and passes",
                stats
                    .hit_ratio()
                    .map_or_else(|| "-".into(), |r| format!("{:.1} %", r * 100.0)),
                p.hits + p.misses + p.passes
            ),
        ),
        (
            "hits in memory",
            format!("{} of {} hits", percent(p.hits_memory, p.hits), p.hits),
        ),
        (
            "stale served",
            format!(
                "{} within grace, {} for a failing origin",
                p.stale_served, p.stale_on_error
            ),
        ),
        (
            "compression",
            format!(
                "{} of {} stored ({}), {} decoded on delivery",
                bytes(p.compress_out),
                bytes(p.compress_in),
                percent(p.compress_out, p.compress_in),
                p.decoded_br + p.decoded_gzip + p.decoded_zstd
            ),
        ),
        (
            "backend errors",
            format!(
                "{} of {} backend requests",
                percent(p.backend_errors, p.backend_requests),
                p.backend_requests
            ),
        ),
        (
            "stored",
            format!("{} objects, {}", s.objects, bytes(s.stored_bytes)),
        ),
        (
            "memory tier",
            format!(
                "{} of {} ({})",
                bytes(s.memory_bytes_used),
                bytes(s.memory_bytes_capacity),
                percent(s.memory_bytes_used, s.memory_bytes_capacity)
            ),
        ),
        (
            "bans",
            format!("{} listed, {} pending", s.bans, s.bans_pending),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use lacquer_admin::wire::{
        ListenerCounters, ListenerStats, ProxyStats, RuleMatches, StoreStats,
    };

    use super::*;

    fn stats(hits: u64, misses: u64, uptime_seconds: u64) -> Stats {
        Stats {
            version: "0.1.0".into(),
            uptime_seconds,
            proxy: ProxyStats {
                requests: hits + misses,
                hits,
                hits_memory: hits,
                misses,
                fetches_in_flight: 2,
                ..Default::default()
            },
            store: StoreStats {
                memory_bytes_used: 1 << 20,
                memory_bytes_capacity: 4 << 20,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn row<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"));
        line.split_whitespace().collect()
    }

    #[test]
    fn averages_since_start_then_rates_over_the_interval() {
        let first = stats(30, 10, 10);
        let text = render(&first, None, None, "127.0.0.1:6082");
        assert!(
            text.starts_with("lacquerd 0.1.0 at 127.0.0.1:6082, up 10s\n"),
            "{text}"
        );
        assert!(
            text.contains("hit ratio       75.0 % of 40 lookups and passes"),
            "{text}"
        );
        assert!(
            text.contains("memory tier     1.0 MiB of 4.0 MiB (25.0 %)"),
            "{text}"
        );
        assert!(text.contains("PER SEC (AVG)"), "{text}");
        assert_eq!(row(&text, "proxy.hits")[..3], ["proxy.hits", "30", "3.00"]);
        let gauge = row(&text, "proxy.fetches_in_flight");
        assert_eq!(
            gauge[..3],
            ["proxy.fetches_in_flight", "2", "Backend"],
            "no rate for a gauge"
        );

        let second = stats(90, 10, 12);
        let text = render(&second, Some((&first, Duration::from_secs(2))), None, "a");
        assert!(text.contains("PER SEC (NOW)"), "{text}");
        assert_eq!(row(&text, "proxy.hits")[..3], ["proxy.hits", "90", "30.00"]);
    }

    #[test]
    fn rules_follow_the_values_with_rates_over_the_interval() {
        let with = |static_n, deliver_n| Stats {
            rules: vec![
                RuleMatches {
                    rule: "static".into(),
                    phase: "request".into(),
                    matched: static_n,
                },
                RuleMatches {
                    rule: "rule[1]".into(),
                    phase: "deliver".into(),
                    matched: deliver_n,
                },
            ],
            ..stats(1, 1, 10)
        };
        let first = with(10, 4);
        let text = render(&first, None, None, "a");
        let tail = text.split("\nRULE").nth(1).expect("a rules table");
        assert_eq!(
            tail,
            "     PHASE    MATCHED  PER SEC (NOW)\n\
             static   request       10\n\
             rule[1]  deliver        4\n",
            "no average since start: a reload restarts the counts\n{text}"
        );
        let second = with(30, 1);
        let text = render(&second, Some((&first, Duration::from_secs(2))), None, "a");
        assert_eq!(row(&text, "static"), ["static", "request", "30", "10.00"]);
        assert_eq!(
            row(&text, "rule[1]"),
            ["rule[1]", "deliver", "1", "0.50"],
            "a count that restarted counts from 0"
        );
        let only = render(&second, None, Some("deliver"), "a");
        assert!(
            only.contains("rule[1]") && !only.contains("static"),
            "{only}"
        );
        assert!(
            !render(&stats(1, 1, 1), None, None, "a").contains("RULE"),
            "no rules, no table"
        );
    }

    #[test]
    fn listeners_follow_in_a_table_of_their_own() {
        let listener = |address: &str, tls, quic, counters| ListenerStats {
            address: address.into(),
            tls,
            quic,
            counters,
        };
        let with = Stats {
            listeners: vec![
                listener(
                    "0.0.0.0:443",
                    true,
                    true,
                    ListenerCounters {
                        connections: 12,
                        requests_http2: 30,
                        requests_http3: 7,
                        bytes_out_http2: 1 << 20,
                        bytes_out_http3: 1 << 20,
                        tls_handshake_errors: 1,
                        quic_handshake_errors: 2,
                        quic_0rtt_accepted: 3,
                        quic_0rtt_refused: 1,
                        quic_errors_reset: 1,
                        quic_errors_idle_timeout: 4,
                        ..Default::default()
                    },
                ),
                listener(
                    "[::]:80",
                    false,
                    false,
                    ListenerCounters {
                        connections: 2,
                        requests_http1: 5,
                        ..Default::default()
                    },
                ),
            ],
            ..stats(1, 1, 10)
        };
        let text = render(&with, None, None, "a");
        assert_eq!(
            row(&text, "0.0.0.0:443"),
            [
                "0.0.0.0:443",
                "tls+quic",
                "12",
                "0",
                "30",
                "7",
                "2.0",
                "MiB",
                "3",
                "3/1",
                "5"
            ],
            "{text}"
        );
        assert_eq!(
            row(&text, "[::]:80"),
            ["[::]:80", "plain", "2", "5", "0", "0", "0", "B", "0", "0/0", "0"],
            "{text}"
        );
        let only = render(&with, None, Some("listeners.[::]"), "a");
        assert!(
            only.contains("[::]:80") && !only.contains("0.0.0.0:443"),
            "{only}"
        );
        assert!(
            !render(&stats(1, 1, 1), None, None, "a").contains("LISTENER"),
            "no listeners, no table"
        );
    }

    #[test]
    fn a_filter_keeps_matching_names() {
        let text = render(&stats(1, 1, 1), None, Some("ban"), "a");
        let names: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("NAME"))
            .skip(1)
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert!(
            !names.is_empty() && names.iter().all(|n| n.contains("ban")),
            "{names:?}"
        );
    }
}
