//! Query normalisation that keeps equivalent URLs on one cache key: parameters optionally sorted, tracking
//! parameters optionally removed. The request is rewritten in place, so the key and what the origin sees
//! agree. (The host needs no rewriting: the key lower-cases it and drops its default port, `key.rs`.)

use http::{request::Parts, Uri};

use crate::config::Normalize;

pub fn apply(parts: &mut Parts, rules: &Normalize) {
    if !rules.sort_query && rules.strip_query_params.is_empty() {
        return;
    }
    let Some(query) = parts.uri.query() else {
        return;
    };
    let normal = query_normalized(query, rules);
    if normal == query {
        return;
    }
    let target = if normal.is_empty() {
        parts.uri.path().to_owned()
    } else {
        format!("{}?{normal}", parts.uri.path())
    };
    if let Ok(uri) = target.parse::<Uri>() {
        parts.uri = uri;
    }
}

fn query_normalized(query: &str, rules: &Normalize) -> String {
    let stripped = |name: &str| {
        rules
            .strip_query_params
            .iter()
            .any(|p| match p.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => name == p,
            })
    };
    let name = |param: &str| param.split_once('=').map_or(param, |(n, _)| n).to_owned();
    let mut params: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty() && !stripped(&name(p)))
        .collect();
    if rules.sort_query {
        params.sort_by_key(|p| name(p));
    }
    params.join("&")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normalized(uri: &str, rules: &Normalize) -> String {
        let mut parts = http::Request::get(uri).body(()).unwrap().into_parts().0;
        apply(&mut parts, rules);
        parts.uri.to_string()
    }

    #[test]
    fn table() {
        let none = Normalize::default();
        let sorted = Normalize {
            sort_query: true,
            ..Default::default()
        };
        let both = Normalize {
            sort_query: true,
            strip_query_params: vec!["utm_*".into(), "gclid".into(), "fbclid".into()],
        };
        let cases = [
            (&none, "/a?b=2&a=1", "/a?b=2&a=1"),
            (&sorted, "/a?b=2&a=1", "/a?a=1&b=2"),
            (&both, "/a?b=2&utm_source=news&a=1", "/a?a=1&b=2"),
            (&both, "/a?utm_medium=x&gclid=1", "/a"),
            (&both, "/a?gclidx=1&fbclid=2", "/a?gclidx=1"),
            (&both, "/a?c=3&a=2&c=1&a", "/a?a=2&a&c=3&c=1"),
            (&both, "/a?b=%20&&a=", "/a?a=&b=%20"),
            (&both, "/a", "/a"),
        ];
        for (rules, uri, want) in cases {
            assert_eq!(normalized(uri, rules), want, "{uri}");
        }
    }
}
