//! `GET /metrics`: every stats value in Prometheus' text format, under the names declared with the wire
//! types, followed by foyer's own metrics.

use std::collections::BTreeMap;

use lacquer_admin::wire::{
    BackendHealth, BackendView, CertificateView, ClusterState, ClusterView, Field, Histogram, Kind,
    Stats, FAMILY_HELP, LATENCY_BOUNDS_US, LISTENER_FAMILY_HELP, LISTENER_LABEL, RULE_MATCHES_HELP,
    RULE_MATCHES_METRIC,
};
use prometheus::{
    core::Collector,
    proto::{self, MetricFamily, MetricType},
    Encoder, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The media type of Prometheus' text exposition format, the version `render` writes.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Renders `stats`, every backend's series, the cluster's gauges when this node is in one, and the metrics
/// in `foyer`.
pub fn render(
    stats: &Stats,
    backends: &[BackendView],
    cluster: Option<&ClusterView>,
    certificates: &[CertificateView],
    foyer: &Registry,
) -> String {
    let mut families: BTreeMap<&str, Vec<(&Field, u64)>> = BTreeMap::new();
    for (_, field, value) in stats.values() {
        families
            .entry(field.metric)
            .or_default()
            .push((field, value));
    }
    let registry = Registry::new();
    for (name, members) in families {
        registry
            .register(family(name, &members))
            .expect("family names are unique and valid (checked by the wire crate's tests)");
    }
    let uptime = IntGauge::new("lacquer_uptime_seconds", "Seconds since lacquerd started.")
        .expect("valid metric");
    uptime.set(stats.uptime_seconds as i64);
    let info = IntGaugeVec::new(
        Opts::new("lacquer_build_info", "Always 1; the version in a label."),
        &["version"],
    )
    .expect("valid metric");
    info.with_label_values(&[stats.version.as_str()]).set(1);
    let rules = IntCounterVec::new(
        Opts::new(RULE_MATCHES_METRIC, RULE_MATCHES_HELP),
        &["rule", "phase"],
    )
    .expect("valid metric");
    for r in &stats.rules {
        rules
            .with_label_values(&[r.rule.as_str(), r.phase.as_str()])
            .inc_by(r.matched);
    }
    for extra in [
        Box::new(uptime) as Box<dyn Collector>,
        Box::new(info),
        Box::new(rules),
    ] {
        registry.register(extra).expect("unique names");
    }
    for extra in listener_families(stats) {
        registry.register(extra).expect("unique names");
    }
    if let Some(view) = cluster {
        for extra in cluster_gauges(view) {
            registry.register(extra).expect("unique names");
        }
    }
    for extra in backend_families(backends) {
        registry.register(extra).expect("unique names");
    }
    if !certificates.is_empty() {
        for extra in certificate_families(certificates) {
            registry.register(extra).expect("unique names");
        }
    }
    let mut gathered = registry.gather();
    gathered.extend(latency_families(stats, backends));
    gathered.sort_by(|a, b| a.name().cmp(b.name()));
    gathered.extend(foyer.gather());
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&gathered, &mut out)
        .expect("the text format encodes any gathered family");
    String::from_utf8(out).expect("the text format is UTF-8")
}

/// The cluster's gauges: what an alert on a node that cannot vouch for its objects, or on a shrinking
/// ring, needs.
fn cluster_gauges(view: &ClusterView) -> Vec<Box<dyn Collector>> {
    let gauge = |name: &str, help: &str, value: u64| {
        let g = IntGauge::new(name, help).expect("valid metric");
        g.set(value as i64);
        Box::new(g) as Box<dyn Collector>
    };
    let lagging = !matches!(
        view.state,
        ClusterState::Serving | ClusterState::Disconnected
    );
    vec![
        gauge(
            "lacquer_cluster_members",
            "Live members of the cluster, as this node sees them.",
            view.members.len() as u64,
        ),
        gauge(
            "lacquer_cluster_applied_revision",
            "The last etcd revision of the invalidation log applied on this node.",
            view.applied_revision,
        ),
        gauge(
            "lacquer_cluster_lag_revisions",
            "Revisions of the invalidation log known and not yet applied on this node.",
            view.lag_revisions,
        ),
        gauge(
            "lacquer_cluster_lagging",
            "1 while this node cannot vouch for having every invalidation (catching up, or cut off past max_invalidation_lag): stored objects are revalidated.",
            u64::from(lagging),
        ),
    ]
}

