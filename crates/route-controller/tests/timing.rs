//! Timing semantics of the three modes, on tokio's paused clock.
//!
//! The controller runs its real loop, scheduler, planner and executor against
//! the simulated cloud; Nodes are fed straight into the [`NodeStore`] the way
//! the watcher feeds it, and status writes land in a recording writer.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

use provider_memory::{MemoryCloud, MemoryConfig, Operation};
use route_cloud::{CloudRoutes, ErrorKind};
use route_controller::testing::{CLUSTER, Fixture, Running};
use route_controller::{Mode, NodeEvent};
use route_core::{NetworkCondition, NodeAddress, NodeView};
use tokio::time::{Instant, sleep};

/// The running controller and the simulated cloud behind it.
struct Harness {
    run: Running,
    cloud: MemoryCloud,
}

impl Deref for Harness {
    type Target = Running;
    fn deref(&self) -> &Running {
        &self.run
    }
}

impl DerefMut for Harness {
    fn deref_mut(&mut self) -> &mut Running {
        &mut self.run
    }
}

fn node(i: usize) -> NodeView {
    NodeView::new(
        format!("node-{i}"),
        format!("uid-{i}"),
        &[&format!("10.244.{}.{}/26", i / 4, (i % 4) * 64)],
    )
    .with_addresses(vec![NodeAddress::internal_ip(format!(
        "10.0.{}.{}",
        i / 250,
        i % 250 + 1
    ))])
}

fn start(mode: Mode, cloud: MemoryCloud, initial: &[NodeView]) -> Harness {
    let provider = Arc::new(cloud.clone()) as Arc<dyn CloudRoutes>;
    start_on(mode, cloud, provider, initial)
}

/// `start` with the drift check every `drift`.
fn start_with_drift(
    mode: Mode,
    cloud: MemoryCloud,
    initial: &[NodeView],
    drift: Duration,
) -> Harness {
    let provider = Arc::new(cloud.clone()) as Arc<dyn CloudRoutes>;
    start_full(mode, cloud, provider, initial, drift)
}

/// `start` with the controller talking to `provider`, which fronts `cloud`.
fn start_on(
    mode: Mode,
    cloud: MemoryCloud,
    provider: Arc<dyn CloudRoutes>,
    initial: &[NodeView],
) -> Harness {
    start_full(mode, cloud, provider, initial, Duration::ZERO)
}

fn start_full(
    mode: Mode,
    cloud: MemoryCloud,
    provider: Arc<dyn CloudRoutes>,
    initial: &[NodeView],
    drift: Duration,
) -> Harness {
    let mut fx = Fixture::new(mode, initial);
    fx.config.timing.drift = drift;
    // The production grace: these tests time deletions as the binary does.
    fx.config.deletion_grace = route_controller::controller::DEFAULT_DELETION_GRACE;
    Harness {
        run: fx.start(provider),
        cloud,
    }
}

impl Harness {
    fn lists(&self) -> u64 {
        self.cloud.stats().total("list")
    }
    fn mutations(&self) -> u64 {
        self.cloud.stats().total("create") + self.cloud.stats().total("delete")
    }
}

#[tokio::test(start_paused = true)]
async fn periodic_lists_every_period_from_pass_start_and_ignores_events() {
    let mut h = start(Mode::Periodic, MemoryCloud::default(), &[node(0)]);
    sleep(Duration::from_millis(1)).await;
    assert_eq!(h.lists(), 1, "first pass right after the cache synced");
    h.nodes.apply(NodeEvent::Apply(node(1)));
    sleep(Duration::from_secs(5)).await;
    assert_eq!(h.lists(), 1, "node events do not trigger in periodic mode");
    sleep(Duration::from_secs(60)).await;
    // Passes at 0, 10, ..., 60 s.
    assert_eq!(h.lists(), 7);
    assert_eq!(h.cloud.routes(CLUSTER).len(), 2);
    assert!(h.passes().iter().all(|p| p.trigger.as_str() == "periodic"));
}

#[tokio::test(start_paused = true)]
async fn watch_spaces_passes_ten_seconds_but_runs_at_once_after_quiet() {
    let mut h = start(Mode::Watch, MemoryCloud::default(), &[node(0)]);
    let t0 = Instant::now();
    sleep(Duration::from_millis(1)).await;
    assert_eq!(h.lists(), 1);
    // A trigger 1 s after the first pass waits until 10 s after it started.
    sleep(Duration::from_secs(1)).await;
    h.nodes.apply(NodeEvent::Apply(node(1)));
    sleep(Duration::from_millis(8_900)).await;
    assert_eq!(h.lists(), 1, "no pass before the 10 s spacing");
    sleep(Duration::from_millis(200)).await;
    assert_eq!(h.lists(), 2);
    let second = h.passes().pop().unwrap();
    assert_eq!(second.trigger.as_str(), "node_change");
    assert!(t0.elapsed() >= Duration::from_secs(10));
    // Quiet for a minute: the next trigger runs immediately (no token debt).
    sleep(Duration::from_secs(60)).await;
    let before = Instant::now();
    h.nodes.apply(NodeEvent::Apply(node(2)));
    sleep(Duration::from_millis(1)).await;
    assert_eq!(h.lists(), 3);
    assert!(before.elapsed() < Duration::from_millis(10));
    assert_eq!(h.cloud.routes(CLUSTER).len(), 3);
}

