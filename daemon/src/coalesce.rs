//! Request coalescing: concurrent misses for one key share one backend fetch, and every waiter streams the
//! body as it arrives. A key whose response proved uncacheable is remembered for a while (hit-for-miss) so
//! that later requests go straight to the backend instead of queueing behind each other.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body::Frame;
use lacquer_storage::InvalidationMark;
use tokio::sync::watch;

use crate::body::{self, Body, BoxError};

/// What a fetch learned from the backend's response head, shared by every reader.
#[derive(Debug)]
pub struct FetchedHead {
    pub status: StatusCode,
    /// Headers as they will be stored and delivered (hop-by-hop fields removed, `Date` ensured).
    pub headers: HeaderMap,
    /// Whether the response is being stored; when not, only the reader that started the fetch may use it.
    pub shareable: bool,
    /// The variant selection the response was fetched under (empty without `Vary`).
    pub selection: Vec<(String, String)>,
    /// Corrected initial age in seconds, at `received_at`.
    pub initial_age: u64,
    pub received_at: Instant,
    /// Freshness left at `received_at` (zero when not stored).
    pub ttl: Duration,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct FetchError(pub Arc<str>);

impl FetchError {
    pub fn new(msg: impl Into<String>) -> Self {
        Self(Arc::from(msg.into()))
    }
}

/// A head failure carries the status the client should see.
#[derive(Debug, Clone)]
pub struct HeadError {
    pub status: StatusCode,
    pub error: FetchError,
}

#[derive(Default)]
struct State {
    head: Option<Result<Arc<FetchedHead>, HeadError>>,
    body: Vec<Bytes>,
    end: Option<Result<(), FetchError>>,
    /// The fill task is done, including publishing to the store: a new lookup now sees what it stored.
    settled: bool,
}

/// One backend fetch and the body bytes received so far.
pub struct Fetch {
    state: Mutex<State>,
    changed: watch::Sender<()>,
    /// When the fetch started, against bans and purges.
    since: InvalidationMark,
}

impl Fetch {
    pub fn new(since: InvalidationMark) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State::default()),
            changed: watch::Sender::new(()),
            since,
        })
    }

    pub fn since(&self) -> InvalidationMark {
        self.since
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.state.lock().expect("fetch mutex"));
        self.changed.send_replace(());
    }

    pub fn set_head(&self, head: Result<Arc<FetchedHead>, HeadError>) {
        self.update(|s| s.head = Some(head));
    }

    pub fn push(&self, data: Bytes) {
        self.update(|s| s.body.push(data));
    }

    pub fn end(&self, result: Result<(), FetchError>) {
        self.update(|s| s.end = Some(result));
    }

    /// Ends a fetch that cannot go on (its task panicked): readers still waiting for the head get `head`,
    /// readers of a body get an error instead of waiting for bytes that will not come.
    pub fn abandon(&self, head: HeadError) {
        let error = head.error.clone();
        self.update(|s| {
            s.head.get_or_insert(Err(head));
            s.end.get_or_insert(Err(error));
        });
    }

    pub fn settle(&self) {
        self.update(|s| s.settled = true);
    }

    /// Whether the whole body has arrived.
    pub fn is_complete(&self) -> bool {
        matches!(self.state.lock().expect("fetch mutex").end, Some(Ok(())))
    }

    pub fn reader(self: &Arc<Self>) -> FetchReader {
        FetchReader {
            fetch: self.clone(),
            rx: self.changed.subscribe(),
            pos: 0,
        }
    }
}

pub struct FetchReader {
    fetch: Arc<Fetch>,
    rx: watch::Receiver<()>,
    pos: usize,
}

impl FetchReader {
    /// Waits for the response head.
    pub async fn head(&mut self) -> Result<Arc<FetchedHead>, HeadError> {
        loop {
            self.rx.borrow_and_update();
            if let Some(head) = &self.fetch.state.lock().expect("fetch mutex").head {
                return head.clone();
            }
            if self.rx.changed().await.is_err() {
                return Err(HeadError {
                    status: StatusCode::BAD_GATEWAY,
                    error: FetchError::new("fetch abandoned"),
                });
            }
        }
    }

    /// Waits until the fill task is done, including publishing what it stored.
    pub async fn settled(&mut self) {
        loop {
            self.rx.borrow_and_update();
            if self.fetch.state.lock().expect("fetch mutex").settled {
                return;
            }
            if self.rx.changed().await.is_err() {
                return;
            }
        }
    }

