//! The index of stored keys: which primary keys have a record in sled, kept in memory so that a key never
//! stored is known to be absent on the calling thread, without a hand-off to a blocking thread to ask sled
//! (on a new-URL miss that hand-off and its wake-ups were a third of the profile).
//!
//! It holds 42 bits of the 64-bit hash of every stored key, never the key: the low 10 choose the shard and
//! the next 32 are kept in it. A fingerprint shared by two keys only costs a sled read (at a million keys, a
//! never-stored key meets a stored key's fingerprint once in about four million lookups), and the index
//! never says absent for a stored key. That holds because each hash has a count of the
//! stored keys under it (sled's insert and remove say whether a key was new or gone), the count is changed
//! under the key's record lock wherever a record is written or removed, and only a key whose count is zero
//! is answered absent. Until the index has been rebuilt from sled at start, it answers nothing: lookups read
//! sled as before.
//!
//! Memory: 5 bytes per table slot (the 32-bit fingerprint and hashbrown's control byte), with tables between
//! 7/16 and 7/8 full, so 6 to 12 bytes per stored key, plus 72 KiB for the 1024 shards themselves (the
//! `key_index_bytes` statistic, which a running store reports: 10.5 bytes per key at 1 000 000 keys). With
//! the whole 64-bit hash it was 9 bytes per slot, measured from a process's RSS at 13.0 bytes per key at
//! 100 000 keys and 18.9 at 1 000 000, which the statistic matched within 5 %.

use std::{
    collections::{HashMap, HashSet},
    hash::{BuildHasherDefault, Hash, Hasher},
    ops::Bound,
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex, MutexGuard,
    },
};

use crate::error::StoreError;

use super::{records::STRIPES, Store};

/// The hash the index keeps for a key: the same one the record lock stripes by, so every key of a shard is
/// changed under one stripe of the record lock.
pub(super) fn key_hash(key: &[u8]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

/// The bits of `hash` a shard keeps: the 32 above those that chose the shard.
fn fingerprint(hash: u64) -> u32 {
    (hash >> STRIPES.trailing_zeros()) as u32
}

/// A hasher for fingerprints, which are already random bits: it spreads them over all 64 bits, since
/// hashbrown takes the bucket from the low bits and its control byte from the top 7.
#[derive(Default)]
struct Spread(u64);

impl Hasher for Spread {
    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    fn write(&mut self, _: &[u8]) {
        unreachable!("the key index hashes fingerprints only")
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n);
    }
}

type Spreading = BuildHasherDefault<Spread>;

/// One shard: the fingerprints of the stored keys that fall in it.
#[derive(Default)]
struct Shard {
    /// Fingerprints with at least one stored key.
    once: HashSet<u32, Spreading>,
    /// For the rare fingerprint with more than one stored key (a collision, or a key counted twice by the
    /// rebuild and a write racing it): how many.
    more: HashMap<u32, u32, Spreading>,
}

impl Shard {
    fn add(&mut self, hash: u32) {
        if !self.once.insert(hash) {
            *self.more.entry(hash).or_insert(1) += 1;
        }
    }

    fn sub(&mut self, hash: u32) {
        match self.more.get_mut(&hash) {
            Some(n) if *n > 2 => *n -= 1,
            Some(_) => {
                self.more.remove(&hash);
            }
            None => {
                self.once.remove(&hash);
            }
        }
    }

    /// Bytes of the tables' allocations, from hashbrown's layout: a power-of-two number of slots, each the
    /// value and one control byte, at most 7/8 of them (all but one below 8 slots) usable.
    fn bytes(&self) -> usize {
        fn table(capacity: usize, slot: usize) -> usize {
            let slots = match capacity {
                0 => return 0,
                1..=7 => (capacity + 1).next_power_of_two(),
                _ => (capacity * 8 / 7).next_power_of_two(),
            };
            slots * (slot + 1) + 16
        }
        table(self.once.capacity(), 4) + table(self.more.capacity(), 8)
    }
}

/// The in-memory index of stored keys (see the module's documentation): 1024 shards of fingerprints, one per
/// stripe of the record lock, each behind a mutex of its own held for one table operation, so a lookup
/// never waits for a record lock held across sled operations. It takes 6 to 12 bytes per stored key
/// (10.5 at a million keys), reported as `key_index_bytes`.
pub(super) struct KeyIndex {
    shards: Box<[Mutex<Shard>]>,
    /// Set once every key in sled has been counted: only then is a missing hash an answer.
    complete: AtomicBool,
}

impl Default for KeyIndex {
    fn default() -> Self {
        Self {
            shards: (0..STRIPES).map(|_| Mutex::default()).collect(),
            complete: AtomicBool::new(false),
        }
    }
}

