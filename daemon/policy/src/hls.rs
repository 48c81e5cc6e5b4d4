//! What live and on-demand video players will ask for next, read from what they send and are sent: the
//! media segments and parts an HLS playlist lists (RFC 8216bis), and the next object or range a request's
//! CMCD data names (CTA-5004). Prefetch acts on these; nothing here fetches.

use http::HeaderMap;
use iri_string::types::{UriAbsoluteStr, UriReferenceStr};
use percent_encoding::percent_decode_str;

/// One media object a playlist lists, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its reference as written in the playlist (relative to the playlist, or absolute).
    pub uri: String,
    /// An LL-HLS part (`#EXT-X-PART`) rather than a whole segment.
    pub part: bool,
}

/// The segments and parts a media playlist lists, in playlist order; `None` for anything else (a
/// multivariant playlist, or text that is no playlist). Preload hints are left out: a player asks for
/// the part hinted itself, and the origin holds that request until the part exists.
pub fn media_objects(text: &str) -> Option<Vec<Listed>> {
    let mut lines = text.lines().map(str::trim);
    if lines.next()? != "#EXTM3U" {
        return None;
    }
    let mut listed = Vec::new();
    let mut media = false;
    for line in lines {
        if let Some(attributes) = line.strip_prefix("#EXT-X-PART:") {
            media = true;
            if let Some(uri) = attribute(attributes, "URI") {
                listed.push(Listed {
                    uri: uri.to_owned(),
                    part: true,
                });
            }
        } else if line.starts_with("#EXTINF:") {
            media = true;
        } else if line.starts_with("#EXT-X-STREAM-INF") {
            return None;
        } else if !line.is_empty() && !line.starts_with('#') {
            listed.push(Listed {
                uri: line.to_owned(),
                part: false,
            });
        }
    }
    media.then_some(listed)
}

/// A quoted-string attribute of a tag's attribute list (`NAME="value"`).
fn attribute<'a>(list: &'a str, name: &str) -> Option<&'a str> {
    let mut rest = list;
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let (value, next) = match after.strip_prefix('"') {
            Some(quoted) => {
                let (value, tail) = quoted.split_once('"')?;
                (value, tail.strip_prefix(',').unwrap_or(tail))
            }
            None => after.split_once(',').unwrap_or((after, "")),
        };
        if key.trim() == name {
            return Some(value);
        }
        rest = next;
    }
    None
}

/// Whether a query asks for an LL-HLS blocking playlist reload (RFC 8216bis §6.2.5.2): it has an
/// `_HLS_msn` parameter, its name percent-encoded or not (an origin decodes `%5FHLS_msn` as `_HLS_msn`, and
/// holds the request all the same).
pub fn blocking_reload(query: &str) -> bool {
    query.split('&').any(|pair| {
        let name = pair.split_once('=').map_or(pair, |(name, _)| name);
        percent_decode_str(name).eq(b"_HLS_msn".iter().copied())
    })
}

/// What a request's CMCD data says the player asks for next.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NextRequest {
    /// `nor`: the next object, a reference relative to this request's URL (percent-decoded).
    pub object: Option<String>,
    /// `nrr`: the next byte range, of `object` or, without it, of this request's object.
    pub range: Option<(u64, Option<u64>)>,
}

impl NextRequest {
    /// Whether it names anything.
    pub fn is_empty(&self) -> bool {
        self.object.is_none() && self.range.is_none()
    }
}

/// The `CMCD-Request` header's or the `CMCD` query parameter's `nor` and `nrr` (CTA-5004 §3.3: a
/// structured-field dictionary, percent-encoded whole in the query form). The header wins; data that
/// does not parse names nothing.
pub fn next_request(headers: &HeaderMap, query: Option<&str>) -> NextRequest {
    let from_header = headers
        .get("cmcd-request")
        .and_then(|v| v.to_str().ok())
        .map(parse_cmcd)
        .filter(|next| !next.is_empty());
    from_header.unwrap_or_else(|| {
        query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .find_map(|pair| pair.strip_prefix("CMCD="))
            .and_then(|value| percent_decode_str(value).decode_utf8().ok())
            .map(|value| parse_cmcd(&value))
            .unwrap_or_default()
    })
}

