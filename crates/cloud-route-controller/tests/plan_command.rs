//! `cloud-route-controller plan` against the real API server and a cloud-sim
//! server: on a cluster with a stale route (its node is gone), a missing
//! route and a correct one, it prints exactly that plan, as JSON and as a
//! table, and the simulated cloud sees only list calls.

mod common;

use std::process::Stdio;
use std::time::Duration;

use cloud_sim::{AdminClient, SimServer};
use common::{TempDir, binary, sim_cloud_config};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use provider_memory::{MemoryConfig, Operation};
use route_core::{CreationReason, DeletionReason, Destination, NodeAddress, Plan, Route};
use serde_json::{Value, json};
use test_cluster::{TestCluster, TestNode};

const CLUSTER: &str = "kubernetes";
const CLUSTER_CIDR: &str = "10.244.0.0/16";

fn internal(ip: &str) -> Vec<NodeAddress> {
    vec![NodeAddress {
        kind: "InternalIP".into(),
        address: ip.into(),
    }]
}

/// Runs `plan` with `extra` flags; returns stdout, asserting exit 0.
async fn plan(kubeconfig: &std::path::Path, config: &std::path::Path, extra: &[&str]) -> String {
    let out = tokio::process::Command::new(binary())
        .arg("plan")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--cluster-cidr", CLUSTER_CIDR, "--cloud-provider", "memory"])
        .arg("--cloud-config")
        .arg(config)
        .args(extra)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .expect("plan finished within 120 s")
        .expect("run plan");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "plan {extra:?} failed: {:?}\n{stderr}\n{stdout}",
        out.status
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_prints_exactly_the_stale_and_missing_routes_and_changes_nothing() {
    let c = TestCluster::acquire().await.unwrap();
    let sim = SimServer::start_local(MemoryConfig::default())
        .await
        .unwrap();
    let admin = AdminClient::new(&sim.url()).unwrap();
    let dir = TempDir::new("plan");
    let config = sim_cloud_config(dir.path(), "cloud", &sim.url(), None);

    c.create_node(
        &TestNode::new("good")
            .pod_cidrs(["10.244.1.0/24"])
            .internal_ip("10.0.0.1"),
    )
    .await
    .unwrap();
    c.create_node(
        &TestNode::new("missing")
            .pod_cidrs(["10.244.2.0/24"])
            .internal_ip("10.0.0.2"),
    )
    .await
    .unwrap();
    // The correct route already carries the condition it implies, so the
    // only condition to change is the missing route's node.
    let condition = json!({"status": {"conditions": [{
        "type": "NetworkUnavailable",
        "status": "False",
        "reason": "RouteCreated",
        "message": "RouteController created a route",
        "lastTransitionTime": "2024-01-01T00:00:00Z",
        "lastHeartbeatTime": "2024-01-01T00:00:00Z",
    }]}});
    c.nodes()
        .patch_status(
            "good",
            &PatchParams::default(),
            &Patch::Strategic(&condition),
        )
        .await
        .unwrap();
    let good = Route::from_text("good", "10.244.1.0/24")
        .named("r-good")
        .with_addresses(internal("10.0.0.1"), true);
    let stale = Route::from_text("gone", "10.244.9.0/24")
        .named("r-gone")
        .with_addresses(internal("10.0.0.9"), true);
    admin.insert_route(CLUSTER, &good).await.unwrap();
    admin.insert_route(CLUSTER, &stale).await.unwrap();
    // Another cluster's table is not this plan's business.
    admin
        .insert_route(
            "other",
            &Route::from_text("x", "10.244.3.0/24").named("r-x"),
        )
        .await
        .unwrap();
    let before = admin.state().await.unwrap().clusters;
    let nodes_before: Vec<Node> = c.nodes().list(&Default::default()).await.unwrap().items;
    admin.clear_log().await.unwrap();

    let json_out = plan(c.kubeconfig_path(), &config, &["-o", "json"]).await;
    let report: Value = serde_json::from_str(&json_out)
        .unwrap_or_else(|e| panic!("plan -o json is not one JSON document ({e}):\n{json_out}"));
    assert_eq!(report["cluster_name"], CLUSTER, "{json_out}");
    assert_eq!(report["nodes"], 2, "{json_out}");
    assert_eq!(
        report["routes"], 2,
        "only this cluster's routes: {json_out}"
    );
    let p: Plan = serde_json::from_value(report["plan"].clone())
        .unwrap_or_else(|e| panic!("the plan does not read back ({e}):\n{json_out}"));

    assert_eq!(p.deletions.len(), 1, "{json_out}");
    let d = &p.deletions[0];
    assert_eq!(d.route.name, "r-gone");
    assert_eq!(d.route.node, "gone");
    assert_eq!(d.route.destination, Destination::parse("10.244.9.0/24"));
    assert_eq!(d.reason, DeletionReason::NodeGone);

    assert_eq!(p.creations.len(), 1, "{json_out}");
    let cr = &p.creations[0];
    assert_eq!(cr.route.node, "missing");
    assert_eq!(cr.route.destination, Destination::parse("10.244.2.0/24"));
    assert_eq!(cr.reason, CreationReason::Missing);
    assert!(cr.after.is_empty(), "nothing to wait for: {json_out}");
    let missing_uid = nodes_before
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some("missing"))
        .and_then(|n| n.metadata.uid.clone())
        .unwrap();
    assert_eq!(cr.node_uid, missing_uid, "the name hint is the node's UID");

    assert!(p.conflicts.is_empty(), "{json_out}");
    assert!(p.outside_cluster.is_empty(), "{json_out}");
    assert!(p.invalid_pod_cidrs.is_empty(), "{json_out}");
    assert!(p.unparsable_routes.is_empty(), "{json_out}");

    assert_eq!(
        report["conditions"],
        json!([{
            "node": "missing",
            "status": "False",
            "reason": "RouteCreated",
            "current": null,
        }]),
        "only the node without a route changes its condition: {json_out}"
    );

    let table = plan(c.kubeconfig_path(), &config, &[]).await;
    for want in [
        "Nothing has been changed",
        "2 nodes, 2 cloud routes",
        "ROUTES TO DELETE (1)",
        "r-gone",
        "10.244.9.0/24",
        "ROUTES TO CREATE (1)",
        "10.244.2.0/24",
        "NODE CONDITIONS TO SET",
        "NetworkUnavailable=False/RouteCreated",
    ] {
        assert!(table.contains(want), "table lacks {want:?}:\n{table}");
    }
    let create_line = table.lines().find(|l| l.contains("10.244.2.0/24")).unwrap();
    assert!(create_line.contains("missing"), "{table}");
    let delete_line = table.lines().find(|l| l.contains("r-gone")).unwrap();
    assert!(delete_line.contains("gone"), "{table}");
    // Each operation says what a freshly started controller's first pass
    // does with it: the gone Node's route waits the deletion grace.
    assert!(
        delete_line.contains("held for the deletion grace"),
        "{table}"
    );
    assert!(create_line.contains("runs in this pass"), "{table}");
    let verdicts = |r: &Value| {
        r["first_pass"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["runs"].as_bool().unwrap(),
                    f["operation"].as_str().unwrap().to_string(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        verdicts(&report),
        [
            (false, "delete 10.244.9.0/24 (r-gone) to gone".to_string()),
            (
                true,
                format!("create 10.244.2.0/24 for Node uid {missing_uid}")
            ),
        ],
        "{json_out}"
    );
    let no_grace = plan(
        c.kubeconfig_path(),
        &config,
        &["--route-deletion-grace", "0s", "-o", "json"],
    )
    .await;
    let no_grace: Value = serde_json::from_str(&no_grace).unwrap();
    assert!(
        verdicts(&no_grace).iter().all(|(runs, _)| *runs),
        "without a grace everything runs: {no_grace}"
    );
    for absent in ["r-good", "10.244.1.0/24", "r-x", "CONFLICT"] {
        assert!(
            !table.contains(absent),
            "table mentions {absent:?}:\n{table}"
        );
    }

    // Only reads reached the cloud, and nothing changed anywhere.
    let log = admin.log(0).await.unwrap();
    assert!(
        log.iter().filter(|e| e.op == Operation::List).count() >= 2,
        "each plan lists the routes: {log:?}"
    );
    assert!(
        log.iter().all(|e| e.op == Operation::List),
        "plan made a call other than list: {log:?}"
    );
    assert_eq!(admin.state().await.unwrap().clusters, before);
    let nodes_after: Vec<Node> = c.nodes().list(&Default::default()).await.unwrap().items;
    let versions = |ns: &[Node]| {
        ns.iter()
            .map(|n| (n.metadata.name.clone(), n.metadata.resource_version.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        versions(&nodes_after),
        versions(&nodes_before),
        "plan wrote to a Node"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_says_so_when_cluster_and_cloud_agree() {
    let c = TestCluster::acquire().await.unwrap();
    let sim = SimServer::start_local(MemoryConfig::default())
        .await
        .unwrap();
    let admin = AdminClient::new(&sim.url()).unwrap();
    let dir = TempDir::new("plan-noop");
    let config = sim_cloud_config(dir.path(), "cloud", &sim.url(), None);
    let json_out = plan(c.kubeconfig_path(), &config, &["--output", "json"]).await;
    let report: Value = serde_json::from_str(&json_out).unwrap();
    let p: Plan = serde_json::from_value(report["plan"].clone()).unwrap();
    assert!(p.is_noop(), "{json_out}");
    assert_eq!(report["conditions"], json!([]), "{json_out}");
    let table = plan(c.kubeconfig_path(), &config, &["--output", "table"]).await;
    assert!(table.contains("no change needed"), "{table}");
    assert!(!table.contains("ROUTES TO"), "{table}");
    let log = admin.log(0).await.unwrap();
    assert!(
        !log.is_empty() && log.iter().all(|e| e.op == Operation::List),
        "{log:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_names_a_route_missing_under_route_created_as_drift_and_lists_the_latest_repairs() {
    use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    let c = TestCluster::acquire().await.unwrap();
    let sim = SimServer::start_local(MemoryConfig::default())
        .await
        .unwrap();
    let dir = TempDir::new("plan-drift");
    let config = sim_cloud_config(dir.path(), "cloud", &sim.url(), None);
    c.create_node(
        &TestNode::new("drifted")
            .pod_cidrs(["10.244.5.0/24"])
            .internal_ip("10.0.0.5"),
    )
    .await
    .unwrap();
    // It reads RouteCreated, but the cloud has no route for it: someone
    // deleted it since the controller last looked.
    let condition = json!({"status": {"conditions": [{
        "type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated",
        "message": "RouteController created a route",
        "lastTransitionTime": "2024-01-01T00:00:00Z", "lastHeartbeatTime": "2024-01-01T00:00:00Z",
    }]}});
    c.nodes()
        .patch_status(
            "drifted",
            &PatchParams::default(),
            &Patch::Strategic(&condition),
        )
        .await
        .unwrap();
    // A repair the controller's drift check made earlier.
    let events: kube::Api<Event> = kube::Api::namespaced(c.client(), "default");
    let event = Event {
        metadata: ObjectMeta {
            name: Some("drifted.repaired".into()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            kind: Some("Node".into()),
            name: Some("drifted".into()),
            ..Default::default()
        },
        reason: Some("RouteRepaired".into()),
        message: Some("the route to 10.244.5.0/24 was missing: someone else deleted it".into()),
        type_: Some("Warning".into()),
        source: Some(EventSource {
            component: Some("route_controller".into()),
            host: None,
        }),
        count: Some(1),
        last_timestamp: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        ..Default::default()
    };
    events.create(&Default::default(), &event).await.unwrap();

    let json_out = plan(c.kubeconfig_path(), &config, &["-o", "json"]).await;
    let report: Value = serde_json::from_str(&json_out).unwrap();
    assert_eq!(
        report["drift"],
        json!([{"node": "drifted", "destination": "10.244.5.0/24", "table": ""}]),
        "{json_out}"
    );
    let repairs = report["recent_repairs"].as_array().unwrap();
    assert_eq!(repairs.len(), 1, "{json_out}");
    assert_eq!(repairs[0]["node"], "drifted");
    assert_eq!(repairs[0]["reason"], "RouteRepaired");
    let table = plan(c.kubeconfig_path(), &config, &[]).await;
    for want in [
        "DRIFT (1): routes missing although their Node reads RouteCreated",
        "  drifted 10.244.5.0/24",
        "REPAIRED BY THE DRIFT CHECK",
        "drifted RouteRepaired (x1): the route to 10.244.5.0/24 was missing",
    ] {
        assert!(table.contains(want), "table lacks {want:?}:\n{table}");
    }
}

/// `plan --exit-code`'s status (what the chart's `helm test` Pod checks):
/// 3 while a Node's route is missing, 0 once the route and its condition
/// are in place; without the flag, 0 either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_exit_code_is_3_while_a_route_is_missing_and_0_once_in_step() {
    let c = TestCluster::acquire().await.unwrap();
    let sim = SimServer::start_local(MemoryConfig::default())
        .await
        .unwrap();
    let admin = AdminClient::new(&sim.url()).unwrap();
    let dir = TempDir::new("plan-exit-code");
    let config = sim_cloud_config(dir.path(), "cloud", &sim.url(), None);
    let status = |extra: &'static [&'static str]| {
        let kubeconfig = c.kubeconfig_path().to_owned();
        let config = config.clone();
        async move {
            let out = tokio::process::Command::new(binary())
                .arg("plan")
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(["--cluster-cidr", CLUSTER_CIDR, "--cloud-provider", "memory"])
                .arg("--cloud-config")
                .arg(&config)
                .args(extra)
                .stdin(Stdio::null())
                .output();
            let out = tokio::time::timeout(Duration::from_secs(120), out)
                .await
                .expect("plan finished within 120 s")
                .expect("run plan");
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        }
    };
    c.create_node(
        &TestNode::new("unrouted")
            .pod_cidrs(["10.244.7.0/24"])
            .internal_ip("10.0.0.7"),
    )
    .await
    .unwrap();
    let (code, out) = status(&["--exit-code"]).await;
    assert_eq!(code, Some(3), "{out}");
    assert!(out.contains("ROUTES TO CREATE"), "{out}");
    assert_eq!(status(&[]).await.0, Some(0), "without --exit-code");

    let route = Route::from_text("unrouted", "10.244.7.0/24")
        .named("r-unrouted")
        .with_addresses(internal("10.0.0.7"), true);
    admin.insert_route(CLUSTER, &route).await.unwrap();
    let condition = json!({"status": {"conditions": [{
        "type": "NetworkUnavailable",
        "status": "False",
        "reason": "RouteCreated",
        "message": "RouteController created a route",
        "lastTransitionTime": "2024-01-01T00:00:00Z",
        "lastHeartbeatTime": "2024-01-01T00:00:00Z",
    }]}});
    c.nodes()
        .patch_status(
            "unrouted",
            &PatchParams::default(),
            &Patch::Strategic(&condition),
        )
        .await
        .unwrap();
    let (code, out) = status(&["--exit-code"]).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("no change needed"), "{out}");
}
