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

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine};
use http::Uri;
use ring::hmac;

/// The shortest secret taken.
pub(crate) const MIN_SECRET: usize = 16;

/// A compiled `signed`.
#[derive(Debug)]
pub(crate) struct Signing {
    key: hmac::Key,
    param: String,
    expires: String,
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
    /// The check of links signed with `secret`, carrying the signature in `param` and the expiry in
    /// `expires`.
    pub fn new(secret: &[u8], param: &str, expires: &str) -> Self {
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
            param: param.to_owned(),
            expires: expires.to_owned(),
        }
    }

    /// Checks `uri` at `now` (unix seconds): the target without the signature and the expiry when the link
    /// checks.
    pub fn check(&self, uri: &Uri, now: u64) -> Result<String, Refused> {
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
        let text = signed_text(uri.path(), &pairs, &self.param);
        hmac::verify(&self.key, text.as_bytes(), &tag).map_err(|_| Refused::Wrong)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"a secret of sixteen bytes or more";

    fn check(target: &str, now: u64) -> Result<String, Refused> {
        Signing::new(SECRET, "sig", "exp").check(&target.parse().unwrap(), now)
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
