//! End to end, issue 14's done-when on OpenStack: one cluster, two Neutron
//! routers (`router_ids`) on a real neutron-server, the real API server and
//! the real binary. 100 Nodes get their routes on both routers, 10 deleted
//! Nodes lose them on both, a foreign route with a destination inside the
//! cluster CIDR on each router (next hop outside `node_subnets`) is never
//! touched, and `cleanup --yes` leaves only the foreign routes.

mod common;

use std::time::Duration;

use common::{Controller, TempDir, cleanup_deletes};
use provider_openstack::testing::{Admin, neutron_server};
use test_cluster::{TestCluster, TestNode, wait_until};

const NODES: usize = 100;
const DELETED: usize = 10;
const FOREIGN: (&str, &str) = ("10.244.200.0/24", "192.168.50.7");

async fn router_routes(admin: &Admin, router: &str) -> Option<Vec<(String, String)>> {
    let mut r = admin.routes(router).await.ok()?.0;
    r.sort();
    Some(r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_routers_route_100_nodes_follow_10_deletions_and_cleanup_leaves_foreign_routes() {
    let t0 = std::time::Instant::now();
    let c = TestCluster::acquire().await.expect("API server");
    let neutron = neutron_server().await.expect("neutron-server");
    let admin = Admin::new(&neutron.url);
    let mut routers = Vec::new();
    for name in ["e2e-zone-a", "e2e-zone-b"] {
        let r = admin
            .create_router(name, "10.60.0.0/24")
            .await
            .expect("router");
        admin
            .set_route_quota(&r.project_id, 200)
            .await
            .expect("quota");
        // Another tool's route: its next hop is on another subnet.
        admin
            .add_subnet(&r, "192.168.50.0/24")
            .await
            .expect("subnet");
        admin
            .add_routes(&r.router_id, &[FOREIGN])
            .await
            .expect("add the foreign route");
        routers.push(r);
    }
    for i in 0..NODES {
        c.create_node(
            &TestNode::new(format!("os-zone-{i}"))
                .pod_cidrs([format!("10.244.{i}.0/24")])
                .internal_ip(format!("10.60.0.{}", 10 + i)),
        )
        .await
        .expect("create the test Node");
    }
    let dir = TempDir::new("openstack-routers");
    let cfg = dir.path().join("openstack.yaml");
    std::fs::write(
        &cfg,
        format!(
            "auth_type: noauth\nendpoint: {}\nrouter_ids: [{}, {}]\nnode_subnets: [10.60.0.0/24]\n",
            neutron.url, routers[0].router_id, routers[1].router_id
        ),
    )
    .expect("write the cloud config");
    let mut ctl = Controller::start(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "openstack",
            "--cloud-config",
            cfg.to_str().expect("utf-8 path"),
            "--leader-elect=false",
            "--metrics-bind-address",
            "0",
        ],
    );
    let expect = |live: std::ops::Range<usize>| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = live
            .map(|i| (format!("10.244.{i}.0/24"), format!("10.60.0.{}", 10 + i)))
            .chain([(FOREIGN.0.to_string(), FOREIGN.1.to_string())])
            .collect();
        v.sort();
        v
    };
    let all = expect(0..NODES);
    wait_until(
        Duration::from_secs(240),
        "100 Node routes on both routers",
        || async {
            for r in &routers {
                if router_routes(&admin, &r.router_id).await? != all {
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
        c.delete_node(&format!("os-zone-{i}"))
            .await
            .expect("delete Node");
    }
    let left = expect(0..NODES - DELETED);
    wait_until(
        Duration::from_secs(120),
        "the 10 deleted Nodes' routes gone from both routers",
        || async {
            for r in &routers {
                if router_routes(&admin, &r.router_id).await? != left {
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

    let cfg_path = cfg.to_str().expect("utf-8 path");
    let args = [
        "--cluster-cidr",
        "10.244.0.0/16",
        "--cloud-provider",
        "openstack",
        "--cloud-config",
        cfg_path,
    ];
    cleanup_deletes(&args, &[], 2 * (NODES - DELETED)).await;
    for r in &routers {
        assert_eq!(
            router_routes(&admin, &r.router_id).await.expect("router"),
            vec![(FOREIGN.0.to_string(), FOREIGN.1.to_string())],
            "{}: only the foreign route is left",
            r.router_id
        );
    }
    eprintln!(
        "two routers: {NODES} Nodes routed after {routed:?}, done after {:?}",
        t0.elapsed()
    );
}
