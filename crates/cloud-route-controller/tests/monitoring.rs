//! `deploy/monitoring/`: the alerting rules pass `promtool check rules` (as a
//! plain rules file and as the PrometheusRule's groups, which are the same),
//! the alerts an operator needs are there, the dashboard's queries are valid
//! PromQL, every metric the dashboard and the rules use is served by
//! `/metrics` of a running controller, and every query of the dashboard and
//! of the docs returns series from it, scraped as the chart's monitors do.
//!
//! `promtool` is built from its Go module by `scripts/build-gotool.sh
//! promtool` (once per machine; `scripts/test.sh` does it in its tools step).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Controller, TempDir, free_port};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::Api;
use kube::api::PostParams;
use serde_json::Value;
use test_cluster::{ClusterGuard, TestCluster, TestNode, wait_until};

fn monitoring(file: &str) -> PathBuf {
    common::repo().join("deploy/monitoring").join(file)
}

/// The promtool binary from the per-machine tools cache (built on first use).
fn promtool() -> PathBuf {
    common::gotool("promtool")
}

fn yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

fn rules_file() -> Value {
    yaml(&monitoring("alerts.rules.yaml"))
}

fn dashboard() -> Value {
    let path = monitoring("grafana-dashboard.json");
    let text = std::fs::read_to_string(&path).expect("dashboard");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// `promtool check rules FILE`: stdout on success, a panic with its output otherwise.
fn check_rules(promtool: &Path, file: &Path) -> String {
    let out = Command::new(promtool)
        .args(["check", "rules"])
        .arg(file)
        .output()
        .expect("run promtool");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "promtool check rules {file:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn alert_rules(rules: &Value) -> Vec<Value> {
    rules["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").clone())
        .collect()
}

/// Every PromQL expression of the dashboard, with Grafana's variables
/// replaced by what Grafana would send.
fn dashboard_exprs() -> Vec<String> {
    let d = dashboard();
    let mut exprs = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().expect("targets") {
            let e = t["expr"].as_str().expect("expr");
            exprs.push(
                e.replace("$__rate_interval", "5m")
                    .replace("$job", ".*")
                    .to_string(),
            );
        }
    }
    exprs
}

/// `route_controller_*` names in a PromQL expression.
fn metric_names(expr: &str, into: &mut BTreeSet<String>) {
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("route_controller_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        into.insert(expr[start..end].to_string());
        i = end;
    }
}

/// The sample names a `/metrics` text can contain, from its `# TYPE` lines
/// and its samples: counters end in `_total`, histograms have `_bucket`,
/// `_sum` and `_count`, an info metric is `<name>_info`.
fn exposed_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            let (Some(name), Some(kind)) = (it.next(), it.next()) else {
                continue;
            };
            match kind {
                "counter" => {
                    names.insert(format!("{}_total", name.trim_end_matches("_total")));
                }
                "histogram" => {
                    for s in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{name}{s}"));
                    }
                }
                "info" => {
                    names.insert(format!("{name}_info"));
                }
                _ => {
                    names.insert(name.to_string());
                }
            }
        } else if !line.starts_with('#')
            && let Some(name) = line.split(['{', ' ']).next().filter(|n| !n.is_empty())
        {
            names.insert(name.to_string());
        }
    }
    names
}

#[test]
fn the_alert_rules_pass_promtool_check_rules() {
    let promtool = promtool();
    let n = alert_rules(&rules_file()).len();
    let out = check_rules(&promtool, &monitoring("alerts.rules.yaml"));
    assert!(out.contains(&format!("SUCCESS: {n} rules found")), "{out}");

    // The PrometheusRule's spec is a rules file too.
    let pr = yaml(&monitoring("prometheusrule.yaml"));
    let dir = TempDir::new("promrule");
    let spec = dir.path().join("prometheusrule-spec.yaml");
    std::fs::write(&spec, serde_yaml_ng::to_string(&pr["spec"]).expect("YAML")).expect("write");
    let out = check_rules(&promtool, &spec);
    assert!(out.contains(&format!("SUCCESS: {n} rules found")), "{out}");
}