    async fn next_chunk(&mut self) -> Option<Result<Bytes, FetchError>> {
        loop {
            self.rx.borrow_and_update();
            {
                let state = self.fetch.state.lock().expect("fetch mutex");
                if let Some(data) = state.body.get(self.pos) {
                    self.pos += 1;
                    return Some(Ok(data.clone()));
                }
                match &state.end {
                    Some(Ok(())) => return None,
                    Some(Err(e)) => return Some(Err(e.clone())),
                    None => {}
                }
            }
            if self.rx.changed().await.is_err() {
                return Some(Err(FetchError::new("fetch abandoned")));
            }
        }
    }

    /// Bytes `first..=last` of the body, each sent as soon as it has arrived.
    pub fn into_range_body(self, first: u64, last: u64) -> Body {
        body::from_stream(futures_util::stream::unfold(
            (self, 0u64),
            move |(mut reader, mut offset)| async move {
                while offset <= last {
                    let data = match reader.next_chunk().await? {
                        Ok(data) => data,
                        Err(e) => return Some((Err(BoxError::from(e)), (reader, u64::MAX))),
                    };
                    let start = offset;
                    offset += data.len() as u64;
                    if offset <= first {
                        continue;
                    }
                    let from = first.saturating_sub(start) as usize;
                    let to = ((last + 1).saturating_sub(start) as usize).min(data.len());
                    return Some((Ok(Frame::data(data.slice(from..to))), (reader, offset)));
                }
                None
            },
        ))
    }

    /// The body as it arrives; an error if the fetch fails or is cut short, so the client never takes a
    /// truncated body for a whole one.
    pub fn into_body(self) -> Body {
        body::from_stream(futures_util::stream::unfold(
            self,
            |mut reader| async move {
                let item = reader.next_chunk().await?;
                Some((item.map(Frame::data).map_err(BoxError::from), reader))
            },
        ))
    }
}

enum Slot {
    Fetching(Arc<Fetch>),
    HitForMiss(Instant),
}

/// How a miss proceeds.
pub enum Joined {
    /// No fetch was in flight: the caller must start one with this handle.
    Leader(Arc<Fetch>),
    /// A fetch is in flight: read it.
    Waiter(Arc<Fetch>),
    /// The key recently proved uncacheable: fetch alone, without registering.
    HitForMiss,
}

/// Hit-for-miss entries are pruned once the table grows past this many keys.
const PRUNE_AT: usize = 4096;

#[derive(Default)]
pub struct Coalescer {
    slots: Mutex<HashMap<String, Slot>>,
}

impl Coalescer {
    /// Joins the fetch in flight for `key`, unless a ban or purge came after it started (`now` is later):
    /// what it brings may be what was invalidated, so a new fetch replaces it for everyone who comes later.
    pub fn join(&self, key: &str, now: InvalidationMark) -> Joined {
        let mut slots = self.slots.lock().expect("coalescer mutex");
        match slots.get(key) {
            Some(Slot::Fetching(fetch)) if fetch.since.epoch == now.epoch => {
                return Joined::Waiter(fetch.clone())
            }
            Some(Slot::HitForMiss(until)) if *until > Instant::now() => return Joined::HitForMiss,
            _ => {}
        }
        let fetch = Fetch::new(now);
        slots.insert(key.to_owned(), Slot::Fetching(fetch.clone()));
        Joined::Leader(fetch)
    }

    /// Unregisters `fetch` so later requests look the key up again; with `hit_for_miss`, they bypass
    /// coalescing for that long.
    pub fn finish(&self, key: &str, fetch: &Arc<Fetch>, hit_for_miss: Option<Duration>) {
        let mut slots = self.slots.lock().expect("coalescer mutex");
        let ours = matches!(slots.get(key), Some(Slot::Fetching(f)) if Arc::ptr_eq(f, fetch));
        if !ours {
            return;
        }
        match hit_for_miss.filter(|d| !d.is_zero()) {
            Some(d) => {
                slots.insert(key.to_owned(), Slot::HitForMiss(Instant::now() + d));
            }
            None => {
                slots.remove(key);
            }
        }
        if slots.len() > PRUNE_AT {
            let now = Instant::now();
            slots.retain(|_, slot| !matches!(slot, Slot::HitForMiss(until) if *until <= now));
        }
    }

