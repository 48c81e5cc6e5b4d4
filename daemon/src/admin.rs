//! The admin API (axum, localhost by default). Every route but `GET /v1/health` requires
//! `Authorization: Bearer <secret>`.

use std::sync::Arc;

use axum::{
    extract::{Request, State},
    http::{header, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::get,
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

pub fn router(state: AdminState) -> Router {
    let guarded =
        Router::new()
            .route("/v1/stats", get(stats))
            .route_layer(middleware::from_fn_with_state(
                state.clone(),
                require_secret,
            ));
    Router::new()
        .route("/v1/health", get(health))
        .merge(guarded)
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
