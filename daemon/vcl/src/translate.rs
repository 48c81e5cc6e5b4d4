//! The tree made rules: each subroutine's statements walked with the condition under which they run, each
//! run of actions under one condition made a rule (one per alternative of a condition with `||`), a
//! `return` made the rule's `stop`.
//!
//! What has no rule (a condition on `beresp.ttl`, a URL that does *not* match, `vcl_hit`'s logic) is
//! reported with its line and why, never approximated silently: a rule that drops one of its conditions
//! could store or share what Varnish would not.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::Duration,
};

use ipnet::IpNet;
use lacquer_config::{
    Backend, BanFromRequest, Bucket, CookieFilter, Phase, Probe, PurgeScope, QueryRewrite, Respond,
    Rewrite, Rule, StatusPattern,
};

use crate::parse::{Cond, Expr, Item, Probe as ProbeDecl, Program, Stmt};

/// A translated declaration and where in the VCL it came from.
#[derive(Debug, Clone)]
pub struct Piece<T> {
    /// What it became.
    pub value: T,
    /// The subroutine it came from (`vcl_recv`), or the declaration (`backend`).
    pub from: String,
    /// The first and last lines it came from.
    pub lines: (usize, usize),
}

/// A construct that has no translation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Untranslated {
    /// Where it is.
    pub line: usize,
    /// What it is, as written (shortened).
    pub construct: String,
    /// Why it has no translation, and what to do instead.
    pub why: String,
}

/// What a VCL file translates into.
#[derive(Debug, Default)]
pub struct Translation {
    /// `[[backend]]`s, probes included.
    pub backends: Vec<Piece<Backend>>,
    /// `[purge] allow_from`: the ACL that guards `PURGE` and `BAN`, when the VCL has one.
    pub purge_allow: Option<Piece<Vec<IpNet>>>,
    /// `[[rule]]`s, in the order they run.
    pub rules: Vec<Piece<Rule>>,
    /// What could not be translated.
    pub untranslated: Vec<Untranslated>,
    /// What needs no rule here (lacquerd does it already), with why: shown so a reviewer sees every line
    /// was read.
    pub unneeded: Vec<Untranslated>,
}

/// The methods a rule can name; `req.method != "GET"` is every other one of them.
const METHODS: [&str; 12] = [
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT", "PURGE", "BAN",
    "QUERY",
];

/// The outcomes a deliver rule can name.
const OUTCOMES: [&str; 5] = ["hit", "stale", "miss", "uncacheable", "pass"];

/// A condition's leaf, negated or not.
#[derive(Debug, Clone)]
struct Lit {
    cond: Cond,
    negated: bool,
}

/// A conjunction of leaves: one alternative of a condition.
type Conj = Vec<Lit>;

/// Past this many alternatives a condition is reported rather than expanded.
const MAX_ALTERNATIVES: usize = 16;

/// `c` (or its negation) as alternatives of conjunctions.
fn dnf(c: &Cond, negated: bool) -> Vec<Conj> {
    match (c, negated) {
        (Cond::Not(inner), n) => dnf(inner, !n),
        (Cond::Or(cs), false) | (Cond::And(cs), true) => {
            cs.iter().flat_map(|c| dnf(c, negated)).collect()
        }
        (Cond::And(cs), false) | (Cond::Or(cs), true) => {
            let mut out: Vec<Conj> = vec![Vec::new()];
            for c in cs {
                let alts = dnf(c, negated);
                let mut next = Vec::new();
                for a in &out {
                    for b in &alts {
                        let mut both = a.clone();
                        both.extend(b.iter().cloned());
                        next.push(both);
                    }
                }
                out = next;
                if out.len() > MAX_ALTERNATIVES * 4 {
                    break;
                }
            }
            out
        }
        (leaf, n) => vec![vec![Lit {
            cond: leaf.clone(),
            negated: n,
        }]],
    }
}

/// Every alternative of `a` joined with every one of `b`.
fn and(a: &[Conj], b: &[Conj]) -> Vec<Conj> {
    let mut out = Vec::new();
    for x in a {
        for y in b {
            let mut both = x.clone();
            both.extend(y.iter().cloned());
            out.push(both);
        }
    }
    out
}

/// How a `vcl_synth` case answers `synth(code, reason)`.
#[derive(Debug, Default, Clone)]
struct SynthCase {
    status: Option<u16>,
    /// `set resp.http.Location = resp.reason`.
    location_is_reason: bool,
    headers: Vec<(String, Expr)>,
    body: Option<Expr>,
}

struct Translator<'a> {
    acls: HashMap<String, Vec<String>>,
    probes: HashMap<String, Vec<(String, Expr)>>,
    /// Each subroutine's statements: a name defined twice runs both bodies in order, as in Varnish.
    subs: HashMap<String, &'a [Stmt]>,
    synth: HashMap<u16, SynthCase>,
    /// Lines of the VCL, for what is reported.
    source: Vec<&'a str>,
    out: Translation,
    /// Header names `vcl_recv` writes: a `vcl_hash` condition on one of them sees it before the write here.
    recv_writes: BTreeSet<String>,
}

/// Translates a parsed file; `source` is its text (the report quotes it).
pub(crate) fn translate(program: &Program, source: &str) -> Translation {
    // A subroutine defined more than once is one body, its parts in order.
    let mut bodies: Vec<(String, Vec<Stmt>)> = Vec::new();
    for item in &program.items {
        if let Item::Sub { name, body } = item {
            match bodies.iter_mut().find(|(n, _)| n == name) {
                Some((_, all)) => all.extend(body.iter().cloned()),
                None => bodies.push((name.clone(), body.clone())),
            }
        }
    }
    let mut t = Translator {
        acls: HashMap::new(),
        probes: HashMap::new(),
        subs: HashMap::new(),
        synth: HashMap::new(),
        source: source.lines().collect(),
        out: Translation::default(),
        recv_writes: BTreeSet::new(),
    };
    for item in &program.items {
        match item {
            Item::Acl { name, entries } => {
                t.acls.insert(name.clone(), entries.clone());
            }
            Item::Probe {
                name,
                probe: ProbeDecl::Fields(fields),
            } => {
                t.probes.insert(name.clone(), fields.clone());
            }
            _ => {}
        }
    }
    for (name, body) in &bodies {
        t.subs.insert(name.clone(), body.as_slice());
    }
    if let Some(body) = t.subs.get("vcl_synth").copied() {
        t.synth_cases(body);
    }
    if let Some(body) = t.subs.get("vcl_recv").copied() {
        t.recv_writes = writes(body);
    }
    for item in &program.items {
        if let Item::Backend {
            name,
            fields,
            probe,
            line,
        } = item
        {
            t.backend(name, fields, probe.as_ref(), *line);
        }
        if let Item::Other { line, text } = item {
            let why = if text.starts_with("include") {
                "an included file: translate it on its own and add its rules where it is included"
            } else {
                "not a declaration vcl2rules reads"
            };
            t.untranslated(*line, text, why);
        }
    }
    // vcl_hash runs after vcl_recv in Varnish; here its rules come first, so that a `return` in vcl_recv
    // (a rule's `stop`) does not skip them.
    for sub in [
        "vcl_hash",
        "vcl_recv",
        "vcl_backend_fetch",
        "vcl_backend_response",
        "vcl_deliver",
        "vcl_backend_error",
    ] {
        if let Some(body) = t.subs.get(sub).copied() {
            t.sub(sub, body);
        }
    }
    let mut others: Vec<(&String, &&[Stmt])> = t
        .subs
        .iter()
        .filter(|(name, _)| {
            !name.starts_with("vcl_")
                || matches!(
                    name.as_str(),
                    "vcl_hit"
                        | "vcl_miss"
                        | "vcl_pass"
                        | "vcl_pipe"
                        | "vcl_purge"
                        | "vcl_init"
                        | "vcl_fini"
                        | "vcl_fetch"
                        | "vcl_error"
                )
        })
        .collect();
    others.sort_by_key(|(name, _)| name.as_str());
    let others: Vec<(String, &[Stmt])> = others.into_iter().map(|(n, b)| (n.clone(), *b)).collect();
    for (name, body) in others {
        if name.starts_with("vcl_") {
            t.unmapped_sub(&name, body);
        }
    }
    t.merge_bans();
    t.out.untranslated.sort_by_key(|u| u.line);
    t.out
        .untranslated
        .dedup_by(|a, b| a.line == b.line && a.why == b.why);
    t.out.unneeded.sort_by_key(|u| u.line);
    t.out
        .unneeded
        .dedup_by(|a, b| a.line == b.line && a.why == b.why);
    t.out
}

/// The request headers a body sets or unsets (lower case).
fn writes(body: &[Stmt]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for stmt in body {
        match stmt {
            Stmt::Set { lhs, .. } | Stmt::Unset { lhs, .. } => {
                if let Some(h) = lhs.strip_prefix("req.http.") {
                    names.insert(h.to_ascii_lowercase());
                }
            }
            Stmt::If {
                branches,
                otherwise,
                ..
            } => {
                for (_, b) in branches {
                    names.extend(writes(b));
                }
                if let Some(b) = otherwise {
                    names.extend(writes(b));
                }
            }
            _ => {}
        }
    }
    names
}

