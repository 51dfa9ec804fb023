//! The controller against a real kube-apiserver (the test-cluster fixture)
//! and the simulated cloud: watcher, triggers, passes, status patches and
//! Events all go through the real API.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use provider_memory::{MemoryCloud, Operation};
use route_cloud::{CloudRoutes, ErrorKind};
use route_controller::testing::{self, CLUSTER, Fixture};
use route_controller::{BackoffConfig, KubeStatusWriter, Mode, NodeStore};
use route_core::{Route, parse_cluster_cidrs};
use serde_json::json;
use test_cluster::{ClusterGuard, TestCluster, TestNode, wait_until};
const WAIT: Duration = Duration::from_secs(30);
const MODES: [Mode; 3] = [Mode::Periodic, Mode::Watch, Mode::Incremental];

/// The running controller and the Node watcher feeding its cache.
struct Running {
    run: testing::Running,
    watcher: tokio::task::JoinHandle<()>,
}

impl Running {
    async fn stop(self) {
        self.run.stop().await;
        let _ = self.watcher.await;
    }

    fn drain_passes(&mut self) -> usize {
        self.run.passes().len()
    }
}

fn start(c: &ClusterGuard, mode: Mode, cloud: &MemoryCloud, resync: Duration) -> Running {
    let mut fx = Fixture::new(mode, &[]);
    // Filled by the watcher from the API server, not synced up front.
    fx.nodes = NodeStore::new(None);
    fx.config.plan.cluster_cidrs =
        parse_cluster_cidrs("10.244.0.0/16,fd00:10::/56").expect("the test CIDRs are valid");
    // Shorter than production so the test does not sit idle; the exact
    // cadence is tested on a virtual clock in tests/timing.rs.
    fx.config.timing.period = Duration::from_secs(2);
    fx.config.timing.min_interval = Duration::from_secs(2);
    fx.config.timing.resync = resync;
    // As the binary: backoff with jitter, the deletion grace.
    fx.config.backoff = BackoffConfig::default();
    fx.config.deletion_grace = route_controller::controller::DEFAULT_DELETION_GRACE;
    let nodes = fx.nodes.clone();
    let run = fx.start_writing_to(
        Arc::new(cloud.clone()) as Arc<dyn CloudRoutes>,
        Arc::new(KubeStatusWriter::new(c.client(), "test")),
    );
    let watcher = tokio::spawn(route_controller::watch::watch_nodes(
        c.client(),
        nodes,
        route_controller::select::NodeSelector::default(),
        run.shutdown.clone(),
    ));
    Running { run, watcher }
}

fn hour() -> Duration {
    Duration::from_secs(3600)
}

fn routes_of(cloud: &MemoryCloud, node: &str) -> Vec<Route> {
    cloud
        .routes(CLUSTER)
        .into_iter()
        .filter(|r| r.node == node)
        .collect()
}