/// The certificates kept by ACME, by their first domain: when each expires (what an alert on one left
/// unrenewed needs) and how their orders went.
fn certificate_families(certificates: &[CertificateView]) -> Vec<Box<dyn Collector>> {
    let expiry = IntGaugeVec::new(
        Opts::new(
            "lacquer_certificate_expiry_timestamp_seconds",
            "When the certificate served for a domain expires (Unix seconds), for each certificate obtained by ACME that is held.",
        ),
        &["certificate"],
    )
    .expect("valid metric");
    let orders = IntCounterVec::new(
        Opts::new(
            "lacquer_acme_orders_total",
            "ACME orders since start, by certificate and result (succeeded, failed).",
        ),
        &["certificate", "result"],
    )
    .expect("valid metric");
    for c in certificates {
        let name = c.domains.first().map_or("", String::as_str);
        if let Some(held) = &c.held {
            expiry.with_label_values(&[name]).set(held.not_after as i64);
        }
        orders
            .with_label_values(&[name, "succeeded"])
            .inc_by(c.orders_succeeded);
        orders
            .with_label_values(&[name, "failed"])
            .inc_by(c.orders_failed);
    }
    vec![Box::new(expiry), Box::new(orders)]
}

/// Client responses by status code, and each backend's traffic: what a per-backend panel or a 5xx alert
/// needs. None without backends (the client responses' family is always there).
fn backend_families(backends: &[BackendView]) -> Vec<Box<dyn Collector>> {
    let counter = |name: &str, help: &str, labels: &[&str]| {
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
    };
    let responses = counter(
        "lacquer_backend_responses_total",
        "Response heads from each backend, by status code.",
        &["backend", "code"],
    );
    let failures = counter(
        "lacquer_backend_failures_total",
        "Failed exchanges with each backend: no connection, a timeout, a 5xx answer, a body that broke off.",
        &["backend"],
    );
    let connections = counter(
        "lacquer_backend_connections_opened_total",
        "Connections opened to each backend (not the probe's).",
        &["backend"],
    );
    let up = IntGaugeVec::new(
        Opts::new(
            "lacquer_backend_up",
            "1 while requests may go to the backend (healthy, or not known to fail), 0 while it is sick or failing.",
        ),
        &["backend"],
    )
    .expect("valid metric");
    for b in backends {
        let name = b.name.as_str();
        for (code, n) in &b.responses {
            responses
                .with_label_values(&[name, &code.to_string()])
                .inc_by(*n);
        }
        failures.with_label_values(&[name]).inc_by(b.errors);
        connections.with_label_values(&[name]).inc_by(b.connections);
        let healthy = matches!(b.health, BackendHealth::Healthy | BackendHealth::Unknown);
        up.with_label_values(&[name]).set(i64::from(healthy));
    }
    if backends.is_empty() {
        return Vec::new();
    }
    vec![
        Box::new(responses),
        Box::new(failures),
        Box::new(connections),
        Box::new(up),
    ]
}