/// The phase a subroutine's rules act in.
fn phase_of(sub: &str) -> Phase {
    match sub {
        "vcl_backend_fetch" => Phase::BackendRequest,
        "vcl_backend_response" => Phase::BackendResponse,
        "vcl_deliver" => Phase::Deliver,
        "vcl_backend_error" => Phase::Error,
        _ => Phase::Request,
    }
}

/// What running a statement leaves: the sub goes on, or it returned.
#[derive(PartialEq)]
enum Flow {
    On,
    Returned,
}

/// A rule being made of consecutive actions under one condition.
struct Group {
    rule: Rule,
    lines: (usize, usize),
    any: bool,
}

impl Group {
    fn new(line: usize) -> Self {
        Self {
            rule: Rule::default(),
            lines: (line, line),
            any: false,
        }
    }
}

impl Translator<'_> {
    fn text(&self, line: usize) -> String {
        self.source
            .get(line.saturating_sub(1))
            .map_or_else(String::new, |l| l.trim().to_owned())
    }

    fn untranslated(&mut self, line: usize, construct: &str, why: &str) {
        let construct = if construct.is_empty() {
            self.text(line)
        } else {
            construct.to_owned()
        };
        self.out.untranslated.push(Untranslated {
            line,
            construct,
            why: why.to_owned(),
        });
    }

    fn unneeded(&mut self, line: usize, why: &str) {
        let construct = self.text(line);
        self.out.unneeded.push(Untranslated {
            line,
            construct,
            why: why.to_owned(),
        });
    }

    fn backend(
        &mut self,
        name: &str,
        fields: &[(String, Expr)],
        probe: Option<&ProbeDecl>,
        line: usize,
    ) {
        let mut b = Backend {
            name: name.to_owned(),
            ..Backend::default()
        };
        let (mut host, mut port) = (None, None);
        for (field, value) in fields {
            match (field.as_str(), value) {
                ("host", Expr::Str(h)) => host = Some(h.clone()),
                ("port", Expr::Str(p) | Expr::Num(p)) => port = Some(p.clone()),
                ("connect_timeout", Expr::Num(d)) => {
                    if let Some(d) = duration(d) {
                        b.connect_timeout = d;
                    }
                }
                ("first_byte_timeout", Expr::Num(d)) => {
                    if let Some(d) = duration(d) {
                        b.first_byte_timeout = d;
                    }
                }
                ("between_bytes_timeout", Expr::Num(d)) => {
                    if let Some(d) = duration(d) {
                        b.between_bytes_timeout = d;
                    }
                }
                ("max_connections", Expr::Num(n)) => {
                    if let Ok(n) = n.parse() {
                        b.max_connections = n;
                    }
                }
                (other, _) => self.untranslated(
                    line,
                    &format!("backend {name} .{other}"),
                    "no [[backend]] setting",
                ),
            }
        }
        // A template's placeholders (`"/* {{ host }} */"`) are no address either.
        let real = |v: &String| !v.is_empty() && !v.contains("{{");
        let host = host.filter(real);
        b.address = Some(match (host, port.filter(real)) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => format!("{h}:80"),
            (None, _) => {
                self.untranslated(
                    line,
                    &format!("backend {name}"),
                    "no .host: set the backend's address by hand",
                );
                "127.0.0.1:8080".to_owned()
            }
        });
        let fields = match probe {
            Some(ProbeDecl::Fields(f)) => Some(f.clone()),
            Some(ProbeDecl::Named(n)) => self.probes.get(n).cloned(),
            None => None,
        };
        if let Some(fields) = fields {
            let mut p = Probe::default();
            for (field, value) in &fields {
                let number = |v: &Expr| match v {
                    Expr::Num(n) | Expr::Str(n) => n.parse::<u32>().ok(),
                    _ => None,
                };
                match (field.as_str(), value) {
                    ("url", Expr::Str(u)) => p.url = u.clone(),
                    ("interval", Expr::Num(d)) => {
                        p.interval = duration(d).unwrap_or(p.interval);
                    }
                    ("timeout", Expr::Num(d)) => p.timeout = duration(d).unwrap_or(p.timeout),
                    ("window", v) => p.window = number(v).unwrap_or(p.window),
                    ("threshold", v) => p.threshold = number(v).unwrap_or(p.threshold),
                    ("initial", v) => p.initial = number(v),
                    ("expected_response", v) => {
                        p.expected_status = number(v).map_or(p.expected_status, |n| n as u16);
                    }
                    (other, _) => self.untranslated(
                        line,
                        &format!("probe .{other}"),
                        "no probe setting (a probe sends `GET url`)",
                    ),
                }
            }
            b.probe = Some(p);
        }
        self.out.backends.push(Piece {
            value: b,
            from: "backend".into(),
            lines: (line, line),
        });
    }

    /// `vcl_synth`'s cases by the status they answer (`if (resp.status == 750) { … }`).
    fn synth_cases(&mut self, body: &[Stmt]) {
        for stmt in body {
            let Stmt::If { branches, .. } = stmt else {
                continue;
            };
            for (cond, stmts) in branches {
                let Cond::Cmp(Expr::Var(v), "==", Expr::Num(code)) = cond else {
                    continue;
                };
                let Ok(code) = code.parse::<u16>() else {
                    continue;
                };
                if v != "resp.status" {
                    continue;
                }
                let mut case = SynthCase::default();
                for s in stmts {
                    match s {
                        Stmt::Set {
                            lhs,
                            value: Expr::Num(n),
                            ..
                        } if lhs == "resp.status" => case.status = n.parse().ok(),
                        Stmt::Set { lhs, value, .. }
                            if lhs.eq_ignore_ascii_case("resp.http.Location") =>
                        {
                            if value == &Expr::Var("resp.reason".into()) {
                                case.location_is_reason = true;
                            } else {
                                case.headers.push(("location".into(), value.clone()));
                            }
                        }
                        Stmt::Set { lhs, value, .. } => {
                            if let Some(h) = lhs.strip_prefix("resp.http.") {
                                case.headers.push((h.to_owned(), value.clone()));
                            }
                        }
                        Stmt::Call { name, args, .. } if name == "synthetic" => {
                            case.body = args.first().cloned();
                        }
                        _ => {}
                    }
                }
                self.synth.insert(code, case);
            }
        }
    }

    fn unmapped_sub(&mut self, name: &str, body: &[Stmt]) {
        for stmt in body {
            let line = stmt_line(stmt);
            match (name, stmt) {
                ("vcl_pipe", _) => self.unneeded(
                    line,
                    "a `pipe` rule's tunnel sends the client's Upgrade and Connection on",
                ),
                ("vcl_hit", Stmt::If { branches, .. }) if matches!(&branches[0].0, Cond::Cmp(Expr::Var(v), ">=", Expr::Num(z)) if v == "obj.ttl" && duration(z) == Some(Duration::ZERO)) =>
                {
                    self.unneeded(
                        line,
                        "a fresh object is served; one in grace is served while it is refreshed, and \
                         `request_grace` bounds how stale (vcl_hit's other branches)",
                    );
                }
                _ => self.untranslated(
                    line,
                    "",
                    &format!("{name} has no rule phase: grace, hit and miss are lacquerd's own"),
                ),
            }
        }
    }

    fn sub(&mut self, name: &str, body: &[Stmt]) {
        let phase = phase_of(name);
        self.block(name, phase, body, &[Vec::new()], 0);
    }

    /// Walks `body` under `path` (the alternatives under which it runs); whether it always returns.
    fn block(
        &mut self,
        sub: &str,
        phase: Phase,
        body: &[Stmt],
        path: &[Conj],
        depth: usize,
    ) -> Flow {
        let mut group: Option<Group> = None;
        for stmt in body {
            match stmt {
                Stmt::If { lines, .. }
                    if phase == Phase::Request && header_idiom(stmt).is_some() =>
                {
                    self.flush(sub, phase, path, group.take());
                    let mut rule = Rule::default();
                    match header_idiom(stmt).expect("checked") {
                        HeaderIdiom::Bucket(bucket) => rule.buckets.push(bucket),
                        HeaderIdiom::Scheme(header) => {
                            rule.set_headers.insert(header, "${scheme}".into());
                        }
                    }
                    let g = Group {
                        rule,
                        lines: *lines,
                        any: true,
                    };
                    self.flush(sub, phase, path, Some(g));
                }
                Stmt::If { lines, .. }
                    if phase == Phase::BackendResponse && ttl_idiom(stmt).is_some() =>
                {
                    self.flush(sub, phase, path, group.take());
                    let (idiom, d, cond) = ttl_idiom(stmt).expect("checked");
                    let mut rule = Rule::default();
                    match idiom {
                        TtlIdiom::Max => rule.ttl_max = Some(d),
                        TtlIdiom::Min => rule.ttl_min = Some(d),
                        TtlIdiom::Default => rule.default_ttl = Some(d),
                    }
                    let here = match cond {
                        Some(c) => and(path, &dnf(&c, false)),
                        None => path.to_vec(),
                    };
                    let g = Group {
                        rule,
                        lines: *lines,
                        any: true,
                    };
                    self.flush(sub, phase, &here, Some(g));
                }
                Stmt::If {
                    branches,
                    otherwise,
                    ..
                } => {
                    self.flush(sub, phase, path, group.take());
                    let mut earlier: Vec<Conj> = vec![Vec::new()];
                    for (cond, stmts) in branches {
                        let here = and(&and(path, &dnf(cond, false)), &earlier);
                        self.block(sub, phase, stmts, &here, depth);
                        earlier = and(&earlier, &dnf(cond, true));
                    }
                    if let Some(stmts) = otherwise {
                        let here = and(path, &earlier);
                        self.block(sub, phase, stmts, &here, depth);
                    }
                }
                Stmt::CallSub { name, line } => {
                    self.flush(sub, phase, path, group.take());
                    match self.subs.get(name.as_str()).copied() {
                        Some(called) if depth < 8 => {
                            if self.block(sub, phase, called, path, depth + 1) == Flow::Returned {
                                return Flow::Returned;
                            }
                        }
                        _ => self.untranslated(*line, "", "calls a subroutine not found here"),
                    }
                }
                simple => {
                    let line = stmt_line(simple);
                    let g = group.get_or_insert_with(|| Group::new(line));
                    g.lines.1 = line;
                    match self.action(sub, phase, simple, &mut g.rule) {
                        Ok(Some(flow)) => {
                            g.any = true;
                            if flow == Flow::Returned {
                                // vcl_hash's rules never stop: vcl_recv's come after them here.
                                if sub != "vcl_hash" {
                                    g.rule.stop = true;
                                }
                                self.flush(sub, phase, path, group.take());
                                return Flow::Returned;
                            }
                        }
                        Ok(None) => {}
                        Err(why) => self.untranslated(line, "", &why),
                    }
                }
            }
        }
        self.flush(sub, phase, path, group);
        Flow::On
    }

    /// Makes the rules of a group: one per alternative of its condition.
    fn flush(&mut self, sub: &str, phase: Phase, path: &[Conj], group: Option<Group>) {
        let Some(group) = group.filter(|g| g.any) else {
            return;
        };
        if path.len() > MAX_ALTERNATIVES {
            self.untranslated(
                group.lines.0,
                "",
                &format!(
                    "its condition has {} alternatives; write the rules by hand",
                    path.len()
                ),
            );
            return;
        }
        let many = path.len() > 1;
        let mut made: Vec<Rule> = Vec::new();
        for (n, conj) in path.iter().enumerate() {
            let mut rule = group.rule.clone();
            rule.on = phase;
            rule.name = Some(if many {
                format!("{}-{}-{}", short(sub), group.lines.0, n + 1)
            } else {
                format!("{}-{}", short(sub), group.lines.0)
            });
            if rule.store == Some(false)
                && (rule.ttl.is_some() || rule.grace.is_some() || rule.keep.is_some())
            {
                rule.ttl = None;
                rule.grace = None;
                rule.keep = None;
                self.unneeded(
                    group.lines.0,
                    "beresp.ttl beside uncacheable is how long Varnish remembers the key as uncacheable: \
                     `cache.hit_for_miss` here",
                );
            }
            // The end of vcl_recv's work, said outright: nothing follows it to stop.
            let bare_stop = Rule {
                name: rule.name.clone(),
                on: rule.on,
                stop: true,
                ..Rule::default()
            };
            if rule == bare_stop && conj.is_empty() {
                continue;
            }
            match self.condition(conj, phase, &mut rule) {
                Ok(true) => {}
                // Can never hold (`GET` and `!= GET`): no rule.
                Ok(false) => continue,
                Err(why) => {
                    let line = group.lines.0;
                    let what = if many {
                        format!(
                            "{} (alternative {} of its condition)",
                            self.text(line),
                            n + 1
                        )
                    } else {
                        String::new()
                    };
                    self.untranslated(line, &what, &format!("its condition: {why}"));
                    continue;
                }
            }
            if rule.pipe && !rule.when.headers.contains_key("upgrade") {
                rule.pipe = false;
                rule.pass = true;
                self.unneeded(
                    group.lines.0,
                    "`pipe` tunnels connection upgrades (WebSocket) only: other requests are passed",
                );
            }
            if sub == "vcl_hash" && !self.recv_writes.is_empty() {
                let read: Vec<String> = conj
                    .iter()
                    .filter_map(|l| header_read(&l.cond))
                    .filter(|h| self.recv_writes.contains(h))
                    .collect();
                if !read.is_empty() {
                    self.untranslated(
                        group.lines.0,
                        "",
                        &format!(
                            "vcl_hash's rule runs before vcl_recv's here, and reads {} that vcl_recv \
                             writes: check the condition against the request as sent",
                            read.join(", ")
                        ),
                    );
                }
            }
            // Alternatives that differ only by method are one rule (`GET` or `HEAD`, and …).
            let same_but_methods = |a: &Rule, b: &Rule| {
                let mut a = a.clone();
                let mut b = b.clone();
                (a.name, b.name) = (None, None);
                (a.when.methods, b.when.methods) = (Vec::new(), Vec::new());
                a == b
            };
            match made.iter_mut().find(|m| {
                same_but_methods(m, &rule)
                    && !m.when.methods.is_empty()
                    && !rule.when.methods.is_empty()
            }) {
                Some(m) => {
                    m.when.methods.extend(rule.when.methods);
                    m.when.methods.sort();
                    m.when.methods.dedup();
                }
                None => made.push(rule),
            }
        }
        let count = made.len();
        for (n, mut rule) in made.into_iter().enumerate() {
            rule.name = Some(if count > 1 {
                format!("{}-{}-{}", short(sub), group.lines.0, n + 1)
            } else {
                format!("{}-{}", short(sub), group.lines.0)
            });
            self.out.rules.push(Piece {
                value: rule,
                from: sub.to_owned(),
                lines: group.lines,
            });
        }
    }

    /// Sets `rule`'s match from a conjunction; `Ok(false)` when it can never hold.
    fn condition(&self, conj: &[Lit], phase: Phase, rule: &mut Rule) -> Result<bool, String> {
        let m = &mut rule.when;
        let mut methods: Option<BTreeSet<&str>> = None;
        let mut outcomes: Option<BTreeSet<&str>> = None;
        let mut statuses: Option<BTreeSet<u16>> = None;
        let response_phase = matches!(
            phase,
            Phase::BackendResponse | Phase::Deliver | Phase::Error
        );
        for lit in conj {
            let n = lit.negated;
            match &lit.cond {
                Cond::Cmp(Expr::Var(v), _, _) | Cond::Truthy(Expr::Var(v)) if v.ends_with('.') => {
                    return Err(format!(
                        "{v} names no header (a template's placeholder?): fill it in"
                    ));
                }
                Cond::Cmp(Expr::Var(a), op @ ("==" | "!="), Expr::Var(b))
                    if response_phase && same_header_pair(a, b).is_some() =>
                {
                    let h = same_header_pair(a, b).expect("checked");
                    if (*op == "==") != n {
                        m.same_headers.push(h);
                    } else {
                        m.different_headers.push(h);
                    }
                }
                Cond::Cmp(Expr::Var(v), op, rhs) => {
                    let v = v.as_str();
                    // `!~` and `!=` are negations too.
                    let (op, n) = match *op {
                        "!~" => ("~", !n),
                        "!=" => ("==", !n),
                        op => (op, n),
                    };
                    let text = match rhs {
                        Expr::Str(s) => Some(s.clone()),
                        _ => None,
                    };
                    let lower = v.to_ascii_lowercase();
                    if matches!(lower.as_str(), "req.url" | "bereq.url") {
                        let re = match (op, &text) {
                            ("~", Some(re)) => re.clone(),
                            ("==", Some(s)) => format!("^{}$", regex::escape(s)),
                            _ => return Err(format!("`{v} {op}` a value that is not a string")),
                        };
                        if n {
                            return Err(format!(
                                "a URL that does not match ({v} !~ {re:?}) is no rule condition"
                            ));
                        }
                        if m.path_regex.replace(re).is_some() {
                            return Err("two expressions on the URL in one alternative".into());
                        }
                    } else if matches!(lower.as_str(), "req.method" | "bereq.method") {
                        let Some(s) = text else {
                            return Err(format!(
                                "`{v}` compared with a value that is not a string"
                            ));
                        };
                        let set = methods.get_or_insert_with(|| METHODS.into_iter().collect());
                        match op {
                            "==" if !n => set.retain(|x| x.eq_ignore_ascii_case(&s)),
                            "==" => set.retain(|x| !x.eq_ignore_ascii_case(&s)),
                            "~" => {
                                let re = regex::Regex::new(&s).map_err(|e| e.to_string())?;
                                set.retain(|x| re.is_match(x) != n);
                            }
                            _ => return Err(format!("`{v} {op}`")),
                        }
                        if !set.iter().any(|x| x.eq_ignore_ascii_case(&s)) && op == "==" && !n {
                            // A method outside the known ones: kept as written.
                            return Err(format!("the method {s:?} is none lacquerd forwards"));
                        }
                    } else if lower == "client.ip" {
                        let Expr::Var(acl) = rhs else {
                            return Err("client.ip compared with a value that is not an ACL".into());
                        };
                        let nets = self.acl(acl)?;
                        if n {
                            m.except_clients.extend(nets);
                        } else {
                            m.clients.extend(nets);
                        }
                    } else if let Some(h) = lower
                        .strip_prefix("req.http.")
                        .or_else(|| lower.strip_prefix("bereq.http."))
                    {
                        let Some(s) = text else {
                            return Err(format!(
                                "`{v}` compared with a value that is not a string"
                            ));
                        };
                        if h == "cookie" && op == "~" {
                            if let Some(names) = cookie_names(&s) {
                                if n {
                                    m.without_cookies.extend(names);
                                } else {
                                    if !m.cookies.is_empty() {
                                        return Err(
                                            "two cookie conditions in one alternative".into()
                                        );
                                    }
                                    m.cookies.extend(names);
                                }
                                continue;
                            }
                        }
                        if n {
                            return Err(format!(
                                "a header that does not match ({v} {}{op} {s:?}) is no rule condition",
                                "!"
                            ));
                        }
                        let re = if op == "==" {
                            format!("^{}$", regex::escape(&s))
                        } else if op == "~" {
                            s
                        } else {
                            return Err(format!("`{v} {op}`"));
                        };
                        // A header present, and matching: the match says both.
                        if m.headers
                            .insert(h.to_owned(), re)
                            .is_some_and(|was| !was.is_empty())
                        {
                            return Err(format!("two expressions on {h} in one alternative"));
                        }
                    } else if let Some(h) = lower
                        .strip_prefix("beresp.http.")
                        .or_else(|| lower.strip_prefix("resp.http."))
                        .or_else(|| lower.strip_prefix("obj.http."))
                    {
                        if !response_phase {
                            return Err(format!("{v} in a request phase"));
                        }
                        let Some(s) = text else {
                            return Err(format!(
                                "`{v}` compared with a value that is not a string"
                            ));
                        };
                        if n {
                            return Err(format!(
                                "a response header that does not match ({v} !{op} {s:?}) is no rule condition"
                            ));
                        }
                        let re = if op == "==" {
                            format!("^{}$", regex::escape(&s))
                        } else {
                            s
                        };
                        if m.response_headers.insert(h.to_owned(), re).is_some() {
                            return Err(format!("two expressions on {h} in one alternative"));
                        }
                    } else if matches!(
                        lower.as_str(),
                        "beresp.status" | "resp.status" | "obj.status"
                    ) {
                        let Expr::Num(code) = rhs else {
                            return Err(format!(
                                "`{v}` compared with a value that is not a number"
                            ));
                        };
                        let code: u16 = code.parse().map_err(|_| format!("status {code}"))?;
                        let set = statuses.get_or_insert_with(|| (100..=599).collect());
                        let (op, code) = match (op, n) {
                            (op, false) => (op, code),
                            ("==", true) => ("!=", code),
                            (">=", true) => ("<", code),
                            (">", true) => ("<=", code),
                            ("<", true) => (">=", code),
                            ("<=", true) => (">", code),
                            (op, true) => return Err(format!("`!({v} {op} …)`")),
                        };
                        set.retain(|&s| match op {
                            "==" => s == code,
                            "!=" => s != code,
                            ">=" => s >= code,
                            ">" => s > code,
                            "<" => s < code,
                            "<=" => s <= code,
                            _ => true,
                        });
                    } else if lower == "obj.hits" {
                        let zero = matches!(rhs, Expr::Num(z) if z == "0");
                        let hit = match (op, zero) {
                            (">", true) | ("!=", true) => !n,
                            ("==", true) => n,
                            _ => return Err(format!("`{v} {op}` other than 0")),
                        };
                        outcome(&mut outcomes, hit, &["hit", "stale"], phase)?;
                    } else {
                        return Err(format!("no rule condition reads {v}"));
                    }
                }
                Cond::Cmp(Expr::Call(f, args), op, Expr::Num(limit))
                    if f == "std.integer"
                        && matches!(args.first(), Some(Expr::Var(h)) if h.eq_ignore_ascii_case("beresp.http.Content-Length"))
                        && *op == ">"
                        && !n =>
                {
                    let bytes: u64 = limit.parse().map_err(|_| format!("size {limit}"))?;
                    m.larger_than = Some(bytesize::ByteSize::b(bytes));
                }
                Cond::Truthy(Expr::Var(v)) => {
                    let lower = v.to_ascii_lowercase();
                    if let Some(h) = lower
                        .strip_prefix("req.http.")
                        .or_else(|| lower.strip_prefix("bereq.http."))
                    {
                        if n {
                            m.without_headers.push(h.to_owned());
                        } else {
                            m.headers.entry(h.to_owned()).or_default();
                        }
                    } else if let Some(h) = lower
                        .strip_prefix("beresp.http.")
                        .or_else(|| lower.strip_prefix("resp.http."))
                        .or_else(|| lower.strip_prefix("obj.http."))
                    {
                        if !response_phase {
                            return Err(format!("{v} in a request phase"));
                        }
                        if n {
                            return Err(format!(
                                "a response header that is absent ({v}) is no rule condition"
                            ));
                        }
                        m.response_headers.insert(h.to_owned(), String::new());
                    } else if lower == "obj.hits" {
                        outcome(&mut outcomes, !n, &["hit", "stale"], phase)?;
                    } else if lower == "obj.uncacheable" {
                        outcome(&mut outcomes, !n, &["uncacheable", "pass"], phase)?;
                    } else {
                        return Err(format!("no rule condition reads {v}"));
                    }
                }
                Cond::Truthy(Expr::Call(f, args))
                    if f == "std.healthy"
                        && matches!(args.first(), Some(Expr::Var(b)) if b == "req.backend_hint") =>
                {
                    m.backend_healthy = Some(!n);
                }
                other => return Err(format!("no rule condition for {}", shown_cond(other))),
            }
        }
        if let Some(set) = methods {
            if set.is_empty() {
                return Ok(false);
            }
            if set.len() < METHODS.len() {
                m.methods = set.into_iter().map(str::to_owned).collect();
            }
        }
        if let Some(set) = outcomes {
            if set.is_empty() {
                return Ok(false);
            }
            m.outcome = set.into_iter().map(str::to_owned).collect();
        }
        if let Some(set) = statuses {
            if set.is_empty() {
                return Ok(false);
            }
            if set.len() < 500 {
                m.status = status_patterns(&set)?;
            }
        }
        Ok(true)
    }

    fn acl(&self, name: &str) -> Result<Vec<IpNet>, String> {
        let entries = self
            .acls
            .get(name)
            .ok_or_else(|| format!("no acl {name}"))?;
        if entries.is_empty() {
            return Err(format!(
                "acl {name} is empty (a template's placeholder?): fill it in, then translate again"
            ));
        }
        let mut nets = Vec::new();
        for e in entries {
            if e.starts_with('!') {
                return Err(format!("acl {name} has a negated entry ({e})"));
            }
            if e == "localhost" {
                nets.push("127.0.0.1/32".parse().expect("net"));
                nets.push("::1/128".parse().expect("net"));
                continue;
            }
            let net: IpNet = match e.parse() {
                Ok(net) => net,
                Err(_) => match e.parse::<std::net::IpAddr>() {
                    Ok(ip) => IpNet::from(ip),
                    Err(_) => return Err(format!("acl {name}: {e:?} is not an address")),
                },
            };
            nets.push(net.trunc());
        }
        Ok(nets)
    }

    /// Puts one action into `rule`: `Ok(Some(flow))` when it did something, `Ok(None)` when nothing is
    /// needed here (noted), `Err` with why it has no translation.
    fn action(
        &mut self,
        sub: &str,
        phase: Phase,
        stmt: &Stmt,
        rule: &mut Rule,
    ) -> Result<Option<Flow>, String> {
        let line = stmt_line(stmt);
        match stmt {
            Stmt::Set { lhs, op, value, .. } => {
                if *op != "=" {
                    return Err(format!("`set {lhs} {op}`"));
                }
                self.set(sub, phase, lhs, value, rule, line)
            }
            Stmt::Unset { lhs, .. } => {
                let lower = lhs.to_ascii_lowercase();
                let header = match phase {
                    Phase::Request => lower.strip_prefix("req.http."),
                    Phase::BackendRequest => lower.strip_prefix("bereq.http."),
                    Phase::BackendResponse => lower.strip_prefix("beresp.http."),
                    Phase::Deliver | Phase::Error => lower.strip_prefix("resp.http."),
                };
                let Some(h) = header else {
                    return Err(format!("no rule unsets {lhs} in {sub}"));
                };
                rule.set_headers.remove(h);
                if !rule.unset_headers.iter().any(|x| x == h) {
                    rule.unset_headers.push(h.to_owned());
                }
                Ok(Some(Flow::On))
            }
            Stmt::Return { action, .. } => self.returns(sub, phase, action, rule, line),
            Stmt::Call { name, args, .. } => self.call(sub, name, args, rule, line),
            Stmt::Other { text, .. } => Err(format!("not a statement vcl2rules reads ({text})")),
            Stmt::If { .. } | Stmt::CallSub { .. } => Ok(None),
        }
    }

    fn set(
        &mut self,
        sub: &str,
        phase: Phase,
        lhs: &str,
        value: &Expr,
        rule: &mut Rule,
        line: usize,
    ) -> Result<Option<Flow>, String> {
        let lower = lhs.to_ascii_lowercase();
        let header = match phase {
            Phase::Request => lower.strip_prefix("req.http."),
            Phase::BackendRequest => lower.strip_prefix("bereq.http."),
            Phase::BackendResponse => lower.strip_prefix("beresp.http."),
            Phase::Deliver | Phase::Error => lower.strip_prefix("resp.http."),
        };
        if let Some(h) = header {
            if h.is_empty() {
                return Err(format!("{lhs} names no header (a template's placeholder?)"));
            }
            return self.set_header(phase, h, value, rule, line);
        }
        let dur = || match value {
            Expr::Num(n) => duration(n).ok_or_else(|| format!("{n} is not a duration")),
            _ => Err(format!("`set {lhs}` to a value that is not a duration")),
        };
        let flag = || match value {
            Expr::Var(b) if b == "true" => Ok(true),
            Expr::Var(b) if b == "false" => Ok(false),
            _ => Err(format!("`set {lhs}` to a value that is not true or false")),
        };
        // The fields a duration or a flag sets, one arm each.
        let duration_field: Option<fn(&mut Rule) -> &mut Option<Duration>> =
            match (phase, lower.as_str()) {
                (Phase::Request, "req.grace") => Some(|r| &mut r.request_grace),
                (Phase::BackendResponse, "beresp.ttl") => Some(|r| &mut r.ttl),
                (Phase::BackendResponse, "beresp.grace") => Some(|r| &mut r.grace),
                (Phase::BackendResponse, "beresp.keep") => Some(|r| &mut r.keep),
                _ => None,
            };
        if let Some(field) = duration_field {
            *field(rule) = Some(dur()?);
            return Ok(Some(Flow::On));
        }
        let flag_field: Option<fn(&mut Rule) -> &mut Option<bool>> = match (phase, lower.as_str()) {
            (Phase::BackendResponse, "beresp.do_esi") => Some(|r| &mut r.esi),
            (Phase::BackendResponse, "beresp.do_gzip") => Some(|r| &mut r.compress),
            _ => None,
        };
        if let Some(field) = flag_field {
            *field(rule) = Some(flag()?);
            return Ok(Some(Flow::On));
        }
        match (phase, lower.as_str()) {
            (Phase::Request, "req.url") => self.set_url(value, rule, line),
            (Phase::Request, "req.backend_hint" | "req.backend") => match value {
                Expr::Var(name) => {
                    rule.backend = Some(name.clone());
                    Ok(Some(Flow::On))
                }
                Expr::Call(f, args) if args.is_empty() && f.ends_with(".backend") => {
                    rule.backend = Some(f.trim_end_matches(".backend").to_owned());
                    Ok(Some(Flow::On))
                }
                _ => Err("a backend chosen by an expression".into()),
            },
            (Phase::BackendResponse, "beresp.uncacheable") => {
                if flag()? {
                    rule.store = Some(false);
                }
                Ok(Some(Flow::On))
            }
            (Phase::BackendResponse, "beresp.do_stream") => {
                self.unneeded(line, "lacquerd always streams a response as it arrives");
                Ok(None)
            }
            (_, "req.http.grace") => Err("a header Varnish's vcl_hit reads".into()),
            _ => Err(format!("no rule sets {lhs} in {sub}")),
        }
    }

    fn set_header(
        &mut self,
        phase: Phase,
        h: &str,
        value: &Expr,
        rule: &mut Rule,
        line: usize,
    ) -> Result<Option<Flow>, String> {
        if phase == Phase::Request && h == "host" {
            let normalises = match value {
                Expr::Call(f, args) if f == "std.tolower" => {
                    matches!(args.first(), Some(Expr::Var(v)) if v.eq_ignore_ascii_case("req.http.host"))
                }
                Expr::Call(f, args) if f == "regsub" => {
                    matches!(args.as_slice(), [Expr::Var(v), Expr::Str(re), Expr::Str(to)]
                        if v.eq_ignore_ascii_case("req.http.host") && re.starts_with(":[0-9]") && to.is_empty())
                }
                _ => false,
            };
            if normalises {
                rule.normalize_host = true;
                return Ok(Some(Flow::On));
            }
        }
        if phase == Phase::Request && h == "cookie" {
            return match value {
                Expr::Call(f, args) if f == "regsuball" || f == "regsub" => match args.as_slice() {
                    [Expr::Var(v), Expr::Str(re), Expr::Str(to)]
                        if v.eq_ignore_ascii_case("req.http.cookie")
                            && (to.is_empty() || kept_cookies(re, to).is_some() || is_cookie_tidying(re)) =>
                    {
                        if let Some(names) = kept_cookies(re, to) {
                            let filter = rule.cookies.get_or_insert_with(CookieFilter::default);
                            filter.keep.extend(names);
                            Ok(Some(Flow::On))
                        } else if let Some((names, left)) = dropped_cookies(re) {
                            // Dropping fewer cookies than the VCL keeps more requests apart: never
                            // shares what Varnish would not.
                            if !left.is_empty() {
                                self.untranslated(
                                    line,
                                    &format!("the cookies {}", left.join(", ")),
                                    "a name written as a regular expression: add the names it stands \
                                     for to `cookies.drop` (the others are dropped)",
                                );
                            }
                            if names.is_empty() {
                                return Ok(None);
                            }
                            let filter = rule.cookies.get_or_insert_with(CookieFilter::default);
                            filter.drop.extend(names);
                            Ok(Some(Flow::On))
                        } else if is_cookie_tidying(re) {
                            self.unneeded(line, "lacquerd drops empty cookies and `Cookie` when none is left");
                            Ok(None)
                        } else {
                            Err("a Cookie rewritten by a regular expression: use `cookies = { keep = [...] }` or `{ drop = [...] }`".into())
                        }
                    }
                    _ => Err("a Cookie rewritten by a regular expression: use `cookies = { keep = [...] }` or `{ drop = [...] }`".into()),
                },
                // The keep-list idiom's first step (`";" + req.http.Cookie`).
                Expr::Concat(parts)
                    if matches!(parts.as_slice(), [Expr::Str(sep), Expr::Var(v)] if sep == ";" && v.eq_ignore_ascii_case("req.http.cookie")) =>
                {
                    self.unneeded(line, "a step of the cookie keep-list idiom: `cookies = { keep = [...] }` does it whole");
                    Ok(None)
                }
                _ => Err("`Cookie` built from other values: use `cookies = { keep = [...] }` or `{ drop = [...] }`".into()),
            };
        }
        if phase == Phase::Deliver {
            if let Expr::Var(v) = value {
                if matches!(v.as_str(), "obj.hits" | "obj.ttl") {
                    rule.debug_headers = true;
                    return Ok(Some(Flow::On));
                }
            }
        }
        let template = template(value, phase)?;
        rule.unset_headers.retain(|x| x != h);
        rule.set_headers.insert(h.to_owned(), template);
        Ok(Some(Flow::On))
    }

    fn set_url(
        &mut self,
        value: &Expr,
        rule: &mut Rule,
        line: usize,
    ) -> Result<Option<Flow>, String> {
        match value {
            Expr::Call(f, args) if f == "std.querysort" => {
                let q = rule.query.get_or_insert_with(QueryRewrite::default);
                q.sort = true;
                q.sort_values = true;
                Ok(Some(Flow::On))
            }
            Expr::Call(f, args) if f == "regsub" || f == "regsuball" => {
                let [Expr::Var(v), Expr::Str(re), Expr::Str(to)] = args.as_slice() else {
                    return Err("regsub of something other than req.url into req.url".into());
                };
                if !v.eq_ignore_ascii_case("req.url") {
                    return Err("regsub of something other than req.url into req.url".into());
                }
                if to.is_empty() && is_url_tidying(re) {
                    self.unneeded(
                        line,
                        "lacquerd already drops a scheme and host, a #fragment and an empty `?` from the target",
                    );
                    return Ok(None);
                }
                if f == "regsuball" && to.is_empty() {
                    if let Some((names, left)) = dropped_parameters(re) {
                        if !left.is_empty() {
                            self.untranslated(
                                line,
                                &format!("the parameters {}", left.join(", ")),
                                "a name written as a regular expression: add the names it stands for \
                                 to `query.drop` (the others are dropped)",
                            );
                        }
                        if names.is_empty() {
                            return Ok(None);
                        }
                        let q = rule.query.get_or_insert_with(QueryRewrite::default);
                        q.drop.extend(names);
                        return Ok(Some(Flow::On));
                    }
                    return Err("query parameters removed by a regular expression: list them in `query = { drop = [...] }`".into());
                }
                if re.contains("\\?") || to.contains('?') {
                    return Err("a rewrite of the query: use `query = { drop = [...] }`, `keep` or `remove`".into());
                }
                if !to.starts_with('/') && !to.starts_with('\\') {
                    return Err("a rewrite of the URL into something that is not a path".into());
                }
                if f == "regsuball" && !re.starts_with('^') {
                    return Err("regsuball on the URL replaces every match; `rewrite_path` replaces the first".into());
                }
                rule.rewrite_path = Some(Rewrite {
                    from: re.clone(),
                    to: groups(to),
                });
                Ok(Some(Flow::On))
            }
            _ => Err("req.url set to an expression".into()),
        }
    }

    fn returns(
        &mut self,
        sub: &str,
        phase: Phase,
        action: &Expr,
        rule: &mut Rule,
        line: usize,
    ) -> Result<Option<Flow>, String> {
        match (phase, action) {
            (Phase::Request, Expr::Var(a)) if a == "pass" => {
                rule.pass = true;
                Ok(Some(Flow::Returned))
            }
            (Phase::Request, Expr::Var(a)) if a == "pipe" => {
                rule.pipe = true;
                Ok(Some(Flow::Returned))
            }
            (Phase::Request, Expr::Var(a)) if a == "hash" || a == "lookup" => {
                Ok(Some(Flow::Returned))
            }
            (Phase::Request, Expr::Var(a)) if a == "purge" => {
                rule.purge = Some(PurgeScope::Url);
                Ok(Some(Flow::Returned))
            }
            (Phase::Request | Phase::Deliver, Expr::Call(f, args)) if f == "synth" => {
                let code = match args.first() {
                    Some(Expr::Num(n)) => n.parse::<u16>().map_err(|_| format!("status {n}"))?,
                    _ => return Err("synth with a status that is not a number".into()),
                };
                let reason = args.get(1);
                if code == 200 && !rule.ban.is_empty() {
                    // A rule's ban answers `200 Purged` itself.
                    self.unneeded(line, "a rule's `ban` answers 200 itself");
                    return Ok(Some(Flow::Returned));
                }
                if code == 405 && rule.pass && phase == Phase::Request {
                    return Ok(Some(Flow::Returned));
                }
                rule.respond = Some(self.respond(code, reason, phase)?);
                Ok(Some(Flow::Returned))
            }
            (Phase::BackendResponse, Expr::Var(a)) if a == "deliver" => Ok(Some(Flow::Returned)),
            (Phase::BackendResponse, Expr::Call(f, _)) if f == "pass" => {
                rule.store = Some(false);
                Ok(Some(Flow::Returned))
            }
            (Phase::Deliver | Phase::Error, Expr::Var(a)) if a == "deliver" => {
                Ok(Some(Flow::Returned))
            }
            (_, a) => Err(format!(
                "return ({}) in {sub} has no rule (restarts and retries are lacquerd's own)",
                shown_expr(a)
            )),
        }
    }

    fn respond(&self, code: u16, reason: Option<&Expr>, phase: Phase) -> Result<Respond, String> {
        let case = self.synth.get(&code).cloned().unwrap_or_default();
        let mut respond = Respond {
            status: Some(case.status.unwrap_or(code)),
            location: None,
            body: None,
            file: None,
            content_type: None,
            headers: BTreeMap::new(),
        };
        if case.location_is_reason {
            respond.location = reason.map(|r| template(r, phase)).transpose()?;
        }
        for (name, value) in &case.headers {
            let value = template(value, phase)?;
            if name.eq_ignore_ascii_case("content-type") {
                respond.content_type = Some(value);
            } else if name.eq_ignore_ascii_case("location") {
                respond.location = Some(value);
            } else {
                respond.headers.insert(name.to_ascii_lowercase(), value);
            }
        }
        match &case.body {
            Some(Expr::Call(f, args)) if f == "std.fileread" => match args.first() {
                Some(Expr::Str(path)) => respond.file = Some(path.into()),
                _ => return Err("std.fileread of a path that is not a string".into()),
            },
            Some(body) => respond.body = Some(template(body, phase)?),
            None if !case.location_is_reason => {
                respond.body = reason.map(|r| template(r, phase)).transpose()?;
            }
            None => {}
        }
        if code >= 700 && case.status.is_none() {
            return Err(format!(
                "synth({code}) with no vcl_synth case for it (resp.status == {code})"
            ));
        }
        Ok(respond)
    }

    fn call(
        &mut self,
        sub: &str,
        name: &str,
        args: &[Expr],
        rule: &mut Rule,
        line: usize,
    ) -> Result<Option<Flow>, String> {
        match name {
            "hash_data" => {
                let Some(arg) = args.first() else {
                    return Err("hash_data without a value".into());
                };
                match arg {
                    Expr::Var(v) if matches!(v.to_ascii_lowercase().as_str(), "req.url" | "req.http.host") => {
                        self.unneeded(line, "the key is the host and the URL already");
                        Ok(None)
                    }
                    Expr::Var(v) => match v.to_ascii_lowercase().strip_prefix("req.http.") {
                        Some("") => Err(format!("{v} names no header (a template's placeholder?)")),
                        Some(h) => {
                            if !rule.key.iter().any(|k| k == h) {
                                rule.key.push(h.to_owned());
                            }
                            Ok(Some(Flow::On))
                        }
                        None => Err(format!("no rule keys on {v}")),
                    },
                    Expr::Call(f, inner) if f == "regsub" => match inner.as_slice() {
                        [Expr::Var(v), Expr::Str(re), Expr::Str(to)]
                            if v.eq_ignore_ascii_case("req.http.cookie") && to == "\\1" =>
                        {
                            match cookie_value_name(re) {
                                Some(cookie) => {
                                    rule.key_cookie_values.push(cookie);
                                    rule.forward_all_cookies = true;
                                    Ok(Some(Flow::On))
                                }
                                None => Err("a key on a part of Cookie that is not one cookie's value".into()),
                            }
                        }
                        _ => Err("a key on a rewritten value".into()),
                    },
                    Expr::Str(_) => Err(
                        "a constant in the key: key on the header the condition reads instead (`key = [...]`)"
                            .into(),
                    ),
                    _ => Err("a key on an expression".into()),
                }
            }
            "ban" => {
                let entry = match args.first() {
                    Some(Expr::Concat(parts)) => ban_entry(parts),
                    _ => None,
                };
                match entry {
                    Some(entry) => {
                        rule.ban.push(entry);
                        Ok(Some(Flow::On))
                    }
                    None => Err(
                        "a ban other than `obj.http.X ~ req.http.Y` or the request's host and URL"
                            .into(),
                    ),
                }
            }
            "std.collect" => {
                self.unneeded(
                    line,
                    "lacquerd joins a header's lines itself (Cookie with `; `)",
                );
                Ok(None)
            }
            "synthetic" if sub == "vcl_backend_error" => {
                let body = args.first().ok_or("synthetic without a body")?;
                let respond = rule.respond.get_or_insert_with(|| Respond {
                    status: None,
                    location: None,
                    body: None,
                    file: None,
                    content_type: None,
                    headers: BTreeMap::new(),
                });
                match body {
                    Expr::Call(f, a) if f == "std.fileread" => match a.first() {
                        Some(Expr::Str(path)) => respond.file = Some(path.into()),
                        _ => return Err("std.fileread of a path that is not a string".into()),
                    },
                    other => respond.body = Some(template(other, Phase::Error)?),
                }
                if let Some(ct) = rule.set_headers.remove("content-type") {
                    respond.content_type = Some(ct);
                }
                Ok(Some(Flow::On))
            }
            other => Err(format!("{other}() has no rule")),
        }
    }

    /// Bans made in sibling branches on the presence of their own header (Magento's `if
    /// (req.http.X-Magento-Tags-Pattern) { ban(…) } if (req.http.X-Pool) { ban(…) }`) are one rule here:
    /// a rule's `ban` skips an entry whose header is absent, and the last matching rule's bans are the
    /// ones made.
    fn merge_bans(&mut self) {
        let mut i = 0;
        while i + 1 < self.out.rules.len() {
            let (a, b) = (&self.out.rules[i].value, &self.out.rules[i + 1].value);
            let mergeable = |r: &Rule| {
                r.ban.len() == 1
                    && r.when.headers.len() == 1
                    && r.when
                        .headers
                        .iter()
                        .all(|(h, re)| re.is_empty() && r.ban[0].regex_from.eq_ignore_ascii_case(h))
            };
            let same_rest = |x: &Rule, y: &Rule| {
                let mut x = x.clone();
                let mut y = y.clone();
                x.when.headers.clear();
                y.when.headers.clear();
                x.ban.clear();
                y.ban.clear();
                x.name = None;
                y.name = None;
                x == y
            };
            // `return (synth(200, "Purged"))` after the bans: a rule's ban answers so itself.
            let answers_ok = |r: &Rule| {
                r.respond.as_ref().and_then(|x| x.status) == Some(200) && r.ban.is_empty()
            };
            if !a.ban.is_empty() && answers_ok(b) && a.on == b.on && a.when == b.when {
                let dropped = self.out.rules.remove(i + 1);
                self.unneeded(
                    dropped.lines.0,
                    "a rule's `ban` answers `200 Purged` itself",
                );
                continue;
            }
            if a.on == b.on && mergeable(a) && mergeable(b) && same_rest(a, b) {
                let next = self.out.rules.remove(i + 1);
                let first = &mut self.out.rules[i];
                first.value.when.headers.clear();
                first.value.ban.extend(next.value.ban);
                first.lines.1 = next.lines.1;
                continue;
            }
            i += 1;
        }
        // The ACL that answers `PURGE` and `BAN` from outside with 405 is `[purge] allow_from`: a rule's
        // ban or purge answers 405 itself to a client outside it.
        let guards: Vec<usize> = self
            .out
            .rules
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                let r = &r.value;
                !r.when.except_clients.is_empty()
                    && r.respond.as_ref().and_then(|x| x.status) == Some(405)
                    && r.when.methods.iter().all(|m| m == "PURGE" || m == "BAN")
                    && !r.when.methods.is_empty()
            })
            .map(|(i, _)| i)
            .collect();
        for &i in guards.iter().rev() {
            let rule = self.out.rules.remove(i);
            let nets = rule.value.when.except_clients.clone();
            match &mut self.out.purge_allow {
                Some(p) if p.value == nets => {}
                Some(_) => self.untranslated(
                    rule.lines.0,
                    "",
                    "a second ACL guards PURGE or BAN: [purge] allow_from is one list",
                ),
                None => {
                    self.out.purge_allow = Some(Piece {
                        value: nets,
                        from: rule.from.clone(),
                        lines: rule.lines,
                    })
                }
            }
        }
    }
}

