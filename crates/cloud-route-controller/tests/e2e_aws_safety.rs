//! End to end on the real API server and moto, EC2 answered by the
//! recording proxy: the two guards that keep a wrong setting or a wrong
//! picture of the cluster from taking routes away at once.
//!
//! - The settings check: a `--cluster-cidr` that none of the Nodes' pod
//!   CIDRs lie in (Nodes routed by upstream's controller under another
//!   one) changes nothing, says why (log, Warning, metric, `/readyz`) and
//!   gives way once the flag is fixed.
//! - `--max-route-deletions`: a pass that would delete more live routes no
//!   Node needs than the bound allows deletes none of them, says so, and
//!   deletes them once the bound is lifted.

mod common;

use std::time::{Duration, Instant};

use common::conditions::Watcher;
use common::{
    Controller, TempDir, create_aws_nodes, http_get_async, metric_sum, start_aws, wait_http,
};
use kube::api::{Patch, PatchParams};
use provider_aws::testing::proxy::is_mutating;
use provider_aws::testing::{
    Client, Logged, Proxy, add_route, client, create_network, moto_endpoint, run_instances,
    set_source_dest_check, table_routes, unique_cluster,
};
use test_cluster::{ClusterGuard, TestCluster, TestNode, wait_until};

/// The drift period: the incremental mode lists (a full pass, with the
/// settings check) this often, no sooner than the 10 s least interval.
const DRIFT: &str = "5s";
/// From the start of the controller to its first pass's report, on a
/// loaded 2-core machine.
const FIRST_PASS: Duration = Duration::from_secs(60);
/// The binary's least interval between full passes plus one pass.
const NEXT_PASS: Duration = Duration::from_secs(30);

/// The condition upstream's route controller writes once a Node's route
/// is made.
fn upstream_route_created() -> serde_json::Value {
    serde_json::json!({"status": {"conditions": [{
        "type": "NetworkUnavailable",
        "status": "False",
        "reason": "RouteCreated",
        "message": "RouteController created a route",
        "lastTransitionTime": "2024-01-01T00:00:00Z",
        "lastHeartbeatTime": "2024-01-01T00:00:00Z",
    }]}})
}

/// The routes of `table` inside `prefix` (a textual prefix such as
/// `"10.42."`) as (destination, target), sorted.
async fn routes_in(ec2: &Client, table: &str, prefix: &str) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = table_routes(ec2, table)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|(d, _, _)| d.starts_with(prefix))
        .map(|(d, t, _)| (d, t))
        .collect();
    v.sort();
    v
}

async fn scrape(metrics: &str) -> String {
    http_get_async(metrics, "/metrics")
        .await
        .map(|(_, body)| body)
        .unwrap_or_default()
}

/// Full passes the controller has finished.
async fn passes(metrics: &str) -> f64 {
    metric_sum(
        &scrape(metrics).await,
        "route_controller_reconcile_duration_seconds_count",
        &[],
    )
}

