//! The ban language: the subset of Varnish's ban expressions operators use to invalidate by pattern.
//!
//! ```text
//! ban       := condition ( "&&" condition )*
//! condition := field operator value
//! field     := req.url | req.http.host | obj.status | obj.http.<header-name>
//! operator  := == | != | ~ | !~
//! value     := "double quoted" | 'single quoted' | bare-word
//! ```
//!
//! `req.url` is the path and query of the cached URL, `req.http.host` its host as the cache key holds it
//! (lower-cased, without `:80` or `:443`); both are known for every stored object, so every ban can be applied by the
//! lurker, unlike Varnish, where bans on `req.*` wait for a lookup.

use std::fmt;

use lacquer_policy::key::normal_host;
use regex::bytes::{Regex, RegexBuilder};

use crate::meta::ObjectMeta;

/// Longest expression accepted, in bytes.
const MAX_LEN: usize = 4096;
/// Compiled size limit for one regex: a hostile pattern is refused instead of eating memory.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Why an expression was refused; `position` is the 1-based character column the problem starts at.
/// Displayed as `unclosed quote at 14`, or `invalid regex at 11: unclosed group` when there is a detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BanSyntaxError {
    /// 1-based character column where the problem starts.
    pub position: usize,
    /// What is wrong, in a few words (`unclosed quote`).
    pub reason: String,
    /// More from the component that refused it (the regex compiler's message, on one line).
    pub detail: Option<String>,
}

