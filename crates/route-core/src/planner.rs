//! The planner: one snapshot of Nodes and cloud routes in, one [`Plan`] out.
//!
//! This module owns *what* must change; the controller owns *when* and *how*
//! (concurrency, retries, rate limits, status patches). The rules are those of
//! upstream's `reconcile` in `k8s.io/cloud-provider/controllers/route`, with
//! these corrections:
//!
//! 1. CIDRs compare normalised ([`Cidr`]), not as strings. A route whose
//!    destination does not parse is never deleted and is listed in
//!    [`Plan::unparsable_routes`].
//! 2. Ownership is upstream's: a route is this cluster's to delete when its
//!    first or last address lies inside a cluster CIDR
//!    ([`is_responsible_for_route`]). Routes outside are never touched.
//! 3. A route kept because the provider tracks node addresses is compared to
//!    the node's addresses as a multiset of (type, address); upstream's check
//!    treats `[A, A]` and `[A, B]` as equal.
//! 4. A blackhole route for a CIDR the node still owns is deleted *and*
//!    re-created in the same plan ([`CreationReason::ReplacesBlackhole`]), or
//!    replaced in place by one creation where the provider can
//!    ([`PlanConfig::replace_blackholes`]); upstream leaves the node without a
//!    route until the next pass.
//! 5. Duplicate pod CIDRs on one node give one creation; several cloud routes
//!    for the same node and CIDR are reduced to one (non-blackhole first, then
//!    one whose addresses match, then the first listed).
//! 6. A CIDR claimed by more than one node (equal or nested blocks) is a
//!    [`Conflict`]: nothing is created for any claimant, existing routes to
//!    claimants are kept, claimants without a route are unroutable.
//! 7. A pod CIDR not entirely inside a cluster CIDR (or of a family without
//!    one) gets no route: upstream would create one it can never delete. It
//!    is reported in [`Plan::outside_cluster`]. A live route already listed
//!    for it (upstream's, before the switch-over) is kept, never deleted,
//!    and routes the Node: its network works, so it is not `InvalidPodCIDR`.
//!    Pod CIDRs that are not CIDRs are reported in [`Plan::invalid_pod_cidrs`].
//! 8. Ordering is explicit: a creation lists, in [`Creation::after`], the
//!    keys of every deletion with the same destination in its table; nothing
//!    else is ordered.
//! 9. A kept route that names another instance than the node's
//!    `spec.providerID` (a Node re-created under the same name on a new
//!    instance) is replaced ([`DeletionReason::TargetChanged`]); upstream
//!    matches by node name and CIDR only and keeps routing to the old one.
//! 10. A node that lacks what the provider needs to route to it
//!     ([`crate::TargetNeeds`]: a providerID, an InternalIP of the family)
//!     gets no creation until the data arrives ([`Plan::awaiting_node_data`]);
//!     upstream sends the creation, which the cloud refuses. A route it
//!     already has is kept rather than replaced by one that cannot be made.
//!
//! 11. Routes that are provably someone else's ([`Route::foreign`], set by
//!     the provider) and routes to Nodes left out of routing
//!     ([`NodeView::excluded`]) are never deleted; a pod CIDR overlapping
//!     one gets no route and is reported in [`Plan::overlaps`]. Routes to a
//!     Node that left the selection after a route controller routed it
//!     ([`NodeView::leaving`]) are deleted ([`DeletionReason::NodeExcluded`]).
//! 12. Address families switched off ([`PlanConfig::skip_families`]) are
//!     not routed at all: their pod CIDRs and routes are invisible here.
//!
//! Nodes being deleted are planned like live nodes, as upstream does: their
//! routes go when the Node object goes.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::IpAddr;

use foldhash::fast::RandomState as FastHash;

use crate::cidr::Cidr;
use crate::model::{Destination, NodeAddress, NodeView, PodCidr, Route};
use crate::plan::{
    AwaitingNodeData, Conflict, Creation, CreationReason, Deletion, DeletionReason, InvalidPodCidr,
    MissingNodeData, NetworkCondition, NodePlan, OpKey, OutsideCidr, Overlap, Plan, PlanConfig,
};
use crate::text::Text;

/// Whether a route with this destination is this cluster's to delete: its
/// first or last address lies inside one of the cluster CIDRs (upstream's
/// `isResponsibleForRoute`). Unparsable destinations are never ours.
pub fn is_responsible_for_route(cluster_cidrs: &[Cidr], destination: &Destination) -> bool {
    destination
        .cidr()
        .is_some_and(|c| responsible(cluster_cidrs, &c))
}

fn responsible(cluster_cidrs: &[Cidr], c: &Cidr) -> bool {
    cluster_cidrs
        .iter()
        .any(|cc| cc.contains(c.network()) || cc.contains(c.last()))
}

/// Whether a pod CIDR may get a route: it lies entirely inside a cluster CIDR.
///
/// Stricter than [`is_responsible_for_route`] on purpose: a block that only
/// straddles the cluster CIDR would route addresses that are not the
/// cluster's. Every CIDR accepted here is one the planner may later delete.
pub fn routable_pod_cidr(cluster_cidrs: &[Cidr], c: &Cidr) -> bool {
    cluster_cidrs.iter().any(|cc| cc.covers(c))
}

/// Whether two address lists are equal as multisets of (type, address).
///
/// Upstream's `equalNodeAddrs` only checks that every element of one list
/// occurs in the other, which makes `[A, A]` equal to `[A, B]`.
pub fn same_addresses(a: &[NodeAddress], b: &[NodeAddress]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    if a == b {
        return true;
    }
    // Address lists are a handful of entries: counting beats allocating.
    if a.len() <= 16 {
        let count = |list: &[NodeAddress], x: &NodeAddress| list.iter().filter(|y| *y == x).count();
        return a.iter().all(|x| count(a, x) == count(b, x));
    }
    let mut x: Vec<&NodeAddress> = a.iter().collect();
    let mut y: Vec<&NodeAddress> = b.iter().collect();
    x.sort_unstable();
    y.sort_unstable();
    x == y
}

