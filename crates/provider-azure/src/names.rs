//! Route names: Azure routes carry no tags or description, so the name is
//! the only place that says which Node a route is for. The formats are the
//! upstream Azure cloud provider's (`cloud-provider-azure`,
//! `pkg/provider/azure_routes.go`, `mapNodeNameToRouteName` and
//! `MapRouteNameToNodeName`; separator `____` from `pkg/consts`), so a table
//! written by upstream's route controller is read as this cluster's and the
//! other way round:
//!
//! - single-stack: the route name is the node name;
//! - dual-stack: `<node>____<cidr>` with `:`, `.` and `/` removed from the
//!   CIDR (upstream's `cidrtoRfc1035`).

/// Between the node name and the CIDR in a dual-stack name.
pub const SEPARATOR: &str = "____";

/// The CIDR as upstream puts it into a name: `:`, `.` and `/` removed.
pub fn cidr_to_rfc1035(cidr: &str) -> String {
    cidr.chars()
        .filter(|c| !matches!(c, ':' | '.' | '/'))
        .collect()
}

/// The name of the route for `node` and `cidr`.
pub fn route_name(dual_stack: bool, node: &str, cidr: &str) -> String {
    if dual_stack {
        format!("{node}{SEPARATOR}{}", cidr_to_rfc1035(cidr))
    } else {
        node.to_string()
    }
}

/// The node a route of this cluster's format names, given the route's
/// address prefix; `None` when the name is not one this cluster writes.
///
/// Stricter than upstream's `MapRouteNameToNodeName`, which takes any name:
/// a dual-stack name must carry exactly this route's prefix, and the node
/// part must be a valid Kubernetes node name (a DNS-1123 subdomain), so a
/// hand-made route such as `Default-Route` or `to_firewall` is never taken
/// for a Node's.
pub fn node_of(name: &str, address_prefix: &str) -> Option<String> {
    let node = match name.split_once(SEPARATOR) {
        Some((node, suffix)) => {
            if suffix != cidr_to_rfc1035(address_prefix) {
                return None;
            }
            node
        }
        None => name,
    };
    is_node_name(node).then(|| node.to_string())
}

/// A DNS-1123 subdomain: what the API server accepts as a Node name.
fn is_node_name(s: &str) -> bool {
    if s.is_empty() || s.len() > 253 {
        return false;
    }
    s.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_upstreams() {
        assert_eq!(
            route_name(false, "aks-pool-1", "10.244.1.0/24"),
            "aks-pool-1"
        );
        assert_eq!(
            route_name(true, "aks-pool-1", "10.244.1.0/24"),
            "aks-pool-1____102441024"
        );
        assert_eq!(
            route_name(true, "n1", "fd00:10:244:1::/64"),
            "n1____fd0010244164"
        );
    }

    #[test]
    fn names_map_back_to_their_node_only_in_this_clusters_formats() {
        assert_eq!(
            node_of("aks-pool-1", "10.244.1.0/24").as_deref(),
            Some("aks-pool-1")
        );
        assert_eq!(
            node_of("n1____102441024", "10.244.1.0/24").as_deref(),
            Some("n1")
        );
        assert_eq!(node_of("n1____102441024", "10.244.2.0/24"), None);
        assert_eq!(node_of("Default-Route", "0.0.0.0/0"), None);
        assert_eq!(node_of("to_firewall", "10.0.0.0/8"), None);
        assert_eq!(node_of("", "10.0.0.0/8"), None);
        assert_eq!(node_of("-x", "10.0.0.0/8"), None);
        assert_eq!(
            node_of("node.example.com", "10.244.1.0/24").as_deref(),
            Some("node.example.com")
        );
    }
}
