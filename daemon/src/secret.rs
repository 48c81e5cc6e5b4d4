//! The admin secret: read from a file, or generated into one on first start.

use std::{io::Write, os::unix::fs::OpenOptionsExt, path::Path};

use anyhow::{bail, Context};

/// Reads the secret at `path`; creates it (random, mode 0600) when the file does not exist.
pub fn load_or_create(path: &Path) -> anyhow::Result<String> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let secret = text.trim().to_owned();
            if secret.len() < 16 {
                bail!(
                    "admin secret in {} is shorter than 16 characters",
                    path.display()
                );
            }
            Ok(secret)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
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
        Err(e) => Err(e).with_context(|| format!("cannot read admin secret {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

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
    fn rejects_a_short_secret() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "abc\n").unwrap();
        assert!(load_or_create(&path)
            .unwrap_err()
            .to_string()
            .contains("shorter than 16"));
    }
}
