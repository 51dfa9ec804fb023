//! The provider conformance suite against the in-process simulated cloud,
//! in three shapes: the default (IPv6, no quota), one with batches, and a
//! Hetzner-like one (IPv4 only, a small quota, one change at a time). Both need no exemption.
//! Last, two deliberately broken wrappers show the suite catches a provider
//! that misclassifies an answer.

use std::sync::Arc;

use async_trait::async_trait;
use provider_conformance::{FaultTable, Op, Subject, run_all};
use provider_memory::{LatencyConfig, MemoryCloud, MemoryConfig, Operation};
use route_cloud::{Capabilities, CloudError, CloudRoutes, ErrorKind, RequestStats};
use route_core::{NodeAddress, NodeView, Route};

/// The simulated server's "fail the next call" knob: it answers any class
/// on any operation, so the answer is the class itself.
fn memory_faults(cloud: MemoryCloud) -> FaultTable<ErrorKind> {
    use ErrorKind::*;
    FaultTable::new(move |op, &kind| {
        let op = match op {
            Op::List => Operation::List,
            Op::Create => Operation::Create,
            Op::Delete => Operation::Delete,
        };
        cloud.fail_next(op, 1, kind);
    })
    .on(Op::List, Timeout, Timeout)
    .on_every_op(
        [
            Throttled,
            Conflict,
            NotFound,
            QuotaExceeded,
            InvalidRequest,
            Transient,
            Permanent,
        ]
        .map(|kind| (kind, kind)),
    )
}

fn nodes() -> Vec<NodeView> {
    ["a", "b"]
        .into_iter()
        .enumerate()
        .map(|(i, n)| {
            NodeView::new(n, format!("uid-{n}"), &[])
                .with_addresses(vec![NodeAddress::internal_ip(format!("10.0.0.{}", i + 2))])
                .with_provider_id(format!("memory://{n}"))
        })
        .collect()
}

/// `config` with a few milliseconds per call, so a cancelled call can be
/// cut mid-flight.
fn subject(config: MemoryConfig) -> Subject {
    let cloud = MemoryCloud::new(MemoryConfig {
        latency: LatencyConfig::uniform(5),
        ..config
    })
    .expect("a valid config");
    let quota = cloud.config().max_routes;
    let log = cloud.clone();
    let mut s = Subject::new(Arc::new(cloud.clone()), "conformance", nodes())
        .with_faults(memory_faults(cloud))
        .with_server_requests(move || log.log().len() as u64);
    if let Some(max) = quota {
        s = s.with_quota(max);
    }
    s
}

#[tokio::test]
async fn the_default_memory_cloud_conforms() {
    run_all(async || subject(MemoryConfig::default()), &[]).await;
}

#[tokio::test]
async fn a_batching_memory_cloud_conforms() {
    let config = MemoryConfig {
        supports_batch: true,
        ..MemoryConfig::default()
    };
    run_all(async || subject(config.clone()), &[]).await;
}

#[tokio::test]
async fn a_hetzner_shaped_memory_cloud_conforms() {
    let config = MemoryConfig {
        max_routes: Some(3),
        ..MemoryConfig::hetzner_like()
    };
    run_all(async || subject(config.clone()), &[]).await;
}

/// A provider that answers `Permanent` where the cloud said `NotFound`.
struct Misclassifying(MemoryCloud);

#[async_trait]
impl CloudRoutes for Misclassifying {
    fn name(&self) -> &'static str {
        "misclassifying"
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    fn stats(&self) -> &RequestStats {
        self.0.stats()
    }
    async fn list_routes(&self, cluster: &str) -> Result<Vec<Route>, CloudError> {
        self.0.list_routes(cluster).await
    }
    async fn create_route(
        &self,
        cluster: &str,
        hint: &str,
        route: &Route,
    ) -> Result<Route, CloudError> {
        self.0.create_route(cluster, hint, route).await
    }
    async fn delete_route(&self, cluster: &str, route: &Route) -> Result<(), CloudError> {
        self.0
            .delete_route(cluster, route)
            .await
            .map_err(|e| match e.kind {
                ErrorKind::NotFound => CloudError::new(ErrorKind::Permanent, e.message),
                _ => e,
            })
    }
}

#[tokio::test]
async fn the_suite_catches_a_provider_that_misclassifies_not_found() {
    let cloud = MemoryCloud::default();
    let broken = Subject::new(Arc::new(Misclassifying(cloud.clone())), "c", nodes())
        .with_faults(memory_faults(cloud));
    let e = provider_conformance::delete_gone(&broken)
        .await
        .unwrap_err();
    assert!(e.contains("permanent"), "{e}");
    let e = provider_conformance::error_classes(&broken)
        .await
        .unwrap_err();
    assert!(e.contains("delete with an injected not_found"), "{e}");
    // The checks that do not involve the broken path still pass.
    provider_conformance::list_after_create(&broken)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_missing_knob_fails_instead_of_passing_quietly() {
    let bare = Subject::new(Arc::new(MemoryCloud::default()), "c", nodes());
    for check in [
        provider_conformance::Check::ErrorClasses,
        provider_conformance::Check::RequestCounters,
    ] {
        let e = provider_conformance::run(check, &bare).await.unwrap_err();
        assert!(e.contains("exempt"), "{check}: {e}");
    }
    // A cloud whose capabilities claim a limit needs a stated quota.
    let limited = MemoryCloud::new(MemoryConfig {
        max_routes: Some(5),
        ..MemoryConfig::default()
    })
    .expect("a valid config");
    let bare = Subject::new(Arc::new(limited), "c", nodes());
    let e = provider_conformance::quota(&bare).await.unwrap_err();
    assert!(e.contains("exempt"), "{e}");
}
