//! What to do with a request before any lookup.

use std::borrow::Cow;

use http::{header, request::Parts, HeaderMap, HeaderValue, Method, Uri};

use super::{cache_control::CacheControl, key::normal_host, Policy};

/// What the cache does with a request, decided from its method and head alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestClass {
    /// GET or HEAD that may be answered from the cache.
    Lookup,
    /// A GET never answered from the cache nor coalesced with others: fetched for itself, and its response
    /// stored when it may be (a request with `Authorization`, RFC 9111 §3.5: for later requests).
    Miss(&'static str),
    /// Forwarded untouched; never stored.
    Pass(&'static str),
    /// An unsafe method, or one whose safety is unknown: forwarded untouched; on success the URL's stored
    /// objects are invalidated (RFC 9111 §4.4).
    Invalidate,
}

/// A request this proxy answers itself, never forwarding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnsweredHere {
    /// `OPTIONS *` asks about the server, not a resource (RFC 9110 §9.3.7): there is no URL to forward it
    /// to, and no origin of several behind routes to speak for.
    ServerOptions,
    /// `CONNECT` asks for a tunnel, which a reverse proxy does not open (`405`, as NGINX answers).
    Connect,
}

/// Whether this proxy answers the request itself: `OPTIONS *` and `CONNECT` (any other method with the
/// asterisk target is refused by [`super::head::check`]).
pub fn answered_here(parts: &Parts) -> Option<AnsweredHere> {
    if parts.method == Method::CONNECT {
        Some(AnsweredHere::Connect)
    } else if parts.uri.path() == "*" {
        Some(AnsweredHere::ServerOptions)
    } else {
        None
    }
}

/// Classifies a request: unsafe methods invalidate; `OPTIONS`, `TRACE`, and `GET`/`HEAD` with
/// `Cookie` (unless `[cache]` allows it) or `Cache-Control: no-store` pass; a GET with `Authorization`
/// (unless `[cache]` allows it) is a miss whose response may be stored for others, a HEAD with it passes;
/// the rest are looked up. `cache_cookies` looks up requests with `Cookie` whatever the policy says (a
/// rule's `cache_cookies`).
pub fn classify(
    method: &Method,
    headers: &HeaderMap,
    policy: &Policy,
    cache_cookies: bool,
) -> RequestClass {
    match *method {
        Method::GET | Method::HEAD => {}
        // Safe methods change nothing at the origin.
        Method::OPTIONS | Method::TRACE => return RequestClass::Pass("method"),
        // A QUERY whose body is not keyed (too large, or of no declared length): safe, so it passes
        // without invalidating anything (RFC 10008).
        ref m if m.as_str() == "QUERY" => return RequestClass::Pass("query-body"),
        // Unsafe methods, and methods whose safety is unknown, invalidate (RFC 9111 §4.4).
        _ => return RequestClass::Invalidate,
    }
    if headers.contains_key(header::COOKIE)
        && !(policy.cache.cache_cookie_requests || cache_cookies)
    {
        return RequestClass::Pass("cookie");
    }
    if CacheControl::from_headers(headers).no_store {
        return RequestClass::Pass("request-no-store");
    }
    if headers.contains_key(header::AUTHORIZATION) && !policy.cache.cache_authorized {
        // The answer may be meant for this client alone, so nothing stored answers it; but what the
        // origin marks as shareable (`public`, `s-maxage`, `must-revalidate`) is stored for the others.
        return if *method == Method::GET {
            RequestClass::Miss("authorization")
        } else {
            RequestClass::Pass("authorization")
        };
    }
    RequestClass::Lookup
}

