//! The store against a real directory: write, read back from memory and from disk after a reopen, removal
//! that survives a reopen, replacement, and a burst that foyer must not drop.

use std::time::Duration;

use lacquer_storage::{BanExpr, ChunkTiers, ObjectMeta, Tier};

mod common;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_survive_a_reopen_and_are_read_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    let a = body(1, 200 * KIB + 17);
    write(&store, "h/a", &a).await;
    let (got, tiers) = read(&store, "h/a").await.unwrap();
    assert_eq!(got, a);
    assert!(tiers.iter().all(|t| *t == Tier::Memory));
    assert_eq!(store.stats().objects, 1);

    let store = reopen(store, dir.path()).await;
    let (got, tiers) = read(&store, "h/a").await.unwrap();
    assert_eq!(got, a);
    assert!(tiers.iter().all(|t| *t == Tier::Disk));
    assert_eq!(store.stats().objects, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_objects_stay_removed_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    write(&store, "h/gone", &body(2, 3000)).await;
    write(&store, "h/kept", &body(3, 3000)).await;
    assert_eq!(store.remove("h/gone").unwrap(), 1);
    assert!(store.lookup("h/gone").unwrap().is_none());
    let store = reopen(store, dir.path()).await;
    assert!(store.lookup("h/gone").unwrap().is_none());
    assert_eq!(read(&store, "h/kept").await.unwrap().0, body(3, 3000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_body_never_lends_old_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    write(&store, "h/x", &body(4, 150 * KIB)).await;
    let old = store.lookup("h/x").unwrap().unwrap().variants[0].clone();
    write(&store, "h/x", &body(5, 70 * KIB)).await;
    let set = store.lookup("h/x").unwrap().unwrap();
    assert_eq!(set.variants.len(), 1);
    assert_ne!(set.variants[0].generation, old.generation);
    assert_eq!(read(&store, "h/x").await.unwrap().0, body(5, 70 * KIB));
    let store = reopen(store, dir.path()).await;
    assert_eq!(read(&store, "h/x").await.unwrap().0, body(5, 70 * KIB));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variants_are_capped() {
    let dir = tempfile::tempdir().unwrap();
    let store = builder(dir.path())
        .with_max_variants(2)
        .open(tokio::runtime::Handle::current())
        .await
        .unwrap();
    for lang in ["en", "de", "fr"] {
        let variant = vec![("accept-language".to_owned(), lang.to_owned())];
        let mut w = store.writer("h/v", &variant, store.mark()).unwrap();
        w.push(lang.as_bytes()).await.unwrap();
        w.finish("h/v".into(), ObjectMeta { variant, ..meta() })
            .await
            .unwrap();
    }
    let set = store.lookup("h/v").unwrap().unwrap();
    let langs: Vec<_> = set
        .variants
        .iter()
        .map(|m| m.variant[0].1.as_str())
        .collect();
    assert_eq!(langs, ["fr", "de"]);
    assert_eq!(store.stats().variants_overflowed, 1);
}

/// foyer ignores entries beyond its flush queue; the writer's backpressure must keep every one of a burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_large_bodies_is_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    let big = body(6, 4 * MIB);
    let writes: Vec<_> = (0..30)
        .map(|i| {
            let (store, big) = (store.clone(), big.clone());
            tokio::spawn(async move { write(&store, &format!("h/big{i}"), &big).await })
        })
        .collect();
    for w in writes {
        w.await.unwrap();
    }
    let store = reopen(store, dir.path()).await;
    for i in 0..30 {
        let (got, _) = read(&store, &format!("h/big{i}"))
            .await
            .expect("object survived");
        assert!(got == big, "body {i} differs");
    }
    assert_eq!(store.stats().foyer_drops, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_keeps_stale_objects_within_their_error_window() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let long_ago = ObjectMeta {
        stored_at_ms: now - 60_000,
        ttl_ms: 1_000,
        stale_if_error_ms: 3_600_000,
        ..meta()
    };
    let expired = ObjectMeta {
        stored_at_ms: now - 60_000,
        ttl_ms: 1_000,
        stale_if_error_ms: 0,
        ..meta()
    };
    for (key, m) in [("h/kept", long_ago), ("h/expired", expired)] {
        let mut w = store.writer(key, &[], store.mark()).unwrap();
        w.push(b"stale but useful").await.unwrap();
        w.finish(key.into(), m).await.unwrap();
    }
    assert_eq!(store.sweep().unwrap(), 1);
    assert!(store.lookup("h/kept").unwrap().is_some());
    assert!(store.lookup("h/expired").unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspection_counts_chunks_per_tier_and_applies_bans() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    write(&store, "h/a", &body(1, 200 * KIB)).await;
    write(&store, "h/b", &body(2, 10)).await;
    for _ in 0..200 {
        if store.stats().objects_durable == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let found = store.inspect("h/a").unwrap();
    assert_eq!(found.len(), 1);
    let (meta, tiers) = (&found[0].meta, &found[0].tiers);
    assert_eq!(meta.length, 200 * KIB as u64);
    assert!(found[0].representations.is_empty());
    let all = ChunkTiers {
        chunks: 4,
        in_memory: 4,
        on_disk: 4,
    };
    assert_eq!(*tiers, all);
    assert!(store.inspect("h/missing").unwrap().is_empty());

    let store = reopen(store, dir.path()).await;
    let tiers = store.inspect("h/a").unwrap().remove(0).tiers;
    assert_eq!(
        tiers,
        ChunkTiers {
            in_memory: 0,
            ..all
        },
        "memory is empty after a restart"
    );

    store
        .add_ban(BanExpr::parse("req.url == /b").unwrap())
        .await
        .unwrap();
    assert!(
        store.inspect("h/b").unwrap().is_empty(),
        "a banned object is not shown"
    );
    assert!(store.lookup("h/b").unwrap().is_none(), "and is gone");
    assert_eq!(store.inspect("h/a").unwrap().len(), 1);
}

/// Readers streaming one large body from the disk tier at the same time share its device reads: each
/// chunk past the first MiB is read once for all of them, and every reader gets the right bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_readers_of_a_large_disk_body_share_its_reads() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    // 2 MiB: past a sixteenth of the 8 MiB memory tier, so it streams from disk without entering memory.
    let data = body(7, 2 * MIB);
    write(&store, "h/big", &data).await;
    let store = reopen(store, dir.path()).await;
    let set = store.lookup("h/big").unwrap().unwrap();
    let meta = &set.variants[0];
    let streamed = (MIB / (64 * KIB)) as u32..meta.chunk_count();
    let before = store.stats();
    for index in streamed.clone() {
        let reads: Vec<_> = (0..4).map(|_| store.read_chunk(meta, index)).collect();
        for read in futures_util::future::join_all(reads).await {
            let read = read.unwrap().expect("chunk");
            let start = index as usize * 64 * KIB;
            assert!(read.data[..] == data[start..start + read.data.len()]);
        }
    }
    let after = store.stats();
    let chunks = streamed.len() as u64;
    assert_eq!(
        after.disk_reads_shared - before.disk_reads_shared,
        3 * chunks
    );
    // Every reader got every chunk: from the device read, or from its copy once that read ended.
    let reads = |s: &lacquer_storage::StoreStatsSnapshot| s.chunk_reads_disk + s.chunk_reads_memory;
    assert_eq!(reads(&after) - reads(&before), 4 * chunks);
    // What the device was asked for: each chunk once (and its entry's framing), not once per reader.
    let device = after.disk_bytes_read - before.disk_bytes_read;
    assert!(
        device < 2 * chunks * 64 * KIB as u64,
        "{device} bytes read for {chunks} chunks of 64 KiB"
    );
    // A reader a little behind finds the last chunks read.
    let late = store
        .read_chunk(meta, meta.chunk_count() - 1)
        .await
        .unwrap();
    assert!(late.is_some());
    assert_eq!(store.stats().disk_reads_shared, after.disk_reads_shared + 1);
}

/// A part of the version stored whole (a range fetched while the whole was, published after it) never
/// replaces the whole; a part of another version does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_of_the_version_stored_whole_never_replaces_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    let tagged = |etag: &[u8]| ObjectMeta {
        headers: vec![("etag".into(), etag.to_vec())],
        ..meta()
    };
    // The range's fetch began after the whole's (a newer generation) and ends after it.
    let mut whole = store.writer("h/w", &[], store.mark()).unwrap();
    let mut part = store.writer("h/w", &[], store.mark()).unwrap();
    whole.push(&body(6, 3000)).await.unwrap();
    whole.finish("h/w".into(), tagged(b"\"a\"")).await.unwrap();
    part.push(&body(6, 3000)[1000..2000]).await.unwrap();
    part.finish_part("h/w".into(), tagged(b"\"a\""), 1000, 3000)
        .await
        .unwrap();
    let set = store.lookup("h/w").unwrap().unwrap();
    assert!(set.partials.is_empty(), "{set:?}");
    assert_eq!(read(&store, "h/w").await.unwrap().0, body(6, 3000));

    let mut newer = store.writer("h/w", &[], store.mark()).unwrap();
    newer.push(&body(7, 1000)).await.unwrap();
    newer
        .finish_part("h/w".into(), tagged(b"\"b\""), 0, 3000)
        .await
        .unwrap();
    let set = store.lookup("h/w").unwrap().unwrap();
    assert_eq!(
        set.partials.len(),
        1,
        "another version's part starts a body"
    );
}

/// A body announced large is cut into the store's large chunks, read back whole from memory and, after a
/// reopen, from the disk tier; removed, it stays removed. A body announced late (after its first byte) or
/// not at all keeps the small chunks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_announced_large_is_stored_in_large_chunks() {
    let dir = tempfile::tempdir().unwrap();
    // 256 KiB large chunks: the test tiers (4 MiB blocks, 8 MiB of memory) hold them.
    let large = |dir: &std::path::Path| builder(dir).with_large_chunk_size(256 * KIB);
    let store = large(dir.path())
        .open(tokio::runtime::Handle::current())
        .await
        .unwrap();
    let data = body(9, 2 * MIB + 1000);
    let mut w = store.writer("h/large", &[], store.mark()).unwrap();
    w.expect_length(data.len() as u64);
    assert_eq!(w.partial_body().chunk_size(), 256 * KIB as u64);
    for piece in data.chunks(10_000) {
        w.push(piece).await.unwrap();
    }
    w.finish("h/large".into(), meta()).await.unwrap();
    let m = store.lookup("h/large").unwrap().unwrap().variants[0].clone();
    assert_eq!(m.chunk_size, 256 * KIB as u32);
    assert_eq!(m.chunk_count(), 9);
    assert_eq!(read(&store, "h/large").await.unwrap().0, data);

    // Told after the first byte: too late to cut the body another way.
    let mut w = store.writer("h/late", &[], store.mark()).unwrap();
    w.push(&data[..10]).await.unwrap();
    w.expect_length(data.len() as u64);
    w.push(&data[10..]).await.unwrap();
    w.finish("h/late".into(), meta()).await.unwrap();
    let late = store.lookup("h/late").unwrap().unwrap().variants[0].clone();
    assert_eq!(late.chunk_size, 64 * KIB as u32);
    assert_eq!(read(&store, "h/late").await.unwrap().0, data);

    store.close(Duration::from_secs(10)).await.unwrap();
    drop(store);
    let store = open_again_with(large(dir.path())).await;
    let (got, tiers) = read(&store, "h/large").await.unwrap();
    assert_eq!(got, data);
    assert!(tiers.iter().all(|t| *t == Tier::Disk), "{tiers:?}");
    assert_eq!(store.remove("h/large").unwrap(), 1);
    assert!(store.lookup("h/large").unwrap().is_none());
    assert_eq!(read(&store, "h/late").await.unwrap().0, data);
}
