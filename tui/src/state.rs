//! What the screen shows, derived from successive stats documents and the keys pressed; no I/O here.

use std::{collections::VecDeque, time::Instant};

use lacquer_admin::{
    cluster::ClusterReport,
    top::{By, Window},
    wire::{BackendList, BackendView, Field, Histogram, Kind, LogEntry, OutcomeLatency, Stats},
};

/// Per-second samples kept for the sparklines: ten minutes.
pub const HISTORY: usize = 600;

/// The rates charted on the overview: a label and the counters whose sum it is.
pub const SERIES: [(&str, &[&str]); 8] = [
    ("requests", &["proxy.requests"]),
    ("hits", &["proxy.hits"]),
    ("misses", &["proxy.misses"]),
    ("passes", &["proxy.passes"]),
    ("stale", &["proxy.stale_served", "proxy.stale_on_error"]),
    ("fetches", &["proxy.backend_requests"]),
    ("errors", &["proxy.backend_errors"]),
    ("bytes out", &["proxy.bytes_out"]),
];

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum View {
    #[default]
    Overview,
    Counters,
    Cluster,
    Rules,
    Latency,
    Top,
}

/// The span of the top view's counts, as `cachectl top`'s default.
pub const TOP_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// The top view's counts: requests of the last [`TOP_WINDOW`], from the log stream, which cachetop follows
/// only while the view is shown (a follower makes the daemon record every request).
#[derive(Debug)]
pub struct Top {
    pub by: By,
    pub window: Window,
    /// When the log stream last delivered: the counts' rates are as of then.
    pub at: Instant,
}

impl Top {
    fn new(by: By) -> Self {
        let now = Instant::now();
        Self {
            by,
            window: Window::new(TOP_WINDOW, now),
            at: now,
        }
    }
}

impl Default for Top {
    fn default() -> Self {
        Self::new(By::Url)
    }
}

/// Samples the latency view spans: its histograms count the requests of the last ten seconds.
pub const LATENCY_WINDOW: usize = 10;

/// A backend with the rates between its last two samples.
#[derive(Debug, Clone)]
pub struct BackendRow {
    pub backend: BackendView,
    /// Requests per second.
    pub fetch_rate: Option<f64>,
    /// Failed share of the requests in the interval.
    pub error_ratio: Option<f64>,
}

/// One row of the counters view.
pub struct CounterRow {
    pub name: String,
    pub field: &'static Field,
    pub value: u64,
    /// Per second between the last two samples; `None` before there are two, and always for a gauge (a
    /// level, not a count, has no rate).
    pub rate: Option<f64>,
}

/// One row of the rules view: a `[[rule]]` and how often it matched.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleRow {
    pub rule: String,
    pub phase: String,
    /// Since the configuration holding it was loaded.
    pub matched: u64,
    /// Matches per second between the last two samples.
    pub rate: Option<f64>,
}

/// What the cluster view shows.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Cluster {
    /// `/v1/cluster` has not answered yet.
    #[default]
    Unknown,
    /// The daemon has no `[cluster]` section.
    Single,
    /// `/v1/cluster` could not be read.
    Failed(String),
    Members {
        /// The asked node's name.
        asked: String,
        rows: Vec<MemberRow>,
        total: MemberRow,
    },
}

/// One member of the cluster view (or the totals row).
#[derive(Debug, Clone, PartialEq)]
pub struct MemberRow {
    pub node: String,
    /// The member's own word (`serving`, `lagging`, …), `unreachable`, or for the totals how many serve.
    pub state: String,
    /// Revisions of the invalidation log not yet applied (the largest, for the totals).
    pub lag_revisions: Option<u64>,
    pub lag_seconds: Option<f64>,
    /// Since the member started (for the totals, of the summed counters).
    pub hit_ratio: Option<f64>,
    /// Requests per second between the last two samples.
    pub rps: Option<f64>,
    pub objects: Option<u64>,
    /// Why the member did not answer.
    pub error: Option<String>,
}

/// How the hits, misses and passes since start split, as fractions of their sum.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Split {
    pub memory: f64,
    pub disk: f64,
    pub miss: f64,
    pub pass: f64,
}

