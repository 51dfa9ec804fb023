//! Instance id ↔ node name, learned from the Nodes themselves.
//!
//! EC2 routes name an instance; the controller thinks in node names. Every
//! Node carries its instance in `spec.providerID` (`aws:///<zone>/<id>`), so
//! the provider learns the mapping from the nodes the controller shows it
//! ([`route_cloud::CloudRoutes::observe_nodes`]) and from its own creations,
//! instead of asking EC2 with `DescribeInstances` on every list.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::collections::hash_map::Entry;

use route_core::NodeView;

/// The instance id in a Node's `spec.providerID`: `aws:///<zone>/<id>`,
/// `aws:////<id>` or a bare `i-...`. `None` for anything else (Fargate ids,
/// other clouds, malformed text).
pub fn instance_id_from_provider_id(provider_id: &str) -> Option<&str> {
    let id = match provider_id.strip_prefix("aws://") {
        Some(rest) => rest.rsplit('/').next()?,
        None if !provider_id.contains('/') => provider_id,
        None => return None,
    };
    is_instance_id(id).then_some(id)
}

/// `i-` followed by 8 or 17 lowercase hex digits (EC2's two id lengths), or
/// any other length of hex digits that emulators use.
pub fn is_instance_id(s: &str) -> bool {
    s.strip_prefix("i-").is_some_and(|h| {
        !h.is_empty()
            && h.len() <= 32
            && h.chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    })
}

/// The mapping, with where each entry came from.
#[derive(Debug, Default)]
pub struct NodeIndex {
    /// From the latest set of nodes the controller showed.
    observed: HashMap<String, String>,
    /// The `spec.providerID` of each observed instance's Node, as the Node
    /// spells it: a listed route carries the same text a created one does.
    observed_provider_ids: HashMap<String, String>,
    /// From creations and name lookups; kept across observations while the
    /// node still exists, so a node without a provider id keeps its routes.
    learned: HashMap<String, String>,
    /// `observe` has been called at least once.
    has_observed: bool,
}

impl NodeIndex {
    /// Replaces the observed part with `nodes`, dropping learned entries of
    /// nodes that no longer exist.
    pub fn observe<N: Borrow<NodeView>>(&mut self, nodes: &[N]) {
        let mut observed = HashMap::with_capacity(nodes.len());
        let mut provider_ids = HashMap::with_capacity(nodes.len());
        for n in nodes {
            let n = n.borrow();
            let Some(pid) = n.provider_id.as_deref() else {
                continue;
            };
            if let Some(id) = instance_id_from_provider_id(pid) {
                // Two nodes naming one instance: the first keeps it, so the
                // answer does not depend on hash order.
                if let Entry::Vacant(e) = observed.entry(id.to_string()) {
                    e.insert(n.name.clone());
                    provider_ids.insert(id.to_string(), pid.to_string());
                }
            }
        }
        let names: std::collections::HashSet<&str> =
            nodes.iter().map(|n| n.borrow().name.as_str()).collect();
        // A Node re-created under the same name on a new instance names that
        // instance in its providerID: what was learned of the old one no
        // longer holds, and its routes must not pass for the new Node's.
        let current: HashMap<&str, &str> = observed
            .iter()
            .map(|(i, n)| (n.as_str(), i.as_str()))
            .collect();
        self.learned.retain(|instance, node| {
            names.contains(node.as_str())
                && current
                    .get(node.as_str())
                    .is_none_or(|i| *i == instance.as_str())
        });
        self.observed = observed;
        self.observed_provider_ids = provider_ids;
        self.has_observed = true;
    }

    /// Records that `instance` is `node` (a creation or a lookup said so).
    pub fn learn(&mut self, instance: &str, node: &str) {
        if node.is_empty() {
            return;
        }
        self.learned.insert(instance.to_string(), node.to_string());
    }

