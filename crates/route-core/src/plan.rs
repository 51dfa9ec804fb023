//! The plan: what must change in the cloud and on the Nodes.
//!
//! A [`Plan`] is computed by [`crate::planner::plan`] from a snapshot of Nodes
//! and cloud routes. It is data only; the controller executes it.
//!
//! Every planned operation is a value with a key ([`OpKey`]): the same key
//! names it in the plan, in the controller's gate, in the executor's outcome
//! and in the retry book, so no structure depends on another's order.
//! Operations refer to each other by key: a creation lists, in
//! [`Creation::after`], every deletion of a route with the same destination
//! in the same table, which must succeed before it may start (a route
//! re-created after an address change, a blackhole replaced by a live route,
//! a CIDR moving from a stale route to its new node); everything else may
//! run concurrently.

use serde::{Deserialize, Serialize};

use crate::cidr::Cidr;
use crate::model::{ConditionState, Destination, Route};
use crate::text::Text;

/// Planner settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanConfig {
    /// `--cluster-cidr`: one CIDR, or one per IP family. Routes are this
    /// cluster's to delete only when they fall inside one of them; pod CIDRs
    /// outside all of them get no route.
    pub cluster_cidrs: Vec<Cidr>,
    /// What the provider needs on a Node before it can route to it. The
    /// controller takes it from the provider's capabilities.
    #[serde(default)]
    pub needs: TargetNeeds,
    /// The provider replaces a blackhole in place when asked to create a
    /// route for its destination (AWS `ReplaceRoute`): a blackhole of a CIDR
    /// its node still owns is then replaced by one creation, with no deletion
    /// and no moment without a route. From the provider's capabilities.
    #[serde(default)]
    pub replace_blackholes: bool,
    /// The route tables of this cluster, for providers with several (AWS
    /// route tables, OpenStack routers; the provider contract calls them
    /// route targets): every Node's route must exist in each. Empty for
    /// providers with one; from the provider.
    #[serde(default, alias = "targets")]
    pub tables: Vec<crate::text::Text>,
    /// Address families this controller does not route
    /// (`--route-ip-families`): pod CIDRs of these families get no route and
    /// no condition, and routes of these families are never touched, as if
    /// the cluster had no CIDR of the family. Empty: every family.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skip_families: Vec<crate::cidr::IpFamily>,
}

impl PlanConfig {
    /// Whether pod CIDRs and routes of `family` are routed at all.
    pub fn routes_family(&self, family: crate::cidr::IpFamily) -> bool {
        !self.skip_families.contains(&family)
    }
}

/// What a provider needs on a Node to create a route to it.
///
/// With `--cloud-provider=external` a Node is registered without
/// `spec.providerID` and often without addresses; node IPAM gives it a pod
/// CIDR at once and the cloud-controller-manager fills in the rest seconds
/// later. A creation sent in that window is refused, so the planner does not
/// plan one: the Node is listed in [`Plan::awaiting_node_data`] and gets its
/// route in the pass its data arrives in, with no backoff to sit out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetNeeds {
    /// The provider can route to any Node by name (memory, hcloud).
    #[default]
    Nothing,
    /// `spec.providerID` (AWS: the instance id).
    ProviderId,
    /// An `InternalIP` of the route's address family (OpenStack: the next hop).
    InternalIp,
}

impl TargetNeeds {
    /// What `node` still lacks for a route of `family`, if anything.
    pub fn missing(
        self,
        node: &crate::model::NodeView,
        family: crate::cidr::IpFamily,
    ) -> Option<MissingNodeData> {
        match self {
            TargetNeeds::Nothing => None,
            TargetNeeds::ProviderId => node
                .provider_id
                .as_deref()
                .is_none_or(|p| p.trim().is_empty())
                .then_some(MissingNodeData::ProviderId),
            TargetNeeds::InternalIp => {
                let has = node.addresses.iter().any(|a| {
                    a.kind == "InternalIP"
                        && crate::cidr::parse_ip_sloppy(a.address.trim()).is_some_and(|ip| {
                            match family {
                                crate::cidr::IpFamily::V4 => ip.is_ipv4(),
                                crate::cidr::IpFamily::V6 => ip.is_ipv6(),
                            }
                        })
                });
                (!has).then_some(MissingNodeData::InternalIp(family))
            }
        }
    }
}

