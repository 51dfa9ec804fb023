//! `deploy/monitoring/`: the alerting rules pass `promtool check rules` (as a
//! plain rules file and as the PrometheusRule's groups, which are the same),
//! the alerts an operator needs are there, the dashboard's queries are valid
//! PromQL, and every metric the dashboard and the rules use is served by
//! `/metrics` of a running controller.
//!
//! `promtool` is built from its Go module by `scripts/build-gotool.sh
//! promtool` (once per machine; `scripts/test.sh` does it in its tools step).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Controller, TempDir, free_port, http_get_async};
use serde_json::Value;
use test_cluster::{TestCluster, TestNode, wait_until};

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

#[tokio::test]
async fn every_metric_the_dashboard_and_the_rules_use_is_served_by_a_running_controller() {
    let mut used = BTreeSet::new();
    for e in dashboard_exprs() {
        metric_names(&e, &mut used);
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
    // A --dry-run shadow serves these alone (the backlog alerts leave it
    // out by them); the reference page lists them.
    let reference =
        std::fs::read_to_string(common::repo().join("docs/reference/metrics.md")).expect("read");
    used.retain(|m| {
        if m.starts_with("route_controller_dry_run_") {
            assert!(
                reference.contains(m.as_str()),
                "{m} is not in the reference"
            );
            false
        } else {
            true
        }
    });

    // A controller that routed a Node and emitted a Warning, so that the
    // families that appear only with a first sample are there too.
    let c = TestCluster::acquire()
        .await
        .expect("the local control plane");
    let dir = TempDir::new("monitoring-metrics");
    let metrics = format!("127.0.0.1:{}", free_port());
    // A route limit, so the headroom gauges are served.
    let cloud = dir.path().join("memory.yaml");
    std::fs::write(&cloud, "max_routes: 50\n").expect("write the cloud config");
    let ctl = Controller::start(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "memory",
            "--cloud-config",
            cloud.to_str().expect("utf-8 path"),
            "--leader-elect=false",
            "--metrics-bind-address",
            &metrics,
        ],
    );
    c.create_node(
        &TestNode::new("monitoring-0")
            .pod_cidrs(["10.244.40.0/24"])
            .internal_ip("10.0.40.10"),
    )
    .await
    .expect("create Node");
    // A second Node inside: a pod CIDR outside the cluster CIDR on a
    // minority of Nodes is those Nodes' problem, on half of them the
    // setting's, which holds every change.
    c.create_node(
        &TestNode::new("monitoring-1")
            .pod_cidrs(["10.244.41.0/24"])
            .internal_ip("10.0.40.12"),
    )
    .await
    .expect("create Node");
    c.create_node(
        &TestNode::new("monitoring-outside")
            .pod_cidrs(["192.168.40.0/24"])
            .internal_ip("10.0.40.11"),
    )
    .await
    .expect("create Node");
    // Families with labels (and the pass metrics) appear with their first
    // sample, so wait until every used name is there or the time is up.
    let base = format!("http://{metrics}");
    let served = wait_until(
        Duration::from_secs(60),
        "every metric of deploy/monitoring in /metrics",
        || async {
            let text = http_get_async(&base, "/metrics").await?.1;
            let exposed = exposed_names(&text);
            used.iter().all(|m| exposed.contains(m)).then_some(())
        },
    )
    .await;
    if let Err(e) = served {
        let text = http_get_async(&base, "/metrics")
            .await
            .map(|(_, t)| t)
            .unwrap_or_default();
        let exposed = exposed_names(&text);
        let missing: Vec<&String> = used.iter().filter(|m| !exposed.contains(*m)).collect();
        panic!(
            "{e}: used by deploy/monitoring but not in /metrics: {missing:?}\n/metrics:\n{text}\n{}",
            ctl.log_text()
        );
    }
    assert_eq!(ctl.stop(), Some(0));
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
