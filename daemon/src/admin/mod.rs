//! The admin API (axum, localhost by default). Every route but `GET /v1/health` requires
//! `Authorization: Bearer <secret>`. Errors are JSON `{"code": "...", "message": "..."}` with a stable code.

mod invalidation;

use std::sync::Arc;

use axum::{
    extract::{DefaultBodyLimit, FromRequest, Request, State},
    http::{header, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use lacquer_storage::StoreStatsSnapshot;
use serde::Serialize;
use subtle::ConstantTimeEq;

use crate::{stats::ProxyStatsSnapshot, worker::Shared};

#[derive(Clone)]
pub struct AdminState {
    pub shared: Arc<Shared>,
    pub secret: Arc<str>,
}

#[derive(Serialize)]
pub struct Health {
    pub status: &'static str,
    pub version: &'static str,
    pub uptime_seconds: u64,
}

#[derive(Serialize)]
pub struct StatsResponse {
    pub uptime_seconds: u64,
    pub proxy: ProxyStatsSnapshot,
    pub store: StoreStatsSnapshot,
}

#[derive(Serialize)]
struct ApiError {
    code: &'static str,
    message: String,
}

fn api_error(status: StatusCode, code: &'static str, message: impl Into<String>) -> Response {
    (
        status,
        Json(ApiError {
            code,
            message: message.into(),
        }),
    )
        .into_response()
}

/// Admin request bodies are small JSON documents.
const BODY_LIMIT: usize = 64 * 1024;

/// `Json` whose rejections (bad JSON, wrong fields, missing content type, too large) are API errors.
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    Json<T>: FromRequest<S, Rejection = axum::extract::rejection::JsonRejection>,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(value)) => Ok(Self(value)),
            Err(rejection) => {
                let status = rejection.status();
                let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
                    "body_too_large"
                } else {
                    "invalid_body"
                };
                Err(api_error(status, code, rejection.body_text()))
            }
        }
    }
}

pub fn router(state: AdminState) -> Router {
    let guarded = Router::new()
        .route("/v1/stats", get(stats))
        .route(
            "/v1/bans",
            get(invalidation::list_bans).post(invalidation::add_ban),
        )
        .route("/v1/purge", post(invalidation::purge_url))
        .route("/v1/purge/tags", post(invalidation::purge_tags))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_secret,
        ));
    Router::new()
        .route("/v1/health", get(health))
        .merge(guarded)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .fallback(|| async { api_error(StatusCode::NOT_FOUND, "not_found", "no such admin route") })
        .with_state(state)
}

async fn require_secret(State(state): State<AdminState>, req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match presented {
        Some(token) if bool::from(token.as_bytes().ct_eq(state.secret.as_bytes())) => {
            next.run(req).await
        }
        Some(_) => api_error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the admin secret does not match",
        ),
        None => api_error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing `Authorization: Bearer <secret>`; the secret is in the file given by --secret",
        ),
    }
}

async fn health(State(state): State<AdminState>) -> Json<Health> {
    Json(Health {
        status: "ok",
        version: env!("CARGO_PKG_VERSION"),
        uptime_seconds: state.shared.started.elapsed().as_secs(),
    })
}

async fn stats(State(state): State<AdminState>) -> Json<StatsResponse> {
    Json(StatsResponse {
        uptime_seconds: state.shared.started.elapsed().as_secs(),
        proxy: state.shared.stats.snapshot(),
        store: state.shared.store.stats(),
    })
}
