//! The Node cache: what the controller knows about the cluster's Nodes.
//!
//! Owned by the controller and fed by exactly one writer (the watcher task in
//! [`crate::watch`], or a simulator). It keeps one small [`NodeView`] per Node
//! — pod CIDRs, addresses, provider id, the NetworkUnavailable condition —
//! instead of whole Node objects, which is what keeps memory flat at thousands
//! of Nodes. Every change is classified here: only changes that can alter
//! routes (a Node added or deleted, `spec.podCIDRs` changed, `status.addresses`
//! changed as a set) are reported as triggers; heartbeats, conditions, labels
//! and taints are absorbed silently.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use route_core::{Cidr, ConditionState, NetworkCondition, NodeAddress, NodeView, PodCidr};
use tokio::time::Instant;

/// Converts a Node into the view routing needs.
pub fn node_view(node: &Node) -> NodeView {
    let spec = node.spec.as_ref();
    let status = node.status.as_ref();
    NodeView {
        name: node.metadata.name.clone().unwrap_or_default(),
        uid: node.metadata.uid.clone().unwrap_or_default(),
        pod_cidrs: spec
            .and_then(|s| s.pod_cidrs.as_ref())
            .map(|v| v.iter().map(|c| PodCidr::parse(c)).collect())
            .unwrap_or_default(),
        addresses: status
            .and_then(|s| s.addresses.as_ref())
            .map(|v| {
                v.iter()
                    .map(|a| NodeAddress::new(&a.type_, a.address.clone()))
                    .collect()
            })
            .unwrap_or_default(),
        provider_id: spec.and_then(|s| s.provider_id.clone()),
        deleting: node.metadata.deletion_timestamp.is_some(),
        network_unavailable: status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "NetworkUnavailable"))
            .map(|c| ConditionState::new(&c.status, c.reason.as_deref().unwrap_or_default())),
    }
}

/// Whether two views of a Node need the same routes: same UID, same pod
/// CIDRs in order (the API keeps them ordered), same providerID (a route
/// waiting for it, or pointing at the instance it names, must be planned
/// again), same addresses as a set (kubelets may reorder them). Runs on
/// every heartbeat, so the common case (nothing changed at all) allocates
/// nothing.
fn same_routing(a: &NodeView, b: &NodeView) -> bool {
    if a.uid != b.uid || a.pod_cidrs != b.pod_cidrs || a.provider_id != b.provider_id {
        return false;
    }
    if a.addresses == b.addresses {
        return true;
    }
    fn set(v: &NodeView) -> Vec<&NodeAddress> {
        let mut x: Vec<&NodeAddress> = v.addresses.iter().collect();
        x.sort_unstable();
        x.dedup();
        x
    }
    set(a) == set(b)
}

/// Why the cache asks for a reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The initial list (or a relist after a watch gap) completed.
    Synced,
    /// A Node was added or deleted, or its pod CIDRs or addresses changed.
    NodeChanged,
}

/// A watch event, already reduced to views. Mirrors kube-runtime's
/// `watcher::Event` so the real watcher and a simulator feed the cache the
/// same way.
#[derive(Debug, Clone)]
pub enum NodeEvent {
    /// A (re)list starts.
    Init,
    /// One Node of the (re)list.
    InitApply(NodeView),
    /// The (re)list is complete; Nodes not seen in it are gone.
    InitDone,
    /// A Node was added or modified.
    Apply(NodeView),
    /// A Node was deleted.
    Delete(NodeView),
}

/// The pod CIDRs of one Node (by UID) and when each was first seen.
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

/// Counters the cache keeps about what it absorbed (for tests and metrics).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    /// Events that changed routing-relevant fields (reported as triggers).
    pub triggers: u64,
    /// Events that changed nothing routing-relevant (heartbeats, conditions, labels).
    pub absorbed: u64,
}

/// The Node cache. Not thread-safe by itself; the controller wraps it in a mutex.
#[derive(Debug, Default)]
pub struct NodeCache {
    nodes: BTreeMap<String, Arc<NodeView>>,
    relist: Option<BTreeMap<String, Arc<NodeView>>>,
    synced: bool,
    /// Per Node UID, when each of its pod CIDRs was first seen; `None` once
    /// its route was confirmed, so later updates of the Node (heartbeats, the
    /// controller's own condition patch) do not start a new measurement.
    /// Looked up for every managed Node in a pass while any awaits a route,
    /// hence the fast hasher; keys are UIDs the API server assigned.
    first_seen: HashMap<String, Seen, foldhash::fast::RandomState>,
    /// How many `Some` entries `first_seen` holds: passes skip the latency
    /// bookkeeping entirely while nothing awaits a route.
    awaiting: usize,
    stats: CacheStats,
}

