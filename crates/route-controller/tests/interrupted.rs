//! Nothing the controller set out to do is silently dropped: work the fence
//! cut off, route tables that appear or go while it runs, and repairs the
//! cloud refuses. Each sequence runs in every mode, on tokio's paused clock,
//! with the real loop against the simulated cloud and a leased fence whose
//! deadline counts on that clock (so "the process was paused" is the clock
//! moving while no renewal arrives).

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use provider_memory::{MemoryCloud, MemoryConfig, Operation};
use route_cloud::{CloudRoutes, ErrorKind, TokioClock};
use route_controller::testing::{CLUSTER, Fixture, Running};
use route_controller::{
    Fence, Mode, NodeEvent, NodeRef, RecordingStatusWriter, StatusError, StatusWriter,
};
use route_core::{NetworkCondition, NodeView};
use tokio::time::sleep;
/// The Lease's renew deadline in these tests.
const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// How often the route targets are looked up again in these tests.
const DISCOVERY: Duration = Duration::from_secs(30);

fn node(i: usize) -> NodeView {
    NodeView::new(
        format!("node-{i}"),
        format!("uid-{i}"),
        &[&format!("10.244.{i}.0/24")],
    )
}

/// The recording writer, refusing condition patches while `down` (an API
/// server outage).
struct Api {
    recorded: Arc<RecordingStatusWriter>,
    down: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl StatusWriter for Api {
    async fn set_condition(
        &self,
        node: &NodeRef,
        cond: NetworkCondition,
    ) -> Result<(), StatusError> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StatusError("the API server is unavailable".into()));
        }
        self.recorded.set_condition(node, cond).await
    }

    async fn warn(&self, node: &NodeRef, reason: &str, message: &str) -> Result<(), StatusError> {
        self.recorded.warn(node, reason, message).await
    }
}

/// The running controller, the simulated cloud behind it and the writer
/// that can refuse its patches.
struct Run {
    run: Running,
    cloud: MemoryCloud,
    api: Arc<Api>,
}

impl Deref for Run {
    type Target = Running;
    fn deref(&self) -> &Running {
        &self.run
    }
}

impl Run {
    /// The controller in `mode` over `initial` Nodes, holding a Lease renewed
    /// just now, against `cloud`.
    fn start(mode: Mode, cloud: MemoryCloud, initial: &[NodeView]) -> Run {
        Run::start_resyncing(mode, cloud, initial, Duration::from_secs(12 * 3600))
    }

    /// `start` with a resync every `resync` in watch and incremental.
    fn start_resyncing(
        mode: Mode,
        cloud: MemoryCloud,
        initial: &[NodeView],
        resync: Duration,
    ) -> Run {
        let mut fx = Fixture::new(mode, initial);
        fx.config.timing.resync = resync;
        fx.config.timing.discovery = DISCOVERY;
        let api = Arc::new(Api {
            recorded: fx.status.clone(),
            down: std::sync::atomic::AtomicBool::new(false),
        });
        // A Lease holder's fence, its deadline on the paused clock.
        fx.fence = Fence::leased(Arc::new(TokioClock::new()));
        fx.fence.set_leader(true);
        fx.fence.renewed(fx.fence.mark(), RENEW_DEADLINE);
        let provider = Arc::new(cloud.clone()) as Arc<dyn CloudRoutes>;
        Run {
            run: fx.start_writing_to(provider, api.clone()),
            cloud,
            api,
        }
    }

    fn routed(&self) -> usize {
        self.cloud.routes(CLUSTER).len()
    }

    /// Every Node that reads `RouteCreated` has its route in the cloud.
    fn no_false_route_created(&self, n: usize) {
        let routes = self.cloud.routes(CLUSTER);
        for i in 0..n {
            let name = format!("node-{i}");
            if self.status.condition_of(&name) == Some(NetworkCondition::RouteCreated) {
                assert!(
                    routes.iter().any(|r| r.node.as_str() == name),
                    "{name} reads RouteCreated without a route"
                );
            }
        }
    }

