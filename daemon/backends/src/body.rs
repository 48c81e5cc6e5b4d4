//! The body type every response and forwarded request uses.

use bytes::Bytes;
use futures_util::Stream;
use http_body::Frame;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Empty, Full, StreamBody};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

pub fn full(data: impl Into<Bytes>) -> Body {
    Full::new(data.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

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