/// A request header written from a chain of cases, as VCL writes one.
enum HeaderIdiom {
    /// `if (req.http.A ~ "re1") { set req.http.B = "v1"; } elsif … else { set req.http.B = "d"; }`: a
    /// rule's `buckets` (devicedetect, Accept-Language classes).
    Bucket(Bucket),
    /// `if (std.port(server.ip) == 443) { set req.http.H = "https"; } else { set req.http.H = "http"; }`:
    /// `H = "${scheme}"`.
    Scheme(String),
}

/// Whether `stmt` is one of the header idioms.
fn header_idiom(stmt: &Stmt) -> Option<HeaderIdiom> {
    let Stmt::If {
        branches,
        otherwise: Some(otherwise),
        ..
    } = stmt
    else {
        return None;
    };
    let constant = |body: &[Stmt]| match body {
        [Stmt::Set {
            lhs,
            op: "=",
            value: Expr::Str(v),
            ..
        }] => lhs
            .to_ascii_lowercase()
            .strip_prefix("req.http.")
            .map(|h| (h.to_owned(), v.clone())),
        _ => None,
    };
    let (to, default) = constant(otherwise)?;
    if let [(Cond::Cmp(Expr::Call(f, args), "==", Expr::Num(port)), body)] = branches.as_slice() {
        let (h, v) = constant(body)?;
        let on_server = matches!(args.as_slice(), [Expr::Var(s)] if s == "server.ip");
        if f == "std.port"
            && on_server
            && port == "443"
            && h == to
            && v == "https"
            && default == "http"
        {
            return Some(HeaderIdiom::Scheme(h));
        }
        return None;
    }
    let mut from = None;
    let mut cases = Vec::new();
    for (cond, body) in branches {
        let Cond::Cmp(Expr::Var(v), "~", Expr::Str(re)) = cond else {
            return None;
        };
        let read = v.to_ascii_lowercase().strip_prefix("req.http.")?.to_owned();
        if from.get_or_insert_with(|| read.clone()) != &read {
            return None;
        }
        let (h, value) = constant(body)?;
        if h != to {
            return None;
        }
        cases.push((value, re.clone()));
    }
    let from = from?;
    Some(HeaderIdiom::Bucket(Bucket {
        to: (to != from).then_some(to),
        from,
        cases,
        default,
    }))
}