#[tokio::test(start_paused = true)]
async fn watch_burst_of_1000_additions_gives_at_most_two_full_passes() {
    let mut h = start(Mode::Watch, MemoryCloud::default(), &[]);
    sleep(Duration::from_millis(1)).await;
    for i in 0..1000 {
        h.nodes.apply(NodeEvent::Apply(node(i)));
    }
    sleep(Duration::from_secs(30)).await;
    let passes = h.passes();
    // The start-up pass plus one for the whole burst.
    assert_eq!(
        passes.len(),
        2,
        "{:?}",
        passes.iter().map(|p| p.trigger).collect::<Vec<_>>()
    );
    assert_eq!(h.lists(), 2);
    assert_eq!(h.cloud.routes(CLUSTER).len(), 1000);
}

#[tokio::test(start_paused = true)]
async fn incremental_burst_of_1000_additions_needs_no_list_beyond_startup() {
    let h = start(Mode::Incremental, MemoryCloud::default(), &[]);
    sleep(Duration::from_millis(1)).await;
    assert_eq!(h.lists(), 1);
    for i in 0..1000 {
        h.nodes.apply(NodeEvent::Apply(node(i)));
        if i % 100 == 0 {
            tokio::task::yield_now().await;
        }
    }
    sleep(Duration::from_secs(30)).await;
    assert_eq!(
        h.lists(),
        1,
        "node events are planned against the cached table"
    );
    assert_eq!(h.cloud.routes(CLUSTER).len(), 1000);
    assert_eq!(
        h.mutations(),
        1000,
        "exactly the minimum: one create per node"
    );
    assert_eq!(
        h.status.condition_of("node-999"),
        Some(NetworkCondition::RouteCreated)
    );
}

#[tokio::test(start_paused = true)]
async fn incremental_routes_a_new_node_without_waiting() {
    let h = start(Mode::Incremental, MemoryCloud::default(), &[]);
    sleep(Duration::from_millis(1)).await;
    let t = Instant::now();
    h.nodes.apply(NodeEvent::Apply(node(7)));
    while h.cloud.routes(CLUSTER).is_empty() {
        sleep(Duration::from_millis(1)).await;
    }
    assert!(t.elapsed() <= Duration::from_millis(2), "{:?}", t.elapsed());
}

#[tokio::test(start_paused = true)]
async fn heartbeats_cause_no_pass_and_no_cloud_call() {
    for mode in [Mode::Watch, Mode::Incremental] {
        let mut h = start(mode, MemoryCloud::default(), &[node(0), node(1)]);
        sleep(Duration::from_secs(1)).await;
        let (lists, mutations, passes) = (h.lists(), h.mutations(), h.passes().len());
        for i in 0..200 {
            // A kubelet heartbeat changes conditions only.
            let n = node(i % 2).with_condition("False", "RouteCreated");
            h.nodes.apply(NodeEvent::Apply(n));
            sleep(Duration::from_secs(1)).await;
        }
        assert_eq!(
            h.passes().len(),
            0,
            "{mode:?}: no pass after {passes} start-up passes"
        );
        assert_eq!((h.lists(), h.mutations()), (lists, mutations), "{mode:?}");
        assert_eq!(h.nodes.stats().absorbed, 200);
    }
}

#[tokio::test(start_paused = true)]
async fn failed_creation_is_retried_with_backoff_without_new_events() {
    for mode in [Mode::Periodic, Mode::Watch, Mode::Incremental] {
        let cloud = MemoryCloud::default();
        cloud.fail_next(Operation::Create, 3, ErrorKind::Transient);
        let h = start(mode, cloud, &[node(0)]);
        sleep(Duration::from_millis(1)).await;
        assert_eq!(
            h.status.condition_of("node-0"),
            Some(NetworkCondition::NoRouteCreated),
            "{mode:?}"
        );
        sleep(Duration::from_secs(40)).await;
        assert_eq!(
            h.cloud.routes(CLUSTER).len(),
            1,
            "{mode:?}: retried until it succeeded"
        );
        assert_eq!(
            h.cloud.stats().total("create"),
            4,
            "{mode:?}: 3 failures then success"
        );
        assert_eq!(
            h.status.condition_of("node-0"),
            Some(NetworkCondition::RouteCreated),
            "{mode:?}"
        );
        let events = h.status.recorded().events;
        assert_eq!(events.len(), 3, "{mode:?}: one event per failed attempt");
        assert!(
            events
                .iter()
                .all(|(n, r, _)| n.name == "node-0" && r == "FailedToCreateRoute")
        );
    }
}

