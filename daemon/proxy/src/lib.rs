//! The client-facing request flow: classify, look up, coalesce misses, pass the rest.

#![warn(missing_docs)]

pub mod access_log;
pub mod cluster;
pub mod coalesce;
mod coding;
pub mod error_page;
pub mod explain;
mod fetch;
mod forward;
pub mod hls;
pub mod invalidation;
pub mod log_format;
#[cfg(test)]
mod memory;
mod peer;
mod phase;
mod pipe;
pub mod prefetch;
mod prepared;
mod purge_method;
mod repeats;
mod respond;
pub mod siblings;
mod slice;
pub mod stats;
pub mod store;
#[cfg(test)]
mod tests;
mod timing;
mod trace;
pub mod worker;

use std::{
    borrow::Cow,
    future::Future,
    net::IpAddr,
    sync::{atomic::Ordering::Relaxed, Arc},
    time::Duration,
};

use http::{header, request::Parts, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use lacquer_edge::{Client, EdgeStats, RequestBody};
use lacquer_rules::Phase;
use lacquer_storage::{ChunkRead, ObjectMeta, ObjectSet, Tier};
use lacquer_telemetry::Trace;

use self::respond::Outcome;
use lacquer_backends::{
    body::{self, Body, BoxError},
    routing::Route,
    BackendError, ClientBodyError,
};
use lacquer_policy::{
    encoding::{Coded, Coding, Delivery},
    head,
    headers::strip_hop_by_hop,
    key::primary_key,
    range,
    request::{answered_here, host_from_authority, AnsweredHere, RequestClass},
    stale::{usability, Usability},
    storable::NotStored,
};

use crate::{
    coalesce::{Fetch, FetchError, HeadError, Joined},
    coding::{Conversion, Negotiated},
    fetch::{Ask, Fill},
    phase::{Admitted, Answered, Decided},
    prepared::Prepared,
    stats::{add, inc, Stats},
    store::CacheStore,
    worker::{Shared, Worker},
};

impl lacquer_edge::Service for Worker {
    type Body = Body;
    type Error = BoxError;

    fn call(
        self: Arc<Self>,
        req: Request<RequestBody>,
        client: Client,
    ) -> impl Future<Output = Response<Body>> + Send + 'static {
        let started = lacquer_clock::monotonic();
        let mut req = req;
        let recording = self.shared.access_log.begin(&mut req, client.ip);
        let traced = self.shared.telemetry.begin(&mut req, client.ip);
        let html = error_page::wants_html(req.headers());
        let head_only = req.method() == Method::HEAD;
        async move {
            let resp = if client.refused {
                too_many_connections()
            } else if client.too_early {
                inc(&self.shared.stats.requests);
                too_early()
            } else {
                handle(self.clone(), client, req).await
            };
            let resp = if resp.extensions().get::<error_page::Failure>().is_some() {
                let page = self.shared.live.load().error_pages.apply(html, resp);
                // The page's length stays in the head; its bytes must not follow a HEAD (see `handle`), nor an
                // empty DATA frame, which a counting body that cannot say it is empty would make HTTP/2 send.
                if head_only {
                    page.map(|_| body::empty())
                } else {
                    counted(page, self.shared.stats.clone())
                }
            } else {
                resp
            };
            let resp = timing::timed(resp, self.shared.stats.clone(), started);
            let resp = match recording {
                Some(r) => r.respond(resp),
                None => resp,
            };
            match traced {
                Some(span) => trace::respond(span, resp),
                None => resp,
            }
        }
    }

    fn stats(&self) -> &EdgeStats {
        &self.shared.stats.edge
    }
}

