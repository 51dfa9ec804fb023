//! The provider conformance suite against the stateful fake Hetzner Cloud
//! API (feature `testing`), over real HTTP on 127.0.0.1. No exemptions: the
//! fake injects error answers, enforces a route limit and counts requests.

use std::sync::Arc;
use std::time::Duration;

use provider_conformance::{FaultTable, Op, Subject, run_all_within};
use provider_hcloud::testing::{FakeConfig, FakeHcloud};
use provider_hcloud::{HcloudConfig, HcloudRoutes, Token};
use route_cloud::ErrorKind;
use route_core::{NodeAddress, NodeView};

const NET: u64 = 7;
/// Routes the fake accepts per network: small, so the quota check is quick.
const MAX_ROUTES: usize = 4;

/// The fake's "answer the next request with this error" knob, by the
/// endpoint each operation calls first, with the status and code the real
/// API documents for each class.
fn faults(fake: Arc<FakeHcloud>) -> FaultTable<(u16, &'static str)> {
    use ErrorKind::*;
    FaultTable::new(move |op, &(status, code)| {
        let endpoint = match op {
            Op::List => "get_network",
            Op::Create => "add_route",
            Op::Delete => "delete_route",
        };
        fake.fail_next(endpoint, 1, status, code);
    })
    .on_every_op([
        (Throttled, (429, "rate_limit_exceeded")),
        (Conflict, (409, "conflict")),
        (InvalidRequest, (400, "invalid_input")),
        (Transient, (503, "unavailable")),
        (Permanent, (403, "forbidden")),
    ])
    .on(Op::Create, QuotaExceeded, (403, "resource_limit_exceeded"))
    .on(Op::Delete, NotFound, (404, "not_found"))
}

async fn subject() -> Subject {
    let fake = Arc::new(
        FakeHcloud::start(FakeConfig {
            max_routes: MAX_ROUTES,
            // The budget is not enforced, so after an injected 429 the
            // headers show a full bucket and the client's wait is short.
            ..FakeConfig::default()
        })
        .await
        .expect("the fake starts"),
    );
    fake.add_network(NET, "k8s", "10.0.0.0/8", &["10.0.0.0/24"]);
    let nodes: Vec<NodeView> = (0..2u32)
        .map(|i| {
            let ip = format!("10.0.0.{}", i + 2);
            fake.add_server(u64::from(100 + i), &format!("node-{i}"), NET, &ip);
            NodeView::new(format!("node-{i}"), format!("uid-{i}"), &[])
                .with_addresses(vec![NodeAddress::internal_ip(ip)])
                .with_provider_id(format!("hcloud://{}", 100 + i))
        })
        .collect();
    let config = HcloudConfig {
        endpoint: fake.base_url(),
        action_poll_initial_ms: 10,
        action_poll_max_ms: 40,
        request_timeout_secs: 5,
        action_timeout_secs: 10,
        // After a 429 the client paces itself at its budget until the
        // bucket refills; the fake's budget is refilled fast, so is this.
        requests_per_hour: 3_600_000,
        keep_in_reserve: 0,
        ..HcloudConfig::for_network(NET.to_string())
    };
    let cloud = HcloudRoutes::new(config, Token::new(fake.token()).expect("a token"))
        .expect("a valid config");
    let counted = Arc::clone(&fake);
    Subject::new(Arc::new(cloud), "conformance", nodes)
        .with_faults(faults(Arc::clone(&fake)))
        .with_server_requests(move || counted.total())
        .with_quota(MAX_ROUTES)
        .keep_alive(fake)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hcloud_provider_conforms() {
    run_all_within(Duration::from_secs(120), subject, &[]).await;
}
