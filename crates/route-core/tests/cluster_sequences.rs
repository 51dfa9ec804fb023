//! Planner behaviour under what real clusters do: host routes in the table,
//! Nodes whose cloud data arrives late, Nodes re-created under the same name.
//! Each test is named after the sequence it pins.

mod common;

use common::{apply, config, node, route};
use route_core::{
    CreationReason, DeletionReason, IpFamily, MissingNodeData, NetworkCondition, NodeAddress,
    NodeView, PlanConfig, Route, TargetNeeds, plan,
};

fn cluster(needs: TargetNeeds) -> PlanConfig {
    PlanConfig {
        needs,
        ..config(&["10.120.0.0/16", "fd00::/48"])
    }
}

#[test]
fn host_routes_in_the_table_are_planned_not_a_crash() {
    // Regression: any /32 or /128 route made `Cidr::last()` overflow and the
    // controller exited. Host routes outside the cluster CIDRs are foreign
    // and untouched; one inside is the cluster's, as upstream decides.
    let nodes = [node("node-1", "01", &["10.120.1.0/24"], "10.0.1.1")];
    let routes = [
        route("node-1", "10.120.1.0/24", &[], false),
        route("", "192.168.7.7/32", &[], false),
        route("", "fd01::7/128", &[], false),
        route("", "0.0.0.0/0", &[], false),
        route("", "::/0", &[], false),
        route("gone", "10.120.9.9/32", &[], false),
    ];
    let p = plan(&nodes, &routes, &cluster(TargetNeeds::Nothing));
    let deleted: Vec<String> = p
        .deletions
        .iter()
        .map(|d| d.route.destination.to_string())
        .collect();
    assert_eq!(deleted, ["10.120.9.9/32"]);
    assert!(p.creations.is_empty());
}

#[test]
fn host_pod_cidr_gets_a_host_route() {
    let nodes = [
        node("node-1", "01", &["10.120.1.1/32"], "10.0.1.1"),
        node("node-2", "02", &["fd00::2/128"], "10.0.1.2"),
    ];
    let p = plan(&nodes, &[], &cluster(TargetNeeds::Nothing));
    let created: Vec<String> = p
        .creations
        .iter()
        .map(|c| c.route.destination.to_string())
        .collect();
    assert_eq!(created, ["10.120.1.1/32", "fd00::2/128"]);
}

#[test]
fn pod_cidr_before_provider_id_waits_without_a_creation() {
    // The external-cloud-provider order: the kubelet registers the Node
    // without providerID, node IPAM assigns the pod CIDR at once.
    let early = NodeView::new("node-1", "01", &["10.120.1.0/24"]);
    let p = plan(
        std::slice::from_ref(&early),
        &[],
        &cluster(TargetNeeds::ProviderId),
    );
    assert!(p.creations.is_empty(), "{p:#?}");
    assert_eq!(p.awaiting_node_data.len(), 1);
    assert_eq!(p.awaiting_node_data[0].missing, MissingNodeData::ProviderId);
    assert_eq!(p.nodes.len(), 1);
    assert!(p.nodes[0].unroutable);
    assert_eq!(
        p.nodes[0].condition_after(|_| false),
        Some(NetworkCondition::AwaitingNodeData)
    );

    // Seconds later the cloud-controller-manager fills in the providerID.
    let ready = early.with_provider_id("aws:///eu-west-1a/i-0123");
    let p = plan(&[ready], &[], &cluster(TargetNeeds::ProviderId));
    assert_eq!(p.creations.len(), 1);
    assert!(p.awaiting_node_data.is_empty());
    assert_eq!(
        p.creations[0].route.node_provider_id.as_deref(),
        Some("aws:///eu-west-1a/i-0123")
    );
}

#[test]
fn pod_cidr_before_internal_ip_of_its_family_waits() {
    let n = NodeView::new("node-1", "01", &["10.120.1.0/24", "fd00::100/120"])
        .with_addresses(vec![NodeAddress::internal_ip("10.0.1.1")]);
    let p = plan(
        std::slice::from_ref(&n),
        &[],
        &cluster(TargetNeeds::InternalIp),
    );
    let created: Vec<String> = p
        .creations
        .iter()
        .map(|c| c.route.destination.to_string())
        .collect();
    assert_eq!(created, ["10.120.1.0/24"]);
    assert_eq!(p.awaiting_node_data.len(), 1);
    assert_eq!(
        p.awaiting_node_data[0].missing,
        MissingNodeData::InternalIp(IpFamily::V6)
    );
    // An ExternalIP of the family is not a next hop.
    let n = n.with_addresses(vec![
        NodeAddress::internal_ip("10.0.1.1"),
        NodeAddress::new("ExternalIP", "fd00:1::1"),
    ]);
    let p = plan(&[n], &[], &cluster(TargetNeeds::InternalIp));
    assert_eq!(p.awaiting_node_data.len(), 1);
}

#[test]
fn route_kept_while_new_addresses_lack_what_a_replacement_needs() {
    // The provider tracks addresses and they changed, but the Node lost its
    // InternalIP meanwhile: a stale route beats a deletion with no creation.
    let n = NodeView::new("node-1", "01", &["10.120.1.0/24"])
        .with_addresses(vec![NodeAddress::new("ExternalIP", "192.0.2.1")]);
    let routes = [route("node-1", "10.120.1.0/24", &["10.0.1.1"], true)];
    let p = plan(&[n], &routes, &cluster(TargetNeeds::InternalIp));
    assert!(p.is_noop(), "{p:#?}");
    assert_eq!(p.awaiting_node_data.len(), 1);
}

