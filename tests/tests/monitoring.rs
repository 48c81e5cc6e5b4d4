//! The Grafana dashboard and Prometheus alert rules the package ships ask only for what `/metrics`
//! exposes: a renamed metric would leave an empty panel or an alert that can never fire, silently.

use std::{collections::BTreeSet, path::PathBuf};

use http::Method;
use lacquer_tests::{get, request, Daemon, Origin, Reply};
use promql_parser::{
    parser::{self, Expr},
    util::{walk_expr, ExprVisitor},
};
use serde_json::Value;

/// Made by Prometheus itself for every scrape target, never by lacquerd.
const PROMETHEUS_OWN: &[&str] = &["up"];

fn packaging(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging")
        .join(file)
}

/// Every series name on a scrape, histograms' and summaries' `_bucket`, `_sum` and `_count` included,
/// since those are what PromQL names.
async fn exposed_names(d: &Daemon) -> BTreeSet<String> {
    let auth = format!("Bearer {}", d.secret());
    let reply = request(
        d.admin,
        Method::GET,
        "/metrics",
        &[("authorization", auth.as_str())],
        Default::default(),
    )
    .await
    .expect("admin request");
    assert_eq!(reply.status, 200);
    let text = String::from_utf8(reply.body.to_vec()).expect("UTF-8");
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            l.split(['{', ' '])
                .next()
                .expect("a sample line starts with its name")
                .to_owned()
        })
        .collect()
}

/// Grafana replaces its variables before Prometheus sees a query; any value that parses will do here.
fn substitute(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m")
        .replace("$__interval", "1m")
        .replace("$__range", "1h")
        .replace("${instance}", "x")
        .replace("$instance", "x")
}

struct Names(BTreeSet<String>);

impl ExprVisitor for Names {
    type Error = std::convert::Infallible;

    fn pre_visit(&mut self, expr: &Expr) -> Result<bool, Self::Error> {
        let selector = match expr {
            Expr::VectorSelector(vs) => Some(vs),
            Expr::MatrixSelector(ms) => Some(&ms.vs),
            _ => None,
        };
        if let Some(vs) = selector {
            // A selector by `{__name__=...}` alone has no name here; the shipped files never use one.
            let name = vs.name.clone().expect("every selector names its metric");
            self.0.insert(name);
        }
        Ok(true)
    }
}

/// The metric names `expr` selects, or why it does not parse.
fn selected(expr: &str) -> Result<BTreeSet<String>, String> {
    let ast = parser::parse(&substitute(expr))?;
    let mut names = Names(BTreeSet::new());
    let Ok(_) = walk_expr(&mut names, &ast);
    Ok(names.0)
}

/// Every panel, those inside rows (collapsed rows keep theirs in `panels`) included.
fn panels(list: &Value, out: &mut Vec<Value>) {
    for panel in list.as_array().expect("panels is a list") {
        if panel["type"] == "row" {
            panels(&panel["panels"], out);
        } else {
            out.push(panel.clone());
        }
    }
}

fn check(source: &str, expr: &str, exposed: &BTreeSet<String>, problems: &mut Vec<String>) {
    match selected(expr) {
        Err(e) => problems.push(format!("{source}: `{expr}` does not parse: {e}")),
        Ok(names) => {
            for name in names {
                if !exposed.contains(&name) && !PROMETHEUS_OWN.contains(&name.as_str()) {
                    problems.push(format!(
                        "{source}: `{expr}` asks for {name}, which /metrics does not expose"
                    ));
                }
            }
        }
    }
}

/// The series a daemon with `acme` adds: one holding a kept certificate (its CA is never reached).
async fn acme_names(origin: std::net::SocketAddr) -> BTreeSet<String> {
    let config = r#"
        [[listen]]
        address = "127.0.0.1:0"
        [[listen]]
        address = "127.0.0.1:0"
        acme = { domains = ["shop.test"], directory = "https://127.0.0.1:9/dir" }
        "#;
    let mut d = Daemon::with_config(origin, config);
    let reply = d.admin_get("/v1/certificates", Some(&d.secret())).await;
    let list: Value = serde_json::from_slice(&reply.body).unwrap();
    let file = PathBuf::from(list["certificates"][0]["file"].as_str().unwrap());
    d.stop();
    let made = rcgen::generate_simple_self_signed(vec!["shop.test".to_owned()]).unwrap();
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, made.cert.pem() + &made.signing_key.serialize_pem()).unwrap();
    let d = d.restart();
    exposed_names(&d).await
}

#[tokio::test(flavor = "multi_thread")]
async fn dashboard_and_alerts_ask_only_for_exposed_metrics() {
    let origin = Origin::start(|_| Reply::ok("body").header("cache-control", "max-age=60")).await;
    let d = Daemon::start(origin.addr, &[]);
    // A miss and a hit, so that the labelled families carry the series the queries select.
    for path in ["/a", "/a"] {
        get(d.addr, path).await;
    }
    let mut exposed = exposed_names(&d).await;
    exposed.extend(acme_names(origin.addr).await);
    for name in [
        "lacquer_cache_requests_total",
        "lacquer_client_ttfb_seconds_bucket",
        "lacquer_backend_ttfb_seconds_bucket",
        "lacquer_backend_responses_total",
        "lacquer_client_responses_total",
    ] {
        assert!(exposed.contains(name), "{name} not in {exposed:?}");
    }
    let mut problems = Vec::new();

    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(packaging("grafana-dashboard.json")).expect("dashboard"),
    )
    .expect("the dashboard is JSON");
    let mut all = Vec::new();
    panels(&dashboard["panels"], &mut all);
    assert!(!all.is_empty(), "the dashboard has panels");
    for panel in &all {
        let title = panel["title"].as_str().unwrap_or("(untitled)");
        let targets = panel["targets"].as_array().map_or(&[][..], Vec::as_slice);
        if targets.is_empty() {
            problems.push(format!("panel {title:?} has no query"));
        }
        for target in targets {
            let expr = target["expr"].as_str().unwrap_or_default();
            check(&format!("panel {title:?}"), expr, &exposed, &mut problems);
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        if let Some(query) = variable["query"]["query"].as_str() {
            // `label_values(metric, label)` is Grafana's, not PromQL: its metric is what must exist.
            let metric = query
                .strip_prefix("label_values(")
                .and_then(|rest| rest.split(',').next())
                .unwrap_or(query);
            check(
                &format!("variable {}", variable["name"]),
                metric,
                &exposed,
                &mut problems,
            );
        }
    }

    let rules: serde_norway::Value = serde_norway::from_str(
        &std::fs::read_to_string(packaging("prometheus-alerts.yml")).expect("alert rules"),
    )
    .expect("the alert rules are YAML");
    let mut alerts = 0;
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().expect("every rule is an alert");
            alerts += 1;
            for (what, present) in [
                ("for", rule["for"].as_str().is_some()),
                (
                    "labels.severity",
                    rule["labels"]["severity"].as_str().is_some(),
                ),
                (
                    "annotations.summary",
                    rule["annotations"]["summary"].as_str().is_some(),
                ),
                (
                    "annotations.description",
                    rule["annotations"]["description"].as_str().is_some(),
                ),
            ] {
                if !present {
                    problems.push(format!("alert {name} has no {what}"));
                }
            }
            let expr = rule["expr"].as_str().expect("every alert has an expr");
            check(&format!("alert {name}"), expr, &exposed, &mut problems);
        }
    }
    assert!(alerts > 0, "the rules file has alerts");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
