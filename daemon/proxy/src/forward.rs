//! Preparing requests for the backend and deciding what an unsafe method invalidates.

use std::{net::IpAddr, sync::Arc};

use bytes::Bytes;

use http::{
    header, request::Parts, HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri,
    Version,
};
use http_body::Frame;
use http_body_util::BodyExt;
use lacquer_backends::{
    body::{self, Body, BoxError},
    BackendBody,
};
use lacquer_codec::{Coding, Encoder};
use lacquer_edge::Interim;
use lacquer_policy::encoding::{self, Accepts, Compression};
use lacquer_policy::{headers::strip_hop_by_hop, key, normalize};
use lacquer_rules::Rules;

use crate::{
    esi::fill::EsiFill,
    fields::{append, VIA},
    phase::{self, Decided},
    respond::{self, Outcome},
    stats::{add, inc, Stats},
};

/// The origin's answer to a pass (or a tunnel it refused), as the client gets it: the backend-response
/// phase on its head (the built-in part, then the rules when `request`, the client's head, is kept for
/// them), the cache's verdict added, and its body's bytes counted in.
#[allow(clippy::too_many_arguments)]
pub(crate) fn answer(
    rules: &Rules,
    request: Option<&Parts>,
    client: IpAddr,
    decided: &Decided,
    outcome: Outcome,
    resp: Response<BackendBody>,
    stats: &Arc<Stats>,
    esi: Option<PassEsi>,
) -> Response<Body> {
    let (mut head, body) = resp.into_parts();
    phase::origin_fields(decided, &mut head.headers);
    let adjust = match request {
        Some(request) => phase::backend_response(
            rules,
            request,
            client,
            decided,
            head.status,
            &mut head.headers,
        ),
        None => Default::default(),
    };
    // Varnish's `do_esi` holds for a passed page too: it is parsed as it streams, and assembled.
    let parsing = esi.and_then(|e| {
        EsiFill::start(
            adjust.esi.unwrap_or(e.route),
            head.status,
            false,
            &mut head.headers,
            e.limit,
            stats,
        )
    });
    // And so does `do_gzip` (a rule's `compress = true`): what the origin sent uncompressed is compressed
    // on its way to a client that takes gzip. An ESI page is compressed as it is assembled instead.
    let gzip = esi
        .filter(|_| parsing.is_none() && adjust.compress == Some(true))
        .and_then(|e| e.gzip_level)
        .filter(|_| {
            request.is_some_and(|r| Accepts::from_headers(&r.headers).accepts(Some(Coding::Gzip)))
        })
        .filter(|_| {
            encoding::compress_with(
                head.status,
                &head.headers,
                &Compression::default(),
                Some(true),
            )
            .is_some()
        });
    if gzip.is_some() {
        head.headers.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_static(Coding::Gzip.token()),
        );
        head.headers.remove(header::CONTENT_LENGTH);
        crate::coding::weaken_etag(&mut head.headers);
        crate::coding::vary_on_accept_encoding(&mut head.headers);
    }
    respond::decorate(&mut head.headers, outcome, None);
    let counted = stats.clone();
    let body = body::incoming(body.map_frame(move |f| {
        if let Some(d) = f.data_ref() {
            add(&counted.bytes_in, d.len() as u64);
        }
        f
    }));
    let body = match (parsing, gzip) {
        (Some(parsing), _) => parsed(body, parsing),
        (None, Some(level)) => compressed(body, Encoder::new(Coding::Gzip, level)),
        (None, None) => body,
    };
    Response::from_parts(head, body)
}

