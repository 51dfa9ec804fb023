//! End to end on the real API server and moto, EC2 answered by the
//! recording proxy: a cloud API outage (every request answered 503) and
//! revoked permissions (every request answered 403 `UnauthorizedOperation`)
//! never make a routed Node `NetworkUnavailable=True`, which would taint it
//! NoSchedule. The Nodes are read every 200 ms throughout; the proxy counts
//! what the controller sent.

mod common;

use std::time::{Duration, Instant};

use common::conditions::{Seen, Watcher};
use common::{Controller, TempDir, create_aws_nodes, start_aws};
use provider_aws::testing::proxy::is_mutating;
use provider_aws::testing::{
    Logged, Proxy, client, create_network, moto_endpoint, run_instances, unique_cluster,
};
use test_cluster::{ClusterGuard, TestCluster, TestNode, wait_until};

/// The binary's least interval between full passes: a failed listing is
/// tried again no sooner, and no listing for the drift period plus this
/// long makes `RouteCreated` Nodes read `Unknown`/`RouteUnverified`.
const MIN_INTERVAL: Duration = Duration::from_secs(10);
/// One pass plus the scheduling of a loaded 2-core machine.
const PASS: Duration = Duration::from_secs(12);

async fn wait_reason(
    c: &ClusterGuard,
    names: &[String],
    reason: &str,
    timeout: Duration,
    ctl: &Controller,
) -> Duration {
    let from = Instant::now();
    wait_until(timeout, &format!("{reason} on every Node"), || async {
        for n in names {
            let cond = c.network_unavailable(n).await.ok()??;
            if cond.reason.as_deref() != Some(reason) {
                return None;
            }
        }
        Some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    from.elapsed()
}

/// What the proxy saw from `mark` on, before `until`.
fn window(proxy: &Proxy, mark: usize, until: Instant) -> Vec<Logged> {
    proxy.log()[mark..]
        .iter()
        .filter(|r| r.at < until)
        .cloned()
        .collect()
}

fn actions(log: &[Logged]) -> Vec<&str> {
    log.iter().map(|r| r.action.as_str()).collect()
}

#[tokio::test]
async fn every_ec2_request_answered_503_for_longer_than_the_drift_period_leaves_routed_nodes_unknown_never_true_and_recovers_within_one_drift_period()
 {
    const DRIFT: Duration = Duration::from_secs(8);
    /// Longer than the drift period plus one pass, so the Nodes go `Unknown`.
    const OUTAGE: Duration = Duration::from_secs(40);
    let c = TestCluster::acquire().await.unwrap();
    let endpoint = moto_endpoint().await.unwrap();
    let ec2 = client(&endpoint).await;
    let proxy = Proxy::start(&endpoint).await.unwrap();
    let cluster = unique_cluster("outage-503");
    let net = create_network(&ec2, "10.44.0.0/16", Some(&cluster))
        .await
        .unwrap();
    let instances = run_instances(&ec2, &net, 3).await.unwrap();
    create_aws_nodes(&c, "outage-503", 180, "10.44.1", &instances).await;
    let names: Vec<String> = (0..3).map(|i| format!("outage-503-{i}")).collect();
    let dir = TempDir::new("outage-503");
    let drift = format!("{}s", DRIFT.as_secs());
    let (ctl, _) = start_aws(
        c.kubeconfig_path(),
        &dir,
        &cluster,
        &proxy.url(),
        "",
        &["--route-drift-check-period", &drift],
    );
    wait_reason(&c, &names, "RouteCreated", Duration::from_secs(90), &ctl).await;
    let watcher = Watcher::start(c.nodes(), names.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;

    let mark = proxy.log().len();
    let began = Instant::now();
    proxy.fail_next(u64::MAX, 503, "ServiceUnavailable");
    let unknown = wait_reason(
        &c,
        &names,
        "RouteUnverified",
        DRIFT + MIN_INTERVAL + PASS,
        &ctl,
    )
    .await;
    eprintln!("every Node read Unknown/RouteUnverified {unknown:?} into the outage");
    assert!(unknown >= DRIFT, "not before the drift period: {unknown:?}");
    tokio::time::sleep(OUTAGE.saturating_sub(began.elapsed())).await;
    proxy.fail_next(0, 503, "ServiceUnavailable");
    let ended = Instant::now();
    let outage = ended - began;

    let recovered = wait_reason(&c, &names, "RouteCreated", DRIFT + PASS, &ctl).await;
    eprintln!("every Node read RouteCreated again {recovered:?} after the outage ended");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let during = window(&proxy, mark, ended);
    let after = window(&proxy, mark, Instant::now());
    eprintln!(
        "{} requests in the {outage:?} outage: {:?}",
        during.len(),
        actions(&during)
    );
    assert!(!during.is_empty(), "the controller kept trying");
    assert!(
        during.iter().all(|r| r.injected.is_some()),
        "every request of the outage was answered 503"
    );
    assert!(
        (during.len() as f64) < outage.as_secs_f64(),
        "fewer than one request per second: {} in {outage:?}",
        during.len()
    );
    let mutations: Vec<&str> = actions(&after)
        .into_iter()
        .filter(|a| is_mutating(a))
        .collect();
    assert!(
        mutations.is_empty(),
        "nothing changed in the cloud during the outage or the recovery: {mutations:?}"
    );

    let seen = watcher.seen();
    let tainting: Vec<&Seen> = seen.iter().filter(|s| s.status == "True").collect();
    assert!(tainting.is_empty(), "a routed Node read True: {tainting:?}");
    for n in &names {
        assert_eq!(
            watcher.reasons_of(n),
            [
                "False/RouteCreated",
                "Unknown/RouteUnverified",
                "False/RouteCreated"
            ],
            "{n}: {seen:?}"
        );
    }
    let text = ctl.log_text();
    assert!(
        text.contains("ServiceUnavailable"),
        "the log names the cloud's answer"
    );
    assert_eq!(ctl.stop(), Some(0), "{text}");
    for n in &names {
        c.delete_node(n).await.unwrap();
    }
}

#[tokio::test]
async fn a_403_on_every_request_while_a_node_joins_leaves_routed_nodes_untouched_names_the_refusal_and_routes_the_newcomer_after_the_fix()
 {
    // Longer than the refusal below plus a pass: the routed Nodes'
    // listing never gets older than the drift period plus one pass, so the
    // RouteUnverified rule does not apply; what is checked is that the
    // refusal itself changes nothing on them.
    const DRIFT: Duration = Duration::from_secs(40);
    const REFUSAL: Duration = Duration::from_secs(20);
    let c = TestCluster::acquire().await.unwrap();
    let endpoint = moto_endpoint().await.unwrap();
    let ec2 = client(&endpoint).await;
    let proxy = Proxy::start(&endpoint).await.unwrap();
    let cluster = unique_cluster("outage-403");
    let net = create_network(&ec2, "10.45.0.0/16", Some(&cluster))
        .await
        .unwrap();
    let instances = run_instances(&ec2, &net, 4).await.unwrap();
    create_aws_nodes(&c, "outage-403", 190, "10.45.1", &instances[..3]).await;
    let names: Vec<String> = (0..3).map(|i| format!("outage-403-{i}")).collect();
    let newcomer = "outage-403-3".to_string();
    let dir = TempDir::new("outage-403");
    let drift = format!("{}s", DRIFT.as_secs());
    // `watch`: every pass lists, so the joining Node's pass is the listing
    // the cloud refuses (in `incremental` a pass for a joining Node runs
    // on the cached table and its creation is what is refused).
    let (ctl, _) = start_aws(
        c.kubeconfig_path(),
        &dir,
        &cluster,
        &proxy.url(),
        "",
        &[
            "--route-drift-check-period",
            &drift,
            "--reconcile-mode",
            "watch",
        ],
    );
    wait_reason(&c, &names, "RouteCreated", Duration::from_secs(90), &ctl).await;
    let mut all = names.clone();
    all.push(newcomer.clone());
    let watcher = Watcher::start(c.nodes(), all);
    tokio::time::sleep(Duration::from_secs(1)).await;

    let mark = proxy.log().len();
    let began = Instant::now();
    proxy.fail_next(u64::MAX, 403, "UnauthorizedOperation");
    c.create_node(
        &TestNode::new(&newcomer)
            .pod_cidrs(["10.244.193.0/24"])
            .internal_ip("10.45.1.13")
            .provider_id(&instances[3].provider_id),
    )
    .await
    .unwrap();
    let marked = wait_until(
        MIN_INTERVAL + PASS,
        "the newcomer True/NoRouteCreated",
        || async {
            let cond = c.network_unavailable(&newcomer).await.ok()??;
            (cond.status == "True" && cond.reason.as_deref() == Some("NoRouteCreated"))
                .then_some(cond)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let message = marked.message.unwrap_or_default();
    eprintln!(
        "the newcomer read True/NoRouteCreated {:?} into the refusal: {message}",
        began.elapsed()
    );
    assert!(
        message.starts_with("RouteController failed to create a route: the cloud refused Describe")
            && message.contains("UnauthorizedOperation (HTTP 403): You are not authorized to perform this operation."),
        "the message names the refused operation and the code: {message}"
    );
    tokio::time::sleep(REFUSAL.saturating_sub(began.elapsed())).await;
    proxy.fail_next(0, 403, "UnauthorizedOperation");
    let ended = Instant::now();
    let refusal = ended - began;

    let routed = wait_until(DRIFT + PASS, "the newcomer RouteCreated", || async {
        let cond = c.network_unavailable(&newcomer).await.ok()??;
        (cond.reason.as_deref() == Some("RouteCreated")).then_some(())
    })
    .await;
    let recovered = ended.elapsed();
    routed.unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    eprintln!("the newcomer read RouteCreated {recovered:?} after the refusal ended");
    // A few reads of the watcher past the change.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let routes = common::pod_routes(&ec2, &net.route_table_id)
        .await
        .unwrap_or_default();
    assert!(
        routes
            .iter()
            .any(|(d, t)| d == "10.244.193.0/24" && *t == instances[3].id),
        "{routes:?}"
    );

    let during = window(&proxy, mark, ended);
    eprintln!(
        "{} requests in the {refusal:?} refusal: {:?}",
        during.len(),
        actions(&during)
    );
    assert!(!during.is_empty(), "the controller tried");
    assert!(
        during.iter().all(|r| r.injected.is_some()),
        "every request of the refusal was answered 403"
    );
    assert!(
        (during.len() as f64) < refusal.as_secs_f64(),
        "fewer than one request per second: {} in {refusal:?}",
        during.len()
    );
    let mutations: Vec<&str> = actions(&during)
        .into_iter()
        .filter(|a| is_mutating(a))
        .collect();
    assert!(
        mutations.is_empty(),
        "nothing was asked to change while refused: {mutations:?}"
    );

    let seen = watcher.seen();
    for n in &names {
        assert_eq!(
            watcher.reasons_of(n),
            ["False/RouteCreated"],
            "{n} never changed: {seen:?}"
        );
    }
    // Read without a condition at first, if a read came before the mark.
    let newcomer_reads: Vec<String> = watcher
        .reasons_of(&newcomer)
        .into_iter()
        .filter(|r| r != "/")
        .collect();
    assert_eq!(
        newcomer_reads,
        ["True/NoRouteCreated", "False/RouteCreated"],
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .filter(|s| s.node == newcomer && s.status == "True")
            .all(|s| s.message == message),
        "one message, naming the refusal: {seen:?}"
    );
    let text = ctl.log_text();
    assert!(
        text.contains("could not list routes") && text.contains("UnauthorizedOperation"),
        "the log names the refusal"
    );
    assert_eq!(ctl.stop(), Some(0), "{text}");
    for n in names.iter().chain([&newcomer]) {
        c.delete_node(n).await.unwrap();
    }
}
