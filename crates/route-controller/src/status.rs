//! Writing back to the cluster: the NetworkUnavailable condition and Events.
//!
//! The status step of a pass is here: [`write_conditions`] patches the
//! conditions a plan calls for and [`emit`] is the one place a
//! [`Warning`] becomes an Event. Both do Kubernetes I/O and both check the
//! fence first, since a status write is a mutation too; under `--dry-run`
//! ([`Writes::DryRun`]) both write nothing.
//!
//! [`StatusWriter`] is the controller's only way to change the cluster. The
//! Kubernetes implementation patches `nodes/<name>/status` with a strategic
//! merge patch (merge key `type`, so other conditions are untouched) and
//! creates core/v1 Events on the Node, exactly as upstream's route controller
//! does; tests and the simulator use an in-memory one.

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use route_core::{NetworkCondition, OpKey, Plan};
use tracing::warn;

use crate::execute::{Fence, OpRecord, OpRecords, OpResult, Writes};
use crate::metrics::MetricsHandle;
use crate::nodes::{NodeRef, NodeStore};
use crate::retry::RetryBook;
use crate::warnings::Warning;

/// The event source component, as upstream's route controller.
pub const EVENT_COMPONENT: &str = "route_controller";

/// Emits `w` as a Warning Event (and a log line and a metric), unless the
/// fence is closed or this replica writes nothing (`--dry-run`: no Event,
/// no line, no count). A failed write is logged, not retried: the cause is
/// still there at the next pass, and the log line already says it.
pub async fn emit(
    w: &Warning,
    writer: &dyn StatusWriter,
    fence: &Fence,
    writes: Writes,
    metrics: &MetricsHandle,
) {
    if !fence.is_open() || writes.dry_run() {
        return;
    }
    let reason = w.reason.as_str();
    warn!(node = %w.node.name, reason, "{}", w.message);
    metrics.warning(reason);
    if let Ok(Err(e)) = fence.guard(writer.warn(&w.node, reason, &w.message)).await {
        warn!(node = %w.node.name, error = %e, "could not record event");
    }
}

/// Patches the NetworkUnavailable condition of every Node of `plan` whose
/// condition must change after `outcome`, at most `concurrency` at a time;
/// returns the conditions written (none under `--dry-run`). Nodes deleted or re-created since the
/// snapshot are skipped, and each patch carries the UID as a precondition.
pub async fn write_conditions(
    plan: &Plan,
    failure: &(dyn Fn(&OpKey) -> Option<NetworkCondition> + Sync),
    nodes: &NodeStore,
    writer: &Arc<dyn StatusWriter>,
    fence: &Fence,
    writes: Writes,
    concurrency: usize,
) -> Written {
    if !fence.is_open() || writes.dry_run() {
        return Written::default();
    }
    let wanted: Vec<(NodeRef, NetworkCondition)> = plan
        .nodes
        .iter()
        .filter_map(|n| {
            let cond = n.condition_given(failure)?;
            nodes.get(&n.node).filter(|v| v.uid == n.uid)?;
            let node = NodeRef {
                name: n.node.clone(),
                uid: n.uid.clone(),
            };
            Some((node, cond))
        })
        .collect();
    patch(wanted, nodes, writer, fence, concurrency, None).await
}

