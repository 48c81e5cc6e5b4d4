//! A `[[rule]]` as plain data made into what runs: patterns parsed, regular expressions built, templates
//! parsed, files read, and every action checked against the phase it is written for.

use std::{path::Path, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{header::HeaderName, HeaderValue, Method, StatusCode};
use regex::{Regex, RegexBuilder};

use lacquer_config::{Phase, Respond, Rule, StatusPattern};
use lacquer_policy::{host::HostPattern, storable::Adjust};

use crate::{
    edit::{Cookies, NamePattern, Query},
    template::Template,
};

/// Largest compiled regular expression: a pattern past it is refused rather than slow to build or run.
/// (The `regex` crate runs in time linear in the input whatever the pattern.)
const REGEX_SIZE_LIMIT: usize = 256 * 1024;
/// Largest synthetic body written in the file.
pub const MAX_BODY: usize = 64 * 1024;
/// Largest body read from a file.
pub const MAX_FILE: u64 = 1024 * 1024;

/// The conditions of a compiled rule.
#[derive(Debug, Default)]
pub(crate) struct Conditions {
    pub hosts: Vec<HostPattern>,
    pub path_prefix: Vec<String>,
    pub path_regex: Option<Regex>,
    pub extensions: Vec<String>,
    pub methods: Vec<Method>,
    pub headers: Vec<(HeaderName, Option<Regex>)>,
    pub without_headers: Vec<HeaderName>,
    pub cookies: Vec<NamePattern>,
    pub without_cookies: Vec<NamePattern>,
    pub query: Vec<String>,
    pub clients: Vec<ipnet::IpNet>,
    pub except_clients: Vec<ipnet::IpNet>,
    pub backend_healthy: Option<bool>,
    pub status: Vec<(u16, u16)>,
    pub content_types: Vec<(String, Option<String>)>,
    pub response_headers: Vec<(HeaderName, Option<Regex>)>,
    /// Headers the request and the response must carry alike (`true`) or not (`false`).
    pub alike: Vec<(HeaderName, bool)>,
    pub outcomes: Vec<crate::Outcome>,
    pub larger_than: Option<u64>,
}

/// A response a rule makes.
#[derive(Debug)]
pub(crate) struct Synthesis {
    pub status: Option<StatusCode>,
    pub location: Option<Template>,
    pub body: Body,
    pub content_type: HeaderValue,
    pub headers: Vec<(HeaderName, Template)>,
}

#[derive(Debug)]
pub(crate) enum Body {
    Template(Template),
    File(Bytes),
}

/// A header a rule writes: its value made once when it holds nothing of the request, rendered per
/// request otherwise.
#[derive(Debug)]
pub(crate) struct Line {
    pub name: HeaderName,
    template: Template,
    literal: Option<HeaderValue>,
}

impl Line {
    fn new(name: HeaderName, template: Template) -> Self {
        let literal = template
            .literal()
            .filter(|t| !t.is_empty())
            .and_then(|t| HeaderValue::from_str(t).ok());
        Self {
            name,
            template,
            literal,
        }
    }

    /// Whether its value says how the cache answered (`${outcome}`).
    pub fn reads_outcome(&self) -> bool {
        self.template.reads_outcome()
    }

    /// The value for this request; `None` removes the field (an empty value, or one that a request's
    /// value made invalid).
    pub fn value(&self, values: &crate::template::Values<'_>) -> Option<HeaderValue> {
        if let Some(v) = &self.literal {
            return Some(v.clone());
        }
        let text = self.template.render(values);
        (!text.is_empty())
            .then(|| HeaderValue::from_str(&text).ok())
            .flatten()
    }

    /// Whether the value is the same for every request and response (nothing rendered).
    pub fn is_literal(&self) -> bool {
        self.template.literal().is_some()
    }

    /// Whether the value may be written as `Host`: the key's first `/` must end the host.
    pub fn is_host(&self) -> bool {
        self.name == http::header::HOST
    }
}

/// A header a rule removes: by name (parsed once), or every name with a prefix.
#[derive(Debug)]
pub(crate) enum Unset {
    Name(HeaderName),
    Prefix(NamePattern),
}

impl Unset {
    pub fn matches(&self, name: &str) -> bool {
        match self {
            Self::Name(n) => n == name,
            Self::Prefix(p) => p.matches(name),
        }
    }
}

/// A request header mapped to classes.
#[derive(Debug)]
pub(crate) struct Bucket {
    pub from: HeaderName,
    pub to: HeaderName,
    pub cases: Vec<(HeaderValue, Regex)>,
    pub default: HeaderValue,
}

/// The actions of a compiled rule; what a phase does not take was refused when compiling.
#[derive(Debug, Default)]
pub(crate) struct Actions {
    pub normalize_host: bool,
    pub unset: Vec<Unset>,
    pub set: Vec<Line>,
    pub append: Vec<Line>,
    pub query: Option<Query>,
    pub rewrite_path: Option<(Regex, Template)>,
    pub cookies: Option<Cookies>,
    pub strip_cookies: bool,
    pub cache_cookies: bool,
    pub key: Vec<HeaderName>,
    pub key_cookies: Vec<Arc<str>>,
    pub buckets: Vec<Bucket>,
    pub pass: bool,
    pub pipe: bool,
    pub backend: Option<Arc<str>>,
    pub respond: Option<Synthesis>,
    pub invalidate: Option<Arc<crate::Invalidation>>,
    pub request_grace: Option<Duration>,
    pub early_hints: Vec<HeaderValue>,
    pub cache_body: Option<u64>,
    pub adjust: Adjust,
    pub debug_headers: bool,
    pub signed: Option<SignedAction>,
}

/// A rule's `signed`: the check, and the answer to a link that fails it.
#[derive(Debug)]
pub(crate) struct SignedAction {
    pub signing: crate::signed::Signing,
    pub refuse: Option<Synthesis>,
}

/// Fields the data path writes into every response after a hit's head is prepared: a rule that touches
/// one cannot be applied to the prepared head ahead of the response.
const PER_RESPONSE: [&str; 3] = ["age", "cache-status", "x-cache"];

impl Compiled {
    /// Whether this deliver rule does the same to every plain hit of one stored response, whatever the
    /// request: it tests nothing but the response's status and type, writes only literal
    /// values, makes no response and shows no debug numbers, and leaves alone the fields that change from
    /// one response to the next. Such a rule can edit a prepared head once instead of every response.
    pub fn response_only(&self) -> bool {
        let w = &self.when;
        let a = &self.actions;
        let request_blind = w.hosts.is_empty()
            && w.path_prefix.is_empty()
            && w.path_regex.is_none()
            && w.extensions.is_empty()
            && w.methods.is_empty()
            && w.headers.is_empty()
            && w.without_headers.is_empty()
            && w.cookies.is_empty()
            && w.without_cookies.is_empty()
            && w.alike.is_empty()
            && w.query.is_empty()
            && w.clients.is_empty()
            && w.except_clients.is_empty()
            && w.backend_healthy.is_none();
        let touches_per_response = PER_RESPONSE.iter().any(|name| {
            a.unset.iter().any(|u| u.matches(name))
                || a.set.iter().chain(&a.append).any(|l| l.name == *name)
        });
        self.phase == Phase::Deliver
            && request_blind
            && w.response_headers.is_empty()
            && w.outcomes.is_empty()
            && a.respond.is_none()
            && !a.debug_headers
            && a.set.iter().chain(&a.append).all(Line::is_literal)
            && !touches_per_response
    }
}

/// One compiled rule.
#[derive(Debug)]
pub(crate) struct Compiled {
    pub name: Arc<str>,
    pub phase: Phase,
    pub when: Conditions,
    pub stop: bool,
    pub actions: Actions,
    /// How many groups `match.path_regex` has, for templates.
    pub groups: usize,
}

impl Compiled {
    /// Whether it asks how the cache answered (`match.outcome`, `${outcome}` in a header it writes or a
    /// response it makes): the deliver phase then finds out before it runs.
    pub fn reads_outcome(&self) -> bool {
        let a = &self.actions;
        !self.when.outcomes.is_empty()
            || a.set.iter().chain(&a.append).any(Line::reads_outcome)
            || a.respond.as_ref().is_some_and(Synthesis::reads_outcome)
    }
}

impl Synthesis {
    fn reads_outcome(&self) -> bool {
        self.location.as_ref().is_some_and(Template::reads_outcome)
            || matches!(&self.body, Body::Template(t) if t.reads_outcome())
            || self.headers.iter().any(|(_, t)| t.reads_outcome())
    }
}

/// Makes a reason into the error of `field`.
fn at(field: &str) -> impl Fn(String) -> (String, String) + '_ {
    move |reason| (field.to_owned(), reason)
}

