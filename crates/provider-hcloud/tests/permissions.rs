//! The provider's table of requests (`provider_hcloud::permissions::REQUESTS`)
//! against what it really sends to the fake Hetzner Cloud API: a request
//! the table lacks, or an entry no path sends, fails here.
//! `deploy/iam/hcloud.md` is checked against the same table in
//! `cloud-route-controller`'s `tests/iam_policies.rs`.

use std::collections::BTreeSet;
use std::time::Duration;

use provider_hcloud::permissions::{READ, READ_WRITE, REQUESTS};
use provider_hcloud::testing::{FakeConfig, FakeHcloud};
use provider_hcloud::{HcloudConfig, HcloudRoutes, Token};
use route_cloud::permissions::{request_kind, unaccounted};
use route_cloud::{Access, CloudRoutes};
use route_core::{Cidr, NodeAddress, Route};

const NET: u64 = 7;

/// The network found by name, a list that meets a gateway no route of this
/// process names (the server list), a creation and a deletion with their
/// action polls: every request the fake saw is counted under a name with an
/// entry, every entry was sent, and only the actions need a write token.
#[tokio::test]
async fn every_request_sent_to_the_fake_has_an_entry_and_every_entry_is_sent() {
    let fake = FakeHcloud::start(FakeConfig {
        action_duration: Duration::from_millis(5),
        ..FakeConfig::default()
    })
    .await
    .expect("the fake starts");
    fake.add_network(NET, "k8s", "10.0.0.0/8", &["10.0.0.0/24"]);
    fake.add_server(100, "node-0", NET, "10.0.0.2");
    fake.add_server(101, "node-1", NET, "10.0.0.3");
    fake.insert_route(NET, "10.244.1.0/24", "10.0.0.3");
    let p = HcloudRoutes::new(
        HcloudConfig {
            endpoint: fake.base_url(),
            action_poll_initial_ms: 40,
            action_poll_max_ms: 80,
            request_timeout_secs: 5,
            action_timeout_secs: 10,
            ..HcloudConfig::for_network("k8s".to_string())
        },
        Token::new(fake.token()).expect("a valid token"),
    )
    .expect("the provider accepts the config");

    let listed = p.list_routes("c").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].node, "node-1", "found in the server list");
    let mut want = Route::new("node-0", Cidr::parse("10.244.0.0/24").unwrap())
        .with_addresses(vec![NodeAddress::internal_ip("10.0.0.2")], false);
    want.node_provider_id = Some("hcloud://100".into());
    p.create_route("c", "uid-0", &want).await.unwrap();
    p.delete_route("c", &listed[0]).await.unwrap();
    assert_eq!(
        fake.routes(NET),
        [("10.244.0.0/24".to_string(), "10.0.0.2".to_string())]
    );

    let served: BTreeSet<String> = fake.requests().into_keys().collect();
    let counted: BTreeSet<&str> = p.stats().snapshot().keys().map(|(op, _)| *op).collect();
    let names: BTreeSet<&str> = REQUESTS.iter().map(|r| r.name).collect();
    assert_eq!(
        unaccounted(REQUESTS, served.iter().map(String::as_str)),
        BTreeSet::new()
    );
    assert_eq!(
        unaccounted(REQUESTS, counted.iter().copied()),
        BTreeSet::new()
    );
    assert_eq!(
        served.iter().map(String::as_str).collect::<BTreeSet<_>>(),
        names,
        "every entry is a request some path sends"
    );
    for (endpoint, n) in fake.requests() {
        assert_eq!(
            p.stats().total(&endpoint),
            n,
            "{endpoint}: counted as served"
        );
        let entry = request_kind(REQUESTS, &endpoint).unwrap();
        let write = entry.access == Access::Write;
        assert_eq!(entry.permissions, [if write { READ_WRITE } else { READ }]);
        assert_eq!(write, entry.call.starts_with("POST "), "{endpoint}");
    }
}