/// Sets each Node's condition in `wanted`, at most `concurrency` at a
/// time, with `message` in place of the condition's own when given, and
/// records what landed in the Node cache.
async fn patch(
    wanted: Vec<(NodeRef, NetworkCondition)>,
    nodes: &NodeStore,
    writer: &Arc<dyn StatusWriter>,
    fence: &Fence,
    concurrency: usize,
    message: Option<&str>,
) -> Written {
    let results: Vec<(NodeRef, NetworkCondition, bool)> =
        futures::stream::iter(wanted.into_iter().map(|(node, cond)| {
            let writer = writer.clone();
            let fence = fence.clone();
            async move {
                // Checked per patch: one queued behind slow ones may come
                // after the deadline.
                let set = async {
                    match message {
                        Some(m) => writer.set_condition_saying(&node, cond, m).await,
                        None => writer.set_condition(&node, cond).await,
                    }
                };
                let ok = match fence.guard(set).await {
                    Ok(Ok(())) => true,
                    Ok(Err(e)) => {
                        warn!(node = %node.name, error = %e, "failed to update networking condition");
                        false
                    }
                    Err(_) => false,
                };
                (node, cond, ok)
            }
        }))
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let failed = results.iter().filter(|(_, _, ok)| !*ok).count();
    let written: Vec<(NodeRef, NetworkCondition)> = results
        .into_iter()
        .filter(|(_, _, ok)| *ok)
        .map(|(node, cond, _)| (node, cond))
        .collect();
    nodes.record_conditions(
        written
            .iter()
            .map(|(n, c)| (n.name.as_str(), n.uid.as_str(), *c)),
    );
    Written {
        conditions: written.into_iter().map(|(n, c)| (n.name, c)).collect(),
        failed,
    }
}

/// Marks every selected Node that reads `RouteCreated` as
/// `Unknown`/`RouteUnverified`: the cloud's routes could not be listed for
/// longer than the drift check period, so a route that was deleted
/// meanwhile would go unseen. Written once per Node (the next call finds
/// it no longer `RouteCreated`); the next successful listing plans its
/// condition again.
pub async fn mark_unverified(
    nodes: &NodeStore,
    writer: &Arc<dyn StatusWriter>,
    fence: &Fence,
    writes: Writes,
    concurrency: usize,
) -> Written {
    if !fence.is_open() || writes.dry_run() {
        return Written::default();
    }
    let wanted = nodes
        .snapshot()
        .into_iter()
        .filter(|n| !n.excluded && !n.deleting)
        .filter(|n| NetworkCondition::RouteCreated.already_set(n.network_unavailable.as_ref()))
        .map(|n| {
            let node = NodeRef {
                name: n.name.clone(),
                uid: n.uid.clone(),
            };
            (node, NetworkCondition::RouteUnverified)
        })
        .collect();
    patch(wanted, nodes, writer, fence, concurrency, None).await
}

/// Marks every selected Node that `routable` accepts and that has no
/// `NetworkUnavailable` condition at all (never routed: it joined while
/// the cloud refuses the controller) as `True`/`NoRouteCreated`, with
/// `message` (naming the refusal) as the condition's message: without the
/// condition, nothing keeps pods off a Node that has no route. A Node with
/// a condition keeps it, whoever wrote it: a routed one follows
/// [`mark_unverified`]'s rule and is never made `True` here. Written once
/// per Node (the next call finds it has a condition); the next successful
/// listing plans its condition again.
pub async fn mark_refused(
    nodes: &NodeStore,
    routable: impl Fn(&route_core::NodeView) -> bool,
    message: &str,
    writer: &Arc<dyn StatusWriter>,
    fence: &Fence,
    concurrency: usize,
) -> Written {
    if !fence.is_open() {
        return Written::default();
    }
    let wanted = nodes
        .snapshot()
        .into_iter()
        .filter(|n| !n.excluded && !n.deleting && n.network_unavailable.is_none())
        .filter(|n| routable(n))
        .map(|n| {
            let node = NodeRef {
                name: n.name.clone(),
                uid: n.uid.clone(),
            };
            (node, NetworkCondition::NoRouteCreated)
        })
        .collect();
    patch(wanted, nodes, writer, fence, concurrency, Some(message)).await
}

