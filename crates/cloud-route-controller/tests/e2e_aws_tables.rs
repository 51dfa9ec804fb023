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

/// How long the two clusters run side by side with Nodes coming and going.
pub const SIDE_BY_SIDE: Duration = Duration::from_secs(300);

/// One cluster of the shared-table test: its control plane, instances,
/// Node names and controller (talking to EC2 through its own proxy, so
/// the proxy's log is its controller's requests alone).
struct Side {
    name: String,
    kube: kube::Client,
    kubeconfig: std::path::PathBuf,
    proxy: Proxy,
    instances: Vec<provider_aws::testing::Instance>,
    /// Third octet of the pod CIDRs of this cluster's Nodes.
    base: usize,
}

impl Side {
    fn cidr(&self, i: usize) -> String {
        format!("10.244.{}.0/24", self.base + i)
    }

    async fn create(&self, i: usize) {
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(self.kube.clone());
        let node = TestNode::new(format!("{}-{i}", self.name))
            .pod_cidrs([self.cidr(i)])
            .internal_ip(format!("10.60.0.{}", self.base + i))
            .provider_id(&self.instances[i].provider_id)
            .to_node();
        nodes
            .create(&Default::default(), &node)
            .await
            .expect("create Node");
    }

    async fn delete(&self, i: usize) {
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(self.kube.clone());
        nodes
            .delete(&format!("{}-{i}", self.name), &Default::default())
            .await
            .expect("delete Node");
    }
}

