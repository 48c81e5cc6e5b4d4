//! The start-up replay: the invalidation journal is replayed over every metadata record, so that no body an
//! acknowledged purge or ban removed is served again, whatever sled's files went through (a crash that
//! rolled them back, damage). When the journal cannot vouch for the records (damaged, missing, or shorter
//! than the metadata saw it), every stored object is dropped instead.

use std::collections::{HashMap, HashSet};

use crate::{
    ban::{BanExpr, Subject},
    error::StoreError,
    journal::{Entry, Journal, Readback, State, Target},
    meta::{ObjectMeta, ObjectSet},
};

use super::{Store, JOURNAL_LAST};

/// What a clean close leaves in sled's `state` tree (see [`CleanClose`]).
pub(super) const CLEAN_CLOSE: &[u8] = b"clean-close";

/// Ids handed out per millisecond of wall clock before the sequence runs ahead of it: ids start above
/// `now × this` after a restart, so they never go back even if sled and the journal both lost their tail.
const IDS_PER_MS: u64 = 4096;

impl Store {
    /// Replays the invalidation journal over every metadata record, drops what it covers (or everything,
    /// when the journal cannot vouch for the records), counts what is left, and starts the journal.
    pub(super) fn recover(&self, readback: Readback) -> Result<(), StoreError> {
        let inner = &self.inner;
        let journal_last = inner.journal.last();
        // Every start with a journal notes it in sled: a store without that note comes from a version
        // before the journal, whose purges and bans were in sled before they were acknowledged; it is
        // kept, and the journal starts now.
        let marker = inner.state.get(JOURNAL_LAST)?;
        let seen_last = marker
            .as_ref()
            .and_then(|v| v.as_ref().try_into().ok().map(u64::from_be_bytes))
            .unwrap_or(0);
        let doubt = match &readback {
            Readback::Damaged(reason) => Some(format!("the invalidation journal is damaged ({reason})")),
            Readback::Missing if marker.is_some() && !inner.objects.is_empty() => {
                Some("the invalidation journal is missing".to_owned())
            }
            _ if seen_last > journal_last => Some(format!(
                "the invalidation journal ends at entry {journal_last} but the metadata saw entry {seen_last}"
            )),
            _ => None,
        };
        // Taken at once: from here on a crash must not find it.
        let clean = inner
            .state
            .remove(CLEAN_CLOSE)?
            .and_then(|v| CleanClose::decode(&v));
        let replay = Replay::new(&inner.journal);
        let (mut dropped, mut softened, mut unreadable) = (Vec::new(), Vec::new(), 0u64);
        let (mut objects, mut bytes, mut newest) = (0u64, 0u64, 0u64);
        let vouched = clean.filter(|clean| {
            doubt.is_none()
                && matches!(readback, Readback::Intact)
                && clean.journal_last == journal_last
        });
        if let Some(clean) = vouched {
            // The last run closed the store after every invalidation it acknowledged had reached sled, and
            // the journal has not moved since: the replay would find nothing, so the walk over every record
            // (seconds with a million objects) is skipped.
            (objects, bytes, newest) = (clean.objects, clean.bytes, clean.next_id);
            tracing::debug!(objects, "store closed cleanly: no replay needed");
        }
        let walk = vouched.is_none().then(|| inner.objects.iter());
        for item in walk.into_iter().flatten() {
            let (key, value) = item?;
            let primary = String::from_utf8_lossy(&key).into_owned();
            let Ok(set) = ObjectSet::decode(&primary, &value) else {
                unreadable += 1;
                inner.objects.remove(&key)?;
                continue;
            };
            inner.keys.add(&key);
            for meta in &set.variants {
                newest = newest.max(meta.generation).max(meta.ban_checked);
                match (&doubt, replay.verdict(&primary, meta)) {
                    (Some(_), _) | (None, Some(false)) => {
                        dropped.push((primary.clone(), meta.generation))
                    }
                    (None, Some(true)) => softened.push((primary.clone(), meta.generation)),
                    (None, None) => {
                        objects += 1;
                        bytes += meta.length;
                    }
                }
            }
        }
        if vouched.is_none() {
            // Every key is counted and nothing else runs yet: removals from here on count exactly.
            inner.keys.completed();
        }
        for (primary, generation) in &dropped {
            self.retain(primary, |m| m.generation != *generation)?;
        }
        for (primary, generation) in &softened {
            self.soft_expire(primary, |m| m.generation == *generation)?;
        }
        self.recount(objects, bytes);
        self.counters().corrupt_records.add(unreadable);

        let next = (lacquer_clock::now_ms() * IDS_PER_MS)
            .max(newest + 1)
            .max(journal_last + 1)
            .max(inner.db.generate_id()? + 1);
        let fresh = match (&doubt, &readback) {
            (Some(_), _) => Some(next),
            (None, Readback::Missing) => Some(0),
            _ => None,
        };
        inner.journal.start(next, fresh)?;
        inner
            .state
            .insert(JOURNAL_LAST, &inner.journal.last().to_be_bytes())?;
        inner.db.flush()?;
        if unreadable > 0 {
            tracing::error!(
                records = unreadable,
                "discarded unreadable metadata records at start; their objects will be fetched again"
            );
        }
        if let Some(doubt) = doubt {
            self.counters().objects_unverified.add(dropped.len() as u64);
            tracing::error!(
                objects = dropped.len(),
                "{doubt}: dropped every stored object, since none can be proven not purged or banned"
            );
        } else if !dropped.is_empty() || !softened.is_empty() {
            self.counters()
                .objects_invalidated_at_start
                .add((dropped.len() + softened.len()) as u64);
            tracing::warn!(
                removed = dropped.len(),
                made_stale = softened.len(),
                "the metadata still held objects that acknowledged purges or bans cover (rolled back by a crash or damage): removed them again"
            );
        }
        tracing::info!(
            objects,
            journal_entries = inner.journal.len(),
            "store opened"
        );
        Ok(())
    }
}

