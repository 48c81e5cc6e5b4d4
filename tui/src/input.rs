//! Keys: what each does to the [`State`]. No terminal here, so every binding is unit-tested.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use crate::state::{State, View};

#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    Continue,
    Quit,
}

/// Rows a page key scrolls.
const PAGE: usize = 10;

pub fn handle(state: &mut State, key: KeyEvent) -> Action {
    if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
        return Action::Quit;
    }
    if state.editing {
        let plain = !key
            .modifiers
            .intersects(KeyModifiers::CONTROL | KeyModifiers::ALT);
        match key.code {
            KeyCode::Char(c) if plain => state.filter.push(c),
            KeyCode::Backspace => {
                state.filter.pop();
            }
            KeyCode::Enter => state.editing = false,
            KeyCode::Esc => {
                state.editing = false;
                state.filter.clear();
            }
            _ => {}
        }
        state.scroll = 0;
        return Action::Continue;
    }
    if state.help {
        state.help = false;
        return Action::Continue;
    }
    match key.code {
        // A kept filter is cleared first: one Esc too many must not end the session.
        KeyCode::Esc if !state.filter.is_empty() => {
            state.filter.clear();
            state.scroll = 0;
        }
        KeyCode::Char('q') | KeyCode::Esc => return Action::Quit,
        KeyCode::Tab | KeyCode::BackTab => {
            state.view = match state.view {
                View::Overview => View::Counters,
                View::Counters | View::Cluster | View::Rules | View::Latency | View::Top => {
                    View::Overview
                }
            }
        }
        KeyCode::Char('c') => {
            state.view = match state.view {
                View::Cluster => View::Overview,
                View::Overview | View::Counters | View::Rules | View::Latency | View::Top => {
                    View::Cluster
                }
            }
        }
        KeyCode::Char('r') => {
            state.view = match state.view {
                View::Rules => View::Overview,
                View::Overview | View::Counters | View::Cluster | View::Latency | View::Top => {
                    View::Rules
                }
            }
        }
        KeyCode::Char('l') => {
            state.view = match state.view {
                View::Latency => View::Overview,
                View::Overview | View::Counters | View::Cluster | View::Rules | View::Top => {
                    View::Latency
                }
            }
        }
        KeyCode::Char('t') => {
            state.view = match state.view {
                View::Top => View::Overview,
                View::Overview | View::Counters | View::Cluster | View::Rules | View::Latency => {
                    View::Top
                }
            }
        }
        KeyCode::Char('b') if state.view == View::Top => state.next_top_by(),
        KeyCode::Char('d') if state.view == View::Latency => {
            state.latency_total = !state.latency_total;
        }
        KeyCode::Char('p') | KeyCode::Char(' ') => state.paused = !state.paused,
        KeyCode::Char('/') => {
            state.view = View::Counters;
            state.editing = true;
        }
        KeyCode::Char('?') | KeyCode::Char('h') => state.help = true,
        KeyCode::Down | KeyCode::Char('j') => state.scroll += 1,
        KeyCode::Up | KeyCode::Char('k') => state.scroll = state.scroll.saturating_sub(1),
        KeyCode::PageDown => state.scroll += PAGE,
        KeyCode::PageUp => state.scroll = state.scroll.saturating_sub(PAGE),
        KeyCode::Home => state.scroll = 0,
        _ => {}
    }
    Action::Continue
}

#[cfg(test)]
mod tests {
    use super::*;

    fn press(state: &mut State, keys: &str) -> Action {
        let mut last = Action::Continue;
        for c in keys.chars() {
            last = handle(state, KeyEvent::from(KeyCode::Char(c)));
        }
        last
    }

    fn key(state: &mut State, code: KeyCode) -> Action {
        handle(state, KeyEvent::from(code))
    }

