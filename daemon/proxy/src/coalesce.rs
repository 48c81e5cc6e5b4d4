//! Request coalescing: concurrent misses for one key share one backend fetch, and every waiter streams the
//! body as it arrives. A key whose response proved uncacheable is remembered for a while (hit-for-miss) so
//! that later requests go straight to the backend instead of queueing behind each other.
//!
//! Memory is bounded per fetch: at most `transit_buffer` bytes of the body are held (a window over the
//! bytes received). A reader that falls behind the window reads the chunks the store already holds; when
//! the body is not being stored, the origin is read no faster than the slowest reader takes it. A fetch
//! whose readers have all gone is cancelled, unless it is filling the store.

use std::{
    collections::{HashMap, VecDeque},
    future::Future,
    sync::{
        atomic::{AtomicU64, Ordering::SeqCst},
        Arc, Mutex, OnceLock,
    },
    task::Poll,
    time::{Duration, Instant},
};

use bytes::Bytes;
use foyer::{Cache, CacheBuilder, FifoConfig};
use http::{HeaderMap, StatusCode};
use http_body::Frame;
use lacquer_storage::{InvalidationMark, ObjectMeta, Store, StoreError};
use tokio::sync::{watch, Notify};

use lacquer_backends::body::{self, Body, BoxError};
use lacquer_policy::storable::NotStored;

use crate::store::{BodyWriter, CacheStore, PartialRead};

/// What a fetch learned from the backend's response head, shared by every reader.
#[derive(Debug)]
pub struct FetchedHead {
    /// The backend's status.
    pub status: StatusCode,
    /// Headers as they will be stored and delivered (hop-by-hop fields removed, `Date` ensured).
    pub headers: HeaderMap,
    /// Whether the response is being stored; when not, only the reader that started the fetch may use it.
    pub shareable: bool,
    /// Why the response is not stored, when the policy refused it (a store that refused a writer gives
    /// none): `Cache-Status`'s `detail`.
    pub not_stored: Option<NotStored>,
    /// The variant selection the response was fetched under (empty without `Vary`).
    pub selection: Vec<(String, String)>,
    /// Corrected initial age in seconds, at `received_at`.
    pub initial_age: u64,
    /// When the head arrived (monotonic): ages and remaining freshness count from it.
    pub received_at: Instant,
    /// Freshness left at `received_at` (zero when not stored).
    pub ttl: Duration,
    /// The origin confirmed the stored object (a 304 to its validators): the body is the stored one.
    pub revalidated: bool,
}

/// Why a fetch failed, shared by every reader of it (cheap to clone).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct FetchError(pub Arc<str>);

impl FetchError {
    /// An error saying `msg`.
    pub fn new(msg: impl Into<String>) -> Self {
        Self(Arc::from(msg.into()))
    }
}

/// A head failure carries the status the client should see.
#[derive(Debug, Clone)]
pub struct HeadError {
    /// The status the client gets (502, 503 or 504).
    pub status: StatusCode,
    /// What went wrong, for the body and the log.
    pub error: FetchError,
}

/// Where readers behind the window find the body's bytes.
enum Backing<S: CacheStore> {
    /// The chunks the fill's writer has stored so far.
    Writing(S::Partial),
    /// A stored body the origin confirmed (304): all of it.
    Stored(S, Arc<ObjectMeta>),
}

impl<S: CacheStore> Clone for Backing<S> {
    fn clone(&self) -> Self {
        match self {
            Backing::Writing(partial) => Backing::Writing(partial.clone()),
            Backing::Stored(store, meta) => Backing::Stored(store.clone(), meta.clone()),
        }
    }
}

impl<S: CacheStore> Backing<S> {
    /// Bytes of the body readable from the store.
    fn stored(&self) -> u64 {
        match self {
            Backing::Writing(partial) => partial.stored(),
            Backing::Stored(_, meta) => meta.length,
        }
    }

    fn chunk_size(&self) -> u64 {
        match self {
            Backing::Writing(partial) => partial.chunk_size(),
            Backing::Stored(_, meta) => u64::from(meta.chunk_size),
        }
    }

    async fn read_chunk(&mut self, index: u32) -> Result<Option<Bytes>, StoreError> {
        match self {
            Backing::Writing(partial) => partial.read_chunk(index).await,
            Backing::Stored(store, meta) => {
                Ok(store.read_chunk(meta, index).await?.map(|c| c.data))
            }
        }
    }
}

struct State<S: CacheStore> {
    /// Body bytes held in memory before the origin read waits.
    limit: u64,
    head: Option<Result<Arc<FetchedHead>, HeadError>>,
    /// The body bytes held in memory, each frame with its offset: `window_start..received`.
    window: VecDeque<(u64, Bytes)>,
    window_start: u64,
    received: u64,
    /// The store's copy of the body, for readers behind the window.
    stored: Option<Backing<S>>,
    /// Whether the store still takes the body; such a fetch runs on when its readers leave.
    storing: bool,
    /// The fill stopped storing a body it meant to share: the bytes it dropped from memory are in no store.
    abandoned: bool,
    /// A writer that stopped storing, kept unfinished so the chunks it stored stay readable for readers
    /// behind the window until the fetch itself is dropped.
    parked: Option<S::Writer>,
    /// Each reader's position in the body.
    readers: HashMap<u64, u64>,
    next_reader: u64,
    /// Every reader left before the fetch was worth finishing: it stopped.
    cancelled: bool,
    end: Option<Result<(), FetchError>>,
    /// The fill task is done, including publishing to the store: a new lookup now sees what it stored.
    settled: bool,
    /// Changed without waking the readers yet (see [`Fetch::announce`]).
    unannounced: bool,
}

