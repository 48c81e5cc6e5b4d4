//! The `[[rule]]`s: each with its phase, how often it matched since the configuration was loaded, and how
//! often it matches now, the way `varnishstat` shows a VCL's counters.

use ratatui::{
    layout::{Constraint, Rect},
    text::{Line, Span},
    widgets::{Block, Borders, Paragraph, Row, Table, Wrap},
    Frame,
};

use super::{count, rate, Theme};
use crate::state::State;

pub fn render(frame: &mut Frame, area: Rect, state: &State, theme: &Theme) {
    let rows = state.rules();
    let block = Block::default()
        .borders(Borders::ALL)
        .title(Span::styled(" rules ", theme.title()));
    if rows.is_empty() {
        let text = match &state.latest {
            Some(_) => "no [[rule]] in the configuration (or a daemon without rules)",
            None => "waiting for statistics…",
        };
        frame.render_widget(
            Paragraph::new(text).wrap(Wrap { trim: true }).block(block),
            area,
        );
        return;
    }
    let visible = usize::from(area.height.saturating_sub(3));
    let scroll = state.scroll.min(rows.len().saturating_sub(visible));
    let longest = rows.iter().map(|r| r.rule.chars().count());
    let name_width = longest.max().unwrap_or(0).clamp(4, 40) as u16;
    let body = rows.iter().skip(scroll).take(visible).map(|r| {
        // A rule that matches now stands out from the ones that wait for their traffic.
        let style = if r.rate.is_some_and(|r| r > 0.0) {
            theme.good()
        } else {
            Default::default()
        };
        Row::new(vec![
            Line::from(r.rule.clone()),
            Line::from(r.phase.clone()),
            Line::from(count(r.matched)).right_aligned(),
            Line::from(Span::styled(rate(r.rate), style)).right_aligned(),
        ])
    });
    let title = if rows.len() > visible {
        format!(
            " rules {}-{} of {} ",
            scroll + 1,
            (scroll + visible).min(rows.len()),
            rows.len()
        )
    } else {
        format!(" rules: {} ", rows.len())
    };
    frame.render_widget(
        Table::new(
            body,
            [
                Constraint::Length(name_width),
                Constraint::Length(16),
                Constraint::Length(10),
                Constraint::Length(9),
            ],
        )
        .header(
            Row::new([
                Line::from("rule"),
                Line::from("phase"),
                Line::from("matched").right_aligned(),
                Line::from("per sec").right_aligned(),
            ])
            .style(theme.title()),
        )
        .column_spacing(2)
        .block(
            Block::default()
                .borders(Borders::ALL)
                .title(Span::styled(title, theme.title())),
        ),
        area,
    );
}

#[cfg(test)]
mod tests {
    use super::super::tests::{busy, screen};
    use crate::state::{State, View};

    #[test]
    fn every_rule_at_80x24_and_160x48() {
        let mut state = busy();
        state.view = View::Rules;
        let small = screen(&state, 80, 24);
        insta::assert_snapshot!("rules_80x24", small);
        let row = |name: &str| -> Vec<String> {
            small
                .lines()
                .find(|l| l.starts_with(&format!("│{name} ")))
                .unwrap_or_else(|| panic!("no {name} row in\n{small}"))
                .trim_matches('│')
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(row("static"), ["static", "request", "1040", "40/s"]);
        assert_eq!(row("rule[2]"), ["rule[2]", "deliver", "7", "0.0/s"]);
        insta::assert_snapshot!("rules_160x48", screen(&state, 160, 48));
    }

    #[test]
    fn without_rules_the_view_says_so() {
        let mut state = State::new("a".into());
        state.view = View::Rules;
        assert!(screen(&state, 80, 24).contains("waiting for statistics…"));
        state.update(Default::default(), std::time::Instant::now());
        assert!(screen(&state, 80, 24).contains("no [[rule]] in the configuration"));
    }
}