impl KeyIndex {
    fn shard(&self, hash: u64) -> MutexGuard<'_, Shard> {
        self.shards[hash as usize % STRIPES]
            .lock()
            .expect("key index shard")
    }

    /// Whether `key` may have a record: `false` only once the index is complete and no stored key has its
    /// hash.
    pub(super) fn may_hold(&self, key: &[u8]) -> bool {
        if !self.complete.load(Ordering::Acquire) {
            return true;
        }
        let hash = key_hash(key);
        self.shard(hash).once.contains(&fingerprint(hash))
    }

    /// `key` got a record it did not have (the caller holds its record lock), or the rebuild found it.
    pub(super) fn add(&self, key: &[u8]) {
        let hash = key_hash(key);
        self.shard(hash).add(fingerprint(hash));
    }

    /// `key`'s record was removed; the caller holds its record lock. Ignored until the index is complete:
    /// the rebuild may not have counted the key yet, and taking away a count it never added could leave a
    /// key that shares the hash uncounted. What that leaves behind only costs sled reads.
    pub(super) fn sub(&self, key: &[u8]) {
        let hash = key_hash(key);
        let mut shard = self.shard(hash);
        if self.complete.load(Ordering::Acquire) {
            shard.sub(fingerprint(hash));
        }
    }

    /// Every key sled held has been counted (and every key written since, by [`KeyIndex::add`]).
    pub(super) fn completed(&self) {
        self.complete.store(true, Ordering::Release);
    }

    /// Whether [`KeyIndex::completed`] was called: before that, every lookup reads sled.
    pub(super) fn is_complete(&self) -> bool {
        self.complete.load(Ordering::Acquire)
    }

    /// Distinct fingerprints held, and the bytes their tables take.
    pub(super) fn size(&self) -> (u64, u64) {
        self.shards.iter().fold((0, 0), |(keys, bytes), shard| {
            let shard = shard.lock().expect("key index shard");
            (keys + shard.once.len() as u64, bytes + shard.bytes() as u64)
        })
    }
}

/// Keys counted per batch of the rebuild: between batches it lets go of the store, so a store closing
/// meanwhile is not kept open.
const REBUILD_BATCH: usize = 4096;

