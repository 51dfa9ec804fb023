//! The AWS provider against a moto EC2 server (started by `scripts/moto.sh`
//! unless `CRC_MOTO_URL` names one), sometimes through
//! [`provider_aws::testing::Proxy`], which records every request, injects
//! EC2's throttling answer and marks routes as blackholes (moto reports every
//! route as active).

use std::sync::Arc;
use std::time::Duration;

use provider_aws::testing::{self, Proxy};
use provider_aws::{AwsConfig, Ec2Routes};
use route_cloud::{CloudRoutes, ErrorKind};
use route_core::{NodeView, Route};

async fn endpoint() -> String {
    testing::moto_endpoint().await.expect("moto server")
}

/// Shows the provider these Nodes, as the controller's snapshot would.
fn observe(p: &Ec2Routes, nodes: &[NodeView]) {
    let snapshot: Vec<Arc<NodeView>> = nodes.iter().cloned().map(Arc::new).collect();
    p.observe_nodes(&snapshot);
}

fn node(name: &str, instance: &testing::Instance, cidr: &str) -> NodeView {
    NodeView::new(name, format!("uid-{name}"), &[cidr]).with_provider_id(&instance.provider_id)
}

/// The route the planner would ask for: node, CIDR and provider id.
fn wanted(n: &NodeView) -> Route {
    let mut r = Route::new(n.name.clone(), n.valid_pod_cidrs()[0]);
    r.node_provider_id = n.provider_id.as_deref().map(Into::into);
    r
}

fn config_for(table: Option<&str>) -> AwsConfig {
    AwsConfig {
        route_table_id: table.map(str::to_string),
        ..AwsConfig::default()
    }
}

fn count(p: &Ec2Routes, op: &str) -> u64 {
    p.stats().total(op)
}