/// The latency histograms: the client side's by cache outcome, each backend's, and client responses by
/// status code. Built as families, not collectors: the prometheus crate's histograms only observe, and
/// these are counted by the data path.
fn latency_families(stats: &Stats, backends: &[BackendView]) -> Vec<MetricFamily> {
    let client = |name: &str, help: &str, pick: fn(&lacquer_admin::wire::Latency) -> &Histogram| {
        histogram_family(
            name,
            help,
            stats
                .latency
                .iter()
                .map(|l| (vec![("outcome", l.outcome.as_str())], pick(&l.latency))),
        )
    };
    let backend =
        |name: &str, help: &str, pick: fn(&lacquer_admin::wire::Latency) -> &Histogram| {
            histogram_family(
                name,
                help,
                backends
                    .iter()
                    .map(|b| (vec![("backend", b.name.as_str())], pick(&b.latency))),
            )
        };
    let mut responses = MetricFamily::default();
    responses.set_name("lacquer_client_responses_total".into());
    responses.set_help("Responses sent to clients, by status code.".into());
    responses.set_field_type(MetricType::COUNTER);
    for (code, n) in &stats.responses {
        let mut counter = proto::Counter::default();
        counter.set_value(*n as f64);
        let mut metric = proto::Metric::from_label(vec![label("code", &code.to_string())]);
        metric.set_counter(counter);
        responses.mut_metric().push(metric);
    }
    [
        client(
            "lacquer_client_ttfb_seconds",
            "Time from a client request's arrival to its response head, by cache outcome.",
            |l| &l.ttfb,
        ),
        client(
            "lacquer_client_duration_seconds",
            "Time from a client request's arrival to the end of its response body, by cache outcome.",
            |l| &l.total,
        ),
        backend(
            "lacquer_backend_ttfb_seconds",
            "Time from sending a request to a backend to its response head.",
            |l| &l.ttfb,
        ),
        backend(
            "lacquer_backend_duration_seconds",
            "Time from sending a request to a backend to the end of its response body (bodies read to the end).",
            |l| &l.total,
        ),
        responses,
    ]
    .into_iter()
    .filter(|f| !f.get_metric().is_empty())
    .collect()
}

/// One histogram family, a series per label set.
fn histogram_family<'a>(
    name: &str,
    help: &str,
    series: impl Iterator<Item = (Vec<(&'a str, &'a str)>, &'a Histogram)>,
) -> MetricFamily {
    let mut family = MetricFamily::default();
    family.set_name(name.into());
    family.set_help(help.into());
    family.set_field_type(MetricType::HISTOGRAM);
    for (labels, h) in series {
        let mut cumulative = 0;
        let buckets = LATENCY_BOUNDS_US
            .iter()
            .zip(&h.counts)
            .map(|(bound, n)| {
                cumulative += n;
                let mut b = proto::Bucket::default();
                b.set_upper_bound(*bound as f64 / 1e6);
                b.set_cumulative_count(cumulative);
                b
            })
            .collect();
        let mut histogram = proto::Histogram::default();
        histogram.set_bucket(buckets);
        histogram.set_sample_count(h.count());
        histogram.set_sample_sum(h.sum_us as f64 / 1e6);
        let mut metric =
            proto::Metric::from_label(labels.into_iter().map(|(k, v)| label(k, v)).collect());
        metric.set_histogram(histogram);
        family.mut_metric().push(metric);
    }
    family
}

fn label(name: &str, value: &str) -> proto::LabelPair {
    let mut pair = proto::LabelPair::default();
    pair.set_name(name.into());
    pair.set_value(value.into());
    pair
}

/// The per-listener families: each of [`lacquer_admin::wire::ListenerCounters`]' series once per listener, labelled with its
/// address. None without listeners.
fn listener_families(stats: &Stats) -> Vec<Box<dyn Collector>> {
    let mut families: BTreeMap<&str, IntCounterVec> = BTreeMap::new();
    for listener in &stats.listeners {
        for (field, value) in listener.counters.values() {
            let family = families.entry(field.metric).or_insert_with(|| {
                let help = LISTENER_FAMILY_HELP
                    .iter()
                    .find(|(n, _)| *n == field.metric)
                    .map_or_else(|| field.help(), |(_, h)| (*h).to_owned());
                let labels: Vec<&str> = std::iter::once(LISTENER_LABEL)
                    .chain(field.labels.iter().map(|(k, _)| *k))
                    .collect();
                IntCounterVec::new(Opts::new(field.metric, help), &labels).expect("valid metric")
            });
            let labels: Vec<&str> = std::iter::once(listener.address.as_str())
                .chain(field.labels.iter().map(|(_, v)| *v))
                .collect();
            family.with_label_values(&labels).inc_by(value);
        }
    }
    families
        .into_values()
        .map(|f| Box::new(f) as Box<dyn Collector>)
        .collect()
}

