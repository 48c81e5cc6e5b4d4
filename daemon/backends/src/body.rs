//! The body type every response and forwarded request uses.

use bytes::Bytes;
use futures_util::Stream;
use http_body::Frame;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Empty, Full, StreamBody};

/// What any body may fail with (origin, store, client, limits), boxed so they can mix in one [`Body`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The one body type: hit, miss, pass, error page and forwarded request body all have it, so each path
/// returns the same response type. `Send` but not `Sync`, so bodies made of streams that are not `Sync`
/// fit.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// No bytes: 304s, HEAD, error answers without text.
pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// Bytes already in memory, sent as one frame with their length known.
pub fn full(data: impl Into<Bytes>) -> Body {
    Full::new(data.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Frames as a stream produces them (stored chunks, a fetch shared by coalesced readers); an `Err` item
/// ends the body with that error, cutting the response off.
pub fn from_stream<S>(stream: S) -> Body
where
    S: Stream<Item = Result<Frame<Bytes>, BoxError>> + Send + 'static,
{
    StreamBody::new(stream).boxed_unsync()
}

/// A hyper body (a client request or a backend response, possibly wrapped) as a [`Body`].
pub fn incoming<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes, Error = hyper::Error> + Send + 'static,
{
    body.map_err(BoxError::from).boxed_unsync()
}