fn too_many_connections() -> Response<Body> {
    let mut resp = Response::new(body::empty());
    *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    resp.extensions_mut().insert(error_page::Failure);
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

/// The answer to a request in TLS early data that may not be answered before the handshake completes: the
/// client sends it again once it has (RFC 8470).
fn too_early() -> Response<Body> {
    let mut resp = Response::new(body::empty());
    *resp.status_mut() = StatusCode::TOO_EARLY;
    resp
}

/// Answers one request: checks its head, routes it, then looks it up, passes it or invalidates with it.
pub async fn handle(
    worker: Arc<Worker>,
    client: Client,
    req: Request<RequestBody>,
) -> Response<Body> {
    let head_only = req.method() == Method::HEAD;
    let resp = answer(worker, client, req).await;
    if head_only {
        // Whatever path answered (an error page, a pass, a stored object), a HEAD response has no body:
        // HTTP/2 sending one breaks the stream (RFC 9113 §8.1.1), HTTP/1.1 the connection.
        return resp.map(|_| body::empty());
    }
    resp
}

async fn answer(worker: Arc<Worker>, client: Client, req: Request<RequestBody>) -> Response<Body> {
    let stats = &worker.shared.stats;
    inc(&stats.requests);
    let (mut parts, body) = req.into_parts();
    if let Err(e) = head::check(&parts) {
        inc(&stats.bad_requests);
        return refused(e.status(), &e.to_string(), None);
    }
    if let Some(what) = answered_here(&parts) {
        return own_answer(what);
    }
    host_from_authority(&mut parts);
    // Taken before the hop-by-hop fields go: a `pipe` rule's tunnel sends them on.
    let upgrade = pipe::Upgrade::take(&mut parts);
    // From here on the head is the one the origin receives: the key, the variant, the class and every
    // rule are made from it, never from fields that are not forwarded.
    strip_hop_by_hop(&mut parts.headers);
    // Only a cluster's members mark requests as forwarded, and prove it; neither header reaches the origin.
    let forwarded_by = parts.headers.remove(&cluster::FORWARDED_BY);
    let forward_proof = parts.headers.remove(&cluster::FORWARD_PROOF);
    for field in &phase::PSEUDO_FIELDS {
        parts.headers.remove(field);
    }
    let Client {
        ip: client,
        max_request_body,
        secure,
        ..
    } = client;
    let (admitted, delivers, asked) = {
        // A guard, not a counted reference: nothing is awaited while it is held.
        let live = worker.shared.live.load();
        // Prefetches are the requests players would send: made from the head as this one was sent (its
        // CMCD data too, which a `[normalize]` may strip from the key), and run through the request phase
        // once, as theirs would be.
        let asked = live.prefetching.then(|| Arc::new(parts.clone()));
        let shown = upgrade.as_ref().map(pipe::Upgrade::protocol);
        let admitted = phase::request(&live, &mut parts, client, secure, shown, None);
        (admitted, phase::delivers(&live.rules), asked)
    };
    let Admitted {
        route,
        mut decided,
        class,
        body_cap,
        pipe,
    } = match admitted {
        Ok(admitted) => admitted,
        Err(Answered::Denied) => {
            inc(&stats.denied);
            return refused(StatusCode::FORBIDDEN, "denied", None);
        }
        Err(Answered::Synthetic(made)) => return phase::synthetic(*made),
    };
    access_log::note_route(&parts, || worker.shared.live().router.describe(&route));
    access_log::step(&parts, "Class", || match class {
        RequestClass::Lookup => "lookup".to_owned(),
        RequestClass::Miss(why) => format!("miss without lookup: {why}"),
        RequestClass::Pass(why) => format!("pass: {why}"),
        RequestClass::Invalidate => format!("pass: {} invalidates on success", parts.method),
    });
    if purge_method::is_invalidation(&parts.method) {
        return purge_method::handle(&worker, client, &parts).await;
    }
    let body = match body_cap {
        Some(cap) => match Limited::new(body, cap as usize).collect().await {
            Ok(read) => {
                phase::key_body(&mut parts, &mut decided, read.to_bytes());
                None
            }
            Err(_) => {
                inc(&stats.bad_requests);
                return refused(StatusCode::BAD_REQUEST, "request body failed", None);
            }
        },
        None => Some(body),
    };
    if let Some(Err(wait)) = route.rate_limit.as_ref().map(|l| l.check(client)) {
        inc(&stats.rate_limited);
        return refused(
            StatusCode::TOO_MANY_REQUESTS,
            "too many requests",
            Some(wait),
        );
    }
    if let Some(upgrade) = upgrade.filter(|_| pipe) {
        let kept = delivers.then(|| parts.clone());
        let resp = match route.pick_from(decided.target.as_ref(), &primary_key(&parts)) {
            Ok(backend) => {
                access_log::note_backend(&parts, backend.name());
                pipe::tunnel(&worker, client, backend, &decided, parts, upgrade).await
            }
            Err(e) => {
                inc(&stats.backend_unavailable);
                repeats::WARNINGS.warn("nothing to tunnel to", &primary_key(&parts), &e);
                let outcome = Outcome::Pass {
                    unsafe_method: false,
                    detail: None,
                };
                phase::own_error(respond::failure(e.status(), outcome))
            }
        };
        // A tunnel's `101` is no response the deliver rules could edit or replace: the connection is
        // the origin's from here on.
        let mut resp = match kept.filter(|_| resp.status() != StatusCode::SWITCHING_PROTOCOLS) {
            Some(parts) => {
                let keep = timing::Outcome::keep(&resp);
                let live = worker.shared.live.load();
                let mut resp = phase::deliver(&live.rules, &parts, client, secure, resp);
                keep(&mut resp);
                resp
            }
            None => resp,
        };
        respond::withhold_tags(resp.headers_mut(), &route.policy.cache);
        return counted(resp, worker.shared.stats.clone());
    }
    if let (RequestClass::Lookup | RequestClass::Miss(_), Some(cluster)) =
        (&class, &worker.shared.cluster)
    {
        let forwarded = forwarded_by.as_ref().is_some_and(|by| {
            let member = forward_proof
                .as_ref()
                .is_some_and(|proof| cluster.forwarded_by_member(by, proof, &parts));
            if !member {
                // Routed as any client's request: a mark anyone could send must not pin a key here.
                inc(&stats.peer_requests_unproven);
            }
            member
        });
        if forwarded {
            // Never forwarded twice: whatever this node thinks of the ring, it answers.
            inc(&stats.peer_requests_in);
        } else if let Some(peer) = cluster.owner(&primary_key(&parts)) {
            let proof = cluster.forward_proof(&parts);
            if let Some(resp) =
                peer::ask(&worker, client, &peer, cluster.node(), proof, &parts).await
            {
                return counted(resp, worker.shared.stats.clone());
            }
        }
    }
    let prefetching = route.prefetch;
    let asked = asked.filter(|_| {
        class == RequestClass::Lookup && (prefetching.playlist > 0 || prefetching.cmcd)
    });
    if let Some(asked) = &asked {
        prefetch::on_request(
            &worker,
            asked,
            client,
            secure,
            prefetching.playlist,
            prefetching.cmcd,
        );
    }
    let (resp, parts) = match class {
        RequestClass::Lookup | RequestClass::Miss(_) => {
            let own_fetch = matches!(class, RequestClass::Miss(_));
            lookup(&worker, client, &route, &decided, parts, asked, own_fetch).await
        }
        RequestClass::Pass(_) | RequestClass::Invalidate => {
            let body = body.expect("only a looked-up POST has its body read");
            let outcome = match class {
                RequestClass::Pass(why) => Outcome::Pass {
                    unsafe_method: false,
                    detail: Some(why),
                },
                _ => Outcome::Pass {
                    unsafe_method: true,
                    detail: None,
                },
            };
            // A pass hands its head to the origin request; the deliver phase needs a copy to match on.
            let kept = delivers.then(|| Arc::new(parts.clone()));
            let resp = match limited(body, &parts, max_request_body) {
                Some(body) => pass(&worker, client, &route, &decided, parts, body, outcome).await,
                None => {
                    inc(&stats.bodies_too_large);
                    body_too_large()
                }
            };
            (resp, kept)
        }
    };
    let mut resp = match parts.filter(|_| delivers) {
        Some(parts) => {
            let keep = timing::Outcome::keep(&resp);
            let live = worker.shared.live.load();
            let mut resp = phase::deliver(&live.rules, &parts, client, secure, resp);
            keep(&mut resp);
            resp
        }
        None => resp,
    };
    // After the deliver rules, which see the response as the origin sent it (a hit's head prepared
    // ahead of them holds its tags).
    respond::withhold_tags(resp.headers_mut(), &route.policy.cache);
    counted(resp, worker.shared.stats.clone())
}

/// The methods an `Allow` field names: those this proxy forwards or answers (its routes may refuse some).
const ALLOWED: HeaderValue =
    HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE");

/// The answer to a request that is not forwarded ([`AnsweredHere`]).
fn own_answer(what: AnsweredHere) -> Response<Body> {
    let mut resp = match what {
        AnsweredHere::ServerOptions => Response::new(body::empty()),
        AnsweredHere::Connect => refused(
            StatusCode::METHOD_NOT_ALLOWED,
            "CONNECT is not supported",
            None,
        ),
    };
    resp.headers_mut().insert(header::ALLOW, ALLOWED);
    resp
}

/// The request body to forward, cut off past `max` bytes; `None` when its declared length is over `max`.
fn limited(body: RequestBody, parts: &Parts, max: u64) -> Option<Body> {
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > max) {
        return None;
    }
    Some(
        Limited::new(body.map_err(ClientBodyError), max as usize)
            .map_err(BoxError::from)
            .boxed_unsync(),
    )
}

