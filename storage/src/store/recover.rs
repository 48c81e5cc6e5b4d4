//! The start-up replay: the invalidation journal is replayed over every metadata record, so that no body an
//! acknowledged purge or ban removed is served again, whatever sled's files went through (a crash that
//! rolled them back, damage). When the journal cannot vouch for the records (damaged, missing, or shorter
//! than the metadata saw it), every stored object is dropped instead.
//!
//! The replay does not hold up the start. Until its walk over every record has passed a record, that
//! record is checked against the journal whenever it is read from sled ([`Store::replayed`], called by
//! every locked read), so what a lookup sees is exactly what it would see after the walk: the walk
//! only removes what no lookup has met yet, counts what is left and completes the index of stored keys.
//! New ids can be handed out at once because none was ever handed out above the persisted id ceiling
//! ([`Store::next_id`]); a store from before the ceiling is walked before the start, as it always was.

use std::{
    collections::{HashMap, HashSet},
    ops::Bound,
    sync::{
        atomic::{AtomicU64, Ordering::SeqCst},
        Arc, Mutex,
    },
};

use crate::{
    background::Priority,
    ban::{BanExpr, Subject},
    error::StoreError,
    journal::{Entry, Journal, Readback, State, Target},
    meta::ObjectMeta,
};

use super::{Store, JOURNAL_LAST};

/// What a clean close leaves in sled's `state` tree (see [`CleanClose`]).
pub(super) const CLEAN_CLOSE: &[u8] = b"clean-close";

/// Where the id ceiling is kept in sled's `state` tree: no id at or above it has been handed out.
pub(super) const ID_CEILING: &[u8] = b"id-ceiling";

/// Ids handed out per millisecond of wall clock before the sequence runs ahead of it: ids start above
/// `now × this` after a restart, so they never go back even if sled and the journal both lost their tail.
const IDS_PER_MS: u64 = 4096;

/// Records the replay's walk settles per batch: between batches it lets go of the store, so a store
/// closing meanwhile is not kept open.
const REPLAY_BATCH: usize = 4096;

/// The replay while its walk runs: what it checks each record against, and what it has found so far.
pub(super) struct Pending {
    replay: Replay,
    /// Why the journal cannot vouch for the records, when it cannot: then every record is dropped.
    doubt: Option<String>,
    /// Bodies with ids from this one on were stored after the start, so no journal entry covers them
    /// (`u64::MAX` until ids are handed out again).
    new_from: AtomicU64,
    /// The newest id any record checked so far carries, dropped records included.
    newest: AtomicU64,
    dropped: AtomicU64,
    softened: AtomicU64,
    unreadable: AtomicU64,
    /// The last key the walk has settled (keys are walked in order): a record at or before it has been
    /// counted, one after it not yet.
    passed: Mutex<Option<sled::IVec>>,
}

impl Pending {
    /// Whether the journal removes (`Some(false)`) or makes stale (`Some(true)`) the body `meta` describes,
    /// stored under `primary` (`None`: nothing covers it). Notes its id for the walk before the start.
    pub(super) fn verdict(&self, primary: &str, meta: &ObjectMeta) -> Option<bool> {
        self.newest
            .fetch_max(meta.generation.max(meta.ban_checked), SeqCst);
        if meta.generation >= self.new_from.load(SeqCst) {
            None
        } else if self.doubt.is_some() {
            Some(false)
        } else {
            self.replay.verdict(primary, meta)
        }
    }

    /// Counts what a check of one record did; the counters say whether the journal covered it or could not
    /// vouch for it.
    pub(super) fn tally(&self, store: &Store, dropped: usize, softened: usize) {
        self.dropped.fetch_add(dropped as u64, SeqCst);
        self.softened.fetch_add(softened as u64, SeqCst);
        let counters = store.counters();
        match self.doubt {
            Some(_) => counters.objects_unverified.add(dropped as u64),
            None => counters
                .objects_invalidated_at_start
                .add((dropped + softened) as u64),
        }
    }

    /// Counts one record the walk could not decode, and removed.
    pub(super) fn unreadable(&self) {
        self.unreadable.fetch_add(1, SeqCst);
    }

    /// Whether `generation` was stored before the start (the walk counts those; fills since count themselves).
    pub(super) fn before_start(&self, generation: u64) -> bool {
        generation < self.new_from.load(SeqCst)
    }

