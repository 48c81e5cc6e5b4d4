//! `/v1/bans`, `/v1/purge` and `/v1/purge/tags`: invalidation for operators and deploy scripts.

use axum::{extract::State, http::StatusCode, Json};
use lacquer_admin::wire::{ApiError, BanList, BanView, NewBan, PurgeTags, PurgeUrl, Purged};
use lacquer_storage::{BanExpr, BanInfo};

use super::{AdminError, AdminState, ApiJson};
use lacquer_proxy::invalidation::{self, PurgeTarget};

fn ban_view(info: BanInfo, now_ms: u64) -> BanView {
    BanView {
        id: info.id,
        expression: info.expression,
        created: info.created_ms / 1000,
        age_seconds: now_ms.saturating_sub(info.created_ms) / 1000,
        tested: info.tested,
        removed: info.removed,
        to_test: info.to_test,
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
        (status = 415, description = "`invalid_body`: not `Content-Type: application/json`", body = ApiError),
        (status = 422, description = "`invalid_body`: wrong or missing fields", body = ApiError),
    ))]
pub async fn add_ban(
    State(state): State<AdminState>,
    ApiJson(body): ApiJson<NewBan>,
) -> Result<(StatusCode, Json<BanView>), AdminError> {
    let expr = BanExpr::parse(&body.expression)?;
    let info = state.shared.ban(expr).await?;
    Ok((
        StatusCode::CREATED,
        Json(ban_view(info, lacquer_clock::now_ms())),
    ))
}

/// Purges one URL's cache key: every variant. Durable when answered.
#[utoipa::path(post, path = "/v1/purge", tag = "invalidation", security(("secret" = [])),
    request_body = PurgeUrl,
    responses(
        (status = 200, description = "How many stored variants were purged", body = Purged),
        (status = 400, description = "`invalid_url`, `missing_host`, `invalid_host`, `invalid_body`", body = ApiError),
        (status = 401, description = "Missing or wrong secret", body = ApiError),
        (status = 413, description = "`body_too_large`", body = ApiError),
        (status = 415, description = "`invalid_body`: not `Content-Type: application/json`", body = ApiError),
        (status = 422, description = "`invalid_body`: wrong or missing fields", body = ApiError),
    ))]
pub async fn purge_url(
    State(state): State<AdminState>,
    ApiJson(body): ApiJson<PurgeUrl>,
) -> Result<Json<Purged>, AdminError> {
    let key = invalidation::purge_key(&body.url, body.host.as_deref())?;
    purge(&state, PurgeTarget::Key(key), body.soft).await
}

/// Purges every object carrying any of the surrogate keys, on every host. Durable when answered.
#[utoipa::path(post, path = "/v1/purge/tags", tag = "invalidation", security(("secret" = [])),
    request_body = PurgeTags,
    responses(
        (status = 200, description = "How many stored variants were purged", body = Purged),
        (status = 400, description = "`no_tags`, `invalid_tag`, `too_many_tags`, `invalid_body`", body = ApiError),
        (status = 401, description = "Missing or wrong secret", body = ApiError),
        (status = 413, description = "`body_too_large`", body = ApiError),
        (status = 415, description = "`invalid_body`: not `Content-Type: application/json`", body = ApiError),
        (status = 422, description = "`invalid_body`: wrong or missing fields", body = ApiError),
    ))]
pub async fn purge_tags(
    State(state): State<AdminState>,
    ApiJson(body): ApiJson<PurgeTags>,
) -> Result<Json<Purged>, AdminError> {
    let tags = invalidation::tag_list(body.tags)?;
    purge(&state, PurgeTarget::Tags(tags), body.soft).await
}

async fn purge(
    state: &AdminState,
    target: PurgeTarget,
    soft: bool,
) -> Result<Json<Purged>, AdminError> {
    let purged = state.shared.purge(target, soft).await?;
    Ok(Json(Purged {
        purged: purged as u64,
        soft,
    }))
}
