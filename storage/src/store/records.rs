//! Every change to a metadata record happens here, under its key's lock (one of [`Records`]' stripes): the
//! record in sled, its copy in the hot-metadata cache and its tag-index entries change together, so a
//! lookup served from memory and one served from sled never disagree. Bans are applied to a record when a
//! lookup (or the lurker) meets it; a body fetched meanwhile is tested before it is published.
//!
//! Every operation here reads and writes one key's record and that key's tag entries, so records of
//! different keys never wait for each other: the lock is striped by key. A stripe is a plain mutex, held
//! for a few sled operations and never across an `await`. The functions that need it held take the guard
//! ([`Locked`]) as an argument, so calling one without the lock does not compile.

use std::{
    borrow::Cow,
    sync::{Arc, Mutex, MutexGuard},
};

use crate::{
    ban::Verdict,
    error::StoreError,
    meta::{ObjectMeta, ObjectSet, Part, PartFate, Partial, Sibling},
};

use super::{recover::Pending, ChunkTiers, Store};

/// What became of a part given to the store ([`Store::add_part`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartKept {
    /// Added to the stored parts of the same representation.
    Added,
    /// The first part of a new variant body: what was stored under its selection before is gone.
    Started,
    /// An invalidation since its fetch began covers it: not stored.
    Discarded,
}

/// A stored variant as [`Store::inspect`] finds it.
#[derive(Debug, Clone)]
pub struct Inspected {
    /// Its metadata.
    pub meta: ObjectMeta,
    /// Where its body's chunks are.
    pub tiers: ChunkTiers,
    /// The representations made of its body (see [`Sibling`]), and where their chunks are.
    pub representations: Vec<(Sibling, ChunkTiers)>,
    /// When its body is stored in parts ([`Partial`]): the representation's whole length, and each part
    /// with where its chunks are.
    pub parts: Option<(u64, Vec<(Part, ChunkTiers)>)>,
}

/// Whether reading or writing a set puts it in the hot copy (`Fill`), or only refreshes a copy already there
/// (`IfPresent`, for the lurker's walk over every record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HotCopy {
    Fill,
    IfPresent,
}

/// One metadata record as a walk over sled found it, without the lock: by the time it is acted on it may
/// have changed, so walkers change it only through the locked operations below, by generation.
pub(crate) struct Record {
    /// The record's key as stored.
    pub(crate) key: sled::IVec,
    /// The variants; `None` when the record cannot be decoded.
    pub(crate) set: Option<ObjectSet>,
}

impl Record {
    /// The cache key: the stored key read as UTF-8 (lossily; borrowed, so a walk allocates nothing for it).
    pub(crate) fn primary(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.key)
    }
}

/// Proof that a key's record lock is held, for as long as this lives.
struct Locked<'a> {
    _guard: MutexGuard<'a, ()>,
}

/// Stripes of the record lock: enough that two client threads and the background walks rarely meet on
/// one, few enough to cost nothing (a mutex is four bytes). A power of two: the key index's shards are
/// the same stripes.
pub(super) const STRIPES: usize = 1024;

/// The record locks, one per stripe of keys.
pub(super) struct Records {
    stripes: Box<[Mutex<()>]>,
}

impl Default for Records {
    fn default() -> Self {
        Self {
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }
}

impl Records {
    /// The lock of the record stored under `key` (the cache key's bytes).
    fn lock(&self, key: &[u8]) -> Locked<'_> {
        Locked {
            _guard: self.stripes[Self::stripe(key)].lock().expect("record lock"),
        }
    }

    fn stripe(key: &[u8]) -> usize {
        super::index::key_hash(key) as usize % STRIPES
    }
}

impl Store {
    /// What the data path calls on a client thread: [`Store::lookup`], answered from the hot copy when it
    /// can be without the lock, and at once for a key the index of stored keys does not hold; anything else
    /// (reading sled, testing a new ban, removing what it covers) runs on the store runtime's blocking
    /// threads, so that a metadata read that goes to the disk never stalls the other connections of a
    /// client thread's runtime.
    pub async fn lookup_off_thread(
        &self,
        primary: &str,
    ) -> Result<Option<Arc<ObjectSet>>, StoreError> {
        let newest = self.inner.bans.newest();
        if let Some(set) = self.lookup_hot(primary, newest) {
            return Ok(Some(set));
        }
        // A hot key after a new ban: every hot request meets this once per ban, so it stays here.
        if self.inner.hot.contains(primary) {
            if let Some(found) = self.retest_hot(primary, newest)? {
                return Ok(found);
            }
        }
        if !self.inner.keys.may_hold(primary.as_bytes()) {
            return Ok(None);
        }
        let (store, primary) = (self.clone(), primary.to_owned());
        self.inner
            .runtime
            .spawn_blocking(move || store.lookup(&primary))
            .await
            .map_err(|e| {
                if e.is_panic() {
                    tracing::error!(error = %e, "a metadata lookup panicked");
                    StoreError::Unavailable
                } else {
                    StoreError::Closed
                }
            })?
    }

    /// The hot copy of `primary`'s set, if it needs no test against bans up to `newest`.
    fn lookup_hot(&self, primary: &str, newest: u64) -> Option<Arc<ObjectSet>> {
        let set = self.inner.hot.get(primary)?.value().clone();
        (!set
            .variants
            .iter()
            .any(|m| self.inner.bans.needs_test(m, newest)))
        .then_some(set)
    }

