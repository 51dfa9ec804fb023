//! The planner (to be written).
use std::borrow::Borrow;

use crate::cidr::Cidr;
use crate::model::{Destination, NodeView, Route};
use crate::plan::{Plan, PlanConfig};

/// Whether a route with this destination is this cluster's to delete.
pub fn is_responsible_for_route(cluster_cidrs: &[Cidr], destination: &Destination) -> bool {
    let Some(c) = destination.cidr() else { return false };
    cluster_cidrs.iter().any(|cc| cc.contains(c.network()) || cc.contains(c.last()))
}

/// Computes the plan.
pub fn plan<N: Borrow<NodeView>>(_nodes: &[N], _routes: &[Route], _config: &PlanConfig) -> Plan {
    Plan::default()
}
