//! Purges: by cache key or by surrogate key, hard (removed for good) or soft (expired, kept for grace).
//! Each is durable before it is acknowledged, and a fetch that started before a purge does not publish
//! what it fetched when the purge covers it. Purges and bans also go in batches ([`Store::invalidate`]):
//! one journal sync and one metadata flush for the whole batch. A cluster's log applies in batches that
//! wait for neither ([`Store::invalidate_deferred`]): etcd holds it durably, and a checkpoint makes it
//! durable here later.

use std::{
    collections::{BTreeMap, HashSet, VecDeque},
    sync::{
        atomic::{AtomicU64, Ordering::SeqCst},
        Arc, Mutex,
    },
};

use crate::{
    ban::{Ban, BanExpr, BanInfo},
    error::StoreError,
    journal::{Entry, Target},
    meta::{ObjectMeta, ObjectSet},
    store::{Store, Tagged},
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
/// bans and purges added after it before it is stored, and nobody joins a fetch that one of them may cover
/// ([`Store::invalidated_after`]).
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

    /// Whether a purge after `since` may cover what a fetch of `primary` brings, its tags unknown yet: a
    /// purge of that key, or of any tag.
    fn may_cover(&self, since: u64, primary: &str) -> bool {
        self.any_since(since, |target| match target {
            Target::Key(key) => key == primary,
            Target::Tags(_) => true,
        })
    }

    /// Whether a purge after `since` covers a body about to be published under `primary` with `tags`.
    pub(crate) fn covers(&self, since: u64, primary: &str, object_tags: &[String]) -> bool {
        self.any_since(since, |target| match target {
            Target::Key(key) => key == primary,
            Target::Tags(purged) => purged.iter().any(|t| object_tags.contains(t)),
        })
    }

    /// Whether a purge after `since` has a target `matches` takes; any purge does once the ring has
    /// forgotten some of those after `since`, since what they covered is unknown.
    fn any_since(&self, since: u64, matches: impl Fn(&Target) -> bool) -> bool {
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
            .any(|(_, target)| matches(target))
    }
}

/// Makes `meta` stale at `now`, keeping its grace and keep windows; returns whether it was fresh.
pub(crate) fn expire(meta: &mut ObjectMeta, now: u64) -> bool {
    let remaining = meta.remaining_ttl_ms(now);
    if remaining <= 0 {
        return false;
    }
    meta.ttl_ms = meta.ttl_ms.saturating_sub(remaining as u64);
    true
}

/// One invalidation of a batch given to [`Store::invalidate`].
#[derive(Debug, Clone)]
pub enum Invalidation {
    /// A ban; see [`Store::add_ban`].
    Ban(BanExpr),
    /// Every variant of one cache key; see [`Store::purge`].
    Purge {
        /// The cache key.
        primary: String,
        /// Removed, or made stale.
        mode: PurgeMode,
    },
    /// Every object carrying one of the tags, whatever its host; see [`Store::purge_tags`].
    PurgeTags {
        /// The surrogate keys.
        tags: Vec<String>,
        /// Removed, or made stale.
        mode: PurgeMode,
    },
}

/// What one invalidation of a batch did.
#[derive(Debug, Clone)]
pub enum Invalidated {
    /// The ban, as the ban list holds it.
    Ban(BanInfo),
    /// How many variants the purge removed (or made stale).
    Purged(usize),
}

/// How durable a batch's journal entries are once [`Store::apply_batch`] returns.
enum Durability {
    /// Synced, and noted in sled (`JOURNAL_LAST`).
    Now,
    /// Written only: a [`Store::checkpoint`] syncs them.
    Deferred,
}

/// A batch applied, with the bans it added waiting to be listed; holds the ban additions back meanwhile,
/// so that bans are listed in id order.
struct Applied<'a> {
    done: Vec<Invalidated>,
    added: Vec<Arc<Ban>>,
    listed: Vec<Arc<Ban>>,
    _adding: Option<tokio::sync::MutexGuard<'a, ()>>,
}