    /// Every stored variant of `primary` that no ban covers. Served from memory when hot; reads sled
    /// otherwise (blocking: see [`Store::lookup_off_thread`]). Variants not yet tested against the newest
    /// bans are tested now, and removed if banned.
    pub fn lookup(&self, primary: &str) -> Result<Option<Arc<ObjectSet>>, StoreError> {
        let newest = self.inner.bans.newest();
        if let Some(set) = self.lookup_hot(primary, newest) {
            return Ok(Some(set));
        }
        if !self.inner.keys.may_hold(primary.as_bytes()) {
            return Ok(None);
        }
        let locked = self.lock_record(primary);
        let Some(set) = self.load_set(&locked, primary, HotCopy::Fill)? else {
            return Ok(None);
        };
        let (set, removed) =
            self.apply_bans_locked(&locked, primary, set, newest, HotCopy::Fill)?;
        self.counters().objects_banned.add(removed as u64);
        Ok(set)
    }

    /// Tests the variants of `primary` against bans up to `upto`, removing the banned ones; returns what is
    /// left and how many were removed. The caller holds the mutation lock.
    ///
    /// Removals reach sled at once. That the others passed is recorded in the hot copy only, keeping sled
    /// writes off the hit path and out of the lurker's walk: losing it in a restart only means testing again
    /// against bans still pending, and once the lurker completes a ban no object needs testing against it.
    fn apply_bans_locked(
        &self,
        locked: &Locked<'_>,
        primary: &str,
        set: Arc<ObjectSet>,
        upto: u64,
        hot: HotCopy,
    ) -> Result<(Option<Arc<ObjectSet>>, usize), StoreError> {
        if !set
            .variants
            .iter()
            .any(|m| self.inner.bans.needs_test(m, upto))
        {
            return Ok((Some(set), 0));
        }
        let bans = self.inner.bans.snapshot();
        let (mut kept, mut dropped) = (Vec::new(), Vec::new());
        for meta in &set.variants {
            if !self.inner.bans.needs_test(meta, upto) {
                kept.push(meta.clone());
                continue;
            }
            match self.inner.bans.test(&bans, upto, primary, meta) {
                Verdict::Banned => dropped.push(meta.clone()),
                Verdict::Clear(checked) => kept.push(ObjectMeta {
                    ban_checked: checked,
                    ..meta.clone()
                }),
            }
        }
        let removed = dropped.len();
        let kept = ObjectSet {
            variants: kept,
            siblings: set.siblings.clone(),
            partials: set.partials.clone(),
        };
        if removed == 0 {
            let set = Arc::new(kept);
            if hot == HotCopy::Fill || self.inner.hot.contains(primary) {
                self.inner.hot.insert(primary.to_owned(), set.clone());
            }
            return Ok((Some(set), 0));
        }
        let set = self.save_set(locked, primary, kept, &dropped, hot)?;
        Ok((set, removed))
    }

    /// The hot copy of `primary` tested against bans up to `newest` on the calling thread (testing reads
    /// nothing from disk; removing a covered variant writes sled, once per banned hot key). `None` when it
    /// is not hot (any more).
    fn retest_hot(
        &self,
        primary: &str,
        newest: u64,
    ) -> Result<Option<Option<Arc<ObjectSet>>>, StoreError> {
        let locked = self.lock_record(primary);
        let Some(set) = self.inner.hot.get(primary).map(|e| e.value().clone()) else {
            return Ok(None);
        };
        let (set, removed) =
            self.apply_bans_locked(&locked, primary, set, newest, HotCopy::Fill)?;
        self.counters().objects_banned.add(removed as u64);
        Ok(Some(set))
    }

    /// Whether the body `generation` of `primary` is still stored (bans are not applied).
    /// Leaves the hot copy alone: the sweeper and tag purges ask this for every tag entry.
    pub(super) fn stored_generation(
        &self,
        primary: &str,
        generation: u64,
    ) -> Result<bool, StoreError> {
        let locked = self.lock_record(primary);
        Ok(self
            .load_set(&locked, primary, HotCopy::IfPresent)?
            .is_some_and(|set| set.variants.iter().any(|m| m.generation == generation)))
    }

    /// Tests the variants of `primary` against bans up to `upto` under the lock, as a lookup would but
    /// without filling the hot copy: what the lurker does with a record it could not read on its own.
    pub(crate) fn apply_bans(&self, primary: &str, upto: u64) -> Result<usize, StoreError> {
        let locked = self.lock_record(primary);
        let Some(set) = self.load_set(&locked, primary, HotCopy::IfPresent)? else {
            return Ok(0);
        };
        self.apply_bans_locked(&locked, primary, set, upto, HotCopy::IfPresent)
            .map(|(_, n)| n)
    }

