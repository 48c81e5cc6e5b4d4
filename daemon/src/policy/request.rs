//! What to do with a request before any lookup.

use http::{header, HeaderMap, Method};

use super::{cache_control::CacheControl, Policy};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestClass {
    /// GET or HEAD that may be answered from the cache.
    Lookup,
    /// Forwarded untouched; never stored.
    Pass(&'static str),
    /// An unsafe method, or one whose safety is unknown: forwarded untouched; on success the URL's stored
    /// objects are invalidated (RFC 9111 §4.4).
    Invalidate,
}

pub fn classify(method: &Method, headers: &HeaderMap, policy: &Policy) -> RequestClass {
    match *method {
        Method::GET | Method::HEAD => {}
        // Safe methods change nothing at the origin.
        Method::OPTIONS | Method::TRACE | Method::CONNECT => return RequestClass::Pass("method"),
        // Unsafe methods, and methods whose safety is unknown, invalidate (RFC 9111 §4.4).
        _ => return RequestClass::Invalidate,
    }
    if headers.contains_key(header::UPGRADE) {
        return RequestClass::Pass("upgrade");
    }
    if headers.contains_key(header::AUTHORIZATION) && !policy.cache_authorized {
        return RequestClass::Pass("authorization");
    }
    if headers.contains_key(header::COOKIE) && !policy.cache_cookie_requests {
        return RequestClass::Pass("cookie");
    }
    if CacheControl::from_headers(headers).no_store {
        return RequestClass::Pass("request no-store");
    }
    RequestClass::Lookup
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let p = Policy::default();
        let permissive = Policy {
            cache_authorized: true,
            cache_cookie_requests: true,
            ..Policy::default()
        };
        let cases: &[(&Policy, &str, &[(&str, &str)], RequestClass)] = &[
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
                RequestClass::Pass("authorization"),
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
                &[("upgrade", "websocket")],
                RequestClass::Pass("upgrade"),
            ),
            (
                &p,
                "GET",
                &[("cache-control", "no-store")],
                RequestClass::Pass("request no-store"),
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
                classify(&method.parse().unwrap(), &headers, policy),
                *want,
                "{method} {h:?}"
            );
        }
    }
}
