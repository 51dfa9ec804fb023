//! End to end, issue 14's done-when on AWS: a three-zone VPC (three private
//! route tables tagged for the cluster) on moto, the real API server and the
//! real binary. 100 Nodes (one on a multi-NIC instance, routed through its
//! primary interface) get their routes in all three tables, 10 deleted
//! Nodes lose them in all three, foreign routes inside the cluster CIDR in
//! each table (a peering, a transit gateway and a CloudFormation-style
//! route with the same destination range) are never touched, and
//! `cleanup --yes` leaves only the foreign routes.
//!
//! moto gives `Origin` `CreateRouteTable` only to the local route, so the
//! controller talks to moto through `provider_aws::testing::Proxy`, which
//! lists the CloudFormation-style route with that origin, as EC2 would.

mod common;

use std::time::Duration;

use common::{Controller, TempDir, cleanup_deletes, pod_routes};
use provider_aws::cluster_tag_key;
use provider_aws::testing::{
    Proxy, add_route, add_second_interface, client, create_network, create_peering,
    create_route_table, create_transit_gateway, moto_endpoint, run_instances, unique_cluster,
};
use test_cluster::{TestCluster, TestNode, wait_until};

const NODES: usize = 100;
const DELETED: usize = 10;
/// Foreign destinations inside the cluster CIDR, in every table.
const FOREIGN: [&str; 3] = ["10.244.200.0/24", "10.244.201.0/24", "10.244.202.0/24"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_zone_tables_route_100_nodes_follow_10_deletions_and_cleanup_leaves_foreign_routes() {
    let t0 = std::time::Instant::now();
    let c = TestCluster::acquire().await.expect("API server");
    let endpoint = moto_endpoint().await.expect("moto");
    let proxy = Proxy::start(&endpoint).await.expect("proxy");
    let ec2 = client(&endpoint).await;
    let cluster = unique_cluster("zones");
    let tag = cluster_tag_key(&cluster);
    let net = create_network(&ec2, "10.50.0.0/16", Some(&cluster))
        .await
        .expect("network");
    let mut tables = vec![net.route_table_id.clone()];
    for _ in 0..2 {
        tables.push(
            create_route_table(&ec2, &net.vpc_id, &[(&tag, "owned")])
                .await
                .expect("zone table"),
        );
    }
    let instances = run_instances(&ec2, &net, NODES as i32 + 1)
        .await
        .expect("instances");
    let (outsider, instances) = instances.split_last().expect("instances");
    // Node 0 runs on a multi-NIC instance: its routes go to the primary
    // interface in every table.
    let primary = add_second_interface(&ec2, &net, &instances[0])
        .await
        .expect("second interface");
    let pcx = create_peering(&ec2, &net.vpc_id, "10.51.0.0/16")
        .await
        .expect("peering");
    let tgw = create_transit_gateway(&ec2).await.expect("transit gateway");
    for t in &tables {
        add_route(&ec2, t, FOREIGN[0], &pcx).await.expect("route");
        add_route(&ec2, t, FOREIGN[1], &tgw).await.expect("route");
        add_route(&ec2, t, FOREIGN[2], &outsider.id)
            .await
            .expect("route");
    }
    proxy.as_table_route(FOREIGN[2]);
    let foreign: Vec<(String, String)> = {
        let mut v = vec![
            (FOREIGN[0].to_string(), pcx.clone()),
            (FOREIGN[1].to_string(), tgw.clone()),
            (FOREIGN[2].to_string(), outsider.id.clone()),
        ];
        v.sort();
        v
    };

    for (i, inst) in instances.iter().enumerate() {
        c.create_node(
            &TestNode::new(format!("zone-{i}"))
                .pod_cidrs([format!("10.244.{i}.0/24")])
                .internal_ip(format!("10.50.0.{}", 10 + i))
                .provider_id(&inst.provider_id),
        )
        .await
        .expect("create the test Node");
    }
    let dir = TempDir::new("aws-tables");
    let cfg = dir.path().join("aws.yaml");
    // A generous write budget: this test is about placement, not pacing.
    std::fs::write(
        &cfg,
        format!(
            "region: us-east-1\nendpoint: {}\nrate_limit:\n  write: {{per_second: 100, burst: 200}}\n",
            proxy.url()
        ),
    )
    .expect("write the cloud config");
    let env = [
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_REGION", "us-east-1"),
    ];
    let mut ctl = Controller::start_with_env(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cluster-name",
            &cluster,
            "--cloud-provider",
            "aws",
            "--cloud-config",
            cfg.to_str().expect("utf-8 path"),
            "--leader-elect=false",
            "--metrics-bind-address",
            "0",
        ],
        &env,
    );
    let expect = |live: std::ops::Range<usize>| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = live
            .map(|i| {
                let target = if i == 0 {
                    primary.clone()
                } else {
                    instances[i].id.clone()
                };
                (format!("10.244.{i}.0/24"), target)
            })
            .chain(foreign.iter().cloned())
            .collect();
        v.sort();
        v
    };
    let all = expect(0..NODES);
    wait_until(
        Duration::from_secs(240),
        "100 Node routes in each of the three tables",
        || async {
            for t in &tables {
                if pod_routes(&ec2, t).await? != all {
                    return None;
                }
            }
            Some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let routed = t0.elapsed();

    for i in NODES - DELETED..NODES {
        c.delete_node(&format!("zone-{i}"))
            .await
            .expect("delete Node");
    }
    let left = expect(0..NODES - DELETED);
    wait_until(
        Duration::from_secs(120),
        "the 10 deleted Nodes' routes gone from all three tables",
        || async {
            for t in &tables {
                if pod_routes(&ec2, t).await? != left {
                    return None;
                }
            }
            Some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    assert!(ctl.is_running(), "{}", ctl.log_text());
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");

    // Teardown: cleanup lists every table and deletes only this cluster's.
    let cfg_path = cfg.to_str().expect("utf-8 path");
    let args = [
        "--cluster-cidr",
        "10.244.0.0/16",
        "--cluster-name",
        &cluster,
        "--cloud-provider",
        "aws",
        "--cloud-config",
        cfg_path,
    ];
    cleanup_deletes(&args, &env, 3 * (NODES - DELETED)).await;
    for t in &tables {
        assert_eq!(
            pod_routes(&ec2, t).await.expect("describe"),
            foreign,
            "{t}: only the foreign routes are left"
        );
    }
    eprintln!(
        "three tables: {NODES} Nodes routed after {routed:?}, done after {:?}",
        t0.elapsed()
    );
}