/// `promtool test rules` of `dir/alerts.test.yaml`: whether it passed, and its output.
fn test_rules(dir: &Path) -> (bool, String) {
    let out = Command::new(promtool())
        .args(["test", "rules", "alerts.test.yaml"])
        .current_dir(dir)
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_headroom_and_quota_alerts_fire_as_their_promtool_unit_tests_say() {
    let (ok, out) = test_rules(&monitoring(""));
    assert!(ok, "{out}");
    // The unit tests can fail: with the headroom threshold at 90 %, 82 %
    // no longer fires and the test says so.
    let dir = TempDir::new("promtest");
    let rules = std::fs::read_to_string(monitoring("alerts.rules.yaml")).expect("rules");
    let moved = rules.replace(") > 0.8\n", ") > 0.9\n");
    assert_ne!(moved, rules, "the threshold is where this test expects it");
    std::fs::write(dir.path().join("alerts.rules.yaml"), moved).expect("write");
    std::fs::copy(
        monitoring("alerts.test.yaml"),
        dir.path().join("alerts.test.yaml"),
    )
    .expect("copy");
    let (ok, out) = test_rules(dir.path());
    assert!(
        !ok && out.contains("CloudRouteControllerRouteTableNearlyFull"),
        "{out}"
    );
}

#[test]
fn promtool_check_rules_rejects_a_broken_rule() {
    // Pins that the check above can fail: a syntax error and a rule with an
    // unknown field are both refused.
    let promtool = promtool();
    let dir = TempDir::new("promrule-bad");
    for (name, text) in [
        (
            "syntax",
            "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: sum(rate(x[5m]) > 1\n",
        ),
        (
            "field",
            "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up == 0\n    severity: page\n",
        ),
    ] {
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, text).expect("write");
        let out = Command::new(&promtool)
            .args(["check", "rules"])
            .arg(&file)
            .output()
            .expect("run promtool");
        assert!(!out.status.success(), "promtool accepted the {name} error");
    }
}

#[test]
fn the_prometheusrule_carries_the_same_groups_as_the_rules_file() {
    let pr = yaml(&monitoring("prometheusrule.yaml"));
    assert_eq!(pr["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(pr["kind"], "PrometheusRule");
    assert_eq!(pr["spec"], rules_file());
}

#[test]
fn the_rules_alert_on_no_leader_pending_routes_throttling_cloud_errors_and_warnings() {
    let rules = alert_rules(&rules_file());
    let find = |name: &str| {
        rules
            .iter()
            .find(|r| r["alert"] == name)
            .unwrap_or_else(|| panic!("no alert {name}"))
    };
    for (alert, metric) in [
        ("CloudRouteControllerNoLeader", "route_controller_leader"),
        (
            "CloudRouteControllerRoutesPending",
            "route_controller_pending_operations",
        ),
        (
            "CloudRouteControllerThrottled",
            "route_controller_throttle_wait_seconds_total",
        ),
        (
            "CloudRouteControllerCloudErrors",
            "route_controller_cloud_requests_total",
        ),
        (
            "CloudRouteControllerWarningEventsRising",
            "route_controller_warning_events_total",
        ),
        (
            "CloudRouteControllerRouteTableNearlyFull",
            "route_controller_route_table_route_limit",
        ),
        (
            "CloudRouteControllerRouteQuotaExceeded",
            "route_controller_nodes",
        ),
    ] {
        let r = find(alert);
        let expr = r["expr"].as_str().expect("expr");
        assert!(expr.contains(metric), "{alert} does not use {metric}");
        assert!(r["for"].is_string(), "{alert} fires on a single evaluation");
        assert!(r["labels"]["severity"].is_string(), "{alert}: no severity");
        assert!(
            r["annotations"]["summary"].is_string() && r["annotations"]["description"].is_string(),
            "{alert}: no summary or description"
        );
    }
    // No leader also covers "no controller scraped at all".
    assert!(
        find("CloudRouteControllerNoLeader")["expr"]
            .as_str()
            .is_some_and(|e| e.contains("absent(route_controller_leader)"))
    );
}

#[test]
fn the_dashboard_queries_are_valid_promql() {
    let d = dashboard();
    let panels = d["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_i64().expect("id")), "duplicate id");
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        assert!(
            !p["targets"].as_array().expect("targets").is_empty(),
            "{} has no query",
            p["title"]
        );
    }
    // promtool parses the queries exactly as Prometheus would: as recording rules.
    let dir = TempDir::new("dashboard-promql");
    let rules: Vec<Value> = dashboard_exprs()
        .into_iter()
        .enumerate()
        .map(|(i, e)| serde_json::json!({"record": format!("dashboard:query:{i}"), "expr": e}))
        .collect();
    let n = rules.len();
    let file = dir.path().join("dashboard.rules.json");
    std::fs::write(
        &file,
        serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]}).to_string(),
    )
    .expect("write");
    let out = check_rules(&promtool(), &file);
    assert!(out.contains(&format!("SUCCESS: {n} rules found")), "{out}");
}

