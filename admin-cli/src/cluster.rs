//! `cachectl cluster` and `cachectl stats --cluster`: every member of the cluster the daemon belongs to, as
//! each answers through its own admin API, and the statistics summed over them.

use std::time::Duration;

use lacquer_admin::{
    cluster::{ClusterReport, MemberReport},
    format::bytes,
    wire::Stats,
    AdminClient, AdminError,
};

use crate::{
    stats::{listeners, rules, summary_text, values},
    table::{render as table, Align},
    Output,
};

pub async fn show(client: &AdminClient, out: Output) -> Result<(), AdminError> {
    let report = ClusterReport::gather(client).await?;
    out.show(&report, render_members);
    Ok(())
}

/// Who answered the operator, and who did not.
fn heading(r: &ClusterReport) -> String {
    let down: Vec<&str> = r
        .members
        .iter()
        .filter(|m| !m.reachable())
        .map(|m| m.node.as_str())
        .collect();
    let answered = if down.is_empty() {
        "every one answered".to_owned()
    } else {
        format!(
            "{} answered, unreachable: {}",
            r.answered(),
            down.join(", ")
        )
    };
    format!(
        "cluster seen from {} at {}: {} {}, {answered}; self-routing {}\n\n",
        r.view.node,
        r.asked,
        r.members.len(),
        if r.members.len() == 1 {
            "member"
        } else {
            "members"
        },
        if r.view.self_routing { "on" } else { "off" }
    )
}

/// The state column: the member's own word for it, or why it did not answer.
fn state(m: &MemberReport) -> String {
    m.cluster
        .as_ref()
        .map_or_else(|| "unreachable".into(), |c| c.state.as_str().into())
}

/// `reason` for every member that did not answer, one line each.
fn unreachable_lines(r: &ClusterReport) -> String {
    r.members
        .iter()
        .filter_map(|m| {
            let e = m.error.as_ref()?;
            Some(format!("  {} at {}: {e}\n", m.node, m.advertise_admin))
        })
        .collect()
}

fn render_members(r: &ClusterReport) -> String {
    let rows: Vec<Vec<String>> = r
        .members
        .iter()
        .map(|m| {
            let c = m.cluster.as_ref();
            let num = |f: fn(&lacquer_admin::wire::ClusterView) -> String| c.map_or("-".into(), f);
            vec![
                m.node.clone(),
                m.advertise.clone(),
                m.advertise_admin.clone(),
                state(m),
                num(|c| c.applied_revision.to_string()),
                num(|c| c.lag_revisions.to_string()),
                num(|c| format!("{:.1}", c.lag_seconds)),
            ]
        })
        .collect();
    let mut out = heading(r);
    out += &table(
        &[
            ("NODE", Align::Left),
            ("ADVERTISE", Align::Left),
            ("ADMIN", Align::Left),
            ("STATE", Align::Left),
            ("APPLIED", Align::Right),
            ("LAG (REVISIONS)", Align::Right),
            ("LAG (SECONDS)", Align::Right),
        ],
        &rows,
    );
    out += &unreachable_lines(r);
    out += &format!("\nsum over the {} that answered\n", answered(r));
    out += &summary_text(&r.total);
    out.push('\n');
    out + &counters(r)
}

/// "the 2 members", "the member".
fn answered(r: &ClusterReport) -> String {
    match r.answered() {
        1 => "member".into(),
        n => format!("{n} members"),
    }
}

/// The cluster counters: the sum, then each member's.
fn counters(r: &ClusterReport) -> String {
    let mut header = vec![("CLUSTER COUNTER", Align::Left), ("SUM", Align::Right)];
    header.extend(r.members.iter().map(|m| (m.node.as_str(), Align::Right)));
    let rows: Vec<Vec<String>> = r
        .counters
        .values()
        .iter()
        .enumerate()
        .map(|(i, (name, sum))| {
            let mut row = vec![name.to_string(), sum.to_string()];
            row.extend(r.members.iter().map(|m| {
                m.cluster
                    .as_ref()
                    .map_or("-".into(), |c| c.counters.values()[i].1.to_string())
            }));
            row
        })
        .collect();
    table(&header, &rows)
}

