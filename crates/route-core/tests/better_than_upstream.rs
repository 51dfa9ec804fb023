//! One test per place where the planner deliberately differs from upstream's
//! route controller; each is named after the upstream weakness it pins.

mod common;

use common::{apply, cidr, comparable, config, internal, node, route};
use route_core::{
    Conflict, CreationReason, DeletionReason, Destination, InvalidPodCidr, NetworkCondition,
    NodeAddress, NodeView, OutsideCidr, Route, plan,
};

fn cluster() -> route_core::PlanConfig {
    config(&["10.120.0.0/16", "fd00::/48"])
}

// 1. Upstream compares destination CIDRs as strings.
#[test]
fn string_compared_cidrs_recreate_routes_spelled_differently() {
    let nodes = [
        node("node-1", "01", &["10.120.0.0/24"], "10.0.1.1"),
        node("node-2", "02", &["fd00:0:0:2::/64"], "10.0.2.1"),
    ];
    let routes = [
        route("node-1", "10.120.000.0/24", &["10.0.1.1"], true),
        route("node-2", "FD00::2:0:0:0:0/64", &["10.0.2.1"], true),
    ];
    let p = plan(&nodes, &routes, &cluster());
    assert!(
        p.is_noop(),
        "spellings of the same block are the same route: {p:#?}"
    );
    assert!(
        p.nodes
            .iter()
            .all(|n| !n.unroutable && n.creations.is_empty())
    );
}

#[test]
fn unparsable_route_destination_is_never_deleted_and_is_reported() {
    let nodes = [node("node-1", "01", &["10.120.0.0/24"], "10.0.1.1")];
    let garbage = Route::from_text("gone", "10.120.0.0/99").blackholed();
    let routes = [
        route("node-1", "10.120.0.0/24", &["10.0.1.1"], false),
        garbage.clone(),
    ];
    let p = plan(&nodes, &routes, &cluster());
    assert!(p.deletions.is_empty());
    assert_eq!(p.unparsable_routes, vec![garbage]);
    assert!(matches!(
        p.unparsable_routes[0].destination,
        Destination::Unparsable(_)
    ));
}

// 2. Ownership stays upstream's: routes not ours are never touched.
#[test]
fn routes_outside_the_cluster_cidrs_are_never_deleted_even_for_gone_nodes() {
    let routes = [
        route("gone", "10.121.0.0/24", &[], false),
        route("gone", "10.0.0.0/8", &[], false).blackholed(), // a strict superset
        route("", "192.168.0.0/24", &[], false),
        route("gone", "fd01::/64", &[], false),
        route("gone", "10.120.9.0/24", &[], false),
    ];
    let p = plan::<NodeView>(&[], &routes, &cluster());
    let deleted: Vec<String> = p
        .deletions
        .iter()
        .map(|d| d.route.destination.to_string())
        .collect();
    assert_eq!(deleted, ["10.120.9.0/24"]);
    assert_eq!(p.deletions[0].reason, DeletionReason::NodeGone);
}

// 3. Deletion reasons, and upstream's equalNodeAddrs treating [A, A] as [A, B].
#[test]
fn equal_node_addrs_treats_a_repeated_address_as_equal_to_a_different_one() {
    let a = NodeAddress::internal_ip("10.0.1.1");
    let b = NodeAddress::internal_ip("10.0.1.2");
    let n = NodeView::new("node-1", "01", &["10.120.0.0/24"])
        .with_addresses(vec![a.clone(), b.clone()]);
    let stale = Route::from_text("node-1", "10.120.0.0/24")
        .with_addresses(vec![a.clone(), a.clone()], true);
    let p = plan(&[&n], std::slice::from_ref(&stale), &cluster());
    assert_eq!(p.deletions.len(), 1);
    assert_eq!(p.deletions[0].reason, DeletionReason::AddressesChanged);
    assert_eq!(p.creations.len(), 1);
    assert_eq!(p.creations[0].reason, CreationReason::AddressesChanged);
    assert_eq!(p.creations[0].after, vec![p.deletions[0].key()]);
    assert_eq!(
        p.creations[0].route.node_addresses,
        vec![a.clone(), b.clone()]
    );

    // Same multiset in another order is no change, and without
    // enable_node_addresses the addresses are not looked at.
    let reordered =
        Route::from_text("node-1", "10.120.0.0/24").with_addresses(vec![b, a.clone()], true);
    assert!(plan(&[&n], &[reordered], &cluster()).is_noop());
    let untracked =
        Route::from_text("node-1", "10.120.0.0/24").with_addresses(vec![a.clone(), a], false);
    assert!(plan(&[n], &[untracked], &cluster()).is_noop());
}

