//! `Cache-Control` parsing (RFC 9111 §5.2), tolerant the way caches must be: directive names are
//! case-insensitive, values may be quoted, the header may repeat, and for a repeated directive the first
//! occurrence wins.

use http::{header::CACHE_CONTROL, HeaderMap};

/// RFC 9111 §1.2.2: delta-seconds beyond what a cache can represent are taken as 2^31.
pub const DELTA_SECONDS_MAX: u64 = 2_147_483_648;

/// The directives of one request's or response's cache-control field; absent ones are `false` or `None`.
/// Durations are delta-seconds, saturated at [`DELTA_SECONDS_MAX`]; sections are RFC 9111's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheControl {
    /// Response: not stored unless `must_understand` (§5.2.2.5). Request: passed, never stored (§5.2.1.5).
    pub no_store: bool,
    /// Response: revalidated before every use and never served stale, so stored only with a validator; a
    /// route's `ttl` overrides it. Field names after it are ignored: the whole response is no-cache, the
    /// safe reading (§5.2.2.4).
    pub no_cache: bool,
    /// For one user: never stored in this shared cache (§5.2.2.7).
    pub private: bool,
    /// Lets a response to a request with `Authorization` be stored (§3.5, §5.2.2.9).
    pub public: bool,
    /// Never served stale (§5.2.2.2); also lets an authorized response be stored (§3.5).
    pub must_revalidate: bool,
    /// `must-revalidate` for shared caches only, this one included (§5.2.2.8).
    pub proxy_revalidate: bool,
    /// Overrides `no-store` for statuses this cache understands: every final status but 206 and 304
    /// (§5.2.2.3).
    pub must_understand: bool,
    /// Parsed (RFC 8246) but not acted on: a fresh object is never revalidated anyway.
    pub immutable: bool,
    /// Request directive, parsed but not acted on: the request is looked up as any other (§5.2.1.7).
    pub only_if_cached: bool,
    /// `Some(0)` when present but invalid: invalid freshness counts as stale (RFC 9111 §4.2.1).
    pub max_age: Option<u64>,
    /// Freshness for shared caches, winning over `max-age` and `Expires`; `Some(0)` when invalid. Also
    /// lets an authorized response be stored (§5.2.2.10).
    pub s_maxage: Option<u64>,
    /// Seconds past freshness the object may be served while one background fetch refreshes it (RFC 5861
    /// §3); `None` when absent or invalid, then `cache.default_grace` applies.
    pub stale_while_revalidate: Option<u64>,
    /// Seconds past freshness the object may stand in for a failing origin (RFC 5861 §4); `None` when
    /// absent or invalid, then `cache.error_grace` applies.
    pub stale_if_error: Option<u64>,
    /// No intermediary may change the content (RFC 9110 §7.7, RFC 9111 §5.2.1.6, §5.2.2.6): lacquerd
    /// neither compresses nor decompresses it.
    pub no_transform: bool,
    /// Request directive, parsed but not acted on (§5.2.1.3).
    pub min_fresh: Option<u64>,
    /// Request directive, parsed but not acted on (§5.2.1.2). `Some(None)` for `max-stale` without a value:
    /// any staleness.
    pub max_stale: Option<Option<u64>>,
    /// The directives came from a targeted field (RFC 9213): `Expires` is ignored too.
    pub targeted: bool,
}

impl CacheControl {
    /// The directives of every `Cache-Control` line in `headers`, the first occurrence of each winning.
    pub fn from_headers(headers: &HeaderMap) -> Self {
        // By the name made once: looking a field up by `&str` parses and hashes the name again.
        Self::parse_field(headers, &CACHE_CONTROL)
    }

    /// The directives that govern a response in this cache: those of the first field on the target list
    /// (RFC 9213, e.g. `CDN-Cache-Control`) that is present, valid and not empty, else `Cache-Control`.
    pub fn governing(headers: &HeaderMap, targets: &[String]) -> Self {
        targets
            .iter()
            .find_map(|target| Self::targeted(headers, target))
            .unwrap_or_else(|| Self::from_headers(headers))
    }