    /// Reads the set from the hot copy or sled; the caller holds the mutation lock.
    fn load_set(
        &self,
        locked: &Locked<'_>,
        primary: &str,
        hot: HotCopy,
    ) -> Result<Option<Arc<ObjectSet>>, StoreError> {
        if let Some(entry) = self.inner.hot.get(primary) {
            return Ok(Some(entry.value().clone()));
        }
        let Some(bytes) = self.inner.objects.get(primary.as_bytes())? else {
            return Ok(None);
        };
        let pending = self.inner.replay.load_full();
        match ObjectSet::decode(primary, &bytes) {
            Ok(set) if pending.is_some() => self.replayed(
                locked,
                primary,
                set,
                pending.as_deref().expect("pending"),
                hot,
            ),
            Ok(set) => {
                let set = Arc::new(set);
                if hot == HotCopy::Fill {
                    self.inner.hot.insert(primary.to_owned(), set.clone());
                }
                Ok(Some(set))
            }
            Err(e) => {
                tracing::warn!(error = %e, "dropping unreadable metadata record");
                self.counters().corrupt_records.add(1);
                if let Some(pending) = pending {
                    pending.unreadable();
                }
                self.remove_record(locked, primary.as_bytes())?;
                Ok(None)
            }
        }
    }

    /// `set`, just read from sled while the start-up replay walks (see `recover`), checked against the
    /// journal before anything sees it: what an acknowledged purge or ban covers is removed, or made stale.
    /// A record checked once passes unchanged after: the journal's entries are older than it now is.
    fn replayed(
        &self,
        locked: &Locked<'_>,
        primary: &str,
        set: ObjectSet,
        pending: &Pending,
        hot: HotCopy,
    ) -> Result<Option<Arc<ObjectSet>>, StoreError> {
        let now = lacquer_clock::now_ms();
        let ObjectSet {
            variants,
            siblings,
            partials,
        } = set;
        let (mut kept, mut dropped, mut softened) = (Vec::new(), Vec::new(), 0);
        for mut meta in variants {
            match pending.verdict(primary, &meta) {
                Some(false) => dropped.push(meta),
                Some(true) => {
                    softened += usize::from(crate::purge::expire(&mut meta, now));
                    kept.push(meta);
                }
                None => kept.push(meta),
            }
        }
        let set = ObjectSet {
            variants: kept,
            siblings,
            partials,
        };
        if dropped.is_empty() && softened == 0 {
            let set = Arc::new(set);
            if hot == HotCopy::Fill {
                self.inner.hot.insert(primary.to_owned(), set.clone());
            }
            return Ok(Some(set));
        }
        pending.tally(self, dropped.len(), softened);
        self.save_set(locked, primary, set, &dropped, hot)
    }

    /// Settles the record at `key` for the start-up replay's walk: checks it as a read would (under its
    /// lock), then counts what was stored before the start (fills since counted themselves) and indexes
    /// its key. A key that is not UTF-8 was never written by a store: damage, removed.
    pub(super) fn settle_record(
        &self,
        pending: &Pending,
        key: &sled::IVec,
    ) -> Result<(), StoreError> {
        let locked = self.inner.records.lock(key);
        match std::str::from_utf8(key) {
            Ok(primary) => {
                if let Some(set) = self.load_set(&locked, primary, HotCopy::IfPresent)? {
                    let before = set
                        .variants
                        .iter()
                        .filter(|m| pending.before_start(m.generation));
                    let (objects, bytes) = before.fold((0, 0), |(n, b), m| (n + 1, b + m.length));
                    self.counters().objects.add(objects);
                    self.counters().stored_bytes.add(bytes);
                    self.inner.keys.add(key);
                }
            }
            Err(_) => {
                self.remove_record(&locked, key)?;
                self.counters().corrupt_records.add(1);
                pending.unreadable();
            }
        }
        pending.pass(key.clone());
        Ok(())
    }

    /// Replaces the set of `primary` (or removes it when empty) in sled and the hot copy, and returns it; the
    /// caller holds the mutation lock. Chunks and tag entries of `dropped` variants are removed, and so are
    /// the siblings of variant bodies no longer in the set (callers keep the siblings in `set`: whatever
    /// removed their variant, this drops them).
    fn save_set(
        &self,
        locked: &Locked<'_>,
        primary: &str,
        mut set: ObjectSet,
        dropped: &[ObjectMeta],
        hot: HotCopy,
    ) -> Result<Option<Arc<ObjectSet>>, StoreError> {
        let orphans = set.orphans();
        let orphan_parts = set.orphan_parts();
        let saved = if set.variants.is_empty() {
            self.remove_record(locked, primary.as_bytes())?;
            self.inner.hot.remove(primary);
            None
        } else {
            if self
                .inner
                .objects
                .insert(primary.as_bytes(), set.encode())?
                .is_none()
            {
                self.inner.keys.add(primary.as_bytes());
            }
            let set = Arc::new(set);
            if hot == HotCopy::Fill || self.inner.hot.contains(primary) {
                self.inner.hot.insert(primary.to_owned(), set.clone());
            }
            Some(set)
        };
        for meta in dropped {
            self.unindex_tags(primary, meta)?;
            self.forget_body_later(meta);
        }
        for sibling in &orphans {
            self.forget_body_later(&sibling.body);
        }
        for part in &orphan_parts {
            self.forget_body_later(&part.body);
        }
        // While the start-up replay walks, what was stored before the start is counted only once the walk
        // passes its record (parts only as they are added); the rest is counted already.
        let pending = self.inner.replay.load();
        let counted = |generation: u64, walked: bool| {
            pending
                .as_ref()
                .is_none_or(|p| walked || !p.before_start(generation))
        };
        let walked = pending
            .as_ref()
            .is_some_and(|p| p.passed(primary.as_bytes()));
        let dropped = dropped.iter().filter(|m| counted(m.generation, walked));
        let (objects, bytes) = dropped.fold((0, 0), |(n, b), m| (n + 1, b + m.length));
        self.counters().objects.sub(objects);
        self.counters().stored_bytes.sub(bytes);
        self.counters().stored_bytes.sub(
            orphan_parts
                .iter()
                .filter(|p| counted(p.body.generation, false))
                .map(|p| p.body.length)
                .sum(),
        );
        Ok(saved)
    }

