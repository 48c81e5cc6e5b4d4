//! Client-side latency by cache outcome, and client responses by status code: what `varnishhist` draws and
//! Prometheus' request histograms hold. Observed for every request as its response leaves `Service::call`:
//! the time to the head when the response is handed to the connection, the time to the end of its body
//! when the body ends or is dropped.

use http::HeaderMap;

use crate::{fields::X_CACHE, respond};

/// An outcome, as an index into [`OUTCOMES`](lacquer_admin::wire::OUTCOMES).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outcome(usize);

impl Outcome {
    const HIT: Self = Self(0);
    const MISS: Self = Self(1);
    const PASS: Self = Self(2);
    const STALE: Self = Self(3);
    /// What lacquerd made itself: an error, a refusal, a rule's page, an answer to `OPTIONS *` or a purge.
    pub(crate) const SYNTH: Self = Self(4);

    /// Its place in the histograms.
    pub(crate) fn index(self) -> usize {
        self.0
    }

    /// `hit`, `miss`, `pass`, `stale` or `synth`.
    pub(crate) fn name(self) -> &'static str {
        lacquer_admin::wire::OUTCOMES[self.0]
    }

    /// Read off a response another node made: its `X-Cache`, its verdict on the wire.
    pub(crate) fn from_x_cache(headers: &HeaderMap) -> Self {
        match headers.get(X_CACHE).map(|v| v.as_bytes()) {
            Some(b"HIT") => Self::HIT,
            Some(b"MISS") => Self::MISS,
            Some(b"PASS") => Self::PASS,
            Some(b"STALE") => Self::STALE,
            _ => Self::SYNTH,
        }
    }
}

impl From<respond::Outcome> for Outcome {
    fn from(outcome: respond::Outcome) -> Self {
        match outcome {
            respond::Outcome::Hit { .. } => Self::HIT,
            respond::Outcome::Stale { .. } => Self::STALE,
            respond::Outcome::Miss { .. } => Self::MISS,
            respond::Outcome::Pass { .. } => Self::PASS,
        }
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    #[test]
    fn a_peers_verdict_is_read_off_its_x_cache() {
        let cases = [
            (Some("HIT"), Outcome::HIT),
            (Some("MISS"), Outcome::MISS),
            (Some("PASS"), Outcome::PASS),
            (Some("STALE"), Outcome::STALE),
            (Some("hit"), Outcome::SYNTH),
            (None, Outcome::SYNTH),
        ];
        for (x_cache, outcome) in cases {
            let mut headers = HeaderMap::new();
            if let Some(v) = x_cache {
                headers.insert(X_CACHE, HeaderValue::from_static(v));
            }
            assert_eq!(Outcome::from_x_cache(&headers), outcome, "{x_cache:?}");
        }
    }

    #[test]
    fn the_data_paths_verdicts_name_their_histograms() {
        let cases = [
            (respond::Outcome::Hit { ttl_s: 1 }, "hit"),
            (
                respond::Outcome::Stale {
                    ttl_s: -1,
                    origin_failed: true,
                    fwd_status: None,
                },
                "stale",
            ),
            (
                respond::Outcome::Miss {
                    stored: true,
                    collapsed: true,
                    detail: None,
                },
                "miss",
            ),
            (
                respond::Outcome::Pass {
                    unsafe_method: true,
                    detail: None,
                },
                "pass",
            ),
        ];
        for (outcome, name) in cases {
            assert_eq!(Outcome::from(outcome).name(), name, "{outcome:?}");
        }
        assert_eq!(Outcome::SYNTH.name(), "synth");
    }
}
