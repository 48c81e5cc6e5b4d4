//! The overview: traffic rates with sparklines, the hit ratio and its split, the two tiers, coalescing and
//! bans, backends, and the request rate over the last minutes.

use lacquer_admin::format::bytes;
use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::{Color, Style},
    text::{Line, Span},
    widgets::{Block, Borders, Gauge, LineGauge, Paragraph, Sparkline},
    Frame,
};

use super::{count, percent, rate, Theme};
use crate::state::{State, SERIES};

pub fn render(frame: &mut Frame, area: Rect, state: &State, theme: &Theme) {
    let lower = (2 * state.backends.len().max(1) as u16 + 2).max(6);
    let [traffic, tiers, work, requests] = Layout::vertical([
        Constraint::Length(SERIES.len() as u16 + 2),
        Constraint::Length(7),
        Constraint::Length(lower),
        Constraint::Min(0),
    ])
    .areas(area);
    render_traffic(frame, traffic, state, theme);
    let halves = || Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]);
    let [cache, storage] = halves().areas(tiers);
    render_cache(frame, cache, state, theme);
    render_storage(frame, storage, state, theme);
    let [coalescing, backends] = halves().areas(work);
    render_work(frame, coalescing, state, theme);
    render_backends(frame, backends, state, theme);
    if requests.height >= 3 {
        render_requests(frame, requests, state, theme);
    }
}

fn panel(title: &str, theme: &Theme) -> Block<'static> {
    Block::default()
        .borders(Borders::ALL)
        .title(Span::styled(format!(" {title} "), theme.title()))
}

/// The newest samples that fit `width`.
fn tail(history: &std::collections::VecDeque<u64>, width: u16) -> Vec<u64> {
    let skip = history.len().saturating_sub(usize::from(width));
    history.iter().skip(skip).copied().collect()
}

fn render_traffic(frame: &mut Frame, area: Rect, state: &State, theme: &Theme) {
    let block = panel("traffic: rate, total since start, last minutes", theme);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let rows = Layout::vertical([Constraint::Length(1); SERIES.len()]).split(inner);
    for (i, (label, fields)) in SERIES.iter().enumerate() {
        let [name, per_sec, total, chart] = Layout::horizontal([
            Constraint::Length(9),
            Constraint::Length(12),
            Constraint::Length(10),
            Constraint::Min(0),
        ])
        .spacing(1)
        .areas(rows[i]);
        let sum: Option<u64> = fields.iter().map(|f| state.value(f)).sum();
        let (rate_text, total_text) = if *label == "bytes out" {
            (
                state
                    .series_rate(i)
                    .map_or_else(|| "-".into(), |r| format!("{}/s", bytes(r as u64))),
                sum.map_or_else(|| "-".into(), bytes),
            )
        } else {
            (
                rate(state.series_rate(i)),
                sum.map_or_else(|| "-".into(), count),
            )
        };
        frame.render_widget(Paragraph::new(*label), name);
        frame.render_widget(Paragraph::new(rate_text).right_aligned(), per_sec);
        frame.render_widget(Paragraph::new(total_text).right_aligned(), total);
        let style = if *label == "errors" {
            theme.alert()
        } else {
            theme.accent()
        };
        let data = tail(state.history(i), chart.width);
        frame.render_widget(Sparkline::default().data(&data).style(style), chart);
    }
}

