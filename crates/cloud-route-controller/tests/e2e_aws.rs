//! End to end: the binary with `--cloud-provider aws` against the real API
//! server and a moto EC2 server: routes land in the route table tagged for
//! this cluster, follow Node deletions, and another cluster's table is never
//! touched.

mod common;

use std::time::Duration;

use common::{Controller, TempDir};
use provider_aws::testing::{
    client, create_network, moto_endpoint, run_instances, table_routes, unique_cluster,
};
use test_cluster::{TestCluster, TestNode, wait_until};

#[tokio::test]
async fn nodes_get_routes_in_their_clusters_table_and_lose_them_on_deletion() {
    let c = TestCluster::acquire().await.unwrap();
    let endpoint = moto_endpoint().await.unwrap();
    let ec2 = client(&endpoint).await;
    let cluster = unique_cluster("e2e");
    let other = unique_cluster("other");
    let net = create_network(&ec2, "10.30.0.0/16", Some(&cluster))
        .await
        .unwrap();
    let foreign = create_network(&ec2, "10.31.0.0/16", Some(&other))
        .await
        .unwrap();
    let instances = run_instances(&ec2, &net, 3).await.unwrap();
    let foreign_before = table_routes(&ec2, &foreign.route_table_id).await.unwrap();
    for (i, inst) in instances.iter().enumerate() {
        c.create_node(
            &TestNode::new(format!("aws-{i}"))
                .pod_cidrs([format!("10.244.{}.0/24", 40 + i)])
                .internal_ip(format!("10.30.0.{}", 10 + i))
                .provider_id(&inst.provider_id),
        )
        .await
        .unwrap();
    }
    let dir = TempDir::new("aws");
    let cfg = dir.path().join("aws.yaml");
    std::fs::write(&cfg, format!("region: us-east-1\nendpoint: {endpoint}\n")).unwrap();
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
            cfg.to_str().unwrap(),
            "--leader-elect=false",
            "--metrics-bind-address",
            "0",
        ],
        &[
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_REGION", "us-east-1"),
        ],
    );
    let ours = |routes: Vec<(String, String, String)>| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = routes
            .into_iter()
            .filter(|(d, _, _)| d.starts_with("10.244."))
            .map(|(d, t, _)| (d, t))
            .collect();
        v.sort();
        v
    };
    wait_until(
        Duration::from_secs(120),
        "3 routes in the cluster's table",
        || async {
            let r = ours(table_routes(&ec2, &net.route_table_id).await.ok()?);
            (r.len() == 3).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let r = ours(table_routes(&ec2, &net.route_table_id).await.unwrap());
    assert_eq!(
        r[0],
        ("10.244.40.0/24".to_string(), instances[0].id.clone())
    );
    c.delete_node("aws-1").await.unwrap();
    wait_until(
        Duration::from_secs(60),
        "route of the deleted node removed",
        || async {
            let r = ours(table_routes(&ec2, &net.route_table_id).await.ok()?);
            (r.len() == 2 && !r.iter().any(|(d, _)| d == "10.244.41.0/24")).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    assert_eq!(
        table_routes(&ec2, &foreign.route_table_id).await.unwrap(),
        foreign_before,
        "another cluster's route table was touched"
    );
    assert!(ctl.is_running());
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");
}