fn listed_to(node: &str, dest: &str, provider_id: &str) -> Route {
    let mut r = route(node, dest, &[], false);
    r.node_provider_id = Some(provider_id.into());
    r
}

#[test]
fn node_recreated_with_same_name_cidr_and_instance_keeps_its_route() {
    let n = NodeView::new("node-1", "new-uid", &["10.120.1.0/24"])
        .with_provider_id("aws:///eu-west-1a/i-0aaa");
    let routes = [listed_to(
        "node-1",
        "10.120.1.0/24",
        "aws:///eu-west-1a/i-0aaa",
    )];
    let p = plan(&[n], &routes, &cluster(TargetNeeds::ProviderId));
    assert!(p.is_noop(), "{p:#?}");
}

#[test]
fn node_recreated_with_same_name_and_cidr_on_a_new_instance_replaces_the_route() {
    // Regression: the kept route was matched by node name and CIDR only and
    // kept pointing at the old instance while the condition said RouteCreated.
    let n = NodeView::new("node-1", "new-uid", &["10.120.1.0/24"])
        .with_provider_id("aws:///eu-west-1a/i-0bbb");
    let old = listed_to("node-1", "10.120.1.0/24", "aws:///eu-west-1a/i-0aaa");
    let routes = [old.clone()];
    let p = plan(
        std::slice::from_ref(&n),
        &routes,
        &cluster(TargetNeeds::ProviderId),
    );
    assert_eq!(p.deletions.len(), 1);
    assert_eq!(p.deletions[0].reason, DeletionReason::TargetChanged);
    assert_eq!(p.deletions[0].route, old);
    assert_eq!(p.creations.len(), 1);
    assert_eq!(p.creations[0].reason, CreationReason::TargetChanged);
    assert_eq!(p.creations[0].after, vec![p.deletions[0].key()]);
    // Once applied, the table is settled.
    let mut after = apply(&p, &routes);
    after[0].node_provider_id = Some("aws:///eu-west-1a/i-0bbb".into());
    assert!(plan(&[n], &after, &cluster(TargetNeeds::ProviderId)).is_noop());
}

#[test]
fn route_with_unknown_instance_is_no_evidence_of_a_change() {
    // Providers that cannot say which instance a listed route names leave
    // `node_provider_id` empty; that must not churn.
    let n = NodeView::new("node-1", "01", &["10.120.1.0/24"]).with_provider_id("hcloud://7");
    let routes = [route("node-1", "10.120.1.0/24", &[], false)];
    assert!(plan(&[n], &routes, &cluster(TargetNeeds::Nothing)).is_noop());
}

#[test]
fn blackhole_replacement_waits_for_node_data_but_the_blackhole_goes() {
    let n = NodeView::new("node-1", "01", &["10.120.1.0/24"]);
    let routes = [route("node-1", "10.120.1.0/24", &[], false).blackholed()];
    let p = plan(&[n], &routes, &cluster(TargetNeeds::ProviderId));
    assert_eq!(p.deletions.len(), 1);
    assert_eq!(p.deletions[0].reason, DeletionReason::Blackhole);
    assert!(p.creations.is_empty());
    assert_eq!(p.awaiting_node_data.len(), 1);
}

#[test]
fn blackhole_is_replaced_in_place_where_the_provider_can() {
    // The README promises one ReplaceRoute over an AWS blackhole; the plan
    // used to delete it first (two calls and a moment without a route).
    let n = NodeView::new("node-1", "01", &["10.120.1.0/24"]).with_provider_id("aws:///z/i-1");
    let bh = route("node-1", "10.120.1.0/24", &[], false).blackholed();
    let cfg = PlanConfig {
        replace_blackholes: true,
        ..cluster(TargetNeeds::ProviderId)
    };
    let p = plan(std::slice::from_ref(&n), std::slice::from_ref(&bh), &cfg);
    assert!(p.deletions.is_empty(), "{p:#?}");
    assert_eq!(p.creations.len(), 1);
    assert_eq!(p.creations[0].reason, CreationReason::ReplacesBlackhole);
    assert_eq!(p.creations[0].replaces.as_ref(), Some(&bh));
    assert!(p.creations[0].after.is_empty());

    // Without the capability: delete, then create.
    let p = plan(&[n], &[bh], &cluster(TargetNeeds::ProviderId));
    assert_eq!(p.deletions.len(), 1);
    assert_eq!(p.creations[0].after, vec![p.deletions[0].key()]);
    assert!(p.creations[0].replaces.is_none());
}

#[test]
fn blackhole_beside_a_live_route_is_deleted_not_replaced() {
    let n = NodeView::new("node-1", "01", &["10.120.1.0/24"]);
    let live = route("node-1", "10.120.1.0/24", &[], false);
    let bh = route("node-1", "10.120.1.0/24", &[], false).blackholed();
    let cfg = PlanConfig {
        replace_blackholes: true,
        ..cluster(TargetNeeds::Nothing)
    };
    let p = plan(&[n], &[bh.clone(), live], &cfg);
    assert!(p.creations.is_empty());
    assert_eq!(p.deletions.len(), 1);
    assert_eq!(p.deletions[0].route, bh);
    assert_eq!(p.deletions[0].reason, DeletionReason::Blackhole);
}