async fn wait_routes(cloud: &MemoryCloud, node: &str, n: usize, what: &str) {
    wait_until(WAIT, what, || async {
        (routes_of(cloud, node).len() == n).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

async fn wait_condition(c: &ClusterGuard, node: &str, status: &str, reason: &str) {
    wait_until(
        WAIT,
        &format!("{node} NetworkUnavailable={status}/{reason}"),
        || async {
            let cond = c.network_unavailable(node).await.ok()??;
            (cond.status == status && cond.reason.as_deref() == Some(reason)).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test]
async fn new_node_gets_its_route_and_network_available_in_every_mode() {
    let c = TestCluster::acquire().await.unwrap();
    for mode in MODES {
        let cloud = MemoryCloud::default();
        let ctl = start(&c, mode, &cloud, hour());
        let name = format!("n-{}", mode.as_str());
        c.create_node(
            &TestNode::new(&name)
                .pod_cidrs(["10.244.1.0/24"])
                .internal_ip("10.0.0.1"),
        )
        .await
        .unwrap();
        wait_routes(&cloud, &name, 1, "route created").await;
        wait_condition(&c, &name, "False", "RouteCreated").await;
        let r = &routes_of(&cloud, &name)[0];
        assert_eq!(r.destination.to_string(), "10.244.1.0/24");
        ctl.stop().await;
        c.delete_node(&name).await.unwrap();
    }
}

#[tokio::test]
async fn dual_stack_node_gets_both_routes() {
    let c = TestCluster::acquire().await.unwrap();
    let cloud = MemoryCloud::default();
    let ctl = start(&c, Mode::Incremental, &cloud, hour());
    c.create_node(
        &TestNode::new("ds")
            .pod_cidrs(["10.244.7.0/24", "fd00:10:0:7::/64"])
            .internal_ip("10.0.0.7"),
    )
    .await
    .unwrap();
    wait_routes(&cloud, "ds", 2, "two routes").await;
    let mut d: Vec<String> = routes_of(&cloud, "ds")
        .iter()
        .map(|r| r.destination.to_string())
        .collect();
    d.sort();
    assert_eq!(d, vec!["10.244.7.0/24", "fd00:10:0:7::/64"]);
    wait_condition(&c, "ds", "False", "RouteCreated").await;
    ctl.stop().await;
}

#[tokio::test]
async fn deleted_node_loses_its_routes_in_every_mode() {
    let c = TestCluster::acquire().await.unwrap();
    for mode in MODES {
        let cloud = MemoryCloud::default();
        let ctl = start(&c, mode, &cloud, hour());
        c.create_node(&TestNode::new("gone").pod_cidrs(["10.244.2.0/24"]))
            .await
            .unwrap();
        c.create_node(&TestNode::new("stays").pod_cidrs(["10.244.3.0/24"]))
            .await
            .unwrap();
        wait_routes(&cloud, "gone", 1, "route created").await;
        c.delete_node("gone").await.unwrap();
        wait_routes(&cloud, "gone", 0, "route deleted").await;
        assert_eq!(routes_of(&cloud, "stays").len(), 1, "{mode:?}");
        ctl.stop().await;
        c.delete_node("stays").await.unwrap();
    }
}

#[tokio::test]
async fn address_change_recreates_the_route_when_the_provider_reports_addresses() {
    let c = TestCluster::acquire().await.unwrap();
    for mode in [Mode::Watch, Mode::Incremental] {
        let cloud = MemoryCloud::default();
        let ctl = start(&c, mode, &cloud, hour());
        c.create_node(
            &TestNode::new("moves")
                .pod_cidrs(["10.244.4.0/24"])
                .internal_ip("10.0.0.4"),
        )
        .await
        .unwrap();
        wait_routes(&cloud, "moves", 1, "route created").await;
        let patch =
            json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.44"}]}});
        c.nodes()
            .patch_status("moves", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        wait_until(WAIT, "route re-created with the new address", || async {
            let r = routes_of(&cloud, "moves");
            (r.len() == 1 && r[0].node_addresses.iter().any(|a| a.address == "10.0.0.44"))
                .then_some(())
        })
        .await
        .unwrap();
        let deletes = cloud.stats().total("delete");
        assert_eq!(deletes, 1, "{mode:?}: update = delete + create");
        ctl.stop().await;
        c.delete_node("moves").await.unwrap();
    }
}

#[tokio::test]
async fn routes_of_nodes_deleted_while_stopped_are_removed_at_start() {
    let c = TestCluster::acquire().await.unwrap();
    for mode in MODES {
        let cloud = MemoryCloud::default();
        cloud.insert_route(CLUSTER, Route::from_text("ghost", "10.244.99.0/24"));
        // Outside the cluster CIDRs: not ours, never touched.
        cloud.insert_route(CLUSTER, Route::from_text("ghost", "192.168.0.0/24"));
        let ctl = start(&c, mode, &cloud, hour());
        wait_until(WAIT, "stale route removed", || async {
            (routes_of(&cloud, "ghost").len() == 1).then_some(())
        })
        .await
        .unwrap();
        assert_eq!(
            routes_of(&cloud, "ghost")[0].destination.to_string(),
            "192.168.0.0/24",
            "{mode:?}"
        );
        ctl.stop().await;
    }
}

#[tokio::test]
async fn route_deleted_behind_the_back_comes_back_at_the_next_drift_sync() {
    let c = TestCluster::acquire().await.unwrap();
    for mode in MODES {
        let cloud = MemoryCloud::default();
        let ctl = start(&c, mode, &cloud, Duration::from_secs(4));
        c.create_node(&TestNode::new("drift").pod_cidrs(["10.244.5.0/24"]))
            .await
            .unwrap();
        wait_routes(&cloud, "drift", 1, "route created").await;
        let lists = cloud.stats().total("list");
        cloud.remove_route(CLUSTER, &routes_of(&cloud, "drift")[0].destination);
        wait_routes(&cloud, "drift", 1, "route restored by a full sync").await;
        assert!(
            cloud.stats().total("list") > lists,
            "{mode:?}: restored by a list"
        );
        ctl.stop().await;
        c.delete_node("drift").await.unwrap();
    }
}

#[tokio::test]
async fn failed_creation_is_retried_without_any_node_event_and_warns() {
    let c = TestCluster::acquire().await.unwrap();
    for mode in MODES {
        let cloud = MemoryCloud::default();
        cloud.fail_next(Operation::Create, 2, ErrorKind::Transient);
        let ctl = start(&c, mode, &cloud, hour());
        let name = format!("retry-{}", mode.as_str());
        let created: Node = c
            .create_node(&TestNode::new(&name).pod_cidrs(["10.244.6.0/24"]))
            .await
            .unwrap();
        wait_condition(&c, &name, "True", "NoRouteCreated").await;
        wait_routes(&cloud, &name, 1, "route created after retries").await;
        wait_condition(&c, &name, "False", "RouteCreated").await;
        assert_eq!(cloud.stats().total("create"), 3, "{mode:?}");
        let events = c.node_events(&name).await.unwrap();
        let failed: Vec<_> = events
            .iter()
            .filter(|e| e.reason.as_deref() == Some("FailedToCreateRoute"))
            .collect();
        assert_eq!(failed.len(), 2, "{mode:?}: one event per failed attempt");
        for e in failed {
            assert_eq!(e.type_.as_deref(), Some("Warning"));
            let o = &e.involved_object;
            assert_eq!(o.api_version.as_deref(), Some("v1"));
            assert_eq!(o.kind.as_deref(), Some("Node"));
            assert_eq!(o.uid, created.metadata.uid);
        }
        ctl.stop().await;
        c.delete_node(&name).await.unwrap();
    }
}

#[tokio::test]
async fn two_hundred_heartbeats_cause_no_reconcile_and_no_cloud_call() {
    let c = TestCluster::acquire().await.unwrap();
    for mode in [Mode::Watch, Mode::Incremental] {
        let cloud = MemoryCloud::default();
        let mut ctl = start(&c, mode, &cloud, hour());
        for i in 0..4 {
            c.create_node(
                &TestNode::new(format!("hb-{i}")).pod_cidrs([format!("10.244.{}.0/24", 10 + i)]),
            )
            .await
            .unwrap();
        }
        for i in 0..4 {
            wait_condition(&c, &format!("hb-{i}"), "False", "RouteCreated").await;
        }
        // Let the passes caused by creation (and the controller's own status
        // patches arriving through the watch) settle: until 3 s go by
        // without one, however late a loaded machine runs them.
        let settle = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_secs(3)).await;
            if ctl.drain_passes() == 0 {
                break;
            }
            assert!(
                settle.elapsed() < Duration::from_secs(60),
                "{mode:?}: passes kept coming for a minute without a change"
            );
        }
        let calls = |cl: &MemoryCloud| {
            cl.stats().total("list") + cl.stats().total("create") + cl.stats().total("delete")
        };
        let before = calls(&cloud);
        for i in 0..200 {
            c.heartbeat(&format!("hb-{}", i % 4)).await.unwrap();
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            ctl.drain_passes(),
            0,
            "{mode:?}: heartbeats triggered a reconcile"
        );
        assert_eq!(
            calls(&cloud),
            before,
            "{mode:?}: heartbeats caused cloud calls"
        );
        ctl.stop().await;
        for i in 0..4 {
            c.delete_node(&format!("hb-{i}")).await.unwrap();
        }
    }
}

#[tokio::test]
async fn external_cloud_provider_order_routes_the_node_when_its_provider_id_arrives() {
    // Regression: with --cloud-provider=external the pod CIDR comes before
    // the providerID; the refused creation backed off to 5 minutes and the
    // providerID did not even trigger (route 298 s after it was set).
    let c = TestCluster::acquire().await.unwrap();
    for mode in [Mode::Incremental, Mode::Watch] {
        // Shaped like AWS: routes name the instance of the providerID and
        // carry no node addresses.
        let cloud = MemoryCloud::new(provider_memory::MemoryConfig {
            needs: route_core::TargetNeeds::ProviderId,
            reports_node_addresses: false,
            ..Default::default()
        })
        .unwrap();
        let ctl = start(&c, mode, &cloud, hour());
        let name = format!("late-{}", mode.as_str());
        // The kubelet registers: tainted, no providerID, no addresses; node
        // IPAM assigns the pod CIDR at once.
        c.create_node(
            &TestNode::new(&name)
                .pod_cidrs(["10.244.40.0/24"])
                .uninitialized(),
        )
        .await
        .unwrap();
        // It says what it waits for.
        wait_condition(&c, &name, "True", "AwaitingNodeData").await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            cloud.stats().total("create"),
            0,
            "{mode:?}: no creation the cloud must refuse"
        );
        // Seconds later the cloud-controller-manager's node controller fills
        // in providerID and addresses and removes the taint.
        c.nodes()
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({
                    "spec": {"providerID": "aws:///eu-west-1a/i-0late", "taints": null}
                })),
            )
            .await
            .unwrap();
        c.nodes()
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({
                    "status": {"addresses": [{"type": "InternalIP", "address": "10.0.40.1"}]}
                })),
            )
            .await
            .unwrap();
        wait_routes(&cloud, &name, 1, "route after the providerID").await;
        wait_condition(&c, &name, "False", "RouteCreated").await;
        let r = &routes_of(&cloud, &name)[0];
        assert_eq!(
            r.node_provider_id.as_deref(),
            Some("aws:///eu-west-1a/i-0late")
        );
        assert_eq!(
            cloud.stats().total("create"),
            1,
            "{mode:?}: exactly one creation"
        );
        let events = c.node_events(&name).await.unwrap();
        assert!(
            events
                .iter()
                .all(|e| e.reason.as_deref() != Some("FailedToCreateRoute")),
            "{mode:?}: waiting for node data is not a failure"
        );
        ctl.stop().await;
        c.delete_node(&name).await.unwrap();
    }
}

