//! The ban list: in memory for lookups, in sled so that a restart (or a crash) never forgets a ban.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::SeqCst},
        Arc, RwLock,
    },
};

use serde::{Deserialize, Serialize};

use super::expr::{BanExpr, Subject};
use crate::{error::StoreError, meta::ObjectMeta, store::Store};

/// Completed bans still listed (for `GET /v1/bans`); older completed ones are retired.
const COMPLETED_KEPT: usize = 100;
/// Version 2 added `to_test`; version 1 records are still read (their `to_test` is unknown).
const RECORD_VERSION: u8 = 2;

/// One ban. Its id orders it against objects: it applies to objects whose `ban_checked` is below it.
#[derive(Debug)]
pub struct Ban {
    pub id: u64,
    pub created_ms: u64,
    pub expr: BanExpr,
    /// `expr` in its canonical text, written once: adding bans compares every listed ban's text, and
    /// formatting each again per addition made that walk dominate a busy ban log.
    canonical: String,
    tested: AtomicU64,
    removed: AtomicU64,
    /// Objects stored when the ban was added: what it has to be tested against, the measure of its
    /// progress. `None` for a ban written before it was recorded.
    to_test: Option<u64>,
    /// Every stored object has been tested against this ban (and that is durable): it can never match again.
    completed: AtomicBool,
}

/// What `GET /v1/bans` reports of one ban.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BanInfo {
    /// Orders the ban against stored bodies: it covers those whose generation is below it.
    pub id: u64,
    /// The expression in canonical form.
    pub expression: String,
    /// Unix milliseconds.
    pub created_ms: u64,
    /// Objects tested against the ban.
    pub tested: u64,
    /// Objects the ban removed.
    pub removed: u64,
    /// Objects stored when the ban was added, which it has to be tested against; `None` for a ban added by
    /// a lacquerd that did not record it. `tested` may pass it: bodies fetched meanwhile are tested too.
    pub to_test: Option<u64>,
    /// The lurker has tested every object stored before the ban.
    pub completed: bool,
}

#[derive(Serialize, Deserialize)]
struct BanRecordV1 {
    created_ms: u64,
    expression: String,
    tested: u64,
    removed: u64,
    completed: bool,
}

#[derive(Serialize, Deserialize)]
struct BanRecord {
    created_ms: u64,
    expression: String,
    tested: u64,
    removed: u64,
    completed: bool,
    to_test: Option<u64>,
}

impl Ban {
    /// The expression's canonical text.
    pub(crate) fn canonical(&self) -> &str {
        &self.canonical
    }

    pub(crate) fn info(&self) -> BanInfo {
        BanInfo {
            id: self.id,
            expression: self.canonical.clone(),
            created_ms: self.created_ms,
            tested: self.tested.load(SeqCst),
            removed: self.removed.load(SeqCst),
            to_test: self.to_test,
            completed: self.completed.load(SeqCst),
        }
    }

    fn encode(&self) -> Vec<u8> {
        let info = self.info();
        let record = BanRecord {
            created_ms: info.created_ms,
            expression: info.expression,
            tested: info.tested,
            removed: info.removed,
            completed: info.completed,
            to_test: info.to_test,
        };
        let mut out = vec![RECORD_VERSION];
        bincode::serde::encode_into_std_write(&record, &mut out, bincode::config::standard())
            .expect("encoding into a Vec cannot fail");
        out
    }

    fn decode(id: u64, bytes: &[u8]) -> Result<Self, String> {
        let config = bincode::config::standard();
        let record = match bytes.split_first() {
            Some((&RECORD_VERSION, rest)) => {
                bincode::serde::decode_from_slice::<BanRecord, _>(rest, config)
                    .map_err(|e| e.to_string())?
                    .0
            }
            Some((1, rest)) => {
                let (v1, _): (BanRecordV1, _) =
                    bincode::serde::decode_from_slice(rest, config).map_err(|e| e.to_string())?;
                BanRecord {
                    created_ms: v1.created_ms,
                    expression: v1.expression,
                    tested: v1.tested,
                    removed: v1.removed,
                    completed: v1.completed,
                    to_test: None,
                }
            }
            _ => return Err("unknown ban record version".into()),
        };
        let expr = BanExpr::parse(&record.expression).map_err(|e| e.to_string())?;
        Ok(Self {
            id,
            created_ms: record.created_ms,
            canonical: expr.to_string(),
            expr,
            tested: AtomicU64::new(record.tested),
            removed: AtomicU64::new(record.removed),
            to_test: record.to_test,
            completed: AtomicBool::new(record.completed),
        })
    }
}

pub(crate) struct Bans {
    tree: sled::Tree,
    /// Sorted by id. Replaced whole on change, so a lookup holds a snapshot without blocking anyone.
    list: RwLock<Arc<Vec<Arc<Ban>>>>,
    /// Id of the newest ban in `list` (0 when none): objects checked up to it need no test.
    newest: AtomicU64,
    /// Every ban up to this id is completed: every object stored before it passed it or was removed, so no
    /// object needs testing against it, whatever its own `ban_checked` says.
    completed_upto: AtomicU64,
    /// The newest ban retired from the list: a fetch that started before it cannot be tested against it.
    retired_upto: AtomicU64,
    /// Serialises additions so that ids enter the list in order.
    adding: tokio::sync::Mutex<()>,
    pub(crate) lurker: Arc<super::lurker::Wake>,
}