/// A request refused before any lookup; `retry` becomes `Retry-After` in whole seconds, at least 1.
fn refused(status: StatusCode, message: &str, retry: Option<Duration>) -> Response<Body> {
    let mut resp = respond::error(
        status,
        Outcome::Pass {
            unsafe_method: false,
            detail: None,
        },
        message,
    );
    resp.extensions_mut().insert(timing::Made);
    if let Some(wait) = retry {
        let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        resp.headers_mut()
            .insert(header::RETRY_AFTER, seconds.max(1).into());
    }
    resp
}

/// A 503 the client may retry in a second: lacquerd holds back a request the origin is already busy with.
fn busy_briefly() -> Response<Body> {
    let mut resp = respond::failure(
        StatusCode::SERVICE_UNAVAILABLE,
        Outcome::Pass {
            unsafe_method: false,
            detail: None,
        },
    );
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

fn body_too_large() -> Response<Body> {
    refused(
        StatusCode::PAYLOAD_TOO_LARGE,
        "request body too large",
        None,
    )
}

/// Counts body bytes as they go out to the client.
fn counted(resp: Response<Body>, stats: Arc<Stats>) -> Response<Body> {
    resp.map(|b| {
        b.map_frame(move |frame| {
            if let Some(data) = frame.data_ref() {
                add(&stats.bytes_out, data.len() as u64);
            }
            frame
        })
        .boxed_unsync()
    })
}

/// Answers a request from the store, or from a fetch; with `own_fetch`, from a fetch of its own only
/// (never the store, never another request's fetch).
async fn lookup<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    client: IpAddr,
    route: &Arc<Route>,
    decided: &Decided,
    mut parts: Parts,
    asked: Option<Arc<Parts>>,
    own_fetch: bool,
) -> (Response<Body>, Option<Arc<Parts>>) {
    let parts_back = |resp: Response<Body>, parts: &Arc<Parts>| (resp, Some(parts.clone()));
    let shared = &worker.shared;
    let key = primary_key(&parts);
    access_log::step(&parts, "Key", || key.clone());
    shared.prefetch.claim(&key, &shared.stats);
    // From here on the request carries the `Accept-Encoding` the origin is sent and the variant is made
    // from; the client's own decides only how the body leaves.
    let negotiated = route
        .policy
        .compression
        .as_ref()
        .map(|negotiation| Negotiated::take(&mut parts.headers, negotiation));
    let parts = Arc::new(parts);
    let ctx = Ctx {
        client,
        route,
        decided,
        negotiated: negotiated.as_ref(),
        asked: asked.as_ref(),
    };
    if own_fetch {
        let nothing = Stale {
            found: None,
            vouched: false,
        };
        let alone = miss(worker, &ctx, &key, &parts, Joining::Never, nothing, None).await;
        let resp = alone.expect("a fetch of its own never waits for another variant");
        return parts_back(resp, &parts);
    }
    let sliced = route
        .slice
        .filter(|_| matches!(parts.method, Method::GET | Method::HEAD) && decided.body.is_none());
    if let Some(size) = sliced {
        if let Some(resp) = slice::serve(worker, &ctx, &key, &parts, size).await {
            return parts_back(resp, &parts);
        }
    }
    let mut may_wait = true;
    let mut looked_again = false;
    // Parts are tried once: when they could not answer, the ordinary way does.
    let mut parts_tried = false;
    loop {
        // Noted before the store is read: see `Coalescer::finished`.
        let finished = shared.coalescer.finished();
        // Whether this node vouches is read before the store: a node that catches up while the lookup
        // runs may have applied an invalidation the lookup did not see, and must not vouch for its result.
        let vouched = vouched(shared);
        let now = lacquer_clock::now_ms();
        let mut stale = None;
        let looking = Trace::of(&parts.extensions).map(Trace::lookup);
        let found = find_variant(worker, &key, &parts).await;
        if let Some(span) = looking {
            span.set("lacquer.found", found.is_some());
        }
        let found = match found {
            // An object stored in parts (ranges forwarded to the origin) answers while it is fresh; the
            // ordinary way fetches the whole, or forwards the range, otherwise.
            Some(found) if found.set.partial(found.meta().generation).is_some() => {
                let usable = usability(found.meta().lifetime(now));
                let fresh = within_request_grace(usable, found.meta(), now, decided);
                let readable = matches!(parts.method, Method::GET | Method::HEAD);
                if let (Usability::Fresh, true, true, false) =
                    (fresh, vouched, readable, parts_tried)
                {
                    parts_tried = true;
                    let served = slice::serve_parts(worker, &ctx, &key, &parts, &found, finished);
                    if let Some(resp) = served.await {
                        return parts_back(resp, &parts);
                    }
                }
                None
            }
            found => found,
        };
        if found.is_none() {
            access_log::step(&parts, "Lookup", || {
                "nothing stored for this variant".into()
            });
        }
        if let Some(found) = found {
            let ttl_s = found.meta().remaining_ttl_ms(now) / 1000;
            let usable = within_request_grace(
                usability(found.meta().lifetime(now)),
                found.meta(),
                now,
                decided,
            );
            access_log::step(&parts, "Lookup", || {
                let (variant, of) = (found.index + 1, found.set.variants.len());
                let state = match usable {
                    Usability::Fresh => format!("fresh, {ttl_s} s left"),
                    Usability::Grace => "stale, within grace: served while it is refetched".into(),
                    Usability::OnError => "stale, kept for origin errors only".into(),
                    Usability::Unusable => "stale, past grace".into(),
                };
                let unvouched = if vouched {
                    ""
                } else {
                    "; this node may have missed an invalidation: the origin confirms it"
                };
                format!("variant {variant} of {of}, {state}{unvouched}")
            });
            match usable {
                // An invalidation this node has not seen may cover what it stores: the origin confirms
                // the object (a 304 to its validators) or sends it again.
                Usability::Fresh | Usability::Grace if !vouched => {
                    inc(&shared.stats.cluster_revalidations);
                    stale = Some(found);
                }
                Usability::Fresh => {
                    if let Some(resp) = serve_stored(
                        worker,
                        &ctx,
                        &key,
                        &parts,
                        &found,
                        now,
                        Outcome::Hit { ttl_s },
                    )
                    .await
                    {
                        return parts_back(resp, &parts);
                    }
                }
                Usability::Grace => {
                    let outcome = Outcome::Stale {
                        ttl_s,
                        origin_failed: false,
                        fwd_status: None,
                    };
                    if let Some(resp) =
                        serve_stored(worker, &ctx, &key, &parts, &found, now, outcome).await
                    {
                        inc(&shared.stats.stale_served);
                        refresh(worker, &ctx, &key, &parts, found);
                        return parts_back(resp, &parts);
                    }
                }
                Usability::OnError | Usability::Unusable => stale = Some(found),
            }
        }
        let joining = if may_wait {
            Joining::MayWait
        } else {
            Joining::NoWait
        };
        let looked_up_at = (!looked_again).then_some(finished);
        let stale = Stale {
            found: stale,
            vouched,
        };
        match miss(worker, &ctx, &key, &parts, joining, stale, looked_up_at).await {
            Some(resp) => return parts_back(resp, &parts),
            // Another variant's fetch has settled, or a fetch finished since the lookup: look up again,
            // this time without waiting for anyone.
            None => {
                may_wait = false;
                looked_again = true;
            }
        }
    }
}

