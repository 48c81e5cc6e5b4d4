//! Signed URLs (a rule's `signed`): a link that carries, in its query, its expiry and an HMAC-SHA256 of
//! its path and its other parameters, keyed by a secret the origin's site and lacquerd share.
//!
//! The signed text is the path, `?`, and the query's parameters but the signature, in name order, as sent
//! (percent-encoded as they came), joined by `&`: a link whose parameters a client or a normaliser
//! reorders still checks, one whose path, expiry or any other parameter was changed does not. The
//! signature is base64url without padding. It is compared in constant time (`ring::hmac::verify`).
//!
//! Only a link that checks has its signature and expiry removed from the target, and with them from the
//! key: sharing one object between links signed apart is what the signature allows, and only once it is
//! proved.
//!
//! Links made for NGINX's `secure_link_md5` check too (`algorithm = "nginx-md5"`): the signature is the
//! MD5 of an expression of the expiry, the path, the client's address and the secret, in base64url, as
//! NGINX checks it. MD5 is what those links carry; it is weaker than HMAC-SHA256, which new links should
//! use.

use std::net::IpAddr;

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine};
use http::Uri;
use md5::{Digest, Md5};
use ring::hmac;
use subtle::ConstantTimeEq;

/// The shortest secret taken.
pub(crate) const MIN_SECRET: usize = 16;

/// A compiled `signed`.
#[derive(Debug)]
pub(crate) struct Signing {
    how: How,
    param: String,
    expires: String,
}

/// How a signature is made.
#[derive(Debug)]
enum How {
    HmacSha256(hmac::Key),
    /// NGINX's `secure_link_md5`: the MD5 of the expression, the secret written into it.
    NginxMd5 {
        expression: Vec<Piece>,
        secret: Vec<u8>,
    },
}

/// One piece of an `nginx-md5` expression.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Expires,
    Uri,
    RemoteAddr,
    Secret,
}

/// NGINX's documented `secure_link_md5` example, the secret in place of its literal one.
pub const NGINX_EXPRESSION: &str = "$secure_link_expires$uri$remote_addr $secret";

/// Reads an `nginx-md5` expression: text and `$name` or `${name}` variables, each one of those a link's
/// check knows; otherwise the variable that is not.
fn expression(text: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        if at > 0 {
            pieces.push(Piece::Text(rest[..at].to_owned()));
        }
        let after = &rest[at + 1..];
        let (name, next) = match after.strip_prefix('{') {
            Some(braced) => {
                let end = braced
                    .find('}')
                    .ok_or_else(|| format!("{text:?}: a `${{` without its `}}`"))?;
                (&braced[..end], &braced[end + 1..])
            }
            None => {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], &after[end..])
            }
        };
        pieces.push(match name {
            "secure_link_expires" => Piece::Expires,
            "uri" => Piece::Uri,
            "remote_addr" => Piece::RemoteAddr,
            "secret" => Piece::Secret,
            other => {
                return Err(format!(
                    "${other} is not known here: the variables are $secure_link_expires, $uri, \
                     $remote_addr and $secret"
                ))
            }
        });
        rest = next;
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest.to_owned()));
    }
    if !pieces.contains(&Piece::Secret) {
        return Err(format!(
            "{text:?}: without $secret anyone could make a link"
        ));
    }
    Ok(pieces)
}

/// What an `nginx-md5` link's MD5 is of.
fn md5_text(pieces: &[Piece], secret: &[u8], expiry: &str, path: &str, client: IpAddr) -> Vec<u8> {
    let mut text = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Text(t) => text.extend_from_slice(t.as_bytes()),
            Piece::Expires => text.extend_from_slice(expiry.as_bytes()),
            // NGINX's `$uri` is the path decoded.
            Piece::Uri => text.extend(percent_decoded(path)),
            Piece::RemoteAddr => text.extend_from_slice(client.to_string().as_bytes()),
            Piece::Secret => text.extend_from_slice(secret),
        }
    }
    text
}

/// `path` with its `%XX` escapes decoded (a `%` not followed by two hex digits is kept).
fn percent_decoded(path: &str) -> Vec<u8> {
    percent_encoding::percent_decode_str(path).collect()
}

/// Why a link is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// No signature, or no expiry, or either sent twice.
    Unsigned,
    /// A signature that does not check.
    Wrong,
    /// Past its expiry.
    Expired,
}

impl Signing {
    /// The check of links signed with `secret` (HMAC-SHA256), carrying the signature in `param` and the
    /// expiry in `expires`.
    pub fn new(secret: &[u8], param: &str, expires: &str) -> Self {
        Self {
            how: How::HmacSha256(hmac::Key::new(hmac::HMAC_SHA256, secret)),
            param: param.to_owned(),
            expires: expires.to_owned(),
        }
    }