/// What testing an object against newer bans concluded.
pub(crate) enum Verdict {
    Banned,
    /// No ban matched; the object is now checked up to this id.
    Clear(u64),
}

impl Bans {
    /// Reads the ban list; also returns how many unreadable ban records were discarded. Discarding one does
    /// not bring banned content back: the invalidation journal's replay at start removed every stored
    /// object a ban covers, and anything fetched since is newer than the ban.
    pub(crate) fn open(db: &sled::Db) -> Result<(Self, u64), StoreError> {
        let tree = db.open_tree("bans")?;
        let mut list = Vec::new();
        let mut unreadable = 0;
        for item in tree.iter() {
            let (key, value) = item?;
            let id = u64::from_be_bytes(key.as_ref().try_into().unwrap_or_default());
            match Ban::decode(id, &value) {
                Ok(ban) => list.push(Arc::new(ban)),
                Err(reason) => {
                    tracing::error!(id, reason, "discarding an unreadable ban record");
                    tree.remove(&key)?;
                    unreadable += 1;
                }
            }
        }
        let newest = list.last().map_or(0, |b| b.id);
        let completed_upto = list
            .iter()
            .filter(|b| b.completed.load(SeqCst))
            .map(|b| b.id)
            .max()
            .unwrap_or(0);
        let bans = Self {
            tree,
            list: RwLock::new(Arc::new(list)),
            newest: AtomicU64::new(newest),
            completed_upto: AtomicU64::new(completed_upto),
            retired_upto: AtomicU64::new(0),
            adding: tokio::sync::Mutex::new(()),
            lurker: Arc::default(),
        };
        Ok((bans, unreadable))
    }

    /// Whether ban `id` is listed and not completed.
    pub(crate) fn is_pending(&self, id: u64) -> bool {
        self.snapshot()
            .iter()
            .any(|b| b.id == id && !b.completed.load(SeqCst))
    }

    pub(crate) fn newest(&self) -> u64 {
        self.newest.load(SeqCst)
    }

    /// Whether a ban after what `meta` was tested against, up to `upto`, still has to be tested.
    pub(crate) fn needs_test(&self, meta: &ObjectMeta, upto: u64) -> bool {
        meta.ban_checked.max(self.completed_upto.load(SeqCst)) < upto
    }

    pub(crate) fn snapshot(&self) -> Arc<Vec<Arc<Ban>>> {
        self.list.read().expect("ban list lock").clone()
    }

    /// Bans the lurker has not finished with.
    pub(crate) fn pending(&self) -> usize {
        self.snapshot()
            .iter()
            .filter(|b| !b.completed.load(SeqCst))
            .count()
    }

    pub(crate) fn infos(&self) -> Vec<BanInfo> {
        self.snapshot().iter().map(|b| b.info()).collect()
    }

    /// Held from taking a ban's id until the ban is listed, so that ids enter the list in order (and the
    /// lurker's completions wait for it).
    pub(crate) async fn adding(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.adding.lock().await
    }

    /// A new ban of `expr`, for the caller (holding [`Bans::adding`]) to journal, [`Bans::record`] and
    /// [`Bans::publish`]. Ids never go back, even across crashes, so it is newer than every checked object.
    pub(crate) fn new_ban(&self, store: &Store, expr: BanExpr) -> Arc<Ban> {
        Arc::new(Ban {
            id: store.next_id(),
            created_ms: lacquer_clock::now_ms(),
            canonical: expr.to_string(),
            expr,
            tested: AtomicU64::new(0),
            removed: AtomicU64::new(0),
            to_test: Some(store.counted().0),
            completed: AtomicBool::new(false),
        })
    }

    /// Writes `added` (new bans, oldest first) to sled, dropping every older identical ban, those of
    /// `added` included: the newest covers everything they covered. Returns the list to
    /// [`Bans::publish`] once sled is flushed.
    pub(crate) fn record(&self, added: &[Arc<Ban>]) -> Result<Vec<Arc<Ban>>, StoreError> {
        let newest: HashMap<&str, u64> =
            added.iter().map(|b| (b.canonical.as_str(), b.id)).collect();
        let current = self.snapshot();
        let mut next = Vec::with_capacity(current.len() + added.len());
        for old in current.iter() {
            if newest.contains_key(old.canonical.as_str()) {
                self.tree.remove(old.id.to_be_bytes())?;
            } else {
                next.push(old.clone());
            }
        }
        for ban in added {
            if newest[ban.canonical.as_str()] == ban.id {
                self.tree.insert(ban.id.to_be_bytes(), ban.encode())?;
                next.push(ban.clone());
            }
        }
        Ok(next)
    }