// AKS #1639, cloud-provider-openstack #3128: two clusters on one route
// table with overlapping cluster CIDRs delete each other's routes forever.
// Here each cluster's instances carry its `kubernetes.io/cluster/<name>`
// tag, and neither controller ever deletes a route to the other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_with_overlapping_cidrs_share_one_table_for_5_minutes_without_deleting_each_others_routes()
 {
    use rand::{Rng, SeedableRng};
    const PER_SIDE: usize = 12;
    let endpoint = moto_endpoint().await.expect("moto");
    let ec2 = client(&endpoint).await;
    let a_name = unique_cluster("share-a");
    let b_name = unique_cluster("share-b");
    let net = create_network(&ec2, "10.60.0.0/16", Some(&a_name))
        .await
        .expect("network");
    let table = net.route_table_id.clone();
    provider_aws::testing::tag(&ec2, &table, &cluster_tag_key(&b_name), "shared")
        .await
        .expect("tag the table for the second cluster");
    // Five minutes, so on control planes of its own (the shared one serves
    // one test at a time); `scripts/test.sh` runs it beside the others.
    let plane_a = test_cluster::ControlPlane::start(test_cluster::StartOptions::default())
        .await
        .expect("the first cluster's control plane");
    let plane_b = test_cluster::ControlPlane::start(test_cluster::StartOptions::default())
        .await
        .expect("the second cluster's control plane");
    let mut sides = Vec::new();
    for (name, kubeconfig, base) in [
        (&a_name, plane_a.kubeconfig().to_path_buf(), 0),
        (&b_name, plane_b.kubeconfig().to_path_buf(), 100),
    ] {
        let instances = run_instances(&ec2, &net, PER_SIDE as i32 + 1)
            .await
            .expect("instances");
        for i in &instances {
            provider_aws::testing::tag(&ec2, &i.id, &cluster_tag_key(name), "owned")
                .await
                .expect("tag the instance");
        }
        sides.push(Side {
            name: name.clone(),
            kube: test_cluster::client_from_kubeconfig(&kubeconfig)
                .await
                .expect("client"),
            kubeconfig,
            proxy: Proxy::start(&endpoint).await.expect("proxy"),
            instances,
            base,
        });
    }
    let dir = TempDir::new("aws-shared-table");
    let env = [
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_REGION", "us-east-1"),
    ];
    let mut ctls = Vec::new();
    for s in &sides {
        let cfg = dir.path().join(format!("{}.yaml", s.name));
        std::fs::write(
            &cfg,
            format!(
                "region: us-east-1\nendpoint: {}\nrate_limit:\n  write: {{per_second: 100, burst: 200}}\n",
                s.proxy.url()
            ),
        )
        .expect("write the cloud config");
        ctls.push(Controller::start_with_env(
            &s.kubeconfig,
            dir.path(),
            &s.name,
            &[
                // Both clusters claim the whole range.
                "--cluster-cidr",
                "10.244.0.0/16",
                "--cluster-name",
                &s.name,
                "--cloud-provider",
                "aws",
                "--cloud-config",
                cfg.to_str().expect("utf-8 path"),
                "--min-resync-period",
                "20s",
                "--leader-elect=false",
                "--metrics-bind-address",
                "0",
            ],
            &env,
        ));
    }
    let mut live: Vec<Vec<bool>> = vec![vec![false; PER_SIDE]; 2];
    for (s, live) in sides.iter().zip(&mut live) {
        for (i, l) in live.iter_mut().enumerate().take(PER_SIDE - 2) {
            s.create(i).await;
            *l = true;
        }
    }
    // The overlap: cluster B's last Node claims cluster A's Node 0's pod
    // CIDR, after A routed it.
    let a0 = sides[0].cidr(0);
    wait_until(
        Duration::from_secs(120),
        "cluster A's first routes",
        || async {
            pod_routes(&ec2, &table)
                .await?
                .iter()
                .any(|(d, _)| *d == a0)
                .then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctls[0].log_text()));
    let overlap = format!("{b_name}-overlap");
    {
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
            kube::Api::all(sides[1].kube.clone());
        let node = TestNode::new(&overlap)
            .pod_cidrs([a0.clone()])
            .internal_ip("10.60.0.250")
            .provider_id(&sides[1].instances[PER_SIDE].provider_id)
            .to_node();
        nodes
            .create(&Default::default(), &node)
            .await
            .expect("create Node");
    }

    // Nodes come and go on both sides.
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let until = std::time::Instant::now() + SIDE_BY_SIDE;
    let mut changes = 0;
    while std::time::Instant::now() < until {
        let side = rng.random_range(0..2);
        let i = rng.random_range(1..PER_SIDE);
        if live[side][i] {
            sides[side].delete(i).await;
        } else {
            sides[side].create(i).await;
        }
        live[side][i] = !live[side][i];
        changes += 1;
        tokio::time::sleep(Duration::from_millis(rng.random_range(2_000..8_000))).await;
    }
    // Then both settle to exactly their live Nodes' routes, and the
    // overlapping claim stays A's.
    let want: Vec<(String, String)> = {
        let mut v: Vec<(String, String)> = sides
            .iter()
            .zip(&live)
            .flat_map(|(s, live)| {
                live.iter()
                    .enumerate()
                    .filter(|(_, l)| **l)
                    .map(|(i, _)| (s.cidr(i), s.instances[i].id.clone()))
            })
            .collect();
        v.sort();
        v
    };
    wait_until(
        Duration::from_secs(120),
        "both clusters settled",
        || async { (pod_routes(&ec2, &table).await? == want).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nA: {}\nB: {}", ctls[0].log_text(), ctls[1].log_text()));
    // Neither deleted nor replaced a route of the other. A CreateRoute for
    // the other's destination cannot change it (EC2 answers
    // RouteAlreadyExists); an incremental pass planned against its cached
    // table may send one before the next list shows whose the route is.
    for (s, other) in [(&sides[0], &sides[1]), (&sides[1], &sides[0])] {
        let theirs: Vec<String> = (0..PER_SIDE).map(|i| other.cidr(i)).collect();
        let (mut deletes, mut blind_creates) = (0, 0);
        for r in s.proxy.log() {
            let dest = r.param("DestinationCidrBlock").replace("%2F", "/");
            match r.action.as_str() {
                "DeleteRoute" | "ReplaceRoute" => assert!(
                    !theirs.contains(&dest),
                    "{} sent {} for {dest}, a route of {}",
                    s.name,
                    r.action,
                    other.name
                ),
                "CreateRoute" if theirs.contains(&dest) => blind_creates += 1,
                _ => {}
            }
            deletes += usize::from(r.action == "DeleteRoute");
        }
        assert!(
            blind_creates <= 2,
            "{}: {blind_creates} CreateRoute for {}'s destinations",
            s.name,
            other.name
        );
        eprintln!(
            "{}: {deletes} DeleteRoute, all of its own routes; {blind_creates} CreateRoute refused for the other's destination",
            s.name
        );
    }
    // One Warning for the overlap, on the Node that lost it.
    let events: kube::Api<k8s_openapi::api::core::v1::Event> =
        kube::Api::all(sides[1].kube.clone());
    let warned: Vec<_> = events
        .list(&kube::api::ListParams::default().fields(&format!(
            "involvedObject.kind=Node,involvedObject.name={overlap}"
        )))
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("PodCIDROverlap"))
        .collect();
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert_eq!(warned[0].count.unwrap_or(1), 1, "warned once");
    let cond = test_cluster::condition(
        &kube::Api::<k8s_openapi::api::core::v1::Node>::all(sides[1].kube.clone())
            .get_status(&overlap)
            .await
            .expect("Node"),
        "NetworkUnavailable",
    )
    .cloned()
    .expect("condition");
    assert_eq!(cond.reason.as_deref(), Some("PodCIDRConflict"));
    eprintln!("two clusters side by side for {SIDE_BY_SIDE:?}: {changes} Node changes");
    for mut ctl in ctls {
        assert!(ctl.is_running());
        let text = ctl.log_text();
        assert_eq!(ctl.stop(), Some(0), "{text}");
    }
    plane_a.stop().expect("stop the first control plane");
    plane_b.stop().expect("stop the second control plane");
}
