//! The help overlay: keys, and what the panels mean.

use ratatui::{
    layout::{Constraint, Flex, Layout, Rect},
    text::Line,
    widgets::{Block, Borders, Clear, Paragraph, Wrap},
    Frame,
};

use super::Theme;

const TEXT: [&str; 24] = [
    "q, esc    quit (ctrl-c too); esc clears a kept filter first",
    "tab       overview / every counter",
    "c         cluster: every member, and the totals (c again leaves)",
    "r         rules: matches of each [[rule]] (r again leaves)",
    "l         latency histogram by cache outcome (l again leaves);",
    "          d switches time to head / to end",
    "t         top URLs of the last minute, like varnishtop (t leaves);",
    "          b counts by host, misses, fetches, status, backend",
    "p, space  pause: keep this screen",
    "/         filter counters by name; enter keeps, esc clears",
    "↑ ↓ pgup pgdn home   scroll the counters and the rules",
    "?, h      this help; any key closes it",
    "",
    "traffic   rates over the last second, totals since start",
    "cache     hit ratio since start; split of hits (memory, disk),",
    "          misses and passes",
    "storage   tier fill; memory evictions, bodies lost, foyer drops",
    "waiters   requests waiting on another's fetch; fetches in flight",
    "bans      the ban list, and the lurker that walks the store",
    "backends  health from real traffic; fetch and error rates",
    "cluster   per member: state, invalidation lag, traffic",
    "rules     matches since the last reload, and per second now",
    "",
    "docs/cachetop.md explains every number",
];

pub fn render(frame: &mut Frame, area: Rect, theme: &Theme) {
    let [column] = Layout::horizontal([Constraint::Length(66)])
        .flex(Flex::Center)
        .areas(area);
    let [popup] = Layout::vertical([Constraint::Length(TEXT.len() as u16 + 2)])
        .flex(Flex::Center)
        .areas(column);
    frame.render_widget(Clear, popup);
    let lines: Vec<Line> = TEXT.iter().map(|l| Line::from(*l)).collect();
    frame.render_widget(
        Paragraph::new(lines).wrap(Wrap { trim: false }).block(
            Block::default()
                .borders(Borders::ALL)
                .title(" cachetop help ")
                .title_style(theme.accent()),
        ),
        popup,
    );
}

#[cfg(test)]
mod tests {
    use super::super::tests::{busy, screen};

    #[test]
    fn help_overlays_the_view() {
        let mut state = busy();
        state.help = true;
        let s = screen(&state, 80, 24);
        insta::assert_snapshot!(s);
        assert!(s.contains(" cachetop help "), "{s}");
        assert!(s.contains("/         filter counters by name"), "{s}");
    }
}
