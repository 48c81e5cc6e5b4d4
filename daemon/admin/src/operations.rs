//! `GET /v1/backends` and `POST /v1/reload`.

use axum::{extract::State, Json};
use lacquer_admin::wire::{ApiError, BackendList, Reloaded};

use super::{AdminError, AdminState};

/// The backends: their probes' verdicts, and how their requests have been going.
#[utoipa::path(get, path = "/v1/backends", tag = "operations", security(("secret" = [])),
    responses(
        (status = 200, description = "Every backend", body = BackendList),
        (status = 401, description = "Missing or wrong secret", body = ApiError),
    ))]
pub async fn backends(State(state): State<AdminState>) -> Json<BackendList> {
    Json(BackendList {
        backends: state
            .shared
            .live
            .load()
            .router
            .backends
            .iter()
            .map(|b| b.view())
            .collect(),
    })
}

/// Reads the configuration file again, as `SIGHUP` does. The cache policy, purge access and log level change
/// at once; other changed settings are listed as waiting for a restart. A file that does not load changes
/// nothing.
#[utoipa::path(post, path = "/v1/reload", tag = "operations", security(("secret" = [])),
    responses(
        (status = 200, description = "What changed", body = Reloaded),
        (status = 400, description = "`invalid_config`: the file does not load; nothing changed", body = ApiError),
        (status = 401, description = "Missing or wrong secret", body = ApiError),
    ))]
pub async fn reload(State(state): State<AdminState>) -> Result<Json<Reloaded>, AdminError> {
    let reloader = state.reloader.clone();
    let reloaded = tokio::task::spawn_blocking(move || reloader.reload())
        .await
        .expect("reloading does not panic")?;
    Ok(Json(reloaded))
}
