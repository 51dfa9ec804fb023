//! The configuration check: the controller's own settings held against what
//! the cluster shows, before any plan is carried out.
//!
//! A pod CIDR outside `--cluster-cidr` on one Node is that Node's problem
//! (`InvalidPodCIDR`). The same on most Nodes is the controller's problem:
//! `--cluster-cidr` is not the cluster's, and writing `NetworkUnavailable=True`
//! on every Node would taint them all `NoSchedule` for a typo. So is a
//! `--node-selector` that leaves every Node out, or `--route-ip-families`
//! that leaves out every pod CIDR the Nodes carry. [`check_configuration`]
//! tells these apart; the controller then carries out nothing of the plan
//! (no route change, no condition) until the Nodes or the flags agree.

use std::borrow::Borrow;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::cidr::{Cidr, IpFamily};
use crate::model::{NodeView, PodCidr};
use crate::plan::PlanConfig;
use crate::planner::routable_pod_cidr;

/// How many of the Nodes' CIDRs a message quotes.
const QUOTED: usize = 5;

/// A setting of the controller that disagrees with the whole cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "check")]
pub enum Misconfiguration {
    /// Of the Nodes with pod CIDRs of `family`, no more than half have them
    /// inside `--cluster-cidr`.
    ClusterCidr {
        /// The address family checked.
        family: IpFamily,
        /// `--cluster-cidr` of that family (empty: none configured).
        configured: Vec<Cidr>,
        /// Nodes whose pod CIDRs of the family lie inside it.
        inside: usize,
        /// Nodes with pod CIDRs of the family.
        nodes: usize,
        /// Some of the pod CIDRs that lie outside, in Node order.
        outside: Vec<Cidr>,
    },
    /// The Nodes carry pod CIDRs, but none of a family this controller
    /// routes (`--route-ip-families`).
    RouteIpFamilies {
        /// The families routed.
        routed: Vec<IpFamily>,
        /// The families the Nodes' pod CIDRs are of.
        seen: Vec<IpFamily>,
    },
    /// `--node-selector` leaves every Node out.
    NodeSelector {
        /// Nodes in the cluster.
        nodes: usize,
    },
}

impl Misconfiguration {
    /// The flag to look at.
    pub fn flag(&self) -> &'static str {
        match self {
            Misconfiguration::ClusterCidr { .. } => "--cluster-cidr",
            Misconfiguration::RouteIpFamilies { .. } => "--route-ip-families",
            Misconfiguration::NodeSelector { .. } => "--node-selector",
        }
    }

    /// A short name for labels and logs: `cluster_cidr`, `route_ip_families`
    /// or `node_selector`.
    pub fn check(&self) -> &'static str {
        match self {
            Misconfiguration::ClusterCidr { .. } => "cluster_cidr",
            Misconfiguration::RouteIpFamilies { .. } => "route_ip_families",
            Misconfiguration::NodeSelector { .. } => "node_selector",
        }
    }

    /// Every value of [`Misconfiguration::check`].
    pub const CHECKS: [&'static str; 3] = ["cluster_cidr", "route_ip_families", "node_selector"];
}

impl fmt::Display for Misconfiguration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |v: &[Cidr]| {
            v.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        match self {
            Misconfiguration::ClusterCidr {
                family,
                configured,
                inside,
                nodes,
                outside,
            } => {
                let configured = if configured.is_empty() {
                    format!("has no {family} CIDR")
                } else {
                    format!("is {}", list(configured))
                };
                let more = if *nodes - *inside > outside.len() {
                    ", ..."
                } else {
                    ""
                };
                write!(
                    f,
                    "--cluster-cidr {configured}, but only {inside} of the {nodes} Nodes with {family} pod CIDRs have them inside it (the Nodes carry {}{more}): set --cluster-cidr to the cluster's (kube-controller-manager's --cluster-cidr){}",
                    list(outside),
                    if *family == IpFamily::V6 {
                        ", or route IPv4 alone with --route-ip-families=IPv4"
                    } else {
                        ""
                    }
                )
            }
            Misconfiguration::RouteIpFamilies { routed, seen } => {
                let names = |v: &[IpFamily]| {
                    v.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                };
                write!(
                    f,
                    "--route-ip-families is {}, but the Nodes' pod CIDRs are {}: set --route-ip-families to the cluster's families",
                    names(routed),
                    names(seen)
                )
            }
            Misconfiguration::NodeSelector { nodes } => write!(
                f,
                "--node-selector leaves out every one of the {nodes} Nodes: check the selector's spelling against the Nodes' labels"
            ),
        }
    }
}

