//! The data path's phases, each in one place and named as rules name them (docs/rules.md): [`request`]
//! (before routing and lookup), the lookup (`lookup` in lib.rs), [`backend_request`] (a request leaving
//! for the origin), [`backend_response`] (the origin's answer, before the store decides on it),
//! [`deliver`] (every response leaving for the client) and [`error`] (what lacquerd answers itself when
//! no backend answered). Each runs its built-in steps and then the live rules of its phase.

use std::{fmt::Write, net::IpAddr, sync::Arc, time::Duration};

use bytes::Bytes;

use http::{
    header::{self, HeaderName},
    request::Parts,
    HeaderMap, HeaderValue, Response, StatusCode,
};

use lacquer_backends::{
    body::{self, Body},
    routing::{Route, Target},
};
use lacquer_policy::{
    headers::{normalize_selecting, strip_forwarding, strip_hop_by_hop},
    normalize,
    request::{classify, RequestClass},
    storable::Adjust,
    vary,
};
use lacquer_rules::{
    Ahead, Debug, Facts, Invalidation, Phase, RequestVerdict, Rules, Synthetic, Trace,
};

use crate::{coding::IDENTITY_LENGTH, live::Live};

/// What the request phase decided about a request it lets through to the lookup or the origin, beyond
/// the head it rewrote.
pub(crate) struct Admitted {
    /// The route the request takes.
    pub route: Arc<Route>,
    /// What the request's rules decided for the phases after this one.
    pub decided: Decided,
    /// Lookup, miss, pass or invalidation.
    pub class: RequestClass,
    /// A POST keyed by its body: read at most this many bytes of it before the lookup.
    pub body_cap: Option<u64>,
    /// A rule's `pipe`, for a request that asks for a connection upgrade: tunnelled to the backend.
    pub pipe: bool,
}

/// What the request phase's rules decided that later phases act on; carried by the lookup and its fills.
#[derive(Debug, Clone, Default)]
pub(crate) struct Decided {
    /// The request came over TLS.
    pub secure: bool,
    /// `Set-Cookie` is removed from the response (`strip_cookies`, or a route's `cookies = "strip"`).
    pub strip_set_cookie: bool,
    /// Request fields the stored response varies on, beyond its `Vary` (a rule's `key`).
    pub key: Vec<HeaderName>,
    /// The backend or director a rule chose instead of the route's.
    pub target: Option<Target>,
    /// The most stale an object in grace may be to be answered at once.
    pub request_grace: Option<Duration>,
    /// A deliver rule shows hit counts: hits are counted.
    pub counts_hits: bool,
    /// ... and may show them to this request: the count and the freshness left are carried to it.
    pub wants_debug: bool,
    /// A POST keyed by its body (`cache_body`): the body, read before the lookup, that every fill sends.
    pub body: Option<Bytes>,
    /// `Link` values sent in a `103 Early Hints` as the request goes to the origin (`early_hints`).
    pub early_hints: Vec<HeaderValue>,
}

/// The request field a POST keyed by its body carries from the lookup to the variant: the body's digest.
/// Never sent to the origin, and removed from what clients send.
pub(crate) const BODY_DIGEST: HeaderName = HeaderName::from_static("lacquer-body-digest");

/// The request field that carries which fields the configuration keys this request on beyond `Vary`
/// (rules' `key`, a route's key headers): their names, part of every variant stored for such a request. A reload that adds `key = ["cookie"]` is how an operator stops one cookie's object being served
/// for another; objects stored before it do not vary on the cookie, and without this field they would
/// still be served to every cookie (as Varnish's `vcl_hash` makes a changed hash reach new objects).
/// Never sent to the origin, and removed from what clients send.
pub(crate) const KEY_RULES: HeaderName = HeaderName::from_static("lacquer-key-rules");

/// Fields lacquerd puts in a request head for the variant alone: removed from what clients send, never
/// forwarded.
pub(crate) const PSEUDO_FIELDS: [HeaderName; 3] = [BODY_DIGEST, KEY_RULES, KEY_COOKIES];

/// The request field that carries the values of the cookies a rule's `key_cookie_values` keys the request
/// on: `name=value` for each, in the rules' order (`name=` when it is not sent), joined by `; `. The
/// cookies themselves are forwarded whole; this field is never sent, and removed from what clients send.
pub(crate) const KEY_COOKIES: HeaderName = HeaderName::from_static("lacquer-key-cookies");