#[tokio::test]
async fn condition_patch_for_a_recreated_node_of_the_same_name_is_refused() {
    // Regression: the nodes/status patch carried no UID precondition and
    // could land on a Node re-created under the same name.
    use route_controller::{NodeRef, StatusWriter};
    let c = TestCluster::acquire().await.unwrap();
    let old = c
        .create_node(&TestNode::new("again").pod_cidrs(["10.244.41.0/24"]))
        .await
        .unwrap();
    let old_uid = old.metadata.uid.clone().unwrap();
    c.delete_node("again").await.unwrap();
    let new = c
        .create_node(&TestNode::new("again").pod_cidrs(["10.244.41.0/24"]))
        .await
        .unwrap();
    let writer = KubeStatusWriter::new(c.client(), "test");
    let stale = NodeRef {
        name: "again".into(),
        uid: old_uid,
    };
    let r = writer
        .set_condition(&stale, route_core::NetworkCondition::RouteCreated)
        .await;
    assert!(
        r.is_err(),
        "a patch meant for the old Node must fail: {r:?}"
    );
    assert!(c.network_unavailable("again").await.unwrap().is_none());
    let current = NodeRef {
        name: "again".into(),
        uid: new.metadata.uid.clone().unwrap(),
    };
    writer
        .set_condition(&current, route_core::NetworkCondition::RouteCreated)
        .await
        .unwrap();
    assert!(c.network_unavailable("again").await.unwrap().is_some());
    c.delete_node("again").await.unwrap();
}
