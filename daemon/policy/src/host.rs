//! Host names as routes and rules compare them.

use std::borrow::Cow;

use http::{header, HeaderMap};

/// A host condition of a route or rule: any host, one name, or every name under one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// Any host.
    Any,
    /// This name.
    Exact(String),
    /// `*.example.com`, kept as `.example.com`.
    Subdomains(String),
}

impl HostPattern {
    /// `example.com` or `*.example.com`; `""` is any host.
    pub fn parse(pattern: &str) -> Result<Self, String> {
        let p = pattern.trim().to_ascii_lowercase();
        if p.is_empty() {
            return Ok(Self::Any);
        }
        let (wild, name) = match p.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, p.as_str()),
        };
        let valid = !name.is_empty()
            && name.split('.').all(|l| {
                !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        match (valid, wild) {
            (false, _) => Err(format!(
                "{pattern:?} is not a host name or *.name (no port, no other wildcard)"
            )),
            (true, true) => Ok(Self::Subdomains(format!(".{name}"))),
            (true, false) => Ok(Self::Exact(name.to_owned())),
        }
    }

    /// `host` lower-cased, without port.
    pub fn matches(&self, host: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Exact(name) => host == name,
            Self::Subdomains(suffix) => {
                host.len() > suffix.len() && host.ends_with(suffix.as_str())
            }
        }
    }
}

/// The request's `Host` as routes and rules compare it: lower-cased, without a port; empty when absent.
/// Borrowed when it is in that form already, as nearly every one is.
pub fn request_host(headers: &HeaderMap) -> Cow<'_, str> {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let host = host.rsplit_once(':').map_or(host, |(h, port)| {
        if port.bytes().all(|b| b.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_patterns() {
        let cases = [
            ("", "anything.test", true),
            ("Example.com", "example.com", true),
            ("example.com", "www.example.com", false),
            ("*.example.com", "www.example.com", true),
            ("*.example.com", "a.b.example.com", true),
            ("*.example.com", "example.com", false),
            ("*.example.com", "badexample.com", false),
        ];
        for (pattern, host, want) in cases {
            let p = HostPattern::parse(pattern).unwrap();
            assert_eq!(p.matches(host), want, "{pattern} {host}");
        }
        for bad in ["*", "*.", "ex*.com", "example.com:80", "a..b", "*.*.a"] {
            assert!(HostPattern::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_request_host_is_compared_lower_cased_without_its_port() {
        for (sent, want) in [
            ("example.com", "example.com"),
            ("Example.COM:8080", "example.com"),
            ("[::1]:80", "[::1]"),
            ("", ""),
        ] {
            let mut h = HeaderMap::new();
            if !sent.is_empty() {
                h.insert(header::HOST, sent.parse().unwrap());
            }
            assert_eq!(request_host(&h), want, "{sent}");
        }
    }
}