#[derive(Debug, Default)]
pub struct State {
    pub addr: String,
    pub latest: Option<Stats>,
    previous: Option<(Stats, Instant)>,
    taken: Option<Instant>,
    pub error: Option<String>,
    history: [VecDeque<u64>; SERIES.len()],
    pub backends: Vec<BackendRow>,
    backends_taken: Option<(BackendList, Instant)>,
    pub cluster: Cluster,
    cluster_taken: Option<(ClusterReport, Instant)>,
    pub view: View,
    /// The screen stays as it is; new samples are dropped.
    pub paused: bool,
    pub help: bool,
    /// Counters whose name contains this are shown.
    pub filter: String,
    /// Keys go to the filter.
    pub editing: bool,
    /// First counter row shown.
    pub scroll: usize,
    /// The latency histograms of the last [`LATENCY_WINDOW`] samples and the one before, oldest first.
    latency_window: VecDeque<Vec<OutcomeLatency>>,
    /// The latency view shows the time to the end of responses, not to their head.
    pub latency_total: bool,
    pub top: Top,
}

impl State {
    pub fn new(addr: String) -> Self {
        Self {
            addr,
            ..Self::default()
        }
    }

    pub fn update(&mut self, stats: Stats, at: Instant) {
        if let (Some(latest), Some(taken)) = (self.latest.take(), self.taken) {
            self.previous = Some((latest, taken));
        }
        if self.latency_window.len() > LATENCY_WINDOW {
            self.latency_window.pop_front();
        }
        self.latency_window.push_back(stats.latency.clone());
        self.latest = Some(stats);
        self.taken = Some(at);
        self.error = None;
        for (i, (_, fields)) in SERIES.iter().enumerate() {
            let rates: Option<Vec<f64>> = fields.iter().map(|f| self.rate(f)).collect();
            if let Some(rates) = rates {
                let history = &mut self.history[i];
                if history.len() == HISTORY {
                    history.pop_front();
                }
                history.push_back(rates.iter().sum::<f64>().round() as u64);
            }
        }
    }

    pub fn update_backends(&mut self, list: BackendList, at: Instant) {
        let before = self.backends_taken.take();
        self.backends = list
            .backends
            .iter()
            .map(|b| {
                let earlier = before.as_ref().and_then(|(list, taken)| {
                    let old = list.backends.iter().find(|o| o.name == b.name)?;
                    Some((old, at.duration_since(*taken).as_secs_f64()))
                });
                let (fetch_rate, error_ratio) = match earlier {
                    Some((old, secs)) if secs > 0.0 => {
                        let requests = b.requests.saturating_sub(old.requests);
                        let errors = b.errors.saturating_sub(old.errors);
                        let ratio = (requests > 0).then(|| errors as f64 / requests as f64);
                        (Some(requests as f64 / secs), ratio)
                    }
                    _ => (None, None),
                };
                BackendRow {
                    backend: b.clone(),
                    fetch_rate,
                    error_ratio,
                }
            })
            .collect();
        self.backends_taken = Some((list, at));
    }

    /// A new look at the whole cluster; rates are each member's since the previous one.
    pub fn update_cluster(&mut self, report: ClusterReport, at: Instant) {
        let before = self.cluster_taken.take();
        let requests = |m: &lacquer_admin::cluster::MemberReport| -> Option<f64> {
            let (earlier, taken) = before.as_ref()?;
            let then = earlier.members.iter().find(|b| b.node == m.node)?;
            m.stats.as_ref()?.rate_since(
                "proxy.requests",
                then.stats.as_ref()?,
                at.duration_since(*taken),
            )
        };
        let rows: Vec<MemberRow> = report
            .members
            .iter()
            .map(|m| {
                let view = m.cluster.as_ref();
                let stats = m.stats.as_ref();
                MemberRow {
                    node: m.node.clone(),
                    state: view.map_or_else(|| "unreachable".into(), |c| c.state.as_str().into()),
                    lag_revisions: view.map(|c| c.lag_revisions),
                    lag_seconds: view.map(|c| c.lag_seconds),
                    hit_ratio: stats.and_then(Stats::hit_ratio),
                    rps: requests(m),
                    objects: stats.map(|s| s.store.objects),
                    error: m.error.clone(),
                }
            })
            .collect();
        let serving = rows.iter().filter(|r| r.state == "serving").count();
        let total = MemberRow {
            node: "total".into(),
            state: format!("{serving}/{} serving", rows.len()),
            lag_revisions: rows.iter().filter_map(|r| r.lag_revisions).max(),
            lag_seconds: rows.iter().filter_map(|r| r.lag_seconds).reduce(f64::max),
            hit_ratio: report.total.hit_ratio(),
            rps: rows.iter().filter_map(|r| r.rps).reduce(|a, b| a + b),
            objects: (report.answered() > 0).then_some(report.total.store.objects),
            error: None,
        };
        self.cluster = Cluster::Members {
            asked: report.view.node.clone(),
            rows,
            total,
        };
        self.cluster_taken = Some((report, at));
    }

