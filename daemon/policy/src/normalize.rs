//! Target normalisation, so that deny rules, routes, the cache key and the origin all see one spelling of
//! a path: the path always normalised ([`path`]), the query's parameters optionally sorted and tracking
//! parameters optionally removed. The request is rewritten in place, so what the rules matched and the key
//! was made of is what the origin receives. (The host needs no rewriting: the key lower-cases it and
//! drops its default port, `key.rs`.)

use std::borrow::Cow;

use http::{request::Parts, Uri};

use lacquer_config::Normalize;

/// Rewrites the request target in place: the path always normalised, the query sorted and stripped as
/// `rules` say; the target is left as it is when nothing changes.
pub fn apply(parts: &mut Parts, rules: &Normalize) {
    // The asterisk form (`OPTIONS *`) has no path to normalise.
    let raw_path = parts.uri.path();
    let path = match raw_path.starts_with('/') {
        true => path(raw_path),
        false => Cow::Borrowed(raw_path),
    };
    let query = parts.uri.query().map(|q| {
        if rules.sort_query || !rules.strip_query_params.is_empty() {
            Cow::Owned(query_normalized(q, rules))
        } else {
            Cow::Borrowed(q)
        }
    });
    if path == raw_path && query.as_deref() == parts.uri.query() {
        return;
    }
    let target = match query {
        Some(q) if !q.is_empty() => format!("{path}?{q}"),
        _ => path.into_owned(),
    };
    if let Ok(uri) = target.parse::<Uri>() {
        parts.uri = uri;
    }
}

/// An absolute path in its normal form, as NGINX normalises before matching `location`s:
/// percent-encoded unreserved characters decoded and other percent-encodings upper-cased (RFC 3986
/// §6.2.2.1-2), runs of `/` merged (NGINX's `merge_slashes`, which RFC 3986 does not ask for but
/// almost every origin's file or route lookup does), then `.` and `..` segments removed (§5.2.4), which
/// never climbs above the root. Letter case is kept: paths are case-sensitive.
pub fn path(raw: &str) -> Cow<'_, str> {
    if is_normal(raw) {
        return Cow::Borrowed(raw);
    }
    let decoded = percent_normalized(raw);
    let mut segments: Vec<&str> = Vec::new();
    let parts: Vec<&str> = decoded.split('/').skip(1).collect();
    let last = parts.len().saturating_sub(1);
    // Whether the output ends in `/`: after a `.` or `..` last segment, or an empty one.
    let mut trailing = false;
    for (i, segment) in parts.iter().enumerate() {
        match *segment {
            "" => trailing = i == last,
            "." => trailing = i == last,
            ".." => {
                segments.pop();
                trailing = i == last;
            }
            s => {
                segments.push(s);
                trailing = false;
            }
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if trailing || segments.is_empty() {
        out.push('/');
    }
    Cow::Owned(out)
}

/// Whether [`path`] leaves `raw` as it is: no percent-encoding, no empty segment past the first, no `.` or
/// `..` segment. One pass, as every request's path is asked.
fn is_normal(raw: &str) -> bool {
    let b = raw.as_bytes();
    // Segments start at 0 and after every `/`.
    let dot_segment = |start: usize| {
        matches!(
            &b[start..],
            [b'.'] | [b'.', b'/', ..] | [b'.', b'.'] | [b'.', b'.', b'/', ..]
        )
    };
    if dot_segment(0) {
        return false;
    }
    for (i, &c) in b.iter().enumerate() {
        match c {
            b'%' => return false,
            b'/' if b.get(i + 1) == Some(&b'/') || dot_segment(i + 1) => return false,
            _ => {}
        }
    }
    true
}

/// A path-and-query (`/a/./b?q`) with its path normalised as [`path`] does: what a request for it is keyed
/// under, for keys built outside a request (purges, `Location` invalidation).
pub fn target(path_and_query: &str) -> String {
    let (raw_path, query) = match path_and_query.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path_and_query, None),
    };
    let mut out = match raw_path.starts_with('/') {
        true => path(raw_path).into_owned(),
        false => raw_path.to_owned(),
    };
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// The path-and-query as a lenient origin may read it, when that differs from how it reads as sent: Tomcat,
/// Spring, IIS and many frameworks take `%2F` and `%5C` as separators, `\` as `/`, and drop `;`
/// parameters from each segment, so `/%2Fadmin`, `/\admin`, `/;/admin` and `/.;/admin` all reach their
/// `/admin`. Deny rules and routes match this reading as well as the normal form ([`path`]), so a rule on
/// `^/admin` cannot be passed by a spelling only the origin resolves. The query is left as it is.
pub fn lenient(path_and_query: &str) -> Option<String> {
    let (raw, query) = match path_and_query.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path_and_query, None),
    };
    if !raw.starts_with('/') || !raw.bytes().any(|b| matches!(b, b'%' | b'\\' | b';')) {
        return None;
    }
    let mut separated = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(c) = rest.chars().next() {
        let escape = rest.as_bytes().get(..3);
        if escape.is_some_and(|e| e.eq_ignore_ascii_case(b"%2F") || e.eq_ignore_ascii_case(b"%5C"))
        {
            separated.push('/');
            rest = &rest[3..];
        } else {
            separated.push(if c == '\\' { '/' } else { c });
            rest = &rest[c.len_utf8()..];
        }
    }
    let unparametered: Vec<&str> = separated
        .split('/')
        .map(|segment| segment.split(';').next().unwrap_or(""))
        .collect();
    let mut read = path(&unparametered.join("/")).into_owned();
    if read == raw {
        return None;
    }
    if let Some(q) = query {
        read.push('?');
        read.push_str(q);
    }
    Some(read)
}

