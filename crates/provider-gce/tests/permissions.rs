//! The provider's table of requests (`provider_gce::permissions::REQUESTS`)
//! against what it really sends to the fake Compute Engine API: a request
//! the table lacks, or an entry no path sends, fails here. The custom role
//! in `deploy/iam/gce-role.yaml` is checked against the same table in
//! `cloud-route-controller`'s `tests/iam_policies.rs`.

use std::collections::BTreeSet;
use std::sync::Arc;

use provider_gce::permissions::REQUESTS;
use provider_gce::testing::{FakeConfig, FakeGce};
use provider_gce::{GceConfig, GceRoutes};
use route_cloud::permissions::{request_kind, unaccounted};
use route_cloud::{Access, CloudRoutes, Forwarding, ForwardingCheck};
use route_core::{Cidr, NodeView, Route};

const NETWORK: &str = "k8s";
const ZONE: &str = "us-central1-a";

/// Start (the network read), list, create, a retried create that meets its
/// own route (the read-back), the forwarding check, delete: every request
/// the fake saw and the provider counted has an entry, every entry was sent,
/// and the fake's writes are the entries marked writes.
#[tokio::test]
async fn every_request_sent_to_the_fake_has_an_entry_and_every_entry_is_sent() {
    let fake = FakeGce::start(FakeConfig {
        operation_duration: std::time::Duration::from_millis(50),
        ..FakeConfig::default()
    })
    .await
    .expect("the fake starts");
    fake.add_network(NETWORK, false);
    fake.add_instance(ZONE, "node-0");
    fake.add_instance(ZONE, "node-1");
    fake.set_can_ip_forward(ZONE, "node-1", false);
    let c = GceRoutes::connect(GceConfig {
        endpoint: fake.endpoint(),
        anonymous: true,
        request_timeout_secs: 5,
        operation_timeout_secs: 10,
        operation_poll_min_ms: 20,
        operation_polls_per_second: 1000.0,
        operation_poll_burst: 100,
        ..GceConfig::for_network(fake.project(), NETWORK)
    })
    .await
    .expect("connects");
    let nodes: Vec<Arc<NodeView>> = (0..2)
        .map(|i| {
            Arc::new(
                NodeView::new(format!("node-{i}"), format!("uid-{i}"), &[])
                    .with_provider_id(format!("gce://{}/{ZONE}/node-{i}", fake.project())),
            )
        })
        .collect();
    c.observe_nodes(&nodes);
    let mut want = Route::new("node-0", Cidr::parse("10.244.0.0/24").unwrap());
    want.node_provider_id = nodes[0].provider_id.as_deref().map(Into::into);

    c.list_routes("k8s").await.unwrap();
    c.create_route("k8s", "uid-0", &want).await.unwrap();
    c.create_route("k8s", "uid-0", &want).await.unwrap();
    let checked = c
        .check_forwarding(
            "k8s",
            &nodes,
            ForwardingCheck {
                fresh: true,
                repair: true,
            },
        )
        .await
        .unwrap();
    assert!(
        checked
            .iter()
            .any(|(n, f)| n == "node-1" && matches!(f, Forwarding::Disabled { .. })),
        "{checked:?}"
    );
    let listed = c.list_routes("k8s").await.unwrap();
    c.delete_route("k8s", &listed[0]).await.unwrap();
    assert!(fake.routes().is_empty());

    let served = fake.requests();
    let sent: BTreeSet<&str> = served.keys().map(String::as_str).collect();
    let counted: BTreeSet<&str> = c.stats().snapshot().keys().map(|(op, _)| *op).collect();
    let names: BTreeSet<&str> = REQUESTS.iter().map(|r| r.name).collect();
    assert_eq!(unaccounted(REQUESTS, sent.iter().copied()), BTreeSet::new());
    assert_eq!(
        unaccounted(REQUESTS, counted.iter().copied()),
        BTreeSet::new()
    );
    assert_eq!(sent, names, "every entry is a request some path sends");
    assert_eq!(
        counted, names,
        "and the provider counts each under its name"
    );
    for name in sent {
        let entry = request_kind(REQUESTS, name).unwrap();
        assert_eq!(
            entry.access == Access::Write,
            matches!(name, "insert" | "delete"),
            "{name}: only inserts and deletes change anything on the fake"
        );
    }
}