/// Why a planned creation left its Node unrouted after a pass, as the
/// Node's condition says it: `None` when it succeeded. The reason is the
/// [`policy`](crate::policy) row of the refusal it got (from the cloud, or
/// from its verdict in the cloud's place), or of the refusal it waits out
/// while backing off: `RouteQuotaExceeded` for room, `InstanceNotRunning`
/// for a stopped instance, and upstream's `NoRouteCreated` for any other
/// failure, backoff or wait.
pub fn explain(ops: &OpRecords, book: &RetryBook, key: &OpKey) -> Option<NetworkCondition> {
    let refusal = match ops.of(key) {
        OpResult::Done(_) => return None,
        _ => ops
            .record(key)
            .and_then(OpRecord::refused)
            .or_else(|| book.refusal(key)),
    };
    Some(refusal.map_or(NetworkCondition::NoRouteCreated, |k| {
        crate::policy::of(k).condition
    }))
}

/// What [`write_conditions`] did.
#[derive(Debug, Default)]
pub struct Written {
    /// The conditions written, by Node name.
    pub conditions: Vec<(String, NetworkCondition)>,
    /// Patches that failed (API server unavailable, a conflict) or were cut
    /// off by the fence: the loop passes again after a backoff to rewrite them.
    pub failed: usize,
}

/// A failure to write to the cluster.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StatusError(pub String);

/// Writes conditions and Events.
#[async_trait]
pub trait StatusWriter: Send + Sync + 'static {
    /// Sets the NetworkUnavailable condition of a Node.
    async fn set_condition(
        &self,
        node: &NodeRef,
        cond: NetworkCondition,
    ) -> Result<(), StatusError>;

    /// Sets the NetworkUnavailable condition of a Node with `message` in
    /// place of [`NetworkCondition::message`] (one that names the cloud's
    /// refusal). A writer that keeps no messages (the simulator's API
    /// model) sets the condition alone.
    async fn set_condition_saying(
        &self,
        node: &NodeRef,
        cond: NetworkCondition,
        message: &str,
    ) -> Result<(), StatusError> {
        let _ = message;
        self.set_condition(node, cond).await
    }

    /// Emits a Warning Event on a Node.
    async fn warn(&self, node: &NodeRef, reason: &str, message: &str) -> Result<(), StatusError>;
}

/// The Kubernetes implementation.
#[derive(Clone)]
pub struct KubeStatusWriter {
    nodes: Api<Node>,
    events: Api<Event>,
    host: String,
}

impl KubeStatusWriter {
    /// A writer using `client`; `host` is recorded as the Event source host.
    pub fn new(client: kube::Client, host: impl Into<String>) -> Self {
        Self {
            nodes: Api::all(client.clone()),
            // Events about cluster-scoped objects live in "default", as
            // client-go's recorder puts them.
            events: Api::namespaced(client, "default"),
            host: host.into(),
        }
    }
}

/// The strategic-merge patch body upstream's `SetNodeCondition` sends.
pub fn condition_patch(cond: NetworkCondition, now: Timestamp) -> serde_json::Value {
    condition_patch_saying(cond, cond.message(), now)
}

/// [`condition_patch`] with `message` in place of the condition's own.
pub fn condition_patch_saying(
    cond: NetworkCondition,
    message: &str,
    now: Timestamp,
) -> serde_json::Value {
    let t = Time(now);
    serde_json::json!({
        "status": {
            "conditions": [{
                "type": "NetworkUnavailable",
                "status": cond.status(),
                "reason": cond.reason(),
                "message": message,
                "lastTransitionTime": t,
                "lastHeartbeatTime": t,
            }]
        }
    })
}

#[async_trait]
impl StatusWriter for KubeStatusWriter {
    async fn set_condition(
        &self,
        node: &NodeRef,
        cond: NetworkCondition,
    ) -> Result<(), StatusError> {
        self.set_condition_saying(node, cond, cond.message()).await
    }

