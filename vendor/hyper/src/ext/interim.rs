//! [Vendored patch] Informational (1xx) responses a server sends ahead of its final response, such as
//! `103 Early Hints` (RFC 8297): hyper's server had no way to send one (hyperium/hyper#3815,
//! hyperium/hyper#4114).

use std::{
    collections::VecDeque,
    fmt,
    sync::{Arc, Mutex},
    task::{Context, Poll, Waker},
};

/// Sends informational (1xx) responses on one request's stream before its final response. A server
/// connection built with `informational_responses(true)` (HTTP/1 and HTTP/2 builders) puts one in each
/// request's extensions; take it with `req.extensions_mut().remove::<Interim>()`.
///
/// Over HTTP/1 only an HTTP/1.1 request is sent any (RFC 9110 §15.2: never to an HTTP/1.0 client). Once
/// the final response's head is being written, sending fails.
#[derive(Clone)]
pub struct Interim(Arc<Mutex<State>>);

#[derive(Default)]
struct State {
    queue: VecDeque<http::Response<()>>,
    waker: Option<Waker>,
    closed: bool,
}

/// Why an informational response was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterimError {
    /// Its status is not 1xx, or is 101 (a protocol switch is a final response).
    NotInformational,
    /// The final response has begun, or the stream is gone.
    Closed,
    /// `MAX_QUEUED` responses wait to be written already.
    Full,
}

impl fmt::Display for InterimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InterimError::NotInformational => "not an informational status",
            InterimError::Closed => "the final response has begun",
            InterimError::Full => "too many informational responses queued",
        })
    }
}

impl std::error::Error for InterimError {}

impl fmt::Debug for Interim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Interim").finish()
    }
}

/// Informational responses waiting for the connection to write them: a stream that is not read cannot
/// make its sender hold more.
const MAX_QUEUED: usize = 8;

impl Interim {
    /// Queues `res` to be written on the stream before the final response, and wakes the connection.
    pub fn send(&self, res: http::Response<()>) -> Result<(), InterimError> {
        let status = res.status();
        if !status.is_informational() || status == http::StatusCode::SWITCHING_PROTOCOLS {
            return Err(InterimError::NotInformational);
        }
        let mut state = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if state.closed {
            return Err(InterimError::Closed);
        }
        if state.queue.len() >= MAX_QUEUED {
            return Err(InterimError::Full);
        }
        state.queue.push_back(res);
        if let Some(waker) = state.waker.take() {
            waker.wake();
        }
        Ok(())
    }
}

/// The connection's end of an [`Interim`].
pub(crate) struct InterimReceiver(Arc<Mutex<State>>);

pub(crate) fn pair() -> (Interim, InterimReceiver) {
    let state = Arc::new(Mutex::new(State::default()));
    (Interim(state.clone()), InterimReceiver(state))
}

impl InterimReceiver {
    /// The next response queued; `Pending` (the task woken by the next `send`) when there is none.
    pub(crate) fn poll_next(&self, cx: &mut Context<'_>) -> Poll<http::Response<()>> {
        let mut state = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(res) = state.queue.pop_front() {
            return Poll::Ready(res);
        }
        match &state.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            _ => state.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl Drop for InterimReceiver {
    fn drop(&mut self) {
        let mut state = self.0.lock().unwrap_or_else(|e| e.into_inner());
        state.closed = true;
        state.queue.clear();
        state.waker = None;
    }
}
