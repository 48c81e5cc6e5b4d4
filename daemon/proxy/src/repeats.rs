//! Warnings about a failing backend, one per cause per [`WINDOW`]: an origin that is down fails every
//! request, and one line per request would flood the journal and hide everything else in it. The first
//! failure of a kind is written at once; the ones like it that follow are counted, and written as one line
//! with their count when the window ends.

use std::{
    collections::HashMap,
    sync::{LazyLock, Mutex},
    time::Duration,
};

use tokio::time::Instant;

/// How long the failures like a written one are counted before their count is written.
pub(crate) const WINDOW: Duration = Duration::from_secs(10);

/// Causes remembered at most; past it, those whose window has ended are forgotten first.
const MAX_CAUSES: usize = 1024;

/// What the failures of causes past [`MAX_CAUSES`] are counted as, together.
const OTHER: &str = "failures of other causes, past 1024 causes in one window";

/// The process's warnings: what the log rate-limits is the journal's flood, whichever worker writes it.
pub(crate) static WARNINGS: LazyLock<Repeats> = LazyLock::new(Repeats::default);

/// Counts of the lines held back, by what they say.
#[derive(Debug, Default)]
pub(crate) struct Repeats {
    causes: Mutex<HashMap<String, Window>>,
}

#[derive(Debug)]
struct Window {
    started: Instant,
    held: u64,
}

impl Repeats {
    /// Writes `what` failed with `error` (a backend's error names the backend and the cause) at `WARN`,
    /// with `key` (the request it failed), unless a line like it was written within [`WINDOW`]: then it
    /// is counted, and the count is written when the window ends.
    pub(crate) fn warn(
        &'static self,
        what: &'static str,
        key: &str,
        error: &dyn std::fmt::Display,
    ) {
        let cause = format!("{what}: {error}");
        if self.admit(&cause, Instant::now()) {
            tracing::warn!(key, error = %error, "{what}");
        }
    }

    /// Whether a line saying `cause` is written now; when it is held back and is the first of its
    /// window to be, a task writes the window's count when it ends. Past [`MAX_CAUSES`] causes seen
    /// within one window, the others share one count ([`OTHER`]): a flood of distinct causes is held back
    /// as one.
    fn admit(&'static self, mut cause: &str, now: Instant) -> bool {
        let mut causes = self.causes.lock().expect("repeats mutex");
        if !causes.contains_key(cause) {
            if causes.len() >= MAX_CAUSES {
                causes.retain(|_, w| now.duration_since(w.started) < WINDOW || w.held > 0);
            }
            if causes.len() >= MAX_CAUSES {
                cause = OTHER;
            }
            if !causes.contains_key(cause) {
                causes.insert(
                    cause.to_owned(),
                    Window {
                        started: now,
                        held: 0,
                    },
                );
                return true;
            }
        }
        self.held_back(&mut causes, cause, now)
    }

    /// For a `cause` already seen: whether its line is written now (a whole window went by without
    /// one), or else counted.
    fn held_back(
        &'static self,
        causes: &mut HashMap<String, Window>,
        cause: &str,
        now: Instant,
    ) -> bool {
        let w = causes.get_mut(cause).expect("a cause seen before");
        if w.held == 0 && now.duration_since(w.started) >= WINDOW {
            // Quiet for a whole window: this one starts the next.
            w.started = now;
            return true;
        }
        w.held += 1;
        if w.held == 1 {
            let ends = w.started + WINDOW;
            let cause = cause.to_owned();
            tokio::spawn(async move {
                tokio::time::sleep_until(ends).await;
                self.window_ended(&cause);
            });
        }
        false
    }

    /// Writes the count of `cause`'s lines held back in the window that just ended, and opens the next
    /// window: while the failures go on, one line per window.
    fn window_ended(&self, cause: &str) {
        let held = {
            let mut causes = self.causes.lock().expect("repeats mutex");
            let Some(w) = causes.get_mut(cause) else {
                return;
            };
            let held = w.held;
            *w = Window {
                started: Instant::now(),
                held: 0,
            };
            held
        };
        tracing::warn!(
            "{cause} (and {held} more like it in the last {} s)",
            WINDOW.as_secs()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_line_per_cause_per_window() {
        let repeats: &'static Repeats = Box::leak(Box::default());
        let t0 = Instant::now();
        assert!(repeats.admit("fetch failed: backend a unreachable", t0));
        assert!(repeats.admit("fetch failed: backend b unreachable", t0));
        for _ in 0..199 {
            assert!(!repeats.admit("fetch failed: backend a unreachable", t0));
        }
        let held = |cause: &str| repeats.causes.lock().unwrap()[cause].held;
        assert_eq!(held("fetch failed: backend a unreachable"), 199);
        tokio::time::sleep(WINDOW + Duration::from_millis(1)).await;
        // Counted and written: the next window starts empty, and holds back what comes in it.
        assert_eq!(held("fetch failed: backend a unreachable"), 0);
        assert!(!repeats.admit("fetch failed: backend a unreachable", Instant::now()));
        assert!(repeats.admit("fetch failed: backend b unreachable", Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_distinct_causes_is_held_back_as_one() {
        let repeats: &'static Repeats = Box::leak(Box::default());
        let t0 = Instant::now();
        let written = (0..10_000)
            .filter(|n| repeats.admit(&format!("fetch failed: error {n}"), t0))
            .count();
        // One line per cause that found room, one for the rest; the rest counted.
        assert_eq!(written, MAX_CAUSES + 1);
        let causes = repeats.causes.lock().unwrap();
        assert_eq!(causes.len(), MAX_CAUSES + 1);
        assert_eq!(causes[OTHER].held, 10_000 - MAX_CAUSES as u64 - 1);
    }
}
