//! A scripted Low-Latency HLS origin, as `tests/tests/live.rs` has it, and the names and bytes its players
//! check. From the origin's start (time zero) a new part is made every part duration
//! (`BENCH_LIVE_PART_MS`, default 200 ms), four parts to a segment; part `k` exists from the end of the
//! interval it covers, `t0 + (k + 1) × part`. Blocking playlist reloads (`_HLS_msn`, `_HLS_part`) and
//! requests for a part are held until that part exists, and refused (400) when that is more than
//! [`HOLD`] ahead, as RFC 8216bis §6.2.5.2 has a server refuse an `_HLS_msn` too far ahead.

use std::{
    fmt::Write,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use bytes::Bytes;
use hyper::{Response, StatusCode};

use crate::env_or;

pub const PARTS_PER_SEGMENT: u64 = 4;
pub const HOLD: Duration = Duration::from_secs(3);
pub const PLAYLIST: &str = "/live/index.m3u8";
/// The origin's time zero and sizes, as JSON, for the players (not counted as a request).
pub const CLOCK: &str = "/live/__t0";

/// The repeating pattern every part is cut from: `len` bytes starting anywhere in the first 251.
pub fn pattern(len: usize) -> Bytes {
    (0..len + 251).map(|i| (i % 251) as u8).collect()
}

/// Where part `k` starts in [`pattern`]: each part shifted by its number, so that a part served for another
/// (or a playlist served for a part) is caught.
pub fn part_shift(k: u64) -> usize {
    (k * 13 % 251) as usize
}

pub fn part_path(k: u64) -> String {
    format!(
        "/live/s{}.p{}.m4s",
        k / PARTS_PER_SEGMENT,
        k % PARTS_PER_SEGMENT
    )
}

/// The part a `/live/sN.pK.m4s` path names.
pub fn part_index(path: &str) -> Option<u64> {
    let (n, p) = path
        .strip_prefix("/live/s")?
        .strip_suffix(".m4s")?
        .split_once(".p")?;
    n.parse::<u64>()
        .ok()?
        .checked_mul(PARTS_PER_SEGMENT)?
        .checked_add(p.parse().ok()?)
}

/// The blocking reload for the playlist version that first lists part `k`.
pub fn reload_path(k: u64) -> String {
    format!(
        "{PLAYLIST}?_HLS_msn={}&_HLS_part={}",
        k / PARTS_PER_SEGMENT,
        k % PARTS_PER_SEGMENT
    )
}

/// The part a blocking reload's query waits for: `_HLS_msn` alone asks for the whole segment.
pub fn blocking(query: &str) -> Option<u64> {
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse::<u64>().ok())
    };
    param("_HLS_msn")?
        .checked_mul(PARTS_PER_SEGMENT)?
        .checked_add(param("_HLS_part").unwrap_or(PARTS_PER_SEGMENT - 1))
}

/// The part a playlist's preload hint names: the next one a player asks for.
pub fn hinted(playlist: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(playlist).ok()?;
    let uri = text
        .lines()
        .find_map(|l| l.strip_prefix("#EXT-X-PRELOAD-HINT:TYPE=PART,URI=\""))?
        .strip_suffix('"')?;
    part_index(&format!("/live/{uri}"))
}

/// The key the origin counts a live request under: a blocking reload by the part it waits for, whatever
/// order or extra parameters its query has, so that `/__count` of [`reload_path`] finds it.
pub fn counted(path: &str, query: Option<&str>) -> String {
    match query.and_then(blocking) {
        Some(k) if path == PLAYLIST => reload_path(k),
        _ => path.to_owned(),
    }
}

pub struct Live {
    t0: Instant,
    t0_unix_us: u128,
    part: Duration,
    part_bytes: usize,
    /// Segments the playlist lists: a sliding window keeps it at a few KiB however long the origin runs.
    window: u64,
    pattern: Bytes,
}

impl Live {
    /// Time zero is now; sizes from `BENCH_LIVE_PART_MS` (200), `BENCH_LIVE_PART_BYTES` (25 600: about
    /// 1 Mbit/s with 200 ms parts) and `BENCH_LIVE_WINDOW` (16 segments: a playlist of about 3.5 KiB).
    pub fn from_env() -> Live {
        let part_bytes = env_or("BENCH_LIVE_PART_BYTES", 25_600);
        let part = Duration::from_millis(env_or("BENCH_LIVE_PART_MS", 200));
        assert!(!part.is_zero(), "BENCH_LIVE_PART_MS must be above 0");
        Live {
            t0: Instant::now(),
            t0_unix_us: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_micros(),
            part,
            part_bytes,
            window: env_or::<u64>("BENCH_LIVE_WINDOW", 16).max(1),
            pattern: pattern(part_bytes),
        }
    }

    /// How many parts exist at `now`.
    fn made(&self, now: Instant) -> u64 {
        (now.saturating_duration_since(self.t0).as_micros() / self.part.as_micros()) as u64
    }

    /// None for a part too far ahead to be counted in an `Instant`.
    fn made_at(&self, k: u64) -> Option<Instant> {
        let n = u32::try_from(k.checked_add(1)?).ok()?;
        self.t0.checked_add(self.part.checked_mul(n)?)
    }