impl<S: CacheStore> State<S> {
    /// Drops the frames no reader needs from memory: those every reader has passed, and, while the store
    /// holds them, the oldest ones at or past `limit`. While the body is being stored nothing past what the
    /// store holds is dropped, so a reader joining late finds every byte in the store or in the window.
    /// Returns what the store held as it trimmed: a wait for the store must wait for more than that, not
    /// for more than a later reading (the store moves on without this lock).
    fn trim(&mut self) -> u64 {
        // What the store holds, not what it was handed: a chunk handed over can still be refused (a full
        // disk), and a reader joining late must then find its bytes in the window.
        let held_by_store = self.stored.as_ref().map_or(0, Backing::stored);
        let slowest = self
            .readers
            .values()
            .min()
            .copied()
            .unwrap_or(self.received);
        while let Some((start, data)) = self.window.front() {
            let end = start + data.len() as u64;
            let held = self.received - self.window_start;
            let passed = end <= slowest;
            let in_store = end <= held_by_store;
            // At the limit too: `room` waits until the window is below it.
            let droppable = if self.storing {
                in_store && (passed || held >= self.limit)
            } else {
                passed || (in_store && held >= self.limit)
            };
            if !droppable {
                break;
            }
            self.window_start = end;
            self.window.pop_front();
        }
        held_by_store
    }

    /// Reader `id` moved to `pos`; returns whether the fill may be waiting for it to (`Fetch::room` waits
    /// only while the window is full: below it, waking the fill for every frame every reader takes cost a
    /// wake-up per reader per frame for nothing).
    fn reader_at(&mut self, id: u64, pos: u64) -> bool {
        self.readers.insert(id, pos);
        self.received - self.window_start >= self.limit
    }

    /// The bytes held from `pos` to the end of the frame holding it.
    fn held_at(&self, pos: u64) -> Option<Bytes> {
        let i = self.window.partition_point(|(start, _)| *start <= pos);
        let (start, data) = self.window.get(i.checked_sub(1)?)?;
        let from = (pos - start) as usize;
        (from < data.len()).then(|| data.slice(from..))
    }
}

/// One backend fetch and the window of body bytes its readers have not all taken yet.
pub struct Fetch<S: CacheStore = Store> {
    state: Mutex<State<S>>,
    /// Wakes readers: the head, more body, or the end arrived.
    changed: watch::Sender<()>,
    /// Wakes the fill task: a reader moved on or left.
    progress: Notify,
    /// When the fetch started, against bans and purges.
    since: InvalidationMark,
    /// The whole body decoded, once, for every reader that needs it decoded ([`FetchReader::decoded_once`]);
    /// `None` inside when it did not decode.
    decoded: OnceLock<Option<Bytes>>,
}