    async fn set_condition_saying(
        &self,
        node: &NodeRef,
        cond: NetworkCondition,
        message: &str,
    ) -> Result<(), StatusError> {
        let mut patch = condition_patch_saying(cond, message, Timestamp::now());
        // The UID is a precondition: a Node deleted and re-created under the
        // same name since the plan was made is not the Node it was made for,
        // and the API server refuses the patch (409) instead of applying it.
        if !node.uid.is_empty() {
            patch["metadata"] = serde_json::json!({ "uid": node.uid });
        }
        self.nodes
            .patch_status(
                &node.name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
            .map(|_| ())
            .map_err(|e| StatusError(format!("patching status of node {}: {e}", node.name)))
    }

    async fn warn(&self, node: &NodeRef, reason: &str, message: &str) -> Result<(), StatusError> {
        let now = Timestamp::now();
        let ev = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", node.name)),
                namespace: Some("default".into()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.name.clone()),
                uid: Some(node.uid.clone()),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message.into()),
            type_: Some("Warning".into()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: None::<MicroTime>,
            source: Some(EventSource {
                component: Some(EVENT_COMPONENT.into()),
                host: Some(self.host.clone()),
            }),
            reporting_component: Some(EVENT_COMPONENT.into()),
            reporting_instance: Some(self.host.clone()),
            ..Default::default()
        };
        self.events
            .create(&PostParams::default(), &ev)
            .await
            .map(|_| ())
            .map_err(|e| StatusError(format!("creating event on node {}: {e}", node.name)))
    }
}

/// An in-memory [`StatusWriter`] that records what it is asked to write; the
/// API-server model of virtual-time tests and the simulator.
#[derive(Debug, Default)]
pub struct RecordingStatusWriter {
    inner: std::sync::Mutex<Recorded>,
}

/// What a [`RecordingStatusWriter`] saw.
#[derive(Debug, Default, Clone)]
pub struct Recorded {
    /// Every condition write, in order.
    pub conditions: Vec<(NodeRef, NetworkCondition)>,
    /// The messages of the writes that gave one of their own
    /// ([`StatusWriter::set_condition_saying`]), by Node name, in order.
    pub messages: Vec<(String, String)>,
    /// Every event: node, reason, message.
    pub events: Vec<(NodeRef, String, String)>,
}

impl RecordingStatusWriter {
    /// A copy of everything recorded.
    pub fn recorded(&self) -> Recorded {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The last condition written for a node.
    pub fn condition_of(&self, node: &str) -> Option<NetworkCondition> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .conditions
            .iter()
            .rev()
            .find(|(n, _)| n.name == node)
            .map(|(_, c)| *c)
    }
}

