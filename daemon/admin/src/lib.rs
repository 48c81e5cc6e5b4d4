//! The admin API (axum, localhost by default). Every route but `GET /v1/health` and
//! `GET /v1/openapi.json` requires `Authorization: Bearer <secret>` (and `GET /metrics` unless
//! `admin.open_metrics`). Every failure is an [`AdminError`], answered as a JSON `ApiError` with a stable
//! code. Routes are registered together with their OpenAPI description, so `GET /v1/openapi.json` lists
//! exactly what is served.

#![warn(missing_docs)]

mod error;
mod explain;
mod invalidation;
mod log;
mod metrics;
mod objects;
mod operations;
mod serve;
mod status;

use std::sync::{Arc, OnceLock};

use axum::{
    body::Bytes,
    extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Query, Request, State},
    http::{header, request::Parts},
    middleware::{self, Next},
    response::Response,
    Json, Router,
};
use subtle::ConstantTimeEq;
use tokio::sync::watch;
use utoipa::{
    openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme},
    Modify, OpenApi,
};
use utoipa_axum::{router::OpenApiRouter, routes};

use lacquer_admin::wire::Reloaded;
use lacquer_config::ConfigError;
use lacquer_proxy::worker::Shared;

pub use error::AdminError;
pub use serve::serve;

/// Reads the configuration again and applies what can change while requests are served (`POST
/// /v1/reload`, as `SIGHUP` does).
pub trait Reload: Send + Sync + 'static {
    /// What changed and what waits for a restart; an error says why the file cannot be used, and then
    /// nothing changed.
    fn reload(&self) -> Result<Reloaded, ConfigError>;
}

/// What the handlers work on; cloned per request, so everything in it is shared.
#[derive(Clone)]
pub struct AdminState {
    /// The state the client-serving workers share: store, statistics, live settings, access log.
    pub shared: Arc<Shared>,
    /// The admin secret every guarded route requires as `Authorization: Bearer <secret>`, compared in
    /// constant time.
    pub secret: Arc<str>,
    /// What `POST /v1/reload` runs, off the async threads since it reads files.
    pub reloader: Arc<dyn Reload>,
    /// `GET /metrics` answers without the secret (`admin.open_metrics`), for scrapers that cannot send one.
    pub open_metrics: bool,
    /// Turns true on shutdown: long-lived streams end so the server can stop.
    pub stopping: watch::Receiver<bool>,
    /// The OpenAPI document, rendered once the routes are known.
    pub openapi: Arc<OnceLock<Bytes>>,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "lacquerd admin API",
        description = "Operate a running lacquerd: statistics, bans, purges, inspection, backends, reload. \
            Send the contents of the admin secret file as `Authorization: Bearer <secret>`."
    ),
    modifiers(&SecretAuth),
    tags(
        (name = "status", description = "Health, statistics, metrics and the live access log"),
        (name = "invalidation", description = "Bans and purges"),
        (name = "objects", description = "What the store holds, and what would become of a request"),
        (name = "operations", description = "Backends and configuration"),
    )
)]
struct ApiDoc;

struct SecretAuth;

impl Modify for SecretAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some(
                "The contents of the admin secret file (`admin.secret_file`).",
            ))
            .build();
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme("secret", SecurityScheme::Http(scheme));
    }
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
    type Rejection = AdminError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let Json(value) = Json::<T>::from_request(req, state).await?;
        Ok(Self(value))
    }
}

/// `Query` whose rejections are API errors.
pub struct ApiQuery<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiQuery<T>
where
    Query<T>: FromRequestParts<S, Rejection = axum::extract::rejection::QueryRejection>,
    S: Send + Sync,
{
    type Rejection = AdminError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Query(value) = Query::<T>::from_request_parts(parts, state).await?;
        Ok(Self(value))
    }
}

/// The routes, each registered with its OpenAPI description, and the document they make up.
fn routes(state: &AdminState) -> OpenApiRouter<AdminState> {
    let guard = || middleware::from_fn_with_state(state.clone(), require_secret);
    let open = OpenApiRouter::new()
        .routes(routes!(status::health))
        .routes(routes!(status::openapi));
    let guarded = OpenApiRouter::new()
        .routes(routes!(status::stats))
        .routes(routes!(status::cluster))
        .routes(routes!(status::stats_stream))
        .routes(routes!(log::stream))
        .routes(routes!(invalidation::list_bans, invalidation::add_ban))
        .routes(routes!(invalidation::purge_url))
        .routes(routes!(invalidation::purge_tags))
        .routes(routes!(objects::inspect))
        .routes(routes!(explain::explain))
        .routes(routes!(operations::backends))
        .routes(routes!(operations::set_backend_health))
        .routes(routes!(operations::reload))
        .routes(routes!(operations::certificates))
        .routes(routes!(operations::renew_certificates))
        .route_layer(guard());
    let metrics = OpenApiRouter::new().routes(routes!(status::metrics));
    let metrics = if state.open_metrics {
        metrics
    } else {
        metrics.route_layer(guard())
    };
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(open)
        .merge(guarded)
        .merge(metrics)
}

