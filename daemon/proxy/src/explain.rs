//! What the live rules and policy would do with a request, without sending anything to the origin:
//! `POST /v1/explain` (`cachectl explain`), and the rules' own `examples`, which every compile runs. Both
//! go through the data path's own phase functions ([`crate::phase`]), so an explanation cannot drift
//! from what a request really gets.

use std::{net::IpAddr, time::SystemTime};

use http::{header, request::Parts, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};

use lacquer_admin::wire::{
    ExplainRequest, ExplainedObject, ExplainedResponse, Explanation, HeaderField, RuleStep,
};
use lacquer_backends::{protection::DenyRule, routing::Router, BackendSet};
use lacquer_config::{Config, ConfigError, Rule};
use lacquer_policy::{
    cache_control::CacheControl,
    head,
    headers::strip_hop_by_hop,
    key::primary_key,
    request::{host_from_authority, RequestClass},
    stale::{usability, Usability},
    storable::{self, Credentials, Decision, NotStored},
};
use lacquer_rules::Rules;
use lacquer_rules::{Facts, Phase, Trace};
use lacquer_storage::ObjectMeta;

use crate::{
    cluster,
    coding::Negotiated,
    error_page::ErrorPages,
    live::Live,
    phase::{self, Admitted, Answered},
    pipe,
    prepared::Prepared,
    purge_method,
    store::CacheStore,
    worker::Shared,
};

// Built here rather than beside the struct: building the live settings is their validation, and that runs
// every rule's `examples` through the data path's phases, which this module takes requests through.
impl Live {
    /// The live settings of `config`, with backends made from its `[[backend]]`s; building them is their
    /// validation, and the error names the setting that cannot be built.
    pub fn new(config: &Config, backends: &BackendSet) -> Result<Self, ConfigError> {
        let live = Self {
            router: Router::new(config, backends)?,
            purge: config.purge.clone(),
            deny: config
                .deny
                .iter()
                .enumerate()
                .map(|(n, d)| {
                    DenyRule::compile(d).map_err(|e| ConfigError::setting(format!("deny[{n}]"), e))
                })
                .collect::<Result<_, _>>()?,
            normalize: config.normalize.clone(),
            error_pages: ErrorPages::compile(&config.error_pages)?,
            prefetch: config.prefetch.clone(),
            esi: config.esi.clone(),
            prefetching: config
                .route
                .iter()
                .any(|r| r.prefetch.is_some_and(|p| p.cmcd || p.playlist > 0)),
            rules: {
                let mut names: Vec<&str> = config.backend.iter().map(|b| b.name.as_str()).collect();
                names.extend(config.director.iter().map(|d| d.name.as_str()));
                Rules::compile(&config.rule, &names)
                    .map_err(|e| ConfigError::setting(e.setting(), e.reason))?
            },
        };
        check_examples(&live, &config.rule)?;
        Ok(live)
    }
}

/// The client address an explanation assumes when none is given: a documentation address, which no
/// client rule on a real network matches by accident.
const SOMEONE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));

/// A request taken through the request phase.
struct Simulated {
    explanation: Explanation,
    /// The head as the lookup sees it (after compression negotiation), when it is looked up.
    looked_up: Option<(Parts, Admitted)>,
    client: IpAddr,
    secure: bool,
    trace: Trace,
}

/// The request head `req` describes, or why it cannot be one.
fn request_head(req: &ExplainRequest) -> Result<Parts, String> {
    let method = match &req.method {
        Some(m) => Method::from_bytes(m.to_ascii_uppercase().as_bytes())
            .map_err(|_| format!("{m:?} is not a method"))?,
        None => Method::GET,
    };
    let uri: Uri = req
        .url
        .parse()
        .map_err(|e| format!("{:?} is not a URL: {e}", req.url))?;
    let mut builder = http::Request::builder().method(method).uri(uri);
    for field in &req.headers {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| format!("{:?} is not a header name", field.name))?;
        let value = HeaderValue::from_str(&field.value)
            .map_err(|_| format!("the value of {:?} is not a header value", field.name))?;
        builder = builder.header(name, value);
    }
    let (mut parts, ()) = builder
        .body(())
        .map_err(|e| format!("not a request: {e}"))?
        .into_parts();
    // A client sends `Host` for an absolute URL as well; the request phase then reads it from there.
    if let Some(authority) = parts.uri.authority() {
        if !parts.headers.contains_key(header::HOST) {
            let host = HeaderValue::from_str(authority.as_str())
                .map_err(|_| format!("{authority} is not a host"))?;
            parts.headers.insert(header::HOST, host);
        }
    }
    Ok(parts)
}

