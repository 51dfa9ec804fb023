//! Several route tables for one cluster, against moto: every table tagged
//! for the cluster except the VPC main table, each route created in the
//! table its `target` names, a multi-NIC instance routed through its primary
//! network interface, and routes this controller could not have made
//! (peering, transit gateway, a CloudFormation-style table route) never
//! listed, so never deleted.
//!
//! moto deviations, each worked around here: moto gives `Origin`
//! `CreateRouteTable` only to the local route, so the CloudFormation-style
//! route is marked by [`Proxy::as_table_route`]; moto names only the
//! interface (never its instance) on a route to an interface, which the
//! provider maps back with `DescribeNetworkInterfaces` as it would for a
//! detached interface on EC2; moto does not paginate `DescribeRouteTables`
//! (it ignores `MaxResults` and answers no `NextToken`), so
//! [`Proxy::page_route_tables`] pages its answers as EC2 would.

use std::sync::Arc;

use provider_aws::testing::{self, Proxy};
use provider_aws::{AwsConfig, Ec2Routes, cluster_tag_key};
use route_cloud::CloudRoutes;
use route_core::{NodeView, Route, Text};

fn observe(p: &Ec2Routes, nodes: &[NodeView]) {
    let snapshot: Vec<Arc<NodeView>> = nodes.iter().cloned().map(Arc::new).collect();
    p.observe_nodes(&snapshot);
}

fn wanted(n: &NodeView, table: &str) -> Route {
    let mut r = Route::new(n.name.clone(), n.valid_pod_cidrs()[0]).in_table(table);
    r.node_provider_id = n.provider_id.as_deref().map(Into::into);
    r
}

