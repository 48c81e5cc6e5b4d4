//! The fill's stage that moves the body: from the origin to the readers and, while it is stored, into the
//! store, recoded on the way when the store keeps another coding.

use std::sync::Arc;

use bytes::Bytes;
use http_body::Body as _;
use http_body_util::BodyExt;
use lacquer_backends::error_chain;

use super::{
    decide::Verdict,
    request::{Ask, Ending, Fill},
    send::Sent,
};
use crate::{
    coalesce::{Fetch, FetchError},
    coding::Pushed,
    prefetch::budget::MAX_PLAYLIST,
    stats::{add, inc},
    store::{BodyWriter, CacheStore},
    worker::Worker,
};

/// How the body went.
pub(super) struct Pumped {
    /// Every reader of a forwarded range left, and the bytes in hand are kept as a part.
    pub left: bool,
    /// A body without a declared length found larger than `max_object_size` as it came.
    pub grew_too_large: bool,
}

/// Reads the body to its end (or until every reader of a body not stored leaves); `Err` with how the fill
/// ended when the origin's body failed or does not decode.
pub(super) async fn pump<S: CacheStore>(
    worker: &Arc<Worker<S>>,
    fetch: &Arc<Fetch<S>>,
    request: &Fill,
    sent: &mut Sent<'_>,
    verdict: &mut Verdict<S>,
) -> Result<Pumped, Ending> {
    let key = request.key.as_str();
    let shared = &worker.shared;
    let max_object_size = request.route.policy.cache.max_object_size.as_u64();
    let placed = verdict.placed;
    let (backend, body) = (&sent.backend, &mut sent.body);
    let Verdict {
        writer,
        coding,
        playlist,
        esi,
        ..
    } = verdict;
    let mut unattended = false;
    // A client's forwarded range that every reader left: the origin is read no further, and the bytes in
    // hand are kept as a part (an open range of a huge object is mostly asked for, then left).
    let left_part = matches!(request.part, Some(Ask::Client(_))) && placed.is_some();
    let mut left = false;
    // A body without a declared length found larger than `max_object_size` as it came.
    let mut grew_too_large = false;
    loop {
        fetch.room().await;
        if writer.is_some() && !unattended && fetch.unattended() {
            if left_part && fetch.leave_if_deserted() {
                left = true;
                break;
            }
            unattended = true;
            inc(&shared.stats.background_fills);
        }
        // Frames already in hand are taken without waking the readers for each: they wake once, for all
        // of them, when the fill is about to wait (the head too, announced with the first of them).
        let next = fetch
            .announced_before_waiting(async {
                tokio::select! {
                    biased;
                    () = fetch.deserted() => None,
                    next = tokio::time::timeout(backend.between_bytes_timeout, body.frame()) => Some(next),
                }
            })
            .await;
        let Some(next) = next else {
            tracing::debug!(key, "every reader left an unstored body; fetch cancelled");
            return Err(Ending::Cancelled);
        };
        let frame = match next {
            Err(_) => Err(format!(
                "no body bytes for {:?}",
                backend.between_bytes_timeout
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
                return Err(Ending::Failed);
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        add(&shared.stats.bytes_in, data.len() as u64);
        if let Some(text) = playlist.as_mut() {
            if text.len() + data.len() > MAX_PLAYLIST {
                *playlist = None;
            } else {
                text.extend_from_slice(&data);
            }
        }
        let pieces = match fetch.announced_before_waiting(coding.push(data)).await {
            Ok(Pushed::Pieces(pieces)) => pieces,
            Ok(Pushed::OverLimit(pieces)) => {
                inc(&shared.stats.decode_limit);
                tracing::info!(
                    key,
                    "compressed body expands past max_object_size; not storing"
                );
                fetch.stop_storing(writer.take());
                pieces
            }
            Err(e) => return Err(corrupt(worker, fetch, key, e)),
        };
        let pieces = match esi.as_mut() {
            None => pieces,
            Some(esi) => match esi.push(pieces) {
                Ok(template) => template,
                Err(e) => return Err(corrupt(worker, fetch, key, e)),
            },
        };
        // A body of known length sent on as the origin sent it is whole once its last bytes are in hand.
        // Marked so as they reach the readers, a request right after a client took every byte finds it
        // complete (as good as stored) rather than joining a fetch that waits for the store to take them.
        // (A page parsed for ESI holds the end of its text until the body ends.)
        let whole = body.is_end_stream() && coding.passes_through() && esi.is_none();
        let count = pieces.len();
        for (i, piece) in pieces.into_iter().enumerate() {
            let last = whole && i + 1 == count;
            grew_too_large |= forward_piece(fetch, writer, piece, max_object_size, key, last).await;
        }
    }
    if !left {
        let last = match coding.finish() {
            Ok(pieces) => pieces,
            Err(e) => return Err(corrupt(worker, fetch, key, e)),
        };
        let last = match esi.as_mut() {
            None => last,
            Some(esi) => match esi.finish(last) {
                Ok(template) => template,
                Err(e) => return Err(corrupt(worker, fetch, key, e)),
            },
        };
        for piece in last {
            grew_too_large |=
                forward_piece(fetch, writer, piece, max_object_size, key, false).await;
        }
        fetch.end(Ok(()));
    } else {
        // Not read to its end: not all it lists is known.
        *playlist = None;
        fetch.announce();
    }
    coding.record(&mut sent.head.headers, &shared.stats);
    Ok(Pumped {
        left,
        grew_too_large,
    })
}

/// Sends one piece of the body to the fetch's readers and, while storing, to the store; the `last` piece
/// of a body ends it as it reaches the readers. Returns whether the piece took the body past
/// `max_object_size`, which stopped storing it.
async fn forward_piece<S: CacheStore>(
    fetch: &Fetch<S>,
    writer: &mut Option<S::Writer>,
    piece: Bytes,
    max_object_size: u64,
    key: &str,
    last: bool,
) -> bool {
    if last {
        fetch.push_last(piece.clone());
    } else {
        fetch.push_quietly(piece.clone());
    }
    if let Some(w) = writer.as_mut() {
        let over = w.length() + piece.len() as u64 > max_object_size;
        if over {
            tracing::info!(key, "body exceeds max_object_size; not storing");
        }
        if over
            || fetch
                .announced_before_waiting(w.push(&piece))
                .await
                .is_err()
        {
            fetch.stop_storing(writer.take());
        }
        return over;
    }
    false
}

/// A compressed body from the origin that does not decode: nothing is stored and the readers' responses
/// end in an error, so none takes it for complete.
fn corrupt<S: CacheStore>(
    worker: &Worker<S>,
    fetch: &Fetch<S>,
    key: &str,
    e: lacquer_codec::CodecError,
) -> Ending {
    inc(&worker.shared.stats.corrupt_bodies);
    tracing::warn!(key, error = %e, "backend body does not decode; nothing stored");
    fetch.end(Err(FetchError::new(format!("backend body failed: {e}"))));
    Ending::Failed
}