/// Whether this node may serve what it stores without asking the origin: always on a single node; in a
/// cluster, while it can vouch for having applied every invalidation.
fn vouched<S: CacheStore>(shared: &Shared<S>) -> bool {
    shared.cluster.as_ref().is_none_or(|c| c.vouched())
}

/// Who a lookup answers and how its body may be coded.
struct Ctx<'a> {
    client: IpAddr,
    route: &'a Arc<Route>,
    /// What the request phase's rules decided.
    decided: &'a Decided,
    /// The client's `Accept-Encoding` when the route negotiates codings.
    negotiated: Option<&'a Negotiated>,
    /// The head as the client sent it, when the route prefetches (see [`fetch::Fill::asked`]).
    asked: Option<&'a Arc<Parts>>,
}

impl Ctx<'_> {
    /// How a response with `headers` leaves for this client.
    fn delivery(&self, headers: &HeaderMap) -> Delivery {
        self.negotiated
            .map_or(Delivery::AsStored, |n| n.delivery(headers))
    }

    /// [`Ctx::delivery`] for a stored body whose coding is known already.
    fn delivery_of(&self, coded: Coded, headers: &HeaderMap) -> Delivery {
        self.negotiated
            .map_or(Delivery::AsStored, |n| n.delivery_of(coded, headers))
    }

    fn conversion(&self, delivery: Delivery, stats: &Arc<Stats>) -> Conversion {
        let policy = &self.route.policy;
        let limit = policy.cache.max_object_size.as_u64();
        let settings = policy.compression.as_ref().map(|n| &n.settings);
        Conversion::new(delivery, limit, settings, stats)
    }

    /// Sends the request to the origin as the client sent it, `Accept-Encoding` included: nothing stored
    /// or fetched is in a coding this client may get.
    async fn forward_as_sent<S: CacheStore>(
        &self,
        worker: &Worker<S>,
        parts: &Parts,
    ) -> Response<Body> {
        inc(&worker.shared.stats.coding_forwarded);
        let mut parts = parts.clone();
        if let Some(n) = self.negotiated {
            n.restore(&mut parts.headers);
        }
        pass(
            worker,
            self.client,
            self.route,
            self.decided,
            parts,
            body::empty(),
            Outcome::Pass {
                unsafe_method: false,
                detail: None,
            },
        )
        .await
    }
}

/// A stored variant selected for a request.
#[derive(Clone)]
pub struct Found {
    set: Arc<ObjectSet>,
    index: usize,
}

impl Found {
    /// The variant's metadata, as stored when it was looked up.
    pub fn meta(&self) -> &ObjectMeta {
        &self.set.variants[self.index]
    }

    /// Whether a fill can ask the origin to confirm it instead of sending the body again.
    pub(crate) fn revalidatable(&self) -> bool {
        let meta = self.meta();
        meta.header("etag").is_some() || meta.header("last-modified").is_some()
    }
}

