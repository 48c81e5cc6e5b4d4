//! The fill's ESI stage: a page parsed, as it streams, into the template the store keeps.

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use lacquer_codec::{CodecError, Decoder};
use lacquer_esi::{Parser, TEMPLATE_VERSION};
use lacquer_policy::encoding::{self, Coded};

use crate::{
    coding::weaken_etag,
    stats::{inc, Stats},
};

/// In a stored or fetched head: the body is an ESI template of this version, to be assembled. Internal:
/// removed from what origins send, and from every response before it leaves.
pub const TEMPLATE: HeaderName = HeaderName::from_static("lacquer-esi");

/// The fill's ESI stage: the origin's body (decoded, when it came compressed) parsed into a template.
pub(crate) struct EsiFill {
    parser: Parser,
    decoder: Option<Decoder>,
}

impl EsiFill {
    /// The stage for a response with `status` and `headers` when `on`, the headers shaped for the
    /// template it makes; `None` when off, or for a response without a page to parse (no body, a part of
    /// one, a coding lacquerd does not decode). `limit` (`max_object_size`) bounds a compressed page's
    /// decoded size.
    pub fn start(
        on: bool,
        status: StatusCode,
        part: bool,
        headers: &mut HeaderMap,
        limit: u64,
        stats: &Stats,
    ) -> Option<Self> {
        let bodiless = matches!(status.as_u16(), 100..=199 | 204 | 206 | 304);
        if !on || bodiless || part {
            return None;
        }
        let decoder = match encoding::coded(headers) {
            Coded::Identity => None,
            Coded::With(coding) => Some(Decoder::new(coding, limit)),
            Coded::Other => return None,
        };
        headers.remove(header::CONTENT_ENCODING);
        headers.remove(header::CONTENT_LENGTH);
        headers.remove(header::ACCEPT_RANGES);
        weaken_etag(headers);
        headers.insert(TEMPLATE, HeaderValue::from_static(TEMPLATE_VERSION));
        inc(&stats.esi_pages);
        Some(Self {
            parser: Parser::new(),
            decoder,
        })
    }

    /// The template bytes `pieces` of the origin's body make.
    pub fn push(&mut self, pieces: Vec<Bytes>) -> Result<Vec<Bytes>, CodecError> {
        let mut out = Vec::with_capacity(pieces.len());
        for piece in pieces {
            match &mut self.decoder {
                None => out.push(self.parser.push(&piece)),
                Some(decoder) => {
                    decoder.feed(piece);
                    while let Some(decoded) = decoder.piece()? {
                        out.push(self.parser.push(&decoded));
                    }
                }
            }
        }
        out.retain(|b| !b.is_empty());
        Ok(out)
    }

    /// The last template bytes, once the body has ended (`last`: the fill's coding's last pieces).
    pub fn finish(&mut self, last: Vec<Bytes>) -> Result<Vec<Bytes>, CodecError> {
        let mut out = self.push(last)?;
        if let Some(decoder) = &mut self.decoder {
            decoder.end();
            while let Some(decoded) = decoder.piece()? {
                out.push(self.parser.push(&decoded));
            }
        }
        out.push(self.parser.finish());
        out.retain(|b| !b.is_empty());
        Ok(out)
    }
}