impl NodeCache {
    /// An empty, unsynced cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one event; returns the trigger it causes, if any.
    pub fn apply(&mut self, event: NodeEvent) -> Option<Trigger> {
        let trigger = match event {
            NodeEvent::Init => {
                self.relist = Some(BTreeMap::new());
                None
            }
            NodeEvent::InitApply(v) => {
                let name = v.name.clone();
                let v = Arc::new(v);
                self.note_cidrs(&v);
                match &mut self.relist {
                    Some(buf) => {
                        buf.insert(name, v);
                    }
                    // An InitApply without Init: treat it as a plain apply.
                    None => {
                        self.nodes.insert(name, v);
                    }
                }
                None
            }
            NodeEvent::InitDone => {
                if let Some(buf) = self.relist.take() {
                    let live: std::collections::HashSet<&str> =
                        buf.values().map(|v| v.uid.as_str()).collect();
                    self.first_seen.retain(|uid, _| live.contains(uid.as_str()));
                    self.awaiting = self.first_seen.values().map(Seen::awaiting).sum();
                    self.nodes = buf;
                }
                self.synced = true;
                // Always reconcile after a (re)list: Nodes deleted while the
                // watch was down produce no Delete event, only their absence.
                Some(Trigger::Synced)
            }
            NodeEvent::Apply(v) => {
                self.note_cidrs(&v);
                match self.nodes.get_mut(v.name.as_str()) {
                    // Most events are heartbeats that change nothing this
                    // cache keeps: the stored view stays where it is, so the
                    // cache neither allocates nor scatters across the heap.
                    Some(old) if **old == v => None,
                    Some(old) => {
                        let changed = !same_routing(old, &v);
                        *old = Arc::new(v);
                        changed.then_some(Trigger::NodeChanged)
                    }
                    None => {
                        self.nodes.insert(v.name.clone(), Arc::new(v));
                        Some(Trigger::NodeChanged)
                    }
                }
            }
            NodeEvent::Delete(v) => {
                if let Some(gone) = self.first_seen.remove(v.uid.as_str()) {
                    self.awaiting -= gone.awaiting();
                }
                self.nodes.remove(&v.name);
                Some(Trigger::NodeChanged)
            }
        };
        match trigger {
            Some(Trigger::NodeChanged) => self.stats.triggers += 1,
            None if self.synced => self.stats.absorbed += 1,
            _ => {}
        }
        trigger
    }

