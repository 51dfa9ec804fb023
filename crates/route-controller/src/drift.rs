//! Drift: what changed in the cloud behind the controller's back.
//!
//! The controller keeps the route table it last saw (listed, plus its own
//! writes since) in every mode. When a full pass lists the cloud,
//! [`compare`] tells what someone else changed in between: a route of this
//! cluster deleted, pointed at another target, or otherwise changed. The
//! full pass repairs it like any other difference (the plan is made from the
//! listing); this module only names what was found, for the
//! `route_controller_drift_total` counter and the `RouteRepaired` Warning.
//! Pure: no I/O.

use std::collections::HashMap;

use route_core::{Destination, Route, Text};

/// What kind of change was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DriftKind {
    /// A route of this cluster is gone from the table.
    RouteMissing,
    /// A route of this cluster now points at another Node or at something
    /// that is not this cluster's.
    RouteForeign,
    /// A route of this cluster still names its Node but changed otherwise
    /// (its next hop, or it became a blackhole).
    RouteChanged,
    /// A forwarding prerequisite was found off on a routed Node.
    PrerequisiteLost,
}

impl DriftKind {
    /// Every kind, as the `kind` label shows them.
    pub const ALL: [DriftKind; 4] = [
        DriftKind::RouteMissing,
        DriftKind::RouteForeign,
        DriftKind::RouteChanged,
        DriftKind::PrerequisiteLost,
    ];

    /// The `kind` label of `route_controller_drift_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            DriftKind::RouteMissing => "route_missing",
            DriftKind::RouteForeign => "route_foreign",
            DriftKind::RouteChanged => "route_changed",
            DriftKind::PrerequisiteLost => "prerequisite_lost",
        }
    }

    /// What was found, for the operator reference.
    pub fn meaning(self) -> &'static str {
        match self {
            DriftKind::RouteMissing => "a route of this cluster is gone from the table",
            DriftKind::RouteForeign => {
                "a route of this cluster now points at another Node, or at something that is not this cluster's"
            }
            DriftKind::RouteChanged => {
                "a route of this cluster still names its Node but changed otherwise: its next hop, or it became a blackhole"
            }
            DriftKind::PrerequisiteLost => {
                "a routed Node's forwarding prerequisite was found off (AWS source/destination check, OpenStack allowed-address pair, GCE canIpForward, Azure IP forwarding)"
            }
        }
    }
}

/// One route found changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteDrift {
    /// What was found.
    pub kind: DriftKind,
    /// The route as the controller last saw it.
    pub was: Route,
    /// The route the listing shows in its place, if any.
    pub now: Option<Route>,
}

impl RouteDrift {
    /// A sentence for the Warning and the log ("the route to 10.244.1.0/24
    /// in rtb-1 was missing: ..."). A provider that lists a route as
    /// missing while its prerequisite is undone (OpenStack: the port's
    /// allowed address pair) is covered by the same words.
    pub fn describe(&self) -> String {
        let table = if self.was.table.is_empty() {
            String::new()
        } else {
            format!(" in {}", self.was.table)
        };
        let dest = &self.was.destination;
        match (&self.kind, &self.now) {
            (DriftKind::RouteForeign, Some(now)) => {
                let to = match &now.foreign {
                    Some(owner) => format!("{owner}'s target"),
                    None if now.node.is_empty() => format!("{:?}", now.next_hop.as_str()),
                    None => format!("node {}", now.node),
                };
                format!("the route to {dest}{table} was pointed at {to} by someone else")
            }
            (DriftKind::RouteChanged, Some(now)) if now.blackhole && !self.was.blackhole => {
                format!("the route to {dest}{table} became a blackhole")
            }
            (DriftKind::RouteChanged, Some(now)) => format!(
                "the next hop of the route to {dest}{table} changed from {:?} to {:?}",
                self.was.next_hop.as_str(),
                now.next_hop.as_str()
            ),
            _ => format!(
                "the route to {dest}{table} was missing: someone else deleted it, or undid what it needs on the Node's port or instance"
            ),
        }
    }
}