    fn calls(&self, op: Operation) -> usize {
        self.cloud.log().iter().filter(|c| c.op == op).count()
    }
}

/// Renews the Lease every 2 s while switched on, as the election loop does
/// while the API server answers in time.
struct Renewer {
    on: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Renewer {
    fn start(fence: &Fence) -> Renewer {
        let on = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let task = {
            let (fence, on) = (fence.clone(), on.clone());
            tokio::spawn(async move {
                loop {
                    if on.load(std::sync::atomic::Ordering::SeqCst) {
                        fence.renewed(fence.mark(), RENEW_DEADLINE);
                    }
                    sleep(Duration::from_secs(2)).await;
                }
            })
        };
        Renewer { on, task }
    }

    /// Renewals stop arriving (a slow API server, a paused process).
    fn stall(&self) {
        self.on.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// The late renewal arrives; renewals are in time again.
    fn resume(&self, fence: &Fence) -> bool {
        let late = fence.renewed(fence.mark(), RENEW_DEADLINE);
        self.on.store(true, std::sync::atomic::Ordering::SeqCst);
        late
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits (virtual time) until `op` was sent at least once.
async fn until_sent(run: &Run, op: Operation) {
    for _ in 0..600 {
        if run.calls(op) > 0 {
            return;
        }
        sleep(Duration::from_millis(100)).await;
    }
    panic!("no {op:?} sent in 60 s");
}

/// The sequence of issue 23 (1): the Lease renewals stall while 100
/// creations are under way, the renew deadline passes, and the renewal then
/// succeeds (the replica keeps the Lease). Every creation the fence cut off
/// is redone within one pass of the renewal.
#[tokio::test(start_paused = true)]
async fn a_renewal_late_past_the_renew_deadline_during_100_creations_loses_none() {
    for mode in Mode::ALL {
        let cloud = MemoryCloud::new(MemoryConfig::default()).expect("valid");
        // 10 at a time, 1.5 s each: the burst outlasts the renew deadline.
        cloud.set_latency(Operation::Create, Duration::from_millis(1500));
        let run = Run::start(mode, cloud, &[]);
        let renewer = Renewer::start(&run.fence);
        sleep(Duration::from_secs(1)).await;
        for i in 0..100 {
            run.nodes.apply(NodeEvent::Apply(node(i)));
        }
        until_sent(&run, Operation::Create).await;
        renewer.stall();
        sleep(Duration::from_secs(20)).await;
        assert!(!run.fence.is_open(), "{mode}");
        let before = run.routed();
        assert!(
            (1..100).contains(&before),
            "{mode}: the fence cut the burst off ({before} routed)"
        );
        run.no_false_route_created(100);
        run.cloud
            .set_latency(Operation::Create, Duration::from_millis(100));
        assert!(renewer.resume(&run.fence), "{mode}: the renewal is late");
        // One pass: a list where answers were abandoned, then the rest.
        sleep(Duration::from_secs(3)).await;
        assert_eq!(run.routed(), 100, "{mode}: every creation redone");
        for i in 0..100 {
            assert_eq!(
                run.status.condition_of(&format!("node-{i}")),
                Some(NetworkCondition::RouteCreated),
                "{mode}: node-{i}"
            );
        }
        assert_eq!(run.fence.late_renewals(), 1, "{mode}");
    }
}

/// The sequence of issue 23 (1), second half: a sole replica stalls for
/// 20 s (paused, or its API server slow) during a wave of 80 deletions and
/// keeps its Lease. Every route of a deleted Node is gone within 10 s of
/// resuming.
#[tokio::test(start_paused = true)]
async fn a_sole_replica_paused_20s_during_80_deletions_deletes_them_all_after_resuming() {
    for mode in Mode::ALL {
        let cloud = MemoryCloud::new(MemoryConfig::default()).expect("valid");
        let nodes: Vec<NodeView> = (0..80).map(node).collect();
        let run = Run::start(mode, cloud, &nodes);
        let renewer = Renewer::start(&run.fence);
        sleep(Duration::from_secs(2)).await;
        assert_eq!(run.routed(), 80, "{mode}");
        run.cloud
            .set_latency(Operation::Delete, Duration::from_millis(1500));
        for n in &nodes {
            run.nodes.apply(NodeEvent::Delete(n.clone()));
        }
        until_sent(&run, Operation::Delete).await;
        renewer.stall();
        sleep(Duration::from_secs(20)).await;
        assert!(!run.fence.is_open(), "{mode}");
        assert!(run.routed() > 0, "{mode}: the stall cut the wave off");
        let sent = run.calls(Operation::Delete);
        run.cloud
            .set_latency(Operation::Delete, Duration::from_millis(100));
        assert!(renewer.resume(&run.fence), "{mode}: the renewal is late");
        sleep(Duration::from_secs(10)).await;
        assert_eq!(run.routed(), 0, "{mode}: every deleted Node's route gone");
        assert!(run.calls(Operation::Delete) > sent, "{mode}");
    }
}

/// The sequence of issue 23 (2): a route table added to the cluster while it
/// runs gets every Node's route within the discovery period plus one pass;
/// one that goes is dropped and nothing in it is deleted; a Node created
/// after that is routed only where the tables still are.
#[tokio::test(start_paused = true)]
async fn a_route_table_added_at_runtime_is_routed_within_the_discovery_period() {
    for mode in Mode::ALL {
        let cloud = MemoryCloud::new(MemoryConfig {
            targets: vec!["rtb-a".into()],
            ..MemoryConfig::default()
        })
        .expect("valid");
        let nodes: Vec<NodeView> = (0..30).map(node).collect();
        let run = Run::start(mode, cloud, &nodes);
        let _renewer = Renewer::start(&run.fence);
        sleep(Duration::from_secs(2)).await;
        assert_eq!(run.cloud.routes_in(CLUSTER, "rtb-a").len(), 30, "{mode}");
        run.cloud.set_targets(vec!["rtb-a".into(), "rtb-b".into()]);
        sleep(DISCOVERY + Duration::from_secs(2)).await;
        assert_eq!(
            run.cloud.routes_in(CLUSTER, "rtb-b").len(),
            30,
            "{mode}: the new table is routed"
        );
        // The first table loses its tag: dropped, its routes left alone.
        let deletes = run.calls(Operation::Delete);
        run.cloud.set_targets(vec!["rtb-b".into()]);
        sleep(DISCOVERY + Duration::from_secs(2)).await;
        assert_eq!(run.calls(Operation::Delete), deletes, "{mode}");
        run.cloud.set_targets(vec!["rtb-a".into(), "rtb-b".into()]);
        assert_eq!(
            run.cloud.routes_in(CLUSTER, "rtb-a").len(),
            30,
            "{mode}: nothing deleted in the table that went"
        );
        run.cloud.set_targets(vec!["rtb-b".into()]);
        run.nodes.apply(NodeEvent::Apply(node(30)));
        sleep(Duration::from_secs(12)).await;
        assert_eq!(run.cloud.routes_in(CLUSTER, "rtb-b").len(), 31, "{mode}");
    }
}

/// The sequence of issue 23 (3): the instance behind a route is terminated,
/// its route is a blackhole and the cloud refuses every replacement. The
/// repair backs off (60 s doubling): at most 3 attempts in 5 minutes, and
/// one Warning, in every mode.
#[tokio::test(start_paused = true)]
async fn a_blackhole_whose_repair_the_cloud_refuses_is_retried_at_most_3_times_in_5_minutes() {
    for mode in Mode::ALL {
        let cloud = MemoryCloud::new(MemoryConfig::default()).expect("valid");
        // Watch and incremental see a blackhole at a list: their resync.
        let resync = Duration::from_secs(20);
        let run = Run::start_resyncing(mode, cloud, &[node(0), node(1)], resync);
        sleep(Duration::from_secs(2)).await;
        assert_eq!(run.routed(), 2, "{mode}");
        let _renewer = Renewer::start(&run.fence);
        let dest =
            route_core::Destination::Cidr(route_core::Cidr::parse("10.244.1.0/24").expect("valid"));
        // The instance is terminated: its route is a blackhole, and the
        // cloud refuses any route to it.
        assert!(run.cloud.blackhole_route(CLUSTER, &dest));
        run.cloud
            .fail_next(Operation::Create, 1000, ErrorKind::TargetUnavailable);
        let creates = run.calls(Operation::Create);
        sleep(Duration::from_secs(300)).await;
        let attempts = run.cloud.log()[..]
            .iter()
            .filter(|c| {
                c.op == Operation::Create
                    && c.destination.as_ref() == Some(&dest)
                    && c.result.is_err()
            })
            .count();
        assert!(
            (1..=3).contains(&attempts),
            "{mode}: {attempts} refused repairs in 5 minutes"
        );
        let warnings = run
            .status
            .recorded()
            .events
            .iter()
            .filter(|(n, reason, _)| n.name == "node-1" && reason == "FailedToCreateRoute")
            .count();
        assert_eq!(warnings, 1, "{mode}: one Warning");
        assert!(run.calls(Operation::Create) > creates, "{mode}");
    }
}

/// Condition patches that fail (the API server is unavailable for 20 s) are
/// written again once it is back, without another Node event, in every mode.
#[tokio::test(start_paused = true)]
async fn condition_patches_refused_during_an_api_server_outage_are_written_once_it_is_back() {
    for mode in Mode::ALL {
        let cloud = MemoryCloud::new(MemoryConfig::default()).expect("valid");
        let run = Run::start(mode, cloud, &[]);
        let _renewer = Renewer::start(&run.fence);
        sleep(Duration::from_secs(1)).await;
        run.api
            .down
            .store(true, std::sync::atomic::Ordering::SeqCst);
        run.nodes.apply(NodeEvent::Apply(node(0)));
        sleep(Duration::from_secs(12)).await;
        assert_eq!(run.routed(), 1, "{mode}: routed during the outage");
        assert_eq!(run.status.condition_of("node-0"), None, "{mode}");
        run.api
            .down
            .store(false, std::sync::atomic::Ordering::SeqCst);
        // The retry backs off 1 s doubling while the outage lasts: 16 s at most here.
        sleep(Duration::from_secs(20)).await;
        assert_eq!(
            run.status.condition_of("node-0"),
            Some(NetworkCondition::RouteCreated),
            "{mode}: written once the API server is back"
        );
    }
}

/// Found on moto (three tables, one `CreateRoute` answered HTTP 500): the
/// retry of a Node's creation was keyed by Node and destination only, so
/// the same creation succeeding in another table erased the failed one's
/// retry, and in `incremental` nothing sent it again.
#[tokio::test(start_paused = true)]
async fn a_creation_that_failed_in_one_table_is_retried_after_it_succeeded_in_the_others() {
    for mode in Mode::ALL {
        let cloud = MemoryCloud::new(MemoryConfig {
            targets: vec!["rtb-a".into(), "rtb-b".into(), "rtb-c".into()],
            max_concurrent_operations: 1,
            ..MemoryConfig::default()
        })
        .expect("valid");
        let run = Run::start(mode, cloud, &[]);
        let _renewer = Renewer::start(&run.fence);
        sleep(Duration::from_secs(1)).await;
        // One at a time, the first of the three creations fails.
        run.cloud
            .fail_next(Operation::Create, 1, ErrorKind::Transient);
        run.nodes.apply(NodeEvent::Apply(node(0)));
        // Periodic creates at its next period (10 s) and retries at the
        // one after; the others retry after the 1 s backoff.
        sleep(Duration::from_secs(25)).await;
        for t in ["rtb-a", "rtb-b", "rtb-c"] {
            assert_eq!(run.cloud.routes_in(CLUSTER, t).len(), 1, "{mode}: {t}");
        }
    }
}