/// The stored variant this request selects, whole or in parts, fresh or not (the sweeper removes what is
/// past keeping).
pub(crate) async fn find_variant<S: CacheStore>(
    worker: &Worker<S>,
    key: &str,
    parts: &Parts,
) -> Option<Found> {
    let set = worker.shared.store.lookup(key).await.unwrap_or_else(|e| {
        tracing::warn!(key, error = %e, "lookup failed; treating as a miss");
        None
    })?;
    let index = set
        .variants
        .iter()
        .position(|m| phase::selects(&m.variant, parts))?;
    Some(Found { set, index })
}

/// Answers from a stored object whose body is all there (every chunk present, the first ones read: see
/// `Store::open_body`); `None` (and the metadata dropped) when it is not.
async fn serve_stored<S: CacheStore>(
    worker: &Worker<S>,
    ctx: &Ctx<'_>,
    key: &str,
    parts: &Parts,
    found: &Found,
    now: u64,
    outcome: Outcome,
) -> Option<Response<Body>> {
    let shared = &worker.shared;
    let meta = found.meta();
    let prepared = prepared::prepared(meta);
    let delivery = ctx.delivery_of(prepared.coded, &prepared.head);
    if delivery == Delivery::Forward {
        return Some(ctx.forward_as_sent(worker, parts).await);
    }
    if let Delivery::Decode(coding) = delivery {
        if let Some((sibling, conversion, first)) = sibling(worker, ctx, key, found, coding).await {
            record_hit(&shared.stats, first.tier);
            access_log::step(parts, "Body", || {
                format!("stored, {:?} tier, its {coding:?} sibling", first.tier)
            });
            let body = &found.set.siblings[sibling].body;
            let Conversion::Sibling { coding, .. } = conversion else {
                unreachable!("a sibling is sent as one");
            };
            let make = |m: &ObjectMeta| Prepared::sibling(&prepared, coding, m.length);
            let owned;
            let head = match body.prepared(make) {
                Some(head) => head,
                None => {
                    owned = make(body);
                    &owned
                }
            };
            let resp = respond::stored(
                shared.store.clone(),
                found.set.clone(),
                found.index,
                Some(sibling),
                Some(first.data),
                now,
                outcome,
                parts,
                head,
                &conversion,
                &shared.live.load().rules,
            );
            return Some(with_debug(resp, ctx, &prepared, meta, now));
        }
    }
    let first = if meta.length == 0 {
        None
    } else {
        match shared.store.open_body(meta).await {
            Ok(Some(chunk)) => Some(chunk),
            Ok(None) => {
                inc(&shared.stats.bodies_lost);
                if let Err(e) = shared.store.remove_generation(key, meta.generation) {
                    tracing::warn!(key, error = %e, "cannot drop metadata of a lost body");
                }
                return None;
            }
            Err(e) => {
                tracing::warn!(key, error = %e, "reading a stored body failed; refetching");
                return None;
            }
        }
    };
    let tier = first.as_ref().map_or(Tier::Memory, |c| c.tier);
    record_hit(&shared.stats, tier);
    access_log::step(parts, "Body", || format!("stored, {tier:?} tier"));
    let data = first.map(|c| c.data);
    let resp = respond::stored(
        shared.store.clone(),
        found.set.clone(),
        found.index,
        None,
        data,
        now,
        outcome,
        parts,
        &prepared,
        &ctx.conversion(delivery, &shared.stats),
        &shared.live.load().rules,
    );
    Some(with_debug(resp, ctx, &prepared, meta, now))
}

/// Counts the hit while a rule shows hit counts (`debug_headers`), and carries the count and the
/// freshness left to the deliver phase when that rule may show them to this request.
fn with_debug(
    mut resp: Response<Body>,
    ctx: &Ctx<'_>,
    prepared: &Prepared,
    meta: &ObjectMeta,
    now: u64,
) -> Response<Body> {
    if ctx.decided.counts_hits {
        let hits = prepared.hits.count();
        if ctx.decided.wants_debug {
            let debug = lacquer_rules::Debug {
                hits: Some(hits),
                ttl_s: Some(meta.remaining_ttl_ms(now) / 1000),
            };
            resp.extensions_mut().insert(phase::DebugInfo(debug));
        }
    }
    resp
}

/// `usability`, with the request rules' `request_grace` applied: an object in grace staler than that
/// waits for the origin, and still stands in if the origin fails.
fn within_request_grace(
    usable: Usability,
    meta: &ObjectMeta,
    now: u64,
    decided: &Decided,
) -> Usability {
    match (usable, decided.request_grace) {
        (Usability::Grace, Some(limit))
            if meta.remaining_ttl_ms(now).unsigned_abs() > limit.as_millis() as u64 =>
        {
            Usability::OnError
        }
        (usable, _) => usable,
    }
}

/// The sibling of `found` this client should be sent instead of converting its body (stored in `coding`)
/// on the way out, its index in the set, how it is sent and its chunk 0; `None` when there is none to send.
/// A sibling is then made, for the clients after this one, unless `[compression] conversions` is 0.
async fn sibling<S: CacheStore>(
    worker: &Worker<S>,
    ctx: &Ctx<'_>,
    key: &str,
    found: &Found,
    coding: Coding,
) -> Option<(usize, Conversion, ChunkRead)> {
    let shared = &worker.shared;
    let (negotiated, negotiation) = (ctx.negotiated?, ctx.route.policy.compression.as_ref()?);
    let meta = found.meta();
    if negotiation.settings.conversions == 0 || meta.length == 0 {
        return None;
    }
    let wanted = siblings::coding_for(coding, negotiated.takes_gzip());
    if let Some(index) = found
        .set
        .sibling(meta.generation, wanted.map(Coding::token))
    {
        match shared
            .store
            .open_body(&found.set.siblings[index].body)
            .await
        {
            Ok(Some(first)) => {
                let conversion = Conversion::Sibling {
                    coding: wanted,
                    stats: shared.stats.clone(),
                };
                return Some((index, conversion, first));
            }
            // Made again below: the new one replaces it.
            Ok(None) => inc(&shared.stats.representations_evicted),
            Err(e) => tracing::warn!(key, error = %e, "reading a representation failed"),
        }
    }
    siblings::start(
        &shared.store,
        &shared.making,
        &shared.stats,
        &negotiation.settings,
        ctx.route.policy.cache.max_object_size.as_u64(),
        siblings::Wanted {
            key,
            found,
            stored: coding,
            coding: wanted,
        },
    );
    None
}

