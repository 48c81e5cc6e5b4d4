//! Content codings (RFC 9110 §8.4, §12.5.3): what a client accepts, what the origin is asked for, what is
//! compressed when stored, and how a stored body reaches each client.

use http::{
    header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE},
    HeaderMap, HeaderName, HeaderValue, StatusCode,
};
pub use lacquer_config::{Coding, Compression, DictionaryCoding};

use crate::cache_control::CacheControl;

/// What one request's `Accept-Encoding` accepts, read once. Quality values are kept in thousandths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Accepts {
    /// `br`, `gzip`, `zstd`: the quality the field gives each, when it names it.
    known: [Option<u16>; 3],
    /// `dcb`, `dcz` (RFC 9842), when named: never implied by `*`, since a client takes them only with a
    /// dictionary it announces.
    dictionary: [Option<u16>; 2],
    /// `identity`, when named.
    identity: Option<u16>,
    /// `*`, when named: the quality of every coding not named.
    any: Option<u16>,
    /// Whether the request had the field at all.
    present: bool,
}

fn slot(coding: Coding) -> usize {
    match coding {
        Coding::Br => 0,
        Coding::Gzip => 1,
        Coding::Zstd => 2,
    }
}

/// A `qvalue` (RFC 9110 §12.4.2) in thousandths; `None` when malformed, which makes the member ignored.
fn qvalue(s: &str) -> Option<u16> {
    let s = s.trim();
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac_value = format!("{frac:0<3}").parse::<u16>().ok()?;
    match int {
        "0" => Some(frac_value),
        "1" if frac_value == 0 => Some(1000),
        _ => None,
    }
}

impl Accepts {
    /// Reads every `Accept-Encoding` line. Members that do not parse are skipped; the first mention of a
    /// coding wins. Linear in the field's length, whatever the number of members.
    pub fn from_headers(headers: &HeaderMap) -> Self {
        let mut accepts = Accepts::default();
        for value in headers.get_all(ACCEPT_ENCODING) {
            accepts.present = true;
            let Ok(value) = value.to_str() else { continue };
            for member in value.split(',') {
                let mut params = member.split(';');
                let token = params.next().unwrap_or("").trim();
                if token.is_empty() {
                    continue;
                }
                let mut q = Some(1000);
                for param in params {
                    if let Some((name, v)) = param.split_once('=') {
                        if name.trim().eq_ignore_ascii_case("q") {
                            q = qvalue(v);
                        }
                    }
                }
                let Some(q) = q else { continue };
                let target = if token == "*" {
                    &mut accepts.any
                } else if token.eq_ignore_ascii_case("identity") {
                    &mut accepts.identity
                } else if let Some(coding) = Coding::from_token(token) {
                    &mut accepts.known[slot(coding)]
                } else if let Some(coding) = DictionaryCoding::from_token(token) {
                    &mut accepts.dictionary[coding as usize]
                } else {
                    continue;
                };
                target.get_or_insert(q);
            }
        }
        accepts
    }

    /// The quality given to `coding` (`None`: identity).
    fn quality(&self, coding: Option<Coding>) -> u16 {
        match coding {
            Some(c) => self.known[slot(c)].or(self.any).unwrap_or(0),
            // Identity is acceptable unless refused by name or by `*;q=0` (RFC 9110 §12.5.3).
            None => self.identity.or(self.any.filter(|q| *q == 0)).unwrap_or(1),
        }
    }

    /// Whether `coding` (`None`: identity) is acceptable. Without the field only identity is: RFC 9110
    /// allows any coding then, but clients that send nothing are the ones least likely to decode.
    pub fn accepts(&self, coding: Option<Coding>) -> bool {
        match coding {
            Some(_) if !self.present => false,
            c => self.quality(c) > 0,
        }
    }
}

impl Accepts {
    /// Whether the field names `coding` with a quality above 0.
    pub fn accepts_dictionary(&self, coding: DictionaryCoding) -> bool {
        self.dictionary[coding as usize].is_some_and(|q| q > 0)
    }
}

/// The SHA-256 of the dictionary a request says its client holds (`Available-Dictionary`, RFC 9842 §2.2:
/// a byte sequence of 32 bytes); `None` without one, or when the field is malformed, repeated or of
/// another length, which makes the request one without a dictionary.
pub fn available_dictionary(headers: &HeaderMap) -> Option<[u8; 32]> {
    let mut values = headers.get_all(AVAILABLE_DICTIONARY).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return None;
    };
    let item: sfv::Item = sfv::Parser::new(value.to_str().ok()?).parse().ok()?;
    match item.bare_item {
        sfv::BareItem::ByteSequence(bytes) => bytes.try_into().ok(),
        _ => None,
    }
}

/// `Available-Dictionary` (RFC 9842 §2.2).
pub const AVAILABLE_DICTIONARY: HeaderName = HeaderName::from_static("available-dictionary");

/// `Dictionary-ID` (RFC 9842 §2.3).
pub const DICTIONARY_ID: HeaderName = HeaderName::from_static("dictionary-id");

/// `Use-As-Dictionary` (RFC 9842 §2.1).
pub const USE_AS_DICTIONARY: HeaderName = HeaderName::from_static("use-as-dictionary");