/// The Node data a route waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MissingNodeData {
    /// `spec.providerID` is not set yet.
    ProviderId,
    /// No `InternalIP` of this family in `status.addresses` yet.
    InternalIp(crate::cidr::IpFamily),
}

impl std::fmt::Display for MissingNodeData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MissingNodeData::ProviderId => f.write_str("spec.providerID"),
            MissingNodeData::InternalIp(fam) => write!(f, "an {fam} InternalIP"),
        }
    }
}

/// A pod CIDR whose route waits for Node data the provider needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AwaitingNodeData {
    /// The node.
    pub node: String,
    /// The pod CIDR.
    pub cidr: Cidr,
    /// What is missing.
    pub missing: MissingNodeData,
}

/// Why a route is to be deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeletionReason {
    /// The route names a node that does not exist (deleted, or never existed).
    NodeGone,
    /// The route has no target node.
    NoTargetNode,
    /// The node exists but no longer has this pod CIDR.
    CidrNotAssigned,
    /// The cloud reports the route as a blackhole.
    Blackhole,
    /// The route's Node left the selection (`--node-selector`) after a
    /// route controller routed it.
    NodeExcluded,
    /// The node's addresses changed and the provider tracks them: delete, then re-create.
    AddressesChanged,
    /// Another route for the same node and CIDR is kept.
    Duplicate,
    /// The route points at another instance than the node's `spec.providerID`
    /// (the Node was re-created under the same name on a new instance):
    /// delete, then re-create.
    TargetChanged,
}

/// Why a route is to be created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CreationReason {
    /// The node's pod CIDR has no route.
    Missing,
    /// Re-creation after [`DeletionReason::AddressesChanged`].
    AddressesChanged,
    /// Replaces a blackhole route for a CIDR the node still owns.
    ReplacesBlackhole,
    /// Re-creation after [`DeletionReason::TargetChanged`].
    TargetChanged,
}

/// A pod CIDR that overlaps a route provably someone else's
/// ([`Route::foreign`]): it gets no route (creating one would start a
/// delete/create fight with the other cluster's controller, or shadow its
/// route) and its Node a `PodCIDROverlap` Warning.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overlap {
    /// The node.
    pub node: String,
    /// Its pod CIDR.
    pub cidr: Cidr,
    /// The other route's destination.
    pub route: Cidr,
    /// Whose the other route is.
    pub owner: Text,
    /// The route table (empty with a single table).
    #[serde(default, skip_serializing_if = "crate::text::Text::is_empty")]
    pub table: Text,
}

/// The identity of one planned cloud operation, across modules and passes.
///
/// Upstream's route controller keys its work by Node and CIDR; so does this
/// one, plus the table, since each table's route fails and retries on its
/// own. A key says nothing about the operation's position in a plan: plans
/// may be joined, filtered and re-sorted freely.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum OpKey {
    /// Create the route of this Node (by UID: a Node re-created under the
    /// same name is another Node) for this destination in this table.
    Create {
        /// The Node's `metadata.uid`.
        node_uid: String,
        /// The pod CIDR.
        destination: Destination,
        /// The route table ([`Route::table`]); empty with a single table.
        table: Text,
    },
    /// Delete this route, exactly as the cloud listed it: providers delete
    /// by what they listed, so that is what tells two deletions apart.
    Delete {
        /// The listed route.
        route: Route,
        /// Which copy of it: 0, or for a route listed more than once
        /// exactly alike (a cloud that keeps duplicate entries), 1 for the
        /// second, and so on; each listed copy is deleted.
        copy: u32,
    },
}

