//! The page a client gets when lacquerd answers a 5xx itself: the operator's `[error_pages]` file for
//! that status, else a generic page in HTML or plain text as the request's `Accept` prefers. Never the
//! cause: a backend's address and its connect error are the operator's (the log, `cachectl backends`),
//! not the public's.

use std::{collections::BTreeMap, path::PathBuf};

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use lacquer_backends::body::{self, Body};
use lacquer_config::ConfigError;

/// The operator's pages by status, read once when the configuration is compiled.
#[derive(Debug, Default)]
pub struct ErrorPages {
    pages: Vec<(StatusCode, HeaderValue, Bytes)>,
}

impl ErrorPages {
    /// Reads every `[error_pages]` file (as a rule's `respond.file` is read, at most 1 MiB), so a missing
    /// one stops `--check`, the start or a reload; the error names the entry and the path.
    pub fn compile(pages: &BTreeMap<String, PathBuf>) -> Result<Self, ConfigError> {
        let pages = pages
            .iter()
            .map(|(status, path)| {
                let setting = format!("error_pages.{status}");
                let code = status
                    .parse::<u16>()
                    .ok()
                    .and_then(|s| StatusCode::from_u16(s).ok())
                    .filter(StatusCode::is_server_error)
                    .ok_or_else(|| ConfigError::setting(&setting, "not a 5xx status"))?;
                let bytes = lacquer_rules::read_page(path)
                    .map_err(|e| ConfigError::setting(&setting, e))?;
                Ok((code, lacquer_rules::page_type(path), bytes))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { pages })
    }

    /// `resp`, a failure lacquerd made, with its page: the operator's for its status, else the generic one
    /// (`html` when the client's `Accept` prefers it). Its other fields (`Retry-After`, `Cache-Status`)
    /// stay.
    pub(crate) fn apply(&self, html: bool, resp: Response<Body>) -> Response<Body> {
        let (mut head, _) = resp.into_parts();
        let (content_type, page) = self.page(head.status, html);
        head.headers.insert(header::CONTENT_TYPE, content_type);
        // Framed by length: the byte counter the page passes through hides its size from hyper.
        head.headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(page.len()));
        Response::from_parts(head, body::full(page))
    }

    fn page(&self, status: StatusCode, html: bool) -> (HeaderValue, Bytes) {
        if let Some((_, t, b)) = self.pages.iter().find(|(s, _, _)| *s == status) {
            return (t.clone(), b.clone());
        }
        let reason = status.canonical_reason().unwrap_or("Error");
        let code = status.as_u16();
        if html {
            let page = format!(
                "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{code} {reason}</title></head>\n\
                 <body><h1>{code} {reason}</h1><p>The server cannot answer this request right now. \
                 Please try again later.</p></body></html>\n"
            );
            (
                HeaderValue::from_static("text/html; charset=utf-8"),
                page.into(),
            )
        } else {
            let page = format!(
                "{code} {reason}: the server cannot answer this request right now. Please try again later.\n"
            );
            (
                HeaderValue::from_static("text/plain; charset=utf-8"),
                page.into(),
            )
        }
    }
}

/// The client prefers HTML: its `Accept` lines name `text/html` (or `application/xhtml+xml`) with a weight
/// above zero, as a browser's does. A client that names none (curl, an API client) gets plain text.
pub(crate) fn wants_html<'a>(accept: impl IntoIterator<Item = &'a HeaderValue>) -> bool {
    accept
        .into_iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|range| {
            let mut params = range.split(';');
            let media = params.next().unwrap_or("").trim();
            let refused = params.any(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            !refused
                && (media.eq_ignore_ascii_case("text/html")
                    || media.eq_ignore_ascii_case("application/xhtml+xml"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    #[test]
    fn html_is_for_clients_that_ask_for_it() {
        let accept = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::ACCEPT, v.parse().unwrap());
            wants_html(h.get_all(header::ACCEPT))
        };
        assert!(accept(
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
        ));
        assert!(accept("TEXT/HTML"));
        assert!(!accept("*/*"));
        assert!(!accept("application/json"));
        assert!(!accept("text/html;q=0, text/plain"));
        assert!(!wants_html(HeaderMap::new().get_all(header::ACCEPT)));
    }

    #[test]
    fn the_generic_page_tells_nothing_but_the_status() {
        let pages = ErrorPages::default();
        let (t, b) = pages.page(StatusCode::SERVICE_UNAVAILABLE, true);
        assert_eq!(t, "text/html; charset=utf-8");
        assert!(std::str::from_utf8(&b)
            .unwrap()
            .contains("503 Service Unavailable"));
        let (t, b) = pages.page(StatusCode::GATEWAY_TIMEOUT, false);
        assert_eq!(t, "text/plain; charset=utf-8");
        assert!(b.starts_with(b"504 Gateway Timeout"));
    }

    #[test]
    fn a_missing_or_oversized_file_names_the_entry_and_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("503.html");
        let e =
            ErrorPages::compile(&BTreeMap::from([("503".into(), missing.clone())])).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("error_pages.503: {}: ", missing.display())),
            "{e}"
        );
        let big = dir.path().join("502.txt");
        std::fs::write(&big, vec![b'x'; 2 * 1024 * 1024]).unwrap();
        let e = ErrorPages::compile(&BTreeMap::from([("502".into(), big)])).unwrap_err();
        assert!(e.to_string().contains("more than 1 MiB"), "{e}");
        let page = dir.path().join("504.html");
        std::fs::write(&page, "<p>down</p>").unwrap();
        let pages = ErrorPages::compile(&BTreeMap::from([("504".into(), page)])).unwrap();
        let (t, b) = pages.page(StatusCode::GATEWAY_TIMEOUT, false);
        assert_eq!(
            (t.to_str().unwrap(), &b[..]),
            ("text/html; charset=utf-8", &b"<p>down</p>"[..])
        );
    }
}
