//! `access_log.format`, compiled once (at start and on reload): `default`, `combined`, `json`, or a format
//! string of `varnishncsa -F`'s fields. A field the language does not know is refused at compile time,
//! naming the setting and the field, never discovered while requests are logged.

use std::fmt::Write as _;

use chrono::{format::StrftimeItems, Local, TimeZone};
use http::{HeaderMap, HeaderName};
use lacquer_admin::wire::LogEntry;
use lacquer_config::ConfigError;

/// The setting every compile error names.
const SETTING: &str = "access_log.format";

/// NCSA combined as varnishncsa writes it (the request line with the full URL, so the host is in it),
/// then the cache result, time to first byte and total time. `LogEntry::ncsa_line`, which `cachectl log`
/// prints, is the same line (a test holds them together).
pub const DEFAULT: &str =
    "%h %l %u %t \"%r\" %s %b \"%{Referer}i\" \"%{User-agent}i\" %{cache}x %{ttfb}x %{duration}x %{detail}x";

/// NCSA combined exactly as NGINX and Apache write it (the request line with the path only), for tools
/// that parse nothing else.
pub const COMBINED: &str = "%h %l %u %t \"%m %U%q %H\" %s %b \"%{Referer}i\" \"%{User-agent}i\"";

/// How each access log line is written.
#[derive(Debug)]
pub struct LogFormat {
    shape: Shape,
    /// The request fields `%{NAME}i` asks for, captured when the request arrives.
    pub(crate) request_fields: Vec<HeaderName>,
    /// The response fields `%{NAME}o` asks for, captured when the response head leaves.
    pub(crate) response_fields: Vec<HeaderName>,
}

#[derive(Debug)]
enum Shape {
    /// One JSON document per line: the record `GET /v1/log/stream` sends.
    Json,
    Line(Vec<Piece>),
}

#[derive(Debug)]
enum Piece {
    Text(String),
    /// `%h`.
    Client,
    /// `%l`, `%u`: no identd, no authenticated user.
    Dash,
    /// `%t`: `[10/Oct/2026:13:55:36 +0000]`, local time.
    Time,
    /// `%{FORMAT}t`: strftime, local time.
    TimeAs(String),
    /// `%r`: `GET http://host/path?query HTTP/1.1`.
    RequestLine,
    /// `%m`.
    Method,
    /// `%U`: the path without the query.
    Path,
    /// `%q`: `?query`, or nothing.
    Query,
    /// `%H`.
    Protocol,
    /// `%s`.
    Status,
    /// `%b`: body bytes sent, `-` for none.
    Bytes,
    /// `%D`: microseconds from the request's arrival to its last byte.
    Micros,
    /// `%T`: whole seconds, the same span.
    Seconds,
    /// `%{NAME}i`, by its place in `request_fields`.
    RequestField(usize),
    /// `%{NAME}o`, by its place in `response_fields`.
    ResponseField(usize),
    /// `%{cache}x`: `HIT`, `MISS`, `PASS`, `STALE`, … (the response's `X-Cache`).
    Cache,
    /// `%{Varnish:hitmiss}x`: `hit` or `miss`.
    HitMiss,
    /// `%{Varnish:handling}x`: `hit`, `miss`, `pass`, `stale`, … (the cache result in lower case).
    Handling,
    /// `%{ttfb}x`, `%{Varnish:time_firstbyte}x`: seconds to the response head.
    Ttfb,
    /// `%{duration}x`: seconds to the last byte.
    Duration,
    /// `%{backend}x`: the backend the request was sent to, `-` when none.
    Backend,
    /// `%{route}x`: `route[N]` or `default`.
    Route,
    /// `%{detail}x`: the `Cache-Status` detail (why a miss was not stored, why a request passed), `-` when none.
    Detail,
    /// `%{host}x`: the request's host.
    Host,
    /// `%{url}x`: `http://host/path?query`.
    Url,
}

/// The values of the request and response fields a format asks for, in its order.
pub(crate) type Captured = Vec<Option<String>>;