/// A PromQL query a page gives in a ```promql block.
struct DocQuery {
    page: String,
    expr: String,
    /// The block says it returns nothing while all is well (a comment line
    /// with "nothing while"): it must evaluate, not return series.
    may_be_empty: bool,
}

/// Every ```promql block of README.md and docs/.
fn docs_queries() -> Vec<DocQuery> {
    let repo = common::repo();
    let mut pages = vec![repo.join("README.md")];
    let mut dirs = vec![repo.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read docs/") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    let mut queries = Vec::new();
    for page in pages {
        let text = std::fs::read_to_string(&page).expect("read the page");
        let mut block: Option<String> = None;
        for line in text.lines() {
            match (&mut block, line.trim_start()) {
                (None, l) if l.starts_with("```promql") => block = Some(String::new()),
                (Some(b), l) if l.starts_with("```") => {
                    queries.push(DocQuery {
                        page: page
                            .strip_prefix(&repo)
                            .unwrap_or(&page)
                            .display()
                            .to_string(),
                        may_be_empty: b.lines().any(|l| {
                            l.trim_start().starts_with('#') && l.contains("nothing while")
                        }),
                        expr: std::mem::take(b),
                    });
                    block = None;
                }
                (Some(b), _) => {
                    b.push_str(line);
                    b.push('\n');
                }
                (None, _) => {}
            }
        }
    }
    queries
}

/// The samples of a `/metrics` text as promtool series names, with the
/// labels Prometheus adds to a scraped target (`target`).
fn scraped_series(text: &str, target: &str) -> BTreeMap<String, String> {
    let mut series = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name_labels, value) = line.rsplit_once(' ').expect("a sample line");
        let series_name = match name_labels.split_once('{') {
            Some((name, labels)) => {
                let labels = labels.trim_end_matches('}');
                if labels.is_empty() {
                    format!("{name}{{{target}}}")
                } else {
                    format!("{name}{{{labels},{target}}}")
                }
            }
            None => format!("{name_labels}{{{target}}}"),
        };
        series.insert(series_name, value.to_string());
    }
    series
}

