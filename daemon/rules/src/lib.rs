//! `[[rule]]`s compiled once and run at the data path's phases ([`Phase`]): what VCL's `vcl_recv`,
//! `vcl_backend_fetch`, `vcl_backend_response`, `vcl_deliver` and `vcl_synth` say, as a small typed
//! vocabulary of matches and actions over request and response heads. No I/O happens here: the data path
//! calls one function per phase, and `cachectl explain` calls the same ones without the origin.

#![warn(missing_docs)]

mod compile;
mod edit;
mod signed;
mod template;

use std::{
    borrow::Cow,
    net::IpAddr,
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc,
    },
    time::Duration,
};

use bytes::Bytes;
use http::{
    header::{self, HeaderName},
    request::Parts,
    HeaderMap, HeaderValue, StatusCode, Uri,
};

use lacquer_config::Rule;
pub use lacquer_config::{Phase, PurgeScope};
use lacquer_policy::{head::valid_host, host::request_host, normalize, storable::Adjust};

pub use compile::{page_type, read_page, MAX_BODY, MAX_FILE};
use compile::{Body, Compiled, Line, Synthesis};
pub use signed::{sign, sign_nginx_md5, NGINX_EXPRESSION};
use template::Values;

/// A rule that cannot be compiled, named as the file names it.
#[derive(Debug, thiserror::Error)]
#[error("{}: {reason}", self.setting())]
pub struct RulesError {
    /// The rule's place in the file, from 0.
    pub index: usize,
    /// Its `name`, when it has one.
    pub name: Option<String>,
    /// The field at fault, as the file names it (`match.path_regex`); empty for the rule as a whole.
    pub field: String,
    /// Why.
    pub reason: String,
}

impl RulesError {
    /// `rule[3].match.path_regex`, with the rule's name when it has one.
    pub fn setting(&self) -> String {
        let mut s = format!("rule[{}]", self.index);
        if let Some(name) = &self.name {
            s.push_str(&format!(" ({name:?})"));
        }
        if !self.field.is_empty() {
            s.push('.');
            s.push_str(&self.field);
        }
        s
    }
}

/// The compiled rules of one configuration: what a reload replaces whole, counters included.
#[derive(Debug, Default)]
pub struct Rules {
    rules: Vec<Compiled>,
    /// Indices into `rules`, per phase, in file order.
    by_phase: [Vec<usize>; 5],
    /// Matches per rule, in [`SHARDS`] copies: every worker thread counts every request it serves into
    /// one of them, so the threads do not fight over one cache line on each hit.
    matched: Box<[Box<[AtomicU64]>]>,
    /// A rule shows hit counts (asked on every request).
    counts_hits: bool,
    /// Some rule turns Edge Side Includes on (`esi = true`).
    turns_on_esi: bool,
    /// What the rules that edit prepared heads are (a digest of how they are written): a head prepared
    /// under other ones is not theirs to skip, and one prepared before a reload that kept them still is.
    id: u64,
    /// How many deliver rules, from the first, look at nothing but the response
    /// ([`Compiled::response_only`]): on a plain hit they have edited the prepared head already.
    ahead: usize,
    /// How many fields those rules may add to a head.
    edited_fields: usize,
    /// A deliver rule asks how the cache answered ([`Compiled::reads_outcome`]).
    reads_outcome: bool,
}

/// What the deliver rules that look at the response alone did to a prepared head ([`Rules::prepare`]),
/// for the responses sent with it to count and go on from ([`Rules::deliver_prepared`]).
/// Small enough to copy into every response sent with that head.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ahead {
    /// What the rules that made it are ([`Rules::id`]).
    rules: u64,
    /// How many rules were tried, from the phase's first.
    tried: u32,
    /// Which of them matched: bit `n` for the phase's `n`th rule.
    matched: u64,
    /// A rule that matched ended the phase (`stop`).
    stopped: bool,
}

impl Ahead {
    /// What the rules that made it are ([`Rules::id`]).
    pub fn rules(&self) -> u64 {
        self.rules
    }
}

/// Copies of the counters: more than the worker threads of most machines this runs on.
const SHARDS: usize = 16;

/// The counters' copy this thread counts into, given out in turn as threads first count.
fn shard() -> usize {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        static SHARD: usize = (NEXT.fetch_add(1, Relaxed) % SHARDS as u64) as usize;
    }
    SHARD.with(|s| *s)
}

fn slot(phase: Phase) -> usize {
    match phase {
        Phase::Request => 0,
        Phase::BackendRequest => 1,
        Phase::BackendResponse => 2,
        Phase::Deliver => 3,
        Phase::Error => 4,
    }
}

/// One rule's part in a trace: whether it matched in its phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Its place in the file.
    pub index: usize,
    /// Its name (`rule[N]` when it has none).
    pub name: Arc<str>,
    /// Its phase.
    pub phase: Phase,
    /// Whether its conditions held (and its actions ran).
    pub matched: bool,
}

/// What `cachectl explain` records: every rule tried, in the order tried.
#[derive(Debug, Default, Clone)]
pub struct Trace {
    /// The rules tried.
    pub steps: Vec<Step>,
}

/// A response a rule made: the whole of it.
#[derive(Debug, Clone)]
pub struct Synthetic {
    /// Its status.
    pub status: StatusCode,
    /// Its header fields, `Content-Type` and `Location` included (not `Content-Length`).
    pub headers: HeaderMap,
    /// Its body.
    pub body: Bytes,
}

