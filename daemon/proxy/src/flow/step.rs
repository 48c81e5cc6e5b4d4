//! What the steps carry and hand on: the request's context ([`Txn`]) and the next step ([`Step`]) with
//! what it needs.

use std::{net::IpAddr, sync::Arc};

use http::{request::Parts, HeaderMap, HeaderValue, Response, StatusCode};
use lacquer_backends::{body::Body, routing::Route};
use lacquer_edge::Interim;
use lacquer_policy::{
    encoding::{Coded, Delivery},
    request::RequestClass,
};
use lacquer_rules::{Ahead, Debug};
use lacquer_telemetry::Trace;

use crate::{
    access_log::Note,
    cluster::Peer,
    coding::{Conversion, Negotiated},
    esi::{fill::TEMPLATE, Within},
    phase::Decided,
    pipe::Upgrade,
    respond::{self, Made, Outcome},
    stats::Stats,
    store::Found,
};

/// One request on its way through the flow.
pub(crate) struct Txn {
    /// Where it came from.
    pub client: IpAddr,
    /// It came over TLS.
    pub secure: bool,
    /// The head as the origin receives it: the key, the variant, the class and every rule are made from
    /// it. Taken by a pass, which hands it to the origin request (a copy stays when the deliver phase
    /// needs one).
    pub head: Option<Arc<Parts>>,
    /// The route it takes.
    pub route: Arc<Route>,
    /// What the request phase's rules decided.
    pub decided: Decided,
    /// Lookup, miss, pass or invalidation.
    pub class: RequestClass,
    /// Its primary key, for a request that is looked up or fetched.
    pub key: String,
    /// The client's `Accept-Encoding`, when the route negotiates codings.
    pub negotiated: Option<Negotiated>,
    /// The head as the client sent it, when its route prefetches (see [`crate::fetch::Fill::asked`]).
    pub asked: Option<Arc<Parts>>,
    /// The deliver or error phase has rules: the head is kept for them.
    pub delivers: bool,
    /// The access log's note, when the request is recorded.
    pub note: Option<Arc<Note>>,
    /// The request's trace, when its span is sampled: the lookup's, the fetches' and the store's spans are
    /// its children.
    pub trace: Option<Trace>,
    /// The cache's verdict on the response, once a step has made one from the store, a fetch or the
    /// origin; `None` for what lacquerd answered itself.
    pub outcome: Option<Outcome>,
    /// The response is an error lacquerd made for want of a backend's answer: the error phase replaces it.
    pub own_error: bool,
    /// The response is a 5xx lacquerd made itself (for want of a backend's answer, or because it cannot
    /// serve the request now): its page is chosen as it leaves, unless a rule replaced it.
    pub failure: bool,
    /// A deliver or error rule made the response in place of the data path's.
    pub replaced: bool,
    /// What `debug_headers` may show of a hit or a miss.
    pub debug: Option<Debug>,
    /// The response-only deliver rules already applied to a plain hit's prepared head.
    pub ahead: Option<Ahead>,
    /// The cluster member that owns the key answered: the verdict is its own.
    pub owner_answered: bool,
    /// Parts of an object stored in parts were tried once: when they could not answer, the ordinary way
    /// does.
    pub parts_tried: bool,
    /// The response is an ESI page's template (the store's or a fill's): it is assembled as it leaves.
    pub assembles: bool,
    /// The request is a fragment of an ESI page: the pages above it.
    pub within: Option<Arc<Within>>,
    /// Sends `103 Early Hints` to the client ahead of the answer (not for a fragment, nor over HTTP/1.0).
    pub interim: Option<Interim>,
}

impl Txn {
    /// A request the request phase admitted, as it enters its first step: its head, key, notes and
    /// everything the steps learn still to come.
    pub fn admitted(
        client: IpAddr,
        secure: bool,
        route: Arc<Route>,
        decided: Decided,
        class: RequestClass,
        delivers: bool,
    ) -> Self {
        Self {
            client,
            secure,
            head: None,
            route,
            decided,
            class,
            key: String::new(),
            negotiated: None,
            asked: None,
            delivers,
            note: None,
            trace: None,
            outcome: None,
            own_error: false,
            failure: false,
            replaced: false,
            debug: None,
            ahead: None,
            parts_tried: false,
            owner_answered: false,
            assembles: false,
            within: None,
            interim: None,
        }
    }

    /// Sends the request's rules' `early_hints` in a `103 Early Hints`, as the request goes to the origin
    /// (once: a miss that looks again does not send them again).
    pub fn send_early_hints(&mut self, stats: &Stats) {
        let Some(interim) = &self.interim else {
            return;
        };
        let links = std::mem::take(&mut self.decided.early_hints);
        if links.is_empty() {
            return;
        }
        let mut hints = Response::new(());
        *hints.status_mut() = StatusCode::EARLY_HINTS;
        for link in links {
            hints.headers_mut().append(http::header::LINK, link);
        }
        if interim.send(hints) {
            crate::stats::inc(&stats.early_hints_sent);
        }
    }