/// A passed body compressed as it streams; each frame's output is flushed, so a slow origin's bytes reach
/// the client as they come.
fn compressed(body: Body, encoder: Encoder) -> Body {
    let stream = futures_util::stream::unfold(
        (body, Some(encoder)),
        |(mut body, mut encoder)| async move {
            loop {
                let e = encoder.as_mut()?;
                let ended = match body.frame().await {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => {
                            e.feed(data);
                            e.flush();
                            false
                        }
                        Err(_) => continue,
                    },
                    Some(Err(err)) => return Some((Err(err), (body, None))),
                    None => {
                        e.end();
                        true
                    }
                };
                let out = match crate::coding::drain(e) {
                    Ok(out) => out,
                    Err(err) => return Some((Err(BoxError::from(err)), (body, None))),
                };
                if ended {
                    encoder = None;
                }
                if out.is_empty() && encoder.is_some() {
                    continue;
                }
                return Some((Ok(Frame::data(out)), (body, encoder)));
            }
        },
    );
    body::from_stream(stream)
}

/// What a pass needs to parse a page for ESI (the route's `esi`, and its `max_object_size`: the most a
/// compressed page decodes to), and to compress a body a rule says to (the route's gzip level, when it
/// negotiates codings).
#[derive(Clone, Copy)]
pub(crate) struct PassEsi {
    pub route: bool,
    pub limit: u64,
    pub gzip_level: Option<u32>,
}

/// A passed page's body, parsed into an ESI template as it streams.
fn parsed(body: Body, parsing: EsiFill) -> Body {
    let stream = futures_util::stream::unfold(
        (body, Some(parsing)),
        |(mut body, mut parsing)| async move {
            loop {
                let esi = parsing.as_mut()?;
                let pieces = match body.frame().await {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => esi.push(vec![data]),
                        Err(_) => continue,
                    },
                    Some(Err(e)) => return Some((Err(e), (body, None))),
                    None => {
                        let last = esi.finish(Vec::new());
                        parsing = None;
                        last
                    }
                };
                let frame = match pieces {
                    Ok(pieces) if pieces.is_empty() && parsing.is_some() => continue,
                    Ok(pieces) => Ok(Frame::data(pieces.concat().into())),
                    Err(e) => Err(BoxError::from(e)),
                };
                return Some((frame, (body, parsing)));
            }
        },
    );
    body::from_stream(stream)
}

/// Makes client headers fit to forward: hop-by-hop fields removed, the client appended to
/// `X-Forwarded-For`, this proxy to `Via`. `Host` is kept as the request carries it (checked and
/// normalised as it is keyed, see `lacquer_policy::request::host_from_authority`).
fn prepare_headers(headers: &mut HeaderMap, client: IpAddr) {
    strip_hop_by_hop(headers);
    for field in &crate::phase::PSEUDO_FIELDS {
        headers.remove(field);
    }
    append(
        headers,
        header::HeaderName::from_static("x-forwarded-for"),
        &client.to_string(),
    );
    append(headers, header::VIA, VIA);
    join_cookies(headers);
}

/// An HTTP/2 client may split `Cookie` into one field per cookie (RFC 9113 §8.2.3); on HTTP/1.1 they must
/// be one line, joined by `; `, or an origin reading the first line only loses the session.
fn join_cookies(headers: &mut HeaderMap) {
    let mut lines = headers.get_all(header::COOKIE).iter();
    if lines.nth(1).is_none() {
        return;
    }
    let mut joined = Vec::new();
    for line in headers.get_all(header::COOKIE) {
        if !joined.is_empty() {
            joined.extend_from_slice(b"; ");
        }
        joined.extend_from_slice(line.as_bytes());
    }
    if let Ok(value) = HeaderValue::from_bytes(&joined) {
        headers.insert(header::COOKIE, value);
    }
}

/// The request the origin (or the owning peer) is sent for a client's request with this head (method,
/// target and fields; taken, so that a pass forwards them without a copy), on every
/// path: a pass, an invalidating method, a fill, a revalidation, a peer's forward. Whatever protocol the
/// client spoke (HTTP/1.0, HTTP/1.1, HTTP/2), it goes out as HTTP/1.1, the protocol of every backend
/// pool, with the fields that protocol needs: hyper refuses to send an HTTP/2 head on an HTTP/1.1
/// connection, which once made every HTTP/2 request but a cacheable GET fail with 502.
pub fn origin_request(
    method: Method,
    uri: Uri,
    mut headers: HeaderMap,
    client: IpAddr,
    body: Body,
) -> Request<Body> {
    prepare_headers(&mut headers, client);
    let mut req = Request::new(body);
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_11;
    *req.headers_mut() = headers;
    req
}