fn render_cache(frame: &mut Frame, area: Rect, state: &State, theme: &Theme) {
    let block = panel("cache", theme);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let [gauge, bar, legend, stale, coding] =
        Layout::vertical([Constraint::Length(1); 5]).areas(inner);
    let ratio = state.hit_ratio();
    frame.render_widget(
        Gauge::default()
            .gauge_style(theme.good())
            .ratio(ratio.unwrap_or(0.0).clamp(0.0, 1.0))
            .label(format!("hit ratio {}", percent(ratio))),
        gauge,
    );
    let Some(split) = state.split() else {
        return;
    };
    // Each share gets its own glyph as well as its own colour, so the bar reads without colour.
    let parts = [
        ("mem", split.memory, "█", Color::Green),
        ("disk", split.disk, "▓", Color::Cyan),
        ("miss", split.miss, "▒", Color::Yellow),
        ("pass", split.pass, "░", Color::Magenta),
    ];
    let width = f64::from(bar.width);
    let mut used = 0usize;
    let mut spans = Vec::new();
    for (i, (_, share, glyph, color)) in parts.iter().enumerate() {
        let cells = if i == parts.len() - 1 {
            usize::from(bar.width).saturating_sub(used)
        } else {
            (share * width).round() as usize
        };
        let cells = cells.min(usize::from(bar.width).saturating_sub(used));
        used += cells;
        let style = if theme.color {
            Style::default().fg(*color)
        } else {
            Style::default()
        };
        spans.push(Span::styled(glyph.repeat(cells), style));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), bar);
    let text: Vec<String> = parts
        .iter()
        .map(|(name, share, glyph, _)| format!("{glyph}{name} {:.0}%", share * 100.0))
        .collect();
    frame.render_widget(Paragraph::new(text.join(" ")), legend);
    frame.render_widget(
        Paragraph::new(format!(
            "stale {} grace, {} on error",
            rate(state.rate("proxy.stale_served")),
            rate(state.rate("proxy.stale_on_error")),
        )),
        stale,
    );
    frame.render_widget(
        Paragraph::new(format!(
            "compressed to {}, {} decoded",
            percent(compression_ratio(state)),
            rate(
                ["br", "gzip", "zstd"]
                    .iter()
                    .map(|c| state.rate(&format!("proxy.decoded_{c}")))
                    .sum()
            )
        )),
        coding,
    );
}

/// Stored bytes after compression over bytes before, since the start.
fn compression_ratio(state: &State) -> Option<f64> {
    let before = state.value("proxy.compress_in").filter(|n| *n > 0)?;
    Some(state.value("proxy.compress_out")? as f64 / before as f64)
}

fn render_storage(frame: &mut Frame, area: Rect, state: &State, theme: &Theme) {
    let block = panel("storage", theme);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let rows = Layout::vertical([Constraint::Length(1); 4]).split(inner);
    let v = |name: &str| state.value(name).unwrap_or(0);
    for (row, (label, used, capacity)) in [
        (
            rows[0],
            (
                "memory",
                v("store.memory_bytes_used"),
                v("store.memory_bytes_capacity"),
            ),
        ),
        (
            rows[1],
            (
                "disk  ",
                v("store.disk_bytes_used"),
                v("store.disk_bytes_capacity"),
            ),
        ),
    ] {
        let ratio = if capacity == 0 {
            0.0
        } else {
            (used as f64 / capacity as f64).clamp(0.0, 1.0)
        };
        let label = format!(
            "{label} {}/{} {:>3.0}%",
            bytes(used),
            bytes(capacity),
            ratio * 100.0
        );
        frame.render_widget(
            LineGauge::default()
                .filled_symbol("━")
                .unfilled_symbol("─")
                .filled_style(theme.accent())
                .ratio(ratio)
                .label(label),
            row,
        );
    }
    // What `/v1/health` would call degraded, from the same gauges.
    let problems: Vec<&str> = [
        ("store.disk_full", "disk full"),
        ("store.memory_only", "memory-only"),
        ("store.damaged_at_start", "started empty"),
        ("store.tasks_failed", "task died"),
    ]
    .into_iter()
    .filter(|(name, _)| v(name) > 0)
    .map(|(_, what)| what)
    .collect();
    // A degraded store takes the objects line: it matters more.
    let objects = if problems.is_empty() {
        Span::raw(format!(
            "objects {} ({})",
            count(v("store.objects")),
            bytes(v("store.stored_bytes"))
        ))
    } else {
        Span::styled(format!("DEGRADED: {}", problems.join(", ")), theme.alert())
    };
    frame.render_widget(Paragraph::new(Line::from(objects)), rows[2]);
    let drops = state.rate("store.foyer_drops");
    let drops_style = if drops.is_some_and(|d| d > 0.0) {
        theme.alert()
    } else {
        Style::default()
    };
    frame.render_widget(
        Paragraph::new(Line::from(vec![
            Span::raw(format!(
                "evict {}  lost {}  ",
                rate(state.rate("store.memory_evictions")),
                rate(state.rate("proxy.bodies_lost"))
            )),
            Span::styled(format!("drops {}", rate(drops)), drops_style),
        ])),
        rows[3],
    );
}