    pub fn clock(&self) -> String {
        format!(
            "{{\"t0_unix_us\": {}, \"part_us\": {}, \"part_bytes\": {}, \"parts_per_segment\": {}, \
             \"window_segments\": {}, \"made\": {}}}",
            self.t0_unix_us,
            self.part.as_micros(),
            self.part_bytes,
            PARTS_PER_SEGMENT,
            self.window,
            self.made(Instant::now())
        )
    }

    /// The media playlist once part `last` exists: the window's parts and a preload hint for the next one.
    fn playlist(&self, last: u64) -> Bytes {
        let seconds = |d: Duration| format!("{:.3}", d.as_secs_f64());
        let segment = self.part * PARTS_PER_SEGMENT as u32;
        let first = (last / PARTS_PER_SEGMENT).saturating_sub(self.window - 1);
        let mut text = format!(
            "#EXTM3U\n#EXT-X-VERSION:9\n#EXT-X-TARGETDURATION:{}\n#EXT-X-PART-INF:PART-TARGET={}\n\
             #EXT-X-SERVER-CONTROL:CAN-BLOCK-RELOAD=YES,PART-HOLD-BACK={}\n#EXT-X-MEDIA-SEQUENCE:{first}\n",
            segment.as_secs_f64().ceil() as u64,
            seconds(self.part),
            seconds(self.part * 3),
        );
        for k in first * PARTS_PER_SEGMENT..=last {
            let uri = &part_path(k)["/live/".len()..];
            let _ = writeln!(
                text,
                "#EXT-X-PART:DURATION={},URI=\"{uri}\"",
                seconds(self.part)
            );
            if k % PARTS_PER_SEGMENT == PARTS_PER_SEGMENT - 1 {
                let _ = write!(
                    text,
                    "#EXTINF:{},\ns{}.m4s\n",
                    seconds(segment),
                    k / PARTS_PER_SEGMENT
                );
            }
        }
        let next = &part_path(last + 1)["/live/".len()..];
        let _ = writeln!(text, "#EXT-X-PRELOAD-HINT:TYPE=PART,URI=\"{next}\"");
        Bytes::from(text)
    }

    /// Waits until part `k` exists; false (at once) when that is further ahead than a hold.
    async fn until_made(&self, k: u64) -> bool {
        match self.made_at(k) {
            Some(at) if at <= Instant::now() + HOLD => {
                tokio::time::sleep_until(at.into()).await;
                true
            }
            _ => false,
        }
    }

    pub async fn respond(&self, path: &str, query: Option<&str>) -> Response<Bytes> {
        let refused = || {
            Response::builder()
                .status(StatusCode::BAD_REQUEST)
                .body(Bytes::from_static(b"too far ahead\n"))
                .unwrap()
        };
        if path == PLAYLIST {
            // A plain load gets the newest version; before part 0 exists, that is the one listing it.
            let wanted = query
                .and_then(blocking)
                .unwrap_or_else(|| self.made(Instant::now()).saturating_sub(1));
            if !self.until_made(wanted).await {
                return refused();
            }
            // A reload for a part made a while ago gets the current playlist, as a live server would.
            let last = wanted.max(self.made(Instant::now()).saturating_sub(1));
            return Response::builder()
                .header("cache-control", "max-age=1")
                .header("content-type", "application/vnd.apple.mpegurl")
                .body(self.playlist(last))
                .unwrap();
        }
        let Some(k) = part_index(path) else {
            return Response::builder()
                .status(StatusCode::NOT_FOUND)
                .body(Bytes::from_static(b"no such thing\n"))
                .unwrap();
        };
        if !self.until_made(k).await {
            return refused();
        }
        let shift = part_shift(k);
        Response::builder()
            .header("cache-control", "max-age=60")
            .header("content-type", "video/mp4")
            .body(self.pattern.slice(shift..shift + self.part_bytes))
            .unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back() {
        for k in [0, 3, 4, 1234567] {
            assert_eq!(part_index(&part_path(k)), Some(k));
            let reload = reload_path(k);
            let (_, query) = reload.split_once('?').unwrap();
            assert_eq!(blocking(query), Some(k));
            assert_eq!(counted(PLAYLIST, Some(query)), reload_path(k));
        }
        assert_eq!(blocking("_HLS_msn=2"), Some(11), "the whole segment");
        assert_eq!(
            counted(PLAYLIST, Some("x=1&_HLS_part=1&_HLS_msn=2")),
            reload_path(9)
        );
        assert_eq!(counted(PLAYLIST, None), PLAYLIST);
        assert_eq!(part_index("/live/s1.m4s"), None);
    }

    #[test]
    fn a_playlist_lists_its_window_and_hints_the_next_part() {
        let live = Live::from_env();
        for last in [0, 5, 4000] {
            let text = live.playlist(last);
            assert_eq!(hinted(&text), Some(last + 1));
            assert!(text.len() < 6 * 1024, "{} bytes", text.len());
            let listed = std::str::from_utf8(&text)
                .unwrap()
                .matches("#EXT-X-PART:")
                .count() as u64;
            assert_eq!(
                listed,
                last + 1 - (last / PARTS_PER_SEGMENT).saturating_sub(15) * PARTS_PER_SEGMENT
            );
        }
    }
}
