//! `PURGE` and `BAN` on the client listeners, the VCL idiom: off by default, and only from `purge.allow_from`.
//!
//! - `PURGE /path` purges every variant of that URL on the request's host; with an `xkey-purge` or
//!   `Surrogate-Key` header it purges those tags instead. `Soft-Purge: 1` makes either soft.
//! - `BAN /regex` bans `req.http.host == <host> && req.url ~ <regex>`; an `X-Ban` header gives the whole
//!   expression instead.

use std::net::IpAddr;

use http::{header, request::Parts, HeaderMap, HeaderValue, Method, Response, StatusCode};
use lacquer_storage::BanExpr;

use lacquer_backends::body::Body;
use lacquer_policy::{key::primary_key, surrogate};
use lacquer_rules::{Invalidation, PurgeScope};

use crate::{
    cluster::InvalidateError,
    invalidation::{self, PurgeTarget},
    respond,
    stats::inc,
    worker::Worker,
};

/// Methods this cache may answer for itself; `Allow` of a refused `PURGE` or `BAN`.
const ALLOW: &str = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS";

pub fn is_invalidation(method: &Method) -> bool {
    matches!(method.as_str(), "PURGE" | "BAN")
}

pub async fn handle(worker: &Worker, client: IpAddr, parts: &Parts) -> Response<Body> {
    let shared = &worker.shared;
    let live = shared.live();
    let access = &live.purge;
    if !access.http_methods || !access.allow_from.iter().any(|net| net.contains(&client)) {
        inc(&shared.stats.purge_requests_refused);
        let message = format!("{} is not allowed from {client}", parts.method);
        let mut resp = error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            &message,
        );
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static(ALLOW));
        return resp;
    }
    inc(&shared.stats.purge_requests);
    if parts.method == "BAN" {
        return ban(worker, parts).await;
    }
    let soft = parts
        .headers
        .get("soft-purge")
        .is_some_and(|v| matches!(v.as_bytes(), b"1" | b"true" | b"yes"));
    let target = match requested_tags(&parts.headers) {
        Some(tags) => match invalidation::tag_list(tags) {
            Ok(tags) => PurgeTarget::Tags(tags),
            Err(e) => return error(StatusCode::BAD_REQUEST, e.code(), &e.to_string()),
        },
        None => PurgeTarget::Key(primary_key(parts)),
    };
    match shared.purge(target, soft).await {
        Ok(n) => json(StatusCode::OK, format!(r#"{{"purged":{n},"soft":{soft}}}"#)),
        Err(e) => failed(&e),
    }
}

/// A request a rule's `ban` or `purge` turns into an invalidation (Magento's `PURGE` with
/// `X-Magento-Tags-Pattern`, WordPress's regex purge), answered as those platforms' VCL templates answer:
/// only from `purge.allow_from` (`405` otherwise, as their `client.ip ~ purge`), `400` naming the request
/// fields one of which is needed when none is sent or an expression is not one, else `200 Purged` once
/// every ban and purge is durable (in a cluster, in its log). The expressions are the request's, put
/// into bans made of parts ([`BanExpr::header_matches`]): they cannot add a condition.
pub async fn from_rule(
    worker: &Worker,
    client: IpAddr,
    parts: &Parts,
    invalidation: &Invalidation,
) -> Response<Body> {
    let shared = &worker.shared;
    if !shared
        .live()
        .purge
        .allow_from
        .iter()
        .any(|net| net.contains(&client))
    {
        inc(&shared.stats.purge_requests_refused);
        let mut resp = respond::plain(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed");
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static(ALLOW));
        return resp;
    }
    inc(&shared.stats.purge_requests);
    let key = primary_key(parts);
    let mut bans = Vec::new();
    for template in &invalidation.bans {
        let Some(pattern) = template.regex_from.of(parts) else {
            continue;
        };
        let ban = match &template.object_header {
            Some(name) => BanExpr::header_matches(name.as_str(), &pattern),
            None => BanExpr::url_matches(host_of(&key), &pattern),
        };
        match ban {
            Ok(ban) => bans.push(ban),
            Err(e) => {
                let field = template.regex_from.name();
                return respond::plain(StatusCode::BAD_REQUEST, &format!("{field}: {e}"));
            }
        }
    }
    if bans.is_empty() && invalidation.purge.is_none() {
        let fields: Vec<&str> = invalidation
            .bans
            .iter()
            .map(|b| b.regex_from.name())
            .collect();
        return respond::plain(
            StatusCode::BAD_REQUEST,
            &format!("{} header required", fields.join(" or ")),
        );
    }
    for ban in bans {
        if let Err(e) = shared.ban(ban).await {
            return failed(&e);
        }
    }
    if let Some(scope) = invalidation.purge {
        let key = match scope {
            PurgeScope::Url => key,
            PurgeScope::Path => match key.split_once('?') {
                Some((without, _)) => without.to_owned(),
                None => key,
            },
        };
        if let Err(e) = shared.purge(PurgeTarget::Key(key), false).await {
            return failed(&e);
        }
    }
    respond::plain(StatusCode::OK, "Purged")
}

/// What a rule's invalidation does, for `explain`.
pub fn describe(invalidation: &Invalidation) -> String {
    let mut parts: Vec<String> = invalidation
        .bans
        .iter()
        .map(|b| match &b.object_header {
            Some(name) => format!("ban obj.http.{name} ~ <{}>", b.regex_from.name()),
            None => format!("ban req.url ~ <{}> on this host", b.regex_from.name()),
        })
        .collect();
    match invalidation.purge {
        Some(PurgeScope::Url) => parts.push("purge this URL".into()),
        Some(PurgeScope::Path) => parts.push("purge this URL without its query".into()),
        None => {}
    }
    parts.join(", ")
}

/// The host part of a primary key (`host/path?query`).
fn host_of(key: &str) -> &str {
    key.split_once('/').map_or(key, |(host, _)| host)
}

/// A store that failed is the cache's fault (500); a cluster that could not take the invalidation is
/// unavailable for now (503): either way nothing was acknowledged and the sender should retry.
fn failed(e: &InvalidateError) -> Response<Body> {
    match e {
        InvalidateError::Store(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "store_error",
            &e.to_string(),
        ),
        InvalidateError::Cluster(message) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "cluster_unavailable",
            message,
        ),
    }
}