/// Starts one background fetch (a revalidation when the object has validators) for a key served in grace,
/// unless a fetch for it is already running.
fn refresh<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    ctx: &Ctx<'_>,
    key: &str,
    parts: &Arc<Parts>,
    found: Found,
) {
    let Ctx { client, route, .. } = *ctx;
    let now = worker.shared.store.mark();
    let transit_buffer = route.policy.cache.transit_buffer.as_u64();
    let invalidated = |since| worker.shared.store.invalidated_after(since, key);
    if let Joined::Leader(fetch) =
        worker
            .shared
            .coalescer
            .join(key, now, transit_buffer, None, invalidated)
    {
        let fill = Fill {
            key: key.to_owned(),
            registered: true,
            parts: parts.clone(),
            asked: ctx.asked.cloned(),
            client,
            route: route.clone(),
            decided: ctx.decided.clone(),
            stale: found.revalidatable().then_some(found),
            background: true,
            stand_in: true,
            part: None,
            if_range: None,
        };
        tokio::spawn(fetch::run(worker.clone(), fetch, fill));
    }
}

fn record_hit(stats: &Stats, tier: Tier) {
    inc(&stats.hits);
    inc(match tier {
        Tier::Memory => &stats.hits_memory,
        Tier::Disk => &stats.hits_disk,
    });
}

/// What a lookup found that a miss may revalidate or fall back on, and whether this node vouched for it
/// when the lookup began (a cluster node catching up does not).
struct Stale {
    found: Option<Found>,
    vouched: bool,
}

/// How a miss may share a fetch with other requests for the key.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Joining {
    /// Join the fetch in flight, and wait for it to settle when it turns out to be another variant's.
    MayWait,
    /// Join the fetch in flight, but fetch alone when it is another variant's.
    NoWait,
    /// Always fetch alone (the request must not take another's answer, nor give its own).
    Never,
}

