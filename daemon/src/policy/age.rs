//! `Age` and `Date` handling (RFC 9111 §4.2.3, §5.1).

use std::time::SystemTime;

use http::{
    header::{AGE, DATE},
    HeaderMap,
};

use super::cache_control::parse_delta_seconds;

/// The `Age` a response arrived with: the first member of a list, ignored when invalid.
pub fn age_header(headers: &HeaderMap) -> Option<u64> {
    let value = headers.get(AGE)?.to_str().ok()?;
    parse_delta_seconds(value.split(',').next()?.trim())
}

/// Parses an HTTP date; `None` when absent or invalid.
pub fn http_date(headers: &HeaderMap, name: http::header::HeaderName) -> Option<SystemTime> {
    httpdate::parse_http_date(headers.get(name)?.to_str().ok()?.trim()).ok()
}

/// RFC 9111 §4.2.3 `corrected_initial_age`, in whole seconds.
pub fn corrected_initial_age(
    headers: &HeaderMap,
    request_time: SystemTime,
    response_time: SystemTime,
) -> u64 {
    let apparent_age = http_date(headers, DATE)
        .and_then(|date| response_time.duration_since(date).ok())
        .map_or(0, |d| d.as_secs());
    let response_delay = response_time
        .duration_since(request_time)
        .map_or(0, |d| d.as_secs());
    let corrected_age_value = age_header(headers)
        .unwrap_or(0)
        .saturating_add(response_delay);
    apparent_age.max(corrected_age_value)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::policy::test_headers as headers;

    #[test]
    fn age_header_table() {
        let cases: &[(&[(&str, &str)], Option<u64>)] = &[
            (&[], None),
            (&[("age", "30")], Some(30)),
            (&[("age", "30, 60")], Some(30)),
            (&[("age", "1.5")], None),
            (&[("age", "-1")], None),
            (&[("age", "abc")], None),
            (&[("age", "99999999999999")], Some(2_147_483_648)),
        ];
        for (h, want) in cases {
            assert_eq!(age_header(&headers(h)), *want, "{h:?}");
        }
    }

    #[test]
    fn corrected_initial_age_table() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        let req = now - Duration::from_secs(2);
        let cases: &[(&[(&str, &str)], u64)] = &[
            (&[], 2),
            (&[("date", "Sun, 06 Nov 1994 08:49:37 GMT")], 2),
            (&[("date", "Sun, 06 Nov 1994 08:48:37 GMT")], 60),
            (
                &[("date", "Sun, 06 Nov 1994 08:49:37 GMT"), ("age", "100")],
                102,
            ),
            (&[("date", "Sun, 06 Nov 1994 08:50:37 GMT")], 2),
            (&[("date", "garbage"), ("age", "10")], 12),
        ];
        for (h, want) in cases {
            assert_eq!(corrected_initial_age(&headers(h), req, now), *want, "{h:?}");
        }
    }
}
