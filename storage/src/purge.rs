//! Purges: by cache key or by surrogate key, hard (removed for good) or soft (expired, kept for grace).
//! Each is durable before it is acknowledged, and a fetch that started before a purge does not publish
//! what it fetched when the purge covers it.

use std::{
    collections::{BTreeMap, HashSet, VecDeque},
    sync::{
        atomic::{AtomicU64, Ordering::SeqCst},
        Mutex,
    },
};

use crate::{
    error::StoreError,
    journal::{Entry, Target},
    meta::{ObjectMeta, ObjectSet},
    store::Store,
};

/// Purges remembered for fetches in flight; a fetch older than all of them is not published.
const RECENT_KEPT: usize = 4096;

/// What a purge does to the objects it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PurgeMode {
    /// Remove every matching object now.
    Hard,
    /// Make matching objects stale now; they stay servable for their grace while being refreshed.
    Soft,
}

/// A point in the invalidation history, taken when a fetch starts: what it fetched is tested against the
/// bans and purges added after it before it is stored, and nobody joins a fetch from an older epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InvalidationMark {
    /// The newest ban id.
    pub ban: u64,
    /// Moves with every ban and purge.
    pub epoch: u64,
}

/// Every invalidation moves the epoch; fetches record it when they start.
#[derive(Default)]
pub(crate) struct Invalidations {
    epoch: AtomicU64,
    recent: Mutex<VecDeque<(u64, Target)>>,
    /// Purges up to this epoch were forgotten: a fetch older than it may be covered by one of them.
    forgotten: AtomicU64,
}

impl Invalidations {
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(SeqCst)
    }

    /// Records a ban (which the ban list itself applies to fetches in flight).
    pub(crate) fn banned(&self) {
        self.epoch.fetch_add(1, SeqCst);
    }

    fn purged(&self, target: Target) {
        let mut recent = self.recent.lock().expect("purge ring");
        let epoch = self.epoch.fetch_add(1, SeqCst) + 1;
        recent.push_back((epoch, target));
        if recent.len() > RECENT_KEPT {
            if let Some((old, _)) = recent.pop_front() {
                self.forgotten.store(old, SeqCst);
            }
        }
    }

    /// Whether a purge after `since` covers a body about to be published under `primary` with `tags`.
    pub(crate) fn covers(&self, since: u64, primary: &str, object_tags: &[String]) -> bool {
        if self.epoch() == since {
            return false;
        }
        let recent = self.recent.lock().expect("purge ring");
        if since < self.forgotten.load(SeqCst) {
            return true;
        }
        recent
            .iter()
            .rev()
            .take_while(|(epoch, _)| *epoch > since)
            .any(|(_, target)| match target {
                Target::Key(key) => key == primary,
                Target::Tags(purged) => purged.iter().any(|t| object_tags.contains(t)),
            })
    }
}

/// Makes `meta` stale at `now`, keeping its grace and keep windows; returns whether it was fresh.
fn expire(meta: &mut ObjectMeta, now: u64) -> bool {
    let remaining = meta.remaining_ttl_ms(now);
    if remaining <= 0 {
        return false;
    }
    meta.ttl_ms = meta.ttl_ms.saturating_sub(remaining as u64);
    true
}

impl Store {
    /// Removes every variant of one cache key, as an unsafe method's success does (RFC 9111 §4.4), and
    /// keeps fetches for it that started before from publishing; returns how many variants it removed.
    /// Not journaled: it is this cache's own bookkeeping, not an operator's purge to replay or to share.
    pub fn invalidate(&self, primary: &str) -> Result<usize, StoreError> {
        self.invalidations().purged(Target::Key(primary.to_owned()));
        self.remove(primary)
    }

    /// Purges every variant of one cache key; returns how many variants were affected.
    pub async fn purge(&self, primary: &str, mode: PurgeMode) -> Result<usize, StoreError> {
        let target = Target::Key(primary.to_owned());
        let applying = self.journal_purge(&target, mode).await?;
        self.invalidations().purged(target);
        let n = match mode {
            PurgeMode::Hard => self.remove(primary)?,
            PurgeMode::Soft => self.soft_expire(primary, |_| true)?,
        };
        drop(applying);
        self.count_purge(mode, n);
        self.flush_metadata().await?;
        Ok(n)
    }