fn fields(headers: &HeaderMap) -> Vec<HeaderField> {
    headers
        .iter()
        .map(|(n, v)| HeaderField {
            name: n.as_str().to_owned(),
            value: String::from_utf8_lossy(v.as_bytes()).into_owned(),
        })
        .collect()
}

fn steps(trace: &Trace) -> Vec<RuleStep> {
    trace
        .steps
        .iter()
        .map(|s| RuleStep {
            index: s.index,
            name: s.name.to_string(),
            phase: s.phase.name().to_owned(),
            matched: s.matched,
        })
        .collect()
}

/// Takes `req` through the request phase and the backend-request rules, as `answer` and `lookup` do.
fn simulate(live: &Live, req: &ExplainRequest) -> Result<Simulated, String> {
    let mut parts = request_head(req)?;
    if let Some(body) = &req.body {
        parts
            .headers
            .entry(header::CONTENT_LENGTH)
            .or_insert_with(|| HeaderValue::from(body.len()));
    }
    let client = req.client.unwrap_or(SOMEONE);
    let secure = req.secure;
    let mut trace = Trace::default();
    let mut explanation = Explanation {
        action: String::new(),
        reason: None,
        rules: Vec::new(),
        method: parts.method.to_string(),
        target: String::new(),
        headers: Vec::new(),
        route: String::new(),
        backend: String::new(),
        key: None,
        key_fields: Vec::new(),
        early_hints: Vec::new(),
        synthetic: None,
        stored: None,
    };
    if let Err(e) = head::check(&parts) {
        explanation.action = "refused".into();
        explanation.reason = Some(e.to_string());
        return Ok(Simulated {
            explanation,
            looked_up: None,
            client,
            secure,
            trace,
        });
    }
    host_from_authority(&mut parts);
    let upgrade = pipe::requested(&parts);
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(&cluster::FORWARDED_BY);
    parts.headers.remove(&cluster::FORWARD_PROOF);
    for field in &phase::PSEUDO_FIELDS {
        parts.headers.remove(field);
    }
    let admitted = phase::request(
        live,
        &mut parts,
        client,
        secure,
        upgrade.as_ref(),
        Some(&mut trace),
    );
    let mut looked_up = None;
    match admitted {
        Err(Answered::Denied) => {
            explanation.action = "denied".into();
            explanation.reason = Some("[[deny]]".into());
        }
        Err(Answered::Invalidate(invalidation)) => {
            explanation.action = "invalidation".into();
            explanation.reason = Some(purge_method::describe(&invalidation));
        }
        Err(Answered::Synthetic(made)) => {
            explanation.action = "synthetic".into();
            explanation.synthetic = Some(ExplainedResponse {
                status: made.status.as_u16(),
                headers: fields(&made.headers),
            });
        }
        Ok(mut admitted) => {
            // Keyed by its body as the data path keys it, when the body fits the rule's cap.
            if let (Some(cap), Some(body)) = (admitted.body_cap, &req.body) {
                if body.len() as u64 <= cap {
                    let body = bytes::Bytes::copy_from_slice(body.as_bytes());
                    phase::key_body(&mut parts, &mut admitted.decided, body);
                }
            }
            let route = &admitted.route;
            explanation.route = live.router.describe(route);
            let target = admitted.decided.target.as_ref();
            explanation.backend = route
                .target_name(target.unwrap_or(&route.target))
                .to_owned();
            let (action, reason) = match admitted.class {
                _ if purge_method::is_invalidation(&parts.method) => {
                    ("invalidation", Some(parts.method.to_string()))
                }
                RequestClass::Lookup => ("lookup", None),
                RequestClass::Miss(why) => ("miss", Some(why.to_owned())),
                _ if admitted.pipe => ("pipe", None),
                RequestClass::Pass(why) => ("pass", Some(why.to_owned())),
                RequestClass::Invalidate => ("invalidation", Some("unsafe method".to_owned())),
            };
            explanation.action = action.into();
            explanation.reason = reason;
            explanation.early_hints = (admitted.decided.early_hints.iter())
                .filter_map(|link| link.to_str().ok().map(str::to_owned))
                .collect();
            if matches!(admitted.class, RequestClass::Lookup | RequestClass::Miss(_)) {
                let policy = &route.policy;
                explanation.key = Some(primary_key(&parts));
                if let Some(negotiation) = &policy.compression {
                    Negotiated::take(&mut parts.headers, negotiation);
                }
                let mut key_fields: Vec<String> = policy.key_headers.clone();
                key_fields.extend(
                    (admitted.decided.key.iter())
                        .filter(|k| **k != phase::KEY_RULES)
                        .map(|k| k.as_str().to_owned()),
                );
                if policy.compression.is_some() {
                    key_fields.push("accept-encoding".into());
                }
                key_fields.dedup();
                explanation.key_fields = key_fields;
            }
            let mut sent = parts.headers.clone();
            // The fields made for the variant are never sent (forward.rs).
            for field in &phase::PSEUDO_FIELDS {
                sent.remove(field);
            }
            if live.rules.has(Phase::BackendRequest) {
                let facts = Facts {
                    parts: &parts,
                    client,
                    secure,
                };
                live.rules
                    .backend_request(facts, &mut sent, Some(&mut trace));
            }
            explanation.headers = fields(&sent);
            looked_up = Some((parts.clone(), admitted));
        }
    }
    explanation.target = looked_up
        .as_ref()
        .map_or(&parts, |(p, _)| p)
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    Ok(Simulated {
        explanation,
        looked_up,
        client,
        secure,
        trace,
    })
}