/// Whether a route naming instance `route` may stand for a node whose
/// `spec.providerID` is `node`. Unknown on either side is no evidence of a
/// change; providers fill `Route::node_provider_id` only when they know it.
fn same_instance(route: Option<&str>, node: Option<&str>) -> bool {
    match (route.map(str::trim), node.map(str::trim)) {
        (Some(r), Some(n)) if !r.is_empty() && !n.is_empty() => r == n,
        _ => true,
    }
}

/// What a distinct valid pod CIDR of a node can get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    /// Inside the cluster CIDRs and claimed by this node alone.
    Routable,
    /// Claimed by other nodes too: keep what exists, create nothing.
    Conflict,
    /// Not inside any cluster CIDR: keep what exists, create nothing.
    Outside,
    /// Overlaps a route that is provably someone else's: keep what exists,
    /// create nothing (correction 11).
    Overlap,
}

/// How a listed route for a (node, CIDR) fits the node as it is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fit {
    /// Same instance (or unknown), and the addresses match or are not tracked.
    Matches,
    /// The provider tracks addresses and they differ from the node's
    /// (correction 3: compared as a multiset).
    AddressesChanged,
    /// The route names another instance than the node's providerID
    /// (correction 9).
    InstanceChanged,
}

impl Fit {
    fn of(route: &Route, node: &NodeView) -> Self {
        if !same_instance(
            route.node_provider_id.as_deref(),
            node.provider_id.as_deref(),
        ) {
            Fit::InstanceChanged
        } else if route.enable_node_addresses
            && !same_addresses(&route.node_addresses, &node.addresses)
        {
            Fit::AddressesChanged
        } else {
            Fit::Matches
        }
    }
}

/// A route's position in the table's route list. Stored as position + 1 so
/// that an absent one (`Option<RouteIx>`) costs no extra bytes: slots are
/// the planner's largest per-Node structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RouteIx(std::num::NonZeroU32);

impl RouteIx {
    fn new(i: usize) -> Self {
        // A route list longer than u32::MAX - 1 entries cannot be listed.
        Self(std::num::NonZeroU32::MIN.saturating_add(i as u32))
    }

    fn get(self) -> usize {
        (self.0.get() - 1) as usize
    }
}

/// The one listed route kept for a (node, CIDR) pair: where it is in the
/// table's route list, and how it fits.
#[derive(Debug, Clone, Copy)]
struct Kept {
    route: RouteIx,
    fit: Fit,
}

/// One distinct valid pod CIDR of one node, and what the route list says about it.
#[derive(Debug, Clone, Copy)]
struct Slot {
    cidr: Cidr,
    node: u32,
    state: SlotState,
    /// The route kept for this (node, CIDR), if one is listed.
    kept: Option<Kept>,
    /// What the node lacks for the provider to create this route.
    missing: Option<MissingNodeData>,
    /// A blackhole route for this (node, CIDR) is being deleted or replaced.
    blackhole_seen: bool,
    /// The blackhole route a creation replaces in place (correction 4,
    /// [`PlanConfig::replace_blackholes`]).
    replaced: Option<RouteIx>,
}

impl Slot {
    /// A creation may be planned for it now: routable, and the node has
    /// what the provider needs (correction 10).
    fn creatable(&self) -> bool {
        self.state == SlotState::Routable && self.missing.is_none()
    }

    /// Why the route kept for it must be replaced, if it must: only a route
    /// that will be re-created is replaced. In a conflict, outside the
    /// cluster, or while the node lacks what a new route needs, a stale
    /// route beats none.
    fn replace_kept(&self) -> Option<DeletionReason> {
        match self.kept?.fit {
            _ if !self.creatable() => None,
            Fit::Matches => None,
            Fit::AddressesChanged => Some(DeletionReason::AddressesChanged),
            Fit::InstanceChanged => Some(DeletionReason::TargetChanged),
        }
    }

    /// Why a creation is planned for it, if one is.
    fn creation_reason(&self) -> Option<CreationReason> {
        match self.kept.map(|k| k.fit) {
            Some(Fit::Matches) => None,
            Some(Fit::AddressesChanged) => Some(CreationReason::AddressesChanged),
            Some(Fit::InstanceChanged) => Some(CreationReason::TargetChanged),
            None if self.blackhole_seen => Some(CreationReason::ReplacesBlackhole),
            None => Some(CreationReason::Missing),
        }
    }
}

/// Per-node bookkeeping; slots of node `i` are `slots[start..end]`.
#[derive(Debug, Clone, Copy, Default)]
struct NodeInfo {
    start: u32,
    end: u32,
    /// First node of its name; later namesakes (impossible in a real
    /// snapshot) and nameless nodes are ignored.
    canonical: bool,
    invalid_pod_cidr: bool,
    /// Some listed route names this node.
    targeted: bool,
    /// Left out of routing ([`NodeView::excluded`]); it has no slots.
    excluded: bool,
}

/// Whose a listed route is, beyond upstream's CIDR rule (correction 11).
enum Owner {
    /// This cluster's, decided by the usual rules.
    Ours,
    /// Provably someone else's: never deleted.
    Foreign(Text),
    /// The Node's (by index) that left the selection: deleted.
    Leaving(u32),
}

/// The Nodes left out of routing, by name and by InternalIP (a route a
/// provider cannot name a Node for still names its next hop).
#[derive(Clone, Default)]
struct Excluded<'n> {
    by_ip: HashMap<&'n str, u32, FastHash>,
    any: bool,
}