/// A bound on the freshness, as VCL writes one.
enum TtlIdiom {
    /// `if (beresp.ttl > D) { set beresp.ttl = D; }`: `ttl_max`.
    Max,
    /// `if (beresp.ttl > 0s && beresp.ttl < D) { set beresp.ttl = D; }`: `ttl_min`.
    Min,
    /// `if (!beresp.http.Cache-Control && !beresp.http.Expires) { set beresp.ttl = D; }`: `default_ttl`.
    Default,
}

/// Whether `stmt` is one of the freshness bounds VCL writes (an `if` of one branch setting `beresp.ttl`
/// alone); with the other conditions of the branch, when it has some.
fn ttl_idiom(stmt: &Stmt) -> Option<(TtlIdiom, Duration, Option<Cond>)> {
    let Stmt::If {
        branches,
        otherwise: None,
        ..
    } = stmt
    else {
        return None;
    };
    let [(cond, body)] = branches.as_slice() else {
        return None;
    };
    let [Stmt::Set {
        lhs,
        op: "=",
        value: Expr::Num(d),
        ..
    }] = body.as_slice()
    else {
        return None;
    };
    if lhs != "beresp.ttl" {
        return None;
    }
    let d = duration(d)?;
    let leaves: Vec<&Cond> = match cond {
        Cond::And(cs) => cs.iter().collect(),
        c => vec![c],
    };
    let ttl = |c: &Cond, want: &str| match c {
        Cond::Cmp(Expr::Var(v), op, Expr::Num(n)) if v == "beresp.ttl" && *op == want => {
            duration(n)
        }
        _ => None,
    };
    let absent = |c: &Cond, name: &str| matches!(c, Cond::Not(inner) if matches!(&**inner, Cond::Truthy(Expr::Var(v)) if v.eq_ignore_ascii_case(name)));
    let rest = |used: &[usize]| {
        let others: Vec<Cond> = leaves
            .iter()
            .enumerate()
            .filter(|(i, _)| !used.contains(i))
            .map(|(_, c)| (*c).clone())
            .collect();
        match others.len() {
            0 => None,
            1 => others.into_iter().next(),
            _ => Some(Cond::And(others)),
        }
    };
    if let Some(i) = leaves.iter().position(|c| ttl(c, ">") == Some(d)) {
        if !leaves.iter().any(|c| ttl(c, "<").is_some()) {
            return Some((TtlIdiom::Max, d, rest(&[i])));
        }
    }
    if let Some(i) = leaves.iter().position(|c| ttl(c, "<") == Some(d)) {
        let zero = leaves
            .iter()
            .position(|c| ttl(c, ">") == Some(Duration::ZERO));
        let used: Vec<usize> = [Some(i), zero].into_iter().flatten().collect();
        return Some((TtlIdiom::Min, d, rest(&used)));
    }
    let cc = leaves
        .iter()
        .position(|c| absent(c, "beresp.http.Cache-Control"));
    let ex = leaves.iter().position(|c| absent(c, "beresp.http.Expires"));
    if let (Some(a), Some(b)) = (cc, ex) {
        return Some((TtlIdiom::Default, d, rest(&[a, b])));
    }
    None
}

