//! `GET /v1/backends`, `PUT /v1/backends/{name}/health`, `POST /v1/reload`, `GET /v1/certificates` and
//! `POST /v1/certificates/renew`.

use axum::{
    extract::{Path, State},
    Json,
};
use lacquer_admin::wire::{
    ApiError, BackendList, BackendView, CertificateList, Reloaded, SetBackendHealth,
};
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

/// How long `POST /v1/certificates/renew` waits for the orders to end: the CA's checks take seconds, and
/// the order gives up after two minutes of them.
const RENEW_WAIT: std::time::Duration = std::time::Duration::from_secs(150);

/// The certificates obtained by ACME: what each listener serves, when it expires, how its orders went.
#[utoipa::path(get, path = "/v1/certificates", tag = "operations", security(("secret" = [])),
    responses(
        (status = 200, description = "Every certificate kept by ACME", body = CertificateList),
        (status = 401, description = "Missing or wrong secret", body = ApiError),
        (status = 404, description = "`acme_disabled`: no listener has `acme`", body = ApiError),
    ))]
pub async fn certificates(
    State(state): State<AdminState>,
) -> Result<Json<CertificateList>, AdminError> {
    let acme = state.shared.acme.as_ref().ok_or(AdminError::AcmeDisabled)?;
    Ok(Json(CertificateList {
        certificates: acme.views(),
    }))
}

/// Orders every ACME certificate now, whatever its age, and answers once the orders end (at most 150 s):
/// a renewed certificate is served from the next handshake on; a failed order keeps the one held, and
/// `last_error` says why.
#[utoipa::path(post, path = "/v1/certificates/renew", tag = "operations", security(("secret" = [])),
    responses(
        (status = 200, description = "Every certificate after its order", body = CertificateList),
        (status = 401, description = "Missing or wrong secret", body = ApiError),
        (status = 404, description = "`acme_disabled`: no listener has `acme`", body = ApiError),
    ))]
pub async fn renew_certificates(
    State(state): State<AdminState>,
) -> Result<Json<CertificateList>, AdminError> {
    let acme = state.shared.acme.as_ref().ok_or(AdminError::AcmeDisabled)?;
    tracing::info!("certificate renewal asked for by the operator");
    let mut stopping = state.stopping.clone();
    // A shutdown answers at once, with the orders as they stand, rather than hold the admin server up.
    let certificates = tokio::select! {
        renewed = acme.renew(RENEW_WAIT) => renewed,
        _ = stopping.wait_for(|stopping| *stopping) => acme.views(),
    };
    Ok(Json(CertificateList { certificates }))
}
