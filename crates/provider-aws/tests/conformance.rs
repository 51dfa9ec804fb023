//! The provider conformance suite against moto (started by `scripts/moto.sh`
//! unless `CRC_MOTO_URL` names one), through the recording [`Proxy`]: the
//! proxy injects EC2's error answers and counts the requests the server saw,
//! which moto itself cannot report.
//!
//! One exemption: `quota`. EC2 refuses routes past the table's limit with
//! `RouteLimitExceeded`, but moto never does, so a full table cannot be
//! reached here. That the provider classifies `RouteLimitExceeded` as
//! `QuotaExceeded` is still checked, by `error_classes` through the proxy.

use std::sync::Arc;
use std::time::Duration;

use provider_aws::testing::{self, Proxy};
use provider_aws::{AwsConfig, RateLimitConfig};
use provider_conformance::{Check, Exemption, FaultTable, Op, Subject, run_all_within};
use route_cloud::ErrorKind;
use route_core::NodeView;

/// The proxy's "answer the next request with this EC2 error" knob, with
/// the status and code EC2 answers for each class.
fn faults(proxy: Arc<Proxy>) -> FaultTable<(u16, &'static str)> {
    use ErrorKind::*;
    // The proxy fails whichever request comes next; each operation's first
    // request is the one its classification rests on.
    FaultTable::new(move |_op, &(status, code)| proxy.fail_next(1, status, code))
        .on_every_op([
            (Throttled, (503, "RequestLimitExceeded")),
            (InvalidRequest, (400, "InvalidParameterValue")),
            (Transient, (500, "InternalError")),
            (Permanent, (403, "UnauthorizedOperation")),
        ])
        .on(Op::Create, QuotaExceeded, (400, "RouteLimitExceeded"))
        .on(Op::Delete, NotFound, (400, "InvalidRoute.NotFound"))
}

async fn subject() -> Subject {
    let moto = testing::moto_endpoint().await.expect("moto server");
    let proxy = Arc::new(Proxy::start(&moto).await.expect("the proxy starts"));
    let ec2 = testing::client(&moto).await;
    let net = testing::create_network(&ec2, "10.60.0.0/16", None)
        .await
        .expect("a network");
    let instances = testing::run_instances(&ec2, &net, 2)
        .await
        .expect("instances");
    let nodes: Vec<NodeView> = instances
        .iter()
        .enumerate()
        .map(|(i, inst)| {
            NodeView::new(format!("node-{i}"), format!("uid-{i}"), &[])
                .with_provider_id(&inst.provider_id)
        })
        .collect();
    let config = AwsConfig {
        route_table_id: Some(net.route_table_id.clone()),
        // After a throttle the provider pauses; short here, as the
        // error check throttles on purpose.
        rate_limit: RateLimitConfig {
            throttle_pause_ms: 20,
            ..RateLimitConfig::default()
        },
        ..AwsConfig::default()
    };
    let cloud = testing::provider(&proxy.url(), config)
        .await
        .expect("a valid config");
    let counted = Arc::clone(&proxy);
    Subject::new(
        Arc::new(cloud),
        testing::unique_cluster("conformance"),
        nodes,
    )
    .with_faults(faults(Arc::clone(&proxy)))
    .with_server_requests(move || counted.log().len() as u64)
    .keep_alive(proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aws_provider_conforms() {
    let exemptions = [Exemption {
        check: Check::Quota,
        reason: "moto does not enforce EC2's routes-per-table limit (it never answers RouteLimitExceeded); error_classes checks that answer's classification",
    }];
    run_all_within(Duration::from_secs(300), subject, &exemptions).await;
}