/// What the request phase decided beyond the head it rewrote.
#[derive(Debug, Default)]
pub struct RequestVerdict {
    /// Never looked up or stored (`pass`).
    pub pass: bool,
    /// Tunnelled to the backend (`pipe`).
    pub pipe: bool,
    /// Answered here, without the origin (`respond`).
    pub respond: Option<Synthetic>,
    /// The backend or director chosen instead of the route's.
    pub backend: Option<Arc<str>>,
    /// Request fields the stored response varies on, beyond its `Vary`.
    pub key: Vec<HeaderName>,
    /// Cookies whose values the stored response varies on, every cookie forwarded
    /// (`key_cookie_values`).
    pub key_cookies: Vec<Arc<str>>,
    /// `Set-Cookie` removed from the response (`strip_cookies`).
    pub strip_set_cookie: bool,
    /// Looked up and stored although `Cookie` is sent.
    pub cache_cookies: bool,
    /// The most stale an object in grace may be to be answered at once.
    pub request_grace: Option<Duration>,
    /// `Link` values sent in a `103 Early Hints` when the request goes to the origin (`early_hints`).
    pub early_hints: Vec<HeaderValue>,
    /// The host or path changed: the request is routed again.
    pub rerouted: bool,
    /// A POST body of at most this many bytes is read and keyed (`cache_body`).
    pub cache_body: Option<u64>,
    /// The request is turned into bans or a purge and answered here (`ban`, `purge`).
    pub invalidate: Option<Arc<Invalidation>>,
}

/// What a rule's `ban` and `purge` turn a request into (see `lacquer_config::Rule::ban`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalidation {
    /// The bans, each made when its request field is sent.
    pub bans: Vec<BanTemplate>,
    /// The request's URL purged.
    pub purge: Option<PurgeScope>,
}

/// One ban a request makes: its regular expression, taken from the request, matched against one field of
/// every stored object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BanTemplate {
    /// The stored response header matched (`obj.http.<name>`); `None`: the stored URLs of the request's
    /// host.
    pub object_header: Option<HeaderName>,
    /// Where the expression is taken from.
    pub regex_from: RegexFrom,
}

/// The request field a ban's expression is taken from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegexFrom {
    /// A request header's value.
    Header(HeaderName),
    /// The request's path and query.
    Path,
}

impl RegexFrom {
    /// The expression `parts` carries, if it carries one (a header that is not text carries none).
    pub fn of<'a>(&self, parts: &'a Parts) -> Option<std::borrow::Cow<'a, str>> {
        match self {
            RegexFrom::Header(name) => parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(std::borrow::Cow::Borrowed),
            RegexFrom::Path => Some(match parts.uri.path_and_query() {
                Some(pq) => std::borrow::Cow::Borrowed(pq.as_str()),
                None => std::borrow::Cow::Borrowed("/"),
            }),
        }
    }

    /// How the rule names it: the header's name, or `path`.
    pub fn name(&self) -> &str {
        match self {
            RegexFrom::Header(name) => name.as_str(),
            RegexFrom::Path => "path",
        }
    }
}

/// The client's request a response phase's conditions are tested against: as it was looked up and
/// forwarded, after the request phase.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// Its head.
    pub parts: &'a Parts,
    /// The client's address.
    pub client: IpAddr,
    /// It came over TLS.
    pub secure: bool,
}

/// What `debug_headers` shows.
#[derive(Debug, Clone, Copy, Default)]
pub struct Debug {
    /// Times the object was served from the cache, when it came from the cache.
    pub hits: Option<u64>,
    /// Seconds of freshness left (negative once stale), when it is stored.
    pub ttl_s: Option<i64>,
    /// How the cache answered (`match.outcome`, `${outcome}`); none where no response was made (an
    /// explanation).
    pub outcome: Option<Outcome>,
}

/// How the cache answered a response the deliver phase sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// From the cache, fresh.
    Hit,
    /// From the cache, stale: within grace while refreshed, or standing in for a failing origin.
    Stale,
    /// Fetched, and stored.
    Miss,
    /// Fetched, and not stored (the origin's or a rule's answer forbade it).
    Uncacheable,
    /// Sent to the origin without a lookup.
    Pass,
}

impl Outcome {
    /// Every outcome, by its name.
    pub const ALL: [(&'static str, Outcome); 5] = [
        ("hit", Outcome::Hit),
        ("stale", Outcome::Stale),
        ("miss", Outcome::Miss),
        ("uncacheable", Outcome::Uncacheable),
        ("pass", Outcome::Pass),
    ];

    /// Its name, as `match.outcome` and `${outcome}` write it.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, o)| *o == self)
            .map_or("", |(n, _)| n)
    }
}

/// The response a response phase's conditions look at.
#[derive(Clone, Copy)]
struct Response<'a> {
    status: StatusCode,
    headers: &'a HeaderMap,
    /// How the cache answered, in the deliver phase.
    outcome: Option<Outcome>,
}

/// Header lines a rule writes, with their values for one request.
type Lines<'a> = Vec<(&'a Line, Option<HeaderValue>)>;