impl Excluded<'_> {
    fn owner<N: Borrow<NodeView>>(
        &self,
        r: &Route,
        nodes: &[N],
        by_name: &HashMap<&str, u32, FastHash>,
    ) -> Owner {
        if let Some(owner) = &r.foreign {
            return Owner::Foreign(owner.clone());
        }
        if !self.any {
            return Owner::Ours;
        }
        let by_node = (!r.node.is_empty())
            .then(|| by_name.get(r.node.as_str()).copied())
            .flatten();
        let ni = match by_node {
            Some(ni) => ni,
            // Only a route naming no known Node is matched by address.
            None => {
                let hop = std::iter::once(r.next_hop.as_str())
                    .chain(r.node_addresses.iter().map(|a| a.address.as_str()));
                match hop.filter_map(|a| self.by_ip.get(a.trim())).next() {
                    Some(&ni) => ni,
                    None => return Owner::Ours,
                }
            }
        };
        let n = nodes[ni as usize].borrow();
        match (n.excluded, n.leaving()) {
            (false, _) => Owner::Ours,
            (true, true) => Owner::Leaving(ni),
            (true, false) => {
                Owner::Foreign(format!("Node {} (outside --node-selector)", n.name).into())
            }
        }
    }
}

/// Computes the plan for one snapshot.
///
/// Outputs are deterministic: deletions in route order, creations and node
/// outcomes in node order (pod CIDR order within a node), conflicts by CIDR.
///
/// With several route tables ([`PlanConfig::tables`]) every table is
/// planned on its own, from the routes listed in it, and the plans are
/// joined: deletions and creations table by table in the order of
/// `tables`, each creation carrying its table in [`Route::table`]. A Node
/// is routed only when its routes exist in every table, so its condition
/// is `RouteCreated` only then. Routes listed in a table that is not one of
/// `tables` are not this cluster's and are left alone. With no tables
/// configured, all routes form the one table (the common case).
pub fn plan<N: Borrow<NodeView>>(nodes: &[N], routes: &[Route], config: &PlanConfig) -> Plan {
    match config.tables.as_slice() {
        [] => plan_one(nodes, routes, config, &Text::default(), None),
        [only] if routes.iter().all(|r| r.table == *only) => {
            plan_one(nodes, routes, config, only, None)
        }
        tables => plan_tables(nodes, routes, config, tables),
    }
}

fn plan_tables<N: Borrow<NodeView>>(
    nodes: &[N],
    routes: &[Route],
    config: &PlanConfig,
    tables: &[Text],
) -> Plan {
    let index: HashMap<&str, usize, FastHash> = tables
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut by_table: Vec<Vec<&Route>> = vec![Vec::new(); tables.len()];
    for r in routes {
        if let Some(&i) = index.get(r.table.as_str()) {
            by_table[i].push(r);
        }
    }
    let mut joined = Plan::default();
    // Per Node name: its entry in `joined.nodes`.
    let mut outcome_of: HashMap<String, usize, FastHash> = HashMap::default();
    let mut unroutable_somewhere: Vec<usize> = Vec::new();
    let prepared = prepare(nodes, config);
    for (i, (table, routes)) in tables.iter().zip(&by_table).enumerate() {
        // A Node left out as settled because it cannot be routed (and says
        // so) in this table must not look routed in the join.
        let mut settled_unroutable = Vec::new();
        let p = decide(
            nodes,
            prepared.clone(),
            routes,
            config,
            table,
            Some(&mut settled_unroutable),
        );
        unroutable_somewhere.extend(settled_unroutable);
        // Keys name each table's operations: the plans join as they are.
        joined.deletions.extend(p.deletions);
        joined.creations.extend(p.creations);
        for n in p.nodes {
            match outcome_of.entry(n.node.clone()) {
                Entry::Occupied(e) => {
                    let o = &mut joined.nodes[*e.get()];
                    o.unroutable |= n.unroutable;
                    o.cause = match (o.cause, n.cause) {
                        (Some(a), Some(b)) => Some(a.or(b)),
                        (a, b) => a.or(b),
                    };
                    o.creations.extend(n.creations);
                }
                Entry::Vacant(e) => {
                    e.insert(joined.nodes.len());
                    joined.nodes.push(n);
                }
            }
        }
        joined.unparsable_routes.extend(p.unparsable_routes);
        // What a pod CIDR is (conflicting, outside, invalid, awaiting data)
        // does not depend on the table.
        if i == 0 {
            joined.conflicts = p.conflicts;
            joined.outside_cluster = p.outside_cluster;
            joined.invalid_pod_cidrs = p.invalid_pod_cidrs;
            joined.awaiting_node_data = p.awaiting_node_data;
        }
        joined.overlaps.extend(p.overlaps);
    }
    for i in unroutable_somewhere {
        let n = nodes[i].borrow();
        if let Some(&o) = outcome_of.get(n.name.as_str()) {
            let o = &mut joined.nodes[o];
            o.unroutable = true;
            // Settled there: the Node already says why.
            let said = n
                .network_unavailable
                .as_ref()
                .and_then(|c| NetworkCondition::from_reason(&c.reason));
            o.cause = match (o.cause, said) {
                (Some(a), Some(b)) => Some(a.or(b)),
                (a, b) => a.or(b),
            };
        }
    }
    joined
        .nodes
        .retain(|n| !n.creations.is_empty() || !n.planned().already_set(n.current.as_ref()));
    joined
}

/// What the planner knows from the Nodes alone, before it looks at a route:
/// built once per plan, shared by every route table.
#[derive(Clone)]
struct Prepared<'n> {
    by_name: HashMap<&'n str, u32, FastHash>,
    info: Vec<NodeInfo>,
    slots: Vec<Slot>,
    excluded: Excluded<'n>,
    /// Conflicts, invalid and outside pod CIDRs: the same in every table.
    plan: Plan,
}

