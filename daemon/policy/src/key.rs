//! The primary cache key: which URL an object belongs to.
//!
//! A key is the normalised host followed by the request target, `example.com/a?b=1`. It cannot be
//! confused: the host went through [`super::head::valid_host`], so it holds no `/`, and an origin-form
//! target starts with one, so the first `/` of a key always ends the host (bans split keys there).

use std::borrow::Cow;

use http::{header::HOST, request::Parts};

/// The key of a request whose head was checked ([`super::head::check`]) and whose authority was moved to
/// `Host` ([`super::request::host_from_authority`]). Requests without a host (HTTP/1.0 may omit it) have an
/// empty host part, as the origin receives them.
pub fn primary_key(req: &Parts) -> String {
    let host = req
        .headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri.authority().map(|a| a.as_str()))
        .unwrap_or("");
    let path = req.uri.path_and_query().map_or("/", |p| p.as_str());
    key_for(host, path)
}

/// The key for a host and a path-and-query, as used by invalidation of `Location` targets as well. The
/// host is compared as RFC 3986 §6.2.2 and §6.2.3 say equivalent hosts compare: letter case ignored, an
/// empty port or the port of `http` (or `https`, which TLS clients may send) dropped, leading zeros of a
/// port ignored.
pub fn key_for(host: &str, path_and_query: &str) -> String {
    let host = normal_host(host.trim());
    let mut key = String::with_capacity(host.len() + path_and_query.len());
    key.push_str(&host);
    key.push_str(path_and_query);
    key
}

/// `host[:port]` as it stands in a primary key: lower-cased, the port as a number and dropped when it is
/// `http`'s or `https`'s (or empty), so equivalent hosts (RFC 3986 §6.2.2, §6.2.3) key and ban alike.
/// Borrowed when `host` is normal already, as nearly every one is (every request makes its key), and
/// only then. Normal once is normal for good (a ban's host is printed normal and read back).
pub fn normal_host(sent: &str) -> Cow<'_, str> {
    let mut host = sent;
    fn split(host: &str) -> Option<(&str, &str)> {
        match host.rfind(':') {
            Some(colon) if !host[colon..].contains(']') => {
                Some((&host[..colon], &host[colon + 1..]))
            }
            _ => None,
        }
    }
    // A port dropped leaves a host that may end in another (`a:80:`, `::`): it is read again, in a loop
    // rather than a recursion however many colons a client sends.
    while let Some((name, port)) = split(host) {
        if !port.is_empty() && !matches!(port.parse::<u16>(), Ok(80 | 443)) {
            break;
        }
        host = name;
    }
    let (name, port) = match split(host) {
        Some((name, port)) => match port.parse::<u16>() {
            Ok(number) => (name, Some((number, port))),
            Err(_) => (host, None),
        },
        None => (host, None),
    };
    let port_as_written = port.is_none_or(|(_, written)| {
        !written.starts_with('0') && written.bytes().all(|b| b.is_ascii_digit())
    });
    let whole = name.len() == host.len() || port.is_some();
    if whole && port_as_written && !name.bytes().any(|b| b.is_ascii_uppercase()) {
        return match host.len() == sent.len() {
            true => Cow::Borrowed(host),
            false => Cow::Owned(host.to_owned()),
        };
    }
    let mut out = name.to_ascii_lowercase();
    if let Some((number, _)) = port {
        out.push(':');
        out.push_str(&number.to_string());
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(uri: &str, host: Option<&str>) -> Parts {
        let mut b = http::Request::builder().uri(uri);
        if let Some(h) = host {
            b = b.header(HOST, h);
        }
        b.body(()).unwrap().into_parts().0
    }

    /// A host that is normal already is borrowed, not copied; any other is made normal.
    #[test]
    fn normal_hosts_are_borrowed() {
        for (host, normal, borrowed) in [
            ("example.com", "example.com", true),
            ("example.com:8080", "example.com:8080", true),
            ("[::1]:8080", "[::1]:8080", true),
            ("[::1]", "[::1]", true),
            ("Example.com", "example.com", false),
            ("example.com:80", "example.com", false),
            ("example.com:443", "example.com", false),
            ("example.com:", "example.com", false),
            ("example.com:08080", "example.com:8080", false),
            ("example.com:+8080", "example.com:8080", false),
            ("[::1]:80", "[::1]", false),
            ("Example.com:80", "example.com", false),
            ("example.com:80:", "example.com", false),
            ("a::80", "a", false),
            ("::", "", false),
            ("a::8080", "a::8080", true),
            ("a:b", "a:b", true),
        ] {
            let got = normal_host(host);
            assert_eq!(got, normal, "{host}");
            assert_eq!(matches!(got, Cow::Borrowed(_)), borrowed, "{host}");
            assert_eq!(
                normal_host(&got),
                got,
                "normal once, normal for good: {host}"
            );
        }
        let colons = ":".repeat(100_000);
        assert_eq!(normal_host(&colons), "", "however many colons");
    }

    #[test]
    fn table() {
        let cases = [
            ("/a?b=1", Some("Example.COM"), "example.com/a?b=1"),
            ("/a", Some("example.com:80"), "example.com/a"),
            ("/a", Some("example.com:8080"), "example.com:8080/a"),
            ("/a", Some("example.com:08080"), "example.com:8080/a"),
            ("/a", Some("Example.com:443"), "example.com/a"),
            ("/a", Some("example.com:"), "example.com/a"),
            ("/a", Some("[::1]:80"), "[::1]/a"),
            ("/a", Some("[::1]"), "[::1]/a"),
            ("/a", Some("[2001:DB8::1]:8443"), "[2001:db8::1]:8443/a"),
            ("http://origin.test/x", None, "origin.test/x"),
            ("/", None, "/"),
            ("/p%20q", Some("h"), "h/p%20q"),
        ];
        for (uri, host, want) in cases {
            assert_eq!(primary_key(&parts(uri, host)), want, "{uri} {host:?}");
        }
    }

    /// The attacks of issue 14: with hosts that passed `valid_host`, different (host, target) pairs never
    /// meet on one key, and the host is what comes before the first `/`.
    #[test]
    fn keys_cannot_be_confused() {
        let pairs = [
            ("victim.test", "/page/evil"),
            ("victim.test", "/page"),
            ("victim.test:8080", "/page"),
            ("victim.test8080", "/page"),
            ("evil.test", "/page"),
            ("victim.tes", "/t/page"),
            ("", "/victim.test/page"),
            ("[::1]", "/page"),
            ("[::1]:81", "/page"),
            ("a*", "*"),
        ];
        let mut keys = std::collections::HashSet::new();
        for (host, target) in pairs {
            assert!(host.is_empty() || super::super::head::valid_host(host.as_bytes()));
            let key = key_for(host, target);
            let (h, t) = key.split_at(key.find('/').unwrap_or(key.len()));
            if target.starts_with('/') {
                assert_eq!((h, t), (normal_host(host).as_ref(), target), "{key}");
            }
            assert!(keys.insert(key.clone()), "{host} {target} collides: {key}");
        }
    }
}
