//! The node and route model the planner works on.
//!
//! These are views, not API objects: the controller's watcher converts each
//! Kubernetes Node into a [`NodeView`] (keeping only what routing needs) and
//! each provider converts its cloud routes into [`Route`]s. Nothing here
//! talks to Kubernetes or to a cloud.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::cidr::{Cidr, CidrError};
use crate::text::Text;

/// One entry of a Node's `status.addresses`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeAddress {
    /// `InternalIP`, `ExternalIP`, `Hostname`, `InternalDNS`, `ExternalDNS`;
    /// those are kept as static text ([`NodeAddress::new`]), since addresses
    /// are copied with every route a cloud lists.
    #[serde(rename = "type")]
    pub kind: Cow<'static, str>,
    /// The address as the kubelet or cloud-node controller reported it.
    pub address: Text,
}

impl NodeAddress {
    /// An address of this type; the well-known types are not copied.
    pub fn new(kind: &str, address: impl Into<Text>) -> Self {
        const KNOWN: [&str; 5] = [
            "InternalIP",
            "ExternalIP",
            "Hostname",
            "InternalDNS",
            "ExternalDNS",
        ];
        Self {
            kind: match KNOWN.iter().find(|k| **k == kind) {
                Some(k) => Cow::Borrowed(k),
                None => Cow::Owned(kind.to_owned()),
            },
            address: address.into(),
        }
    }

    /// Shorthand for an `InternalIP` address.
    pub fn internal_ip(address: impl Into<Text>) -> Self {
        Self {
            kind: "InternalIP".into(),
            address: address.into(),
        }
    }
}

/// A pod CIDR as written on a Node: parsed when possible, kept verbatim when not
/// so the controller can report it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PodCidr {
    /// A valid, normalised CIDR.
    Valid(Cidr),
    /// Text that is not a CIDR (only possible on an API server that skips validation).
    Invalid(String),
}

impl PodCidr {
    /// Parses one entry of `spec.podCIDRs`.
    pub fn parse(s: &str) -> Self {
        match Cidr::parse(s) {
            Ok(c) => PodCidr::Valid(c),
            Err(_) => PodCidr::Invalid(s.to_string()),
        }
    }
}

/// The status and reason of a Node's `NetworkUnavailable` condition, as last seen.
///
/// The well-known values are kept as static text (see [`ConditionState::new`]):
/// every plan copies the condition of every Node, and this keeps that copy
/// free of allocations.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConditionState {
    /// `"True"`, `"False"` or `"Unknown"`.
    pub status: Cow<'static, str>,
    /// The reason of whoever wrote it last (this controller, a CNI, ...).
    pub reason: Cow<'static, str>,
}

impl ConditionState {
    /// A condition with this status and reason; well-known values are not copied.
    pub fn new(status: &str, reason: &str) -> Self {
        Self {
            status: known_text(status),
            reason: known_text(reason),
        }
    }
}

/// Static text for the values conditions nearly always carry, a copy otherwise.
fn known_text(s: &str) -> Cow<'static, str> {
    const KNOWN: [&str; 14] = [
        "True",
        "False",
        "Unknown",
        "RouteCreated",
        "NoRouteCreated",
        "ForwardingDisabled",
        "AwaitingNodeData",
        "RouteQuotaExceeded",
        "InstanceNotRunning",
        "PodCIDRConflict",
        "InvalidPodCIDR",
        "NodeExcluded",
        "RouteUnverified",
        "",
    ];
    match KNOWN.iter().find(|k| **k == s) {
        Some(k) => Cow::Borrowed(k),
        None => Cow::Owned(s.to_owned()),
    }
}

/// What routing needs to know about one Node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeView {
    /// `metadata.name`; routes name their target by it.
    pub name: String,
    /// `metadata.uid`; the name hint of routes created for this node.
    pub uid: String,
    /// `spec.podCIDRs` in order (the singular `spec.podCIDR` is ignored, like upstream).
    pub pod_cidrs: Vec<PodCidr>,
    /// `status.addresses` in order.
    pub addresses: Vec<NodeAddress>,
    /// `spec.providerID`, if set.
    pub provider_id: Option<String>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// The current `NetworkUnavailable` condition, if any.
    pub network_unavailable: Option<ConditionState>,
    /// The cloud provider last found this Node's forwarding prerequisite
    /// off (an instance that may not forward, a NIC without IP forwarding)
    /// and cannot turn it on: the Node's routes are kept, but its condition
    /// says `ForwardingDisabled`. Not Node data: the controller records it.
    #[serde(default)]
    pub forwarding_disabled: bool,
    /// The Node is left out of routing on purpose (`--node-selector`): it
    /// gets no route, and routes to it are not this controller's unless a
    /// route controller routed it before ([`NodeView::leaving`]).
    #[serde(default)]
    pub excluded: bool,
}