    /// Keeps `sibling` with the variant body it represents, replacing one made before in the same coding;
    /// `false` (and its body forgotten) when that body is no longer stored: it was invalidated, or replaced,
    /// while the sibling was being made.
    pub(crate) fn add_sibling(&self, primary: &str, sibling: Sibling) -> Result<bool, StoreError> {
        let locked = self.lock_record(primary);
        let set = self.load_set(&locked, primary, HotCopy::IfPresent)?;
        let Some(mut set) = set
            .filter(|set| set.variants.iter().any(|v| v.generation == sibling.of))
            .map(|set| (*set).clone())
        else {
            self.forget_body(&sibling.body);
            return Ok(false);
        };
        if let Some(pos) = set
            .siblings
            .iter()
            .position(|s| s.of == sibling.of && s.coding == sibling.coding)
        {
            let old = set.siblings.remove(pos);
            self.forget_body_later(&old.body);
        }
        set.siblings.push(sibling);
        self.save_set(&locked, primary, set, &[], HotCopy::IfPresent)?;
        Ok(true)
    }

    /// Applies `change` to the set of `primary` and saves it; returns what `change` returned (0 when there
    /// is no set).
    pub(crate) fn modify(
        &self,
        primary: &str,
        change: impl FnOnce(&mut ObjectSet) -> usize,
    ) -> Result<usize, StoreError> {
        let locked = self.lock_record(primary);
        let Some(set) = self.load_set(&locked, primary, HotCopy::Fill)? else {
            return Ok(0);
        };
        let mut set = (*set).clone();
        let n = change(&mut set);
        if n > 0 {
            self.save_set(&locked, primary, set, &[], HotCopy::Fill)?;
        }
        Ok(n)
    }

    /// Makes a fully written body visible, replacing the variant it shares a selection with; unless a purge
    /// or ban added since its fetch started (at `epoch`) covers it, in which case it is discarded.
    pub(crate) fn publish(
        &self,
        primary: &str,
        mut meta: ObjectMeta,
        epoch: u64,
    ) -> Result<(), StoreError> {
        let locked = self.lock_record(primary);
        if self.invalidated_since(&locked, primary, &mut meta, epoch)? {
            self.forget_body(&meta);
            return Ok(());
        }
        let mut set = self
            .load_set(&locked, primary, HotCopy::Fill)?
            .map(|s| (*s).clone())
            .unwrap_or_default();
        let mut dropped = Vec::new();
        if let Some(pos) = set.variants.iter().position(|v| v.variant == meta.variant) {
            dropped.push(set.variants.remove(pos));
        }
        self.counters().objects.add(1);
        self.counters().stored_bytes.add(meta.length);
        set.variants.insert(0, meta);
        while set.variants.len() > self.inner.config.max_variants {
            dropped.push(set.variants.pop().expect("non-empty"));
            self.counters().variants_overflowed.add(1);
        }
        self.save_set(&locked, primary, set, &dropped, HotCopy::Fill)?;
        self.counters().objects_published.add(1);
        Ok(())
    }

    /// Whether a ban or purge since a fetch started (at `epoch`, and the bans after `meta.ban_checked`)
    /// covers what it brought, described by `meta`; when not, its tags are indexed and `meta` records the
    /// bans it was tested against. The caller holds the mutation lock.
    fn invalidated_since(
        &self,
        _locked: &Locked<'_>,
        primary: &str,
        meta: &mut ObjectMeta,
        epoch: u64,
    ) -> Result<bool, StoreError> {
        // Indexed before the purges are looked at: a tag purge registered after that look finds the entry
        // (and then waits for this key's lock to remove the body), one registered before it is seen here.
        self.index_tags(primary, meta)?;
        let newest = self.inner.bans.newest();
        let banned = meta.ban_checked < newest
            && match self.inner.bans.test_fetched(
                &self.inner.bans.snapshot(),
                meta.ban_checked,
                primary,
                meta,
            ) {
                Verdict::Banned => true,
                Verdict::Clear(checked) => {
                    meta.ban_checked = checked;
                    false
                }
            };
        if banned || self.inner.invalidations.covers(epoch, primary, &meta.tags) {
            self.unindex_tags(primary, meta)?;
            self.counters().publishes_cancelled.add(1);
            return Ok(true);
        }
        Ok(false)
    }

