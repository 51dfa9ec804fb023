//! The provider conformance suite against a real neutron-server (SQLite,
//! noauth; started by `scripts/neutron.sh` unless `CRC_NEUTRON_URL` names
//! one), on both write paths. Each subject is a router of its own, with an
//! IPv4 and an IPv6 subnet, in a project of its own whose route quota is
//! lowered for the quota check. The provider talks to the server through
//! the testing [`Proxy`], which injects Neutron's error answers and counts
//! the requests the server saw: no exemptions. On the atomic path each Node
//! has a port with port security on, so every check also runs the port step
//! (the pod CIDR as an allowed address pair); on the whole-list path no port
//! carries the next hops, the step's skip, which also keeps the two suites
//! within their time on a loaded machine.

use std::sync::Arc;
use std::time::Duration;

use provider_conformance::{FaultTable, Op, Subject, run_all_within};
use provider_openstack::testing::{Admin, Proxy, neutron_server};
use provider_openstack::{OpenStackConfig, OpenStackRoutes, UpdateMode};
use route_cloud::ErrorKind;
use route_core::{NodeAddress, NodeView};

/// Routes the project may put on its router.
const QUOTA: usize = 3;

/// The proxy's "answer the next request with this Neutron error" knob, with
/// the status and Neutron error type for each class.
fn faults(proxy: Arc<Proxy>) -> FaultTable<(u16, &'static str)> {
    use ErrorKind::*;
    // Whichever request comes next: each operation's first request is the
    // one its classification rests on.
    FaultTable::new(move |_op, &(status, neutron_type)| proxy.fail_next(1, status, neutron_type))
        // Not `Conflict`: the whole-list path retries a 409/412 on a fresh
        // read by design, so one injected conflict never reaches the caller.
        .on_every_op([
            (Throttled, (429, "OverLimit")),
            (InvalidRequest, (400, "BadRequest")),
            (Transient, (503, "ServiceUnavailable")),
            (Permanent, (403, "PolicyNotAuthorized")),
            (NotFound, (404, "RouterNotFound")),
        ])
        .on(Op::Create, QuotaExceeded, (409, "OverQuota"))
}

async fn subject(mode: UpdateMode) -> Subject {
    let server = neutron_server().await.expect("neutron-server");
    let admin = Admin::new(&server.url);
    let router = admin
        .create_router(&format!("conformance-{mode:?}"), "10.0.0.0/16")
        .await
        .expect("a router");
    admin
        .add_subnet(&router, "fd00:0:0:1::/64")
        .await
        .expect("an IPv6 subnet");
    admin
        .set_route_quota(&router.project_id, i64::try_from(QUOTA).unwrap_or(i64::MAX))
        .await
        .expect("a route quota");
    for i in (0..2u8).filter(|_| mode == UpdateMode::Auto) {
        admin
            .create_port(
                &router,
                &format!("srv-node-{i}"),
                &[
                    &format!("10.0.0.{}", i + 5),
                    &format!("fd00:0:0:1::{}", i + 5),
                ],
                true,
                serde_json::json!([]),
            )
            .await
            .expect("a Node port");
    }
    let nodes: Vec<NodeView> = (0..2u8)
        .map(|i| {
            NodeView::new(format!("node-{i}"), format!("uid-{i}"), &[]).with_addresses(vec![
                NodeAddress::internal_ip(format!("10.0.0.{}", i + 5)),
                NodeAddress::internal_ip(format!("fd00:0:0:1::{}", i + 5)),
            ])
        })
        .collect();
    let proxy = Arc::new(Proxy::start(&server.url).await.expect("the proxy starts"));
    let mut config = OpenStackConfig::noauth(proxy.url(), &router.router_id);
    config.update_mode = mode;
    let cloud = OpenStackRoutes::new(config).expect("a valid config");
    let counted = Arc::clone(&proxy);
    Subject::new(Arc::new(cloud), "conformance", nodes)
        .with_quota(QUOTA)
        .with_faults(faults(Arc::clone(&proxy)))
        .with_server_requests(move || counted.requests())
        .keep_alive(proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openstack_provider_conforms_with_atomic_updates() {
    run_all_within(
        Duration::from_secs(300),
        async || subject(UpdateMode::Auto).await,
        &[],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openstack_provider_conforms_with_whole_list_updates() {
    run_all_within(
        Duration::from_secs(300),
        async || subject(UpdateMode::WholeList).await,
        &[],
    )
    .await;
}
