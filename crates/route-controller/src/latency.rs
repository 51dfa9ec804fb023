//! Route latency: how long each pod CIDR waited for its route.
//!
//! [`RouteLatency`] owns one piece of state, "when was this Node's pod CIDR
//! first seen, and is it still waiting". The Node store feeds it every watch
//! event beside the Node cache, and the status step asks it, after a pass,
//! which waits ended. It sees Nodes only as [`NodeView`]s, so it depends on
//! nothing of the Node side but the planner's types. It keeps nothing about routes
//! and decides nothing about them; it only measures
//! `route_controller_node_route_latency_seconds`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use route_core::{Cidr, NetworkCondition, NodeView, Plan, PodCidr};
use tokio::time::Instant;

/// The pod CIDRs of one Node (by UID) and when each was first seen;
/// `None` once its route was confirmed, so later updates of the Node
/// (heartbeats, the controller's own condition patch) start no new
/// measurement.
#[derive(Debug)]
struct Seen {
    name: String,
    cidrs: Vec<(Cidr, Option<Instant>)>,
}

impl Seen {
    fn awaiting(&self) -> usize {
        self.cidrs.iter().filter(|(_, t)| t.is_some()).count()
    }
}

/// First sightings of pod CIDRs that still await their route.
#[derive(Debug, Default)]
pub struct RouteLatency {
    /// Per Node UID. Looked up for every managed Node in a pass while any
    /// awaits a route, hence the fast hasher; keys are UIDs the API server
    /// assigned.
    first_seen: HashMap<String, Seen, foldhash::fast::RandomState>,
    /// How many `Some` entries `first_seen` holds: passes skip this
    /// bookkeeping entirely while nothing awaits a route.
    awaiting: usize,
    /// UIDs seen in a relist that is in progress.
    relist: Option<HashSet<String>>,
}

impl RouteLatency {
    /// Nothing seen yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A relist of all Nodes starts.
    pub fn relist_started(&mut self) {
        self.relist = Some(HashSet::new());
    }

    /// A Node of a relist.
    pub fn listed(&mut self, v: &NodeView) {
        if let Some(live) = &mut self.relist {
            live.insert(v.uid.clone());
        }
        self.note_cidrs(v);
    }

    /// The relist is complete: Nodes it did not list are gone.
    pub fn relist_done(&mut self) {
        if let Some(live) = self.relist.take() {
            self.first_seen.retain(|uid, _| live.contains(uid));
            self.awaiting = self.first_seen.values().map(Seen::awaiting).sum();
        }
    }

    /// A Node was added or changed.
    pub fn seen(&mut self, v: &NodeView) {
        self.note_cidrs(v);
    }

    /// The Node with this UID was deleted.
    pub fn deleted(&mut self, uid: &str) {
        if let Some(gone) = self.first_seen.remove(uid) {
            self.awaiting -= gone.awaiting();
        }
    }

    fn note_cidrs(&mut self, v: &NodeView) {
        let mut cidrs = v.pod_cidrs.iter().filter_map(|c| match c {
            PodCidr::Valid(c) => Some(*c),
            PodCidr::Invalid(_) => None,
        });
        let Some(first) = cidrs.next() else { return };
        // Looked up before inserting so a heartbeat does not allocate a key.
        let seen = match self.first_seen.get_mut(v.uid.as_str()) {
            Some(seen) => seen,
            None => self.first_seen.entry(v.uid.clone()).or_insert(Seen {
                name: v.name.clone(),
                cidrs: Vec::new(),
            }),
        };
        let now = Instant::now();
        for c in std::iter::once(first).chain(cidrs) {
            if !seen.cidrs.iter().any(|(s, _)| *s == c) {
                seen.cidrs.push((c, Some(now)));
                self.awaiting += 1;
            }
        }
    }

