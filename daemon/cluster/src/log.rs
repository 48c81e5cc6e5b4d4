//! The invalidation log: appending invalidations, written together when they arrive together, and
//! following the log from the revision this node applied last, in revision order. Applying does not wait
//! for the local journal sync or the metadata flush (etcd holds every entry durably); a checkpoint makes
//! them durable in the background and only then persists the revision a restart resumes from.

use std::{future::Future, sync::atomic::Ordering::Relaxed, time::Duration};

use etcd_client::{EventType, WatchOptions};
use futures_util::FutureExt;
use lacquer_proxy::cluster::{self, Applied, InvalidateError, Invalidation};
use tokio::sync::{mpsc, oneshot};

use crate::{
    entry::{self, Entry, Op},
    Cluster, Inner,
};

/// How long etcd may take to take an entry before the invalidation is refused.
const PUT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long this node may take to apply its own entry before the invalidation is refused (it stays in the
/// log: every node applies it, this one included, once its watch delivers it).
const APPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a following node asks etcd to confirm where the log stands, so that silence (a partition)
/// shows as lag.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// Checkpoints of the store while the log is applied: at most one per this, so a node replays at most
/// about this much of the log after a crash (the first after a quiet spell runs at once).
const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);
/// Pause before following again after the watch broke.
const RETRY_AFTER: Duration = Duration::from_millis(500);
/// Watch responses applied together at most (each is bounded by etcd's response size).
const GATHER: usize = 64;
/// Entries written in one revision at most: a node catching up applies a revision at once.
const MAX_BATCH: usize = 256;
/// Bytes of entries written in one revision at most, well under etcd's request limit (1.5 MiB by
/// default); an entry longer than this alone still goes, alone.
const MAX_BATCH_BYTES: usize = 256 << 10;
/// Entries waiting for the writer at most; past it, submitters wait for room (up to [`PUT_TIMEOUT`]).
pub(crate) const QUEUE: usize = 4 * MAX_BATCH;

/// An entry waiting for the writer, and where to tell its sender the revision it went in (or why not).
pub(crate) struct Queued {
    json: Vec<u8>,
    written: oneshot::Sender<Result<u64, String>>,
}

/// What this node waits for to acknowledge an invalidation: its entry applied here, or why not.
pub(crate) type Waiter = oneshot::Sender<Result<Applied, String>>;

/// An invalidation of this node waiting to be applied: forgotten when its sender stops waiting.
struct Waiting<'a> {
    inner: &'a Inner,
    id: String,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.inner
            .pending
            .lock()
            .expect("pending lock")
            .remove(&self.id);
    }
}

/// Appends `inv` to the log and waits until this node has applied it.
pub(crate) async fn submit(
    cluster: &Cluster,
    inv: Invalidation,
) -> Result<Applied, InvalidateError> {
    let inner = &cluster.inner;
    let id = format!(
        "{}-{}-{}",
        inner.settings.node,
        inner.incarnation,
        inner.next_entry.fetch_add(1, Relaxed)
    );
    let entry = Entry {
        id: id.clone(),
        from: inner.settings.node.clone(),
        op: Op::of(&inv),
    };
    let json = serde_json::to_vec(&entry).expect("an entry serialises");
    let (tx, applied) = oneshot::channel();
    inner
        .pending
        .lock()
        .expect("pending lock")
        .insert(id.clone(), tx);
    let _waiting = Waiting { inner, id };
    let (written, revision) = oneshot::channel();
    let queued = Queued { json, written };
    if tokio::time::timeout(PUT_TIMEOUT, inner.outbox.send(queued))
        .await
        .is_err()
    {
        return Err(InvalidateError::Cluster(format!(
            "{QUEUE} invalidations already wait for etcd and none went in {PUT_TIMEOUT:?}: not taken, retry"
        )));
    }
    // The writer answers every entry it takes, each put bounded by PUT_TIMEOUT.
    let revision = match revision.await {
        Ok(Ok(revision)) => revision,
        Ok(Err(e)) => return Err(InvalidateError::Cluster(e)),
        Err(_) => {
            return Err(InvalidateError::Cluster(
                "the writer of the invalidation log stopped".into(),
            ))
        }
    };
    inner.counters.invalidations_sent.fetch_add(1, Relaxed);
    match tokio::time::timeout(APPLY_TIMEOUT, applied).await {
        Ok(Ok(Ok(applied))) => Ok(applied),
        Ok(Ok(Err(e))) => Err(InvalidateError::Cluster(format!(
            "appended at revision {revision} but applying it here failed: {e}; \
             every node applies it once it can"
        ))),
        _ => Err(InvalidateError::Cluster(format!(
            "appended at revision {revision} but not applied on this node within {APPLY_TIMEOUT:?}; \
             every node applies it once it sees it"
        ))),
    }
}

