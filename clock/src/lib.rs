//! The workspace's one clock.
//!
//! Stored objects, bans and purges carry wall-clock times in milliseconds since the Unix epoch, because they
//! outlive the process and are compared across restarts; durations measured within one process (timeouts,
//! hit-for-miss windows, latencies) use the monotonic clock, which a wall-clock step cannot disturb.
#![warn(missing_docs)]

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The wall clock now.
pub fn wall() -> SystemTime {
    SystemTime::now()
}

/// The wall clock now, in milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    to_ms(wall())
}

/// A wall-clock time in milliseconds since the Unix epoch; times before the epoch (a clock set far back)
/// count as the epoch itself.
pub fn to_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The wall-clock time `ms` milliseconds after the Unix epoch.
pub fn from_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// The monotonic clock now.
pub fn monotonic() -> Instant {
    Instant::now()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_round_trip_and_clamp_before_the_epoch() {
        let t = from_ms(1_700_000_000_123);
        assert_eq!(to_ms(t), 1_700_000_000_123);
        assert_eq!(to_ms(UNIX_EPOCH - Duration::from_secs(5)), 0);
        let before = now_ms();
        assert!(now_ms() >= before);
        assert!(
            before > 1_600_000_000_000,
            "the wall clock is in milliseconds"
        );
    }
}