    /// Whether the walk has settled (and counted) the record at `key`. Asked under its record lock.
    pub(super) fn passed(&self, key: &[u8]) -> bool {
        self.passed
            .lock()
            .expect("replay cursor")
            .as_ref()
            .is_some_and(|last| key <= last.as_ref())
    }

    /// The walk has settled the record at `key`; called under its record lock.
    pub(super) fn pass(&self, key: sled::IVec) {
        *self.passed.lock().expect("replay cursor") = Some(key);
    }
}

impl Store {
    /// Replays the invalidation journal over the metadata records and starts the journal. Returns the
    /// replay left to walk, if any: until it is done every record is checked when read. A store closed
    /// cleanly since the journal last moved needs no walk; one from before the id ceiling is walked here,
    /// before anything can read.
    pub(super) fn recover(&self, readback: Readback) -> Result<Option<Arc<Pending>>, StoreError> {
        let inner = &self.inner;
        let journal_last = inner.journal.last();
        // Every start with a journal notes it in sled: a store without that note comes from a version
        // before the journal, whose purges and bans were in sled before they were acknowledged; it is
        // kept, and the journal starts now.
        let marker = inner.state.get(JOURNAL_LAST)?;
        let seen_last = marker
            .as_ref()
            .and_then(|v| v.as_ref().try_into().ok().map(u64::from_be_bytes))
            .unwrap_or(0);
        let doubt = match &readback {
            Readback::Damaged(reason) => Some(format!("the invalidation journal is damaged ({reason})")),
            Readback::Missing if marker.is_some() && !inner.objects.is_empty() => {
                Some("the invalidation journal is missing".to_owned())
            }
            _ if seen_last > journal_last => Some(format!(
                "the invalidation journal ends at entry {journal_last} but the metadata saw entry {seen_last}"
            )),
            _ => None,
        };
        // Taken at once: from here on a crash must not find it.
        let clean = inner
            .state
            .remove(CLEAN_CLOSE)?
            .and_then(|v| CleanClose::decode(&v));
        let ceiling = inner
            .state
            .get(ID_CEILING)?
            .and_then(|v| v.as_ref().try_into().ok().map(u64::from_be_bytes));
        let vouched = clean.filter(|clean| {
            doubt.is_none()
                && matches!(readback, Readback::Intact)
                && clean.journal_last == journal_last
        });
        let fresh = doubt.is_some();
        let pending = match vouched {
            Some(clean) => {
                // The last run closed the store after every invalidation it acknowledged had reached sled,
                // and the journal has not moved since: the replay would find nothing, so there is no walk.
                self.recount(clean.objects, clean.bytes);
                tracing::debug!(
                    objects = clean.objects,
                    "store closed cleanly: no replay needed"
                );
                None
            }
            None => {
                let pending = Arc::new(Pending {
                    replay: Replay::new(&inner.journal),
                    doubt,
                    new_from: AtomicU64::new(u64::MAX),
                    newest: AtomicU64::new(0),
                    dropped: AtomicU64::new(0),
                    softened: AtomicU64::new(0),
                    unreadable: AtomicU64::new(0),
                    passed: Mutex::new(None),
                });
                inner.replay.store(Some(pending.clone()));
                if ceiling.is_none() {
                    // No ceiling vouches for the ids handed out before: only the records say which was
                    // the newest.
                    self.walk_replay(&pending)?;
                }
                Some(pending)
            }
        };
        let newest = [
            vouched.map_or(0, |clean| clean.next_id),
            ceiling.unwrap_or(0),
            pending.as_ref().map_or(0, |p| p.newest.load(SeqCst)),
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        let next = (lacquer_clock::now_ms() * IDS_PER_MS)
            .max(newest + 1)
            .max(journal_last + 1)
            .max(inner.db.generate_id()? + 1);
        let fresh = match (fresh, &readback) {
            (true, _) => Some(next),
            (false, Readback::Missing) => Some(0),
            _ => None,
        };
        inner.journal.start(next, fresh)?;
        if let Some(pending) = &pending {
            pending.new_from.store(next, SeqCst);
        }
        self.set_id_ceiling(next)?;
        inner
            .state
            .insert(JOURNAL_LAST, &inner.journal.last().to_be_bytes())?;
        inner.db.flush()?;
        let walking = pending.filter(|_| self.replay_pending());
        if walking.is_some() {
            tracing::info!(
                journal_entries = inner.journal.len(),
                "store opened; its objects are checked against the invalidation journal as they are read, and by a walk in the background"
            );
        } else {
            tracing::info!(
                objects = self.counted().0,
                journal_entries = inner.journal.len(),
                "store opened"
            );
        }
        Ok(walking)
    }

    /// Whether the replay's walk has not finished: every record read from sled is checked against the
    /// journal, and the journal must not be compacted (its checkpoint would list unchecked bodies as kept).
    pub(crate) fn replay_pending(&self) -> bool {
        self.inner.replay.load().is_some()
    }

    /// Walks the replay to its end on a background thread (see the module's documentation).
    pub(super) fn replay_in_background(&self, pending: Arc<Pending>) -> Result<(), StoreError> {
        crate::background::spawn("replay", Priority::Normal, self.downgrade(), move |weak| {
            let started = std::time::Instant::now();
            let mut after = None;
            loop {
                let Some(store) = weak.open() else { return };
                match store.replay_batch(&pending, &mut after) {
                    Ok(true) => {}
                    Ok(false) => {
                        store.finish_replay(&pending);
                        tracing::debug!(elapsed = ?started.elapsed(), "start-up replay walked");
                        return;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "walking the stored objects against the invalidation journal failed: each is still checked when read");
                        return;
                    }
                }
            }
        })
    }

