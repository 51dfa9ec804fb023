//! End to end on the real API server and moto: the cloud changed behind the
//! controller's back is found by the drift check (`--route-drift-check-period`)
//! and repaired within one period plus one pass, in every mode, with one
//! Warning per repair; a Node left out by `--node-selector` is never named
//! in a request and never warned, across drift checks.

mod common;

use std::time::{Duration, Instant};

use common::{Controller, TempDir, create_aws_nodes, http_get_async, metric_sum, start_aws};
use provider_aws::testing::{
    Instance, Logged, Proxy, add_route, client, create_network, moto_endpoint, run_instances,
    set_source_dest_check, source_dest_check, unique_cluster,
};
use test_cluster::{ClusterGuard, TestCluster, TestNode, wait_until};

/// The drift period the tests run with: short, so a test takes seconds.
const DRIFT: Duration = Duration::from_secs(8);
/// One pass plus the scheduling of a loaded 2-core machine.
const PASS: Duration = Duration::from_secs(12);

async fn create_nodes(c: &ClusterGuard, prefix: &str, octet: usize, instances: &[Instance]) {
    create_aws_nodes(c, prefix, octet, "10.40.1", instances).await;
}

/// The binary on `endpoint` with the test's drift period and `extra` flags.
fn start(
    c: &ClusterGuard,
    dir: &TempDir,
    cluster: &str,
    endpoint: &str,
    extra_yaml: &str,
    extra: &[&str],
) -> (Controller, String) {
    let drift = format!("{}s", DRIFT.as_secs());
    let mut args = vec!["--route-drift-check-period", drift.as_str()];
    args.extend_from_slice(extra);
    start_aws(
        c.kubeconfig_path(),
        dir,
        cluster,
        endpoint,
        extra_yaml,
        &args,
    )
}

async fn pod_routes(ec2: &provider_aws::testing::Client, table: &str) -> Vec<(String, String)> {
    common::pod_routes(ec2, table).await.unwrap_or_default()
}

