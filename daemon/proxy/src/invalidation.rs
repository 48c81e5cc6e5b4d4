//! What the admin API and the `PURGE` / `BAN` methods share: turning what an operator typed into a cache key
//! or a tag list, and running the purge.

use lacquer_storage::{PurgeMode, Store, StoreError};

use lacquer_policy::{
    head::valid_host,
    key::key_for,
    normalize,
    surrogate::{MAX_TAGS, MAX_TAG_LEN},
};

/// What is wrong with a purge's URL, host or tags; [`InvalidationError::code`] is the stable code.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InvalidationError {
    /// Neither an absolute `http://` URL nor a path.
    #[error("invalid url {0:?}: give http://host/path or /path with a host")]
    InvalidUrl(String),
    /// A path without a host to go with it.
    #[error("{0:?} has no host: give an absolute url or a host")]
    MissingHost(String),
    /// A host that is not a host name or address with an optional port (it would name another key).
    #[error("invalid host {0:?}: give a host name or address with an optional port")]
    InvalidHost(String),
    /// A tag purge naming no tag.
    #[error("no tags given")]
    NoTags,
    /// An empty or too long tag, or one holding a space or comma.
    #[error("invalid tag {0:?}: tags are 1 to {MAX_TAG_LEN} bytes without spaces or commas")]
    InvalidTag(String),
    /// More tags than one purge takes.
    #[error("at most {MAX_TAGS} tags per purge")]
    TooManyTags,
}

impl InvalidationError {
    /// The stable code API clients match on.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidUrl(_) => "invalid_url",
            Self::MissingHost(_) => "missing_host",
            Self::InvalidHost(_) => "invalid_host",
            Self::NoTags => "no_tags",
            Self::InvalidTag(_) => "invalid_tag",
            Self::TooManyTags => "too_many_tags",
        }
    }
}

/// What a purge removes (or, soft, makes stale).
#[derive(Debug, Clone)]
pub enum PurgeTarget {
    /// One cache key: every variant of it.
    Key(String),
    /// Every object carrying one of these surrogate keys, whatever its host.
    Tags(Vec<String>),
}

/// The cache key of `url` (`http://host/path?q`, or `/path?q` with `host`); `host` wins when both are given.
pub fn purge_key(url: &str, host: Option<&str>) -> Result<String, InvalidationError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|_| InvalidationError::InvalidUrl(url.to_owned()))?;
    let path = match uri.path_and_query() {
        Some(p) if p.as_str().starts_with('/') => p.as_str(),
        _ if uri.authority().is_some() => "/",
        _ => return Err(InvalidationError::InvalidUrl(url.to_owned())),
    };
    let host = host
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .or_else(|| uri.authority().map(|a| a.as_str()))
        .ok_or_else(|| InvalidationError::MissingHost(url.to_owned()))?;
    // The same rule as for requests: a host with a `/` (or userinfo) would name another key.
    if !valid_host(host.as_bytes()) {
        return Err(InvalidationError::InvalidHost(host.to_owned()));
    }
    // Keyed as a request for it is: requests' paths are normalised before their key is made.
    Ok(key_for(host, &normalize::target(path)))
}

/// Tags as the index holds them: the same splitting rules as the response headers they came from.
pub fn tag_list(tags: Vec<String>) -> Result<Vec<String>, InvalidationError> {
    if tags.is_empty() {
        return Err(InvalidationError::NoTags);
    }
    if tags.len() > MAX_TAGS {
        return Err(InvalidationError::TooManyTags);
    }
    for tag in &tags {
        let bad = tag.is_empty() || tag.len() > MAX_TAG_LEN || tag.contains([' ', ',', '\t', '\0']);
        if bad {
            return Err(InvalidationError::InvalidTag(tag.clone()));
        }
    }
    Ok(tags)
}

/// Runs a purge, hard or `soft`; returns how many stored objects it affected. Durable when it returns.
pub async fn purge(store: &Store, target: PurgeTarget, soft: bool) -> Result<usize, StoreError> {
    let mode = if soft {
        PurgeMode::Soft
    } else {
        PurgeMode::Hard
    };
    match target {
        PurgeTarget::Key(key) => store.purge(&key, mode).await,
        PurgeTarget::Tags(tags) => store.purge_tags(&tags, mode).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn purge_keys() {
        let cases: &[(&str, Option<&str>, Result<&str, &str>)] = &[
            ("http://Example.com/a?b=1", None, Ok("example.com/a?b=1")),
            ("http://example.com:80/a", None, Ok("example.com/a")),
            ("http://example.com:8080/a", None, Ok("example.com:8080/a")),
            ("http://example.com", None, Ok("example.com/")),
            ("/a?b", Some("shop.test"), Ok("shop.test/a?b")),
            (
                "http://ignored.test/a",
                Some("shop.test"),
                Ok("shop.test/a"),
            ),
            ("/a", None, Err("missing_host")),
            ("/evil", Some("victim.test/page"), Err("invalid_host")),
            ("http://user@victim.test/a", None, Err("invalid_host")),
            ("/a", Some("a b"), Err("invalid_host")),
            ("/a", Some("[::1]:8080"), Ok("[::1]:8080/a")),
            ("http://h.test//a/./b/../%7Ec?x", None, Ok("h.test/a/~c?x")),
            ("/a", Some("  "), Err("missing_host")),
            ("a b", Some("h"), Err("invalid_url")),
            ("", Some("h"), Err("invalid_url")),
            ("*", Some("h"), Err("invalid_url")),
        ];
        for (url, host, want) in cases {
            let got = purge_key(url, *host).map_err(|e| e.code());
            assert_eq!(got.as_deref(), want.as_deref(), "{url} {host:?}");
        }
    }

    #[test]
    fn tags() {
        assert_eq!(
            tag_list(vec!["a".into(), "b-1".into()]).unwrap(),
            ["a", "b-1"]
        );
        assert_eq!(tag_list(vec![]).unwrap_err(), InvalidationError::NoTags);
        for bad in ["", "a b", "a,b", &"x".repeat(MAX_TAG_LEN + 1)] {
            assert_eq!(
                tag_list(vec![bad.into()]).unwrap_err().code(),
                "invalid_tag",
                "{bad:?}"
            );
        }
        let many = (0..=MAX_TAGS).map(|i| i.to_string()).collect();
        assert_eq!(tag_list(many).unwrap_err(), InvalidationError::TooManyTags);
    }
}
