//! Nodes left out of routing, routes that are provably someone else's, and
//! address families switched off (planner corrections 11 and 12).

mod common;

use common::{apply, config, node, route};
use route_core::{
    DeletionReason, IpFamily, NetworkCondition, NodeView, PlanConfig, Route, Text, plan,
};

fn excluded(mut n: NodeView) -> NodeView {
    n.excluded = true;
    n
}

/// A route to a dedicated server behind a vSwitch, as hcloud lists it: the
/// gateway is no cloud server, so it names no Node and looks blackholed.
fn vswitch_route(dest: &str, gateway: &str) -> Route {
    let mut r = route("", dest, &[gateway], false).blackholed();
    r.next_hop = gateway.into();
    r
}

#[test]
fn a_node_outside_the_selector_gets_no_route_and_its_routes_are_never_deleted() {
    let nodes = vec![
        node("cloud-1", "u1", &["10.244.1.0/24"], "10.0.0.1"),
        // A dedicated server a CNI (not a route controller) marks.
        excluded(node("robot-1", "u2", &["10.244.2.0/24"], "10.0.1.2"))
            .with_condition("False", "CiliumIsUp"),
        // One without any condition.
        excluded(node("robot-2", "u3", &["10.244.3.0/24"], "10.0.1.3")),
    ];
    let routes = vec![
        vswitch_route("10.244.2.0/24", "10.0.1.2"),
        route("robot-2", "10.244.3.0/24", &["10.0.1.3"], false),
    ];
    let p = plan(&nodes, &routes, &config(&["10.244.0.0/16"]));
    assert!(p.deletions.is_empty(), "{:?}", p.deletions);
    assert_eq!(p.creations.len(), 1);
    assert_eq!(p.creations[0].route.node, "cloud-1");
    assert!(
        p.nodes.iter().all(|n| n.node == "cloud-1"),
        "no condition written on a Node that was never ours: {:?}",
        p.nodes
    );
    assert!(p.overlaps.is_empty());
}

#[test]
fn a_node_that_leaves_the_selection_loses_its_routes_then_says_node_excluded() {
    let cfg = config(&["10.244.0.0/16"]);
    let routed = node("cloud-1", "u1", &["10.244.1.0/24"], "10.0.0.1")
        .with_condition("False", "RouteCreated");
    let routes = vec![route("cloud-1", "10.244.1.0/24", &["10.0.0.1"], false)];
    let p = plan(std::slice::from_ref(&routed), &routes, &cfg);
    assert!(p.is_noop() && p.nodes.is_empty());

    // Labelled out: the route a route controller made goes; the condition
    // waits until it is gone.
    let leaving = excluded(routed.clone());
    assert!(leaving.leaving());
    let p = plan(std::slice::from_ref(&leaving), &routes, &cfg);
    assert_eq!(p.deletions.len(), 1);
    assert_eq!(p.deletions[0].reason, DeletionReason::NodeExcluded);
    // The condition follows the deletion: written when it succeeds, kept
    // while it fails.
    assert_eq!(p.nodes.len(), 1);
    assert_eq!(p.nodes[0].creations, [p.deletions[0].key()]);
    assert_eq!(p.nodes[0].condition_after(|_| true), None);
    assert_eq!(
        p.nodes[0].condition_after(|_| false),
        Some(NetworkCondition::NodeExcluded)
    );

    let after = apply(&p, &routes);
    let p = plan(std::slice::from_ref(&leaving), &after, &cfg);
    assert!(p.is_noop());
    assert_eq!(p.nodes.len(), 1);
    assert_eq!(
        p.nodes[0].condition_after(|_| false),
        Some(NetworkCondition::NodeExcluded)
    );
    assert_eq!(NetworkCondition::NodeExcluded.status(), "False");

    // Once it says so it is no longer ours: a route someone makes to it
    // now stays.
    let gone = leaving.with_condition("False", "NodeExcluded");
    assert!(!gone.leaving());
    let p = plan(std::slice::from_ref(&gone), &routes, &cfg);
    assert!(p.is_noop() && p.nodes.is_empty(), "{p:?}");

    // Labelled back in: routed at once.
    let mut back = gone.clone();
    back.excluded = false;
    let p = plan(std::slice::from_ref(&back), &[], &cfg);
    assert_eq!(p.creations.len(), 1);
    assert_eq!(
        p.nodes[0].condition_after(|_| false),
        Some(NetworkCondition::RouteCreated)
    );
}

