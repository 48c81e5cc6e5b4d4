use std::path::PathBuf;

/// Everything that can go wrong in the store, with the context an operator needs to act on it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store directory (or a file the store keeps in it) cannot be created or opened. At open this
    /// makes the store memory-only rather than fail.
    #[error("cannot create store directory {path}: {source}")]
    CreateDir {
        /// The directory or file.
        path: PathBuf,
        /// What the filesystem said.
        source: std::io::Error,
    },
    /// sled cannot open its database: at open the store is moved aside and started empty.
    #[error("cannot open metadata database in {path}: {source}")]
    OpenMetadata {
        /// sled's directory (`<store>/meta`).
        path: PathBuf,
        /// What sled said.
        source: sled::Error,
    },
    /// foyer cannot open its disk tier: at open the store is moved aside and started empty.
    #[error("cannot open body cache in {path}: {source}")]
    OpenBodies {
        /// foyer's directory (`<store>/bodies`).
        path: PathBuf,
        /// What foyer said.
        source: foyer::Error,
    },
    /// A sled operation failed while the store was running (an IO error, usually).
    #[error("metadata database: {0}")]
    Metadata(#[from] sled::Error),
    /// A metadata record cannot be decoded; the store drops such a record and counts it
    /// (`corrupt_records`), so callers see this only from decoding directly.
    #[error("metadata record for {key:?} is unreadable: {reason}")]
    CorruptMetadata {
        /// The record's cache key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A foyer operation failed (reading a chunk from the disk tier, usually).
    #[error("body cache: {0}")]
    Bodies(#[from] foyer::Error),
    /// A background thread (sweeper, lurker) could not be started.
    #[error("cannot start the {name} thread: {source}")]
    Background {
        /// Which thread.
        name: &'static str,
        /// What the OS said.
        source: std::io::Error,
    },
    /// [`crate::Store::close`] has begun, or the writer task is gone: nothing new is stored.
    #[error("store is shutting down")]
    Closed,
    /// A fill refused because the store's filesystem is below its free-space reserve (a refusal, see
    /// [`StoreError::is_refusal`]).
    #[error("the store's disk is full: not storing new objects")]
    DiskFull,
    /// A fill refused because a store task has died (a refusal, see [`StoreError::is_refusal`]).
    #[error("a store task has died: not storing new objects")]
    Unavailable,
    /// The invalidation journal cannot be read, written or synced: the purge or ban is not acknowledged.
    #[error("invalidation journal {path}: {source}")]
    Journal {
        /// The journal file.
        path: PathBuf,
        /// What the filesystem said.
        source: std::io::Error,
    },
    /// Another process holds the store directory: the store is not opened (never moved aside or shared).
    #[error("store directory {path} is in use by another process")]
    Locked {
        /// The store (or sled) directory.
        path: PathBuf,
    },
    /// A [`crate::StoreBuilder`] setting that cannot work; says which and why.
    #[error("invalid store setting: {0}")]
    Config(String),
}

impl StoreError {
    /// A fill the store declined on purpose (full disk, dead task): already logged and counted by the store,
    /// so callers need not report each one.
    pub fn is_refusal(&self) -> bool {
        matches!(self, StoreError::DiskFull | StoreError::Unavailable)
    }
}
