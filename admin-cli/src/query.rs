//! `cachectl trace -q EXPR`: which traced requests to show, by a small query language over their fields,
//! as `varnishlog -q` does:
//!
//! ```text
//! expr   := term ( "or" term )*
//! term   := factor ( "and" factor )*
//! factor := "not" factor | "(" expr ")" | field op value
//! field  := url | host | method | client | status | cache | detail | backend | route
//!         | ttfb | duration | bytes | req.http.<name> | resp.http.<name>
//! op     := == | != | ~ | !~ | < | <= | > | >=
//! value  := "double quoted" | 'single quoted' | bare-word
//! ```
//!
//! `ttfb` and `duration` are in milliseconds; `status`, `bytes`, `ttfb` and `duration` compare as numbers
//! with `<`, `<=`, `>` and `>=`. `~` searches a regular expression (Rust's `regex`, linear in its input).
//! A header names every value it has, joined with `, `. A field the request does not have (a header not
//! sent, no backend) equals and matches nothing, so `!=` and `!~` hold for it, as in Varnish.

use lacquer_admin::wire::LogEntry;
use regex::Regex;

/// A parsed query.
#[derive(Debug, Clone)]
pub struct Query(Expr);

#[derive(Debug, Clone)]
enum Expr {
    Or(Box<Expr>, Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Test(Field, Op, Value),
}

#[derive(Debug, Clone, PartialEq)]
enum Field {
    Url,
    Host,
    Method,
    Client,
    Status,
    Cache,
    Detail,
    Backend,
    Route,
    Ttfb,
    Duration,
    Bytes,
    Request(String),
    Response(String),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Eq,
    Ne,
    Match,
    NoMatch,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Debug, Clone)]
enum Value {
    Text(String),
    Number(f64),
    Pattern(Regex),
}

/// One field's value in a record: text, or a number for the numeric fields.
enum Got {
    Text(String),
    Number(f64),
}

impl Query {
    /// Parses `text`; the error says what is wrong and where.
    pub fn parse(text: &str) -> Result<Self, String> {
        let tokens = tokens(text)?;
        let mut p = Parser { tokens, at: 0 };
        let expr = p.or()?;
        match p.tokens.get(p.at) {
            None => Ok(Self(expr)),
            Some(t) => Err(format!(
                "unexpected `{}`: expected `and`, `or` or the end",
                t.text()
            )),
        }
    }

    /// Whether `entry` is one the query asks for.
    pub fn matches(&self, entry: &LogEntry) -> bool {
        self.0.holds(entry)
    }
}

impl Expr {
    fn holds(&self, e: &LogEntry) -> bool {
        match self {
            Expr::Or(a, b) => a.holds(e) || b.holds(e),
            Expr::And(a, b) => a.holds(e) && b.holds(e),
            Expr::Not(a) => !a.holds(e),
            Expr::Test(field, op, value) => test(field.of(e), *op, value),
        }
    }
}

fn test(got: Option<Got>, op: Op, value: &Value) -> bool {
    let Some(got) = got else {
        return matches!(op, Op::Ne | Op::NoMatch);
    };
    match (op, value, got) {
        (Op::Match, Value::Pattern(re), got) => re.is_match(&got.text()),
        (Op::NoMatch, Value::Pattern(re), got) => !re.is_match(&got.text()),
        (Op::Eq | Op::Ne, Value::Number(want), Got::Number(n)) => (n == *want) == (op == Op::Eq),
        (Op::Eq | Op::Ne, Value::Text(want), got) => (got.text() == *want) == (op == Op::Eq),
        (Op::Eq | Op::Ne, Value::Number(want), got) => {
            (got.text() == want.to_string()) == (op == Op::Eq)
        }
        (_, Value::Number(want), Got::Number(n)) => match op {
            Op::Lt => n < *want,
            Op::Le => n <= *want,
            Op::Gt => n > *want,
            _ => n >= *want,
        },
        _ => false,
    }
}

impl Got {
    fn text(&self) -> String {
        match self {
            Got::Text(t) => t.clone(),
            Got::Number(n) => n.to_string(),
        }
    }
}

impl Field {
    fn parse(name: &str) -> Result<Self, String> {
        Ok(match name {
            "url" => Field::Url,
            "host" => Field::Host,
            "method" => Field::Method,
            "client" => Field::Client,
            "status" => Field::Status,
            "cache" => Field::Cache,
            "detail" => Field::Detail,
            "backend" => Field::Backend,
            "route" => Field::Route,
            "ttfb" => Field::Ttfb,
            "duration" => Field::Duration,
            "bytes" => Field::Bytes,
            _ => match (name.strip_prefix("req.http."), name.strip_prefix("resp.http.")) {
                (Some(h), _) if !h.is_empty() => Field::Request(h.to_ascii_lowercase()),
                (_, Some(h)) if !h.is_empty() => Field::Response(h.to_ascii_lowercase()),
                _ => {
                    return Err(format!(
                        "unknown field `{name}` (url, host, method, client, status, cache, detail, backend, \
                         route, ttfb, duration, bytes, req.http.NAME, resp.http.NAME)"
                    ))
                }
            },
        })
    }