impl Rules {
    /// Compiles `rules`; `backends` are the names a rule's `backend` may take (backends and directors).
    /// The error names the rule and its field.
    pub fn compile(rules: &[Rule], backends: &[&str]) -> Result<Self, RulesError> {
        let mut compiled = Vec::with_capacity(rules.len());
        let mut by_phase: [Vec<usize>; 5] = Default::default();
        for (index, rule) in rules.iter().enumerate() {
            let name: Arc<str> = match &rule.name {
                Some(n) => n.as_str().into(),
                None => format!("rule[{index}]").into(),
            };
            if let Some(n) = &rule.name {
                if rules[..index].iter().any(|r| r.name.as_ref() == Some(n)) {
                    return Err(RulesError {
                        index,
                        name: rule.name.clone(),
                        field: "name".into(),
                        reason: "another rule has this name: counters and explain tell rules apart by it"
                            .into(),
                    });
                }
            }
            let c =
                compile::compile(rule, name, backends).map_err(|(field, reason)| RulesError {
                    index,
                    name: rule.name.clone(),
                    field,
                    reason,
                })?;
            by_phase[slot(c.phase)].push(index);
            compiled.push(c);
        }
        let ahead = by_phase[slot(Phase::Deliver)]
            .iter()
            .take(u64::BITS as usize)
            .take_while(|&&i| compiled[i].response_only())
            .count();
        let leading = &by_phase[slot(Phase::Deliver)][..ahead];
        let id = {
            let mut digest = std::hash::DefaultHasher::new();
            for &i in leading {
                std::hash::Hash::hash(&format!("{:?}", rules[i]), &mut digest);
            }
            std::hash::Hasher::finish(&digest)
        };
        let edited_fields = leading
            .iter()
            .map(|&i| compiled[i].actions.set.len() + compiled[i].actions.append.len())
            .sum();
        Ok(Self {
            id,
            ahead,
            edited_fields,
            matched: (0..SHARDS)
                .map(|_| {
                    // At least a cache line each, so that two shards never share one.
                    let len = compiled.len().next_multiple_of(8).max(8);
                    (0..len).map(|_| AtomicU64::new(0)).collect()
                })
                .collect(),
            counts_hits: compiled.iter().any(|r| r.actions.debug_headers),
            turns_on_esi: compiled.iter().any(|r| r.actions.adjust.esi == Some(true)),
            reads_outcome: compiled.iter().any(Compiled::reads_outcome),
            rules: compiled,
            by_phase,
        })
    }

    /// Whether any rule acts in `phase`: the data path skips a phase without rules.
    pub fn has(&self, phase: Phase) -> bool {
        !self.by_phase[slot(phase)].is_empty()
    }

    /// Whether a rule turns Edge Side Includes on: a passed page may then be assembled.
    pub fn turns_on_esi(&self) -> bool {
        self.turns_on_esi
    }

    /// Whether a rule shows hit counts, which the data path then counts.
    pub fn counts_hits(&self) -> bool {
        self.counts_hits
    }

    /// Whether a `debug_headers` rule may show its headers to this request: its conditions on the request
    /// hold (those on the response are tested when it is delivered). The data path carries the numbers to
    /// the deliver phase only then.
    pub fn wants_debug(&self, parts: &Parts, client: IpAddr) -> bool {
        self.counts_hits
            && self.phase(Phase::Deliver).any(|(_, r)| {
                r.actions.debug_headers
                    && matches(
                        r,
                        parts,
                        client,
                        None,
                        &mut Vec::new(),
                        &|_| true,
                        &mut Seen::default(),
                    )
            })
    }

    /// Whether every rule with a path condition, in every phase, reads the request's path the same way as
    /// sent and as `lenient`, its reading by a lenient origin ([`normalize::lenient`]: `;` parameters
    /// dropped, `%2F` and `\` as separators). A rule matches when either reading does, which is right for what it tightens
    /// (`pass`, a `[[deny]]`-like `respond`), but an action that loosens caching (`cache_cookies`, a
    /// longer `ttl`, a `Cache-Control` rewritten to share) must hold for every reading: the data path
    /// passes a request whose readings disagree, so that `/account/me;x.css` is never stored under a rule
    /// for `.css`.
    pub fn readings_agree(&self, parts: &Parts, lenient: &str) -> bool {
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let lenient_path = lenient.split_once('?').map_or(lenient, |(p, _)| p);
        let mut groups = Vec::new();
        self.rules.iter().all(|r| {
            let w = &r.when;
            let on_path =
                !w.path_prefix.is_empty() || !w.extensions.is_empty() || w.path_regex.is_some();
            !on_path
                || path_matches(r, target, parts.uri.path(), &mut groups)
                    == path_matches(r, lenient, lenient_path, &mut groups)
        })
    }