/// The values of the cookies `names` in `headers`, as [`KEY_COOKIES`] carries them; `None` when origins
/// could read them otherwise than this does. Sharing one answer among the requests that send the same values
/// loosens caching, so every reading of the request must agree on them: an origin that takes the first of two
/// `X-Magento-Vary` cookies and a key made of the second would store one customer group's page for another.
/// Only the one plain spelling, `Name=value` with the name's own case, is read: some origins take a name in
/// another case (ASP.NET), spaces around a name or value trimmed away (Node's `cookie`), a quoted value
/// unquoted, a bare `Name` as a cookie, or bytes that are not text as text. A keyed cookie sent any of those
/// ways, or twice with two values, and the request passes.
fn cookie_values(headers: &HeaderMap, names: &[Arc<str>]) -> Option<HeaderValue> {
    let mut values: Vec<Option<&str>> = vec![None; names.len()];
    for line in headers.get_all(header::COOKIE) {
        for pair in line.to_str().ok()?.split(';') {
            let pair = pair.trim_start();
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let Some(i) = names
                .iter()
                .position(|n| n.eq_ignore_ascii_case(name.trim()))
            else {
                continue;
            };
            let plain = pair.contains('=')
                && name == &*names[i]
                && value == value.trim()
                && !value.starts_with('"');
            match values[i] {
                _ if !plain => return None,
                Some(seen) if seen != value => return None,
                _ => values[i] = Some(value),
            }
        }
    }
    let joined: Vec<String> = names
        .iter()
        .zip(values)
        .map(|(name, value)| format!("{name}={}", value.unwrap_or("")))
        .collect();
    HeaderValue::from_str(&joined.join("; ")).ok()
}

/// Whether a stored variant (its Vary `selection`) answers the request `parts`: the Vary match, and for a
/// request that carries a pseudo-field (a POST keyed by its body, a request keyed by rules) only a variant
/// made with it too. Stored without it (a GET's object, or one stored before a rule keyed on more), the
/// Vary match alone would give that object to every such request.
pub(crate) fn selects(selection: &[(String, String)], parts: &Parts) -> bool {
    vary::matches(selection, &parts.headers)
        && PSEUDO_FIELDS.iter().all(|field| {
            !parts.headers.contains_key(field)
                || selection.iter().any(|(name, _)| name == field.as_str())
        })
}

/// Marks a request the configuration keys on `names` beyond `Vary` with those names, sorted ([`KEY_RULES`]).
/// They come from the configuration, never from the client, and are header names: a field value as they
/// are, with nothing to collide.
fn key_rules(parts: &mut Parts, decided: &mut Decided, names: &[String]) {
    let mut all: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .chain(decided.key.iter().map(HeaderName::as_str))
        .collect();
    if all.is_empty() {
        return;
    }
    all.sort_unstable();
    all.dedup();
    let value = HeaderValue::from_str(&all.join(",")).expect("header names are a field value");
    parts.headers.insert(KEY_RULES, value);
    decided.key.push(KEY_RULES);
}

/// Whether a route or a rule reads the request's path otherwise as sent than as a lenient origin reads it
/// (read once, for both).
fn ambiguous(live: &Live, parts: &Parts) -> bool {
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    normalize::lenient(target).is_some_and(|lenient| {
        !(live.router.readings_agree(parts, &lenient) && live.rules.readings_agree(parts, &lenient))
    })
}

/// The most of `parts`'s body to read and key it by, when it is keyed: a POST a `cache_body` rule keys
/// (`rule_cap`), or a QUERY (RFC 10008; `cache.max_query_body`), whose declared length is within the cap.
fn keyed_body(parts: &Parts, rule_cap: Option<u64>, query_cap: u64) -> Option<u64> {
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let cap = if parts.method == http::Method::POST {
        rule_cap?
    } else if parts.method.as_str() == "QUERY" {
        Some(query_cap).filter(|&cap| cap > 0)?
    } else {
        return None;
    };
    declared.is_some_and(|len| len <= cap).then_some(cap)
}