/// Left by [`Store::close`] once everything it acknowledged is in sled, and taken at the next start: what
/// the start-up walk would otherwise count. Trusted only when the journal ends where it ended then (an
/// invalidation after it, or sled's files rolled back to an older close, shows as a journal that moved on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CleanClose {
    pub(super) journal_last: u64,
    /// Above every id handed out before the close (with room for the few a closing store may still take).
    pub(super) next_id: u64,
    pub(super) objects: u64,
    pub(super) bytes: u64,
}

impl CleanClose {
    pub(super) fn encode(&self) -> [u8; 32] {
        let mut out = [0; 32];
        for (slot, value) in
            out.chunks_mut(8)
                .zip([self.journal_last, self.next_id, self.objects, self.bytes])
        {
            slot.copy_from_slice(&value.to_be_bytes());
        }
        out
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let field = |i: usize| {
            Some(u64::from_be_bytes(
                bytes.get(i * 8..i * 8 + 8)?.try_into().ok()?,
            ))
        };
        (bytes.len() == 32).then_some(())?;
        Some(Self {
            journal_last: field(0)?,
            next_id: field(1)?,
            objects: field(2)?,
            bytes: field(3)?,
        })
    }
}

/// The journal indexed for the start-up replay: by cache key, by tag, and the bans.
struct Replay {
    floor: u64,
    kept: HashSet<u64>,
    keys: HashMap<String, Vec<(u64, bool)>>,
    tags: HashMap<String, Vec<(u64, bool)>>,
    /// A ban whose expression no longer parses covers everything older than it.
    bans: Vec<(u64, Option<BanExpr>)>,
}

impl Replay {
    fn new(journal: &Journal) -> Self {
        journal.view(Self::index)
    }

    fn index(state: &State) -> Self {
        let mut replay = Replay {
            floor: state.floor,
            kept: state.kept.clone(),
            keys: HashMap::new(),
            tags: HashMap::new(),
            bans: Vec::new(),
        };
        for entry in &state.entries {
            match entry {
                Entry::Purge {
                    id,
                    target: Target::Key(key),
                    soft,
                } => replay
                    .keys
                    .entry(key.clone())
                    .or_default()
                    .push((*id, *soft)),
                Entry::Purge {
                    id,
                    target: Target::Tags(tags),
                    soft,
                } => {
                    for tag in tags {
                        replay
                            .tags
                            .entry(tag.clone())
                            .or_default()
                            .push((*id, *soft));
                    }
                }
                Entry::Ban { id, expression } => {
                    replay.bans.push((*id, BanExpr::parse(expression).ok()))
                }
                Entry::Checkpoint { .. } => {}
            }
        }
        replay
    }

    /// `Some(false)`: an entry removes the body; `Some(true)`: a soft purge makes it stale; `None`: nothing
    /// covers it.
    fn verdict(&self, primary: &str, meta: &ObjectMeta) -> Option<bool> {
        let generation = meta.generation;
        if generation < self.floor && !self.kept.contains(&generation) {
            return Some(false);
        }
        let subject = Subject::new(primary, meta);
        let banned = self.bans.iter().any(|(id, expr)| {
            *id > generation && expr.as_ref().is_none_or(|e| e.matches(&subject))
        });
        if banned {
            return Some(false);
        }
        let purges = self
            .keys
            .get(primary)
            .into_iter()
            .chain(meta.tags.iter().filter_map(|t| self.tags.get(t)))
            .flatten()
            .filter(|(id, _)| *id > generation);
        let mut soft = None;
        for (_, is_soft) in purges {
            if !is_soft {
                return Some(false);
            }
            soft = Some(true);
        }
        soft
    }
}