impl NodeView {
    /// An excluded Node whose `NetworkUnavailable` condition was last
    /// written by a route controller (this one or upstream's): it left the
    /// selection, so the routes to it were a route controller's and go
    /// (after the deletion grace); once none is left its condition says
    /// `NodeExcluded`. An excluded Node whose condition is anyone else's
    /// (a CNI's, none at all) never was ours: routes to it are foreign.
    pub fn leaving(&self) -> bool {
        self.excluded
            && self.network_unavailable.as_ref().is_some_and(|c| {
                crate::plan::NetworkCondition::from_reason(&c.reason)
                    .is_some_and(|r| r != crate::plan::NetworkCondition::NodeExcluded)
            })
    }

    /// A node with a name, uid and pod CIDRs and nothing else; for tests and tools.
    pub fn new(name: impl Into<String>, uid: impl Into<String>, pod_cidrs: &[&str]) -> Self {
        Self {
            name: name.into(),
            uid: uid.into(),
            pod_cidrs: pod_cidrs.iter().map(|c| PodCidr::parse(c)).collect(),
            addresses: Vec::new(),
            provider_id: None,
            deleting: false,
            network_unavailable: None,
            forwarding_disabled: false,
            excluded: false,
        }
    }

    /// Builder: sets the addresses.
    pub fn with_addresses(mut self, addresses: Vec<NodeAddress>) -> Self {
        self.addresses = addresses;
        self
    }

    /// Builder: sets the provider id.
    pub fn with_provider_id(mut self, id: impl Into<String>) -> Self {
        self.provider_id = Some(id.into());
        self
    }

    /// Builder: sets the current NetworkUnavailable condition.
    pub fn with_condition(mut self, status: &str, reason: &str) -> Self {
        self.network_unavailable = Some(ConditionState::new(status, reason));
        self
    }

    /// The valid pod CIDRs, in order, duplicates removed.
    pub fn valid_pod_cidrs(&self) -> Vec<Cidr> {
        let mut out: Vec<Cidr> = Vec::with_capacity(self.pod_cidrs.len());
        for c in &self.pod_cidrs {
            if let PodCidr::Valid(c) = c
                && !out.contains(c)
            {
                out.push(*c);
            }
        }
        out
    }
}

/// A route's destination: parsed, or kept verbatim when the cloud returned
/// something that is not a CIDR. Unparsable routes are never deleted.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Destination {
    /// A valid CIDR.
    Cidr(Cidr),
    /// Whatever the cloud said, verbatim.
    Unparsable(String),
}

impl Destination {
    /// Parses a destination string from a cloud answer.
    pub fn parse(s: &str) -> Self {
        match Cidr::parse(s) {
            Ok(c) => Destination::Cidr(c),
            Err(_) => Destination::Unparsable(s.to_string()),
        }
    }

    /// The CIDR, if the destination parsed.
    pub fn cidr(&self) -> Option<Cidr> {
        match self {
            Destination::Cidr(c) => Some(*c),
            Destination::Unparsable(_) => None,
        }
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Destination::Cidr(c) => write!(f, "{c}"),
            Destination::Unparsable(s) => write!(f, "{s}"),
        }
    }
}

impl fmt::Debug for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Destination::Cidr(c) => write!(f, "{c}"),
            Destination::Unparsable(s) => write!(f, "unparsable({s:?})"),
        }
    }
}

impl From<Cidr> for Destination {
    fn from(c: Cidr) -> Self {
        Destination::Cidr(c)
    }
}