/// Waits until the controller has finished a full pass after the
/// `before`-th.
async fn wait_next_pass(metrics: &str, before: f64, ctl: &Controller) -> Duration {
    let from = Instant::now();
    wait_until(NEXT_PASS, "one more full pass", || async {
        (passes(metrics).await > before).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    from.elapsed()
}

fn mutations(log: &[Logged]) -> Vec<String> {
    log.iter()
        .filter(|r| is_mutating(&r.action))
        .map(|r| r.action.clone())
        .collect()
}

/// How many Warning Events of `reason` the named Nodes carry, counting
/// repeats folded into one Event.
async fn warnings(c: &ClusterGuard, names: &[String], reason: &str) -> i32 {
    let mut n = 0;
    for name in names {
        for e in c.node_events(name).await.unwrap_or_default() {
            if e.reason.as_deref() == Some(reason) && e.type_.as_deref() == Some("Warning") {
                n += e.count.unwrap_or(1).max(1);
            }
        }
    }
    n
}

/// Polls `checks` every 200 ms until each has held once; when each first
/// held, counted from `from`. Panics with the log after `timeout`.
async fn first_seen<F, Fut>(
    what: &[&str],
    from: Instant,
    timeout: Duration,
    ctl: &Controller,
    mut check: F,
) -> Vec<Duration>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut at: Vec<Option<Duration>> = vec![None; what.len()];
    loop {
        for (i, slot) in at.iter_mut().enumerate() {
            if slot.is_none() && check(i).await {
                *slot = Some(from.elapsed());
            }
        }
        if at.iter().all(Option::is_some) {
            return at.into_iter().flatten().collect();
        }
        if from.elapsed() > timeout {
            let missing: Vec<&str> = what
                .iter()
                .zip(&at)
                .filter(|(_, a)| a.is_none())
                .map(|(w, _)| *w)
                .collect();
            panic!("not within {timeout:?}: {missing:?}\n{}", ctl.log_text());
        }
        tokio::time::sleep(common::conditions::POLL).await;
    }
}

#[tokio::test]
async fn upstream_routed_nodes_outside_a_wrong_cluster_cidr_keep_their_routes_and_conditions_while_the_controller_says_why_and_resume_once_the_flag_is_fixed()
 {
    const NODES: usize = 10;
    let c = TestCluster::acquire().await.unwrap();
    let endpoint = moto_endpoint().await.unwrap();
    let ec2 = client(&endpoint).await;
    let proxy = Proxy::start(&endpoint).await.unwrap();
    let cluster = unique_cluster("safety-cidr");
    let net = create_network(&ec2, "10.48.0.0/16", Some(&cluster))
        .await
        .unwrap();
    let instances = run_instances(&ec2, &net, NODES as i32).await.unwrap();
    let names: Vec<String> = (0..NODES).map(|i| format!("safety-cidr-{i}")).collect();
    for (i, inst) in instances.iter().enumerate() {
        let cidr = format!("10.42.{i}.0/24");
        c.create_node(
            &TestNode::new(&names[i])
                .pod_cidrs([cidr.clone()])
                .internal_ip(format!("10.48.1.{}", 10 + i))
                .provider_id(&inst.provider_id),
        )
        .await
        .unwrap();
        // What upstream's route controller leaves behind: the route to the
        // instance, its source/destination check off, and the condition.
        add_route(&ec2, &net.route_table_id, &cidr, &inst.id)
            .await
            .unwrap();
        set_source_dest_check(&ec2, &inst.id, false).await.unwrap();
        c.nodes()
            .patch_status(
                &names[i],
                &PatchParams::default(),
                &Patch::Strategic(&upstream_route_created()),
            )
            .await
            .unwrap();
    }
    let upstream_routes = routes_in(&ec2, &net.route_table_id, "10.42.").await;
    assert_eq!(upstream_routes.len(), NODES, "{upstream_routes:?}");
    let watcher = Watcher::start(c.nodes(), names.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;

    // The controller of another cluster's settings: 10.244.0.0/16.
    let dir = TempDir::new("safety-cidr");
    let began = Instant::now();
    let (ctl, metrics) = start_aws(
        c.kubeconfig_path(),
        &dir,
        &cluster,
        &proxy.url(),
        "",
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--route-drift-check-period",
            DRIFT,
        ],
    );
    let error_line = |text: &str| -> usize {
        text.lines()
            .filter(|l| {
                l.contains("ERROR")
                    && l.contains("the controller's settings disagree with the cluster: --cluster-cidr is 10.244.0.0/16, but only 0 of the 10 Nodes")
                    && l.contains("10.42.")
            })
            .count()
    };
    let what = [
        "the error line",
        "a ConfigurationMismatch Warning",
        "route_controller_configuration_error{check=\"cluster_cidr\"} 1",
        "/readyz 503 naming --cluster-cidr",
    ];
    let at = first_seen(&what, began, FIRST_PASS, &ctl, |i| {
        let (c, ctl, metrics, names) = (&c, &ctl, &metrics, &names);
        async move {
            match i {
                0 => error_line(&ctl.log_text()) > 0,
                1 => warnings(c, names, "ConfigurationMismatch").await > 0,
                2 => {
                    metric_sum(
                        &scrape(metrics).await,
                        "route_controller_configuration_error",
                        &["check=\"cluster_cidr\""],
                    ) == 1.0
                }
                _ => http_get_async(metrics, "/readyz")
                    .await
                    .is_some_and(|(code, body)| {
                        code == 503
                            && body.contains("--cluster-cidr")
                            && body.contains("10.244.0.0/16")
                    }),
            }
        }
    })
    .await;
    for (w, t) in what.iter().zip(&at) {
        eprintln!("wrong --cluster-cidr: {w} {t:?} after the start");
    }
    // A second pass finds the same mismatch and says nothing new.
    let second = wait_next_pass(&metrics, passes(&metrics).await, &ctl).await;
    eprintln!("wrong --cluster-cidr: a further pass {second:?} later");
    let (code, body) = http_get_async(&metrics, "/readyz")
        .await
        .unwrap_or_default();
    eprintln!("/readyz: {code} {body}");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("10.42."), "{body}");
    let text = ctl.log_text();
    assert_eq!(error_line(&text), 1, "one error line per mismatch\n{text}");
    assert_eq!(
        warnings(&c, &names, "ConfigurationMismatch").await,
        1,
        "one Warning per mismatch"
    );
    let events = c.node_events(&names[0]).await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("ConfigurationMismatch")),
        "filed under the first Node by name: {events:?}"
    );
    let held = proxy.log();
    assert!(!held.is_empty(), "the controller listed the table");
    assert_eq!(mutations(&held), Vec::<String>::new(), "nothing changed");
    assert_eq!(
        routes_in(&ec2, &net.route_table_id, "10.42.").await,
        upstream_routes
    );
    assert_eq!(ctl.stop(), Some(0), "{text}");

    // The flag fixed.
    let mark = proxy.log().len();
    let dir = TempDir::new("safety-cidr-fixed");
    let restarted = Instant::now();
    let (ctl, metrics) = start_aws(
        c.kubeconfig_path(),
        &dir,
        &cluster,
        &proxy.url(),
        "",
        &[
            "--cluster-cidr",
            "10.42.0.0/16",
            "--route-drift-check-period",
            DRIFT,
        ],
    );
    wait_http(&metrics, "/readyz", 200, FIRST_PASS)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let ready = restarted.elapsed();
    let text = scrape(&metrics).await;
    assert_eq!(
        metric_sum(
            &text,
            "route_controller_configuration_error",
            &["check=\"cluster_cidr\""]
        ),
        0.0,
        "{text}"
    );
    assert!(
        metric_sum(
            &text,
            "route_controller_reconcile_duration_seconds_count",
            &[]
        ) >= 1.0,
        "ready after a full pass: {text}"
    );
    eprintln!("--cluster-cidr fixed: /readyz 200 and the metric 0 {ready:?} after the restart");
    // One more pass over the right routes.
    let second = wait_next_pass(&metrics, passes(&metrics).await, &ctl).await;
    eprintln!("--cluster-cidr fixed: a further pass {second:?} later");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after: Vec<Logged> = proxy.log()[mark..].to_vec();
    assert!(!after.is_empty(), "the controller listed the table");
    assert_eq!(
        mutations(&after),
        Vec::<String>::new(),
        "the routes are right: nothing to change"
    );
    assert_eq!(
        routes_in(&ec2, &net.route_table_id, "10.42.").await,
        upstream_routes
    );
    let seen = watcher.seen();
    for n in &names {
        assert_eq!(
            watcher.reasons_of(n),
            ["False/RouteCreated"],
            "{n} never changed: {seen:?}"
        );
    }
    let text = ctl.log_text();
    assert!(
        !text.contains("settings disagree"),
        "no mismatch with the fixed flag\n{text}"
    );
    assert_eq!(ctl.stop(), Some(0), "{text}");
    for n in &names {
        c.delete_node(n).await.unwrap();
    }
}

