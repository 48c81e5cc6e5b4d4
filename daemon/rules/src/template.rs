//! Templates: the values rules write (headers, paths, redirect targets, bodies), parsed once into literal
//! text and the request's values.

use std::{fmt::Write, net::IpAddr};

use http::request::Parts;

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    /// `$1`…`$9`: a group of the rule's regular expression.
    Group(usize),
    Var(Var),
    /// `${resp.NAME}`: a header of the response (backend_response and deliver rules).
    Response(http::HeaderName),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Var {
    Host,
    Path,
    Query,
    Target,
    Scheme,
    ClientIp,
    Method,
    Status,
    Outcome,
}

const VARS: [(&str, Var); 9] = [
    ("host", Var::Host),
    ("path", Var::Path),
    ("query", Var::Query),
    ("target", Var::Target),
    ("scheme", Var::Scheme),
    ("client_ip", Var::ClientIp),
    ("method", Var::Method),
    ("status", Var::Status),
    ("outcome", Var::Outcome),
];

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template(Vec<Piece>);

/// What a template is rendered from.
pub(crate) struct Values<'a> {
    pub parts: &'a Parts,
    pub client: IpAddr,
    pub secure: bool,
    pub status: Option<u16>,
    pub groups: &'a [String],
    /// The response's head, in the response phases.
    pub response: Option<&'a http::HeaderMap>,
    /// How the cache answered, in the deliver phase (`hit`, `miss`…).
    pub outcome: Option<&'static str>,
}

impl<'a> Values<'a> {
    /// The request phase's values: the request alone, no response yet.
    pub fn request(parts: &'a Parts, client: IpAddr, secure: bool, groups: &'a [String]) -> Self {
        Self {
            parts,
            client,
            secure,
            status: None,
            groups,
            response: None,
            outcome: None,
        }
    }
}

