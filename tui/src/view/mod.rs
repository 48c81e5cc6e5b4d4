//! The screen as a pure function of [`State`], so it can be tested on ratatui's `TestBackend`.

mod cluster;
mod counters;
mod help;
mod latency;
mod overview;
mod rules;
mod top;

use ratatui::{
    backend::TestBackend,
    layout::{Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::Paragraph,
    Frame, Terminal,
};

use crate::state::{State, View};

/// Colours that read on dark and light backgrounds alike (no white, black or grey text); without colour,
/// emphasis comes from bold, reverse video and distinct glyphs.
pub struct Theme {
    pub color: bool,
}

impl Theme {
    fn styled(&self, color: Color, fallback: Modifier) -> Style {
        if self.color {
            Style::default().fg(color).add_modifier(Modifier::BOLD)
        } else {
            Style::default().add_modifier(fallback)
        }
    }

    fn accent(&self) -> Style {
        self.styled(Color::Cyan, Modifier::BOLD)
    }

    fn good(&self) -> Style {
        self.styled(Color::Green, Modifier::BOLD)
    }

    fn warn(&self) -> Style {
        self.styled(Color::Yellow, Modifier::BOLD)
    }

    fn alert(&self) -> Style {
        self.styled(Color::Red, Modifier::REVERSED)
    }

    fn title(&self) -> Style {
        Style::default().add_modifier(Modifier::BOLD)
    }
}

/// `1234`, `98.8k`, `12.3M`: totals that fit a column.
fn count(n: u64) -> String {
    match n {
        0..100_000 => n.to_string(),
        100_000..100_000_000 => format!("{:.1}k", n as f64 / 1e3),
        _ => format!("{:.1}M", n as f64 / 1e6),
    }
}

/// A rate per second, or `-` before there are two samples.
fn rate(r: Option<f64>) -> String {
    match r {
        None => "-".into(),
        Some(r) if r < 10.0 => format!("{r:.1}/s"),
        Some(r) => format!("{}/s", count(r.round() as u64)),
    }
}

fn percent(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |r| format!("{:.1} %", r * 100.0))
}

