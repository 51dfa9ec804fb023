//! Property tests of the planner on random clusters and route tables.
//!
//! Clusters are drawn from small pools of CIDRs, names and addresses so that
//! duplicates, conflicts (equal and nested claims), foreign and outside CIDRs,
//! stale and blackhole routes occur often. Expected results are computed by
//! naive oracles here, not by the planner's own helpers.

mod common;

use std::collections::BTreeSet;

use common::apply;
use proptest::prelude::*;
use route_core::{
    Cidr, Creation, Deletion, DeletionReason, NodeAddress, NodeView, OpKey, PlanConfig, PodCidr,
    Route, is_responsible_for_route, plan,
};

/// Pod CIDR texts: inside the v4 cluster CIDR (with one wider block that
/// nests over two others, and host routes nested in blocks), outside it,
/// IPv6 inside/outside, the whole address space, and garbage.
const POD_CIDRS: [&str; 19] = [
    "10.0.1.7/32", // a host inside 10.0.1.0/24
    "10.0.255.255/32",
    "fd00:0:0:1::7/128", // a host inside fd00:0:0:1::/64
    "0.0.0.0/0",
    "::/0",
    "10.0.0.0/24",
    "10.0.1.0/24",
    "10.0.2.0/24",
    "10.0.3.0/24",
    "10.0.4.0/24",
    "10.0.005.0/24", // another spelling of a distinct block
    "10.0.2.0/23",   // covers 10.0.2.0/24 and 10.0.3.0/24
    "10.1.0.0/24",   // outside 10.0.0.0/16
    "10.0.0.0/15",   // wider than the cluster CIDR
    "fd00:0:0:1::/64",
    "fd00:0:0:2::/64",
    "fd01::/64", // outside fd00::/48
    "nonsense",
    "10.0.6.0/24",
];

/// Route destinations: every pod CIDR plus foreign, host and unparsable ones.
const ROUTE_DESTS: [&str; 10] = [
    "192.168.7.7/32",
    "fd01::7/128",
    "10.0.9.9/32",
    "0.0.0.0/1",
    "172.16.0.0/24",
    "10.0.0.0/8",
    "not-a-cidr",
    "10.0.9.0/24",
    "fd00:0:0:9::/64",
    "10.00.1.0/24",
];

const ADDRS: [&str; 3] = ["192.168.0.1", "192.168.0.2", "192.168.0.3"];

#[derive(Debug, Clone)]
struct World {
    nodes: Vec<NodeView>,
    routes: Vec<Route>,
    config: PlanConfig,
}

fn addresses(bits: u8) -> Vec<NodeAddress> {
    // 0-2 addresses from a pool of 3, repeats allowed.
    let n = usize::from(bits % 3);
    (0..n)
        .map(|i| NodeAddress::internal_ip(ADDRS[usize::from((bits / 3) >> (2 * i)) % ADDRS.len()]))
        .collect()
}

type RawNode = (Vec<u8>, u8);
type RawRoute = (u8, u8, u8, u8, bool, bool);