impl std::fmt::Display for OpKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let table = |t: &Text| {
            if t.is_empty() {
                String::new()
            } else {
                format!(" in {t}")
            }
        };
        match self {
            OpKey::Create {
                node_uid,
                destination,
                table: t,
            } => write!(
                f,
                "create {destination} for Node uid {node_uid}{}",
                table(t)
            ),
            OpKey::Delete { route, .. } => {
                write!(f, "delete {}", route.destination)?;
                if !route.name.is_empty() {
                    write!(f, " ({})", route.name)?;
                }
                if !route.node.is_empty() {
                    write!(f, " to {}", route.node)?;
                }
                write!(f, "{}", table(&route.table))
            }
        }
    }
}

/// One route to delete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deletion {
    /// The route exactly as the cloud listed it (providers delete by it).
    pub route: Route,
    /// Why.
    pub reason: DeletionReason,
    /// Which copy of the route this is, when the cloud listed it more than
    /// once exactly alike ([`OpKey::Delete`]); 0 otherwise.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub copy: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Deletion {
    /// This deletion's identity.
    pub fn key(&self) -> OpKey {
        OpKey::Delete {
            route: self.route.clone(),
            copy: self.copy,
        }
    }
}

/// One route to create.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Creation {
    /// The route wanted: Node, destination, the Node's addresses and provider id.
    pub route: Route,
    /// The Node's UID: part of the creation's identity, and the name hint
    /// the provider is given (as upstream).
    pub node_uid: String,
    /// The deletions that must succeed before this creation starts: those
    /// of routes with the same destination in the same table.
    pub after: Vec<OpKey>,
    /// The blackhole route this creation replaces in place
    /// ([`PlanConfig::replace_blackholes`]); it is not deleted.
    #[serde(default)]
    pub replaces: Option<Route>,
    /// Why.
    pub reason: CreationReason,
}

impl Creation {
    /// This creation's identity.
    pub fn key(&self) -> OpKey {
        OpKey::Create {
            node_uid: self.node_uid.clone(),
            destination: self.route.destination.clone(),
            table: self.route.table.clone(),
        }
    }
}

/// Two or more nodes claim overlapping pod CIDRs; no competing route is created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conflict {
    /// The CIDR claimed; when the claims differ in size, the widest one,
    /// which covers every other claim of the group.
    pub cidr: Cidr,
    /// Every node that claims it, sorted.
    pub nodes: Vec<String>,
}

/// A pod CIDR that lies outside every cluster CIDR; it gets no route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutsideCidr {
    /// The node.
    pub node: String,
    /// The pod CIDR.
    pub cidr: Cidr,
}

/// A pod CIDR on a Node that is not a CIDR at all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvalidPodCidr {
    /// The node.
    pub node: String,
    /// The text found in `spec.podCIDRs`.
    pub text: String,
}