/// Answers a request the store could not, from a fetch: a new one, or one in flight for the same key.
/// `None` when the fetch in flight is for another variant and has now settled, or when a fetch finished
/// since the caller's lookup (`looked_up_at`, see [`Coalescer::join`]), so the caller should look up again
/// (with [`Joining::NoWait`] it fetches alone instead).
async fn miss<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    ctx: &Ctx<'_>,
    key: &str,
    parts: &Arc<Parts>,
    joining: Joining,
    stale: Stale,
    looked_up_at: Option<u64>,
) -> Option<Response<Body>> {
    let Stale {
        found: stale,
        vouched,
    } = stale;
    let may_wait = joining == Joining::MayWait;
    let shared = &worker.shared;
    let Ctx { client, route, .. } = *ctx;
    let transit_buffer = route.policy.cache.transit_buffer.as_u64();
    let stand_in = stale.as_ref().is_some_and(|found| {
        usability(found.meta().lifetime(lacquer_clock::now_ms())) != Usability::Unusable
    });
    // A range of an object not stored goes to the origin as that range, coalesced with fetches of the same
    // range alone.
    let forwarded = stale
        .is_none()
        .then(|| {
            let whole_unstored = || shared.coalescer.is_hit_for_miss(key);
            forwarded_range(route, ctx.decided, parts, whole_unstored)
        })
        .flatten();
    let fetch_key = forwarded.map_or(Cow::Borrowed(key), |ask| Cow::Owned(ask.key(key)));
    // Starts the coalescer's fetch for the key (`leader`), or one of this request's own, revalidating the
    // stale object when `revalidate`. The reader exists before the fill task starts, so the fill never sees
    // a fetch without readers that it would cancel.
    let start = |leader: Option<Arc<Fetch<S>>>, revalidate: bool| {
        let registered = leader.is_some();
        let fetch = leader.unwrap_or_else(|| Fetch::new(shared.store.mark(), transit_buffer));
        let reader = fetch.reader();
        let fill = Fill {
            key: key.to_owned(),
            registered,
            parts: parts.clone(),
            asked: ctx.asked.cloned(),
            client,
            route: route.clone(),
            decided: ctx.decided.clone(),
            stale: stale
                .clone()
                .filter(|found| revalidate && found.revalidatable()),
            background: false,
            stand_in,
            part: forwarded,
            if_range: None,
        };
        tokio::spawn(fetch::run(worker.clone(), fetch.clone(), fill));
        (fetch, reader)
    };
    let now = shared.store.mark();
    let joined = (joining != Joining::Never).then(|| {
        let invalidated = |since| shared.store.invalidated_after(since, key);
        shared
            .coalescer
            .join(&fetch_key, now, transit_buffer, looked_up_at, invalidated)
    });
    // A blocking reload that would go to the origin takes a place among its playlist's there, or is
    // refused before it is sent; it keeps the place until the origin answers.
    let blocking = hls::playlist(parts);
    let slot = match (&blocking, &joined) {
        (Some(_), Some(Joined::Waiter(_) | Joined::LookAgain)) | (None, _) => None,
        (Some(playlist), _) => {
            let cache = &route.policy.cache;
            let per_backend = route
                .pick_from(ctx.decided.target.as_ref(), key)
                .ok()
                .and_then(|b| {
                    let max = b.config.max_connections;
                    (max > 0).then(|| (b.name().to_owned(), (max / 2).max(1)))
                });
            let limits = hls::Limits {
                per_playlist: cache.blocking_reloads_per_playlist,
                per_client: cache.blocking_reloads_per_client,
                per_backend,
            };
            match shared.blocking.take(playlist.clone(), client, limits) {
                Ok(slot) => Some(slot),
                Err(bound) => {
                    if let Some(Joined::Leader(fetch)) = &joined {
                        fetch.abandon(HeadError {
                            status: StatusCode::SERVICE_UNAVAILABLE,
                            error: FetchError::new("too many blocking reloads of this playlist"),
                        });
                        shared.coalescer.finish(&fetch_key, fetch, None);
                        fetch.settle();
                    }
                    inc(&shared.stats.hls_reloads_refused);
                    tracing::debug!(bound, "too many blocking reloads at the origin: 503");
                    return Some(busy_briefly());
                }
            }
        }
    };
    let ((fetch, mut reader), mut owner) = match joined {
        None => (start(None, true), true),
        Some(Joined::LookAgain) => return None,
        Some(Joined::Leader(fetch)) => (start(Some(fetch), true), true),
        Some(Joined::Waiter(fetch)) => {
            let reader = fetch.reader();
            if reader.cancelled() {
                // Its readers all left just before this one came: it is no longer fetching.
                (start(None, true), true)
            } else {
                ((fetch, reader), false)
            }
        }
        Some(Joined::HitForMiss) => {
            inc(&shared.stats.hit_for_miss);
            (start(None, true), true)
        }
    };
    access_log::step(parts, "Fetch", || {
        let revalidating = stale.as_ref().is_some_and(Found::revalidatable);
        match (owner, revalidating) {
            (true, true) => "started, asking the origin to confirm the stored object".into(),
            (true, false) => "started".into(),
            (false, _) => "joined the fetch in flight for this key".into(),
        }
    });
    if let Some(slot) = slot {
        // The place is the origin request's: kept until the origin answers it or it is given up, however
        // many of the clients waiting on it leave before.
        let fetch = fetch.clone();
        tokio::spawn(async move {
            fetch.answered().await;
            drop(slot);
        });
    }
    // A body that is already complete is as good as stored: the store just has not published it yet.
    let complete = !owner && fetch.is_complete();
    let held = blocking
        .is_some()
        .then(|| hls::Held::new(&shared.stats, owner));
    let mut head = match held {
        Some(_) => {
            let hold = route.policy.cache.blocking_reload_hold;
            match tokio::time::timeout(hold, reader.head()).await {
                Ok(head) => head,
                Err(_) => {
                    inc(&shared.stats.hls_reloads_timed_out);
                    tracing::debug!(
                        "the origin held a blocking reload past cache.blocking_reload_hold: 503"
                    );
                    return Some(busy_briefly());
                }
            }
        }
        None => reader.head().await,
    };
    drop(held);
    if let (false, Ok(h)) = (owner, &head) {
        let other_variant = !phase::selects(&h.selection, parts);
        // A finished fetch stands in for the store only while its response is fresh: a no-cache or
        // already expired response must be validated again for this request, and with what it stores as
        // the validator: once it is published, the lookup again finds it and asks the origin whether it
        // changed (a fetch from here would ask whole, with nothing to validate).
        let spent = complete && h.ttl.saturating_sub(h.received_at.elapsed()).is_zero();
        if h.shareable && (other_variant || spent) && may_wait {
            reader.settled().await;
            return None;
        }
        if !h.shareable || other_variant || spent {
            // Uncacheable, another variant again, or spent: fetch alone at once rather than queue. An
            // unshareable answer asks whole: the stale object it confirmed may already be going from the
            // store (no longer storable), and a 304 for it would then find no body to serve.
            reader = start(None, h.shareable).1;
            head = reader.head().await;
            owner = true;
        }
    }
    // A stale object may stand in for an origin that failed or answered with a server error.
    let failure = match &head {
        Err(_) => Some(None),
        Ok(h) if h.status.is_server_error() => Some(Some(h.status.as_u16())),
        Ok(_) => None,
    };
    let now = lacquer_clock::now_ms();
    let fallback = stale.filter(|found| {
        // An object in grace reaches a miss only past a rule's `request_grace` (or unvouched, which
        // `vouched` keeps out): it stands in as an object past grace does.
        let usable = usability(found.meta().lifetime(now));
        matches!(usable, Usability::OnError | Usability::Grace) && vouched
    });
    if let (Some(fwd_status), Some(found)) = (failure, &fallback) {
        let ttl_s = found.meta().remaining_ttl_ms(now) / 1000;
        let outcome = Outcome::Stale {
            ttl_s,
            origin_failed: true,
            fwd_status,
        };
        if let Some(resp) = serve_stored(worker, ctx, key, parts, found, now, outcome).await {
            inc(&shared.stats.stale_on_error);
            return Some(resp);
        }
    }
    let delivery = match &head {
        // A 206's bytes are the origin's at their place in its representation: decoded, they would
        // not be the ones its `Content-Range` names.
        Ok(h) if h.status == StatusCode::PARTIAL_CONTENT => Delivery::AsStored,
        Ok(h) => ctx.delivery(&h.headers),
        Err(_) => Delivery::AsStored,
    };
    if delivery == Delivery::Forward {
        return Some(ctx.forward_as_sent(worker, parts).await);
    }
    let conversion = ctx.conversion(delivery, &shared.stats);
    let debug = ctx.decided.wants_debug.then(|| lacquer_rules::Debug {
        hits: None,
        ttl_s: head
            .as_ref()
            .ok()
            .filter(|h| h.shareable)
            .map(|h| h.ttl.saturating_sub(h.received_at.elapsed()).as_secs() as i64),
    });
    let mut resp = match head {
        Ok(head) if complete && !owner => {
            record_hit(&shared.stats, Tier::Memory);
            let ttl_s = head
                .ttl
                .saturating_sub(head.received_at.elapsed())
                .as_secs() as i64;
            respond::fetched(&head, reader, Outcome::Hit { ttl_s }, parts, &conversion).await
        }
        Ok(head) => {
            inc(&shared.stats.misses);
            if !owner {
                inc(&shared.stats.coalesced_waiters);
            }
            let outcome = Outcome::Miss {
                stored: head.shareable,
                collapsed: !owner,
                detail: head.not_stored.map(NotStored::token),
            };
            respond::fetched(&head, reader, outcome, parts, &conversion).await
        }
        Err(e) => {
            inc(&shared.stats.misses);
            let outcome = Outcome::Miss {
                stored: false,
                collapsed: !owner,
                detail: Some("backend-error"),
            };
            phase::own_error(respond::failure(e.status, outcome))
        }
    };
    let growing = resp.status() == StatusCode::PARTIAL_CONTENT
        && resp
            .headers()
            .get(header::CONTENT_RANGE)
            .is_some_and(|v| v.as_bytes().ends_with(b"/*"));
    if growing {
        inc(&shared.stats.ranges_growing);
    }
    if let Some(debug) = debug {
        resp.extensions_mut().insert(phase::DebugInfo(debug));
    }
    Some(resp)
}

