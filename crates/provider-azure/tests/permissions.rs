//! The provider's table of requests (`provider_azure::permissions::REQUESTS`)
//! against what it really sends to the fake ARM API: a request the table
//! lacks, or an entry no path sends, fails here. The role definitions in
//! `deploy/iam/` are checked against the same table in
//! `cloud-route-controller`'s `tests/iam_policies.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use provider_azure::permissions::REQUESTS;
use provider_azure::testing::{FakeAzure, FakeConfig};
use provider_azure::{AzureConfig, AzureRoutes, ops};
use route_cloud::permissions::{request_kind, unaccounted};
use route_cloud::{Access, Batch, CloudRoutes, ForwardingCheck};
use route_core::{Cidr, NodeAddress, NodeView, Route};

const TABLE: &str = "k8s-routes";

/// The provider's counter names behind each of the fake's endpoints (the
/// fake names a request by its URL and method; the provider by its purpose).
fn counted_as(endpoint: &str) -> &'static [&'static str] {
    match endpoint {
        "token" | "imds_token" => &[ops::TOKEN],
        "get_table" => &[ops::LIST, ops::GET_TABLE],
        "put_table" => &[ops::PUT_TABLE],
        "get_operation" => &[ops::POLL],
        "get_vm" => &[ops::GET_VM],
        "get_nic" => &[ops::GET_NIC],
        "list_nics" => &[ops::LIST_NICS],
        _ => &[],
    }
}

/// A token, a list, a batch of creations (the `PUT`, its operation polls,
/// the read after it), a batch of a deletion, the forwarding check: every
/// request the fake saw was counted by the provider under a name with an
/// entry, and every entry was sent.
#[tokio::test]
async fn every_request_sent_to_the_fake_has_an_entry_and_every_entry_is_sent() {
    let f = FakeAzure::start(FakeConfig::default())
        .await
        .expect("the fake starts");
    f.add_table(TABLE);
    f.set_operation_duration(Duration::from_millis(60));
    let p = AzureRoutes::new(AzureConfig::from_yaml(&f.cloud_config(TABLE)).expect("a config"))
        .expect("a provider");
    let nodes: Vec<Arc<NodeView>> = (0..2)
        .map(|i| {
            let ip = format!("10.0.0.{}", i + 4);
            let id = f.add_vm(&format!("node-{i}"), &ip);
            Arc::new(
                NodeView::new(format!("node-{i}"), format!("uid-{i}"), &[])
                    .with_provider_id(id)
                    .with_addresses(vec![NodeAddress::internal_ip(ip)]),
            )
        })
        .collect();
    p.observe_nodes(&nodes);
    let want = |i: usize| {
        Route::new(
            nodes[i].name.as_str(),
            Cidr::parse(&format!("10.244.{i}.0/24")).unwrap(),
        )
        .with_addresses(nodes[i].addresses.clone(), false)
    };

    p.list_routes("c").await.unwrap();
    let created = p
        .apply_batch(
            "c",
            &Batch::new(&[], &[("uid-0".into(), want(0)), ("uid-1".into(), want(1))]),
        )
        .await
        .unwrap();
    assert!(
        created.len() == 2 && created.values().all(Result::is_ok),
        "{created:?}"
    );
    let listed = p.list_routes("c").await.unwrap();
    assert_eq!(listed.len(), 2);
    let gone = p
        .apply_batch("c", &Batch::one_deletion(&listed[0]))
        .await
        .unwrap();
    assert!(
        gone.len() == 1 && gone.values().all(Result::is_ok),
        "{gone:?}"
    );
    let checked = p
        .check_forwarding(
            "c",
            &nodes,
            ForwardingCheck {
                fresh: true,
                repair: true,
            },
        )
        .await
        .unwrap();
    assert_eq!(checked.len(), 2, "{checked:?}");
    // Afresh again: the NICs read before are listed by their group.
    let again = p
        .check_forwarding(
            "c",
            &nodes,
            ForwardingCheck {
                fresh: true,
                repair: true,
            },
        )
        .await
        .unwrap();
    assert_eq!(again.len(), 2, "{again:?}");

    let mut served: BTreeMap<String, u64> = BTreeMap::new();
    for ((endpoint, _), n) in f.answers() {
        *served.entry(endpoint).or_default() += n;
    }
    let snapshot = p.stats().snapshot();
    let counted = |names: &[&str]| -> u64 {
        snapshot
            .iter()
            .filter(|((op, _), _)| names.contains(op))
            .map(|(_, n)| n)
            .sum()
    };
    for (endpoint, n) in &served {
        let names = counted_as(endpoint);
        assert!(
            !names.is_empty(),
            "the fake served {endpoint}, which the provider never sends"
        );
        assert_eq!(
            counted(names),
            *n,
            "{endpoint}: every request the fake served is counted by the provider as one of {names:?}"
        );
    }
    let sent: BTreeSet<&str> = snapshot.keys().map(|(op, _)| *op).collect();
    let names: BTreeSet<&str> = REQUESTS.iter().map(|r| r.name).collect();
    assert_eq!(unaccounted(REQUESTS, sent.iter().copied()), BTreeSet::new());
    assert_eq!(sent, names, "every entry is a request some path sends");
    for name in sent {
        let entry = request_kind(REQUESTS, name).unwrap();
        assert_eq!(
            entry.access == Access::Write,
            name == ops::PUT_TABLE,
            "{name}: only the table PUT changes anything"
        );
    }
}