/// Runs each query over two scrapes a minute apart (the second one held for
/// four more minutes, as Prometheus would keep scraping it): a query passes
/// when it returns at least one series at minute 4, or, where the page says
/// so, evaluates at all. The failures, as promtool prints them.
fn run_queries(
    first: &BTreeMap<String, String>,
    second: &BTreeMap<String, String>,
    queries: &[(String, bool)],
) -> Result<(), String> {
    let dir = TempDir::new("promql-docs");
    let input: Vec<Value> = second
        .iter()
        .map(|(name, v)| {
            let before = first.get(name).map_or("_", String::as_str);
            serde_json::json!({"series": name, "values": format!("{before} {v} {v} {v} {v} {v}")})
        })
        .collect();
    let tests: Vec<Value> = queries
        .iter()
        .map(|(q, may_be_empty)| {
            if *may_be_empty {
                // Evaluates: absent() of the query is one series or none,
                // and either way this is one series of value 1.
                serde_json::json!({"expr": format!("count(absent({q})) or vector(1)"), "eval_time": "4m",
                    "exp_samples": [{"labels": "{}", "value": 1}]})
            } else {
                serde_json::json!({"expr": format!("count({q}) > bool 0"), "eval_time": "4m",
                    "exp_samples": [{"labels": "{}", "value": 1}]})
            }
        })
        .collect();
    let file = serde_json::json!({
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": input, "promql_expr_test": tests}],
    });
    std::fs::write(dir.path().join("queries.test.yaml"), file.to_string()).expect("write");
    let out = Command::new(promtool())
        .args(["test", "rules", "queries.test.yaml"])
        .current_dir(dir.path())
        .output()
        .expect("run promtool");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The token of `monitoring/<account>` that the API server mounts into
/// Prometheus's pod (the ServiceMonitor's bearerTokenFile), from a
/// TokenRequest.
async fn service_account_token(c: &ClusterGuard, account: &str) -> String {
    let namespaces: Api<Namespace> = Api::all(c.client());
    let _ = namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "monitoring"}}))
                .expect("a Namespace"),
        )
        .await;
    let accounts: Api<ServiceAccount> = Api::namespaced(c.client(), "monitoring");
    let _ = accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": account}}))
                .expect("a ServiceAccount"),
        )
        .await;
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .expect("TokenRequest")
        .status
        .expect("a token")
        .token
}

/// `kubectl apply` of `yaml` on the test cluster.
fn kubectl_apply(c: &ClusterGuard, yaml: &[u8]) -> String {
    let dir = TempDir::new("apply");
    let file = dir.path().join("objects.yaml");
    std::fs::write(&file, yaml).expect("write");
    let out = Command::new(c.kubectl_path().expect("kubectl"))
        .arg("--kubeconfig")
        .arg(c.kubeconfig_path())
        .args(["apply", "-f"])
        .arg(&file)
        .output()
        .expect("run kubectl");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    text
}

/// A controller on its secure port, with a certificate the test trusts.
fn start_secure(
    c: &ClusterGuard,
    dir: &TempDir,
    name: &str,
    cloud_config: &Path,
    extra: &[&str],
) -> (Controller, u16, rustls::pki_types::CertificateDer<'static>) {
    let port = free_port();
    let port_arg = port.to_string();
    let (cert, key) = (
        dir.path().join(format!("{name}.crt")),
        dir.path().join(format!("{name}.key")),
    );
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).expect("rcgen");
    std::fs::write(&key, made.signing_key.serialize_pem()).expect("write the key");
    std::fs::write(&cert, made.cert.pem()).expect("write the certificate");
    let mut args = vec![
        "--cluster-cidr",
        "10.244.0.0/16",
        "--cloud-provider",
        "memory",
        "--cloud-config",
        cloud_config.to_str().expect("utf-8 path"),
        "--leader-elect=false",
        "--secure-port",
        &port_arg,
        "--bind-address",
        "127.0.0.1",
        "--tls-cert-file",
        cert.to_str().expect("utf-8 path"),
        "--tls-private-key-file",
        key.to_str().expect("utf-8 path"),
    ];
    args.extend_from_slice(extra);
    let ctl = Controller::start(c.kubeconfig_path(), dir.path(), name, &args);
    (ctl, port, made.cert.der().clone())
}

