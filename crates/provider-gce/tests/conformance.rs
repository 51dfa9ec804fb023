//! The provider conformance suite against the stateful fake Compute Engine
//! API (feature `testing`), over real HTTP on 127.0.0.1, through Google's
//! official client. No exemptions: the fake injects error answers, enforces
//! a static-routes quota and counts requests.

use std::sync::Arc;
use std::time::Duration;

use provider_conformance::{FaultTable, Op, Subject, run_all_within};
use provider_gce::testing::{FakeConfig, FakeGce};
use provider_gce::{GceConfig, GceRoutes};
use route_cloud::ErrorKind;
use route_core::{NodeAddress, NodeView};

const NETWORK: &str = "k8s";
const ZONE: &str = "europe-west1-b";
/// Routes the fake accepts per network: small, so the quota check is quick.
const MAX_ROUTES: usize = 4;

/// The fake's "answer the next request with this error" knob, by the
/// request each operation sends first, with the status and reason Compute
/// Engine documents for each class
/// (cloud.google.com/compute/docs/api/handling-errors).
fn faults(fake: Arc<FakeGce>) -> FaultTable<(u16, &'static str)> {
    use ErrorKind::*;
    FaultTable::new(move |op, &(status, reason)| {
        let endpoint = match op {
            Op::List => "list",
            Op::Create => "insert",
            Op::Delete => "delete",
        };
        fake.fail_next(endpoint, status, reason);
    })
    .on_every_op([
        (Throttled, (403, "rateLimitExceeded")),
        (Conflict, (400, "resourceNotReady")),
        (InvalidRequest, (400, "invalid")),
        (Transient, (503, "backendError")),
        (Permanent, (403, "forbidden")),
    ])
    .on(Op::Create, QuotaExceeded, (403, "quotaExceeded"))
    .on(Op::Delete, NotFound, (404, "notFound"))
}

async fn subject() -> Subject {
    let fake = Arc::new(
        FakeGce::start(FakeConfig {
            max_routes: MAX_ROUTES,
            ..FakeConfig::default()
        })
        .await
        .expect("the fake starts"),
    );
    // An internal IPv6 range, so the ipv6 check routes IPv6 for real.
    fake.add_network(NETWORK, true);
    let project = fake.project();
    let nodes: Vec<NodeView> = (0..2u32)
        .map(|i| {
            let name = format!("node-{i}");
            fake.add_instance(ZONE, &name);
            NodeView::new(name.clone(), format!("uid-{i}"), &[])
                .with_addresses(vec![
                    NodeAddress::internal_ip(format!("10.0.0.{}", i + 2)),
                    NodeAddress::internal_ip(format!("fd20::{}", i + 2)),
                ])
                .with_provider_id(format!("gce://{project}/{ZONE}/{name}"))
        })
        .collect();
    let config = GceConfig {
        endpoint: fake.endpoint(),
        anonymous: true,
        request_timeout_secs: 5,
        operation_timeout_secs: 10,
        // The fake's operations take 30 ms; the client still never reads
        // one operation more often than this.
        operation_poll_min_ms: 20,
        operation_polls_per_second: 1000.0,
        operation_poll_burst: 100,
        // After a `rateLimitExceeded` the client waits for the window to
        // turn; a short window keeps the injected throttling answers quick.
        quota_window_secs: 1,
        max_routes: MAX_ROUTES,
        ..GceConfig::for_network(project, NETWORK)
    };
    let cloud = GceRoutes::connect(config)
        .await
        .expect("the provider connects");
    let counted = Arc::clone(&fake);
    Subject::new(Arc::new(cloud), "conformance", nodes)
        .with_faults(faults(Arc::clone(&fake)))
        .with_server_requests(move || counted.total())
        .with_quota(MAX_ROUTES)
        .keep_alive(fake)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gce_provider_conforms() {
    run_all_within(Duration::from_secs(120), subject, &[]).await;
}