/// Keys a POST or a QUERY by its `body` (read whole, within the cap): the digest goes into the head as a
/// field the variant is made of (with `Content-Type` and `Content-Encoding`), and the body into what every
/// fill sends.
///
/// Sharing one client's answer with every client that sends the same body loosens caching, so the digest
/// must be one nobody can collide: SHA-256. A fast non-cryptographic hash (xxh3 with its public secret)
/// let an attacker build, in microseconds, a body of their own text with a victim's body's digest, and
/// have their answer stored for the victim's query.
pub(crate) fn key_body(parts: &mut Parts, decided: &mut Decided, body: Bytes) {
    let digest = ring::digest::digest(&ring::digest::SHA256, &body);
    let mut hex = String::with_capacity(64);
    for b in digest.as_ref() {
        let _ = write!(hex, "{b:02x}");
    }
    let value = HeaderValue::from_str(&hex).expect("hex is a field value");
    parts.headers.insert(BODY_DIGEST, value);
    decided.key.push(BODY_DIGEST);
    // The same bytes read as another media type, or in another coding, are another query (RFC 10008
    // §2.2): the origin reads them with these fields, so the key does too.
    for field in [header::CONTENT_TYPE, header::CONTENT_ENCODING] {
        if !decided.key.contains(&field) {
            decided.key.push(field);
        }
    }
    decided.body = Some(body);
}

/// A request the request phase answers itself.
pub(crate) enum Answered {
    /// A `[[deny]]` rule refused it.
    Denied,
    /// A rule's `respond` (boxed: it is the rare outcome, and large).
    Synthetic(Box<Synthetic>),
    /// A rule's `ban` or `purge`: the request, as the rules left it, is an invalidation.
    Invalidate(Arc<Invalidation>),
}

/// The request phase: the target normalised, `[[deny]]`, the route, forwarding fields stripped as that
/// route says (before rules, so that rules may set them), the request rules (routed again when they
/// changed the host or path, and `[[deny]]` asked again), `Cookie` stripped, and the request classified.
/// The head is, from here on, what the key and variant are made of and what the origin receives.
/// `upgrade` is the `Upgrade` of a request asking for a connection upgrade (`pipe::requested`), gone with
/// the hop-by-hop fields: the request rules alone see it, so that a `pipe` rule can match on it.
pub(crate) fn request(
    live: &Live,
    parts: &mut Parts,
    client: IpAddr,
    secure: bool,
    upgrade: Option<&HeaderValue>,
    trace: Option<&mut Trace>,
) -> Result<Admitted, Answered> {
    normalize::apply(parts, &live.normalize);
    let denied = |parts: &Parts| live.deny.iter().any(|rule| rule.matches(parts, client));
    if denied(parts) {
        return Err(Answered::Denied);
    }
    let mut route = live.router.route(parts);
    // The fields responses vary on most, in one form, before the rules: the origin is asked, and the
    // variant made of, that form (cache-tests' vary-normalise: `en-US, fr` and `en-us,fr` share one stored
    // answer). A route that negotiates codings replaces `Accept-Encoding` with its own: not worth writing.
    normalize_selecting(&mut parts.headers, route.policy.compression.is_none());
    if route.strip_forwarding {
        strip_forwarding(&mut parts.headers);
    }
    let mut verdict = if live.rules.has(Phase::Request) {
        let healthy = |p: &Parts, chosen: Option<&str>| {
            let target = chosen.and_then(|name| live.router.target(name));
            live.router.route(p).is_healthy(target)
        };
        if let Some(protocol) = upgrade {
            parts.headers.insert(header::UPGRADE, protocol.clone());
        }
        let verdict = live.rules.request(parts, client, secure, &healthy, trace);
        // Never forwarded but by the tunnel, which sends the client's own.
        parts.headers.remove(header::UPGRADE);
        verdict
    } else {
        RequestVerdict::default()
    };
    if let Some(made) = verdict.respond.take() {
        return Err(Answered::Synthetic(Box::new(made)));
    }
    if let Some(invalidation) = verdict.invalidate.take() {
        return Err(Answered::Invalidate(invalidation));
    }
    if verdict.rerouted {
        if denied(parts) {
            return Err(Answered::Denied);
        }
        route = live.router.route(parts);
    }
    if route.strip_cookies {
        parts.headers.remove(header::COOKIE);
    }
    // A POST a rule keys by its body, and a QUERY, are classified as the GET they are cached as.
    let query_cap = route.policy.cache.max_query_body.as_u64();
    let body_cap = keyed_body(parts, verdict.cache_body, query_cap);
    let method = match body_cap {
        Some(_) => &http::Method::GET,
        None => &parts.method,
    };
    // `key_cookie_values` looks the request up although it carries `Cookie`, keyed on those values.
    let keyed_cookies = (!verdict.key_cookies.is_empty())
        .then(|| cookie_values(&parts.headers, &verdict.key_cookies));
    let cache_cookies = verdict.cache_cookies || keyed_cookies.is_some();
    let class = match classify(method, &parts.headers, &route.policy, cache_cookies) {
        RequestClass::Lookup | RequestClass::Miss(_) if route.pass => RequestClass::Pass("route"),
        RequestClass::Lookup | RequestClass::Miss(_) if matches!(keyed_cookies, Some(None)) => {
            RequestClass::Pass("ambiguous-cookie")
        }
        RequestClass::Lookup | RequestClass::Miss(_) if verdict.pass => RequestClass::Pass("rule"),
        RequestClass::Lookup | RequestClass::Miss(_) if verdict.pipe => RequestClass::Pass("pipe"),
        // A route or rule chose by one reading of the path alone (`/static/..;/account/me` is
        // `/account/me` to a lenient origin): what it loosens must not apply, so nothing is stored or
        // served from the cache (docs/rules.md, "Tightening and loosening").
        RequestClass::Lookup | RequestClass::Miss(_) if ambiguous(live, parts) => {
            RequestClass::Pass("ambiguous-path")
        }
        class => class,
    };
    let target = verdict
        .backend
        .as_deref()
        .and_then(|name| live.router.target(name))
        .cloned();
    let mut decided = Decided {
        secure,
        strip_set_cookie: verdict.strip_set_cookie || route.strip_cookies,
        key: verdict.key,
        target,
        request_grace: verdict.request_grace,
        counts_hits: live.rules.counts_hits(),
        wants_debug: live.rules.wants_debug(parts, client),
        body: None,
        early_hints: verdict.early_hints,
    };
    if matches!(class, RequestClass::Lookup | RequestClass::Miss(_)) {
        if let Some(Some(values)) = keyed_cookies {
            parts.headers.insert(KEY_COOKIES, values);
            decided.key.push(KEY_COOKIES);
        }
        key_rules(parts, &mut decided, &route.policy.key_headers);
    }
    Ok(Admitted {
        decided,
        body_cap,
        class,
        route: route.clone(),
        pipe: verdict.pipe && upgrade.is_some(),
    })
}