    /// After a pass: ends the wait of every pod CIDR whose Node has all its
    /// routes in place (`failed` says which of the plan's creations did not
    /// land) and returns how long each waited. Nodes the plan left out whose
    /// condition already says `RouteCreated` were routed before this
    /// controller saw them (a previous leader, a restart): they are
    /// forgotten without a measurement. `node` looks a Node up by name.
    pub fn confirm(
        &mut self,
        node: impl Fn(&str) -> Option<Arc<NodeView>>,
        plan: &Plan,
        failed: impl Fn(&route_core::OpKey) -> bool,
    ) -> Vec<Duration> {
        let mut waited = Vec::new();
        if self.awaiting == 0 {
            return waited;
        }
        for n in plan.nodes.iter().filter(|n| n.routed_after(&failed)) {
            if !self.awaits_route(&n.uid) {
                continue;
            }
            let Some(v) = node(&n.node) else {
                continue;
            };
            for c in v.valid_pod_cidrs() {
                waited.extend(self.confirm_route(&v.uid, c));
            }
        }
        let planned: HashSet<&str> = plan.nodes.iter().map(|n| n.node.as_str()).collect();
        self.forget_settled(node, |name| planned.contains(name));
        waited
    }

    /// Stops waiting for the routes of Nodes not `planned` whose condition
    /// already says `RouteCreated`.
    fn forget_settled(
        &mut self,
        node: impl Fn(&str) -> Option<Arc<NodeView>>,
        planned: impl Fn(&str) -> bool,
    ) {
        if self.awaiting == 0 {
            return;
        }
        for (uid, seen) in &mut self.first_seen {
            if seen.awaiting() == 0 || planned(&seen.name) {
                continue;
            }
            let settled = node(&seen.name).is_some_and(|v| {
                v.uid == *uid
                    && NetworkCondition::RouteCreated.already_set(v.network_unavailable.as_ref())
            });
            if settled {
                for (_, t) in &mut seen.cidrs {
                    if t.take().is_some() {
                        self.awaiting -= 1;
                    }
                }
            }
        }
    }

    /// Some pod CIDR still awaits its first route.
    pub fn awaiting_routes(&self) -> bool {
        self.awaiting > 0
    }

    /// Some pod CIDR of the Node with this UID still awaits its first route.
    pub fn awaits_route(&self, uid: &str) -> bool {
        self.first_seen
            .get(uid)
            .is_some_and(|seen| seen.awaiting() > 0)
    }