/// The value of the `NetworkUnavailable` condition this controller writes:
/// a closed set, one reason per state a Node can be in, so an operator
/// reads from `kubectl get node -o yaml` (or `plan`) why a Node is not
/// routed. Only `RouteCreated` and `NodeExcluded` say `False`; the rest say
/// `True`, which keeps the `node.kubernetes.io/network-unavailable` taint on.
/// `RouteCreated` and `NoRouteCreated` are upstream's and mean what they
/// mean there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum NetworkCondition {
    /// `False`/`RouteCreated`: every route of the Node is in place.
    RouteCreated,
    /// `True`/`NoRouteCreated`: a creation failed (or waits behind a
    /// deletion that failed) and is retried with backoff; also a Node with
    /// no pod CIDR that some route targets, as upstream.
    NoRouteCreated,
    /// `True`/`ForwardingDisabled`: every route is in place, but the cloud
    /// drops the pod traffic the Node forwards, because a prerequisite on
    /// its instance or interface is off (GCE `canIpForward`, Azure
    /// `enableIPForwarding`) and it is not this controller's to change. The
    /// Node's Warning Event names the fix.
    ForwardingDisabled,
    /// `True`/`AwaitingNodeData`: the provider needs `spec.providerID` or
    /// an `InternalIP` the Node does not have yet; routed when it arrives.
    AwaitingNodeData,
    /// `True`/`RouteQuotaExceeded`: the route table has no room under the
    /// cloud's route limit; routed as soon as room appears.
    RouteQuotaExceeded,
    /// `True`/`InstanceNotRunning`: the cloud refused the route because the
    /// Node's instance is stopped, or keeps blackholing it.
    InstanceNotRunning,
    /// `True`/`PodCIDRConflict`: another Node claims the pod CIDR, or a
    /// route that is provably another cluster's overlaps it.
    PodCidrConflict,
    /// `True`/`InvalidPodCIDR`: a pod CIDR is not a CIDR, or lies outside
    /// every cluster CIDR with no live route for it in the table.
    InvalidPodCidr,
    /// `False`/`NodeExcluded`: the Node is left out of routing on purpose
    /// (`--node-selector`) and a route controller routed it before; its
    /// routes are gone and its pod network is someone else's. A Node that
    /// was never this controller's keeps its condition untouched.
    NodeExcluded,
    /// `Unknown`/`RouteUnverified`: the Node read `RouteCreated`, but the
    /// cloud's routes could not be listed for longer than the drift check
    /// period, so whether its route is still there is not known. Never
    /// planned: the controller writes it when listing keeps failing, and the
    /// next successful listing plans the Node's condition again. `Unknown`,
    /// not `True`: the route is probably still there, and `True` would
    /// taint every Node during a cloud API outage.
    RouteUnverified,
}

impl NetworkCondition {
    /// Every value, in the order of [`NetworkCondition::rank`].
    pub const ALL: [NetworkCondition; 10] = [
        NetworkCondition::RouteCreated,
        NetworkCondition::ForwardingDisabled,
        NetworkCondition::NoRouteCreated,
        NetworkCondition::InstanceNotRunning,
        NetworkCondition::RouteQuotaExceeded,
        NetworkCondition::AwaitingNodeData,
        NetworkCondition::PodCidrConflict,
        NetworkCondition::InvalidPodCidr,
        NetworkCondition::NodeExcluded,
        NetworkCondition::RouteUnverified,
    ];