#[tokio::test(start_paused = true)]
async fn backoff_doubles_between_attempts() {
    let cloud = MemoryCloud::default();
    cloud.fail_next(Operation::Create, 4, ErrorKind::Transient);
    let h = start(Mode::Incremental, cloud, &[node(0)]);
    sleep(Duration::from_secs(60)).await;
    let t: Vec<Instant> = h
        .cloud
        .log()
        .iter()
        .filter(|c| c.op == Operation::Create)
        .map(|c| c.at)
        .collect();
    assert_eq!(t.len(), 5);
    let gaps: Vec<u64> = t.windows(2).map(|w| (w[1] - w[0]).as_secs()).collect();
    assert_eq!(gaps, vec![1, 2, 4, 8]);
}

#[tokio::test(start_paused = true)]
async fn incremental_resyncs_once_per_resync_interval_and_repairs_drift() {
    let h = start(
        Mode::Incremental,
        MemoryCloud::default(),
        &[node(0), node(1)],
    );
    sleep(Duration::from_secs(1)).await;
    assert_eq!(h.cloud.routes(CLUSTER).len(), 2);
    // A route vanishes behind the controller's back.
    let gone = h.cloud.routes(CLUSTER)[0].destination.clone();
    h.cloud.remove_route(CLUSTER, &gone);
    sleep(Duration::from_secs(11 * 3600)).await;
    assert_eq!(h.lists(), 1, "no list before the resync");
    assert_eq!(h.cloud.routes(CLUSTER).len(), 1);
    sleep(Duration::from_secs(3600 + 10)).await;
    assert_eq!(h.lists(), 2, "one resync at 12 h");
    assert_eq!(
        h.cloud.routes(CLUSTER).len(),
        2,
        "the resync repaired the drift"
    );
}

#[tokio::test(start_paused = true)]
async fn already_exists_makes_incremental_relist_spaced_by_ten_seconds() {
    let h = start(Mode::Incremental, MemoryCloud::default(), &[node(0)]);
    sleep(Duration::from_secs(1)).await;
    // Someone else creates node-1's route before the controller does.
    let mut pre = route_core::Route::new("node-1", node(1).valid_pod_cidrs()[0]);
    pre.node_addresses = node(1).addresses.clone();
    h.cloud.insert_route(CLUSTER, pre);
    h.nodes.apply(NodeEvent::Apply(node(1)));
    sleep(Duration::from_millis(1)).await;
    assert_eq!(
        h.cloud
            .stats()
            .snapshot()
            .get(&("create", "already_exists")),
        Some(&1)
    );
    assert_eq!(h.lists(), 1);
    sleep(Duration::from_secs(10)).await;
    assert_eq!(
        h.lists(),
        2,
        "the uncertain answer forced one full list, 10 s after the last"
    );
    sleep(Duration::from_secs(60)).await;
    assert_eq!(h.lists(), 2, "and the list settled it");
    assert_eq!(
        h.status.condition_of("node-1"),
        Some(NetworkCondition::RouteCreated)
    );
}

#[tokio::test(start_paused = true)]
async fn throttled_answers_wait_for_retry_after() {
    let cloud = MemoryCloud::new(MemoryConfig {
        rate_limit: Some(provider_memory::RateLimitConfig {
            requests: 60,
            period_secs: 60,
            burst: 5,
        }),
        ..Default::default()
    })
    .unwrap();
    let h = start(Mode::Incremental, cloud, &[]);
    sleep(Duration::from_millis(1)).await;
    for i in 0..40 {
        h.nodes.apply(NodeEvent::Apply(node(i)));
    }
    let t0 = Instant::now();
    sleep(Duration::from_secs(120)).await;
    if h.cloud.routes(CLUSTER).len() != 40 {
        for c in h.cloud.log() {
            eprintln!("{:?} {:?} {:?} {:?}", c.at - t0, c.op, c.node, c.result);
        }
    }
    assert_eq!(
        h.cloud.routes(CLUSTER).len(),
        40,
        "all routes despite throttling"
    );
    let throttled = h
        .cloud
        .stats()
        .snapshot()
        .get(&("create", "throttled"))
        .copied()
        .unwrap_or(0);
    // Without honouring retry-after, 10 concurrent creators would be refused
    // dozens of times; with the gate only the calls already in flight are.
    assert!(throttled <= 10, "throttled {throttled} times");
}

