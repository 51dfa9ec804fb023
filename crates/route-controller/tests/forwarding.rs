//! Routes that carry traffic: a Node's forwarding prerequisite (what the
//! cloud needs on its instance before it delivers the pod traffic the Node
//! forwards) as the loop learns it, on tokio's paused clock, in every mode.
//!
//! The cloud is the simulated one behind a wrapper that adds the
//! prerequisite in the two shapes real clouds have: one only the operator
//! can fix (GCE `canIpForward`, Azure NIC IP forwarding), remembered once
//! found on; and one the provider repairs itself (the AWS
//! source/destination check), found off only when read afresh.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use provider_memory::{MemoryCloud, MemoryConfig};
use route_cloud::{
    Batch, BatchResult, Capabilities, CloudError, CloudRoutes, Forwarding, ForwardingCheck,
    RequestStats,
};
use route_controller::forwarding::RECHECK;
use route_controller::testing::{CLUSTER, Fixture, Running};
use route_controller::{Mode, NodeEvent};
use route_core::{NetworkCondition, NodeView, Route, parse_cluster_cidrs};
use tokio::time::sleep;

/// Who turns a prerequisite that is off back on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// Only the operator (GCE, Azure): the provider answers `Disabled`.
    OperatorFixes,
    /// The provider, when asked to repair (AWS): it answers `Repaired`.
    ProviderRepairs,
}

#[derive(Default)]
struct Instances {
    /// Nodes whose instance cannot forward now.
    off: BTreeSet<String>,
    /// What the provider remembers as ready (never read again when not fresh).
    remembered: BTreeSet<String>,
    /// Reads of one instance, by Node.
    reads: BTreeMap<String, u32>,
    /// Every Node the controller asked about, fresh or not.
    asked: BTreeSet<String>,
}

/// The simulated cloud plus a forwarding prerequisite of `shape`.
struct Cloud {
    routes: MemoryCloud,
    shape: Shape,
    instances: Mutex<Instances>,
}

