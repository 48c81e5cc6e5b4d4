//! The invalidation journal: every purge and ban, appended to a file of its own and synced before it is
//! acknowledged (a cluster's log: before its revision is recorded as applied, see `store::durability`),
//! and replayed over the metadata at every start. sled's records can be rolled back by a
//! crash or damaged on disk; the journal is what keeps an invalidated body from coming back.
//!
//! Every stored body and every invalidation takes its id from one increasing sequence, so an entry applies
//! exactly to the bodies older than it: `generation < entry id`. The file starts with a checkpoint: bodies
//! older than its floor are invalid unless it lists them as kept, so entries older than the floor can be
//! retired and the file stays bounded.
//!
//! Records are framed `length (u32 LE) | crc32 (u32 LE) | bincode`. A short last record is an append that a
//! crash interrupted (never acknowledged) and is dropped; anything else unreadable means the journal cannot
//! vouch for the stored bodies, and the store drops them.

use std::{
    collections::HashSet,
    fs::{File, OpenOptions},
    io::Write,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering::SeqCst},
        Mutex,
    },
};

use serde::{Deserialize, Serialize};

use crate::error::StoreError;

pub(crate) const FILE: &str = "invalidations";
const MAGIC: &[u8; 8] = b"LQINVJ01";
/// A record longer than this is damage, not an entry (a purge of many tags is a few KiB).
const MAX_RECORD: usize = 64 << 20;
/// Entries past the checkpoint that make the sweeper compact the journal.
pub(crate) const COMPACT_AT: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Target {
    Key(String),
    Tags(Vec<String>),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Entry {
    /// First record of the file. Bodies older than `floor` are invalid unless listed in `kept`; `last` is
    /// the newest entry id ever appended, retired or not.
    Checkpoint {
        floor: u64,
        last: u64,
        kept: Vec<u64>,
    },
    Purge {
        id: u64,
        target: Target,
        soft: bool,
    },
    Ban {
        id: u64,
        expression: String,
    },
}

impl Entry {
    pub(crate) fn id(&self) -> u64 {
        match self {
            Entry::Checkpoint { .. } => 0,
            Entry::Purge { id, .. } | Entry::Ban { id, .. } => *id,
        }
    }
}

/// What reading the journal at start concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Readback {
    /// Every entry is there (a torn last append aside).
    Intact,
    /// No journal: a new store, or one from before the journal.
    Missing,
    /// The journal cannot vouch for the stored bodies; the reason.
    Damaged(String),
}

/// The journal's state in memory: the checkpoint and the entries after it.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) floor: u64,
    pub(crate) last: u64,
    pub(crate) kept: HashSet<u64>,
    pub(crate) entries: Vec<Entry>,
}

pub(crate) struct Journal {
    path: PathBuf,
    /// The append handle; `None` for a store that keeps nothing across restarts.
    file: Mutex<Option<File>>,
    state: Mutex<State>,
    next_id: AtomicU64,
    /// Appends (and what they apply to the metadata) hold it shared; a compaction takes it exclusively to
    /// wait for every entry it retires to be applied.
    applying: tokio::sync::RwLock<()>,
    /// Group commit: appends written, and the highest one a sync covered.
    written: AtomicU64,
    synced: AtomicU64,
    syncing: Mutex<()>,
}

fn frame(entry: &Entry) -> Vec<u8> {
    let payload = bincode::serde::encode_to_vec(entry, bincode::config::standard())
        .expect("encoding into a Vec cannot fail");
    let mut out = Vec::with_capacity(payload.len() + 8);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// Reads the records of a journal file: the entries, the length of the valid prefix, and whether it is
/// intact.
fn parse(bytes: &[u8]) -> (Vec<Entry>, usize, Readback) {
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return (Vec::new(), 0, Readback::Damaged("bad magic".into()));
    }
    let mut entries = Vec::new();
    let mut at = MAGIC.len();
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.len() < 8 {
            return (entries, at, Readback::Intact);
        }
        let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
        if len > MAX_RECORD {
            return (
                entries,
                at,
                Readback::Damaged(format!("record at {at} claims {len} bytes")),
            );
        }
        if rest.len() < 8 + len {
            // An append cut short by a crash: it was never acknowledged.
            return (entries, at, Readback::Intact);
        }
        let payload = &rest[8..8 + len];
        if crc32fast::hash(payload) != crc {
            return (
                entries,
                at,
                Readback::Damaged(format!("checksum mismatch at {at}")),
            );
        }
        match bincode::serde::decode_from_slice::<Entry, _>(payload, bincode::config::standard()) {
            Ok((entry, _)) => entries.push(entry),
            Err(e) => {
                return (
                    entries,
                    at,
                    Readback::Damaged(format!("record at {at}: {e}")),
                )
            }
        }
        at += 8 + len;
    }
    (entries, at, Readback::Intact)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