    /// Every rule with its phase and how many requests it matched since it was compiled.
    pub fn counters(&self) -> impl Iterator<Item = (&str, Phase, u64)> + '_ {
        self.rules.iter().enumerate().map(|(i, r)| {
            let n = self
                .matched
                .iter()
                .map(|shard| shard[i].load(Relaxed))
                .sum();
            (&*r.name, r.phase, n)
        })
    }

    fn phase(&self, phase: Phase) -> impl Iterator<Item = (usize, &Compiled)> + '_ {
        self.by_phase[slot(phase)]
            .iter()
            .map(move |&i| (i, &self.rules[i]))
    }

    /// Tests a rule of a phase after the request one on `facts` (and the response, for the response
    /// phases), counting or tracing it; its path groups when it matched.
    fn tried(
        &self,
        index: usize,
        rule: &Compiled,
        facts: Facts<'_>,
        response: Option<Response<'_>>,
        trace: &mut Option<&mut Trace>,
        seen: &mut Seen,
    ) -> Option<Vec<String>> {
        let mut groups = Vec::new();
        let hit = matches(
            rule,
            facts.parts,
            facts.client,
            response,
            &mut groups,
            &|_| true,
            seen,
        );
        self.record(index, hit, trace);
        hit.then_some(groups)
    }

    /// Counts one rule's test, or traces it: a traced run (`cachectl explain`, an example) is not a
    /// request and moves no counter.
    fn record(&self, index: usize, matched: bool, trace: &mut Option<&mut Trace>) {
        if matched && trace.is_none() {
            self.matched[shard()][index].fetch_add(1, Relaxed);
        }
        if let Some(t) = trace {
            let r = &self.rules[index];
            t.steps.push(Step {
                index,
                name: r.name.clone(),
                phase: r.phase,
                matched,
            });
        }
    }

    /// The request phase: rewrites the client's head in place (what the key, the variant and the origin
    /// are made of from here on) and says what else the rules decided. `healthy` tells whether the backend
    /// the request would go to (`Some` name when a rule chose one) is healthy.
    pub fn request(
        &self,
        parts: &mut Parts,
        client: IpAddr,
        secure: bool,
        healthy: &dyn Fn(&Parts, Option<&str>) -> bool,
        mut trace: Option<&mut Trace>,
    ) -> RequestVerdict {
        let mut v = RequestVerdict::default();
        let mut seen = Seen::default();
        for (i, rule) in self.phase(Phase::Request) {
            let mut groups = Vec::new();
            let hit = matches(
                rule,
                parts,
                client,
                None,
                &mut groups,
                &|p: &Parts| healthy(p, v.backend.as_deref()),
                &mut seen,
            );
            self.record(i, hit, &mut trace);
            if !hit {
                continue;
            }
            let a = &rule.actions;
            // Checked before the rule's other actions: the signature is over the link as it came.
            if let Some(s) = &a.signed {
                let now = lacquer_clock::now_ms() / 1000;
                match s.signing.check(&parts.uri, client, now) {
                    Ok(target) => {
                        if let Ok(uri) = target.parse::<Uri>() {
                            parts.uri = uri;
                            seen = Seen::default();
                            v.rerouted = true;
                        }
                    }
                    Err(why) => {
                        let values = Values::request(parts, client, secure, &groups);
                        v.respond = Some(match &s.refuse {
                            Some(r) => synthesize(r, StatusCode::FORBIDDEN, &values),
                            None => refused_link(why),
                        });
                        break;
                    }
                }
            }
            if a.normalize_host {
                let sent = parts.headers.get(header::HOST).map(|h| h.as_bytes());
                let host = request_host(&parts.headers);
                if sent.is_some_and(|s| s != host.as_bytes()) {
                    if let Ok(value) = HeaderValue::from_str(&host) {
                        parts.headers.insert(header::HOST, value);
                        v.rerouted = true;
                    }
                }
            }
            let mut bucketed = Vec::with_capacity(a.buckets.len());
            for b in &a.buckets {
                let sent = parts.headers.get(&b.from).and_then(|h| h.to_str().ok());
                let value = sent
                    .and_then(|s| b.cases.iter().find(|(_, r)| r.is_match(s)))
                    .map_or(&b.default, |(value, _)| value);
                parts.headers.insert(b.to.clone(), value.clone());
                bucketed.push((&b.to, value));
            }
            let values = Values::request(parts, client, secure, &groups);
            // Rendered before the head they go into is borrowed for writing.
            let set: Lines = a.set.iter().map(|l| (l, l.value(&values))).collect();
            let append: Lines = a.append.iter().map(|l| (l, l.value(&values))).collect();
            let target = rewritten_target(rule, parts, client, secure);
            if a.set.iter().any(Line::is_host) {
                v.rerouted = true;
            }
            // A rule's removals never take what the rule itself writes: `unset_headers` on a bucket's
            // `to` removes what the client sent under that name, and the bucket's value stays (the
            // client-sent header was the one to distrust).
            unset(&mut parts.headers, &a.unset);
            for (name, value) in bucketed {
                parts.headers.insert(name.clone(), value.clone());
            }
            write(&mut parts.headers, set, append);
            if let Some(target) = target {
                if let Ok(uri) = target.parse::<Uri>() {
                    parts.uri = uri;
                    seen = Seen::default();
                    v.rerouted = true;
                }
            }
            if let Some(c) = &a.cookies {
                let kept = c.apply(
                    parts
                        .headers
                        .get_all(header::COOKIE)
                        .iter()
                        .filter_map(|l| l.to_str().ok()),
                );
                parts.headers.remove(header::COOKIE);
                if let Some(value) = kept.and_then(|k| HeaderValue::from_str(&k).ok()) {
                    parts.headers.insert(header::COOKIE, value);
                }
            }
            if a.strip_cookies {
                parts.headers.remove(header::COOKIE);
                v.strip_set_cookie = true;
            }
            v.cache_cookies |= a.cache_cookies;
            for k in &a.key {
                if !v.key.contains(k) {
                    v.key.push(k.clone());
                }
            }
            for c in &a.key_cookies {
                if !v.key_cookies.contains(c) {
                    v.key_cookies.push(c.clone());
                }
            }
            v.pass |= a.pass;
            v.pipe |= a.pipe;
            if let Some(invalidate) = &a.invalidate {
                v.invalidate = Some(invalidate.clone());
            }
            if let Some(b) = &a.backend {
                v.backend = Some(b.clone());
            }
            if let Some(g) = a.request_grace {
                v.request_grace = Some(g);
            }
            for hint in &a.early_hints {
                if !v.early_hints.contains(hint) {
                    v.early_hints.push(hint.clone());
                }
            }
            if let Some(cap) = a.cache_body {
                v.cache_body = Some(cap);
            }
            if let Some(s) = &a.respond {
                let values = Values::request(parts, client, secure, &groups);
                v.respond = Some(synthesize(s, StatusCode::OK, &values));
                break;
            }
            if rule.stop {
                break;
            }
        }
        v
    }

    /// The backend-request phase: edits the fields of a request leaving for the origin (`headers`), by
    /// conditions on the client's request (`facts`).
    pub fn backend_request(
        &self,
        facts: Facts<'_>,
        headers: &mut HeaderMap,
        mut trace: Option<&mut Trace>,
    ) {
        let mut seen = Seen::default();
        for (i, rule) in self.phase(Phase::BackendRequest) {
            let Some(groups) = self.tried(i, rule, facts, None, &mut trace, &mut seen) else {
                continue;
            };
            let values = facts.values(None, &groups, None, None);
            let a = &rule.actions;
            edit(headers, a, &values);
            if rule.stop {
                break;
            }
        }
    }

    /// The backend-response phase: edits the origin's response fields before the store decides on them,
    /// and returns what the matching rules change in that decision.
    pub fn backend_response(
        &self,
        facts: Facts<'_>,
        status: StatusCode,
        headers: &mut HeaderMap,
        mut trace: Option<&mut Trace>,
    ) -> Adjust {
        let mut adjust = Adjust::default();
        let mut seen = Seen::default();
        for (i, rule) in self.phase(Phase::BackendResponse) {
            let response = Response {
                status,
                headers,
                outcome: None,
            };
            let Some(groups) = self.tried(i, rule, facts, Some(response), &mut trace, &mut seen)
            else {
                continue;
            };
            let a = &rule.actions;
            let lines = render(a, &facts.values(Some(status), &groups, Some(headers), None));
            apply(headers, a, lines);
            let r = a.adjust;
            adjust = Adjust {
                ttl: r.ttl.or(adjust.ttl),
                default_ttl: r.default_ttl.or(adjust.default_ttl),
                ttl_min: r.ttl_min.or(adjust.ttl_min),
                ttl_max: r.ttl_max.or(adjust.ttl_max),
                grace: r.grace.or(adjust.grace),
                keep: r.keep.or(adjust.keep),
                store: r.store.or(adjust.store),
                compress: r.compress.or(adjust.compress),
                esi: r.esi.or(adjust.esi),
            };
            if rule.stop {
                break;
            }
        }
        adjust
    }

    /// The deliver phase: edits the fields of a response leaving for the client (hit, miss or pass), or
    /// replaces the response (`respond`). `debug` is asked for only when a rule shows debug headers.
    pub fn deliver(
        &self,
        facts: Facts<'_>,
        status: StatusCode,
        headers: &mut HeaderMap,
        debug: &dyn Fn() -> Debug,
        trace: Option<&mut Trace>,
    ) -> Option<Synthetic> {
        self.deliver_from(0, facts, status, headers, debug, trace)
    }

    /// What the deliver rules that edit prepared heads are: the same for two compiles of the same ones.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// How many fields, at most, the deliver rules add to a head they edit ahead of its hits; `None`
    /// when they edit none ([`Rules::prepares`]).
    pub fn edited_fields(&self) -> Option<usize> {
        self.prepares().then_some(self.edited_fields)
    }

    /// Whether some deliver rules can edit a stored response's prepared head ahead of its hits
    /// ([`Rules::prepare`]).
    pub fn prepares(&self) -> bool {
        self.ahead > 0
    }

    /// Runs the deliver rules that look at the response alone, those before the first that looks at the
    /// request, on the head every plain hit of one stored response is sent with (`status`, `headers`),
    /// once for all of them. Nothing is counted: each response counts its own
    /// ([`Rules::deliver_prepared`]).
    pub fn prepare(&self, status: StatusCode, headers: &mut HeaderMap) -> Ahead {
        // These rules read nothing of the request: an empty one stands in for every request.
        let (parts, ()) = http::Request::new(()).into_parts();
        let facts = Facts {
            parts: &parts,
            client: IpAddr::from([0, 0, 0, 0]),
            secure: false,
        };
        let mut ahead = Ahead {
            rules: self.id,
            ..Ahead::default()
        };
        for (n, (_, rule)) in self.phase(Phase::Deliver).take(self.ahead).enumerate() {
            let response = Some(Response {
                status,
                headers,
                outcome: None,
            });
            let hit = matches(
                rule,
                &parts,
                facts.client,
                response,
                &mut Vec::new(),
                &|_| true,
                &mut Seen::default(),
            );
            ahead.tried += 1;
            ahead.matched |= u64::from(hit) << n;
            if !hit {
                continue;
            }
            let lines = render(
                &rule.actions,
                &facts.values(Some(status), &[], Some(headers), None),
            );
            apply(headers, &rule.actions, lines);
            if rule.stop {
                ahead.stopped = true;
                break;
            }
        }
        ahead
    }

    /// The deliver phase for a response sent with a head [`Rules::prepare`] edited (`ahead`): the rules
    /// it ran are counted (or traced) as they matched then, and the phase goes on from the first rule
    /// it left. A head prepared under other rules (a reload that changed them came between the head's
    /// preparation and this response) gets the whole phase.
    pub fn deliver_prepared(
        &self,
        facts: Facts<'_>,
        status: StatusCode,
        headers: &mut HeaderMap,
        debug: &dyn Fn() -> Debug,
        ahead: &Ahead,
        mut trace: Option<&mut Trace>,
    ) -> Option<Synthetic> {
        if ahead.rules != self.id {
            return self.deliver(facts, status, headers, debug, trace);
        }
        for (n, (i, _)) in self
            .phase(Phase::Deliver)
            .take(ahead.tried as usize)
            .enumerate()
        {
            self.record(i, ahead.matched & (1 << n) != 0, &mut trace);
        }
        if ahead.stopped {
            return None;
        }
        self.deliver_from(self.ahead, facts, status, headers, debug, trace)
    }

    /// The deliver phase from its `skip`th rule on.
    fn deliver_from(
        &self,
        skip: usize,
        facts: Facts<'_>,
        status: StatusCode,
        headers: &mut HeaderMap,
        debug: &dyn Fn() -> Debug,
        mut trace: Option<&mut Trace>,
    ) -> Option<Synthetic> {
        let mut seen = Seen::default();
        let outcome = self.reads_outcome.then(|| debug().outcome).flatten();
        for (i, rule) in self.phase(Phase::Deliver).skip(skip) {
            let response = Response {
                status,
                headers,
                outcome,
            };
            let Some(groups) = self.tried(i, rule, facts, Some(response), &mut trace, &mut seen)
            else {
                continue;
            };
            let a = &rule.actions;
            let values = facts.values(Some(status), &groups, Some(headers), outcome);
            if let Some(s) = &a.respond {
                return Some(synthesize(s, status, &values));
            }
            let lines = render(a, &values);
            apply(headers, a, lines);
            if a.debug_headers {
                let d = debug();
                for (name, value) in [
                    ("x-cache-hits", d.hits.map(|h| h as i64)),
                    ("x-cache-ttl", d.ttl_s),
                ] {
                    if let Some(n) = value {
                        headers.insert(HeaderName::from_static(name), HeaderValue::from(n));
                    }
                }
            }
            if rule.stop {
                break;
            }
        }
        None
    }

    /// The error phase: for an error lacquerd answers itself (`status`: no backend answered, a timeout),
    /// the response a rule makes instead, or `None` to send the built-in one.
    pub fn error(
        &self,
        facts: Facts<'_>,
        status: StatusCode,
        mut trace: Option<&mut Trace>,
    ) -> Option<Synthetic> {
        let empty = HeaderMap::new();
        let mut seen = Seen::default();
        for (i, rule) in self.phase(Phase::Error) {
            let response = Response {
                status,
                headers: &empty,
                outcome: None,
            };
            let Some(groups) = self.tried(i, rule, facts, Some(response), &mut trace, &mut seen)
            else {
                continue;
            };
            let values = facts.values(Some(status), &groups, None, None);
            let a = &rule.actions;
            let mut made = match &a.respond {
                Some(s) => synthesize(s, status, &values),
                None => Synthetic {
                    status,
                    headers: HeaderMap::new(),
                    body: Bytes::new(),
                },
            };
            edit(&mut made.headers, a, &values);
            if a.respond.is_some() || rule.stop {
                return Some(made);
            }
        }
        None
    }
}