fn regex(pattern: &str) -> Result<Regex, String> {
    RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| match e {
            regex::Error::CompiledTooBig(_) => format!(
                "{pattern:?} is too large once compiled (over {} KiB): simplify it",
                REGEX_SIZE_LIMIT / 1024
            ),
            e => e.to_string(),
        })
}

fn header_name(name: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| format!("{name:?} is not a header name"))
}

/// A literal header value: no CR, LF or other control character can get into a response or request.
fn header_value(value: &str) -> Result<HeaderValue, String> {
    HeaderValue::from_str(value)
        .map_err(|_| format!("{value:?} is not a valid header value (control characters?)"))
}

/// A header template whose literal text can be part of a header value.
fn header_template(value: &str, groups: usize) -> Result<Template, String> {
    let t = Template::parse(value, groups)?;
    for text in t.texts() {
        header_value(text)?;
    }
    Ok(t)
}

/// Headers rules may not write: they frame the message, and the data path keeps them right itself.
const FRAMING: [&str; 5] = [
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
];

/// Checks a rule in `phase` may use an action or condition, by the field's name.
fn allowed(phase: Phase, field: &str, phases: &[Phase]) -> Result<(), (String, String)> {
    if phases.contains(&phase) {
        return Ok(());
    }
    let names: Vec<_> = phases.iter().map(|p| p.name()).collect();
    Err((
        field.to_owned(),
        format!(
            "not in the {} phase (only in {})",
            phase.name(),
            names.join(", ")
        ),
    ))
}