/// Writes what [`submit`] queues to the log for as long as the daemon runs.
pub(crate) async fn write(cluster: Cluster, mut queue: mpsc::Receiver<Queued>) {
    let key = cluster.inner.settings.log_key();
    batches(&mut queue, |json| put(&cluster, &key, json)).await
}

/// Group commit: takes every entry waiting (up to [`MAX_BATCH`] and [`MAX_BATCH_BYTES`]) and `put`s them
/// as one value, so one etcd commit carries them all, then tells each sender the revision or the error.
/// Nothing waits for company: an entry arriving at an idle writer goes at once, and those arriving while a
/// put is in flight go together in the next.
async fn batches<F, Fut>(queue: &mut mpsc::Receiver<Queued>, mut put: F)
where
    F: FnMut(Vec<u8>) -> Fut,
    Fut: Future<Output = Result<u64, String>>,
{
    let mut held = None;
    loop {
        let first = match held.take() {
            Some(first) => first,
            None => match queue.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        let mut bytes = first.json.len();
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            let Ok(next) = queue.try_recv() else { break };
            bytes += next.json.len() + 1;
            if bytes > MAX_BATCH_BYTES {
                held = Some(next);
                break;
            }
            batch.push(next);
        }
        // A sender that stopped waiting (its client went away, or it timed out queueing) was told nothing:
        // its invalidation is not written.
        batch.retain(|q| !q.written.is_closed());
        if batch.is_empty() {
            continue;
        }
        let jsons: Vec<&[u8]> = batch.iter().map(|q| q.json.as_slice()).collect();
        let result = put(entry::batch(&jsons))
            .await
            .map_err(|e| match batch.len() {
                1 => e,
                n => format!("{e} (the same for the {n} invalidations written together)"),
            });
        for q in batch {
            let _ = q.written.send(result.clone());
        }
    }
}

/// Puts `json` (one revision's entries) to the log under the cluster's signature; returns its revision.
async fn put(cluster: &Cluster, key: &str, json: Vec<u8>) -> Result<u64, String> {
    let inner = &cluster.inner;
    let value = inner.settings.secret.sign_entry(key, &json);
    let attempt = || {
        let mut client = inner.client.clone();
        let (key, value) = (key.to_owned(), value.clone());
        async move { tokio::time::timeout(PUT_TIMEOUT, client.put(key, value, None)).await }
    };
    let mut result = attempt().await;
    if inner.settings.etcd_user.is_some() && matches!(result, Ok(Err(_))) {
        // etcd's tokens expire: one refusal is worth a new token and a second try.
        if cluster.authenticate().await.is_ok() {
            result = attempt().await;
        }
    }
    match result {
        Ok(Ok(resp)) => Ok(resp.header().map_or(0, |h| h.revision() as u64)),
        Ok(Err(e)) => Err(format!(
            "etcd did not take the invalidation: {}",
            crate::describe(&e)
        )),
        Err(_) => Err(format!("etcd did not answer within {PUT_TIMEOUT:?}")),
    }
}