/// What the store would decide on an origin response `(status, headers)` to the simulated request and
/// what its client would get: the backend-response rules, the policy, then the deliver rules.
struct Answer {
    decision: Decision,
    /// The origin's directive that keeps it from being served stale, a rule's grace notwithstanding.
    stale_forbidden_by: Option<&'static str>,
    response: ExplainedResponse,
}

/// `Origin`: `headers` are the origin's own (an example's response), or a stored head standing in for them.
#[derive(Clone, Copy, PartialEq)]
enum Origin {
    Sent,
    Stored,
}

fn answer(
    live: &Live,
    sim: &mut Simulated,
    status: StatusCode,
    mut headers: HeaderMap,
    origin: Origin,
    delivered: impl FnOnce(&HeaderMap) -> HeaderMap,
) -> Option<Answer> {
    let (parts, admitted) = sim.looked_up.as_ref()?;
    let facts = Facts {
        parts,
        client: sim.client,
        secure: sim.secure,
    };
    let authorized = parts.headers.contains_key(header::AUTHORIZATION);
    // A stored head carries what `backend_response` rules wrote when it was filled: what the origin
    // itself would say of sharing an authorized answer cannot be read from it, and is not assumed.
    let unknown = origin == Origin::Stored && live.rules.has(Phase::BackendResponse);
    let credentials = match Credentials::of(authorized, &headers, &admitted.route.policy) {
        Credentials::Authorized { .. } if unknown => Credentials::Authorized {
            origin_shares: false,
        },
        credentials => credentials,
    };
    let adjust = live
        .rules
        .backend_response(facts, status, &mut headers, Some(&mut sim.trace));
    let mut decision = storable::decide_adjusted(
        credentials,
        status,
        &headers,
        &admitted.route.policy,
        &adjust,
        SystemTime::now(),
    );
    if !matches!(admitted.class, RequestClass::Lookup | RequestClass::Miss(_)) {
        decision = Decision::DontStore(NotStored::NotLookedUp);
    }
    let policy = &admitted.route.policy;
    let cc = CacheControl::governing(&headers, &policy.cache.targeted_cache_control);
    let stale_forbidden_by = storable::stale_forbidden_by(
        &cc,
        cc.no_cache && policy.ttl_override.is_none(),
        adjust.grace.or(policy.grace_override).is_some(),
    );
    let mut out = delivered(&headers);
    let made = live.rules.deliver(
        facts,
        status,
        &mut out,
        &lacquer_rules::Debug::default,
        Some(&mut sim.trace),
    );
    // As the data path leaves them: the tags withheld after the deliver rules.
    crate::respond::withhold_tags(&mut out, &admitted.route.policy.cache);
    let response = match made {
        Some(m) => ExplainedResponse {
            status: m.status.as_u16(),
            headers: fields(&m.headers),
        },
        None => ExplainedResponse {
            status: status.as_u16(),
            headers: fields(&out),
        },
    };
    Some(Answer {
        decision,
        stale_forbidden_by,
        response,
    })
}

