//! The admin secret: read from a file, or generated into one on first start.

use std::{
    io::Write,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use anyhow::{anyhow, bail, Context};

/// The admin secret, and the file an operator reads it from.
pub struct Secret {
    pub value: String,
    pub file: PathBuf,
}

/// The secret at `path` ([`load_or_create`]). When `path` is the default one (inside the store directory)
/// and cannot be read or created there (a read-only or unwritable store directory, which the store
/// survives by running memory-only), lacquerd still starts: with a new secret for this run, written to a
/// file of its own in the runtime directory (`$RUNTIME_DIRECTORY`, `$XDG_RUNTIME_DIR`, else the
/// temporary directory), and said in the log. A secret file the operator named (`--secret`) must work,
/// and one that other users can read is refused wherever it is.
pub fn load(path: &Path, default_location: bool) -> anyhow::Result<Secret> {
    match load_or_create(path) {
        Ok(value) => Ok(Secret {
            value,
            file: path.to_owned(),
        }),
        Err(Refused::Unsafe(e)) => Err(e),
        Err(Refused::Unusable(e)) if !default_location => Err(e),
        Err(Refused::Unusable(e)) => {
            let file = runtime_dir().join(format!("lacquer-admin-secret.{}", std::process::id()));
            let value = create(&file).map_err(|fallback| {
                fallback.context(format!(
                    "{e:#}; and no file for a secret of this run either: start with --secret FILE"
                ))
            })?;
            tracing::warn!(
                default = %path.display(),
                error = %format!("{e:#}"),
                file = %file.display(),
                "the admin secret cannot be kept in the store directory: this run uses a new one, in \
                 file (cachectl --secret-file, or LACQUER_SECRET_FILE); --secret FILE names a lasting one"
            );
            Ok(Secret { value, file })
        }
    }
}

fn runtime_dir() -> PathBuf {
    ["RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR"]
        .into_iter()
        .find_map(|var| std::env::var_os(var).filter(|v| !v.is_empty()))
        .map_or_else(std::env::temp_dir, PathBuf::from)
}

/// Why [`load_or_create`] gave no secret.
enum Refused {
    /// A secret that exists but must not be used (readable by others, too short): the operator must fix
    /// it, wherever it is.
    Unsafe(anyhow::Error),
    /// The file cannot be read, or created where it is missing.
    Unusable(anyhow::Error),
}

/// Reads the secret at `path`; creates it (random, mode 0600) when the file does not exist. A secret that
/// other users can read or change is refused, as ssh refuses such a private key: whoever can read it
/// can purge the cache and reconfigure the daemon.
fn load_or_create(path: &Path) -> Result<String, Refused> {
    match read_checked(path, "admin secret")? {
        Some(secret) => long_enough(secret, path, "admin secret").map_err(Refused::Unsafe),
        None => {
            let secret = create(path).map_err(Refused::Unusable)?;
            tracing::info!(path = %path.display(), "generated admin secret");
            Ok(secret)
        }
    }
}

/// The secret `what` in `path`, trimmed; `None` when the file does not exist. One that other users can
/// read or change is refused, as ssh refuses such a private key.
pub fn read(path: &Path, what: &str) -> anyhow::Result<Option<String>> {
    read_checked(path, what).map_err(|(Refused::Unsafe(e) | Refused::Unusable(e))| e)
}

fn read_checked(path: &Path, what: &str) -> Result<Option<String>, Refused> {
    let unusable = |e: std::io::Error| {
        Refused::Unusable(
            anyhow::Error::from(e).context(format!("cannot read {what} {}", path.display())),
        )
    };
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(unusable(e)),
    };
    let mode = std::fs::metadata(path)
        .map_err(unusable)?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(Refused::Unsafe(anyhow!(
            "{what} {path} is accessible by other users (mode {mode:04o}); \
             run `chmod 600 {path}` (and make the daemon's user its owner)",
            path = path.display(),
            mode = mode & 0o7777,
        )));
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

/// A new random secret in a new file at `path` (mode 0600; never an existing file or a link's target).
fn create(path: &Path) -> anyhow::Result<String> {
    let mut raw = [0u8; 32];
    getrandom::fill(&mut raw).map_err(|e| anyhow!("no randomness for the admin secret: {e}"))?;
    let secret: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create admin secret {}", path.display()))?;
    writeln!(file, "{secret}")
        .with_context(|| format!("cannot write admin secret {}", path.display()))?;
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_once_with_mode_0600_then_reuses() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/secret");
        let first = load(&path, false).unwrap().value;
        assert_eq!(first.len(), 64);
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(load(&path, false).unwrap().value, first);
    }

    #[test]
    fn refuses_a_secret_other_users_can_read_or_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "0123456789abcdef0123\n").unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = load(&path, true).err().unwrap().to_string();
            assert!(
                err.contains(&format!("mode {mode:04o}"))
                    && err.contains(&format!("chmod 600 {}", path.display())),
                "{err}"
            );
        }
        for mode in [0o600, 0o400] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(load(&path, true).unwrap().value, "0123456789abcdef0123");
        }
    }

    #[test]
    fn rejects_a_short_secret() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "abc\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(load(&path, true)
            .err()
            .unwrap()
            .to_string()
            .contains("shorter than 16"));
    }
}
