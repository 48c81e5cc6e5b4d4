//! `GET /metrics`: every stats value in Prometheus' text format, under the names declared with the wire
//! types, followed by foyer's own metrics.

use std::collections::BTreeMap;

use lacquer_admin::wire::{
    ClusterState, ClusterView, Field, Kind, Stats, FAMILY_HELP, LISTENER_FAMILY_HELP,
    LISTENER_LABEL, RULE_MATCHES_HELP, RULE_MATCHES_METRIC,
};
use prometheus::{
    core::Collector, Encoder, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// The media type of Prometheus' text exposition format, the version `render` writes.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Renders `stats`, the cluster's gauges when this node is in one, and the metrics in `foyer`.
pub fn render(stats: &Stats, cluster: Option<&ClusterView>, foyer: &Registry) -> String {
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
    let mut gathered = registry.gather();
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
        };
        let text = render(&stats, None, &Registry::new());
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
    fn no_rules_no_rule_family() {
        let text = render(&Stats::default(), None, &Registry::new());
        assert!(!text.contains(RULE_MATCHES_METRIC), "{text}");
        assert!(!text.contains("lacquer_listener_"), "{text}");
    }
}