impl Template {
    /// Parses `text`; `groups` is how many groups the rule's regular expression has.
    pub fn parse(text: &str, groups: usize) -> Result<Self, String> {
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(at) = rest.find('$') {
            literal.push_str(&rest[..at]);
            rest = &rest[at + 1..];
            let piece = if let Some(inner) = rest.strip_prefix('{') {
                let end = inner
                    .find('}')
                    .ok_or_else(|| format!("{text:?}: `${{` is not closed"))?;
                let name = &inner[..end];
                rest = &inner[end + 1..];
                if let Some(header) = name.strip_prefix("resp.") {
                    let header = http::HeaderName::from_bytes(header.as_bytes())
                        .map_err(|_| format!("{text:?}: `{header}` is not a header name"))?;
                    if !literal.is_empty() {
                        pieces.push(Piece::Text(std::mem::take(&mut literal)));
                    }
                    pieces.push(Piece::Response(header));
                    continue;
                }
                let var = VARS
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| *v)
                    .ok_or_else(|| {
                        let known: Vec<_> = VARS.iter().map(|(n, _)| *n).collect();
                        format!("{text:?}: no value `{name}` (known: {})", known.join(", "))
                    })?;
                Piece::Var(var)
            } else if let Some(d) = rest.chars().next().filter(|c| c.is_ascii_digit()) {
                rest = &rest[1..];
                let n = d as usize - '0' as usize;
                if n == 0 || n > groups {
                    return Err(format!(
                        "{text:?}: `${n}` but the regular expression has {groups} group(s)"
                    ));
                }
                Piece::Group(n)
            } else if let Some(after) = rest.strip_prefix('$') {
                rest = after;
                literal.push('$');
                continue;
            } else {
                return Err(format!(
                    "{text:?}: `$` starts `$1`…`$9` or `${{name}}` (`$$` for a `$`)"
                ));
            };
            if !literal.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut literal)));
            }
            pieces.push(piece);
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            pieces.push(Piece::Text(literal));
        }
        Ok(Self(pieces))
    }

    /// The literal text, all of it, when there is no value to put in.
    pub fn literal(&self) -> Option<&str> {
        match self.0.as_slice() {
            [] => Some(""),
            [Piece::Text(t)] => Some(t),
            _ => None,
        }
    }

    /// Every literal piece, for checks of what the template can produce.
    pub fn texts(&self) -> impl Iterator<Item = &str> {
        self.0.iter().filter_map(|p| match p {
            Piece::Text(t) => Some(t.as_str()),
            _ => None,
        })
    }

    /// Whether it reads the response (`${resp.NAME}`): only a response phase's rules have one.
    pub fn reads_response(&self) -> bool {
        self.0.iter().any(|p| matches!(p, Piece::Response(_)))
    }

    /// Whether it reads how the cache answered (`${outcome}`): only the deliver phase knows.
    pub fn reads_outcome(&self) -> bool {
        self.0.iter().any(|p| matches!(p, Piece::Var(Var::Outcome)))
    }

    /// Whether it starts with literal text that starts with `prefix`.
    pub fn starts_with(&self, prefix: &str) -> bool {
        matches!(self.0.first(), Some(Piece::Text(t)) if t.starts_with(prefix))
    }

    pub fn render(&self, v: &Values<'_>) -> String {
        if let Some(t) = self.literal() {
            return t.to_owned();
        }
        let mut out = String::new();
        for piece in &self.0 {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Group(n) => out.push_str(v.groups.get(*n - 1).map_or("", String::as_str)),
                Piece::Response(name) => {
                    // Every value, joined as one field; a value that is not text is left out.
                    let values = v.response.into_iter().flat_map(|h| h.get_all(name));
                    for (i, value) in values.filter_map(|v| v.to_str().ok()).enumerate() {
                        if i > 0 {
                            out.push_str(", ");
                        }
                        out.push_str(value);
                    }
                }
                Piece::Var(var) => match var {
                    Var::Host => {
                        out.push_str(&lacquer_policy::host::request_host(&v.parts.headers))
                    }
                    Var::Path => out.push_str(v.parts.uri.path()),
                    Var::Query => out.push_str(v.parts.uri.query().unwrap_or("")),
                    Var::Target => {
                        out.push_str(v.parts.uri.path_and_query().map_or("/", |p| p.as_str()))
                    }
                    Var::Scheme => out.push_str(if v.secure { "https" } else { "http" }),
                    Var::ClientIp => {
                        let _ = write!(out, "{}", v.client);
                    }
                    Var::Method => out.push_str(v.parts.method.as_str()),
                    Var::Status => {
                        if let Some(s) = v.status {
                            let _ = write!(out, "{s}");
                        }
                    }
                    Var::Outcome => out.push_str(v.outcome.unwrap_or("")),
                },
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str, host: &str) -> Parts {
        http::Request::builder()
            .uri(uri)
            .header("host", host)
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    #[test]
    fn templates_put_in_the_requests_values() {
        let p = parts("/a/b?x=1", "Example.com:8080");
        let groups = vec!["b".to_owned()];
        let mut response = http::HeaderMap::new();
        response.insert("cache-control", "public, max-age=60".parse().unwrap());
        response.append("x-tags", "a".parse().unwrap());
        response.append("x-tags", "b".parse().unwrap());
        let v = Values {
            parts: &p,
            client: "192.0.2.7".parse().unwrap(),
            secure: true,
            status: Some(404),
            groups: &groups,
            response: Some(&response),
            outcome: Some("hit"),
        };
        for (text, want) in [
            ("plain", "plain"),
            ("", ""),
            ("https://new.example.com/$1", "https://new.example.com/b"),
            (
                "${scheme}://${host}${target}",
                "https://example.com/a/b?x=1",
            ),
            ("${path}|${query}|${method}", "/a/b|x=1|GET"),
            ("${client_ip} ${status} $$5", "192.0.2.7 404 $5"),
            ("cc=${resp.Cache-Control}", "cc=public, max-age=60"),
            ("${resp.x-tags}|${resp.absent}|", "a, b||"),
            (
                "X-Magento-Cache-Debug: ${outcome}",
                "X-Magento-Cache-Debug: hit",
            ),
        ] {
            assert_eq!(Template::parse(text, 1).unwrap().render(&v), want, "{text}");
        }
    }

    #[test]
    fn a_template_naming_what_does_not_exist_is_refused() {
        for (text, groups) in [
            ("$1", 0),
            ("$2", 1),
            ("$0", 3),
            ("${nope}", 0),
            ("${host", 0),
            ("cost $", 0),
            ("$x", 0),
            ("${resp.not a name}", 0),
        ] {
            assert!(Template::parse(text, groups).is_err(), "{text}");
        }
    }
}