impl LogFormat {
    /// `default`, `combined`, `json`, or a format string; the error names the setting and the field.
    pub fn compile(text: &str) -> Result<Self, ConfigError> {
        let source = match text {
            "default" => DEFAULT,
            "combined" => COMBINED,
            "json" => {
                return Ok(Self {
                    shape: Shape::Json,
                    request_fields: Vec::new(),
                    response_fields: Vec::new(),
                })
            }
            other => other,
        };
        let (mut request_fields, mut response_fields) = (Vec::new(), Vec::new());
        let pieces = parse(source, &mut request_fields, &mut response_fields)?;
        Ok(Self {
            shape: Shape::Line(pieces),
            request_fields,
            response_fields,
        })
    }

    /// The values of the fields the format asks for from `headers`, lossily decoded: a log line is text.
    pub(crate) fn capture(names: &[HeaderName], headers: &HeaderMap) -> Captured {
        names
            .iter()
            .map(|name| {
                let values: Vec<_> = headers
                    .get_all(name)
                    .iter()
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                    .collect();
                (!values.is_empty()).then(|| values.join(", "))
            })
            .collect()
    }

    /// One line, newline included. Every value that came from a client or an origin is escaped, so no
    /// request can forge a field or a line.
    pub fn line(&self, e: &LogEntry, request: &Captured, response: &Captured) -> String {
        let pieces = match &self.shape {
            Shape::Json => {
                let mut line = serde_json::to_string(e).expect("a log entry serializes");
                line.push('\n');
                return line;
            }
            Shape::Line(pieces) => pieces,
        };
        let mut out = String::with_capacity(256);
        let dash_or = |out: &mut String, v: Option<&str>| match v {
            Some(v) => escape_into(out, v),
            None => out.push('-'),
        };
        let (path, query) = e
            .url
            .split_once('?')
            .map_or((e.url.as_str(), None), |(p, q)| (p, Some(q)));
        for piece in pieces {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Client => escape_into(&mut out, &e.client),
                Piece::Dash => out.push('-'),
                Piece::Time => {
                    out.push('[');
                    time_into(&mut out, e.time_ms, "%d/%b/%Y:%H:%M:%S %z");
                    out.push(']');
                }
                Piece::TimeAs(f) => time_into(&mut out, e.time_ms, f),
                Piece::RequestLine => {
                    escape_into(&mut out, &e.method);
                    out.push(' ');
                    url_into(&mut out, e);
                    out.push(' ');
                    escape_into(&mut out, &e.protocol);
                }
                Piece::Method => escape_into(&mut out, &e.method),
                Piece::Path => escape_into(&mut out, path),
                Piece::Query => {
                    if let Some(q) = query {
                        out.push('?');
                        escape_into(&mut out, q);
                    }
                }
                Piece::Protocol => escape_into(&mut out, &e.protocol),
                Piece::Status => {
                    let _ = write!(out, "{}", e.status);
                }
                Piece::Bytes if e.bytes == 0 => out.push('-'),
                Piece::Bytes => {
                    let _ = write!(out, "{}", e.bytes);
                }
                Piece::Micros => {
                    let _ = write!(out, "{}", (e.duration * 1e6) as u64);
                }
                Piece::Seconds => {
                    let _ = write!(out, "{}", e.duration as u64);
                }
                Piece::RequestField(n) => {
                    dash_or(&mut out, request.get(*n).and_then(Option::as_deref))
                }
                Piece::ResponseField(n) => {
                    dash_or(&mut out, response.get(*n).and_then(Option::as_deref))
                }
                Piece::Cache => escape_into(&mut out, &e.cache),
                Piece::HitMiss => out.push_str(if e.cache.starts_with("HIT") {
                    "hit"
                } else {
                    "miss"
                }),
                Piece::Handling => escape_into(&mut out, &e.cache.to_ascii_lowercase()),
                Piece::Ttfb => {
                    let _ = write!(out, "{:.6}", e.ttfb);
                }
                Piece::Duration => {
                    let _ = write!(out, "{:.6}", e.duration);
                }
                Piece::Backend => dash_or(&mut out, e.backend.as_deref()),
                Piece::Route => dash_or(&mut out, e.route.as_deref()),
                Piece::Detail => dash_or(&mut out, e.detail.as_deref()),
                Piece::Host => dash_or(&mut out, e.host.as_deref()),
                Piece::Url => url_into(&mut out, e),
            }
        }
        out.push('\n');
        out
    }
}

