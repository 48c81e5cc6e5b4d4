//! Latency as `varnishhist` draws it: one row per bucket of the log scale, a bar per row whose glyphs say
//! how the cache answered (`|` hits, `#` misses, `+` passes, `~` stale, `.` made here), over the last ten
//! seconds; and each outcome's median and 99th percentile above it.

use lacquer_admin::wire::{Histogram, LATENCY_BOUNDS_US, LATENCY_BUCKETS};
use ratatui::{
    layout::Rect,
    style::Style,
    text::{Line, Span},
    widgets::{Block, Borders, Paragraph},
    Frame,
};

use super::{count, Theme};
use crate::state::State;

/// Each outcome's glyph, distinct without colour as `varnishhist`'s `|` and `#` are.
fn glyph(outcome: &str) -> char {
    match outcome {
        "hit" => '|',
        "miss" => '#',
        "pass" => '+',
        "stale" => '~',
        _ => '.',
    }
}

fn style(outcome: &str, theme: &Theme) -> Style {
    match outcome {
        "hit" => theme.good(),
        "miss" => theme.warn(),
        "pass" | "stale" => theme.accent(),
        _ => theme.alert(),
    }
}

/// `25µs`, `2.5ms`, `1s`: a bucket's bound.
fn bound(us: u64) -> String {
    match us {
        0..1_000 => format!("{us}µs"),
        1_000..1_000_000 => format!("{}ms", trim(us as f64 / 1e3)),
        _ => format!("{}s", trim(us as f64 / 1e6)),
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.1}");
    s.strip_suffix(".0").map_or(s.clone(), str::to_owned)
}

fn quantile(h: &Histogram, q: f64) -> String {
    match h.quantile_bound_us(q) {
        Some(us) => format!("≤{}", bound(us)),
        None if h.count() > 0 => {
            format!(">{}", bound(LATENCY_BOUNDS_US[LATENCY_BOUNDS_US.len() - 1]))
        }
        None => "-".into(),
    }
}