    fn note_cidrs(&mut self, v: &NodeView) {
        let mut cidrs = v.pod_cidrs.iter().filter_map(|c| match c {
            PodCidr::Valid(c) => Some(*c),
            PodCidr::Invalid(_) => None,
        });
        let Some(first) = cidrs.next() else { return };
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

    /// Stops waiting for the routes of Nodes a plan left out as settled
    /// (`planned` says which names it listed) whose condition already says
    /// `RouteCreated`: their routes were made before this controller saw
    /// them (a previous leader, a restart), so there is no latency to measure.
    pub fn forget_settled(&mut self, planned: impl Fn(&str) -> bool) {
        if self.awaiting == 0 {
            return;
        }
        for (uid, seen) in &mut self.first_seen {
            if seen.awaiting() == 0 || planned(&seen.name) {
                continue;
            }
            let settled = self.nodes.get(&seen.name).is_some_and(|v| {
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

    /// A route for this node and CIDR is confirmed; returns how long ago the
    /// CIDR was first seen, once per (node, CIDR).
    pub fn confirm_route(&mut self, uid: &str, cidr: Cidr) -> Option<std::time::Duration> {
        let seen = self.first_seen.get_mut(uid)?;
        let (_, t) = seen.cidrs.iter_mut().find(|(c, _)| *c == cidr)?;
        let t = t.take()?;
        self.awaiting -= 1;
        Some(t.elapsed())
    }

    /// The first full list has been seen.
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// Number of Nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// No Nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// A consistent copy of all Nodes (cheap: shared views).
    pub fn snapshot(&self) -> Vec<Arc<NodeView>> {
        self.nodes.values().cloned().collect()
    }

    /// One Node by name.
    pub fn get(&self, name: &str) -> Option<Arc<NodeView>> {
        self.nodes.get(name).cloned()
    }

    /// Records a condition this controller just wrote, so the next pass does
    /// not patch it again before the watch delivers the change.
    pub fn record_condition(&mut self, name: &str, uid: &str, cond: NetworkCondition) {
        if let Some(v) = self.nodes.get_mut(name)
            && v.uid == uid
        {
            Arc::make_mut(v).network_unavailable = Some(ConditionState {
                status: cond.status().into(),
                reason: cond.reason().into(),
            });
        }
    }

    /// What the cache has absorbed and reported so far.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(name: &str, cidrs: &[&str], addrs: &[&str]) -> NodeView {
        NodeView::new(name, format!("uid-{name}"), cidrs)
            .with_addresses(addrs.iter().map(|a| NodeAddress::internal_ip(*a)).collect())
    }

    fn synced(nodes: &[NodeView]) -> NodeCache {
        let mut c = NodeCache::new();
        c.apply(NodeEvent::Init);
        for n in nodes {
            c.apply(NodeEvent::InitApply(n.clone()));
        }
        assert_eq!(c.apply(NodeEvent::InitDone), Some(Trigger::Synced));
        c
    }

    #[test]
    fn init_apply_seeds_without_triggering() {
        let mut c = NodeCache::new();
        assert_eq!(c.apply(NodeEvent::Init), None);
        assert_eq!(
            c.apply(NodeEvent::InitApply(view("a", &["10.0.0.0/24"], &[]))),
            None
        );
        assert!(!c.is_synced());
        assert_eq!(c.apply(NodeEvent::InitDone), Some(Trigger::Synced));
        // The first Apply after the list must compare against the seeded view.
        assert_eq!(
            c.apply(NodeEvent::Apply(view("a", &["10.0.0.0/24"], &[]))),
            None
        );
    }

    #[test]
    fn heartbeat_condition_and_label_changes_are_absorbed() {
        let mut c = synced(&[view("a", &["10.0.0.0/24"], &["10.1.0.1"])]);
        let mut hb = view("a", &["10.0.0.0/24"], &["10.1.0.1"]);
        hb.network_unavailable = Some(ConditionState::new("False", "RouteCreated"));
        assert_eq!(c.apply(NodeEvent::Apply(hb)), None);
        assert_eq!(
            c.get("a")
                .unwrap()
                .network_unavailable
                .as_ref()
                .unwrap()
                .reason,
            "RouteCreated",
            "the cache still keeps the latest condition"
        );
        assert_eq!(c.stats().absorbed, 1);
        assert_eq!(c.stats().triggers, 0);
    }

    #[test]
    fn address_reorder_is_not_a_change_but_a_new_address_is() {
        let mut c = synced(&[view("a", &["10.0.0.0/24"], &["10.1.0.1", "10.1.0.2"])]);
        assert_eq!(
            c.apply(NodeEvent::Apply(view(
                "a",
                &["10.0.0.0/24"],
                &["10.1.0.2", "10.1.0.1"]
            ))),
            None
        );
        assert_eq!(
            c.apply(NodeEvent::Apply(view("a", &["10.0.0.0/24"], &["10.1.0.3"]))),
            Some(Trigger::NodeChanged)
        );
    }

    #[test]
    fn pod_cidr_change_add_and_delete_trigger() {
        let mut c = synced(&[view("a", &[], &[])]);
        assert_eq!(
            c.apply(NodeEvent::Apply(view("a", &["10.0.0.0/24"], &[]))),
            Some(Trigger::NodeChanged)
        );
        assert_eq!(
            c.apply(NodeEvent::Apply(view("b", &["10.0.1.0/24"], &[]))),
            Some(Trigger::NodeChanged)
        );
        assert_eq!(
            c.apply(NodeEvent::Delete(view("b", &["10.0.1.0/24"], &[]))),
            Some(Trigger::NodeChanged)
        );
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn recreated_node_with_same_name_triggers() {
        let mut c = synced(&[view("a", &["10.0.0.0/24"], &[])]);
        let mut again = view("a", &["10.0.0.0/24"], &[]);
        again.uid = "uid-a-2".into();
        assert_eq!(c.apply(NodeEvent::Apply(again)), Some(Trigger::NodeChanged));
    }

    #[test]
    fn relist_drops_nodes_deleted_during_a_watch_gap() {
        let mut c = synced(&[view("a", &[], &[]), view("b", &[], &[])]);
        c.apply(NodeEvent::Init);
        c.apply(NodeEvent::InitApply(view("a", &[], &[])));
        // During the relist the old state stays visible.
        assert_eq!(c.len(), 2);
        assert_eq!(c.apply(NodeEvent::InitDone), Some(Trigger::Synced));
        assert_eq!(c.len(), 1);
        assert!(c.get("b").is_none());
    }

    fn cidr(s: &str) -> Cidr {
        Cidr::parse(s).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn route_latency_is_measured_once_from_first_sight() {
        let mut c = synced(&[]);
        c.apply(NodeEvent::Apply(view("a", &["10.0.0.0/24"], &[])));
        tokio::time::advance(std::time::Duration::from_millis(1500)).await;
        assert_eq!(
            c.confirm_route("uid-a", cidr("10.0.0.0/24")),
            Some(std::time::Duration::from_millis(1500))
        );
        assert_eq!(c.confirm_route("uid-a", cidr("10.0.0.0/24")), None);
        // Later updates of the same Node (a heartbeat) start no new measurement.
        c.apply(NodeEvent::Apply(view("a", &["10.0.0.0/24"], &[])));
        tokio::time::advance(std::time::Duration::from_millis(10)).await;
        assert_eq!(c.confirm_route("uid-a", cidr("10.0.0.0/24")), None);
        assert!(!c.awaiting_routes());
    }

    #[tokio::test(start_paused = true)]
    async fn awaiting_routes_counts_only_unconfirmed_cidrs_of_live_nodes() {
        let mut c = synced(&[]);
        assert!(!c.awaiting_routes());
        c.apply(NodeEvent::Apply(view("a", &["10.0.0.0/24"], &[])));
        c.apply(NodeEvent::Apply(view(
            "b",
            &["10.0.1.0/24", "fd00::/64"],
            &[],
        )));
        assert!(c.awaits_route("uid-a") && c.awaits_route("uid-b"));
        assert_eq!(
            c.confirm_route("uid-b", cidr("10.0.1.0/24")),
            Some(Default::default())
        );
        assert!(c.awaits_route("uid-b"), "the IPv6 CIDR still waits");
        c.apply(NodeEvent::Delete(view("b", &[], &[])));
        assert!(!c.awaits_route("uid-b"));
        assert_eq!(
            c.confirm_route("uid-a", cidr("10.0.0.0/24")),
            Some(Default::default())
        );
        assert!(!c.awaiting_routes());
        // A Node gone during a watch gap is forgotten at the relist.
        c.apply(NodeEvent::Apply(view("d", &["10.0.3.0/24"], &[])));
        c.apply(NodeEvent::Init);
        c.apply(NodeEvent::InitApply(view("a", &["10.0.0.0/24"], &[])));
        c.apply(NodeEvent::InitDone);
        assert!(!c.awaiting_routes());
    }

    #[tokio::test(start_paused = true)]
    async fn forget_settled_drops_only_unplanned_nodes_already_marked_routed() {
        let routed = |name: &str, cidr: &str| {
            view(name, &[cidr], &[]).with_condition("False", "RouteCreated")
        };
        let mut c = synced(&[
            routed("old", "10.0.0.0/24"),
            view("new", &["10.0.1.0/24"], &[]),
            routed("planned", "10.0.2.0/24"),
        ]);
        c.forget_settled(|name| name == "planned");
        // A route from before this controller saw the Node: nothing to measure.
        assert!(!c.awaits_route("uid-old"));
        // No condition yet, or named by the plan: still measured.
        assert!(c.awaits_route("uid-new"));
        assert!(c.awaits_route("uid-planned"));
        assert!(c.awaiting_routes());
    }

    #[test]
    fn reordered_or_repeated_addresses_are_not_a_change() {
        let a = NodeAddress::internal_ip("10.1.0.1");
        let h = NodeAddress {
            kind: "Hostname".into(),
            address: "a".into(),
        };
        let with = |addrs: &[&NodeAddress]| {
            view("a", &["10.0.0.0/24"], &[])
                .with_addresses(addrs.iter().map(|x| (*x).clone()).collect())
        };
        let mut c = synced(&[with(&[&a, &h])]);
        assert_eq!(c.apply(NodeEvent::Apply(with(&[&h, &a, &a]))), None);
        let changed = with(&[&h]);
        assert_eq!(
            c.apply(NodeEvent::Apply(changed)),
            Some(Trigger::NodeChanged)
        );
    }
}
