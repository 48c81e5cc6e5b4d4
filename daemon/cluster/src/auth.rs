//! The cluster secret: reaching etcd is not enough to join. Every member entry and every invalidation a
//! node puts to etcd carries an HMAC of its bytes under the secret, and every request a node forwards to a
//! key's owner carries one over what routes it; whatever fails the check is not believed.

use std::time::Duration;

use http::{header, request::Parts, HeaderValue};
use ring::hmac;

/// How far a forwarded request's timestamp may be from this node's clock: the members' clocks agree to
/// well within it (NTP), and a captured request can only be replayed within it.
const FORWARD_WINDOW: Duration = Duration::from_secs(30);

/// The secret every member of a cluster shares, as an HMAC-SHA256 key.
#[derive(Clone)]
pub struct Secret(hmac::Key);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// The key made of `bytes` (the contents of `cluster.secret_file`).
    pub fn new(bytes: &[u8]) -> Self {
        Self(hmac::Key::new(hmac::HMAC_SHA256, bytes))
    }

    /// `value` signed for `key`: the hex HMAC, a space, then `value`, so `etcdctl get` still shows the
    /// JSON. The key is signed too: an entry copied under another key is not believed there.
    pub(crate) fn sign_entry(&self, key: &str, value: &[u8]) -> Vec<u8> {
        let tag = hmac::sign(&self.0, &entry_input(key, value));
        let mut out = hex(tag.as_ref()).into_bytes();
        out.push(b' ');
        out.extend_from_slice(value);
        out
    }

    /// The value under a valid signature for `key`; `None` for anything unsigned or signed otherwise.
    pub(crate) fn verify_entry<'a>(&self, key: &str, signed: &'a [u8]) -> Option<&'a [u8]> {
        let space = signed.iter().position(|&b| b == b' ')?;
        let (tag, value) = (unhex(&signed[..space])?, &signed[space + 1..]);
        hmac::verify(&self.0, &entry_input(key, value), &tag)
            .ok()
            .map(|()| value)
    }

    /// The proof `node` forwards the request of `parts` with, at `now_ms` (Unix milliseconds):
    /// `<now_ms>.<hex HMAC>` over the node, the time, the method, the host and the target.
    pub(crate) fn forward_proof(&self, node: &str, parts: &Parts, now_ms: u64) -> HeaderValue {
        let tag = hmac::sign(&self.0, &forward_input(node, now_ms, parts));
        HeaderValue::from_str(&format!("{now_ms}.{}", hex(tag.as_ref())))
            .expect("digits, a dot and hex are a header value")
    }

    /// Whether `proof` shows that a member forwarded the request of `parts`, as `node`, within the window
    /// around `now_ms`.
    pub(crate) fn verify_forward(
        &self,
        node: &str,
        proof: &HeaderValue,
        parts: &Parts,
        now_ms: u64,
    ) -> bool {
        let Some((at, tag)) = proof.to_str().ok().and_then(|p| p.split_once('.')) else {
            return false;
        };
        let (Ok(at), Some(tag)) = (at.parse::<u64>(), unhex(tag.as_bytes())) else {
            return false;
        };
        if at.abs_diff(now_ms) > FORWARD_WINDOW.as_millis() as u64 {
            return false;
        }
        hmac::verify(&self.0, &forward_input(node, at, parts), &tag).is_ok()
    }
}

fn entry_input(key: &str, value: &[u8]) -> Vec<u8> {
    let mut input = format!("lacquer-entry\n{key}\n").into_bytes();
    input.extend_from_slice(value);
    input
}

/// What a forwarding proof covers, each field on its own line (none can hold a newline): the domain
/// string keeps a proof from ever passing for an entry's signature.
fn forward_input(node: &str, at: u64, parts: &Parts) -> Vec<u8> {
    let host = parts
        .headers
        .get(header::HOST)
        .map_or(&b""[..], HeaderValue::as_bytes);
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut input = format!("lacquer-forward\n{node}\n{at}\n{}\n", parts.method).into_bytes();
    input.extend_from_slice(host);
    input.push(b'\n');
    input.extend_from_slice(target.as_bytes());
    input
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &[u8]) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(method: &str, host: &str, target: &str) -> Parts {
        let req = http::Request::builder()
            .method(method)
            .uri(target)
            .header(header::HOST, host)
            .body(())
            .unwrap();
        req.into_parts().0
    }

    #[test]
    fn an_entry_is_believed_only_under_the_same_secret_and_key() {
        let secret = Secret::new(b"0123456789abcdef0123456789abcdef");
        let value = br#"{"node":"n1"}"#;
        let signed = secret.sign_entry("/c/members/n1", value);
        assert!(signed.ends_with(value));
        assert_eq!(
            secret.verify_entry("/c/members/n1", &signed),
            Some(&value[..])
        );
        let cases: [(&str, &Secret, Vec<u8>); 5] = [
            ("another key", &secret, signed.clone()),
            ("unsigned", &secret, value.to_vec()),
            ("garbage", &secret, b"zz {}".to_vec()),
            (
                "value changed",
                &secret,
                [&signed[..signed.len() - 1], b" }"].concat(),
            ),
            (
                "another secret",
                &Secret::new(b"another secret, just as long!!"),
                signed.clone(),
            ),
        ];
        for (what, secret, bytes) in cases {
            let key = if what == "another key" {
                "/c/members/n9"
            } else {
                "/c/members/n1"
            };
            assert_eq!(secret.verify_entry(key, &bytes), None, "{what}");
        }
    }

    #[test]
    fn a_forwarding_proof_covers_the_node_the_request_and_the_time() {
        let secret = Secret::new(b"0123456789abcdef0123456789abcdef");
        let req = parts("GET", "www.example.test", "/a?b=1");
        let now = 1_800_000_000_000;
        let proof = secret.forward_proof("n1", &req, now);
        assert!(secret.verify_forward("n1", &proof, &req, now + 29_000));
        assert!(secret.verify_forward("n1", &proof, &req, now - 29_000));
        let other = Secret::new(b"another secret, just as long!!");
        let cases = [
            ("another node", "n2", req.clone(), now, &secret),
            (
                "another target",
                "n1",
                parts("GET", "www.example.test", "/a?b=2"),
                now,
                &secret,
            ),
            (
                "another host",
                "n1",
                parts("GET", "evil.test", "/a?b=1"),
                now,
                &secret,
            ),
            (
                "another method",
                "n1",
                parts("HEAD", "www.example.test", "/a?b=1"),
                now,
                &secret,
            ),
            ("too late", "n1", req.clone(), now + 31_000, &secret),
            ("another secret", "n1", req.clone(), now, &other),
        ];
        for (what, node, req, at, secret) in cases {
            assert!(!secret.verify_forward(node, &proof, &req, at), "{what}");
        }
        for bad in ["", "1800000000000", "x.00", "1800000000000.zz"] {
            let bad = HeaderValue::from_static(bad);
            assert!(!secret.verify_forward("n1", &bad, &req, now), "{bad:?}");
        }
    }
}