impl Facts<'_> {
    /// What a rule's templates are rendered from; `response`, the response's head in the response phases.
    fn values<'g>(
        &'g self,
        status: Option<StatusCode>,
        groups: &'g [String],
        response: Option<&'g HeaderMap>,
        outcome: Option<Outcome>,
    ) -> Values<'g>
    where
        Self: 'g,
    {
        Values {
            parts: self.parts,
            client: self.client,
            secure: self.secure,
            status: status.map(|s| s.as_u16()),
            groups,
            response,
            outcome: outcome.map(Outcome::name),
        }
    }
}

/// Removes the fields `unset` names.
fn unset(headers: &mut HeaderMap, unset: &[compile::Unset]) {
    for pattern in unset {
        match pattern {
            compile::Unset::Name(name) => {
                headers.remove(name);
            }
            compile::Unset::Prefix(prefix) => {
                let doomed: Vec<HeaderName> = headers
                    .keys()
                    .filter(|n| prefix.matches(n.as_str()))
                    .cloned()
                    .collect();
                for n in doomed {
                    headers.remove(n);
                }
            }
        }
    }
}

/// Writes rendered values: those set replace (`None` removes), then those appended join an existing
/// value with `, `.
fn write(headers: &mut HeaderMap, set: Lines<'_>, append: Lines<'_>) {
    for (line, value) in set {
        // The key is made of `Host` and its first `/` must end the host: a value a request's parts were
        // put into must still be a host, or the request keeps its own.
        if line.is_host() && !value.as_ref().is_some_and(|v| valid_host(v.as_bytes())) {
            continue;
        }
        match value {
            Some(v) => {
                headers.insert(line.name.clone(), v);
            }
            None => {
                headers.remove(&line.name);
            }
        }
    }
    for (line, value) in append {
        let Some(value) = value else { continue };
        let joined = match headers.get(&line.name) {
            Some(old) if !old.is_empty() => {
                let mut both = Vec::with_capacity(old.len() + 2 + value.len());
                both.extend_from_slice(old.as_bytes());
                both.extend_from_slice(b", ");
                both.extend_from_slice(value.as_bytes());
                HeaderValue::from_bytes(&both).ok()
            }
            _ => Some(value),
        };
        if let Some(v) = joined {
            headers.insert(line.name.clone(), v);
        }
    }
}

