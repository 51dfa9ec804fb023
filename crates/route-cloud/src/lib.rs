//! The cloud-provider interface.
//!
//! A provider *translates*: it lists the cloud's routes as [`route_core::Route`]s
//! and creates or deletes the routes it is told to. It never decides what
//! should exist; that is the planner's job. Each provider describes what its
//! API can do with [`Capabilities`] and classifies every failure with
//! [`CloudError`], so the controller can retry, back off or resync correctly.

pub mod conditional;
mod error;
pub mod fence;
pub mod permissions;
pub mod ratelimit;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use route_core::{NodeView, OpKey, Route, TargetNeeds};

pub use conditional::{ConditionalWrite, write_conditionally};
pub use error::{CloudError, ErrorKind};
pub use fence::{BootClock, Clock, Fence, TokioClock};
pub use permissions::{Access, RequestKind};

/// What a provider's API supports; the executor sizes itself from this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// How many create/delete calls may be in flight at once (AWS: many;
    /// Hetzner: one per network, actions are serialised).
    pub max_concurrent_operations: usize,
    /// [`CloudRoutes::apply_batch`] applies many changes in one call.
    pub supports_batch: bool,
    /// Listed routes carry the target node's addresses reliably
    /// (`Route::enable_node_addresses`).
    pub reports_node_addresses: bool,
    /// IPv6 destinations are accepted.
    pub supports_ipv6: bool,
    /// The most routes the cloud accepts in one route target (table,
    /// router, network), if it has a limit.
    pub max_routes: Option<usize>,
    /// What a Node must carry before a route to it can be created; the
    /// planner waits for it instead of sending a creation the cloud refuses.
    pub needs: TargetNeeds,
    /// `create_route` for the destination of a blackhole replaces it in one
    /// call (AWS `ReplaceRoute`), so the planner sends no deletion first.
    pub replaces_blackholes: bool,
    /// [`CloudRoutes::check_forwarding`] answers: the cloud drops pod
    /// traffic a Node forwards unless something on its instance or
    /// interface is set, and the provider can tell whether it is.
    pub checks_forwarding: bool,
    /// [`Capabilities::max_routes`] counts IPv4 and IPv6 routes apart
    /// (AWS: 50 of each per route table by default).
    pub max_routes_per_family: bool,
}

impl Default for Capabilities {
    fn default() -> Self {
        Self {
            max_concurrent_operations: 10,
            supports_batch: false,
            reports_node_addresses: false,
            supports_ipv6: true,
            max_routes: None,
            needs: TargetNeeds::Nothing,
            replaces_blackholes: false,
            checks_forwarding: false,
            max_routes_per_family: false,
        }
    }
}

/// What a provider found about one Node's forwarding prerequisite: what
/// the cloud needs on the Node's instance or interface before it delivers
/// the pod traffic the Node forwards (AWS: the source/destination check
/// off; GCE: `canIpForward`; Azure: the NIC's `enableIPForwarding`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forwarding {
    /// In place.
    Ready,
    /// It was off and the provider turned it on again (the controller
    /// tells the operator with a Warning: something turned it off).
    Repaired {
        /// What was repaired, for the Warning ("source/destination check on i-0abc").
        what: String,
    },
    /// Off, and the provider would turn it back on: the answer of a check
    /// asked not to repair (`plan`) where it repairs.
    WouldRepair {
        /// What is off.
        what: String,
    },
    /// Off, and not the provider's to change: the routes are kept, so
    /// traffic flows the moment it is on.
    Disabled {
        /// What is off ("instance node-1 has canIpForward false").
        what: String,
        /// How the operator turns it on.
        fix: String,
    },
}

/// How [`CloudRoutes::check_forwarding`] may answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardingCheck {
    /// Read the cloud again, even for what the provider remembers (at start,
    /// on the resync, and for prerequisites last found off). Without it the
    /// provider answers from memory and reads only what it never saw.
    pub fresh: bool,
    /// Turn a prerequisite the provider owns back on (AWS). Off for `plan`,
    /// which changes nothing.
    pub repair: bool,
}

/// A set of changes applied in one call by providers whose API takes the whole
/// route table at once (OpenStack Neutron).
///
/// Every change travels under the key of the planned operation it is
/// ([`OpKey`]), and the provider answers by that key ([`BatchResult`]): no
/// one on either side pairs an answer with its change by position.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// Routes to delete, as listed, each under its operation's key.
    pub delete: Vec<(OpKey, Route)>,
    /// Routes to create, each under its operation's key, with its name hint.
    pub create: Vec<(OpKey, String, Route)>,
}