impl fmt::Display for BanSyntaxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at {}", self.reason, self.position)?;
        match &self.detail {
            Some(detail) => write!(f, ": {detail}"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for BanSyntaxError {}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Field {
    Url,
    Host,
    Status,
    /// Lower-cased header name.
    Header(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    Match,
    NoMatch,
}

#[derive(Debug, Clone)]
enum Value {
    Text(String),
    Status(u16),
    Pattern(Regex),
}

#[derive(Debug, Clone)]
struct Condition {
    field: Field,
    op: Op,
    value: Value,
}

/// A parsed ban: every condition must hold for an object to be banned.
#[derive(Debug, Clone)]
pub struct BanExpr {
    conditions: Vec<Condition>,
}

/// The stored object a ban is tested against: its cache key split into host and URL, and its metadata.
pub(crate) struct Subject<'a> {
    pub host: &'a str,
    pub url: &'a str,
    pub meta: &'a ObjectMeta,
}

impl<'a> Subject<'a> {
    /// Splits a primary key (`host/path?query`) at its first `/`.
    pub(crate) fn new(primary: &'a str, meta: &'a ObjectMeta) -> Self {
        let (host, url) = primary
            .find('/')
            .map_or((primary, ""), |i| primary.split_at(i));
        Self { host, url, meta }
    }
}

impl BanExpr {
    /// Parses and compiles an expression (syntax in `docs/invalidation.md`); refuses one longer than
    /// 4 KiB, or with a regex that would compile to more than 1 MiB.
    pub fn parse(text: &str) -> Result<Self, BanSyntaxError> {
        if text.len() > MAX_LEN {
            return Err(error(1, format!("expression longer than {MAX_LEN} bytes")));
        }
        let mut p = Parser {
            text,
            chars: text.char_indices().collect(),
            at: 0,
        };
        let mut conditions = vec![p.condition()?];
        loop {
            p.skip_space();
            if p.at == p.chars.len() {
                break;
            }
            if !p.eat("&&") {
                return Err(error(
                    p.column(),
                    "expected `&&` or the end of the expression",
                ));
            }
            conditions.push(p.condition()?);
        }
        Ok(Self { conditions })
    }

    /// The ban on objects whose stored response header `name` matches `pattern` (Varnish's
    /// `obj.http.<name> ~ <pattern>`), made of its parts rather than of text, so that a pattern taken from
    /// a request can only ever be a pattern. Refused as [`BanExpr::parse`] refuses: a name that is not a
    /// header name, a pattern that is not a regex or that would compile to more than 1 MiB.
    pub fn header_matches(name: &str, pattern: &str) -> Result<Self, BanSyntaxError> {
        if !http_token(name) {
            return Err(error(1, format!("invalid header name `{name}`")));
        }
        Self::of(Field::Header(name.to_ascii_lowercase()), pattern)
    }

    /// The ban on objects stored under `host` whose URL (path and query) matches `pattern`
    /// (`req.http.host == <host> && req.url ~ <pattern>`), made of its parts as
    /// [`BanExpr::header_matches`] is.
    pub fn url_matches(host: &str, pattern: &str) -> Result<Self, BanSyntaxError> {
        let mut ban = Self::of(Field::Url, pattern)?;
        ban.conditions.insert(
            0,
            Condition {
                field: Field::Host,
                op: Op::Eq,
                value: Value::Text(normal_host(host.trim()).into_owned()),
            },
        );
        Ok(ban)
    }

    /// One condition: `field ~ pattern`.
    fn of(field: Field, pattern: &str) -> Result<Self, BanSyntaxError> {
        if pattern.len() > MAX_LEN {
            return Err(error(1, format!("pattern longer than {MAX_LEN} bytes")));
        }
        let value = Value::Pattern(
            RegexBuilder::new(pattern)
                .size_limit(REGEX_SIZE_LIMIT)
                .build()
                .map_err(|e| BanSyntaxError {
                    position: 1,
                    reason: "invalid regex".into(),
                    detail: Some(one_line(&e.to_string())),
                })?,
        );
        Ok(Self {
            conditions: vec![Condition {
                field,
                op: Op::Match,
                value,
            }],
        })
    }

    pub(crate) fn matches(&self, subject: &Subject<'_>) -> bool {
        self.conditions.iter().all(|c| c.matches(subject))
    }
}

impl Condition {
    fn matches(&self, s: &Subject<'_>) -> bool {
        let actual: Option<&[u8]> = match &self.field {
            Field::Url => Some(s.url.as_bytes()),
            Field::Host => Some(s.host.as_bytes()),
            Field::Header(name) => s.meta.header(name),
            Field::Status => {
                let Value::Status(want) = self.value else {
                    return false;
                };
                return (s.meta.status == want) == (self.op == Op::Eq);
            }
        };
        // As in Varnish, a missing header equals and matches nothing, so `!=` and `!~` hold for it.
        let Some(actual) = actual else {
            return matches!(self.op, Op::Ne | Op::NoMatch);
        };
        match (&self.value, self.op) {
            (Value::Text(want), Op::Eq) => actual == want.as_bytes(),
            (Value::Text(want), Op::Ne) => actual != want.as_bytes(),
            (Value::Pattern(re), Op::Match) => re.is_match(actual),
            (Value::Pattern(re), Op::NoMatch) => !re.is_match(actual),
            _ => false,
        }
    }
}

fn error(position: usize, reason: impl Into<String>) -> BanSyntaxError {
    BanSyntaxError {
        position,
        reason: reason.into(),
        detail: None,
    }
}

struct Parser<'a> {
    text: &'a str,
    chars: Vec<(usize, char)>,
    at: usize,
}

impl Parser<'_> {
    fn column(&self) -> usize {
        self.at + 1
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).map(|&(_, c)| c)
    }

    fn skip_space(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.at += 1;
        }
    }

    fn eat(&mut self, token: &str) -> bool {
        let start = self.chars.get(self.at).map_or(self.text.len(), |&(i, _)| i);
        if self.text[start..].starts_with(token) {
            self.at += token.chars().count();
            true
        } else {
            false
        }
    }

    /// A run of characters up to whitespace (or an operator character, for a field name).
    fn word(&mut self, stop: impl Fn(char) -> bool) -> String {
        let mut out = String::new();
        while let Some(c) = self.peek().filter(|&c| !c.is_whitespace() && !stop(c)) {
            out.push(c);
            self.at += 1;
        }
        out
    }

    fn condition(&mut self) -> Result<Condition, BanSyntaxError> {
        self.skip_space();
        let field_at = self.column();
        let name = self.word(|c| matches!(c, '=' | '!' | '~'));
        if name.is_empty() {
            return Err(error(
                field_at,
                "expected a field (req.url, req.http.host, obj.status or obj.http.<name>)",
            ));
        }
        let field = match name.as_str() {
            "req.url" => Field::Url,
            "req.http.host" => Field::Host,
            "obj.status" => Field::Status,
            _ => match name.strip_prefix("obj.http.") {
                Some(header) if http_token(header) => Field::Header(header.to_ascii_lowercase()),
                Some(_) => return Err(error(field_at, format!("invalid header name in `{name}`"))),
                None => {
                    return Err(error(
                        field_at,
                        format!("unknown field `{name}` (expected req.url, req.http.host, obj.status or obj.http.<name>)"),
                    ))
                }
            },
        };
        self.skip_space();
        let op_at = self.column();
        let op = if self.eat("==") {
            Op::Eq
        } else if self.eat("!=") {
            Op::Ne
        } else if self.eat("!~") {
            Op::NoMatch
        } else if self.eat("~") {
            Op::Match
        } else {
            return Err(error(op_at, "expected an operator (==, !=, ~ or !~)"));
        };
        self.skip_space();
        let value_at = self.column();
        let raw = self.value()?;
        let value = match (&field, op) {
            (Field::Status, Op::Eq | Op::Ne) => match raw.parse::<u16>() {
                Ok(code) if (100..=999).contains(&code) => Value::Status(code),
                _ => {
                    return Err(error(
                        value_at,
                        format!("obj.status needs a status code from 100 to 999, not `{raw}`"),
                    ))
                }
            },
            (Field::Status, _) => {
                return Err(error(
                    op_at,
                    "obj.status can only be compared with == or !=",
                ))
            }
            (_, Op::Match | Op::NoMatch) => Value::Pattern(
                RegexBuilder::new(&raw)
                    .size_limit(REGEX_SIZE_LIMIT)
                    .build()
                    .map_err(|e| BanSyntaxError {
                        position: value_at,
                        reason: "invalid regex".into(),
                        detail: Some(one_line(&e.to_string())),
                    })?,
            ),
            (Field::Host, _) => Value::Text(normal_host(raw.trim()).into_owned()),
            _ => Value::Text(raw),
        };
        Ok(Condition { field, op, value })
    }

    fn value(&mut self) -> Result<String, BanSyntaxError> {
        let start = self.column();
        match self.peek() {
            None => Err(error(start, "expected a value")),
            Some(quote @ ('"' | '\'')) => {
                self.at += 1;
                let mut out = String::new();
                loop {
                    match self.peek() {
                        None => return Err(error(start, "unclosed quote")),
                        Some(c) if c == quote => {
                            self.at += 1;
                            return Ok(out);
                        }
                        Some('\\') if matches!(self.chars.get(self.at + 1), Some(&(_, n)) if n == quote || n == '\\') =>
                        {
                            out.push(self.chars[self.at + 1].1);
                            self.at += 2;
                        }
                        Some(c) => {
                            out.push(c);
                            self.at += 1;
                        }
                    }
                }
            }
            Some(_) => {
                let word = self.word(|_| false);
                if word.starts_with("&&") {
                    return Err(error(start, "expected a value"));
                }
                Ok(word)
            }
        }
    }
}