impl Cloud {
    fn new(shape: Shape) -> Arc<Cloud> {
        Arc::new(Cloud {
            routes: MemoryCloud::new(MemoryConfig::default()).expect("valid"),
            shape,
            instances: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Instances> {
        self.instances.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_forwarding(&self, node: &str, on: bool) {
        let mut i = self.lock();
        if on {
            i.off.remove(node);
        } else {
            i.off.insert(node.to_string());
        }
    }

    fn reads(&self, node: &str) -> u32 {
        let i = self.lock();
        i.reads.get(node).copied().unwrap_or(0)
    }
}

#[async_trait]
impl CloudRoutes for Cloud {
    fn name(&self) -> &'static str {
        "forwarding"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            checks_forwarding: true,
            max_routes_per_family: false,
            ..self.routes.capabilities()
        }
    }

    fn stats(&self) -> &RequestStats {
        self.routes.stats()
    }

    async fn list_routes(&self, cluster: &str) -> Result<Vec<Route>, CloudError> {
        self.routes.list_routes(cluster).await
    }

    async fn create_route(
        &self,
        cluster: &str,
        name_hint: &str,
        route: &Route,
    ) -> Result<Route, CloudError> {
        self.routes.create_route(cluster, name_hint, route).await
    }

    async fn delete_route(&self, cluster: &str, route: &Route) -> Result<(), CloudError> {
        self.routes.delete_route(cluster, route).await
    }

    async fn apply_batch(&self, cluster: &str, batch: &Batch) -> Result<BatchResult, CloudError> {
        self.routes.apply_batch(cluster, batch).await
    }

    async fn check_forwarding(
        &self,
        _cluster: &str,
        nodes: &[Arc<NodeView>],
        check: ForwardingCheck,
    ) -> Result<Vec<(String, Forwarding)>, CloudError> {
        let mut i = self.lock();
        let mut out = Vec::new();
        for n in nodes {
            let name = n.name.clone();
            i.asked.insert(name.clone());
            if !check.fresh && i.remembered.contains(&name) {
                out.push((name, Forwarding::Ready));
                continue;
            }
            *i.reads.entry(name.clone()).or_default() += 1;
            let what = format!("instance of {name} cannot forward");
            let answer = match (i.off.contains(&name), self.shape) {
                (false, _) => Forwarding::Ready,
                (true, Shape::OperatorFixes) => Forwarding::Disabled {
                    what,
                    fix: "turn it on".into(),
                },
                (true, Shape::ProviderRepairs) if check.repair => {
                    i.off.remove(&name);
                    Forwarding::Repaired { what }
                }
                (true, Shape::ProviderRepairs) => Forwarding::WouldRepair { what },
            };
            if matches!(answer, Forwarding::Ready | Forwarding::Repaired { .. }) {
                i.remembered.insert(name.clone());
            }
            out.push((name, answer));
        }
        Ok(out)
    }
}

/// The running controller over the wrapped cloud.
struct Run(Running);

impl Deref for Run {
    type Target = Running;
    fn deref(&self) -> &Running {
        &self.0
    }
}

impl Run {
    fn start(mode: Mode, cloud: Arc<Cloud>, resync: Duration) -> Run {
        Run::start_with(mode, cloud, resync, Duration::ZERO, Vec::new())
    }

    fn start_with(
        mode: Mode,
        cloud: Arc<Cloud>,
        resync: Duration,
        drift: Duration,
        skip_families: Vec<route_core::IpFamily>,
    ) -> Run {
        let mut fx = Fixture::new(mode, &[]);
        fx.config.plan.cluster_cidrs =
            parse_cluster_cidrs("10.244.0.0/16,fd00:10::/56").expect("valid");
        fx.config.plan.skip_families = skip_families;
        fx.config.timing.resync = resync;
        fx.config.timing.drift = drift;
        Run(fx.start(cloud))
    }

    fn add(&self, i: usize) {
        let n = NodeView::new(
            format!("node-{i}"),
            format!("uid-{i}"),
            &[&format!("10.244.{i}.0/24")],
        );
        self.nodes.apply(NodeEvent::Apply(n));
    }

    fn condition(&self, i: usize) -> Option<NetworkCondition> {
        self.status.condition_of(&format!("node-{i}"))
    }

    fn warnings(&self, reason: &str) -> Vec<String> {
        self.status
            .recorded()
            .events
            .into_iter()
            .filter(|(_, r, _)| r == reason)
            .map(|(n, _, _)| n.name)
            .collect()
    }

    /// No Node was ever written `RouteCreated` while its instance was
    /// known to be unable to forward: `forbidden` lists those Nodes.
    fn never_route_created(&self, node: &str) {
        assert!(
            !self
                .status
                .recorded()
                .conditions
                .iter()
                .any(|(n, c)| n.name == node && *c == NetworkCondition::RouteCreated),
            "{node} read RouteCreated while its instance could not forward"
        );
    }
}

/// The sequence: one of two Nodes sits on an instance the operator created
/// without forwarding. It keeps its route (traffic flows the moment the
/// instance is fixed), reads `ForwardingDisabled` with one Warning, and
/// reads `RouteCreated` within a recheck of the fix, even with no Node
/// event in between; the Node that can forward is read once, never again.
#[tokio::test(start_paused = true)]
async fn a_node_on_an_instance_that_cannot_forward_keeps_its_route_reads_forwarding_disabled_and_clears_within_a_recheck_of_the_fix()
 {
    for mode in Mode::ALL {
        let cloud = Cloud::new(Shape::OperatorFixes);
        cloud.set_forwarding("node-1", false);
        let run = Run::start(mode, cloud.clone(), Duration::from_secs(12 * 3600));
        sleep(Duration::from_secs(1)).await;
        run.add(0);
        run.add(1);
        sleep(Duration::from_secs(12)).await;
        assert_eq!(cloud.routes.routes(CLUSTER).len(), 2, "{mode}: both routed");
        assert_eq!(
            run.condition(0),
            Some(NetworkCondition::RouteCreated),
            "{mode}"
        );
        assert_eq!(
            run.condition(1),
            Some(NetworkCondition::ForwardingDisabled),
            "{mode}"
        );
        assert_eq!(run.warnings("ForwardingDisabled"), ["node-1"], "{mode}");
        // Minutes pass: one Warning per streak, no flapping.
        sleep(RECHECK * 2).await;
        assert_eq!(run.warnings("ForwardingDisabled"), ["node-1"], "{mode}");
        run.never_route_created("node-1");
        cloud.set_forwarding("node-1", true);
        sleep(RECHECK + Duration::from_secs(11)).await;
        assert_eq!(
            run.condition(1),
            Some(NetworkCondition::RouteCreated),
            "{mode}: cleared within a recheck of the fix"
        );
        assert_eq!(
            cloud.reads("node-0"),
            1,
            "{mode}: found ready, never read again"
        );
        assert_eq!(cloud.routes.routes(CLUSTER).len(), 2, "{mode}");
    }
}

/// The sequence: a prerequisite the provider owns (the AWS
/// source/destination check) is turned back on behind the controller's
/// back. The resync reads it afresh and repairs it, with one
/// `ForwardingRepaired` Warning; the Node never leaves `RouteCreated`.
/// A Node whose instance is prepared before its first route (the check
/// was on from the start) gets no Warning.
#[tokio::test(start_paused = true)]
async fn a_prerequisite_lost_behind_the_back_is_repaired_at_the_next_resync_with_one_warning() {
    const RESYNC: Duration = Duration::from_secs(120);
    for mode in Mode::ALL {
        let cloud = Cloud::new(Shape::ProviderRepairs);
        let run = Run::start(mode, cloud.clone(), RESYNC);
        sleep(Duration::from_secs(1)).await;
        run.add(0);
        run.add(1);
        sleep(Duration::from_secs(12)).await;
        assert_eq!(cloud.routes.routes(CLUSTER).len(), 2, "{mode}");
        cloud.set_forwarding("node-1", false);
        sleep(RESYNC + Duration::from_secs(11)).await;
        assert!(
            !cloud.lock().off.contains("node-1"),
            "{mode}: repaired within a resync"
        );
        assert_eq!(run.warnings("ForwardingRepaired"), ["node-1"], "{mode}");
        assert_eq!(
            run.condition(1),
            Some(NetworkCondition::RouteCreated),
            "{mode}"
        );
        assert!(run.warnings("ForwardingDisabled").is_empty(), "{mode}");
        // Node 2's instance starts with the prerequisite off: its first
        // resync read is its preparation, not a repair.
        cloud.set_forwarding("node-2", false);
        run.add(2);
        sleep(RESYNC * 2).await;
        assert_eq!(run.warnings("ForwardingRepaired"), ["node-1"], "{mode}");
        assert_eq!(
            run.condition(2),
            Some(NetworkCondition::RouteCreated),
            "{mode}"
        );
    }
}

/// Hands off what is not routed. Regression: the check ran over every
/// instance a listed route targets, so a Node left out by --node-selector
/// that a hand-made route pointed at had its prerequisite changed and got a
/// ForwardingRepaired Warning.
#[tokio::test(start_paused = true)]
async fn a_left_out_node_and_a_node_of_an_unrouted_family_are_never_asked_about_across_drift_checks()
 {
    let drift = Duration::from_secs(60);
    for mode in Mode::ALL {
        let cloud = Cloud::new(Shape::ProviderRepairs);
        // A hand-made route to the left-out Node, whose instance is off.
        cloud
            .routes
            .insert_route(CLUSTER, Route::from_text("left-out", "10.244.9.0/24"));
        cloud.set_forwarding("left-out", false);
        cloud.set_forwarding("v6-only", false);
        let run = Run::start_with(
            mode,
            cloud.clone(),
            Duration::from_secs(12 * 3600),
            drift,
            vec![route_core::IpFamily::V6],
        );
        sleep(Duration::from_secs(1)).await;
        run.add(0);
        let mut out = NodeView::new("left-out", "uid-left-out", &["10.244.9.0/24"]);
        out.excluded = true;
        run.nodes.apply(NodeEvent::Apply(out));
        run.nodes.apply(NodeEvent::Apply(NodeView::new(
            "v6-only",
            "uid-v6-only",
            &["fd00:10::/64"],
        )));
        sleep(drift * 3 + Duration::from_secs(5)).await;
        let asked = cloud.lock().asked.clone();
        assert!(asked.contains("node-0"), "{mode}: {asked:?}");
        assert!(!asked.contains("left-out"), "{mode}: {asked:?}");
        assert!(!asked.contains("v6-only"), "{mode}: {asked:?}");
        assert!(run.warnings("ForwardingRepaired").is_empty(), "{mode}");
        assert!(cloud.lock().off.contains("left-out"), "{mode}: untouched");
        assert!(
            cloud.reads("node-0") >= 3,
            "{mode}: the routed Node is read afresh at every drift check ({} reads)",
            cloud.reads("node-0")
        );
    }
}