/// Follows the log for as long as the daemon runs.
pub(crate) async fn follow(cluster: Cluster) {
    let mut first = true;
    loop {
        match follow_once(&cluster).await {
            Ok(()) => continue,
            Err(e) => {
                cluster.inner.counters.watch_breaks.fetch_add(1, Relaxed);
                // Logged when the log is lost, not at every retry while it stays lost.
                if cluster.mark_disconnected() || first {
                    tracing::warn!(
                        error = %cluster.explain(e),
                        "cluster: lost the invalidation log; retrying"
                    );
                }
                first = false;
            }
        }
        tokio::time::sleep(RETRY_AFTER).await;
    }
}

/// One watch of the log, from the revision after the last applied: first the backlog (etcd replays it),
/// then new entries as they come. Returns `Ok` when the history had been compacted and the watch must
/// start again from where etcd still has it; an error when the watch broke.
async fn follow_once(cluster: &Cluster) -> Result<(), String> {
    let inner = &cluster.inner;
    cluster.authenticate().await?;
    let key = inner.settings.log_key();
    let mut client = inner.client.clone();
    let head = tokio::time::timeout(PUT_TIMEOUT, client.get(key.clone(), None))
        .await
        .map_err(|_| "etcd did not answer".to_string())?
        .map_err(|e| crate::describe(&e))?;
    // The log as it stands now: applied up to here, this node is current.
    let target = head.kvs().first().map_or(0, |kv| kv.mod_revision() as u64);
    let present = head.header().map_or(0, |h| h.revision() as u64);
    if present < *inner.applied.borrow() {
        rewound(cluster, present).await?;
        return Ok(());
    }
    inner.log_head.fetch_max(target, Relaxed);
    inner.seen.fetch_max(present, Relaxed);
    let from = *inner.applied.borrow() + 1;
    let options = WatchOptions::new().with_start_revision(from as i64);
    let mut stream = client
        .watch(key, Some(options))
        .await
        .map_err(|e| e.to_string())?;
    loop {
        // A second of silence: ask where the log stands, so that a watch stuck behind a partition shows
        // as lag instead of passing for a quiet log.
        let Ok(message) = tokio::time::timeout(PROGRESS_EVERY, stream.message()).await else {
            stream.request_progress().await.map_err(|e| e.to_string())?;
            continue;
        };
        // What arrived while the last batch was being applied goes with this one: one store batch for all
        // of it, so that applying keeps up with every node's writes.
        let mut messages = vec![message];
        while messages.len() < GATHER {
            let Some(more) = stream.message().now_or_never() else {
                break;
            };
            messages.push(more);
        }
        let mut entries: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut seen = 0;
        let mut stop = None;
        for message in messages {
            let resp = match message.map_err(|e| e.to_string()) {
                Ok(Some(resp)) => resp,
                Ok(None) => {
                    stop = Some(Err("the watch ended".to_string()));
                    break;
                }
                Err(e) => {
                    stop = Some(Err(e));
                    break;
                }
            };
            if resp.compact_revision() > 0 {
                stop = Some(Ok(resp.compact_revision() as u64));
                break;
            }
            if resp.canceled() {
                stop = Some(Err(format!(
                    "the watch was cancelled: {}",
                    resp.cancel_reason()
                )));
                break;
            }
            entries.extend(
                resp.events()
                    .iter()
                    .filter(|e| e.event_type() == EventType::Put)
                    .filter_map(|e| e.kv())
                    .map(|kv| (kv.mod_revision() as u64, kv.value().to_vec())),
            );
            if let Some(h) = resp.header() {
                seen = seen.max(h.revision() as u64);
            }
        }
        if let Some((revision, _)) = entries.last() {
            inner.log_head.fetch_max(*revision, Relaxed);
        }
        apply(cluster, entries).await?;
        inner.seen.fetch_max(seen, Relaxed);
        match stop {
            Some(Ok(compact_revision)) => {
                compacted(cluster, compact_revision).await?;
                return Ok(());
            }
            Some(Err(e)) => return Err(e),
            None => {}
        }
        if *inner.applied.borrow() >= target {
            cluster.mark_current();
        }
    }
}

