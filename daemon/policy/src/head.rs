//! The request head checked before anything reads it: the host a request is for decides its cache key,
//! so a request whose host is missing, repeated or not a host is refused (RFC 9110 §7.2, RFC 9112 §3.2),
//! as NGINX does, rather than keyed on one reading of it and forwarded with another.

use std::net::Ipv6Addr;

use http::{header, request::Parts, Method, StatusCode, Version};

/// Why a request head is refused ([`BadHead::status`]: `400`, or `501` for a transfer coding this proxy
/// cannot forward); the message is the response body's one-line reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadHead {
    /// Two `Host` lines: the cache and the origin might each read a different one (RFC 9112 §3.2).
    #[error("more than one Host field")]
    HostRepeated,
    /// `Host` holds something other than a name, IPv4 address or bracketed IPv6 literal with an optional
    /// port (a path, `@`, spaces, …).
    #[error("Host is not a host name or address with an optional port")]
    HostInvalid,
    /// The absolute-form target's or HTTP/2 `:authority`'s host is not valid (userinfo included), and it
    /// would have replaced `Host`.
    #[error("the request target's authority is not a host name or address with an optional port")]
    AuthorityInvalid,
    /// An HTTP/1.1 request without `Host`, or an HTTP/2 one with neither `:authority` nor `Host`.
    #[error("an HTTP/1.1 request needs a Host field")]
    HostMissing,
    /// `Connection: host`: the origin would be asked to drop the host the key was made of.
    #[error("Connection names Host, which is not hop-by-hop")]
    ConnectionNamesHost,
    /// The asterisk target (`*`) with a method other than `OPTIONS` (RFC 9112 §3.2.4): it names no
    /// resource, and forwarded it became `http://backend*`, a request to port 80 of the backend's host.
    #[error("the request target * is only for OPTIONS")]
    AsteriskNotOptions,
    /// A request body in a transfer coding other than `chunked` alone (`gzip, chunked`, …): hyper removes
    /// only the chunked framing, so the origin would get the coded bytes as the body itself (RFC 9112 §6.1
    /// answers such a request `501`, as NGINX does).
    #[error("transfer codings other than chunked are not implemented")]
    TransferCoding,
}