impl Applied<'_> {
    /// Lists the added bans (lookups and the lurker test them from now on); returns what each
    /// invalidation did.
    fn published(self, store: &Store) -> Vec<Invalidated> {
        if let Some(newest) = self.added.last() {
            store.ban_list().publish(self.listed, newest.id);
            for _ in &self.added {
                store.invalidations().banned();
                store.counters().bans_added.add(1);
            }
        }
        self.done
    }
}

/// One invalidation of a batch between its journal entry and its effect.
enum Step {
    Ban(Arc<Ban>),
    Purge(Target, PurgeMode),
}

impl Store {
    /// Whether a ban, or a purge that may cover `primary` (of that key, or of any tag), came after `since`:
    /// what a fetch of `primary` that started at `since` brings may then be what was invalidated.
    pub fn invalidated_after(&self, since: InvalidationMark, primary: &str) -> bool {
        self.ban_list().newest() != since.ban
            || self.invalidations().may_cover(since.epoch, primary)
    }

    /// Removes every variant of one cache key, as an unsafe method's success does (RFC 9111 §4.4), and
    /// keeps fetches for it that started before from publishing; returns how many variants it removed.
    /// Not journaled: it is this cache's own bookkeeping, not an operator's purge to replay or to share.
    pub fn invalidate_key(&self, primary: &str) -> Result<usize, StoreError> {
        self.invalidations().purged(Target::Key(primary.to_owned()));
        self.remove(primary)
    }

    /// Purges every variant of one cache key; returns how many variants were affected.
    pub async fn purge(&self, primary: &str, mode: PurgeMode) -> Result<usize, StoreError> {
        let primary = primary.to_owned();
        self.purged(Invalidation::Purge { primary, mode }).await
    }

    /// Purges every object carrying one of `tags`, whatever its host; returns how many were affected.
    pub async fn purge_tags(&self, tags: &[String], mode: PurgeMode) -> Result<usize, StoreError> {
        let tags = tags.to_vec();
        self.purged(Invalidation::PurgeTags { tags, mode }).await
    }

    async fn purged(&self, purge: Invalidation) -> Result<usize, StoreError> {
        match self.invalidate(vec![purge], None).await?.pop() {
            Some(Invalidated::Purged(n)) => Ok(n),
            other => unreachable!("a purge applied as {other:?}"),
        }
    }

    /// Applies `batch` in order, as calling [`Store::add_ban`], [`Store::purge`] and
    /// [`Store::purge_tags`] for each in turn would, at the cost of one call: one journal write and sync,
    /// one metadata flush. With `cluster_revision`, the same flush records it as the newest revision of a
    /// cluster's log applied here ([`Store::cluster_revision`]), replacing any a deferred batch applied
    /// (batches of one log come from one caller, in order). Returns, once all of it is durable, what each
    /// did. On an error, part of the batch may be applied (and journaled): applying it again is harmless.
    pub async fn invalidate(
        &self,
        batch: Vec<Invalidation>,
        cluster_revision: Option<u64>,
    ) -> Result<Vec<Invalidated>, StoreError> {
        let recording = match cluster_revision {
            Some(_) => Some(self.recording_revision().await),
            None => None,
        };
        let done = self.apply_batch(batch, Durability::Now).await?;
        if let Some(revision) = cluster_revision {
            // Deferred batches applied before this one are behind the revision: their entries too.
            self.sync_journal().await?;
            self.note_cluster_revision(revision)?;
        }
        self.flush_metadata().await?;
        if recording.is_some() {
            self.recorded_revision();
        }
        Ok(done.published(self))
    }