/// How a response body is coded, from its `Content-Encoding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coded {
    /// No coding (absent, empty or `identity`).
    Identity,
    /// One coding lacquerd can decode.
    With(Coding),
    /// A coding lacquerd cannot decode, or several stacked: delivered as the origin sent it.
    Other,
}

/// Reads `Content-Encoding`.
pub fn coded(headers: &HeaderMap) -> Coded {
    let mut codings = headers
        .get_all(CONTENT_ENCODING)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("?").split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty() && !t.eq_ignore_ascii_case("identity"));
    match (codings.next(), codings.next()) {
        (None, _) => Coded::Identity,
        (Some(one), None) => Coded::from_token(one),
        _ => Coded::Other,
    }
}

impl Coded {
    fn from_token(token: &str) -> Coded {
        Coding::from_token(token).map_or(Coded::Other, Coded::With)
    }
}

/// `[compression]` as a route applies it: the settings, and the `Accept-Encoding` made from them once.
#[derive(Debug, Clone, PartialEq)]
pub struct Negotiation {
    /// The section as read.
    pub settings: Compression,
    /// What the origin is sent and stored objects vary on ([`origin_accept_encoding`]).
    pub accept_encoding: HeaderValue,
}

impl Negotiation {
    /// The negotiation `settings` describe.
    pub fn new(settings: Compression) -> Self {
        let accept_encoding = origin_accept_encoding(&settings);
        Self {
            settings,
            accept_encoding,
        }
    }
}

/// The `Accept-Encoding` lacquerd sends the origin and varies stored objects on: the same for every client,
/// so one stored object serves them all. Quality values say the preference order (`gzip, br;q=0.9`), for
/// origins that choose by them.
pub fn origin_accept_encoding(settings: &Compression) -> HeaderValue {
    let members: Vec<String> = settings
        .codings
        .iter()
        .enumerate()
        .map(|(n, c)| match n {
            0 => c.token().to_owned(),
            n => format!("{};q=0.{}", c.token(), 10 - n.min(9)),
        })
        .collect();
    HeaderValue::from_str(&members.join(", ")).expect("coding tokens are ASCII")
}

/// The coding to compress a response with when it is stored: the first configured one, if the response is a
/// complete 200 in a listed type, not coded already, not marked `no-transform`, and not known to be smaller
/// than `min_size`. A rule's `compress` (`forced`) decides the type and size itself: `true` compresses
/// any such 200, `false` none.
pub fn compress_with(
    status: StatusCode,
    headers: &HeaderMap,
    settings: &Compression,
    forced: Option<bool>,
) -> Option<Coding> {
    if forced == Some(false)
        || status != StatusCode::OK
        || coded(headers) != Coded::Identity
        || headers.contains_key(CONTENT_RANGE)
        || CacheControl::from_headers(headers).no_transform
    {
        return None;
    }
    if forced == Some(true) {
        return settings.codings.first().copied();
    }
    let length = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if length.is_some_and(|len| len < settings.min_size.as_u64()) {
        return None;
    }
    let media_type = headers
        .get(CONTENT_TYPE)?
        .to_str()
        .ok()?
        .split(';')
        .next()?
        .trim()
        .to_ascii_lowercase();
    let (kind, _) = media_type.split_once('/')?;
    let listed = settings.types.iter().any(|t| match t.strip_suffix("/*") {
        Some(any_of) => any_of == kind,
        None => *t == media_type,
    });
    listed.then(|| settings.codings.first().copied()).flatten()
}

/// How a stored (or arriving) body reaches one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The bytes as stored.
    AsStored,
    /// Decompressed on the way out, for a client that accepts none of the stored coding.
    Decode(Coding),
    /// Nothing stored can be sent: the stored coding is not acceptable and `no-transform` forbids decoding
    /// it. The request goes to the origin as the client sent it.
    Forward,
}

/// Chooses how a response with headers `stored` reaches a client; `no_transform` when the response or the
/// request says `no-transform`. A client that refuses identity too still gets identity: RFC 9110 §12.5.3
/// prefers that to a 415.
pub fn delivery(stored: &HeaderMap, client: &Accepts, no_transform: bool) -> Delivery {
    delivery_of(coded(stored), client, no_transform)
}

/// [`delivery`] for a stored body whose coding is known already.
pub fn delivery_of(stored: Coded, client: &Accepts, no_transform: bool) -> Delivery {
    match stored {
        Coded::Identity => Delivery::AsStored,
        Coded::With(c) if client.accepts(Some(c)) => Delivery::AsStored,
        Coded::With(c) if !no_transform => Delivery::Decode(c),
        Coded::With(_) => Delivery::Forward,
        // What lacquerd cannot decode goes as the origin sent it, as through any cache: the origin chose
        // to send it to a request that did not ask for it.
        Coded::Other => Delivery::AsStored,
    }
}

/// `etag` made weak (RFC 9110 §8.8.3): the bytes sent are not the origin's, so only weak comparison may
/// match them. Weak tags and values that are not entity-tags are kept as they are.
pub fn weak_etag(etag: &HeaderValue) -> HeaderValue {
    let bytes = etag.as_bytes();
    if bytes.starts_with(b"\"") {
        let mut weak = b"W/".to_vec();
        weak.extend_from_slice(bytes);
        HeaderValue::from_bytes(&weak).unwrap_or_else(|_| etag.clone())
    } else {
        etag.clone()
    }
}

#[cfg(test)]
mod tests;