#[test]
fn deletion_reasons_name_why_a_route_goes() {
    let nodes = [
        node("node-1", "01", &["10.120.0.0/24"], "10.0.1.1"),
        node("node-2", "02", &[], "10.0.2.1"),
    ];
    let routes = [
        route("node-9", "10.120.9.0/24", &[], false),
        route("", "10.120.8.0/24", &[], false),
        route("node-1", "10.120.7.0/24", &[], false),
        route("node-2", "10.120.6.0/24", &[], false),
        route("node-1", "10.120.5.0/24", &[], false).blackholed(),
    ];
    let p = plan(&nodes, &routes, &cluster());
    let reasons: Vec<DeletionReason> = p.deletions.iter().map(|d| d.reason).collect();
    assert_eq!(
        reasons,
        [
            DeletionReason::NodeGone,
            DeletionReason::NoTargetNode,
            DeletionReason::CidrNotAssigned,
            DeletionReason::CidrNotAssigned,
            DeletionReason::Blackhole,
        ]
    );
    for (d, r) in p.deletions.iter().zip(&routes) {
        assert_eq!(
            &d.route, r,
            "deletions carry the listed route and keep list order"
        );
    }
}

// 4. Upstream deletes a blackhole route for a CIDR the node owns, reports the
//    node as routed, and creates nothing until the next pass.
#[test]
fn blackhole_route_for_an_owned_cidr_leaves_the_node_without_route_until_next_pass() {
    let nodes = [node("node-1", "01", &["10.120.0.0/24"], "10.0.1.1")];
    let routes = [
        route("node-1", "10.120.0.0/24", &["10.0.1.1"], false).blackholed(),
        route("gone", "10.120.5.0/24", &[], false),
    ];
    let p = plan(&nodes, &routes, &cluster());
    assert_eq!(p.deletions[0].reason, DeletionReason::Blackhole);
    assert_eq!(p.creations.len(), 1);
    let c = &p.creations[0];
    assert_eq!(c.reason, CreationReason::ReplacesBlackhole);
    assert_eq!(
        c.after,
        vec![p.deletions[0].key()],
        "only the blackhole for the same destination orders it"
    );
    assert_eq!(
        c.route.destination,
        Destination::Cidr(cidr("10.120.0.0/24"))
    );
    assert!(!c.route.blackhole);
    // Routed if the creation succeeds, not routed if it fails.
    assert_eq!(p.nodes[0].creations, vec![p.creations[0].key()]);
    assert_eq!(
        p.nodes[0].condition_after(|_| false),
        Some(NetworkCondition::RouteCreated)
    );
    assert_eq!(
        p.nodes[0].condition_after(|_| true),
        Some(NetworkCondition::NoRouteCreated)
    );
    let after = apply(&p, &routes);
    assert_eq!(
        comparable(&after),
        comparable(&[route("node-1", "10.120.0.0/24", &["10.0.1.1"], false)])
    );
}