/// One metric family: a plain counter or gauge, or a vector of them when its members carry labels.
fn family(name: &str, members: &[(&Field, u64)]) -> Box<dyn Collector> {
    let (first, value) = members[0];
    let labels: Vec<&str> = first.labels.iter().map(|(k, _)| *k).collect();
    let help = FAMILY_HELP
        .iter()
        .find(|(n, _)| *n == name)
        .map_or_else(|| first.help(), |(_, h)| (*h).to_owned());
    let opts = Opts::new(name, help);
    let label_values = |f: &Field| f.labels.iter().map(|(_, v)| *v).collect::<Vec<_>>();
    match (first.kind, labels.is_empty()) {
        (Kind::Counter, true) => {
            let c = IntCounter::with_opts(opts).expect("valid metric");
            c.inc_by(value);
            Box::new(c)
        }
        (Kind::Gauge, true) => {
            let g = IntGauge::with_opts(opts).expect("valid metric");
            g.set(value as i64);
            Box::new(g)
        }
        (Kind::Counter, false) => {
            let v = IntCounterVec::new(opts, &labels).expect("valid metric");
            for (field, value) in members {
                v.with_label_values(&label_values(field)).inc_by(*value);
            }
            Box::new(v)
        }
        (Kind::Gauge, false) => {
            let v = IntGaugeVec::new(opts, &labels).expect("valid metric");
            for (field, value) in members {
                v.with_label_values(&label_values(field)).set(*value as i64);
            }
            Box::new(v)
        }
    }
}

#[cfg(test)]
mod tests {
    use lacquer_admin::wire::{
        ListenerCounters, ListenerStats, ProxyStats, RuleMatches, StoreStats,
    };

    use super::*;