impl Store {
    /// Counts every key sled holds into the index, on a thread of its own in the idle class (after a clean
    /// close the start skips its walk over the records, so that hits are served at once; this walk is the
    /// one it skipped, and nothing waits for it: until it completes, misses read sled as before). Writes
    /// meanwhile add their keys themselves; a key both count is counted twice, which only costs a sled read
    /// once it is removed. A walk that fails leaves the index incomplete, with a warning.
    pub(super) fn rebuild_key_index(&self) -> Result<(), StoreError> {
        crate::background::spawn(
            "key-index",
            crate::background::Priority::Idle,
            self.downgrade(),
            |weak| {
                let started = std::time::Instant::now();
                let (mut after, mut keys) = (None::<sled::IVec>, 0u64);
                loop {
                    let Some(store) = weak.open() else { return };
                    let walk = match &after {
                        Some(key) => store
                            .inner
                            .objects
                            .range((Bound::Excluded(key.clone()), Bound::Unbounded)),
                        None => store.inner.objects.iter(),
                    };
                    let mut batch = 0;
                    for key in walk.keys().take(REBUILD_BATCH) {
                        let key = match key {
                            Ok(key) => key,
                            Err(e) => {
                                tracing::warn!(error = %e, "rebuilding the index of stored keys failed: misses read the metadata");
                                return;
                            }
                        };
                        store.inner.keys.add(&key);
                        after = Some(key);
                        batch += 1;
                    }
                    keys += batch as u64;
                    if batch < REBUILD_BATCH {
                        store.inner.keys.completed();
                        tracing::debug!(keys, elapsed = ?started.elapsed(), "index of stored keys rebuilt");
                        return;
                    }
                }
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{meta::ObjectMeta, BanExpr, PurgeMode, StoreBuilder};

    async fn open(dir: &std::path::Path) -> Store {
        for _ in 0..100 {
            match StoreBuilder::small(dir)
                .open(tokio::runtime::Handle::current())
                .await
            {
                Err(StoreError::Locked { .. }) => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                opened => return opened.unwrap(),
            }
        }
        panic!("the previous handle never let go of the store");
    }

    /// Metadata of a new body (no chunks: the record operations never read them).
    fn body(store: &Store, tags: &[&str]) -> ObjectMeta {
        ObjectMeta {
            generation: store.next_id(),
            status: 200,
            length: 10,
            chunk_size: 64 << 10,
            stored_at_ms: lacquer_clock::now_ms(),
            ttl_ms: 3_600_000,
            tags: tags.iter().map(|t| (*t).to_owned()).collect(),
            ban_checked: store.mark().ban,
            ..ObjectMeta::default()
        }
    }

    fn put(store: &Store, key: &str) {
        store
            .publish(key, body(store, &[]), store.mark().epoch)
            .unwrap();
    }

    fn indexed(store: &Store, key: &str) -> bool {
        store.inner.keys.may_hold(key.as_bytes())
    }

    async fn until_ready(store: &Store) {
        for _ in 0..600 {
            if store.stats().key_index_ready == 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the index of stored keys was never rebuilt");
    }

    /// Every key with a record in sled, read past the index and the hot copy.
    fn in_sled(store: &Store) -> Vec<String> {
        store
            .inner
            .objects
            .iter()
            .keys()
            .map(|k| String::from_utf8(k.unwrap().to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn a_key_never_stored_is_a_miss_without_a_blocking_thread() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = runtime.block_on(open(dir.path()));
        let stored = "a.test/stored";
        put(&store, stored);
        store.inner.hot.remove(stored);
        // The runtime's only blocking thread is kept busy: a lookup that needs one waits for it.
        let (release, released) = std::sync::mpsc::channel::<()>();
        let (busy_tx, busy) = std::sync::mpsc::channel();
        runtime.spawn_blocking(move || {
            busy_tx.send(()).unwrap();
            released.recv().ok();
        });
        busy.recv().unwrap();
        let never = runtime.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(10),
                store.lookup_off_thread("a.test/never"),
            )
            .await
        });
        assert!(
            matches!(never, Ok(Ok(None))),
            "a key never stored waited for a blocking thread"
        );
        let cold = runtime.spawn({
            let store = store.clone();
            async move { store.lookup_off_thread(stored).await }
        });
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !cold.is_finished(),
            "a stored key that is not hot is read from sled on a blocking thread"
        );
        release.send(()).unwrap();
        assert!(runtime.block_on(cold).unwrap().unwrap().is_some());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_way_a_record_goes_keeps_the_index_right() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path()).await;
        for key in [
            "a.test/removed",
            "a.test/purged",
            "a.test/banned",
            "a.test/swept",
            "a.test/unreadable",
            "a.test/kept",
        ] {
            put(&store, key);
        }
        store
            .publish("a.test/tagged", body(&store, &["t"]), store.mark().epoch)
            .unwrap();
        // Made stale by a soft purge, it is kept for its grace: the sweep leaves it.
        let graced = ObjectMeta {
            grace_ms: 3_600_000,
            ..body(&store, &[])
        };
        store
            .publish("a.test/soft", graced, store.mark().epoch)
            .unwrap();
        let expired = ObjectMeta {
            stored_at_ms: lacquer_clock::now_ms() - 60_000,
            ttl_ms: 1_000,
            ..body(&store, &[])
        };
        store
            .publish("a.test/swept", expired, store.mark().epoch)
            .unwrap();
        assert!(!indexed(&store, "a.test/never"));
        assert_eq!(store.stats().key_index_keys, 8);

        assert_eq!(store.remove("a.test/removed").unwrap(), 1);
        store.purge("a.test/purged", PurgeMode::Hard).await.unwrap();
        store.purge("a.test/soft", PurgeMode::Soft).await.unwrap();
        store
            .purge_tags(&["t".to_owned()], PurgeMode::Hard)
            .await
            .unwrap();
        store
            .add_ban(BanExpr::parse("req.url ~ ^/banned$").unwrap())
            .await
            .unwrap();
        assert!(store
            .lookup_off_thread("a.test/banned")
            .await
            .unwrap()
            .is_none());
        assert!(store.sweep().unwrap() >= 1);
        store
            .inner
            .objects
            .insert("a.test/unreadable", &b"\xffgarbage"[..])
            .unwrap();
        store.inner.hot.remove("a.test/unreadable");
        assert!(store.lookup("a.test/unreadable").unwrap().is_none());

        for gone in [
            "a.test/removed",
            "a.test/purged",
            "a.test/tagged",
            "a.test/banned",
            "a.test/swept",
            "a.test/unreadable",
        ] {
            assert!(!indexed(&store, gone), "{gone} is still indexed");
        }
        for kept in ["a.test/soft", "a.test/kept"] {
            assert!(indexed(&store, kept), "{kept} is not indexed");
        }
        assert_eq!(in_sled(&store), ["a.test/kept", "a.test/soft"]);
        assert_eq!(store.stats().key_index_keys, 2);
        put(&store, "a.test/removed");
        assert!(indexed(&store, "a.test/removed"), "stored again");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_reopening_every_stored_key_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<String> = (0..3 * REBUILD_BATCH + 7)
            .map(|i| format!("a.test/{i}"))
            .collect();
        let store = open(dir.path()).await;
        for key in &keys {
            put(&store, key);
        }
        store.close(Duration::from_secs(10)).await.unwrap();
        drop(store);
        // After a clean close the start skips its walk: the index is rebuilt in the background.
        let store = open(dir.path()).await;
        until_ready(&store).await;
        assert!(keys.iter().all(|k| indexed(&store, k)));
        assert!(!indexed(&store, "a.test/never"));
        assert_eq!(store.stats().key_index_keys, keys.len() as u64);

        // After a crash the start's replay walks every record in the background, and counts them as it goes.
        store.close(Duration::from_secs(10)).await.unwrap();
        store
            .inner
            .state
            .remove(super::super::recover::CLEAN_CLOSE)
            .unwrap();
        store.inner.db.flush().unwrap();
        drop(store);
        let store = open(dir.path()).await;
        until_ready(&store).await;
        assert_eq!(
            store.stats().journal_replayed,
            1,
            "complete with the replay"
        );
        assert_eq!(store.stats().objects, keys.len() as u64);
        assert!(keys.iter().all(|k| indexed(&store, k)));
        assert!(!indexed(&store, "a.test/never"));
    }

    /// Takes the store's index back to where a start whose rebuild has counted only `counted` is.
    fn restart_index(store: &Store, counted: &[String]) {
        store.inner.keys.complete.store(false, Ordering::Release);
        for shard in store.inner.keys.shards.iter() {
            *shard.lock().unwrap() = Shard::default();
        }
        for key in counted {
            store.inner.keys.add(key.as_bytes());
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lookups_during_the_rebuild_never_miss_a_stored_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path()).await;
        let keys: Vec<String> = (0..2 * REBUILD_BATCH)
            .map(|i| format!("a.test/{i}"))
            .collect();
        for key in &keys {
            put(&store, key);
            store.inner.hot.remove(key);
        }
        restart_index(&store, &keys[..keys.len() / 2]);
        assert_eq!(store.stats().key_index_ready, 0);
        for key in &keys {
            assert!(
                store.lookup_off_thread(key).await.unwrap().is_some(),
                "{key} missed"
            );
        }
        assert!(store
            .lookup_off_thread("a.test/never")
            .await
            .unwrap()
            .is_none());

        // Writes race the rebuild: keys stored and removed while it walks.
        restart_index(&store, &[]);
        store.rebuild_key_index().unwrap();
        let writer = std::thread::spawn({
            let (store, keys) = (store.clone(), keys.clone());
            move || {
                for (i, key) in keys.iter().enumerate() {
                    put(&store, &format!("a.test/new/{i}"));
                    if i % 2 == 0 {
                        store.remove(key).unwrap();
                    }
                }
            }
        });
        writer.join().unwrap();
        until_ready(&store).await;
        let stored = in_sled(&store);
        assert_eq!(stored.len(), keys.len() * 3 / 2);
        for key in &stored {
            assert!(indexed(&store, key), "{key} is stored but not indexed");
        }
        for (i, key) in keys.iter().enumerate() {
            let found = store.lookup_off_thread(key).await.unwrap().is_some();
            assert_eq!(found, i % 2 == 1, "{key}");
        }
    }

    /// Keys whose fingerprints are equal, as two stored keys' may be: made by giving the shard the fingerprint
    /// directly.
    #[test]
    fn a_hash_two_keys_share_stays_until_both_are_gone() {
        let mut shard = Shard::default();
        shard.add(7);
        shard.add(7);
        shard.add(9);
        shard.sub(7);
        assert!(shard.once.contains(&7), "the other key still has it");
        shard.sub(7);
        assert!(!shard.once.contains(&7));
        assert!(shard.once.contains(&9));
        assert!(shard.more.is_empty());
    }

    #[test]
    fn nothing_is_answered_absent_before_the_index_is_complete() {
        let index = KeyIndex::default();
        assert!(index.may_hold(b"a.test/never"));
        index.add(b"a.test/kept");
        index.completed();
        assert!(!index.may_hold(b"a.test/never"));
        assert!(index.may_hold(b"a.test/kept"));
    }

    #[test]
    fn removals_before_the_index_is_complete_never_take_a_count_away() {
        let index = KeyIndex::default();
        // Found stored by a write while the rebuild had not reached it yet, then removed: the rebuild may
        // still count it, or a key sharing its hash, so the removal leaves the count alone.
        index.add(b"a.test/x");
        index.sub(b"a.test/x");
        index.completed();
        assert!(index.may_hold(b"a.test/x"));
        index.sub(b"a.test/x");
        assert!(!index.may_hold(b"a.test/x"));
    }
}