/// Applies the entries of `revisions` in order, skipping revisions applied already, as one deferred batch
/// of the store (in effect at once; durable, with the newest revision, at the next [`checkpoints`] run),
/// then answers this node's waiters among them: with what applying did, or with why it failed.
async fn apply(cluster: &Cluster, revisions: Vec<(u64, Vec<u8>)>) -> Result<(), String> {
    let inner = &cluster.inner;
    let key = inner.settings.log_key();
    let applied = *inner.applied.borrow();
    let mut newest = applied;
    let mut batch = Vec::new();
    let mut ids = Vec::new();
    for (revision, value) in revisions {
        if revision <= newest {
            continue;
        }
        newest = revision;
        let Some(json) = inner.settings.secret.verify_entry(&key, &value) else {
            // Whoever wrote it can write to etcd but does not hold the cluster secret: it is no
            // member's, and taking it (even as a ban of everything) would hand the cache to them.
            inner.counters.rejected_entries.fetch_add(1, Relaxed);
            tracing::warn!(
                revision,
                entry = %String::from_utf8_lossy(&value),
                "cluster: ignored an invalidation not signed with the cluster secret"
            );
            continue;
        };
        for entry in entry::read(json) {
            let readable = entry.and_then(|e| match e.op.invalidation() {
                Ok(inv) => Ok((Some(e.id), inv)),
                Err(_) => Err(serde_json::to_string(&e).expect("an entry serialises")),
            });
            let (id, inv) = readable.unwrap_or_else(|text| {
                // A member sent it, so it means something: a newer version's invalidation this node
                // cannot tell the extent of.
                inner.counters.unreadable_entries.fetch_add(1, Relaxed);
                tracing::warn!(
                    revision,
                    entry = %text,
                    "cluster: an invalidation this node cannot read; banning every object stored before it"
                );
                (None, entry::everything())
            });
            ids.push(id);
            batch.push(inv);
        }
    }
    if newest == applied {
        return Ok(());
    }
    let count = batch.len() as u64;
    let outcome = cluster::apply_deferred(&inner.store, batch, newest).await;
    let outcome = outcome.map_err(|e| format!("revisions {}..={newest}: {e}", applied + 1));
    let mut pending = inner.pending.lock().expect("pending lock");
    match outcome {
        Ok(done) => {
            inner.applied.send_replace(newest);
            inner
                .counters
                .invalidations_applied
                .fetch_add(count, Relaxed);
            for (id, applied) in ids.into_iter().zip(done) {
                if let Some(tx) = id.and_then(|id| pending.remove(&id)) {
                    let _ = tx.send(Ok(applied));
                }
            }
            Ok(())
        }
        Err(e) => {
            for id in ids.into_iter().flatten() {
                if let Some(tx) = pending.remove(&id) {
                    let _ = tx.send(Err(e.clone()));
                }
            }
            Err(e)
        }
    }
}

/// Makes what [`apply`] applied durable, for as long as the daemon runs: a store checkpoint after each
/// revision applied, at most one per [`CHECKPOINT_EVERY`]. A failed one leaves the persisted revision where
/// it was (a crash then replays more) and is tried again at the next revision.
pub(crate) async fn checkpoints(cluster: Cluster) {
    let mut applied = cluster.inner.applied.subscribe();
    while applied.changed().await.is_ok() {
        if let Err(e) = cluster.inner.store.checkpoint().await {
            tracing::warn!(error = %e, "cluster: making the applied invalidations durable failed");
        }
        tokio::time::sleep(CHECKPOINT_EVERY).await;
    }
}

