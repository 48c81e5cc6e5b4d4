//! Bans and purges (`/v1/bans`, `/v1/purge`, `/v1/purge/tags`); the semantics are in docs/invalidation.md.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/bans`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewBan {
    /// e.g. `req.url ~ "^/products/" && obj.http.content-type ~ "json"`.
    #[schema(example = "req.url ~ \"^/products/\"")]
    pub expression: String,
}

/// A ban, as listed and as answered when added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BanView {
    pub id: u64,
    /// The expression in canonical form.
    pub expression: String,
    /// When it was added, in Unix seconds.
    pub created: u64,
    pub age_seconds: u64,
    /// Objects tested against it.
    pub tested: u64,
    /// Objects it removed.
    pub removed: u64,
    /// Objects stored when it was added: what it has to be tested against, so `tested` of `to_test` is its
    /// progress (`tested` may pass it: bodies fetched meanwhile are tested too). `null` for a ban added by
    /// a lacquerd that did not record it.
    #[serde(default)]
    pub to_test: Option<u64>,
    /// The lurker has tested every object stored before the ban: it can no longer match anything.
    pub completed: bool,
}

impl BanView {
    /// Percent done: 100 once completed; while pending, `tested` of `to_test`, held below 100 (only the
    /// lurker's walk completes a ban). `None` while pending with no total.
    pub fn percent(&self) -> Option<u64> {
        if self.completed {
            return Some(100);
        }
        let total = self.to_test.filter(|&t| t > 0)?;
        Some((self.tested.saturating_mul(100) / total).min(99))
    }
}

/// `GET /v1/bans`: oldest first; the newest 100 completed bans stay listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BanList {
    pub bans: Vec<BanView>,
}

/// `POST /v1/purge`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PurgeUrl {
    /// `http://host/path?query`, or `/path?query` with `host`.
    #[schema(example = "http://www.example.com/index.html")]
    pub url: String,
    /// The host, when `url` has none (or to override it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Expire instead of removing: the object is still served stale within its grace while it is fetched
    /// again.
    #[serde(default)]
    pub soft: bool,
}

/// `POST /v1/purge/tags`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PurgeTags {
    /// Surrogate keys (from `Surrogate-Key`, `xkey` or `Cache-Tag`); an object carrying any of them is purged.
    pub tags: Vec<String>,
    #[serde(default)]
    pub soft: bool,
}

/// What a purge did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Purged {
    /// Stored objects (variants) removed, or expired for a soft purge.
    pub purged: u64,
    pub soft: bool,
}
