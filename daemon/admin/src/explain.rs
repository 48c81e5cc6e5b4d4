//! `POST /v1/explain`: what the running daemon's rules and policy would do with a request, worked out by
//! the data path's own functions without sending anything to the origin.

use axum::{extract::State, Json};
use lacquer_admin::wire::{ApiError, ExplainRequest, Explanation};
use lacquer_proxy::invalidation::{purge_key, InvalidationError};

use super::{AdminError, AdminState, ApiJson};

/// The action, the rules tried at every phase, what the origin would be sent, the route, backend and key,
/// a rule's synthetic answer, and the stored variant the request would be answered from. The origin sees
/// nothing of it.
#[utoipa::path(post, path = "/v1/explain", tag = "objects", security(("secret" = [])),
    request_body = ExplainRequest,
    responses(
        (status = 200, description = "What lacquerd would do; nothing was sent to the origin", body = Explanation),
        (status = 400, description = "`invalid_url`, `missing_host`, `invalid_host`, `invalid_request`, `invalid_body`", body = ApiError),
        (status = 401, description = "Missing or wrong secret", body = ApiError),
        (status = 415, description = "`invalid_body`: not `Content-Type: application/json`", body = ApiError),
        (status = 422, description = "`invalid_body`: a missing, mistyped or unknown field", body = ApiError),
    ))]
pub async fn explain(
    State(state): State<AdminState>,
    ApiJson(request): ApiJson<ExplainRequest>,
) -> Result<Json<Explanation>, AdminError> {
    check_url(&request)?;
    lacquer_proxy::explain::explain(&state.shared, &request)
        .await
        .map(Json)
        .map_err(AdminError::Unexplainable)
}

/// Refuses, with the codes purges and inspection use, a URL that is neither `http://host/path` nor a path
/// sent with a `Host` field. What is wrong with the rest of the head (a bad `Host` value, a repeated one)
/// is for the explanation to show, as `refused` with its reason, the way the proxy answers it.
fn check_url(request: &ExplainRequest) -> Result<(), AdminError> {
    let sends_host = request
        .headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("host"));
    match purge_key(&request.url, None) {
        Err(InvalidationError::MissingHost(_)) if sends_host => Ok(()),
        Err(e) => Err(e.into()),
        Ok(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use lacquer_admin::wire::HeaderField;

    use super::*;

    #[test]
    fn urls_explain_takes() {
        let host = || HeaderField {
            name: "Host".into(),
            value: "example.com".into(),
        };
        let cases = [
            ("http://example.com/a?b=1", vec![], None),
            ("https://example.com/", vec![], None),
            ("/a", vec![host()], None),
            ("/a", vec![], Some("missing_host")),
            ("::", vec![host()], Some("invalid_url")),
            ("a b", vec![], Some("invalid_url")),
            ("http://exa mple.com/", vec![], Some("invalid_url")),
        ];
        for (url, headers, want) in cases {
            let request = ExplainRequest {
                url: url.into(),
                method: None,
                headers,
                client: None,
                secure: false,
                body: None,
            };
            let got = check_url(&request).err().map(|e| e.code());
            assert_eq!(got, want, "{url}");
        }
    }
}