fn prepare<'n, N: Borrow<NodeView>>(nodes: &'n [N], config: &PlanConfig) -> Prepared<'n> {
    let cluster = config.cluster_cidrs.as_slice();
    let mut plan = Plan::default();
    // Node index and slots.
    // Keys are Node names the planner was given, not attacker-chosen input
    // to a long-lived table, so a fast hasher is safe here.
    let mut by_name: HashMap<&str, u32, FastHash> =
        HashMap::with_capacity_and_hasher(nodes.len(), FastHash::default());
    let mut info: Vec<NodeInfo> = Vec::with_capacity(nodes.len());
    let mut slots: Vec<Slot> = Vec::with_capacity(nodes.len() + nodes.len() / 2);
    let mut excluded = Excluded::default();
    for (ni, n) in nodes.iter().enumerate() {
        let n = n.borrow();
        let ni = ni as u32;
        let start = slots.len() as u32;
        let mut this = NodeInfo {
            start,
            end: start,
            ..NodeInfo::default()
        };
        if !n.name.is_empty()
            && let Entry::Vacant(e) = by_name.entry(n.name.as_str())
        {
            e.insert(ni);
            this.canonical = true;
        }
        if !this.canonical {
            info.push(this);
            continue;
        }
        if n.excluded {
            // Correction 11: no slot, so no route and no condition of ours.
            this.excluded = true;
            excluded.any = true;
            for a in n.addresses.iter().filter(|a| a.kind == "InternalIP") {
                excluded.by_ip.entry(a.address.trim()).or_insert(ni);
            }
            info.push(this);
            continue;
        }
        let invalid_start = plan.invalid_pod_cidrs.len();
        for pc in &n.pod_cidrs {
            match pc {
                PodCidr::Invalid(text) => {
                    this.invalid_pod_cidr = true;
                    if !plan.invalid_pod_cidrs[invalid_start..]
                        .iter()
                        .any(|e| &e.text == text)
                    {
                        plan.invalid_pod_cidrs.push(InvalidPodCidr {
                            node: n.name.clone(),
                            text: text.clone(),
                        });
                    }
                }
                PodCidr::Valid(c) => {
                    if slots[start as usize..].iter().any(|s| s.cidr == *c)
                        || !config.routes_family(c.family())
                    {
                        continue;
                    }
                    let state = if routable_pod_cidr(cluster, c) {
                        SlotState::Routable
                    } else {
                        plan.outside_cluster.push(OutsideCidr {
                            node: n.name.clone(),
                            cidr: *c,
                        });
                        SlotState::Outside
                    };
                    slots.push(Slot {
                        cidr: *c,
                        node: ni,
                        state,
                        kept: None,
                        missing: config.needs.missing(n, c.family()),
                        blackhole_seen: false,
                        replaced: None,
                    });
                }
            }
        }
        this.end = slots.len() as u32;
        info.push(this);
    }

    plan.conflicts = mark_conflicts(nodes, &mut slots);

    Prepared {
        by_name,
        info,
        slots,
        excluded,
        plan,
    }
}

fn plan_one<N: Borrow<NodeView>, R: Borrow<Route>>(
    nodes: &[N],
    routes: &[R],
    config: &PlanConfig,
    table: &Text,
    settled_unroutable: Option<&mut Vec<usize>>,
) -> Plan {
    decide(
        nodes,
        prepare(nodes, config),
        routes,
        config,
        table,
        settled_unroutable,
    )
}

/// Plans one route table from the prepared Nodes and its routes, in three
/// steps: what becomes of each listed route, which of them go, and what
/// each Node gets.
fn decide<N: Borrow<NodeView>, R: Borrow<Route>>(
    nodes: &[N],
    prepared: Prepared<'_>,
    routes: &[R],
    config: &PlanConfig,
    table: &Text,
    settled_unroutable: Option<&mut Vec<usize>>,
) -> Plan {
    let Prepared {
        by_name,
        mut info,
        mut slots,
        excluded,
        mut plan,
    } = prepared;
    let foreign = mark_overlaps(
        nodes, &by_name, &excluded, &mut slots, routes, config, table, &mut plan,
    );
    let mut leaving_routes = Vec::new();
    let mut doomed = judge_routes(
        nodes,
        &by_name,
        &mut info,
        &mut slots,
        routes,
        config,
        &excluded,
        foreign,
        &mut leaving_routes,
        &mut plan,
    );
    settle_slots(&mut slots, &mut doomed);
    let (after, by_route) = delete_doomed(routes, &doomed, &mut plan);
    let mut leaving: HashMap<u32, Vec<OpKey>> = HashMap::new();
    for (ri, ni) in leaving_routes {
        if let Some(key) = by_route.get(&ri) {
            leaving.entry(ni).or_default().push(key.clone());
        }
    }
    create_and_report(
        nodes,
        &info,
        &slots,
        routes,
        table,
        &after,
        &leaving,
        settled_unroutable,
        &mut plan,
    );
    plan
}

/// Step 0 (correction 11): the routes that are provably someone else's,
/// and the pod CIDRs they overlap, which get no route. Returns whether any
/// route of the table is someone else's (or a leaving Node's), so the
/// common table pays one scan of its routes and nothing more.
#[expect(
    clippy::too_many_arguments,
    reason = "the planner's state, split by step: a struct holding it would only rename the arguments"
)]
fn mark_overlaps<N: Borrow<NodeView>, R: Borrow<Route>>(
    nodes: &[N],
    by_name: &HashMap<&str, u32, FastHash>,
    excluded: &Excluded<'_>,
    slots: &mut [Slot],
    routes: &[R],
    config: &PlanConfig,
    table: &Text,
    plan: &mut Plan,
) -> bool {
    if !excluded.any && routes.iter().all(|r| r.borrow().foreign.is_none()) {
        return false;
    }
    let cluster = config.cluster_cidrs.as_slice();
    let mut theirs: Vec<(Cidr, Text)> = Vec::new();
    for r in routes {
        let r = r.borrow();
        let Some(c) = r.destination.cidr() else {
            continue;
        };
        if !responsible(cluster, &c) || !config.routes_family(c.family()) {
            continue;
        }
        if let Owner::Foreign(owner) = excluded.owner(r, nodes, by_name) {
            theirs.push((c, owner));
        }
    }
    for s in slots.iter_mut() {
        let (fam, lo, hi) = span(&s.cidr);
        for (c, owner) in &theirs {
            let (f, l, h) = span(c);
            if f == fam && l <= hi && lo <= h {
                if s.state == SlotState::Routable {
                    s.state = SlotState::Overlap;
                }
                let node = nodes[s.node as usize].borrow().name.clone();
                if !plan
                    .overlaps
                    .iter()
                    .any(|o| o.node == node && o.cidr == s.cidr && o.route == *c)
                {
                    plan.overlaps.push(Overlap {
                        node,
                        cidr: s.cidr,
                        route: *c,
                        owner: owner.clone(),
                        table: table.clone(),
                    });
                }
            }
        }
    }
    true
}