#[test]
fn a_leaving_node_says_node_excluded_only_once_every_table_is_clean() {
    let cfg = PlanConfig {
        tables: vec![Text::from("rtb-a"), Text::from("rtb-b")],
        ..config(&["10.244.0.0/16"])
    };
    let leaving = excluded(
        node("cloud-1", "u1", &["10.244.1.0/24"], "10.0.0.1")
            .with_condition("False", "RouteCreated"),
    );
    let routes = vec![route("cloud-1", "10.244.1.0/24", &["10.0.0.1"], false).in_table("rtb-b")];
    let p = plan(std::slice::from_ref(&leaving), &routes, &cfg);
    assert_eq!(p.deletions.len(), 1);
    assert_eq!(p.nodes.len(), 1);
    assert_eq!(
        p.nodes[0].condition_after(|k| *k == p.deletions[0].key()),
        None,
        "rtb-b still routes it while its deletion fails"
    );
    let p = plan(std::slice::from_ref(&leaving), &[], &cfg);
    assert_eq!(
        p.nodes.iter().map(|n| n.planned()).collect::<Vec<_>>(),
        [NetworkCondition::NodeExcluded]
    );
}

#[test]
fn a_pod_cidr_overlapping_another_clusters_route_gets_no_route_and_is_reported() {
    let nodes = vec![
        node("a", "ua", &["10.244.1.0/24"], "10.0.0.1"),
        node("b", "ub", &["10.244.2.0/24"], "10.0.0.2"),
    ];
    let theirs = route("", "10.244.0.0/23", &[], false).owned_by("cluster other");
    // A stray of ours in the same range is still deleted.
    let stray = route("gone", "10.244.9.0/24", &[], false);
    let routes = vec![theirs.clone(), stray.clone()];
    let p = plan(&nodes, &routes, &config(&["10.244.0.0/16"]));
    let deleted: Vec<&Route> = p.deletions.iter().map(|d| &d.route).collect();
    assert_eq!(
        deleted,
        [&stray],
        "the other cluster's route is never deleted"
    );
    let created: Vec<&str> = p.creations.iter().map(|c| c.route.node.as_str()).collect();
    assert_eq!(created, ["b"]);
    assert_eq!(p.overlaps.len(), 1);
    assert_eq!(p.overlaps[0].node, "a");
    assert_eq!(p.overlaps[0].owner, "cluster other");
    let a = p.nodes.iter().find(|n| n.node == "a").unwrap();
    assert_eq!(
        a.condition_after(|_| false),
        Some(NetworkCondition::PodCidrConflict)
    );
}

#[test]
fn a_switched_off_family_is_neither_routed_nor_deleted_nor_unroutable() {
    let cfg = PlanConfig {
        skip_families: vec![IpFamily::V6],
        ..config(&["10.244.0.0/16", "fd00:10::/56"])
    };
    let n = node(
        "a",
        "ua",
        &["10.244.1.0/24", "fd00:10:0:1::/64"],
        "10.0.0.1",
    );
    let v6_stray = route("gone", "fd00:10:0:9::/64", &[], false);
    let p = plan(
        std::slice::from_ref(&n),
        std::slice::from_ref(&v6_stray),
        &cfg,
    );
    assert!(p.deletions.is_empty());
    let created: Vec<String> = p
        .creations
        .iter()
        .map(|c| c.route.destination.to_string())
        .collect();
    assert_eq!(created, ["10.244.1.0/24"]);
    assert_eq!(
        p.nodes[0].condition_after(|_| false),
        Some(NetworkCondition::RouteCreated),
        "routed in every family it routes"
    );
}

#[test]
fn every_condition_reason_round_trips_and_only_two_say_false() {
    for c in NetworkCondition::ALL {
        assert_eq!(NetworkCondition::from_reason(c.reason()), Some(c));
    }
    let falses: Vec<_> = NetworkCondition::ALL
        .into_iter()
        .filter(|c| c.status() == "False")
        .collect();
    assert_eq!(
        falses,
        [
            NetworkCondition::RouteCreated,
            NetworkCondition::NodeExcluded
        ]
    );
    assert_eq!(
        NetworkCondition::RouteQuotaExceeded.or(NetworkCondition::NoRouteCreated),
        NetworkCondition::RouteQuotaExceeded
    );
}