    /// The condition's `status`.
    pub fn status(self) -> &'static str {
        match self {
            NetworkCondition::RouteCreated | NetworkCondition::NodeExcluded => "False",
            NetworkCondition::RouteUnverified => "Unknown",
            _ => "True",
        }
    }

    /// The condition's `reason`.
    pub fn reason(self) -> &'static str {
        match self {
            NetworkCondition::RouteCreated => "RouteCreated",
            NetworkCondition::NoRouteCreated => "NoRouteCreated",
            NetworkCondition::ForwardingDisabled => "ForwardingDisabled",
            NetworkCondition::AwaitingNodeData => "AwaitingNodeData",
            NetworkCondition::RouteQuotaExceeded => "RouteQuotaExceeded",
            NetworkCondition::InstanceNotRunning => "InstanceNotRunning",
            NetworkCondition::PodCidrConflict => "PodCIDRConflict",
            NetworkCondition::InvalidPodCidr => "InvalidPodCIDR",
            NetworkCondition::NodeExcluded => "NodeExcluded",
            NetworkCondition::RouteUnverified => "RouteUnverified",
        }
    }

    /// The value whose reason is `reason`, if it is one of this set.
    pub fn from_reason(reason: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.reason() == reason)
    }

    /// The condition's `message`.
    pub fn message(self) -> &'static str {
        match self {
            NetworkCondition::RouteCreated => "RouteController created a route",
            NetworkCondition::NoRouteCreated => "RouteController failed to create a route",
            NetworkCondition::ForwardingDisabled => {
                "RouteController created a route, but the cloud drops the pod traffic this Node forwards (see the Node's Events for the fix)"
            }
            NetworkCondition::AwaitingNodeData => {
                "RouteController waits for Node data the cloud needs before it can create a route: spec.providerID, or an InternalIP of each pod CIDR's address family (a dual-stack Node with only an IPv4 InternalIP has no next hop for its IPv6 pod CIDR); `cloud-route-controller plan` names what is missing"
            }
            NetworkCondition::RouteQuotaExceeded => {
                "RouteController cannot create a route: the route table is at the cloud's route limit (see the Node's Events)"
            }
            NetworkCondition::InstanceNotRunning => {
                "RouteController cannot create a route: the cloud refuses it while the Node's instance is not running"
            }
            NetworkCondition::PodCidrConflict => {
                "RouteController created no route: the pod CIDR is claimed by another Node or by another cluster's route (see the Node's Events)"
            }
            NetworkCondition::InvalidPodCidr => {
                "RouteController created no route: a pod CIDR is not a CIDR or lies outside the cluster CIDRs"
            }
            NetworkCondition::NodeExcluded => {
                "RouteController does not route this Node: it is outside --node-selector"
            }
            NetworkCondition::RouteUnverified => {
                "RouteController could not list the cloud's routes for longer than its drift check period: whether this Node's route is still in place is not known (see the controller's log)"
            }
        }
    }

    /// When the controller writes it, as the operator reference says
    /// (docs/reference/conditions-and-events.md is generated from this).
    pub fn when(self) -> &'static str {
        match self {
            NetworkCondition::RouteCreated => {
                "every pod CIDR of the Node has its route in every route target, and its forwarding prerequisite is not known to be off"
            }
            NetworkCondition::NoRouteCreated => {
                "a creation failed (or was cut off, or waits behind a deletion that failed) and is retried with backoff; also a Node without pod CIDRs that some route targets, and a Node with pod CIDRs and no condition yet (never routed) while the cloud refuses the controller's listing for its credentials or permissions (EC2 `UnauthorizedOperation`), the message then naming the refusal (`...: the cloud refused DescribeRouteTables: UnauthorizedOperation ...`); a Node that reads `RouteCreated` is never made `True` by a refusal"
            }
            NetworkCondition::ForwardingDisabled => {
                "every route is in place, but the cloud drops the pod traffic the Node forwards (GCE `canIpForward`, Azure `enableIPForwarding` off); the `ForwardingDisabled` Warning names the fix"
            }
            NetworkCondition::AwaitingNodeData => {
                "the provider needs `spec.providerID` or an `InternalIP` the Node does not have yet; routed in the pass it arrives. A dual-stack Node with an IPv4 `InternalIP` only (OpenStack, whose next hop is the Node's address of the route's family) reads this too, with its IPv4 route in place: its IPv6 pods are unreachable, so the Node is not `RouteCreated`, as upstream, which would fail the IPv6 route, says `NoRouteCreated`; `--route-ip-families=IPv4` routes such a cluster on purpose. The message says what kind of data is missing and `plan` names it per Node"
            }
            NetworkCondition::RouteQuotaExceeded => {
                "the route table is at the cloud's route limit; routed as soon as room appears (a `RouteQuotaExceeded` Warning once)"
            }
            NetworkCondition::InstanceNotRunning => {
                "the cloud refused the route because the Node's instance is stopped (EC2 `IncorrectInstanceState`); retried with backoff"
            }
            NetworkCondition::PodCidrConflict => {
                "another Node claims the pod CIDR, or it overlaps a route that is provably another cluster's (a `PodCIDRConflict` or `PodCIDROverlap` Warning)"
            }
            NetworkCondition::InvalidPodCidr => {
                "a pod CIDR is not a CIDR, or lies outside every `--cluster-cidr` and no live route for it is in the table (one in place, such as upstream's, routes the Node: `RouteCreated`). When no more than half of the Nodes' pod CIDRs of a family lie inside `--cluster-cidr`, the setting is wrong, not the Nodes: no condition is written at all (a `ConfigurationMismatch` Warning)"
            }
            NetworkCondition::NodeExcluded => {
                "the Node left `--node-selector` after a route controller routed it; its routes are gone. `False`, so the network-unavailable taint does not keep pods off a Node whose pod network is someone else's"
            }
            NetworkCondition::RouteUnverified => {
                "the Node read `RouteCreated`, but no listing of the cloud's routes has succeeded for the drift check period plus one pass (a cloud API outage, revoked credentials), so a route deleted meanwhile would go unseen; the next successful listing writes the Node's condition again. `Unknown`, not `True`: the route is most likely still there, and only `True` makes the node lifecycle controller taint the Node"
            }
        }
    }

    /// Which of two explanations a Node shows when several apply: the one
    /// an operator must act on first (a bad pod CIDR before a full table,
    /// a full table before a failure that retries by itself).
    pub fn rank(self) -> usize {
        Self::ALL
            .iter()
            .position(|c| *c == self)
            .unwrap_or_default()
    }

    /// The condition of a Node whose routes are all in place (`routed`) or
    /// not, given whether its forwarding prerequisite is known to be off.
    /// A missing route says more than a disabled prerequisite: it is what
    /// the controller works on.
    pub fn wanted(routed: bool, forwarding_disabled: bool) -> Self {
        match (routed, forwarding_disabled) {
            (false, _) => NetworkCondition::NoRouteCreated,
            (true, true) => NetworkCondition::ForwardingDisabled,
            (true, false) => NetworkCondition::RouteCreated,
        }
    }

    /// The more pressing of two explanations ([`NetworkCondition::rank`]).
    pub fn or(self, other: Self) -> Self {
        if other.rank() > self.rank() {
            other
        } else {
            self
        }
    }

    /// Whether `current` already says exactly this (status AND reason, as
    /// upstream since k/k #136561), in which case no patch is sent.
    pub fn already_set(self, current: Option<&ConditionState>) -> bool {
        current.is_some_and(|c| c.status == self.status() && c.reason == self.reason())
    }
}