#[tokio::test(start_paused = true)]
async fn full_route_table_refuses_locally_and_frees_up_on_deletion() {
    for mode in [Mode::Incremental, Mode::Watch, Mode::Periodic] {
        full_route_table_in(mode).await;
    }
}

async fn full_route_table_in(mode: Mode) {
    let cloud = MemoryCloud::new(MemoryConfig {
        max_routes: Some(3),
        ..Default::default()
    })
    .expect("a memory cloud with a route limit");
    let h = start(mode, cloud, &[node(0), node(1), node(2), node(3), node(4)]);
    sleep(Duration::from_secs(1)).await;
    assert_eq!(h.cloud.routes(CLUSTER).len(), 3);
    assert_eq!(
        h.cloud.stats().total("create"),
        3,
        "creations that cannot fit are refused without a request"
    );
    let events = h.status.recorded().events;
    let refused: Vec<_> = events
        .iter()
        .filter(|(_, r, _)| r == "RouteQuotaExceeded")
        .collect();
    assert_eq!(refused.len(), 2, "one per waiting Node: {events:?}");
    assert!(
        refused
            .iter()
            .all(|(_, _, m)| m.contains("at most 3 routes"))
    );
    // The third route filled the table: one RouteTableNearlyFull, nothing else.
    let full: Vec<_> = events
        .iter()
        .filter(|(_, r, _)| r == "RouteTableNearlyFull")
        .collect();
    assert_eq!(full.len(), 1, "{events:?}");
    assert!(full[0].2.contains("3 of the 3 routes"), "{full:?}");
    assert_eq!(events.len(), 3, "{events:?}");
    // A deletion makes room, and the waiting creation runs in the next
    // pass, not after its quota backoff (60 s): the pass that lands the
    // deletion releases it. When the deletion runs depends on the mode.
    h.nodes.apply(NodeEvent::Delete(node(0)));
    let deadline = Instant::now() + Duration::from_secs(70);
    while h.cloud.stats().total("delete") == 0 {
        assert!(
            Instant::now() < deadline,
            "{mode:?}: the deletion never ran"
        );
        sleep(Duration::from_millis(5)).await;
    }
    let deleted = Instant::now();
    while h.cloud.stats().total("create") < 4 {
        assert!(
            deleted.elapsed() < Duration::from_secs(60),
            "{mode:?}: the waiting creation never ran"
        );
        sleep(Duration::from_millis(5)).await;
    }
    let took = deleted.elapsed();
    // Incremental: in the pass the deletion's pass wakes at once. Watch and
    // periodic: in the next pass, one interval (10 s here) later, as any
    // follow-up work there.
    let bound = match mode {
        Mode::Incremental => Duration::from_millis(10),
        _ => Duration::from_secs(10) + Duration::from_millis(10),
    };
    assert!(
        took <= bound,
        "{mode:?}: routed {took:?} after the deletion"
    );
    assert_eq!(h.cloud.routes(CLUSTER).len(), 3, "{mode:?}");
    assert_eq!(h.cloud.stats().total("create"), 4, "{mode:?}");
}

fn creations_and_deletions(h: &Harness) -> (u64, u64) {
    (
        h.cloud.stats().total("create"),
        h.cloud.stats().total("delete"),
    )
}