/// The backend-request phase, on the fields of a request leaving for the origin (a fill, a revalidation,
/// a pass) made for the client's request `parts`.
pub(crate) fn backend_request(
    rules: &Rules,
    parts: &Parts,
    client: IpAddr,
    decided: &Decided,
    headers: &mut HeaderMap,
) {
    if rules.has(Phase::BackendRequest) {
        let facts = Facts {
            parts,
            client,
            secure: decided.secure,
        };
        rules.backend_request(facts, headers, None);
    }
}

/// The backend-response phase's built-in part, on the head of every origin response to a fill or a
/// pass: hop-by-hop fields and the internal fields (the decoded length, the ESI template's mark) removed, `Set-Cookie` stripped when the
/// request's route or rules say so.
pub(crate) fn origin_fields(decided: &Decided, headers: &mut HeaderMap) {
    strip_hop_by_hop(headers);
    headers.remove(IDENTITY_LENGTH);
    headers.remove(crate::esi::fill::TEMPLATE);
    if decided.strip_set_cookie {
        headers.remove(header::SET_COOKIE);
    }
}

/// The backend-response phase's rules, on the head the store decides on (for a 304, the stored head
/// it updated), returning what they change in that decision.
pub(crate) fn backend_response(
    rules: &Rules,
    parts: &Parts,
    client: IpAddr,
    decided: &Decided,
    status: StatusCode,
    headers: &mut HeaderMap,
) -> Adjust {
    if !rules.has(Phase::BackendResponse) {
        return Adjust::default();
    }
    let facts = Facts {
        parts,
        client,
        secure: decided.secure,
    };
    rules.backend_response(facts, status, headers, None)
}

