//! The provider conformance suite against the stateful fake of ARM's
//! `routeTables` resource (feature `testing`), over real HTTP on 127.0.0.1,
//! with a client-secret token from the fake's Entra endpoint. No
//! exemptions: the fake injects ARM's error answers, enforces the route
//! limit and counts every request, token requests and operation polls too.

use std::sync::Arc;
use std::time::Duration;

use provider_azure::testing::{FakeAzure, FakeConfig};
use provider_azure::{AzureConfig, AzureRoutes};
use provider_conformance::{FaultTable, Op, Subject, run_all_within};
use route_cloud::ErrorKind;
use route_core::{NodeAddress, NodeView};

const TABLE: &str = "k8s-routes";
/// Routes the table accepts: small, so the quota check is quick.
const MAX_ROUTES: usize = 4;

/// The fake's "answer the next request with this error" knob, by the
/// endpoint each operation's outcome rests on, with the status and code ARM
/// answers for each class.
fn faults(fake: Arc<FakeAzure>) -> FaultTable<(u16, &'static str)> {
    use ErrorKind::*;
    FaultTable::new(move |op, &(status, code)| {
        let endpoint = match op {
            Op::List => "get_table",
            Op::Create | Op::Delete => "put_table",
        };
        fake.fail_next(endpoint, 1, status, code);
    })
    // Not `Conflict`: a 412 is answered by reading the table again and
    // writing once more, by design, so one never reaches the caller
    // (`tests/fake_api.rs` checks that path and its count).
    .on_every_op([
        (Throttled, (429, "SubscriptionRequestsThrottled")),
        (InvalidRequest, (400, "InvalidRequestFormat")),
        (Transient, (503, "ServiceUnavailable")),
        (Permanent, (403, "AuthorizationFailed")),
        (NotFound, (404, "ResourceNotFound")),
    ])
    .on(Op::Create, QuotaExceeded, (400, "QuotaExceeded"))
}

async fn subject() -> Subject {
    let fake = Arc::new(
        FakeAzure::start(FakeConfig {
            max_routes: MAX_ROUTES,
            operation_duration: Duration::from_millis(20),
            ..FakeConfig::default()
        })
        .await
        .expect("the fake starts"),
    );
    fake.add_table(TABLE);
    // Someone else's route on the same table: never listed, never lost.
    fake.put_route(
        TABLE,
        "to-firewall",
        "0.0.0.0/0",
        "VirtualAppliance",
        Some("10.0.0.4"),
    );
    let mut config = AzureConfig::from_yaml(&fake.cloud_config(TABLE)).expect("a config");
    // One route per pod CIDR: the checks route several CIDRs to one Node.
    config.ipv6_dual_stack_enabled = true;
    // Above the fake's limit, so the refusal of a full table is ARM's
    // answer (`400 QuotaExceeded`) and not the provider's own count
    // (`tests/fake_api.rs` checks that one).
    config.max_routes = MAX_ROUTES + 1;
    // Each Node on a VM whose NIC forwards, as in a working cluster (the
    // forwarding check reads them through `spec.providerID`).
    let nodes: Vec<NodeView> = (0..2u8)
        .map(|i| {
            let ip = format!("10.0.0.{}", i + 5);
            let provider_id = fake.add_vm(&format!("node-{i}"), &ip);
            NodeView::new(format!("node-{i}"), format!("uid-{i}"), &[])
                .with_addresses(vec![
                    NodeAddress::internal_ip(ip),
                    NodeAddress::internal_ip(format!("fd00::{}", i + 5)),
                ])
                .with_provider_id(provider_id)
        })
        .collect();
    let cloud = AzureRoutes::new(config).expect("a valid config");
    let counted = Arc::clone(&fake);
    Subject::new(Arc::new(cloud), "conformance", nodes)
        .with_faults(faults(Arc::clone(&fake)))
        .with_server_requests(move || counted.total())
        // The table holds the foreign route, so this many more fit.
        .with_quota(MAX_ROUTES - 1)
        .keep_alive(fake)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_azure_provider_conforms() {
    run_all_within(Duration::from_secs(120), subject, &[]).await;
}
