//! `GET /v1/objects?url=…`: what the store holds for a URL, and where.

use axum::{extract::State, Json};
use bytes::BytesMut;
use lacquer_admin::wire::{
    ApiError, EsiInclude, HeaderField, Inspection, NotStoredNote, ObjectQuery, Representation,
    StoredPart, StoredVariant, Tiers,
};
use lacquer_storage::{ChunkTiers, Inspected, ObjectMeta, Store};

use super::{AdminError, AdminState, ApiQuery};
use lacquer_policy::{
    cache_control::CacheControl,
    stale::{usability, Usability},
    storable, vary,
};
use lacquer_proxy::invalidation;

/// Every stored variant of a URL's cache key: status, size, tiers, freshness, tags and headers. Objects a
/// ban covers are removed first, as a lookup would. While the key's last response, not stored, keeps
/// requests bypassing the cache (hit-for-miss), why it was not stored.
#[utoipa::path(get, path = "/v1/objects", tag = "objects", security(("secret" = [])),
    params(ObjectQuery),
    responses(
        (status = 200, description = "The key and its variants (none when not cached)", body = Inspection),
        (status = 400, description = "`invalid_url`, `missing_host`, `invalid_host`, `invalid_query`", body = ApiError),
        (status = 401, description = "Missing or wrong secret", body = ApiError),
    ))]
pub async fn inspect(
    State(state): State<AdminState>,
    ApiQuery(query): ApiQuery<ObjectQuery>,
) -> Result<Json<Inspection>, AdminError> {
    let key = invalidation::purge_key(&query.url, query.host.as_deref())?;
    let store = state.shared.store.clone();
    let lookup_key = key.clone();
    let found = tokio::task::spawn_blocking(move || store.inspect(&lookup_key))
        .await
        .expect("inspection does not panic")?;
    let now = lacquer_clock::now_ms();
    let mut variants = Vec::with_capacity(found.len());
    for found in found {
        let includes = esi_includes(&state.shared.store, &found.meta).await;
        let mut variant = stored_variant(found, now);
        variant.esi_includes = includes;
        variants.push(variant);
    }
    let not_stored = state.shared.uncacheable(&key).map(|u| NotStoredNote {
        reason: u.why.token().into(),
        at: u.at_ms / 1000,
        bypass_seconds: u
            .until
            .saturating_duration_since(lacquer_clock::monotonic())
            .as_secs(),
    });
    Ok(Json(Inspection {
        key,
        cached: !variants.is_empty(),
        variants,
        not_stored,
    }))
}

/// The most of an ESI page's template read to list its includes: a larger one is listed as unread.
const ESI_LISTED: u64 = 4 << 20;

/// The includes of a stored ESI page, in order, read from its template; `None` for any other body. A
/// template larger than [`ESI_LISTED`], gone, or damaged lists none.
async fn esi_includes(store: &Store, meta: &ObjectMeta) -> Option<Vec<EsiInclude>> {
    meta.header(lacquer_proxy::ESI_TEMPLATE.as_str())?;
    if meta.length > ESI_LISTED {
        return Some(Vec::new());
    }
    let mut template = BytesMut::with_capacity(meta.length as usize);
    for index in 0..meta.chunk_count() {
        match store.read_chunk(meta, index).await {
            Ok(Some(chunk)) => template.extend_from_slice(&chunk.data),
            _ => return Some(Vec::new()),
        }
    }
    let segments = lacquer_esi::Reader::read_all(template.freeze()).unwrap_or_default();
    Some(
        segments
            .into_iter()
            .filter_map(|s| match s {
                lacquer_esi::Segment::Include(i) => Some(EsiInclude {
                    src: i.src,
                    continue_on_error: i.continue_on_error,
                }),
                lacquer_esi::Segment::Literal(_) => None,
            })
            .collect(),
    )
}

fn tiers(t: ChunkTiers) -> Tiers {
    Tiers {
        chunks: t.chunks,
        in_memory: t.in_memory,
        on_disk: t.on_disk,
    }
}

fn stored_variant(found: Inspected, now_ms: u64) -> StoredVariant {
    let Inspected {
        meta,
        tiers: chunk_tiers,
        representations,
        parts,
    } = found;
    let state = match usability(meta.lifetime(now_ms)) {
        Usability::Fresh => "fresh",
        Usability::Grace => "grace",
        Usability::OnError => "stale_if_error",
        Usability::Unusable if now_ms < meta.expires_at_ms() => "keep",
        Usability::Unusable => "expired",
    };
    let field = |(name, value): (String, Vec<u8>)| HeaderField {
        name,
        value: String::from_utf8_lossy(&value).into_owned(),
    };
    StoredVariant {
        state: state.into(),
        stored_at: meta.stored_at_ms / 1000,
        age_seconds: meta.age_s(now_ms),
        ttl_seconds: meta.remaining_ttl_ms(now_ms).div_euclid(1000),
        grace_seconds: meta.grace_ms / 1000,
        keep_seconds: meta.keep_ms / 1000,
        stale_if_error_seconds: meta.stale_if_error_ms / 1000,
        no_stale: meta.no_stale,
        stale_forbidden_by: meta
            .no_stale
            .then(|| {
                // No rule's grace held when it was stored (a rule's grace voids s-maxage's
                // implication, so s-maxage here means there was none); a route's TTL voids no-cache,
                // so a stored no-cache with freshness is not the reason.
                let cc = CacheControl::governing(&meta.header_map(0), &[]);
                let no_cache = cc.no_cache && meta.ttl_ms == 0;
                storable::stale_forbidden_by(&cc, no_cache, false)
            })
            .flatten()
            .map(str::to_owned),
        status: meta.status,
        size: parts.as_ref().map_or(meta.length, |(_, parts)| {
            parts.iter().map(|(p, _)| p.body.length).sum()
        }),
        total: parts.as_ref().map(|(total, _)| *total),
        parts: parts
            .into_iter()
            .flat_map(|(_, parts)| parts)
            .map(|(part, t)| StoredPart {
                start: part.start,
                size: part.body.length,
                tiers: tiers(t),
                generation: part.body.generation,
            })
            .collect(),
        tiers: tiers(chunk_tiers),
        generation: meta.generation,
        representations: representations
            .into_iter()
            .map(|(sibling, t)| Representation {
                coding: sibling.coding.unwrap_or_else(|| "identity".into()),
                size: sibling.body.length,
                tiers: tiers(t),
                generation: sibling.body.generation,
            })
            .collect(),
        // One field per line the request sent, as headers are shown; an absent header as an empty one.
        vary: meta
            .variant
            .into_iter()
            .flat_map(|(n, v)| {
                let lines = vary::sent_lines(&v);
                if lines.is_empty() {
                    vec![field((n, Vec::new()))]
                } else {
                    lines.into_iter().map(|l| field((n.clone(), l))).collect()
                }
            })
            .collect(),
        tags: meta.tags,
        headers: meta.headers.into_iter().map(field).collect(),
        esi_includes: None,
    }
}
