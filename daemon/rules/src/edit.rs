//! The edits rules make to a request's query string and cookies, as plain functions over strings.

/// A name or, with a trailing `*`, every name starting so; compared as written for query parameters and
/// cookies (their names are case-sensitive), lower-cased for header names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NamePattern {
    Exact(String),
    Prefix(String),
}

impl NamePattern {
    pub fn parse(pattern: &str) -> Result<Self, String> {
        let p = pattern.trim();
        match p.strip_suffix('*') {
            Some(prefix) if prefix.contains('*') => {
                Err(format!("{pattern:?}: only a trailing `*` is allowed"))
            }
            Some(prefix) => Ok(Self::Prefix(prefix.to_owned())),
            None if p.is_empty() => Err("an empty name matches nothing".into()),
            None if p.contains('*') => Err(format!("{pattern:?}: only a trailing `*` is allowed")),
            None => Ok(Self::Exact(p.to_owned())),
        }
    }

    pub fn matches(&self, name: &str) -> bool {
        match self {
            Self::Exact(n) => n == name,
            Self::Prefix(p) => name.starts_with(p.as_str()),
        }
    }
}

/// What a query rewrite does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Query {
    pub sort: bool,
    /// Repeated names sorted by value too (`sort` with `sort_values`).
    pub sort_values: bool,
    pub drop: Vec<NamePattern>,
    pub keep: Vec<NamePattern>,
    pub remove: bool,
}

impl Query {
    /// The query after the rewrite; `None` when nothing is left (the target loses its `?`).
    pub fn apply(&self, query: &str) -> Option<String> {
        if self.remove {
            return None;
        }
        let mut params: Vec<&str> = query
            .split('&')
            .filter(|p| !p.is_empty())
            .filter(|p| {
                let name = p.split_once('=').map_or(*p, |(n, _)| n);
                !self.drop.iter().any(|d| d.matches(name))
                    && (self.keep.is_empty() || self.keep.iter().any(|k| k.matches(name)))
            })
            .collect();
        fn split(p: &str) -> (&str, &str) {
            p.split_once('=').unwrap_or((p, ""))
        }
        if self.sort_values {
            params.sort_by(|a, b| split(a).cmp(&split(b)));
        } else if self.sort {
            params.sort_by_key(|p| split(p).0);
        }
        (!params.is_empty()).then(|| params.join("&"))
    }
}

/// Cookie names kept (an allow-list, when given) and dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Cookies {
    pub keep: Vec<NamePattern>,
    pub drop: Vec<NamePattern>,
}

impl Cookies {
    /// The `Cookie` value with only the cookies that pass, in the order sent; `None` when none does.
    pub fn apply<'a>(&self, lines: impl Iterator<Item = &'a str>) -> Option<String> {
        let mut out = String::new();
        for cookie in lines.flat_map(|l| l.split(';')).map(str::trim) {
            if cookie.is_empty() {
                continue;
            }
            let name = cookie.split_once('=').map_or(cookie, |(n, _)| n).trim();
            let kept = !self.drop.iter().any(|d| d.matches(name))
                && (self.keep.is_empty() || self.keep.iter().any(|k| k.matches(name)));
            if kept {
                if !out.is_empty() {
                    out.push_str("; ");
                }
                out.push_str(cookie);
            }
        }
        (!out.is_empty()).then_some(out)
    }
}

/// Whether any cookie of these `Cookie` lines matches one of `names`.
pub(crate) fn has_cookie<'a>(lines: impl Iterator<Item = &'a str>, names: &[NamePattern]) -> bool {
    lines
        .flat_map(|l| l.split(';'))
        .map(|c| {
            let c = c.trim();
            c.split_once('=').map_or(c, |(n, _)| n).trim()
        })
        .any(|name| names.iter().any(|n| n.matches(name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patterns(names: &[&str]) -> Vec<NamePattern> {
        names
            .iter()
            .map(|n| NamePattern::parse(n).unwrap())
            .collect()
    }

    #[test]
    fn query_rewrites() {
        let cases: &[(Query, &str, Option<&str>)] = &[
            (
                Query {
                    sort: true,
                    drop: patterns(&["utm_*", "gclid", "fbclid"]),
                    ..Query::default()
                },
                "z=1&utm_source=x&a=2&gclid=9&a=1&fbclid=y",
                Some("a=2&a=1&z=1"),
            ),
            (
                Query {
                    sort: true,
                    sort_values: true,
                    ..Query::default()
                },
                "z=1&a=2&ab=0&a=1&a&a-b=3",
                Some("a&a=1&a=2&a-b=3&ab=0&z=1"),
            ),
            (
                Query {
                    drop: patterns(&["utm_*"]),
                    ..Query::default()
                },
                "utm_a=1&utm_b=2",
                None,
            ),
            (Query::default(), "", None),
            (Query::default(), "a=1&&b", Some("a=1&b")),
            (
                Query {
                    keep: patterns(&["id"]),
                    ..Query::default()
                },
                "x=1&id=7&idx=2",
                Some("id=7"),
            ),
            (
                Query {
                    remove: true,
                    ..Query::default()
                },
                "a=1",
                None,
            ),
        ];
        for (rewrite, query, want) in cases {
            assert_eq!(rewrite.apply(query).as_deref(), *want, "{query}");
        }
    }

    #[test]
    fn cookie_filters() {
        let tracking = Cookies {
            drop: patterns(&["_ga*", "_gid", "__utm*"]),
            ..Cookies::default()
        };
        let allow = Cookies {
            keep: patterns(&["sessionid", "lang"]),
            ..Cookies::default()
        };
        let cases: &[(&Cookies, &[&str], Option<&str>)] = &[
            (
                &tracking,
                &["_ga=1; sessionid=abc; _gid=2"],
                Some("sessionid=abc"),
            ),
            (&tracking, &["_ga=1; __utma=2"], None),
            (
                &allow,
                &["a=1; lang=fr", "sessionid=s; b=2"],
                Some("lang=fr; sessionid=s"),
            ),
            (&allow, &["a=1"], None),
            (&allow, &[";;  ; lang=de;"], Some("lang=de")),
        ];
        for (filter, lines, want) in cases {
            assert_eq!(
                filter.apply(lines.iter().copied()).as_deref(),
                *want,
                "{lines:?}"
            );
        }
    }

    #[test]
    fn presence_of_cookies() {
        assert!(has_cookie(
            ["a=1; sessionid=2"].into_iter(),
            &patterns(&["sess*"])
        ));
        assert!(!has_cookie(
            ["a=1; xsessionid=2"].into_iter(),
            &patterns(&["sess*"])
        ));
    }

    #[test]
    fn bad_name_patterns_are_refused() {
        for bad in ["", "*a", "a*b*", "a*b"] {
            assert!(NamePattern::parse(bad).is_err(), "{bad}");
        }
    }
}