impl BadHead {
    /// The status the request is refused with.
    pub fn status(&self) -> StatusCode {
        match self {
            BadHead::TransferCoding => StatusCode::NOT_IMPLEMENTED,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

/// Refuses what RFC 9110 §7.2 and RFC 9112 §3.2 tell a server to refuse with 400. An HTTP/2 request may
/// carry its host as `:authority` only; an HTTP/1.1 one needs the `Host` line even in absolute form.
///
/// `Connection` may list only hop-by-hop fields (RFC 9110 §7.6.1), and listed fields are removed before
/// the key is made; Host cannot be removed (a request without it is refused), so naming it is refused.
pub fn check(parts: &Parts) -> Result<(), BadHead> {
    let mut hosts = parts.headers.get_all(header::HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(BadHead::HostRepeated);
    }
    if host.is_some_and(|h| !valid_host(h.as_bytes())) {
        return Err(BadHead::HostInvalid);
    }
    let authority = parts.uri.authority();
    if authority.is_some_and(|a| !valid_host(a.as_str().as_bytes())) {
        return Err(BadHead::AuthorityInvalid);
    }
    let required = match parts.version {
        Version::HTTP_09 | Version::HTTP_10 => false,
        Version::HTTP_11 => host.is_none(),
        _ => host.is_none() && authority.is_none(),
    };
    if required {
        return Err(BadHead::HostMissing);
    }
    let names_host = parts
        .headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"host"));
    if names_host {
        return Err(BadHead::ConnectionNamesHost);
    }
    if parts.uri.path() == "*" && parts.method != Method::OPTIONS {
        return Err(BadHead::AsteriskNotOptions);
    }
    let codings = parts.headers.get_all(header::TRANSFER_ENCODING);
    let mut lines = codings.iter();
    let chunked_alone = match (lines.next(), lines.next()) {
        (None, _) => true,
        (Some(one), None) => one.as_bytes().trim_ascii().eq_ignore_ascii_case(b"chunked"),
        _ => false,
    };
    if !chunked_alone {
        return Err(BadHead::TransferCoding);
    }
    Ok(())
}

/// Whether `value` is `uri-host [ ":" port ]` (RFC 3986 §3.2.2, §3.2.3): an IP literal in brackets, or a
/// non-empty reg-name (which covers IPv4 addresses), and a port of at most 65535. Nothing else: no
/// userinfo, path, query, spaces or controls, so no host can carry a `/` into the cache key.
pub fn valid_host(value: &[u8]) -> bool {
    let (host, port) = match value.strip_prefix(b"[") {
        Some(rest) => {
            let Some(end) = rest.iter().position(|&b| b == b']') else {
                return false;
            };
            if !ip_literal(&rest[..end]) {
                return false;
            }
            match &rest[end + 1..] {
                [] => return true,
                [b':', port @ ..] => (None, port),
                _ => return false,
            }
        }
        None => match value.iter().rposition(|&b| b == b':') {
            Some(colon) => (Some(&value[..colon]), &value[colon + 1..]),
            None => (Some(value), &[][..]),
        },
    };
    let host_ok = host.is_none_or(|h| !h.is_empty() && reg_name(h));
    host_ok && valid_port(port)
}

/// `*DIGIT`, empty included, whose value fits a TCP port.
fn valid_port(port: &[u8]) -> bool {
    port.is_empty()
        || (port.len() <= 5
            && port.iter().all(u8::is_ascii_digit)
            && std::str::from_utf8(port).is_ok_and(|p| p.parse::<u16>().is_ok()))
}

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn sub_delim(b: u8) -> bool {
    matches!(
        b,
        b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'='
    )
}

/// `*( unreserved / pct-encoded / sub-delims )`.
fn reg_name(name: &[u8]) -> bool {
    let mut i = 0;
    while i < name.len() {
        match name[i] {
            b'%' => {
                let hex = name.get(i + 1..i + 3);
                if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                    return false;
                }
                i += 3;
            }
            b if unreserved(b) || sub_delim(b) => i += 1,
            _ => return false,
        }
    }
    true
}

