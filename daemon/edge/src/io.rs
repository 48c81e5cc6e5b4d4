//! Wrappers around a client connection's byte stream: bytes already read put back in front, and the idle
//! timeout.

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed},
        Arc,
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::{Buf, Bytes};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::{Instant, Sleep},
};

/// A stream with bytes read ahead (past a PROXY header, or while looking for the HTTP/2 preface) served
/// before the rest.
pub struct Prefixed<IO> {
    prefix: Bytes,
    io: IO,
}

impl<IO> Prefixed<IO> {
    pub fn new(prefix: Bytes, io: IO) -> Self {
        Self { prefix, io }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Prefixed<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.prefix.has_remaining() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Prefixed<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    // Passed on, as every wrapper of the socket must: the default writes only the first buffer, so a body
    // frame hyper queues (its size line, its bytes, its CRLF) went out in three `send`s, not one `writev`.
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// What the idle timeout of one connection shares with its requests.
#[derive(Debug, Default)]
pub struct Activity {
    /// Requests still waiting for their response head. While any is, the connection is not idle however
    /// long the backend takes: the fetch has timeouts of its own.
    waiting: AtomicUsize,
    /// Set when the connection was given up as idle (HTTP/2 does not keep the I/O error that says so).
    timed_out: AtomicBool,
}

impl Activity {
    /// Counts a request as waiting for its response head until the guard is dropped.
    pub fn enter(self: &Arc<Self>) -> WaitingGuard {
        self.waiting.fetch_add(1, Relaxed);
        WaitingGuard(self.clone())
    }

    /// Whether the connection was given up as idle.
    pub fn timed_out(&self) -> bool {
        self.timed_out.load(Relaxed)
    }
}

/// A request waiting for its response head, for as long as it lives.
pub struct WaitingGuard(Arc<Activity>);

impl Drop for WaitingGuard {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Relaxed);
    }
}

/// Fails reads and writes with `TimedOut` once no byte has moved for `idle` and no request is waiting.
///
/// A timer ticks four times per `idle` and the connection goes after four quiet ticks in a row, so it
/// closes between `idle` and 1.25 × `idle` after it went quiet, and the hit path never reads the clock.
pub struct IdleTimeout<IO> {
    io: IO,
    tick: Duration,
    activity: Arc<Activity>,
    moved: bool,
    quiet_ticks: u32,
    timer: Pin<Box<Sleep>>,
}

const TICKS_PER_IDLE: u32 = 4;

impl<IO> IdleTimeout<IO> {
    /// `io`, given up once idle for `idle` while no request of `activity` waits.
    pub fn new(io: IO, idle: Duration, activity: Arc<Activity>) -> Self {
        let tick = idle / TICKS_PER_IDLE;
        Self {
            io,
            tick,
            activity,
            moved: false,
            quiet_ticks: 0,
            timer: Box::pin(tokio::time::sleep(tick)),
        }
    }

    /// Called when the stream would block: counts the ticks that passed, and gives up after enough quiet ones.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        while self.timer.as_mut().poll(cx).is_ready() {
            if self.moved || self.activity.waiting.load(Relaxed) > 0 {
                self.quiet_ticks = 0;
            } else {
                self.quiet_ticks += 1;
            }
            self.moved = false;
            if self.quiet_ticks >= TICKS_PER_IDLE {
                self.activity.timed_out.store(true, Relaxed);
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no activity for {:?}", self.tick * TICKS_PER_IDLE),
                ));
            }
            let next = Instant::now() + self.tick;
            self.timer.as_mut().reset(next);
        }
        Ok(())
    }

    /// Notes a write's outcome: bytes moved, or a wait that counts towards the idle timeout.
    fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        written: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match written {
            Poll::Ready(r) => {
                self.moved = true;
                Poll::Ready(r)
            }
            Poll::Pending => {
                self.poll_idle(cx)?;
                Poll::Pending
            }
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for IdleTimeout<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    self.moved = true;
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                self.poll_idle(cx)?;
                Poll::Pending
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        self.wrote(cx, written)
    }

    // Passed on (see `Prefixed`).
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.wrote(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn the_prefix_comes_first() {
        let (mut tx, rx) = tokio::io::duplex(64);
        tx.write_all(b" world").await.unwrap();
        drop(tx);
        let mut s = Prefixed::new(Bytes::from_static(b"hello"), rx);
        let mut all = String::new();
        s.read_to_string(&mut all).await.unwrap();
        assert_eq!(all, "hello world");
    }

    #[tokio::test(start_paused = true)]
    async fn idle_connections_time_out_unless_a_request_is_waiting() {
        let (mut tx, rx) = tokio::io::duplex(64);
        let activity = Arc::new(Activity::default());
        let mut s = IdleTimeout::new(rx, Duration::from_secs(10), activity.clone());
        let mut buf = [0; 8];
        tokio::time::sleep(Duration::from_secs(8)).await;
        tx.write_all(b"x").await.unwrap();
        assert_eq!(s.read(&mut buf).await.unwrap(), 1);
        let start = Instant::now();
        let guard = activity.enter();
        let timed_out = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf)).await;
        assert!(timed_out.is_err(), "a waiting request keeps it open");
        drop(guard);
        let e = s.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(activity.timed_out());
        assert!(start.elapsed() >= Duration::from_secs(30));
        assert!(
            start.elapsed() <= Duration::from_secs(41),
            "{:?}",
            start.elapsed()
        );
    }
}
