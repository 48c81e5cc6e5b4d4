//! When a stored object may be used (RFC 9111 §4.2.4, RFC 5861): fresh, stale within grace (answered at
//! once while one background fetch refreshes it), stale but still allowed to stand in for a failing origin,
//! or not at all.

/// What a stored object's metadata says about its age, at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetime {
    /// Milliseconds of freshness left; negative once stale.
    pub remaining_ttl_ms: i64,
    /// How long past freshness it may be served while one background fetch refreshes it.
    pub grace_ms: u64,
    /// How long past freshness it may stand in for a failing origin.
    pub stale_if_error_ms: u64,
    /// The origin forbade serving it stale (`must-revalidate`, `no-cache`, …).
    pub no_stale: bool,
}

/// Whether a stored object may answer a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usability {
    /// Serve it.
    Fresh,
    /// Serve now, refresh in the background.
    Grace,
    /// Fetch; serve this only if the origin fails (refused, reset, timed out, or 5xx).
    OnError,
    /// Fetch; it cannot stand in for anything.
    Unusable,
}

/// What an object of this lifetime may still be used for.
pub fn usability(lifetime: Lifetime) -> Usability {
    let remaining = lifetime.remaining_ttl_ms;
    if remaining > 0 {
        return Usability::Fresh;
    }
    if lifetime.no_stale {
        return Usability::Unusable;
    }
    let stale_for = remaining.unsigned_abs();
    if stale_for < lifetime.grace_ms {
        Usability::Grace
    } else if stale_for < lifetime.stale_if_error_ms {
        Usability::OnError
    } else {
        Usability::Unusable
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An object stored with these lifetimes, looked at `after_s` seconds later.
    fn meta(ttl_s: u64, grace_s: u64, sie_s: u64, no_stale: bool) -> impl Fn(u64) -> Lifetime {
        move |after_s| Lifetime {
            remaining_ttl_ms: (ttl_s as i64 - after_s as i64) * 1000,
            grace_ms: grace_s * 1000,
            stale_if_error_ms: sie_s * 1000,
            no_stale,
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
            let lifetime = m(after_s);
            assert_eq!(usability(lifetime), want, "{after_s}s: {lifetime:?}");
        }
    }
}