    /// The daemon answered that it is not in a cluster, or could not say.
    pub fn no_cluster(&mut self, cluster: Cluster) {
        self.cluster = cluster;
        self.cluster_taken = None;
    }

    pub fn disconnected(&mut self, error: String) {
        self.error = Some(error);
    }

    /// A value by its `section.name`, e.g. `proxy.hits`.
    pub fn value(&self, name: &str) -> Option<u64> {
        self.latest.as_ref()?.get(name)
    }

    /// Per-second change of a counter between the last two samples.
    pub fn rate(&self, name: &str) -> Option<f64> {
        let (prev, prev_at) = self.previous.as_ref()?;
        let elapsed = self.taken?.duration_since(*prev_at);
        self.latest.as_ref()?.rate_since(name, prev, elapsed)
    }

    /// The latest rate of series `index` of [`SERIES`].
    pub fn series_rate(&self, index: usize) -> Option<f64> {
        SERIES[index].1.iter().map(|f| self.rate(f)).sum()
    }

    /// Per-second samples of series `index` of [`SERIES`], oldest first.
    pub fn history(&self, index: usize) -> &VecDeque<u64> {
        &self.history[index]
    }

    pub fn hit_ratio(&self) -> Option<f64> {
        self.latest.as_ref()?.hit_ratio()
    }

    pub fn split(&self) -> Option<Split> {
        let p = &self.latest.as_ref()?.proxy;
        let total = (p.hits + p.misses + p.passes) as f64;
        (total > 0.0).then(|| Split {
            memory: p.hits_memory as f64 / total,
            disk: p.hits_disk as f64 / total,
            miss: p.misses as f64 / total,
            pass: p.passes as f64 / total,
        })
    }

    /// Requests that completed, from the log stream (the top view).
    pub fn update_log(&mut self, entries: Vec<LogEntry>, at: Instant) {
        let by = self.top.by;
        for entry in &entries {
            if let Some(key) = by.key(entry) {
                self.top.window.add(at, key);
            }
        }
        self.top.window.expire(at);
        self.top.at = at;
    }

    /// Counts by the next way of [`By::ALL`], from now on.
    pub fn next_top_by(&mut self) {
        let next = By::ALL
            .iter()
            .position(|b| *b == self.top.by)
            .map_or(By::Url, |i| By::ALL[(i + 1) % By::ALL.len()]);
        self.top = Top::new(next);
    }

    /// Each outcome's histogram (time to the head, or with [`State::latency_total`] to the end) over the
    /// window, and how many samples back the window reaches: `None` before there are two samples, when the
    /// histograms count every request since the daemon started.
    pub fn latency(&self) -> (Vec<(String, Histogram)>, Option<usize>) {
        let pick = |l: &OutcomeLatency| {
            if self.latency_total {
                l.latency.total.clone()
            } else {
                l.latency.ttfb.clone()
            }
        };
        let (Some(newest), Some(oldest)) =
            (self.latency_window.back(), self.latency_window.front())
        else {
            return (Vec::new(), None);
        };
        let span = self.latency_window.len() - 1;
        let rows = newest
            .iter()
            .map(|now| {
                let h = pick(now);
                let earlier = oldest.iter().find(|o| o.outcome == now.outcome);
                let h = match earlier.filter(|_| span > 0) {
                    Some(e) => h.since(&pick(e)),
                    None => h,
                };
                (now.outcome.clone(), h)
            })
            .collect();
        (rows, (span > 0).then_some(span))
    }

