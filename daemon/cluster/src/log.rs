//! The invalidation log: appending an invalidation, and following the log from the revision this node
//! applied last, in revision order, persisting each step.

use std::{sync::atomic::Ordering::Relaxed, time::Duration};

use etcd_client::{EventType, WatchOptions};
use lacquer_proxy::cluster::{self, Applied, InvalidateError, Invalidation};
use tokio::sync::oneshot;

use crate::{
    entry::{self, Entry, Op},
    Cluster,
};

/// How long etcd may take to take an entry before the invalidation is refused.
const PUT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long this node may take to apply its own entry before the invalidation is refused (it stays in the
/// log: every node applies it, this one included, once its watch delivers it).
const APPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a following node asks etcd to confirm where the log stands, so that silence (a partition)
/// shows as lag.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// Pause before following again after the watch broke.
const RETRY_AFTER: Duration = Duration::from_millis(500);

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
    let key = inner.settings.log_key();
    let json = serde_json::to_vec(&entry).expect("an entry serialises");
    let value = inner.settings.secret.sign_entry(&key, &json);
    let (tx, rx) = oneshot::channel();
    inner
        .pending
        .lock()
        .expect("pending lock")
        .insert(id.clone(), tx);
    let forget = || {
        inner.pending.lock().expect("pending lock").remove(&id);
    };
    let put = || {
        let mut client = inner.client.clone();
        let (key, value) = (key.clone(), value.clone());
        async move { tokio::time::timeout(PUT_TIMEOUT, client.put(key, value, None)).await }
    };
    let mut result = put().await;
    if inner.settings.etcd_user.is_some() && matches!(result, Ok(Err(_))) {
        // etcd's tokens expire: one refusal is worth a new token and a second try.
        if cluster.authenticate().await.is_ok() {
            result = put().await;
        }
    }
    let revision = match result {
        Ok(Ok(resp)) => resp.header().map_or(0, |h| h.revision()),
        Ok(Err(e)) => {
            forget();
            return Err(InvalidateError::Cluster(format!(
                "etcd did not take the invalidation: {}",
                crate::describe(&e)
            )));
        }
        Err(_) => {
            forget();
            return Err(InvalidateError::Cluster(format!(
                "etcd did not answer within {PUT_TIMEOUT:?}"
            )));
        }
    };
    inner.counters.invalidations_sent.fetch_add(1, Relaxed);
    match tokio::time::timeout(APPLY_TIMEOUT, rx).await {
        Ok(Ok(applied)) => Ok(applied),
        _ => {
            forget();
            Err(InvalidateError::Cluster(format!(
                "appended at revision {revision} but not applied on this node within {APPLY_TIMEOUT:?}; \
                 every node applies it once it sees it"
            )))
        }
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
        let resp = message
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "the watch ended".to_string())?;
        if resp.compact_revision() > 0 {
            compacted(cluster, resp.compact_revision() as u64).await?;
            return Ok(());
        }
        if resp.canceled() {
            return Err(format!("the watch was cancelled: {}", resp.cancel_reason()));
        }
        let entries: Vec<(u64, Vec<u8>)> = resp
            .events()
            .iter()
            .filter(|e| e.event_type() == EventType::Put)
            .filter_map(|e| e.kv())
            .map(|kv| (kv.mod_revision() as u64, kv.value().to_vec()))
            .collect();
        if let Some((revision, _)) = entries.last() {
            inner.log_head.fetch_max(*revision, Relaxed);
        }
        apply(cluster, entries).await?;
        if let Some(h) = resp.header() {
            inner.seen.fetch_max(h.revision() as u64, Relaxed);
        }
        if *inner.applied.borrow() >= target {
            cluster.mark_current();
        }
    }
}

/// Applies entries in revision order, skipping those applied already, then persists the newest revision
/// and acknowledges the entries this node is waiting for.
async fn apply(cluster: &Cluster, entries: Vec<(u64, Vec<u8>)>) -> Result<(), String> {
    let inner = &cluster.inner;
    let key = inner.settings.log_key();
    let mut done = Vec::new();
    let mut newest = *inner.applied.borrow();
    for (revision, value) in entries {
        if revision <= newest {
            continue;
        }
        let Some(json) = inner.settings.secret.verify_entry(&key, &value) else {
            // Whoever wrote it can write to etcd but does not hold the cluster secret: it is no
            // member's, and taking it (even as a ban of everything) would hand the cache to them.
            inner.counters.rejected_entries.fetch_add(1, Relaxed);
            tracing::warn!(
                revision,
                entry = %String::from_utf8_lossy(&value),
                "cluster: ignored an invalidation not signed with the cluster secret"
            );
            newest = revision;
            continue;
        };
        let entry = serde_json::from_slice::<Entry>(json).ok();
        let inv = entry.as_ref().and_then(|e| e.op.invalidation().ok());
        let inv = match inv {
            Some(inv) => inv,
            None => {
                // A member sent it, so it means something: a newer version's invalidation this node
                // cannot tell the extent of.
                inner.counters.unreadable_entries.fetch_add(1, Relaxed);
                tracing::warn!(
                    revision,
                    entry = %String::from_utf8_lossy(json),
                    "cluster: an invalidation this node cannot read; banning every object stored before it"
                );
                entry::everything()
            }
        };
        let outcome = cluster::apply(&inner.store, inv)
            .await
            .map_err(|e| format!("revision {revision}: {e}"))?;
        inner.counters.invalidations_applied.fetch_add(1, Relaxed);
        newest = revision;
        if let Some(entry) = entry {
            done.push((entry.id, outcome));
        }
    }
    if newest > *inner.applied.borrow() {
        record_applied(cluster, newest).await?;
    }
    let mut pending = inner.pending.lock().expect("pending lock");
    for (id, outcome) in done {
        if let Some(tx) = pending.remove(&id) {
            let _ = tx.send(outcome);
        }
    }
    Ok(())
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
/// saw may cover any of it, and the log is taken as applied up to `resume`.
async fn start_over(cluster: &Cluster, resume: u64) -> Result<(), String> {
    cluster.inner.counters.compactions.fetch_add(1, Relaxed);
    cluster::apply(&cluster.inner.store, entry::everything())
        .await
        .map_err(|e| format!("banning everything stored: {e}"))?;
    record_applied(cluster, resume).await
}

/// Persists `revision` as the last applied, then tells the waiters.
async fn record_applied(cluster: &Cluster, revision: u64) -> Result<(), String> {
    let inner = &cluster.inner;
    inner
        .store
        .set_cluster_revision(revision)
        .await
        .map_err(|e| e.to_string())?;
    inner.applied.send_replace(revision);
    Ok(())
}