    #[test]
    fn views_pause_help_and_quit() {
        let mut s = State::default();
        assert_eq!(key(&mut s, KeyCode::Tab), Action::Continue);
        assert_eq!(s.view, View::Counters);
        key(&mut s, KeyCode::Tab);
        assert_eq!(s.view, View::Overview);
        for (keys, view) in [
            ("c", View::Cluster),
            ("c", View::Overview),
            ("c", View::Cluster),
        ] {
            press(&mut s, keys);
            assert_eq!(s.view, view, "after {keys}");
        }
        press(&mut s, "r");
        assert_eq!(s.view, View::Rules, "from the cluster to the rules");
        press(&mut s, "r");
        assert_eq!(s.view, View::Overview, "r again leaves the rules");
        press(&mut s, "d");
        assert!(!s.latency_total, "d only switches in the latency view");
        press(&mut s, "l");
        assert_eq!(s.view, View::Latency);
        press(&mut s, "d");
        assert!(s.latency_total, "d switches to the time to the end");
        press(&mut s, "dl");
        assert_eq!((s.view, s.latency_total), (View::Overview, false));
        press(&mut s, "r");
        key(&mut s, KeyCode::Tab);
        assert_eq!(s.view, View::Overview, "tab leaves the rules view");
        press(&mut s, "c");
        key(&mut s, KeyCode::Tab);
        assert_eq!(s.view, View::Overview, "tab leaves the cluster view");
        key(&mut s, KeyCode::Tab);
        press(&mut s, "c");
        assert_eq!(s.view, View::Cluster, "from the counters too");
        press(&mut s, "c");
        press(&mut s, "p");
        assert!(s.paused);
        press(&mut s, "p");
        assert!(!s.paused);
        press(&mut s, "?");
        assert!(s.help);
        assert_eq!(
            press(&mut s, "q"),
            Action::Continue,
            "a key closes help first"
        );
        assert!(!s.help);
        assert_eq!(press(&mut s, "q"), Action::Quit);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(handle(&mut State::default(), ctrl_c), Action::Quit);
    }

    #[test]
    fn slash_types_a_filter_until_enter_and_esc_clears_it() {
        let mut s = State::default();
        press(&mut s, "/banq");
        assert_eq!(
            (s.view, s.editing, s.filter.as_str()),
            (View::Counters, true, "banq")
        );
        key(&mut s, KeyCode::Backspace);
        key(&mut s, KeyCode::Enter);
        assert_eq!((s.editing, s.filter.as_str()), (false, "ban"));
        assert_eq!(press(&mut s, "/x"), Action::Continue);
        let alt_y = KeyEvent::new(KeyCode::Char('y'), KeyModifiers::ALT);
        handle(&mut s, alt_y);
        assert_eq!(
            s.filter, "banx",
            "alt and control combinations are not typed"
        );
        key(&mut s, KeyCode::Esc);
        assert_eq!((s.editing, s.filter.as_str()), (false, ""));
    }

    #[test]
    fn esc_clears_a_kept_filter_before_it_quits() {
        let mut s = State::default();
        press(&mut s, "/ban");
        key(&mut s, KeyCode::Enter);
        press(&mut s, "j");
        assert_eq!(key(&mut s, KeyCode::Esc), Action::Continue);
        assert_eq!(
            (s.filter.as_str(), s.scroll, s.view),
            ("", 0, View::Counters)
        );
        assert_eq!(
            key(&mut s, KeyCode::Esc),
            Action::Quit,
            "no filter left: Esc quits"
        );
        press(&mut s, "/ban");
        key(&mut s, KeyCode::Enter);
        assert_eq!(
            press(&mut s, "q"),
            Action::Quit,
            "q quits whatever the filter"
        );
    }

    #[test]
    fn scrolling_stays_at_or_above_zero() {
        let mut s = State::default();
        key(&mut s, KeyCode::Up);
        assert_eq!(s.scroll, 0);
        key(&mut s, KeyCode::PageDown);
        key(&mut s, KeyCode::Down);
        assert_eq!(s.scroll, 11);
        key(&mut s, KeyCode::Home);
        assert_eq!(s.scroll, 0);
    }
}