pub fn render(frame: &mut Frame, state: &State, theme: &Theme) {
    let [header, body, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    render_header(frame, header, state, theme);
    match state.view {
        View::Overview => overview::render(frame, body, state, theme),
        View::Counters => counters::render(frame, body, state, theme),
        View::Cluster => cluster::render(frame, body, state, theme),
        View::Rules => rules::render(frame, body, state, theme),
        View::Latency => latency::render(frame, body, state, theme),
        View::Top => top::render(frame, body, state, theme),
    }
    render_footer(frame, footer, state, theme);
    if state.help {
        help::render(frame, body, theme);
    }
}

fn render_header(frame: &mut Frame, area: Rect, state: &State, theme: &Theme) {
    let mut spans = vec![
        Span::styled("cachetop ", theme.accent()),
        Span::raw(format!("{}  ", state.addr)),
    ];
    if let (Some(stats), None) = (&state.latest, &state.error) {
        spans.push(Span::raw(format!("lacquerd {}  ", stats.version)));
    }
    spans.push(match (&state.error, state.paused) {
        (Some(e), _) => Span::styled(format!("disconnected — retrying ({e})"), theme.alert()),
        (None, true) => Span::styled("paused (p resumes)", theme.warn()),
        (None, false) => match state.uptime() {
            Some(up) => Span::raw(format!("up {}", lacquer_admin::format::duration(up))),
            None => Span::raw("connecting…"),
        },
    });
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

fn render_footer(frame: &mut Frame, area: Rect, state: &State, theme: &Theme) {
    let line = if state.editing {
        Line::from(vec![
            Span::styled("filter: ", theme.accent()),
            Span::raw(format!("{}▏", state.filter)),
            Span::raw("  enter keep  esc clear"),
        ])
    } else {
        let mut keys = "q quit  tab view  c cluster  r rules  l latency  t top  ? help".to_owned();
        if matches!(state.view, View::Counters | View::Rules) {
            keys += "  ↑↓ scroll";
        }
        Line::from(keys)
    };
    frame.render_widget(Paragraph::new(line), area);
}

/// One frame rendered off-screen as plain text (`cachetop --once`, and tests).
pub fn to_text(state: &State, theme: &Theme, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test backend");
    terminal
        .draw(|f| render(f, state, theme))
        .expect("drawing off-screen cannot fail");
    let buf = terminal.backend().buffer();
    (0..height)
        .map(|y| {
            let line: String = (0..width).map(|x| buf[(x, y)].symbol()).collect();
            line.trim_end().to_owned() + "\n"
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::{Duration, Instant};

    use lacquer_admin::wire::{
        BackendHealth, BackendList, BackendView, LastError, ListenerCounters, ListenerStats,
        ProxyStats, RuleMatches, Stats, StoreStats,
    };

    use super::*;

    /// A daemon two samples into a busy minute: 200 requests/s, a third of them hits from disk.
    pub fn busy() -> State {
        let sample = |n: u64| Stats {
            version: "0.1.0".into(),
            uptime_seconds: 3_725 + n,
            proxy: ProxyStats {
                requests: 10_000 + 200 * n,
                hits: 6_000 + 150 * n,
                hits_memory: 4_000 + 100 * n,
                hits_disk: 2_000 + 50 * n,
                misses: 3_000 + 40 * n,
                passes: 1_000 + 10 * n,
                stale_served: 20 + n,
                backend_requests: 4_000 + 50 * n,
                backend_errors: 3 + n,
                coalesced_waiters: 500 + 5 * n,
                fetches_in_flight: 3,
                bytes_out: 50_000_000 + 400_000 * n,
                compress_in: 8_000_000,
                compress_out: 2_000_000,
                decoded_gzip: 100 + 3 * n,
                ..Default::default()
            },
            store: StoreStats {
                objects: 1_234,
                stored_bytes: 300 << 20,
                memory_bytes_used: 64 << 20,
                memory_bytes_capacity: 256 << 20,
                disk_bytes_used: 512 << 20,
                disk_bytes_capacity: 2 << 30,
                memory_evictions: 100 + 7 * n,
                bans: 3,
                bans_pending: 1,
                lurker_records_tested: 40_000 + 20_000 * n,
                ..Default::default()
            },
            rules: [
                ("static", "request", 960 + 40 * n),
                ("strip-tracking", "backend_request", 250_000 + 100 * n),
                ("rule[2]", "deliver", 7),
            ]
            .into_iter()
            .map(|(rule, phase, matched)| RuleMatches {
                rule: rule.into(),
                phase: phase.into(),
                matched,
            })
            .collect(),
            listeners: vec![ListenerStats {
                address: "0.0.0.0:443".into(),
                tls: true,
                quic: true,
                counters: ListenerCounters {
                    connections: 900 + 2 * n,
                    requests_http2: 8_000 + 150 * n,
                    requests_http3: 2_000 + 50 * n,
                    bytes_out_http2: 40_000_000 + 300_000 * n,
                    bytes_out_http3: 10_000_000 + 100_000 * n,
                    ..Default::default()
                },
            }],
            ..Default::default()
        };
        let backends = |n: u64| BackendList {
            backends: vec![BackendView {
                name: "default".into(),
                address: "127.0.0.1:8080".into(),
                health: BackendHealth::Failing,
                admin: Default::default(),
                requests: 4_000 + 50 * n,
                errors: 3 + n,
                consecutive_failures: 1,
                last_success: Some(1),
                last_error: Some(LastError {
                    at: 2,
                    message: "backend 127.0.0.1:8080 answered 503 Service Unavailable".into(),
                }),
                probe: None,
                connections: 2,
                streams_reset: 0,
                responses: Default::default(),
                latency: Default::default(),
            }],
        };
        let mut state = State::new("127.0.0.1:6082".into());
        let t0 = Instant::now();
        for n in 0..3 {
            state.update(sample(n), t0 + Duration::from_secs(n));
            state.update_backends(backends(n), t0 + Duration::from_secs(n));
        }
        state
    }

    pub fn screen(state: &State, w: u16, h: u16) -> String {
        to_text(state, &Theme { color: false }, w, h)
    }

    #[test]
    fn the_header_says_where_what_and_how_it_is() {
        let mut state = busy();
        let s = screen(&state, 80, 24);
        assert!(
            s.starts_with("cachetop 127.0.0.1:6082  lacquerd 0.1.0  up 1h 2m\n"),
            "{s}"
        );
        assert!(
            s.ends_with("q quit  tab view  c cluster  r rules  l latency  t top  ? help\n"),
            "{s}"
        );
        state.paused = true;
        assert!(screen(&state, 80, 24).contains("paused (p resumes)"));
        state.disconnected("connection refused".into());
        assert!(screen(&state, 80, 24).contains("disconnected — retrying (connection refused)"));
    }

    #[test]
    fn tiny_and_huge_terminals_do_not_panic() {
        let mut state = busy();
        state.update_cluster(
            crate::state::tests::report(&[("n1", Some((10, 5, 0))), ("n2", None)]),
            Instant::now(),
        );
        for view in [
            View::Overview,
            View::Counters,
            View::Cluster,
            View::Rules,
            View::Latency,
            View::Top,
        ] {
            state.view = view;
            for help in [false, true] {
                state.help = help;
                for (w, h) in [(1, 1), (10, 3), (20, 5), (40, 12), (300, 100)] {
                    screen(&state, w, h);
                }
            }
        }
        screen(&State::new("x".into()), 80, 24);
    }

    #[test]
    fn totals_and_rates_are_compact() {
        assert_eq!(count(99_999), "99999");
        assert_eq!(count(123_456), "123.5k");
        assert_eq!(count(123_456_789), "123.5M");
        assert_eq!(rate(None), "-");
        assert_eq!(rate(Some(2.25)), "2.2/s");
        assert_eq!(rate(Some(150_000.0)), "150.0k/s");
    }
}
