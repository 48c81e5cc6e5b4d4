//! `/v1/bans`, `/v1/purge` and `/v1/purge/tags`: invalidation for operators and deploy scripts.

use axum::{
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use lacquer_storage::{BanExpr, BanInfo};
use serde::{Deserialize, Serialize};

use super::{api_error, AdminState, ApiJson};
use crate::{
    invalidation::{self, PurgeTarget},
    proxy::now_ms,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewBan {
    pub expression: String,
}

#[derive(Serialize)]
pub struct BanView {
    pub id: u64,
    pub expression: String,
    /// Unix seconds.
    pub created: u64,
    pub age_seconds: u64,
    pub tested: u64,
    pub removed: u64,
    /// The lurker has tested every object stored before the ban: it can no longer match anything.
    pub completed: bool,
}

impl BanView {
    fn new(info: BanInfo, now_ms: u64) -> Self {
        Self {
            id: info.id,
            expression: info.expression,
            created: info.created_ms / 1000,
            age_seconds: now_ms.saturating_sub(info.created_ms) / 1000,
            tested: info.tested,
            removed: info.removed,
            completed: info.completed,
        }
    }
}

#[derive(Serialize)]
pub struct BanList {
    pub bans: Vec<BanView>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PurgeUrl {
    /// `http://host/path?query`, or `/path?query` with `host`.
    pub url: String,
    /// The host, when `url` has none (or to override it).
    #[serde(default)]
    pub host: Option<String>,
    #[serde(default)]
    pub soft: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PurgeTags {
    pub tags: Vec<String>,
    #[serde(default)]
    pub soft: bool,
}

#[derive(Serialize)]
pub struct Purged {
    /// Stored objects (variants) removed, or expired for a soft purge.
    pub purged: usize,
    pub soft: bool,
}

fn store_failed(e: lacquer_storage::StoreError) -> Response {
    tracing::error!(error = %e, "invalidation failed");
    api_error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "store_error",
        e.to_string(),
    )
}

pub async fn list_bans(State(state): State<AdminState>) -> Json<BanList> {
    let now = now_ms();
    Json(BanList {
        bans: state
            .shared
            .store
            .bans()
            .into_iter()
            .map(|b| BanView::new(b, now))
            .collect(),
    })
}

pub async fn add_ban(State(state): State<AdminState>, ApiJson(body): ApiJson<NewBan>) -> Response {
    let expr = match BanExpr::parse(&body.expression) {
        Ok(expr) => expr,
        Err(e) => return api_error(StatusCode::BAD_REQUEST, "invalid_ban", e.to_string()),
    };
    match state.shared.store.add_ban(expr).await {
        Ok(info) => (StatusCode::CREATED, Json(BanView::new(info, now_ms()))).into_response(),
        Err(e) => store_failed(e),
    }
}

pub async fn purge_url(
    State(state): State<AdminState>,
    ApiJson(body): ApiJson<PurgeUrl>,
) -> Response {
    let key = match invalidation::purge_key(&body.url, body.host.as_deref()) {
        Ok(key) => key,
        Err(e) => return api_error(StatusCode::BAD_REQUEST, e.code(), e.to_string()),
    };
    purge(&state, PurgeTarget::Key(key), body.soft).await
}

pub async fn purge_tags(
    State(state): State<AdminState>,
    ApiJson(body): ApiJson<PurgeTags>,
) -> Response {
    let tags = match invalidation::tag_list(body.tags) {
        Ok(tags) => tags,
        Err(e) => return api_error(StatusCode::BAD_REQUEST, e.code(), e.to_string()),
    };
    purge(&state, PurgeTarget::Tags(tags), body.soft).await
}

async fn purge(state: &AdminState, target: PurgeTarget, soft: bool) -> Response {
    match invalidation::purge(&state.shared.store, target, soft).await {
        Ok(purged) => Json(Purged { purged, soft }).into_response(),
        Err(e) => store_failed(e),
    }
}