/// The routes of this cluster in `last` (the table as last seen) that
/// `listed` (the cloud now) shows deleted, retargeted or changed. Routes
/// that are not this cluster's (foreign, or naming no Node) are not
/// compared: they are not ours to keep.
pub fn compare(last: &[Route], listed: &[Route]) -> Vec<RouteDrift> {
    let mut by_key: HashMap<(&Text, &Destination), Vec<&Route>> =
        HashMap::with_capacity(listed.len());
    for r in listed {
        by_key
            .entry((&r.table, &r.destination))
            .or_default()
            .push(r);
    }
    let mut found = Vec::new();
    for was in last
        .iter()
        .filter(|r| r.foreign.is_none() && !r.node.is_empty())
    {
        let there = by_key
            .get(&(&was.table, &was.destination))
            .map(Vec::as_slice)
            .unwrap_or_default();
        let ours = there
            .iter()
            .find(|r| r.foreign.is_none() && r.node == was.node);
        let drift = match (ours, there.first()) {
            (Some(now), _) => {
                // A route this controller created is cached as it asked for
                // it; its next hop may be filled only by the listing.
                let hop_changed = !was.next_hop.is_empty()
                    && !now.next_hop.is_empty()
                    && was.next_hop != now.next_hop;
                if now.blackhole != was.blackhole || hop_changed {
                    Some((DriftKind::RouteChanged, Some((*now).clone())))
                } else {
                    None
                }
            }
            (None, Some(other)) => Some((DriftKind::RouteForeign, Some((*other).clone()))),
            (None, None) => Some((DriftKind::RouteMissing, None)),
        };
        if let Some((kind, now)) = drift {
            found.push(RouteDrift {
                kind,
                was: was.clone(),
                now,
            });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use route_core::Cidr;

    fn route(node: &str, cidr: &str, table: &str) -> Route {
        let mut r = Route::new(node, Cidr::parse(cidr).unwrap());
        r.table = table.into();
        r.next_hop = format!("i-{node}").into();
        r
    }

    fn kinds(found: &[RouteDrift]) -> Vec<(DriftKind, String)> {
        found
            .iter()
            .map(|d| (d.kind, d.was.node.to_string()))
            .collect()
    }

    #[test]
    fn an_unchanged_table_has_no_drift_whatever_the_order() {
        let a = route("a", "10.0.1.0/24", "rtb-1");
        let b = route("b", "10.0.2.0/24", "rtb-1");
        assert!(compare(&[a.clone(), b.clone()], &[b, a]).is_empty());
    }

    #[test]
    fn a_deleted_route_is_missing_in_its_own_table_only() {
        let a1 = route("a", "10.0.1.0/24", "rtb-1");
        let a2 = route("a", "10.0.1.0/24", "rtb-2");
        let found = compare(&[a1.clone(), a2], &[a1]);
        assert_eq!(kinds(&found), [(DriftKind::RouteMissing, "a".into())]);
        assert_eq!(found[0].was.table.as_str(), "rtb-2");
        assert_eq!(
            found[0].describe(),
            "the route to 10.0.1.0/24 in rtb-2 was missing: someone else deleted it, or undid what it needs on the Node's port or instance"
        );
    }

    #[test]
    fn a_route_pointed_elsewhere_is_foreign_and_names_where() {
        let a = route("a", "10.0.1.0/24", "");
        let mut b = route("b", "10.0.1.0/24", "");
        assert_eq!(
            kinds(&compare(std::slice::from_ref(&a), std::slice::from_ref(&b))),
            [(DriftKind::RouteForeign, "a".into())]
        );
        b.foreign = Some("cluster other".into());
        let found = compare(&[a], &[b]);
        assert_eq!(found[0].kind, DriftKind::RouteForeign);
        assert!(
            found[0].describe().contains("cluster other"),
            "{}",
            found[0].describe()
        );
    }

    #[test]
    fn a_changed_next_hop_or_a_blackhole_is_a_change_but_a_hop_only_the_listing_knows_is_not() {
        let a = route("a", "10.0.1.0/24", "");
        let mut hole = a.clone();
        hole.blackhole = true;
        assert_eq!(
            compare(std::slice::from_ref(&a), &[hole])[0].kind,
            DriftKind::RouteChanged
        );
        let mut moved = a.clone();
        moved.next_hop = "i-other".into();
        assert_eq!(
            compare(std::slice::from_ref(&a), &[moved])[0].kind,
            DriftKind::RouteChanged
        );
        let mut created = a.clone();
        created.next_hop = "".into();
        assert!(compare(&[created], &[a]).is_empty());
    }

    #[test]
    fn routes_that_are_not_ours_are_not_compared() {
        let mut other = route("", "10.0.9.0/24", "");
        other.foreign = Some("cluster other".into());
        assert!(compare(&[other], &[]).is_empty());
    }
}
