//! Every counter and gauge with its value, rate and meaning, filtered by what was typed after `/`, the way
//! `varnishstat` lists its counters.

use ratatui::{
    layout::{Constraint, Layout, Rect},
    text::{Line, Span},
    widgets::{Block, Borders, Paragraph, Row, Table},
    Frame,
};

use lacquer_admin::wire::Kind;

use super::{rate, Theme};
use crate::state::State;

pub fn render(frame: &mut Frame, area: Rect, state: &State, theme: &Theme) {
    let rows = state.counters();
    let total = state
        .latest
        .as_ref()
        .map_or(0, |s| s.values().count() + s.listener_values().count());
    let [filter, table] = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(area);
    let filter_line = if state.filter.is_empty() && !state.editing {
        Line::from(format!("{total} values; / to filter"))
    } else {
        Line::from(vec![
            Span::styled("filter ", theme.accent()),
            Span::raw(format!("{:?}: {} of {total}", state.filter, rows.len())),
        ])
    };
    frame.render_widget(Paragraph::new(filter_line), filter);
    let visible = usize::from(table.height.saturating_sub(3));
    let scroll = state.scroll.min(rows.len().saturating_sub(visible));
    // Wide enough for the names shown, a listener's too (`listeners.[2001:db8::1]:443.quic_0rtt_accepted`):
    // set by every row instead, the daemon's own would have their descriptions cut for the listeners'
    // sake even when no listener is in view.
    let name_width = rows
        .iter()
        .skip(scroll)
        .take(visible)
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(0)
        .clamp(28, 56) as u16;
    let body = rows.iter().skip(scroll).take(visible).map(|r| {
        Row::new(vec![
            Line::from(r.name.clone()),
            Line::from(r.value.to_string()).right_aligned(),
            // A gauge's cell stays empty, as in `cachectl stats`: `-` would read as "no rate yet".
            Line::from(match r.field.kind {
                Kind::Counter => rate(r.rate),
                Kind::Gauge => String::new(),
            })
            .right_aligned(),
            Line::from(r.field.help()),
        ])
    });
    let title = if rows.len() > visible {
        format!(
            " counters {}-{} of {} ",
            scroll + 1,
            (scroll + visible).min(rows.len()),
            rows.len()
        )
    } else {
        " counters ".to_owned()
    };
    frame.render_widget(
        Table::new(
            body,
            [
                Constraint::Length(name_width),
                Constraint::Length(12),
                Constraint::Length(9),
                Constraint::Min(10),
            ],
        )
        .header(
            Row::new([
                Line::from("name"),
                Line::from("value").right_aligned(),
                Line::from("per sec").right_aligned(),
                Line::from("description"),
            ])
            .style(theme.title()),
        )
        .column_spacing(2)
        .block(Block::default().borders(Borders::ALL).title(title)),
        table,
    );
}

#[cfg(test)]
mod tests {
    use lacquer_admin::wire::{ListenerCounters, ProxyStats, StoreStats};

    use super::super::tests::{busy, screen};
    use crate::state::View;

    /// Every value the daemon reports: the list shows them all.
    fn total() -> usize {
        ProxyStats::FIELDS.len() + StoreStats::FIELDS.len() + ListenerCounters::FIELDS.len()
    }

    #[test]
    fn every_counter_at_80x24_and_160x48() {
        let mut state = busy();
        state.view = View::Counters;
        let small = screen(&state, 80, 24);
        insta::assert_snapshot!("counters_80x24", small);
        let row: Vec<&str> = small
            .lines()
            .find(|l| l.starts_with("│proxy.requests "))
            .expect("a proxy.requests row")
            .split_whitespace()
            .collect();
        assert_eq!(
            row[..4],
            ["│proxy.requests", "10400", "200/s", "Client"],
            "{small}"
        );
        let heading = format!(" counters 1-18 of {} ", total());
        assert!(small.contains(&heading), "{small}");
        let large = screen(&state, 160, 48);
        insta::assert_snapshot!("counters_160x48", large);
        assert!(large.contains("Client requests received."), "{large}");
    }

    #[test]
    fn a_gauge_has_no_rate() {
        let mut state = busy();
        state.view = View::Counters;
        state.filter = "store.objects".into();
        let s = screen(&state, 160, 24);
        let row = s
            .lines()
            .find(|l| l.starts_with("│store.objects "))
            .unwrap_or_else(|| panic!("a store.objects row: {s}"));
        assert!(!row.contains("/s") && !row.contains(" - "), "{row}");
    }

    #[test]
    fn a_filter_narrows_and_scrolling_moves_the_window() {
        let mut state = busy();
        state.view = View::Counters;
        state.filter = "ban".into();
        let s = screen(&state, 100, 24);
        let heading = format!("filter \"ban\": 5 of {}", total());
        assert!(s.contains(&heading), "{s}");
        let names: Vec<&str> = s
            .lines()
            .filter_map(|l| l.strip_prefix('│')?.split_whitespace().next())
            .filter(|n| n.contains('.'))
            .collect();
        assert!(
            !names.is_empty() && names.iter().all(|n| n.contains("ban")),
            "{names:?}"
        );

        state.filter.clear();
        state.scroll = 5;
        let s = screen(&state, 100, 24);
        let heading = format!(" counters 6-23 of {} ", total());
        assert!(s.contains(&heading), "{s}");
        assert!(s.contains("│proxy.stale_on_error"), "{s}");
        state.scroll = 10_000;
        let s = screen(&state, 100, 24);
        assert!(
            s.contains("│listeners.0.0.0.0:443.quic_errors_reset"),
            "scrolling stops at the end: {s}"
        );
    }

    #[test]
    fn listeners_are_listed_with_their_rates() {
        let mut state = busy();
        state.view = View::Counters;
        state.filter = "listeners.".into();
        let s = screen(&state, 120, 30);
        let row: Vec<&str> = s
            .lines()
            .find(|l| l.starts_with("│listeners.0.0.0.0:443.requests_http2 "))
            .unwrap_or_else(|| panic!("no listener row in\n{s}"))
            .split_whitespace()
            .collect();
        assert_eq!(
            row[..4],
            [
                "│listeners.0.0.0.0:443.requests_http2",
                "8300",
                "150/s",
                "Requests"
            ],
            "{s}"
        );
    }
}