/// What an operator reads on the dashboard and in the docs works on what
/// the controller serves, scraped the way the chart's monitors scrape it:
/// over HTTPS on the secure port, with the token of Prometheus's service
/// account, allowed by the chart's metrics-reader binding. Two replicas
/// are scraped, a writing one and a `--dry-run` shadow beside it (the
/// shadow mode's queries need its series), each with the target labels
/// Prometheus adds. Every metric the dashboard and the rules use is there,
/// and every query of the dashboard and of the docs' ```promql blocks
/// returns at least one series from the scrapes (promtool evaluates them
/// over the scraped samples), so a query whose metric, label or value no
/// longer exists fails here.
#[tokio::test]
async fn every_query_of_the_dashboard_and_the_docs_returns_series_scraped_through_the_charts_authentication()
 {
    let mut used = BTreeSet::new();
    let mut queries: Vec<(String, bool)> =
        dashboard_exprs().into_iter().map(|e| (e, false)).collect();
    for e in &queries {
        metric_names(&e.0, &mut used);
    }
    for r in alert_rules(&rules_file()) {
        metric_names(r["expr"].as_str().expect("expr"), &mut used);
    }
    for m in [
        "route_controller_leader",
        "route_controller_pending_operations",
        "route_controller_throttle_wait_seconds_total",
        "route_controller_cloud_requests_total",
        "route_controller_warning_events_total",
        "route_controller_node_route_latency_seconds_bucket",
    ] {
        assert!(used.contains(m), "{m} is not used: {used:?}");
    }
    let docs = docs_queries();
    assert!(
        docs.len() >= 4 && docs.iter().any(|q| q.page.contains("troubleshooting")),
        "the docs' ```promql blocks: {:?}",
        docs.iter().map(|q| &q.page).collect::<Vec<_>>()
    );
    for q in &docs {
        metric_names(&q.expr, &mut used);
        queries.push((q.expr.trim().to_string(), q.may_be_empty));
    }

    let c = TestCluster::acquire()
        .await
        .expect("the local control plane");
    // The chart's metrics reader, bound to Prometheus's service account,
    // exactly as `helm install` would create it.
    let rendered = Command::new(common::gotool("helm"))
        .args(["template", "cloud-route-controller"])
        .arg(common::repo().join("deploy/helm/cloud-route-controller"))
        .args([
            "-n",
            "kube-system",
            "--show-only",
            "templates/metrics-reader.yaml",
        ])
        .args(common::CHART_CLUSTER)
        .args([
            "--set",
            "monitoring.metricsReader.enabled=true",
            "--set",
            "monitoring.metricsReader.subjects[0].name=prometheus-docs-queries",
            "--set",
            "monitoring.metricsReader.subjects[0].namespace=monitoring",
        ])
        .output()
        .expect("run helm");
    assert!(
        rendered.status.success(),
        "{}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let token = service_account_token(&c, "prometheus-docs-queries").await;

    let dir = TempDir::new("monitoring-queries");
    // A route limit (the headroom gauges), and creations that fail now and
    // then (the error ratio and the retry gauges).
    let cloud = dir.path().join("memory.yaml");
    std::fs::write(
        &cloud,
        "max_routes: 50\nerror_rates:\n  create: {probability: 0.3, kind: transient}\nseed: 7\n",
    )
    .expect("write the cloud config");
    let shadow_cloud = dir.path().join("shadow.yaml");
    std::fs::write(&shadow_cloud, "max_routes: 50\n").expect("write the cloud config");
    let (writer, writer_port, writer_ca) = start_secure(&c, &dir, "writer", &cloud, &[]);
    // Its memory cloud is its own and empty: it disagrees, as a shadow does
    // until the routes are in its table.
    let (shadow, shadow_port, shadow_ca) =
        start_secure(&c, &dir, "shadow", &shadow_cloud, &["--dry-run"]);
    let scrape = |port: u16, ca: rustls::pki_types::CertificateDer<'static>| {
        let token = token.clone();
        async move { common::https_get(port, &ca, "/metrics", Some(&token)).await }
    };
    // Before the binding, the token is Prometheus's and nothing more: 403.
    let denied = wait_until(Duration::from_secs(60), "the secure port", || async {
        scrape(writer_port, writer_ca.clone())
            .await
            .ok()
            .map(|(code, _)| code)
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}: the writer's secure port\n{}\n{}",
            writer.log_text(),
            shadow.log_text()
        )
    });
    assert_eq!(denied, 403, "scraped without the metrics reader's grant");
    kubectl_apply(&c, &rendered.stdout);

    c.create_node(
        &TestNode::new("queries-0")
            .pod_cidrs(["10.244.50.0/24"])
            .internal_ip("10.0.50.10"),
    )
    .await
    .expect("create Node");
    c.create_node(
        &TestNode::new("queries-1")
            .pod_cidrs(["10.244.51.0/24"])
            .internal_ip("10.0.50.12"),
    )
    .await
    .expect("create Node");
    // Outside the cluster CIDR on a minority of Nodes: that Node's problem
    // (a Warning), not the setting's.
    c.create_node(
        &TestNode::new("queries-outside")
            .pod_cidrs(["192.168.50.0/24"])
            .internal_ip("10.0.50.11"),
    )
    .await
    .expect("create Node");

    let target = |instance: u16| {
        format!(
            r#"job="cloud-route-controller",namespace="kube-system",instance="127.0.0.1:{instance}""#
        )
    };
    let both = || async {
        let (wc, w) = scrape(writer_port, writer_ca.clone()).await.ok()?;
        let (sc, s) = scrape(shadow_port, shadow_ca.clone()).await.ok()?;
        (wc == 200 && sc == 200).then_some(())?;
        let mut series = scraped_series(&w, &target(writer_port));
        series.extend(scraped_series(&s, &target(shadow_port)));
        Some((w + &s, series))
    };
    // Families with labels appear with their first sample: wait until
    // every used name is served.
    let first = wait_until(
        Duration::from_secs(60),
        "every used metric in /metrics",
        || async {
            let (text, series) = both().await?;
            let exposed = exposed_names(&text);
            used.iter().all(|m| exposed.contains(m)).then_some(series)
        },
    )
    .await;
    let first = match first {
        Ok(s) => s,
        Err(e) => {
            let text = both().await.map(|(t, _)| t).unwrap_or_default();
            let exposed = exposed_names(&text);
            let missing: Vec<&String> = used.iter().filter(|m| !exposed.contains(*m)).collect();
            panic!(
                "{e}: used but not in /metrics: {missing:?}\n/metrics:\n{text}\n{}\n{}",
                writer.log_text(),
                shadow.log_text()
            );
        }
    };
    // The second scrape a few seconds on, so counters have moved; retried
    // until every query returns its series (a retry's first failure and the
    // shadow's first disagreement come within seconds).
    let last = std::sync::Mutex::new(String::new());
    let answered = wait_until(
        Duration::from_secs(60),
        "every query to return series",
        || async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let (_, second) = both().await?;
            run_queries(&first, &second, &queries)
                .map_err(|e| *last.lock().expect("lock") = e)
                .ok()
        },
    )
    .await;
    if let Err(e) = answered {
        let last = last.lock().expect("lock");
        panic!("{e}:\n{last}\n{}\n{}", writer.log_text(), shadow.log_text());
    }
    assert_eq!(writer.stop(), Some(0));
    assert_eq!(shadow.stop(), Some(0));
}