    /// Forgets a hit-for-miss marker once the key turned out cacheable after all.
    pub fn clear_hit_for_miss(&self, key: &str) {
        let mut slots = self.slots.lock().expect("coalescer mutex");
        if matches!(slots.get(key), Some(Slot::HitForMiss(_))) {
            slots.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn mark(epoch: u64) -> InvalidationMark {
        InvalidationMark { ban: 0, epoch }
    }

    fn head(shareable: bool) -> Arc<FetchedHead> {
        Arc::new(FetchedHead {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            shareable,
            selection: vec![],
            initial_age: 0,
            received_at: Instant::now(),
            ttl: Duration::ZERO,
        })
    }

    #[tokio::test]
    async fn waiters_stream_bytes_as_they_arrive() {
        let c = Coalescer::default();
        let Joined::Leader(fetch) = c.join("k", mark(0)) else {
            panic!("first is leader")
        };
        let Joined::Waiter(same) = c.join("k", mark(0)) else {
            panic!("second waits")
        };
        assert!(Arc::ptr_eq(&fetch, &same));
        let mut reader = same.reader();
        fetch.set_head(Ok(head(true)));
        assert_eq!(reader.head().await.unwrap().status, StatusCode::OK);
        fetch.push(Bytes::from_static(b"first"));
        let mut body = reader.into_body();
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "first");
        fetch.push(Bytes::from_static(b"second"));
        fetch.end(Ok(()));
        assert_eq!(body.collect().await.unwrap().to_bytes(), "second");
        c.finish("k", &fetch, None);
        assert!(matches!(c.join("k", mark(0)), Joined::Leader(_)));
    }

    #[tokio::test]
    async fn a_failed_fetch_reaches_readers_as_an_error() {
        let fetch = Fetch::new(mark(0));
        let reader = fetch.reader();
        fetch.set_head(Ok(head(true)));
        fetch.push(Bytes::from_static(b"part"));
        fetch.end(Err(FetchError::new("reset")));
        assert!(reader.into_body().collect().await.is_err());
    }

    #[tokio::test]
    async fn an_abandoned_fetch_ends_every_reader() {
        let before_head = Fetch::new(mark(0));
        let mut waiting = before_head.reader();
        before_head.abandon(HeadError {
            status: StatusCode::BAD_GATEWAY,
            error: FetchError::new("panicked"),
        });
        assert_eq!(
            waiting.head().await.unwrap_err().status,
            StatusCode::BAD_GATEWAY
        );

        let mid_body = Fetch::new(mark(0));
        let reader = mid_body.reader();
        mid_body.set_head(Ok(head(true)));
        mid_body.push(Bytes::from_static(b"part"));
        mid_body.abandon(HeadError {
            status: StatusCode::BAD_GATEWAY,
            error: FetchError::new("panicked"),
        });
        assert!(
            reader.into_body().collect().await.is_err(),
            "a short body is an error"
        );
    }

    #[test]
    fn hit_for_miss_bypasses_and_expires() {
        let c = Coalescer::default();
        let Joined::Leader(fetch) = c.join("k", mark(0)) else {
            panic!()
        };
        c.finish("k", &fetch, Some(Duration::from_secs(60)));
        assert!(matches!(c.join("k", mark(0)), Joined::HitForMiss));
        c.clear_hit_for_miss("k");
        let Joined::Leader(fetch) = c.join("k", mark(0)) else {
            panic!()
        };
        c.finish("k", &fetch, Some(Duration::from_nanos(1)));
        std::thread::sleep(Duration::from_millis(2));
        assert!(matches!(c.join("k", mark(0)), Joined::Leader(_)));
    }

    #[test]
    fn an_invalidation_replaces_the_fetch_in_flight_for_newcomers() {
        let c = Coalescer::default();
        let Joined::Leader(old) = c.join("k", mark(0)) else {
            panic!()
        };
        let Joined::Leader(new) = c.join("k", mark(1)) else {
            panic!("a fetch from before the invalidation is not joined")
        };
        assert!(matches!(c.join("k", mark(1)), Joined::Waiter(f) if Arc::ptr_eq(&f, &new)));
        c.finish("k", &old, None);
        assert!(matches!(c.join("k", mark(1)), Joined::Waiter(f) if Arc::ptr_eq(&f, &new)));
    }

    #[test]
    fn finishing_someone_elses_fetch_changes_nothing() {
        let c = Coalescer::default();
        let Joined::Leader(fetch) = c.join("k", mark(0)) else {
            panic!()
        };
        c.finish("k", &Fetch::new(mark(0)), None);
        assert!(matches!(c.join("k", mark(0)), Joined::Waiter(f) if Arc::ptr_eq(&f, &fetch)));
    }
}