fn http_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// regex reports multi-line errors with a caret diagram; an API error is one line.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty() && !l.chars().all(|c| c == '^' || c == ' '))
        .unwrap_or(message)
        .trim_start_matches("error: ")
        .to_owned()
}

impl fmt::Display for BanExpr {
    /// The canonical form: identical bans print identically whatever their spacing and quoting.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.conditions.iter().enumerate() {
            if i > 0 {
                f.write_str(" && ")?;
            }
            match &c.field {
                Field::Url => f.write_str("req.url")?,
                Field::Host => f.write_str("req.http.host")?,
                Field::Status => f.write_str("obj.status")?,
                Field::Header(name) => write!(f, "obj.http.{name}")?,
            }
            let op = match c.op {
                Op::Eq => "==",
                Op::Ne => "!=",
                Op::Match => "~",
                Op::NoMatch => "!~",
            };
            match &c.value {
                Value::Status(code) => write!(f, " {op} {code}")?,
                Value::Text(text) => write!(f, " {op} {}", quoted(text))?,
                Value::Pattern(re) => write!(f, " {op} {}", quoted(re.as_str()))?,
            }
        }
        Ok(())
    }
}

fn quoted(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

#[cfg(test)]
mod props;

#[cfg(test)]
mod tests {

    /// A ban made of parts prints as text that parses back to the same ban, whatever the pattern holds:
    /// a pattern taken from a request cannot add a condition.
    #[test]
    fn bans_made_of_parts_round_trip_and_cannot_be_injected() {
        let hostile = r#"cat_1|x" && req.url ~ "."#;
        let ban = BanExpr::header_matches("X-Magento-Tags", hostile).unwrap();
        let text = ban.to_string();
        let parsed = BanExpr::parse(&text).unwrap();
        assert_eq!(parsed.to_string(), text);
        assert_eq!(parsed.conditions.len(), 1, "{text}");
        let ban = BanExpr::url_matches("Example.com:80", "^/wp-content/.*").unwrap();
        assert_eq!(
            ban.to_string(),
            r#"req.http.host == "example.com" && req.url ~ "^/wp-content/.*""#
        );
        assert!(BanExpr::header_matches("x tags", "a").is_err());
        let err = BanExpr::header_matches("x-tags", "(unclosed").unwrap_err();
        assert_eq!(err.reason, "invalid regex");
        assert!(BanExpr::header_matches("x-tags", &"a".repeat(MAX_LEN + 1)).is_err());
    }
    use super::*;

    fn object(status: u16, headers: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            status,
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
                .collect(),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn valid_expressions_and_their_canonical_form() {
        let cases = [
            ("req.url ~ ^/news", r#"req.url ~ "^/news""#),
            ("req.url==/a", r#"req.url == "/a""#),
            (r#"req.url ~ "^/a b""#, r#"req.url ~ "^/a b""#),
            (
                "req.http.host == Example.COM:80",
                r#"req.http.host == "example.com""#,
            ),
            (
                "req.http.host == example.com:443",
                r#"req.http.host == "example.com""#,
            ),
            (
                "req.http.host == example.com:08080",
                r#"req.http.host == "example.com:8080""#,
            ),
            (
                "req.http.host == a.test && req.url !~ '\\.css$'",
                r#"req.http.host == "a.test" && req.url !~ "\\.css$""#,
            ),
            ("obj.status == 404", "obj.status == 404"),
            ("obj.status!=200", "obj.status != 200"),
            (
                "obj.http.Content-Type ~ ^image/",
                r#"obj.http.content-type ~ "^image/""#,
            ),
            (
                r#"obj.http.x-tag == "say \"hi\"""#,
                r#"obj.http.x-tag == "say \"hi\"""#,
            ),
            (
                "  req.url ~ .  &&  obj.status == 200  ",
                r#"req.url ~ "." && obj.status == 200"#,
            ),
        ];
        for (text, canonical) in cases {
            let expr = BanExpr::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(expr.to_string(), canonical, "{text}");
            let again = BanExpr::parse(&expr.to_string()).unwrap();
            assert_eq!(again.to_string(), canonical, "canonical form parses back");
        }
    }

    #[test]
    fn invalid_expressions_say_where_and_why() {
        let cases = [
            ("", 1, "expected a field"),
            ("req.url ~ \"^/a", 11, "unclosed quote"),
            ("req.ur ~ x", 1, "unknown field `req.ur`"),
            ("req.url", 8, "expected an operator"),
            ("req.url = x", 9, "expected an operator"),
            ("req.url ==", 11, "expected a value"),
            ("req.url ~ (", 11, "invalid regex"),
            (
                "obj.status ~ 40.",
                12,
                "obj.status can only be compared with == or !=",
            ),
            ("obj.status == abc", 15, "obj.status needs a status code"),
            ("obj.status == 42", 15, "obj.status needs a status code"),
            ("obj.http. == x", 1, "invalid header name"),
            ("req.url == a || req.url == b", 14, "expected `&&`"),
            ("req.url == a &&", 16, "expected a field"),
            ("req.url == &&", 12, "expected a value"),
        ];
        for (text, position, reason) in cases {
            let err = BanExpr::parse(text).expect_err(text);
            assert_eq!(err.position, position, "{text}: {err}");
            assert!(err.reason.starts_with(reason), "{text}: {err}");
        }
        let err = BanExpr::parse("req.url ~ [z-a]").unwrap_err();
        assert!(
            err.to_string().starts_with("invalid regex at 11: "),
            "{err}"
        );
        assert!(!err.to_string().contains('\n'), "{err}");
        assert!(BanExpr::parse(&"a".repeat(MAX_LEN + 1)).is_err());
        assert!(
            BanExpr::parse("req.url ~ a{10000}{10000}").is_err(),
            "hostile regex refused"
        );
    }

    #[test]
    fn matching_table() {
        let html = object(200, &[("Content-Type", "text/html"), ("X-Section", "news")]);
        let missing = object(404, &[]);
        let cases = [
            ("req.url ~ ^/news", "a.test/news/1", &html, true),
            ("req.url ~ ^/news", "a.test/sport/1", &html, false),
            ("req.url == /news/1", "a.test/news/1", &html, true),
            ("req.url != /news/1", "a.test/news/1", &html, false),
            ("req.url ~ \\?page=2$", "a.test/list?page=2", &html, true),
            ("req.http.host == A.test", "a.test/x", &html, true),
            ("req.http.host == b.test", "a.test/x", &html, false),
            (
                "req.http.host ~ \\.test$ && req.url ~ ^/x",
                "a.test/x",
                &html,
                true,
            ),
            (
                "req.http.host ~ \\.test$ && req.url ~ ^/y",
                "a.test/x",
                &html,
                false,
            ),
            ("obj.status == 200", "a.test/x", &html, true),
            ("obj.status != 200", "a.test/x", &missing, true),
            ("obj.http.content-type ~ html", "a.test/x", &html, true),
            ("obj.http.X-SECTION == news", "a.test/x", &html, true),
            ("obj.http.x-section == news", "a.test/x", &missing, false),
            ("obj.http.x-section != news", "a.test/x", &missing, true),
            ("obj.http.x-section ~ .", "a.test/x", &missing, false),
            ("obj.http.x-section !~ .", "a.test/x", &missing, true),
        ];
        for (text, primary, meta, want) in cases {
            let expr = BanExpr::parse(text).unwrap();
            assert_eq!(
                expr.matches(&Subject::new(primary, meta)),
                want,
                "{text} on {primary}"
            );
        }
    }

    #[test]
    fn keys_split_into_host_and_url() {
        let meta = ObjectMeta::default();
        let s = Subject::new("example.com:8080/a/b?c=/d", &meta);
        assert_eq!((s.host, s.url), ("example.com:8080", "/a/b?c=/d"));
        let s = Subject::new("/only-path", &meta);
        assert_eq!((s.host, s.url), ("", "/only-path"));
    }
}
