//! `Age` and `Date` handling (RFC 9111 §4.2.3, §5.1).

use std::time::SystemTime;

use http::{
    header::{AGE, DATE},
    HeaderMap,
};

use super::cache_control::parse_delta_seconds;

/// The `Age` a response arrived with (RFC 9111 §5.1): the first member of the first line, its parameters
/// dropped, saturated at 2^31 s. A value that is not a non-negative integer (`abc`, `-7200`, `7200.0`) is
/// ignored as if absent, as the HTTP caching test suite expects and Varnish, Traffic Server and Fastly do:
/// `Age: 0, 7200` is fresh, `Age: 7200, 0` stale.
pub fn age_header(headers: &HeaderMap) -> Option<u64> {
    let first = headers.get(AGE)?.to_str().ok()?;
    let member = first.split(',').next()?;
    let value = member.split(';').next()?.trim();
    parse_delta_seconds(value)
}

/// Parses an HTTP date; `None` when absent or invalid.
pub fn http_date(headers: &HeaderMap, name: http::header::HeaderName) -> Option<SystemTime> {
    parse_date(headers.get(name)?.to_str().ok()?)
}

/// An HTTP-date in any of its three formats (RFC 9110 §5.6.7: IMF-fixdate, and the obsolete RFC 850 and
/// asctime formats a recipient must accept), letter case ignored (`THU, 18 AUG 2050 02:01:18 gMT`), as
/// the section encourages recipients to be robust; anything else (other zones, two-digit years but RFC
/// 850's, extra spaces) is invalid.
pub fn parse_date(value: &str) -> Option<SystemTime> {
    let value = value.trim();
    if let Ok(t) = httpdate::parse_http_date(value) {
        return Some(t);
    }
    if !value.is_ascii() {
        return None;
    }
    let mut canonical = String::with_capacity(value.len());
    for (n, word) in value.split(|c: char| !c.is_ascii_alphabetic()).enumerate() {
        if n > 0 {
            // The separator the split consumed, at the same position.
            canonical.push(value.as_bytes()[canonical.len()] as char);
        }
        if word.eq_ignore_ascii_case("gmt") {
            canonical.push_str("GMT");
        } else {
            let mut letters = word.chars();
            if let Some(first) = letters.next() {
                canonical.push(first.to_ascii_uppercase());
                canonical.extend(letters.map(|c| c.to_ascii_lowercase()));
            }
        }
    }
    httpdate::parse_http_date(&canonical)
        .ok()
        .or_else(|| with_any_weekday(&canonical))
}