/// The answer to a [`Batch`]: the result of each change, by its key (a
/// created route, or `None` for a deletion).
///
/// A map rather than a list of pairs: each change has exactly one result,
/// which its caller takes by the key it sent, so the type itself rules out
/// two answers for one change, and a change left unanswered or an answer
/// for a change never asked shows as a missing or a leftover key. Ordered
/// by key, so its `Debug` and its iteration are the same on every run.
pub type BatchResult = BTreeMap<OpKey, Result<Option<Route>, CloudError>>;

impl Batch {
    /// A batch of `delete` and `create` (name hint, route), keyed as the
    /// planner keys them: a creation by its name hint (the Node's UID),
    /// destination and table; a deletion by its route and, for a route
    /// given more than once exactly alike, which copy it is. The changes
    /// keep the order given. For callers without a plan (single-route
    /// calls, the cleanup command, tests).
    pub fn new(delete: &[Route], create: &[(String, Route)]) -> Self {
        let mut copies: HashMap<&Route, u32> = HashMap::new();
        Self {
            delete: delete
                .iter()
                .map(|r| {
                    let copy = copies.entry(r).or_default();
                    let key = OpKey::Delete {
                        route: r.clone(),
                        copy: *copy,
                    };
                    *copy += 1;
                    (key, r.clone())
                })
                .collect(),
            create: create
                .iter()
                .map(|(hint, r)| {
                    let key = OpKey::Create {
                        node_uid: hint.clone(),
                        destination: r.destination.clone(),
                        table: r.table.clone(),
                    };
                    (key, hint.clone(), r.clone())
                })
                .collect(),
        }
    }

    /// A batch of one creation: how a provider whose writes are whole-table
    /// batches answers [`CloudRoutes::create_route`].
    pub fn one_creation(name_hint: &str, route: &Route) -> Self {
        Self::new(&[], &[(name_hint.to_string(), route.clone())])
    }

    /// A batch of one deletion, for [`CloudRoutes::delete_route`].
    pub fn one_deletion(route: &Route) -> Self {
        Self::new(std::slice::from_ref(route), &[])
    }

    /// The key of every change: the deletions', then the creations'.
    pub fn keys(&self) -> impl Iterator<Item = &OpKey> {
        self.delete
            .iter()
            .map(|(k, _)| k)
            .chain(self.create.iter().map(|(k, _, _)| k))
    }

    /// How many changes the batch holds.
    pub fn len(&self) -> usize {
        self.delete.len() + self.create.len()
    }

    /// The batch holds no change.
    pub fn is_empty(&self) -> bool {
        self.delete.is_empty() && self.create.is_empty()
    }
}

/// The created route of a [`Batch::one_creation`]'s `result`; a result
/// without one for the batch's creation is transient (the write's outcome
/// is not known).
pub fn created_by(batch: &Batch, mut result: BatchResult) -> Result<Route, CloudError> {
    let answer = batch.create.first().and_then(|(k, _, _)| result.remove(k));
    match answer {
        Some(Ok(Some(route))) => Ok(route),
        Some(Err(e)) => Err(e),
        _ => Err(CloudError::new(
            ErrorKind::Transient,
            "no result for the creation",
        )),
    }
}

/// The outcome of a [`Batch::one_deletion`]'s `result`; no result for the
/// batch's deletion is transient.
pub fn deleted_by(batch: &Batch, mut result: BatchResult) -> Result<(), CloudError> {
    let answer = batch.delete.first().and_then(|(k, _)| result.remove(k));
    match answer {
        Some(Ok(_)) => Ok(()),
        Some(Err(e)) => Err(e),
        None => Err(CloudError::new(
            ErrorKind::Transient,
            "no result for the deletion",
        )),
    }
}