    /// Walks the replay to its end on the calling thread.
    fn walk_replay(&self, pending: &Pending) -> Result<(), StoreError> {
        let mut after = None;
        while self.replay_batch(pending, &mut after)? {}
        self.finish_replay(pending);
        Ok(())
    }

    /// Settles the next records of the walk after `after` (moved on to the last one settled); `false`
    /// once none is left.
    fn replay_batch(
        &self,
        pending: &Pending,
        after: &mut Option<sled::IVec>,
    ) -> Result<bool, StoreError> {
        let walk = match after.take() {
            Some(key) => self
                .inner
                .objects
                .range((Bound::Excluded(key), Bound::Unbounded)),
            None => self.inner.objects.iter(),
        };
        let mut settled = 0;
        for key in walk.keys().take(REPLAY_BATCH) {
            let key = key?;
            self.settle_record(pending, &key)?;
            *after = Some(key);
            settled += 1;
        }
        Ok(settled == REPLAY_BATCH)
    }

    /// The walk is over: every record has been checked, counted, and its key indexed.
    fn finish_replay(&self, pending: &Pending) {
        self.inner.replay.store(None);
        self.inner.keys.completed();
        let (dropped, softened, unreadable) = (
            pending.dropped.load(SeqCst),
            pending.softened.load(SeqCst),
            pending.unreadable.load(SeqCst),
        );
        if unreadable > 0 {
            tracing::error!(
                records = unreadable,
                "discarded unreadable metadata records at start; their objects will be fetched again"
            );
        }
        if let Some(doubt) = &pending.doubt {
            tracing::error!(
                objects = dropped,
                "{doubt}: dropped every object stored before the start, since none can be proven not purged or banned"
            );
        } else if dropped > 0 || softened > 0 {
            tracing::warn!(
                removed = dropped,
                made_stale = softened,
                "the metadata still held objects that acknowledged purges or bans cover (rolled back by a crash or damage): removed them again"
            );
        }
        tracing::info!(
            objects = self.counted().0,
            "stored objects checked against the invalidation journal"
        );
    }
}

/// Left by [`Store::close`] once everything it acknowledged is in sled, and taken at the next start: what
/// the start-up walk would otherwise count. Trusted only when the journal ends where it ended then (an
/// invalidation after it, or sled's files rolled back to an older close, shows as a journal that moved on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CleanClose {
    pub(super) journal_last: u64,
    /// Above every id handed out before the close (with room for the few a closing store may still take).
    pub(super) next_id: u64,
    pub(super) objects: u64,
    pub(super) bytes: u64,
}

impl CleanClose {
    pub(super) fn encode(&self) -> [u8; 32] {
        let mut out = [0; 32];
        for (slot, value) in
            out.chunks_mut(8)
                .zip([self.journal_last, self.next_id, self.objects, self.bytes])
        {
            slot.copy_from_slice(&value.to_be_bytes());
        }
        out
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let field = |i: usize| {
            Some(u64::from_be_bytes(
                bytes.get(i * 8..i * 8 + 8)?.try_into().ok()?,
            ))
        };
        (bytes.len() == 32).then_some(())?;
        Some(Self {
            journal_last: field(0)?,
            next_id: field(1)?,
            objects: field(2)?,
            bytes: field(3)?,
        })
    }
}