/// etcd is behind the last revision applied here: it was restored from a backup or replaced, and what was
/// written after the backup is gone from it. As after a compaction, the log is followed from etcd's present.
async fn rewound(cluster: &Cluster, present: u64) -> Result<(), String> {
    let inner = &cluster.inner;
    tracing::warn!(
        applied_revision = *inner.applied.borrow(),
        etcd_revision = present,
        "cluster: etcd is behind the last revision applied here (restored or replaced); \
         banning every object stored before now"
    );
    start_over(cluster, present).await?;
    inner.log_head.store(present, Relaxed);
    inner.seen.store(present, Relaxed);
    Ok(())
}

/// etcd no longer has the history after the last revision applied here: the log is followed again from
/// the oldest revision etcd still has.
async fn compacted(cluster: &Cluster, compact_revision: u64) -> Result<(), String> {
    let applied = *cluster.inner.applied.borrow();
    tracing::warn!(
        applied_revision = applied,
        compact_revision,
        "cluster: the invalidation log was compacted past the last revision applied here; \
         banning every object stored before now"
    );
    start_over(cluster, compact_revision.saturating_sub(1).max(applied)).await
}

/// History this node cannot replay: everything stored before now is banned, since an invalidation it never
/// saw may cover any of it, and the log is taken as applied up to `resume`. Durable before it returns: no
/// log could apply that ban again after a crash (a rewound etcd's history from `resume` on is not the one
/// this node applied).
async fn start_over(cluster: &Cluster, resume: u64) -> Result<(), String> {
    let inner = &cluster.inner;
    inner.counters.compactions.fetch_add(1, Relaxed);
    cluster::apply_all(&inner.store, vec![entry::everything()], resume)
        .await
        .map_err(|e| format!("banning everything stored: {e}"))?;
    inner.applied.send_replace(resume);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::sync::Semaphore;

    use super::*;

    /// A stand-in for etcd: records the entries of each put (by number), and holds each put until the test
    /// lets it through; the n-th put fails when `fail(n)`.
    #[derive(Clone)]
    struct Etcd {
        puts: Arc<Mutex<Vec<Vec<u64>>>>,
        gate: Arc<Semaphore>,
        fail: fn(usize) -> bool,
    }

    impl Etcd {
        fn new(fail: fn(usize) -> bool) -> Self {
            Self {
                puts: Arc::default(),
                gate: Arc::new(Semaphore::new(0)),
                fail,
            }
        }

        fn start(&self) -> mpsc::Sender<Queued> {
            let (tx, mut rx) = mpsc::channel(QUEUE);
            let etcd = self.clone();
            tokio::spawn(async move {
                batches(&mut rx, |value| {
                    let etcd = etcd.clone();
                    async move {
                        let numbers = numbers(&value);
                        let n = {
                            let mut puts = etcd.puts.lock().unwrap();
                            puts.push(numbers);
                            puts.len()
                        };
                        etcd.gate.acquire().await.unwrap().forget();
                        match (etcd.fail)(n) {
                            true => Err("etcdserver: no leader".to_string()),
                            false => Ok(100 + n as u64),
                        }
                    }
                })
                .await
            });
            tx
        }

        async fn wait_for_puts(&self, n: usize) {
            while self.puts.lock().unwrap().len() < n {
                tokio::task::yield_now().await;
            }
        }

        fn puts(&self) -> Vec<Vec<u64>> {
            self.puts.lock().unwrap().clone()
        }
    }

    /// The entry numbers in a value: one entry `{"n":…}`, or an array of them.
    fn numbers(value: &[u8]) -> Vec<u64> {
        let value: serde_json::Value = serde_json::from_slice(value).unwrap();
        let number = |v: &serde_json::Value| v["n"].as_u64().unwrap();
        match value.as_array() {
            Some(items) => items.iter().map(number).collect(),
            None => vec![number(&value)],
        }
    }

    async fn send(
        queue: &mpsc::Sender<Queued>,
        n: u64,
        pad: usize,
    ) -> oneshot::Receiver<Result<u64, String>> {
        let json = format!(r#"{{"n":{n},"pad":"{}"}}"#, "x".repeat(pad)).into_bytes();
        let (written, revision) = oneshot::channel();
        queue.send(Queued { json, written }).await.ok().unwrap();
        revision
    }

    #[tokio::test]
    async fn an_idle_writer_puts_at_once_and_what_queues_meanwhile_goes_in_one_put_in_order() {
        let etcd = Etcd::new(|_| false);
        let queue = etcd.start();
        let first = send(&queue, 0, 0).await;
        etcd.wait_for_puts(1).await;
        let mut rest = Vec::new();
        for n in 1..100 {
            rest.push(send(&queue, n, 0).await);
        }
        etcd.gate.add_permits(2);
        assert_eq!(first.await.unwrap(), Ok(101));
        for revision in rest {
            assert_eq!(revision.await.unwrap(), Ok(102));
        }
        assert_eq!(etcd.puts(), vec![vec![0], (1..100).collect()]);
    }

    #[tokio::test]
    async fn a_failed_put_fails_every_entry_in_it_and_only_those() {
        let etcd = Etcd::new(|n| n == 2);
        let queue = etcd.start();
        let first = send(&queue, 0, 0).await;
        etcd.wait_for_puts(1).await;
        let mut failing = Vec::new();
        for n in 1..=5 {
            failing.push(send(&queue, n, 0).await);
        }
        etcd.gate.add_permits(2);
        assert_eq!(first.await.unwrap(), Ok(101));
        for revision in failing {
            let error = revision.await.unwrap().unwrap_err();
            assert!(
                error.contains("no leader")
                    && error.contains("the 5 invalidations written together"),
                "{error}"
            );
        }
        let after = send(&queue, 6, 0).await;
        etcd.gate.add_permits(1);
        assert_eq!(after.await.unwrap(), Ok(103), "the writer carries on");
    }

    #[tokio::test]
    async fn a_put_holds_at_most_its_count_and_its_bytes() {
        let etcd = Etcd::new(|_| false);
        let queue = etcd.start();
        let first = send(&queue, 0, 0).await;
        etcd.wait_for_puts(1).await;
        let mut waiting = vec![first];
        for n in 1..=300 {
            waiting.push(send(&queue, n, 0).await);
        }
        etcd.gate.add_permits(3);
        for revision in waiting {
            revision.await.unwrap().unwrap();
        }
        let sizes: Vec<usize> = etcd.puts().iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![1, MAX_BATCH, 300 - MAX_BATCH]);

        let etcd = Etcd::new(|_| false);
        let queue = etcd.start();
        let first = send(&queue, 0, 0).await;
        etcd.wait_for_puts(1).await;
        // Three entries of 100 KiB fit twice under the byte cap; one longer than the cap goes alone.
        let mut waiting = vec![first];
        for (n, pad) in [
            (1, 100 << 10),
            (2, 100 << 10),
            (3, 100 << 10),
            (4, 300 << 10),
            (5, 0),
        ] {
            waiting.push(send(&queue, n, pad).await);
        }
        etcd.gate.add_permits(5);
        for revision in waiting {
            revision.await.unwrap().unwrap();
        }
        assert_eq!(
            etcd.puts(),
            vec![vec![0], vec![1, 2], vec![3], vec![4], vec![5]]
        );
    }

    #[tokio::test]
    async fn an_entry_whose_sender_stopped_waiting_is_not_written() {
        let etcd = Etcd::new(|_| false);
        let queue = etcd.start();
        let first = send(&queue, 0, 0).await;
        etcd.wait_for_puts(1).await;
        drop(send(&queue, 1, 0).await);
        let kept = send(&queue, 2, 0).await;
        etcd.gate.add_permits(2);
        first.await.unwrap().unwrap();
        kept.await.unwrap().unwrap();
        assert_eq!(etcd.puts(), vec![vec![0], vec![2]]);
    }
}