impl<S: CacheStore> Fetch<S> {
    /// A fetch started at `since`, holding at most `transit_buffer` body bytes in memory (at least two
    /// chunks once it stores the body).
    pub fn new(since: InvalidationMark, transit_buffer: u64) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                limit: transit_buffer,
                head: None,
                window: VecDeque::new(),
                window_start: 0,
                received: 0,
                stored: None,
                storing: false,
                abandoned: false,
                parked: None,
                readers: HashMap::new(),
                next_reader: 0,
                cancelled: false,
                unannounced: false,
                end: None,
                settled: false,
            }),
            changed: watch::Sender::new(()),
            progress: Notify::new(),
            since,
            decoded: OnceLock::new(),
        })
    }

    /// Where the invalidation history stood when the fetch started: what it stores is tested against
    /// the bans and purges after it.
    pub fn since(&self) -> InvalidationMark {
        self.since
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<S>> {
        self.state.lock().expect("fetch mutex")
    }

    fn update(&self, f: impl FnOnce(&mut State<S>)) {
        {
            let mut s = self.lock();
            f(&mut s);
            s.unannounced = false;
        }
        self.changed.send_replace(());
    }

    /// Changes the state without waking the readers: the fill calls [`Fetch::announce`] before anything it
    /// waits for, so the readers of a head and body that arrive together wake once for all of it, not once
    /// for the head and once for each frame (a thousand players of one live part each woke four or five
    /// times per part, and wrote the head apart from the body).
    fn update_quietly(&self, f: impl FnOnce(&mut State<S>)) {
        let mut s = self.lock();
        f(&mut s);
        s.unannounced = true;
    }

    /// Wakes the readers for what changed quietly since they were last woken, if anything did.
    pub fn announce(&self) {
        let announce = std::mem::take(&mut self.lock().unannounced);
        if announce {
            self.changed.send_replace(());
        }
    }

    /// Runs `work` for the fill; if it has to wait, the readers are woken first for what was changed
    /// quietly, so they never wait for what is in hand while the fill waits for something else. Before
    /// that, `work` gets one more try after the other tasks of the thread have had a turn: the origin's
    /// connection runs as one of them, and a body that came in one piece (a live part: its head, its
    /// frames, its chunked end) then reaches the readers at one wake, which each answers in one write.
    pub async fn announced_before_waiting<T>(&self, work: impl Future<Output = T>) -> T {
        let mut work = std::pin::pin!(work);
        if let Poll::Ready(out) = poll_once(work.as_mut()).await {
            return out;
        }
        if self.lock().unannounced {
            tokio::task::yield_now().await;
            if let Poll::Ready(out) = poll_once(work.as_mut()).await {
                return out;
            }
            self.announce();
        }
        work.await
    }

    /// The response head, or why there is none; wakes every reader waiting for it.
    pub fn set_head(&self, head: Result<Arc<FetchedHead>, HeadError>) {
        self.update(|s| s.head = Some(head));
    }

    /// The response head, for the readers to find when they are next woken: the fill announces it with
    /// the first body bytes that are in hand, or before it first waits.
    pub fn set_head_quietly(&self, head: Arc<FetchedHead>) {
        self.update_quietly(|s| s.head = Some(Ok(head)));
    }

    /// The body is being stored by `writer`: readers that fall behind the window read it back from there,
    /// and the fetch goes on when its readers leave. The window then holds at least two chunks, since the
    /// bytes of a chunk still filling up cannot be read back yet.
    pub fn store_into(&self, writer: &S::Writer) {
        let mut s = self.lock();
        let stored = writer.partial_body();
        s.limit = s.limit.max(2 * stored.chunk_size());
        s.stored = Some(Backing::Writing(stored));
        s.storing = true;
    }

    /// The whole body is `meta`'s, which the store holds (the origin confirmed it with a 304): every reader
    /// reads it from there, and the fetch holds none of it.
    pub fn complete_from_store(&self, store: S, meta: ObjectMeta) {
        let length = meta.length;
        self.update(|s| {
            s.stored = Some(Backing::Stored(store, Arc::new(meta)));
            s.received = length;
            s.window_start = length;
            s.end = Some(Ok(()));
        });
    }

    /// The body is no longer being stored. The writer is kept (unfinished) while the fetch lives, so what
    /// it stored stays readable for the readers behind the window; from now on the origin is read no faster
    /// than the slowest reader.
    pub fn stop_storing(&self, writer: Option<S::Writer>) {
        let mut s = self.lock();
        s.storing = false;
        s.abandoned = true;
        s.parked = writer;
    }

    /// Body bytes from the backend, for the readers (call [`Fetch::room`] first to stay in the window).
    #[cfg(test)]
    pub fn push(&self, data: Bytes) {
        self.push_quietly(data);
        self.announce();
    }

    /// Body bytes from the backend, for the readers to find when they are next woken ([`Fetch::announce`];
    /// [`Fetch::room`] announces before it waits).
    pub fn push_quietly(&self, data: Bytes) {
        self.update_quietly(|s| {
            let len = data.len() as u64;
            s.window.push_back((s.received, data));
            s.received += len;
        });
    }

    /// The last body bytes from the backend: the body is whole as the readers get them.
    pub fn push_last(&self, data: Bytes) {
        self.update(|s| {
            let len = data.len() as u64;
            s.window.push_back((s.received, data));
            s.received += len;
            s.end = Some(Ok(()));
        });
    }

    /// The body ended: whole (`Ok`), or cut short, which readers see as an error.
    pub fn end(&self, result: Result<(), FetchError>) {
        self.update(|s| s.end = Some(result));
    }

    /// Waits until the window has room for more of the body, dropping what no reader needs. While the body
    /// is being stored that includes waiting for the store to take what it was handed; a store that refuses
    /// the body ends the wait (the fill learns it from its writer and stops storing).
    ///
    /// The store takes whole chunks only, so once it holds every whole chunk of what was received, waiting
    /// for it would wait for bytes that only the fill can bring: the window then goes past its limit by
    /// less than a chunk and a frame (a frame across the store's edge cannot be dropped).
    pub async fn room(&self) {
        loop {
            let storing = {
                let mut s = self.lock();
                let in_store = s.trim();
                if s.received - s.window_start < s.limit {
                    return;
                }
                match &s.stored {
                    Some(Backing::Writing(partial)) if s.storing => {
                        let chunk = partial.chunk_size().max(1);
                        if in_store >= s.received / chunk * chunk {
                            return;
                        }
                        Some((partial.clone(), in_store))
                    }
                    _ => None,
                }
            };
            // The readers must see all there is before the fill waits for them.
            self.announce();
            match storing {
                Some((mut partial, stored)) => tokio::select! {
                    () = self.progress.notified() => {}
                    more = partial.stored_beyond(stored) => if !more {
                        return;
                    },
                },
                None => self.progress.notified().await,
            }
        }
    }

    /// Resolves once every reader has gone while the body is not being stored; the fetch is then marked
    /// cancelled (atomically with that check, so a reader cannot join it in between) and should stop.
    pub async fn deserted(&self) {
        loop {
            {
                let mut s = self.lock();
                if s.readers.is_empty() && !s.storing {
                    s.cancelled = true;
                    s.head.get_or_insert_with(|| {
                        Err(HeadError {
                            status: StatusCode::BAD_GATEWAY,
                            error: FetchError::new("fetch cancelled"),
                        })
                    });
                    s.end
                        .get_or_insert_with(|| Err(FetchError::new("fetch cancelled")));
                    drop(s);
                    self.changed.send_replace(());
                    return;
                }
            }
            self.progress.notified().await;
        }
    }

    /// Marks the fetch cancelled, as [`Fetch::deserted`] does, when every reader has gone, even while it is
    /// storing: no reader joins it after, and `true` says the fill may stop. For a fill that keeps what it
    /// has (a client's forwarded range that its clients left).
    pub fn leave_if_deserted(&self) -> bool {
        let mut s = self.lock();
        if !s.readers.is_empty() {
            return false;
        }
        s.cancelled = true;
        s.end
            .get_or_insert_with(|| Err(FetchError::new("every reader left the range")));
        drop(s);
        self.changed.send_replace(());
        true
    }

    /// Whether no reader is left (the fetch goes on only because it is filling the store).
    pub fn unattended(&self) -> bool {
        self.lock().readers.is_empty()
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

    /// The fill is done, publication included: readers waiting to look up again may.
    pub fn settle(&self) {
        self.update(|s| s.settled = true);
    }

    /// Waits until the fetch has its answer's head, or why there is none (it failed or was cancelled).
    pub async fn answered(&self) {
        self.until(|s| s.head.is_some()).await;
    }

    /// Waits until `done` holds of the fetch's state; checked again whenever it changes.
    async fn until(&self, done: impl Fn(&State<S>) -> bool) {
        let mut changed = self.changed.subscribe();
        while !done(&self.lock()) {
            if changed.changed().await.is_err() {
                return;
            }
        }
    }

    /// Body bytes received from the origin so far.
    pub fn received(&self) -> u64 {
        self.lock().received
    }

    /// Whether the whole body has arrived.
    pub fn is_complete(&self) -> bool {
        matches!(self.lock().end, Some(Ok(())))
    }

    /// Whether a newcomer may read this fetch: not when it was cancelled, nor when it stopped storing a
    /// body it meant to share (the bytes it dropped from memory are then in no store).
    fn joinable(&self) -> bool {
        let s = self.lock();
        !s.cancelled && !s.abandoned
    }

    /// A reader from the start of the body. [`FetchReader::cancelled`] tells whether the fetch had already
    /// been given up, in which case the reader must fetch for itself.
    pub fn reader(self: &Arc<Self>) -> FetchReader<S> {
        let mut s = self.lock();
        let id = s.next_reader;
        s.next_reader += 1;
        s.readers.insert(id, 0);
        let cancelled = s.cancelled;
        drop(s);
        FetchReader {
            fetch: self.clone(),
            rx: self.changed.subscribe(),
            place: Place {
                id,
                pos: 0,
                unyielded: YIELD_EVERY - FIRST_TURN,
            },
            cancelled,
        }
    }
}

/// Polls `work` once.
async fn poll_once<T>(mut work: std::pin::Pin<&mut impl Future<Output = T>>) -> Poll<T> {
    std::future::poll_fn(|cx| Poll::Ready(work.as_mut().poll(cx))).await
}

/// Bytes a reader takes without waiting before it lets other tasks of its thread run. A burst of clients
/// joining one fetch all wake when its first bytes arrive; held bytes never make a reader wait, so without
/// this the first woken reader would write megabytes before the next one's first byte left (cold-burst
/// p99 50–80 ms above the origin's own delay). Decoding for a client (`coding`) yields as often.
pub(crate) const YIELD_EVERY: u64 = 64 * 1024;

/// Bytes a reader takes before its first yield: its head and first bytes go out before the other readers'
/// turns. Enough for a live part or a playlist whole: each yield flushes what the reader has taken, and
/// yielding after the first frame sent every such response in two writes (three with its chunked end)
/// where one does (the second reader's first byte waits for 32 KiB more of the first one's at most).
pub(crate) const FIRST_TURN: u64 = 32 * 1024;

/// One reader of a fetch: its position in the body keeps the bytes it has not read in the window (or
/// in the store). Dropping it leaves the fetch.
pub struct FetchReader<S: CacheStore = Store> {
    fetch: Arc<Fetch<S>>,
    rx: watch::Receiver<()>,
    place: Place,
    cancelled: bool,
}

/// Where a reader is in the body, and what it took since it last let its thread go.
struct Place {
    id: u64,
    pos: u64,
    /// Bytes taken since this reader last waited or yielded (its first turn is [`FIRST_TURN`]).
    unyielded: u64,
}

impl Place {
    /// Moves past `len` bytes taken, noting the new position in the fetch's state `s`, and wakes the fill
    /// when it may be waiting for that.
    fn took<S: CacheStore>(&mut self, s: &mut State<S>, progress: &Notify, len: u64) {
        self.pos += len;
        self.unyielded += len;
        if s.reader_at(self.id, self.pos) {
            progress.notify_one();
        }
    }
}

impl<S: CacheStore> Drop for FetchReader<S> {
    fn drop(&mut self) {
        self.fetch.lock().readers.remove(&self.place.id);
        self.fetch.progress.notify_one();
    }
}

/// Where a reader's next bytes come from.
enum Next<S: CacheStore> {
    Store(Backing<S>),
    End(Option<Result<Bytes, FetchError>>),
    Wait,
}

impl<S: CacheStore> FetchReader<S> {
    /// Whether the fetch had been cancelled (all its readers gone) before this reader joined it.
    pub fn cancelled(&self) -> bool {
        self.cancelled
    }

    /// Waits until byte `pos` of the body has arrived, the body has ended (whole or not), or the window holds
    /// all it may: a body not stored waits for this reader to take bytes before more come, so waiting on
    /// would hold the origin's connection for as long as the client stays.
    pub async fn arrived(&self, pos: u64) {
        self.fetch
            .until(|s| {
                s.received > pos || s.end.is_some() || s.received - s.window_start >= s.limit
            })
            .await;
    }

    /// The body's length once the whole of it has arrived.
    pub fn complete_length(&self) -> Option<u64> {
        let s = self.fetch.lock();
        matches!(s.end, Some(Ok(()))).then_some(s.received)
    }

    /// The fetch's whole body, when it has all arrived, is all still in memory and is at most `max` bytes,
    /// decoded by `decode` once for all its readers: the first reader to ask decodes it, the others take
    /// what it made (or wait the moment so small a body takes). `None` otherwise, and when it did not
    /// decode: each reader then decodes as it reads, and meets the error itself.
    pub fn decoded_once(
        &self,
        max: u64,
        decode: impl FnOnce(&[Bytes]) -> Option<Bytes>,
    ) -> Option<Bytes> {
        if let Some(done) = self.fetch.decoded.get() {
            return done.clone();
        }
        let pieces: Vec<Bytes> = {
            let s = self.fetch.lock();
            let in_hand = matches!(s.end, Some(Ok(()))) && s.window_start == 0 && s.received <= max;
            if !in_hand {
                return None;
            }
            s.window.iter().map(|(_, data)| data.clone()).collect()
        };
        self.fetch.decoded.get_or_init(|| decode(&pieces)).clone()
    }

    /// Waits for the response head.
    pub async fn head(&mut self) -> Result<Arc<FetchedHead>, HeadError> {
        loop {
            self.rx.borrow_and_update();
            if let Some(head) = &self.fetch.lock().head {
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
            if self.fetch.lock().settled {
                return;
            }
            if self.rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Leaves the fetch, then waits until its fill task is done, publishing included: a fetch not storing
    /// its body is read at its slowest reader's pace, so a reader that waits without reading would hold it
    /// (and everyone joined to it) still.
    pub async fn leave_until_settled(self) {
        let (fetch, mut rx) = (self.fetch.clone(), self.rx.clone());
        drop(self);
        loop {
            rx.borrow_and_update();
            if fetch.lock().settled {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    async fn next_chunk(&mut self) -> Option<Result<Bytes, FetchError>> {
        if self.place.pos > 0 && self.place.unyielded >= YIELD_EVERY {
            tokio::task::yield_now().await;
            self.place.unyielded = 0;
        }
        loop {
            self.rx.borrow_and_update();
            let next = {
                let mut s = self.fetch.lock();
                if self.place.pos < s.window_start {
                    match &s.stored {
                        Some(stored) => Next::Store(stored.clone()),
                        None => Next::End(Some(Err(FetchError::new(
                            "the reader fell behind a body that is not stored",
                        )))),
                    }
                } else if let Some(data) = s.held_at(self.place.pos) {
                    // Taken under the same lock: one lock of the fetch per frame for each reader.
                    self.place
                        .took(&mut s, &self.fetch.progress, data.len() as u64);
                    return Some(Ok(data));
                } else {
                    match &s.end {
                        Some(Ok(())) => Next::End(None),
                        Some(Err(e)) => Next::End(Some(Err(e.clone()))),
                        None => Next::Wait,
                    }
                }
            };
            match next {
                Next::End(end) => return end,
                Next::Store(mut stored) => {
                    let chunk_size = stored.chunk_size();
                    let index = (self.place.pos / chunk_size) as u32;
                    return match stored.read_chunk(index).await {
                        Ok(Some(chunk)) => {
                            let from = (self.place.pos - u64::from(index) * chunk_size) as usize;
                            let data = chunk.slice(from.min(chunk.len())..);
                            let mut s = self.fetch.lock();
                            self.place
                                .took(&mut s, &self.fetch.progress, data.len() as u64);
                            Some(Ok(data))
                        }
                        Ok(None) => Some(Err(FetchError::new(
                            "a stored chunk of the body in progress was lost",
                        ))),
                        Err(e) => Some(Err(FetchError::new(format!(
                            "reading the body in progress back from the store failed: {e}"
                        )))),
                    };
                }
                Next::Wait => {}
            }
            if self.rx.changed().await.is_err() {
                return Some(Err(FetchError::new("fetch abandoned")));
            }
            self.place.unyielded = 0;
        }
    }

    /// Moves the reader on to byte `pos` without reading what lies before it (in the window or the store):
    /// the window keeps nothing for it behind `pos`.
    fn skip_to(&mut self, pos: u64) {
        if pos > self.place.pos {
            self.place.pos = pos;
            if self.fetch.lock().reader_at(self.place.id, pos) {
                self.fetch.progress.notify_one();
            }
        }
    }

    /// Bytes `first..=last` of the body, each sent as soon as it has arrived; the bytes before `first` are
    /// not read.
    pub fn into_range_body(mut self, first: u64, last: u64) -> Body {
        self.skip_to(first);
        let start = self.place.pos;
        body::from_stream(futures_util::stream::unfold(
            (self, start),
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
                    // An open range runs to `u64::MAX`.
                    let to = last
                        .saturating_add(1)
                        .saturating_sub(start)
                        .min(data.len() as u64) as usize;
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

/// How a miss proceeds.
pub enum Joined<S: CacheStore = Store> {
    /// No fetch was in flight: the caller must start one with this handle.
    Leader(Arc<Fetch<S>>),
    /// A fetch is in flight: read it.
    Waiter(Arc<Fetch<S>>),
    /// The key recently proved uncacheable: fetch alone, without registering.
    HitForMiss,
    /// No fetch is in flight, but one finished after the caller looked the store up: it may have stored
    /// what the caller wants, so the caller looks again instead of fetching it a second time.
    LookAgain,
}

/// Fetches in flight by key, and the keys that recently proved uncacheable.
pub struct Coalescer<S: CacheStore = Store> {
    fetching: Mutex<HashMap<String, Arc<Fetch<S>>>>,
    /// The keys that bypass coalescing for a while, and why; bounded in bytes, the oldest entries leave
    /// first, so endless unique uncacheable URLs cannot grow it.
    hit_for_miss: Cache<String, Uncacheable>,
    /// Fetches finished so far (any key); see [`Coalescer::finished`].
    finished: AtomicU64,
}

/// What one hit-for-miss entry costs besides its key (the entry, its value, the table's slot).
const HIT_FOR_MISS_OVERHEAD: usize = 128;

/// A key whose response recently proved uncacheable (hit-for-miss).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uncacheable {
    /// Until when requests for the key go straight to the backend (monotonic).
    pub until: Instant,
    /// When the response was found so, in Unix milliseconds.
    pub at_ms: u64,
    /// Why it was not stored.
    pub why: NotStored,
}

impl Uncacheable {
    fn new(how_long: Duration, why: NotStored) -> Self {
        Self {
            until: lacquer_clock::monotonic() + how_long,
            at_ms: lacquer_clock::now_ms(),
            why,
        }
    }

    fn in_force(&self) -> bool {
        self.until > lacquer_clock::monotonic()
    }
}

impl<S: CacheStore> Coalescer<S> {
    /// A coalescer whose hit-for-miss table holds at most `hit_for_miss_memory` bytes.
    pub fn new(hit_for_miss_memory: usize) -> Self {
        Self {
            fetching: Mutex::default(),
            hit_for_miss: CacheBuilder::new(hit_for_miss_memory)
                .with_shards(4)
                .with_eviction_config(FifoConfig::default())
                .with_weighter(|key: &String, _: &Uncacheable| key.len() + HIT_FOR_MISS_OVERHEAD)
                .build(),
            finished: AtomicU64::new(0),
        }
    }

    /// How many fetches have finished: a lookup notes it before it reads the store and hands it to
    /// [`Coalescer::join`]. A fetch publishes what it stored before it finishes, so a lookup that missed
    /// an object a fetch was about to publish sees this number move.
    pub fn finished(&self) -> u64 {
        self.finished.load(SeqCst)
    }

    /// Joins the fetch in flight for `key`, unless `invalidated` says a ban, or a purge that may cover the
    /// key, came after the fetch started (given the mark it started at): what it brings may be what was
    /// invalidated, so a new fetch, starting at `now`, replaces it for everyone who comes later. An
    /// invalidation of other keys (a `POST` elsewhere on the site) leaves it joinable. The same goes for a
    /// fetch that was cancelled or stopped storing. `looked_up_at` is [`Coalescer::finished`] as it was
    /// before the caller's lookup: when a fetch finished since, [`Joined::LookAgain`] (it may have just
    /// published the key).
    pub fn join(
        &self,
        key: &str,
        now: InvalidationMark,
        transit_buffer: u64,
        looked_up_at: Option<u64>,
        invalidated: impl FnOnce(InvalidationMark) -> bool,
    ) -> Joined<S> {
        let mut fetching = self.fetching.lock().expect("coalescer mutex");
        match fetching.get(key) {
            Some(fetch)
                if (fetch.since == now || !invalidated(fetch.since)) && fetch.joinable() =>
            {
                return Joined::Waiter(fetch.clone())
            }
            _ => {}
        }
        if looked_up_at.is_some_and(|n| n != self.finished.load(SeqCst)) {
            return Joined::LookAgain;
        }
        if self.is_hit_for_miss(key) {
            return Joined::HitForMiss;
        }
        let fetch = Fetch::new(now, transit_buffer);
        fetching.insert(key.to_owned(), fetch.clone());
        Joined::Leader(fetch)
    }

    /// Whether a fetch of `key` is in flight now.
    pub fn in_flight(&self, key: &str) -> bool {
        self.fetching
            .lock()
            .expect("coalescer mutex")
            .contains_key(key)
    }

    /// Unregisters `fetch` so later requests look the key up again; with `uncacheable` (how long, and why
    /// its response was not stored), they bypass coalescing for that long.
    pub fn finish(
        &self,
        key: &str,
        fetch: &Arc<Fetch<S>>,
        uncacheable: Option<(Duration, NotStored)>,
    ) {
        let mut fetching = self.fetching.lock().expect("coalescer mutex");
        if !fetching.get(key).is_some_and(|f| Arc::ptr_eq(f, fetch)) {
            return;
        }
        fetching.remove(key);
        self.finished.fetch_add(1, SeqCst);
        if let Some((how_long, why)) = uncacheable.filter(|(d, _)| !d.is_zero()) {
            self.hit_for_miss
                .insert(key.to_owned(), Uncacheable::new(how_long, why));
        }
    }

    /// Forgets a hit-for-miss marker once the key turned out cacheable after all.
    pub fn clear_hit_for_miss(&self, key: &str) {
        self.hit_for_miss.remove(key);
    }

    /// Marks `key` uncacheable for `how_long` (when not zero) without a fetch of it finishing: a sliced
    /// object that nothing could prove one version across its slices.
    pub fn mark_hit_for_miss(&self, key: &str, how_long: Duration, why: NotStored) {
        if !how_long.is_zero() {
            self.hit_for_miss
                .insert(key.to_owned(), Uncacheable::new(how_long, why));
        }
    }

    /// Whether `key` proved uncacheable recently.
    pub fn is_hit_for_miss(&self, key: &str) -> bool {
        self.uncacheable(key).is_some()
    }

    /// When and why `key` proved uncacheable, while requests for it still bypass coalescing.
    pub fn uncacheable(&self, key: &str) -> Option<Uncacheable> {
        self.hit_for_miss
            .get(key)
            .map(|entry| *entry.value())
            .filter(Uncacheable::in_force)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryStore;
    use http_body_util::BodyExt;

    const WINDOW: u64 = 64 * 1024;

    fn mark(epoch: u64) -> InvalidationMark {
        InvalidationMark { ban: 0, epoch }
    }

    /// Every invalidation covers the key: what is joinable then depends on the epoch alone.
    fn moved(epoch: u64) -> impl FnOnce(InvalidationMark) -> bool {
        move |since| since.epoch != epoch
    }

    fn head(shareable: bool) -> Arc<FetchedHead> {
        Arc::new(FetchedHead {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            shareable,
            not_stored: None,
            selection: vec![],
            initial_age: 0,
            received_at: lacquer_clock::monotonic(),
            ttl: Duration::ZERO,
            revalidated: false,
        })
    }

    fn coalescer() -> Coalescer {
        Coalescer::new(1024 * 1024)
    }

    /// Deterministic body bytes, so a reader's output proves where every byte came from.
    fn bytes(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    fn held<S: CacheStore>(fetch: &Fetch<S>) -> u64 {
        let s = fetch.lock();
        s.received - s.window_start
    }

    /// Whether `room()` would wait now.
    async fn full<S: CacheStore>(fetch: &Fetch<S>) -> bool {
        tokio::time::timeout(Duration::from_millis(20), fetch.room())
            .await
            .is_err()
    }

    #[tokio::test]
    async fn waiters_stream_bytes_as_they_arrive() {
        let c = coalescer();
        let Joined::Leader(fetch) = c.join("k", mark(0), WINDOW, None, moved(0)) else {
            panic!("first is leader")
        };
        let Joined::Waiter(same) = c.join("k", mark(0), WINDOW, None, moved(0)) else {
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
        assert!(matches!(
            c.join("k", mark(0), WINDOW, None, moved(0)),
            Joined::Leader(_)
        ));
    }

    #[tokio::test]
    async fn readers_wake_once_for_a_head_and_the_frames_in_hand_with_it() {
        let c = coalescer();
        let Joined::Leader(fetch) = c.join("k", mark(0), WINDOW, None, moved(0)) else {
            panic!("first is leader")
        };
        let mut reader = fetch.reader();
        let mut rx = reader.rx.clone();
        rx.borrow_and_update();
        fetch.set_head_quietly(head(true));
        fetch.push_quietly(Bytes::from_static(b"one "));
        fetch.push_quietly(Bytes::from_static(b"two"));
        assert!(!rx.has_changed().unwrap(), "woken before the fill waits");
        // What the fill waits for is not ready: the readers are woken first, once.
        let (tx, wait) = tokio::sync::oneshot::channel::<()>();
        let waiting = tokio::spawn({
            let fetch = fetch.clone();
            async move { fetch.announced_before_waiting(wait).await.is_ok() }
        });
        rx.changed().await.unwrap();
        assert_eq!(reader.head().await.unwrap().status, StatusCode::OK);
        fetch.announce();
        assert!(!rx.has_changed().unwrap(), "announced twice");
        // Work that does not wait announces nothing.
        fetch.push_quietly(Bytes::from_static(b" three"));
        assert_eq!(fetch.announced_before_waiting(async { 7 }).await, 7);
        assert!(!rx.has_changed().unwrap());
        tx.send(()).unwrap();
        assert!(waiting.await.unwrap());
        fetch.end(Ok(()));
        let body = reader.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "one two three");
    }

    #[tokio::test]
    async fn readers_of_held_bytes_take_turns_on_their_thread() {
        let c = coalescer();
        let Joined::Leader(fetch) = c.join("k", mark(0), 1 << 20, None, moved(0)) else {
            panic!("first is leader")
        };
        let readers: Vec<_> = (0..2).map(|_| fetch.reader()).collect();
        fetch.set_head(Ok(head(true)));
        for _ in 0..16 {
            fetch.push(Bytes::from(bytes(16 * 1024)));
        }
        fetch.end(Ok(()));
        // Every piece each reader takes, in the order they were taken, on one thread.
        let taken = Arc::new(Mutex::new(Vec::new()));
        let tasks: Vec<_> = readers
            .into_iter()
            .enumerate()
            .map(|(n, reader)| {
                let taken = taken.clone();
                tokio::spawn(async move {
                    let mut body = reader.into_body();
                    while let Some(frame) = body.frame().await {
                        frame.unwrap();
                        taken.lock().unwrap().push(n);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let taken = taken.lock().unwrap();
        // The first turn is 32 KiB: two pieces of 16 KiB.
        let first_of_second = taken.iter().position(|&n| n == 1).unwrap();
        assert!(
            first_of_second <= 2,
            "the second reader's first piece waited for {first_of_second} pieces of the first: {taken:?}"
        );
        assert_eq!(taken.len(), 32);
    }

    #[tokio::test]
    async fn a_failed_fetch_reaches_readers_as_an_error() {
        let fetch = Fetch::<Store>::new(mark(0), WINDOW);
        let reader = fetch.reader();
        fetch.set_head(Ok(head(true)));
        fetch.push(Bytes::from_static(b"part"));
        fetch.end(Err(FetchError::new("reset")));
        assert!(reader.into_body().collect().await.is_err());
    }

    #[tokio::test]
    async fn an_abandoned_fetch_ends_every_reader() {
        let before_head = Fetch::<Store>::new(mark(0), WINDOW);
        let mut waiting = before_head.reader();
        before_head.abandon(HeadError {
            status: StatusCode::BAD_GATEWAY,
            error: FetchError::new("panicked"),
        });
        assert_eq!(
            waiting.head().await.unwrap_err().status,
            StatusCode::BAD_GATEWAY
        );

        let mid_body = Fetch::<Store>::new(mark(0), WINDOW);
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

    #[tokio::test]
    async fn an_unstored_body_is_read_from_the_origin_no_faster_than_its_slowest_reader() {
        let fetch = Fetch::<Store>::new(mark(0), WINDOW);
        let slow = fetch.reader();
        let mut fast = fetch.reader().into_body();
        fetch.set_head(Ok(head(false)));
        let frame = Bytes::from(vec![7u8; 16 * 1024]);
        for _ in 0..4 {
            fetch.room().await;
            fetch.push(frame.clone());
        }
        assert!(full(&fetch).await, "the window is full");
        for _ in 0..4 {
            fast.frame().await.unwrap().unwrap();
        }
        assert!(full(&fetch).await, "the slow reader still holds the window");
        assert_eq!(held(&fetch), 4 * 16 * 1024);

        let mut slow = slow.into_body();
        slow.frame().await.unwrap().unwrap();
        fetch.room().await;
        assert_eq!(
            held(&fetch),
            3 * 16 * 1024,
            "what both have read is dropped"
        );
        drop(slow);
        fetch.room().await;
        assert_eq!(held(&fetch), 0, "a reader that leaves holds nothing");
    }

    #[tokio::test]
    async fn a_fetch_whose_readers_all_left_is_cancelled_and_not_joined() {
        let c = coalescer();
        let Joined::Leader(fetch) = c.join("k", mark(0), WINDOW, None, moved(0)) else {
            panic!()
        };
        let reader = fetch.reader();
        let deserted = tokio::time::timeout(Duration::from_millis(20), fetch.deserted());
        assert!(deserted.await.is_err(), "a reader is still there");
        drop(reader);
        fetch.deserted().await;
        let late = fetch.reader();
        assert!(late.cancelled(), "a reader arriving now must fetch alone");
        assert!(
            matches!(c.join("k", mark(0), WINDOW, None, moved(0)), Joined::Leader(f) if !Arc::ptr_eq(&f, &fetch)),
            "a cancelled fetch is replaced"
        );
    }

    /// A reader that falls behind a stored body reads the chunks the store holds, then the window, and gets
    /// every byte in order; the window stays bounded whatever that reader does.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reader_behind_a_stored_body_reads_it_back_from_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = lacquer_storage::StoreBuilder::new(dir.path())
            .with_memory_bytes(8 << 20)
            .with_disk_bytes(64 << 20)
            .with_chunk_size(16 * 1024)
            .open(tokio::runtime::Handle::current())
            .await
            .unwrap();
        let c = coalescer();
        let Joined::Leader(fetch) = c.join("k", store.mark(), WINDOW, None, |since| {
            store.invalidated_after(since, "k")
        }) else {
            panic!()
        };
        let slow = fetch.reader();
        let mut writer = store.writer("k", &[], fetch.since()).unwrap();
        fetch.store_into(&writer);
        fetch.set_head(Ok(head(true)));
        let body = bytes(1024 * 1024 + 123);
        let mut max_held = 0;
        for piece in body.chunks(10_000) {
            fetch.room().await;
            fetch.push(Bytes::copy_from_slice(piece));
            writer.push(piece).await.unwrap();
            max_held = max_held.max(held(&fetch));
        }
        assert!(
            max_held <= WINDOW + 10_000,
            "the window grew to {max_held} bytes"
        );
        writer
            .finish(
                "k".into(),
                lacquer_storage::ObjectMeta {
                    status: 200,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        fetch.end(Ok(()));

        let Joined::Waiter(joined) = c.join("k", store.mark(), WINDOW, None, |since| {
            store.invalidated_after(since, "k")
        }) else {
            panic!("a storing fetch can be joined late")
        };
        let late = joined.reader();
        for reader in [slow, late] {
            let got = reader.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(got.len(), body.len());
            assert!(got == body, "bytes differ");
        }
    }

    /// The store refuses the last chunk of a body (its disk filled) after the first reader has read it all:
    /// a reader joining before the fill learns of it still gets every byte, the chunks before from the store
    /// and the refused one from the window, since the window drops only what the store holds, not what it
    /// was handed.
    #[tokio::test]
    async fn a_late_reader_gets_every_byte_of_a_body_whose_last_chunk_the_store_refused() {
        const CHUNK: u64 = 16 * 1024;
        let store = MemoryStore::new(CHUNK);
        let c = Coalescer::<MemoryStore>::new(1024 * 1024);
        let Joined::Leader(fetch) = c.join("k", mark(0), WINDOW, None, moved(0)) else {
            panic!()
        };
        let mut first = fetch.reader().into_body();
        let mut writer = store.writer("k", &[], fetch.since()).unwrap();
        fetch.store_into(&writer);
        fetch.set_head(Ok(head(true)));
        let body = bytes(4 * CHUNK as usize);
        let mut got = Vec::new();
        for (n, piece) in body.chunks(CHUNK as usize / 2).enumerate() {
            if n == 7 {
                store.set_disk_full(true);
            }
            fetch.room().await;
            fetch.push(Bytes::copy_from_slice(piece));
            writer.push(piece).await.expect("refused at the next push");
            let frame = first.frame().await.unwrap().unwrap();
            got.extend_from_slice(&frame.into_data().unwrap());
        }
        assert!(got == body, "the first reader kept up");

        let Joined::Waiter(joined) = c.join("k", mark(0), WINDOW, None, moved(0)) else {
            panic!("the fetch is still in flight")
        };
        let late = joined.reader().into_body();
        fetch.end(Ok(()));
        let got = late.collect().await.expect("a whole body").to_bytes();
        assert!(got == body, "bytes differ");
        assert!(
            writer
                .finish("k".into(), ObjectMeta::default())
                .await
                .is_err(),
            "the body is not published"
        );
    }

    /// A fill storing a body for a reader that reads nothing: the window drops what the store holds and
    /// the fill never waits for a store that already holds every whole chunk it was given, whether the
    /// frames fill the window to exactly its limit or are larger than it (each hung: a stored body's
    /// fill stalled for good once its only client stopped reading).
    #[tokio::test]
    async fn a_stored_fill_goes_on_while_its_reader_reads_nothing() {
        const CHUNK: u64 = 16 * 1024;
        for (window, piece) in [(4 * CHUNK, CHUNK), (2 * CHUNK, 2 * CHUNK + CHUNK / 2)] {
            let store = MemoryStore::new(CHUNK);
            let c = Coalescer::<MemoryStore>::new(1024 * 1024);
            let Joined::Leader(fetch) = c.join("k", mark(0), window, None, moved(0)) else {
                panic!()
            };
            let _stalled = fetch.reader();
            let mut writer = store.writer("k", &[], fetch.since()).unwrap();
            fetch.store_into(&writer);
            fetch.set_head(Ok(head(true)));
            let body = bytes(40 * CHUNK as usize);
            for (n, part) in body.chunks(piece as usize).enumerate() {
                assert!(
                    !full(&fetch).await,
                    "window {window}, pieces of {piece}: waited before piece {n}, {} bytes held",
                    held(&fetch)
                );
                fetch.push(Bytes::copy_from_slice(part));
                writer.push(part).await.unwrap();
                assert!(
                    held(&fetch) < window + CHUNK + piece,
                    "window {window}, pieces of {piece}: {} bytes held",
                    held(&fetch)
                );
            }
        }
    }

    /// A request whose lookup missed an object a fetch published just after, and which then finds that fetch
    /// gone from the table, must not fetch the object again (each of two requests in a row fetched it under
    /// load: a self-routed cluster's origin saw one object twice).
    #[test]
    fn a_miss_after_a_fetch_finished_since_its_lookup_looks_again() {
        let c = coalescer();
        let looked_up_at = c.finished();
        let Joined::Leader(fetch) = c.join("k", mark(0), WINDOW, None, moved(0)) else {
            panic!()
        };
        c.finish("k", &fetch, None);
        assert!(matches!(
            c.join("k", mark(0), WINDOW, Some(looked_up_at), moved(0)),
            Joined::LookAgain
        ));
        assert!(matches!(
            c.join("k", mark(0), WINDOW, Some(c.finished()), moved(0)),
            Joined::Leader(_)
        ));
    }

    #[test]
    fn hit_for_miss_bypasses_and_expires() {
        let c = coalescer();
        let Joined::Leader(fetch) = c.join("k", mark(0), WINDOW, None, moved(0)) else {
            panic!()
        };
        c.finish(
            "k",
            &fetch,
            Some((Duration::from_secs(60), NotStored::Private)),
        );
        assert!(matches!(
            c.join("k", mark(0), WINDOW, None, moved(0)),
            Joined::HitForMiss
        ));
        assert_eq!(c.uncacheable("k").unwrap().why, NotStored::Private);
        c.clear_hit_for_miss("k");
        let Joined::Leader(fetch) = c.join("k", mark(0), WINDOW, None, moved(0)) else {
            panic!()
        };
        c.finish(
            "k",
            &fetch,
            Some((Duration::from_nanos(1), NotStored::NoStore)),
        );
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(c.uncacheable("k"), None, "told only while in force");
        assert!(matches!(
            c.join("k", mark(0), WINDOW, None, moved(0)),
            Joined::Leader(_)
        ));
    }

    #[test]
    fn unique_uncacheable_keys_cannot_grow_the_hit_for_miss_table() {
        let c: Coalescer = Coalescer::new(64 * 1024);
        for i in 0..20_000 {
            let key = format!("example.test/unique/{i}");
            let Joined::Leader(fetch) = c.join(&key, mark(0), WINDOW, None, moved(0)) else {
                panic!()
            };
            c.finish(
                &key,
                &fetch,
                Some((Duration::from_secs(60), NotStored::NoStore)),
            );
        }
        assert!(c.hit_for_miss.usage() <= 64 * 1024);
        assert!(
            matches!(
                c.join("example.test/unique/19999", mark(0), WINDOW, None, moved(0)),
                Joined::HitForMiss
            ),
            "the newest are kept"
        );
        assert!(
            matches!(
                c.join("example.test/unique/0", mark(0), WINDOW, None, moved(0)),
                Joined::Leader(_)
            ),
            "the oldest left first"
        );
        assert!(c.fetching.lock().unwrap().len() <= 1);
    }

    #[test]
    fn an_invalidation_replaces_the_fetch_in_flight_for_newcomers() {
        let c = coalescer();
        let Joined::Leader(old) = c.join("k", mark(0), WINDOW, None, moved(0)) else {
            panic!()
        };
        let Joined::Leader(new) = c.join("k", mark(1), WINDOW, None, moved(1)) else {
            panic!("a fetch from before the invalidation is not joined")
        };
        assert!(
            matches!(c.join("k", mark(1), WINDOW, None, moved(1)), Joined::Waiter(f) if Arc::ptr_eq(&f, &new))
        );
        c.finish("k", &old, None);
        assert!(
            matches!(c.join("k", mark(1), WINDOW, None, moved(1)), Joined::Waiter(f) if Arc::ptr_eq(&f, &new))
        );
    }

    #[test]
    fn finishing_someone_elses_fetch_changes_nothing() {
        let c = coalescer();
        let Joined::Leader(fetch) = c.join("k", mark(0), WINDOW, None, moved(0)) else {
            panic!()
        };
        c.finish("k", &Fetch::<Store>::new(mark(0), WINDOW), None);
        assert!(
            matches!(c.join("k", mark(0), WINDOW, None, moved(0)), Joined::Waiter(f) if Arc::ptr_eq(&f, &fetch))
        );
    }
}