/// The pieces of a format string; the names `%{NAME}i` and `%{NAME}o` ask for go to `request` and
/// `response`, the pieces holding their places.
fn parse(
    source: &str,
    request: &mut Vec<HeaderName>,
    response: &mut Vec<HeaderName>,
) -> Result<Vec<Piece>, ConfigError> {
    let error = |what: String| ConfigError::setting(SETTING, what);
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = source.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        if c != '%' {
            text.push(c);
            continue;
        }
        let argument = if chars.peek().map(|&(_, c)| c) == Some('{') {
            chars.next();
            let mut argument = String::new();
            loop {
                match chars.next() {
                    Some((_, '}')) => break,
                    Some((_, c)) => argument.push(c),
                    None => return Err(error(format!("unclosed %{{ at byte {at}"))),
                }
            }
            Some(argument)
        } else {
            None
        };
        // `%>s` is Apache's final status: the only status lacquerd has.
        if argument.is_none() && chars.peek().map(|&(_, c)| c) == Some('>') {
            chars.next();
        }
        let Some((_, letter)) = chars.next() else {
            return Err(error(format!(
                "a lone % at the end (byte {at}); write %% for a percent sign"
            )));
        };
        let piece = match (letter, argument) {
            ('%', None) => {
                text.push('%');
                continue;
            }
            ('h', None) => Piece::Client,
            ('l' | 'u', None) => Piece::Dash,
            ('t', None) => Piece::Time,
            ('t', Some(strftime)) => {
                if StrftimeItems::new(&strftime).any(|i| i == chrono::format::Item::Error) {
                    return Err(error(format!("%{{{strftime}}}t: not a strftime format")));
                }
                Piece::TimeAs(strftime)
            }
            ('r', None) => Piece::RequestLine,
            ('m', None) => Piece::Method,
            ('U', None) => Piece::Path,
            ('q', None) => Piece::Query,
            ('H', None) => Piece::Protocol,
            ('s', None) => Piece::Status,
            ('b', None) => Piece::Bytes,
            ('D', None) => Piece::Micros,
            ('T', None) => Piece::Seconds,
            ('i', Some(name)) => Piece::RequestField(field(request, &name, 'i')?),
            ('o', Some(name)) => {
                Piece::ResponseField(field(response, &name, 'o')?)
            }
            ('x', Some(name)) => match name.as_str() {
                "cache" => Piece::Cache,
                "Varnish:hitmiss" => Piece::HitMiss,
                "Varnish:handling" => Piece::Handling,
                "ttfb" | "Varnish:time_firstbyte" => Piece::Ttfb,
                "duration" => Piece::Duration,
                "backend" => Piece::Backend,
                "route" => Piece::Route,
                "detail" => Piece::Detail,
                "host" => Piece::Host,
                "url" => Piece::Url,
                _ => {
                    return Err(error(format!(
                        "unknown field %{{{name}}}x (known: cache, ttfb, duration, backend, route, detail, host, url, \
                         Varnish:hitmiss, Varnish:handling, Varnish:time_firstbyte)"
                    )))
                }
            },
            (letter, Some(argument)) => {
                return Err(error(format!("unknown field %{{{argument}}}{letter}")))
            }
            (letter, None) => {
                return Err(error(format!(
                    "unknown field %{letter} (known: %b %D %H %h %l %m %q %r %s %t %T %U %u, \
                     %{{NAME}}i %{{NAME}}o %{{FORMAT}}t %{{NAME}}x, %%)"
                )))
            }
        };
        if !text.is_empty() {
            pieces.push(Piece::Text(std::mem::take(&mut text)));
        }
        pieces.push(piece);
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

/// Where `%{NAME}i` or `%{NAME}o` finds its value; a name no header can have is refused.
fn field(names: &mut Vec<HeaderName>, name: &str, letter: char) -> Result<usize, ConfigError> {
    let name = HeaderName::try_from(name).map_err(|_| {
        ConfigError::setting(
            SETTING,
            format!("%{{{name}}}{letter}: not a header field name"),
        )
    })?;
    Ok(names.iter().position(|n| *n == name).unwrap_or_else(|| {
        names.push(name);
        names.len() - 1
    }))
}

/// `http://host/path?query` as varnishncsa's `%r` writes it; the path alone without a host.
fn url_into(out: &mut String, e: &LogEntry) {
    if let Some(host) = &e.host {
        out.push_str("http://");
        escape_into(out, host);
    }
    escape_into(out, &e.url);
}

fn time_into(out: &mut String, ms: u64, format: &str) {
    match Local.timestamp_millis_opt(ms as i64).single() {
        Some(t) => {
            let _ = write!(out, "{}", t.format(format));
        }
        None => out.push('-'),
    }
}

/// As NGINX does: quotes, backslashes and control characters as `\xHH`, so a client cannot forge
/// fields or lines.
fn escape_into(out: &mut String, s: &str) {
    for c in s.chars() {
        if c == '"' || c == '\\' || c.is_control() {
            let mut utf8 = [0; 4];
            for b in c.encode_utf8(&mut utf8).bytes() {
                let _ = write!(out, "\\x{b:02X}");
            }
        } else {
            out.push(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> LogEntry {
        LogEntry {
            time_ms: 1_796_016_974_123,
            client: "203.0.113.7".into(),
            method: "GET".into(),
            url: "/a?b=1".into(),
            host: Some("example.com".into()),
            protocol: "HTTP/1.1".into(),
            status: 200,
            bytes: 2048,
            referer: None,
            // What a header can carry (no CR, LF or other control byte but a tab), all of it hostile.
            user_agent: Some("evil\" \"\t\\ \u{fffd}".into()),
            cache: "HIT".into(),
            detail: None,
            ttfb: 0.000123,
            duration: 1.0045,
            backend: Some("app1".into()),
            route: Some("route[0]".into()),
            request_headers: Vec::new(),
            response_headers: Vec::new(),
            steps: Vec::new(),
        }
    }

    fn headers(fields: &[(&str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in fields {
            h.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(value).unwrap(),
            );
        }
        h
    }

    fn line(format: &str, e: &LogEntry, request: &HeaderMap, response: &HeaderMap) -> String {
        let f = LogFormat::compile(format).unwrap();
        let req = LogFormat::capture(&f.request_fields, request);
        let resp = LogFormat::capture(&f.response_fields, response);
        f.line(e, &req, &resp)
    }

    #[test]
    fn the_default_line_is_the_one_cachectl_log_prints() {
        let e = entry();
        let request = headers(&[("user-agent", b"evil\" \"\t\\ \xff")]);
        let written = line("default", &e, &request, &HeaderMap::new());
        assert_eq!(written, e.ncsa_line());
        assert!(
            written.contains("\"GET http://example.com/a?b=1 HTTP/1.1\""),
            "{written}"
        );
        assert!(
            written.contains("\"evil\\x22 \\x22\\x09\\x5C \u{fffd}\" HIT"),
            "{written}"
        );
        assert_eq!(written.matches('\n').count(), 1);
    }

    #[test]
    fn combined_is_ncsa_combined_with_the_path_only() {
        let written = line("combined", &entry(), &HeaderMap::new(), &HeaderMap::new());
        let time = Local
            .timestamp_millis_opt(entry().time_ms as i64)
            .unwrap()
            .format("%d/%b/%Y:%H:%M:%S %z");
        assert_eq!(
            written,
            format!("203.0.113.7 - - [{time}] \"GET /a?b=1 HTTP/1.1\" 200 2048 \"-\" \"-\"\n")
        );
    }

    #[test]
    fn every_field_of_a_format_string() {
        let e = entry();
        let request = headers(&[("x-a", b"1"), ("x-a", b"2"), ("host", b"example.com")]);
        let response = headers(&[("content-type", b"text/plain")]);
        let written = line(
            "%m|%U|%q|%H|%>s|%b|%D|%T|%{x-a}i|%{X-Missing}i|%{Content-Type}o|%{cache}x|%{Varnish:hitmiss}x|\
             %{Varnish:handling}x|%{Varnish:time_firstbyte}x|%{backend}x|%{route}x|%{host}x|%{url}x|%{%Y}t|100%%",
            &e,
            &request,
            &response,
        );
        let year = Local
            .timestamp_millis_opt(e.time_ms as i64)
            .unwrap()
            .format("%Y");
        assert_eq!(
            written,
            format!(
                "GET|/a|?b=1|HTTP/1.1|200|2048|1004500|1|1, 2|-|text/plain|HIT|hit|hit|0.000123|app1|route[0]|\
                 example.com|http://example.com/a?b=1|{year}|100%\n"
            )
        );
        let bare = LogEntry {
            url: "/a".into(),
            bytes: 0,
            cache: "MISS".into(),
            backend: None,
            host: None,
            ..e
        };
        assert_eq!(
            line(
                "%U%q %b %{Varnish:hitmiss}x %{backend}x %r",
                &bare,
                &HeaderMap::new(),
                &HeaderMap::new()
            ),
            "/a - miss - GET /a HTTP/1.1\n"
        );
    }

    #[test]
    fn hostile_heads_cannot_forge_fields_or_lines() {
        // Fields the proxy fills in (the host, the URL, a name) may hold anything; header fields anything
        // but CR, LF and other control bytes (hyper refuses those before a line is written).
        let e = LogEntry {
            host: Some("a\"b\\c\u{7f}".into()),
            url: "/x\"y".into(),
            backend: Some("b\nc".into()),
            user_agent: Some("\u{1b}[2J\r\n".into()),
            ..entry()
        };
        let request = headers(&[("referer", b"\"\t\\ \xff\xfe")]);
        let written = line(
            "%{host}x \"%r\" \"%{Referer}i\" %{backend}x",
            &e,
            &request,
            &HeaderMap::new(),
        );
        assert_eq!(
            written,
            "a\\x22b\\x5Cc\\x7F \"GET http://a\\x22b\\x5Cc\\x7F/x\\x22y HTTP/1.1\" \
             \"\\x22\\x09\\x5C \u{fffd}\u{fffd}\" b\\x0Ac\n"
        );

        let json = line("json", &e, &request, &HeaderMap::new());
        assert!(
            json.ends_with('\n') && json.matches('\n').count() == 1,
            "{json}"
        );
        let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(parsed["host"], "a\"b\\c\u{7f}");
        assert_eq!(parsed["user_agent"], "\u{1b}[2J\r\n");
        assert_eq!(parsed["backend"], "b\nc");
        assert_eq!(parsed["route"], "route[0]");
        assert!(
            json.trim_end()
                .chars()
                .all(|c| !c.is_control() || c == '\u{7f}'),
            "control characters are escaped: {json}"
        );
    }

    #[test]
    fn errors_name_the_setting_and_the_field() {
        for (format, want) in [
            ("%h %Z", "access_log.format: unknown field %Z"),
            ("%{nope}x", "access_log.format: unknown field %{nope}x"),
            (
                "%{a b}i",
                "access_log.format: %{a b}i: not a header field name",
            ),
            ("%{Host}z", "access_log.format: unknown field %{Host}z"),
            ("%{Host", "access_log.format: unclosed %{ at byte 0"),
            ("50%", "access_log.format: a lone % at the end (byte 2)"),
            ("%{%Q}t", "access_log.format: %{%Q}t: not a strftime format"),
        ] {
            let e = LogFormat::compile(format).unwrap_err().to_string();
            assert!(e.starts_with(want), "{format}: {e}");
        }
    }
}