/// `IPv6address / IPvFuture`, the inside of the brackets.
fn ip_literal(inside: &[u8]) -> bool {
    if let [b'v' | b'V', rest @ ..] = inside {
        let Some(dot) = rest.iter().position(|&b| b == b'.') else {
            return false;
        };
        let (version, tail) = (&rest[..dot], &rest[dot + 1..]);
        return !version.is_empty()
            && version.iter().all(u8::is_ascii_hexdigit)
            && !tail.is_empty()
            && tail
                .iter()
                .all(|&b| unreserved(b) || sub_delim(b) || b == b':');
    }
    std::str::from_utf8(inside).is_ok_and(|s| s.parse::<Ipv6Addr>().is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_values() {
        let cases: &[(&str, bool)] = &[
            ("example.com", true),
            ("Example.COM", true),
            ("example.com:8080", true),
            ("example.com:", true),
            ("example.com:65535", true),
            ("example.com:65536", false),
            ("example.com:080", true),
            ("example.com:123456", false),
            ("example.com:80x", false),
            ("example.com:-1", false),
            ("192.0.2.1", true),
            ("192.0.2.1:80", true),
            ("[::1]", true),
            ("[::1]:8080", true),
            ("[2001:db8::7]:", true),
            ("[v1.fe80::a+en1]", true),
            ("[::1", false),
            ("[::1]x", false),
            ("[::1]:x", false),
            ("[example.com]", false),
            ("[fe80::1%25eth0]", false),
            ("::1", false),
            ("a_b~c-d.e", true),
            ("xn--bcher-kva.example", true),
            ("ex%41mple.com", true),
            ("ex%4", false),
            ("ex%zzmple", false),
            ("a!$&'()*+,;=b", true),
            ("", false),
            (":80", false),
            ("victim.test/page", false),
            ("victim.test?x", false),
            ("victim.test#x", false),
            ("user@victim.test", false),
            ("a b", false),
            (" victim.test", false),
            ("victim.test\t", false),
            ("victim.test\\x", false),
            ("vïctim.test", false),
            ("a:b:80", false),
        ];
        for (value, want) in cases {
            assert_eq!(valid_host(value.as_bytes()), *want, "{value:?}");
        }
    }

    fn parts(version: Version, uri: &str, headers: &[(&str, &str)]) -> Parts {
        with_method("GET", version, uri, headers)
    }

    fn with_method(method: &str, version: Version, uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut b = http::Request::builder()
            .method(method)
            .version(version)
            .uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn heads() {
        use BadHead::*;
        const HTTP_10: Version = Version::HTTP_10;
        const HTTP_11: Version = Version::HTTP_11;
        const HTTP_2: Version = Version::HTTP_2;
        type Case<'a> = (
            Version,
            &'a str,
            &'a [(&'a str, &'a str)],
            Result<(), BadHead>,
        );
        let cases: &[Case] = &[
            (HTTP_11, "/", &[("host", "a.test")], Ok(())),
            (HTTP_11, "/", &[], Err(HostMissing)),
            (HTTP_10, "/", &[], Ok(())),
            (HTTP_10, "/", &[("host", "a/b")], Err(HostInvalid)),
            (
                HTTP_11,
                "/",
                &[("host", "victim.test"), ("host", "evil.test")],
                Err(HostRepeated),
            ),
            (
                HTTP_11,
                "/",
                &[("host", "victim.test"), ("host", "victim.test")],
                Err(HostRepeated),
            ),
            (
                HTTP_11,
                "/evil",
                &[("host", "victim.test/page")],
                Err(HostInvalid),
            ),
            (HTTP_11, "/", &[("host", "")], Err(HostInvalid)),
            (
                HTTP_11,
                "http://victim.test/a",
                &[("host", "evil.test")],
                Ok(()),
            ),
            (HTTP_11, "http://victim.test/a", &[], Err(HostMissing)),
            (
                HTTP_11,
                "http://user@victim.test/a",
                &[("host", "victim.test")],
                Err(AuthorityInvalid),
            ),
            (HTTP_2, "https://victim.test/a", &[], Ok(())),
            (HTTP_2, "/a", &[("host", "victim.test")], Ok(())),
            (HTTP_2, "/a", &[], Err(HostMissing)),
            (
                HTTP_2,
                "https://victim.test/a",
                &[("host", "a"), ("host", "b")],
                Err(HostRepeated),
            ),
            (
                HTTP_11,
                "/",
                &[("host", "a.test"), ("connection", "close, Host")],
                Err(ConnectionNamesHost),
            ),
            (
                HTTP_11,
                "/",
                &[("host", "a.test"), ("connection", "x-host, hostname")],
                Ok(()),
            ),
            (HTTP_11, "*", &[("host", "a.test")], Err(AsteriskNotOptions)),
            (
                HTTP_11,
                "/",
                &[("host", "a.test"), ("transfer-encoding", "chunked")],
                Ok(()),
            ),
            (
                HTTP_11,
                "/",
                &[("host", "a.test"), ("transfer-encoding", "Chunked ")],
                Ok(()),
            ),
            (
                HTTP_11,
                "/",
                &[("host", "a.test"), ("transfer-encoding", "gzip, chunked")],
                Err(TransferCoding),
            ),
            (
                HTTP_11,
                "/",
                &[
                    ("host", "a.test"),
                    ("transfer-encoding", "gzip"),
                    ("transfer-encoding", "chunked"),
                ],
                Err(TransferCoding),
            ),
        ];
        for (version, uri, headers, want) in cases {
            assert_eq!(
                check(&parts(*version, uri, headers)),
                *want,
                "{version:?} {uri} {headers:?}"
            );
        }
        for (method, want) in [("OPTIONS", Ok(())), ("HEAD", Err(AsteriskNotOptions))] {
            let p = with_method(method, HTTP_11, "*", &[("host", "a.test")]);
            assert_eq!(check(&p), want, "{method} *");
        }
        assert_eq!(TransferCoding.status(), StatusCode::NOT_IMPLEMENTED);
        assert_eq!(HostMissing.status(), StatusCode::BAD_REQUEST);
    }
}
