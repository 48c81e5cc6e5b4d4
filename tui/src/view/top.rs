//! The most frequent URLs, hosts, misses, origin fetches, statuses or backends of the last minute, as
//! `varnishtop` shows them and `cachectl top` prints them.

use ratatui::{
    layout::{Constraint, Rect},
    text::{Line, Span},
    widgets::{Block, Borders, Paragraph, Row, Table, Wrap},
    Frame,
};

use super::{count, Theme};
use crate::state::State;

pub fn render(frame: &mut Frame, area: Rect, state: &State, theme: &Theme) {
    let top = &state.top;
    let shown = usize::from(area.height.saturating_sub(3));
    let rows = top.window.top(shown, top.at);
    let partial = if top.window.full() {
        " (the most recent requests only)"
    } else {
        ""
    };
    let title = format!(
        " top {} over the last {} s{partial} (b switches) ",
        top.by.name(),
        top.window.span(top.at).as_secs()
    );
    let block = Block::default()
        .borders(Borders::ALL)
        .title(Span::styled(title, theme.title()));
    if rows.is_empty() {
        frame.render_widget(
            Paragraph::new("counting the requests that complete from now on…")
                .wrap(Wrap { trim: true })
                .block(block),
            area,
        );
        return;
    }
    let body = rows.iter().map(|r| {
        Row::new(vec![
            Line::from(count(r.count)).right_aligned(),
            Line::from(format!("{:.2}", r.per_second)).right_aligned(),
            Line::from(r.key.clone()),
        ])
    });
    frame.render_widget(
        Table::new(
            body,
            [
                Constraint::Length(8),
                Constraint::Length(9),
                Constraint::Min(10),
            ],
        )
        .header(
            Row::new([
                Line::from("count").right_aligned(),
                Line::from("per sec").right_aligned(),
                Line::from("key"),
            ])
            .style(theme.title()),
        )
        .column_spacing(2)
        .block(block),
        area,
    );
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use lacquer_admin::wire::LogEntry;

    use super::super::tests::screen;
    use crate::state::{State, View};

    fn entry(url: &str, cache: &str, status: u16) -> LogEntry {
        LogEntry {
            time_ms: 0,
            client: "192.0.2.1".into(),
            method: "GET".into(),
            url: url.into(),
            host: Some("shop.example".into()),
            protocol: "HTTP/1.1".into(),
            status,
            bytes: 0,
            referer: None,
            user_agent: None,
            cache: cache.into(),
            detail: None,
            ttfb: 0.0,
            duration: 0.0,
            backend: Some("app1".into()),
            route: None,
            request_headers: Vec::new(),
            response_headers: Vec::new(),
            steps: Vec::new(),
        }
    }

    #[test]
    fn the_most_requested_come_first_and_b_counts_another_way() {
        let mut state = State::new("127.0.0.1:6082".into());
        state.view = View::Top;
        assert!(screen(&state, 80, 24).contains("counting the requests that complete from now on"));
        let mut log = vec![entry("/api/cart", "MISS", 200); 3];
        log.push(entry("/", "HIT", 200));
        log.push(entry("/gone", "MISS", 404));
        state.update_log(log.clone(), Instant::now());
        let s = screen(&state, 80, 24);
        insta::assert_snapshot!(s);
        assert!(
            s.contains(" top url over the last 1 s (b switches) "),
            "rates over the time counted, not the whole window: {s}"
        );
        let rows: Vec<&str> = s.lines().filter(|l| l.contains("shop.example")).collect();
        assert_eq!(rows.len(), 3, "{s}");
        assert!(
            rows[0].contains("3") && rows[0].contains("shop.example/api/cart"),
            "{s}"
        );
        state.next_top_by();
        assert!(
            screen(&state, 80, 24).contains("counting the requests"),
            "a new count starts"
        );
        state.update_log(log, Instant::now());
        let s = screen(&state, 80, 24);
        assert!(s.contains(" top host over the last 1 s "), "{s}");
        assert!(s.contains("5  ") && s.contains("shop.example"), "{s}");
    }
}