/// The journal indexed for the start-up replay: by cache key, by tag, and the bans.
struct Replay {
    floor: u64,
    kept: HashSet<u64>,
    keys: HashMap<String, Vec<(u64, bool)>>,
    tags: HashMap<String, Vec<(u64, bool)>>,
    /// A ban whose expression no longer parses covers everything older than it.
    bans: Vec<(u64, Option<BanExpr>)>,
}

impl Replay {
    fn new(journal: &Journal) -> Self {
        journal.view(Self::index)
    }

    fn index(state: &State) -> Self {
        let mut replay = Replay {
            floor: state.floor,
            kept: state.kept.clone(),
            keys: HashMap::new(),
            tags: HashMap::new(),
            bans: Vec::new(),
        };
        for entry in &state.entries {
            match entry {
                Entry::Purge {
                    id,
                    target: Target::Key(key),
                    soft,
                } => replay
                    .keys
                    .entry(key.clone())
                    .or_default()
                    .push((*id, *soft)),
                Entry::Purge {
                    id,
                    target: Target::Tags(tags),
                    soft,
                } => {
                    for tag in tags {
                        replay
                            .tags
                            .entry(tag.clone())
                            .or_default()
                            .push((*id, *soft));
                    }
                }
                Entry::Ban { id, expression } => {
                    replay.bans.push((*id, BanExpr::parse(expression).ok()))
                }
                Entry::Checkpoint { .. } => {}
            }
        }
        replay
    }

    /// `Some(false)`: an entry removes the body; `Some(true)`: a soft purge makes it stale; `None`: nothing
    /// covers it.
    fn verdict(&self, primary: &str, meta: &ObjectMeta) -> Option<bool> {
        let generation = meta.generation;
        if generation < self.floor && !self.kept.contains(&generation) {
            return Some(false);
        }
        let subject = Subject::new(primary, meta);
        let banned = self.bans.iter().any(|(id, expr)| {
            *id > generation && expr.as_ref().is_none_or(|e| e.matches(&subject))
        });
        if banned {
            return Some(false);
        }
        let purges = self
            .keys
            .get(primary)
            .into_iter()
            .chain(meta.tags.iter().filter_map(|t| self.tags.get(t)))
            .flatten()
            .filter(|(id, _)| *id > generation);
        let mut soft = None;
        for (_, is_soft) in purges {
            if !is_soft {
                return Some(false);
            }
            soft = Some(true);
        }
        soft
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{PurgeMode, StoreBuilder};

    async fn open(dir: &std::path::Path) -> Store {
        StoreBuilder::small(dir)
            .open(tokio::runtime::Handle::current())
            .await
            .unwrap()
    }

    fn body(store: &Store) -> ObjectMeta {
        ObjectMeta {
            generation: store.next_id(),
            status: 200,
            length: 10,
            chunk_size: 64 << 10,
            stored_at_ms: lacquer_clock::now_ms(),
            ttl_ms: 60_000,
            ban_checked: store.mark().ban,
            ..ObjectMeta::default()
        }
    }

    /// The store as a start after a crash finds it, its walk not begun: the replay is pending over the
    /// records in sled, and the gauges count nothing yet.
    fn crashed(store: &Store) -> Arc<Pending> {
        store.inner.hot.clear();
        store.recount(0, 0);
        let pending = Arc::new(Pending {
            replay: Replay::new(&store.inner.journal),
            doubt: None,
            new_from: AtomicU64::new(store.next_id()),
            newest: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            softened: AtomicU64::new(0),
            unreadable: AtomicU64::new(0),
            passed: Mutex::new(None),
        });
        store.inner.replay.store(Some(pending.clone()));
        pending
    }

    /// A record read before the walk reaches it is checked as the walk would check it; the walk then counts
    /// exactly what was stored before the start and is still there, whatever reads, removals and fills
    /// happened first; and until the walk is done the journal is not compacted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn records_read_before_the_walk_reaches_them_are_checked_and_counted_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path()).await;
        let keys = ["a.test/hard", "a.test/soft", "a.test/kept", "a.test/gone"];
        for key in keys {
            store
                .publish(key, body(&store), store.mark().epoch)
                .unwrap();
        }
        // What sled held before the purges, as a crash that rolled it back would leave it.
        let rolled_back: Vec<_> = keys
            .iter()
            .map(|k| store.inner.objects.get(k).unwrap().unwrap())
            .collect();
        assert_eq!(
            store.purge("a.test/hard", PurgeMode::Hard).await.unwrap(),
            1
        );
        assert_eq!(
            store.purge("a.test/soft", PurgeMode::Soft).await.unwrap(),
            1
        );
        for (key, bytes) in keys.iter().zip(&rolled_back) {
            store.inner.objects.insert(key, bytes.clone()).unwrap();
            store.inner.keys.add(key.as_bytes());
        }
        let pending = crashed(&store);
        // A fill since the start, counted first: a removal that took away what was never counted shows.
        store
            .publish("a.test/new", body(&store), store.mark().epoch)
            .unwrap();

        assert!(store.lookup("a.test/hard").unwrap().is_none(), "purged");
        assert!(store.inner.objects.get("a.test/hard").unwrap().is_none());
        let soft = store.lookup("a.test/soft").unwrap().expect("kept stale");
        assert!(soft.variants[0].remaining_ttl_ms(lacquer_clock::now_ms()) <= 0);
        assert!(store.lookup("a.test/kept").unwrap().is_some());
        assert_eq!(store.stats().objects_invalidated_at_start, 2);
        // Removed before the walk counted it: it must not skew the count.
        let gone = store.lookup("a.test/gone").unwrap().unwrap().variants[0].generation;
        store.remove_generation("a.test/gone", gone).unwrap();
        assert_eq!(store.stats().objects, 1, "the fill only");
        assert!(
            !crate::sweep::compact_journal(&store, 0).unwrap(),
            "a checkpoint now would list unchecked bodies as kept"
        );
        assert_eq!(store.stats().journal_replayed, 0);

        store.walk_replay(&pending).unwrap();
        let stats = store.stats();
        assert_eq!(stats.journal_replayed, 1);
        assert_eq!(stats.objects, 3, "soft, kept and new: {stats:?}");
        assert_eq!(stats.objects_invalidated_at_start, 2, "checked once");
        assert!(store.lookup("a.test/soft").unwrap().is_some());
        let compacting = store.clone();
        let compacted = tokio::task::spawn_blocking(move || {
            crate::sweep::compact_journal(&compacting, 0).unwrap()
        });
        assert!(compacted.await.unwrap(), "compacted once the walk is done");
        store.close(Duration::from_secs(10)).await.unwrap();
    }