/// What the running daemon would do with `req`: the request's rules and route, the key and variant, the
/// stored variant it selects and what the rules make of it. Nothing is sent to the origin and no counter
/// moves.
pub async fn explain<S: CacheStore>(
    shared: &Shared<S>,
    req: &ExplainRequest,
) -> Result<Explanation, String> {
    let live = shared.live();
    let mut sim = simulate(&live, req)?;
    let found = match (&sim.explanation.key, &sim.looked_up) {
        (Some(key), Some((parts, _))) => {
            let set = shared
                .store
                .lookup(key)
                .await
                .map_err(|e| format!("the store cannot be read: {e}"))?;
            set.and_then(|set| {
                set.variants
                    .iter()
                    .find(|m| phase::selects(&m.variant, parts))
                    .cloned()
            })
        }
        _ => None,
    };
    if let Some(meta) = found {
        let now = lacquer_clock::now_ms();
        let state = match usability(meta.lifetime(now)) {
            Usability::Fresh => "fresh",
            Usability::Grace => "grace",
            Usability::OnError => "stale",
            Usability::Unusable => "unusable",
        };
        let ttl_seconds = meta.remaining_ttl_ms(now) / 1000;
        let stored = stored_head(&meta);
        let status = StatusCode::from_u16(meta.status).unwrap_or(StatusCode::OK);
        let prepared = Prepared::of(&meta).head;
        if let Some(a) = answer(&live, &mut sim, status, stored, Origin::Stored, |_| {
            prepared
        }) {
            let (storable, because, ttl, grace) = match &a.decision {
                Decision::Store(s) => (true, None, Some(s.ttl.as_secs()), Some(s.grace.as_secs())),
                Decision::DontStore(why) => (false, Some(why.token().to_owned()), None, None),
            };
            sim.explanation.stored = Some(ExplainedObject {
                state: state.into(),
                ttl_seconds,
                storable,
                not_stored_because: because,
                would_ttl_seconds: ttl,
                would_grace_seconds: grace,
                stale_forbidden_by: storable
                    .then_some(a.stale_forbidden_by)
                    .flatten()
                    .map(str::to_owned),
                response: a.response,
            });
        }
    }
    sim.explanation.rules = steps(&sim.trace);
    Ok(sim.explanation)
}

/// The stored fields of `meta`, as the origin sent them (less what only this cache adds).
fn stored_head(meta: &ObjectMeta) -> HeaderMap {
    let mut h = meta.header_map(0);
    h.remove(crate::coding::IDENTITY_LENGTH);
    h
}

/// Runs every rule's `examples` through the live settings `live` (built from `rules`); the error names
/// the rule, the example and what came out otherwise.
pub fn check_examples(live: &Live, rules: &[Rule]) -> Result<(), ConfigError> {
    for (index, rule) in rules.iter().enumerate() {
        for (n, example) in rule.examples.iter().enumerate() {
            let setting = match &rule.name {
                Some(name) => format!("rule[{index}] ({name:?}).examples[{n}]"),
                None => format!("rule[{index}].examples[{n}]"),
            };
            check_example(live, example).map_err(|e| ConfigError::setting(&setting, e))?;
        }
    }
    Ok(())
}