    /// Applies `batch` of a cluster's log, up to `revision`, as [`Store::invalidate`] does, but returns
    /// once it is applied (in effect for every lookup, fetch and ban test here) without waiting for the
    /// journal sync or the metadata flush: etcd already holds the log durably, and the node replays it from
    /// [`Store::cluster_revision`] after a crash. That revision moves to `revision` only at the next
    /// [`Store::checkpoint`], once the journal holding the batch is synced (see `durability`). A crash
    /// before it makes the node apply the batch again: purges remove what they match again, bans get new
    /// ids and cover every body older than those (more than before, never less). Revisions come from one
    /// caller, in order; an empty batch only moves the revision.
    pub async fn invalidate_deferred(
        &self,
        batch: Vec<Invalidation>,
        revision: u64,
    ) -> Result<Vec<Invalidated>, StoreError> {
        let done = self.apply_batch(batch, Durability::Deferred).await?;
        let done = done.published(self);
        self.defer_revision(revision);
        Ok(done)
    }

    /// Journals and applies `batch`; the bans it added are listed once the caller made the batch as
    /// durable as it needs ([`Applied::published`]).
    async fn apply_batch(
        &self,
        batch: Vec<Invalidation>,
        durability: Durability,
    ) -> Result<Applied<'_>, StoreError> {
        let bans = self.ban_list();
        // Only a batch with a ban waits for other ban additions: purges alone run side by side, and their
        // journal syncs and flushes group (a single node's stampede of purges).
        let adding = match batch.iter().any(|i| matches!(i, Invalidation::Ban(_))) {
            true => Some(bans.adding().await),
            false => None,
        };
        // Held until the batch is applied to the metadata (see `Journal::applying`).
        let applying = self.journal().applying().await;
        let mut entries = Vec::with_capacity(batch.len());
        let mut steps = Vec::with_capacity(batch.len());
        for inv in batch {
            let (target, mode) = match inv {
                Invalidation::Ban(expr) => {
                    let ban = bans.new_ban(self, expr);
                    entries.push(Entry::Ban {
                        id: ban.id,
                        expression: ban.canonical().to_owned(),
                    });
                    steps.push(Step::Ban(ban));
                    continue;
                }
                Invalidation::Purge { primary, mode } => (Target::Key(primary), mode),
                Invalidation::PurgeTags { tags, mode } => (Target::Tags(tags), mode),
            };
            entries.push(Entry::Purge {
                id: self.next_id(),
                target: target.clone(),
                soft: mode == PurgeMode::Soft,
            });
            steps.push(Step::Purge(target, mode));
        }
        if !entries.is_empty() {
            match durability {
                Durability::Now => self.append_journal(entries).await?,
                Durability::Deferred => self.append_journal_unsynced(entries).await?,
            }
        }
        let added: Vec<Arc<Ban>> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Ban(ban) => Some(ban.clone()),
                Step::Purge(..) => None,
            })
            .collect();
        let listed = bans.record(&added)?;
        let mut done = Vec::with_capacity(steps.len());
        let mut prune = Vec::new();
        for step in steps {
            let (target, mode) = match step {
                Step::Ban(ban) => {
                    done.push(Invalidated::Ban(ban.info()));
                    continue;
                }
                Step::Purge(target, mode) => (target, mode),
            };
            self.invalidations().purged(target.clone());
            let n = match &target {
                Target::Key(primary) => match mode {
                    PurgeMode::Hard => self.remove(primary)?,
                    PurgeMode::Soft => self.soft_expire(primary, |_| true)?,
                },
                Target::Tags(tags) => {
                    let found = self.tagged(tags)?;
                    let n = self.purge_found(&found, mode)?;
                    prune.extend(found);
                    n
                }
            };
            self.count_purge(mode, n);
            done.push(Invalidated::Purged(n));
        }
        drop(applying);
        // Entries whose object was already gone (after a crash, say) go now.
        for (key, tagged) in prune {
            self.prune_tag_entry(&key, &tagged)?;
        }
        Ok(Applied {
            done,
            added,
            listed,
            _adding: adding,
        })
    }

    /// Removes (or expires) the variants `found` in the tag index points at; returns how many.
    fn purge_found(
        &self,
        found: &[(Vec<u8>, Tagged)],
        mode: PurgeMode,
    ) -> Result<usize, StoreError> {
        let mut by_key: BTreeMap<String, HashSet<u64>> = BTreeMap::new();
        for (_, tagged) in found {
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
        Ok(n)
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