/// Step 1: walks the table in list order and decides each route: kept for
/// its (node, CIDR) slot, replaced in place, or doomed with a reason.
/// Returns one entry per route: `Some(reason)` for those to delete.
#[expect(
    clippy::too_many_arguments,
    reason = "the planner's state, split by step: a struct holding it would only rename the arguments"
)]
fn judge_routes<N: Borrow<NodeView>, R: Borrow<Route>>(
    nodes: &[N],
    by_name: &HashMap<&str, u32, FastHash>,
    info: &mut [NodeInfo],
    slots: &mut [Slot],
    routes: &[R],
    config: &PlanConfig,
    excluded: &Excluded<'_>,
    foreign: bool,
    leaving_routes: &mut Vec<(usize, u32)>,
    plan: &mut Plan,
) -> Vec<Option<DeletionReason>> {
    let cluster = config.cluster_cidrs.as_slice();
    let mut doomed: Vec<Option<DeletionReason>> = vec![None; routes.len()];
    for (ri, r) in routes.iter().enumerate() {
        let r = r.borrow();
        let ix = RouteIx::new(ri);
        let mut leaving = None;
        if foreign {
            match excluded.owner(r, nodes, by_name) {
                Owner::Ours => {}
                Owner::Foreign(_) => continue,
                Owner::Leaving(ni) => leaving = Some(ni),
            }
        }
        let node = if r.node.is_empty() {
            None
        } else {
            by_name.get(r.node.as_str()).copied()
        };
        if let Some(ni) = node {
            info[ni as usize].targeted = true;
        }
        // Correction 1: destinations compare as CIDRs, and one that is not a
        // CIDR is reported, never deleted.
        let Some(c) = r.destination.cidr() else {
            plan.unparsable_routes.push(r.clone());
            continue;
        };
        // Correction 2's ownership rule (upstream's `isResponsibleForRoute`),
        // and correction 12: a family not routed is not ours either.
        if !responsible(cluster, &c) || !config.routes_family(c.family()) {
            // Correction 7: not ours to delete, but a live route for a pod
            // CIDR outside the cluster CIDRs (upstream creates those, and
            // someone else's may be in place before the switch-over)
            // routes its Node all the same.
            if !r.blackhole
                && let Some(s) = node.and_then(|ni| {
                    let i = info[ni as usize];
                    (i.start..i.end).find(|&s| {
                        let s = &slots[s as usize];
                        s.cidr == c && s.state == SlotState::Outside
                    })
                })
            {
                let slot = &mut slots[s as usize];
                if slot.kept.is_none() {
                    let fit = Fit::of(r, nodes[slot.node as usize].borrow());
                    slot.kept = Some(Kept { route: ix, fit });
                }
            }
            continue;
        }
        if let Some(ni) = leaving {
            // Correction 11: a route controller routed this Node before it
            // left the selection; the route goes like a gone Node's.
            info[ni as usize].targeted = true;
            leaving_routes.push((ri, ni));
            doomed[ri] = Some(DeletionReason::NodeExcluded);
            continue;
        }
        let slot = node.and_then(|ni| {
            let i = info[ni as usize];
            (i.start..i.end).find(|&s| slots[s as usize].cidr == c)
        });
        if r.blackhole {
            // Correction 4: a blackhole of a CIDR its node still owns is
            // replaced in the same plan (in place where the provider can).
            if let Some(s) = slot {
                let s = &mut slots[s as usize];
                s.blackhole_seen = true;
                if config.replace_blackholes && s.replaced.is_none() && s.creatable() {
                    s.replaced = Some(ix);
                    continue;
                }
            }
            doomed[ri] = Some(DeletionReason::Blackhole);
            continue;
        }
        let Some(s) = slot else {
            doomed[ri] = Some(if r.node.is_empty() {
                DeletionReason::NoTargetNode
            } else if node.is_none() {
                DeletionReason::NodeGone
            } else {
                DeletionReason::CidrNotAssigned
            });
            continue;
        };
        let slot = &mut slots[s as usize];
        let fit = Fit::of(r, nodes[slot.node as usize].borrow());
        // Correction 5: several routes for one (node, CIDR) reduce to one,
        // the first that fits, else the first listed.
        match slot.kept {
            None => slot.kept = Some(Kept { route: ix, fit }),
            Some(kept) if fit == Fit::Matches && kept.fit != Fit::Matches => {
                doomed[kept.route.get()] = Some(DeletionReason::Duplicate);
                slot.kept = Some(Kept { route: ix, fit });
            }
            Some(_) => doomed[ri] = Some(DeletionReason::Duplicate),
        }
    }
    doomed
}

/// Step 2: what the whole table says about each slot. A blackhole meant
/// to be replaced in place is deleted instead when a live route for the
/// pair turned up after all; a kept route that no longer fits is doomed
/// when it will be re-created.
fn settle_slots(slots: &mut [Slot], doomed: &mut [Option<DeletionReason>]) {
    for s in slots {
        if s.kept.is_some()
            && let Some(replaced) = s.replaced.take()
        {
            doomed[replaced.get()] = Some(DeletionReason::Blackhole);
        }
        if let (Some(kept), Some(reason)) = (s.kept, s.replace_kept()) {
            doomed[kept.route.get()] = Some(reason);
        }
    }
}