    /// Keeps `part`, bytes `part.start..` of a representation `total` bytes long whose head is `head`, as
    /// part of the variant body `head` selects: added to it when that body is stored in parts of the same
    /// representation ([`same_representation`]), else a new variant body of this part alone, which replaces
    /// the one stored under that selection (the object changed at the origin, or was stored whole). Unless
    /// an invalidation since the fetch began (at `epoch`) covers it: then it is discarded.
    pub(crate) fn add_part(
        &self,
        primary: &str,
        mut head: ObjectMeta,
        total: u64,
        part: Part,
        epoch: u64,
    ) -> Result<PartKept, StoreError> {
        // The generation a new variant body would be: its tags are indexed under it before the purges
        // are looked at.
        head.generation = self.next_id();
        let locked = self.lock_record(primary);
        if self.invalidated_since(&locked, primary, &mut head, epoch)? {
            self.forget_body(&part.body);
            return Ok(PartKept::Discarded);
        }
        let mut set = self
            .load_set(&locked, primary, HotCopy::Fill)?
            .map(|s| (*s).clone())
            .unwrap_or_default();
        let replaces = match set.part_fate(&head, total, &part) {
            PartFate::Joins {
                variant,
                partial,
                adds,
            } => {
                // Tags came with the object's first part; the variant keeps them.
                self.unindex_tags(primary, &head)?;
                set.variants[variant].refresh_from_part(head);
                let partial = &mut set.partials[partial];
                if adds {
                    self.counters().stored_bytes.add(part.body.length);
                    let at = partial.parts.partition_point(|p| p.start < part.start);
                    partial.parts.insert(at, part);
                } else {
                    self.forget_body(&part.body);
                }
                self.save_set(&locked, primary, set, &[], HotCopy::Fill)?;
                return Ok(PartKept::Added);
            }
            PartFate::Refused => {
                self.unindex_tags(primary, &head)?;
                self.forget_body(&part.body);
                return Ok(PartKept::Discarded);
            }
            PartFate::Starts { replaces } => replaces,
        };
        self.counters().stored_bytes.add(part.body.length);
        let mut dropped = Vec::new();
        if let Some(pos) = replaces {
            dropped.push(set.variants.remove(pos));
        }
        head.length = 0;
        head.chunk_size = part.body.chunk_size;
        head.stored_at_ms = head.stored_at_ms.min(lacquer_clock::now_ms());
        set.partials.push(Partial {
            of: head.generation,
            total,
            parts: vec![part],
        });
        set.variants.insert(0, head);
        self.counters().objects.add(1);
        while set.variants.len() > self.inner.config.max_variants {
            dropped.push(set.variants.pop().expect("non-empty"));
            self.counters().variants_overflowed.add(1);
        }
        self.save_set(&locked, primary, set, &dropped, HotCopy::Fill)?;
        self.counters().objects_published.add(1);
        Ok(PartKept::Started)
    }

    /// Forgets the part of variant body `of` stored as `generation` (one found to have lost a chunk): the
    /// variant stays, and the bytes are fetched again when asked for.
    pub fn remove_part(&self, primary: &str, of: u64, generation: u64) -> Result<(), StoreError> {
        let locked = self.lock_record(primary);
        let Some(set) = self.load_set(&locked, primary, HotCopy::Fill)? else {
            return Ok(());
        };
        let mut set = (*set).clone();
        let Some(partial) = set.partials.iter_mut().find(|p| p.of == of) else {
            return Ok(());
        };
        let Some(pos) = partial
            .parts
            .iter()
            .position(|p| p.body.generation == generation)
        else {
            return Ok(());
        };
        let part = partial.parts.remove(pos);
        self.forget_body_later(&part.body);
        self.counters().stored_bytes.sub(part.body.length);
        self.save_set(&locked, primary, set, &[], HotCopy::Fill)?;
        Ok(())
    }

    /// Removes every variant of `primary`; returns how many there were.
    pub fn remove(&self, primary: &str) -> Result<usize, StoreError> {
        let locked = self.lock_record(primary);
        let Some(set) = self.load_set(&locked, primary, HotCopy::Fill)? else {
            return Ok(0);
        };
        let dropped = set.variants.clone();
        let emptied = ObjectSet {
            variants: Vec::new(),
            siblings: set.siblings.clone(),
            partials: set.partials.clone(),
        };
        self.save_set(&locked, primary, emptied, &dropped, HotCopy::Fill)?;
        self.counters().objects_removed.add(dropped.len() as u64);
        Ok(dropped.len())
    }

    /// Replaces the metadata of a stored body (same generation, same chunks), as after a revalidation;
    /// `false` when that body is no longer stored.
    pub fn refresh(&self, primary: &str, meta: ObjectMeta) -> Result<bool, StoreError> {
        let locked = self.lock_record(primary);
        let Some(set) = self.load_set(&locked, primary, HotCopy::Fill)? else {
            return Ok(false);
        };
        let mut set = (*set).clone();
        let Some(slot) = set
            .variants
            .iter_mut()
            .find(|m| m.generation == meta.generation)
        else {
            return Ok(false);
        };
        let mut meta = meta;
        meta.ban_checked = meta.ban_checked.max(slot.ban_checked);
        let old = std::mem::replace(slot, meta.clone());
        if old.tags != meta.tags {
            self.index_tags(primary, &meta)?;
        }
        self.save_set(&locked, primary, set, &[], HotCopy::Fill)?;
        if old.tags != meta.tags {
            let gone = ObjectMeta {
                tags: old
                    .tags
                    .into_iter()
                    .filter(|t| !meta.tags.contains(t))
                    .collect(),
                ..old
            };
            self.unindex_tags(primary, &gone)?;
        }
        Ok(true)
    }