    /// Lists the bans [`Bans::record`] wrote, once they are durable; `newest` is the newest of them.
    pub(crate) fn publish(&self, list: Vec<Arc<Ban>>, newest: u64) {
        *self.list.write().expect("ban list lock") = Arc::new(list);
        self.newest.store(newest, SeqCst);
        self.lurker.notify();
    }

    /// Tests an object checked up to `checked` against the bans after it, up to `upto`.
    pub(crate) fn test(
        &self,
        bans: &[Arc<Ban>],
        upto: u64,
        primary: &str,
        meta: &ObjectMeta,
    ) -> Verdict {
        let subject = Subject::new(primary, meta);
        let tested = meta.ban_checked.max(self.completed_upto.load(SeqCst));
        let from = bans.partition_point(|b| b.id <= tested);
        for ban in bans[from..].iter().take_while(|b| b.id <= upto) {
            if ban.completed.load(SeqCst) {
                continue;
            }
            ban.tested.fetch_add(1, SeqCst);
            if ban.expr.matches(&subject) {
                ban.removed.fetch_add(1, SeqCst);
                return Verdict::Banned;
            }
        }
        Verdict::Clear(upto)
    }

    /// Tests a body fetched since ban `since` against every ban after it, completed ones included: the
    /// lurker's walk could not see a body that was still being fetched. A ban already retired from the list
    /// cannot be tested, so a fetch older than one is treated as banned.
    pub(crate) fn test_fetched(
        &self,
        bans: &[Arc<Ban>],
        since: u64,
        primary: &str,
        meta: &ObjectMeta,
    ) -> Verdict {
        if since < self.retired_upto.load(SeqCst) {
            return Verdict::Banned;
        }
        let subject = Subject::new(primary, meta);
        let from = bans.partition_point(|b| b.id <= since);
        for ban in &bans[from..] {
            ban.tested.fetch_add(1, SeqCst);
            if ban.expr.matches(&subject) {
                ban.removed.fetch_add(1, SeqCst);
                return Verdict::Banned;
            }
        }
        Verdict::Clear(bans.last().map_or(since, |b| b.id.max(since)))
    }

    /// Marks every ban up to `upto` completed (the caller has made the walk's removals durable) and retires
    /// completed bans beyond the newest [`COMPLETED_KEPT`], so the list stays bounded under a stream of bans.
    /// The newest completed ban is always kept: after a restart it says how far bans are completed.
    /// Called from a blocking thread (the lurker's walk).
    pub(crate) fn complete(&self, upto: u64) -> Result<usize, StoreError> {
        let _adding = self.adding.blocking_lock();
        let current = self.snapshot();
        let done_after = |b: &Ban| b.id <= upto || b.completed.load(SeqCst);
        let newly = current
            .iter()
            .filter(|b| b.id <= upto && !b.completed.load(SeqCst))
            .count();
        let done = current.iter().filter(|b| done_after(b)).count();
        let mut retire = done.saturating_sub(COMPLETED_KEPT);
        if retire > 0 {
            let mut kept = Vec::with_capacity(current.len() - retire);
            for ban in current.iter() {
                if retire > 0 && done_after(ban) {
                    self.tree.remove(ban.id.to_be_bytes())?;
                    self.retired_upto.fetch_max(ban.id, SeqCst);
                    retire -= 1;
                } else {
                    kept.push(ban.clone());
                }
            }
            // Bounded before any ban shows completed: whoever sees no pending ban sees the list bounded.
            *self.list.write().expect("ban list lock") = Arc::new(kept);
        }
        self.completed_upto.fetch_max(upto, SeqCst);
        for ban in self.snapshot().iter().filter(|b| b.id <= upto) {
            ban.completed.store(true, SeqCst);
        }
        Ok(newly)
    }

    /// Persists every listed ban with its counters and completed flag (one write per ban per walk), so the
    /// list reads the same after a restart; a completion lost in a crash only means another walk.
    pub(crate) fn save_counters(&self) -> Result<(), StoreError> {
        for ban in self.snapshot().iter() {
            self.tree.insert(ban.id.to_be_bytes(), ban.encode())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_1_record_is_read_with_its_total_unknown() {
        let v1 = BanRecordV1 {
            created_ms: 5,
            expression: "req.url ~ \"^/a\"".into(),
            tested: 3,
            removed: 1,
            completed: false,
        };
        let mut bytes = vec![1];
        bincode::serde::encode_into_std_write(&v1, &mut bytes, bincode::config::standard())
            .unwrap();
        let ban = Ban::decode(7, &bytes).unwrap();
        let info = ban.info();
        assert_eq!(
            (info.id, info.tested, info.removed, info.to_test),
            (7, 3, 1, None)
        );

        let again = Ban::decode(
            7,
            &Ban {
                to_test: Some(40),
                ..ban
            }
            .encode(),
        )
        .unwrap();
        assert_eq!(again.info().to_test, Some(40), "version 2 keeps the total");
        assert!(Ban::decode(7, &[9, 0]).is_err());
    }
}
