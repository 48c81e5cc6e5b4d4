//! The screen as a pure function of [`State`], so it can be tested on ratatui's `TestBackend`.

use ratatui::{
    backend::TestBackend,
    layout::{Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Block, Borders, Gauge, Paragraph, Row, Sparkline, Table},
    Frame, Terminal,
};

use lacquer_admin::format::bytes;

use crate::state::State;

pub struct Theme {
    pub color: bool,
}

impl Theme {
    fn accent(&self) -> Style {
        if self.color {
            Style::default()
                .fg(Color::Cyan)
                .add_modifier(Modifier::BOLD)
        } else {
            Style::default().add_modifier(Modifier::BOLD)
        }
    }

    fn alert(&self) -> Style {
        if self.color {
            Style::default().fg(Color::Red).add_modifier(Modifier::BOLD)
        } else {
            Style::default().add_modifier(Modifier::REVERSED)
        }
    }
}

fn rate(state: &State, name: &str) -> String {
    state
        .rate(name)
        .map_or_else(|| "-".into(), |r| format!("{r:.0}/s"))
}

fn total(state: &State, name: &str) -> String {
    state
        .value(name)
        .map_or_else(|| "-".into(), |v| v.to_string())
}

pub fn render(frame: &mut Frame, state: &State, theme: &Theme) {
    let [header, body, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(10),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    render_header(frame, header, state, theme);
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(body);
    render_traffic(frame, left, state);
    let [ratio, storage, spark] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Min(8),
        Constraint::Length(5),
    ])
    .areas(right);
    render_ratio(frame, ratio, state, theme);
    render_storage(frame, storage, state);
    let rates: Vec<u64> = state.request_rates.iter().copied().collect();
    frame.render_widget(
        Sparkline::default()
            .block(Block::default().borders(Borders::ALL).title(" requests/s "))
            .data(&rates),
        spark,
    );
    frame.render_widget(Paragraph::new("q quit"), footer);
}

fn render_header(frame: &mut Frame, area: Rect, state: &State, theme: &Theme) {
    let status = match &state.error {
        Some(e) => Span::styled(format!("disconnected — retrying ({e})"), theme.alert()),
        None => Span::raw(format!("up {}s", state.uptime().unwrap_or(0))),
    };
    let line = Line::from(vec![
        Span::styled("cachetop ", theme.accent()),
        Span::raw(format!("{}  ", state.addr)),
        status,
    ]);
    frame.render_widget(Paragraph::new(line), area);
}

fn render_traffic(frame: &mut Frame, area: Rect, state: &State) {
    let rows = [
        ("requests", "proxy.requests"),
        ("hits", "proxy.hits"),
        ("  memory", "proxy.hits_memory"),
        ("  disk", "proxy.hits_disk"),
        ("misses", "proxy.misses"),
        ("passes", "proxy.passes"),
        ("coalesced", "proxy.coalesced_waiters"),
        ("hit-for-miss", "proxy.hit_for_miss"),
        ("backend reqs", "proxy.backend_requests"),
        ("backend errors", "proxy.backend_errors"),
        ("in flight", "proxy.fetches_in_flight"),
    ]
    .into_iter()
    .map(|(label, name)| {
        Row::new(vec![
            label.to_string(),
            rate(state, name),
            total(state, name),
        ])
    });
    let mut rows: Vec<Row> = rows.collect();
    rows.push(Row::new(vec![
        "bytes out".to_string(),
        state
            .rate("proxy.bytes_out")
            .map_or_else(|| "-".into(), |r| format!("{}/s", bytes(r as u64))),
        state
            .value("proxy.bytes_out")
            .map_or_else(|| "-".into(), bytes),
    ]));
    let table = Table::new(
        rows,
        [
            Constraint::Length(15),
            Constraint::Length(11),
            Constraint::Min(8),
        ],
    )
    .header(
        Row::new(vec!["traffic", "rate", "total"])
            .style(Style::default().add_modifier(Modifier::BOLD)),
    )
    .block(Block::default().borders(Borders::ALL));
    frame.render_widget(table, area);
}

