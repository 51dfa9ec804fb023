//! The provider conformance suite against a real neutron-server (SQLite,
//! noauth; started by `scripts/neutron.sh` unless `CRC_NEUTRON_URL` names
//! one), on both write paths. Each subject is a router of its own, with an
//! IPv4 and an IPv6 subnet, in a project of its own whose route quota is
//! lowered for the quota check.

use std::sync::Arc;
use std::time::Duration;

use provider_conformance::{Check, Exemption, Subject, run_all};
use provider_openstack::testing::{Admin, neutron_server};
use provider_openstack::{OpenStackConfig, OpenStackRoutes, UpdateMode};
use route_core::{NodeAddress, NodeView};

/// Routes the project may put on its router.
const QUOTA: usize = 3;

const EXEMPTIONS: [Exemption; 2] = [
    Exemption {
        check: Check::ErrorClasses,
        reason: "neutron-server has no fault knobs; the classification of Neutron's answers is unit-tested in src/client.rs",
    },
    Exemption {
        check: Check::RequestCounters,
        reason: "neutron-server does not report how many requests it served",
    },
];

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
    let nodes: Vec<NodeView> = (0..2u8)
        .map(|i| {
            NodeView::new(format!("node-{i}"), format!("uid-{i}"), &[]).with_addresses(vec![
                NodeAddress::internal_ip(format!("10.0.0.{}", i + 5)),
                NodeAddress::internal_ip(format!("fd00:0:0:1::{}", i + 5)),
            ])
        })
        .collect();
    let mut config = OpenStackConfig::noauth(&server.url, &router.router_id);
    config.update_mode = mode;
    let cloud = OpenStackRoutes::new(config).expect("a valid config");
    Subject::new(Arc::new(cloud), "conformance", nodes).with_quota(QUOTA)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openstack_provider_conforms_with_atomic_updates() {
    tokio::time::timeout(
        Duration::from_secs(300),
        run_all(async || subject(UpdateMode::Auto).await, &EXEMPTIONS),
    )
    .await
    .expect("the suite finishes in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openstack_provider_conforms_with_whole_list_updates() {
    tokio::time::timeout(
        Duration::from_secs(300),
        run_all(async || subject(UpdateMode::WholeList).await, &EXEMPTIONS),
    )
    .await
    .expect("the suite finishes in time");
}
