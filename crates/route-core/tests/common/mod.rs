//! Helpers shared by the planner's integration tests: fixtures and a plan
//! applier that behaves like a cloud that executes every operation.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use route_core::{Cidr, NodeAddress, NodeView, Plan, PlanConfig, Route};

pub fn cidr(s: &str) -> Cidr {
    Cidr::parse(s).unwrap_or_else(|e| panic!("bad fixture {s:?}: {e}"))
}

pub fn config(cidrs: &[&str]) -> PlanConfig {
    PlanConfig {
        cluster_cidrs: cidrs.iter().map(|c| cidr(c)).collect(),
        ..PlanConfig::default()
    }
}

pub fn internal(ip: &str) -> Vec<NodeAddress> {
    vec![NodeAddress::internal_ip(ip)]
}

pub fn node(name: &str, uid: &str, pod_cidrs: &[&str], ip: &str) -> NodeView {
    NodeView::new(name, uid, pod_cidrs).with_addresses(internal(ip))
}

/// A route as a provider would list it.
pub fn route(target: &str, dest: &str, addrs: &[&str], enable: bool) -> Route {
    Route::from_text(target, dest).with_addresses(
        addrs.iter().map(|a| NodeAddress::internal_ip(*a)).collect(),
        enable,
    )
}

/// The route table after every operation of `plan` succeeded: each deleted
/// route removed once, each creation appended.
pub fn apply(plan: &Plan, routes: &[Route]) -> Vec<Route> {
    let mut out: Vec<Route> = routes.to_vec();
    for d in &plan.deletions {
        let pos = out
            .iter()
            .position(|r| *r == d.route)
            .unwrap_or_else(|| panic!("plan deletes a route that is not listed: {:?}", d.route));
        out.remove(pos);
    }
    for c in &plan.creations {
        if let Some(replaced) = &c.replaces {
            let pos = out.iter().position(|r| r == replaced).unwrap_or_else(|| {
                panic!("plan replaces a route that is not listed: {replaced:?}")
            });
            out.remove(pos);
        }
        out.push(c.route.clone());
    }
    out
}

/// What upstream's `routeListEqual` compares: node, destination and the
/// address set, regardless of order and of everything else.
pub fn comparable(routes: &[Route]) -> Vec<(String, String, Vec<NodeAddress>)> {
    let mut v: Vec<_> = routes
        .iter()
        .map(|r| {
            let mut a = r.node_addresses.clone();
            a.sort();
            a.dedup();
            (r.node.to_string(), r.destination.to_string(), a)
        })
        .collect();
    v.sort();
    v
}