/// The condition bookkeeping for one node whose `NetworkUnavailable` this
/// controller manages (upstream: every node with pod CIDRs, and every node
/// without pod CIDRs that some route targets) and that this plan concerns:
/// it has creations, or its condition is not yet what the plan gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePlan {
    /// Node name.
    pub node: String,
    /// Node UID.
    pub uid: String,
    /// The keys of this node's creations in [`Plan::creations`]; for a
    /// Node that left the selection ([`NetworkCondition::NodeExcluded`]),
    /// of the deletions of its routes, which its condition waits for.
    pub creations: Vec<OpKey>,
    /// Some pod CIDR of this node cannot get a route in this plan (no pod
    /// CIDRs at all, a conflict with no existing route to this node, outside
    /// the cluster CIDRs, not a CIDR, Node data the provider needs missing).
    pub unroutable: bool,
    /// Why the Node is [`NodePlan::unroutable`] (or, with
    /// [`NetworkCondition::NodeExcluded`], that it is left out); `None`
    /// reads as `NoRouteCreated`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<NetworkCondition>,
    /// The condition as last seen on the Node.
    pub current: Option<ConditionState>,
    /// The provider found the Node's forwarding prerequisite off
    /// ([`NodeView::forwarding_disabled`]).
    #[serde(default)]
    pub forwarding_disabled: bool,
}

impl NodePlan {
    /// Every pod CIDR of the node has its route once the creations have run,
    /// given which of them failed.
    pub fn routed_after(&self, failed: impl Fn(&OpKey) -> bool) -> bool {
        !self.unroutable && !self.creations.iter().any(failed)
    }

    /// The condition the plan alone gives the Node (every creation done).
    pub fn planned(&self) -> NetworkCondition {
        Self::planned_of(self.unroutable, self.cause, self.forwarding_disabled)
    }

