//! The response head of a stored body, finished once per copy of its metadata: a hit clones it and sets
//! the two fields that change from one response to the next (`Age`, `Cache-Status`).

use std::sync::{
    atomic::{AtomicU64, Ordering::Relaxed},
    Arc,
};

use arc_swap::ArcSwapOption;
use http::{header, HeaderMap, HeaderValue, StatusCode};
use lacquer_policy::encoding::{self, Coded, Coding, DictionaryCoding};
use lacquer_rules::{Ahead, Rules};
use lacquer_storage::ObjectMeta;

use crate::{
    coding::{take_identity_length, vary_on_accept_encoding, weaken_etag},
    fields::{append, CACHE_STATUS, VIA, X_CACHE},
};

/// A stored body's response head ([`ObjectMeta::prepared`]), shared by every response served from one
/// copy of its metadata (the hot copy holds one per key).
#[derive(Clone)]
pub struct Prepared {
    /// What every response sending these bytes as stored carries: the stored fields less the decoded
    /// length a fill records, `Vary: Accept-Encoding` for a coded body, this body's `Content-Length`,
    /// `Accept-Ranges` for a 200, `X-Cache: HIT` and `Via`. `Age` and `Cache-Status` hold placeholders,
    /// so a response replaces their values in place: a clone has room for exactly the fields it holds,
    /// and a hit never grows it.
    pub head: HeaderMap,
    /// The body's coding.
    pub coded: Coded,
    /// The decoded length recorded at fill time, for a body stored compressed.
    pub identity_length: Option<u64>,
    /// A 200 with `Use-As-Dictionary`: a hit offers it as a compression dictionary (read once).
    pub dictionary: bool,
    /// Times this copy was served, counted only while a rule shows it (`debug_headers`): as Varnish's
    /// `obj.hits`, it starts again when the object is read back into memory.
    pub hits: Hits,
    /// `head` as the deliver rules that look at the response alone leave it, for the rules that made it.
    delivered: Delivered,
}

/// A plain hit's head with the response-only deliver rules applied ([`Rules::prepare`]): a hit clones it
/// and the deliver phase goes on from the rules it left, so those rules cost a plain hit nothing but
/// their counters. Made again when a reload changes those rules; a clone of the [`Prepared`] starts without.
#[derive(Default)]
struct Delivered(ArcSwapOption<(HeaderMap, Ahead)>);

impl Clone for Delivered {
    fn clone(&self) -> Self {
        Self::default()
    }
}

/// A hit counter that clones as its current value.
#[derive(Debug, Default)]
pub struct Hits(AtomicU64);

impl Hits {
    /// Counts one hit; the count including it.
    pub fn count(&self) -> u64 {
        self.0.fetch_add(1, Relaxed) + 1
    }
}

impl Clone for Hits {
    fn clone(&self) -> Self {
        Self(AtomicU64::new(self.0.load(Relaxed)))
    }
}

impl Prepared {
    /// The head of `meta`'s body as stored.
    pub fn of(meta: &ObjectMeta) -> Self {
        let mut head = meta.header_map(PER_RESPONSE);
        let identity_length = take_identity_length(&mut head);
        let coded = encoding::coded(&head);
        if coded != Coded::Identity {
            vary_on_accept_encoding(&mut head);
        }
        head.insert(header::CONTENT_LENGTH, HeaderValue::from(meta.length));
        if meta.status == StatusCode::OK.as_u16() {
            head.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        }
        head.insert(header::AGE, HeaderValue::from_static("0"));
        head.insert(X_CACHE, HeaderValue::from_static("HIT"));
        head.insert(CACHE_STATUS, HeaderValue::from_static("lacquer"));
        append(&mut head, header::VIA, VIA);
        Self {
            dictionary: meta.status == StatusCode::OK.as_u16()
                && head.contains_key(encoding::USE_AS_DICTIONARY),
            head,
            coded,
            identity_length,
            hits: Hits::default(),
            delivered: Delivered::default(),
        }
    }

    /// The head a plain hit (the body as stored, whole, `status`) is sent with under `rules`, and what
    /// their deliver rules did to it ahead of the response, for the deliver phase to go on from.
    pub fn plain_head(&self, rules: &Rules, status: StatusCode) -> (HeaderMap, Option<Ahead>) {
        if !rules.prepares() {
            return (self.head.clone(), None);
        }
        if let Some(made) = &*self.delivered.0.load() {
            if made.1.rules() == rules.id() {
                return (made.0.clone(), Some(made.1));
            }
        }
        let mut head = self.head.clone();
        let ahead = rules.prepare(status, &mut head);
        self.delivered
            .0
            .store(Some(Arc::new((head.clone(), ahead))));
        (head, Some(ahead))
    }

    /// The head of a sibling of `variant`'s body, `length` bytes in `coding` (`None`: identity): sent
    /// under the variant's fields, with its own coding and length and the entity-tag weak (the bytes are
    /// not the origin's, RFC 9110 §8.8.3).
    pub fn sibling(variant: &Prepared, coding: Option<Coding>, length: u64) -> Self {
        let mut head = variant.head.clone();
        match coding {
            Some(c) => {
                head.insert(
                    header::CONTENT_ENCODING,
                    HeaderValue::from_static(c.token()),
                );
            }
            None => {
                head.remove(header::CONTENT_ENCODING);
            }
        }
        weaken_etag(&mut head);
        head.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
        Self {
            head,
            coded: coding.map_or(Coded::Identity, Coded::With),
            identity_length: None,
            dictionary: false,
            hits: Hits::default(),
            delivered: Delivered::default(),
        }
    }

    /// The head of a sibling of `variant`'s body compressed against a dictionary, `length` bytes in
    /// `coding`: as [`Prepared::sibling`], and varying on `Available-Dictionary` as well, so that no cache
    /// after this one sends it to a client without that dictionary.
    pub fn dictionary_sibling(variant: &Prepared, coding: DictionaryCoding, length: u64) -> Self {
        let mut head = variant.head.clone();
        head.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_static(coding.token()),
        );
        vary_on_accept_encoding(&mut head);
        head.append(
            header::VARY,
            HeaderValue::from_static("Available-Dictionary"),
        );
        weaken_etag(&mut head);
        head.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
        Self {
            head,
            coded: Coded::Other,
            identity_length: None,
            dictionary: false,
            hits: Hits::default(),
            delivered: Delivered::default(),
        }
    }
}

/// The fields [`Prepared::of`] adds to the stored ones, at most.
const PER_RESPONSE: usize = 7;

/// `meta`'s prepared head, made now when something else was prepared from this copy.
pub fn prepared(meta: &ObjectMeta) -> std::borrow::Cow<'_, Prepared> {
    match meta.prepared(Prepared::of) {
        Some(p) => std::borrow::Cow::Borrowed(p),
        None => std::borrow::Cow::Owned(Prepared::of(meta)),
    }
}