fn parse_cmcd(data: &str) -> NextRequest {
    let Ok(dict) = sfv::Parser::new(data).parse::<sfv::Dictionary>() else {
        return NextRequest::default();
    };
    let string = |name: &str| match dict.get(name) {
        Some(sfv::ListEntry::Item(sfv::Item {
            bare_item: sfv::BareItem::String(s),
            ..
        })) => Some(s.as_str().to_owned()),
        _ => None,
    };
    let object = string("nor")
        .and_then(|nor| Some(percent_decode_str(&nor).decode_utf8().ok()?.into_owned()))
        .filter(|nor| !nor.is_empty());
    let range = string("nrr").and_then(|nrr| {
        let (first, last) = nrr.split_once('-')?;
        let first = first.parse::<u64>().ok()?;
        let last = match last {
            "" => None,
            last => Some(last.parse::<u64>().ok().filter(|l| *l >= first)?),
        };
        Some((first, last))
    });
    NextRequest { object, range }
}

/// `reference` resolved against the path-and-query `base` (RFC 3986 §5.2), as a path-and-query on the same
/// host; `None` when it names another host or scheme, or climbs above the site's root (`../../` past
/// `/`), which a player's next object never does.
pub fn resolve(base: &str, reference: &str) -> Option<String> {
    // Resolved under a root of its own: a reference that climbs above the real one leaves it.
    const ROOT: &str = "http://prefetch.invalid/_";
    let reference = UriReferenceStr::new(reference).ok()?;
    if reference.scheme_str().is_some() || reference.authority_str().is_some() {
        return None;
    }
    // A path from the root is the site's own, whatever dot segments it has (they stop at the root).
    let root = if reference.as_str().starts_with('/') {
        &ROOT[..ROOT.len() - 2]
    } else {
        ROOT
    };
    let base = format!("{root}{base}");
    let base = UriAbsoluteStr::new(&base).ok()?;
    let resolved = reference.resolve_against(base);
    resolved.ensure_rfc3986_normalizable().ok()?;
    let resolved = resolved.to_string();
    let target = resolved.strip_prefix(root)?;
    target.starts_with('/').then(|| target.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIVE: &str = "#EXTM3U\n#EXT-X-VERSION:9\n#EXT-X-TARGETDURATION:1\n\
        #EXT-X-PART-INF:PART-TARGET=0.2\n#EXT-X-MEDIA-SEQUENCE:0\n\
        #EXT-X-PART:DURATION=0.2,URI=\"s0.p0.m4s\",INDEPENDENT=YES\n\
        #EXT-X-PART:DURATION=0.2,URI=\"s0.p1.m4s\"\n\
        #EXTINF:0.4,\ns0.m4s\n\
        #EXT-X-PART:DURATION=0.2,URI=\"s1.p0.m4s\"\n\
        #EXT-X-PRELOAD-HINT:TYPE=PART,URI=\"s1.p1.m4s\"\n";

    #[test]
    fn a_media_playlist_lists_its_parts_and_segments_in_order() {
        let listed = media_objects(LIVE).unwrap();
        let names: Vec<(&str, bool)> = listed.iter().map(|l| (l.uri.as_str(), l.part)).collect();
        assert_eq!(
            names,
            [
                ("s0.p0.m4s", true),
                ("s0.p1.m4s", true),
                ("s0.m4s", false),
                ("s1.p0.m4s", true),
            ]
        );
        let vod =
            "#EXTM3U\r\n#EXT-X-TARGETDURATION:6\r\n#EXTINF:6.0,\r\nseg1.ts\r\n#EXTINF:6.0,\r\n\
                   https://cdn.example/seg2.ts?t=1\r\n#EXT-X-ENDLIST\r\n";
        let listed = media_objects(vod).unwrap();
        assert_eq!(listed[0].uri, "seg1.ts");
        assert_eq!(listed[1].uri, "https://cdn.example/seg2.ts?t=1");
    }

    #[test]
    fn what_is_no_media_playlist_lists_nothing() {
        for text in [
            "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=1280000\nlow/index.m3u8\n",
            "<html>not a playlist</html>",
            "",
            "#EXTM3U\n#EXT-X-VERSION:3\n",
        ] {
            assert_eq!(media_objects(text), None, "{text:?}");
        }
    }

    #[test]
    fn a_blocking_reload_is_told_by_its_msn_however_the_name_is_encoded() {
        for (query, blocking) in [
            ("_HLS_msn=5&_HLS_part=1", true),
            ("a=1&_HLS_msn=5", true),
            ("%5FHLS_msn=5", true),
            ("%5fHLS%5Fmsn=5", true),
            ("_HLS_msn", true),
            ("_HLS_part=1", false),
            ("x_HLS_msn=5", false),
            ("_hls_msn=5", false),
            ("", false),
        ] {
            assert_eq!(blocking_reload(query), blocking, "{query}");
        }
    }

    #[test]
    fn cmcd_names_the_next_object_and_range_from_the_header_or_the_query() {
        let mut headers = HeaderMap::new();
        let cases: [(Option<&str>, Option<&str>, NextRequest); 6] = [
            (
                Some(r#"nor="..%2F300kbps%2Fsegment35.m4v",nrr="12323-48763",sid="6e2fb550""#),
                None,
                NextRequest {
                    object: Some("../300kbps/segment35.m4v".into()),
                    range: Some((12323, Some(48763))),
                },
            ),
            (
                None,
                Some("a=1&CMCD=bl%3D21300%2Cnor%3D%22seg2.m4s%22%2Cnrr%3D%22100-%22"),
                NextRequest {
                    object: Some("seg2.m4s".into()),
                    range: Some((100, None)),
                },
            ),
            (Some(r#"nrr="9-3""#), None, NextRequest::default()),
            (Some("nor=unquoted"), None, NextRequest::default()),
            (Some("nor=\"\""), None, NextRequest::default()),
            (Some("bl=300,,,"), None, NextRequest::default()),
        ];
        for (header, query, want) in cases {
            headers.remove("cmcd-request");
            if let Some(h) = header {
                headers.insert("cmcd-request", h.parse().unwrap());
            }
            assert_eq!(next_request(&headers, query), want, "{header:?} {query:?}");
        }
    }

    #[test]
    fn references_resolve_on_the_same_host_and_never_above_its_root() {
        let cases = [
            ("/live/a/index.m3u8", "s1.m4s", Some("/live/a/s1.m4s")),
            (
                "/live/a/index.m3u8?x=1",
                "s1.m4s?t=2",
                Some("/live/a/s1.m4s?t=2"),
            ),
            ("/live/a/s0.m4s", "../b/s1.m4s", Some("/live/b/s1.m4s")),
            ("/live/a/s0.m4s", "/vod/s1.m4s", Some("/vod/s1.m4s")),
            ("/live/a/s0.m4s", "../../s1.m4s", Some("/s1.m4s")),
            ("/live/a/s0.m4s", "../../../etc/passwd", None),
            ("/s0.m4s", "../s1.m4s", None),
            ("/live/s0.m4s", "https://other.example/s1.m4s", None),
            ("/live/s0.m4s", "//other.example/s1.m4s", None),
            ("/live/s0.m4s", "javascript:alert(1)", None),
            ("/live/s0.m4s", "s 1.m4s", None),
        ];
        for (base, reference, want) in cases {
            assert_eq!(
                resolve(base, reference).as_deref(),
                want,
                "{base} + {reference}"
            );
        }
    }
}
