//! An include's `src`, made the request target its fragment is fetched with.

use http::uri::{PathAndQuery, Uri};

/// Why an include's `src` is not fetched.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Refused {
    /// An absolute URL on a host other than the page's: a page assembles its own site's fragments only.
    #[error("src names another host ({0})")]
    OtherHost(String),
    /// Not a URL a request can carry.
    #[error("src is not a request target: {0:?}")]
    NotATarget(String),
}

/// The target (path and query) fetched for `src` in a page requested as `page` with `Host` `host`:
/// - an absolute URL (`http://`, `https://` or `//`) on the page's host: its path and query, whatever its
///   scheme or port (the site reached through this cache is the one the origin names);
/// - a path (`/nav`): as it is;
/// - a relative reference (`nav?x=1`): against the page's directory, as a browser resolves it.
///
/// A `#fragment` is not sent. Whatever does not make a valid target is refused.
pub fn resolve(src: &str, page: &Uri, host: Option<&str>) -> Result<PathAndQuery, Refused> {
    let src = src.split('#').next().unwrap_or_default();
    let lower = src.get(..8).unwrap_or(src).to_ascii_lowercase();
    let target =
        if lower.starts_with("http://") || lower.starts_with("https://") || src.starts_with("//") {
            let absolute = if src.starts_with("//") {
                format!("http:{src}")
            } else {
                src.to_owned()
            };
            let uri: Uri = absolute
                .parse()
                .map_err(|_| Refused::NotATarget(src.to_owned()))?;
            let named = uri.host().unwrap_or_default();
            let ours = host.map(host_name).unwrap_or_default();
            if !named.eq_ignore_ascii_case(ours) {
                return Err(Refused::OtherHost(named.to_owned()));
            }
            match uri.path_and_query() {
                Some(pq) if !pq.as_str().is_empty() => pq.as_str().to_owned(),
                _ => "/".to_owned(),
            }
        } else if src.starts_with('/') {
            src.to_owned()
        } else {
            let path = page.path();
            let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
            let dir = if dir.is_empty() { "/" } else { dir };
            format!("{dir}{src}")
        };
    target
        .parse::<PathAndQuery>()
        .ok()
        .filter(|pq| pq.as_str().starts_with('/'))
        .ok_or(Refused::NotATarget(src.to_owned()))
}

/// A `Host` value's name, without its port (an IPv6 literal keeps its brackets).
fn host_name(host: &str) -> &str {
    if host.starts_with('[') {
        return host.split_inclusive(']').next().unwrap_or(host);
    }
    host.rsplit_once(':').map_or(host, |(name, _)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        let page: Uri = "/shop/cat/page.html?p=2".parse().unwrap();
        let host = Some("Shop.Test:8080");
        let table: [(&str, Result<&str, Refused>); 11] = [
            ("/nav", Ok("/nav")),
            ("/nav?a=1&b=2", Ok("/nav?a=1&b=2")),
            ("nav", Ok("/shop/cat/nav")),
            ("../up?x", Ok("/shop/cat/../up?x")),
            ("http://shop.test/block?id=1", Ok("/block?id=1")),
            ("https://SHOP.test:443/block", Ok("/block")),
            ("//shop.test/b", Ok("/b")),
            ("http://shop.test", Ok("/")),
            ("/frag#part", Ok("/frag")),
            (
                "http://evil.test/x",
                Err(Refused::OtherHost("evil.test".into())),
            ),
            ("/a b", Err(Refused::NotATarget("/a b".into()))),
        ];
        for (src, want) in table {
            let got = resolve(src, &page, host).map(|pq| pq.as_str().to_owned());
            assert_eq!(got, want.map(str::to_owned), "{src}");
        }
        let root: Uri = "/".parse().unwrap();
        assert_eq!(resolve("x", &root, None).unwrap().as_str(), "/x");
        assert_eq!(
            resolve("http://a.test/", &root, None),
            Err(Refused::OtherHost("a.test".into()))
        );
        assert_eq!(
            host_name("[::1]:80"),
            "[::1]",
            "an IPv6 literal keeps its brackets"
        );
    }
}
