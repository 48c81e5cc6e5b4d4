//! The admin API client shared by `cachectl` and `cachetop`: finds the daemon the way the daemon is
//! configured, and turns every failure into one line that says what to do.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{header, Method, Request, StatusCode};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};

pub const DEFAULT_ADMIN: &str = "127.0.0.1:6082";
/// Where `lacquerd` generates its secret when run with its default store directory.
pub const DEFAULT_SECRET: &str = "/var/lib/lacquer/secret";

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("cannot reach lacquerd at {addr}: {reason} (is the service running?)")]
    Unreachable { addr: SocketAddr, reason: String },
    #[error("unauthorized: the secret in {path} does not match")]
    Unauthorized { path: PathBuf },
    #[error("cannot read the admin secret {path}: {reason} (pass --secret FILE or set LACQUER_SECRET_FILE)")]
    Secret { path: PathBuf, reason: String },
    #[error("lacquerd answered {status}: {message}")]
    Refused { status: StatusCode, message: String },
}

impl AdminError {
    /// 3 when the daemon cannot be used at all (down, wrong secret), 1 when it refused the operation.
    pub fn exit_code(&self) -> u8 {
        match self {
            AdminError::Refused { .. } => 1,
            _ => 3,
        }
    }
}

/// The flags every tool uses to find the daemon.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnectArgs {
    /// Admin API address [env: LACQUER_ADMIN] [default: 127.0.0.1:6082]
    #[arg(long, global = true)]
    pub admin: Option<SocketAddr>,
    /// File holding the admin secret [env: LACQUER_SECRET_FILE] [default: /var/lib/lacquer/secret]
    #[arg(long, global = true)]
    pub secret: Option<PathBuf>,
}

impl ConnectArgs {
    /// A client for the daemon these flags (or the environment, or the defaults) point at; on a bad
    /// `LACQUER_ADMIN` the message a tool prints before exiting with status 2.
    pub fn client(self) -> Result<AdminClient, String> {
        Target::discover(self.admin, self.secret).map(AdminClient::new)
    }
}

/// Where the daemon is and how to prove who we are.
#[derive(Debug, Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub secret_file: PathBuf,
}

impl Target {
    /// Flags first, then `LACQUER_ADMIN` / `LACQUER_SECRET_FILE`, then the defaults.
    pub fn discover(
        addr: Option<SocketAddr>,
        secret_file: Option<PathBuf>,
    ) -> Result<Self, String> {
        let addr = match addr {
            Some(a) => a,
            None => {
                let text =
                    std::env::var("LACQUER_ADMIN").unwrap_or_else(|_| DEFAULT_ADMIN.to_owned());
                text.parse().map_err(|_| {
                    format!("LACQUER_ADMIN={text:?} is not an address like {DEFAULT_ADMIN}")
                })?
            }
        };
        let secret_file = secret_file
            .or_else(|| std::env::var_os("LACQUER_SECRET_FILE").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_SECRET));
        Ok(Self { addr, secret_file })
    }
}

pub struct AdminClient {
    target: Target,
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
}

impl AdminClient {
    pub fn new(target: Target) -> Self {
        Self {
            target,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    fn secret(&self) -> Result<String, AdminError> {
        read_secret(&self.target.secret_file)
    }

    /// GETs a JSON document; `authorized` routes send the secret.
    pub async fn get_json(
        &self,
        path: &str,
        authorized: bool,
    ) -> Result<serde_json::Value, AdminError> {
        let mut req = Request::builder()
            .method(Method::GET)
            .uri(format!("http://{}{path}", self.target.addr));
        if authorized {
            req = req.header(header::AUTHORIZATION, format!("Bearer {}", self.secret()?));
        }
        let req = req.body(Full::new(Bytes::new())).expect("valid request");
        let unreachable = |reason: String| AdminError::Unreachable {
            addr: self.target.addr,
            reason,
        };
        let resp = tokio::time::timeout(Duration::from_secs(10), self.client.request(req))
            .await
            .map_err(|_| unreachable("no answer within 10 s".into()))?
            .map_err(|e| unreachable(root_cause(&e)))?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| unreachable(e.to_string()))?
            .to_bytes();
        let json: serde_json::Value =
            serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
        match status {
            s if s.is_success() => Ok(json),
            StatusCode::UNAUTHORIZED => Err(AdminError::Unauthorized {
                path: self.target.secret_file.clone(),
            }),
            status => Err(AdminError::Refused {
                status,
                message: json["message"].as_str().unwrap_or("no message").to_owned(),
            }),
        }
    }

    pub async fn health(&self) -> Result<serde_json::Value, AdminError> {
        self.get_json("/v1/health", false).await
    }

    pub async fn stats(&self) -> Result<serde_json::Value, AdminError> {
        self.get_json("/v1/stats", true).await
    }
}

fn read_secret(path: &Path) -> Result<String, AdminError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|e| AdminError::Secret {
            path: path.to_owned(),
            reason: e.to_string(),
        })
}

/// The innermost error: "connection refused" rather than hyper's "client error (Connect)".
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
        .split(" (os error")
        .next()
        .unwrap_or_default()
        .to_lowercase()
}

/// Flattens a stats document into `(section.name, value)` rows, in document order.
pub fn flatten(
    prefix: &str,
    value: &serde_json::Value,
    out: &mut Vec<(String, serde_json::Value)>,
) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        other => out.push((prefix.to_owned(), other.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flatten_keeps_order_and_nests_names() {
        let v = serde_json::json!({"uptime_seconds": 3, "proxy": {"requests": 5, "hits": 4}});
        let mut rows = Vec::new();
        flatten("", &v, &mut rows);
        let names: Vec<_> = rows.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["uptime_seconds", "proxy.requests", "proxy.hits"]);
    }

    #[test]
    fn discovery_prefers_flags() {
        let t =
            Target::discover(Some("127.0.0.1:9".parse().unwrap()), Some("/tmp/s".into())).unwrap();
        assert_eq!(t.addr.to_string(), "127.0.0.1:9");
        assert_eq!(t.secret_file, PathBuf::from("/tmp/s"));
    }
}