    fn numeric(&self) -> bool {
        matches!(
            self,
            Field::Status | Field::Ttfb | Field::Duration | Field::Bytes
        )
    }

    fn of(&self, e: &LogEntry) -> Option<Got> {
        let text = |t: &str| Some(Got::Text(t.to_owned()));
        let header = |fields: &[lacquer_admin::wire::HeaderField], name: &str| {
            let values: Vec<&str> = fields
                .iter()
                .filter(|f| f.name.eq_ignore_ascii_case(name))
                .map(|f| f.value.as_str())
                .collect();
            (!values.is_empty()).then(|| Got::Text(values.join(", ")))
        };
        match self {
            Field::Url => text(&e.url),
            Field::Host => e.host.as_deref().and_then(text),
            Field::Method => text(&e.method),
            Field::Client => text(&e.client),
            Field::Status => Some(Got::Number(f64::from(e.status))),
            Field::Cache => text(&e.cache),
            Field::Detail => e.detail.as_deref().and_then(text),
            Field::Backend => e.backend.as_deref().and_then(text),
            Field::Route => e.route.as_deref().and_then(text),
            Field::Ttfb => Some(Got::Number(e.ttfb * 1e3)),
            Field::Duration => Some(Got::Number(e.duration * 1e3)),
            Field::Bytes => Some(Got::Number(e.bytes as f64)),
            Field::Request(name) => header(&e.request_headers, name),
            Field::Response(name) => header(&e.response_headers, name),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Word(String),
    Quoted(String),
    Op(Op),
    Open,
    Close,
}

impl Token {
    fn text(&self) -> String {
        match self {
            Token::Word(w) => w.clone(),
            Token::Quoted(q) => format!("{q:?}"),
            Token::Op(op) => format!("{op:?}"),
            Token::Open => "(".into(),
            Token::Close => ")".into(),
        }
    }
}

fn tokens(text: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let (token, len) = match (c, next) {
            (c, _) if c.is_whitespace() => {
                i += 1;
                continue;
            }
            ('(', _) => (Token::Open, 1),
            (')', _) => (Token::Close, 1),
            ('=', Some('=')) => (Token::Op(Op::Eq), 2),
            ('!', Some('=')) => (Token::Op(Op::Ne), 2),
            ('!', Some('~')) => (Token::Op(Op::NoMatch), 2),
            ('~', _) => (Token::Op(Op::Match), 1),
            ('<', Some('=')) => (Token::Op(Op::Le), 2),
            ('>', Some('=')) => (Token::Op(Op::Ge), 2),
            ('<', _) => (Token::Op(Op::Lt), 1),
            ('>', _) => (Token::Op(Op::Gt), 1),
            (quote @ ('"' | '\''), _) => {
                let mut value = String::new();
                let mut j = i + 1;
                loop {
                    match chars.get(j) {
                        None => return Err(format!("unclosed quote at {}", i + 1)),
                        Some('\\')
                            if chars.get(j + 1).is_some_and(|n| *n == quote || *n == '\\') =>
                        {
                            value.push(chars[j + 1]);
                            j += 2;
                        }
                        Some(c) if *c == quote => break,
                        Some(c) => {
                            value.push(*c);
                            j += 1;
                        }
                    }
                }
                (Token::Quoted(value), j + 1 - i)
            }
            _ => {
                let start = i;
                let mut j = i;
                while j < chars.len()
                    && !chars[j].is_whitespace()
                    && !matches!(chars[j], '(' | ')' | '=' | '!' | '~' | '<' | '>')
                {
                    j += 1;
                }
                if j == start {
                    return Err(format!("unexpected `{c}` at {}", i + 1));
                }
                (Token::Word(chars[start..j].iter().collect()), j - start)
            }
        };
        out.push(token);
        i += len;
    }
    Ok(out)
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn keyword(&mut self, word: &str) -> bool {
        let hit = matches!(self.tokens.get(self.at), Some(Token::Word(w)) if w.eq_ignore_ascii_case(word));
        self.at += usize::from(hit);
        hit
    }

    fn or(&mut self) -> Result<Expr, String> {
        let mut left = self.and()?;
        while self.keyword("or") {
            left = Expr::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, String> {
        let mut left = self.factor()?;
        while self.keyword("and") {
            left = Expr::And(Box::new(left), Box::new(self.factor()?));
        }
        Ok(left)
    }

    fn factor(&mut self) -> Result<Expr, String> {
        if self.keyword("not") {
            return Ok(Expr::Not(Box::new(self.factor()?)));
        }
        if self.tokens.get(self.at) == Some(&Token::Open) {
            self.at += 1;
            let inner = self.or()?;
            if self.tokens.get(self.at) != Some(&Token::Close) {
                return Err("unclosed `(`".into());
            }
            self.at += 1;
            return Ok(inner);
        }
        let field = match self.tokens.get(self.at) {
            Some(Token::Word(w)) => Field::parse(w)?,
            Some(t) => return Err(format!("expected a field, found `{}`", t.text())),
            None => return Err("expected a field, found the end".into()),
        };
        let op = match self.tokens.get(self.at + 1) {
            Some(Token::Op(op)) => *op,
            _ => {
                return Err(
                    "expected an operator (==, !=, ~, !~, <, <=, >, >=) after the field".into(),
                )
            }
        };
        let raw = match self.tokens.get(self.at + 2) {
            Some(Token::Word(w) | Token::Quoted(w)) => w.clone(),
            _ => return Err("expected a value after the operator".into()),
        };
        self.at += 3;
        let value = match op {
            Op::Match | Op::NoMatch => Value::Pattern(
                regex::RegexBuilder::new(&raw)
                    .size_limit(1 << 20)
                    .build()
                    .map_err(|e| format!("invalid regex {raw:?}: {e}"))?,
            ),
            Op::Lt | Op::Le | Op::Gt | Op::Ge => {
                if !field.numeric() {
                    return Err(
                        "<, <=, > and >= compare numbers: status, bytes, ttfb, duration".into(),
                    );
                }
                Value::Number(
                    raw.parse()
                        .map_err(|_| format!("{raw:?} is not a number"))?,
                )
            }
            Op::Eq | Op::Ne if field.numeric() => match raw.parse() {
                Ok(n) => Value::Number(n),
                Err(_) => Value::Text(raw),
            },
            Op::Eq | Op::Ne => Value::Text(raw),
        };
        Ok(Expr::Test(field, op, value))
    }
}

#[cfg(test)]
mod tests {
    use lacquer_admin::wire::HeaderField;

    use super::*;

    fn entry() -> LogEntry {
        LogEntry {
            time_ms: 0,
            client: "203.0.113.7".into(),
            method: "GET".into(),
            url: "/p/1?x=2".into(),
            host: Some("shop.example".into()),
            protocol: "HTTP/1.1".into(),
            status: 503,
            bytes: 120,
            referer: None,
            user_agent: None,
            cache: "MISS".into(),
            detail: Some("backend-error".into()),
            ttfb: 0.250,
            duration: 0.251,
            backend: Some("app1".into()),
            route: Some("default".into()),
            request_headers: vec![HeaderField {
                name: "user-agent".into(),
                value: "curl/8.0".into(),
            }],
            response_headers: vec![
                HeaderField {
                    name: "x-foo".into(),
                    value: "bar".into(),
                },
                HeaderField {
                    name: "X-Foo".into(),
                    value: "baz".into(),
                },
            ],
            steps: Vec::new(),
        }
    }

    #[test]
    fn queries_select_as_varnishlogs_do() {
        let e = entry();
        for (query, want) in [
            ("status >= 500", true),
            ("status >= 500 and resp.http.x-foo ~ \"bar\"", true),
            ("RespStatus >= 500", false),
            ("status == 503 and not cache == HIT", true),
            ("status < 500 or ttfb > 200", true),
            ("ttfb > 300", false),
            (
                "(host ~ '^shop\\.' and url ~ ^/p/) and backend == app1",
                true,
            ),
            ("resp.http.X-FOO == 'bar, baz'", true),
            ("req.http.user-agent ~ curl", true),
            ("req.http.cookie ~ .", false),
            ("req.http.cookie !~ .", true),
            ("req.http.cookie != x", true),
            ("detail == backend-error and bytes <= 120", true),
        ] {
            match Query::parse(query) {
                Ok(q) => assert_eq!(q.matches(&e), want, "{query}"),
                Err(err) => assert!(!want && query.starts_with("RespStatus"), "{query}: {err}"),
            }
        }
    }

    #[test]
    fn bad_queries_say_what_is_wrong() {
        for (query, says) in [
            ("status", "expected an operator"),
            ("status >", "expected a value"),
            ("url < 5", "compare numbers"),
            ("nope == 1", "unknown field `nope`"),
            ("url ~ \"(\"", "invalid regex"),
            ("(status == 1", "unclosed `(`"),
            ("status == 1 status", "expected `and`, `or` or the end"),
            ("url == \"a", "unclosed quote"),
        ] {
            let err = Query::parse(query).unwrap_err();
            assert!(err.contains(says), "{query}: {err}");
        }
    }
}