    /// The walk removes what no read has met; a store closed before its walk is done leaves no clean-close
    /// note, so the next start checks again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_walk_removes_what_no_read_met_and_a_close_before_it_ends_is_not_clean() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path()).await;
        store
            .publish("a.test/hard", body(&store), store.mark().epoch)
            .unwrap();
        let rolled_back = store.inner.objects.get("a.test/hard").unwrap().unwrap();
        store.purge("a.test/hard", PurgeMode::Hard).await.unwrap();
        store
            .inner
            .objects
            .insert("a.test/hard", rolled_back)
            .unwrap();
        let pending = crashed(&store);
        store.close(Duration::from_secs(10)).await.unwrap();
        assert!(store.inner.state.get(CLEAN_CLOSE).unwrap().is_none());
        store.walk_replay(&pending).unwrap();
        assert!(store.inner.objects.get("a.test/hard").unwrap().is_none());
        assert_eq!(store.stats().objects, 0);
    }

    /// Ids after a crash start above every id handed out before it, with no walk to find the newest: the
    /// ceiling is in sled before any id reaches it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ids_after_a_crash_start_above_the_ceiling() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path()).await;
        // An id far ahead of the clock, as a sequence that ran ahead of it (or a clock set back) leaves.
        let ahead = lacquer_clock::now_ms() * IDS_PER_MS + (1 << 40);
        store.inner.journal.start(ahead, None).unwrap();
        let taken = store.next_id();
        assert!(taken >= ahead);
        store.close(Duration::from_secs(10)).await.unwrap();
        store.inner.state.remove(CLEAN_CLOSE).unwrap();
        store.inner.db.flush().unwrap();
        drop(store);

        let store = loop {
            match StoreBuilder::small(dir.path())
                .open(tokio::runtime::Handle::current())
                .await
            {
                Ok(store) => break store,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        assert!(store.next_id() > taken);
        let ceiling = store.inner.state.get(ID_CEILING).unwrap().unwrap();
        assert!(u64::from_be_bytes(ceiling.as_ref().try_into().unwrap()) > store.next_id());
        store.close(Duration::from_secs(10)).await.unwrap();
    }
}
