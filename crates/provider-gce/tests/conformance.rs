//! The provider conformance suite against the stateful fake Compute Engine
//! API (feature `testing`), over real HTTP on 127.0.0.1, through Google's
//! official client. No exemptions: the fake injects error answers, enforces
//! a static-routes quota and counts requests.

use std::sync::Arc;
use std::time::Duration;

use provider_conformance::{Faults, Op, Subject, run_all};
use provider_gce::testing::{FakeConfig, FakeGce};
use provider_gce::{GceConfig, GceRoutes};
use route_cloud::ErrorKind;
use route_core::{NodeAddress, NodeView};

const NETWORK: &str = "k8s";
const ZONE: &str = "europe-west1-b";
/// Routes the fake accepts per network: small, so the quota check is quick.
const MAX_ROUTES: usize = 4;

/// The fake's "answer the next request with this error" knob, by the
/// request each operation sends first.
struct FakeFaults(Arc<FakeGce>);

impl Faults for FakeFaults {
    fn injectable(&self) -> Vec<(Op, ErrorKind)> {
        use ErrorKind::*;
        let mut pairs = Vec::new();
        for op in [Op::List, Op::Create, Op::Delete] {
            for kind in [Throttled, Conflict, InvalidRequest, Transient, Permanent] {
                pairs.push((op, kind));
            }
        }
        pairs.extend([(Op::Create, QuotaExceeded), (Op::Delete, NotFound)]);
        pairs
    }

    fn fail_next(&self, op: Op, kind: ErrorKind) {
        let endpoint = match op {
            Op::List => "list",
            Op::Create => "insert",
            Op::Delete => "delete",
        };
        // The status and reason Compute Engine documents for each class
        // (cloud.google.com/compute/docs/api/handling-errors).
        let (status, reason) = match kind {
            ErrorKind::Throttled => (403, "rateLimitExceeded"),
            ErrorKind::Conflict => (400, "resourceNotReady"),
            ErrorKind::InvalidRequest => (400, "invalid"),
            ErrorKind::Transient => (503, "backendError"),
            ErrorKind::Permanent => (403, "forbidden"),
            ErrorKind::QuotaExceeded => (403, "quotaExceeded"),
            ErrorKind::NotFound => (404, "notFound"),
            other => panic!("the fake has no answer for {other}"),
        };
        self.0.fail_next(endpoint, status, reason);
    }
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
        .with_faults(FakeFaults(Arc::clone(&fake)))
        .with_server_requests(move || counted.total())
        .with_quota(MAX_ROUTES)
        .keep_alive(fake)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gce_provider_conforms() {
    tokio::time::timeout(Duration::from_secs(120), run_all(subject, &[]))
        .await
        .expect("the suite finishes in time");
}