/// `cachectl stats --cluster`: the summary and the breakdown per member, then every value summed; rates are
/// each member's (over the interval since `previous`, else its average since its start), added up.
pub fn render_stats(
    r: &ClusterReport,
    previous: Option<(&ClusterReport, Duration)>,
    filter: Option<&str>,
) -> String {
    let mut out = heading(r);
    out += &summary_text(&r.total);
    out.push('\n');
    out += &breakdown(r);
    out += &unreachable_lines(r);
    out.push('\n');
    let rate = |name: &str, _: u64| -> Option<f64> {
        r.members
            .iter()
            .filter_map(|m| {
                let stats = m.stats.as_ref()?;
                match previous {
                    Some((before, elapsed)) => {
                        let then = before
                            .members
                            .iter()
                            .find(|b| b.node == m.node)?
                            .stats
                            .as_ref()?;
                        stats.rate_since(name, then, elapsed)
                    }
                    None if stats.uptime_seconds > 0 => {
                        Some(stats.get(name)? as f64 / stats.uptime_seconds as f64)
                    }
                    None => None,
                }
            })
            .fold(None, |sum, rate| Some(sum.unwrap_or(0.0) + rate))
    };
    out + &values(&r.total, filter, previous.is_some(), rate)
        + &rules(
            &r.total,
            previous.map(|(b, elapsed)| (&b.total, elapsed)),
            filter,
        )
        + &listeners(&r.total, filter)
}

