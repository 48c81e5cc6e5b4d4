//! Header hygiene at the proxy boundary (RFC 9110 §7.6.1).

use http::{header, HeaderMap, HeaderName};

/// Hop-by-hop fields that never cross a proxy, besides those the `Connection` header names.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Request fields that tell an origin (or its framework) which host, scheme, port, path or method to act
/// on instead of the request's own. A cache that forwards them without keying on them stores one client's
/// answer for everyone (web cache poisoning), so they are stripped unless a route keys on them.
pub const FORWARDING: [HeaderName; 22] = [
    HeaderName::from_static("forwarded"),
    HeaderName::from_static("x-forwarded-host"),
    HeaderName::from_static("x-forwarded-proto"),
    HeaderName::from_static("x-forwarded-port"),
    HeaderName::from_static("x-forwarded-scheme"),
    HeaderName::from_static("x-forwarded-server"),
    HeaderName::from_static("x-forwarded-prefix"),
    HeaderName::from_static("x-forwarded-ssl"),
    HeaderName::from_static("x-host"),
    HeaderName::from_static("x-original-host"),
    HeaderName::from_static("x-original-url"),
    HeaderName::from_static("x-rewrite-url"),
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
    HeaderName::from_static("x-url-scheme"),
    HeaderName::from_static("front-end-https"),
    HeaderName::from_static("x-forwarded-uri"),
    HeaderName::from_static("x-original-uri"),
    HeaderName::from_static("x-forwarded-path"),
    HeaderName::from_static("x-scheme"),
    HeaderName::from_static("x-forwarded-protocol"),
];

/// Removes the forwarding fields (`X-Forwarded-Host`, `Forwarded`, `X-Original-URL`, method overrides, …)
/// that make an origin answer for another host, scheme, path or method: what `forwarding_headers =
/// "strip"` does, so no client can have such an answer stored for everyone.
pub fn strip_forwarding(headers: &mut HeaderMap) {
    // Most requests carry none: a look at the few names they carry costs less than hashing every one of
    // the list to remove it. Names made once: removing by `&str` parses and hashes the name again.
    if !headers.keys().any(|name| FORWARDING.contains(name)) {
        return;
    }
    for name in &FORWARDING {
        headers.remove(name);
    }
}

/// Removes hop-by-hop fields and every field listed in `Connection` (RFC 9110 §7.6.1), and `Upgrade`,
/// which this proxy does not forward.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most heads carry none (`Connection` is among them, so nothing is listed either).
    if !headers
        .keys()
        .any(|name| HOP_BY_HOP.contains(name) || name == header::UPGRADE)
    {
        return;
    }
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in listed.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
    headers.remove(header::UPGRADE);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_listed_and_standard_hop_by_hop_fields() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, X-Secret , close"),
            ("keep-alive", "timeout=5"),
            ("x-secret", "1"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("upgrade", "websocket"),
            ("proxy-authorization", "Basic x"),
            ("cache-control", "max-age=1"),
            ("x-kept", "yes"),
        ] {
            h.append(HeaderName::from_static(k), v.parse().unwrap());
        }
        strip_hop_by_hop(&mut h);
        let mut left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, ["cache-control", "x-kept"]);
    }
}

/// Request fields a response's `Vary` names most, whose values are lists in which spacing, and for the
/// first two letter case, carry no meaning (RFC 9110 §5.6.1, §12.5.3, §12.5.4, RFC 4647 §2).
const SELECTING: [(HeaderName, bool); 3] = [
    (header::ACCEPT_LANGUAGE, true),
    (header::ACCEPT_ENCODING, true),
    (header::ACCEPT, false),
];

/// Writes the selecting fields in one canonical form: one line, no optional whitespace around `,` and `;`,
/// and `Accept-Language` and `Accept-Encoding` lower-cased. Done to the head the origin receives, which
/// the variant is then made of: `en-US, fr` and `en-us,fr` select one stored answer because the origin was
/// asked the same question for both, never because the cache read two questions as one. `Accept-Encoding`
/// only `with_accept_encoding` (a route negotiating codings replaces it whole).
pub fn normalize_selecting(headers: &mut HeaderMap, with_accept_encoding: bool) {
    for (name, fold) in &SELECTING {
        if *name == header::ACCEPT_ENCODING && !with_accept_encoding {
            continue;
        }
        let mut lines = headers.get_all(name).iter();
        let Some(first) = lines.next() else {
            continue;
        };
        let single = lines.next().is_none();
        // Most requests send one line already canonical: nothing to do.
        let canonical = |b: &[u8]| {
            !b.iter()
                .any(|c| *c == b' ' || *c == b'\t' || (*fold && c.is_ascii_uppercase()))
        };
        if single && canonical(first.as_bytes()) {
            continue;
        }
        let Ok(texts) = headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str())
            .collect::<Result<Vec<&str>, _>>()
        else {
            // Bytes that are not text are left as sent (and select as sent).
            continue;
        };
        let mut items = Vec::new();
        for text in texts {
            for item in text.split(',') {
                let parts: Vec<&str> = item.split(';').map(str::trim).collect();
                if parts.iter().all(|p| p.is_empty()) {
                    continue;
                }
                let item = parts.join(";");
                items.push(if *fold {
                    item.to_ascii_lowercase()
                } else {
                    item
                });
            }
        }
        match http::HeaderValue::from_str(&items.join(",")) {
            Ok(value) => {
                headers.insert(name, value);
            }
            Err(_) => continue,
        }
    }
}

#[cfg(test)]
mod selecting_tests {
    use super::*;

    /// Fields as sent, and as written after.
    type Fields<'a> = &'a [(&'a str, &'a str)];

    #[test]
    fn selecting_fields_have_one_form() {
        let table: [(Fields, Fields); 6] = [
            (
                &[("accept-language", "en-US, fr;q=0.5")],
                &[("accept-language", "en-us,fr;q=0.5")],
            ),
            (
                &[("accept-language", "EN-us,FR ; q=0.5")],
                &[("accept-language", "en-us,fr;q=0.5")],
            ),
            (
                &[("accept-language", "en"), ("accept-language", " fr")],
                &[("accept-language", "en,fr")],
            ),
            (
                &[("accept-encoding", "gzip, deflate, BR")],
                &[("accept-encoding", "gzip,deflate,br")],
            ),
            // Accept keeps its case (a parameter's value may need it); its spacing goes.
            (
                &[("accept", "text/html, application/JSON; q=0.9")],
                &[("accept", "text/html,application/JSON;q=0.9")],
            ),
            (&[("accept", "*/*")], &[("accept", "*/*")]),
        ];
        for (sent, want) in table {
            let mut headers = HeaderMap::new();
            for (n, v) in sent {
                headers.append(*n, v.parse().unwrap());
            }
            normalize_selecting(&mut headers, true);
            let got: Vec<(String, String)> = headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
                .collect();
            let want: Vec<(String, String)> = want
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect();
            assert_eq!(got, want, "{sent:?}");
        }
    }
}