fn instance_routes(routes: &[(String, String, String)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = routes
        .iter()
        .filter(|(_, t, _)| t.starts_with("i-"))
        .map(|(d, t, _)| (d.clone(), t.clone()))
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_creates_and_deletes_routes_with_one_request_each() {
    let ep = endpoint().await;
    let ec2 = testing::client(&ep).await;
    let net = testing::create_network(&ec2, "10.10.0.0/16", None)
        .await
        .unwrap();
    let inst = testing::run_instances(&ec2, &net, 2).await.unwrap();
    let p = testing::provider(&ep, config_for(Some(&net.route_table_id)))
        .await
        .unwrap();
    let cluster = testing::unique_cluster("crud");
    let a = node("node-a", &inst[0], "10.244.0.0/24");
    let b = node("node-b", &inst[1], "10.244.1.0/24");
    observe(&p, &[a.clone(), b.clone()]);

    assert_eq!(
        p.list_routes(&cluster).await.unwrap(),
        vec![],
        "the local route is not ours"
    );
    assert_eq!(count(&p, "DescribeRouteTables"), 1);

    let ra = p
        .create_route(&cluster, "uid-node-a", &wanted(&a))
        .await
        .unwrap();
    assert_eq!(ra.node, "node-a");
    assert_eq!(ra.next_hop, inst[0].id);
    assert_eq!(
        (
            count(&p, "ModifyInstanceAttribute"),
            count(&p, "CreateRoute")
        ),
        (1, 1)
    );
    p.create_route(&cluster, "uid-node-b", &wanted(&b))
        .await
        .unwrap();
    // A second CIDR for node a: source/dest check is known to be off already.
    let mut a2 = wanted(&a);
    a2.destination = "10.244.9.0/24".parse::<route_core::Cidr>().unwrap().into();
    p.create_route(&cluster, "uid-node-a", &a2).await.unwrap();
    assert_eq!(count(&p, "ModifyInstanceAttribute"), 2, "once per instance");
    assert_eq!(count(&p, "CreateRoute"), 3);

    for i in &inst {
        let attr = ec2
            .describe_instance_attribute()
            .instance_id(&i.id)
            .attribute(aws_sdk_ec2::types::InstanceAttributeName::SourceDestCheck)
            .send()
            .await
            .unwrap();
        assert_eq!(
            attr.source_dest_check().and_then(|v| v.value()),
            Some(false)
        );
    }
    assert_eq!(
        instance_routes(
            &testing::table_routes(&ec2, &net.route_table_id)
                .await
                .unwrap()
        ),
        vec![
            ("10.244.0.0/24".into(), inst[0].id.clone()),
            ("10.244.1.0/24".into(), inst[1].id.clone()),
            ("10.244.9.0/24".into(), inst[0].id.clone()),
        ]
    );

    assert_eq!(
        count(&p, "DescribeInstances"),
        0,
        "single-NIC instances are prepared without a lookup"
    );
    let before = count(&p, "DescribeRouteTables");
    let mut listed = p.list_routes(&cluster).await.unwrap();
    assert_eq!(count(&p, "DescribeRouteTables"), before + 1);
    assert_eq!(
        count(&p, "DescribeInstances"),
        0,
        "nodes come from observe_nodes"
    );
    listed.sort_by_key(|r| r.name.clone());
    let got: Vec<(&str, &str, bool)> = listed
        .iter()
        .map(|r| (r.name.as_str(), r.node.as_str(), r.blackhole))
        .collect();
    assert_eq!(
        got,
        vec![
            ("10.244.0.0/24", "node-a", false),
            ("10.244.1.0/24", "node-b", false),
            ("10.244.9.0/24", "node-a", false),
        ]
    );

    // Creating what exists: same target is done, another target is a conflict.
    p.create_route(&cluster, "uid-node-a", &wanted(&a))
        .await
        .unwrap();
    let mut clash = wanted(&b);
    clash.destination = a.valid_pod_cidrs()[0].into();
    let e = p
        .create_route(&cluster, "uid-node-b", &clash)
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::AlreadyExists, "{e}");

    let deletes = count(&p, "DeleteRoute");
    p.delete_route(&cluster, &listed[0]).await.unwrap();
    assert_eq!(count(&p, "DeleteRoute"), deletes + 1);
    let e = p.delete_route(&cluster, &listed[0]).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound, "{e}");
    let left: Vec<String> = p
        .list_routes(&cluster)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.name.to_string())
        .collect();
    assert_eq!(left.len(), 2);
    assert!(!left.contains(&"10.244.0.0/24".to_string()));

    // A node that left: its routes name no node any more.
    observe(&p, std::slice::from_ref(&a));
    let listed = p.list_routes(&cluster).await.unwrap();
    let orphan = listed.iter().find(|r| r.name == "10.244.1.0/24").unwrap();
    assert_eq!(orphan.node, "");
    assert_eq!(orphan.next_hop, inst[1].id);

    // Bad input is refused without a request.
    let mut bad = wanted(&a);
    bad.node_provider_id = Some("gce://project/zone/vm".into());
    let creates = count(&p, "CreateRoute");
    let e = p.create_route(&cluster, "x", &bad).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidRequest);
    assert_eq!(count(&p, "CreateRoute"), creates);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_observed_nodes_routes_are_named_by_private_dns() {
    let ep = endpoint().await;
    let ec2 = testing::client(&ep).await;
    let net = testing::create_network(&ec2, "10.11.0.0/16", None)
        .await
        .unwrap();
    let inst = testing::run_instances(&ec2, &net, 1).await.unwrap();
    ec2.create_route()
        .route_table_id(&net.route_table_id)
        .destination_cidr_block("10.244.5.0/24")
        .instance_id(&inst[0].id)
        .send()
        .await
        .unwrap();
    let p = testing::provider(&ep, config_for(Some(&net.route_table_id)))
        .await
        .unwrap();
    let listed = p.list_routes("c").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(!inst[0].private_dns_name.is_empty());
    assert_eq!(listed[0].node, inst[0].private_dns_name);
    assert_eq!(count(&p, "DescribeInstances"), 1);
    // Once nodes are shown, no more lookups.
    observe(
        &p,
        &[
            NodeView::new(&inst[0].private_dns_name, "u", &["10.244.5.0/24"])
                .with_provider_id(&inst[0].provider_id),
        ],
    );
    p.list_routes("c").await.unwrap();
    assert_eq!(count(&p, "DescribeInstances"), 1);

    // A node without a provider id is found by its private DNS name.
    let p2 = testing::provider(&ep, config_for(Some(&net.route_table_id)))
        .await
        .unwrap();
    let r = Route::new(
        inst[0].private_dns_name.clone(),
        "10.244.6.0/24".parse::<route_core::Cidr>().unwrap(),
    );
    let created = p2.create_route("c", "u", &r).await.unwrap();
    assert_eq!(created.next_hop, inst[0].id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finds_its_table_by_tag_and_never_touches_another_clusters() {
    let ep = endpoint().await;
    let proxy = Proxy::start(&ep).await.unwrap();
    let ec2 = testing::client(&ep).await;
    let mine = testing::unique_cluster("mine");
    let theirs = testing::unique_cluster("theirs");
    let net_mine = testing::create_network(&ec2, "10.20.0.0/16", Some(&mine))
        .await
        .unwrap();
    let net_theirs = testing::create_network(&ec2, "10.21.0.0/16", Some(&theirs))
        .await
        .unwrap();
    let inst_mine = testing::run_instances(&ec2, &net_mine, 1).await.unwrap();
    let inst_theirs = testing::run_instances(&ec2, &net_theirs, 1).await.unwrap();
    // The other cluster uses the same pod CIDRs.
    ec2.create_route()
        .route_table_id(&net_theirs.route_table_id)
        .destination_cidr_block("10.244.0.0/24")
        .instance_id(&inst_theirs[0].id)
        .send()
        .await
        .unwrap();
    let theirs_before = testing::table_routes(&ec2, &net_theirs.route_table_id)
        .await
        .unwrap();

    let p = testing::provider(&proxy.url(), config_for(None))
        .await
        .unwrap();
    let a = node("node-a", &inst_mine[0], "10.244.0.0/24");
    observe(&p, std::slice::from_ref(&a));
    assert_eq!(p.list_routes(&mine).await.unwrap(), vec![]);
    p.create_route(&mine, "u", &wanted(&a)).await.unwrap();
    let listed = p.list_routes(&mine).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].next_hop, inst_mine[0].id);
    p.delete_route(&mine, &listed[0]).await.unwrap();
    p.create_route(&mine, "u", &wanted(&a)).await.unwrap();

    assert_eq!(
        instance_routes(
            &testing::table_routes(&ec2, &net_mine.route_table_id)
                .await
                .unwrap()
        ),
        vec![("10.244.0.0/24".into(), inst_mine[0].id.clone())]
    );
    assert_eq!(
        testing::table_routes(&ec2, &net_theirs.route_table_id)
            .await
            .unwrap(),
        theirs_before,
        "the other cluster's table is untouched"
    );
    let log = proxy.log();
    assert!(!log.is_empty());
    for r in &log {
        assert!(
            !r.body.contains(&net_theirs.route_table_id),
            "a request named the other cluster's table: {}",
            r.body
        );
        if r.action == "DescribeRouteTables" {
            assert!(
                r.body.contains("Filter.") || r.body.contains("RouteTableId."),
                "unfiltered DescribeRouteTables: {}",
                r.body
            );
        }
    }
    let describes = log
        .iter()
        .filter(|r| r.action == "DescribeRouteTables")
        .count();
    assert_eq!(
        describes, 2,
        "one per list; creates and deletes reuse the table id"
    );

    // No tagged table: a clear, permanent error.
    let e = p
        .list_routes(&testing::unique_cluster("nobody"))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Permanent, "{e}");
    // Two tagged tables are two targets (upstream refuses "multiple
    // matching route tables").
    let twice = testing::unique_cluster("twice");
    let n1 = testing::create_network(&ec2, "10.22.0.0/16", Some(&twice))
        .await
        .unwrap();
    let n2 = testing::create_network(&ec2, "10.23.0.0/16", Some(&twice))
        .await
        .unwrap();
    p.list_routes(&twice).await.unwrap();
    let mut both = vec![n1.route_table_id.clone(), n2.route_table_id.clone()];
    both.sort();
    assert_eq!(
        p.targets()
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>(),
        both
    );
    // vpc_id narrows the lookup to one of them.
    let net3 = testing::create_network(&ec2, "10.24.0.0/16", Some(&twice))
        .await
        .unwrap();
    let p3 = testing::provider(
        &ep,
        AwsConfig {
            vpc_id: Some(net3.vpc_id.clone()),
            ..AwsConfig::default()
        },
    )
    .await
    .unwrap();
    p3.list_routes(&twice).await.unwrap();
    assert_eq!(
        p3.targets(),
        vec![route_core::Text::from(net3.route_table_id.as_str())]
    );
    // A configured table that does not exist.
    let p4 = testing::provider(&ep, config_for(Some("rtb-0000000000deadbee")))
        .await
        .unwrap();
    let e = p4.list_routes(&mine).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Permanent, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_routes_are_reported_and_replaced() {
    let ep = endpoint().await;
    let proxy = Proxy::start(&ep).await.unwrap();
    let ec2 = testing::client(&ep).await;
    let net = testing::create_network(&ec2, "10.30.0.0/16", None)
        .await
        .unwrap();
    let inst = testing::run_instances(&ec2, &net, 3).await.unwrap();
    let p = testing::provider(&proxy.url(), config_for(Some(&net.route_table_id)))
        .await
        .unwrap();
    let a_old = node("node-a", &inst[0], "10.244.0.0/24");
    let c_old = node("node-c", &inst[2], "10.244.2.0/24");
    observe(&p, &[a_old.clone(), c_old.clone()]);
    p.create_route("bh", "u", &wanted(&a_old)).await.unwrap();
    p.create_route("bh", "u", &wanted(&c_old)).await.unwrap();

    // The instances die; EC2 turns their routes into blackholes. Node a
    // comes back on a new instance, node c does not.
    ec2.terminate_instances()
        .instance_ids(&inst[0].id)
        .instance_ids(&inst[2].id)
        .send()
        .await
        .unwrap();
    proxy.blackhole(&inst[0].id);
    proxy.blackhole(&inst[2].id);
    let a_new = node("node-a", &inst[1], "10.244.0.0/24");
    observe(&p, std::slice::from_ref(&a_new));
    let listed = p.list_routes("bh").await.unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|r| r.blackhole), "{listed:?}");

    let (replaces, creates) = (count(&p, "ReplaceRoute"), count(&p, "CreateRoute"));
    let r = p.create_route("bh", "u", &wanted(&a_new)).await.unwrap();
    assert_eq!(r.next_hop, inst[1].id);
    assert_eq!(
        count(&p, "ReplaceRoute"),
        replaces + 1,
        "a listed blackhole is replaced in one call"
    );
    assert_eq!(count(&p, "CreateRoute"), creates);
    let listed = p.list_routes("bh").await.unwrap();
    let a_route = listed.iter().find(|r| r.name == "10.244.0.0/24").unwrap();
    assert!(!a_route.blackhole);
    assert_eq!(a_route.node, "node-a");

    // A provider that has not listed yet learns of the blackhole from
    // RouteAlreadyExists and replaces it too.
    let fresh = testing::provider(&proxy.url(), config_for(Some(&net.route_table_id)))
        .await
        .unwrap();
    let c_new = node("node-c", &inst[1], "10.244.2.0/24");
    fresh
        .create_route("bh", "u", &wanted(&c_new))
        .await
        .unwrap();
    assert_eq!(count(&fresh, "CreateRoute"), 1);
    assert_eq!(count(&fresh, "ReplaceRoute"), 1);
    assert_eq!(
        instance_routes(
            &testing::table_routes(&ec2, &net.route_table_id)
                .await
                .unwrap()
        ),
        vec![
            ("10.244.0.0/24".into(), inst[1].id.clone()),
            ("10.244.2.0/24".into(), inst[1].id.clone()),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_slows_the_client_down_without_losing_routes() {
    let ep = endpoint().await;
    let proxy = Proxy::start(&ep).await.unwrap();
    let ec2 = testing::client(&ep).await;
    let net = testing::create_network(&ec2, "10.40.0.0/16", None)
        .await
        .unwrap();
    let inst = testing::run_instances(&ec2, &net, 4).await.unwrap();
    let mut cfg = config_for(Some(&net.route_table_id));
    cfg.rate_limit.throttle_pause_ms = 200;
    let p = testing::provider(&proxy.url(), cfg).await.unwrap();
    let nodes: Vec<NodeView> = (0..8)
        .map(|i| node(&format!("n{i}"), &inst[i % 4], &format!("10.244.{i}.0/24")))
        .collect();
    observe(&p, &nodes);
    proxy.throttle_every(3);

    // Retry like the controller does: throttled calls are simply repeated.
    let mut throttled = 0;
    for n in &nodes {
        let mut attempts = 0;
        loop {
            attempts += 1;
            assert!(attempts < 20, "no progress for {}", n.name);
            match p.create_route("t", "u", &wanted(n)).await {
                Ok(_) => break,
                Err(e) if e.kind == ErrorKind::Throttled => throttled += 1,
                Err(e) => panic!("unexpected {e}"),
            }
        }
    }
    let listed = loop {
        match p.list_routes("t").await {
            Ok(l) => break l,
            Err(e) if e.kind == ErrorKind::Throttled => throttled += 1,
            Err(e) => panic!("unexpected {e}"),
        }
    };
    proxy.throttle_every(0);

    assert_eq!(listed.len(), 8, "no route lost: {listed:?}");
    assert!(listed.iter().all(|r| !r.node.is_empty()));
    let log = proxy.log();
    let injected = log.iter().filter(|r| r.throttled).count();
    assert!(injected >= 3, "the proxy throttled {injected} requests");
    assert_eq!(
        throttled, injected,
        "every throttle answer surfaced as Throttled"
    );
    let stats = p.stats().snapshot();
    let counted: u64 = stats
        .iter()
        .filter(|((_, res), _)| *res == "throttled")
        .map(|(_, n)| n)
        .sum();
    assert_eq!(counted as usize, injected);
    assert!(p.stats().rate_limit_wait() >= Duration::from_millis(200));
    // After each throttle the same action waits out its pause before the next try.
    for (i, r) in log.iter().enumerate() {
        if !r.throttled {
            continue;
        }
        if let Some(next) = log[i + 1..].iter().find(|n| n.action == r.action) {
            let gap = next.at.duration_since(r.at);
            assert!(
                gap >= Duration::from_millis(190),
                "{} retried {gap:?} after a throttle",
                r.action
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creations_for_one_instance_turn_off_source_dest_check_once() {
    // Regression: a dual-stack Node's two routes are created concurrently
    // and both sent ModifyInstanceAttribute. What matters is two creations
    // for one instance in flight together; two IPv4 CIDRs show it without
    // depending on the emulator's IPv6 routes.
    let ep = endpoint().await;
    let ec2 = testing::client(&ep).await;
    let net = testing::create_network(&ec2, "10.12.0.0/16", None)
        .await
        .unwrap();
    let inst = testing::run_instances(&ec2, &net, 1).await.unwrap();
    let p = testing::provider(&ep, config_for(Some(&net.route_table_id)))
        .await
        .unwrap();
    let cluster = testing::unique_cluster("once");
    let n = node("node-a", &inst[0], "10.244.0.0/24");
    observe(&p, std::slice::from_ref(&n));
    let first = wanted(&n);
    let mut second = wanted(&n);
    second.destination = "10.244.1.0/24".parse::<route_core::Cidr>().unwrap().into();
    let (a, b) = tokio::join!(
        p.create_route(&cluster, "uid-node-a", &first),
        p.create_route(&cluster, "uid-node-a", &second)
    );
    a.unwrap();
    b.unwrap();
    assert_eq!(count(&p, "ModifyInstanceAttribute"), 1);
    assert_eq!(count(&p, "CreateRoute"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_route_carries_the_provider_id_its_creation_returned() {
    // Regression (found by the conformance suite): create_route returned the
    // Node's providerID in `node_provider_id`, a later list None, so a
    // cached creation and a listing of the same route disagreed although the
    // trait promises create returns the route as a list would show it.
    let ep = endpoint().await;
    let ec2 = testing::client(&ep).await;
    let net = testing::create_network(&ec2, "10.13.0.0/16", None)
        .await
        .unwrap();
    let inst = testing::run_instances(&ec2, &net, 1).await.unwrap();
    let p = testing::provider(&ep, config_for(Some(&net.route_table_id)))
        .await
        .unwrap();
    let cluster = testing::unique_cluster("pid");
    let n = node("node-a", &inst[0], "10.244.0.0/24");
    observe(&p, std::slice::from_ref(&n));
    let created = p
        .create_route(&cluster, "uid-node-a", &wanted(&n))
        .await
        .unwrap();
    assert_eq!(
        created.node_provider_id.as_deref(),
        Some(inst[0].provider_id.as_str())
    );
    assert_eq!(p.list_routes(&cluster).await.unwrap(), vec![created]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_left_to_an_instance_no_node_names_is_moved_with_one_replace_route() {
    // The sequence: a Node's instance is replaced (same name, same pod
    // CIDR, new instance); the old instance's route is still in the table.
    let ep = endpoint().await;
    let ec2 = testing::client(&ep).await;
    let net = testing::create_network(&ec2, "10.12.0.0/16", None)
        .await
        .unwrap();
    let inst = testing::run_instances(&ec2, &net, 3).await.unwrap();
    testing::add_route(&ec2, &net.route_table_id, "10.244.7.0/24", &inst[0].id)
        .await
        .unwrap();
    let p = testing::provider(&ep, config_for(Some(&net.route_table_id)))
        .await
        .unwrap();
    let n = node("node-n", &inst[1], "10.244.7.0/24");
    let other = node("node-o", &inst[2], "10.244.8.0/24");
    observe(&p, &[n.clone(), other.clone()]);
    let created = p.create_route("c", "uid", &wanted(&n)).await.unwrap();
    assert_eq!(created.next_hop, inst[1].id);
    assert_eq!(count(&p, "ReplaceRoute"), 1, "moved in one call");
    assert_eq!(count(&p, "DeleteRoute"), 0);
    assert_eq!(
        instance_routes(
            &testing::table_routes(&ec2, &net.route_table_id)
                .await
                .unwrap()
        ),
        vec![("10.244.7.0/24".into(), inst[1].id.clone())]
    );
    // A live Node's route is never taken over: that is a conflict.
    let mut clash = wanted(&other);
    clash.destination = n.valid_pod_cidrs()[0].into();
    let e = p.create_route("c", "uid", &clash).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::AlreadyExists, "{e}");
    assert_eq!(count(&p, "ReplaceRoute"), 1);
}

/// The Nodes of `instances`, one /24 each from 10.244.`base`.0/24 on.
fn nodes_of(instances: &[testing::Instance], base: usize) -> Vec<NodeView> {
    instances
        .iter()
        .enumerate()
        .map(|(k, i)| {
            node(
                &format!("node-{}", base + k),
                i,
                &format!("10.244.{}.0/24", base + k),
            )
        })
        .collect()
}

/// Starts one creation per Node, each in its own task, as the controller's
/// concurrent workers do.
fn spawn_creations(
    p: &Arc<Ec2Routes>,
    cluster: &str,
    nodes: &[NodeView],
) -> Vec<tokio::task::JoinHandle<Result<Route, route_cloud::CloudError>>> {
    nodes
        .iter()
        .map(|n| {
            let (p, cluster, route, uid) =
                (p.clone(), cluster.to_string(), wanted(n), n.uid.clone());
            tokio::spawn(async move { p.create_route(&cluster, &uid, &route).await })
        })
        .collect()
}

/// Waits (on the proxy's log) until `n` `DescribeInstances` have arrived.
async fn describe_instances_arrived(proxy: &Proxy, n: usize) {
    for _ in 0..1000 {
        if proxy
            .log()
            .iter()
            .filter(|l| l.action == "DescribeInstances")
            .count()
            >= n
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{n} DescribeInstances never arrived");
}

/// Routes `cidr` to a fresh instance with two network interfaces, as the
/// first route to a multi-NIC Node: EC2 refuses the instance-level request,
/// and from then on the provider describes new instances before preparing
/// them. Returns the instance's primary interface, the route's target.
async fn route_a_multi_nic_node(
    p: &Ec2Routes,
    ec2: &aws_sdk_ec2::Client,
    net: &testing::Network,
    cluster: &str,
    cidr: &str,
) -> String {
    let inst = testing::run_instances(ec2, net, 1)
        .await
        .expect("the multi-NIC instance");
    let primary = testing::add_second_interface(ec2, net, &inst[0])
        .await
        .expect("its second interface");
    let n = node("node-multi-nic", &inst[0], cidr);
    let created = p
        .create_route(cluster, &n.uid, &wanted(&n))
        .await
        .expect("a route to the multi-NIC Node");
    assert_eq!(created.next_hop.as_str(), primary);
    primary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_single_nic_instances_costs_no_describe_instances() {
    // Regression: every new instance cost a DescribeInstances (221 extra
    // requests for 200 Nodes under EC2's buckets, 27 once shared), only to
    // learn it had one network interface.
    let ep = endpoint().await;
    let proxy = Proxy::start(&ep).await.unwrap();
    let ec2 = testing::client(&ep).await;
    let net = testing::create_network(&ec2, "10.16.0.0/16", None)
        .await
        .unwrap();
    let inst = testing::run_instances(&ec2, &net, 12).await.unwrap();
    let p = Arc::new(
        testing::provider(&proxy.url(), config_for(Some(&net.route_table_id)))
            .await
            .unwrap(),
    );
    let cluster = testing::unique_cluster("single");
    let nodes = nodes_of(&inst, 0);
    observe(&p, &nodes);
    for h in spawn_creations(&p, &cluster, &nodes) {
        h.await.unwrap().unwrap();
    }
    let counts = proxy.counts();
    let requests: Vec<(&str, u64)> = counts
        .iter()
        .map(|(action, c)| (action.as_str(), c.requests))
        .collect();
    assert_eq!(
        requests,
        [("CreateRoute", 12), ("ModifyInstanceAttribute", 12)],
        "two writes per instance and nothing else (the table is configured)"
    );
    assert_eq!(
        instance_routes(
            &testing::table_routes(&ec2, &net.route_table_id)
                .await
                .unwrap()
        )
        .len(),
        12
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_nic_instance_refused_at_instance_level_is_routed_to_its_primary_interface() {
    let ep = endpoint().await;
    let proxy = Proxy::start(&ep).await.unwrap();
    let ec2 = testing::client(&ep).await;
    let net = testing::create_network(&ec2, "10.17.0.0/16", None)
        .await
        .unwrap();
    let single = testing::run_instances(&ec2, &net, 1).await.unwrap();
    let p = testing::provider(&proxy.url(), config_for(Some(&net.route_table_id)))
        .await
        .unwrap();
    let cluster = testing::unique_cluster("multinic");
    let primary = route_a_multi_nic_node(&p, &ec2, &net, &cluster, "10.244.0.0/24").await;
    let refused: Vec<_> = proxy
        .log()
        .into_iter()
        .filter(|l| l.action == "ModifyInstanceAttribute")
        .collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(count(&p, "DescribeInstances"), 1);
    assert_eq!(count(&p, "ModifyNetworkInterfaceAttribute"), 1);
    let eni = ec2
        .describe_network_interfaces()
        .network_interface_ids(&primary)
        .send()
        .await
        .unwrap();
    assert_eq!(
        eni.network_interfaces()[0].source_dest_check(),
        Some(false),
        "the check is off on the primary interface"
    );
    // A cluster with one multi-NIC Node likely has more: the next new
    // instance is described first instead of refused first.
    let n = node("node-single", &single[0], "10.244.1.0/24");
    p.create_route(&cluster, &n.uid, &wanted(&n)).await.unwrap();
    assert_eq!(count(&p, "DescribeInstances"), 2);
    assert_eq!(
        count(&p, "ModifyInstanceAttribute"),
        2,
        "the refused one and the single-NIC instance's"
    );
    let routes = testing::table_routes(&ec2, &net.route_table_id)
        .await
        .unwrap();
    assert!(
        routes
            .iter()
            .any(|(d, t, _)| d == "10.244.0.0/24" && *t == primary),
        "{routes:?}"
    );
    assert_eq!(
        instance_routes(&routes),
        [("10.244.1.0/24".to_string(), single[0].id.clone())]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_gained_an_interface_is_described_again_after_ec2_refuses_its_route() {
    let ep = endpoint().await;
    let proxy = Proxy::start(&ep).await.unwrap();
    let ec2 = testing::client(&ep).await;
    let net = testing::create_network(&ec2, "10.18.0.0/16", None)
        .await
        .unwrap();
    let inst = testing::run_instances(&ec2, &net, 1).await.unwrap();
    let p = testing::provider(&proxy.url(), config_for(Some(&net.route_table_id)))
        .await
        .unwrap();
    let cluster = testing::unique_cluster("gained");
    let n = node("node-a", &inst[0], "10.244.0.0/24");
    p.create_route(&cluster, &n.uid, &wanted(&n)).await.unwrap();
    let primary = testing::add_second_interface(&ec2, &net, &inst[0])
        .await
        .unwrap();
    let mut second = wanted(&n);
    second.destination = "10.244.1.0/24".parse::<route_core::Cidr>().unwrap().into();
    let e = p
        .create_route(&cluster, &n.uid, &second)
        .await
        .expect_err("EC2 refuses an instance-level route to a multi-NIC instance");
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    assert!(e.message.contains("multiple interfaces"), "{e}");
    let created = p.create_route(&cluster, &n.uid, &second).await.unwrap();
    assert_eq!(created.next_hop.as_str(), primary);
    assert_eq!(count(&p, "DescribeInstances"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_of_new_instances_shares_describe_instances() {
    // Regression: every new instance cost its own DescribeInstances (221
    // extra requests for 200 Nodes under EC2's buckets). Instances are
    // described once the cluster is known to have multi-NIC Nodes.
    let ep = endpoint().await;
    let proxy = Proxy::start(&ep).await.unwrap();
    let ec2 = testing::client(&ep).await;
    let net = testing::create_network(&ec2, "10.13.0.0/16", None)
        .await
        .unwrap();
    let inst = testing::run_instances(&ec2, &net, 16).await.unwrap();
    let primary = testing::add_second_interface(&ec2, &net, &inst[5])
        .await
        .unwrap();
    let p = Arc::new(
        testing::provider(&proxy.url(), config_for(Some(&net.route_table_id)))
            .await
            .unwrap(),
    );
    let cluster = testing::unique_cluster("batch");
    route_a_multi_nic_node(&p, &ec2, &net, &cluster, "10.244.200.0/24").await;
    let describes_before = count(&p, "DescribeInstances");
    let modified_before = proxy
        .log()
        .iter()
        .filter(|l| l.action == "ModifyInstanceAttribute")
        .count();
    let mut nodes = nodes_of(&inst, 0);
    // An instance EC2 does not show: targeted by id, as without batching.
    let missing = "i-0123456789abcdef0";
    nodes.push(
        NodeView::new("node-missing", "uid-node-missing", &["10.244.100.0/24"])
            .with_provider_id(format!("aws:///us-east-1a/{missing}")),
    );
    observe(&p, &nodes);
    let mut results = Vec::new();
    for h in spawn_creations(&p, &cluster, &nodes) {
        results.push(h.await.unwrap());
    }
    let (missed, created) = results.split_last().unwrap();
    assert!(missed.is_err(), "moto knows no {missing}: {missed:?}");
    for r in created {
        r.as_ref().unwrap();
    }
    let describes = count(&p, "DescribeInstances") - describes_before;
    assert!(
        describes <= 3,
        "{} new instances cost {describes} DescribeInstances",
        nodes.len()
    );
    assert_eq!(
        proxy.counts()["DescribeInstances"].requests,
        count(&p, "DescribeInstances"),
        "every request went through the provider's counters"
    );
    let modified: Vec<String> = proxy
        .log()
        .iter()
        .filter(|l| l.action == "ModifyInstanceAttribute")
        .skip(modified_before)
        .map(|l| l.param("InstanceId").to_string())
        .collect();
    assert!(modified.iter().any(|i| i == missing), "{modified:?}");
    assert_eq!(
        modified.len(),
        16,
        "15 single-NIC instances and the missing one; the multi-NIC one was described, not refused"
    );
    let routes = testing::table_routes(&ec2, &net.route_table_id)
        .await
        .unwrap();
    let to_primary: Vec<&str> = routes
        .iter()
        .filter(|(_, t, _)| *t == primary)
        .map(|(d, _, _)| d.as_str())
        .collect();
    assert_eq!(to_primary, ["10.244.5.0/24"], "{routes:?}");
    assert_eq!(instance_routes(&routes).len(), 15);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_shared_describe_instances_fails_every_waiter_and_a_retry_succeeds() {
    let ep = endpoint().await;
    let proxy = Proxy::start(&ep).await.unwrap();
    let ec2 = testing::client(&ep).await;
    let net = testing::create_network(&ec2, "10.14.0.0/16", None)
        .await
        .unwrap();
    let inst = testing::run_instances(&ec2, &net, 6).await.unwrap();
    let p = Arc::new(
        testing::provider(&proxy.url(), config_for(Some(&net.route_table_id)))
            .await
            .unwrap(),
    );
    let cluster = testing::unique_cluster("batchfail");
    route_a_multi_nic_node(&p, &ec2, &net, &cluster, "10.244.200.0/24").await;
    let (describes, modifies) = (
        count(&p, "DescribeInstances"),
        count(&p, "ModifyInstanceAttribute"),
    );
    let nodes = nodes_of(&inst, 0);
    // Only the first Node is known when its lookup starts, so nothing is
    // described ahead for the others.
    observe(&p, &nodes[..1]);
    // The first creation's lookup is in flight while five more queue; the
    // request for those five is the next one, and it fails.
    proxy.set_latency(Duration::from_millis(300));
    let first = spawn_creations(&p, &cluster, &nodes[..1]);
    describe_instances_arrived(&proxy, 2).await;
    proxy.fail_next(1, 500, "InternalError");
    observe(&p, &nodes);
    let rest = spawn_creations(&p, &cluster, &nodes[1..]);
    for h in rest {
        let e = h.await.unwrap().unwrap_err();
        assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    }
    for h in first {
        h.await.unwrap().unwrap();
    }
    assert_eq!(
        count(&p, "DescribeInstances") - describes,
        2,
        "one request for the five"
    );
    assert_eq!(count(&p, "ModifyInstanceAttribute") - modifies, 1);
    proxy.set_latency(Duration::ZERO);
    for h in spawn_creations(&p, &cluster, &nodes[1..]) {
        h.await.unwrap().unwrap();
    }
    assert_eq!(count(&p, "ModifyInstanceAttribute") - modifies, 6);
    let routes = testing::table_routes(&ec2, &net.route_table_id)
        .await
        .unwrap();
    assert_eq!(instance_routes(&routes).len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_leader_or_waiter_strands_no_other_lookup() {
    let ep = endpoint().await;
    let proxy = Proxy::start(&ep).await.unwrap();
    let ec2 = testing::client(&ep).await;
    let net = testing::create_network(&ec2, "10.15.0.0/16", None)
        .await
        .unwrap();
    let inst = testing::run_instances(&ec2, &net, 3).await.unwrap();
    let p = Arc::new(
        testing::provider(&proxy.url(), config_for(Some(&net.route_table_id)))
            .await
            .unwrap(),
    );
    let cluster = testing::unique_cluster("batchdrop");
    route_a_multi_nic_node(&p, &ec2, &net, &cluster, "10.244.200.0/24").await;
    let nodes = nodes_of(&inst, 0);
    observe(&p, &nodes[..1]);
    proxy.set_latency(Duration::from_millis(500));
    let leader = spawn_creations(&p, &cluster, &nodes[..1]);
    describe_instances_arrived(&proxy, 2).await;
    observe(&p, &nodes);
    let mut waiters = spawn_creations(&p, &cluster, &nodes[1..]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The leader mid-request and one waiter go away; the other waiter still
    // gets its answer.
    leader[0].abort();
    waiters[0].abort();
    let survivor = waiters.pop().unwrap();
    tokio::time::timeout(Duration::from_secs(20), survivor)
        .await
        .expect("the remaining waiter is not stranded")
        .unwrap()
        .unwrap();
    proxy.set_latency(Duration::ZERO);
    for h in spawn_creations(&p, &cluster, &nodes[..2]) {
        h.await.unwrap().unwrap();
    }
    let routes = testing::table_routes(&ec2, &net.route_table_id)
        .await
        .unwrap();
    assert_eq!(instance_routes(&routes).len(), 3);
}

/// What a resync's forwarding check costs: one filtered `DescribeInstances`
/// per 200 routed instances and no write while nothing was reset; one
/// `ModifyInstanceAttribute` per instance whose check was turned back on.
/// Once an instance was seen off, later checks ask EC2 only for the
/// instances whose check is on (`source-dest-check=true`), so an answer
/// carries the offenders, not every Node's instance.
/// `CRC_FORWARDING_NODES` sets the cluster size (BENCHMARKS.md ran 1,000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resyncs_forwarding_check_costs_one_describe_per_200_instances_and_one_write_per_reset() {
    use route_cloud::{Forwarding, ForwardingCheck};
    let n: usize = std::env::var("CRC_FORWARDING_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(201);
    let ep = endpoint().await;
    let ec2 = testing::client(&ep).await;
    // A VPC CIDR no other test uses: moto names instances by private IP,
    // and a test that looks instances up by that name must find one.
    let net = testing::create_network(&ec2, "10.19.0.0/16", None)
        .await
        .unwrap();
    let mut instances = Vec::new();
    while instances.len() < n {
        let batch = (n - instances.len()).min(250) as i32;
        instances.extend(testing::run_instances(&ec2, &net, batch).await.unwrap());
    }
    let proxy = Proxy::start(&ep).await.unwrap();
    let p = testing::provider(&proxy.url(), config_for(Some(&net.route_table_id)))
        .await
        .unwrap();
    let nodes: Vec<Arc<NodeView>> = instances
        .iter()
        .enumerate()
        .map(|(i, inst)| {
            let cidr = format!("10.{}.{}.0/24", 100 + i / 256, i % 256);
            Arc::new(node(&format!("node-{i}"), inst, &cidr))
        })
        .collect();
    // Routed instances had their check turned off before their first route.
    for inst in &instances {
        testing::set_source_dest_check(&ec2, &inst.id, false)
            .await
            .unwrap();
    }
    let fresh = ForwardingCheck {
        fresh: true,
        repair: true,
    };
    let before = p.stats().snapshot();
    let answers = p.check_forwarding("c", &nodes, fresh).await.unwrap();
    let sent = |op: &str, before: &std::collections::BTreeMap<(&str, &str), u64>| {
        p.stats().total(op)
            - before
                .iter()
                .filter(|((o, _), _)| *o == op)
                .map(|(_, n)| n)
                .sum::<u64>()
    };
    assert_eq!(answers.len(), n);
    assert!(answers.iter().all(|(_, f)| *f == Forwarding::Ready));
    let describes = sent("DescribeInstances", &before);
    assert_eq!(describes as usize, n.div_ceil(200));
    assert_eq!(sent("ModifyInstanceAttribute", &before), 0);
    let asks_only_offenders = |l: &testing::Logged| {
        (1..=2).any(|f| {
            l.param(&format!("Filter.{f}.Name")) == "source-dest-check"
                && l.param(&format!("Filter.{f}.Value.1")) == "true"
        })
    };
    let first_read: Vec<_> = proxy
        .log()
        .into_iter()
        .filter(|l| l.action == "DescribeInstances")
        .collect();
    assert!(
        !first_read.iter().any(asks_only_offenders),
        "instances never seen are described whole"
    );
    // Two instances reset behind the controller's back: two writes, two Repaired.
    for inst in &instances[..2] {
        testing::set_source_dest_check(&ec2, &inst.id, true)
            .await
            .unwrap();
    }
    proxy.reset_counts();
    let logged_before = proxy.log().len();
    let before = p.stats().snapshot();
    let answers = p.check_forwarding("c", &nodes, fresh).await.unwrap();
    let second_read: Vec<_> = proxy.log()[logged_before..]
        .iter()
        .filter(|l| l.action == "DescribeInstances")
        .cloned()
        .collect();
    assert_eq!(second_read.len(), n.div_ceil(200));
    assert!(
        second_read.iter().all(asks_only_offenders),
        "instances seen off are asked only whether their check is on: {:?}",
        second_read
            .iter()
            .map(|l| l.body.chars().take(120).collect::<String>())
            .collect::<Vec<_>>()
    );
    // Every other Node is as last seen.
    assert_eq!(answers.len(), n);
    assert_eq!(
        answers
            .iter()
            .filter(|(_, f)| *f == Forwarding::Ready)
            .count(),
        n - 2
    );
    let repaired: Vec<&str> = answers
        .iter()
        .filter(|(_, f)| matches!(f, Forwarding::Repaired { .. }))
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(repaired, ["node-0", "node-1"]);
    assert_eq!(sent("ModifyInstanceAttribute", &before), 2);
    for inst in &instances[..2] {
        assert_eq!(testing::source_dest_check(&ec2, &inst.id).await, Ok(false));
    }
    // A remembered check answers from memory, without a request.
    let before = p.stats().snapshot();
    let remembered = ForwardingCheck {
        fresh: false,
        repair: true,
    };
    let answers = p
        .check_forwarding("c", &nodes[..2], remembered)
        .await
        .unwrap();
    assert_eq!(answers.len(), 2);
    let total = |s: &std::collections::BTreeMap<(&str, &str), u64>| s.values().sum::<u64>();
    assert_eq!(total(&p.stats().snapshot()), total(&before));
    eprintln!(
        "forwarding check of {n} instances: {describes} DescribeInstances, 0 writes; 2 resets: 2 ModifyInstanceAttribute"
    );
}

// cloud-provider-aws reads the legacy tag `KubernetesCluster=<id>` beside
// `kubernetes.io/cluster/<id>` (its `KubernetesClusterTag`): a cluster whose
// table carries only the legacy tag is found when `legacy_cluster_tag` is
// set and not otherwise, and an instance tagged legacy for another cluster
// makes its route that cluster's, with or without the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_tagged_only_with_the_legacy_kubernetes_cluster_tag_is_found_when_asked() {
    let ep = endpoint().await;
    let proxy = Proxy::start(&ep).await.unwrap();
    let ec2 = testing::client(&ep).await;
    let old = testing::unique_cluster("legacy");
    let other = testing::unique_cluster("legacy-other");
    let net = testing::create_network(&ec2, "10.25.0.0/16", None)
        .await
        .unwrap();
    testing::tag(
        &ec2,
        &net.route_table_id,
        provider_aws::LEGACY_CLUSTER_TAG,
        &old,
    )
    .await
    .unwrap();
    let inst = testing::run_instances(&ec2, &net, 2).await.unwrap();
    testing::tag(&ec2, &inst[1].id, provider_aws::LEGACY_CLUSTER_TAG, &other)
        .await
        .unwrap();
    ec2.create_route()
        .route_table_id(&net.route_table_id)
        .destination_cidr_block("10.244.9.0/24")
        .instance_id(&inst[1].id)
        .send()
        .await
        .unwrap();

    let plain = testing::provider(&proxy.url(), AwsConfig::default())
        .await
        .unwrap();
    let e = plain.list_routes(&old).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Permanent, "{e}");
    assert!(!e.message.contains(provider_aws::LEGACY_CLUSTER_TAG), "{e}");

    let p = testing::provider(
        &proxy.url(),
        AwsConfig {
            legacy_cluster_tag: true,
            ..AwsConfig::default()
        },
    )
    .await
    .unwrap();
    let a = node("node-a", &inst[0], "10.244.0.0/24");
    observe(&p, std::slice::from_ref(&a));
    let listed = p.list_routes(&old).await.unwrap();
    assert_eq!(
        p.targets(),
        vec![route_core::Text::from(net.route_table_id.as_str())]
    );
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].next_hop, inst[1].id);
    let owner = listed[0].foreign.as_deref().unwrap_or_default();
    assert!(
        owner.contains(&other),
        "the legacy-tagged instance's route is the other cluster's: {listed:?}"
    );
    p.create_route(&old, "u", &wanted(&a)).await.unwrap();
    assert_eq!(
        instance_routes(
            &testing::table_routes(&ec2, &net.route_table_id)
                .await
                .unwrap()
        ),
        vec![
            ("10.244.0.0/24".into(), inst[0].id.clone()),
            ("10.244.9.0/24".into(), inst[1].id.clone()),
        ]
    );
    // Two lists, each with one request per tag.
    let describes = proxy
        .log()
        .iter()
        .filter(|r| r.action == "DescribeRouteTables")
        .count();
    assert_eq!(
        describes,
        1 + 2,
        "one for the plain provider, two for the legacy one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routes_the_listing_leaves_out_count_against_the_route_quota_as_ec2_counts_them() {
    // Regression: max_routes counted only this controller's routes, while
    // EC2's "routes per route table" quota counts every non-propagated route.
    let ep = endpoint().await;
    let ec2 = testing::client(&ep).await;
    let net = testing::create_network(&ec2, "10.12.0.0/16", None)
        .await
        .unwrap();
    let inst = testing::run_instances(&ec2, &net, 1).await.unwrap();
    let pcx = testing::create_peering(&ec2, &net.vpc_id, "192.168.0.0/16")
        .await
        .unwrap();
    testing::add_route(&ec2, &net.route_table_id, "192.168.0.0/16", &pcx)
        .await
        .unwrap();
    let p = testing::provider(&ep, config_for(Some(&net.route_table_id)))
        .await
        .unwrap();
    let cluster = testing::unique_cluster("unlisted");
    let a = node("node-a", &inst[0], "10.244.0.0/24");
    observe(&p, std::slice::from_ref(&a));
    p.create_route(&cluster, "uid-node-a", &wanted(&a))
        .await
        .unwrap();
    let listed = p.list_routes(&cluster).await.unwrap();
    assert_eq!(
        listed.len(),
        1,
        "only the Node's route is listed: {listed:?}"
    );
    let all = testing::table_routes(&ec2, &net.route_table_id)
        .await
        .unwrap();
    let unlisted = p.unlisted_routes();
    let v4: usize = unlisted
        .iter()
        .filter(|((t, f), _)| t.as_str() == net.route_table_id && *f == route_core::IpFamily::V4)
        .map(|(_, n)| *n)
        .sum();
    // The local route and the peering route: what the console counts
    // besides the Node's route.
    assert_eq!(v4, all.len() - 1, "{all:?} / {unlisted:?}");
    assert!(v4 >= 2, "{all:?}");
}