const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A date whose day name does not match its date (`Thu Aug  8 … 2050`, a Monday): the day name is
/// redundant, so the date stands if one of the seven names, in the same short or long form, makes it
/// valid; a word that is not a day name is still invalid.
fn with_any_weekday(canonical: &str) -> Option<SystemTime> {
    let end = canonical.find(|c: char| !c.is_ascii_alphabetic())?;
    let (given, rest) = canonical.split_at(end);
    let long = WEEKDAYS.contains(&given);
    if !long && !WEEKDAYS.iter().any(|day| &day[..3] == given) {
        return None;
    }
    WEEKDAYS.iter().find_map(|day| {
        let name = if long { day } else { &day[..3] };
        httpdate::parse_http_date(&format!("{name}{rest}")).ok()
    })
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

    /// RFC 9110 §5.6.7's three formats, in any letter case; everything else is invalid.
    #[test]
    fn dates() {
        let t = httpdate::parse_http_date("Thu, 18 Aug 2050 02:01:18 GMT").unwrap();
        let valid = [
            "Thu, 18 Aug 2050 02:01:18 GMT",
            "  Thu, 18 Aug 2050 02:01:18 GMT ",
            "Thursday, 18-Aug-50 02:01:18 GMT",
            "Thu Aug 18 02:01:18 2050",
            "THU, 18 Aug 2050 02:01:18 GMT",
            "Thu, 18 AUG 2050 02:01:18 GMT",
            "Thu, 18 Aug 2050 02:01:18 gMT",
            "thursday, 18-aug-50 02:01:18 gmt",
            // The day name is redundant: a wrong one is ignored.
            "Mon, 18 Aug 2050 02:01:18 GMT",
            "monday, 18-Aug-50 02:01:18 GMT",
            "Sun Aug 18 02:01:18 2050",
        ];
        for v in valid {
            assert_eq!(parse_date(v), Some(t), "{v:?}");
        }
        assert_eq!(
            parse_date("Thu Aug  8 02:01:18 2050"),
            httpdate::parse_http_date("Mon Aug  8 02:01:18 2050").ok(),
            "the suite's asctime date, on a Monday"
        );
        let invalid = [
            "Thu, 18 Aug 2050 02:01:18 UTC",
            "Thu, 18 Aug 2050 02:01:18 AEST",
            "Thu, 18 Aug 50 02:01:18 GMT",
            "Thu 18 Aug 2050 02:01:18 GMT",
            "Thu, 18 Aug  2050 02:01:18 GMT",
            "Thu, 18-Aug-2050 02:01:18 GMT",
            "Thu, 18 Aug 2050 02.01.18 GMT",
            "Thu, 18 Aug 2050 2:01:18 GMT",
            "Thü, 18 Aug 2050 02:01:18 GMT",
            "Xyz, 18 Aug 2050 02:01:18 GMT",
            "Mo, 18 Aug 2050 02:01:18 GMT",
            "Mon, 18-Aug-50 02:01:18 GMT",
            "Monday, 18 Aug 2050 02:01:18 GMT",
            "Mon, 31 Feb 2050 02:01:18 GMT",
            "0",
            "",
        ];
        for v in invalid {
            assert_eq!(parse_date(v), None, "{v:?}");
        }
    }
    use crate::test_headers as headers;
    use crate::Lines;

    #[test]
    fn age_header_table() {
        let cases: &[(Lines<'_>, Option<u64>)] = &[
            (&[], None),
            (&[("age", "30")], Some(30)),
            (&[("age", " 30 ")], Some(30)),
            (&[("age", "0")], Some(0)),
            // The first member of the first line counts.
            (&[("age", "7200, 0")], Some(7200)),
            (&[("age", "0, 7200")], Some(0)),
            (&[("age", "0, 0")], Some(0)),
            (&[("age", "7200"), ("age", "0")], Some(7200)),
            (&[("age", "0"), ("age", "7200")], Some(0)),
            (&[("age", "3600"), ("age", "3600")], Some(3600)),
            // Not a non-negative integer: ignored.
            (&[("age", "abc")], None),
            (&[("age", "-7200")], None),
            (&[("age", "7200.0")], None),
            (&[("age", "1.5")], None),
            (&[("age", "")], None),
            (&[("age", "abc, 7200")], None),
            // Parameters are not part of the value.
            (&[("age", "7200;foo=bar")], Some(7200)),
            (&[("age", "7200;foo=111")], Some(7200)),
            // Saturated at 2^31.
            (&[("age", "2147483647")], Some(2_147_483_647)),
            (&[("age", "2147483648")], Some(2_147_483_648)),
            (&[("age", "2147483649")], Some(2_147_483_648)),
            (&[("age", "99999999999999999999999")], Some(2_147_483_648)),
        ];
        for (h, want) in cases {
            assert_eq!(age_header(&headers(h)), *want, "{h:?}");
        }
    }

    #[test]
    fn corrected_initial_age_table() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        let req = now - Duration::from_secs(2);
        let cases: &[(Lines<'_>, u64)] = &[
            (&[], 2),
            (&[("date", "Sun, 06 Nov 1994 08:49:37 GMT")], 2),
            (&[("date", "Sun, 06 Nov 1994 08:48:37 GMT")], 60),
            (
                &[("date", "Sun, 06 Nov 1994 08:49:37 GMT"), ("age", "100")],
                102,
            ),
            (&[("date", "Sun, 06 Nov 1994 08:50:37 GMT")], 2),
            (&[("date", "garbage"), ("age", "10")], 12),
            (&[("age", "ten")], 2),
        ];
        for (h, want) in cases {
            assert_eq!(corrected_initial_age(&headers(h), req, now), *want, "{h:?}");
        }
    }
}