fn world() -> impl Strategy<Value = World> {
    let raw_nodes = prop::collection::vec(
        (prop::collection::vec(any::<u8>(), 0..=2), any::<u8>()),
        0..8,
    );
    let raw_routes = prop::collection::vec(
        (
            any::<u8>(),
            any::<u8>(),
            any::<u8>(),
            any::<u8>(),
            any::<bool>(),
            any::<bool>(),
        ),
        0..12,
    );
    (raw_nodes, raw_routes, any::<bool>(), any::<bool>()).prop_map(
        |(raw_nodes, raw_routes, dual, replace): (Vec<RawNode>, Vec<RawRoute>, bool, bool)| {
            let nodes: Vec<NodeView> = raw_nodes
                .iter()
                .enumerate()
                .map(|(i, (cidrs, addr_bits))| {
                    let texts: Vec<&str> = cidrs
                        .iter()
                        .map(|c| POD_CIDRS[usize::from(*c) % POD_CIDRS.len()])
                        .collect();
                    NodeView::new(format!("node-{i}"), format!("uid-{i}"), &texts)
                        .with_addresses(addresses(*addr_bits))
                })
                .collect();
            let routes = raw_routes
                .iter()
                .map(|&(target, dest, addr_bits, kind, enable, follow_node)| {
                    // Target: one of the nodes, a gone node, or nobody.
                    let t = usize::from(target) % (nodes.len() + 3);
                    let target_name = match t.checked_sub(nodes.len()) {
                        None => nodes[t].name.clone(),
                        Some(0) => String::new(),
                        Some(k) => format!("gone-{k}"),
                    };
                    // Destination: often the target's own pod CIDR, so that kept,
                    // stale, duplicate and blackhole routes of live pairs are common.
                    let own = nodes.get(t).filter(|_| follow_node).and_then(|n| {
                        (!n.pod_cidrs.is_empty())
                            .then(|| n.pod_cidrs[usize::from(dest) % n.pod_cidrs.len()].clone())
                    });
                    let dest_text = match own {
                        Some(PodCidr::Valid(c)) => c.to_string(),
                        Some(PodCidr::Invalid(s)) => s,
                        None => {
                            let d = usize::from(dest) % (POD_CIDRS.len() + ROUTE_DESTS.len());
                            POD_CIDRS
                                .get(d)
                                .copied()
                                .unwrap_or_else(|| ROUTE_DESTS[d - POD_CIDRS.len()])
                                .to_string()
                        }
                    };
                    // Addresses: the node's own (a kept route), a near miss
                    // (the same multiset reordered, or one entry repeated in
                    // place of another), or random.
                    let addrs = match (nodes.get(t), kind % 3) {
                        (Some(n), 0) => n.addresses.clone(),
                        (Some(n), 1) => {
                            let mut a = n.addresses.clone();
                            a.reverse();
                            if addr_bits % 2 == 0 && a.len() >= 2 {
                                a[1] = a[0].clone();
                            }
                            a
                        }
                        _ => addresses(addr_bits),
                    };
                    let mut r =
                        Route::from_text(target_name, &dest_text).with_addresses(addrs, enable);
                    r.blackhole = kind % 7 == 1;
                    r
                })
                .collect();
            let mut cluster_cidrs =
                vec![Cidr::parse("10.0.0.0/16").expect("the test CIDRs are valid")];
            if dual {
                cluster_cidrs.push(Cidr::parse("fd00::/48").expect("the test CIDRs are valid"));
            }
            World {
                nodes,
                routes,
                config: PlanConfig {
                    cluster_cidrs,
                    replace_blackholes: replace,
                    ..PlanConfig::default()
                },
            }
        },
    )
}

fn multiset_eq(a: &[NodeAddress], b: &[NodeAddress]) -> bool {
    let mut a = a.to_vec();
    let mut b = b.to_vec();
    a.sort();
    b.sort();
    a == b
}