/// Tags named by `xkey-purge` (Varnish's xkey) or `Surrogate-Key` (Fastly) on a `PURGE`.
fn requested_tags(headers: &HeaderMap) -> Option<Vec<String>> {
    let names = ["xkey-purge".to_string(), "surrogate-key".to_string()];
    let tags = surrogate::tags(headers, &names);
    (!tags.is_empty()).then_some(tags)
}

async fn ban(worker: &Worker, parts: &Parts) -> Response<Body> {
    let text = match parts.headers.get("x-ban") {
        Some(value) => match value.to_str() {
            Ok(text) => text.to_owned(),
            Err(_) => return error(StatusCode::BAD_REQUEST, "invalid_ban", "X-Ban is not text"),
        },
        None => {
            let key = primary_key(parts);
            let (host, path) = key.split_at(key.find('/').unwrap_or(key.len()));
            format!(
                "req.http.host == {} && req.url ~ {}",
                quote(host),
                quote(path)
            )
        }
    };
    let expr = match BanExpr::parse(&text) {
        Ok(expr) => expr,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_ban", &e.to_string()),
    };
    match worker.shared.ban(expr).await {
        Ok(info) => json(
            StatusCode::OK,
            serde_json::json!({"id": info.id, "expression": info.expression}).to_string(),
        ),
        Err(e) => failed(&e),
    }
}

fn quote(text: &str) -> String {
    serde_json::to_string(text).expect("a string serialises")
}

fn error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    json(
        status,
        serde_json::json!({"code": code, "message": message}).to_string(),
    )
}

fn json(status: StatusCode, text: String) -> Response<Body> {
    respond::own_body(status, "application/json", text + "\n")
}
