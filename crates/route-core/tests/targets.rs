//! Several route targets per cluster (AWS route tables, OpenStack routers):
//! every Node's route in every target, stale routes deleted where they are,
//! foreign targets untouched, and a Node routed only when all targets are.

mod common;

use common::{apply, config, node, route};
use route_core::{
    CreationReason, DeletionReason, NetworkCondition, NodeView, PlanConfig, Route, Text, plan,
};

const TABLES: [&str; 3] = ["rtb-a", "rtb-b", "rtb-c"];

fn three_tables() -> PlanConfig {
    PlanConfig {
        tables: TABLES.iter().map(|t| Text::from(*t)).collect(),
        ..config(&["10.120.0.0/16"])
    }
}

fn in_table(r: Route, t: &str) -> Route {
    r.in_table(t)
}

fn nodes(n: usize) -> Vec<NodeView> {
    (0..n)
        .map(|i| {
            node(
                &format!("n{i}"),
                &format!("uid-{i}"),
                &[format!("10.120.{i}.0/24").as_str()],
                &format!("10.0.0.{i}"),
            )
        })
        .collect()
}

fn per_table(routes: &[Route]) -> Vec<(String, usize)> {
    TABLES
        .iter()
        .map(|t| {
            (
                t.to_string(),
                routes.iter().filter(|r| r.table.as_str() == *t).count(),
            )
        })
        .collect()
}

#[test]
fn every_node_is_routed_in_every_table_and_then_nothing_is_planned() {
    let nodes = nodes(4);
    let p = plan(&nodes, &[], &three_tables());
    assert_eq!(p.creations.len(), 12);
    let table = apply(&p, &[]);
    assert_eq!(
        per_table(&table),
        TABLES.map(|t| (t.to_string(), 4)).to_vec()
    );
    assert!(
        p.nodes.iter().all(|n| n.creations.len() == 3),
        "each Node waits for its three creations"
    );
    let again = plan(&nodes, &table, &three_tables());
    assert!(again.is_noop(), "{again:?}");
}

#[test]
fn a_deleted_node_loses_its_route_in_every_table_and_a_foreign_table_is_untouched() {
    let nodes = nodes(2);
    let mut table = apply(&plan(&nodes, &[], &three_tables()), &[]);
    for t in TABLES {
        table.push(in_table(route("gone", "10.120.9.0/24", &[], false), t));
    }
    // A table of another cluster (or one no longer tagged for this one).
    table.push(in_table(
        route("gone", "10.120.9.0/24", &[], false),
        "rtb-other",
    ));
    let p = plan(&nodes, &table, &three_tables());
    let deleted: Vec<&str> = p.deletions.iter().map(|d| d.route.table.as_str()).collect();
    assert_eq!(deleted, TABLES);
    assert!(
        p.deletions
            .iter()
            .all(|d| d.reason == DeletionReason::NodeGone)
    );
    assert!(p.creations.is_empty());
}

#[test]
fn a_node_missing_from_one_table_is_routed_only_when_that_table_has_it() {
    let nodes = nodes(1)
        .into_iter()
        .map(|n| n.with_condition("False", "RouteCreated"))
        .collect::<Vec<_>>();
    let full = apply(&plan(&nodes, &[], &three_tables()), &[]);
    // rtb-b lost the route behind the controller's back.
    let partial: Vec<Route> = full
        .into_iter()
        .filter(|r| r.table.as_str() != "rtb-b")
        .collect();
    let p = plan(&nodes, &partial, &three_tables());
    assert_eq!(p.creations.len(), 1);
    assert_eq!(p.creations[0].route.table.as_str(), "rtb-b");
    assert_eq!(p.creations[0].reason, CreationReason::Missing);
    let n = &p.nodes[0];
    assert_eq!(
        n.condition_after(|_| true),
        Some(NetworkCondition::NoRouteCreated),
        "its route in rtb-b failed: not routed"
    );
    assert_eq!(n.condition_after(|_| false), None, "routed in all three");
}

#[test]
fn a_node_unroutable_in_one_table_is_not_routed_although_the_others_are_settled() {
    // Two Nodes claim one CIDR: the claimant keeps the routes it has and
    // no competing one is created. n0 has its route in rtb-a and rtb-c
    // only; rtb-b cannot get one while the conflict lasts.
    let nodes = vec![
        node("n0", "uid-0", &["10.120.0.0/24"], "10.0.0.1")
            .with_condition("True", "PodCIDRConflict"),
        node("n1", "uid-1", &["10.120.0.0/24"], "10.0.0.2"),
    ];
    let routes = vec![
        in_table(route("n0", "10.120.0.0/24", &[], false), "rtb-a"),
        in_table(route("n0", "10.120.0.0/24", &[], false), "rtb-c"),
    ];
    let p = plan(&nodes, &routes, &three_tables());
    assert!(p.creations.is_empty());
    assert_eq!(p.conflicts.len(), 1, "reported once, not per table");
    let n0 = p.nodes.iter().find(|n| n.node == "n0");
    assert!(
        n0.is_none_or(|n| n.condition_after(|_| false).is_none()),
        "n0 keeps PodCIDRConflict: {n0:?}"
    );
}

#[test]
fn a_blackhole_in_one_table_is_replaced_there_after_its_deletion() {
    let nodes = nodes(1);
    let mut table = apply(&plan(&nodes, &[], &three_tables()), &[]);
    let hole = table
        .iter_mut()
        .find(|r| r.table.as_str() == "rtb-c")
        .expect("a route in rtb-c");
    hole.blackhole = true;
    let p = plan(&nodes, &table, &three_tables());
    assert_eq!(p.deletions.len(), 1);
    assert_eq!(p.deletions[0].route.table.as_str(), "rtb-c");
    assert_eq!(p.creations.len(), 1);
    let c = &p.creations[0];
    assert_eq!(c.route.table.as_str(), "rtb-c");
    assert_eq!(
        c.after,
        vec![p.deletions[0].key()],
        "it waits for the deletion in its own table"
    );
}

#[test]
fn one_configured_target_plans_like_the_untargeted_table() {
    let nodes = nodes(3);
    let one = PlanConfig {
        tables: vec![Text::from("rtb-a")],
        ..config(&["10.120.0.0/16"])
    };
    let p = plan(&nodes, &[], &one);
    let plain = plan(&nodes, &[], &config(&["10.120.0.0/16"]));
    assert_eq!(p.creations.len(), plain.creations.len());
    assert!(
        p.creations
            .iter()
            .all(|c| c.route.table.as_str() == "rtb-a")
    );
    // The same outcomes; only the table in each creation's key differs.
    let untabled = |nodes: &[route_core::NodePlan]| {
        let mut nodes = nodes.to_vec();
        for n in &mut nodes {
            for k in &mut n.creations {
                if let route_core::OpKey::Create { table, .. } = k {
                    *table = Text::default();
                }
            }
        }
        nodes
    };
    assert_eq!(untabled(&p.nodes), untabled(&plain.nodes));
}