fn check_example(live: &Live, example: &lacquer_config::Example) -> Result<(), String> {
    let r = &example.request;
    let req = ExplainRequest {
        url: r.url.clone(),
        method: Some(r.method.clone()),
        headers: r
            .headers
            .iter()
            .map(|(n, v)| HeaderField {
                name: n.clone(),
                value: v.clone(),
            })
            .collect(),
        client: Some(r.client),
        secure: false,
        body: None,
    };
    let mut sim = simulate(live, &req)?;
    let expect = &example.expect;
    let e = &sim.explanation;
    if e.action == "refused" {
        return Err(format!(
            "the request is refused before any rule: {}",
            e.reason.as_deref().unwrap_or("bad head")
        ));
    }
    let mut wrong = Vec::new();
    let mut check = |what: &str, want: String, got: String| {
        if want != got {
            wrong.push(format!("{what}: expected {want:?}, got {got:?}"));
        }
    };
    if let Some(t) = &expect.target {
        check("target", t.clone(), e.target.clone());
    }
    for (name, want) in &expect.headers {
        check(
            &format!("request header {name}"),
            want.clone(),
            header_of(&e.headers, name),
        );
    }
    if let Some(p) = expect.pass {
        check("pass", p.to_string(), (e.action == "pass").to_string());
    }
    if let Some(p) = expect.pipe {
        check("pipe", p.to_string(), (e.action == "pipe").to_string());
    }
    if let Some(b) = &expect.backend {
        check("backend", b.clone(), e.backend.clone());
    }
    if let Some(s) = expect.status {
        let got = e
            .synthetic
            .as_ref()
            .map_or("none".to_owned(), |r| r.status.to_string());
        check("synthetic status", s.to_string(), got);
    }
    if let Some(k) = &expect.key {
        // The rules' additions, not what the configuration keys every response on.
        let got: Vec<String> = sim.looked_up.as_ref().map_or_else(Vec::new, |(_, a)| {
            (a.decided.key.iter())
                .filter(|n| !phase::PSEUDO_FIELDS.contains(n))
                .map(|n| n.as_str().to_owned())
                .collect()
        });
        check("key", format!("{k:?}"), format!("{got:?}"));
    }
    if let (Some(made), false) = (&e.synthetic, expect.response_headers.is_empty()) {
        for (name, want) in &expect.response_headers {
            check(
                &format!("response header {name}"),
                want.clone(),
                header_of(&made.headers, name),
            );
        }
    }
    let wants_response = expect.stored.is_some()
        || expect.ttl.is_some()
        || expect.grace.is_some()
        || (!expect.response_headers.is_empty() && e.synthetic.is_none());
    if wants_response {
        let response = example.response.clone().unwrap_or_default();
        let status = StatusCode::from_u16(response.status.unwrap_or(200))
            .map_err(|_| "response.status is not a status".to_owned())?;
        let mut headers = HeaderMap::new();
        for (n, v) in &response.headers {
            let name = HeaderName::from_bytes(n.as_bytes())
                .map_err(|_| format!("response header {n:?} is not a header name"))?;
            let value = HeaderValue::from_str(v)
                .map_err(|_| format!("response header {n:?} has no valid value"))?;
            headers.append(name, value);
        }
        let answered = answer(
            live,
            &mut sim,
            status,
            headers,
            Origin::Sent,
            HeaderMap::clone,
        );
        match answered {
            None => {
                wrong.push("the request is not sent to the origin, so nothing is stored".into())
            }
            Some(a) => {
                let (stored, ttl, grace) = match &a.decision {
                    Decision::Store(s) => (true, Some(s.ttl), Some(s.grace)),
                    Decision::DontStore(_) => (false, None, None),
                };
                if let Some(want) = expect.stored {
                    check("stored", want.to_string(), stored.to_string());
                }
                if let Some(want) = expect.ttl {
                    check(
                        "ttl",
                        format!("{want:?}"),
                        format!("{:?}", ttl.unwrap_or_default()),
                    );
                }
                if let Some(want) = expect.grace {
                    let got = grace.unwrap_or_default();
                    let voided = a
                        .stale_forbidden_by
                        .map(|d| format!(" (the origin's {d} forbids serving it stale)"))
                        .unwrap_or_default();
                    // In seconds: Duration's own form writes no grace as "0ns".
                    check(
                        "grace",
                        format!("{}s", want.as_secs()),
                        format!("{}s{voided}", got.as_secs()),
                    );
                }
                for (name, want) in &expect.response_headers {
                    let got = header_of(&a.response.headers, name);
                    check(&format!("response header {name}"), want.clone(), got);
                }
            }
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// Every value of the field `name` in `fields`, joined as one line (empty when absent).
fn header_of(fields: &[HeaderField], name: &str) -> String {
    fields
        .iter()
        .filter(|f| f.name.eq_ignore_ascii_case(name))
        .map(|f| f.value.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