    /// [`NodePlan::planned`] from its parts, for a Node the planner has
    /// not built an outcome for (a settled one is left out without one).
    pub fn planned_of(
        unroutable: bool,
        cause: Option<NetworkCondition>,
        forwarding_disabled: bool,
    ) -> NetworkCondition {
        match cause {
            Some(NetworkCondition::NodeExcluded) => NetworkCondition::NodeExcluded,
            cause if unroutable => cause.unwrap_or(NetworkCondition::NoRouteCreated),
            _ => NetworkCondition::wanted(true, forwarding_disabled),
        }
    }

    /// The condition the node should carry once the creations have run,
    /// given which of them failed; `None` when the node already says so.
    pub fn condition_after(&self, failed: impl Fn(&OpKey) -> bool) -> Option<NetworkCondition> {
        self.condition_given(|k| failed(k).then_some(NetworkCondition::NoRouteCreated))
    }

    /// [`NodePlan::condition_after`], with each failed creation's own
    /// explanation (`None`: it succeeded): a creation refused for room
    /// says `RouteQuotaExceeded`, one refused for a stopped instance
    /// `InstanceNotRunning`. The most pressing explanation wins.
    pub fn condition_given(
        &self,
        failure: impl Fn(&OpKey) -> Option<NetworkCondition>,
    ) -> Option<NetworkCondition> {
        let planned = self.planned();
        let want = if planned == NetworkCondition::NodeExcluded {
            // Written once the deletions of its routes succeeded.
            if self.creations.iter().any(|k| failure(k).is_some()) {
                return None;
            }
            planned
        } else {
            let failed = self
                .creations
                .iter()
                .filter_map(failure)
                .reduce(NetworkCondition::or);
            match (self.unroutable, failed) {
                (_, None) => planned,
                (true, Some(f)) => planned.or(f),
                (false, Some(f)) => f,
            }
        };
        (!want.already_set(self.current.as_ref())).then_some(want)
    }
}

/// Everything a reconcile pass must do.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Routes to delete; all may run concurrently. Keys are unique.
    pub deletions: Vec<Deletion>,
    /// Routes to create; each may start once the deletions it lists
    /// succeeded. Keys are unique.
    pub creations: Vec<Creation>,
    /// Condition bookkeeping, in node order: one entry per managed node
    /// that has creations or whose condition must change. A managed node
    /// left out is settled: every route in place and the condition saying
    /// `RouteCreated` (or, when it cannot be routed, `NoRouteCreated`).
    pub nodes: Vec<NodePlan>,
    /// Pod CIDRs claimed by more than one node.
    pub conflicts: Vec<Conflict>,
    /// Pod CIDRs outside every cluster CIDR.
    pub outside_cluster: Vec<OutsideCidr>,
    /// Pod CIDRs that are not CIDRs.
    pub invalid_pod_cidrs: Vec<InvalidPodCidr>,
    /// Cloud routes whose destination is not a CIDR; never touched.
    pub unparsable_routes: Vec<Route>,
    /// Pod CIDRs without a route because the Node lacks data the provider
    /// needs ([`TargetNeeds`]); planned again when the data arrives.
    #[serde(default)]
    pub awaiting_node_data: Vec<AwaitingNodeData>,
    /// Pod CIDRs overlapping a route that is provably someone else's.
    #[serde(default)]
    pub overlaps: Vec<Overlap>,
}

impl Plan {
    /// No cloud mutation is needed.
    pub fn is_noop(&self) -> bool {
        self.deletions.is_empty() && self.creations.is_empty()
    }

    /// The conditions to write if every creation succeeds.
    pub fn conditions_if_all_succeed(&self) -> impl Iterator<Item = (&NodePlan, NetworkCondition)> {
        self.nodes
            .iter()
            .filter_map(|n| n.condition_after(|_| false).map(|c| (n, c)))
    }
}