// 5. Upstream issues one CreateRoute per duplicate pod CIDR (the second fails
//    with "already exists") and never cleans up duplicate cloud routes.
#[test]
fn duplicate_pod_cidrs_cause_a_second_failing_create() {
    let nodes = [node(
        "node-4",
        "04",
        &["10.120.1.0/24", "10.120.001.0/24", "10.120.1.0/24"],
        "10.0.4.1",
    )];
    let p = plan(&nodes, &[], &cluster());
    assert_eq!(p.creations.len(), 1);
    assert_eq!(p.nodes[0].creations, vec![p.creations[0].key()]);
    assert!(!p.nodes[0].unroutable);
}

#[test]
fn duplicate_cloud_routes_for_one_node_and_cidr_are_never_cleaned_up() {
    let n = node("node-1", "01", &["10.120.0.0/24"], "10.0.1.1");
    let bh = route("node-1", "10.120.0.0/24", &["10.0.1.1"], true).blackholed();
    let stale = route("node-1", "10.120.0.0/24", &["10.0.9.9"], true);
    let good1 = route("node-1", "10.120.0.0/24", &["10.0.1.1"], true).named("good-1");
    let good2 = route("node-1", "10.120.0.0/24", &["10.0.1.1"], true).named("good-2");

    // Prefers a non-blackhole whose addresses match, then the first listed.
    let routes = [bh.clone(), stale.clone(), good1.clone(), good2.clone()];
    let p = plan(&[&n], &routes, &cluster());
    let deleted: Vec<(&Route, DeletionReason)> =
        p.deletions.iter().map(|d| (&d.route, d.reason)).collect();
    assert_eq!(
        deleted,
        [
            (&bh, DeletionReason::Blackhole),
            (&stale, DeletionReason::Duplicate),
            (&good2, DeletionReason::Duplicate),
        ]
    );
    assert!(p.creations.is_empty(), "good-1 is kept");

    // With no matching route the first non-blackhole is kept and updated.
    let stale2 = route("node-1", "10.120.0.0/24", &["10.0.8.8"], true);
    let routes = [stale.clone(), stale2.clone(), bh.clone()];
    let p = plan(&[&n], &routes, &cluster());
    let deleted: Vec<(&Route, DeletionReason)> =
        p.deletions.iter().map(|d| (&d.route, d.reason)).collect();
    assert_eq!(
        deleted,
        [
            (&stale, DeletionReason::AddressesChanged),
            (&stale2, DeletionReason::Duplicate),
            (&bh, DeletionReason::Blackhole),
        ]
    );
    assert_eq!(p.creations.len(), 1);
    assert_eq!(p.creations[0].reason, CreationReason::AddressesChanged);
    assert_eq!(
        p.creations[0].after,
        p.deletions[0..3]
            .iter()
            .map(|d| d.key())
            .collect::<Vec<_>>(),
        "every deletion of that destination comes first"
    );
    let after = apply(&p, &routes);
    assert_eq!(after.len(), 1);
    assert!(plan(&[n], &after, &cluster()).is_noop());
}

// 6. Upstream creates one route per claimant of the same CIDR.
#[test]
fn cidr_claimed_by_two_nodes_gets_competing_routes() {
    let nodes = [
        node("node-b", "0b", &["10.120.1.0/24"], "10.0.2.1"),
        node("node-a", "0a", &["10.120.1.0/24"], "10.0.1.1"),
        node("node-c", "0c", &["10.120.0.0/23"], "10.0.3.1"),
        node("node-d", "0d", &["10.120.4.0/24"], "10.0.4.1"),
    ];
    let existing = route("node-a", "10.120.1.0/24", &["10.0.1.1"], false);
    let p = plan(&nodes, std::slice::from_ref(&existing), &cluster());
    assert_eq!(
        p.conflicts,
        vec![Conflict {
            cidr: cidr("10.120.0.0/23"),
            nodes: vec!["node-a".into(), "node-b".into(), "node-c".into()],
        }]
    );
    assert!(
        p.deletions.is_empty(),
        "the existing route to a claimant is kept"
    );
    let created: Vec<&str> = p.creations.iter().map(|c| c.route.node.as_str()).collect();
    assert_eq!(created, ["node-d"], "no claimant gets a route");
    let unroutable: Vec<(&str, bool)> = p
        .nodes
        .iter()
        .map(|o| (o.node.as_str(), o.unroutable))
        .collect();
    assert_eq!(
        unroutable,
        [
            ("node-b", true),
            ("node-a", false),
            ("node-c", true),
            ("node-d", false)
        ]
    );
    assert!(plan(&nodes, &apply(&p, &[existing]), &cluster()).is_noop());
}

