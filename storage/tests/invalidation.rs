//! Bans, purges and surrogate keys against a real store: exact effects, persistence across a reopen, the
//! lurker finishing its work, and fetches in flight that an invalidation covers.

mod common;

use std::time::Duration;

use common::*;
use lacquer_storage::{BanExpr, ObjectMeta, PurgeMode, Store};

async fn write_with(store: &Store, key: &str, variant: &[(String, String)], meta: ObjectMeta) {
    let mut w = store.writer(key, variant, store.mark()).unwrap();
    w.push(key.as_bytes()).await.unwrap();
    w.finish(
        key.to_owned(),
        ObjectMeta {
            variant: variant.to_vec(),
            ..meta
        },
    )
    .await
    .unwrap();
}

fn tagged(tags: &[&str]) -> ObjectMeta {
    ObjectMeta {
        tags: tags.iter().map(|t| t.to_string()).collect(),
        ..meta()
    }
}

fn present(store: &Store, key: &str) -> bool {
    store.lookup(key).unwrap().is_some()
}

fn ban(text: &str) -> BanExpr {
    BanExpr::parse(text).unwrap()
}

async fn lurker_done(store: &Store) {
    for _ in 0..200 {
        if store.stats().bans_pending == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the lurker never finished: {:?}", store.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_removes_exactly_the_matching_objects_and_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    for key in [
        "a.test/news/1",
        "a.test/news/2",
        "a.test/sport/1",
        "b.test/news/1",
    ] {
        write(&store, key, key.as_bytes()).await;
    }
    store
        .add_ban(ban("req.http.host == a.test && req.url ~ ^/news/"))
        .await
        .unwrap();
    assert!(
        !present(&store, "a.test/news/1"),
        "banned at the very next lookup"
    );
    assert!(present(&store, "a.test/sport/1"));
    assert!(present(&store, "b.test/news/1"));
    // Not looked up since the ban, and tested after the reopen (by lookup or lurker, whichever is first).
    let store = reopen(store, dir.path()).await;
    assert!(!present(&store, "a.test/news/2"));
    assert!(present(&store, "a.test/sport/1"));
    assert!(present(&store, "b.test/news/1"));
    assert_eq!(store.bans().len(), 1);
    assert_eq!(
        store.bans()[0].expression,
        r#"req.http.host == "a.test" && req.url ~ "^/news/""#
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_stored_after_a_ban_are_not_affected_by_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    write(&store, "h/x", b"old").await;
    store.add_ban(ban("req.url == /x")).await.unwrap();
    write(&store, "h/x", b"new").await;
    assert_eq!(read(&store, "h/x").await.unwrap().0, b"new");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lurker_applies_bans_without_lookups_and_the_list_stays_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    for i in 0..40 {
        write(&store, &format!("h/obj/{i}"), b"x").await;
    }
    store
        .add_ban(ban("req.url ~ ^/obj/[0-9]*[02468]$"))
        .await
        .unwrap();
    lurker_done(&store).await;
    let stats = store.stats();
    assert_eq!(stats.objects_lurked, 20, "{stats:?}");
    assert_eq!(stats.objects, 20);
    let info = &store.bans()[0];
    assert!(info.completed);
    assert_eq!((info.tested, info.removed), (40, 20));

    for i in 0..500 {
        store
            .add_ban(ban(&format!("req.url == /nothing/{i}")))
            .await
            .unwrap();
    }
    lurker_done(&store).await;
    let bans = store.bans();
    assert!(bans.len() <= 100, "{} bans listed", bans.len());
    assert!(bans.iter().all(|b| b.completed));
    assert_eq!(store.stats().objects, 20, "no other object touched");
    let store = reopen(store, dir.path()).await;
    assert!(store.bans().len() <= 100);
    assert!(present(&store, "h/obj/1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_bans_collapse_into_the_newest() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    let first = store.add_ban(ban("req.url ~ ^/a")).await.unwrap();
    let second = store.add_ban(ban("req.url   ~   '^/a'")).await.unwrap();
    assert!(second.id > first.id);
    let ids: Vec<u64> = store.bans().iter().map(|b| b.id).collect();
    assert_eq!(ids, vec![second.id]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_that_started_before_a_ban_or_purge_does_not_publish_what_they_cover() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    let mut w = store.writer("h/banned", &[], store.mark()).unwrap();
    w.push(b"body").await.unwrap();
    store.add_ban(ban("req.url == /banned")).await.unwrap();
    // The lurker completes the ban without seeing the body still being fetched; publishing still tests it.
    lurker_done(&store).await;
    w.finish("h/banned".into(), meta()).await.unwrap();
    assert!(!present(&store, "h/banned"));

    let mut w = store.writer("h/purged", &[], store.mark()).unwrap();
    w.push(b"body").await.unwrap();
    store.purge("h/purged", PurgeMode::Hard).await.unwrap();
    w.finish("h/purged".into(), meta()).await.unwrap();
    assert!(!present(&store, "h/purged"));

    let mut w = store.writer("h/tagged", &[], store.mark()).unwrap();
    w.push(b"body").await.unwrap();
    store
        .purge_tags(&["t".into()], PurgeMode::Hard)
        .await
        .unwrap();
    w.finish("h/tagged".into(), tagged(&["t"])).await.unwrap();
    assert!(!present(&store, "h/tagged"));

    let mut w = store.writer("h/other", &[], store.mark()).unwrap();
    w.push(b"body").await.unwrap();
    store.purge("h/unrelated", PurgeMode::Hard).await.unwrap();
    w.finish("h/other".into(), tagged(&["u"])).await.unwrap();
    assert!(
        present(&store, "h/other"),
        "an unrelated purge cancels nothing"
    );
    assert_eq!(store.stats().publishes_cancelled, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hard_purge_removes_every_variant_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    let gzip = vec![("accept-encoding".to_string(), "gzip".to_string())];
    let br = vec![("accept-encoding".to_string(), "br".to_string())];
    write_with(&store, "h/page", &gzip, meta()).await;
    write_with(&store, "h/page", &br, meta()).await;
    write(&store, "h/other", b"x").await;
    assert_eq!(store.lookup("h/page").unwrap().unwrap().variants.len(), 2);
    assert_eq!(store.purge("h/page", PurgeMode::Hard).await.unwrap(), 2);
    assert!(!present(&store, "h/page"));
    let store = reopen(store, dir.path()).await;
    assert!(!present(&store, "h/page"));
    assert!(present(&store, "h/other"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soft_purge_expires_but_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    let graced = ObjectMeta {
        grace_ms: 60_000,
        ..meta()
    };
    write_with(&store, "h/soft", &[], graced).await;
    assert_eq!(store.purge("h/soft", PurgeMode::Soft).await.unwrap(), 1);
    let set = store.lookup("h/soft").unwrap().expect("still stored");
    let m = &set.variants[0];
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(m.remaining_ttl_ms(now) <= 0, "stale now");
    assert_eq!(m.grace_ms, 60_000, "grace kept");
    assert_eq!(store.stats().objects_soft_purged, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tag_purges_reach_across_hosts_and_the_index_follows_removals() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    write_with(&store, "a.test/p/1", &[], tagged(&["product-1", "list"])).await;
    write_with(&store, "b.test/p/1", &[], tagged(&["product-1"])).await;
    write_with(&store, "a.test/p/2", &[], tagged(&["product-2", "list"])).await;
    write(&store, "a.test/untagged", b"x").await;

    let n = store
        .purge_tags(&["product-1".into()], PurgeMode::Hard)
        .await
        .unwrap();
    assert_eq!(n, 2);
    assert!(!present(&store, "a.test/p/1"));
    assert!(!present(&store, "b.test/p/1"));
    assert!(present(&store, "a.test/p/2"));
    assert!(present(&store, "a.test/untagged"));

    // The removed object's other tag no longer points at it.
    assert_eq!(
        store
            .purge_tags(&["list".into()], PurgeMode::Soft)
            .await
            .unwrap(),
        1
    );
    assert!(present(&store, "a.test/p/2"), "soft purge keeps it");
    // Removed by URL: its tags go with it.
    store.purge("a.test/p/2", PurgeMode::Hard).await.unwrap();
    assert_eq!(
        store
            .purge_tags(&["list".into(), "product-2".into()], PurgeMode::Hard)
            .await
            .unwrap(),
        0
    );

    // A replaced body carries the new response's tags only.
    write_with(&store, "a.test/p/3", &[], tagged(&["old"])).await;
    write_with(&store, "a.test/p/3", &[], tagged(&["new"])).await;
    assert_eq!(
        store
            .purge_tags(&["old".into()], PurgeMode::Hard)
            .await
            .unwrap(),
        0
    );
    let store = reopen(store, dir.path()).await;
    assert_eq!(
        store
            .purge_tags(&["new".into()], PurgeMode::Hard)
            .await
            .unwrap(),
        1
    );
}

/// sled's `flush_async` deadlocks once enough callers overlap (its IO pool parks waiting for a write queued
/// on itself); a burst of concurrent purges and bans must all complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_concurrent_purges_and_bans_completes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    for i in 0..50 {
        write(&store, &format!("h/p/{i}"), b"x").await;
    }
    let mut tasks = Vec::new();
    for i in 0..300 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            if i % 10 == 0 {
                store.add_ban(ban(&format!("req.url == /b/{i}"))).await?;
            }
            store
                .purge(&format!("h/p/{}", i % 50), PurgeMode::Hard)
                .await
        }));
    }
    let all = async {
        for t in tasks {
            t.await.unwrap().unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("every purge and ban completes");
    assert_eq!(store.stats().objects, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_applies_in_order_records_the_cluster_revision_and_survives_a_reopen() {
    use lacquer_storage::{Invalidated, Invalidation};

    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    write(&store, "h/a", b"a").await;
    write(&store, "h/b", b"b").await;
    write_with(&store, "h/t", &[], tagged(&["shelf"])).await;
    write(&store, "h/kept", b"k").await;
    let batch = vec![
        Invalidation::Ban(ban("req.url == /a")),
        Invalidation::Purge {
            primary: "h/b".into(),
            mode: PurgeMode::Hard,
        },
        Invalidation::PurgeTags {
            tags: vec!["shelf".into()],
            mode: PurgeMode::Hard,
        },
        // The same ban again: the newer covers what the older did, and only it stays listed.
        Invalidation::Ban(ban("req.url == /a")),
    ];
    let done = store.invalidate(batch, Some(42)).await.unwrap();
    let [Invalidated::Ban(first), Invalidated::Purged(1), Invalidated::Purged(1), Invalidated::Ban(second)] =
        &done[..]
    else {
        panic!("{done:?}")
    };
    assert!(first.id < second.id, "ids follow the batch's order");
    assert_eq!(store.bans().len(), 1);
    assert_eq!(store.bans()[0].id, second.id);
    assert_eq!(store.cluster_revision().unwrap(), 42);
    assert!(!present(&store, "h/a"));
    assert!(!present(&store, "h/b"));
    assert!(!present(&store, "h/t"));
    assert!(present(&store, "h/kept"));

    let store = reopen(store, dir.path()).await;
    assert_eq!(store.cluster_revision().unwrap(), 42);
    assert_eq!(store.bans().len(), 1);
    for key in ["h/a", "h/b", "h/t"] {
        assert!(!present(&store, key), "{key}");
    }
    assert!(present(&store, "h/kept"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_batch_is_in_effect_at_once_and_moves_the_revision_only_at_the_checkpoint() {
    use lacquer_storage::Invalidation;

    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    for key in ["h/a", "h/b", "h/kept"] {
        write(&store, key, key.as_bytes()).await;
    }
    store.invalidate(Vec::new(), Some(10)).await.unwrap();
    assert_eq!(store.checkpoint().await.unwrap(), None, "nothing deferred");
    let batch = vec![
        Invalidation::Purge {
            primary: "h/a".into(),
            mode: PurgeMode::Hard,
        },
        Invalidation::Ban(ban("req.url == /b")),
    ];
    store.invalidate_deferred(batch, 11).await.unwrap();
    assert!(!present(&store, "h/a"), "purged before the checkpoint");
    assert!(!present(&store, "h/b"), "banned before the checkpoint");
    assert_eq!(store.bans().len(), 1, "the ban is listed at once");
    assert_eq!(
        store.cluster_revision().unwrap(),
        10,
        "not durable yet: a restart must replay revision 11"
    );
    store.invalidate_deferred(Vec::new(), 12).await.unwrap();
    assert_eq!(store.cluster_revision().unwrap(), 10);
    assert_eq!(store.checkpoint().await.unwrap(), Some(12));
    assert_eq!(store.cluster_revision().unwrap(), 12);
    assert_eq!(store.checkpoint().await.unwrap(), None, "nothing new");

    store
        .invalidate_deferred(
            vec![Invalidation::Purge {
                primary: "h/kept".into(),
                mode: PurgeMode::Soft,
            }],
            13,
        )
        .await
        .unwrap();
    // A clean stop makes what was applied durable: the next start resumes after it.
    let store = reopen(store, dir.path()).await;
    assert_eq!(store.cluster_revision().unwrap(), 13);
    assert!(!present(&store, "h/a"));
    assert!(!present(&store, "h/b"));
    assert!(store.problems().is_empty(), "{:?}", store.problems());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_revision_replaces_a_deferred_one() {
    use lacquer_storage::Invalidation;

    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path()).await;
    write(&store, "h/a", b"a").await;
    store.invalidate_deferred(Vec::new(), 50).await.unwrap();
    // A rewound etcd: everything banned, the log taken as applied up to a revision below the deferred one.
    store
        .invalidate(vec![Invalidation::Ban(ban("req.url ~ ."))], Some(20))
        .await
        .unwrap();
    assert_eq!(store.cluster_revision().unwrap(), 20);
    assert_eq!(
        store.checkpoint().await.unwrap(),
        None,
        "the deferred revision must not come back over the one recorded after it"
    );
    assert_eq!(store.cluster_revision().unwrap(), 20);
}