    /// The head the request carries (taken only by a pass, which is a last step).
    pub fn head(&self) -> &Arc<Parts> {
        self.head
            .as_ref()
            .expect("the head is taken only by a pass")
    }

    /// Notes a step of a traced request (`cachectl trace`); `detail` runs only when it is traced.
    pub fn step(&self, tag: &'static str, detail: impl FnOnce() -> String) {
        if let Some(note) = &self.note {
            note.step(tag, detail);
        }
    }

    /// How a response with `headers` leaves for this client.
    pub fn delivery(&self, headers: &HeaderMap) -> Delivery {
        self.negotiated
            .as_ref()
            .map_or(Delivery::AsStored, |n| n.delivery(headers))
    }

    /// [`Txn::delivery`] for a stored body whose coding is known already.
    pub fn delivery_of(&self, coded: Coded, headers: &HeaderMap) -> Delivery {
        self.negotiated
            .as_ref()
            .map_or(Delivery::AsStored, |n| n.delivery_of(coded, headers))
    }

    /// How a body delivered `delivery` is converted on its way out.
    pub fn conversion(&self, delivery: Delivery, stats: &Arc<Stats>) -> Conversion {
        let policy = &self.route.policy;
        let limit = policy.cache.max_object_size.as_u64();
        let settings = policy.compression.as_ref().map(|n| &n.settings);
        Conversion::new(delivery, limit, settings, stats)
    }

    /// A response of the data path, with its verdict. An ESI page's template is marked in its head: the
    /// mark goes here, before any rule sees the head, and the page is assembled once delivered.
    pub(crate) fn answered(&mut self, mut resp: Response<Body>, outcome: Outcome) -> Step {
        self.outcome = Some(outcome);
        self.assembles = resp.headers_mut().remove(TEMPLATE).is_some();
        Step::Deliver(resp)
    }

    /// A response made from what is stored or fetched, with its verdict.
    pub(crate) fn made(&mut self, made: Made, outcome: Outcome) -> Step {
        match made {
            Made::Answer(resp) => self.answered(resp, outcome),
            Made::Failure(resp) => {
                self.failure = true;
                self.answered(resp, outcome)
            }
        }
    }

    /// An error lacquerd made because no backend answered: the error phase may replace it.
    pub(crate) fn failed(&mut self, status: StatusCode, outcome: Outcome) -> Step {
        self.own_error = true;
        self.made(Made::Failure(respond::failure(status, outcome)), outcome)
    }
}

/// What a step hands on: the next step, or the response.
pub(crate) enum Step {
    /// Look the key up in the store; `again` after a fetch in flight settled or finished, when the lookup
    /// no longer waits for anyone.
    Lookup { again: bool },
    /// Serve a stored variant found fresh or in grace.
    Hit(Hit),
    /// Answer from a fetch: a new one, or one in flight for the key.
    Miss(Miss),
    /// Send the request to the origin, its body with it, storing nothing.
    Pass(Body),
    /// Tunnel the connection to the backend: a `pipe` rule's upgrade request.
    Pipe(Upgrade),
    /// Ask the cluster member that owns the key, with this node's proof that it forwarded the request.
    Peer(Peer, HeaderValue),
    /// A response to the client, through the deliver phase.
    Deliver(Response<Body>),
    /// A response to the client as it is: the owner's, which its own deliver phase made.
    Done(Response<Body>),
}

/// A variant the lookup found servable, and the miss to make when its body turns out to be gone.
pub(crate) struct Hit {
    pub found: Found,
    /// When it was looked up (ms since the epoch).
    pub now: u64,
    /// `Hit`, or `Stale` within grace.
    pub outcome: Outcome,
    pub otherwise: Miss,
}

/// How the miss is made: whether it joins others, what the lookup found, and when it looked.
pub(crate) struct Miss {
    pub joining: Joining,
    pub stale: Stale,
    /// [`crate::coalesce::Coalescer::finished`] before the store was read; `None` when the lookup was
    /// made again, or never made.
    pub looked_up_at: Option<u64>,
}

impl Miss {
    /// A fetch of the request's own: never the store, never another request's fetch.
    pub fn alone() -> Self {
        Self {
            joining: Joining::Never,
            stale: Stale {
                found: None,
                vouched: false,
            },
            looked_up_at: None,
        }
    }
}

/// What a lookup found that a miss may revalidate or fall back on, and whether this node vouched for it
/// when the lookup began (a cluster node catching up does not).
pub(crate) struct Stale {
    pub found: Option<Found>,
    pub vouched: bool,
}

/// How a miss may share a fetch with other requests for the key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Joining {
    /// Join the fetch in flight, and wait for it to settle when it turns out to be another variant's.
    MayWait,
    /// Join the fetch in flight, but fetch alone when it is another variant's.
    NoWait,
    /// Always fetch alone (the request must not take another's answer, nor give its own).
    Never,
}
