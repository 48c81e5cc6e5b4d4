//! Health, statistics (a document, a stream, Prometheus metrics) and the OpenAPI document.

use std::{convert::Infallible, sync::atomic::Ordering::Relaxed, time::Duration};

use axum::{
    extract::State,
    http::header,
    response::{
        sse::{Event, KeepAlive, Sse},
        IntoResponse, Response,
    },
    Json,
};
use futures_util::Stream;
use lacquer_admin::wire::{
    ApiError, ClusterState, ClusterView, Health, RuleMatches, Stats, StoreStats,
};
use lacquer_storage::StoreStatsSnapshot;

use super::AdminState;
use lacquer_proxy::worker::Shared;

use crate::{error::AdminError, metrics};

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Is the daemon up, and is anything wrong with it? Needs no secret.
#[utoipa::path(get, path = "/v1/health", tag = "status",
    responses((status = 200, description = "The daemon is serving (`degraded`: with the problems listed)", body = Health)))]
pub async fn health(State(state): State<AdminState>) -> Json<Health> {
    let mut problems = state.shared.store.problems();
    if let Some(acme) = &state.shared.acme {
        problems.extend(acme.problems());
    }
    if let Some(view) = cluster_view(&state.shared) {
        match view.state {
            ClusterState::Serving | ClusterState::Disconnected => {}
            ClusterState::CatchingUp => problems.push(format!(
                "cluster: catching up with the invalidation log (applied revision {}); stored objects are revalidated with the origin",
                view.applied_revision
            )),
            ClusterState::Lagging => problems.push(format!(
                "cluster: no word from etcd for {:.0} s, past max_invalidation_lag; stored objects are revalidated with the origin",
                view.lag_seconds
            )),
        }
    }
    Json(Health {
        status: if problems.is_empty() {
            "ok"
        } else {
            "degraded"
        }
        .into(),
        version: VERSION.into(),
        uptime_seconds: state.shared.started.elapsed().as_secs(),
        problems,
    })
}

/// This document. Needs no secret.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "status",
    responses((status = 200, description = "The OpenAPI 3 description of the admin API", content_type = "application/json")))]
pub async fn openapi(State(state): State<AdminState>) -> Response {
    let doc = state.openapi.get().cloned().unwrap_or_default();
    ([(header::CONTENT_TYPE, "application/json")], doc).into_response()
}

/// Every counter and gauge.
#[utoipa::path(get, path = "/v1/stats", tag = "status", security(("secret" = [])),
    responses(
        (status = 200, description = "Counters and gauges", body = Stats),
        (status = 401, description = "Missing or wrong secret", body = ApiError),
    ))]
pub async fn stats(State(state): State<AdminState>) -> Json<Stats> {
    Json(snapshot(&state.shared))
}

/// The statistics document once a second, as server-sent events named `stats`, until the client leaves or
/// the daemon stops.
#[utoipa::path(get, path = "/v1/stats/stream", tag = "status", security(("secret" = [])),
    responses(
        (status = 200, description = "`event: stats` with a statistics document as `data`, every second", content_type = "text/event-stream", body = Stats),
        (status = 401, description = "Missing or wrong secret", body = ApiError),
    ))]
pub async fn stats_stream(
    State(state): State<AdminState>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let events =
        futures_util::stream::unfold((state, ticks), |(mut state, mut ticks)| async move {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = state.stopping.wait_for(|stopping| *stopping) => return None,
            }
            let event = Event::default()
                .event("stats")
                .json_data(snapshot(&state.shared))
                .expect("statistics serialize");
            Some((Ok(event), (state, ticks)))
        });
    Sse::new(events).keep_alive(KeepAlive::default())
}

/// Every statistics value in Prometheus' text format, then foyer's own metrics.
#[utoipa::path(get, path = "/metrics", tag = "status", security(("secret" = [])),
    responses(
        (status = 200, description = "Prometheus text exposition format 0.0.4", content_type = "text/plain"),
        (status = 401, description = "Missing or wrong secret (unless `admin.open_metrics`)", body = ApiError),
    ))]
pub async fn metrics(State(state): State<AdminState>) -> Response {
    let text = metrics::render(
        &snapshot(&state.shared),
        &super::operations::backend_views(&state.shared),
        cluster_view(&state.shared).as_ref(),
        &state
            .shared
            .acme
            .as_ref()
            .map(|a| a.views())
            .unwrap_or_default(),
        state.shared.store.metrics_registry(),
    );
    ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response()
}

/// This node's place in its cluster: state, lag behind the invalidation log, live members, counters.
#[utoipa::path(get, path = "/v1/cluster", tag = "status", security(("secret" = [])),
    responses(
        (status = 200, description = "This node in its cluster", body = ClusterView),
        (status = 401, description = "Missing or wrong secret", body = ApiError),
        (status = 404, description = "`cluster_disabled`: a single node", body = ApiError),
    ))]
pub async fn cluster(State(state): State<AdminState>) -> Result<Json<ClusterView>, AdminError> {
    cluster_view(&state.shared)
        .map(Json)
        .ok_or(AdminError::ClusterDisabled)
}

/// The cluster's view with the data path's counters in it; `None` on a single node.
fn cluster_view(shared: &Shared) -> Option<ClusterView> {
    let mut view = shared.cluster.as_ref()?.view();
    let s = &shared.stats;
    view.counters.hits_revalidated_for_lag = s.cluster_revalidations.load(Relaxed);
    view.counters.peer_fetches = s.peer_requests.load(Relaxed);
    view.counters.peer_failures = s.peer_failures.load(Relaxed);
    view.counters.forwarded_in = s.peer_requests_in.load(Relaxed);
    Some(view)
}

pub fn snapshot(shared: &Shared) -> Stats {
    let live = shared.live.load();
    let sick = live
        .router
        .backends
        .iter()
        .filter(|b| !b.is_healthy())
        .count();
    shared.stats.backends_sick.store(sick as u64, Relaxed);
    let (proxy, listeners) = shared.stats.snapshot();
    Stats {
        version: VERSION.into(),
        uptime_seconds: shared.started.elapsed().as_secs(),
        proxy,
        listeners,
        store: store_stats(shared.store.stats()),
        latency: shared.stats.latency(),
        responses: shared.stats.responses(),
        rules: live
            .rules
            .counters()
            .map(|(rule, phase, matched)| RuleMatches {
                rule: rule.to_owned(),
                phase: phase.name().to_owned(),
                matched,
            })
            .collect(),
    }
}

/// Every field named by the store's own list ([`lacquer_storage::for_each_store_stat`]), taken from its
/// snapshot and given to the wire type by destructuring and building: a field added to either side and not
/// the other does not compile.
fn store_stats(s: StoreStatsSnapshot) -> StoreStats {
    macro_rules! same_fields {
        ($($field:ident),* $(,)?) => {{
            let StoreStatsSnapshot { $($field),* } = s;
            StoreStats { $($field),* }
        }};
    }
    lacquer_storage::for_each_store_stat!(same_fields)
}