/// The request a cache fill sends: always a full GET, so the object can be stored and the client's ranges
/// are answered from it. The client's own `If-None-Match` and `If-Modified-Since` go with it only when
/// `client_validators` (nothing stored to validate with: the origin's 304 then answers that client); the
/// other conditionals, which would make the origin answer 412 or a part, never do.
/// A POST keyed by its body (`keyed_body`) is sent as the POST it is, with that body.
pub fn fill_request(
    parts: &Parts,
    client: IpAddr,
    client_validators: bool,
    keyed_body: Option<&Bytes>,
) -> Request<Body> {
    // A keyed body goes with the method it came with (POST, QUERY), every fill and revalidation alike.
    let (method, sent) = match keyed_body {
        Some(b) => (parts.method.clone(), body::full(b.clone())),
        None => (Method::GET, body::empty()),
    };
    let mut req = origin_request(
        method,
        parts.uri.clone(),
        parts.headers.clone(),
        client,
        sent,
    );
    let headers = req.headers_mut();
    if !client_validators {
        headers.remove(header::IF_NONE_MATCH);
        headers.remove(header::IF_MODIFIED_SINCE);
    }
    for name in [
        header::IF_MATCH,
        header::IF_UNMODIFIED_SINCE,
        header::IF_RANGE,
        header::RANGE,
        header::CONTENT_LENGTH,
        header::EXPECT,
    ] {
        headers.remove(name);
    }
    if let Some(b) = keyed_body {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(b.len()));
    }
    req
}

/// Counts the interim (1xx) responses the backend sends before its final answer to `req` (hyper's client
/// reads them over HTTP/1 only), and sends each on to the client through `interim`, as a proxy must (RFC
/// 9110 §15.2): without the fields that speak of one connection or of the final message, and without
/// cookies, which a browser takes from the final response only.
pub fn forward_interim<B>(req: &mut Request<B>, stats: &Arc<Stats>, interim: Option<&Interim>) {
    let stats = stats.clone();
    let interim = interim.cloned();
    hyper::ext::on_informational(req, move |res| {
        inc(&stats.interim_responses);
        let Some(interim) = &interim else { return };
        let status = res.status();
        if status == StatusCode::CONTINUE || status == StatusCode::SWITCHING_PROTOCOLS {
            return;
        }
        let mut sent = Response::new(());
        *sent.status_mut() = status;
        *sent.headers_mut() = res.headers().clone();
        let headers = sent.headers_mut();
        strip_hop_by_hop(headers);
        headers.remove(header::CONTENT_LENGTH);
        headers.remove(header::SET_COOKIE);
        if interim.send(sent) {
            inc(&stats.interim_forwarded);
        }
    });
}

