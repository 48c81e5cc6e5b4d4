//! [`AdminError`]: every way an admin request fails, each answered with the status and stable `code`
//! documented in docs/admin-api.md.

use axum::{
    extract::rejection::{JsonRejection, QueryRejection},
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use lacquer_admin::wire::ApiError;
use lacquer_config::ConfigError;
use lacquer_proxy::cluster::InvalidateError;
use lacquer_proxy::invalidation::InvalidationError;
use lacquer_storage::{BanSyntaxError, StoreError};

/// Why an admin request was refused or failed. It answers as a JSON [`ApiError`] whose `code` scripts
/// match on and whose `message` is this error's text, with the status of [`AdminError::status`]; a
/// client sees the same answer whichever handler or extractor gave up.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// No `Authorization: Bearer` credentials: `401 unauthorized`.
    #[error(
        "missing `Authorization: Bearer <secret>`; the secret is in the file given by --secret"
    )]
    MissingSecret,
    /// Credentials that are not the admin secret: `401 unauthorized`.
    #[error("the admin secret does not match")]
    WrongSecret,
    /// No route has this path: `404 not_found`.
    #[error("no such admin route")]
    NotFound,
    /// The path is a route, the method is not one of its: `405 method_not_allowed`.
    #[error("this route does not take that method")]
    MethodNotAllowed,
    /// The body is not JSON, or could not be read: `400 invalid_body`. Holds axum's explanation.
    #[error("{0}")]
    MalformedBody(String),
    /// The body is not declared `Content-Type: application/json`: `415 invalid_body`.
    #[error("{0}")]
    NotJson(String),
    /// JSON with a missing, mistyped or unknown field: `422 invalid_body`, naming the field.
    #[error("{0}")]
    WrongFields(String),
    /// A body over the admin API's 64 KiB limit: `413 body_too_large`.
    #[error("{0}")]
    BodyTooLarge(String),
    /// A missing, unknown or malformed query parameter: `400 invalid_query`, saying which.
    #[error("{0}")]
    InvalidQuery(String),
    /// A ban expression that does not parse: `400 invalid_ban`, with the column.
    #[error(transparent)]
    InvalidBan(#[from] BanSyntaxError),
    /// A purge or inspection target that is not a URL, host or tag list: `400` with the
    /// [`InvalidationError::code`] (`invalid_url`, `missing_host`, `no_tags`, …).
    #[error(transparent)]
    Invalidation(#[from] InvalidationError),
    /// A reload of a configuration that does not load; nothing changed: `400 invalid_config`.
    #[error(transparent)]
    InvalidConfig(#[from] ConfigError),
    /// The store failed and the operation did not happen: `500 store_error`, logged when answered.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The cluster's log could not take an invalidation (etcd out of reach): nothing acknowledged, retry:
    /// `503 cluster_unavailable`.
    #[error("{0}")]
    ClusterUnavailable(String),
    /// `POST /v1/explain` of a request no client could send (a method or header field that does not
    /// parse): `400 invalid_request`, saying what.
    #[error("{0}")]
    Unexplainable(String),
    /// `PUT /v1/backends/{name}/health` naming no configured backend: `404 unknown_backend`, listing those
    /// there are.
    #[error("no backend is named {name:?} (the backends are {})", .known.join(", "))]
    UnknownBackend {
        /// The name asked for.
        name: String,
        /// The configured backends' names.
        known: Vec<String>,
    },
    /// `GET /v1/cluster` on a node without a `[cluster]` section: `404 cluster_disabled`.
    #[error("this node is not in a cluster: its configuration has no [cluster] section")]
    ClusterDisabled,
    /// `GET /v1/certificates` or `POST /v1/certificates/renew` without a listener's `acme`:
    /// `404 acme_disabled`.
    #[error("no listener obtains its certificate by ACME: none has `acme`")]
    AcmeDisabled,
}

impl From<InvalidateError> for AdminError {
    fn from(e: InvalidateError) -> Self {
        match e {
            InvalidateError::Store(e) => Self::Store(e),
            InvalidateError::Cluster(message) => Self::ClusterUnavailable(message),
        }
    }
}

impl AdminError {
    /// The HTTP status of the answer.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::MissingSecret | Self::WrongSecret => StatusCode::UNAUTHORIZED,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::NotJson(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::WrongFields(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::MalformedBody(_)
            | Self::InvalidQuery(_)
            | Self::InvalidBan(_)
            | Self::Invalidation(_)
            | Self::InvalidConfig(_)
            | Self::Unexplainable(_) => StatusCode::BAD_REQUEST,
            Self::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::ClusterUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::ClusterDisabled | Self::AcmeDisabled | Self::UnknownBackend { .. } => {
                StatusCode::NOT_FOUND
            }
        }
    }

    /// The stable `code` of the answer, which clients match on (docs/admin-api.md lists them).
    pub fn code(&self) -> &'static str {
        match self {
            Self::MissingSecret | Self::WrongSecret => "unauthorized",
            Self::NotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::MalformedBody(_) | Self::NotJson(_) | Self::WrongFields(_) => "invalid_body",
            Self::BodyTooLarge(_) => "body_too_large",
            Self::InvalidQuery(_) => "invalid_query",
            Self::InvalidBan(_) => "invalid_ban",
            Self::Invalidation(e) => e.code(),
            Self::InvalidConfig(_) => "invalid_config",
            Self::Unexplainable(_) => "invalid_request",
            Self::Store(_) => "store_error",
            Self::ClusterUnavailable(_) => "cluster_unavailable",
            Self::ClusterDisabled => "cluster_disabled",
            Self::AcmeDisabled => "acme_disabled",
            Self::UnknownBackend { .. } => "unknown_backend",
        }
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        // The operator finds store failures in the daemon's log, not only in whichever client saw them.
        if let Self::Store(e) = &self {
            tracing::error!(error = %e, "admin operation failed in the store");
        }
        let body = ApiError {
            code: self.code().to_owned(),
            message: self.to_string(),
        };
        (self.status(), Json(body)).into_response()
    }
}