    /// The node of `instance`, if known.
    pub fn node_of(&self, instance: &str) -> Option<&str> {
        self.observed
            .get(instance)
            .or_else(|| self.learned.get(instance))
            .map(String::as_str)
    }

    /// The `spec.providerID` of the observed Node on `instance`, if any.
    pub fn provider_id_of(&self, instance: &str) -> Option<&str> {
        self.observed_provider_ids.get(instance).map(String::as_str)
    }

    /// The instances of the observed Nodes.
    pub fn observed_instances(&self) -> impl Iterator<Item = &str> {
        self.observed.keys().map(String::as_str)
    }

    /// The instance of `node`, if known.
    pub fn instance_of(&self, node: &str) -> Option<&str> {
        self.observed
            .iter()
            .chain(self.learned.iter())
            .find(|(_, n)| n.as_str() == node)
            .map(|(i, _)| i.as_str())
    }

    /// Whether the controller has shown the provider its nodes yet. Until
    /// then an unknown instance may well be a node, not a stranger.
    pub fn has_observed(&self) -> bool {
        self.has_observed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_recreated_on_a_new_instance_forgets_the_old_instance() {
        // Regression: a route to the old instance kept passing for the
        // re-created Node's, so it was never replaced.
        let mut idx = NodeIndex::default();
        idx.learn("i-0aaa", "node-1");
        let n = NodeView::new("node-1", "uid-2", &["10.0.1.0/24"])
            .with_provider_id("aws:///eu-west-1a/i-0bbb");
        idx.observe(&[n]);
        assert_eq!(idx.node_of("i-0aaa"), None);
        assert_eq!(idx.node_of("i-0bbb"), Some("node-1"));
        assert_eq!(idx.instance_of("node-1"), Some("i-0bbb"));
    }

    #[test]
    fn parses_the_provider_id_forms() {
        assert_eq!(
            instance_id_from_provider_id("aws:///us-east-1a/i-0123456789abcdef0"),
            Some("i-0123456789abcdef0")
        );
        assert_eq!(
            instance_id_from_provider_id("aws:////i-12345678"),
            Some("i-12345678")
        );
        assert_eq!(
            instance_id_from_provider_id("i-12345678"),
            Some("i-12345678")
        );
        for bad in [
            "",
            "aws://",
            "aws:///us-east-1a/",
            "aws:///us-east-1a/fargate-ip-10-0-0-1",
            "hcloud://123",
            "gce://p/z/i-12345678x",
            "aws:///us-east-1a/i-XYZ",
            "i-",
            "foo/i-12345678",
        ] {
            assert_eq!(instance_id_from_provider_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn observation_replaces_and_prunes() {
        let mut ix = NodeIndex::default();
        assert!(!ix.has_observed());
        ix.learn("i-0000000a", "a");
        ix.learn("i-0000000c", "c");
        let nodes = [
            NodeView::new("a", "ua", &[]),
            NodeView::new("b", "ub", &[]).with_provider_id("aws:///z/i-0000000b"),
            NodeView::new("b2", "ub2", &[]).with_provider_id("aws:///z/i-0000000b"),
        ];
        ix.observe(&nodes);
        assert!(ix.has_observed());
        assert_eq!(ix.node_of("i-0000000b"), Some("b"), "first claimant wins");
        assert_eq!(
            ix.node_of("i-0000000a"),
            Some("a"),
            "learned, node still there"
        );
        assert_eq!(ix.node_of("i-0000000c"), None, "node c is gone");
        assert_eq!(ix.instance_of("b"), Some("i-0000000b"));
        assert_eq!(ix.provider_id_of("i-0000000b"), Some("aws:///z/i-0000000b"));
        assert_eq!(ix.provider_id_of("i-0000000a"), None, "learned only");
        ix.observe::<NodeView>(&[]);
        assert_eq!(ix.provider_id_of("i-0000000b"), None);
        assert_eq!(ix.node_of("i-0000000b"), None);
        assert_eq!(ix.node_of("i-0000000a"), None);
    }
}