/// Puts the target host where the rest of the flow looks for it, `Host`, normalised as the cache key holds
/// it, and the target in origin form. HTTP/2 sends the host as `:authority` (which hyper puts in the URI)
/// and often no `Host`; an HTTP/1.1 request in absolute form names it in the URI, which then wins over
/// `Host` (RFC 9112 §3.2.2). The origin receives the host the key was made of: `a.test:443` is keyed as
/// `a.test`, and forwarded as sent an origin reflecting the port in its links would have them served to
/// every client of `a.test`.
pub fn host_from_authority(parts: &mut Parts) {
    if let Some(authority) = parts.uri.authority() {
        if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
            parts.headers.insert(header::HOST, host);
        }
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        if let Ok(uri) = target.parse::<Uri>() {
            parts.uri = uri;
        }
    }
    let Some(host) = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
    else {
        return;
    };
    // Most hosts are already normal: those are borrowed, and the field stays as it is.
    if let Cow::Owned(normal) = normal_host(host) {
        if let Ok(value) = HeaderValue::from_str(&normal) {
            parts.headers.insert(header::HOST, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Cache;
    use crate::Lines;

    #[test]
    fn host_comes_from_the_authority_when_there_is_one() {
        let cases = [
            ("https://Example.com/a?b", None, "example.com", "/a?b"),
            (
                "http://example.com:8080",
                Some("other"),
                "example.com:8080",
                "/",
            ),
            ("/a", Some("example.com"), "example.com", "/a"),
            ("/a", Some("A.Test:443"), "a.test", "/a"),
            ("/a", Some("a.test:80"), "a.test", "/a"),
            ("/a", Some("a.test:"), "a.test", "/a"),
            ("/a", Some("a.test:0080"), "a.test", "/a"),
            ("/a", Some("a.test:08080"), "a.test:8080", "/a"),
            ("/a", Some("[::1]:443"), "[::1]", "/a"),
            ("/a", None, "", "/a"),
        ];
        for (uri, host, want_host, want_target) in cases {
            let mut b = http::Request::builder().uri(uri);
            if let Some(h) = host {
                b = b.header(header::HOST, h);
            }
            let mut parts = b.body(()).unwrap().into_parts().0;
            host_from_authority(&mut parts);
            let got = parts
                .headers
                .get(header::HOST)
                .map_or("", |h| h.to_str().unwrap());
            assert_eq!(got, want_host, "{uri}");
            assert_eq!(parts.uri.to_string(), want_target, "{uri}");
        }
    }

    #[test]
    fn requests_answered_here() {
        let cases = [
            ("OPTIONS", "*", Some(AnsweredHere::ServerOptions)),
            ("OPTIONS", "/a", None),
            ("CONNECT", "a.test:443", Some(AnsweredHere::Connect)),
            ("GET", "/", None),
        ];
        for (method, uri, want) in cases {
            let parts = http::Request::builder()
                .method(method)
                .uri(uri)
                .body(())
                .unwrap()
                .into_parts()
                .0;
            assert_eq!(answered_here(&parts), want, "{method} {uri}");
        }
    }

    #[test]
    fn table() {
        let p = Policy::default();
        let permissive = Policy::new(Cache {
            cache_authorized: true,
            cache_cookie_requests: true,
            ..Cache::default()
        });
        let cases: &[(&Policy, &str, Lines<'_>, RequestClass)] = &[
            (&p, "GET", &[], RequestClass::Lookup),
            (&p, "HEAD", &[("accept", "*/*")], RequestClass::Lookup),
            (&p, "POST", &[], RequestClass::Invalidate),
            (&p, "PUT", &[], RequestClass::Invalidate),
            (&p, "DELETE", &[], RequestClass::Invalidate),
            (&p, "PATCH", &[], RequestClass::Invalidate),
            (&p, "OPTIONS", &[], RequestClass::Pass("method")),
            (&p, "M-SEARCH", &[], RequestClass::Invalidate),
            (
                &p,
                "GET",
                &[("authorization", "Bearer x")],
                RequestClass::Miss("authorization"),
            ),
            (
                &p,
                "HEAD",
                &[("authorization", "Bearer x")],
                RequestClass::Pass("authorization"),
            ),
            (
                &p,
                "GET",
                &[("authorization", "Bearer x"), ("cookie", "a=b")],
                RequestClass::Pass("cookie"),
            ),
            (
                &p,
                "GET",
                &[("authorization", "Bearer x"), ("cache-control", "no-store")],
                RequestClass::Pass("request-no-store"),
            ),
            (
                &p,
                "GET",
                &[("cookie", "a=b")],
                RequestClass::Pass("cookie"),
            ),
            (
                &permissive,
                "GET",
                &[("authorization", "Bearer x"), ("cookie", "a=b")],
                RequestClass::Lookup,
            ),
            (
                &p,
                "GET",
                &[("cache-control", "no-store")],
                RequestClass::Pass("request-no-store"),
            ),
            (
                &p,
                "GET",
                &[("cache-control", "no-cache")],
                RequestClass::Lookup,
            ),
        ];
        for (policy, method, h, want) in cases {
            let mut headers = HeaderMap::new();
            for (k, v) in *h {
                headers.append(
                    http::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                );
            }
            assert_eq!(
                classify(&method.parse().unwrap(), &headers, policy, false),
                *want,
                "{method} {h:?}"
            );
        }
        let cookie = [("cookie", "lang=fr")];
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, cookie[0].1.parse().unwrap());
        assert_eq!(
            classify(&Method::GET, &headers, &p, true),
            RequestClass::Lookup,
            "a rule's cache_cookies looks it up"
        );
    }
}