    /// A targeted field's directives (RFC 9213 §2.1): a Structured Fields Dictionary (RFC 9651), its
    /// lines joined. `None` when the field is absent, empty, fails to parse, or gives a known directive a
    /// value of the wrong type (`max-age="10"`): such a field is ignored as a whole, so `Cache-Control`
    /// governs instead of a field that no longer says what the origin meant. Parameters and unknown
    /// directives are ignored.
    fn targeted(headers: &HeaderMap, name: &str) -> Option<Self> {
        let lines = headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().ok())
            .collect::<Option<Vec<&str>>>()?;
        let joined = lines.join(", ");
        let dictionary: sfv::Dictionary = sfv::Parser::new(&joined).parse().ok()?;
        if dictionary.is_empty() {
            return None;
        }
        let mut cc = CacheControl {
            targeted: true,
            ..CacheControl::default()
        };
        const KNOWN: [&str; 12] = [
            "max-age",
            "s-maxage",
            "stale-while-revalidate",
            "stale-if-error",
            "no-store",
            "public",
            "must-revalidate",
            "proxy-revalidate",
            "must-understand",
            "immutable",
            "no-cache",
            "private",
        ];
        for (key, entry) in &dictionary {
            let item = match entry {
                sfv::ListEntry::Item(item) => item,
                // No known directive takes an inner list.
                sfv::ListEntry::InnerList(_) if KNOWN.contains(&key.as_str()) => return None,
                sfv::ListEntry::InnerList(_) => continue,
            };
            let seconds = || {
                item.bare_item
                    .as_integer()
                    .map(i64::from)
                    .and_then(|n| u64::try_from(n).ok())
                    .map(|n| n.min(DELTA_SECONDS_MAX))
            };
            let flag = || item.bare_item.as_boolean() == Some(true);
            let field_names = || flag() || item.bare_item.as_string().is_some();
            match key.as_str() {
                "max-age" => cc.max_age = Some(seconds()?),
                "s-maxage" => cc.s_maxage = Some(seconds()?),
                "stale-while-revalidate" => cc.stale_while_revalidate = Some(seconds()?),
                "stale-if-error" => cc.stale_if_error = Some(seconds()?),
                "no-store" => cc.no_store = flag().then_some(true)?,
                "public" => cc.public = flag().then_some(true)?,
                "must-revalidate" => cc.must_revalidate = flag().then_some(true)?,
                "proxy-revalidate" => cc.proxy_revalidate = flag().then_some(true)?,
                "must-understand" => cc.must_understand = flag().then_some(true)?,
                "immutable" => cc.immutable = flag().then_some(true)?,
                "no-cache" => cc.no_cache = field_names().then_some(true)?,
                "private" => cc.private = field_names().then_some(true)?,
                _ => {}
            }
        }
        Some(cc)
    }

    /// Parses every line of the named field.
    pub fn from_header_values(headers: &HeaderMap, name: &str) -> Self {
        Self::parse_field(headers, name)
    }

    /// The directives of every line of a field.
    fn parse_field(headers: &HeaderMap, name: impl http::header::AsHeaderName) -> Self {
        let mut cc = CacheControl::default();
        let mut seen: Vec<String> = Vec::new();
        for value in headers.get_all(name) {
            let Ok(value) = value.to_str() else { continue };
            for (name, arg) in Directives::new(value) {
                let name = name.to_ascii_lowercase();
                if seen.contains(&name) {
                    continue;
                }
                cc.apply(&name, arg);
                seen.push(name);
            }
        }
        cc
    }

    fn apply(&mut self, name: &str, arg: Option<&str>) {
        let seconds = || Some(arg.and_then(parse_delta_seconds).unwrap_or(0));
        match name {
            "no-store" => self.no_store = true,
            // A qualified no-cache (with field names) restricts only those fields; we have no partial reuse,
            // so it is treated as unqualified, which is the safe reading.
            "no-cache" => self.no_cache = true,
            "private" => self.private = true,
            "public" => self.public = true,
            "must-revalidate" => self.must_revalidate = true,
            "proxy-revalidate" => self.proxy_revalidate = true,
            "must-understand" => self.must_understand = true,
            "immutable" => self.immutable = true,
            "only-if-cached" => self.only_if_cached = true,
            "no-transform" => self.no_transform = true,
            "max-age" => self.max_age = seconds(),
            "s-maxage" => self.s_maxage = seconds(),
            "stale-while-revalidate" => {
                self.stale_while_revalidate = arg.and_then(parse_delta_seconds)
            }
            "stale-if-error" => self.stale_if_error = arg.and_then(parse_delta_seconds),
            "min-fresh" => self.min_fresh = arg.and_then(parse_delta_seconds),
            "max-stale" => self.max_stale = Some(arg.and_then(parse_delta_seconds)),
            _ => {}
        }
    }
}

/// delta-seconds: digits only; overflow saturates at 2^31.
pub fn parse_delta_seconds(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(
        s.parse::<u64>()
            .map_or(DELTA_SECONDS_MAX, |v| v.min(DELTA_SECONDS_MAX)),
    )
}

/// Splits a `Cache-Control` value into `(name, argument)` pairs, honouring quoted strings (which may contain
/// commas and escaped quotes).
struct Directives<'a> {
    rest: &'a str,
}