#[async_trait]
impl StatusWriter for RecordingStatusWriter {
    async fn set_condition(
        &self,
        node: &NodeRef,
        cond: NetworkCondition,
    ) -> Result<(), StatusError> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .conditions
            .push((node.clone(), cond));
        Ok(())
    }

    async fn set_condition_saying(
        &self,
        node: &NodeRef,
        cond: NetworkCondition,
        message: &str,
    ) -> Result<(), StatusError> {
        let mut r = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        r.conditions.push((node.clone(), cond));
        r.messages.push((node.name.clone(), message.into()));
        Ok(())
    }

    async fn warn(&self, node: &NodeRef, reason: &str, message: &str) -> Result<(), StatusError> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .events
            .push((node.clone(), reason.into(), message.into()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodes::NodeEvent;
    use crate::warnings::Reason;
    use route_core::{Cidr, NodeView, PlanConfig};

    fn store(nodes: &[NodeView]) -> Arc<NodeStore> {
        let s = NodeStore::new(None);
        s.apply(NodeEvent::Init);
        for n in nodes {
            s.apply(NodeEvent::InitApply(n.clone()));
        }
        s.apply(NodeEvent::InitDone);
        s
    }

    fn plan_for(store: &NodeStore) -> Plan {
        route_core::plan(
            &store.snapshot(),
            &[],
            &PlanConfig {
                cluster_cidrs: vec![Cidr::parse("10.0.0.0/16").unwrap()],
                ..PlanConfig::default()
            },
        )
    }

    fn done(plan: &Plan) -> OpRecords {
        let mut o = OpRecords::default();
        for c in &plan.creations {
            o.set(c.key(), crate::OpResult::Done(None));
        }
        o
    }

    #[test]
    fn the_condition_patch_is_upstreams_strategic_merge() {
        let p = condition_patch(NetworkCondition::RouteCreated, Timestamp::UNIX_EPOCH);
        let c = &p["status"]["conditions"][0];
        assert_eq!(c["type"], "NetworkUnavailable");
        assert_eq!(c["status"], "False");
        assert_eq!(c["reason"], "RouteCreated");
        assert_eq!(c["lastTransitionTime"], c["lastHeartbeatTime"]);
    }

    #[tokio::test]
    async fn conditions_skip_a_node_recreated_since_the_snapshot_and_are_recorded() {
        let nodes = store(&[
            NodeView::new("a", "uid-a", &["10.0.1.0/24"]),
            NodeView::new("b", "uid-b", &["10.0.2.0/24"]),
        ]);
        let plan = plan_for(&nodes);
        // b is deleted and re-created under its name after the plan was made.
        nodes.apply(NodeEvent::Apply(NodeView::new(
            "b",
            "uid-b2",
            &["10.0.2.0/24"],
        )));
        let rec = Arc::new(RecordingStatusWriter::default());
        let writer: Arc<dyn StatusWriter> = rec.clone();
        let written = write_conditions(
            &plan,
            &|k| explain(&done(&plan), &RetryBook::default(), k),
            &nodes,
            &writer,
            &Fence::new(true),
            Writes::Allowed,
            2,
        )
        .await
        .conditions;
        assert_eq!(written, [("a".to_string(), NetworkCondition::RouteCreated)]);
        assert_eq!(rec.recorded().conditions.len(), 1);
        // The written condition is in the cache at once: the next plan
        // does not patch it again.
        let again = plan_for(&nodes);
        let written = write_conditions(
            &again,
            &|k| explain(&done(&again), &RetryBook::default(), k),
            &nodes,
            &writer,
            &Fence::new(true),
            Writes::Allowed,
            2,
        )
        .await
        .conditions;
        assert!(
            written.iter().all(|(n, _)| n != "a"),
            "a is not patched twice: {written:?}"
        );
    }

    #[tokio::test]
    async fn nothing_is_written_past_the_fence_nor_under_dry_run() {
        let nodes = store(&[NodeView::new("a", "uid-a", &["10.0.1.0/24"])]);
        let plan = plan_for(&nodes);
        let rec = Arc::new(RecordingStatusWriter::default());
        let writer: Arc<dyn StatusWriter> = rec.clone();
        let closed = Fence::new(false);
        let written = write_conditions(
            &plan,
            &|k| explain(&done(&plan), &RetryBook::default(), k),
            &nodes,
            &writer,
            &closed,
            Writes::Allowed,
            2,
        )
        .await;
        assert!(written.conditions.is_empty());
        let w = Warning::invalid_pod_cidr(
            NodeRef {
                name: "a".into(),
                uid: "uid-a".into(),
            },
            "x",
        );
        emit(
            &w,
            &*rec,
            &closed,
            Writes::Allowed,
            &MetricsHandle::default(),
        )
        .await;
        assert!(rec.recorded().conditions.is_empty() && rec.recorded().events.is_empty());
        // Nor under --dry-run, the fence open.
        let open = Fence::new(true);
        let written = write_conditions(
            &plan,
            &|k| explain(&done(&plan), &RetryBook::default(), k),
            &nodes,
            &writer,
            &open,
            Writes::DryRun,
            2,
        )
        .await;
        assert!(written.conditions.is_empty() && written.failed == 0);
        emit(&w, &*rec, &open, Writes::DryRun, &MetricsHandle::default()).await;
        assert!(rec.recorded().conditions.is_empty() && rec.recorded().events.is_empty());
        emit(&w, &*rec, &open, Writes::Allowed, &MetricsHandle::default()).await;
        let events = rec.recorded().events;
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].1, Reason::InvalidPodCidr.as_str());
    }
}