/// A cloud route, as listed by a provider or as wanted by the planner.
///
/// Mirrors upstream's `cloudprovider.Route` (`TargetNode`,
/// `DestinationCIDR`, `Blackhole`, `TargetNodeAddresses`,
/// `EnableNodeAddresses`), plus what providers need to address the route in
/// their API ([`Route::next_hop`]), to create it ([`Route::node_provider_id`])
/// and to tell their tables apart ([`Route::table`]). The field names say
/// which thing each one is: the table it lives in, the Node it serves, the
/// Node's instance, and what it points at in the cloud's own terms.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Route {
    /// The provider's name for the route; empty on routes the planner wants created.
    pub name: Text,
    /// The Kubernetes Node the route sends traffic to (upstream's
    /// `TargetNode`); may be empty.
    #[serde(alias = "target_node")]
    pub node: Text,
    /// The destination (a pod CIDR).
    pub destination: Destination,
    /// The cloud reports the route as a blackhole (its target is gone).
    pub blackhole: bool,
    /// The Node's addresses, as the provider knows them.
    #[serde(alias = "target_node_addresses")]
    pub node_addresses: Vec<NodeAddress>,
    /// The provider fills `node_addresses` reliably, so a difference from
    /// the Node's addresses means the route must be re-created.
    pub enable_node_addresses: bool,
    /// What the route points at in the cloud's own terms (instance id,
    /// next-hop IP, gateway, network interface). Opaque to the planner.
    #[serde(alias = "cloud_target")]
    pub next_hop: Text,
    /// The Node's `spec.providerID`, i.e. its instance: filled on routes to
    /// create, and on listed routes where the provider knows which instance
    /// the route names.
    #[serde(alias = "target_provider_id")]
    pub node_provider_id: Option<Text>,
    /// The route table (AWS route table, OpenStack router, ...) the route
    /// lives in, for providers with several per cluster
    /// ([`crate::PlanConfig::tables`]); empty when the provider has one.
    #[serde(default, alias = "target")]
    pub table: Text,
    /// Whose the route provably is, when it is not this cluster's although
    /// its destination lies inside a cluster CIDR: another cluster (named by
    /// the provider from its own evidence: an instance tagged for it, a next
    /// hop outside this cluster's node subnets, another cluster's name
    /// prefix) or a Node left out of routing. Such a route is never deleted,
    /// and a pod CIDR overlapping it gets no route and a Warning instead of
    /// a delete/create fight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub foreign: Option<Text>,
}

impl Route {
    /// A route to `node` for `destination`, with nothing else set.
    pub fn new(node: impl Into<Text>, destination: impl Into<Destination>) -> Self {
        Self {
            name: Text::default(),
            node: node.into(),
            destination: destination.into(),
            blackhole: false,
            node_addresses: Vec::new(),
            enable_node_addresses: false,
            next_hop: Text::default(),
            node_provider_id: None,
            table: Text::default(),
            foreign: None,
        }
    }

    /// Parses `destination` from text (cloud answers); never fails.
    pub fn from_text(node: impl Into<Text>, destination: &str) -> Self {
        Self::new(node, Destination::parse(destination))
    }

    /// Builder: sets the name.
    pub fn named(mut self, name: impl Into<Text>) -> Self {
        self.name = name.into();
        self
    }

    /// Builder: sets the target addresses and marks them as reliable.
    pub fn with_addresses(mut self, addrs: Vec<NodeAddress>, enable: bool) -> Self {
        self.node_addresses = addrs;
        self.enable_node_addresses = enable;
        self
    }

    /// Builder: sets the route table it lives in.
    pub fn in_table(mut self, table: impl Into<Text>) -> Self {
        self.table = table.into();
        self
    }

    /// Builder: marks the route as provably someone else's ([`Route::foreign`]).
    pub fn owned_by(mut self, owner: impl Into<Text>) -> Self {
        self.foreign = Some(owner.into());
        self
    }

    /// Builder: marks the route as a blackhole.
    pub fn blackholed(mut self) -> Self {
        self.blackhole = true;
        self
    }
}

/// Parses a comma-separated cluster CIDR list the way the cloud-controller-manager
/// does: one CIDR, or one IPv4 and one IPv6 CIDR.
pub fn parse_cluster_cidrs(s: &str) -> Result<Vec<Cidr>, ClusterCidrError> {
    if s.trim().is_empty() {
        return Err(ClusterCidrError::Empty);
    }
    let cidrs = s
        .split(',')
        .map(|p| Cidr::parse(p.trim()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(ClusterCidrError::Invalid)?;
    match cidrs.as_slice() {
        [_] => Ok(cidrs),
        [a, b] if a.family() != b.family() => Ok(cidrs),
        [_, _] => Err(ClusterCidrError::NotDualStack(s.to_string())),
        _ => Err(ClusterCidrError::TooMany(cidrs.len())),
    }
}

/// Why a `--cluster-cidr` value is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterCidrError {
    /// Nothing given.
    #[error(
        "--cluster-cidr is required: give one CIDR, or one IPv4 and one IPv6 CIDR separated by a comma"
    )]
    Empty,
    /// An entry is not a CIDR.
    #[error("--cluster-cidr: {0}")]
    Invalid(CidrError),
    /// Two CIDRs of one family.
    #[error("--cluster-cidr {0:?}: two CIDRs must be one IPv4 and one IPv6 (dual-stack)")]
    NotDualStack(String),
    /// More than two entries.
    #[error("--cluster-cidr: at most two CIDRs (one per IP family) are allowed, got {0}")]
    TooMany(usize),
}
