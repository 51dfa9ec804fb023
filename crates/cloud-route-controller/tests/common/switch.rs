//! The steps of docs/switching-over.md that every switch-over test runs
//! the same way: `plan`, a `--dry-run` shadow that must agree, and this
//! controller writing (tests/switch_over.rs beside the real upstream
//! controller, tests/switch_over_native.rs on routes made as each CCM
//! makes them).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use test_cluster::{ClusterGuard, wait_until};

use super::{Controller, TempDir, binary, free_port, http_get_async, metric_sum};

/// The cluster CIDR of the switch-over tests.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";

/// `cloud-route-controller plan` with `args` and `env`; its stdout.
pub async fn plan(kubeconfig: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let out = tokio::process::Command::new(binary())
        .arg("plan")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .expect("plan finished within 120 s")
        .expect("run plan");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "plan: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The common flags of a switch-over run: periodic passes every 2 s (as
/// upstream's), no election, metrics on `metrics`.
fn common_args(metrics: &str) -> Vec<&str> {
    vec![
        "--cluster-cidr",
        CLUSTER_CIDR,
        "--leader-elect=false",
        "--reconcile-mode",
        "periodic",
        "--route-reconciliation-period",
        "2s",
        "--metrics-bind-address",
        metrics,
    ]
}

/// Waits until the controller serving `metrics` satisfies `done` on its
/// `/metrics` text; the controller's log in the failure.
async fn wait_metrics(ctl: &Controller, metrics: &str, what: &str, done: impl Fn(&str) -> bool) {
    let base = format!("http://{metrics}");
    wait_until(Duration::from_secs(90), what, || async {
        let (_, text) = http_get_async(&base, "/metrics").await?;
        done(&text).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
}

/// The shadow's lines for what it would change (`pass{..}: dry run: would
/// create route ...`, one per difference when it appears). Its start-up
/// line quotes the phrase (`logged as "dry run: would ..."`), so a bare
/// `contains` would count that line as a difference on every run.
pub fn differences(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains(" dry run: would "))
        .collect()
}

/// Starts this controller as a `--dry-run` shadow with `args` after the
/// common ones, waits until it has made at least 3 passes and agrees
/// (nothing to change), checks that no pass disagreed, and stops it. Its
/// log.
pub async fn shadow_agrees(
    c: &ClusterGuard,
    dir: &TempDir,
    args: &[&str],
    env: &[(&str, &str)],
) -> String {
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut all = common_args(&metrics);
    all.push("--dry-run");
    all.extend_from_slice(args);
    let ctl = Controller::start_with_env(c.kubeconfig_path(), dir.path(), "shadow", &all, env);
    wait_metrics(&ctl, &metrics, "3 passes of the shadow, agreeing", |text| {
        metric_sum(text, "route_controller_route_sync_total", &[]) >= 3.0
            && metric_sum(text, "route_controller_dry_run_agreeing", &[]) == 1.0
    })
    .await;
    let log = ctl.log_text();
    let differences = differences(&log);
    assert!(
        differences.is_empty(),
        "the shadow disagreed at some pass:\n{}\n\n{log}",
        differences.join("\n")
    );
    assert_eq!(ctl.stop(), Some(0), "{log}");
    log
}

/// Starts this controller, writing, with `args` after the common ones and
/// waits until it has made at least 3 passes and says `RouteCreated` of
/// all `nodes` Nodes itself; the controller and how long that took.
pub async fn run_ours(
    c: &ClusterGuard,
    dir: &TempDir,
    args: &[&str],
    env: &[(&str, &str)],
    nodes: usize,
) -> (Controller, Duration) {
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut all = common_args(&metrics);
    all.extend_from_slice(args);
    let began = Instant::now();
    let ctl = Controller::start_with_env(c.kubeconfig_path(), dir.path(), "ours", &all, env);
    wait_metrics(
        &ctl,
        &metrics,
        "3 passes and every Node RouteCreated by this controller",
        |text| {
            metric_sum(text, "route_controller_route_sync_total", &[]) >= 3.0
                && metric_sum(text, "route_controller_nodes", &["reason=\"RouteCreated\""])
                    == nodes as f64
        },
    )
    .await;
    (ctl, began.elapsed())
}
