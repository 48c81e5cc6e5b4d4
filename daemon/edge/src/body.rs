//! A client's request body, whichever protocol carried it: one enum rather than a boxed body, so a request
//! costs no allocation for it.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::stats::{add, ListenerStats};

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
    /// None: a request lacquerd makes itself for one it serves (an ESI page's fragment).
    Empty,
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
            Self::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Http(body) => body.is_end_stream(),
            Self::H3(body) => body.state == State::Ended,
            Self::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Http(body) => body.size_hint(),
            Self::H3(body) if body.state == State::Ended => SizeHint::with_exact(0),
            Self::H3(body) => body.length.map_or_else(SizeHint::new, SizeHint::with_exact),
            Self::Empty => SizeHint::with_exact(0),
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

/// A response body over HTTP/1.x or HTTP/2 that counts the bytes it hands to hyper, on its listener (whose
/// sums are the daemon's totals): hyper writes the body itself, so this is where its bytes can be seen.
pub(crate) struct Counted<B> {
    body: B,
    listener: Arc<ListenerStats>,
    http2: bool,
}

impl<B> Counted<B> {
    pub(crate) fn new(body: B, listener: Arc<ListenerStats>, http2: bool) -> Self {
        Self {
            body,
            listener,
            http2,
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Counted<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let frame = std::task::ready!(Pin::new(&mut this.body).poll_frame(cx));
        if let Some(data) = frame.as_ref().and_then(|f| f.as_ref().ok()?.data_ref()) {
            let l = &this.listener;
            let counter = if this.http2 {
                &l.bytes_out_http2
            } else {
                &l.bytes_out_http1
            };
            add(counter, data.len() as u64);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