/// (destination, target) of every route in a table, sorted, local left out.
async fn routes_of(ec2: &aws_sdk_ec2::Client, table: &str) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = testing::table_routes(ec2, table)
        .await
        .expect("describe the table")
        .into_iter()
        .filter(|(_, t, _)| t != "local")
        .map(|(d, t, _)| (d, t))
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_tagged_tables_get_every_route_and_foreign_routes_are_never_listed() {
    let ep = testing::moto_endpoint().await.expect("moto server");
    let proxy = Proxy::start(&ep).await.unwrap();
    let ec2 = testing::client(&ep).await;
    let cluster = testing::unique_cluster("zones");
    let tag = cluster_tag_key(&cluster);
    // One VPC: the fixture's table is tagged, two more tagged tables (one
    // per zone), an untagged one, and the main table tagged too (ignored).
    let net = testing::create_network(&ec2, "10.40.0.0/16", Some(&cluster))
        .await
        .unwrap();
    let mut tables = vec![net.route_table_id.clone()];
    for _ in 0..2 {
        tables.push(
            testing::create_route_table(&ec2, &net.vpc_id, &[(&tag, "owned")])
                .await
                .unwrap(),
        );
    }
    tables.sort();
    let untagged = testing::create_route_table(&ec2, &net.vpc_id, &[])
        .await
        .unwrap();
    let main = testing::main_route_table(&ec2, &net.vpc_id).await.unwrap();
    testing::tag(&ec2, &main, &tag, "owned").await.unwrap();

    let inst = testing::run_instances(&ec2, &net, 3).await.unwrap();
    let primary = testing::add_second_interface(&ec2, &net, &inst[1])
        .await
        .unwrap();
    // Foreign routes inside the cluster CIDR: peering and transit gateway
    // in the first table, a CloudFormation-style route to an instance in
    // the second, an instance route in the untagged and the main table.
    let pcx = testing::create_peering(&ec2, &net.vpc_id, "10.41.0.0/16")
        .await
        .unwrap();
    let tgw = testing::create_transit_gateway(&ec2).await.unwrap();
    testing::add_route(&ec2, &tables[0], "10.244.200.0/24", &pcx)
        .await
        .unwrap();
    testing::add_route(&ec2, &tables[0], "10.244.201.0/24", &tgw)
        .await
        .unwrap();
    testing::add_route(&ec2, &tables[1], "10.244.202.0/24", &inst[2].id)
        .await
        .unwrap();
    proxy.as_table_route("10.244.202.0/24");
    testing::add_route(&ec2, &untagged, "10.244.0.0/24", &inst[2].id)
        .await
        .unwrap();
    testing::add_route(&ec2, &main, "10.244.0.0/24", &inst[2].id)
        .await
        .unwrap();
    // A route to an instance no Node names, in the third table.
    testing::add_route(&ec2, &tables[2], "10.244.99.0/24", &inst[2].id)
        .await
        .unwrap();
    let untagged_before = routes_of(&ec2, &untagged).await;
    let main_before = routes_of(&ec2, &main).await;

    let p = testing::provider(&proxy.url(), AwsConfig::default())
        .await
        .unwrap();
    let a =
        NodeView::new("node-a", "ua", &["10.244.1.0/24"]).with_provider_id(&inst[0].provider_id);
    let b =
        NodeView::new("node-b", "ub", &["10.244.2.0/24"]).with_provider_id(&inst[1].provider_id);
    observe(&p, &[a.clone(), b.clone()]);

    let listed = p.list_routes(&cluster).await.unwrap();
    let want_targets: Vec<Text> = tables.iter().map(|t| t.as_str().into()).collect();
    assert_eq!(
        p.targets(),
        want_targets,
        "the main and the untagged table are not targets"
    );
    let got: Vec<(String, String, String)> = listed
        .iter()
        .map(|r| (r.table.to_string(), r.name.to_string(), r.node.to_string()))
        .collect();
    assert_eq!(
        got,
        vec![(tables[2].clone(), "10.244.99.0/24".into(), String::new())],
        "only the instance route is ours; the unknown instance fails nothing and names no node"
    );

    for t in &tables {
        for n in [&a, &b] {
            let created = p
                .create_route(&cluster, "hint", &wanted(n, t))
                .await
                .unwrap();
            assert_eq!(created.table, t.as_str());
        }
    }
    assert_eq!(
        p.stats().total("DescribeInstances"),
        2,
        "not one lookup per table, and none for the single-NIC instance: one for the unknown \
         instance's cluster tags when listing, and the multi-NIC one, once EC2 refused it"
    );
    assert_eq!(
        p.stats().total("ModifyInstanceAttribute"),
        2,
        "the single-NIC instance, and the multi-NIC one refused"
    );
    assert_eq!(
        p.stats().total("ModifyNetworkInterfaceAttribute"),
        1,
        "the multi-NIC instance's primary interface"
    );
    for t in &tables {
        let r = routes_of(&ec2, t).await;
        assert!(
            r.contains(&("10.244.1.0/24".into(), inst[0].id.clone())),
            "{t}: {r:?}"
        );
        assert!(
            r.contains(&("10.244.2.0/24".into(), primary.clone())),
            "{t}: {r:?}"
        );
    }
    let mut listed = p.list_routes(&cluster).await.unwrap();
    listed.sort_by(|x, y| (&x.table, &x.name).cmp(&(&y.table, &y.name)));
    let got: Vec<(String, String, String)> = listed
        .iter()
        .map(|r| (r.table.to_string(), r.name.to_string(), r.node.to_string()))
        .collect();
    let mut want = Vec::new();
    for t in &tables {
        want.push((t.clone(), "10.244.1.0/24".to_string(), "node-a".to_string()));
        want.push((t.clone(), "10.244.2.0/24".to_string(), "node-b".to_string()));
        if *t == tables[2] {
            want.push((t.clone(), "10.244.99.0/24".to_string(), String::new()));
        }
    }
    assert_eq!(got, want, "the interface route maps back to node-b");
    let b_route = listed.iter().find(|r| r.node == "node-b").unwrap();
    assert_eq!(
        b_route.node_provider_id.as_deref(),
        Some(inst[1].provider_id.as_str())
    );

    // Deleting node-b's routes from every table touches nothing else.
    for r in listed.iter().filter(|r| r.node == "node-b") {
        p.delete_route(&cluster, r).await.unwrap();
    }
    for t in &tables {
        let r = routes_of(&ec2, t).await;
        assert!(!r.iter().any(|(d, _)| d == "10.244.2.0/24"), "{t}: {r:?}");
        assert!(
            r.contains(&("10.244.1.0/24".into(), inst[0].id.clone())),
            "{t}: {r:?}"
        );
    }
    assert!(
        routes_of(&ec2, &tables[0])
            .await
            .contains(&("10.244.200.0/24".into(), pcx))
    );
    assert!(
        routes_of(&ec2, &tables[0])
            .await
            .contains(&("10.244.201.0/24".into(), tgw))
    );
    assert!(
        routes_of(&ec2, &tables[1])
            .await
            .contains(&("10.244.202.0/24".into(), inst[2].id.clone()))
    );
    assert_eq!(routes_of(&ec2, &untagged).await, untagged_before);
    assert_eq!(routes_of(&ec2, &main).await, main_before);
    for r in proxy.log() {
        assert!(
            !r.body.contains(&untagged) && !r.body.contains(&main)
                || r.action == "DescribeRouteTables",
            "{} named a table that is not a target: {}",
            r.action,
            r.body
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_route_table_ids_are_the_targets_and_a_missing_one_is_permanent() {
    let ep = testing::moto_endpoint().await.expect("moto server");
    let ec2 = testing::client(&ep).await;
    let net = testing::create_network(&ec2, "10.42.0.0/16", None)
        .await
        .unwrap();
    let second = testing::create_route_table(&ec2, &net.vpc_id, &[])
        .await
        .unwrap();
    let p = testing::provider(
        &ep,
        AwsConfig {
            route_table_id: Some(net.route_table_id.clone()),
            route_table_ids: vec![second.clone()],
            ..AwsConfig::default()
        },
    )
    .await
    .unwrap();
    let mut want = [net.route_table_id.clone(), second.clone()];
    assert_eq!(p.targets().len(), 2, "known before the first list");
    p.list_routes("c").await.unwrap();
    want.sort();
    let want: Vec<Text> = want.iter().map(|t| t.as_str().into()).collect();
    assert_eq!(p.targets(), want);
    // A route that names no table is refused when there are several.
    let inst = testing::run_instances(&ec2, &net, 1).await.unwrap();
    let n = NodeView::new("n", "u", &["10.244.3.0/24"]).with_provider_id(&inst[0].provider_id);
    let mut r = Route::new("n", n.valid_pod_cidrs()[0]);
    r.node_provider_id = n.provider_id.as_deref().map(Into::into);
    let e = p.create_route("c", "u", &r).await.unwrap_err();
    assert_eq!(e.kind, route_cloud::ErrorKind::InvalidRequest, "{e}");
    // Nor is a route to a table this cluster does not manage.
    let stranger = testing::create_route_table(&ec2, &net.vpc_id, &[])
        .await
        .unwrap();
    let e = p
        .create_route("c", "u", &r.clone().in_table(stranger.as_str()))
        .await
        .unwrap_err();
    assert_eq!(e.kind, route_cloud::ErrorKind::InvalidRequest, "{e}");
    assert_eq!(
        p.stats().total("CreateRoute"),
        0,
        "refused without a request"
    );

    let p = testing::provider(
        &ep,
        AwsConfig {
            route_table_ids: vec![net.route_table_id.clone(), "rtb-00000000deadbeef".into()],
            ..AwsConfig::default()
        },
    )
    .await
    .unwrap();
    let e = p.list_routes("c").await.unwrap_err();
    assert_eq!(e.kind, route_cloud::ErrorKind::Permanent, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_follows_every_page_of_tagged_tables() {
    let ep = testing::moto_endpoint().await.expect("moto server");
    let proxy = Proxy::start(&ep).await.unwrap();
    let ec2 = testing::client(&ep).await;
    let cluster = testing::unique_cluster("pages");
    let tag = cluster_tag_key(&cluster);
    let net = testing::create_network(&ec2, "10.43.0.0/16", Some(&cluster))
        .await
        .unwrap();
    let mut tables = vec![net.route_table_id.clone()];
    for _ in 0..2 {
        tables.push(
            testing::create_route_table(&ec2, &net.vpc_id, &[(&tag, "owned")])
                .await
                .unwrap(),
        );
    }
    tables.sort();
    proxy.page_route_tables(1);
    let p = testing::provider(&proxy.url(), AwsConfig::default())
        .await
        .unwrap();
    p.list_routes(&cluster).await.unwrap();
    let want: Vec<Text> = tables.iter().map(|t| t.as_str().into()).collect();
    assert_eq!(p.targets(), want, "every page's table is a target");
    let pages: Vec<String> = proxy
        .log()
        .iter()
        .filter(|r| r.action == "DescribeRouteTables")
        .map(|r| r.param("NextToken").to_string())
        .collect();
    assert_eq!(pages, vec!["", "page-1", "page-2"], "one request per page");
}