/// A rule's header edits on a head other than the request's own, which no rendering borrows.
fn edit(headers: &mut HeaderMap, a: &compile::Actions, values: &Values<'_>) {
    let lines = render(a, values);
    apply(headers, a, lines);
}

/// A rule's header lines rendered from `values`, before the rule edits anything: every line reads the
/// head as the rule found it (`${resp.cache-control}` beside an `unset_headers` of it is the origin's).
fn render<'a>(a: &'a compile::Actions, values: &Values<'_>) -> (Lines<'a>, Lines<'a>) {
    let set = a.set.iter().map(|l| (l, l.value(values))).collect();
    let append = a.append.iter().map(|l| (l, l.value(values))).collect();
    (set, append)
}

/// A rule's removals, then its rendered writes ([`render`]).
fn apply(headers: &mut HeaderMap, a: &compile::Actions, (set, append): (Lines<'_>, Lines<'_>)) {
    unset(headers, &a.unset);
    write(headers, set, append);
}

/// The target after a rule's query rewrite and path rewrite, when either changes it. A rewritten path is
/// normalised again, so a rewrite cannot reach above the root or spell a path two ways.
fn rewritten_target(
    rule: &Compiled,
    parts: &Parts,
    client: IpAddr,
    secure: bool,
) -> Option<String> {
    let a = &rule.actions;
    if a.query.is_none() && a.rewrite_path.is_none() {
        return None;
    }
    let path = parts.uri.path();
    let query = parts.uri.query();
    let new_path: Cow<'_, str> = match &a.rewrite_path {
        Some((from, to)) => match from.captures(path) {
            Some(caps) => {
                let own: Vec<String> = caps
                    .iter()
                    .skip(1)
                    .map(|m| m.map_or(String::new(), |m| m.as_str().to_owned()))
                    .collect();
                let values = Values {
                    parts,
                    client,
                    secure,
                    status: None,
                    groups: &own,
                    response: None,
                    outcome: None,
                };
                let whole = caps.get(0).expect("group 0");
                let mut out = String::with_capacity(path.len());
                out.push_str(&path[..whole.start()]);
                out.push_str(&to.render(&values));
                out.push_str(&path[whole.end()..]);
                Cow::Owned(normalize::path(&out).into_owned())
            }
            None => Cow::Borrowed(path),
        },
        None => Cow::Borrowed(path),
    };
    // A rewrite of the path may carry a query of its own (`/search?q=$1`): it goes before the sent one.
    let (new_path, own_query) = match new_path.split_once('?') {
        Some((p, q)) => (p.to_owned(), Some(q.to_owned())),
        None => (new_path.into_owned(), None),
    };
    let joined = match (own_query, query) {
        (Some(o), Some(q)) if !q.is_empty() => Some(format!("{o}&{q}")),
        (Some(o), _) => Some(o),
        (None, q) => q.map(str::to_owned),
    };
    let new_query = match (&a.query, joined) {
        (Some(rw), Some(q)) => rw.apply(&q),
        (_, q) => q.filter(|q| !q.is_empty()),
    };
    let target = match new_query {
        Some(q) => format!("{new_path}?{q}"),
        None => new_path,
    };
    (target != parts.uri.path_and_query().map_or("/", |p| p.as_str())).then_some(target)
}