/// Step 3a: the deletions, in route order. Returns, per destination, the
/// keys of its deletions: a creation for that destination follows them,
/// since a provider may allow one route per destination (AWS) and an
/// address update is a delete and a create (correction 8).
fn delete_doomed<R: Borrow<Route>>(
    routes: &[R],
    doomed: &[Option<DeletionReason>],
    plan: &mut Plan,
) -> (HashMap<Cidr, Vec<OpKey>>, HashMap<usize, OpKey>) {
    let mut after: HashMap<Cidr, Vec<OpKey>> = HashMap::new();
    let mut copies: HashMap<&Route, u32> = HashMap::new();
    // A leaving Node's condition waits for the deletion of its routes.
    let mut by_route: HashMap<usize, OpKey> = HashMap::new();
    for (ri, (r, d)) in routes.iter().zip(doomed).enumerate() {
        let Some(reason) = *d else { continue };
        let r = r.borrow();
        // Keys must tell deletions apart: a route listed twice exactly
        // alike gets one deletion per copy.
        let copy = copies.entry(r).or_default();
        let deletion = Deletion {
            route: r.clone(),
            reason,
            copy: *copy,
        };
        *copy += 1;
        if let Some(c) = deletion.route.destination.cidr() {
            after.entry(c).or_default().push(deletion.key());
        }
        if reason == DeletionReason::NodeExcluded {
            by_route.insert(ri, deletion.key());
        }
        plan.deletions.push(deletion);
    }
    (after, by_route)
}

/// Step 3b: the creations and node outcomes, in node order.
#[expect(
    clippy::too_many_arguments,
    reason = "the planner's state, split by step: a struct holding it would only rename the arguments"
)]
fn create_and_report<N: Borrow<NodeView>, R: Borrow<Route>>(
    nodes: &[N],
    info: &[NodeInfo],
    slots: &[Slot],
    routes: &[R],
    table: &Text,
    after: &HashMap<Cidr, Vec<OpKey>>,
    leaving: &HashMap<u32, Vec<OpKey>>,
    mut settled_unroutable: Option<&mut Vec<usize>>,
    plan: &mut Plan,
) {
    for (ni, n) in nodes.iter().enumerate() {
        let n = n.borrow();
        let i = info[ni];
        if !i.canonical {
            continue;
        }
        if i.excluded {
            // Correction 11: a Node that left the selection says so once
            // the deletions of its routes succeeded; one never ours is not
            // touched.
            if n.leaving() {
                plan.nodes.push(NodePlan {
                    node: n.name.clone(),
                    uid: n.uid.clone(),
                    creations: leaving.get(&(ni as u32)).cloned().unwrap_or_default(),
                    unroutable: false,
                    cause: Some(NetworkCondition::NodeExcluded),
                    current: n.network_unavailable.clone(),
                    forwarding_disabled: false,
                });
            }
            continue;
        }
        let mut creations = Vec::new();
        let mut unroutable = n.pod_cidrs.is_empty() || i.invalid_pod_cidr;
        let mut cause = if i.invalid_pod_cidr {
            Some(NetworkCondition::InvalidPodCidr)
        } else {
            None
        };
        fn because(c: NetworkCondition, cause: &mut Option<NetworkCondition>) {
            *cause = Some(cause.map_or(c, |had| had.or(c)));
        }
        for s in &slots[i.start as usize..i.end as usize] {
            match s.state {
                // Correction 7: no route is created outside the cluster
                // CIDRs; one already in place still routes the Node.
                SlotState::Outside => {
                    if s.kept.is_none() {
                        unroutable = true;
                        because(NetworkCondition::InvalidPodCidr, &mut cause);
                    }
                }
                // Correction 6: a contested CIDR gets nothing new.
                SlotState::Conflict | SlotState::Overlap => {
                    if s.kept.is_none() {
                        unroutable = true;
                        because(NetworkCondition::PodCidrConflict, &mut cause);
                    }
                }
                SlotState::Routable => {
                    let Some(reason) = s.creation_reason() else {
                        continue;
                    };
                    if let Some(missing) = s.missing {
                        // Correction 10: wait for the Node's data. A stale
                        // route still routes; none at all does not.
                        if s.kept.is_none() {
                            unroutable = true;
                            because(NetworkCondition::AwaitingNodeData, &mut cause);
                        }
                        plan.awaiting_node_data.push(AwaitingNodeData {
                            node: n.name.clone(),
                            cidr: s.cidr,
                            missing,
                        });
                        continue;
                    }
                    let creation = Creation {
                        route: Route {
                            name: Text::default(),
                            node: n.name.as_str().into(),
                            destination: Destination::Cidr(s.cidr),
                            blackhole: false,
                            node_addresses: n.addresses.clone(),
                            enable_node_addresses: false,
                            next_hop: Text::default(),
                            node_provider_id: n.provider_id.as_deref().map(Text::from),
                            table: table.clone(),
                            foreign: None,
                        },
                        node_uid: n.uid.clone(),
                        after: after.get(&s.cidr).cloned().unwrap_or_default(),
                        replaces: s.replaced.map(|r| routes[r.get()].borrow().clone()),
                        reason,
                    };
                    creations.push(creation.key());
                    plan.creations.push(creation);
                }
            }
        }
        // A node whose routes are all in place and whose condition already
        // says so needs nothing from this plan. Leaving it out keeps a plan of
        // a settled cluster as small as what changed, not as large as the
        // cluster (every pass of every mode builds one).
        let cause = cause.filter(|_| unroutable);
        // Decided before an outcome is built: a settled cluster's plan
        // allocates nothing per Node.
        let settled = creations.is_empty()
            && NodePlan::planned_of(unroutable, cause, n.forwarding_disabled)
                .already_set(n.network_unavailable.as_ref());
        let managed = !n.pod_cidrs.is_empty() || i.targeted;
        if settled
            && unroutable
            && managed
            && let Some(out) = settled_unroutable.as_mut()
        {
            out.push(ni);
        }
        if !settled && managed {
            plan.nodes.push(NodePlan {
                node: n.name.clone(),
                uid: n.uid.clone(),
                creations,
                unroutable,
                cause,
                current: n.network_unavailable.clone(),
                forwarding_disabled: n.forwarding_disabled,
            });
        }
    }
}