/// Pins that the query check can fail: a query on a label value no
/// controller serves, as the troubleshooting page once had.
#[test]
fn a_docs_query_on_a_label_value_nobody_serves_fails_the_query_check() {
    let target = r#"job="cloud-route-controller",namespace="kube-system",instance="127.0.0.1:1""#;
    let text = "# TYPE route_controller_cloud_requests_total counter\n\
        route_controller_cloud_requests_total{provider=\"aws\",operation=\"DescribeRouteTables\",result=\"ok\"} 3\n\
        route_controller_cloud_requests_total{provider=\"aws\",operation=\"DescribeRouteTables\",result=\"transient\"} 1\n";
    let series = scraped_series(text, target);
    let good =
        r#"sum by (operation) (rate(route_controller_cloud_requests_total{result!="ok"}[5m]))"#;
    let bad = r#"route_controller_cloud_requests_total{operation="list",result!="ok"}"#;
    assert_eq!(
        run_queries(&series, &series, &[(good.to_string(), false)]),
        Ok(())
    );
    let err = run_queries(&series, &series, &[(bad.to_string(), false)])
        .expect_err("a query on operation=\"list\" returns nothing");
    assert!(err.contains("operation"), "{err}");
    // Marked as empty while healthy, it only has to evaluate.
    assert_eq!(
        run_queries(&series, &series, &[(bad.to_string(), true)]),
        Ok(())
    );
}