/// A deliver outcome condition: `yes` the listed outcomes, otherwise the others.
fn outcome<'a>(
    set: &mut Option<BTreeSet<&'a str>>,
    yes: bool,
    listed: &[&'a str],
    phase: Phase,
) -> Result<(), String> {
    if phase != Phase::Deliver {
        return Err("obj.hits and obj.uncacheable are read in vcl_deliver only here".into());
    }
    let all = set.get_or_insert_with(|| OUTCOMES.into_iter().collect());
    all.retain(|o| listed.contains(o) == yes);
    Ok(())
}

/// A set of statuses as the patterns a rule's `status` takes: whole classes as `"5xx"`, the rest as codes.
fn status_patterns(set: &BTreeSet<u16>) -> Result<Vec<StatusPattern>, String> {
    let mut out = Vec::new();
    for class in 1..=5u16 {
        let all: Vec<u16> = (class * 100..class * 100 + 100).collect();
        let held: Vec<u16> = all.iter().copied().filter(|s| set.contains(s)).collect();
        if held.len() == all.len() {
            out.push(StatusPattern::Text(format!("{class}xx")));
        } else {
            out.extend(held.into_iter().map(StatusPattern::Code));
        }
    }
    if out.len() > 20 {
        return Err("a status condition that is neither codes nor classes".into());
    }
    Ok(out)
}

