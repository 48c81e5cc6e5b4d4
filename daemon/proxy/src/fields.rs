//! The fields lacquerd adds to what it forwards and what it answers.

use http::{header, HeaderMap, HeaderName, HeaderValue};

/// The cache's verdict in one word: `HIT`, `MISS`, `PASS` or `STALE`.
pub const X_CACHE: HeaderName = HeaderName::from_static("x-cache");
/// The cache's verdict as RFC 9211 writes it.
pub const CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// What this proxy adds to `Via` on requests and responses.
pub const VIA: &str = "1.1 lacquer";

/// Appends `value` to the field `name`, joined with a comma to what is there.
pub fn append(headers: &mut HeaderMap, name: header::HeaderName, value: &str) {
    let joined = match headers.get(&name).and_then(|v| v.to_str().ok()) {
        Some(existing) if !existing.is_empty() => format!("{existing}, {value}"),
        _ => value.to_owned(),
    };
    if let Ok(v) = HeaderValue::from_str(&joined) {
        headers.insert(name, v);
    }
}
