//! `GET /v1/backends`, `PUT /v1/backends/{name}/health` and `POST /v1/reload`.

use axum::{
    extract::{Path, State},
    Json,
};
use lacquer_admin::wire::{ApiError, BackendList, BackendView, Reloaded, SetBackendHealth};
use lacquer_proxy::worker::Shared;

use super::{AdminError, AdminState, ApiJson};

/// The backends: their probes' verdicts, and how their requests have been going.
#[utoipa::path(get, path = "/v1/backends", tag = "operations", security(("secret" = [])),
    responses(
        (status = 200, description = "Every backend", body = BackendList),
        (status = 401, description = "Missing or wrong secret", body = ApiError),
    ))]
pub async fn backends(State(state): State<AdminState>) -> Json<BackendList> {
    Json(BackendList {
        backends: backend_views(&state.shared),
    })
}

/// Every backend of the live configuration, as `/v1/backends` and `/metrics` show them.
pub(crate) fn backend_views(shared: &Shared) -> Vec<BackendView> {
    shared
        .live
        .load()
        .router
        .backends
        .iter()
        .map(|b| b.view())
        .collect()
}

/// Forces a backend sick (drained: no requests, whatever its probe says) or healthy (requests whatever its
/// probe says), or hands its health back to the probe (`auto`), as Varnish's `backend.set_health` does. Kept
/// until set again or until lacquerd restarts, and through reloads that keep a backend of that name.
#[utoipa::path(put, path = "/v1/backends/{name}/health", tag = "operations", security(("secret" = [])),
    params(("name" = String, Path, description = "The backend's `name`")),
    request_body = SetBackendHealth,
    responses(
        (status = 200, description = "The backend with its new state", body = BackendView),
        (status = 401, description = "Missing or wrong secret", body = ApiError),
        (status = 404, description = "`unknown_backend`: no backend has that name", body = ApiError),
        (status = 422, description = "`invalid_body`: `health` is not `sick`, `healthy` or `auto`", body = ApiError),
    ))]
pub async fn set_backend_health(
    State(state): State<AdminState>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<SetBackendHealth>,
) -> Result<Json<BackendView>, AdminError> {
    let live = state.shared.live.load();
    let backends = &live.router.backends;
    let backend =
        backends
            .iter()
            .find(|b| b.name() == name)
            .ok_or_else(|| AdminError::UnknownBackend {
                name,
                known: backends.iter().map(|b| b.name().to_owned()).collect(),
            })?;
    backend.set_admin(body.health);
    tracing::info!(
        backend = backend.name(),
        health = body.health.as_str(),
        "backend health set by the operator"
    );
    Ok(Json(backend.view()))
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