// 7. Upstream creates a route for a pod CIDR outside the cluster CIDRs, which
//    its own ownership check then never lets it delete.
#[test]
fn pod_cidr_outside_the_cluster_cidrs_gets_a_route_that_can_never_be_deleted() {
    let nodes = [
        node(
            "node-1",
            "01",
            &["10.121.0.0/24", "10.120.0.0/24"],
            "10.0.1.1",
        ),
        node("node-2", "02", &["fd01::/64"], "10.0.2.1"),
        node("node-3", "03", &["10.120.0.0/15"], "10.0.3.1"), // wider than the cluster CIDR
    ];
    let p = plan(&nodes, &[], &config(&["10.120.0.0/16"]));
    assert_eq!(
        p.outside_cluster,
        vec![
            OutsideCidr {
                node: "node-1".into(),
                cidr: cidr("10.121.0.0/24")
            },
            OutsideCidr {
                node: "node-2".into(),
                cidr: cidr("fd01::/64")
            },
            OutsideCidr {
                node: "node-3".into(),
                cidr: cidr("10.120.0.0/15")
            },
        ]
    );
    let created: Vec<String> = p
        .creations
        .iter()
        .map(|c| c.route.destination.to_string())
        .collect();
    assert_eq!(created, ["10.120.0.0/24"]);
    assert!(p.nodes.iter().all(|n| n.unroutable));
    assert_eq!(
        p.nodes[0].creations,
        vec![p.creations[0].key()],
        "the routable CIDR is still created"
    );
    assert!(
        p.conflicts.is_empty(),
        "claims outside the cluster are not conflicts"
    );
}

// 7, continued: a Node whose pod CIDR lies outside the cluster CIDRs but
//    whose route is in the table (upstream's, before the switch-over) has a
//    working network; a wrong --cluster-cidr must not taint it.
#[test]
fn upstream_routes_outside_a_wrong_cluster_cidr_keep_their_nodes_route_created() {
    let nodes = [
        node("node-1", "01", &["10.42.1.0/24"], "10.0.1.1").with_condition("False", "RouteCreated"),
        node("node-2", "02", &["10.42.2.0/24"], "10.0.2.1"),
        node("node-3", "03", &["10.42.3.0/24"], "10.0.3.1"),
        node("node-4", "04", &["10.42.4.0/24"], "10.0.4.1"),
    ];
    let routes = [
        route("node-1", "10.42.1.0/24", &["10.0.1.1"], false),
        route("node-2", "10.42.2.0/24", &["10.0.2.1"], false),
        route("node-3", "10.42.3.0/24", &["10.0.3.1"], false).blackholed(),
    ];
    let p = plan(&nodes, &routes, &config(&["10.244.0.0/16"]));
    assert!(p.deletions.is_empty(), "not ours to delete: {p:#?}");
    assert!(p.creations.is_empty(), "none created outside: {p:#?}");
    assert_eq!(p.outside_cluster.len(), 4, "still reported");
    let outcome: Vec<(&str, Option<NetworkCondition>)> = p
        .nodes
        .iter()
        .map(|n| (n.node.as_str(), n.condition_after(|_| false)))
        .collect();
    assert_eq!(
        outcome,
        [
            // node-1 already says RouteCreated: nothing to write.
            ("node-2", Some(NetworkCondition::RouteCreated)),
            // A blackhole routes nothing; no live route: no network.
            ("node-3", Some(NetworkCondition::InvalidPodCidr)),
            ("node-4", Some(NetworkCondition::InvalidPodCidr)),
        ]
    );
}