fn render_ratio(frame: &mut Frame, area: Rect, state: &State, theme: &Theme) {
    let ratio = state.hit_ratio().unwrap_or(0.0);
    let gauge = Gauge::default()
        .block(Block::default().borders(Borders::ALL).title(" hit ratio "))
        .gauge_style(theme.accent())
        .ratio(ratio.clamp(0.0, 1.0))
        .label(format!("{:.1} %", ratio * 100.0));
    frame.render_widget(gauge, area);
}

fn render_storage(frame: &mut Frame, area: Rect, state: &State) {
    let used = state.value("store.memory_bytes_used").unwrap_or(0);
    let cap = state
        .value("store.memory_bytes_capacity")
        .unwrap_or(0)
        .max(1);
    let lines = vec![
        format!("objects  {}", total(state, "store.objects")),
        format!(
            "stored   {}",
            state
                .value("store.stored_bytes")
                .map_or_else(|| "-".into(), bytes)
        ),
        format!(
            "memory   {} / {} ({:.0} %)",
            bytes(used),
            bytes(cap),
            used as f64 * 100.0 / cap as f64
        ),
        format!(
            "disk     {}",
            state
                .value("store.disk_bytes_capacity")
                .map_or_else(|| "-".into(), bytes)
        ),
        format!("written  {}", rate(state, "store.disk_bytes_written")),
        format!("drops    {}", total(state, "store.foyer_drops")),
    ];
    let text: Vec<Line> = lines.into_iter().map(Line::from).collect();
    frame.render_widget(
        Paragraph::new(text).block(Block::default().borders(Borders::ALL).title(" storage ")),
        area,
    );
}

/// One frame rendered off-screen as plain text (`cachetop --once`, and tests).
pub fn to_text(state: &State, theme: &Theme, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test backend");
    terminal.draw(|f| render(f, state, theme)).expect("draw");
    let buf = terminal.backend().buffer();
    (0..height)
        .map(|y| {
            let line: String = (0..width).map(|x| buf[(x, y)].symbol()).collect();
            line.trim_end().to_owned() + "\n"
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use lacquer_admin::wire::{ProxyStats, Stats, StoreStats};

    use super::*;

    fn screen(state: &State, w: u16, h: u16) -> String {
        to_text(state, &Theme { color: false }, w, h)
    }

    fn stats(requests: u64, hits: u64) -> Stats {
        Stats {
            version: "0.1.0".into(),
            uptime_seconds: 42,
            proxy: ProxyStats {
                requests,
                hits,
                misses: requests - hits,
                bytes_out: 4096,
                ..Default::default()
            },
            store: StoreStats {
                objects: 7,
                memory_bytes_used: 1 << 20,
                memory_bytes_capacity: 4 << 20,
                ..Default::default()
            },
        }
    }

    #[test]
    fn renders_rates_ratio_and_storage_at_80x24_and_160x48() {
        let mut state = State::new("127.0.0.1:6082".into());
        let t0 = Instant::now();
        state.update(stats(100, 50), t0);
        state.update(stats(300, 200), t0 + Duration::from_secs(2));
        for (w, h) in [(80, 24), (160, 48)] {
            let s = screen(&state, w, h);
            assert!(s.contains("127.0.0.1:6082") && s.contains("up 42s"), "{s}");
            assert!(
                s.contains("requests") && s.contains("100/s") && s.contains("300"),
                "{s}"
            );
            assert!(s.contains("66.7 %"), "hit ratio 200/300: {s}");
            assert!(
                s.contains("objects  7") && s.contains("1.0 MiB / 4.0 MiB (25 %)"),
                "{s}"
            );
        }
    }

    #[test]
    fn shows_a_lost_daemon() {
        let mut state = State::new("127.0.0.1:6082".into());
        state.disconnected("connection refused".into());
        let s = screen(&state, 80, 24);
        assert!(
            s.contains("disconnected — retrying (connection refused)"),
            "{s}"
        );
    }
}