/// The main counters per member, and their sum.
fn breakdown(r: &ClusterReport) -> String {
    let row = |node: &str, state: String, s: Option<&Stats>| -> Vec<String> {
        let Some(s) = s else {
            let mut row = vec![node.to_owned(), state];
            row.extend(std::iter::repeat_n("-".to_owned(), 9));
            return row;
        };
        let p = &s.proxy;
        vec![
            node.to_owned(),
            state,
            p.requests.to_string(),
            p.hits.to_string(),
            p.misses.to_string(),
            p.passes.to_string(),
            s.hit_ratio()
                .map_or("-".into(), |r| format!("{:.1} %", r * 100.0)),
            p.backend_requests.to_string(),
            p.backend_errors.to_string(),
            s.store.objects.to_string(),
            bytes(s.store.stored_bytes),
        ]
    };
    let mut rows: Vec<Vec<String>> = r
        .members
        .iter()
        .map(|m| row(&m.node, state(m), m.stats.as_ref()))
        .collect();
    rows.push(row("SUM", String::new(), Some(&r.total)));
    table(
        &[
            ("NODE", Align::Left),
            ("STATE", Align::Left),
            ("REQUESTS", Align::Right),
            ("HITS", Align::Right),
            ("MISSES", Align::Right),
            ("PASSES", Align::Right),
            ("HIT RATIO", Align::Right),
            ("FETCHES", Align::Right),
            ("FETCH ERRORS", Align::Right),
            ("OBJECTS", Align::Right),
            ("STORED", Align::Right),
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use lacquer_admin::wire::{ClusterCounters, ClusterState, ClusterView, ProxyStats};

    use super::*;

    fn view(node: &str, state: ClusterState, lag: u64, seconds: f64) -> ClusterView {
        ClusterView {
            node: node.into(),
            state,
            applied_revision: 90 - lag,
            seen_revision: 90,
            lag_revisions: lag,
            lag_seconds: seconds,
            self_routing: true,
            members: Vec::new(),
            counters: ClusterCounters {
                watch_breaks: lag,
                ..Default::default()
            },
        }
    }

    fn member(node: &str, advertise: &str, view: Option<ClusterView>, hits: u64) -> MemberReport {
        MemberReport {
            node: node.into(),
            advertise: advertise.into(),
            advertise_admin: format!("{node}.example:6082"),
            stats: view.as_ref().map(|_| Stats {
                uptime_seconds: 10,
                proxy: ProxyStats {
                    requests: 2 * hits,
                    hits,
                    misses: hits,
                    ..Default::default()
                },
                ..Default::default()
            }),
            error: view.is_none().then(|| "no answer within 3s".to_owned()),
            cluster: view,
        }
    }

    fn words(text: &str, first: &str) -> Vec<String> {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(first))
            .unwrap_or_else(|| panic!("no {first} in\n{text}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn members_states_and_lags_read_as_a_table() {
        let lagging = view("a", ClusterState::Lagging, 12, 31.25);
        // The members, the heading, and the words of the rows that start with a given word.
        type Rows<'a> = &'a [(&'a str, &'a [&'a str])];
        let cases: [(Vec<MemberReport>, &str, Rows); 2] = [
            (
                vec![member("a", "-", Some(lagging.clone()), 5)],
                "cluster seen from a at 127.0.0.1:6082: 1 member, every one answered; self-routing on\n",
                &[
                    ("a", &["a", "-", "a.example:6082", "lagging", "78", "12", "31.2"]),
                    ("hit", &["hit", "ratio", "50.0", "%", "of", "10", "lookups", "and", "passes"]),
                    ("watch_breaks", &["watch_breaks", "12", "12"]),
                ],
            ),
            (
                vec![
                    member("a", "10.0.0.1:80", Some(lagging.clone()), 5),
                    member("b", "10.0.0.2:80", Some(view("b", ClusterState::Disconnected, 0, 4.0)), 7),
                    member("c", "10.0.0.3:80", None, 0),
                ],
                "cluster seen from a at 127.0.0.1:6082: 3 members, 2 answered, unreachable: c; self-routing on\n",
                &[
                    ("b", &["b", "10.0.0.2:80", "b.example:6082", "disconnected", "90", "0", "4.0"]),
                    ("c", &["c", "10.0.0.3:80", "c.example:6082", "unreachable", "-", "-", "-"]),
                    ("hit", &["hit", "ratio", "50.0", "%", "of", "24", "lookups", "and", "passes"]),
                    ("watch_breaks", &["watch_breaks", "12", "12", "0", "-"]),
                ],
            ),
        ];
        for (members, heading, rows) in cases {
            let report = ClusterReport::new("127.0.0.1:6082".into(), lagging.clone(), members);
            let text = render_members(&report);
            assert!(text.starts_with(heading), "{text}");
            for (first, want) in rows {
                assert_eq!(words(&text, first), *want, "{text}");
            }
        }
    }

    #[test]
    fn stats_rates_add_each_members_own() {
        let a = view("a", ClusterState::Serving, 0, 0.0);
        let report = |hits_a: u64, hits_b: u64| {
            let mut b = member(
                "b",
                "b:80",
                Some(view("b", ClusterState::Serving, 0, 0.0)),
                hits_b,
            );
            b.stats.as_mut().unwrap().uptime_seconds = 20;
            ClusterReport::new(
                "127.0.0.1:6082".into(),
                a.clone(),
                vec![
                    member("a", "a:80", Some(a.clone()), hits_a),
                    b,
                    member("c", "c:80", None, 0),
                ],
            )
        };
        let first = report(100, 400);
        let text = render_stats(&first, None, Some("proxy.hits"));
        // Averages since each member's start: 100/10 s + 400/20 s.
        assert_eq!(
            words(&text, "proxy.hits")[..3],
            ["proxy.hits", "500", "30.00"]
        );
        assert_eq!(
            words(&text, "SUM")[..6],
            ["SUM", "1000", "500", "500", "0", "50.0"]
        );
        assert_eq!(words(&text, "c")[..3], ["c", "unreachable", "-"]);
        let second = report(130, 410);
        let text = render_stats(
            &second,
            Some((&first, Duration::from_secs(2))),
            Some("proxy.hits"),
        );
        assert!(text.contains("PER SEC (NOW)"), "{text}");
        // Over the interval: (30 + 10) / 2 s.
        assert_eq!(
            words(&text, "proxy.hits")[..3],
            ["proxy.hits", "540", "20.00"]
        );
    }
}