#[test]
fn invalid_pod_cidr_text_is_reported_and_the_node_is_unroutable() {
    let mut n = node("node-1", "01", &["10.120.0.0/24"], "10.0.1.1");
    n.pod_cidrs.push(route_core::PodCidr::parse("not-a-cidr"));
    n.pod_cidrs.push(route_core::PodCidr::parse("not-a-cidr"));
    let p = plan(&[n], &[], &cluster());
    assert_eq!(
        p.invalid_pod_cidrs,
        vec![InvalidPodCidr {
            node: "node-1".into(),
            text: "not-a-cidr".into()
        }]
    );
    assert_eq!(p.creations.len(), 1);
    assert!(p.nodes[0].unroutable);
    // The reason names the cause (upstream would say NoRouteCreated).
    assert_eq!(
        p.nodes[0].condition_after(|_| false),
        Some(NetworkCondition::InvalidPodCidr)
    );
}

// 8. Upstream waits for all deletions before any creation only when
//    routes[0] has EnableNodeAddresses; otherwise an update runs its delete
//    and create concurrently.
#[test]
fn delete_create_barrier_depends_on_the_first_listed_route() {
    let nodes = [
        node("node-1", "01", &["10.120.0.0/24"], "10.0.1.1"),
        node("node-2", "02", &["10.120.1.0/24"], "10.0.2.1"),
        node("node-3", "03", &["10.120.2.0/24"], "10.0.3.1"),
        node("node-4", "04", &["10.120.3.0/24"], "10.0.4.1"),
    ];
    let routes = [
        route("node-1", "10.120.0.0/24", &["10.0.1.1"], false), // routes[0] without addresses
        route("node-2", "10.120.1.0/24", &["10.0.9.9"], true),  // needs an update
        route("node-4", "10.120.2.0/24", &[], false),           // node-3's CIDR, wrong node
        route("gone", "10.120.7.0/24", &[], false),             // unrelated
    ];
    let p = plan(&nodes, &routes, &cluster());
    let by_dest = |d: &str| {
        p.creations
            .iter()
            .find(|c| c.route.destination.to_string() == d)
            .unwrap_or_else(|| panic!("no creation for {d}"))
    };
    let del_idx = |d: &str| {
        p.deletions
            .iter()
            .find(|x| x.route.destination.to_string() == d)
            .unwrap()
            .key()
    };
    assert_eq!(
        by_dest("10.120.1.0/24").after,
        vec![del_idx("10.120.1.0/24")]
    );
    assert_eq!(
        by_dest("10.120.2.0/24").after,
        vec![del_idx("10.120.2.0/24")]
    );
    assert!(
        by_dest("10.120.3.0/24").after.is_empty(),
        "a plain creation waits for nothing"
    );
    assert_eq!(p.creations.len(), 3);
    assert_eq!(p.deletions.len(), 3);
}

