//! Which Node a next hop belongs to.
//!
//! A Neutron route is only `destination` + `nexthop`; the router knows
//! nothing of Kubernetes. The provider therefore keeps two maps:
//!
//! * [`NodeAddressIndex`], the Nodes' current addresses, fed by the
//!   controller from its Node watch (shared through an `Arc`, so the
//!   controller keeps feeding it after handing the provider over as a
//!   `dyn CloudRoutes`);
//! * the targets it created itself (next hop → node name and the addresses
//!   the controller gave for it), so a route stays attributed to its Node
//!   after the Node is deleted or changes address, until the route is gone.
//!
//! The provider owns both; nothing here does I/O.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::RwLock;

use route_core::{NodeAddress, NodeView};

/// The Nodes' current addresses, keyed both ways. Cheap to share and update.
#[derive(Debug, Default)]
pub struct NodeAddressIndex {
    inner: RwLock<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Set once the controller has given a complete snapshot.
    populated: bool,
    by_node: HashMap<String, Vec<NodeAddress>>,
    by_ip: HashMap<IpAddr, String>,
}

impl State {
    fn index_node(&mut self, name: &str, addresses: &[NodeAddress]) {
        for ip in internal_ips(addresses) {
            self.by_ip.insert(ip, name.to_string());
        }
    }

    fn unindex_node(&mut self, name: &str) {
        if let Some(old) = self.by_node.get(name) {
            for ip in internal_ips(old) {
                if self.by_ip.get(&ip).is_some_and(|n| n == name) {
                    self.by_ip.remove(&ip);
                }
            }
        }
    }
}

/// The parsed `InternalIP` addresses of a Node (the only kind a route's next
/// hop is made from).
pub fn internal_ips(addresses: &[NodeAddress]) -> impl Iterator<Item = IpAddr> + '_ {
    addresses
        .iter()
        .filter(|a| a.kind == "InternalIP")
        .filter_map(|a| a.address.trim().parse::<IpAddr>().ok())
}

impl NodeAddressIndex {
    /// An empty index that has not seen a snapshot yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces the whole index with a complete snapshot of the Nodes and marks
    /// it populated.
    pub fn replace_all<I, S>(&self, nodes: I)
    where
        I: IntoIterator<Item = (S, Vec<NodeAddress>)>,
        S: Into<String>,
    {
        let mut s = self.write();
        s.by_node.clear();
        s.by_ip.clear();
        for (name, addrs) in nodes {
            let name = name.into();
            s.index_node(&name, &addrs);
            s.by_node.insert(name, addrs);
        }
        s.populated = true;
    }

    /// [`replace_all`](Self::replace_all) from the controller's node views.
    pub fn replace_from_views<'a>(&self, nodes: impl IntoIterator<Item = &'a NodeView>) {
        self.replace_all(
            nodes
                .into_iter()
                .map(|n| (n.name.clone(), n.addresses.clone())),
        );
    }

    /// Adds or updates one Node.
    pub fn upsert(&self, name: &str, addresses: Vec<NodeAddress>) {
        let mut s = self.write();
        s.unindex_node(name);
        s.index_node(name, &addresses);
        s.by_node.insert(name.to_string(), addresses);
    }

    /// Forgets one Node.
    pub fn remove(&self, name: &str) {
        let mut s = self.write();
        s.unindex_node(name);
        s.by_node.remove(name);
    }

    /// Whether a complete snapshot has been given, so "no Node has this
    /// address" can be trusted.
    pub fn is_populated(&self) -> bool {
        self.read().populated
    }

    /// The Node whose InternalIP is `ip`, with its addresses.
    pub fn node_for(&self, ip: IpAddr) -> Option<(String, Vec<NodeAddress>)> {
        let s = self.read();
        let name = s.by_ip.get(&ip)?;
        Some((
            name.clone(),
            s.by_node.get(name).cloned().unwrap_or_default(),
        ))
    }

    /// A Node's current addresses, if it is known.
    pub fn addresses_of(&self, name: &str) -> Option<Vec<NodeAddress>> {
        self.read().by_node.get(name).cloned()
    }
}

/// What the provider remembers about next hops it created routes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Learned {
    pub node: String,
    pub addresses: Vec<NodeAddress>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn maps_internal_ips_only_and_follows_updates() {
        let idx = NodeAddressIndex::new();
        assert!(!idx.is_populated());
        idx.replace_all([(
            "n1",
            vec![
                NodeAddress::internal_ip("10.0.0.5"),
                NodeAddress {
                    kind: "ExternalIP".into(),
                    address: "203.0.113.5".into(),
                },
            ],
        )]);
        assert!(idx.is_populated());
        assert_eq!(idx.node_for(ip("10.0.0.5")).unwrap().0, "n1");
        assert!(
            idx.node_for(ip("203.0.113.5")).is_none(),
            "external IPs are no next hops"
        );

        idx.upsert("n1", vec![NodeAddress::internal_ip("10.0.0.6")]);
        assert!(
            idx.node_for(ip("10.0.0.5")).is_none(),
            "old address forgotten"
        );
        assert_eq!(idx.node_for(ip("10.0.0.6")).unwrap().0, "n1");

        idx.upsert("n2", vec![NodeAddress::internal_ip("10.0.0.5")]);
        idx.remove("n1");
        assert!(idx.node_for(ip("10.0.0.6")).is_none());
        assert_eq!(idx.node_for(ip("10.0.0.5")).unwrap().0, "n2");
        assert!(idx.addresses_of("n1").is_none());
    }

    #[test]
    fn removing_a_node_keeps_an_address_another_node_took_over() {
        let idx = NodeAddressIndex::new();
        idx.upsert("old", vec![NodeAddress::internal_ip("10.0.0.7")]);
        idx.upsert("new", vec![NodeAddress::internal_ip("10.0.0.7")]);
        idx.remove("old");
        assert_eq!(idx.node_for(ip("10.0.0.7")).unwrap().0, "new");
    }

    #[test]
    fn unparsable_addresses_are_ignored() {
        let idx = NodeAddressIndex::new();
        idx.upsert("n", vec![NodeAddress::internal_ip("not-an-ip")]);
        assert_eq!(idx.addresses_of("n").unwrap().len(), 1);
        assert!(idx.node_for(ip("10.0.0.1")).is_none());
    }
}