#[tokio::test]
async fn a_pass_that_would_delete_more_live_routes_than_the_bound_holds_them_and_releasing_the_bound_deletes_them()
 {
    const STRAY: usize = 12;
    let c = TestCluster::acquire().await.unwrap();
    let endpoint = moto_endpoint().await.unwrap();
    let ec2 = client(&endpoint).await;
    let proxy = Proxy::start(&endpoint).await.unwrap();
    let cluster = unique_cluster("safety-held");
    let net = create_network(&ec2, "10.49.0.0/16", Some(&cluster))
        .await
        .unwrap();
    let instances = run_instances(&ec2, &net, 2 + STRAY as i32).await.unwrap();
    create_aws_nodes(&c, "safety-held", 60, "10.49.1", &instances[..2]).await;
    let names: Vec<String> = (0..2).map(|i| format!("safety-held-{i}")).collect();
    // Live routes inside the cluster CIDR to running instances no Node
    // names, as a Node list missing most of the cluster would leave them.
    let mut stray: Vec<(String, String)> = Vec::new();
    for (i, inst) in instances[2..].iter().enumerate() {
        let cidr = format!("10.244.{}.0/24", 100 + i);
        add_route(&ec2, &net.route_table_id, &cidr, &inst.id)
            .await
            .unwrap();
        stray.push((cidr, inst.id.clone()));
    }
    stray.sort();
    let nodes_routes: Vec<(String, String)> = (0..2)
        .map(|i| (format!("10.244.{}.0/24", 60 + i), instances[i].id.clone()))
        .collect();

    let dir = TempDir::new("safety-held");
    let began = Instant::now();
    let (ctl, metrics) = start_aws(
        c.kubeconfig_path(),
        &dir,
        &cluster,
        &proxy.url(),
        "",
        &["--route-drift-check-period", DRIFT],
    );
    let held_line = |text: &str| -> usize {
        text.lines()
            .filter(|l| {
                // The hold's own line, not the Warning's echo.
                l.contains("WARN")
                    && l.contains("flag=\"--max-route-deletions\"")
                    && l.contains("held: this pass would delete live routes that no Node needs for 12 at once, more than --max-route-deletions")
            })
            .count()
    };
    let what = [
        "RouteCreated on both Nodes",
        "the held: line",
        "a ChangesHeld Warning",
        "route_controller_held_changes{kind=\"route_deletion\"} 12",
    ];
    let at = first_seen(&what, began, FIRST_PASS, &ctl, |i| {
        let (c, ctl, metrics, names) = (&c, &ctl, &metrics, &names);
        async move {
            match i {
                0 => {
                    let mut all = true;
                    for n in names {
                        let reason = c
                            .network_unavailable(n)
                            .await
                            .ok()
                            .flatten()
                            .and_then(|c| c.reason);
                        all &= reason.as_deref() == Some("RouteCreated");
                    }
                    all
                }
                1 => held_line(&ctl.log_text()) > 0,
                2 => warnings(c, names, "ChangesHeld").await > 0,
                _ => {
                    metric_sum(
                        &scrape(metrics).await,
                        "route_controller_held_changes",
                        &["kind=\"route_deletion\""],
                    ) == STRAY as f64
                }
            }
        }
    })
    .await;
    for (w, t) in what.iter().zip(&at) {
        eprintln!("bounded: {w} {t:?} after the start");
    }
    let second = wait_next_pass(&metrics, passes(&metrics).await, &ctl).await;
    eprintln!("bounded: a further pass {second:?} later");
    let log = proxy.log();
    let actions: Vec<&str> = log.iter().map(|r| r.action.as_str()).collect();
    assert!(
        !actions.contains(&"DeleteRoute"),
        "no route deleted: {actions:?}"
    );
    assert_eq!(
        actions.iter().filter(|a| **a == "CreateRoute").count(),
        2,
        "the Nodes routed: {actions:?}"
    );
    let mut expected = nodes_routes.clone();
    expected.extend(stray.iter().cloned());
    expected.sort();
    assert_eq!(
        routes_in(&ec2, &net.route_table_id, "10.244.").await,
        expected
    );
    let text = ctl.log_text();
    assert_eq!(held_line(&text), 1, "one line per hold\n{text}");
    assert_eq!(warnings(&c, &names, "ChangesHeld").await, 1);
    assert_eq!(
        metric_sum(
            &scrape(&metrics).await,
            "route_controller_held_changes",
            &["kind=\"route_deletion\""],
        ),
        STRAY as f64,
        "still held in the further pass"
    );
    assert_eq!(ctl.stop(), Some(0), "{text}");

    // The bound lifted.
    let mark = proxy.log().len();
    let dir = TempDir::new("safety-held-lifted");
    let restarted = Instant::now();
    let (ctl, metrics) = start_aws(
        c.kubeconfig_path(),
        &dir,
        &cluster,
        &proxy.url(),
        "",
        &[
            "--route-drift-check-period",
            DRIFT,
            "--max-route-deletions=100%",
        ],
    );
    wait_until(FIRST_PASS, "the stray routes deleted", || async {
        (routes_in(&ec2, &net.route_table_id, "10.244.").await == nodes_routes).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let deleted = restarted.elapsed();
    eprintln!("bound lifted: the {STRAY} stray routes deleted {deleted:?} after the restart");
    wait_http(&metrics, "/readyz", 200, NEXT_PASS)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let after: Vec<Logged> = proxy.log()[mark..].to_vec();
    let mut deletions: Vec<String> = after
        .iter()
        .filter(|r| r.action == "DeleteRoute")
        .map(|r| r.param("DestinationCidrBlock").replace("%2F", "/"))
        .collect();
    deletions.sort();
    let wanted: Vec<String> = stray.iter().map(|(d, _)| d.clone()).collect();
    assert_eq!(deletions, wanted, "each stray route deleted once");
    let other: Vec<String> = mutations(&after)
        .into_iter()
        .filter(|a| a != "DeleteRoute")
        .collect();
    assert_eq!(
        other,
        Vec::<String>::new(),
        "the Nodes' routes stay as they are"
    );
    assert_eq!(
        metric_sum(
            &scrape(&metrics).await,
            "route_controller_held_changes",
            &["kind=\"route_deletion\""],
        ),
        0.0
    );
    for n in &names {
        let cond = c.network_unavailable(n).await.unwrap().unwrap();
        assert_eq!(
            (cond.status.as_str(), cond.reason.as_deref()),
            ("False", Some("RouteCreated")),
            "{n}"
        );
    }
    let text = ctl.log_text();
    assert_eq!(held_line(&text), 0, "{text}");
    assert_eq!(ctl.stop(), Some(0), "{text}");
    for n in &names {
        c.delete_node(n).await.unwrap();
    }
}