fn percent_normalized(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = String::with_capacity(raw.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| {
            let h = std::str::from_utf8(h).ok()?;
            u8::from_str_radix(h, 16)
                .ok()
                .filter(|_| h.bytes().all(|b| b.is_ascii_hexdigit()))
        });
        match (bytes[i], hex) {
            (b'%', Some(b))
                if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') =>
            {
                out.push(b as char);
                i += 3;
            }
            (b'%', Some(b)) => {
                out.push_str(&format!("%{b:02X}"));
                i += 3;
            }
            (_, _) => {
                let ch = raw[i..].chars().next().expect("in bounds");
                out.push(ch);
                i += ch.len_utf8();
            }
        }
    }
    out
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

/// Whether `query` has a parameter named one of `names` (with a value or without).
pub fn has_param(query: &str, names: &[impl AsRef<str>]) -> bool {
    query
        .split('&')
        .map(|p| p.split_once('=').map_or(p, |(n, _)| n))
        .any(|name| names.iter().any(|n| n.as_ref() == name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presence_of_parameters() {
        assert!(has_param("a=1&_HLS_msn=3", &["_HLS_msn"]));
        assert!(!has_param("a=1&_HLS_msnx=3", &["_HLS_msn"]));
        assert!(has_param("flag", &["flag"]));
        assert!(!has_param("", &["flag"]));
    }

    #[test]
    fn lenient_readings() {
        let cases: &[(&str, Option<&str>)] = &[
            ("/admin", None),
            ("/a/b?x=%2F", None),
            ("/%2Fadmin", Some("/admin")),
            ("/%2fadmin/x", Some("/admin/x")),
            ("/%5Cadmin", Some("/admin")),
            ("/\\admin", Some("/admin")),
            ("/;/admin", Some("/admin")),
            ("/.;/admin", Some("/admin")),
            ("/admin;jsessionid=1?q", Some("/admin?q")),
            ("/x/..;/admin", Some("/admin")),
            ("/public%2F..%2Fadmin", Some("/admin")),
            ("/a%20b", None),
            ("/caf%C3%A9", None),
            ("*", None),
        ];
        for (raw, want) in cases {
            assert_eq!(lenient(raw).as_deref(), *want, "{raw}");
        }
    }

    fn normalized(uri: &str, rules: &Normalize) -> String {
        let mut parts = http::Request::get(uri).body(()).unwrap().into_parts().0;
        apply(&mut parts, rules);
        parts.uri.to_string()
    }

    #[test]
    fn paths() {
        let cases = [
            ("/", "/"),
            ("/a/b", "/a/b"),
            ("/admin", "/admin"),
            ("/%61dmin", "/admin"),
            ("/%61%64%6D%69%6e", "/admin"),
            ("//admin", "/admin"),
            ("///admin//x///", "/admin/x/"),
            ("/./admin", "/admin"),
            ("/x/../admin", "/admin"),
            ("/x/%2e%2E/admin", "/admin"),
            ("/x/.%2e/admin", "/admin"),
            ("/../admin", "/admin"),
            ("/../../", "/"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/a/./", "/a/"),
            ("/a/..b/c", "/a/..b/c"),
            ("/a/.b", "/a/.b"),
            ("/a/b%2f../c", "/a/b%2F../c"),
            ("/a/%2F/b", "/a/%2F/b"),
            ("/%7euser/%7E", "/~user/~"),
            ("/a%20b", "/a%20b"),
            ("/a%2", "/a%2"),
            ("/a%zz", "/a%zz"),
            ("/%25%36%31", "/%2561"),
            ("/%C3%A9", "/%C3%A9"),
            ("/ADMIN", "/ADMIN"),
            ("/x//..//admin", "/admin"),
        ];
        for (raw, want) in cases {
            assert_eq!(path(raw), want, "{raw}");
            assert_eq!(path(want), want, "{want} is already normal");
        }
    }

    /// The one-pass check says what the three scans it replaced said, for every string of up to 7 of the
    /// characters that matter.
    #[test]
    fn the_normal_check_agrees_with_the_segments() {
        let three_scans = |raw: &str| {
            !(raw.contains('%')
                || raw.contains("//")
                || raw.split('/').any(|s| s == "." || s == ".."))
        };
        let alphabet = ['/', '.', '%', 'a'];
        let mut strings = vec![String::new()];
        for _ in 0..7 {
            let longer: Vec<String> = strings
                .iter()
                .flat_map(|s| alphabet.iter().map(move |c| format!("{s}{c}")))
                .collect();
            for raw in &longer {
                assert_eq!(is_normal(raw), three_scans(raw), "{raw:?}");
            }
            strings = longer;
        }
    }

    #[test]
    fn targets() {
        let cases = [
            ("/a//./b?x=/../y", "/a/b?x=/../y"),
            ("/%7Ea", "/~a"),
            ("/a?", "/a?"),
            ("*", "*"),
        ];
        for (raw, want) in cases {
            assert_eq!(target(raw), want, "{raw}");
        }
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
            (&none, "//a/./b?x=/../y", "/a/b?x=/../y"),
            (&sorted, "/%61/?b&a", "/a/?a&b"),
        ];
        for (rules, uri, want) in cases {
            assert_eq!(normalized(uri, rules), want, "{uri}");
        }
    }
}