impl From<JsonRejection> for AdminError {
    fn from(rejection: JsonRejection) -> Self {
        let message = rejection.body_text();
        match rejection {
            JsonRejection::JsonDataError(_) => Self::WrongFields(message),
            JsonRejection::MissingJsonContentType(_) => Self::NotJson(message),
            r if r.status() == StatusCode::PAYLOAD_TOO_LARGE => Self::BodyTooLarge(message),
            _ => Self::MalformedBody(message),
        }
    }
}

impl From<QueryRejection> for AdminError {
    fn from(rejection: QueryRejection) -> Self {
        Self::InvalidQuery(rejection.body_text())
    }
}

#[cfg(test)]
mod tests {
    use axum::{body::to_bytes, http::header};
    use lacquer_storage::BanExpr;
    use serde_json::{json, Value};

    use super::*;

    /// What a client receives for `error`: the status, the content type and the JSON body.
    async fn answer(error: AdminError) -> (u16, String, Value) {
        let response = error.into_response();
        let status = response.status().as_u16();
        let content_type = response.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .to_owned();
        let body = to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, content_type, serde_json::from_slice(&body).unwrap())
    }

    /// Every variant answers with the status and code docs/admin-api.md promises, the message as the one
    /// other field.
    #[tokio::test]
    async fn every_error_answers_its_documented_status_and_code() {
        let ban = BanExpr::parse("req.url ~ (").unwrap_err();
        let ban_message = ban.to_string();
        let cases: Vec<(AdminError, u16, &str, String)> = vec![
            (
                AdminError::MissingSecret,
                401,
                "unauthorized",
                "missing `Authorization: Bearer <secret>`; the secret is in the file given by --secret"
                    .into(),
            ),
            (
                AdminError::WrongSecret,
                401,
                "unauthorized",
                "the admin secret does not match".into(),
            ),
            (
                AdminError::NotFound,
                404,
                "not_found",
                "no such admin route".into(),
            ),
            (
                AdminError::MethodNotAllowed,
                405,
                "method_not_allowed",
                "this route does not take that method".into(),
            ),
            (
                AdminError::MalformedBody("EOF while parsing".into()),
                400,
                "invalid_body",
                "EOF while parsing".into(),
            ),
            (
                AdminError::NotJson("want json".into()),
                415,
                "invalid_body",
                "want json".into(),
            ),
            (
                AdminError::WrongFields("missing field `expression`".into()),
                422,
                "invalid_body",
                "missing field `expression`".into(),
            ),
            (
                AdminError::BodyTooLarge("length limit exceeded".into()),
                413,
                "body_too_large",
                "length limit exceeded".into(),
            ),
            (
                AdminError::InvalidQuery("missing field `url`".into()),
                400,
                "invalid_query",
                "missing field `url`".into(),
            ),
            (ban.into(), 400, "invalid_ban", ban_message),
            (
                InvalidationError::InvalidUrl("::".into()).into(),
                400,
                "invalid_url",
                "invalid url \"::\": give http://host/path or /path with a host".into(),
            ),
            (
                InvalidationError::MissingHost("/a".into()).into(),
                400,
                "missing_host",
                "\"/a\" has no host: give an absolute url or a host".into(),
            ),
            (
                InvalidationError::InvalidHost("a b".into()).into(),
                400,
                "invalid_host",
                "invalid host \"a b\": give a host name or address with an optional port".into(),
            ),
            (
                InvalidationError::NoTags.into(),
                400,
                "no_tags",
                "no tags given".into(),
            ),
            (
                InvalidationError::InvalidTag("a,b".into()).into(),
                400,
                "invalid_tag",
                InvalidationError::InvalidTag("a,b".into()).to_string(),
            ),
            (
                InvalidationError::TooManyTags.into(),
                400,
                "too_many_tags",
                InvalidationError::TooManyTags.to_string(),
            ),
            (
                ConfigError("lacquer.toml:2:15: cache.default_ttl: invalid value".into()).into(),
                400,
                "invalid_config",
                "lacquer.toml:2:15: cache.default_ttl: invalid value".into(),
            ),
            (
                AdminError::Unexplainable("invalid method \"G T\"".into()),
                400,
                "invalid_request",
                "invalid method \"G T\"".into(),
            ),
            (
                AdminError::UnknownBackend {
                    name: "app3".into(),
                    known: vec!["app1".into(), "app2".into()],
                },
                404,
                "unknown_backend",
                "no backend is named \"app3\" (the backends are app1, app2)".into(),
            ),
            (
                StoreError::DiskFull.into(),
                500,
                "store_error",
                "the store's disk is full: not storing new objects".into(),
            ),
        ];
        for (error, status, code, message) in cases {
            let described = format!("{error:?}");
            let (got_status, content_type, body) = answer(error).await;
            assert_eq!(
                (got_status, body),
                (status, json!({"code": code, "message": message})),
                "{described}"
            );
            assert_eq!(content_type, "application/json", "{described}");
        }
    }
}
