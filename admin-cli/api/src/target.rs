//! Finding the daemon the way the daemon was configured: flags, then the environment, then the `[admin]`
//! section of its configuration file, then the defaults.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::{Path, PathBuf},
};

use serde::Deserialize;

pub const DEFAULT_ADMIN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 6082);
pub const DEFAULT_CONFIG: &str = "/etc/lacquer/lacquer.toml";
/// Where `lacquerd` generates its secret when it runs as the service (or as root).
pub const DEFAULT_SECRET: &str = "/var/lib/lacquer/secret";

/// A problem with how the tool was told to find the daemon: the caller exits with status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TargetError(String);

/// The flags every tool uses to find the daemon.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConnectArgs {
    /// Admin API address [default: `[admin] listen` of the config file, else 127.0.0.1:6082]
    #[arg(long, global = true, env = "LACQUER_ADMIN", value_name = "ADDR")]
    pub admin: Option<SocketAddr>,
    /// File holding the admin secret [default: `[admin] secret_file` of the config file, else
    /// /var/lib/lacquer/secret]
    #[arg(long, global = true, env = "LACQUER_SECRET_FILE", value_name = "FILE")]
    pub secret: Option<PathBuf>,
    /// lacquerd's configuration file, read for its [admin] section [default: /etc/lacquer/lacquer.toml,
    /// when it exists]
    #[arg(long, global = true, env = "LACQUER_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The store directory lacquerd was started with (its --disk DIR): the secret is DIR/secret, as
    /// lacquerd generates it there, unless --secret or the config file's [admin] secret_file says otherwise
    #[arg(long, global = true, env = "LACQUER_DISK", value_name = "DIR")]
    pub disk: Option<PathBuf>,
}

impl ConnectArgs {
    pub fn target(&self) -> Result<Target, TargetError> {
        let file = match &self.config {
            Some(path) => Some(DaemonConfig::read(path)?),
            None if Path::new(DEFAULT_CONFIG).exists() => {
                Some(DaemonConfig::read(Path::new(DEFAULT_CONFIG))?)
            }
            None => None,
        }
        .unwrap_or_default();
        let addr = self
            .admin
            .or(file.admin.listen)
            .map_or(DEFAULT_ADMIN, reachable);
        let secret_file = self
            .secret
            .clone()
            .or(file.admin.secret_file)
            // lacquerd's --disk wins over the file's storage.dir, so it does here too.
            .or_else(|| {
                self.disk
                    .clone()
                    .or(file.storage.dir)
                    .map(|dir| dir.join("secret"))
            })
            .unwrap_or_else(default_secret);
        Ok(Target { addr, secret_file })
    }
}

/// Where the daemon is and how to prove who we are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub addr: SocketAddr,
    pub secret_file: PathBuf,
}

/// The parts of `lacquer.toml` a client needs; the daemon validates the rest.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct DaemonConfig {
    admin: AdminSection,
    storage: StorageSection,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct AdminSection {
    listen: Option<SocketAddr>,
    secret_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StorageSection {
    dir: Option<PathBuf>,
}

impl DaemonConfig {
    fn read(path: &Path) -> Result<Self, TargetError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            TargetError(format!(
                "cannot read config file {}: {} (pass --config FILE, or --admin and --secret)",
                path.display(),
                io_reason(&e)
            ))
        })?;
        toml::from_str(&text).map_err(|e| {
            let at = e.span().map_or_else(String::new, |span| {
                let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
                format!(":{line}")
            });
            TargetError(format!(
                "{}{at}: {}",
                path.display(),
                e.message().trim().replace('\n', "; ")
            ))
        })
    }
}

/// A daemon listening on every address is reached on loopback.
fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), addr.port())
        }
        _ => addr,
    }
}

/// The service's secret when it exists; else the one `lacquerd` generates when run by a user who cannot write
/// `/var/lib/lacquer`.
fn default_secret() -> PathBuf {
    let system = PathBuf::from(DEFAULT_SECRET);
    let user = std::env::var_os("HOME")
        .map(|home| PathBuf::from(home).join(".local/state/lacquer/secret"));
    match user {
        Some(user) if !system.exists() && user.exists() => user,
        _ => system,
    }
}

pub(crate) fn io_reason(e: &std::io::Error) -> String {
    plain(&e.to_string())
}

/// "permission denied" rather than "Permission denied (os error 13)".
pub(crate) fn plain(message: &str) -> String {
    message
        .split(" (os error")
        .next()
        .unwrap_or_default()
        .to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(config: Option<&Path>) -> ConnectArgs {
        ConnectArgs {
            config: config.map(Path::to_owned),
            ..ConnectArgs::default()
        }
    }

    #[test]
    fn flags_win_over_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("lacquer.toml");
        std::fs::write(
            &config,
            "[admin]\nlisten = \"127.0.0.1:7000\"\nsecret_file = \"/etc/s\"\n",
        )
        .unwrap();
        let t = ConnectArgs {
            admin: Some("127.0.0.1:9".parse().unwrap()),
            secret: Some("/tmp/s".into()),
            config: Some(config.clone()),
            disk: Some("/srv/other".into()),
        }
        .target()
        .unwrap();
        assert_eq!(t.addr.to_string(), "127.0.0.1:9");
        assert_eq!(t.secret_file, PathBuf::from("/tmp/s"));
        let t = args(Some(&config)).target().unwrap();
        assert_eq!(t.addr.to_string(), "127.0.0.1:7000");
        assert_eq!(t.secret_file, PathBuf::from("/etc/s"));
    }

    #[test]
    fn the_secret_follows_the_store_directory_and_wildcards_mean_loopback() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("lacquer.toml");
        let text = "[server]\nworkers = 2\n[admin]\nlisten = \"0.0.0.0:6090\"\n[storage]\ndir = \"/srv/cache\"\n";
        std::fs::write(&config, text).unwrap();
        let t = args(Some(&config)).target().unwrap();
        assert_eq!(t.addr.to_string(), "127.0.0.1:6090");
        assert_eq!(t.secret_file, PathBuf::from("/srv/cache/secret"));
        let with_disk = ConnectArgs {
            disk: Some("/mnt/fast".into()),
            ..args(Some(&config))
        };
        assert_eq!(
            with_disk.target().unwrap().secret_file,
            PathBuf::from("/mnt/fast/secret"),
            "--disk wins over storage.dir, as it does for lacquerd"
        );
    }

    #[test]
    fn config_problems_are_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.toml");
        let e = args(Some(&missing)).target().unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "cannot read config file {}: no such file or directory (pass --config FILE, or --admin and --secret)",
                missing.display()
            )
        );
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, "[admin]\nlisten = \"nowhere\"\n").unwrap();
        let e = args(Some(&bad)).target().unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}:2: ", bad.display())), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