fn io(path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Journal {
        path: path.to_owned(),
        source: e,
    }
}

impl Journal {
    /// A journal that keeps nothing (the store itself does not outlive the process).
    pub(crate) fn volatile() -> Self {
        Self {
            path: PathBuf::new(),
            file: Mutex::new(None),
            state: Mutex::new(State::default()),
            next_id: AtomicU64::new(1),
            applying: tokio::sync::RwLock::new(()),
            written: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            syncing: Mutex::new(()),
        }
    }

    /// Reads the journal in `dir`; it is not written until [`Journal::start`].
    pub(crate) fn read(dir: &Path) -> Result<(Self, Readback), StoreError> {
        let path = dir.join(FILE);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => Some(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(&path, e)),
        };
        let mut state = State::default();
        let readback = match bytes {
            None => Readback::Missing,
            Some(bytes) => {
                let (entries, _, mut readback) = parse(&bytes);
                let mut entries = entries.into_iter();
                match entries.next() {
                    Some(Entry::Checkpoint { floor, last, kept }) => {
                        state.floor = floor;
                        state.last = last;
                        state.kept = kept.into_iter().collect();
                    }
                    _ if readback == Readback::Intact => {
                        readback = Readback::Damaged("no checkpoint".into())
                    }
                    _ => {}
                }
                state.entries = entries.collect();
                state.last = state
                    .entries
                    .iter()
                    .map(Entry::id)
                    .fold(state.last, u64::max);
                readback
            }
        };
        let journal = Self {
            path,
            file: Mutex::new(None),
            state: Mutex::new(state),
            next_id: AtomicU64::new(1),
            applying: tokio::sync::RwLock::new(()),
            written: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            syncing: Mutex::new(()),
        };
        Ok((journal, readback))
    }

    /// The newest entry id the journal knows of.
    pub(crate) fn last(&self) -> u64 {
        self.state.lock().expect("journal state").last
    }

    /// Starts the journal after the start-up replay: ids continue from `next_id`; when `fresh`, the file is
    /// rewritten with only a checkpoint at `floor` (every older body is gone or invalid).
    pub(crate) fn start(&self, next_id: u64, fresh: Option<u64>) -> Result<(), StoreError> {
        self.next_id.store(next_id, SeqCst);
        if let Some(floor) = fresh {
            let mut state = self.state.lock().expect("journal state");
            state.floor = floor;
            state.kept.clear();
            state.entries.clear();
        }
        self.rewrite()
    }

    /// A new id in the sequence bodies and invalidations share.
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, SeqCst)
    }

    /// Appends `entries`, in order, and syncs them: once this returns, a crash cannot lose any of them.
    /// One write and one sync for all of them, and syncs are grouped across callers too: entries written
    /// while a sync runs are covered by the next one, so a stampede of purges costs one `fsync` per batch,
    /// not per purge.
    pub(crate) fn append(&self, entries: Vec<Entry>) -> Result<(), StoreError> {
        let (ticket, handle) = self.write(entries)?;
        let Some(handle) = handle else {
            return Ok(());
        };
        self.sync_upto(ticket, &handle)
    }

    /// Appends `entries`, in order, without syncing them: a killed process does not lose them (they are
    /// in the kernel's cache), a crash of the machine may, until the next [`Journal::sync`] or
    /// [`Journal::append`]. Only for entries something else keeps durably (a cluster's log), which must
    /// be replayed after a crash that lost them.
    pub(crate) fn append_unsynced(&self, entries: Vec<Entry>) -> Result<(), StoreError> {
        self.write(entries).map(drop)
    }

    /// Syncs every entry appended so far; returns the newest id among them, which a crash can no longer
    /// take from the file.
    pub(crate) fn sync(&self) -> Result<u64, StoreError> {
        let (ticket, last, handle) = {
            let file = self.file.lock().expect("journal file");
            let handle = match file.as_ref() {
                Some(file) => Some(file.try_clone().map_err(|e| io(&self.path, e))?),
                None => None,
            };
            // Read under the file lock: every entry up to `last` is written, since appends update the
            // state under it after their write.
            (self.written.load(SeqCst), self.last(), handle)
        };
        if let Some(handle) = handle {
            self.sync_upto(ticket, &handle)?;
        }
        Ok(last)
    }

    /// Writes `entries` to the file (not synced); returns their ticket for [`Journal::sync_upto`] and a
    /// handle to sync with (`None` for a volatile journal).
    fn write(&self, entries: Vec<Entry>) -> Result<(u64, Option<File>), StoreError> {
        let mut file = self.file.lock().expect("journal file");
        let handle = match file.as_mut() {
            Some(file) => {
                let at = file.metadata().map_err(|e| io(&self.path, e))?.len();
                let bytes: Vec<u8> = entries.iter().flat_map(frame).collect();
                if let Err(e) = file.write_all(&bytes) {
                    // A partial record in the middle of the file would read as damage at the next start.
                    let _ = file.set_len(at);
                    return Err(io(&self.path, e));
                }
                Some(file.try_clone().map_err(|e| io(&self.path, e))?)
            }
            None => None,
        };
        let mut state = self.state.lock().expect("journal state");
        state.last = entries.iter().map(Entry::id).fold(state.last, u64::max);
        state.entries.extend(entries);
        Ok((self.written.fetch_add(1, SeqCst) + 1, handle))
    }

    /// Returns once a sync covered every write up to `ticket`, running one unless a sync that started
    /// after that write already did.
    fn sync_upto(&self, ticket: u64, handle: &File) -> Result<(), StoreError> {
        let _one = self.syncing.lock().expect("journal sync");
        if self.synced.load(SeqCst) >= ticket {
            return Ok(());
        }
        let upto = self.written.load(SeqCst);
        handle.sync_data().map_err(|e| io(&self.path, e))?;
        self.synced.fetch_max(upto, SeqCst);
        Ok(())
    }

    /// Reads the checkpoint and the entries after it (the start-up replay indexes them), holding the
    /// journal's state lock meanwhile: appends wait.
    pub(crate) fn view<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.state.lock().expect("journal state"))
    }

    /// Held (shared) by whoever appends an invalidation, from taking its id until what it invalidates is
    /// applied to the metadata: [`Journal::retirable`] waits for every holder, so a compaction never
    /// retires an entry whose effect is not yet in the records it keeps.
    pub(crate) async fn applying(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.applying.read().await
    }

    /// The ids of the entries a compaction may retire now: every purge (applied before it was
    /// acknowledged) and every ban `pending` does not claim. Waits for appends in progress to be applied
    /// first; blocks, so it runs on the sweeper's thread.
    pub(crate) fn retirable(&self, pending: impl Fn(u64) -> bool) -> HashSet<u64> {
        let _applied = self.applying.blocking_write();
        let state = self.state.lock().expect("journal state");
        state
            .entries
            .iter()
            .filter(|e| match e {
                Entry::Ban { id, .. } => !pending(*id),
                _ => true,
            })
            .map(Entry::id)
            .collect()
    }

    /// Entries past the checkpoint.
    pub(crate) fn len(&self) -> usize {
        self.state.lock().expect("journal state").entries.len()
    }

    /// Replaces the entries in `retired` by a checkpoint at `floor` keeping `kept` (bodies older than the
    /// floor that are still stored and were checked against every retired entry).
    pub(crate) fn compact(
        &self,
        floor: u64,
        retired: &HashSet<u64>,
        kept: Vec<u64>,
    ) -> Result<(), StoreError> {
        {
            let mut state = self.state.lock().expect("journal state");
            state.floor = state.floor.max(floor);
            state.kept = kept.into_iter().collect();
            state.entries.retain(|e| !retired.contains(&e.id()));
        }
        self.rewrite()
    }

    /// Writes the whole journal to a new file and puts it in place (synced, then renamed).
    fn rewrite(&self) -> Result<(), StoreError> {
        let mut file = self.file.lock().expect("journal file");
        if self.path.as_os_str().is_empty() {
            return Ok(());
        }
        let mut bytes = MAGIC.to_vec();
        {
            let state = self.state.lock().expect("journal state");
            let mut kept: Vec<u64> = state.kept.iter().copied().collect();
            kept.sort_unstable();
            bytes.extend(frame(&Entry::Checkpoint {
                floor: state.floor,
                last: state.last,
                kept,
            }));
            for entry in &state.entries {
                bytes.extend(frame(entry));
            }
        }
        let tmp = self.path.with_extension("new");
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let write = || -> std::io::Result<File> {
            let mut f = File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)?;
            sync_dir(dir)?;
            OpenOptions::new().append(true).open(&self.path)
        };
        *file = Some(write().map_err(|e| io(&self.path, e))?);
        // The new file was synced whole: every append written so far is durable.
        self.synced.fetch_max(self.written.load(SeqCst), SeqCst);
        Ok(())
    }

    /// Reads a journal file back (for tests and tools): its entries and whether it is intact.
    #[cfg(test)]
    pub(crate) fn read_file(path: &Path) -> (Vec<Entry>, Readback) {
        let (entries, _, readback) = parse(&std::fs::read(path).unwrap());
        (entries, readback)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn purge(id: u64, key: &str) -> Entry {
        Entry::Purge {
            id,
            target: Target::Key(key.into()),
            soft: false,
        }
    }

    #[test]
    fn appends_survive_a_reopen_and_a_torn_tail_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let (j, readback) = Journal::read(dir.path()).unwrap();
        assert_eq!(readback, Readback::Missing);
        j.start(10, Some(0)).unwrap();
        j.append(vec![purge(10, "a")]).unwrap();
        j.append(vec![Entry::Ban {
            id: 11,
            expression: "req.url ~ x".into(),
        }])
        .unwrap();
        drop(j);
        let path = dir.path().join(FILE);
        let full = std::fs::metadata(&path).unwrap().len();
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(full - 3).unwrap();
        let (j, readback) = Journal::read(dir.path()).unwrap();
        assert_eq!(
            readback,
            Readback::Intact,
            "a torn append was never acknowledged"
        );
        assert_eq!(j.state.lock().unwrap().entries, vec![purge(10, "a")]);
        assert_eq!(j.last(), 10);
    }

    #[test]
    fn concurrent_appends_are_all_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (j, _) = Journal::read(dir.path()).unwrap();
        j.start(1, Some(0)).unwrap();
        let j = std::sync::Arc::new(j);
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let j = j.clone();
                std::thread::spawn(move || {
                    for n in 0..50 {
                        j.append(vec![purge(1 + t * 50 + n, "k")]).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let (entries, readback) = Journal::read_file(&dir.path().join(FILE));
        assert_eq!(readback, Readback::Intact);
        assert_eq!(entries.len(), 1 + 400);
        assert!(j.synced.load(SeqCst) >= 400, "every append was synced");
    }

    #[test]
    fn unsynced_appends_are_kept_in_order_and_covered_by_the_next_sync() {
        let dir = tempfile::tempdir().unwrap();
        let (j, _) = Journal::read(dir.path()).unwrap();
        j.start(1, Some(0)).unwrap();
        j.append_unsynced(vec![purge(1, "a")]).unwrap();
        j.append_unsynced(vec![purge(2, "b")]).unwrap();
        assert_eq!(j.synced.load(SeqCst), 0, "not synced by the appends");
        assert_eq!(j.sync().unwrap(), 2, "the newest id the sync covered");
        assert!(j.synced.load(SeqCst) >= 2);
        j.append(vec![purge(3, "c")]).unwrap();
        let (entries, readback) = Journal::read_file(&dir.path().join(FILE));
        assert_eq!(readback, Readback::Intact);
        assert_eq!(entries[1..], [purge(1, "a"), purge(2, "b"), purge(3, "c")]);
    }

    #[test]
    fn damage_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let (j, _) = Journal::read(dir.path()).unwrap();
        j.start(1, Some(0)).unwrap();
        j.append(vec![purge(1, "a")]).unwrap();
        j.append(vec![purge(2, "b")]).unwrap();
        drop(j);
        let path = dir.path().join(FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 4] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let (_, readback) = Journal::read(dir.path()).unwrap();
        assert!(matches!(readback, Readback::Damaged(r) if r.contains("checksum")));
        std::fs::write(&path, b"garbage").unwrap();
        let (_, readback) = Journal::read(dir.path()).unwrap();
        assert!(matches!(readback, Readback::Damaged(_)));
    }

    #[test]
    fn compaction_retires_entries_and_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let (j, _) = Journal::read(dir.path()).unwrap();
        j.start(1, Some(0)).unwrap();
        for id in 1..=5 {
            j.append(vec![purge(id, "k")]).unwrap();
        }
        j.compact(4, &[1, 2, 3].into_iter().collect(), vec![2])
            .unwrap();
        j.append(vec![purge(6, "k")]).unwrap();
        let (entries, readback) = Journal::read_file(&dir.path().join(FILE));
        assert_eq!(readback, Readback::Intact);
        assert_eq!(
            entries,
            vec![
                Entry::Checkpoint {
                    floor: 4,
                    last: 5,
                    kept: vec![2]
                },
                purge(4, "k"),
                purge(5, "k"),
                purge(6, "k"),
            ]
        );
    }
}