/// The interface every cloud implements. All methods are cancel-safe only in
/// the sense that a dropped call may or may not have happened in the cloud;
/// the controller treats that as an uncertain answer and resyncs.
#[async_trait]
pub trait CloudRoutes: Send + Sync + 'static {
    /// A short provider name for logs and metrics (`aws`, `memory`, ...).
    fn name(&self) -> &'static str;

    /// What this provider supports.
    fn capabilities(&self) -> Capabilities;

    /// The provider's request counters (by operation and result).
    fn stats(&self) -> &RequestStats;

    /// Every route of `cluster` the provider manages, in every route target,
    /// each with its [`Route::target`].
    async fn list_routes(&self, cluster: &str) -> Result<Vec<Route>, CloudError>;

    /// The route targets of this cluster (AWS route tables, OpenStack
    /// routers) when the provider has several: every Node's route must exist
    /// in each, and routes go to and come from them by [`Route::target`].
    /// Empty (the default) for a provider with one table, whose routes leave
    /// `target` empty. A provider that discovers its targets does so in
    /// `list_routes`; this answers what the last list found.
    fn targets(&self) -> Vec<route_core::Text> {
        Vec::new()
    }

    /// Looks the route targets up again without listing routes, for a
    /// provider that discovers them (AWS: route tables by tag). The
    /// controller calls it every discovery period in which no list ran, and
    /// lists when the answer differs from [`CloudRoutes::targets`]; it must
    /// not change what `targets` answers (the next list does). `None` (the
    /// default): the targets are fixed by configuration.
    async fn discover_targets(
        &self,
        cluster: &str,
    ) -> Result<Option<Vec<route_core::Text>>, CloudError> {
        let _ = cluster;
        Ok(None)
    }

    /// Creates `route` (its `name` is ignored). Returns the route as a later
    /// `list_routes` would show it, so the controller can cache it.
    ///
    /// Creating a route that already exists to the same node answers either
    /// that route or [`ErrorKind::AlreadyExists`] (after which the
    /// controller lists again); either way the table holds it once. The
    /// conformance suite (`crates/provider-conformance`) checks this.
    async fn create_route(
        &self,
        cluster: &str,
        name_hint: &str,
        route: &Route,
    ) -> Result<Route, CloudError>;

    /// Deletes a route previously returned by `list_routes` or `create_route`.
    ///
    /// Deleting a route that is already gone answers `Ok` or
    /// [`ErrorKind::NotFound`]; the controller takes both as done.
    async fn delete_route(&self, cluster: &str, route: &Route) -> Result<(), CloudError>;

    /// Applies deletions then creations in one call. The answer has one
    /// result per change of `batch`, under that change's key (a created
    /// route, or `None` for a deletion), and no other; the caller treats a
    /// change left unanswered as one whose outcome is unknown. Only called
    /// when `supports_batch` is true.
    async fn apply_batch(&self, cluster: &str, batch: &Batch) -> Result<BatchResult, CloudError> {
        let _ = (cluster, batch);
        Err(CloudError::new(
            ErrorKind::InvalidRequest,
            format!("the {} provider does not support batches", self.name()),
        ))
    }

    /// Checks the forwarding prerequisite of `nodes` (Nodes with pod CIDRs),
    /// batched: a provider never sends one request per Node per pass. The
    /// answer names Nodes by name; a Node it leaves out has no news (its
    /// instance is not known yet, or it needs nothing). Only called when
    /// [`Capabilities::checks_forwarding`]; the default answers nothing.
    ///
    /// A provider that must prepare an instance before its first route (AWS
    /// turns the check off) still does so when creating the route; this is
    /// how the controller learns that it was undone behind its back.
    async fn check_forwarding(
        &self,
        cluster: &str,
        nodes: &[Arc<NodeView>],
        check: ForwardingCheck,
    ) -> Result<Vec<(String, Forwarding)>, CloudError> {
        let _ = (cluster, nodes, check);
        Ok(Vec::new())
    }

    /// Shows the provider the Nodes that exist now; the controller calls it
    /// with the same snapshot it plans with, before each `list_routes`.
    /// Providers whose routes name a cloud object rather than a node (AWS: an
    /// instance id) map it back through the Nodes' `spec.providerID` instead
    /// of asking the cloud on every list. The default ignores the nodes.
    ///
    /// The snapshot is shared, not copied: this runs before every full pass.
    fn observe_nodes(&self, nodes: &[Arc<NodeView>]) {
        let _ = nodes;
    }

    /// Routes in each route target that the last `list_routes` left out
    /// (not this cluster's kind: the VPC's local route, gateways, peerings)
    /// but that the cloud counts against [`Capabilities::max_routes`], by
    /// target and address family. So a limit means what the cloud's console
    /// says it means. Empty (the default): only the listed routes count.
    fn unlisted_routes(&self) -> Vec<((route_core::Text, route_core::IpFamily), usize)> {
        Vec::new()
    }

    /// The route as a `list_routes` now would show it, worked out from what
    /// the provider already knows, without a request; `None` when nothing
    /// it reports could have changed (the default). A cached route table
    /// keeps what was true when it was listed; a provider that derives a
    /// route's target node addresses from the Nodes (OpenStack: the next
    /// hop's node) refreshes them here, so a later change of the Node's
    /// other addresses does not look like a route to replace.
    fn refresh_route(&self, route: &Route) -> Option<Route> {
        let _ = route;
        None
    }
}

/// A per-request timeout every provider applies unless configured otherwise.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

pub mod stats;
pub use stats::RequestStats;