/// A template for a value: literal text (`$` written `$$`), and the values a template has.
fn template(value: &Expr, phase: Phase) -> Result<String, String> {
    match value {
        Expr::Str(s) => Ok(s.replace('$', "$$")),
        Expr::Num(n) => Ok(n.clone()),
        Expr::Concat(parts) => parts.iter().map(|p| template(p, phase)).collect(),
        Expr::Var(v) => {
            let lower = v.to_ascii_lowercase();
            let response = matches!(
                phase,
                Phase::BackendResponse | Phase::Deliver | Phase::Error
            );
            match lower.as_str() {
                "client.ip" => Ok("${client_ip}".into()),
                "req.url" | "bereq.url" => Ok("${target}".into()),
                "req.http.host" | "bereq.http.host" => Ok("${host}".into()),
                "req.method" | "bereq.method" => Ok("${method}".into()),
                "beresp.status" | "resp.status" if response => Ok("${status}".into()),
                _ => {
                    for prefix in ["beresp.http.", "resp.http.", "obj.http."] {
                        if let Some(h) = v.get(prefix.len()..).filter(|_| lower.starts_with(prefix))
                        {
                            if response {
                                return Ok(format!("${{resp.{h}}}"));
                            }
                        }
                    }
                    Err(format!("a value made of {v}, which no template reads"))
                }
            }
        }
        other => Err(format!("a value made of {}", shown_expr(other))),
    }
}

