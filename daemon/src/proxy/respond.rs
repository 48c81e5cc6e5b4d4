//! Building client responses: from a stored object, from a fetch in flight, or for a failure. Every one
//! carries `Age`, `X-Cache`, `Cache-Status` (RFC 9211) and `Via`.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use http_body::Frame;
use lacquer_storage::{ObjectSet, Store};

use super::forward::{append, VIA};
use crate::{
    body::{self, Body, BoxError},
    coalesce::{FetchReader, FetchedHead},
};

pub const X_CACHE: HeaderName = HeaderName::from_static("x-cache");
pub const CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// The cache's verdict on one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Hit {
        ttl_s: i64,
    },
    /// A stale object: within grace while a background fetch refreshes it (`origin_failed` false), or
    /// standing in for an origin that failed (`fwd_status` is its 5xx, none when it could not be reached).
    Stale {
        ttl_s: i64,
        origin_failed: bool,
        fwd_status: Option<u16>,
    },
    /// Answered from a fetch; `stored` when the response is being stored, `collapsed` when the request
    /// joined a fetch started by another.
    Miss {
        stored: bool,
        collapsed: bool,
        detail: Option<&'static str>,
    },
    Pass {
        unsafe_method: bool,
    },
}

impl Outcome {
    fn x_cache(self) -> &'static str {
        match self {
            Outcome::Hit { .. } => "HIT",
            Outcome::Stale { .. } => "STALE",
            Outcome::Miss { .. } => "MISS",
            Outcome::Pass { .. } => "PASS",
        }
    }

    fn cache_status(self) -> String {
        match self {
            Outcome::Hit { ttl_s } => format!("lacquer; hit; ttl={ttl_s}"),
            Outcome::Stale {
                ttl_s,
                origin_failed: false,
                ..
            } => {
                format!("lacquer; hit; ttl={ttl_s}; detail=\"stale-while-revalidate\"")
            }
            Outcome::Stale {
                ttl_s,
                origin_failed: true,
                fwd_status: Some(status),
            } => {
                format!("lacquer; fwd=stale; fwd-status={status}; ttl={ttl_s}")
            }
            Outcome::Stale {
                ttl_s,
                origin_failed: true,
                fwd_status: None,
            } => {
                format!("lacquer; fwd=stale; ttl={ttl_s}; detail=\"origin-unreachable\"")
            }
            Outcome::Miss {
                stored,
                collapsed,
                detail,
            } => {
                let mut s = String::from("lacquer; fwd=miss");
                if stored {
                    s.push_str("; stored");
                }
                if collapsed {
                    s.push_str("; collapsed");
                }
                if let Some(d) = detail {
                    s.push_str(&format!("; detail=\"{d}\""));
                }
                s
            }
            Outcome::Pass {
                unsafe_method: true,
            } => "lacquer; fwd=method".into(),
            Outcome::Pass {
                unsafe_method: false,
            } => "lacquer; fwd=bypass".into(),
        }
    }
}

/// Adds what every delivered response carries. `age` replaces any `Age` already present.
pub fn decorate(headers: &mut HeaderMap, outcome: Outcome, age: Option<u64>) {
    if let Some(age) = age {
        headers.insert(header::AGE, HeaderValue::from(age));
    } else if !headers.contains_key(header::AGE) {
        headers.insert(header::AGE, HeaderValue::from_static("0"));
    }
    headers.insert(X_CACHE, HeaderValue::from_static(outcome.x_cache()));
    if let Ok(v) = HeaderValue::from_str(&outcome.cache_status()) {
        headers.insert(CACHE_STATUS, v);
    }
    append(headers, header::VIA, VIA);
}

pub fn error(status: StatusCode, outcome: Outcome, message: &str) -> Response<Body> {
    let mut resp = Response::new(body::full(format!("{message}\n")));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    decorate(h, outcome, Some(0));
    resp
}

/// A response read from a fetch in flight (or just finished).
pub fn fetched(
    head: &FetchedHead,
    reader: FetchReader,
    outcome: Outcome,
    head_only: bool,
) -> Response<Body> {
    let mut resp = Response::new(if head_only {
        body::empty()
    } else {
        reader.into_body()
    });
    *resp.status_mut() = head.status;
    *resp.headers_mut() = head.headers.clone();
    let age = head.initial_age + head.received_at.elapsed().as_secs();
    decorate(resp.headers_mut(), outcome, Some(age));
    resp
}

/// A response from a stored object whose first chunk has been read already (so the object is known to be
/// readable before the status line goes out).
pub fn stored(
    store: Store,
    set: Arc<ObjectSet>,
    variant: usize,
    first: Option<Bytes>,
    now_ms: u64,
    outcome: Outcome,
    head_only: bool,
) -> Response<Body> {
    let meta = &set.variants[variant];
    let mut headers = HeaderMap::with_capacity(meta.headers.len() + 6);
    for (name, value) in &meta.headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            headers.append(n, v);
        }
    }
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(meta.length));
    decorate(&mut headers, outcome, Some(meta.age_s(now_ms)));
    let status = StatusCode::from_u16(meta.status).unwrap_or(StatusCode::OK);
    let body = if head_only || meta.length == 0 {
        body::empty()
    } else {
        chunks(store, set, variant, first)
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    resp
}

/// Streams a stored body chunk by chunk; a chunk lost mid-body ends the stream with an error, so the client
/// sees a broken response rather than a short one.
fn chunks(store: Store, set: Arc<ObjectSet>, variant: usize, first: Option<Bytes>) -> Body {
    let count = set.variants[variant].chunk_count();
    let state = (store, set, first, 0u32);
    body::from_stream(futures_util::stream::unfold(
        state,
        move |(store, set, first, index)| async move {
            if index >= count {
                return None;
            }
            let data: Result<Bytes, BoxError> = match (index, first.clone()) {
                (0, Some(data)) => Ok(data),
                _ => match store.read_chunk(&set.variants[variant], index).await {
                    Ok(Some(read)) => Ok(read.data),
                    Ok(None) => Err(format!("chunk {index} of a stored body is gone").into()),
                    Err(e) => Err(e.into()),
                },
            };
            let failed = data.is_err();
            let next_index = if failed { count } else { index + 1 };
            Some((data.map(Frame::data), (store, set, None, next_index)))
        },
    ))
}