/// The admin API, ready to serve: every route, the secret guard, JSON [`AdminError`]s for unknown routes
/// and methods, a 64 KiB body limit. Renders the OpenAPI document into `state.openapi` once.
pub fn router(state: AdminState) -> Router {
    let (router, doc) = routes(&state).split_for_parts();
    let rendered = doc
        .to_pretty_json()
        .expect("the OpenAPI document serializes");
    state.openapi.get_or_init(|| Bytes::from(rendered));
    router
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .fallback(|| async { AdminError::NotFound })
        .method_not_allowed_fallback(|| async { AdminError::MethodNotAllowed })
        .with_state(state)
}

async fn require_secret(
    State(state): State<AdminState>,
    req: Request,
    next: Next,
) -> Result<Response, AdminError> {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .ok_or(AdminError::MissingSecret)?;
    if bool::from(presented.as_bytes().ct_eq(state.secret.as_bytes())) {
        Ok(next.run(req).await)
    } else {
        Err(AdminError::WrongSecret)
    }
}

/// The token of `Bearer <token>` credentials; the scheme's case does not matter and spaces may repeat
/// (RFC 9110 §11.1, RFC 6750 §2.1).
fn bearer_token(credentials: &str) -> Option<&str> {
    let (scheme, token) = credentials.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use axum::{
        body::{to_bytes, Body},
        http::{Method, StatusCode},
    };
    use lacquer_config::{Config, Overrides};
    use lacquer_proxy::{access_log::AccessLog, log_format::LogFormat, stats::Stats, worker::Live};
    use lacquer_storage::StoreBuilder;
    use serde_json::Value;
    use tower::ServiceExt;

    use super::*;

    const SECRET: &str = "s3cret";

    struct FailingReload;

    impl Reload for FailingReload {
        fn reload(&self) -> Result<Reloaded, ConfigError> {
            Err(ConfigError("lacquer.toml:1:1: unreadable".into()))
        }
    }

    /// The router as lacquerd serves it, over a real (small, temporary) store and default settings.
    async fn app(dir: &std::path::Path) -> Router {
        app_with(dir, "").await
    }

    /// As [`app`], with `config` as the configuration file.
    async fn app_with(dir: &std::path::Path, config: &str) -> Router {
        let overrides = Overrides {
            backend: Some("127.0.0.1:9".into()),
            disk: Some(dir.join("store")),
            ..Default::default()
        };
        let file = dir.join("lacquer.toml");
        std::fs::write(&file, config).unwrap();
        let config = Config::load(Some(&file), overrides).unwrap();
        let backends = lacquer_backends::backend_set(&config).unwrap();
        let store = StoreBuilder::new(dir.join("store"))
            .with_memory_bytes(1 << 20)
            .with_disk_bytes(16 << 20)
            .with_chunk_size(16 * 1024)
            .open(tokio::runtime::Handle::current())
            .await
            .unwrap();
        let stats = Arc::new(Stats::default());
        let format = LogFormat::compile(&config.access_log.format).unwrap();
        let (access_log, _) = AccessLog::start(&config.access_log, format, stats.clone()).unwrap();
        let live = Live::new(&config, &backends).unwrap();
        let shared = Arc::new(Shared::new(live, store, stats, access_log));
        let (_, stopping) = watch::channel(false);
        router(AdminState {
            shared,
            secret: SECRET.into(),
            reloader: Arc::new(FailingReload),
            open_metrics: false,
            stopping,
            openapi: Arc::default(),
        })
    }

    /// Requests refused before any handler touches the store are answered, through the whole router, with
    /// the documented status and code: the guard, the fallbacks, the extractors' rejections, the handlers'
    /// own checks.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn refusals_through_the_router() {
        let dir = tempfile::tempdir().unwrap();
        let app = app(dir.path()).await;
        let bearer = format!("Bearer {SECRET}");
        let bearer = Some(bearer.as_str());
        let json = Some("application/json");
        let big = format!(r#"{{"expression": "{}"}}"#, "x".repeat(70_000));
        let big = big.as_str();
        #[rustfmt::skip]
        let cases = [
            (Method::GET, "/v1/stats", None, None, "", 401, "unauthorized"),
            (Method::GET, "/v1/stats", Some("Bearer nope"), None, "", 401, "unauthorized"),
            (Method::GET, "/v1/stats", Some("Basic czNjcmV0"), None, "", 401, "unauthorized"),
            (Method::GET, "/metrics", None, None, "", 401, "unauthorized"),
            (Method::GET, "/v1/nope", None, None, "", 404, "not_found"),
            (Method::DELETE, "/v1/stats", bearer, None, "", 405, "method_not_allowed"),
            (Method::POST, "/v1/bans", bearer, None, r#"{"expression": "obj.status == 599"}"#, 415, "invalid_body"),
            (Method::POST, "/v1/bans", bearer, json, "{", 400, "invalid_body"),
            (Method::POST, "/v1/bans", bearer, json, r#"{"expr": "x"}"#, 422, "invalid_body"),
            (Method::POST, "/v1/bans", bearer, json, big, 413, "body_too_large"),
            (Method::POST, "/v1/bans", bearer, json, r#"{"expression": "req.url ~ ("}"#, 400, "invalid_ban"),
            (Method::GET, "/v1/objects", bearer, None, "", 400, "invalid_query"),
            (Method::GET, "/v1/objects?url=/a", bearer, None, "", 400, "missing_host"),
            (Method::POST, "/v1/purge/tags", bearer, json, r#"{"tags": []}"#, 400, "no_tags"),
            (Method::GET, "/v1/log/stream?status=6xx", bearer, None, "", 400, "invalid_query"),
            (Method::POST, "/v1/reload", bearer, None, "", 400, "invalid_config"),
            (Method::POST, "/v1/explain", None, json, r#"{"url": "http://a/"}"#, 401, "unauthorized"),
            (Method::POST, "/v1/explain", bearer, json, r#"{"url": "::"}"#, 400, "invalid_url"),
            (Method::POST, "/v1/explain", bearer, json, r#"{"url": "/a"}"#, 400, "missing_host"),
            (Method::POST, "/v1/explain", bearer, json, r#"{"url": "/a", "secure": "yes"}"#, 422, "invalid_body"),
            (Method::POST, "/v1/explain", bearer, json, r#"{"url": "/a", "host": "a"}"#, 422, "invalid_body"),
            (Method::POST, "/v1/explain", bearer, None, r#"{"url": "http://a/"}"#, 415, "invalid_body"),
            (Method::GET, "/v1/explain", bearer, None, "", 405, "method_not_allowed"),
        ];
        for (method, path, authorization, content_type, body, status, code) in cases {
            let mut request = Request::builder().method(method.clone()).uri(path);
            if let Some(value) = authorization {
                request = request.header(header::AUTHORIZATION, value);
            }
            if let Some(value) = content_type {
                request = request.header(header::CONTENT_TYPE, value);
            }
            let request = request.body(Body::from(body.to_owned())).unwrap();
            let response = app.clone().oneshot(request).await.unwrap();
            assert_eq!(response.status().as_u16(), status, "{method} {path}");
            let body = to_bytes(response.into_body(), usize::MAX).await.unwrap();
            let body: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(body["code"], code, "{method} {path}: {body}");
            assert!(
                body["message"].as_str().is_some_and(|m| !m.is_empty()),
                "{body}"
            );
        }

        let health = Request::get("/v1/health").body(Body::empty()).unwrap();
        let response = app.oneshot(health).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "health needs no secret");
    }

    /// `POST /v1/explain` answers the live rules' decision; a request no client could send is
    /// `invalid_request`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn explain_through_the_router() {
        let dir = tempfile::tempdir().unwrap();
        let app = app_with(
            dir.path(),
            r#"
            [[rule]]
            name = "old"
            match = { path_regex = "^/old/(.*)$" }
            respond = { status = 301, location = "/new/$1" }
            "#,
        )
        .await;
        let post = |body: &str| {
            Request::post("/v1/explain")
                .header(header::AUTHORIZATION, format!("Bearer {SECRET}"))
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_owned()))
                .unwrap()
        };
        let answer = |response: Response| async move {
            let status = response.status().as_u16();
            let body = to_bytes(response.into_body(), usize::MAX).await.unwrap();
            (status, serde_json::from_slice::<Value>(&body).unwrap())
        };
        let (status, body) = answer(
            app.clone()
                .oneshot(post(r#"{"url": "http://example.com/old/a"}"#))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["action"], "synthetic", "{body}");
        assert_eq!(body["synthetic"]["status"], 301, "{body}");
        assert_eq!(body["rules"][0]["name"], "old", "{body}");
        assert_eq!(body["rules"][0]["matched"], true, "{body}");

        let (status, body) = answer(
            app.clone()
                .oneshot(post(r#"{"url": "http://example.com/", "method": "G T"}"#))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(
            (status, &body["code"]),
            (400, &Value::from("invalid_request"))
        );
        assert!(body["message"].as_str().unwrap().contains("G T"), "{body}");
    }

    #[test]
    fn bearer_credentials() {
        let cases = [
            ("Bearer abc", Some("abc")),
            ("bearer abc", Some("abc")),
            ("BEARER   abc ", Some("abc")),
            ("Bearer", None),
            ("Bearer ", None),
            ("Basic abc", None),
            ("Bearerabc", None),
            ("", None),
        ];
        for (value, want) in cases {
            assert_eq!(bearer_token(value), want, "{value:?}");
        }
    }
}
