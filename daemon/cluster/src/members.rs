//! Membership: this node's registration under a lease it keeps alive, and the live member list every
//! node follows.

use std::{
    collections::BTreeMap,
    sync::{atomic::Ordering::Relaxed, Arc},
    time::Duration,
};

use etcd_client::{EventType, GetOptions, PutOptions, WatchOptions};

use crate::{Cluster, Member};

const RETRY_AFTER: Duration = Duration::from_secs(1);
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// Keeps this node registered for as long as the daemon runs: a lease of `lease_ttl`, renewed three times
/// per TTL; a lease that lapsed (a partition longer than the TTL) is replaced by a new one.
pub(crate) async fn register(cluster: Cluster) {
    let mut first = true;
    loop {
        let Err(e) = registered(&cluster).await;
        // Logged when the registration is lost, not at every retry while etcd stays out of reach.
        let was_registered = cluster
            .inner
            .lease
            .lock()
            .expect("lease lock")
            .take()
            .is_some();
        if was_registered || first {
            tracing::warn!(
                error = %cluster.explain(e),
                "cluster: cannot keep this node registered; retrying"
            );
        }
        first = false;
        tokio::time::sleep(RETRY_AFTER).await;
    }
}

/// Registers this node and keeps its lease alive until that fails.
async fn registered(cluster: &Cluster) -> Result<std::convert::Infallible, String> {
    let inner = &cluster.inner;
    let settings = &inner.settings;
    cluster.authenticate().await?;
    let mut client = inner.client.clone();
    let ttl = settings.lease_ttl.as_secs().max(1) as i64;
    let lease = timeout(client.lease_grant(ttl, None)).await?.id();
    let me = Member {
        node: settings.node.clone(),
        advertise: settings.advertise,
        advertise_admin: settings.advertise_admin,
    };
    let key = format!("{}{}", settings.members_prefix(), settings.node);
    let json = serde_json::to_vec(&me).expect("a member serialises");
    let value = settings.secret.sign_entry(&key, &json);
    timeout(client.put(
        key.clone(),
        value,
        Some(PutOptions::new().with_lease(lease)),
    ))
    .await?;
    *inner.lease.lock().expect("lease lock") = Some(lease);
    tracing::info!(node = %settings.node, lease, "cluster: registered");
    let (mut keeper, mut responses) = timeout(client.lease_keep_alive(lease)).await?;
    let mut every = tokio::time::interval(settings.lease_ttl / 3);
    loop {
        every.tick().await;
        keeper.keep_alive().await.map_err(|e| e.to_string())?;
        let resp = tokio::time::timeout(CALL_TIMEOUT, responses.message())
            .await
            .map_err(|_| "no answer to a lease keep-alive".to_string())?
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "the lease keep-alive stream ended".to_string())?;
        if resp.ttl() <= 0 {
            return Err("the membership lease lapsed".into());
        }
    }
}

/// Revokes this node's lease: it leaves every member's list at once rather than after the TTL.
pub(crate) async fn leave(cluster: &Cluster) {
    let lease = *cluster.inner.lease.lock().expect("lease lock");
    if let Some(lease) = lease {
        let mut client = cluster.inner.client.clone();
        match timeout(client.lease_revoke(lease)).await {
            Ok(_) => tracing::info!("cluster: left"),
            Err(e) => {
                tracing::warn!(error = %e, "cluster: could not leave; the lease lapses instead")
            }
        }
    }
}

/// Follows the member list for as long as the daemon runs. While etcd is out of reach the last list is
/// kept: etcd, not this node, decides who has left.
pub(crate) async fn follow(cluster: Cluster) {
    loop {
        if let Err(e) = followed(&cluster).await {
            tracing::debug!(error = %e, "cluster: member list watch broke; retrying");
        }
        tokio::time::sleep(RETRY_AFTER).await;
    }
}

async fn followed(cluster: &Cluster) -> Result<(), String> {
    let inner = &cluster.inner;
    cluster.authenticate().await?;
    let prefix = inner.settings.members_prefix();
    let mut client = inner.client.clone();
    let now = timeout(client.get(prefix.clone(), Some(GetOptions::new().with_prefix()))).await?;
    let mut members = BTreeMap::new();
    for kv in now.kvs() {
        if let Some(m) = member(cluster, kv.key(), kv.value()) {
            members.insert(kv.key().to_vec(), m);
        }
    }
    publish(cluster, &members);
    let from = now.header().map_or(0, |h| h.revision()) + 1;
    let options = WatchOptions::new().with_prefix().with_start_revision(from);
    let mut stream = client
        .watch(prefix, Some(options))
        .await
        .map_err(|e| e.to_string())?;
    loop {
        let resp = stream
            .message()
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "the watch ended".to_string())?;
        if resp.canceled() {
            return Err(format!("the watch was cancelled: {}", resp.cancel_reason()));
        }
        for event in resp.events() {
            let Some(kv) = event.kv() else { continue };
            match event.event_type() {
                EventType::Put => {
                    // A rejected entry replaces whatever the key held: the key is no member's now.
                    match member(cluster, kv.key(), kv.value()) {
                        Some(m) => members.insert(kv.key().to_vec(), m),
                        None => members.remove(kv.key()),
                    };
                }
                EventType::Delete => {
                    members.remove(kv.key());
                }
            }
        }
        publish(cluster, &members);
    }
}

/// The member an entry registers, when a member signed it with the cluster secret; anything else is
/// logged and counted, never routed to: whoever can write to etcd must not be able to draw requests.
fn member(cluster: &Cluster, key: &[u8], value: &[u8]) -> Option<Member> {
    let inner = &cluster.inner;
    let name = String::from_utf8_lossy(key);
    let reject = |why: &str| {
        inner.counters.rejected_entries.fetch_add(1, Relaxed);
        tracing::warn!(
            key = %name,
            entry = %String::from_utf8_lossy(value),
            "cluster: ignored a member entry {why}"
        );
    };
    let Some(json) = inner.settings.secret.verify_entry(&name, value) else {
        reject("not signed with the cluster secret");
        return None;
    };
    match serde_json::from_slice::<Member>(json) {
        Ok(m) => Some(m),
        Err(_) => {
            reject("this node cannot read");
            None
        }
    }
}

fn publish(cluster: &Cluster, members: &BTreeMap<Vec<u8>, Member>) {
    let list: Vec<Member> = members.values().cloned().collect();
    let mut current = cluster.inner.members.write().expect("members lock");
    if **current != list {
        let names: Vec<&str> = list.iter().map(|m| m.node.as_str()).collect();
        tracing::info!(members = ?names, "cluster: members");
        *current = Arc::new(list);
    }
}

async fn timeout<T>(
    call: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, String> {
    tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .map_err(|_| "etcd did not answer".to_string())?
        .map_err(|e| crate::describe(&e))
}