/// What the conditions of a phase's rules read of the request, worked out for the first rule that asks and
/// kept for the others, until a rule rewrites what it was read from.
#[derive(Default)]
struct Seen {
    /// The lenient reading of the target (`normalize::lenient`), once asked for.
    lenient: Option<Option<String>>,
}

/// Whether `rule`'s conditions hold, the cheap ones first; `groups` gets `match.path_regex`'s groups.
fn matches(
    rule: &Compiled,
    parts: &Parts,
    client: IpAddr,
    response: Option<Response<'_>>,
    groups: &mut Vec<String>,
    healthy: &dyn Fn(&Parts) -> bool,
    seen: &mut Seen,
) -> bool {
    let w = &rule.when;
    if !w.methods.is_empty() && !w.methods.contains(&parts.method) {
        return false;
    }
    if !w.clients.is_empty() && !w.clients.iter().any(|n| n.contains(&client)) {
        return false;
    }
    if w.except_clients.iter().any(|n| n.contains(&client)) {
        return false;
    }
    if !w.hosts.is_empty() {
        let host = request_host(&parts.headers);
        if !w.hosts.iter().any(|h| h.matches(&host)) {
            return false;
        }
    }
    if !w.path_prefix.is_empty() || !w.extensions.is_empty() || w.path_regex.is_some() {
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        // A pass for `/account/` must not be escaped by a spelling only the origin resolves
        // (`/;/account/`, `/%2Faccount/`): either reading matching is a match, as for routes and
        // `[[deny]]`.
        // The request's own path is the URI's, found when it was parsed.
        if !path_matches(rule, target, parts.uri.path(), groups) {
            let lenient = seen
                .lenient
                .get_or_insert_with(|| normalize::lenient(target));
            if !lenient.as_deref().is_some_and(|l| {
                path_matches(rule, l, l.split_once('?').map_or(l, |(p, _)| p), groups)
            }) {
                return false;
            }
        }
    }
    for n in &w.without_headers {
        if parts.headers.contains_key(n) {
            return false;
        }
    }
    for (n, r) in &w.headers {
        let mut values = parts.headers.get_all(n).iter().peekable();
        if values.peek().is_none() {
            return false;
        }
        if let Some(r) = r {
            if !values.any(|v| v.to_str().is_ok_and(|s| r.is_match(s))) {
                return false;
            }
        }
    }
    if !w.cookies.is_empty() {
        let lines = parts
            .headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|l| l.to_str().ok());
        if !edit::has_cookie(lines, &w.cookies) {
            return false;
        }
    }
    if !w.without_cookies.is_empty() {
        let lines = parts
            .headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|l| l.to_str().ok());
        if edit::has_cookie(lines, &w.without_cookies) {
            return false;
        }
    }
    if !w.query.is_empty() && !normalize::has_param(parts.uri.query().unwrap_or(""), &w.query) {
        return false;
    }
    if let Some(r) = &response {
        let code = r.status.as_u16();
        if !w.status.is_empty() && !w.status.iter().any(|(lo, hi)| (*lo..=*hi).contains(&code)) {
            return false;
        }
        if !w.content_types.is_empty() {
            let t = r
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let media = t.split(';').next().unwrap_or("").trim();
            let (kind, sub) = media.split_once('/').unwrap_or((media, ""));
            if !w.content_types.iter().any(|(k, s)| {
                k.eq_ignore_ascii_case(kind)
                    && s.as_deref().is_none_or(|s| s.eq_ignore_ascii_case(sub))
            }) {
                return false;
            }
        }
        if !w.outcomes.is_empty() && !r.outcome.is_some_and(|o| w.outcomes.contains(&o)) {
            return false;
        }
        for (n, want) in &w.alike {
            let alike = parts
                .headers
                .get_all(n)
                .iter()
                .eq(r.headers.get_all(n).iter());
            if alike != *want {
                return false;
            }
        }
        for (n, pattern) in &w.response_headers {
            let mut values = r.headers.get_all(n).iter().peekable();
            if values.peek().is_none() {
                return false;
            }
            if let Some(pattern) = pattern {
                if !values.any(|v| v.to_str().is_ok_and(|s| pattern.is_match(s))) {
                    return false;
                }
            }
        }
        if let Some(limit) = w.larger_than {
            let len = r
                .headers
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            if len.is_none_or(|l| l <= limit) {
                return false;
            }
        }
    }
    if let Some(want) = w.backend_healthy {
        if healthy(parts) != want {
            return false;
        }
    }
    true
}