impl<'a> Directives<'a> {
    fn new(value: &'a str) -> Self {
        Self { rest: value }
    }
}

impl<'a> Iterator for Directives<'a> {
    type Item = (&'a str, Option<&'a str>);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let s = self.rest.trim_start_matches([' ', '\t', ',']);
            if s.is_empty() {
                self.rest = s;
                return None;
            }
            let name_end = s.find(['=', ',']).unwrap_or(s.len());
            let name = s[..name_end].trim();
            if s[name_end..].starts_with('=') {
                let after = s[name_end + 1..].trim_start();
                let (arg, rest) = if let Some(quoted) = after.strip_prefix('"') {
                    let mut escaped = false;
                    let end = quoted
                        .char_indices()
                        .find(|&(_, c)| {
                            let close = c == '"' && !escaped;
                            escaped = c == '\\' && !escaped;
                            close
                        })
                        .map(|(i, _)| i);
                    match end {
                        Some(i) => (&quoted[..i], &quoted[i + 1..]),
                        None => (quoted, ""),
                    }
                } else {
                    let end = after.find(',').unwrap_or(after.len());
                    (after[..end].trim(), &after[end..])
                };
                self.rest = rest.find(',').map_or("", |i| &rest[i..]);
                if name.is_empty() {
                    continue;
                }
                return Some((name, Some(arg)));
            }
            self.rest = &s[name_end..];
            if name.is_empty() {
                continue;
            }
            return Some((name, None));
        }
    }
}

#[cfg(test)]
mod props;

#[cfg(test)]
mod tests {
    use super::*;

    fn cc(lines: &[&str]) -> CacheControl {
        let mut h = HeaderMap::new();
        for l in lines {
            h.append(CACHE_CONTROL, l.parse().unwrap());
        }
        CacheControl::from_headers(&h)
    }

    #[test]
    fn table() {
        let cases: &[(&[&str], CacheControl)] = &[
            (
                &["max-age=60"],
                CacheControl {
                    max_age: Some(60),
                    ..Default::default()
                },
            ),
            (
                &["MAX-AGE=60, Public"],
                CacheControl {
                    max_age: Some(60),
                    public: true,
                    ..Default::default()
                },
            ),
            (
                &["max-age=\"60\""],
                CacheControl {
                    max_age: Some(60),
                    ..Default::default()
                },
            ),
            (
                &["max-age = 60"],
                CacheControl {
                    max_age: Some(60),
                    ..Default::default()
                },
            ),
            (
                &["max-age=60", "max-age=10"],
                CacheControl {
                    max_age: Some(60),
                    ..Default::default()
                },
            ),
            (
                &["max-age=60, max-age=10"],
                CacheControl {
                    max_age: Some(60),
                    ..Default::default()
                },
            ),
            (
                &["max-age=abc"],
                CacheControl {
                    max_age: Some(0),
                    ..Default::default()
                },
            ),
            (
                &["max-age=-5"],
                CacheControl {
                    max_age: Some(0),
                    ..Default::default()
                },
            ),
            (
                &["max-age=1.5"],
                CacheControl {
                    max_age: Some(0),
                    ..Default::default()
                },
            ),
            (
                &["max-age=99999999999999999999"],
                CacheControl {
                    max_age: Some(DELTA_SECONDS_MAX),
                    ..Default::default()
                },
            ),
            (
                &["s-maxage=5, max-age=60"],
                CacheControl {
                    s_maxage: Some(5),
                    max_age: Some(60),
                    ..Default::default()
                },
            ),
            (
                &["no-store"],
                CacheControl {
                    no_store: true,
                    ..Default::default()
                },
            ),
            (
                &["private=\"set-cookie, x-foo\", max-age=3"],
                CacheControl {
                    private: true,
                    max_age: Some(3),
                    ..Default::default()
                },
            ),
            (
                &["no-cache=\"set-cookie\""],
                CacheControl {
                    no_cache: true,
                    ..Default::default()
                },
            ),
            (
                &["must-revalidate,proxy-revalidate"],
                CacheControl {
                    must_revalidate: true,
                    proxy_revalidate: true,
                    ..Default::default()
                },
            ),
            (
                &["max-age=10, stale-while-revalidate=30, stale-if-error=600"],
                CacheControl {
                    max_age: Some(10),
                    stale_while_revalidate: Some(30),
                    stale_if_error: Some(600),
                    ..Default::default()
                },
            ),
            (
                &["max-stale"],
                CacheControl {
                    max_stale: Some(None),
                    ..Default::default()
                },
            ),
            (
                &["max-stale=5, min-fresh=2, only-if-cached"],
                CacheControl {
                    max_stale: Some(Some(5)),
                    min_fresh: Some(2),
                    only_if_cached: true,
                    ..Default::default()
                },
            ),
            (
                &[",, ,max-age=7,,"],
                CacheControl {
                    max_age: Some(7),
                    ..Default::default()
                },
            ),
            (
                &["foo=\"a,b\\\"c\", max-age=8"],
                CacheControl {
                    max_age: Some(8),
                    ..Default::default()
                },
            ),
            (
                &["unknown, immutable, max-age=9"],
                CacheControl {
                    immutable: true,
                    max_age: Some(9),
                    ..Default::default()
                },
            ),
            (&[""], CacheControl::default()),
        ];
        for (lines, want) in cases {
            assert_eq!(&cc(lines), want, "Cache-Control: {lines:?}");
        }
    }