    #[test]
    fn every_value_is_a_sample_with_help_and_type() {
        let stats = Stats {
            version: "1.2.3".into(),
            uptime_seconds: 42,
            proxy: ProxyStats {
                hits: 7,
                misses: 3,
                hits_disk: 2,
                ..Default::default()
            },
            store: StoreStats {
                objects: 11,
                ..Default::default()
            },
            rules: vec![
                RuleMatches {
                    rule: "static".into(),
                    phase: "request".into(),
                    matched: 4,
                },
                RuleMatches {
                    rule: "rule[1]".into(),
                    phase: "deliver".into(),
                    matched: 0,
                },
            ],
            listeners: vec![
                ListenerStats {
                    address: "0.0.0.0:443".into(),
                    tls: true,
                    quic: true,
                    counters: ListenerCounters {
                        requests_http3: 5,
                        quic_errors_reset: 1,
                        ..Default::default()
                    },
                },
                ListenerStats {
                    address: "[::]:80".into(),
                    counters: ListenerCounters {
                        bytes_out_http1: 900,
                        ..Default::default()
                    },
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let text = render(&stats, &[], None, &[], &Registry::new());
        for line in [
            "# TYPE lacquer_cache_requests_total counter",
            "lacquer_cache_requests_total{result=\"hit\"} 7",
            "lacquer_cache_requests_total{result=\"miss\"} 3",
            "lacquer_cache_hits_total{tier=\"disk\"} 2",
            "# TYPE lacquer_store_objects gauge",
            "lacquer_store_objects 11",
            "lacquer_uptime_seconds 42",
            "lacquer_build_info{version=\"1.2.3\"} 1",
            "# HELP lacquer_client_requests_total Client requests received.",
            "# TYPE lacquer_rule_matches_total counter",
            "lacquer_rule_matches_total{phase=\"request\",rule=\"static\"} 4",
            "lacquer_rule_matches_total{phase=\"deliver\",rule=\"rule[1]\"} 0",
            "# TYPE lacquer_listener_requests_total counter",
            "lacquer_listener_requests_total{listener=\"0.0.0.0:443\",protocol=\"http3\"} 5",
            "lacquer_listener_requests_total{listener=\"[::]:80\",protocol=\"http3\"} 0",
            "lacquer_listener_sent_bytes_total{listener=\"[::]:80\",protocol=\"http1\"} 900",
            "lacquer_listener_quic_connection_errors_total{kind=\"reset\",listener=\"0.0.0.0:443\"} 1",
            "lacquer_listener_connections_total{listener=\"[::]:80\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from:\n{text}"
            );
        }
        let samples = text.lines().filter(|l| !l.starts_with('#')).count();
        let per_listener = ListenerCounters::FIELDS.len() * stats.listeners.len();
        assert_eq!(
            samples,
            stats.values().count() + 2 + stats.rules.len() + per_listener
        );
    }

    #[test]
    fn latency_is_a_histogram_per_outcome_and_per_backend() {
        let mut counts = vec![0; lacquer_admin::wire::LATENCY_BUCKETS];
        counts[0] = 3;
        counts[5] = 2;
        counts[lacquer_admin::wire::LATENCY_BUCKETS - 1] = 1;
        let h = Histogram {
            counts,
            sum_us: 31_500_000,
        };
        let latency = lacquer_admin::wire::Latency {
            ttfb: h.clone(),
            total: Histogram::default(),
        };
        let stats = Stats {
            latency: vec![lacquer_admin::wire::OutcomeLatency {
                outcome: "hit".into(),
                latency: latency.clone(),
            }],
            responses: [(200, 5), (503, 1)].into(),
            ..Default::default()
        };
        let backend = BackendView {
            name: "api \"v2\"".into(),
            address: "127.0.0.1:8080".into(),
            health: BackendHealth::Sick,
            admin: Default::default(),
            requests: 6,
            errors: 1,
            consecutive_failures: 1,
            last_success: None,
            last_error: None,
            probe: None,
            connections: 2,
            streams_reset: 0,
            responses: [(200, 5), (502, 1)].into(),
            latency,
        };
        let text = render(&stats, &[backend], None, &[], &Registry::new());
        for line in [
            "# TYPE lacquer_client_ttfb_seconds histogram",
            "lacquer_client_ttfb_seconds_bucket{outcome=\"hit\",le=\"0.000025\"} 3",
            "lacquer_client_ttfb_seconds_bucket{outcome=\"hit\",le=\"0.0005\"} 3",
            "lacquer_client_ttfb_seconds_bucket{outcome=\"hit\",le=\"0.001\"} 5",
            "lacquer_client_ttfb_seconds_bucket{outcome=\"hit\",le=\"30\"} 5",
            "lacquer_client_ttfb_seconds_bucket{outcome=\"hit\",le=\"+Inf\"} 6",
            "lacquer_client_ttfb_seconds_sum{outcome=\"hit\"} 31.5",
            "lacquer_client_ttfb_seconds_count{outcome=\"hit\"} 6",
            "lacquer_client_duration_seconds_count{outcome=\"hit\"} 0",
            "lacquer_client_responses_total{code=\"503\"} 1",
            "lacquer_backend_ttfb_seconds_count{backend=\"api \\\"v2\\\"\"} 6",
            "lacquer_backend_responses_total{backend=\"api \\\"v2\\\"\",code=\"502\"} 1",
            "lacquer_backend_failures_total{backend=\"api \\\"v2\\\"\"} 1",
            "lacquer_backend_up{backend=\"api \\\"v2\\\"\"} 0",
            "lacquer_backend_connections_opened_total{backend=\"api \\\"v2\\\"\"} 2",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from:\n{text}"
            );
        }
        let parsed = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
            .expect("the text format parses");
        assert!(parsed
            .samples
            .iter()
            .any(|s| s.metric == "lacquer_backend_duration_seconds_count"));
    }

    #[test]
    fn no_rules_no_rule_family() {
        let text = render(&Stats::default(), &[], None, &[], &Registry::new());
        assert!(!text.contains(RULE_MATCHES_METRIC), "{text}");
        assert!(!text.contains("lacquer_listener_"), "{text}");
    }
}