pub fn render(frame: &mut Frame, area: Rect, state: &State, theme: &Theme) {
    let (rows, span) = state.latency();
    let what = if state.latency_total {
        "to the end of the response"
    } else {
        "to the response head"
    };
    let when = match span {
        Some(n) => format!("last {n} s"),
        None => "since start".into(),
    };
    let block = Block::default().borders(Borders::ALL).title(Span::styled(
        format!(" latency {what}, {when} (d switches) "),
        theme.title(),
    ));
    if rows.is_empty() {
        let text = match &state.latest {
            Some(_) => "no latency histograms (a daemon without them)",
            None => "waiting for statistics…",
        };
        frame.render_widget(Paragraph::new(text).block(block), area);
        return;
    }
    let mut lines = vec![Line::from(
        rows.iter()
            // Outcomes without requests in the window would only push the others off the line.
            .filter(|(_, h)| h.count() > 0)
            .flat_map(|(outcome, h)| {
                [
                    Span::styled(
                        format!("{} {outcome}", glyph(outcome)),
                        style(outcome, theme),
                    ),
                    Span::raw(format!(
                        " {} p50 {} p99 {}   ",
                        count(h.count()),
                        quantile(h, 0.5),
                        quantile(h, 0.99)
                    )),
                ]
            })
            .collect::<Vec<_>>(),
    )];
    let label_width = 8;
    let inner_width = usize::from(area.width.saturating_sub(2));
    let bar_width = inner_width.saturating_sub(label_width + 10);
    let per_bucket: Vec<u64> = (0..LATENCY_BUCKETS)
        .map(|b| {
            rows.iter()
                .map(|(_, h)| h.counts.get(b).copied().unwrap_or(0))
                .sum()
        })
        .collect();
    let highest = per_bucket.iter().copied().max().unwrap_or(0).max(1);
    let shown = usize::from(area.height.saturating_sub(3));
    // The buckets that hold something, with the empty ones between them: the scale keeps its steps.
    let first = per_bucket.iter().position(|&n| n > 0).unwrap_or(0);
    let last = per_bucket.iter().rposition(|&n| n > 0).unwrap_or(0);
    let (first, last) = if last + 1 - first < shown {
        let spare = shown - (last + 1 - first);
        let first = first.saturating_sub(spare / 2);
        (first, (first + shown - 1).min(LATENCY_BUCKETS - 1))
    } else {
        (first, last)
    };
    for b in (first..=last).take(shown) {
        let label = match LATENCY_BOUNDS_US.get(b) {
            Some(&us) => format!("≤{}", bound(us)),
            None => "more".into(),
        };
        let mut spans = vec![Span::raw(format!("{label:>label_width$} "))];
        let mut drawn = 0;
        for (outcome, h) in &rows {
            let n = h.counts.get(b).copied().unwrap_or(0);
            // Any request shows, however long the longest bar.
            let cells = match n {
                0 => 0,
                n => ((n as f64 / highest as f64 * bar_width as f64).round() as usize).max(1),
            };
            let cells = cells.min(bar_width.saturating_sub(drawn));
            drawn += cells;
            if cells > 0 {
                spans.push(Span::styled(
                    glyph(outcome).to_string().repeat(cells),
                    style(outcome, theme),
                ));
            }
        }
        if per_bucket[b] > 0 {
            spans.push(Span::raw(format!(" {}", count(per_bucket[b]))));
        }
        lines.push(Line::from(spans));
    }
    frame.render_widget(Paragraph::new(lines).block(block), area);
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use lacquer_admin::wire::{Latency, OutcomeLatency, Stats};

    use super::super::tests::screen;
    use super::*;
    use crate::state::View;

    fn histogram(buckets: &[(usize, u64)]) -> Histogram {
        let mut counts = vec![0; LATENCY_BUCKETS];
        for &(b, n) in buckets {
            counts[b] = n;
        }
        Histogram { counts, sum_us: 0 }
    }

    fn sample(scale: u64) -> Stats {
        let outcome = |name: &str, ttfb: &[(usize, u64)]| OutcomeLatency {
            outcome: name.into(),
            latency: Latency {
                ttfb: histogram(
                    &ttfb
                        .iter()
                        .map(|&(b, n)| (b, n * scale))
                        .collect::<Vec<_>>(),
                ),
                total: histogram(&[(12, scale)]),
            },
        };
        Stats {
            version: "0.1.0".into(),
            latency: vec![
                outcome("hit", &[(1, 40), (2, 20)]),
                outcome("miss", &[(9, 10), (10, 5)]),
                outcome("pass", &[(10, 2)]),
                outcome("stale", &[]),
                outcome("synth", &[(0, 1)]),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn hits_and_misses_stand_apart_over_the_window() {
        let mut state = State::new("127.0.0.1:6082".into());
        state.view = View::Latency;
        let t0 = Instant::now();
        for n in 0..3 {
            state.update(sample(n + 1), t0 + Duration::from_secs(n));
        }
        let s = screen(&state, 120, 30);
        insta::assert_snapshot!(s);
        assert!(s.contains("latency to the response head, last 2 s"), "{s}");
        // Two seconds of growth: 2 × 40 hits in the 50 µs bucket.
        assert!(s.contains("| hit 120 p50 ≤50µs p99 ≤100µs"), "{s}");
        assert!(s.contains("# miss 30 p50 ≤25ms p99 ≤50ms"), "{s}");
        assert!(s.contains(". synth 2 "), "{s}");
        assert!(!s.contains("~ stale"), "no stale in the window: {s}");
        let hits_row = s
            .lines()
            .find(|l| l.contains("  ≤50µs "))
            .expect("50 µs row");
        assert!(
            hits_row.contains("||||") && hits_row.contains("| 80 "),
            "{hits_row}"
        );
        let mixed = s
            .lines()
            .find(|l| l.contains("  ≤50ms "))
            .expect("50 ms row");
        assert!(mixed.contains("#+") && mixed.contains(" 14 "), "{mixed}");
        state.latency_total = true;
        let s = screen(&state, 120, 30);
        assert!(
            s.contains("latency to the end of the response, last 2 s"),
            "{s}"
        );
        assert!(s.contains("≤250ms"), "{s}");
    }

    #[test]
    fn one_sample_counts_since_start_and_none_waits() {
        let mut state = State::new("x".into());
        state.view = View::Latency;
        assert!(screen(&state, 80, 24).contains("waiting for statistics"));
        state.update(sample(1), Instant::now());
        let s = screen(&state, 80, 24);
        assert!(s.contains("since start"), "{s}");
        assert!(s.contains("| hit 60 "), "{s}");
    }

    #[test]
    fn bounds_read_as_durations() {
        let cases = [
            (25, "25µs"),
            (2_500, "2.5ms"),
            (1_000, "1ms"),
            (1_000_000, "1s"),
            (30_000_000, "30s"),
        ];
        for (us, text) in cases {
            assert_eq!(bound(us), text);
        }
    }
}