    #[test]
    fn targeted_fields_take_precedence_in_list_order() {
        let targets = vec![
            "lacquer-cache-control".to_string(),
            "cdn-cache-control".to_string(),
        ];
        let mut h = HeaderMap::new();
        h.insert(CACHE_CONTROL, "max-age=10".parse().unwrap());
        assert_eq!(CacheControl::governing(&h, &targets).max_age, Some(10));
        h.insert("cdn-cache-control", "max-age=600".parse().unwrap());
        let cc = CacheControl::governing(&h, &targets);
        assert_eq!((cc.max_age, cc.targeted), (Some(600), true));
        h.insert("lacquer-cache-control", "no-store".parse().unwrap());
        let cc = CacheControl::governing(&h, &targets);
        assert!(cc.no_store && cc.max_age.is_none());
        h.insert("lacquer-cache-control", "".parse().unwrap());
        assert_eq!(
            CacheControl::governing(&h, &targets).max_age,
            Some(600),
            "an empty field is skipped"
        );
        assert_eq!(CacheControl::governing(&h, &[]).max_age, Some(10));
    }

    /// RFC 9213 §2.1: a targeted field is a Structured Fields Dictionary; one that does not parse, or
    /// gives a known directive the wrong type, is ignored as a whole and `Cache-Control` governs.
    #[test]
    fn targeted_fields_are_structured_fields() {
        /// What governs: `(max_age, s_maxage, no_store, private, targeted)`.
        type Governs = (Option<u64>, Option<u64>, bool, bool, bool);
        let targets = vec!["cdn-cache-control".to_string()];
        // (CDN-Cache-Control lines, what governs)
        let cases: &[(&[&str], Governs)] = &[
            (&["max-age=600"], (Some(600), None, false, false, true)),
            (
                &["max-age=600", "s-maxage=60"],
                (Some(600), Some(60), false, false, true),
            ),
            (
                &["max-age=600;foo=bar, unknown=\"x\""],
                (Some(600), None, false, false, true),
            ),
            (
                &["private=\"set-cookie\", max-age=5"],
                (Some(5), None, false, true, true),
            ),
            (&["no-store"], (None, None, true, false, true)),
            (
                &["max-age=99999999999"],
                (Some(DELTA_SECONDS_MAX), None, false, false, true),
            ),
            // Invalid: Cache-Control (max-age=10) governs.
            (
                &["max-age=10000, &&&&&"],
                (Some(10), None, false, false, false),
            ),
            (
                &["max-age=\"10000\""],
                (Some(10), None, false, false, false),
            ),
            (&["max-age=-1"], (Some(10), None, false, false, false)),
            (&["max-age=1.5"], (Some(10), None, false, false, false)),
            (&["no-store=?0"], (Some(10), None, false, false, false)),
            (&["max-age=(1 2)"], (Some(10), None, false, false, false)),
            (&["MAX-AGE=600"], (Some(10), None, false, false, false)),
            (&[""], (Some(10), None, false, false, false)),
        ];
        for (lines, want) in cases {
            let mut h = HeaderMap::new();
            h.insert(CACHE_CONTROL, "max-age=10".parse().unwrap());
            for line in *lines {
                h.append("cdn-cache-control", line.parse().unwrap());
            }
            let cc = CacheControl::governing(&h, &targets);
            let got = (
                cc.max_age,
                cc.s_maxage,
                cc.no_store,
                cc.private,
                cc.targeted,
            );
            assert_eq!(got, *want, "{lines:?}");
        }
    }

    #[test]
    fn delta_seconds() {
        assert_eq!(parse_delta_seconds("0"), Some(0));
        assert_eq!(parse_delta_seconds("2147483649"), Some(DELTA_SECONDS_MAX));
        assert_eq!(parse_delta_seconds(""), None);
        assert_eq!(parse_delta_seconds("+1"), None);
        assert_eq!(parse_delta_seconds("1e3"), None);
    }
}