#[tokio::test(start_paused = true)]
async fn node_recreated_with_same_name_cidr_and_instance_keeps_its_route_in_every_mode() {
    // Regression: in incremental mode the delete was acted on at once, so the
    // Node went ~0.5 s without a route before the create.
    for mode in [Mode::Incremental, Mode::Watch, Mode::Periodic] {
        let first = node(0).with_provider_id("aws:///eu-west-1a/i-0aaa");
        let h = start(mode, MemoryCloud::default(), std::slice::from_ref(&first));
        sleep(Duration::from_secs(1)).await;
        assert_eq!(h.cloud.routes(CLUSTER).len(), 1, "{mode:?}");
        let before = creations_and_deletions(&h);
        h.nodes.apply(NodeEvent::Delete(first.clone()));
        sleep(Duration::from_millis(500)).await;
        let mut again = first.clone();
        again.uid = "uid-0-again".into();
        h.nodes.apply(NodeEvent::Apply(again));
        sleep(Duration::from_secs(60)).await;
        assert_eq!(
            creations_and_deletions(&h),
            before,
            "{mode:?}: no route mutation"
        );
        assert_eq!(h.cloud.routes(CLUSTER).len(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn deleted_node_loses_its_route_after_the_grace() {
    let h = start(Mode::Incremental, MemoryCloud::default(), &[node(0)]);
    sleep(Duration::from_secs(1)).await;
    h.nodes.apply(NodeEvent::Delete(node(0)));
    sleep(Duration::from_millis(1_900)).await;
    assert_eq!(h.cloud.routes(CLUSTER).len(), 1, "kept within the grace");
    sleep(Duration::from_millis(200)).await;
    assert!(h.cloud.routes(CLUSTER).is_empty(), "deleted once it passed");
    assert_eq!(h.cloud.stats().total("delete"), 1);
}

#[tokio::test(start_paused = true)]
async fn node_recreated_with_same_name_and_cidr_on_a_new_instance_gets_a_route_to_it() {
    // Regression: the kept route pointed at the old instance while the
    // condition said RouteCreated; no cloud call was made for the CIDR.
    for mode in [Mode::Incremental, Mode::Watch, Mode::Periodic] {
        let first = node(0).with_provider_id("aws:///eu-west-1a/i-0aaa");
        let h = start(mode, MemoryCloud::default(), std::slice::from_ref(&first));
        sleep(Duration::from_secs(1)).await;
        h.nodes.apply(NodeEvent::Delete(first.clone()));
        sleep(Duration::from_millis(300)).await;
        let mut again = first.clone().with_provider_id("aws:///eu-west-1a/i-0bbb");
        again.uid = "uid-0-again".into();
        h.nodes.apply(NodeEvent::Apply(again));
        sleep(Duration::from_secs(15)).await;
        let routes = h.cloud.routes(CLUSTER);
        assert_eq!(routes.len(), 1, "{mode:?}");
        assert_eq!(
            routes[0].node_provider_id.as_deref(),
            Some("aws:///eu-west-1a/i-0bbb"),
            "{mode:?}: the route follows the new instance"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn pod_cidr_before_provider_id_routes_as_soon_as_it_arrives() {
    // Regression: the creation was refused (no providerID), non-retryable
    // errors backed off to 5 minutes and the providerID did not trigger.
    let cloud = MemoryCloud::new(MemoryConfig {
        needs: route_core::TargetNeeds::ProviderId,
        ..Default::default()
    })
    .unwrap();
    for mode in [Mode::Incremental, Mode::Watch, Mode::Periodic] {
        let cloud = MemoryCloud::new(cloud.config()).unwrap();
        let early = NodeView::new("node-0", "uid-0", &["10.244.0.0/26"]);
        let h = start(mode, cloud, &[]);
        sleep(Duration::from_secs(1)).await;
        h.nodes.apply(NodeEvent::Apply(early.clone()));
        sleep(Duration::from_secs(3)).await;
        assert!(h.cloud.routes(CLUSTER).is_empty());
        assert_eq!(
            h.cloud.stats().total("create"),
            0,
            "{mode:?}: no creation is sent that the cloud must refuse"
        );
        assert!(
            h.status.recorded().events.is_empty(),
            "{mode:?}: waiting is not a failure"
        );
        h.nodes.apply(NodeEvent::Apply(
            early
                .clone()
                .with_addresses(vec![NodeAddress::internal_ip("10.0.0.1")])
                .with_provider_id("aws:///eu-west-1a/i-0aaa"),
        ));
        let t = Instant::now();
        while h.cloud.routes(CLUSTER).is_empty() && t.elapsed() < Duration::from_secs(60) {
            sleep(Duration::from_millis(50)).await;
        }
        let waited = t.elapsed();
        // Watch and periodic passes are at least 10 s apart, as upstream's.
        let bound = if mode.caches_route_table() {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(10)
        };
        assert!(
            waited <= bound,
            "{mode:?}: route {waited:?} after the providerID (bound {bound:?})"
        );
        let (_, last) = h.status.recorded().conditions.last().cloned().unwrap();
        assert_eq!(last, NetworkCondition::RouteCreated, "{mode:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn blackhole_of_a_stopped_instance_is_repaired_with_backoff_not_every_pass() {
    // Regression: a route whose instance is stopped was deleted and
    // re-created on every periodic pass (12 mutations a minute).
    let h = start(Mode::Periodic, MemoryCloud::default(), &[node(0)]);
    sleep(Duration::from_secs(1)).await;
    let dest = h.cloud.routes(CLUSTER)[0].destination.clone();
    // The instance is stopped: whatever the route is replaced with points at
    // it again and the cloud reports a blackhole.
    let stop = {
        let cloud = h.cloud.clone();
        let dest = dest.clone();
        tokio::spawn(async move {
            loop {
                cloud.blackhole_route(CLUSTER, &dest);
                sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let before = h.mutations();
    sleep(Duration::from_secs(60)).await;
    let mutations = h.mutations() - before;
    stop.abort();
    // Periodic passes every 10 s: 6 in the minute. The first repair is at
    // once, the next only after the 60 s floor: at most 2 repairs of 2
    // mutations each, instead of 6 × 2.
    assert!(
        mutations <= 4,
        "{mutations} mutations in 60 s for one unrepairable blackhole"
    );
    let events = h.status.recorded().events;
    let blackholed: Vec<_> = events
        .iter()
        .filter(|(_, r, _)| r == "RouteBlackholed")
        .collect();
    assert_eq!(blackholed.len(), 1, "reported once: {events:?}");
    // Once the instance runs again, the next repair sticks and the book forgets it.
    sleep(Duration::from_secs(120)).await;
    assert!(!h.cloud.routes(CLUSTER)[0].blackhole);
}

#[tokio::test(start_paused = true)]
async fn relist_from_a_stale_watch_cache_keeps_the_newest_nodes_route() {
    // A relist served from the API server's watch cache (resourceVersion 0)
    // can predate what the watch already showed; the watch then replays the
    // newer events. The Node missing from the stale list must keep its route.
    let h = start(Mode::Incremental, MemoryCloud::default(), &[node(0)]);
    sleep(Duration::from_secs(1)).await;
    h.nodes.apply(NodeEvent::Apply(node(1)));
    sleep(Duration::from_secs(1)).await;
    assert_eq!(h.cloud.routes(CLUSTER).len(), 2);
    h.nodes.apply(NodeEvent::Init);
    h.nodes.apply(NodeEvent::InitApply(node(0)));
    h.nodes.apply(NodeEvent::InitDone);
    sleep(Duration::from_millis(200)).await;
    h.nodes.apply(NodeEvent::Apply(node(1)));
    sleep(Duration::from_secs(30)).await;
    assert_eq!(h.cloud.stats().total("delete"), 0);
    assert_eq!(h.cloud.routes(CLUSTER).len(), 2);
}

/// A cloud that answers every call `Throttled` from `from` until `until`,
/// each time with a longer retry-after (1 s, 2 s, ... up to 5 s).
struct Storm {
    inner: MemoryCloud,
    from: Instant,
    until: Instant,
    refused: std::sync::atomic::AtomicU32,
}

impl Storm {
    fn weather(&self) -> Result<(), route_cloud::CloudError> {
        let now = Instant::now();
        if now < self.from || now >= self.until {
            return Ok(());
        }
        let n = self
            .refused
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Err(route_cloud::CloudError::throttled(
            "RequestLimitExceeded",
            Some(Duration::from_secs(u64::from(n.min(4)) + 1)),
        ))
    }
}

#[async_trait::async_trait]
impl CloudRoutes for Storm {
    fn name(&self) -> &'static str {
        "storm"
    }
    fn capabilities(&self) -> route_cloud::Capabilities {
        self.inner.capabilities()
    }
    fn stats(&self) -> &route_cloud::RequestStats {
        self.inner.stats()
    }
    async fn list_routes(
        &self,
        cluster: &str,
    ) -> Result<Vec<route_core::Route>, route_cloud::CloudError> {
        self.weather()?;
        self.inner.list_routes(cluster).await
    }
    async fn create_route(
        &self,
        cluster: &str,
        hint: &str,
        route: &route_core::Route,
    ) -> Result<route_core::Route, route_cloud::CloudError> {
        self.weather()?;
        self.inner.create_route(cluster, hint, route).await
    }
    async fn delete_route(
        &self,
        cluster: &str,
        route: &route_core::Route,
    ) -> Result<(), route_cloud::CloudError> {
        self.weather()?;
        self.inner.delete_route(cluster, route).await
    }
}

#[tokio::test(start_paused = true)]
async fn throttling_storm_of_30s_over_50_new_nodes_converges_within_10s_of_its_end() {
    let cloud = MemoryCloud::default();
    // The first pass lists at 0; the storm starts as the Nodes arrive.
    let from = Instant::now() + Duration::from_millis(1);
    let storm = Arc::new(Storm {
        inner: cloud.clone(),
        from,
        until: from + Duration::from_secs(30),
        refused: Default::default(),
    });
    let storm_end = storm.until;
    let h = start_on(Mode::Incremental, cloud, storm.clone(), &[]);
    sleep(Duration::from_millis(1)).await;
    for i in 0..50 {
        h.nodes.apply(NodeEvent::Apply(node(i)));
    }
    let mut converged = None;
    while Instant::now() < storm_end + Duration::from_secs(60) {
        if h.cloud.routes(CLUSTER).len() == 50 {
            converged = Some(Instant::now());
            break;
        }
        sleep(Duration::from_millis(100)).await;
    }
    let refused = storm.refused.load(std::sync::atomic::Ordering::SeqCst);
    let converged = converged.unwrap_or_else(|| {
        panic!(
            "{} of 50 routes a minute after the storm",
            h.cloud.routes(CLUSTER).len()
        )
    });
    // The ramp from one call per 5 s to unpaced takes under 2 s; a route
    // whose own backoff had grown with each throttled probe would come later.
    assert!(
        converged < storm_end + Duration::from_secs(5),
        "converged {:?} after the storm",
        converged - storm_end
    );
    // One probe per retry-after: 1 + 2 + 3 + 4 + 5 + 5 + 5 + 5 s = 30 s.
    assert!(refused <= 9, "{refused} requests refused during the storm");
}

#[tokio::test(start_paused = true)]
async fn retry_due_while_another_retry_is_in_flight_is_not_forgotten() {
    // Regression: with cloud latency, a retry that came due while another
    // pass ran was taken for one blocked by a deletion, and the loop never
    // woke for it (found by the hcloud fault test: 2 of 3 routes in 90 s).
    let cloud = MemoryCloud::default();
    cloud.set_latency(Operation::Create, Duration::from_millis(500));
    cloud.fail_next(Operation::Create, 2, ErrorKind::Transient);
    let h = start(Mode::Incremental, cloud, &[node(0)]);
    sleep(Duration::from_millis(300)).await;
    h.nodes.apply(NodeEvent::Apply(node(1)));
    sleep(Duration::from_secs(10)).await;
    assert_eq!(
        h.cloud.routes(CLUSTER).len(),
        2,
        "both failed creations retried: {:?}",
        h.cloud.log()
    );
}

/// Polls every 100 ms (virtual) for up to `limit` until `done`; how long it took.
async fn time_until(limit: Duration, mut done: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() <= limit {
        if done() {
            return Some(start.elapsed());
        }
        sleep(Duration::from_millis(100)).await;
    }
    None
}

#[tokio::test(start_paused = true)]
async fn a_route_deleted_behind_the_controllers_back_is_back_within_the_drift_period_plus_one_pass_in_every_mode()
 {
    let drift = Duration::from_secs(60);
    for mode in Mode::ALL {
        let h = start_with_drift(mode, MemoryCloud::default(), &[node(0), node(1)], drift);
        sleep(Duration::from_secs(1)).await;
        assert_eq!(h.cloud.routes(CLUSTER).len(), 2, "{mode}");
        let gone = h.cloud.routes(CLUSTER)[0].clone();
        h.cloud.remove_route(CLUSTER, &gone.destination);
        let back = time_until(drift + Duration::from_secs(11), || {
            h.cloud.routes(CLUSTER).len() == 2
        })
        .await;
        assert!(
            back.is_some(),
            "{mode}: not back within {drift:?} plus one pass"
        );
        let repaired: Vec<_> = h
            .status
            .recorded()
            .events
            .into_iter()
            .filter(|(_, reason, _)| reason == "RouteRepaired")
            .collect();
        assert_eq!(
            repaired.len(),
            1,
            "{mode}: one Warning per repair: {repaired:?}"
        );
        assert_eq!(repaired[0].0.name, gone.node.as_str(), "{mode}");
        assert!(
            repaired[0]
                .2
                .contains("was missing: someone else deleted it"),
            "{mode}: {}",
            repaired[0].2
        );
        // An idle hour costs one listing per drift period in the modes that
        // do not list every pass anyway.
        let lists = h.lists();
        sleep(Duration::from_secs(3600)).await;
        let per_hour = h.lists() - lists;
        match mode {
            Mode::Periodic => assert!(per_hour >= 359, "{mode}: {per_hour}"),
            _ => assert!(
                (59..=61).contains(&per_hour),
                "{mode}: {per_hour} lists in an idle hour"
            ),
        }
        assert_eq!(h.cloud.routes(CLUSTER).len(), 2, "{mode}");
    }
}

#[tokio::test(start_paused = true)]
async fn with_the_drift_check_off_incremental_and_watch_do_not_list_before_the_resync() {
    for mode in [Mode::Incremental, Mode::Watch] {
        let h = start(mode, MemoryCloud::default(), &[node(0)]);
        sleep(Duration::from_secs(3600)).await;
        assert_eq!(h.lists(), 1, "{mode}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_node_recreated_with_a_new_pod_cidr_loses_its_old_route_when_the_grace_ends_not_a_period_later()
 {
    // Regression: in periodic and watch the held deletion waited for the next
    // pass, so the old route stayed 20 s where upstream removes it in 10 s.
    for mode in Mode::ALL {
        let first = node(0).with_provider_id("aws:///eu-west-1a/i-0aaa");
        let h = start(mode, MemoryCloud::default(), std::slice::from_ref(&first));
        sleep(Duration::from_secs(1)).await;
        let old = h.cloud.routes(CLUSTER)[0].destination.clone();
        h.nodes.apply(NodeEvent::Delete(first.clone()));
        let mut again = NodeView::new("node-0", "uid-0-again", &["10.244.200.0/26"])
            .with_provider_id("aws:///eu-west-1a/i-0aaa");
        again.addresses = first.addresses.clone();
        h.nodes.apply(NodeEvent::Apply(again));
        let gone = time_until(Duration::from_secs(30), || {
            !h.cloud.routes(CLUSTER).iter().any(|r| r.destination == old)
        })
        .await
        .unwrap_or_else(|| panic!("{mode}: the old route stayed 30 s"));
        // Periodic and watch see the change in their next pass (here 9 s
        // away, when upstream deletes) and delete when the grace (2 s) ends,
        // not a whole period later; incremental sees it at once.
        let bound = match mode {
            Mode::Incremental => Duration::from_millis(2_500),
            _ => Duration::from_millis(11_500),
        };
        assert!(gone <= bound, "{mode}: the old route went after {gone:?}");
        assert_eq!(h.cloud.routes(CLUSTER).len(), 1, "{mode}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_node_waiting_on_a_cidr_another_cluster_freed_is_routed_within_one_drift_period() {
    let drift = Duration::from_secs(60);
    for mode in [Mode::Incremental, Mode::Watch] {
        let cloud = MemoryCloud::default();
        // node(20) has 10.244.5.0/26, inside another cluster's route.
        let mut theirs = route_core::Route::new(
            "",
            route_core::Cidr::parse("10.244.5.0/24").expect("a valid CIDR"),
        );
        theirs.next_hop = "10.99.0.1".into();
        theirs.foreign = Some("cluster other".into());
        cloud.insert_route(CLUSTER, theirs.clone());
        let h = start_with_drift(mode, cloud, &[node(0), node(20)], drift);
        sleep(Duration::from_secs(1)).await;
        assert_eq!(
            h.status.condition_of("node-20"),
            Some(NetworkCondition::PodCidrConflict),
            "{mode}"
        );
        h.cloud.remove_route(CLUSTER, &theirs.destination);
        let routed = time_until(drift + Duration::from_secs(1), || {
            h.status.condition_of("node-20") == Some(NetworkCondition::RouteCreated)
        })
        .await;
        assert!(
            routed.is_some(),
            "{mode}: still waiting after one drift period"
        );
        assert_eq!(h.cloud.routes(CLUSTER).len(), 2, "{mode}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_node_labelled_out_of_the_selection_loses_its_route_in_that_pass_without_the_grace() {
    // README promised the deletion grace here; the label change is
    // deliberate, so the route goes at once and the text says so now.
    let h = start(
        Mode::Incremental,
        MemoryCloud::default(),
        &[node(0), node(1)],
    );
    sleep(Duration::from_secs(1)).await;
    assert_eq!(h.cloud.routes(CLUSTER).len(), 2);
    let mut out = node(1).with_condition("False", "RouteCreated");
    out.excluded = true;
    h.nodes.apply(NodeEvent::Apply(out));
    let gone = time_until(Duration::from_secs(5), || {
        h.cloud.routes(CLUSTER).len() == 1
    })
    .await
    .expect("the left-out Node's route goes");
    assert!(
        gone < route_controller::controller::DEFAULT_DELETION_GRACE,
        "went after {gone:?}"
    );
    assert_eq!(
        h.status.condition_of("node-1"),
        Some(NetworkCondition::NodeExcluded)
    );
}

#[tokio::test(start_paused = true)]
async fn a_node_stops_reading_route_created_once_no_listing_succeeded_for_the_drift_period_plus_one_pass()
 {
    let drift = Duration::from_secs(60);
    for mode in Mode::ALL {
        let h = start_with_drift(mode, MemoryCloud::default(), &[node(0), node(1)], drift);
        sleep(Duration::from_secs(1)).await;
        assert_eq!(
            h.status.condition_of("node-0"),
            Some(NetworkCondition::RouteCreated),
            "{mode}"
        );
        // The cloud stops answering lists (an outage, credentials revoked).
        h.cloud
            .fail_next(Operation::List, u32::MAX, ErrorKind::Transient);
        sleep(drift).await;
        assert_eq!(
            h.status.condition_of("node-0"),
            Some(NetworkCondition::RouteCreated),
            "{mode}: still within the drift period"
        );
        sleep(Duration::from_secs(12)).await;
        for n in ["node-0", "node-1"] {
            assert_eq!(
                h.status.condition_of(n),
                Some(NetworkCondition::RouteUnverified),
                "{mode}: {n} after the drift period plus one pass without a listing"
            );
        }
        assert_eq!(NetworkCondition::RouteUnverified.status(), "Unknown");
        // Listing works again: the next pass says what it sees.
        h.cloud.fail_next(Operation::List, 0, ErrorKind::Transient);
        let back = time_until(Duration::from_secs(310), || {
            h.status.condition_of("node-0") == Some(NetworkCondition::RouteCreated)
        })
        .await;
        assert!(
            back.is_some(),
            "{mode}: RouteCreated again once a listing succeeds"
        );
        assert_eq!(h.mutations(), 2, "{mode}: nothing was re-created");
    }
}