    pub fn uptime(&self) -> Option<u64> {
        Some(self.latest.as_ref()?.uptime_seconds)
    }

    /// Every rule in file order, with its rate between the last two samples.
    pub fn rules(&self) -> Vec<RuleRow> {
        let Some(stats) = &self.latest else {
            return Vec::new();
        };
        let earlier = self.previous.as_ref().zip(self.taken);
        stats
            .rules
            .iter()
            .map(|r| RuleRow {
                rule: r.rule.clone(),
                phase: r.phase.clone(),
                matched: r.matched,
                rate: earlier.and_then(|((before, at), now)| {
                    stats.rule_rate_since(&r.rule, &r.phase, before, now.duration_since(*at))
                }),
            })
            .collect()
    }

    /// Every value whose name contains the filter, in document order.
    pub fn counters(&self) -> Vec<CounterRow> {
        let Some(stats) = &self.latest else {
            return Vec::new();
        };
        stats
            .values()
            .chain(stats.listener_values())
            .filter(|(name, _, _)| name.contains(self.filter.as_str()))
            .map(|(name, field, value)| CounterRow {
                rate: match field.kind {
                    Kind::Counter => self.rate(&name),
                    Kind::Gauge => None,
                },
                name,
                field,
                value,
            })
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use lacquer_admin::wire::{BackendHealth, ProxyStats};

    use super::*;

    fn stats(requests: u64, hits: u64, stale: u64) -> Stats {
        Stats {
            proxy: ProxyStats {
                requests,
                hits,
                hits_memory: hits,
                misses: requests - hits,
                stale_served: stale,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn rates_and_history_follow_the_samples() {
        let mut s = State::new("a".into());
        let t0 = Instant::now();
        s.update(stats(100, 50, 0), t0);
        assert_eq!(s.rate("proxy.requests"), None, "one sample has no rate");
        assert!(s.history(0).is_empty());
        s.update(stats(300, 200, 4), t0 + Duration::from_secs(2));
        assert_eq!(s.rate("proxy.requests"), Some(100.0));
        assert_eq!(s.series_rate(4), Some(2.0), "stale sums two counters");
        s.update(stats(310, 205, 4), t0 + Duration::from_secs(3));
        assert_eq!(s.history(0).iter().copied().collect::<Vec<_>>(), [100, 10]);
        let split = s.split().unwrap();
        assert!((split.memory - 205.0 / 310.0).abs() < 1e-9);
        assert!((split.memory + split.disk + split.miss + split.pass - 1.0).abs() < 1e-9);
    }

    #[test]
    fn history_is_bounded() {
        let mut s = State::new("a".into());
        let t0 = Instant::now();
        for i in 0..HISTORY as u64 + 50 {
            s.update(stats(i, 0, 0), t0 + Duration::from_secs(i));
        }
        assert_eq!(s.history(0).len(), HISTORY);
    }

    #[test]
    fn backend_rates_come_from_two_samples() {
        let list = |requests, errors| BackendList {
            backends: vec![BackendView {
                name: "default".into(),
                address: "127.0.0.1:8080".into(),
                health: BackendHealth::Healthy,
                admin: Default::default(),
                requests,
                errors,
                consecutive_failures: 0,
                last_success: None,
                last_error: None,
                probe: None,
                connections: 2,
                streams_reset: 0,
                responses: Default::default(),
                latency: Default::default(),
            }],
        };
        let mut s = State::new("a".into());
        let t0 = Instant::now();
        s.update_backends(list(10, 0), t0);
        assert_eq!(s.backends[0].fetch_rate, None);
        s.update_backends(list(30, 5), t0 + Duration::from_secs(2));
        assert_eq!(s.backends[0].fetch_rate, Some(10.0));
        assert_eq!(s.backends[0].error_ratio, Some(0.25));
    }

    /// A member's requests, hits and revisions behind; none when it does not answer.
    pub type Sample<'a> = (&'a str, Option<(u64, u64, u64)>);

    /// Members answering these samples, the first one asked.
    pub fn report(samples: &[Sample]) -> ClusterReport {
        use lacquer_admin::{
            cluster::MemberReport,
            wire::{ClusterCounters, ClusterState, ClusterView, StoreStats},
        };
        let view = |node: &str, lag: u64| ClusterView {
            node: node.into(),
            state: if lag == 0 {
                ClusterState::Serving
            } else {
                ClusterState::CatchingUp
            },
            applied_revision: 100 - lag,
            seen_revision: 100,
            lag_revisions: lag,
            lag_seconds: lag as f64 / 2.0,
            self_routing: false,
            members: Vec::new(),
            counters: ClusterCounters::default(),
        };
        let members = samples
            .iter()
            .map(|(node, sample)| MemberReport {
                node: node.to_string(),
                advertise: format!("{node}:8080"),
                advertise_admin: format!("{node}:6082"),
                cluster: sample.map(|(_, _, lag)| view(node, lag)),
                stats: sample.map(|(requests, hits, _)| Stats {
                    store: StoreStats {
                        objects: hits,
                        ..Default::default()
                    },
                    ..stats(requests, hits, 0)
                }),
                error: sample.is_none().then(|| "connection refused".into()),
            })
            .collect();
        ClusterReport::new("127.0.0.1:6082".into(), view(samples[0].0, 0), members)
    }

    #[test]
    fn cluster_rows_rate_each_member_and_total_the_answers() {
        let mut s = State::new("a".into());
        let t0 = Instant::now();
        s.update_cluster(
            report(&[
                ("n1", Some((100, 50, 0))),
                ("n2", Some((10, 0, 6))),
                ("n3", None),
            ]),
            t0,
        );
        let Cluster::Members { rows, total, .. } = &s.cluster else {
            panic!("{:?}", s.cluster);
        };
        assert_eq!(rows[0].rps, None, "one sample has no rate");
        assert_eq!(total.objects, Some(50));
        s.update_cluster(
            report(&[
                ("n1", Some((300, 150, 0))),
                ("n2", Some((20, 5, 2))),
                ("n3", None),
            ]),
            t0 + Duration::from_secs(2),
        );
        let Cluster::Members { asked, rows, total } = &s.cluster else {
            panic!("{:?}", s.cluster);
        };
        assert_eq!(asked, "n1");
        let table: Vec<_> = rows
            .iter()
            .chain([total])
            .map(|r| {
                (
                    r.node.as_str(),
                    r.state.as_str(),
                    r.lag_revisions,
                    r.rps,
                    r.hit_ratio,
                    r.objects,
                )
            })
            .collect();
        assert_eq!(
            table,
            [
                ("n1", "serving", Some(0), Some(100.0), Some(0.5), Some(150)),
                ("n2", "catching_up", Some(2), Some(5.0), Some(0.25), Some(5)),
                ("n3", "unreachable", None, None, None, None),
                (
                    "total",
                    "1/3 serving",
                    Some(2),
                    Some(105.0),
                    Some(155.0 / 320.0),
                    Some(155)
                ),
            ]
        );
        assert_eq!(rows[2].error.as_deref(), Some("connection refused"));
        assert_eq!(total.lag_seconds, Some(1.0));

        s.no_cluster(Cluster::Single);
        assert_eq!(s.cluster, Cluster::Single);
    }

    #[test]
    fn rule_rows_rate_each_rule_between_samples() {
        use lacquer_admin::wire::RuleMatches;
        let sample = |n: u64| Stats {
            rules: vec![RuleMatches {
                rule: "static".into(),
                phase: "request".into(),
                matched: n,
            }],
            ..stats(1, 1, 0)
        };
        let mut s = State::new("a".into());
        assert!(s.rules().is_empty(), "nothing before the first sample");
        let t0 = Instant::now();
        s.update(sample(10), t0);
        let row = |rate| RuleRow {
            rule: "static".into(),
            phase: "request".into(),
            matched: 30,
            rate,
        };
        assert_eq!(s.rules()[0].rate, None, "one sample has no rate");
        s.update(sample(30), t0 + Duration::from_secs(4));
        assert_eq!(s.rules(), [row(Some(5.0))]);
    }

    #[test]
    fn the_filter_keeps_matching_counters() {
        let mut s = State::new("a".into());
        s.update(stats(1, 1, 0), Instant::now());
        s.filter = "ban".into();
        let rows = s.counters();
        assert!(!rows.is_empty());
        assert!(rows.iter().all(|r| r.name.contains("ban")));
    }
}
