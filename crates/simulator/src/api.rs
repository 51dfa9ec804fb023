//! The API-server model: the Node objects and their watch.
//!
//! [`ApiServer`] holds the current view of every Node and delivers each change
//! to the controller's [`NodeStore`] the way the watcher would (an initial
//! list, then `Apply` and `Delete` events). It is also the controller's
//! [`StatusWriter`]: a NetworkUnavailable patch changes the stored Node and
//! comes back as a watch event, as on a real API server, so later kubelet
//! heartbeats carry the condition the controller wrote and the controller's
//! own patches never look like changes. Watch delivery takes no time unless
//! the watch is held back ([`ApiServer::hold_watch`]), after which it
//! catches up late or relists, possibly from a stale cache ([`CatchUp`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use route_controller::{NodeEvent, NodeRef, NodeStore, StatusError, StatusWriter};
use route_core::{ConditionState, NetworkCondition, NodeView};

/// See the module docs.
pub struct ApiServer {
    store: Arc<NodeStore>,
    /// The watch caches of further replicas ([`ApiServer::also_feed`]).
    others: Mutex<Vec<Arc<NodeStore>>>,
    nodes: Mutex<HashMap<String, NodeView>>,
    events_delivered: AtomicU64,
    condition_writes: AtomicU64,
    warnings: Mutex<BTreeMap<String, u64>>,
    /// Status patches and Events fail (the API server is unavailable).
    outage: std::sync::atomic::AtomicBool,
    /// Sees every NetworkUnavailable patch as it arrives (the checker's
    /// invariants on what is written).
    on_condition: Mutex<Option<ConditionHook>>,
    /// While the watch is held back: the events not yet delivered, and the
    /// Nodes as they were when it began (what a stale cache would list).
    held: Mutex<Option<Held>>,
}

/// A watch held back ([`ApiServer::hold_watch`]).
struct Held {
    events: Vec<NodeEvent>,
    stale: Vec<NodeView>,
}

/// How a held-back watch catches up ([`ApiServer::release_watch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatchUp {
    /// The held events arrive, in order.
    Late,
    /// The watch ends and relists the Nodes as they are now; the held
    /// events are not delivered (the list has their effect).
    Relist,
    /// The watch relists from a stale cache (the Nodes as they were when
    /// it was held back), then the held events arrive.
    StaleRelist,
}

/// See [`ApiServer::on_condition`].
type ConditionHook = Box<dyn Fn(&NodeRef, NetworkCondition) + Send + Sync>;

impl ApiServer {
    /// An empty API server feeding `store`.
    pub fn new(store: Arc<NodeStore>) -> Self {
        Self {
            store,
            others: Mutex::new(Vec::new()),
            nodes: Mutex::new(HashMap::new()),
            events_delivered: AtomicU64::new(0),
            condition_writes: AtomicU64::new(0),
            warnings: Mutex::new(BTreeMap::new()),
            outage: std::sync::atomic::AtomicBool::new(false),
            on_condition: Mutex::new(None),
            held: Mutex::new(None),
        }
    }

