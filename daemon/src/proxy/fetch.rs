//! The fill task: one backend fetch that streams into a shared [`Fetch`] for its readers and, when the
//! response is storable, into the store.

use std::{
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use http::{header, request::Parts, HeaderValue};
use http_body_util::BodyExt;
use lacquer_storage::ObjectMeta;

use super::forward;
use crate::{
    backend::error_chain,
    coalesce::{Fetch, FetchError, FetchedHead, HeadError},
    policy::{
        age::corrected_initial_age,
        headers::strip_hop_by_hop,
        storable::{self, Decision},
        vary,
    },
    stats::{add, dec, inc},
    worker::Worker,
};

/// How a fill ended, for the coalescer: whether later requests should skip coalescing for a while.
enum Ending {
    Stored,
    NotStored,
    Failed,
}

/// Runs a fill for `key` on behalf of the request `parts`. With `registered`, the fetch is the coalescer's
/// entry for the key and is unregistered when done.
pub async fn run(
    worker: Arc<Worker>,
    fetch: Arc<Fetch>,
    key: String,
    registered: bool,
    parts: Arc<Parts>,
    client: IpAddr,
) {
    let stats = &worker.shared.stats;
    inc(&stats.fetches_in_flight);
    inc(&stats.backend_requests);
    let ending = fill(&worker, &fetch, &key, &parts, client).await;
    dec(&stats.fetches_in_flight);
    let coalescer = &worker.shared.coalescer;
    match ending {
        Ending::Stored => {
            inc(&stats.objects_stored);
            coalescer.clear_hit_for_miss(&key);
        }
        Ending::Failed => inc(&stats.backend_errors),
        Ending::NotStored => inc(&stats.uncacheable),
    }
    if registered {
        let hit_for_miss =
            matches!(ending, Ending::NotStored).then_some(worker.shared.policy.hit_for_miss);
        coalescer.finish(&key, &fetch, hit_for_miss);
    }
    fetch.settle();
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn fill(worker: &Worker, fetch: &Fetch, key: &str, parts: &Parts, client: IpAddr) -> Ending {
    let shared = &worker.shared;
    let policy = &shared.policy;
    let request_time = SystemTime::now();
    let resp = match worker
        .backend
        .send(forward::fill_request(parts, client))
        .await
    {
        Ok(resp) => resp,
        Err(e) => {
            tracing::warn!(key, error = %e, "fetch failed");
            fetch.set_head(Err(HeadError {
                status: e.status(),
                error: FetchError::new(e.to_string()),
            }));
            return Ending::Failed;
        }
    };
    let response_time = SystemTime::now();
    let received_at = Instant::now();
    let (mut head, mut body) = resp.into_parts();
    strip_hop_by_hop(&mut head.headers);
    if !head.headers.contains_key(header::DATE) {
        head.headers.insert(
            header::DATE,
            HeaderValue::from_str(&httpdate::fmt_http_date(response_time)).expect("date"),
        );
    }
    let initial_age = corrected_initial_age(&head.headers, request_time, response_time);
    head.headers.remove(header::AGE);

    let authorized = parts.headers.contains_key(header::AUTHORIZATION);
    let too_large = head
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .is_some_and(|len| len > policy.max_object_size);
    let decision = match storable::decide(
        authorized,
        head.status,
        &head.headers,
        policy,
        response_time,
    ) {
        Decision::Store(_) if too_large => Decision::DontStore("too large"),
        d => d,
    };
    let (storable, selection) = match &decision {
        Decision::Store(s) => (Some(s.clone()), vary::selection(&s.vary, &parts.headers)),
        Decision::DontStore(reason) => {
            tracing::debug!(key, reason, "not storing");
            (None, Vec::new())
        }
    };
    let mut writer = match &storable {
        Some(_) => match shared.store.writer(key, &selection) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(key, error = %e, "cannot store");
                None
            }
        },
        None => None,
    };
    let fetched = Arc::new(FetchedHead {
        status: head.status,
        headers: head.headers.clone(),
        shareable: writer.is_some(),
        selection: selection.clone(),
        initial_age,
        received_at,
        ttl: storable.as_ref().map_or(Duration::ZERO, |s| {
            s.ttl.saturating_sub(Duration::from_secs(initial_age))
        }),
    });
    fetch.set_head(Ok(fetched));

    loop {
        let frame =
            match tokio::time::timeout(worker.backend.between_bytes_timeout, body.frame()).await {
                Err(_) => Err(format!(
                    "no body bytes for {:?}",
                    worker.backend.between_bytes_timeout
                )),
                Ok(None) => break,
                Ok(Some(Err(e))) => Err(error_chain(&e)),
                Ok(Some(Ok(frame))) => Ok(frame),
            };
        let frame = match frame {
            Ok(frame) => frame,
            Err(reason) => {
                tracing::warn!(key, reason, "backend body failed; nothing stored");
                fetch.end(Err(FetchError::new(format!(
                    "backend body failed: {reason}"
                ))));
                return Ending::Failed;
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        add(&shared.stats.bytes_in, data.len() as u64);
        fetch.push(data.clone());
        if let Some(w) = writer.as_mut() {
            let over = w.length() + data.len() as u64 > policy.max_object_size;
            if over {
                tracing::info!(key, "body exceeds max_object_size; not storing");
            }
            if over || w.push(&data).await.is_err() {
                writer = None;
            }
        }
    }
    fetch.end(Ok(()));

    let (Some(writer), Some(storable)) = (writer, storable) else {
        // A server error is a failure of the origin, not a sign that the URL is uncacheable: no hit-for-miss.
        return if head.status.is_server_error() {
            Ending::Failed
        } else {
            Ending::NotStored
        };
    };
    let meta = ObjectMeta {
        object: 0,
        generation: 0,
        variant: selection,
        status: head.status.as_u16(),
        headers: head
            .headers
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect(),
        length: 0,
        chunk_size: 0,
        stored_at_ms: unix_ms(response_time),
        initial_age_s: initial_age,
        ttl_ms: storable.ttl.as_millis() as u64,
        grace_ms: storable.grace.as_millis() as u64,
        keep_ms: storable.keep.as_millis() as u64,
        stale_if_error_ms: storable.stale_if_error.as_millis() as u64,
        no_stale: storable.no_stale,
    };
    match writer.finish(key.to_owned(), meta).await {
        Ok(()) => Ending::Stored,
        Err(e) => {
            tracing::warn!(key, error = %e, "storing failed");
            Ending::NotStored
        }
    }
}
