//! The Node side: what the controller knows about the cluster's Nodes.
//!
//! The [`NodeStore`] is the single owner of the [`NodeCache`] and of the
//! [`RouteLatency`] measurements; it is fed by exactly one writer (the
//! watcher task in [`crate::watch`], or a simulator) and read by the
//! reconcile loop, which it wakes through its notification. It keeps one small [`NodeView`] per Node
//! — pod CIDRs, addresses, provider id, the NetworkUnavailable condition —
//! instead of whole Node objects, which is what keeps memory flat at thousands
//! of Nodes. Every change is classified here: only changes that can alter
//! routes (a Node added or deleted, `spec.podCIDRs` changed, `status.addresses`
//! changed as a set) are reported as triggers; heartbeats, conditions, labels
//! and taints are absorbed silently.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use route_core::{ConditionState, NetworkCondition, NodeAddress, NodeView, Plan, PodCidr};
use tokio::sync::{Notify, watch};

use crate::latency::RouteLatency;
use crate::metrics::{Metrics, MetricsHandle};
use crate::select::NodeSelector;

/// Converts a Node into the view routing needs, every Node selected.
pub fn node_view(node: &Node) -> NodeView {
    node_view_selected(node, &NodeSelector::default())
}

/// Converts a Node into the view routing needs; a Node outside `selector`
/// is [`NodeView::excluded`].
pub fn node_view_selected(node: &Node, selector: &NodeSelector) -> NodeView {
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
        // Recorded by the controller, carried over by the cache.
        forwarding_disabled: false,
        excluded: !selector.matches(node.metadata.labels.as_ref()),
    }
}