    /// Removes one stored body (for instance one whose chunks were lost) if it is still the current one.
    pub fn remove_generation(&self, primary: &str, generation: u64) -> Result<(), StoreError> {
        self.retain(primary, |m| m.generation != generation)
            .map(|_| ())
    }

    /// Keeps the variants of `primary` for which `keep` holds; returns how many were dropped.
    pub(crate) fn retain(
        &self,
        primary: &str,
        keep: impl Fn(&ObjectMeta) -> bool,
    ) -> Result<usize, StoreError> {
        let locked = self.lock_record(primary);
        let Some(set) = self.load_set(&locked, primary, HotCopy::Fill)? else {
            return Ok(0);
        };
        let (kept, dropped): (Vec<_>, Vec<_>) = set.variants.iter().cloned().partition(|m| keep(m));
        if dropped.is_empty() {
            return Ok(0);
        }
        let kept = ObjectSet {
            variants: kept,
            siblings: set.siblings.clone(),
            partials: set.partials.clone(),
        };
        self.save_set(&locked, primary, kept, &dropped, HotCopy::Fill)?;
        Ok(dropped.len())
    }

    /// Every stored variant of `primary` that no ban covers, with where its chunks are, for operators: unlike
    /// [`Store::lookup`] it does not make the key hot.
    pub fn inspect(&self, primary: &str) -> Result<Vec<Inspected>, StoreError> {
        let set = {
            let locked = self.lock_record(primary);
            let Some(set) = self.load_set(&locked, primary, HotCopy::IfPresent)? else {
                return Ok(Vec::new());
            };
            let (set, removed) = self.apply_bans_locked(
                &locked,
                primary,
                set,
                self.inner.bans.newest(),
                HotCopy::IfPresent,
            )?;
            self.counters().objects_banned.add(removed as u64);
            set
        };
        let Some(set) = set else {
            return Ok(Vec::new());
        };
        Ok(set
            .variants
            .iter()
            .map(|meta| Inspected {
                tiers: self.chunk_tiers(meta),
                representations: set
                    .siblings
                    .iter()
                    .filter(|s| s.of == meta.generation)
                    .map(|s| (s.clone(), self.chunk_tiers(&s.body)))
                    .collect(),
                parts: set.partial(meta.generation).map(|partial| {
                    let parts = partial
                        .parts
                        .iter()
                        .map(|p| (p.clone(), self.chunk_tiers(&p.body)))
                        .collect();
                    (partial.total, parts)
                }),
                meta: meta.clone(),
            })
            .collect())
    }

