//! Node shapes and the kubelet-like writes tests need.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// Condition type the route controller owns.
pub const NETWORK_UNAVAILABLE: &str = "NetworkUnavailable";

/// A Node to create: name, pod CIDRs, addresses, provider id, labels.
///
/// The Node is created with its status (addresses and a `Ready=True`
/// condition) in the same request, as the API allows on create.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TestNode {
    /// `metadata.name`.
    pub name: String,
    /// `spec.podCIDRs`.
    pub pod_cidrs: Vec<String>,
    /// `(type, address)`, e.g. `("InternalIP", "10.0.0.5")`.
    pub addresses: Vec<(String, String)>,
    /// `spec.providerID`.
    pub provider_id: Option<String>,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `(key, effect)` taints.
    pub taints: Vec<(String, String)>,
}

/// The taint a kubelet with `--cloud-provider=external` registers with; the
/// cloud-controller-manager's node controller removes it once it has filled
/// in the providerID and addresses.
pub const UNINITIALIZED_TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";

impl TestNode {
    /// A Node with only a name.
    pub fn new(name: impl Into<String>) -> Self {
        TestNode {
            name: name.into(),
            ..Default::default()
        }
    }

    /// Pod CIDRs; the first one also becomes `spec.podCIDR`, as node IPAM does.
    pub fn pod_cidrs<I, S>(mut self, cidrs: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.pod_cidrs = cidrs.into_iter().map(Into::into).collect();
        self
    }

    /// One more address of `kind` (`InternalIP`, `Hostname`, …).
    pub fn address(mut self, kind: impl Into<String>, address: impl Into<String>) -> Self {
        self.addresses.push((kind.into(), address.into()));
        self
    }

    /// One more InternalIP.
    pub fn internal_ip(self, address: impl Into<String>) -> Self {
        self.address("InternalIP", address)
    }

    /// `spec.providerID`.
    pub fn provider_id(mut self, id: impl Into<String>) -> Self {
        self.provider_id = Some(id.into());
        self
    }

    /// One more label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// One more taint.
    pub fn taint(mut self, key: impl Into<String>, effect: impl Into<String>) -> Self {
        self.taints.push((key.into(), effect.into()));
        self
    }

    /// As the kubelet registers with `--cloud-provider=external`: tainted
    /// uninitialized (providerID and addresses come from the
    /// cloud-controller-manager later).
    pub fn uninitialized(self) -> Self {
        self.taint(UNINITIALIZED_TAINT, "NoSchedule")
    }

    /// The Node object sent on create.
    pub fn to_node(&self) -> Node {
        let now = Time(now_seconds());
        Node {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: (!self.labels.is_empty()).then(|| self.labels.clone()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                pod_cidr: self.pod_cidrs.first().cloned(),
                pod_cidrs: (!self.pod_cidrs.is_empty()).then(|| self.pod_cidrs.clone()),
                provider_id: self.provider_id.clone(),
                taints: (!self.taints.is_empty()).then(|| {
                    self.taints
                        .iter()
                        .map(|(key, effect)| Taint {
                            key: key.clone(),
                            effect: effect.clone(),
                            value: Some("true".into()),
                            time_added: None,
                        })
                        .collect()
                }),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: (!self.addresses.is_empty()).then(|| {
                    self.addresses
                        .iter()
                        .map(|(kind, address)| NodeAddress {
                            type_: kind.clone(),
                            address: address.clone(),
                        })
                        .collect()
                }),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    reason: Some("KubeletReady".into()),
                    message: Some("kubelet is posting ready status".into()),
                    last_heartbeat_time: Some(now.clone()),
                    last_transition_time: Some(now),
                }]),
                ..Default::default()
            }),
        }
    }
}

/// API times have whole-second precision; anything finer is dropped by the
/// server, so compare and bump in whole seconds.
pub(crate) fn now_seconds() -> Timestamp {
    Timestamp::from_second(Timestamp::now().as_second()).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// The next heartbeat time: now, but strictly after `previous` so the patch
/// is a real change (the server drops no-op writes without a new
/// resourceVersion).
pub(crate) fn next_heartbeat(previous: Option<&Time>) -> Timestamp {
    let now = now_seconds();
    match previous {
        Some(prev) if prev.0 >= now => prev
            .0
            .checked_add(SignedDuration::from_secs(1))
            .unwrap_or(now),
        _ => now,
    }
}

/// The named condition of a Node, if present.
pub fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_spec_and_status() {
        let node = TestNode::new("n1")
            .pod_cidrs(["10.244.1.0/24", "fd00:1::/64"])
            .internal_ip("10.0.0.1")
            .address("ExternalIP", "203.0.113.1")
            .provider_id("aws:///eu-west-1a/i-1")
            .label("zone", "a")
            .to_node();
        let spec = node.spec.as_ref().expect("spec");
        assert_eq!(spec.pod_cidr.as_deref(), Some("10.244.1.0/24"));
        assert_eq!(spec.pod_cidrs.as_ref().map(Vec::len), Some(2));
        assert_eq!(spec.provider_id.as_deref(), Some("aws:///eu-west-1a/i-1"));
        let addrs = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .expect("addresses");
        assert_eq!(addrs[1].type_, "ExternalIP");
        assert_eq!(
            condition(&node, "Ready").map(|c| c.status.as_str()),
            Some("True")
        );
        assert!(condition(&node, NETWORK_UNAVAILABLE).is_none());
    }

    #[test]
    fn empty_node_leaves_optional_fields_unset() {
        let node = TestNode::new("bare").to_node();
        let spec = node.spec.expect("spec");
        assert!(spec.pod_cidr.is_none() && spec.pod_cidrs.is_none());
        assert!(node.metadata.labels.is_none());
    }

    #[test]
    fn heartbeat_time_always_moves_forward() {
        let future = Time(
            now_seconds()
                .checked_add(SignedDuration::from_secs(30))
                .expect("add"),
        );
        assert_eq!(
            next_heartbeat(Some(&future)).as_second(),
            future.0.as_second() + 1
        );
        let past = Time(Timestamp::UNIX_EPOCH);
        assert!(next_heartbeat(Some(&past)) > past.0);
        assert_eq!(next_heartbeat(None).subsec_nanosecond(), 0);
    }
}
