use std::path::PathBuf;

/// Everything that can go wrong in the store, with the context an operator needs to act on it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create store directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open metadata database in {path}: {source}")]
    OpenMetadata { path: PathBuf, source: sled::Error },
    #[error("cannot open body cache in {path}: {source}")]
    OpenBodies { path: PathBuf, source: foyer::Error },
    #[error("metadata database: {0}")]
    Metadata(#[from] sled::Error),
    #[error("metadata record for {key:?} is unreadable: {reason}")]
    CorruptMetadata { key: String, reason: String },
    #[error("body cache: {0}")]
    Bodies(#[from] foyer::Error),
    #[error("cannot start the {name} thread: {source}")]
    Background {
        name: &'static str,
        source: std::io::Error,
    },
    #[error("store is shutting down")]
    Closed,
    #[error("the store's disk is full: not storing new objects")]
    DiskFull,
    #[error("a store task has died: not storing new objects")]
    Unavailable,
    #[error("invalidation journal {path}: {source}")]
    Journal {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("store directory {path} is in use by another process")]
    Locked { path: PathBuf },
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