/// The Prometheus Operator whose CRDs the PrometheusRule and PodMonitor are
/// checked against, fetched from the Go module proxy like the Go tools.
const PROMETHEUS_OPERATOR: &str = "github.com/prometheus-operator/prometheus-operator@v0.85.0";
const OPERATOR_CRDS: &[(&str, &str)] = &[
    (
        "monitoring.coreos.com_prometheusrules.yaml",
        "prometheusrules.monitoring.coreos.com",
    ),
    (
        "monitoring.coreos.com_podmonitors.yaml",
        "podmonitors.monitoring.coreos.com",
    ),
    (
        "monitoring.coreos.com_servicemonitors.yaml",
        "servicemonitors.monitoring.coreos.com",
    ),
];

/// The directory of the prometheus-operator module (downloaded on first use).
fn prometheus_operator_dir() -> PathBuf {
    let dir = TempDir::new("po-module");
    let out = Command::new("go")
        .args(["mod", "download", "-json", PROMETHEUS_OPERATOR])
        .current_dir(dir.path())
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .output()
        .expect("run go mod download");
    let info: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "go mod download {PROMETHEUS_OPERATOR}: {e}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        out.status.success() && info["Dir"].is_string(),
        "go mod download {PROMETHEUS_OPERATOR} failed: {info}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(info["Dir"].as_str().unwrap_or_default())
}

/// Deletes the CRDs (and so every object of theirs) however the test ends.
struct Crds {
    kubectl: PathBuf,
    kubeconfig: PathBuf,
}

impl Drop for Crds {
    fn drop(&mut self) {
        for (_, name) in OPERATOR_CRDS {
            let _ = Command::new(&self.kubectl)
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(["delete", "crd", name, "--ignore-not-found", "--wait=false"])
                .output();
        }
    }
}