/// Keys an unsafe request invalidates on success (RFC 9111 §4.4): its own URL, and `Location` and
/// `Content-Location` when they point at the same host.
pub fn invalidation_keys(req: &Parts, response: &HeaderMap) -> Vec<String> {
    let own = key::primary_key(req);
    let host = req
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let mut keys = vec![own];
    for name in [header::LOCATION, header::CONTENT_LOCATION] {
        let Some(target) = response.get(&name).and_then(|v| v.to_str().ok()) else {
            continue;
        };
        let Ok(uri) = target.parse::<http::Uri>() else {
            continue;
        };
        let same_host = uri
            .authority()
            .is_none_or(|a| key::key_for(a.as_str(), "") == key::key_for(host, ""));
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        if same_host && path.starts_with('/') {
            let k = key::key_for(host, &normalize::target(path));
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    type Lines<'a> = &'a [(&'a str, &'a str)];

    #[test]
    fn origin_requests_are_http11_with_forwarded_fields() {
        for version in [Version::HTTP_10, Version::HTTP_11, Version::HTTP_2] {
            let (parts, _) = Request::builder()
                .method("POST")
                .uri("/form?x")
                .version(version)
                .header("x-forwarded-for", "10.0.0.1")
                .header("via", "1.0 edge")
                .header("connection", "close, x-hop")
                .header("x-hop", "1")
                .header("te", "trailers")
                .header("host", "example.com")
                .header("cookie", "a=1")
                .header("cookie", "b=2")
                .body(())
                .unwrap()
                .into_parts();
            let client = "192.0.2.7".parse().unwrap();
            let req = origin_request(
                parts.method,
                parts.uri,
                parts.headers,
                client,
                body::empty(),
            );
            assert_eq!(req.version(), Version::HTTP_11, "from {version:?}");
            assert_eq!(req.method(), Method::POST);
            assert_eq!(req.uri(), "/form?x");
            let h = req.headers();
            assert_eq!(h["x-forwarded-for"], "10.0.0.1, 192.0.2.7");
            assert_eq!(h["via"], "1.0 edge, 1.1 lacquer");
            assert_eq!(h["host"], "example.com");
            assert_eq!(
                h.get_all("cookie").iter().collect::<Vec<_>>(),
                ["a=1; b=2"],
                "HTTP/2's cookie fields are one line on HTTP/1.1"
            );
            for hop in ["x-hop", "connection", "te"] {
                assert!(!h.contains_key(hop), "{hop}");
            }
        }
    }

    #[test]
    fn fill_requests_are_whole_gets() {
        let (parts, _) = Request::builder()
            .method("HEAD")
            .uri("/a?b")
            .version(Version::HTTP_2)
            .header("if-none-match", "\"x\"")
            .header("if-modified-since", "Sun, 06 Nov 1994 08:49:37 GMT")
            .header("if-match", "\"x\"")
            .header("if-unmodified-since", "Sun, 06 Nov 1994 08:49:37 GMT")
            .header("if-range", "\"x\"")
            .header("range", "bytes=0-1")
            .header("accept-encoding", "gzip")
            .body(())
            .unwrap()
            .into_parts();
        let never = ["if-match", "if-unmodified-since", "if-range", "range"];
        for (client_validators, kept) in [
            (false, &[][..]),
            (true, &["if-none-match", "if-modified-since"][..]),
        ] {
            let req = fill_request(
                &parts,
                "127.0.0.1".parse().unwrap(),
                client_validators,
                None,
            );
            assert_eq!(req.method(), Method::GET);
            assert_eq!(req.version(), Version::HTTP_11);
            assert_eq!(req.uri(), "/a?b");
            assert_eq!(req.headers()["accept-encoding"], "gzip");
            for name in ["if-none-match", "if-modified-since"] {
                assert_eq!(
                    req.headers().contains_key(name),
                    kept.contains(&name),
                    "{name} with client_validators={client_validators}"
                );
            }
            for name in never {
                assert!(!req.headers().contains_key(name), "{name}");
            }
        }
    }

    #[test]
    fn invalidation_targets() {
        let (parts, _) = Request::builder()
            .method("POST")
            .uri("/form")
            .header("host", "Example.com")
            .body(())
            .unwrap()
            .into_parts();
        let cases: &[(Lines<'_>, &[&str])] = &[
            (&[], &["example.com/form"]),
            (
                &[("location", "/done?x=1")],
                &["example.com/form", "example.com/done?x=1"],
            ),
            (
                &[
                    ("location", "http://example.com/a"),
                    ("content-location", "/b"),
                ],
                &["example.com/form", "example.com/a", "example.com/b"],
            ),
            (
                &[("location", "http://other.example/a")],
                &["example.com/form"],
            ),
            (&[("content-location", "/form")], &["example.com/form"]),
            (
                &[("location", "/a//./b/../%7Ec")],
                &["example.com/form", "example.com/a/~c"],
            ),
        ];
        for (h, want) in cases {
            let mut headers = HeaderMap::new();
            for (k, v) in *h {
                headers.insert(header::HeaderName::from_static(k), v.parse().unwrap());
            }
            assert_eq!(invalidation_keys(&parts, &headers), *want, "{h:?}");
        }
    }
}
