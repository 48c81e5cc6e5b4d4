//! When a stored object may be used (RFC 9111 §4.2.4, RFC 5861): fresh, stale within grace (answered at
//! once while one background fetch refreshes it), stale but still allowed to stand in for a failing origin,
//! or not at all.

use lacquer_storage::ObjectMeta;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usability {
    Fresh,
    /// Serve now, refresh in the background.
    Grace,
    /// Fetch; serve this only if the origin fails (refused, reset, timed out, or 5xx).
    OnError,
    Unusable,
}

pub fn usability(meta: &ObjectMeta, now_ms: u64) -> Usability {
    let remaining = meta.remaining_ttl_ms(now_ms);
    if remaining > 0 {
        return Usability::Fresh;
    }
    if meta.no_stale {
        return Usability::Unusable;
    }
    let stale_for = remaining.unsigned_abs();
    if stale_for < meta.grace_ms {
        Usability::Grace
    } else if stale_for < meta.stale_if_error_ms {
        Usability::OnError
    } else {
        Usability::Unusable
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(ttl_s: u64, grace_s: u64, sie_s: u64, no_stale: bool) -> ObjectMeta {
        ObjectMeta {
            status: 200,
            chunk_size: 4096,
            stored_at_ms: 1_000_000,
            ttl_ms: ttl_s * 1000,
            grace_ms: grace_s * 1000,
            stale_if_error_ms: sie_s * 1000,
            no_stale,
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn table() {
        use Usability::*;
        let cases = [
            (meta(10, 5, 60, false), 5, Fresh),
            (meta(10, 5, 60, false), 12, Grace),
            (meta(10, 5, 60, false), 20, OnError),
            (meta(10, 5, 60, false), 80, Unusable),
            (meta(10, 30, 5, false), 20, Grace),
            (meta(10, 5, 60, true), 12, Unusable),
            (meta(0, 0, 60, false), 1, OnError),
        ];
        for (m, after_s, want) in cases {
            assert_eq!(
                usability(&m, 1_000_000 + after_s * 1000),
                want,
                "{after_s}s after storing {m:?}"
            );
        }
    }
}