/// The span of a CIDR as integers, for ordering and overlap tests.
fn span(c: &Cidr) -> (u8, u128, u128) {
    let p = u32::from(c.prefix_len());
    match c.network() {
        IpAddr::V4(a) => {
            let host = if p >= 32 { 0 } else { u32::MAX >> p };
            let a = u32::from(a);
            (4, u128::from(a), u128::from(a | host))
        }
        IpAddr::V6(a) => {
            let host = if p >= 128 { 0 } else { u128::MAX >> p };
            let a = u128::from(a);
            (6, a, a | host)
        }
    }
}

/// A routable slot's block, ordered for the conflict sweep: by family,
/// then start address, then widest first (a shorter prefix sorts first),
/// so that an enclosing block precedes every block it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct SweepKey {
    family: u8,
    start: u128,
    prefix_len: u8,
    end: u128,
    slot: u32,
}

/// Finds groups of overlapping routable pod CIDRs claimed by at least two
/// nodes, reports each group once and marks [`SlotState::Conflict`] every
/// slot that overlaps a slot of another node.
///
/// CIDR blocks are either nested or disjoint, so after sorting by start
/// (widest first on ties) an overlapping group is a run whose members start
/// before the end of the run's first block, which covers all of them.
fn mark_conflicts<N: Borrow<NodeView>>(nodes: &[N], slots: &mut [Slot]) -> Vec<Conflict> {
    // Sized up front: growing a vector of a slot per Node by doubling
    // costs reallocations and fresh pages on every plan.
    let mut keys: Vec<SweepKey> = Vec::with_capacity(slots.len());
    keys.extend(
        slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.state == SlotState::Routable)
            .map(|(i, s)| {
                let (family, start, end) = span(&s.cidr);
                SweepKey {
                    family,
                    start,
                    prefix_len: s.cidr.prefix_len(),
                    end,
                    slot: i as u32,
                }
            }),
    );
    keys.sort_unstable();
    let mut conflicts = Vec::new();
    let mut g = 0;
    while g < keys.len() {
        let first = keys[g];
        let mut e = g + 1;
        while e < keys.len() && keys[e].family == first.family && keys[e].start <= first.end {
            e += 1;
        }
        let group = &keys[g..e];
        let first_node = slots[first.slot as usize].node;
        if group
            .iter()
            .any(|k| slots[k.slot as usize].node != first_node)
        {
            let mut names: Vec<String> = group
                .iter()
                .map(|k| {
                    nodes[slots[k.slot as usize].node as usize]
                        .borrow()
                        .name
                        .clone()
                })
                .collect();
            names.sort_unstable();
            names.dedup();
            mark_contested(group, slots);
            conflicts.push(Conflict {
                cidr: slots[first.slot as usize].cidr,
                nodes: names,
            });
        }
        g = e;
    }
    conflicts
}

/// Which nodes claim a set of slots, as far as conflicts care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owners {
    Nobody,
    One(u32),
    Many,
}

impl Owners {
    fn add(self, node: u32) -> Self {
        match self {
            Owners::Nobody => Owners::One(node),
            Owners::One(n) if n == node => self,
            _ => Owners::Many,
        }
    }

    fn merge(self, other: Owners) -> Self {
        match other {
            Owners::Nobody => self,
            Owners::One(n) => self.add(n),
            Owners::Many => Owners::Many,
        }
    }

    fn other_than(self, node: u32) -> bool {
        match self {
            Owners::Nobody => false,
            Owners::One(n) => n != node,
            Owners::Many => true,
        }
    }
}