/// Whether a target (path and query; `path` without the query) meets a rule's path conditions: prefix,
/// extension, regular expression (whose groups go to `groups`).
fn path_matches(rule: &Compiled, target: &str, path: &str, groups: &mut Vec<String>) -> bool {
    let w = &rule.when;
    if !w.path_prefix.is_empty() && !w.path_prefix.iter().any(|p| path.starts_with(p.as_str())) {
        return false;
    }
    if !w.extensions.is_empty() {
        let last = path.rsplit('/').next().unwrap_or("");
        // `/account/me;x.css` is `/account/me` to Tomcat, Spring and many others: a last segment with
        // parameters is no file of any extension (an extension test is how static files are told from
        // pages, to store them whatever their cookies).
        if last.contains(';') {
            return false;
        }
        let ext = last.rsplit_once('.').map(|(_, e)| e);
        if !ext.is_some_and(|e| w.extensions.iter().any(|x| x.eq_ignore_ascii_case(e))) {
            return false;
        }
    }
    if let Some(r) = &w.path_regex {
        if rule.groups == 0 {
            return r.is_match(target);
        }
        let Some(caps) = r.captures(target) else {
            return false;
        };
        groups.clear();
        groups.extend(
            caps.iter()
                .skip(1)
                .map(|m| m.map_or(String::new(), |m| m.as_str().to_owned())),
        );
    }
    true
}

/// A rendered `Location` that starts with `/` kept a path on this site: browsers read `//evil.example`,
/// `/\evil.example` and `/<tab>/evil.example` as another host, so a client's bytes put into the template
/// (`location = "/$1"` from `^/go/(.*)$`) would make an open redirect. Backslashes and tabs are
/// percent-encoded, and a second leading `/` too.
fn same_origin(location: String) -> String {
    if !location.starts_with('/')
        || (!location.contains(['\\', '\t']) && !location.starts_with("//"))
    {
        return location;
    }
    let escaped = location.replace('\\', "%5C").replace('\t', "%09");
    match escaped.strip_prefix("//") {
        Some(rest) => format!("/%2F{rest}"),
        None => escaped,
    }
}

/// A rule's response, rendered; `status` is the one it keeps when the rule names none.
/// lacquerd's own answer to a link a `signed` rule refuses.
fn refused_link(why: signed::Refused) -> Synthetic {
    let text = match why {
        signed::Refused::Unsigned => "forbidden: this link is not signed\n",
        signed::Refused::Wrong => "forbidden: this link's signature is wrong\n",
        signed::Refused::Expired => "forbidden: this link has expired\n",
    };
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    Synthetic {
        status: StatusCode::FORBIDDEN,
        headers,
        body: Bytes::from_static(text.as_bytes()),
    }
}

fn synthesize(s: &Synthesis, status: StatusCode, values: &Values<'_>) -> Synthetic {
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, s.content_type.clone());
    if let Some(l) = &s.location {
        if let Ok(v) = HeaderValue::from_str(&same_origin(l.render(values))) {
            headers.insert(header::LOCATION, v);
        }
    }
    for (n, t) in &s.headers {
        if let Ok(v) = HeaderValue::from_str(&t.render(values)) {
            headers.insert(n.clone(), v);
        }
    }
    let body = match &s.body {
        Body::File(b) => b.clone(),
        Body::Template(t) => Bytes::from(t.render(values)),
    };
    Synthetic {
        status: s.status.unwrap_or(status),
        headers,
        body,
    }
}

#[cfg(test)]
mod docs;
#[cfg(test)]
mod tests;