    /// Takes the lock every change to `primary`'s record holds, from reading it to writing it back (sled,
    /// the hot copy and the tag index). Not reentrant: the locked operations here take it themselves.
    fn lock_record(&self, primary: &str) -> Locked<'_> {
        self.inner.records.lock(primary.as_bytes())
    }

    /// Walks every record in sled in key order, without the lock (a walk over a large store must not hold
    /// up lookups): act on what it yields only through the locked operations above.
    pub(crate) fn records(&self) -> impl Iterator<Item = Result<Record, StoreError>> + '_ {
        self.inner.objects.iter().map(|item| {
            let (key, value) = item?;
            let set = ObjectSet::decode(&String::from_utf8_lossy(&key), &value).ok();
            Ok(Record { key, set })
        })
    }

    /// Removes the record at `key` that a walk could not decode, under the lock and only if it still cannot
    /// be decoded (a record rewritten since the walk read it is left alone); returns whether it was removed.
    /// Not counted: callers count what they report.
    pub(crate) fn drop_unreadable(&self, key: &[u8]) -> Result<bool, StoreError> {
        let locked = self.inner.records.lock(key);
        let Some(value) = self.inner.objects.get(key)? else {
            return Ok(false);
        };
        if ObjectSet::decode(&String::from_utf8_lossy(key), &value).is_ok() {
            return Ok(false);
        }
        self.remove_record(&locked, key)?;
        Ok(true)
    }

    /// Removes the record at `key` from sled and, if it was there, from the index of stored keys.
    fn remove_record(&self, _locked: &Locked<'_>, key: &[u8]) -> Result<(), StoreError> {
        if self.inner.objects.remove(key)?.is_some() {
            self.inner.keys.sub(key);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::{PurgeMode, StoreBuilder};

    async fn open(dir: &std::path::Path) -> Store {
        StoreBuilder::small(dir)
            .with_max_variants(2)
            .open(tokio::runtime::Handle::current())
            .await
            .unwrap()
    }

    /// Metadata of a new body in the `encoding` variant (no chunks: these operations never read them).
    fn body(store: &Store, encoding: &str, tags: &[&str]) -> ObjectMeta {
        ObjectMeta {
            generation: store.next_id(),
            variant: vec![("accept-encoding".into(), encoding.into())],
            status: 200,
            length: 10,
            chunk_size: 64 << 10,
            stored_at_ms: lacquer_clock::now_ms(),
            ttl_ms: 60_000,
            tags: tags.iter().map(|t| (*t).to_owned()).collect(),
            ban_checked: store.mark().ban,
            ..ObjectMeta::default()
        }
    }

    /// The record in sled, read past the hot copy.
    fn in_sled(store: &Store, primary: &str) -> Option<ObjectSet> {
        let bytes = store.inner.objects.get(primary).unwrap()?;
        Some(ObjectSet::decode(primary, &bytes).unwrap())
    }

    fn in_memory(store: &Store, primary: &str) -> Option<ObjectSet> {
        store
            .inner
            .hot
            .get(primary)
            .map(|entry| (**entry.value()).clone())
    }

    fn generations(set: &ObjectSet) -> Vec<u64> {
        set.variants.iter().map(|m| m.generation).collect()
    }

    fn tagged(store: &Store, tag: &str) -> HashSet<u64> {
        store
            .tagged(&[tag.to_owned()])
            .unwrap()
            .into_iter()
            .map(|(_, t)| t.generation)
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn publishing_replaces_the_selection_keeps_the_newest_and_memory_matches_sled() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path()).await;
        let key = "a.test/x";
        let epoch = store.mark().epoch;
        let gzip = body(&store, "gzip", &["t"]);
        let br = body(&store, "br", &["t"]);
        let gzip_again = body(&store, "gzip", &["t"]);
        let identity = body(&store, "identity", &["t"]);
        for meta in [&gzip, &br, &gzip_again, &identity] {
            store.publish(key, meta.clone(), epoch).unwrap();
        }
        let set = store.lookup(key).unwrap().unwrap();
        assert_eq!(
            generations(&set),
            [identity.generation, gzip_again.generation],
            "newest first; gzip replaced in place, br dropped past max_variants"
        );
        assert_eq!(in_sled(&store, key).as_ref(), Some(&*set));
        assert_eq!(in_memory(&store, key).as_ref(), Some(&*set));
        assert_eq!(
            tagged(&store, "t"),
            HashSet::from([identity.generation, gzip_again.generation]),
            "dropped bodies leave the tag index"
        );
        let stats = store.stats();
        assert_eq!(stats.objects_published, 4);
        assert_eq!(stats.variants_overflowed, 1);
        assert_eq!((stats.objects, stats.stored_bytes), (2, 20));
    }

    /// A key in another stripe than `of`'s.
    fn elsewhere(of: &str) -> String {
        (0..)
            .map(|i| format!("b.test/{i}"))
            .find(|k| Records::stripe(k.as_bytes()) != Records::stripe(of.as_bytes()))
            .expect("more than one stripe")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_record_held_locked_does_not_stop_lookups_of_other_keys() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path()).await;
        let held = "a.test/held";
        let other = elsewhere(held);
        for key in [held, other.as_str()] {
            store
                .publish(key, body(&store, "gzip", &[]), store.mark().epoch)
                .unwrap();
            store.inner.hot.remove(key);
        }
        let _locked = store.lock_record(held);
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = store.clone();
        std::thread::spawn(move || tx.send(reader.lookup(&other).map(|s| s.is_some())));
        let found = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("a lookup of another key waited for the held record's lock");
        assert!(found.unwrap());
    }

    /// Entries weighed without the edited heads the data path now keeps, or with smaller ones, leave the
    /// hot copy (sled still answers for them, and they come back weighed anew); smaller copies keep it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn larger_edited_heads_empty_the_hot_copy_weighed_without_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path()).await;
        let mut meta = body(&store, "gzip", &[]);
        meta.headers = vec![("content-type".into(), b"text/plain".to_vec())];
        store.publish("a.test/k", meta, store.mark().epoch).unwrap();
        let weighed = store.inner.hot.usage();
        assert!(in_memory(&store, "a.test/k").is_some());
        store.weigh_edited_heads(Some(2));
        assert!(
            in_memory(&store, "a.test/k").is_none(),
            "weighed for no copy"
        );
        assert!(store.lookup_off_thread("a.test/k").await.unwrap().is_some());
        assert!(in_memory(&store, "a.test/k").is_some());
        assert!(store.inner.hot.usage() > weighed, "weighed with its copy");
        store.weigh_edited_heads(Some(1));
        store.weigh_edited_heads(None);
        assert!(in_memory(&store, "a.test/k").is_some(), "weighed for more");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hot_key_met_after_a_ban_is_tested_and_removed_only_if_covered() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path()).await;
        for key in ["a.test/banned", "a.test/kept"] {
            store
                .publish(key, body(&store, "gzip", &[]), store.mark().epoch)
                .unwrap();
        }
        store
            .add_ban(crate::BanExpr::parse("req.url ~ ^/banned$").unwrap())
            .await
            .unwrap();
        let newest = store.mark().ban;
        assert!(store
            .lookup_off_thread("a.test/banned")
            .await
            .unwrap()
            .is_none());
        assert!(
            in_sled(&store, "a.test/banned").is_none(),
            "removed for good"
        );
        assert!(in_memory(&store, "a.test/banned").is_none());
        let kept = store
            .lookup_off_thread("a.test/kept")
            .await
            .unwrap()
            .unwrap();
        // Tested by this lookup (and remembered in the hot copy), or by the lurker first: on a busy
        // machine its walk may complete the ban before the lookup, which then has nothing left to test.
        assert!(!store.inner.bans.needs_test(&kept.variants[0], newest));
        assert!(
            !store.inner.bans.needs_test(
                &in_memory(&store, "a.test/kept").unwrap().variants[0],
                newest
            ),
            "the test is remembered in the hot copy"
        );
        assert_eq!(store.stats().objects_banned, 1);
    }

    #[test]
    fn a_lookup_that_must_read_sled_leaves_the_client_runtime_free() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = runtime.block_on(open(dir.path()));
        let key = "a.test/cold";
        store
            .publish(key, body(&store, "gzip", &[]), store.mark().epoch)
            .unwrap();
        store.inner.hot.remove(key);
        // Another thread holds the record's lock until this runtime tells it to let go: a lookup that
        // waited for the lock on the runtime's own thread would never let the runtime say so.
        let (release, released) = std::sync::mpsc::channel::<()>();
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let holder = store.clone();
        std::thread::spawn(move || {
            let _locked = holder.lock_record(key);
            locked_tx.send(()).unwrap();
            released.recv().ok();
        });
        locked_rx.recv().unwrap();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let found = runtime.block_on(async {
                let lookup = tokio::spawn({
                    let store = store.clone();
                    async move { store.lookup_off_thread(key).await }
                });
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                release.send(()).unwrap();
                lookup.await.unwrap()
            });
            done_tx.send(found.map(|s| s.is_some())).ok();
        });
        let found = done_rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the lookup blocked the client runtime's thread");
        assert!(found.unwrap(), "read from sled once the lock was free");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_body_fetched_before_a_covering_purge_is_not_published() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path()).await;
        let key = "a.test/x";
        let before = store.mark();
        store.purge(key, PurgeMode::Hard).await.unwrap();
        store
            .publish(key, body(&store, "gzip", &[]), before.epoch)
            .unwrap();
        assert!(store.lookup(key).unwrap().is_none());
        assert!(in_sled(&store, key).is_none());
        assert_eq!(store.stats().publishes_cancelled, 1);
        let after = store.mark();
        store
            .publish(key, body(&store, "gzip", &[]), after.epoch)
            .unwrap();
        assert!(store.lookup(key).unwrap().is_some(), "fetched after it");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn refresh_keeps_the_newest_ban_check_and_moves_the_tag_entries() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path()).await;
        let key = "a.test/x";
        let stored = ObjectMeta {
            ban_checked: 40,
            ..body(&store, "gzip", &["a", "b"])
        };
        store
            .publish(key, stored.clone(), store.mark().epoch)
            .unwrap();
        let revalidated = ObjectMeta {
            ttl_ms: 120_000,
            ban_checked: 0,
            tags: vec!["b".into(), "c".into()],
            ..stored.clone()
        };
        assert!(store.refresh(key, revalidated).unwrap());
        let set = in_sled(&store, key).unwrap();
        assert_eq!(set.variants[0].ttl_ms, 120_000);
        assert_eq!(
            set.variants[0].ban_checked, 40,
            "bans already passed are not tested again"
        );
        assert_eq!(in_memory(&store, key), Some(set));
        assert!(tagged(&store, "a").is_empty());
        assert_eq!(tagged(&store, "b"), HashSet::from([stored.generation]));
        assert_eq!(tagged(&store, "c"), HashSet::from([stored.generation]));
        let gone = ObjectMeta {
            generation: store.next_id(),
            ..stored
        };
        assert!(
            !store.refresh(key, gone).unwrap(),
            "a body no longer stored is not brought back"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn walks_read_without_filling_memory_and_remove_by_generation() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path()).await;
        let key = "a.test/x";
        let old = body(&store, "gzip", &[]);
        store.publish(key, old.clone(), store.mark().epoch).unwrap();
        store.inner.hot.remove(key);
        assert!(store.stored_generation(key, old.generation).unwrap());
        assert!(
            in_memory(&store, key).is_none(),
            "a walk does not make keys hot"
        );
        // The body is replaced between a walk's read and its removal: the new one stays.
        let new = body(&store, "gzip", &[]);
        store.publish(key, new.clone(), store.mark().epoch).unwrap();
        assert_eq!(
            store
                .retain(key, |m| m.generation != old.generation)
                .unwrap(),
            0
        );
        assert_eq!(
            generations(&in_sled(&store, key).unwrap()),
            [new.generation]
        );
        assert_eq!(
            store
                .retain(key, |m| m.generation != new.generation)
                .unwrap(),
            1
        );
        assert!(in_sled(&store, key).is_none() && in_memory(&store, key).is_none());
        assert_eq!(store.stats().objects, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unreadable_record_is_dropped_only_while_it_is_still_unreadable() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path()).await;
        let key = "a.test/x";
        store
            .inner
            .objects
            .insert(key, &b"\xffgarbage"[..])
            .unwrap();
        let walked: Vec<Record> = store.records().map(Result::unwrap).collect();
        assert_eq!(walked.len(), 1);
        assert!(walked[0].set.is_none());
        // Rewritten after the walk read it: left alone.
        store
            .publish(key, body(&store, "gzip", &[]), store.mark().epoch)
            .unwrap();
        assert!(!store.drop_unreadable(&walked[0].key).unwrap());
        assert!(in_sled(&store, key).is_some());
        store
            .inner
            .objects
            .insert(key, &b"\xffgarbage"[..])
            .unwrap();
        assert!(store.drop_unreadable(&walked[0].key).unwrap());
        assert!(store.inner.objects.get(key).unwrap().is_none());
    }
}