    /// The check of links made for NGINX's `secure_link_md5` with `expression` and `secret`; why not, for
    /// an expression that does not read.
    pub fn nginx_md5(
        secret: &[u8],
        expression_text: &str,
        param: &str,
        expires: &str,
    ) -> Result<Self, String> {
        Ok(Self {
            how: How::NginxMd5 {
                expression: expression(expression_text)?,
                secret: secret.to_vec(),
            },
            param: param.to_owned(),
            expires: expires.to_owned(),
        })
    }

    /// Checks `uri`, sent by `client`, at `now` (unix seconds): the target without the signature and the
    /// expiry when the link checks.
    pub fn check(&self, uri: &Uri, client: IpAddr, now: u64) -> Result<String, Refused> {
        let pairs = pairs(uri.query().unwrap_or(""));
        let one = |name: &str| {
            let mut found = pairs.iter().filter(|(n, _)| *n == name);
            match (found.next(), found.next()) {
                (Some((_, value)), None) => Ok(*value),
                _ => Err(Refused::Unsigned),
            }
        };
        let signature = one(&self.param)?;
        let expiry = one(&self.expires)?;
        let tag = URL_SAFE_NO_PAD
            .decode(signature.trim_end_matches('='))
            .map_err(|_| Refused::Wrong)?;
        match &self.how {
            How::HmacSha256(key) => {
                let text = signed_text(uri.path(), &pairs, &self.param);
                hmac::verify(key, text.as_bytes(), &tag).map_err(|_| Refused::Wrong)?;
            }
            How::NginxMd5 { expression, secret } => {
                let text = md5_text(expression, secret, expiry, uri.path(), client);
                let digest = Md5::digest(&text);
                if !bool::from(digest.as_slice().ct_eq(&tag)) {
                    return Err(Refused::Wrong);
                }
            }
        }
        // Checked after the signature: an expiry is only believed once it is proved.
        let expiry: u64 = expiry.parse().map_err(|_| Refused::Wrong)?;
        if now >= expiry {
            return Err(Refused::Expired);
        }
        let kept: Vec<&str> = uri
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty())
            .filter(|p| {
                let name = p.split('=').next().unwrap_or("");
                name != self.param && name != self.expires
            })
            .collect();
        Ok(if kept.is_empty() {
            uri.path().to_owned()
        } else {
            format!("{}?{}", uri.path(), kept.join("&"))
        })
    }
}

/// The query's `name=value` pairs as sent.
fn pairs(query: &str) -> Vec<(&str, &str)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .collect()
}

/// What is signed: the path and the parameters but `param`, in name order (then value order).
fn signed_text(path: &str, pairs: &[(&str, &str)], param: &str) -> String {
    let mut kept: Vec<&(&str, &str)> = pairs.iter().filter(|(n, _)| *n != param).collect();
    kept.sort();
    let query: Vec<String> = kept.iter().map(|(n, v)| format!("{n}={v}")).collect();
    format!("{path}?{}", query.join("&"))
}

/// `target` (path and query) signed with `secret`, valid until `expires_at` (unix seconds): the target
/// with the expiry in `expires` and the signature in `param` appended (`cachectl sign`).
pub fn sign(secret: &[u8], target: &str, expires_at: u64, param: &str, expires: &str) -> String {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let expiry = expires_at.to_string();
    let mut all = pairs(query);
    all.retain(|(n, _)| *n != param && *n != expires);
    let kept: Vec<String> = all.iter().map(|(n, v)| format!("{n}={v}")).collect();
    all.push((expires, &expiry));
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    let tag = hmac::sign(&key, signed_text(path, &all, param).as_bytes());
    let signature = URL_SAFE_NO_PAD.encode(tag.as_ref());
    let mut query = kept;
    query.push(format!("{expires}={expiry}"));
    query.push(format!("{param}={signature}"));
    format!("{path}?{}", query.join("&"))
}

