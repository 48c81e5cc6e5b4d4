//! The files beside the store: a certificate's chain and key in one PEM file, the ACME accounts' keys;
//! mode 0600 in a 0700 directory, each replaced whole (written aside, synced, renamed), so that a crash
//! leaves the old file or the new one, never half of either or a chain beside another's key.

use std::{
    fs,
    io::{self, Write},
    os::unix::fs::{DirBuilderExt, OpenOptionsExt},
    path::Path,
};

/// The file's bytes; `None` when there is none yet.
pub(crate) fn read(file: &Path) -> io::Result<Option<Vec<u8>>> {
    match fs::read(file) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Replaces `file` with `bytes`, readable by this user only.
pub(crate) fn write(file: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = file.parent().expect("a file in a directory");
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let aside = file.with_extension("new");
    let _ = fs::remove_file(&aside);
    let mut out = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&aside)?;
    out.write_all(bytes)?;
    out.sync_all()?;
    fs::rename(&aside, file)?;
    fs::File::open(dir)?.sync_all()
}

/// [`read`] off the runtime's threads.
pub(crate) async fn read_async(file: std::path::PathBuf) -> io::Result<Option<Vec<u8>>> {
    tokio::task::spawn_blocking(move || read(&file))
        .await
        .map_err(io::Error::other)?
}

/// [`write`] off the runtime's threads (it syncs).
pub(crate) async fn write_async(file: std::path::PathBuf, bytes: Vec<u8>) -> io::Result<()> {
    tokio::task::spawn_blocking(move || write(&file, &bytes))
        .await
        .map_err(io::Error::other)?
}

/// Whether files can be kept in `dir` (made 0700 if missing): a file is written and removed.
pub(crate) fn writable(dir: &Path) -> io::Result<()> {
    write(&dir.join(".writable"), b"")?;
    fs::remove_file(dir.join(".writable"))
}
