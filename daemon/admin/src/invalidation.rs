//! `/v1/bans`, `/v1/purge` and `/v1/purge/tags`: invalidation for operators and deploy scripts.

use axum::{
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use lacquer_admin::wire::{ApiError, BanList, BanView, NewBan, PurgeTags, PurgeUrl, Purged};
use lacquer_storage::{BanExpr, BanInfo};

use super::{api_error, store_failed, AdminState, ApiJson};
use lacquer_proxy::invalidation::{self, PurgeTarget};

fn ban_view(info: BanInfo, now_ms: u64) -> BanView {
    BanView {
        id: info.id,
        expression: info.expression,
        created: info.created_ms / 1000,
        age_seconds: now_ms.saturating_sub(info.created_ms) / 1000,
        tested: info.tested,
        removed: info.removed,
        completed: info.completed,
    }
}

/// The ban list, oldest first.
#[utoipa::path(get, path = "/v1/bans", tag = "invalidation", security(("secret" = [])),
    responses(
        (status = 200, description = "Pending bans and the newest completed ones", body = BanList),
        (status = 401, description = "Missing or wrong secret", body = ApiError),
    ))]
pub async fn list_bans(State(state): State<AdminState>) -> Json<BanList> {
    let now = lacquer_clock::now_ms();
    Json(BanList {
        bans: state
            .shared
            .store
            .bans()
            .into_iter()
            .map(|b| ban_view(b, now))
            .collect(),
    })
}

/// Adds a ban: every object stored before it that matches is gone for every later request. Durable when
/// answered.
#[utoipa::path(post, path = "/v1/bans", tag = "invalidation", security(("secret" = [])),
    request_body = NewBan,
    responses(
        (status = 201, description = "The ban, in canonical form", body = BanView),
        (status = 400, description = "`invalid_ban` (with the column), `invalid_body`", body = ApiError),
        (status = 401, description = "Missing or wrong secret", body = ApiError),
        (status = 413, description = "`body_too_large`", body = ApiError),
        (status = 422, description = "`invalid_body`: wrong or missing fields", body = ApiError),
    ))]
pub async fn add_ban(State(state): State<AdminState>, ApiJson(body): ApiJson<NewBan>) -> Response {
    let expr = match BanExpr::parse(&body.expression) {
        Ok(expr) => expr,
        Err(e) => return api_error(StatusCode::BAD_REQUEST, "invalid_ban", e.to_string()),
    };
    match state.shared.store.add_ban(expr).await {
        Ok(info) => (
            StatusCode::CREATED,
            Json(ban_view(info, lacquer_clock::now_ms())),
        )
            .into_response(),
        Err(e) => store_failed(e),
    }
}

/// Purges one URL's cache key: every variant. Durable when answered.
#[utoipa::path(post, path = "/v1/purge", tag = "invalidation", security(("secret" = [])),
    request_body = PurgeUrl,
    responses(
        (status = 200, description = "How many stored variants were purged", body = Purged),
        (status = 400, description = "`invalid_url`, `missing_host`, `invalid_host`, `invalid_body`", body = ApiError),
        (status = 401, description = "Missing or wrong secret", body = ApiError),
        (status = 422, description = "`invalid_body`: wrong or missing fields", body = ApiError),
    ))]
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

/// Purges every object carrying any of the surrogate keys, on every host. Durable when answered.
#[utoipa::path(post, path = "/v1/purge/tags", tag = "invalidation", security(("secret" = [])),
    request_body = PurgeTags,
    responses(
        (status = 200, description = "How many stored variants were purged", body = Purged),
        (status = 400, description = "`no_tags`, `invalid_tag`, `too_many_tags`, `invalid_body`", body = ApiError),
        (status = 401, description = "Missing or wrong secret", body = ApiError),
        (status = 422, description = "`invalid_body`: wrong or missing fields", body = ApiError),
    ))]
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
        Ok(purged) => Json(Purged {
            purged: purged as u64,
            soft,
        })
        .into_response(),
        Err(e) => store_failed(e),
    }
}
