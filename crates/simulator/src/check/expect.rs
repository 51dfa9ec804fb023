//! What the cloud should hold, worked out from the Nodes alone.
//!
//! Deliberately independent of the planner (`route_core::plan`): checking the
//! controller against its own planning code would prove nothing. The rules
//! are the ones the issue states: one route per valid, conflict-free pod CIDR
//! lying inside a cluster CIDR, of every live Node, pointing at that Node's
//! instance (and carrying its addresses when the cloud reports them).

use std::borrow::Borrow;
use std::collections::BTreeMap;

use route_core::{Cidr, NodeAddress, NodeView, PodCidr, Route};

/// The route one pod CIDR of one Node should have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    /// The Node's name.
    pub node: String,
    /// Its `spec.providerID`: the instance the route must point at.
    pub provider_id: Option<String>,
    /// Its addresses, sorted (compared as a multiset).
    pub addresses: Vec<NodeAddress>,
}

/// One routable pod CIDR claim of one Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The Node's name.
    pub node: String,
    /// The pod CIDR.
    pub cidr: Cidr,
    /// Another Node claims an overlapping block.
    pub conflicted: bool,
}

/// The block lies entirely inside one of the cluster CIDRs.
pub fn in_cluster(cluster: &[Cidr], c: &Cidr) -> bool {
    cluster.iter().any(|cc| cc.covers(c))
}

/// Every valid pod CIDR inside the cluster CIDRs, per Node, with whether
/// another Node claims an overlapping block.
pub fn claims<N: Borrow<NodeView>>(nodes: &[N], cluster: &[Cidr]) -> Vec<Claim> {
    let mut out: Vec<Claim> = Vec::new();
    for n in nodes {
        let n = n.borrow();
        for c in &n.pod_cidrs {
            if let PodCidr::Valid(c) = c
                && in_cluster(cluster, c)
                && !out.iter().any(|x| x.node == n.name && x.cidr == *c)
            {
                out.push(Claim {
                    node: n.name.clone(),
                    cidr: *c,
                    conflicted: false,
                });
            }
        }
    }
    for i in 0..out.len() {
        let conflicted = out
            .iter()
            .any(|o| o.node != out[i].node && o.cidr.overlaps(&out[i].cidr));
        out[i].conflicted = conflicted;
    }
    out
}

/// The routes the Nodes need, by destination: conflict-free in-cluster pod
/// CIDRs of Nodes that have an instance to route to.
pub fn wants<N: Borrow<NodeView>>(nodes: &[N], cluster: &[Cidr]) -> BTreeMap<Cidr, Want> {
    let mut out = BTreeMap::new();
    for c in claims(nodes, cluster) {
        if c.conflicted {
            continue;
        }
        let Some(n) = nodes.iter().map(Borrow::borrow).find(|n| n.name == c.node) else {
            continue;
        };
        if n.provider_id.is_none() {
            continue;
        }
        let mut addresses = n.addresses.clone();
        addresses.sort();
        out.insert(
            c.cidr,
            Want {
                node: n.name.clone(),
                provider_id: n.provider_id.clone(),
                addresses,
            },
        );
    }
    out
}

/// The route is the one `want` describes: to that Node and its instance, not
/// a blackhole, and with its addresses when the cloud reports addresses.
pub fn points_at(route: &Route, want: &Want, reports_addresses: bool) -> bool {
    if route.blackhole
        || route.node != want.node.as_str()
        || route.node_provider_id.as_deref() != want.provider_id.as_deref()
    {
        return false;
    }
    if !reports_addresses {
        return true;
    }
    let mut a = route.node_addresses.clone();
    a.sort();
    a == want.addresses
}
