//! The primary cache key: which URL an object belongs to.

use http::{header::HOST, request::Parts};

/// `host` (lower-cased, default port removed: `:80`, and `:443` which TLS clients may send) followed by the
/// path and query, e.g. `example.com/a?b=1`.
/// Requests without a host (HTTP/1.0) use the authority of the absolute URI, or nothing.
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

/// The key for a host and a path-and-query, as used by invalidation of `Location` targets as well.
pub fn key_for(host: &str, path_and_query: &str) -> String {
    let host = host.trim();
    let host = [":80", ":443"]
        .iter()
        .find_map(|port| host.strip_suffix(port))
        .unwrap_or(host);
    let mut key = String::with_capacity(host.len() + path_and_query.len());
    key.extend(host.chars().map(|c| c.to_ascii_lowercase()));
    key.push_str(path_and_query);
    key
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

    #[test]
    fn table() {
        let cases = [
            ("/a?b=1", Some("Example.COM"), "example.com/a?b=1"),
            ("/a", Some("example.com:80"), "example.com/a"),
            ("/a", Some("example.com:8080"), "example.com:8080/a"),
            ("/a", Some("Example.com:443"), "example.com/a"),
            ("http://origin.test/x", None, "origin.test/x"),
            ("/", None, "/"),
            ("/p%20q", Some("h"), "h/p%20q"),
        ];
        for (uri, host, want) in cases {
            assert_eq!(primary_key(&parts(uri, host)), want, "{uri} {host:?}");
        }
    }
}