fn valid_cidrs(n: &NodeView) -> Vec<Cidr> {
    let mut out: Vec<Cidr> = n
        .pod_cidrs
        .iter()
        .filter_map(|p| match p {
            PodCidr::Valid(c) => Some(*c),
            PodCidr::Invalid(_) => None,
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

fn inside(w: &World, c: &Cidr) -> bool {
    w.config.cluster_cidrs.iter().any(|cc| cc.covers(c))
}

/// Oracle: a (node, CIDR) pair is contested when another node claims an
/// overlapping CIDR that is also inside the cluster.
fn contested(w: &World, node: &str, c: &Cidr) -> bool {
    w.nodes
        .iter()
        .filter(|n| n.name != node)
        .any(|n| valid_cidrs(n).iter().any(|o| inside(w, o) && o.overlaps(c)))
}

/// Oracle: a listed route that serves (node, CIDR) as it is.
fn usable(w: &World, r: &Route, n: &NodeView, c: &Cidr) -> bool {
    r.node == n.name
        && r.destination.cidr() == Some(*c)
        && !r.blackhole
        && (!r.enable_node_addresses || multiset_eq(&r.node_addresses, &n.addresses))
        && is_responsible_for_route(&w.config.cluster_cidrs, &r.destination)
}

fn owns(w: &World, r: &Route) -> Option<(usize, Cidr)> {
    let c = r.destination.cidr()?;
    let i = w.nodes.iter().position(|n| n.name == r.node)?;
    valid_cidrs(&w.nodes[i]).contains(&c).then_some((i, c))
}

fn cases() -> ProptestConfig {
    ProptestConfig::with_cases(1000)
}

proptest! {
    #![proptest_config(cases())]

    /// (a) Applying a plan and planning again gives a no-op plan.
    #[test]
    fn applying_the_plan_then_planning_again_is_a_noop(w in world()) {
        let p = plan(&w.nodes, &w.routes, &w.config);
        let after = apply(&p, &w.routes);
        let again = plan(&w.nodes, &after, &w.config);
        prop_assert!(again.is_noop(), "first {:#?}\nsecond {:#?}", p, again);
        prop_assert_eq!(&again.conflicts, &p.conflicts);
        prop_assert_eq!(&again.outside_cluster, &p.outside_cluster);
        // Once the routes exist, no node is waiting for a creation.
        for o in &again.nodes {
            prop_assert!(o.creations.is_empty());
        }
    }

    /// (b) No plan deletes a route outside the cluster CIDRs or with an
    /// unparsable destination.
    #[test]
    fn no_plan_deletes_a_route_it_is_not_responsible_for(w in world()) {
        let p = plan(&w.nodes, &w.routes, &w.config);
        for d in &p.deletions {
            let c = d.route.destination.cidr();
            prop_assert!(c.is_some(), "deleted unparsable {:?}", d.route);
            let c = c.unwrap();
            let ours = w.config.cluster_cidrs.iter().any(|cc| cc.contains(c.network()) || cc.contains(c.last()));
            prop_assert!(ours, "deleted foreign route {:?}", d.route);
        }
        let unparsable = w.routes.iter().filter(|r| r.destination.cidr().is_none()).count();
        prop_assert_eq!(p.unparsable_routes.len(), unparsable);
    }

    /// (c) A live node's route for a CIDR it still owns is deleted only when
    /// its addresses changed, it is a blackhole, or another route for the
    /// same pair is kept; and the pair keeps exactly one route when it is
    /// routable, at least one when it had a working one.
    #[test]
    fn owned_routes_are_deleted_only_when_replaced_or_duplicated(w in world()) {
        let p = plan(&w.nodes, &w.routes, &w.config);
        let after = apply(&p, &w.routes);
        for d in &p.deletions {
            let Some((i, c)) = owns(&w, &d.route) else {
                prop_assert!(matches!(
                    d.reason,
                    DeletionReason::NodeGone | DeletionReason::NoTargetNode | DeletionReason::CidrNotAssigned | DeletionReason::Blackhole
                ), "{:?}", d);
                continue;
            };
            let n = &w.nodes[i];
            match d.reason {
                DeletionReason::Blackhole => prop_assert!(d.route.blackhole),
                DeletionReason::AddressesChanged => {
                    prop_assert!(d.route.enable_node_addresses && !multiset_eq(&d.route.node_addresses, &n.addresses));
                    prop_assert!(inside(&w, &c) && !contested(&w, &n.name, &c), "update only where a route can be created");
                }
                DeletionReason::Duplicate => {
                    let kept = after.iter().filter(|r| r.node == n.name && r.destination.cidr() == Some(c) && !r.blackhole).count();
                    prop_assert!(kept >= 1, "duplicate deleted but nothing kept: {:?}", d);
                }
                other => prop_assert!(false, "owned route deleted as {:?}: {:?}", other, d),
            }
        }
        for (i, n) in w.nodes.iter().enumerate() {
            for c in valid_cidrs(n) {
                let before = w.routes.iter().filter(|r| owns(&w, r) == Some((i, c)) && !r.blackhole).count();
                let now = after.iter().filter(|r| owns(&w, r) == Some((i, c))).count();
                if inside(&w, &c) && !contested(&w, &n.name, &c) {
                    prop_assert_eq!(now, 1, "{} {} must end with one route", n.name, c);
                } else if before > 0 {
                    prop_assert!(now >= 1, "{} {} lost its route", n.name, c);
                }
            }
        }
    }

    /// (d) Creations are exactly the missing (node, CIDR) pairs, conflicts and
    /// CIDRs outside the cluster excluded; each waits for every deletion of
    /// its destination and nothing else.
    #[test]
    fn creations_are_exactly_the_missing_pairs(w in world()) {
        let p = plan(&w.nodes, &w.routes, &w.config);
        let mut expected = BTreeSet::new();
        for n in &w.nodes {
            for c in valid_cidrs(n) {
                if inside(&w, &c) && !contested(&w, &n.name, &c) && !w.routes.iter().any(|r| usable(&w, r, n, &c)) {
                    expected.insert((n.name.clone(), c));
                }
            }
        }
        let got: Vec<(String, Cidr)> = p
            .creations
            .iter()
            .map(|c| (c.route.node.to_string(), c.route.destination.cidr().unwrap()))
            .collect();
        let got_set: BTreeSet<_> = got.iter().cloned().collect();
        prop_assert_eq!(got.len(), got_set.len(), "a pair is created twice");
        prop_assert_eq!(got_set, expected);
        for c in &p.creations {
            let want: Vec<OpKey> = p
                .deletions
                .iter()
                .filter(|d| d.route.destination == c.route.destination)
                .map(Deletion::key)
                .collect();
            prop_assert_eq!(&c.after, &want);
        }
        // Every operation has a key of its own: the gate, the executor and
        // the retry book tell operations apart by it.
        let keys: Vec<OpKey> = p.deletions.iter().map(Deletion::key)
            .chain(p.creations.iter().map(Creation::key)).collect();
        let distinct: BTreeSet<&OpKey> = keys.iter().collect();
        prop_assert_eq!(distinct.len(), keys.len(), "two operations share a key");
        // Every creation belongs to exactly one node outcome.
        let mut listed: Vec<OpKey> = p.nodes.iter().flat_map(|o| o.creations.iter().cloned()).collect();
        listed.sort_unstable();
        let mut created: Vec<OpKey> = p.creations.iter().map(Creation::key).collect();
        created.sort_unstable();
        prop_assert_eq!(listed, created);
    }
}

const TABLES: [&str; 3] = ["rtb-a", "rtb-b", "rtb-c"];

/// A world whose routes are spread over three route tables of the cluster
/// and one foreign table.
fn world_with_tables() -> impl Strategy<Value = World> {
    (world(), prop::collection::vec(0u8..4, 12)).prop_map(|(mut w, tables)| {
        for (r, t) in w.routes.iter_mut().zip(tables.iter().cycle()) {
            r.table = match TABLES.get(usize::from(*t)) {
                Some(t) => (*t).into(),
                None => "rtb-foreign".into(),
            };
        }
        w.config.tables = TABLES.iter().map(|t| (*t).into()).collect();
        w
    })
}

proptest! {
    #![proptest_config(cases())]

    /// With several route tables, applying a plan and planning again is a
    /// no-op too, and no route of a table that is not the cluster's is deleted.
    #[test]
    fn with_tables_applying_the_plan_then_planning_again_is_a_noop(w in world_with_tables()) {
        let p = plan(&w.nodes, &w.routes, &w.config);
        for d in &p.deletions {
            prop_assert!(TABLES.contains(&d.route.table.as_str()), "deleted {:?}", d.route);
        }
        for c in &p.creations {
            prop_assert!(TABLES.contains(&c.route.table.as_str()), "created {:?}", c.route);
            for key in &c.after {
                let d = p.deletions.iter().find(|d| d.key() == *key);
                prop_assert!(d.is_some(), "{} follows {} which is not planned", c.key(), key);
                prop_assert_eq!(&d.unwrap().route.table, &c.route.table);
            }
        }
        let after = apply(&p, &w.routes);
        let again = plan(&w.nodes, &after, &w.config);
        prop_assert!(again.is_noop(), "first {:#?}\nsecond {:#?}", p, again);
    }

    /// Each table's part of the joined plan is the plan of that table alone.
    #[test]
    fn with_tables_each_table_is_planned_as_if_it_were_alone(w in world_with_tables()) {
        let p = plan(&w.nodes, &w.routes, &w.config);
        for t in TABLES {
            let alone_routes: Vec<Route> = w
                .routes
                .iter()
                .filter(|r| r.table.as_str() == t)
                .cloned()
                .collect();
            let alone = plan(
                &w.nodes,
                &alone_routes,
                &PlanConfig { tables: vec![t.into()], ..w.config.clone() },
            );
            let joined_dels: Vec<&Route> =
                p.deletions.iter().map(|d| &d.route).filter(|r| r.table.as_str() == t).collect();
            let alone_dels: Vec<&Route> = alone.deletions.iter().map(|d| &d.route).collect();
            prop_assert_eq!(joined_dels, alone_dels);
            let joined_cres: Vec<&Route> =
                p.creations.iter().map(|c| &c.route).filter(|r| r.table.as_str() == t).collect();
            let alone_cres: Vec<&Route> = alone.creations.iter().map(|c| &c.route).collect();
            prop_assert_eq!(joined_cres, alone_cres);
        }
    }
}

/// A world where some Nodes are left out of routing (excluded, and some of
/// those leaving: a route controller's reason on them), some routes are
/// provably another cluster's, and sometimes IPv6 is not routed.
fn world_with_selection() -> impl Strategy<Value = World> {
    (
        world(),
        prop::collection::vec((any::<bool>(), 0u8..4), 8),
        prop::collection::vec(any::<bool>(), 12),
        any::<bool>(),
    )
        .prop_map(|(mut w, marks, theirs, v4_only)| {
            for (n, &(excluded, cond)) in w.nodes.iter_mut().zip(&marks) {
                n.excluded = excluded;
                n.network_unavailable = match cond {
                    0 => None,
                    1 => Some(route_core::ConditionState::new("False", "RouteCreated")),
                    2 => Some(route_core::ConditionState::new("False", "NodeExcluded")),
                    _ => Some(route_core::ConditionState::new("False", "CiliumIsUp")),
                };
            }
            for (r, &t) in w.routes.iter_mut().zip(&theirs) {
                if t && r.node.is_empty() {
                    r.foreign = Some("cluster other".into());
                }
            }
            if v4_only {
                w.config.skip_families = vec![route_core::IpFamily::V6];
            }
            w
        })
}

/// Oracle: the excluded Node a route belongs to, by name, else (naming no
/// known Node) by the first excluded Node whose InternalIP is its next hop
/// or one of its addresses.
fn excluded_owner<'w>(w: &'w World, r: &Route) -> Option<&'w NodeView> {
    if let Some(n) = w
        .nodes
        .iter()
        .find(|n| !r.node.is_empty() && n.name == r.node)
    {
        return n.excluded.then_some(n);
    }
    let hops: Vec<&str> = std::iter::once(r.next_hop.as_str())
        .chain(r.node_addresses.iter().map(|a| a.address.as_str()))
        .collect();
    hops.iter().find_map(|h| {
        w.nodes.iter().find(|n| {
            n.excluded
                && n.addresses
                    .iter()
                    .any(|a| a.kind == "InternalIP" && a.address.as_str() == *h)
        })
    })
}

proptest! {
    #![proptest_config(cases())]

    /// Routes that are someone else's are never deleted: another cluster's,
    /// and those to a Node outside the selection that no route controller
    /// routed. Nothing is created for an excluded Node, over another
    /// cluster's route, or in a family that is not routed.
    #[test]
    fn nothing_of_someone_else_is_deleted_and_nothing_is_created_over_it(w in world_with_selection()) {
        let p = plan(&w.nodes, &w.routes, &w.config);
        for d in &p.deletions {
            prop_assert!(d.route.foreign.is_none(), "deleted another cluster's {:?}", d.route);
            if let Some(n) = excluded_owner(&w, &d.route) {
                prop_assert!(n.leaving(), "deleted {:?}, a route of {} which was never ours", d.route, n.name);
                prop_assert_eq!(d.reason, DeletionReason::NodeExcluded);
            }
            let c = d.route.destination.cidr().unwrap();
            prop_assert!(w.config.routes_family(c.family()), "deleted {:?} of a family not routed", d.route);
        }
        let theirs: Vec<Cidr> = w
            .routes
            .iter()
            .filter(|r| r.foreign.is_some())
            .filter_map(|r| r.destination.cidr())
            .filter(|c| is_responsible_for_route(&w.config.cluster_cidrs, &(*c).into()))
            .collect();
        for c in &p.creations {
            let n = w.nodes.iter().find(|n| n.name == c.route.node).unwrap();
            prop_assert!(!n.excluded, "created {:?} for excluded {}", c.route, n.name);
            let d = c.route.destination.cidr().unwrap();
            prop_assert!(w.config.routes_family(d.family()));
            prop_assert!(!theirs.iter().any(|t| t.overlaps(&d)), "created {:?} over another cluster's route", c.route);
        }
        for n in w.nodes.iter().filter(|n| n.excluded && !n.leaving()) {
            prop_assert!(!p.nodes.iter().any(|o| o.node == n.name), "a condition for {}, never ours", n.name);
        }
    }

    /// A leaving Node's outcome waits for exactly the deletions of its
    /// routes; once they ran, planning again deletes nothing of it and
    /// writes NodeExcluded.
    #[test]
    fn a_leaving_node_says_node_excluded_once_its_routes_are_gone(w in world_with_selection()) {
        let p = plan(&w.nodes, &w.routes, &w.config);
        for n in w.nodes.iter().filter(|n| n.leaving() && w.nodes.iter().position(|m| m.name == n.name) == w.nodes.iter().position(|m| std::ptr::eq(m, *n))) {
            let mut mine: Vec<OpKey> = p
                .deletions
                .iter()
                .filter(|d| d.reason == DeletionReason::NodeExcluded && excluded_owner(&w, &d.route).is_some_and(|o| o.name == n.name))
                .map(Deletion::key)
                .collect();
            mine.sort();
            let o = p.nodes.iter().find(|o| o.node == n.name);
            prop_assert!(o.is_some(), "no outcome for leaving {}", n.name);
            let mut waits = o.unwrap().creations.clone();
            waits.sort();
            prop_assert_eq!(waits, mine);
        }
        let after = apply(&p, &w.routes);
        let again = plan(&w.nodes, &after, &w.config);
        prop_assert!(again.deletions.iter().all(|d| d.reason != DeletionReason::NodeExcluded), "{:?}", again.deletions);
        for o in again.nodes.iter().filter(|o| o.cause == Some(route_core::NetworkCondition::NodeExcluded)) {
            prop_assert!(o.creations.is_empty());
            prop_assert_eq!(o.condition_after(|_| false), Some(route_core::NetworkCondition::NodeExcluded));
        }
    }
}