/// What the data path learned of a response that the deliver and error phases act on.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Delivering {
    /// An error lacquerd made for want of a backend's answer: the error phase replaces it.
    pub own_error: bool,
    /// What `debug_headers` may show: a hit's count and the freshness left.
    pub debug: Debug,
    /// A plain hit sent with the head the response-only deliver rules edited ahead of it
    /// ([`lacquer_rules::Rules::prepare`]): the deliver phase goes on from where they left.
    pub ahead: Option<Ahead>,
}

/// The deliver phase (and, for an error lacquerd made, the error phase), on a response leaving for the
/// client: the rules edit the head the data path prepared (for a hit, its own copy of the stored one) or
/// replace the response; `true` with a response a rule made in its place.
pub(crate) fn deliver(
    rules: &Rules,
    parts: &Parts,
    client: IpAddr,
    secure: bool,
    delivering: Delivering,
    mut resp: Response<Body>,
) -> (Response<Body>, bool) {
    let facts = Facts {
        parts,
        client,
        secure,
    };
    if delivering.own_error {
        return match rules.error(facts, resp.status(), None) {
            Some(made) => (synthetic(made), true),
            None => (resp, false),
        };
    }
    if !rules.has(Phase::Deliver) {
        return (resp, false);
    }
    let debug = delivering.debug;
    let status = resp.status();
    let headers = resp.headers_mut();
    let made = match delivering.ahead {
        Some(ahead) => rules.deliver_prepared(facts, status, headers, &|| debug, &ahead, None),
        None => rules.deliver(facts, status, headers, &|| debug, None),
    };
    match made {
        Some(made) => (synthetic(made), true),
        None => (resp, false),
    }
}

/// Whether the error phase or the deliver phase has anything to do for this request.
pub(crate) fn delivers(rules: &Rules) -> bool {
    rules.has(Phase::Deliver) || rules.has(Phase::Error)
}

/// A response a rule made, framed.
pub(crate) fn synthetic(made: Synthetic) -> Response<Body> {
    let Synthetic {
        status,
        mut headers,
        body: bytes,
    } = made;
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    let mut resp = Response::new(body::full(bytes));
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_cookie_values_are_read_as_every_origin_reads_them_or_not_at_all() {
        let names: Vec<Arc<str>> = vec!["X-Magento-Vary".into(), "store".into()];
        let cases: &[(&[&str], Option<&str>)] = &[
            (&[], Some("X-Magento-Vary=; store=")),
            (
                &["PHPSESSID=abc; X-Magento-Vary=9f2e; mage-cache-sessid=true"],
                Some("X-Magento-Vary=9f2e; store="),
            ),
            // Split over two lines (HTTP/2 sends one per cookie), and in another order.
            (
                &["store=de", "X-Magento-Vary=9f2e"],
                Some("X-Magento-Vary=9f2e; store=de"),
            ),
            // The same value twice reads one way; two values read two ways.
            (
                &["X-Magento-Vary=9f2e; X-Magento-Vary=9f2e"],
                Some("X-Magento-Vary=9f2e; store="),
            ),
            (&["X-Magento-Vary=9f2e; X-Magento-Vary=0000"], None),
            (&["X-Magento-Vary=9f2e", "X-Magento-Vary=0000"], None),
            // Spellings some origins read as the keyed cookie and others not: never keyed.
            (&["x-magento-vary=9f2e"], None),
            (&["X-Magento-Vary =9f2e"], None),
            (&["a=1; X-Magento-Vary= 9f2e"], None),
            (&["X-Magento-Vary=\"9f2e\""], None),
            (&["X-Magento-Vary"], None),
            (&["X-Magento-Varyx=1; a=1"], Some("X-Magento-Vary=; store=")),
        ];
        for (lines, want) in cases {
            let mut headers = HeaderMap::new();
            for line in *lines {
                headers.append(header::COOKIE, HeaderValue::from_str(line).unwrap());
            }
            let got = cookie_values(&headers, &names);
            assert_eq!(
                got.as_ref().map(|v| v.to_str().unwrap()),
                *want,
                "{lines:?}"
            );
        }
        let mut headers = HeaderMap::new();
        headers.append(
            header::COOKIE,
            HeaderValue::from_bytes(b"X-Magento-Vary=\xe9t\xe9").unwrap(),
        );
        assert_eq!(
            cookie_values(&headers, &names),
            None,
            "bytes that are not text"
        );
    }
}
