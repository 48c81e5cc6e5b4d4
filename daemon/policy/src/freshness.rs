//! Freshness lifetime (RFC 9111 §4.2.1, §4.2.2): `s-maxage` > `max-age` > `Expires − Date` > heuristic.

use std::time::{Duration, SystemTime};

use http::{
    header::{DATE, EXPIRES, LAST_MODIFIED},
    HeaderMap, StatusCode,
};

use super::{age::http_date, cache_control::CacheControl, Policy};

/// A response's freshness lifetime and where it came from, counted from when the origin generated it
/// (the corrected initial age eats into it, RFC 9111 §4.2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// From `s-maxage`, `max-age` or `Expires`.
    Explicit(Duration),
    /// Derived from `Last-Modified` for a heuristically cacheable status.
    Heuristic(Duration),
    /// The configured `default_ttl`, for responses with no freshness information.
    Default(Duration),
}

impl Lifetime {
    /// The lifetime whatever its source.
    pub fn duration(self) -> Duration {
        match self {
            Lifetime::Explicit(d) | Lifetime::Heuristic(d) | Lifetime::Default(d) => d,
        }
    }
}

/// Statuses that may be cached without explicit freshness (RFC 9110 §15.1).
pub fn heuristically_cacheable(status: StatusCode) -> bool {
    matches!(
        status.as_u16(),
        200 | 203 | 204 | 206 | 300 | 301 | 308 | 404 | 405 | 410 | 414 | 501
    )
}

/// The freshness lifetime of a response received at `response_time`: `s-maxage`, else `max-age`, else
/// `Expires − Date` (`Expires` ignored under a targeted field; an invalid one is already stale), else a
/// heuristic share of the `Last-Modified` age for [`heuristically_cacheable`] statuses and for responses
/// marked `public` (RFC 9111 §4.2.2, §5.2.2.9), else the default.
pub fn lifetime(
    status: StatusCode,
    headers: &HeaderMap,
    cc: &CacheControl,
    policy: &Policy,
    response_time: SystemTime,
) -> Lifetime {
    if let Some(s) = cc.s_maxage.or(cc.max_age) {
        return Lifetime::Explicit(Duration::from_secs(s));
    }
    if let Some(expires) = headers.get(EXPIRES).filter(|_| !cc.targeted) {
        let expires = expires.to_str().ok().and_then(crate::age::parse_date);
        let Some(expires) = expires else {
            // An invalid Expires ("0" included) means already expired.
            return Lifetime::Explicit(Duration::ZERO);
        };
        let date = http_date(headers, DATE).unwrap_or(response_time);
        return Lifetime::Explicit(expires.duration_since(date).unwrap_or_default());
    }
    if heuristically_cacheable(status) || cc.public {
        if let Some(modified) = http_date(headers, LAST_MODIFIED) {
            let date = http_date(headers, DATE).unwrap_or(response_time);
            let since = date.duration_since(modified).unwrap_or_default();
            return Lifetime::Heuristic(
                since
                    .mul_f64(policy.cache.heuristic_fraction)
                    .min(policy.cache.heuristic_max),
            );
        }
    }
    Lifetime::Default(policy.cache.default_ttl)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_headers as headers;
    use crate::Cache;
    use crate::Lines;

    const DATE_S: &str = "Sun, 06 Nov 1994 08:49:37 GMT";

    #[test]
    fn table() {
        let now = httpdate::parse_http_date(DATE_S).unwrap();
        let secs = Duration::from_secs;
        let cases: &[(u16, Lines<'_>, Lifetime)] = &[
            (
                200,
                &[("cache-control", "max-age=60")],
                Lifetime::Explicit(secs(60)),
            ),
            (
                200,
                &[("cache-control", "max-age=60, s-maxage=5")],
                Lifetime::Explicit(secs(5)),
            ),
            (
                200,
                &[
                    ("cache-control", "max-age=60"),
                    ("expires", "Sun, 06 Nov 1994 09:49:37 GMT"),
                ],
                Lifetime::Explicit(secs(60)),
            ),
            (
                200,
                &[
                    ("date", DATE_S),
                    ("expires", "Sun, 06 Nov 1994 08:50:37 GMT"),
                ],
                Lifetime::Explicit(secs(60)),
            ),
            (
                200,
                &[("expires", "Sun, 06 Nov 1994 08:50:37 GMT")],
                Lifetime::Explicit(secs(60)),
            ),
            (
                200,
                &[
                    ("date", DATE_S),
                    ("expires", "Sun, 06 Nov 1994 08:40:37 GMT"),
                ],
                Lifetime::Explicit(secs(0)),
            ),
            (200, &[("expires", "0")], Lifetime::Explicit(secs(0))),
            (
                200,
                &[
                    ("expires", "garbage"),
                    ("last-modified", "Sun, 06 Nov 1994 07:49:37 GMT"),
                ],
                Lifetime::Explicit(secs(0)),
            ),
            (
                200,
                &[
                    ("date", DATE_S),
                    ("last-modified", "Sun, 06 Nov 1994 07:49:37 GMT"),
                ],
                Lifetime::Heuristic(secs(360)),
            ),
            (
                404,
                &[
                    ("date", DATE_S),
                    ("last-modified", "Sun, 06 Nov 1994 07:49:37 GMT"),
                ],
                Lifetime::Heuristic(secs(360)),
            ),
            (
                200,
                &[
                    ("date", DATE_S),
                    ("last-modified", "Tue, 06 Nov 1984 08:49:37 GMT"),
                ],
                Lifetime::Heuristic(secs(86_400)),
            ),
            (
                302,
                &[
                    ("date", DATE_S),
                    ("last-modified", "Sun, 06 Nov 1994 07:49:37 GMT"),
                ],
                Lifetime::Default(secs(0)),
            ),
            (
                302,
                &[
                    ("date", DATE_S),
                    ("last-modified", "Sun, 06 Nov 1994 07:49:37 GMT"),
                    ("cache-control", "public"),
                ],
                Lifetime::Heuristic(secs(360)),
            ),
            (
                599,
                &[
                    ("date", DATE_S),
                    ("last-modified", "Sun, 06 Nov 1994 07:49:37 GMT"),
                    ("cache-control", "public"),
                ],
                Lifetime::Heuristic(secs(360)),
            ),
            (
                599,
                &[
                    ("date", DATE_S),
                    ("last-modified", "Sun, 06 Nov 1994 07:49:37 GMT"),
                ],
                Lifetime::Default(secs(0)),
            ),
            (200, &[], Lifetime::Default(secs(0))),
            (
                500,
                &[("cache-control", "max-age=30")],
                Lifetime::Explicit(secs(30)),
            ),
        ];
        for (status, h, want) in cases {
            let h = headers(h);
            let cc = CacheControl::from_headers(&h);
            let got = lifetime(
                StatusCode::from_u16(*status).unwrap(),
                &h,
                &cc,
                &Policy::default(),
                now,
            );
            assert_eq!(got, *want, "{status} {h:?}");
        }
    }

    #[test]
    fn default_ttl_applies_without_information() {
        let policy = Policy::new(Cache {
            default_ttl: Duration::from_secs(120),
            ..Cache::default()
        });
        let h = HeaderMap::new();
        let got = lifetime(
            StatusCode::OK,
            &h,
            &CacheControl::default(),
            &policy,
            SystemTime::now(),
        );
        assert_eq!(got, Lifetime::Default(Duration::from_secs(120)));
    }
}