/// `target` (path and query) signed for NGINX's `secure_link_md5` with `expression` and `secret`, for
/// `client`, valid until `expires_at`: the target with the expiry in `expires` and the MD5 in `param`
/// appended (`cachectl sign --algorithm nginx-md5`). `Err` for an expression that does not read.
#[allow(clippy::too_many_arguments)]
pub fn sign_nginx_md5(
    secret: &[u8],
    expression_text: &str,
    target: &str,
    client: IpAddr,
    expires_at: u64,
    (param, expires): (&str, &str),
) -> Result<String, String> {
    let pieces = expression(expression_text)?;
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let expiry = expires_at.to_string();
    let digest = Md5::digest(md5_text(&pieces, secret, &expiry, path, client));
    let mut kept: Vec<String> = pairs(query)
        .iter()
        .filter(|(n, _)| *n != param && *n != expires)
        .map(|(n, v)| format!("{n}={v}"))
        .collect();
    kept.push(format!("{param}={}", URL_SAFE_NO_PAD.encode(digest)));
    kept.push(format!("{expires}={expiry}"));
    Ok(format!("{path}?{}", kept.join("&")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"a secret of sixteen bytes or more";
    const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 1));

    fn check(target: &str, now: u64) -> Result<String, Refused> {
        Signing::new(SECRET, "sig", "exp").check(&target.parse().unwrap(), CLIENT, now)
    }

    /// NGINX's own documentation of `secure_link_md5`: the link for `/s/link`, expiring at 2147483647, from
    /// 127.0.0.1, with the expression `$secure_link_expires$uri$remote_addr secret`, is
    /// `/s/link?md5=_e4Nc3iduzkWRm01TBBNYw&expires=2147483647`.
    #[test]
    fn nginxs_documented_link_checks() {
        let nginx = Signing::nginx_md5(
            b"secret",
            "$secure_link_expires$uri$remote_addr $secret",
            "md5",
            "expires",
        )
        .unwrap();
        let link = "/s/link?md5=_e4Nc3iduzkWRm01TBBNYw&expires=2147483647";
        assert_eq!(
            nginx.check(&link.parse().unwrap(), CLIENT, 10),
            Ok("/s/link".into())
        );
        let elsewhere: IpAddr = "10.0.0.9".parse().unwrap();
        assert_eq!(
            nginx.check(&link.parse().unwrap(), elsewhere, 10),
            Err(Refused::Wrong)
        );
        assert_eq!(
            nginx.check(
                &link.replace("/s/link", "/s/other").parse().unwrap(),
                CLIENT,
                10
            ),
            Err(Refused::Wrong)
        );
        assert_eq!(
            nginx.check(&link.parse().unwrap(), CLIENT, 2_147_483_647),
            Err(Refused::Expired)
        );
        // Made here, it is the same link.
        let made = sign_nginx_md5(
            b"secret",
            NGINX_EXPRESSION,
            "/s/link",
            CLIENT,
            2_147_483_647,
            ("md5", "expires"),
        )
        .unwrap();
        assert_eq!(made, link);
        // Expressions that do not read, or would let anyone sign.
        for bad in ["$uri$remote_addr", "$uri $host $secret", "${uri $secret"] {
            assert!(
                Signing::nginx_md5(SECRET, bad, "md5", "expires").is_err(),
                "{bad}"
            );
        }
        let braced = Signing::nginx_md5(
            b"secret",
            "${secure_link_expires}${uri}${remote_addr} ${secret}",
            "md5",
            "expires",
        )
        .unwrap();
        assert_eq!(
            braced.check(&link.parse().unwrap(), CLIENT, 10),
            Ok("/s/link".into())
        );
    }

    #[test]
    fn a_signed_link_checks_until_it_expires_and_nothing_in_it_can_change() {
        let signed = sign(SECRET, "/video/a.mp4?user=7&q=hd", 1_000, "sig", "exp");
        assert!(
            signed.starts_with("/video/a.mp4?user=7&q=hd&exp=1000&sig="),
            "{signed}"
        );
        // Checked: the signature and expiry leave the target, the rest stays as sent.
        assert_eq!(check(&signed, 999), Ok("/video/a.mp4?user=7&q=hd".into()));
        assert_eq!(check(&signed, 1_000), Err(Refused::Expired));
        // Reordered parameters still check.
        let sig = signed.rsplit_once("sig=").unwrap().1;
        let reordered = format!("/video/a.mp4?sig={sig}&q=hd&exp=1000&user=7");
        assert_eq!(check(&reordered, 10), Ok("/video/a.mp4?q=hd&user=7".into()));
        let table = [
            // Another path, another parameter value, a later expiry, an added parameter.
            signed.replace("/a.mp4", "/b.mp4"),
            signed.replace("user=7", "user=8"),
            signed.replace("exp=1000", "exp=99999"),
            format!("{signed}&admin=1"),
            // A signature cut, or made with another secret.
            signed[..signed.len() - 2].to_owned(),
            sign(
                b"another secret of sixteen bytes",
                "/video/a.mp4?user=7&q=hd",
                1_000,
                "sig",
                "exp",
            ),
        ];
        for wrong in table {
            assert_eq!(check(&wrong, 10), Err(Refused::Wrong), "{wrong}");
        }
        for unsigned in [
            "/video/a.mp4?user=7".to_owned(),
            "/video/a.mp4?exp=1000&user=7".to_owned(),
            format!("{signed}&sig=AAAA"),
            format!("{signed}&exp=1000"),
        ] {
            assert_eq!(check(&unsigned, 10), Err(Refused::Unsigned), "{unsigned}");
        }
        let bare = sign(SECRET, "/a", 50, "sig", "exp");
        assert_eq!(check(&bare, 10), Ok("/a".into()));
    }
}
