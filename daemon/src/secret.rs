//! The admin secret: read from a file, or generated into one on first start.

use std::{
    io::Write,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::Path,
};

use anyhow::{bail, Context};

/// Reads the secret at `path`; creates it (random, mode 0600) when the file does not exist. A secret that
/// other users can read or change is refused, as ssh refuses such a private key: whoever can read it
/// can purge the cache and reconfigure the daemon.
pub fn load_or_create(path: &Path) -> anyhow::Result<String> {
    match read(path, "admin secret") {
        Ok(Some(secret)) => long_enough(secret, path, "admin secret"),
        Ok(None) => {
            let mut raw = [0u8; 32];
            getrandom::fill(&mut raw)
                .map_err(|e| anyhow::anyhow!("no randomness for the admin secret: {e}"))?;
            let secret: String = raw.iter().map(|b| format!("{b:02x}")).collect();
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
            }
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("cannot create admin secret {}", path.display()))?;
            writeln!(file, "{secret}")
                .with_context(|| format!("cannot write admin secret {}", path.display()))?;
            tracing::info!(path = %path.display(), "generated admin secret");
            Ok(secret)
        }
        Err(e) => Err(e),
    }
}

/// The secret `what` in `path`, trimmed; `None` when the file does not exist. One that other users can
/// read or change is refused, as ssh refuses such a private key.
pub fn read(path: &Path, what: &str) -> anyhow::Result<Option<String>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {what} {}", path.display())),
    };
    let mode = std::fs::metadata(path)
        .with_context(|| format!("cannot read {what} {}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        bail!(
            "{what} {path} is accessible by other users (mode {mode:04o}); \
             run `chmod 600 {path}` (and make the daemon's user its owner)",
            path = path.display(),
            mode = mode & 0o7777,
        );
    }
    Ok(Some(text.trim().to_owned()))
}

/// `secret`, when it is long enough not to be guessed.
pub fn long_enough(secret: String, path: &Path, what: &str) -> anyhow::Result<String> {
    if secret.len() < 16 {
        bail!("{what} in {} is shorter than 16 characters", path.display());
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_once_with_mode_0600_then_reuses() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/secret");
        let first = load_or_create(&path).unwrap();
        assert_eq!(first.len(), 64);
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(load_or_create(&path).unwrap(), first);
    }

    #[test]
    fn refuses_a_secret_other_users_can_read_or_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "0123456789abcdef0123\n").unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = load_or_create(&path).unwrap_err().to_string();
            assert!(
                err.contains(&format!("mode {mode:04o}"))
                    && err.contains(&format!("chmod 600 {}", path.display())),
                "{err}"
            );
        }
        for mode in [0o600, 0o400] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(load_or_create(&path).unwrap(), "0123456789abcdef0123");
        }
    }

    #[test]
    fn rejects_a_short_secret() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "abc\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(load_or_create(&path)
            .unwrap_err()
            .to_string()
            .contains("shorter than 16"));
    }
}