#[tokio::test]
async fn the_prometheusrule_and_podmonitor_apply_against_the_operators_crds() {
    let c = TestCluster::acquire()
        .await
        .expect("the local control plane");
    let kubeconfig = c.kubeconfig_path().to_owned();
    let kubectl_bin = c.kubectl_path().expect("kubectl");
    let kubectl = |args: &[&str]| {
        let out = Command::new(&kubectl_bin)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .current_dir(common::repo())
            .output()
            .expect("run kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let crd_dir = prometheus_operator_dir().join("example/prometheus-operator-crd");
    let _crds = Crds {
        kubectl: kubectl_bin.clone(),
        kubeconfig: kubeconfig.clone(),
    };
    for (file, name) in OPERATOR_CRDS {
        let path = crd_dir.join(file);
        let path = path.to_str().expect("utf-8 path");
        // Server-side: the CRDs are too large for client-side apply's annotation.
        let (ok, out) = kubectl(&["apply", "--server-side", "-f", path]);
        assert!(ok, "{out}");
        // Regression: right after the apply a CRD can have no
        // `.status.conditions` yet, and `kubectl wait` then fails at once
        // ("accessor error: <nil> is of the type <nil>") instead of waiting.
        let crd = format!("crd/{name}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let (ok, out) =
                kubectl(&["wait", "--for=condition=Established", "--timeout=60s", &crd]);
            if ok {
                break;
            }
            assert!(
                out.contains("accessor error") && std::time::Instant::now() < deadline,
                "{out}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    // Prometheus's namespace, where the PodMonitor, its token Secret and
    // the reader's binding go (a cluster with Prometheus has it).
    let (ok, out) = kubectl(&["create", "namespace", "monitoring"]);
    assert!(ok || out.contains("AlreadyExists"), "{out}");
    // The README's commands, from the repository root.
    let files = [
        "-f",
        "deploy/monitoring/prometheusrule.yaml",
        "-f",
        "deploy/monitoring/metrics-reader.yaml",
        "-f",
        "deploy/monitoring/podmonitor.yaml",
    ];
    let (ok, out) = kubectl(&[&["apply", "--dry-run=server"][..], &files[..]].concat());
    assert!(ok, "{out}");
    assert!(
        out.contains(
            "prometheusrule.monitoring.coreos.com/cloud-route-controller created (server dry run)"
        ) && out.contains(
            "podmonitor.monitoring.coreos.com/cloud-route-controller created (server dry run)"
        ),
        "{out}"
    );
    let (ok, out) = kubectl(&[&["apply"][..], &files[..]].concat());
    assert!(ok, "{out}");
    let (ok, out) = kubectl(&[&["delete"][..], &files[..]].concat());
    assert!(ok, "{out}");

    // The chart's monitoring objects, rendered with every toggle on, apply
    // against the same CRDs.
    let rendered = Command::new(common::gotool("helm"))
        .args(["template", "cloud-route-controller"])
        .arg(common::repo().join("deploy/helm/cloud-route-controller"))
        .args([
            "-n",
            "kube-system",
            "--show-only",
            "templates/podmonitor.yaml",
            "--show-only",
            "templates/servicemonitor.yaml",
            "--show-only",
            "templates/prometheusrule.yaml",
            "--show-only",
            "templates/metrics-reader.yaml",
        ])
        .args(common::CHART_CLUSTER)
        .args(common::CHART_MONITORING_ON)
        .output()
        .expect("run helm");
    assert!(
        rendered.status.success(),
        "{}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let chart_dir = TempDir::new("chart-monitoring");
    let chart_file = chart_dir.path().join("monitoring.yaml");
    std::fs::write(&chart_file, &rendered.stdout).expect("write");
    let chart_file = chart_file.to_str().expect("utf-8 path");
    let (ok, out) = kubectl(&["apply", "--dry-run=server", "-f", chart_file]);
    assert!(ok, "{out}");
    for object in [
        "podmonitor.monitoring.coreos.com/cloud-route-controller",
        "servicemonitor.monitoring.coreos.com/cloud-route-controller",
        "prometheusrule.monitoring.coreos.com/cloud-route-controller",
        "service/cloud-route-controller-metrics",
        "clusterrole.rbac.authorization.k8s.io/cloud-route-controller-metrics-reader",
    ] {
        assert!(
            out.contains(&format!("{object} created (server dry run)")),
            "{object}: {out}"
        );
    }

    // The CRD's schema is really applied: a rule whose `for` is no duration is refused.
    let dir = TempDir::new("bad-promrule");
    let text = std::fs::read_to_string(monitoring("prometheusrule.yaml")).expect("read");
    let bad = text.replacen("for: 5m", "for: five minutes", 1);
    assert_ne!(bad, text);
    let bad_file = dir.path().join("bad.yaml");
    std::fs::write(&bad_file, bad).expect("write");
    let (ok, out) = kubectl(&[
        "apply",
        "--dry-run=server",
        "-f",
        bad_file.to_str().expect("utf-8 path"),
    ]);
    assert!(!ok, "an invalid `for` was accepted: {out}");
}