use Phase::{BackendRequest, BackendResponse, Deliver, Error, Request};

/// The body of a page read from `path` (a rule's `respond.file`, an `error_pages` entry): read once, when
/// the configuration is compiled, so a missing or oversized file stops a start or reload instead of a
/// request. The error names the path and why, for the caller to put after the setting.
pub fn read_page(path: &Path) -> Result<Bytes, String> {
    let len = std::fs::metadata(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .len();
    if len > MAX_FILE {
        return Err(format!(
            "{}: {len} bytes, more than {} MiB",
            path.display(),
            MAX_FILE / (1024 * 1024)
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(bytes.into())
}

/// The `Content-Type` a page read from `path` is sent with when none is given: HTML for `.html` and
/// `.htm`, JSON for `.json`, else plain text.
pub fn page_type(path: &Path) -> HeaderValue {
    match path.extension().and_then(|e| e.to_str()) {
        Some("html" | "htm") => HeaderValue::from_static("text/html; charset=utf-8"),
        Some("json") => HeaderValue::from_static("application/json"),
        _ => HeaderValue::from_static("text/plain; charset=utf-8"),
    }
}

/// Compiles `rule`; the error is the field (as the file names it, `match.path_regex`) and why.
pub(crate) fn compile(
    rule: &Rule,
    name: Arc<str>,
    backends: &[&str],
) -> Result<Compiled, (String, String)> {
    let phase = rule.on;
    let m = &rule.when;
    let mut when = Conditions::default();

    for h in &m.hosts {
        when.hosts
            .push(HostPattern::parse(h).map_err(at("match.hosts"))?);
    }
    for p in &m.path_prefix {
        if !p.starts_with('/') {
            return Err(at("match.path_prefix")(format!(
                "{p:?} never matches: paths start with `/`"
            )));
        }
        when.path_prefix.push(p.clone());
    }
    if let Some(r) = &m.path_regex {
        when.path_regex = Some(regex(r).map_err(at("match.path_regex"))?);
    }
    for e in &m.extensions {
        let e = e.trim_start_matches('.').to_ascii_lowercase();
        if e.is_empty() || e.contains('/') {
            return Err(at("match.extensions")(format!("{e:?} is not an extension")));
        }
        when.extensions.push(e);
    }
    for method in &m.methods {
        when.methods.push(
            Method::from_bytes(method.to_ascii_uppercase().as_bytes())
                .map_err(|_| at("match.methods")(format!("{method:?} is not a method")))?,
        );
    }
    for (name, pattern) in &m.headers {
        let n = header_name(name).map_err(at("match.headers"))?;
        let r = match pattern.as_str() {
            "" => None,
            p => Some(regex(p).map_err(at(&format!("match.headers.{name}")))?),
        };
        when.headers.push((n, r));
    }
    for name in &m.without_headers {
        let n = header_name(name).map_err(at("match.without_headers"))?;
        if when.headers.iter().any(|(h, _)| *h == n) {
            return Err(at("match.without_headers")(format!(
                "{name:?} is also in match.headers: the rule can never match"
            )));
        }
        when.without_headers.push(n);
    }
    for c in &m.cookies {
        when.cookies
            .push(NamePattern::parse(c).map_err(at("match.cookies"))?);
    }
    for c in &m.without_cookies {
        when.without_cookies
            .push(NamePattern::parse(c).map_err(at("match.without_cookies"))?);
    }
    when.query.clone_from(&m.query);
    when.clients.clone_from(&m.clients);
    when.except_clients.clone_from(&m.except_clients);
    if let Some(net) = m
        .clients
        .iter()
        .find(|c| m.except_clients.iter().any(|e| e.contains(*c)))
    {
        if m.clients
            .iter()
            .all(|c| m.except_clients.iter().any(|e| e.contains(c)))
        {
            return Err(at("match.except_clients")(format!(
                "covers every network of match.clients ({net} among them): the rule can never match"
            )));
        }
    }
    when.backend_healthy = m.backend_healthy;
    if !m.status.is_empty() {
        allowed(phase, "match.status", &[BackendResponse, Deliver, Error])?;
    }
    for s in &m.status {
        when.status
            .push(status_range(s).map_err(at("match.status"))?);
    }
    if !m.content_types.is_empty() {
        allowed(phase, "match.content_types", &[BackendResponse, Deliver])?;
    }
    for t in &m.content_types {
        let t = t.trim().to_ascii_lowercase();
        let (kind, sub) = t
            .split_once('/')
            .ok_or_else(|| at("match.content_types")(format!("{t:?} is not type/subtype")))?;
        let sub = (sub != "*").then(|| sub.to_owned());
        when.content_types.push((kind.to_owned(), sub));
    }
    if !m.response_headers.is_empty() {
        allowed(phase, "match.response_headers", &[BackendResponse, Deliver])?;
    }
    if !m.outcome.is_empty() {
        allowed(phase, "match.outcome", &[Deliver])?;
    }
    for name in &m.outcome {
        let outcome = crate::Outcome::ALL
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, o)| *o)
            .ok_or_else(|| {
                at("match.outcome")(format!(
                    "{name:?} is not an outcome (hit, stale, miss, uncacheable, pass)"
                ))
            })?;
        when.outcomes.push(outcome);
    }
    for (field, names, want) in [
        ("match.same_headers", &m.same_headers, true),
        ("match.different_headers", &m.different_headers, false),
    ] {
        if !names.is_empty() {
            allowed(phase, field, &[BackendResponse, Deliver])?;
        }
        for name in names {
            let n = header_name(name).map_err(at(field))?;
            if when.alike.iter().any(|(h, _)| *h == n) {
                return Err(at(field)(format!(
                    "{name:?} is in match.same_headers and match.different_headers: the rule can never match"
                )));
            }
            when.alike.push((n, want));
        }
    }
    for (name, pattern) in &m.response_headers {
        let n = header_name(name).map_err(at("match.response_headers"))?;
        let r = match pattern.as_str() {
            "" => None,
            p => Some(regex(p).map_err(at(&format!("match.response_headers.{name}")))?),
        };
        when.response_headers.push((n, r));
    }
    if let Some(size) = m.larger_than {
        allowed(phase, "match.larger_than", &[BackendResponse])?;
        when.larger_than = Some(size.as_u64());
    }

    let groups = when.path_regex.as_ref().map_or(0, |r| r.captures_len() - 1);
    let mut actions = Actions::default();
    let request_only = [Request];
    let edits_headers = [Request, BackendRequest, BackendResponse, Deliver, Error];
    if rule.normalize_host {
        allowed(phase, "normalize_host", &request_only)?;
        actions.normalize_host = true;
    }
    if !rule.unset_headers.is_empty() {
        allowed(phase, "unset_headers", &edits_headers)?;
    }
    for n in &rule.unset_headers {
        let p = NamePattern::parse(&n.to_ascii_lowercase()).map_err(at("unset_headers"))?;
        actions.unset.push(match p {
            NamePattern::Exact(name) => {
                Unset::Name(header_name(&name).map_err(at("unset_headers"))?)
            }
            prefix => Unset::Prefix(prefix),
        });
    }
    for (field, edits, into) in [
        ("set_headers", &rule.set_headers, &mut actions.set),
        ("append_headers", &rule.append_headers, &mut actions.append),
    ] {
        if !edits.is_empty() {
            allowed(phase, field, &edits_headers)?;
        }
        for (name, value) in edits {
            let n = header_name(name).map_err(at(field))?;
            if FRAMING.contains(&n.as_str()) {
                return Err(at(field)(format!(
                    "{name} frames the message: lacquerd keeps it right itself"
                )));
            }
            if n == http::header::HOST && phase != Request {
                return Err(at(field)(
                    "Host is set in the request phase, where the key is made from it".into(),
                ));
            }
            if actions.unset.iter().any(|u| u.matches(n.as_str())) {
                return Err(at(field)(format!(
                    "{name} is also in unset_headers: contradictory"
                )));
            }
            let t = header_template(value, groups).map_err(at(&format!("{field}.{name}")))?;
            if t.reads_outcome() && phase != Deliver {
                return Err(at(&format!("{field}.{name}"))(format!(
                    "reads the outcome (`${{outcome}}`): not in the {} phase (only in deliver)",
                    phase.name()
                )));
            }
            if t.reads_response() && !matches!(phase, BackendResponse | Deliver) {
                return Err(at(&format!("{field}.{name}"))(format!(
                    "reads the response (`${{resp.…}}`): not in the {} phase (only in backend_response, deliver)",
                    phase.name()
                )));
            }
            into.push(Line::new(n, t));
        }
    }
    if let Some(q) = &rule.query {
        allowed(phase, "query", &request_only)?;
        let names = |list: &[String], field: &str| {
            list.iter()
                .map(|n| NamePattern::parse(n).map_err(at(field)))
                .collect::<Result<Vec<_>, _>>()
        };
        if q.sort_values && !q.sort {
            return Err(at("query.sort_values")(
                "sorts within a sort by name: give sort = true too".into(),
            ));
        }
        let query = Query {
            sort: q.sort,
            sort_values: q.sort_values,
            drop: names(&q.drop, "query.drop")?,
            keep: names(&q.keep, "query.keep")?,
            remove: q.remove,
        };
        if query == Query::default() {
            return Err(at("query")(
                "changes nothing: give sort, drop, keep or remove".into(),
            ));
        }
        actions.query = Some(query);
    }
    if let Some(r) = &rule.rewrite_path {
        allowed(phase, "rewrite_path", &request_only)?;
        let from = regex(&r.from).map_err(at("rewrite_path.from"))?;
        let to = Template::parse(&r.to, from.captures_len() - 1).map_err(at("rewrite_path.to"))?;
        if to.reads_response() || to.reads_outcome() {
            return Err(at("rewrite_path.to")(
                "reads the response (`${resp.…}`): there is none in the request phase".into(),
            ));
        }
        let invalid = to.texts().find_map(|t| {
            t.bytes()
                .find(|b| !is_target_byte(*b))
                .map(|b| format!("{:?} cannot be in a request target", b as char))
        });
        if let Some(reason) = invalid {
            return Err(at("rewrite_path.to")(reason));
        }
        if !to.starts_with("/") {
            return Err(at("rewrite_path.to")(format!(
                "{:?} must start with `/`: the result is the request's path",
                r.to
            )));
        }
        actions.rewrite_path = Some((from, to));
    }
    if let Some(c) = &rule.cookies {
        allowed(phase, "cookies", &request_only)?;
        let names = |list: &[String], field: &str| {
            list.iter()
                .map(|n| NamePattern::parse(n).map_err(at(field)))
                .collect::<Result<Vec<_>, _>>()
        };
        actions.cookies = Some(Cookies {
            keep: names(&c.keep, "cookies.keep")?,
            drop: names(&c.drop, "cookies.drop")?,
        });
    }
    if rule.strip_cookies {
        allowed(phase, "strip_cookies", &request_only)?;
        if rule.cookies.is_some() || rule.cache_cookies {
            return Err((
                "strip_cookies".into(),
                "removes every cookie: cookies and cache_cookies would do nothing".into(),
            ));
        }
        actions.strip_cookies = true;
    }
    if rule.cache_cookies {
        allowed(phase, "cache_cookies", &request_only)?;
        actions.cache_cookies = true;
    }
    if !rule.key.is_empty() {
        allowed(phase, "key", &request_only)?;
    }
    for k in &rule.key {
        let n = header_name(&k.to_ascii_lowercase()).map_err(at("key"))?;
        actions.key.push(n);
    }
    if !rule.key_cookie_values.is_empty() || rule.forward_all_cookies {
        allowed(phase, "key_cookie_values", &request_only)?;
        if rule.key_cookie_values.is_empty() {
            return Err(at("forward_all_cookies")(
                "says what key_cookie_values promises; give key_cookie_values too".into(),
            ));
        }
        if !rule.forward_all_cookies {
            return Err(at("key_cookie_values")(
                "forwards every cookie: say so with forward_all_cookies = true (the origin's answer \
                 depends on these cookies' values only), or keep only these with cookies.keep and \
                 key = [\"cookie\"]"
                    .into(),
            ));
        }
        for (what, given) in [
            ("cookies", rule.cookies.is_some()),
            ("strip_cookies", rule.strip_cookies),
        ] {
            if given {
                return Err(at("forward_all_cookies")(format!(
                    "and {what}: every cookie is forwarded, or not; pick one"
                )));
            }
        }
        for name in &rule.key_cookie_values {
            let token = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b));
            if !token {
                return Err(at("key_cookie_values")(format!(
                    "{name:?} is not a cookie name"
                )));
            }
            actions.key_cookies.push(name.as_str().into());
        }
    }
    if !rule.buckets.is_empty() {
        allowed(phase, "buckets", &request_only)?;
    }
    for (i, b) in rule.buckets.iter().enumerate() {
        let field = format!("buckets[{i}]");
        let from = header_name(&b.from).map_err(at(&format!("{field}.from")))?;
        let to = match &b.to {
            Some(t) => header_name(t).map_err(at(&format!("{field}.to")))?,
            None => from.clone(),
        };
        let mut cases = Vec::new();
        for (value, pattern) in &b.cases {
            let v = header_value(value).map_err(at(&format!("{field}.cases")))?;
            let r = regex(pattern).map_err(at(&format!("{field}.cases")))?;
            cases.push((v, r));
        }
        if cases.is_empty() {
            return Err(at(&format!("{field}.cases"))(
                "no case: every request would get the default; use set_headers".into(),
            ));
        }
        let default = header_value(&b.default).map_err(at(&format!("{field}.default")))?;
        actions.buckets.push(Bucket {
            from,
            to,
            cases,
            default,
        });
    }
    if rule.pass {
        allowed(phase, "pass", &request_only)?;
        actions.pass = true;
    }
    if rule.pipe {
        allowed(phase, "pipe", &request_only)?;
        if rule.pass {
            return Err((
                "pipe".into(),
                "and pass: a tunnel is never cached anyway; pick one".into(),
            ));
        }
        actions.pipe = true;
    }
    if let Some(b) = &rule.backend {
        allowed(phase, "backend", &request_only)?;
        if !backends.contains(&b.as_str()) {
            return Err((
                "backend".into(),
                format!("no backend or director is named {b:?}"),
            ));
        }
        actions.backend = Some(b.as_str().into());
    }
    if let Some(r) = &rule.respond {
        allowed(phase, "respond", &[Request, Deliver, Error])?;
        let contradicts = [
            ("pass", rule.pass),
            ("pipe", rule.pipe),
            ("backend", rule.backend.is_some()),
            ("cache_cookies", rule.cache_cookies),
            ("key", !rule.key.is_empty()),
            ("key_cookie_values", !rule.key_cookie_values.is_empty()),
        ];
        if let Some((what, _)) = contradicts.iter().find(|(_, given)| *given) {
            return Err((
                "respond".into(),
                format!("and {what}: a request answered here is not forwarded"),
            ));
        }
        actions.respond = Some(synthesis(r, phase, groups)?);
    }
    if !rule.ban.is_empty() || rule.purge.is_some() {
        let field = if rule.ban.is_empty() { "purge" } else { "ban" };
        allowed(phase, field, &request_only)?;
        let contradicts = [
            ("pass", rule.pass),
            ("pipe", rule.pipe),
            ("backend", rule.backend.is_some()),
            ("respond", rule.respond.is_some()),
            ("cache_cookies", rule.cache_cookies),
            ("cache_body", rule.cache_body.is_some()),
            ("key", !rule.key.is_empty()),
            ("key_cookie_values", !rule.key_cookie_values.is_empty()),
        ];
        if let Some((what, _)) = contradicts.iter().find(|(_, given)| *given) {
            return Err((
                field.into(),
                format!("and {what}: a request turned into an invalidation is answered here"),
            ));
        }
        let mut bans = Vec::new();
        for (i, b) in rule.ban.iter().enumerate() {
            let (from_field, header_field) = (
                format!("ban[{i}].regex_from"),
                format!("ban[{i}].object_header"),
            );
            let regex_from = match b.regex_from.as_str() {
                "path" => crate::RegexFrom::Path,
                name => crate::RegexFrom::Header(header_name(name).map_err(at(&from_field))?),
            };
            let object_header = match (&b.object_header, b.url) {
                (Some(name), false) => Some(header_name(name).map_err(at(&header_field))?),
                (None, true) => None,
                (Some(_), true) => {
                    return Err((
                        format!("ban[{i}]"),
                        "object_header and url: a ban matches one field; pick one".into(),
                    ))
                }
                (None, false) => {
                    return Err((
                        format!("ban[{i}]"),
                        "matches nothing: give object_header, or url = true".into(),
                    ))
                }
            };
            bans.push(crate::BanTemplate {
                object_header,
                regex_from,
            });
        }
        actions.invalidate = Some(Arc::new(crate::Invalidation {
            bans,
            purge: rule.purge,
        }));
    }
    if let Some(cap) = rule.cache_body {
        allowed(phase, "cache_body", &request_only)?;
        if when.methods != [Method::POST] {
            return Err((
                "cache_body".into(),
                "needs match.methods = [\"POST\"]: only POST bodies are keyed".into(),
            ));
        }
        if rule.pass || rule.pipe || cap.as_u64() == 0 || cap.as_u64() > MAX_FILE {
            return Err((
                "cache_body".into(),
                format!(
                    "must be between 1 byte and {} MiB, without pass or pipe",
                    MAX_FILE / (1024 * 1024)
                ),
            ));
        }
        actions.cache_body = Some(cap.as_u64());
    }
    if let Some(g) = rule.request_grace {
        allowed(phase, "request_grace", &request_only)?;
        actions.request_grace = Some(g);
    }
    if !rule.early_hints.is_empty() {
        allowed(phase, "early_hints", &request_only)?;
        actions.early_hints = early_hints(&rule.early_hints)?;
    }
    if let Some(s) = &rule.signed {
        allowed(phase, "signed", &request_only)?;
        let nginx = match s.algorithm.as_str() {
            "hmac-sha256" => false,
            "nginx-md5" => true,
            other => {
                return Err((
                    "signed.algorithm".into(),
                    format!("{other:?}: \"hmac-sha256\" or \"nginx-md5\""),
                ))
            }
        };
        if !nginx && s.expression.is_some() {
            return Err((
                "signed.expression".into(),
                "is for algorithm = \"nginx-md5\" only".into(),
            ));
        }
        if s.param.is_empty() || s.expires.is_empty() || s.param == s.expires {
            return Err((
                "signed".into(),
                "param and expires must be two different parameter names".into(),
            ));
        }
        let secret = std::fs::read(&s.secret_file).map_err(|e| {
            (
                "signed.secret_file".into(),
                format!("{}: {e}", s.secret_file.display()),
            )
        })?;
        let secret = secret.strip_suffix(b"\n").unwrap_or(&secret);
        let secret = secret.strip_suffix(b"\r").unwrap_or(secret);
        if secret.len() < crate::signed::MIN_SECRET {
            return Err((
                "signed.secret_file".into(),
                format!(
                    "{}: a secret of at least {} bytes",
                    s.secret_file.display(),
                    crate::signed::MIN_SECRET
                ),
            ));
        }
        let refuse = s
            .refuse
            .as_ref()
            .map(|r| synthesis(r, phase, groups))
            .transpose()
            .map_err(|(field, reason)| (format!("signed.refuse.{field}"), reason))?;
        let signing = if nginx {
            let expression = s
                .expression
                .as_deref()
                .unwrap_or(crate::signed::NGINX_EXPRESSION);
            crate::signed::Signing::nginx_md5(secret, expression, &s.param, &s.expires)
                .map_err(|why| ("signed.expression".to_owned(), why))?
        } else {
            crate::signed::Signing::new(secret, &s.param, &s.expires)
        };
        actions.signed = Some(SignedAction { signing, refuse });
    }
    let adjust = Adjust {
        ttl: rule.ttl,
        default_ttl: rule.default_ttl,
        ttl_min: rule.ttl_min,
        ttl_max: rule.ttl_max,
        grace: rule.grace,
        keep: rule.keep,
        store: rule.store,
        compress: rule.compress,
        esi: rule.esi,
    };
    for (field, given) in [
        ("ttl", adjust.ttl.is_some()),
        ("default_ttl", adjust.default_ttl.is_some()),
        ("ttl_min", adjust.ttl_min.is_some()),
        ("ttl_max", adjust.ttl_max.is_some()),
        ("grace", adjust.grace.is_some()),
        ("keep", adjust.keep.is_some()),
        ("store", adjust.store.is_some()),
        ("compress", adjust.compress.is_some()),
        ("esi", adjust.esi.is_some()),
    ] {
        if given {
            allowed(phase, field, &[BackendResponse])?;
            // A page not stored is still assembled: only what shapes the stored copy needs one.
            if adjust.store == Some(false) && !matches!(field, "store" | "esi") {
                return Err((
                    field.into(),
                    "and store = false: nothing is stored to give it to".into(),
                ));
            }
        }
    }
    if let (Some(min), Some(max)) = (adjust.ttl_min, adjust.ttl_max) {
        if min > max {
            return Err((
                "ttl_min".into(),
                format!("{min:?} is more than ttl_max {max:?}"),
            ));
        }
    }
    actions.adjust = adjust;
    if rule.debug_headers {
        allowed(phase, "debug_headers", &[Deliver])?;
        actions.debug_headers = true;
    }
    let does_something = actions.normalize_host
        || !actions.unset.is_empty()
        || !actions.set.is_empty()
        || !actions.append.is_empty()
        || actions.query.is_some()
        || actions.rewrite_path.is_some()
        || actions.cookies.is_some()
        || actions.strip_cookies
        || actions.cache_cookies
        || !actions.key.is_empty()
        || !actions.key_cookies.is_empty()
        || !actions.buckets.is_empty()
        || actions.pass
        || actions.pipe
        || actions.backend.is_some()
        || actions.respond.is_some()
        || actions.invalidate.is_some()
        || actions.request_grace.is_some()
        || !actions.early_hints.is_empty()
        || actions.cache_body.is_some()
        || actions.adjust != Adjust::default()
        || actions.debug_headers
        || actions.signed.is_some()
        || rule.stop;
    if !does_something {
        return Err(("".into(), "has no action".into()));
    }
    Ok(Compiled {
        name,
        phase,
        when,
        stop: rule.stop,
        actions,
        groups,
    })
}