async fn wait_routed(c: &ClusterGuard, names: &[String], ctl: &Controller) {
    wait_until(
        Duration::from_secs(90),
        "RouteCreated on every Node",
        || async {
            for n in names {
                let cond = c.network_unavailable(n).await.ok()??;
                if cond.reason.as_deref() != Some("RouteCreated") {
                    return None;
                }
            }
            Some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
}

async fn warnings(c: &ClusterGuard, node: &str, reason: &str) -> Vec<String> {
    c.node_events(node)
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.message.unwrap_or_default())
        .collect()
}

async fn delete_route(ec2: &provider_aws::testing::Client, table: &str, destination: &str) {
    ec2.delete_route()
        .route_table_id(table)
        .destination_cidr_block(destination)
        .send()
        .await
        .expect("DeleteRoute behind the controller's back");
}

#[tokio::test]
async fn a_route_deleted_with_the_ec2_api_is_back_within_the_drift_period_plus_one_pass_in_every_mode()
 {
    let c = TestCluster::acquire().await.unwrap();
    let endpoint = moto_endpoint().await.unwrap();
    let ec2 = client(&endpoint).await;
    for (m, mode) in ["incremental", "watch", "periodic"].into_iter().enumerate() {
        let cluster = unique_cluster(&format!("drift-{mode}"));
        let net = create_network(&ec2, "10.40.0.0/16", Some(&cluster))
            .await
            .unwrap();
        let instances = run_instances(&ec2, &net, 3).await.unwrap();
        let prefix = format!("drift-{mode}");
        create_nodes(&c, &prefix, 100 + 10 * m, &instances).await;
        let names: Vec<String> = (0..3).map(|i| format!("{prefix}-{i}")).collect();
        let dir = TempDir::new(&prefix);
        let (ctl, metrics) = start(
            &c,
            &dir,
            &cluster,
            &endpoint,
            "",
            &["--reconcile-mode", mode],
        );
        wait_routed(&c, &names, &ctl).await;
        let table = net.route_table_id.clone();
        assert_eq!(pod_routes(&ec2, &table).await.len(), 3, "{mode}");
        let victim = format!("10.244.{}.0/24", 101 + 10 * m);
        delete_route(&ec2, &table, &victim).await;
        let deleted = Instant::now();
        wait_until(DRIFT + PASS, "the deleted route back", || async {
            pod_routes(&ec2, &table)
                .await
                .iter()
                .any(|(d, t)| *d == victim && *t == instances[1].id)
                .then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("{mode}: {e}\n{}", ctl.log_text()));
        let took = deleted.elapsed();
        eprintln!("{mode}: the deleted route was back after {took:?}");
        let repaired = wait_until(
            Duration::from_secs(10),
            "one RouteRepaired Warning",
            || async {
                let w = warnings(&c, &names[1], "RouteRepaired").await;
                (!w.is_empty()).then_some(w)
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{mode}: {e}\n{}", ctl.log_text()));
        assert_eq!(repaired.len(), 1, "{mode}: {repaired:?}");
        assert!(
            repaired[0].contains(&victim) && repaired[0].contains(&table),
            "{mode}: the Warning names the route and its table: {}",
            repaired[0]
        );
        for n in [&names[0], &names[2]] {
            assert!(
                warnings(&c, n, "RouteRepaired").await.is_empty(),
                "{mode}: {n}"
            );
        }
        let (_, text) = http_get_async(&metrics, "/metrics").await.unwrap();
        assert_eq!(
            metric_sum(
                &text,
                "route_controller_drift_total",
                &["kind=\"route_missing\""]
            ),
            1.0,
            "{mode}"
        );
        let cond = c.network_unavailable(&names[1]).await.unwrap().unwrap();
        assert_eq!(cond.reason.as_deref(), Some("RouteCreated"), "{mode}");
        let log = ctl.log_text();
        assert_eq!(ctl.stop(), Some(0), "{mode}: {log}");
        for n in &names {
            c.delete_node(n).await.unwrap();
        }
    }
}

#[tokio::test]
async fn with_route_table_ids_configured_a_source_dest_check_turned_on_a_deleted_and_a_retargeted_route_are_repaired_within_the_drift_period()
 {
    let c = TestCluster::acquire().await.unwrap();
    let endpoint = moto_endpoint().await.unwrap();
    let ec2 = client(&endpoint).await;
    let proxy = Proxy::start(&endpoint).await.unwrap();
    let cluster = unique_cluster("drift-ids");
    // Not tagged: the table is named by id.
    let net = create_network(&ec2, "10.41.0.0/16", None).await.unwrap();
    let instances = run_instances(&ec2, &net, 3).await.unwrap();
    create_nodes(&c, "drift-ids", 140, &instances).await;
    let names: Vec<String> = (0..3).map(|i| format!("drift-ids-{i}")).collect();
    let dir = TempDir::new("drift-ids");
    let table = net.route_table_id.clone();
    let (ctl, _) = start(
        &c,
        &dir,
        &cluster,
        &proxy.url(),
        &format!("route_table_ids: [{table}]\n"),
        &[],
    );
    wait_routed(&c, &names, &ctl).await;
    // Default mode (incremental): nothing would look before the resync
    // without the drift check.
    let victim = &instances[2].id;
    set_source_dest_check(&ec2, victim, true).await.unwrap();
    delete_route(&ec2, &table, "10.244.140.0/24").await;
    let mark = proxy.log().len();
    let changed = Instant::now();
    wait_until(
        DRIFT + PASS,
        "the check off again and the route back",
        || async {
            let off = source_dest_check(&ec2, victim).await == Ok(false);
            let back = pod_routes(&ec2, &table)
                .await
                .iter()
                .any(|(d, _)| d == "10.244.140.0/24");
            (off && back).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    eprintln!("repaired after {:?}", changed.elapsed());
    let log = proxy.log();
    let modify: Vec<&Logged> = log[mark..]
        .iter()
        .filter(|r| r.action == "ModifyInstanceAttribute")
        .collect();
    assert_eq!(modify.len(), 1, "one repair: {modify:?}");
    assert_eq!(modify[0].param("InstanceId"), *victim);
    wait_until(Duration::from_secs(10), "the two Warnings", || async {
        let f = warnings(&c, &names[2], "ForwardingRepaired").await.len();
        let r = warnings(&c, &names[0], "RouteRepaired").await.len();
        (f == 1 && r == 1).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    // A route retargeted over ours (another tool points the Node's CIDR at
    // another instance): pointed back within the drift period.
    ec2.replace_route()
        .route_table_id(&table)
        .destination_cidr_block("10.244.141.0/24")
        .instance_id(&instances[0].id)
        .send()
        .await
        .expect("ReplaceRoute behind the controller's back");
    let retargeted = Instant::now();
    wait_until(
        DRIFT + PASS,
        "the retargeted route pointed back",
        || async {
            pod_routes(&ec2, &table)
                .await
                .iter()
                .any(|(d, t)| d == "10.244.141.0/24" && *t == instances[1].id)
                .then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    eprintln!(
        "retargeted route pointed back after {:?}",
        retargeted.elapsed()
    );
    wait_until(
        Duration::from_secs(10),
        "a RouteRepaired Warning for it",
        || async {
            let w = warnings(&c, &names[1], "RouteRepaired").await;
            (w.len() == 1 && w[0].contains("pointed at")).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    // A settled drift check reads and writes nothing else: one
    // DescribeRouteTables and one DescribeInstances per period.
    let settled = proxy.log().len();
    tokio::time::sleep(DRIFT * 2 + Duration::from_secs(1)).await;
    let log = proxy.log();
    let after = &log[settled..];
    assert!(
        !after
            .iter()
            .any(|r| r.action.starts_with("Modify") || r.action.ends_with("Route")),
        "a settled drift check writes nothing: {after:?}"
    );
    let lists = after
        .iter()
        .filter(|r| r.action == "DescribeRouteTables")
        .count();
    let reads = after
        .iter()
        .filter(|r| r.action == "DescribeInstances")
        .count();
    assert!(
        (1..=3).contains(&lists),
        "{lists} DescribeRouteTables in two periods"
    );
    assert!(
        (1..=3).contains(&reads),
        "{reads} DescribeInstances in two periods"
    );
    let text = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{text}");
    for n in &names {
        c.delete_node(n).await.unwrap();
    }
}

#[tokio::test]
async fn a_node_left_out_by_the_node_selector_is_never_named_in_a_request_nor_warned_across_drift_checks()
 {
    let c = TestCluster::acquire().await.unwrap();
    let endpoint = moto_endpoint().await.unwrap();
    let ec2 = client(&endpoint).await;
    let proxy = Proxy::start(&endpoint).await.unwrap();
    let cluster = unique_cluster("drift-sel");
    let net = create_network(&ec2, "10.42.0.0/16", Some(&cluster))
        .await
        .unwrap();
    let instances = run_instances(&ec2, &net, 3).await.unwrap();
    for (i, inst) in instances.iter().enumerate() {
        let mut node = TestNode::new(format!("drift-sel-{i}"))
            .pod_cidrs([format!("10.244.{}.0/24", 150 + i)])
            .internal_ip(format!("10.42.1.{}", 10 + i))
            .provider_id(&inst.provider_id);
        if i == 2 {
            node = node.label("route.example.com/left-out", "true");
        }
        c.create_node(&node).await.unwrap();
    }
    let excluded = instances[2].id.clone();
    // A hand-made route to the left-out Node's instance, whose check is on:
    // it is not this controller's to look at or change.
    add_route(&ec2, &net.route_table_id, "10.244.152.0/24", &excluded)
        .await
        .unwrap();
    set_source_dest_check(&ec2, &excluded, true).await.unwrap();
    let dir = TempDir::new("drift-sel");
    let (ctl, _) = start(
        &c,
        &dir,
        &cluster,
        &proxy.url(),
        "",
        &["--node-selector", "route.example.com/left-out!=true"],
    );
    let names: Vec<String> = (0..2).map(|i| format!("drift-sel-{i}")).collect();
    wait_routed(&c, &names, &ctl).await;
    // Two drift checks.
    tokio::time::sleep(DRIFT * 2 + PASS).await;
    let named: Vec<Logged> = proxy
        .log()
        .into_iter()
        .filter(|r| r.body.contains(&excluded))
        .collect();
    assert!(
        named.is_empty(),
        "requests naming the left-out Node's instance: {named:?}"
    );
    assert_eq!(source_dest_check(&ec2, &excluded).await, Ok(true));
    let events = c.node_events("drift-sel-2").await.unwrap();
    assert!(events.is_empty(), "Events on the left-out Node: {events:?}");
    assert!(
        c.network_unavailable("drift-sel-2")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        pod_routes(&ec2, &net.route_table_id)
            .await
            .contains(&("10.244.152.0/24".to_string(), excluded.clone())),
        "the hand-made route stays"
    );
    let text = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{text}");
    for i in 0..3 {
        c.delete_node(&format!("drift-sel-{i}")).await.unwrap();
    }
}

#[tokio::test]
async fn a_node_waiting_on_a_cidr_another_cluster_freed_in_a_shared_table_is_routed_within_the_drift_period()
 {
    let c = TestCluster::acquire().await.unwrap();
    let endpoint = moto_endpoint().await.unwrap();
    let ec2 = client(&endpoint).await;
    let cluster = unique_cluster("drift-freed");
    let other = unique_cluster("drift-other");
    let net = create_network(&ec2, "10.43.0.0/16", Some(&cluster))
        .await
        .unwrap();
    let instances = run_instances(&ec2, &net, 2).await.unwrap();
    // The other cluster's instance and its route to a CIDR our Node claims.
    let theirs = &instances[1].id;
    provider_aws::testing::tag(
        &ec2,
        theirs,
        &provider_aws::cluster_tag_key(&other),
        "owned",
    )
    .await
    .unwrap();
    add_route(&ec2, &net.route_table_id, "10.244.170.0/24", theirs)
        .await
        .unwrap();
    c.create_node(
        &TestNode::new("drift-freed-0")
            .pod_cidrs(["10.244.170.0/24"])
            .internal_ip("10.43.1.10")
            .provider_id(&instances[0].provider_id),
    )
    .await
    .unwrap();
    let dir = TempDir::new("drift-freed");
    let (ctl, _) = start(&c, &dir, &cluster, &endpoint, "", &[]);
    wait_until(Duration::from_secs(60), "PodCIDRConflict", || async {
        let cond = c.network_unavailable("drift-freed-0").await.ok()??;
        (cond.reason.as_deref() == Some("PodCIDRConflict")).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    // The other cluster lets the CIDR go.
    delete_route(&ec2, &net.route_table_id, "10.244.170.0/24").await;
    let freed = Instant::now();
    wait_until(
        DRIFT + PASS,
        "our Node routed on the freed CIDR",
        || async {
            pod_routes(&ec2, &net.route_table_id)
                .await
                .iter()
                .any(|(d, t)| d == "10.244.170.0/24" && *t == instances[0].id)
                .then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    eprintln!("routed on the freed CIDR after {:?}", freed.elapsed());
    wait_until(Duration::from_secs(15), "RouteCreated", || async {
        let cond = c.network_unavailable("drift-freed-0").await.ok()??;
        (cond.reason.as_deref() == Some("RouteCreated")).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let text = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{text}");
}