// 9. Condition bookkeeping: upstream patches a node without pod CIDRs to
//    NoRouteCreated only when some route names it, and leaves it alone otherwise.
#[test]
fn node_without_pod_cidrs_is_patched_only_when_a_route_names_it() {
    let nodes = [
        NodeView::new("bare", "u1", &[]).with_addresses(internal("10.0.1.1")),
        NodeView::new("named", "u2", &[]).with_condition("False", "RouteCreated"),
        NodeView::new("foreign", "u3", &[]),
        node("routed", "u4", &["10.120.4.0/24"], "10.0.4.1")
            .with_condition("False", "RouteCreated"),
    ];
    let routes = [
        route("named", "10.120.0.0/24", &[], false),
        route("foreign", "192.168.0.0/24", &[], false), // outside, still names the node
    ];
    let p = plan(&nodes, &routes, &cluster());
    let names: Vec<&str> = p.nodes.iter().map(|n| n.node.as_str()).collect();
    assert_eq!(names, ["named", "foreign", "routed"]);
    assert_eq!(p.deletions.len(), 1);
    assert_eq!(p.deletions[0].reason, DeletionReason::CidrNotAssigned);
    assert!(p.nodes[0].unroutable && p.nodes[1].unroutable && !p.nodes[2].unroutable);
    assert_eq!(p.nodes[0].current, nodes[1].network_unavailable);
    assert_eq!(
        p.nodes[0].condition_after(|_| false),
        Some(NetworkCondition::NoRouteCreated)
    );
    assert_eq!(p.nodes[2].creations, vec![p.creations[0].key()]);
    assert_eq!(
        p.nodes[2].condition_after(|_| false),
        None,
        "already False/RouteCreated"
    );
    assert_eq!(
        p.nodes[2].condition_after(|k| *k == p.creations[0].key()),
        Some(NetworkCondition::NoRouteCreated)
    );
    assert_eq!(p.nodes[2].uid, "u4");
}

#[test]
fn nodes_being_deleted_keep_their_routes_like_live_nodes() {
    let mut n = node("node-1", "01", &["10.120.0.0/24"], "10.0.1.1");
    n.deleting = true;
    let routes = [route("node-1", "10.120.0.0/24", &["10.0.1.1"], false)];
    assert!(plan(&[&n], &routes, &cluster()).is_noop());
    assert_eq!(plan(&[n], &[], &cluster()).creations.len(), 1);
}

#[test]
fn creations_carry_the_node_identity() {
    let n = node("node-1", "01", &["10.120.0.0/24", "fd00::/64"], "10.0.1.1")
        .with_provider_id("aws:///eu-1a/i-1");
    let p = plan(&[&n], &[], &cluster());
    assert_eq!(p.creations.len(), 2);
    for c in &p.creations {
        assert_eq!(c.node_uid, "01");
        assert_eq!(
            c.route.node_provider_id.as_deref(),
            Some("aws:///eu-1a/i-1")
        );
        assert_eq!(c.route.node, "node-1");
        assert_eq!(c.reason, CreationReason::Missing);
        assert!(c.after.is_empty());
    }
}

// Upstream walks every Node on every pass. A plan lists only the Nodes it
// concerns, so planning a settled 5,000-Node cluster allocates nothing per Node.
#[test]
fn settled_nodes_are_left_out_of_the_plan() {
    let nodes = [
        node("done", "01", &["10.120.1.0/24"], "10.0.1.1").with_condition("False", "RouteCreated"),
        node("unmarked", "02", &["10.120.2.0/24"], "10.0.2.1"),
        node("missing", "03", &["10.120.3.0/24"], "10.0.3.1")
            .with_condition("False", "RouteCreated"),
        node("outside", "04", &["10.99.0.0/24"], "10.0.4.1")
            .with_condition("True", "InvalidPodCIDR"),
    ];
    let routes = [
        route("done", "10.120.1.0/24", &["10.0.1.1"], true),
        route("unmarked", "10.120.2.0/24", &["10.0.2.1"], true),
    ];
    let p = plan(&nodes, &routes, &cluster());
    let listed: Vec<&str> = p.nodes.iter().map(|n| n.node.as_str()).collect();
    // "done" and "outside" already say what the plan would write.
    assert_eq!(listed, ["unmarked", "missing"]);
    assert_eq!(
        p.nodes[0].condition_after(|_| false),
        Some(NetworkCondition::RouteCreated)
    );
    assert_eq!(p.nodes[1].creations, vec![p.creations[0].key()]);
    assert_eq!(
        p.nodes[1].condition_after(|_| true),
        Some(NetworkCondition::NoRouteCreated),
        "a failed creation still corrects the condition"
    );
}