    /// A route for this Node and CIDR is confirmed; returns how long ago the
    /// CIDR was first seen, once per (Node, CIDR).
    pub fn confirm_route(&mut self, uid: &str, cidr: Cidr) -> Option<Duration> {
        let seen = self.first_seen.get_mut(uid)?;
        let (_, t) = seen.cidrs.iter_mut().find(|(c, _)| *c == cidr)?;
        let t = t.take()?;
        self.awaiting -= 1;
        Some(t.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The Nodes by name and the latency, fed together as the store does.
    #[derive(Default)]
    struct Fed {
        nodes: BTreeMap<String, Arc<NodeView>>,
        latency: RouteLatency,
    }

    impl Fed {
        fn synced(nodes: &[NodeView]) -> Self {
            let mut f = Fed::default();
            f.latency.relist_started();
            for n in nodes {
                f.latency.listed(n);
                f.nodes.insert(n.name.clone(), Arc::new(n.clone()));
            }
            f.latency.relist_done();
            f
        }

        fn apply(&mut self, v: NodeView) {
            self.latency.seen(&v);
            self.nodes.insert(v.name.clone(), Arc::new(v));
        }

        fn delete(&mut self, name: &str) {
            if let Some(v) = self.nodes.remove(name) {
                self.latency.deleted(&v.uid);
            }
        }
    }

    fn view(name: &str, cidrs: &[&str]) -> NodeView {
        NodeView::new(name, format!("uid-{name}"), cidrs)
    }

    fn cidr(s: &str) -> Cidr {
        Cidr::parse(s).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn route_latency_is_measured_once_from_first_sight() {
        let mut f = Fed::synced(&[]);
        f.apply(view("a", &["10.0.0.0/24"]));
        tokio::time::advance(Duration::from_millis(1500)).await;
        let c = &mut f.latency;
        assert_eq!(
            c.confirm_route("uid-a", cidr("10.0.0.0/24")),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(c.confirm_route("uid-a", cidr("10.0.0.0/24")), None);
        // Later updates of the same Node (a heartbeat) start no new measurement.
        f.apply(view("a", &["10.0.0.0/24"]));
        tokio::time::advance(Duration::from_millis(10)).await;
        assert_eq!(f.latency.confirm_route("uid-a", cidr("10.0.0.0/24")), None);
        assert!(!f.latency.awaiting_routes());
    }

    #[tokio::test(start_paused = true)]
    async fn awaiting_routes_counts_only_unconfirmed_cidrs_of_live_nodes() {
        let mut f = Fed::synced(&[]);
        assert!(!f.latency.awaiting_routes());
        f.apply(view("a", &["10.0.0.0/24"]));
        f.apply(view("b", &["10.0.1.0/24", "fd00::/64"]));
        assert!(f.latency.awaits_route("uid-a") && f.latency.awaits_route("uid-b"));
        assert_eq!(
            f.latency.confirm_route("uid-b", cidr("10.0.1.0/24")),
            Some(Default::default())
        );
        assert!(f.latency.awaits_route("uid-b"), "the IPv6 CIDR still waits");
        f.delete("b");
        assert!(!f.latency.awaits_route("uid-b"));
        assert_eq!(
            f.latency.confirm_route("uid-a", cidr("10.0.0.0/24")),
            Some(Default::default())
        );
        assert!(!f.latency.awaiting_routes());
        // A Node gone during a watch gap is forgotten at the relist.
        f.apply(view("d", &["10.0.3.0/24"]));
        f.latency.relist_started();
        f.latency.listed(&view("a", &["10.0.0.0/24"]));
        f.latency.relist_done();
        assert!(!f.latency.awaiting_routes());
    }

    #[tokio::test(start_paused = true)]
    async fn forget_settled_drops_only_unplanned_nodes_already_marked_routed() {
        let routed =
            |name: &str, cidr: &str| view(name, &[cidr]).with_condition("False", "RouteCreated");
        let mut f = Fed::synced(&[
            routed("old", "10.0.0.0/24"),
            view("new", &["10.0.1.0/24"]),
            routed("planned", "10.0.2.0/24"),
        ]);
        let nodes = f.nodes.clone();
        f.latency
            .forget_settled(|n| nodes.get(n).cloned(), |name| name == "planned");
        // A route from before this controller saw the Node: nothing to measure.
        assert!(!f.latency.awaits_route("uid-old"));
        // No condition yet, or named by the plan: still measured.
        assert!(f.latency.awaits_route("uid-new"));
        assert!(f.latency.awaits_route("uid-planned"));
        assert!(f.latency.awaiting_routes());
    }

    #[tokio::test(start_paused = true)]
    async fn confirm_measures_routed_nodes_of_a_plan_and_not_failed_ones() {
        let mut f = Fed::synced(&[]);
        f.apply(view("a", &["10.0.0.0/24"]));
        f.apply(view("b", &["10.0.1.0/24"]));
        tokio::time::advance(Duration::from_millis(250)).await;
        let nodes: Vec<Arc<NodeView>> = f.nodes.values().cloned().collect();
        let plan = route_core::plan(
            &nodes,
            &[],
            &route_core::PlanConfig {
                cluster_cidrs: vec![cidr("10.0.0.0/16")],
                ..route_core::PlanConfig::default()
            },
        );
        assert_eq!(plan.creations.len(), 2);
        let b = plan
            .creations
            .iter()
            .find(|c| c.route.node.as_str() == "b")
            .unwrap()
            .key();
        let lookup = f.nodes.clone();
        let waited = f
            .latency
            .confirm(|n| lookup.get(n).cloned(), &plan, |k| *k == b);
        assert_eq!(waited, vec![Duration::from_millis(250)]);
        assert!(!f.latency.awaits_route("uid-a"));
        assert!(f.latency.awaits_route("uid-b"), "its creation failed");
    }
}