/// `\1` in a VCL replacement, `$1` in a rule's.
fn groups(to: &str) -> String {
    let mut out = String::new();
    let mut chars = to.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek().is_some_and(char::is_ascii_digit) => {
                out.push('$');
                out.push(chars.next().expect("digit"));
            }
            '$' => out.push_str("$$"),
            c => out.push(c),
        }
    }
    out
}

/// A VCL duration (`120s`, `3d`, `1.5h`, `100ms`; a bare number is seconds).
pub(crate) fn duration(text: &str) -> Option<Duration> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (n, unit) = text.split_at(split);
    let n: f64 = n.parse().ok()?;
    let seconds = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86400.0,
        "w" => n * 7.0 * 86400.0,
        "y" => n * 365.0 * 86400.0,
        _ => return None,
    };
    Some(Duration::from_secs_f64(seconds))
}

/// The names a regular expression of alternatives lists (`(utm_[a-z]+|gclid|_ga[^=]*)`), as rule names
/// (`utm_*`, `gclid`, `_ga*`); `None` when an alternative is more than a name and a trailing class.
fn names_of(alternation: &str) -> Option<Vec<String>> {
    let inner = alternation
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .unwrap_or(alternation);
    let mut names = Vec::new();
    for alt in inner.split('|') {
        let (name, wild) = match alt.find('[') {
            Some(i) => {
                let class = &alt[i..];
                let repeats = class.ends_with("]+") || class.ends_with("]*");
                if !repeats || class[1..class.len() - 2].contains(']') {
                    return None;
                }
                (&alt[..i], true)
            }
            None => (alt, false),
        };
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return None;
        }
        names.push(if wild {
            format!("{name}*")
        } else {
            name.to_owned()
        });
    }
    Some(names)
}