    /// Calls `hook` with every NetworkUnavailable patch received, before it
    /// is applied and whether or not it succeeds.
    pub fn on_condition(&self, hook: impl Fn(&NodeRef, NetworkCondition) + Send + Sync + 'static) {
        *self.on_condition.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(hook));
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, NodeView>> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn deliver(&self, event: NodeEvent) {
        if let Some(h) = self.held.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            h.events.push(event);
            return;
        }
        self.events_delivered.fetch_add(1, Ordering::Relaxed);
        for other in self.others.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            other.apply(event.clone());
        }
        self.store.apply(event);
    }

    /// Every later event also goes to `store`: the watch of a second
    /// replica, which sees the same Nodes at the same time.
    pub fn also_feed(&self, store: Arc<NodeStore>) {
        self.others
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(store);
    }

    /// From now on the watch delivers nothing until [`ApiServer::release_watch`]:
    /// a slow watch, or one about to end.
    pub fn hold_watch(&self) {
        let stale = self.nodes();
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.is_none() {
            *held = Some(Held {
                events: Vec::new(),
                stale,
            });
        }
    }

    /// The held-back watch catches up as `how` says.
    pub fn release_watch(&self, how: CatchUp) {
        let Some(held) = self.held.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let relist = |views: Vec<NodeView>| {
            self.deliver(NodeEvent::Init);
            for v in views {
                self.deliver(NodeEvent::InitApply(v));
            }
            self.deliver(NodeEvent::InitDone);
        };
        match how {
            CatchUp::Late => held.events.into_iter().for_each(|e| self.deliver(e)),
            CatchUp::Relist => relist(self.nodes()),
            CatchUp::StaleRelist => {
                relist(held.stale);
                held.events.into_iter().for_each(|e| self.deliver(e));
            }
        }
    }

    /// The watcher's initial list of these Nodes.
    pub fn initial_list(&self, views: Vec<NodeView>) {
        self.deliver(NodeEvent::Init);
        for v in views {
            self.lock().insert(v.name.clone(), v.clone());
            self.deliver(NodeEvent::InitApply(v));
        }
        self.deliver(NodeEvent::InitDone);
    }

    /// A Node is created.
    pub fn create(&self, view: NodeView) {
        self.lock().insert(view.name.clone(), view.clone());
        self.deliver(NodeEvent::Apply(view));
    }

    /// A Node is changed by `f` (if it exists).
    pub fn update(&self, name: &str, f: impl FnOnce(&mut NodeView)) {
        let view = {
            let mut nodes = self.lock();
            let Some(v) = nodes.get_mut(name) else { return };
            f(v);
            v.clone()
        };
        self.deliver(NodeEvent::Apply(view));
    }

    /// A kubelet status patch that changes nothing routing depends on.
    pub fn heartbeat(&self, name: &str) {
        self.update(name, |_| {});
    }

    /// A Node is deleted.
    pub fn delete(&self, name: &str) {
        let gone = self.lock().remove(name);
        if let Some(v) = gone {
            self.deliver(NodeEvent::Delete(v));
        }
    }

    /// The Node exists.
    pub fn exists(&self, name: &str) -> bool {
        self.lock().contains_key(name)
    }

    /// A copy of every Node as stored now.
    pub fn nodes(&self) -> Vec<NodeView> {
        let mut v: Vec<NodeView> = self.lock().values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// A copy of one Node as stored now.
    pub fn get(&self, name: &str) -> Option<NodeView> {
        self.lock().get(name).cloned()
    }

    /// From now on status patches and Events fail (`true`), or succeed again.
    pub fn set_outage(&self, down: bool) {
        self.outage.store(down, Ordering::SeqCst);
    }

    fn unavailable(&self) -> Result<(), StatusError> {
        if self.outage.load(Ordering::SeqCst) {
            Err(StatusError(
                "the API server is unavailable (connection refused)".into(),
            ))
        } else {
            Ok(())
        }
    }

    /// Watch events delivered so far.
    pub fn events_delivered(&self) -> u64 {
        self.events_delivered.load(Ordering::Relaxed)
    }

    /// NetworkUnavailable patches accepted so far.
    pub fn condition_writes(&self) -> u64 {
        self.condition_writes.load(Ordering::Relaxed)
    }

    /// Warning Events by reason.
    pub fn warnings(&self) -> BTreeMap<String, u64> {
        self.warnings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[async_trait]
impl StatusWriter for ApiServer {
    async fn set_condition(
        &self,
        node: &NodeRef,
        cond: NetworkCondition,
    ) -> Result<(), StatusError> {
        if let Some(hook) = &*self.on_condition.lock().unwrap_or_else(|e| e.into_inner()) {
            hook(node, cond);
        }
        self.unavailable()?;
        let view = {
            let mut nodes = self.lock();
            match nodes.get_mut(&node.name) {
                Some(v) if v.uid == node.uid => {
                    v.network_unavailable = Some(ConditionState {
                        status: cond.status().into(),
                        reason: cond.reason().into(),
                    });
                    v.clone()
                }
                _ => {
                    return Err(StatusError(format!(
                        "nodes {:?} not found (uid {})",
                        node.name, node.uid
                    )));
                }
            }
        };
        self.condition_writes.fetch_add(1, Ordering::Relaxed);
        self.deliver(NodeEvent::Apply(view));
        Ok(())
    }

    async fn warn(&self, _node: &NodeRef, reason: &str, _message: &str) -> Result<(), StatusError> {
        self.unavailable()?;
        *self
            .warnings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(reason.to_string())
            .or_default() += 1;
        Ok(())
    }
}