/// The range a request for an object not stored sends to the origin instead of fetching the whole
/// (`cache.forward_ranges`): its one range, of a GET on a route without `slice`, when it is a suffix or
/// begins `forward_ranges_from` or further in and ends. An open range (`bytes=a-`) is forwarded only when
/// the whole is known not to be stored (`whole_unstored`: too large, or uncacheable): clients resuming a
/// download or seeking in a video each ask for the rest of the object, and one fetch of the whole serves
/// them all where one forwarded range each would fetch the rest again and again. Not with `If-Range`, whose
/// answer may have to be the whole.
pub(crate) fn forwarded_range(
    route: &Route,
    decided: &Decided,
    parts: &Parts,
    whole_unstored: impl FnOnce() -> bool,
) -> Option<Ask> {
    let cache = &route.policy.cache;
    let eligible = cache.forward_ranges
        && route.slice.is_none()
        && parts.method == Method::GET
        && decided.body.is_none()
        && !parts.headers.contains_key(header::IF_RANGE);
    let single = range::single(&parts.headers).filter(|_| eligible)?;
    let far = match single {
        range::Single::Suffix(_) => true,
        range::Single::From(first, last) => {
            first >= cache.forward_ranges_from.as_u64() && (last.is_some() || whole_unstored())
        }
    };
    far.then_some(Ask::Client(single))
}

async fn pass<S: CacheStore>(
    worker: &Worker<S>,
    client: IpAddr,
    route: &Route,
    decided: &Decided,
    parts: Parts,
    body: Body,
    outcome: Outcome,
) -> Response<Body> {
    let shared = &worker.shared;
    inc(&shared.stats.passes);
    let unsafe_method = matches!(
        outcome,
        Outcome::Pass {
            unsafe_method: true,
            ..
        }
    );
    let invalidation_target = unsafe_method.then(|| parts.clone());
    let live = shared.live();
    let rules = &live.rules;
    // The head is handed to the origin request; the backend phases' rules match on a copy.
    let client_head = (rules.has(Phase::BackendRequest) || rules.has(Phase::BackendResponse))
        .then(|| parts.clone());
    let key = primary_key(&parts);
    let note = access_log::Note::of(&parts);
    let mut fetching = None;
    let sent = match route.pick_from(decided.target.as_ref(), &key) {
        Ok(backend) => {
            access_log::note_backend(&parts, backend.name());
            inc(&shared.stats.backend_requests);
            fetching = Trace::of(&parts.extensions)
                .map(|t| t.fetch(&parts.method, backend.name(), &backend.authority));
            let mut req =
                forward::origin_request(parts.method, parts.uri, parts.headers, client, body);
            if let Some(head) = &client_head {
                phase::backend_request(rules, head, client, decided, req.headers_mut());
            }
            if let Some(span) = &fetching {
                span.inject(req.headers_mut());
            }
            forward::count_interim(&mut req, &shared.stats);
            worker.pool(backend).send(req).await
        }
        Err(e) => Err(e),
    };
    if let Some(span) = &fetching {
        match &sent {
            Ok(resp) => span.status(resp.status()),
            Err(_) => span.fail("backend_error"),
        }
    }
    let resp = match sent {
        Ok(resp) => resp,
        Err(BackendError::RequestBodyTooLarge) => {
            inc(&shared.stats.bodies_too_large);
            return body_too_large();
        }
        Err(e @ BackendError::RequestBody(_)) => {
            inc(&shared.stats.bad_requests);
            return refused(e.status(), &e.to_string(), None);
        }
        Err(e @ BackendError::Unavailable { .. }) => {
            inc(&shared.stats.backend_unavailable);
            repeats::WARNINGS.warn("nothing to pass to", &key, &e);
            return phase::own_error(respond::failure(e.status(), outcome));
        }
        Err(e) => {
            inc(&shared.stats.backend_errors);
            repeats::WARNINGS.warn("pass failed", &key, &e);
            return phase::own_error(respond::failure(e.status(), outcome));
        }
    };
    let (mut head, body) = resp.into_parts();
    if let Some(note) = &note {
        note.step("Origin", || head.status.to_string());
    }
    let invalidated =
        invalidation_target.filter(|_| head.status.is_success() || head.status.is_redirection());
    if let Some(target) = invalidated {
        for key in forward::invalidation_keys(&target, &head.headers) {
            match shared.store.invalidate(&key) {
                Ok(n) => add(&shared.stats.invalidations, n as u64),
                Err(e) => tracing::warn!(key, error = %e, "invalidation failed"),
            }
        }
    }
    phase::origin_fields(decided, &mut head.headers);
    if let Some(request) = &client_head {
        phase::backend_response(
            rules,
            request,
            client,
            decided,
            head.status,
            &mut head.headers,
        );
    }
    respond::decorate(&mut head.headers, outcome, None);
    let stats = shared.stats.clone();
    let body = body.map_frame(move |f| {
        if let Some(d) = f.data_ref() {
            stats.bytes_in.fetch_add(d.len() as u64, Relaxed);
        }
        f
    });
    Response::from_parts(head, body::incoming(body))
}