/// Whether two views of a Node need the same routes: same UID, same pod
/// CIDRs in order (the API keeps them ordered), same selection (a label
/// change that moves a Node in or out of `--node-selector`), same providerID (a route
/// waiting for it, or pointing at the instance it names, must be planned
/// again), same addresses as a set (kubelets may reorder them). Runs on
/// every heartbeat, so the common case (nothing changed at all) allocates
/// nothing.
fn same_routing(a: &NodeView, b: &NodeView) -> bool {
    if a.uid != b.uid
        || a.pod_cidrs != b.pod_cidrs
        || a.provider_id != b.provider_id
        || a.excluded != b.excluded
    {
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
            NodeEvent::InitApply(mut v) => {
                carry_findings(self.nodes.get(v.name.as_str()), &mut v);
                let name = v.name.clone();
                let v = Arc::new(v);
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
                    self.nodes = buf;
                }
                self.synced = true;
                // Always reconcile after a (re)list: Nodes deleted while the
                // watch was down produce no Delete event, only their absence.
                Some(Trigger::Synced)
            }
            NodeEvent::Apply(mut v) => {
                carry_findings(self.nodes.get(v.name.as_str()), &mut v);
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

    /// Records what the provider found about a Node's forwarding
    /// prerequisite; kept across the Node's updates (it is not Node data)
    /// until the next finding.
    pub fn record_forwarding(&mut self, name: &str, uid: &str, disabled: bool) {
        if let Some(v) = self.nodes.get_mut(name)
            && v.uid == uid
            && v.forwarding_disabled != disabled
        {
            Arc::make_mut(v).forwarding_disabled = disabled;
        }
    }

    /// What the cache has absorbed and reported so far.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }
}

/// Carries what the controller recorded on the previous view of the same
/// Node (same UID) over to a view built from the API object.
fn carry_findings(old: Option<&Arc<NodeView>>, new: &mut NodeView) {
    if let Some(old) = old
        && old.uid == new.uid
    {
        new.forwarding_disabled = old.forwarding_disabled;
    }
}

/// A Node by name and UID: what a status write or an Event is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeRef {
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

/// The Node side shared by the feeder and the loop: the cache, the latency
/// measurements and the notification the loop waits on.
pub struct NodeStore {
    inner: Mutex<Inner>,
    changed: Notify,
    synced: watch::Sender<bool>,
    metrics: MetricsHandle,
}

/// What the store's mutex guards: both change with every event, together.
#[derive(Default)]
struct Inner {
    cache: NodeCache,
    latency: RouteLatency,
}

impl NodeStore {
    /// An empty store.
    pub fn new(metrics: Option<Arc<Metrics>>) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(Inner::default()),
            changed: Notify::new(),
            synced: watch::channel(false).0,
            metrics: MetricsHandle::from(metrics),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies a watch event; wakes the loop if it may change routes.
    pub fn apply(&self, event: NodeEvent) {
        let trigger = {
            let mut inner = self.lock();
            let latency = &mut inner.latency;
            match &event {
                NodeEvent::Init => latency.relist_started(),
                NodeEvent::InitApply(v) => latency.listed(v),
                NodeEvent::InitDone => latency.relist_done(),
                NodeEvent::Apply(v) => latency.seen(v),
                NodeEvent::Delete(v) => latency.deleted(&v.uid),
            }
            inner.cache.apply(event)
        };
        // Events of the initial list are neither: they are the list.
        if trigger.is_some() || self.is_synced() {
            self.metrics.node_event(trigger.is_some());
        }
        match trigger {
            Some(Trigger::Synced) => {
                self.synced.send_replace(true);
                self.changed.notify_one();
            }
            Some(Trigger::NodeChanged) => self.changed.notify_one(),
            None => {}
        }
    }

    /// The first full list has been applied.
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Resolves once the first full list has been applied.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Resolves at the next event that may change routes (or at once if one
    /// came since the last [`NodeStore::snapshot`]).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// All Nodes now.
    pub fn snapshot(&self) -> Vec<Arc<NodeView>> {
        self.lock().cache.snapshot()
    }

    /// All Nodes now, for the reconcile loop's pass: triggers that arrived
    /// before it are covered by it, so they no longer wake the loop. Only
    /// the loop may call this, or it would swallow the loop's wake-ups.
    pub(crate) fn snapshot_for_pass(&self) -> Vec<Arc<NodeView>> {
        let _ = futures::FutureExt::now_or_never(self.changed.notified());
        self.lock().cache.snapshot()
    }

    /// One Node by name.
    pub fn get(&self, name: &str) -> Option<Arc<NodeView>> {
        self.lock().cache.get(name)
    }

    /// Number of Nodes.
    pub fn len(&self) -> usize {
        self.lock().cache.len()
    }

    /// No Nodes.
    pub fn is_empty(&self) -> bool {
        self.lock().cache.is_empty()
    }

    /// Trigger/absorb counters.
    pub fn stats(&self) -> CacheStats {
        self.lock().cache.stats()
    }

    /// Records the provider's forwarding findings: `(name, uid, disabled)`.
    pub fn record_forwarding<'a>(&self, found: impl IntoIterator<Item = (&'a str, &'a str, bool)>) {
        let mut inner = self.lock();
        for (name, uid, disabled) in found {
            inner.cache.record_forwarding(name, uid, disabled);
        }
    }

    /// Records conditions this controller just wrote, so the next pass does
    /// not patch them again before the watch delivers the change.
    pub fn record_conditions<'a>(
        &self,
        written: impl IntoIterator<Item = (&'a str, &'a str, NetworkCondition)>,
    ) {
        let mut inner = self.lock();
        for (name, uid, cond) in written {
            inner.cache.record_condition(name, uid, cond);
        }
    }

    /// Ends the latency measurement of every Node whose routes are all in
    /// place after `plan` (see [`RouteLatency::confirm`]); returns the waits.
    pub fn confirm_routes(
        &self,
        plan: &Plan,
        failed: impl Fn(&route_core::OpKey) -> bool,
    ) -> Vec<Duration> {
        let mut inner = self.lock();
        let Inner { cache, latency } = &mut *inner;
        latency.confirm(|name| cache.get(name), plan, failed)
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