/// Bytes a rewritten path may hold (RFC 3986 `pchar`, `/` and `?` for a query).
fn is_target_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/?%".contains(&b)
}

fn status_range(s: &StatusPattern) -> Result<(u16, u16), String> {
    let (lo, hi) = match s {
        StatusPattern::Code(c) => (*c, *c),
        StatusPattern::Text(t) => {
            let t = t.trim().to_ascii_lowercase();
            match t.as_bytes() {
                [d @ b'1'..=b'5', b'x', b'x'] => {
                    let base = u16::from(d - b'0') * 100;
                    (base, base + 99)
                }
                _ => {
                    let c = t.parse::<u16>().map_err(|_| {
                        format!("{t:?} is not a status (`404`) or class (`\"5xx\"`)")
                    })?;
                    (c, c)
                }
            }
        }
    };
    if !(100..=599).contains(&lo) {
        return Err(format!(
            "{lo} is not a status code: the rule can never match"
        ));
    }
    Ok((lo, hi))
}

/// Hints a 103 may carry: a handful, each a `Link` value naming a target between angle brackets
/// (RFC 8288), within a field's bytes.
const MAX_EARLY_HINTS: usize = 16;

/// A rule's `early_hints`, each a `Link` field value.
fn early_hints(hints: &[String]) -> Result<Vec<HeaderValue>, (String, String)> {
    if hints.len() > MAX_EARLY_HINTS {
        return Err((
            "early_hints".into(),
            format!("at most {MAX_EARLY_HINTS} hints"),
        ));
    }
    hints
        .iter()
        .enumerate()
        .map(|(i, hint)| {
            let bad = |why: &str| (format!("early_hints[{i}]"), format!("{hint:?}: {why}"));
            let target = hint.trim_start().strip_prefix('<').and_then(|rest| rest.split_once('>'));
            if target.is_none_or(|(uri, _)| uri.is_empty()) {
                return Err(bad("a Link value starts with its target in angle brackets, like \"</app.css>; rel=preload; as=style\""));
            }
            HeaderValue::from_str(hint.trim()).map_err(|_| bad("not a valid field value"))
        })
        .collect()
}

