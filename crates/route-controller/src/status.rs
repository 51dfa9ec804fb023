//! Writing back to the cluster: the NetworkUnavailable condition and Events.
//!
//! [`StatusWriter`] is the controller's only way to change the cluster. The
//! Kubernetes implementation patches `nodes/<name>/status` with a strategic
//! merge patch (merge key `type`, so other conditions are untouched) and
//! creates core/v1 Events on the Node, exactly as upstream's route controller
//! does; tests and the simulator use an in-memory one.

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use route_core::NetworkCondition;

/// The event source component, as upstream's route controller.
pub const EVENT_COMPONENT: &str = "route_controller";

/// Event reasons this controller emits (all Warnings).
pub mod reasons {
    /// A route creation failed (upstream's reason).
    pub const FAILED_TO_CREATE_ROUTE: &str = "FailedToCreateRoute";
    /// A route deletion failed.
    pub const FAILED_TO_DELETE_ROUTE: &str = "FailedToDeleteRoute";
    /// Two Nodes claim the same pod CIDR.
    pub const POD_CIDR_CONFLICT: &str = "PodCIDRConflict";
    /// A pod CIDR lies outside every `--cluster-cidr`.
    pub const POD_CIDR_OUTSIDE_CLUSTER: &str = "PodCIDROutsideClusterCIDR";
    /// A pod CIDR is not a CIDR.
    pub const INVALID_POD_CIDR: &str = "InvalidPodCIDR";
    /// A route was repaired and is a blackhole again (its instance is
    /// stopped or gone); repairs now back off.
    pub const ROUTE_BLACKHOLED: &str = "RouteBlackholed";
}

/// A failure to write to the cluster.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StatusError(pub String);

/// The Node a write is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeRef {
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

/// Writes conditions and Events.
#[async_trait]
pub trait StatusWriter: Send + Sync + 'static {
    /// Sets the NetworkUnavailable condition of a Node.
    async fn set_condition(
        &self,
        node: &NodeRef,
        cond: NetworkCondition,
    ) -> Result<(), StatusError>;

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
    let t = Time(now);
    serde_json::json!({
        "status": {
            "conditions": [{
                "type": "NetworkUnavailable",
                "status": cond.status(),
                "reason": cond.reason(),
                "message": cond.message(),
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
        let mut patch = condition_patch(cond, Timestamp::now());
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

    async fn warn(&self, node: &NodeRef, reason: &str, message: &str) -> Result<(), StatusError> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .events
            .push((node.clone(), reason.into(), message.into()));
        Ok(())
    }
}
