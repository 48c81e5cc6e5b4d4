//! The store against damaged files: metadata rolled back or unreadable, a damaged invalidation journal.
//! It always opens, and never serves what an acknowledged purge or ban removed.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use lacquer_storage::{BanExpr, PurgeMode, StoreBuilder};

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// Every file of the metadata directory with its content.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    files(&dir.join("meta"))
        .into_iter()
        .map(|f| {
            let bytes = std::fs::read(&f).unwrap();
            (f, bytes)
        })
        .collect()
}

fn restore(files: &[(PathBuf, Vec<u8>)]) {
    for (file, bytes) in files {
        std::fs::write(file, bytes).unwrap();
    }
}

async fn close(store: lacquer_storage::Store) {
    store
        .close(std::time::Duration::from_secs(10))
        .await
        .unwrap();
    drop(store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purges_and_bans_hold_when_the_metadata_is_rolled_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    for n in 0..6 {
        write(&store, &format!("a.test/{n}"), &body(n, 100_000)).await;
    }
    let store = reopen(store, dir.path()).await;
    let before = snapshot(dir.path());
    assert_eq!(store.purge("a.test/0", PurgeMode::Hard).await.unwrap(), 1);
    store.purge("a.test/1", PurgeMode::Soft).await.unwrap();
    store
        .add_ban(BanExpr::parse("req.url ~ ^/[23]$").unwrap())
        .await
        .unwrap();
    close(store).await;
    restore(&before);

    let store = open_again(dir.path()).await;
    assert!(read(&store, "a.test/0").await.is_none(), "purged");
    assert!(read(&store, "a.test/2").await.is_none(), "banned");
    assert!(read(&store, "a.test/3").await.is_none(), "banned");
    let soft = store
        .lookup("a.test/1")
        .unwrap()
        .expect("soft-purged is kept");
    assert!(
        soft.variants[0].remaining_ttl_ms(u64::MAX / 2) <= 0,
        "soft-purged is stale again"
    );
    assert_eq!(
        read(&store, "a.test/4").await.unwrap().0,
        body(4, 100_000),
        "the rest is intact"
    );
    let stats = store.stats();
    assert!(stats.objects_invalidated_at_start >= 4, "{stats:?}");
    assert!(store.problems().is_empty(), "{:?}", store.problems());
    close(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_close_skips_the_replay_only_while_the_journal_has_not_moved() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    for n in 0..4 {
        write(&store, &format!("a.test/{n}"), &body(n, 1000)).await;
    }
    close(store).await;
    // The files of a clean close, note included; put back after a later run purged and banned.
    let closed = snapshot(dir.path());
    let store = open_again(dir.path()).await;
    assert_eq!(store.stats().objects, 4, "counted by the clean close");
    assert_eq!(read(&store, "a.test/1").await.unwrap().0, body(1, 1000));
    assert_eq!(store.purge("a.test/0", PurgeMode::Hard).await.unwrap(), 1);
    store
        .add_ban(BanExpr::parse("req.url ~ ^/2$").unwrap())
        .await
        .unwrap();
    close(store).await;
    restore(&closed);

    let store = open_again(dir.path()).await;
    assert!(read(&store, "a.test/0").await.is_none(), "purged");
    assert!(
        store.lookup("a.test/2").unwrap().is_none(),
        "banned, even if the rolled-back ban list no longer has the ban"
    );
    assert_eq!(read(&store, "a.test/3").await.unwrap().0, body(3, 1000));
    replayed(&store).await;
    let stats = store.stats();
    assert_eq!(stats.objects, 2, "{stats:?}");
    assert!(stats.objects_invalidated_at_start >= 2, "{stats:?}");
    close(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_journal_drops_what_it_cannot_vouch_for() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    for n in 0..3 {
        write(&store, &format!("a.test/{n}"), &body(n, 5_000)).await;
    }
    store.purge("a.test/9", PurgeMode::Hard).await.unwrap();
    store.purge("a.test/8", PurgeMode::Hard).await.unwrap();
    close(store).await;
    let journal = dir.path().join("invalidations");
    let mut bytes = std::fs::read(&journal).unwrap();
    let middle = bytes.len() - 12;
    bytes[middle] ^= 0xff;
    std::fs::write(&journal, &bytes).unwrap();

    let store = open_again(dir.path()).await;
    for n in 0..3 {
        assert!(read(&store, &format!("a.test/{n}")).await.is_none());
    }
    assert_eq!(store.stats().objects_unverified, 3);
    // Stored from now on, and vouched for by a fresh journal.
    write(&store, "a.test/0", &body(0, 5_000)).await;
    let store = reopen(store, dir.path()).await;
    assert!(read(&store, "a.test/0").await.is_some());
    assert_eq!(store.stats().objects_unverified, 0);
    close(store).await;
}

/// A journal that went missing cannot vouch for anything; a store that never had one (written by a version
/// before it, which put purges in sled before acknowledging them) keeps its objects and starts one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_journal_empties_the_store_but_an_upgrade_keeps_it() {
    for upgrade in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path()).await;
        write(&store, "a.test/kept", &body(1, 5_000)).await;
        close(store).await;
        std::fs::remove_file(dir.path().join("invalidations")).unwrap();
        if upgrade {
            let db = sled::open(dir.path().join("meta")).unwrap();
            db.open_tree("state").unwrap().clear().unwrap();
            db.flush().unwrap();
        }

        let store = open_again(dir.path()).await;
        let found = read(&store, "a.test/kept").await;
        if upgrade {
            assert_eq!(
                found.unwrap().0,
                body(1, 5_000),
                "an upgraded store keeps its objects"
            );
            assert_eq!(store.stats().objects_unverified, 0);
        } else {
            assert!(found.is_none(), "a lost journal vouches for nothing");
            assert_eq!(store.stats().objects_unverified, 1);
        }
        close(store).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_metadata_is_moved_aside_and_the_store_starts_empty() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    write(&store, "a.test/0", &body(0, 5_000)).await;
    close(store).await;
    std::fs::write(dir.path().join("meta/conf"), b"\xff\xfe garbage").unwrap();

    let store = open_again(dir.path()).await;
    assert!(read(&store, "a.test/0").await.is_none());
    let problems = store.problems();
    assert!(
        problems.iter().any(|p| p.contains("moved aside")),
        "{problems:?}"
    );
    assert_eq!(store.stats().damaged_at_start, 1);
    let aside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("damaged-"))
        .collect();
    assert_eq!(aside.len(), 1);
    assert!(
        aside[0].path().join("meta/conf").exists(),
        "kept for inspection"
    );
    write(&store, "a.test/1", &body(1, 5_000)).await;
    assert!(read(&store, "a.test/1").await.is_some(), "and works");
    close(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_store_on_the_same_directory_is_refused_not_moved_aside() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    write(&store, "a.test/0", &body(0, 5_000)).await;
    let second = StoreBuilder::new(dir.path())
        .with_memory_bytes(8 * MIB)
        .with_disk_bytes(256 * MIB)
        .open(tokio::runtime::Handle::current())
        .await;
    assert!(matches!(
        second,
        Err(lacquer_storage::StoreError::Locked { .. })
    ));
    assert!(read(&store, "a.test/0").await.is_some());
    close(store).await;
}

/// The invalidation journal's bytes, as a crash of the machine could leave them (what was synced).
fn journal(dir: &Path) -> Vec<u8> {
    std::fs::read(dir.join("invalidations")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_checkpoint_leaves_the_older_revision_and_no_damage() {
    use lacquer_storage::Invalidation;

    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    for n in 0..4 {
        write(&store, &format!("a.test/{n}"), &body(n, 1000)).await;
    }
    store.invalidate(Vec::new(), Some(10)).await.unwrap();
    let synced = journal(dir.path());
    let batch = || {
        vec![
            Invalidation::Purge {
                primary: "a.test/0".into(),
                mode: PurgeMode::Hard,
            },
            Invalidation::Ban(BanExpr::parse("req.url ~ ^/1$").unwrap()),
        ]
    };
    store.invalidate_deferred(batch(), 11).await.unwrap();
    assert!(read(&store, "a.test/0").await.is_none());
    // sled flushes on its own (every 200 ms): the deferred batch reaches its files, the journal's sync
    // has not happened. What it wrote there must not claim the batch is durable.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let flushed = snapshot(dir.path());
    close(store).await;
    restore(&flushed);
    std::fs::write(dir.path().join("invalidations"), &synced).unwrap();

    let store = open_again(dir.path()).await;
    assert_eq!(
        store.cluster_revision().unwrap(),
        10,
        "the revision did not run ahead of the journal: revision 11 is replayed"
    );
    assert!(
        store.problems().is_empty(),
        "a journal behind sled's deferred writes is not damage: {:?}",
        store.problems()
    );
    assert_eq!(
        store.stats().objects_unverified,
        0,
        "nothing dropped wholesale"
    );
    assert_eq!(read(&store, "a.test/2").await.unwrap().0, body(2, 1000));
    // The replay: applying the batch again is harmless, and covers what it covered.
    store.invalidate_deferred(batch(), 11).await.unwrap();
    assert!(read(&store, "a.test/0").await.is_none(), "purged again");
    assert!(store.lookup("a.test/1").unwrap().is_none(), "banned again");
    assert_eq!(store.checkpoint().await.unwrap(), Some(11));
    assert_eq!(store.cluster_revision().unwrap(), 11);
    close(store).await;

    let store = open_again(dir.path()).await;
    assert_eq!(store.cluster_revision().unwrap(), 11);
    assert!(read(&store, "a.test/0").await.is_none());
    assert!(store.lookup("a.test/1").unwrap().is_none());
    assert_eq!(read(&store, "a.test/3").await.unwrap().0, body(3, 1000));
    close(store).await;
}