/// Holds the settings in `config` against the Nodes. `None` when they
/// agree, or when the Nodes say nothing yet (no Node, no pod CIDR).
///
/// The cluster CIDR disagrees when, for some routed family, no more than
/// half of the Nodes with pod CIDRs of that family have them all inside it:
/// a Node or two that IPAM got wrong are a minority and read
/// `InvalidPodCIDR` as before; half the cluster is a setting that is wrong.
pub fn check_configuration<N: Borrow<NodeView>>(
    nodes: &[N],
    config: &PlanConfig,
) -> Option<Misconfiguration> {
    let named: Vec<&NodeView> = nodes
        .iter()
        .map(Borrow::borrow)
        .filter(|n| !n.name.is_empty())
        .collect();
    if named.is_empty() {
        return None;
    }
    if named.iter().all(|n| n.excluded) {
        return Some(Misconfiguration::NodeSelector { nodes: named.len() });
    }
    let valid = |n: &&NodeView| -> Vec<Cidr> {
        n.pod_cidrs
            .iter()
            .filter_map(|p| match p {
                PodCidr::Valid(c) => Some(*c),
                PodCidr::Invalid(_) => None,
            })
            .collect()
    };
    let selected: Vec<(&NodeView, Vec<Cidr>)> = named
        .iter()
        .filter(|n| !n.excluded)
        .map(|n| (*n, valid(n)))
        .filter(|(_, c)| !c.is_empty())
        .collect();
    let mut seen: Vec<IpFamily> = Vec::new();
    for (_, cidrs) in &selected {
        for c in cidrs {
            if !seen.contains(&c.family()) {
                seen.push(c.family());
            }
        }
    }
    seen.sort();
    if !seen.is_empty() && seen.iter().all(|f| !config.routes_family(*f)) {
        let routed = [IpFamily::V4, IpFamily::V6]
            .into_iter()
            .filter(|f| config.routes_family(*f))
            .collect();
        return Some(Misconfiguration::RouteIpFamilies { routed, seen });
    }
    for family in seen.into_iter().filter(|f| config.routes_family(*f)) {
        let mut nodes = 0;
        let mut inside = 0;
        let mut outside = Vec::new();
        for (_, cidrs) in &selected {
            let of: Vec<&Cidr> = cidrs.iter().filter(|c| c.family() == family).collect();
            if of.is_empty() {
                continue;
            }
            nodes += 1;
            let mut all_inside = true;
            for c in of {
                if !routable_pod_cidr(&config.cluster_cidrs, c) {
                    all_inside = false;
                    if outside.len() < QUOTED && !outside.contains(c) {
                        outside.push(*c);
                    }
                }
            }
            if all_inside {
                inside += 1;
            }
        }
        if inside * 2 <= nodes {
            let configured = config
                .cluster_cidrs
                .iter()
                .filter(|c| c.family() == family)
                .copied()
                .collect();
            return Some(Misconfiguration::ClusterCidr {
                family,
                configured,
                inside,
                nodes,
                outside,
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    fn node(name: &str, cidrs: &[&str]) -> NodeView {
        NodeView::new(name, name, cidrs)
    }

    fn config(cidrs: &[&str]) -> PlanConfig {
        PlanConfig {
            cluster_cidrs: cidrs.iter().map(|s| c(s)).collect(),
            ..PlanConfig::default()
        }
    }

    #[test]
    fn a_k3s_cluster_under_the_charts_old_default_cluster_cidr_is_a_configuration_error() {
        let nodes: Vec<NodeView> = (1..=10)
            .map(|i| node(&format!("n{i}"), &[&format!("10.42.{i}.0/24")]))
            .collect();
        let m = check_configuration(&nodes, &config(&["10.244.0.0/16"])).unwrap();
        assert_eq!(m.flag(), "--cluster-cidr");
        let text = m.to_string();
        assert!(text.contains("--cluster-cidr is 10.244.0.0/16"), "{text}");
        assert!(text.contains("only 0 of the 10 Nodes"), "{text}");
        assert!(text.contains("10.42.1.0/24,10.42.2.0/24"), "{text}");
        assert!(text.ends_with("--cluster-cidr)"), "{text}");
    }

    #[test]
    fn one_node_of_ten_outside_is_that_nodes_problem_half_is_the_settings() {
        let mut nodes: Vec<NodeView> = (1..=9)
            .map(|i| node(&format!("n{i}"), &[&format!("10.244.{i}.0/24")]))
            .collect();
        nodes.push(node("odd", &["10.99.0.0/24"]));
        assert_eq!(
            check_configuration(&nodes, &config(&["10.244.0.0/16"])),
            None
        );
        let half: Vec<NodeView> = (1..=4)
            .map(|i| node(&format!("in{i}"), &[&format!("10.244.{i}.0/24")]))
            .chain((1..=4).map(|i| node(&format!("out{i}"), &[&format!("10.99.{i}.0/24")])))
            .collect();
        assert!(matches!(
            check_configuration(&half, &config(&["10.244.0.0/16"])),
            Some(Misconfiguration::ClusterCidr {
                inside: 4,
                nodes: 8,
                ..
            })
        ));
    }

    #[test]
    fn dual_stack_nodes_under_an_ipv4_cluster_cidr_name_the_missing_family() {
        let nodes: Vec<NodeView> = (1..=3)
            .map(|i| {
                node(
                    &format!("n{i}"),
                    &[&format!("10.244.{i}.0/24"), &format!("fd00:{i}::/64")],
                )
            })
            .collect();
        let m = check_configuration(&nodes, &config(&["10.244.0.0/16"])).unwrap();
        assert!(
            matches!(
                m,
                Misconfiguration::ClusterCidr {
                    family: IpFamily::V6,
                    inside: 0,
                    nodes: 3,
                    ..
                }
            ),
            "{m:?}"
        );
        assert!(m.to_string().contains("has no IPv6 CIDR"), "{m}");
        assert!(m.to_string().contains("--route-ip-families=IPv4"), "{m}");
        // Routing IPv4 alone is the fix.
        let mut v4 = config(&["10.244.0.0/16"]);
        v4.skip_families = vec![IpFamily::V6];
        assert_eq!(check_configuration(&nodes, &v4), None);
    }

    #[test]
    fn a_family_list_that_leaves_out_every_pod_cidr_is_a_configuration_error() {
        let nodes = [node("n1", &["10.244.1.0/24"])];
        let mut cfg = config(&["10.244.0.0/16", "fd00::/48"]);
        cfg.skip_families = vec![IpFamily::V4];
        let m = check_configuration(&nodes, &cfg).unwrap();
        assert_eq!(m.flag(), "--route-ip-families");
        assert_eq!(
            m.to_string(),
            "--route-ip-families is IPv6, but the Nodes' pod CIDRs are IPv4: set --route-ip-families to the cluster's families"
        );
    }

    #[test]
    fn a_selector_that_leaves_out_every_node_is_a_configuration_error() {
        let mut nodes = [node("n1", &["10.244.1.0/24"]), node("n2", &[])];
        for n in &mut nodes {
            n.excluded = true;
        }
        let m = check_configuration(&nodes, &config(&["10.244.0.0/16"])).unwrap();
        assert_eq!(m, Misconfiguration::NodeSelector { nodes: 2 });
        nodes[1].excluded = false;
        assert_eq!(
            check_configuration(&nodes, &config(&["10.244.0.0/16"])),
            None
        );
    }

    #[test]
    fn nodes_without_pod_cidrs_yet_say_nothing_about_the_settings() {
        let nodes = [node("n1", &[]), node("n2", &["not-a-cidr"])];
        assert_eq!(
            check_configuration(&nodes, &config(&["10.244.0.0/16"])),
            None
        );
        assert_eq!(
            check_configuration::<NodeView>(&[], &config(&["10.244.0.0/16"])),
            None
        );
    }
}
