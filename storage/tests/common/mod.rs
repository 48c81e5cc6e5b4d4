//! Helpers shared by the store's integration tests.
#![allow(dead_code)]

use std::time::Duration;

use lacquer_storage::{ObjectMeta, Store, StoreBuilder, Tier};

pub const KIB: usize = 1024;
pub const MIB: usize = 1024 * KIB;

pub fn builder(dir: &std::path::Path) -> StoreBuilder {
    StoreBuilder::new(dir)
        .with_memory_bytes(8 * MIB)
        .with_disk_bytes(256 * MIB)
        .with_chunk_size(64 * KIB)
}

/// A store in `dir` with the test sizes of [`builder`].
pub async fn open(dir: &std::path::Path) -> Store {
    builder(dir)
        .open(tokio::runtime::Handle::current())
        .await
        .unwrap()
}

pub fn meta() -> ObjectMeta {
    ObjectMeta {
        status: 200,
        stored_at_ms: u64::MAX,
        ttl_ms: 3_600_000,
        ..ObjectMeta::default()
    }
}

pub fn body(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub async fn write(store: &Store, key: &str, data: &[u8]) {
    let mut w = store.writer(key, &[], store.mark()).unwrap();
    for piece in data.chunks(10_000) {
        w.push(piece).await.unwrap();
    }
    w.finish(key.to_owned(), meta()).await.unwrap();
}

pub async fn read(store: &Store, key: &str) -> Option<(Vec<u8>, Vec<Tier>)> {
    let set = store.lookup(key).unwrap()?;
    let m = &set.variants[0];
    let mut out = Vec::new();
    let mut tiers = Vec::new();
    for i in 0..m.chunk_count() {
        let c = store.read_chunk(m, i).await.unwrap()?;
        out.extend_from_slice(&c.data);
        tiers.push(c.tier);
    }
    Some((out, tiers))
}

pub async fn reopen(store: Store, dir: &std::path::Path) -> Store {
    store.close(Duration::from_secs(10)).await.unwrap();
    drop(store);
    open_again(dir).await
}

/// Opens the store in `dir` once the previous handle (closed and dropped) has let go of it: sled's own
/// thread pool may hold the database (and its directory lock) for a moment after the last handle is
/// dropped, longer on a machine busy with other tests; a restarted process never sees this.
pub async fn open_again(dir: &std::path::Path) -> Store {
    open_again_with(builder(dir)).await
}

/// [`open_again`] with other settings.
pub async fn open_again_with(builder: StoreBuilder) -> Store {
    let mut last = None;
    for _ in 0..300 {
        match builder
            .clone()
            .open(tokio::runtime::Handle::current())
            .await
        {
            Ok(store) => return store,
            Err(e @ lacquer_storage::StoreError::Locked { .. }) => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("reopen failed: {e}"),
        }
    }
    panic!("sled directory lock was never released in 30 s: {last:?}")
}

/// Waits for the start-up replay's walk (in the background after a crash) to have checked every record, so
/// the gauges count them all.
pub async fn replayed(store: &Store) {
    for _ in 0..600 {
        if store.stats().journal_replayed == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the start-up replay never finished");
}