/// The parameters a URL `regsuball(…, "(NAMES)=[…]+&?", "")` removes, as names; and the alternatives
/// that are more than a name.
fn dropped_parameters(re: &str) -> Option<(Vec<String>, Vec<String>)> {
    let eq = re.rfind(")=")?;
    let rest = &re[eq + 2..];
    if !(rest.starts_with('[') && (rest.ends_with("+&?") || rest.ends_with("*&?"))) {
        return None;
    }
    Some(split_names(re[..eq].strip_prefix('(')?))
}

/// The alternatives of `inner` that are names (as rule names), and those that are more than a name.
fn split_names(inner: &str) -> (Vec<String>, Vec<String>) {
    let (mut names, mut left) = (Vec::new(), Vec::new());
    for alt in alternatives(inner) {
        match names_of(alt) {
            Some(n) => names.extend(n),
            None => left.push(alt.to_owned()),
        }
    }
    (names, left)
}

/// The top-level alternatives of a regular expression (`a|(b|c)d` is `a` and `(b|c)d`).
fn alternatives(re: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    let bytes = re.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 1,
            b'(' | b'[' => depth += 1,
            b')' | b']' => depth -= 1,
            b'|' if depth == 0 => {
                out.push(&re[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    out.push(&re[start..]);
    out
}

/// The cookies a `regsuball(req.http.Cookie, "(^|;\s*)(NAMES)=[^;]*", "")` removes, as names; and the
/// alternatives that are more than a name.
fn dropped_cookies(re: &str) -> Option<(Vec<String>, Vec<String>)> {
    let rest = re
        .strip_prefix("(^|;\\s*)")
        .or_else(|| re.strip_prefix("(^|; )"))
        .or_else(|| re.strip_prefix("(^|;)"))?;
    let eq = rest.rfind(")=")?;
    if &rest[eq + 2..] != "[^;]*" {
        return None;
    }
    Some(split_names(rest[..eq].strip_prefix('(')?))
}

/// Cookie rewrites that only tidy separators, which lacquerd's cookie handling does anyway, or the steps
/// of the keep-list idiom (Varnish's FAQ) around the one that names the cookies kept.
fn is_cookie_tidying(re: &str) -> bool {
    matches!(
        re,
        "^;\\s*" | "^;+\\s*" | "^[; ]+|[; ]+$" | "; +" | ";[^ ][^;]*"
    )
}

/// The cookies the keep-list idiom keeps: `regsuball(req.http.Cookie, ";(NAMES)=", "; \1=")`.
fn kept_cookies(re: &str, to: &str) -> Option<Vec<String>> {
    let names = re.strip_prefix(';')?.strip_suffix('=')?;
    (to == "; \\1=").then(|| names_of(names)).flatten()
}

/// URL rewrites that only tidy what lacquerd's target normalisation removes anyway.
fn is_url_tidying(re: &str) -> bool {
    matches!(
        re,
        "^http[s]?://" | "^https?://" | "\\#.*$" | "#.*$" | "\\?$" | "[?|&]+$" | "[?&]+$" | "\\?&"
    )
}

/// The cookies a condition `req.http.Cookie ~ RE` asks for, when it asks for cookies by name:
/// `X-Magento-Vary=`, `(^|;\s*)beta=1(;|$)` is not one (it reads a value).
fn cookie_names(re: &str) -> Option<Vec<String>> {
    let rest = re
        .strip_prefix("(^|;\\s*)")
        .or_else(|| re.strip_prefix("(^|; )"))
        .unwrap_or(re);
    let rest = rest.strip_suffix('=')?;
    names_of(rest)
}

/// The cookie whose value `regsub(req.http.cookie, "^.*?NAME=([^;]+);*.*$", "\1")` keeps.
fn cookie_value_name(re: &str) -> Option<String> {
    let rest = re.strip_prefix("^.*?").or_else(|| re.strip_prefix(".*"))?;
    let (name, after) = rest.split_once("=([^;]+)")?;
    (after.starts_with(";*") || after.starts_with(";") || after.is_empty())
        .then(|| name.to_owned())
        .filter(|n| {
            n.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        })
}

/// `ban("obj.http.X ~ " + req.http.Y)`, or `ban("req.http.host == " + req.http.host + " && req.url ~ "
/// + req.url)`.
fn ban_entry(parts: &[Expr]) -> Option<BanFromRequest> {
    match parts {
        [Expr::Str(head), Expr::Var(v)] => {
            let header = head.strip_prefix("obj.http.")?.strip_suffix(" ~ ")?;
            let from = v.strip_prefix("req.http.")?;
            Some(BanFromRequest {
                object_header: Some(header.to_owned()),
                url: false,
                regex_from: from.to_owned(),
            })
        }
        [Expr::Str(a), Expr::Var(host), Expr::Str(b), Expr::Var(url)]
            if a.trim() == "req.http.host =="
                && host.eq_ignore_ascii_case("req.http.host")
                && b.trim() == "&& req.url ~"
                && url == "req.url" =>
        {
            Some(BanFromRequest {
                object_header: None,
                url: true,
                regex_from: "path".into(),
            })
        }
        _ => None,
    }
}

/// The header a request field and a response field name alike (`bereq.http.X-Id`, `beresp.http.X-Id`).
fn same_header_pair(a: &str, b: &str) -> Option<String> {
    let a = a.to_ascii_lowercase();
    let b = b.to_ascii_lowercase();
    let req = a
        .strip_prefix("bereq.http.")
        .or_else(|| a.strip_prefix("req.http."))?;
    let resp = b
        .strip_prefix("beresp.http.")
        .or_else(|| b.strip_prefix("resp.http."))
        .or_else(|| b.strip_prefix("obj.http."))?;
    (req == resp && !req.is_empty()).then(|| req.to_owned())
}

/// The request header a leaf reads, when it reads one.
fn header_read(c: &Cond) -> Option<String> {
    let v = match c {
        Cond::Cmp(Expr::Var(v), _, _) | Cond::Truthy(Expr::Var(v)) => v,
        _ => return None,
    };
    v.to_ascii_lowercase()
        .strip_prefix("req.http.")
        .map(str::to_owned)
}

fn stmt_line(stmt: &Stmt) -> usize {
    match stmt {
        Stmt::If { lines, .. } => lines.0,
        Stmt::Set { line, .. }
        | Stmt::Unset { line, .. }
        | Stmt::Return { line, .. }
        | Stmt::Call { line, .. }
        | Stmt::CallSub { line, .. }
        | Stmt::Other { line, .. } => *line,
    }
}

fn short(sub: &str) -> &str {
    match sub {
        "vcl_recv" => "recv",
        "vcl_hash" => "hash",
        "vcl_backend_fetch" => "bereq",
        "vcl_backend_response" => "beresp",
        "vcl_deliver" => "deliver",
        "vcl_backend_error" => "error",
        other => other,
    }
}

fn shown_expr(e: &Expr) -> String {
    match e {
        Expr::Var(v) => v.clone(),
        Expr::Str(s) => format!("{s:?}"),
        Expr::Num(n) => n.clone(),
        Expr::Call(f, args) => format!(
            "{f}({})",
            args.iter().map(shown_expr).collect::<Vec<_>>().join(", ")
        ),
        Expr::Concat(parts) => parts.iter().map(shown_expr).collect::<Vec<_>>().join(" + "),
        Expr::Arith(a, op, b) => format!("{} {op} {}", shown_expr(a), shown_expr(b)),
    }
}

fn shown_cond(c: &Cond) -> String {
    match c {
        Cond::Cmp(a, op, b) => format!("{} {op} {}", shown_expr(a), shown_expr(b)),
        Cond::Truthy(a) => shown_expr(a),
        Cond::Not(c) => format!("!{}", shown_cond(c)),
        Cond::And(cs) => cs.iter().map(shown_cond).collect::<Vec<_>>().join(" && "),
        Cond::Or(cs) => cs.iter().map(shown_cond).collect::<Vec<_>>().join(" || "),
    }
}