/// Within one sorted overlap group, marks the slots that share an address
/// with a slot of another node: those with an enclosing or an enclosed block
/// of another node. A node's own nested blocks do not conflict with each
/// other, so a node may keep a route that no other node's claim touches.
///
/// One pass with a stack of open (enclosing) blocks: linear in the group.
fn mark_contested(group: &[SweepKey], slots: &mut [Slot]) {
    struct Open {
        slot: u32,
        end: u128,
        above: Owners,
        below: Owners,
    }
    fn close(o: &Open, slots: &mut [Slot], stack: &mut [Open]) {
        let node = slots[o.slot as usize].node;
        if o.above.other_than(node) || o.below.other_than(node) {
            slots[o.slot as usize].state = SlotState::Conflict;
        }
        if let Some(parent) = stack.last_mut() {
            parent.below = parent.below.merge(o.below).add(node);
        }
    }
    let mut stack: Vec<Open> = Vec::new();
    for &SweepKey {
        start, end, slot, ..
    } in group
    {
        while let Some(top) = stack.pop_if(|top| top.end < start) {
            close(&top, slots, &mut stack);
        }
        let above = stack
            .last()
            .map_or(Owners::Nobody, |p| p.above.add(slots[p.slot as usize].node));
        stack.push(Open {
            slot,
            end,
            above,
            below: Owners::Nobody,
        });
    }
    while let Some(top) = stack.pop() {
        close(&top, slots, &mut stack);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Cidr {
        Cidr::parse(s).unwrap()
    }

    fn ip(kind: &str, a: &str) -> NodeAddress {
        NodeAddress::new(kind, a)
    }

    #[test]
    fn same_addresses_is_a_multiset_comparison() {
        let a = ip("InternalIP", "10.0.0.1");
        let b = ip("InternalIP", "10.0.0.2");
        let h = ip("Hostname", "10.0.0.1");
        assert!(same_addresses(&[], &[]));
        assert!(same_addresses(
            &[a.clone(), b.clone()],
            &[b.clone(), a.clone()]
        ));
        assert!(!same_addresses(
            &[a.clone(), a.clone()],
            &[a.clone(), b.clone()]
        ));
        assert!(!same_addresses(
            &[a.clone(), b.clone()],
            &[a.clone(), a.clone()]
        ));
        assert!(
            !same_addresses(std::slice::from_ref(&a), std::slice::from_ref(&h)),
            "the type counts"
        );
        assert!(!same_addresses(
            std::slice::from_ref(&a),
            &[a.clone(), a.clone()]
        ));
    }

    #[test]
    fn same_addresses_handles_long_lists() {
        let long: Vec<NodeAddress> = (0..40)
            .map(|i| ip("InternalIP", &format!("10.0.0.{i}")))
            .collect();
        let mut rev = long.clone();
        rev.reverse();
        assert!(same_addresses(&long, &rev));
        let mut other = rev.clone();
        other[0] = other[1].clone();
        assert!(!same_addresses(&long, &other));
    }

    #[test]
    fn span_covers_the_whole_block() {
        assert_eq!(span(&c("10.0.1.0/24")), (4, 0x0a00_0100, 0x0a00_01ff));
        assert_eq!(span(&c("0.0.0.0/0")), (4, 0, u128::from(u32::MAX)));
        assert_eq!(span(&c("10.0.0.1/32")), (4, 0x0a00_0001, 0x0a00_0001));
        assert_eq!(span(&c("::/0")), (6, 0, u128::MAX));
        assert_eq!(span(&c("::1/128")), (6, 1, 1));
    }

    #[test]
    fn routable_requires_the_whole_block_inside() {
        let cluster = [c("10.244.0.0/16")];
        assert!(routable_pod_cidr(&cluster, &c("10.244.3.0/24")));
        assert!(routable_pod_cidr(&cluster, &c("10.244.0.0/16")));
        assert!(!routable_pod_cidr(&cluster, &c("10.0.0.0/8")), "superset");
        assert!(!routable_pod_cidr(&cluster, &c("10.245.0.0/24")));
        assert!(
            !routable_pod_cidr(&cluster, &c("fd00::/64")),
            "other family"
        );
        assert!(!routable_pod_cidr(&[], &c("10.244.3.0/24")));
    }

    #[test]
    fn nested_claims_of_different_nodes_form_one_conflict() {
        let nodes = vec![
            NodeView::new("a", "ua", &["10.0.0.0/16"]),
            NodeView::new("b", "ub", &["10.0.1.0/24"]),
            NodeView::new("c", "uc", &["10.0.2.0/24"]),
            NodeView::new("d", "ud", &["10.1.0.0/24"]),
            NodeView::new("e", "ue", &["10.1.1.0/24", "10.1.1.0/25"]),
        ];
        let config = PlanConfig {
            cluster_cidrs: vec![c("10.0.0.0/8")],
            ..PlanConfig::default()
        };
        let p = plan(&nodes, &[], &config);
        assert_eq!(
            p.conflicts,
            vec![Conflict {
                cidr: c("10.0.0.0/16"),
                nodes: vec!["a".into(), "b".into(), "c".into()],
            }]
        );
        // Overlaps within one node are not conflicts: d and e get every route.
        let created: Vec<String> = p
            .creations
            .iter()
            .map(|cr| format!("{}:{}", cr.route.node, cr.route.destination))
            .collect();
        assert_eq!(created, ["d:10.1.0.0/24", "e:10.1.1.0/24", "e:10.1.1.0/25"]);
    }

    #[test]
    fn only_blocks_touching_another_nodes_claim_are_contested() {
        let nodes = vec![
            NodeView::new("a", "ua", &["10.0.0.0/16", "10.0.5.0/24"]),
            NodeView::new("b", "ub", &["10.0.1.0/24"]),
            NodeView::new("c", "uc", &["10.0.1.0/25"]),
            NodeView::new("d", "ud", &["10.1.9.0/24", "10.1.9.0/25"]),
            NodeView::new("e", "ue", &["10.1.9.128/25"]),
        ];
        let config = PlanConfig {
            cluster_cidrs: vec![c("10.0.0.0/8")],
            ..PlanConfig::default()
        };
        let p = plan(&nodes, &[], &config);
        let groups: Vec<(String, Vec<String>)> = p
            .conflicts
            .iter()
            .map(|k| (k.cidr.to_string(), k.nodes.clone()))
            .collect();
        assert_eq!(
            groups,
            [
                (
                    "10.0.0.0/16".into(),
                    vec!["a".into(), "b".into(), "c".into()]
                ),
                ("10.1.9.0/24".into(), vec!["d".into(), "e".into()]),
            ]
        );
        // a's /24 and d's lower /25 overlap no other node's claim.
        let created: Vec<String> = p
            .creations
            .iter()
            .map(|cr| format!("{}:{}", cr.route.node, cr.route.destination))
            .collect();
        assert_eq!(created, ["a:10.0.5.0/24", "d:10.1.9.0/25"]);
        let unroutable: Vec<bool> = p.nodes.iter().map(|o| o.unroutable).collect();
        assert_eq!(unroutable, [true, true, true, true, true]);
    }

    #[test]
    fn owners_summary() {
        let o = Owners::Nobody.add(1);
        assert_eq!(o, Owners::One(1));
        assert!(!o.other_than(1) && o.other_than(2));
        assert_eq!(o.add(1), Owners::One(1));
        assert_eq!(o.add(2), Owners::Many);
        assert!(Owners::Many.other_than(1));
        assert!(!Owners::Nobody.other_than(1));
        assert_eq!(Owners::One(3).merge(Owners::Nobody), Owners::One(3));
        assert_eq!(Owners::Nobody.merge(Owners::One(3)), Owners::One(3));
        assert_eq!(Owners::One(3).merge(Owners::One(4)), Owners::Many);
    }

    #[test]
    fn responsible_uses_first_or_last_address() {
        let cluster = [c("10.245.0.0/16")];
        let yes = |d: &str| is_responsible_for_route(&cluster, &Destination::parse(d));
        assert!(yes("10.245.7.0/24"));
        assert!(yes("10.244.0.0/15"), "only the last address is inside");
        assert!(yes("10.245.0.0/15"), "masked to 10.244.0.0/15");
        assert!(
            !yes("10.0.0.0/8"),
            "a strict superset has neither end inside"
        );
        assert!(!yes("garbage"));
    }
}