fn render_work(frame: &mut Frame, area: Rect, state: &State, theme: &Theme) {
    let v = |name: &str| state.value(name).unwrap_or(0);
    let lurker = if v("store.bans_pending") > 0 {
        format!(
            "walking, {} records",
            rate(state.rate("store.lurker_records_tested"))
        )
    } else {
        format!("idle ({} walks)", count(v("store.lurker_walks")))
    };
    let lines = vec![
        Line::from(format!(
            "waiters   {} attached to a fetch",
            rate(state.rate("proxy.coalesced_waiters"))
        )),
        Line::from(format!(
            "in flight {} fetches",
            v("proxy.fetches_in_flight")
        )),
        Line::from(format!(
            "bans      {} listed, {} pending",
            v("store.bans"),
            v("store.bans_pending")
        )),
        Line::from(format!("lurker    {lurker}")),
    ];
    frame.render_widget(
        Paragraph::new(lines).block(panel("coalescing & bans", theme)),
        area,
    );
}

fn render_backends(frame: &mut Frame, area: Rect, state: &State, theme: &Theme) {
    let mut lines = Vec::new();
    for row in &state.backends {
        let b = &row.backend;
        let health_style = match b.health.as_str() {
            "healthy" => theme.good(),
            "failing" | "sick" => theme.alert(),
            _ => Style::default(),
        };
        lines.push(Line::from(vec![
            Span::raw(format!("{} {} ", b.name, b.address)),
            Span::styled(b.health.as_str(), health_style),
        ]));
        lines.push(Line::from(format!(
            "  {} fetches, {} errors",
            rate(row.fetch_rate),
            percent(row.error_ratio)
        )));
    }
    if lines.is_empty() {
        lines.push(Line::from("-"));
    }
    frame.render_widget(Paragraph::new(lines).block(panel("backends", theme)), area);
}

fn render_requests(frame: &mut Frame, area: Rect, state: &State, theme: &Theme) {
    let history = state.history(0);
    let width = area.width.saturating_sub(2);
    let data = tail(history, width);
    let peak = data.iter().copied().max().unwrap_or(0);
    let title = format!("requests/s, last {} s, peak {}", data.len(), count(peak));
    frame.render_widget(
        Sparkline::default()
            .block(panel(&title, theme))
            .style(theme.accent())
            .data(&data),
        area,
    );
}

#[cfg(test)]
mod tests {
    use super::super::tests::{busy, screen};

    #[test]
    fn the_overview_at_80x24() {
        let s = screen(&busy(), 80, 24);
        insta::assert_snapshot!(s);
        for want in [
            "│requests         200/s      10400 ",
            "│hits             150/s       6300 ",
            "│bytes out  390.6 KiB/s   48.4 MiB ",
            "hit ratio 60.6 %",
            "█mem 40% ▓disk 20% ▒miss 30% ░pass 10%",
            "stale 1.0/s grace, 0.0/s on error",
            "compressed to 25.0 %, 3.0/s decoded",
            "memory 64.0 MiB/256.0 MiB  25%",
            "disk   512.0 MiB/2.0 GiB  25%",
            "objects 1234 (300.0 MiB)",
            "evict 7.0/s  lost 0.0/s  drops 0.0/s",
            "waiters   5.0/s attached to a fetch",
            "lurker    walking, 20000/s records",
            "default 127.0.0.1:8080 failing",
            "50/s fetches, 2.0 % errors",
        ] {
            assert!(s.contains(want), "{want:?} not in\n{s}");
        }
    }

    #[test]
    fn a_degraded_store_shows_why() {
        let mut state = busy();
        let mut stats = state.latest.clone().expect("a sample");
        stats.store.disk_full = 1;
        stats.store.tasks_failed = 1;
        state.update(stats, std::time::Instant::now());
        let s = screen(&state, 80, 24);
        assert!(s.contains("DEGRADED: disk full, task died"), "{s}");
        assert!(!screen(&busy(), 80, 24).contains("DEGRADED"));
    }

    #[test]
    fn the_overview_at_160x48() {
        let s = screen(&busy(), 160, 48);
        insta::assert_snapshot!(s);
        assert!(s.contains("hit ratio 60.6 %"), "{s}");
        assert!(
            s.contains("requests/s, last 2 s, peak 200"),
            "the request chart fills the rest: {s}"
        );
    }
}