    /// Purges every object carrying one of `tags`, whatever its host; returns how many were affected.
    pub async fn purge_tags(
        &self,
        purged: &[String],
        mode: PurgeMode,
    ) -> Result<usize, StoreError> {
        let target = Target::Tags(purged.to_vec());
        let applying = self.journal_purge(&target, mode).await?;
        self.invalidations().purged(target);
        let found = self.tagged(purged)?;
        let mut by_key: BTreeMap<String, HashSet<u64>> = BTreeMap::new();
        for (_, tagged) in &found {
            by_key
                .entry(tagged.primary.clone())
                .or_default()
                .insert(tagged.generation);
        }
        let mut n = 0;
        for (primary, generations) in &by_key {
            n += match mode {
                PurgeMode::Hard => {
                    self.retain(primary, |m| !generations.contains(&m.generation))?
                }
                PurgeMode::Soft => {
                    self.soft_expire(primary, |m| generations.contains(&m.generation))?
                }
            };
        }
        drop(applying);
        // Entries whose object was already gone (after a crash, say) go now.
        for (key, tagged) in found {
            self.prune_tag_entry(&key, &tagged)?;
        }
        self.count_purge(mode, n);
        self.flush_metadata().await?;
        Ok(n)
    }

    /// Appends a purge to the invalidation journal (synced) before anything else happens to it; the guard
    /// returned is held until the purge is applied to the metadata (see `Journal::applying`).
    async fn journal_purge(
        &self,
        target: &Target,
        mode: PurgeMode,
    ) -> Result<tokio::sync::RwLockReadGuard<'_, ()>, StoreError> {
        let applying = self.journal().applying().await;
        let entry = Entry::Purge {
            id: self.next_id(),
            target: target.clone(),
            soft: mode == PurgeMode::Soft,
        };
        self.append_journal(entry).await?;
        Ok(applying)
    }

    fn count_purge(&self, mode: PurgeMode, n: usize) {
        let counters = self.counters();
        counters.purges.add(1);
        let counter = match mode {
            PurgeMode::Hard => &counters.objects_purged,
            PurgeMode::Soft => &counters.objects_soft_purged,
        };
        counter.add(n as u64);
    }

    /// Expires the variants of `primary` selected by `which`; returns how many were selected.
    pub(crate) fn soft_expire(
        &self,
        primary: &str,
        which: impl Fn(&ObjectMeta) -> bool,
    ) -> Result<usize, StoreError> {
        self.modify(primary, |set: &mut ObjectSet| {
            let now = lacquer_clock::now_ms();
            let mut n = 0;
            for meta in set.variants.iter_mut().filter(|m| which(m)) {
                expire(meta, now);
                n += 1;
            }
            n
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_expiry_keeps_grace() {
        let mut meta = crate::meta::tests::meta(1, 4);
        let now = 1_010_000;
        assert!(meta.remaining_ttl_ms(now) > 0);
        assert!(expire(&mut meta, now));
        assert_eq!(meta.remaining_ttl_ms(now), 0);
        assert_eq!(meta.grace_ms, 10_000);
        assert!(!expire(&mut meta, now + 1), "already stale stays as it is");
    }

    #[test]
    fn fetches_older_than_a_covering_purge_do_not_publish() {
        let inv = Invalidations::default();
        let before = inv.epoch();
        inv.purged(Target::Key("a.test/x".into()));
        inv.purged(Target::Tags(vec!["t1".into()]));
        assert!(inv.covers(before, "a.test/x", &[]));
        assert!(inv.covers(before, "a.test/y", &["t1".into()]));
        assert!(!inv.covers(before, "a.test/y", &["t2".into()]));
        assert!(
            !inv.covers(inv.epoch(), "a.test/x", &[]),
            "started after the purge"
        );
        for i in 0..RECENT_KEPT {
            inv.purged(Target::Key(format!("k{i}")));
        }
        assert!(
            inv.covers(before, "unrelated", &[]),
            "forgotten purges are assumed to cover"
        );
    }
}