fn synthesis(r: &Respond, phase: Phase, groups: usize) -> Result<Synthesis, (String, String)> {
    let at = |field: &str| {
        let field = format!("respond.{field}");
        move |reason| (field.clone(), reason)
    };
    let status = match r.status {
        Some(s) => Some(
            StatusCode::from_u16(s)
                .ok()
                .filter(|s| !s.is_informational())
                .ok_or_else(|| at("status")(format!("{s} is not a final status")))?,
        ),
        None if r.location.is_some() => Some(StatusCode::FOUND),
        None if phase == Request => Some(StatusCode::OK),
        None => None,
    };
    let location = match &r.location {
        Some(l) => Some(header_template(l, groups).map_err(at("location"))?),
        None => None,
    };
    let body = match (&r.body, &r.file) {
        (Some(_), Some(_)) => {
            return Err(at("file")("and body: give one".into()));
        }
        (Some(b), None) => {
            if b.len() > MAX_BODY {
                return Err(at("body")(format!(
                    "{} bytes, more than the {} KiB a body in the file may have: use `file`",
                    b.len(),
                    MAX_BODY / 1024
                )));
            }
            Body::Template(Template::parse(b, groups).map_err(at("body"))?)
        }
        (None, Some(path)) => Body::File(read_page(path).map_err(at("file"))?),
        (None, None) => Body::Template(Template::parse("", 0).expect("empty template")),
    };
    let content_type = match (&r.content_type, &r.file) {
        (Some(t), _) => header_value(t).map_err(at("content_type"))?,
        (None, Some(path)) => page_type(path),
        (None, None) => HeaderValue::from_static("text/plain; charset=utf-8"),
    };
    let mut headers = Vec::new();
    for (name, value) in &r.headers {
        let n = header_name(name).map_err(at("headers"))?;
        if FRAMING.contains(&n.as_str()) {
            return Err(at("headers")(format!("{name} frames the message")));
        }
        headers.push((
            n,
            header_template(value, groups).map_err(at(&format!("headers.{name}")))?,
        ));
    }
    // Only a deliver rule's response has a head to read when it makes its own.
    let reads = |t: &Template| t.reads_response() || t.reads_outcome();
    let reads_response = location.as_ref().is_some_and(reads)
        || matches!(&body, Body::Template(t) if reads(t))
        || headers.iter().any(|(_, t)| reads(t));
    if reads_response && phase != Deliver {
        return Err((
            "respond".into(),
            format!(
                "reads the response (`${{resp.…}}`): not in the {} phase (only in deliver)",
                phase.name()
            ),
        ));
    }
    Ok(Synthesis {
        status,
        location,
        body,
        content_type,
        headers,
    })
}
