//! A client's request body, whichever protocol carried it: one enum rather than a boxed body, so a request
//! costs no allocation for it.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

/// The error a request body fails with (the client's side failed: a reset stream, a broken connection,
/// bad framing).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

type H3Stream = h3::server::RequestStream<h3_quinn::RecvStream, Bytes>;

/// The body of a client's request.
pub enum RequestBody {
    /// HTTP/1.1 or HTTP/2.
    Http(Incoming),
    /// HTTP/3. Boxed: its stream state is six times the size of hyper's body, and every HTTP/1.1 and
    /// HTTP/2 request would carry the difference.
    H3(Box<H3Body>),
}

/// The receiving half of an HTTP/3 request stream, as a body.
pub struct H3Body {
    stream: H3Stream,
    /// The declared `Content-Length`, which the size hint reports as HTTP/2's body does.
    length: Option<u64>,
    state: State,
    /// What the look at the stream when the request came took from it, given first.
    first: Option<Result<Bytes, BoxError>>,
}

#[derive(Clone, Copy, PartialEq)]
enum State {
    Data,
    Trailers,
    Ended,
}

impl H3Body {
    /// Looks at the stream once without waiting: the end of a GET usually comes in the same packet as its
    /// head, and a body known to be empty is forwarded as one (no chunked framing to the origin). Whatever
    /// that look finds is kept for the first read. (Trailers on a request without a body, which mean
    /// nothing to forward, are dropped.)
    pub(crate) fn new(mut stream: H3Stream, length: Option<u64>) -> Self {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let (state, first) = match stream.poll_recv_data(&mut cx) {
            Poll::Pending => (State::Data, None),
            Poll::Ready(Ok(None)) => (State::Ended, None),
            Poll::Ready(Ok(Some(mut data))) => {
                (State::Data, Some(Ok(data.copy_to_bytes(data.remaining()))))
            }
            Poll::Ready(Err(e)) => (State::Data, Some(Err(e.into()))),
        };
        Self {
            stream,
            length,
            state,
            first,
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Self::Http(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            Self::H3(body) => body.poll(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Http(body) => body.is_end_stream(),
            Self::H3(body) => body.state == State::Ended,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Http(body) => body.size_hint(),
            Self::H3(body) if body.state == State::Ended => SizeHint::with_exact(0),
            Self::H3(body) => body.length.map_or_else(SizeHint::new, SizeHint::with_exact),
        }
    }
}

impl H3Body {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(first) = self.first.take() {
            if first.is_err() {
                self.state = State::Ended;
            }
            return Poll::Ready(Some(first.map(Frame::data)));
        }
        loop {
            match self.state {
                State::Ended => return Poll::Ready(None),
                State::Data => match std::task::ready!(self.stream.poll_recv_data(cx)) {
                    Ok(Some(mut data)) => {
                        let data = data.copy_to_bytes(data.remaining());
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    Ok(None) => self.state = State::Trailers,
                    Err(e) => {
                        self.state = State::Ended;
                        return Poll::Ready(Some(Err(e.into())));
                    }
                },
                State::Trailers => {
                    let trailers = std::task::ready!(self.stream.poll_recv_trailers(cx));
                    self.state = State::Ended;
                    return Poll::Ready(match trailers {
                        Ok(Some(fields)) => Some(Ok(Frame::trailers(fields))),
                        Ok(None) => None,
                        Err(e) => Some(Err(e.into())),
                    });
                }
            }
        }
    }
}
