//! The cluster: one row per member as it answers through its own admin API (state, lag behind the
//! invalidation log, hit ratio, request rate, objects), and the totals.

use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::Style,
    text::{Line, Span},
    widgets::{Block, Borders, Paragraph, Row, Table, Wrap},
    Frame,
};

use super::{count, percent, rate, Theme};
use crate::state::{Cluster, MemberRow, State};

pub fn render(frame: &mut Frame, area: Rect, state: &State, theme: &Theme) {
    let block = Block::default()
        .borders(Borders::ALL)
        .title(Span::styled(" cluster ", theme.title()));
    let (asked, rows, total) = match &state.cluster {
        Cluster::Members { asked, rows, total } => (asked, rows, total),
        other => {
            let text = match other {
                Cluster::Single => format!(
                    "lacquerd at {} is a single node: its configuration has no [cluster] section",
                    state.addr
                ),
                Cluster::Failed(e) => format!("cannot read the cluster: {e}"),
                _ => "asking for the members…".to_owned(),
            };
            frame.render_widget(
                Paragraph::new(text).wrap(Wrap { trim: true }).block(block),
                area,
            );
            return;
        }
    };
    let errors: Vec<Line> = rows
        .iter()
        .filter_map(|r| Some(Line::from(format!("{}: {}", r.node, r.error.as_ref()?))))
        .collect();
    let [table, notes] = Layout::vertical([
        Constraint::Length(rows.len() as u16 + 4),
        Constraint::Length(errors.len() as u16 + 2),
    ])
    .areas(area);
    // Names are short (host names, usually): the numbers stay next to them on a wide terminal.
    let longest = rows
        .iter()
        .chain([total])
        .map(|r| r.node.chars().count() + 2);
    let node_width = longest.max().unwrap_or(0).clamp(6, 32) as u16;
    let mut widths = vec![Constraint::Length(node_width)];
    widths.extend(WIDTHS);
    let body = rows.iter().map(|r| {
        let style = match r.state.as_str() {
            "serving" => theme.good(),
            "catching_up" | "disconnected" => theme.warn(),
            _ => theme.alert(),
        };
        let node = if r.node == *asked {
            format!("{} *", r.node)
        } else {
            r.node.clone()
        };
        cells(node, Span::styled(r.state.clone(), style), r)
    });
    let totals =
        cells(total.node.clone(), Span::raw(total.state.clone()), total).style(theme.title());
    frame.render_widget(
        Table::new(body.chain([totals]), widths)
            .header(
                Row::new([
                    Line::from("node"),
                    Line::from("state"),
                    Line::from("lag rev").right_aligned(),
                    Line::from("lag s").right_aligned(),
                    Line::from("hit ratio").right_aligned(),
                    Line::from("req/s").right_aligned(),
                    Line::from("objects").right_aligned(),
                ])
                .style(theme.title()),
            )
            .column_spacing(2)
            .block(block),
        table,
    );
    if !errors.is_empty() {
        frame.render_widget(
            Paragraph::new(errors)
                .style(Style::default())
                .wrap(Wrap { trim: true })
                .block(
                    Block::default()
                        .borders(Borders::ALL)
                        .title(Span::styled(" unreachable ", theme.alert())),
                ),
            notes,
        );
    }
}

/// Every column after the node's.
const WIDTHS: [Constraint; 6] = [
    Constraint::Length(13),
    Constraint::Length(8),
    Constraint::Length(6),
    Constraint::Length(9),
    Constraint::Length(8),
    Constraint::Length(8),
];

fn cells<'a>(node: String, state: Span<'a>, r: &MemberRow) -> Row<'a> {
    let or_dash = |v: Option<String>| Line::from(v.unwrap_or_else(|| "-".into())).right_aligned();
    Row::new(vec![
        Line::from(node),
        Line::from(state),
        or_dash(r.lag_revisions.map(count)),
        or_dash(r.lag_seconds.map(|s| format!("{s:.1}"))),
        Line::from(percent(r.hit_ratio)).right_aligned(),
        Line::from(rate(r.rps)).right_aligned(),
        or_dash(r.objects.map(count)),
    ])
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::tests::{busy, screen};
    use crate::state::{tests::report, Cluster, View};

    /// Three members two samples apart: n1 serving, n2 catching up 6 revisions behind, n3 down.
    fn three() -> crate::state::State {
        let mut state = busy();
        state.view = View::Cluster;
        let t0 = Instant::now();
        state.update_cluster(
            report(&[
                ("n1", Some((1_000, 900, 0))),
                ("n2", Some((2_000, 1_000, 6))),
                ("n3", None),
            ]),
            t0,
        );
        state.update_cluster(
            report(&[
                ("n1", Some((1_300, 1_170, 0))),
                ("n2", Some((2_100, 1_050, 6))),
                ("n3", None),
            ]),
            t0 + Duration::from_secs(2),
        );
        state
    }

    #[test]
    fn members_and_totals_at_80x24_and_160x48() {
        let state = three();
        let small = screen(&state, 80, 24);
        insta::assert_snapshot!("cluster_80x24", small);
        let row = |name: &str| -> Vec<String> {
            let line = small
                .lines()
                .find(|l| l.starts_with(&format!("│{name} ")))
                .unwrap_or_else(|| panic!("no {name} row in\n{small}"));
            line.trim_matches('│')
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(
            row("n1"),
            ["n1", "*", "serving", "0", "0.0", "90.0", "%", "150/s", "1170"]
        );
        assert_eq!(
            row("n2"),
            ["n2", "catching_up", "6", "3.0", "50.0", "%", "50/s", "1050"]
        );
        assert_eq!(row("n3"), ["n3", "unreachable", "-", "-", "-", "-", "-"]);
        assert_eq!(
            row("total"),
            ["total", "1/3", "serving", "6", "3.0", "65.3", "%", "200/s", "2220"]
        );
        assert!(small.contains("n3: connection refused"), "{small}");
        insta::assert_snapshot!("cluster_160x48", screen(&state, 160, 48));
    }

    #[test]
    fn a_single_node_and_a_failure_say_so() {
        let mut state = busy();
        state.view = View::Cluster;
        assert!(screen(&state, 80, 24).contains("asking for the members…"));
        state.no_cluster(Cluster::Single);
        let s = screen(&state, 80, 24);
        assert!(
            s.contains("lacquerd at 127.0.0.1:6082 is a single node: its configuration has no"),
            "{s}"
        );
        state.no_cluster(Cluster::Failed("unauthorized".into()));
        assert!(screen(&state, 80, 24).contains("cannot read the cluster: unauthorized"));
    }
}
