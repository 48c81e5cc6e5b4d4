//! What a fill is asked to fetch, and how it ended.

use std::{net::IpAddr, sync::Arc};

use http::{header, request::Parts, HeaderValue, Method};
use lacquer_backends::routing::Route;
use lacquer_policy::{range, storable::NotStored};

use lacquer_telemetry::Trace;

use crate::{access_log::Note, phase::Decided, store::Found};

/// How a fill ended, for the coalescer: whether later requests should skip coalescing for a while.
pub(super) enum Ending {
    Stored,
    /// The origin confirmed the stored object (304); its headers and freshness were refreshed.
    Revalidated,
    NotStored(NotStored),
    /// The origin answered the client's own conditional with 304: an answer for that client alone, which
    /// says nothing about whether the URL is cacheable.
    NotModified,
    Failed,
    /// Every reader left while the body was not being stored: the origin read stopped.
    Cancelled,
}

/// One fill: what to fetch, for whom, and what is stored already.
pub struct Fill {
    pub key: String,
    /// Whether the fetch is the coalescer's entry for the key (unregistered when done).
    pub registered: bool,
    /// The request the fill is made for: its headers select the variant.
    pub parts: Arc<Parts>,
    /// That request's head as the client sent it, before the request phase, when its route prefetches: a
    /// playlist's references resolve against it, and prefetches are made from it.
    pub asked: Option<Arc<Parts>>,
    pub client: IpAddr,
    /// The route the request took: its backend and cache policy.
    pub route: Arc<Route>,
    /// What the request's rules decided for the later phases.
    pub decided: Decided,
    /// A stored variant with validators: they go with the request, and a 304 refreshes it instead of
    /// transferring the body again (RFC 9111 §4.3).
    pub stale: Option<Found>,
    /// A refresh nobody waits for (grace): it is not cancelled for want of readers before its head arrives.
    pub background: bool,
    /// The stored variant can still stand in for a failing origin (grace or stale-if-error): a server
    /// error does not replace it.
    pub stand_in: bool,
    /// A byte range asked for instead of the whole: a 206 carrying it is stored as a part of the object's
    /// body.
    pub part: Option<Ask>,
    /// Sent as `If-Range` with `part`: the stored object's strong validator, so that an origin whose object
    /// changed answers with the whole instead of a part of another version.
    pub if_range: Option<HeaderValue>,
    /// The access log's note of the request that started the fill, when it is recorded.
    pub note: Option<Arc<Note>>,
    /// That request's trace, when it is sampled: the fetch's and the store's spans are its children.
    pub trace: Option<Trace>,
    /// Sends the origin's `103 Early Hints` on to the client whose request started the fill, while it
    /// waits (none for a fill nobody waits for).
    pub interim: Option<lacquer_edge::Interim>,
}

/// A byte range a fill asks the origin for instead of the whole object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// Exactly bytes `first..=last` (`None`: to the end): a slice of a sliced route, or bytes between the
    /// parts stored. A 206 carrying other bytes is refused.
    Bytes(u64, Option<u64>),
    /// A client's own range of an object not stored, forwarded (`cache.forward_ranges`): its 206 is
    /// stored wherever its `Content-Range` places it.
    Client(range::Single),
}

impl Fill {
    /// Notes a step of the fill when the request that started it is traced (`cachectl trace`).
    pub(super) fn step(&self, tag: &'static str, detail: impl FnOnce() -> String) {
        if let Some(note) = &self.note {
            note.step(tag, detail);
        }
    }
}

impl Ask {
    /// The key a fetch of this range of `key` is coalesced under: a space is in no cache key (a request
    /// target has none), so it names no other object.
    pub fn key(self, key: &str) -> String {
        format!("{key} {}", self.header())
    }

    /// The `Range` value sent.
    pub(super) fn header(self) -> String {
        match self {
            Ask::Bytes(first, last) => range::Single::From(first, last).header(),
            Ask::Client(single) => single.header(),
        }
    }
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
