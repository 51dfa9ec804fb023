//! One mode, one scenario: the real controller loop on a paused clock.
//!
//! [`run_mode`] builds a current-thread tokio runtime with its clock paused,
//! so time only moves when every task waits, and jumps straight to the next
//! timer. In it run: the unchanged [`Controller`] loop (scheduler, planner,
//! executor, status writes), the scenario driver that plays the
//! [`Timeline`] into the [`ApiServer`] model, and the [`MemoryCloud`] behind a
//! [`Probe`]. A day of cluster life costs what the controller's own work
//! costs in CPU, nothing for the waiting.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use provider_memory::{MemoryCloud, MemoryConfigError};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::index::sample;
use route_cloud::CloudRoutes;
use route_controller::{
    BackoffConfig, Controller, ControllerConfig, Fence, Mode, NodeStore, PassKind, Timing,
};
use route_core::{Destination, NodeAddress, NodeView, PlanConfig, PodCidr, Route};
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::ApiServer;
use crate::observe::{Observer, Probe, RouteStats};
use crate::scenario::Scenario;
use crate::timeline::{Action, Timeline};

/// The cluster name the simulated controller runs with.
pub const CLUSTER: &str = "kubernetes";

/// The least time between two watch-mode passes (KEP-5237), as the binary uses.
pub const MIN_INTERVAL: Duration = Duration::from_secs(10);

/// Points of the cumulative-calls series per run (the chart's resolution).
pub const SERIES_POINTS: u32 = 720;

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The cloud settings are unusable.
    #[error(transparent)]
    Cloud(#[from] MemoryConfigError),
    /// The runtime could not be built.
    #[error("cannot build the simulation runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

/// Passes the controller ran.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Passes {
    /// All passes.
    pub total: u64,
    /// Passes that listed the cloud first.
    pub full: u64,
    /// Passes planned against the cached table (incremental).
    pub cached: u64,
    /// Full passes whose list failed.
    pub list_failed: u64,
}

/// Node events the controller saw.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NodeEvents {
    /// Watch events delivered (initial list, changes, heartbeats, the
    /// controller's own condition patches).
    pub delivered: u64,
    /// Kubelet heartbeats among them.
    pub heartbeats: u64,
    /// Events that changed routing-relevant fields (triggers).
    pub triggers: u64,
    /// Events absorbed without a trigger.
    pub absorbed: u64,
}

/// The result of one mode.
#[derive(Debug, Clone, Serialize)]
pub struct ModeReport {
    /// `periodic`, `watch` or `incremental`.
    pub mode: String,
    /// Requests by operation (`list`, `create`, `delete`, `batch`), any result.
    pub calls: BTreeMap<String, u64>,
    /// All requests.
    pub total_calls: u64,
    /// Requests per simulated hour.
    pub calls_per_hour: f64,
    /// Failed requests by error class (`throttled`, `transient`, `conflict`, ...).
    pub failed: BTreeMap<String, u64>,
    /// Answers throttled by the server-side rate limit.
    pub throttled: u64,
    /// Creations and deletions that took effect.
    pub mutations: u64,
    /// The scenario's minimum plus one repair per route removed behind the
    /// controller's back in this run.
    pub minimum_mutations: u64,
    /// Routes removed behind the controller's back in this run.
    pub routes_removed_behind: u64,
    /// Node-to-route latency and missing-route time.
    pub routes: RouteStats,
    /// Passes.
    pub passes: Passes,
    /// Node events.
    pub node_events: NodeEvents,
    /// NetworkUnavailable patches written.
    pub condition_writes: u64,
    /// Warning Events by reason.
    pub warnings: BTreeMap<String, u64>,
    /// Routes in the cloud at the end, and Nodes alive at the end.
    pub routes_at_end: u64,
    /// Nodes alive at the end.
    pub nodes_at_end: u64,
    /// Wall-clock seconds the run took.
    pub wall_seconds: f64,
    /// Width of one step of `cumulative_calls`, seconds.
    pub series_step_s: f64,
    /// Cumulative requests at the end of each step.
    pub cumulative_calls: Vec<u64>,
}

fn node_view(spec: &crate::timeline::NodeSpec, with_cidr: bool) -> NodeView {
    let cidrs: Vec<String> = if with_cidr {
        vec![spec.cidr.to_string()]
    } else {
        Vec::new()
    };
    let refs: Vec<&str> = cidrs.iter().map(String::as_str).collect();
    NodeView::new(&spec.name, &spec.uid, &refs)
        .with_addresses(vec![
            NodeAddress::internal_ip(spec.address.to_string()),
            NodeAddress {
                kind: "Hostname".into(),
                address: spec.name.clone().into(),
            },
        ])
        .with_provider_id(format!("sim:///{}", spec.name))
}

/// Runs `scenario` (as `timeline`) in `mode` and measures it.
pub fn run_mode(
    scenario: &Scenario,
    timeline: &Timeline,
    mode: Mode,
) -> Result<ModeReport, RunError> {
    let wall = std::time::Instant::now();
    let cloud = MemoryCloud::new(scenario.cloud.memory_config(scenario.seed))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    let mut report = rt.block_on(simulate_mode(scenario, timeline, mode, cloud));
    // Dropping the runtime ends the controller and every helper task.
    drop(rt);
    report.wall_seconds = wall.elapsed().as_secs_f64();
    Ok(report)
}

async fn simulate_mode(
    scenario: &Scenario,
    timeline: &Timeline,
    mode: Mode,
    cloud: MemoryCloud,
) -> ModeReport {
    let start = Instant::now();
    let duration = scenario.duration.0;
    let end = start + duration;
    let step = duration / SERIES_POINTS;
    let tables: Vec<route_core::Text> = cloud.targets();
    let obs = Arc::new(Observer::new(start, end, step).with_tables(tables.clone()));
    let store = NodeStore::new(None);
    let api = Arc::new(ApiServer::new(store.clone()));

    // The cluster at the start, and the cloud's table if it already has routes.
    let initial: Vec<NodeView> = timeline.nodes[..timeline.initial as usize]
        .iter()
        .map(|n| node_view(n, true))
        .collect();
    for (spec, view) in timeline.nodes.iter().zip(&initial) {
        obs.node_visible(&spec.name, spec.cidr);
        if scenario.routes_exist_at_start {
            let route = Route::new(&spec.name, Destination::Cidr(spec.cidr))
                .with_addresses(
                    view.addresses.clone(),
                    scenario.cloud.reports_node_addresses,
                )
                .named(format!("{CLUSTER}-{}-{}", spec.uid, spec.cidr));
            let mut route = route;
            route.next_hop = spec.address.to_string().into();
            route.node_provider_id = view.provider_id.as_deref().map(Into::into);
            if tables.is_empty() {
                cloud.insert_route(CLUSTER, route);
            } else {
                for t in &tables {
                    cloud.insert_route(CLUSTER, route.clone().in_table(t.clone()));
                }
            }
            obs.preexisting(&spec.name);
        }
    }
    api.initial_list(initial);

    let cfg = ControllerConfig {
        cluster_name: CLUSTER.into(),
        plan: PlanConfig {
            cluster_cidrs: scenario.cluster().into_iter().collect(),
            ..PlanConfig::default()
        },
        mode,
        timing: Timing {
            period: scenario.controller.route_reconciliation_period.0,
            min_interval: MIN_INTERVAL,
            resync: timeline.resync,
            discovery: route_controller::schedule::DEFAULT_DISCOVERY_PERIOD,
            drift: scenario.controller.route_drift_check_period.0,
        },
        backoff: BackoffConfig {
            jitter: scenario.controller.retry_jitter,
            ..BackoffConfig::default()
        },
        status_concurrency: scenario.controller.status_concurrency,
        deletion_grace: route_controller::controller::DEFAULT_DELETION_GRACE,
        // The simulation measures calls, not safety: nothing is held.
        bounds: route_controller::bounds::Bounds::NONE,
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (_leader, leader_rx) = watch::channel(true);
    let shutdown = CancellationToken::new();
    let probe = Probe::new(cloud.with_caller("controller"), obs.clone());
    let controller = Controller::new(
        cfg,
        store.clone(),
        Arc::new(probe) as Arc<dyn CloudRoutes>,
        api.clone(),
        Fence::default(),
        None,
    )
    .with_reports(tx);
    tokio::spawn(controller.run(leader_rx, shutdown.clone()));

    let passes = Arc::new(Mutex::new(Passes::default()));
    {
        let passes = passes.clone();
        tokio::spawn(async move {
            while let Some(r) = rx.recv().await {
                if Instant::now() > end {
                    break;
                }
                let mut p = passes.lock().unwrap_or_else(|e| e.into_inner());
                p.total += 1;
                match r.kind {
                    PassKind::Full => p.full += 1,
                    PassKind::Cached => p.cached += 1,
                }
                if r.list_error.is_some() {
                    p.list_failed += 1;
                }
            }
        });
    }
    if scenario.cloud.other_calls_per_hour > 0 {
        // Other clients of the same API budget; not the controller's calls.
        let other = cloud.with_caller("other-clients");
        let every =
            Duration::from_secs_f64(3600.0 / f64::from(scenario.cloud.other_calls_per_hour));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let _ = other.list_routes("other-clients").await;
            }
        });
    }

    let mut driver = Driver {
        scenario,
        timeline,
        api: &api,
        cloud: &cloud,
        obs: &obs,
        alive: vec![false; timeline.nodes.len()],
        heap: BinaryHeap::new(),
        rng: StdRng::seed_from_u64(scenario.seed ^ 0x0005_eed0_fbac),
        heartbeats: 0,
        removed: 0,
        strays: 0,
    };
    driver.run(start).await;
    // Work that starts at the last instant (a periodic pass, a zero-latency
    // call) is part of the run; anything later is cut off.
    tokio::time::sleep_until(end + Duration::from_millis(1)).await;
    shutdown.cancel();

    let calls = obs.calls();
    let mut by_op: BTreeMap<String, u64> = BTreeMap::new();
    let mut failed: BTreeMap<String, u64> = BTreeMap::new();
    for ((op, result), n) in &calls {
        *by_op.entry((*op).to_string()).or_default() += n;
        if *result != "ok" {
            *failed.entry((*result).to_string()).or_default() += n;
        }
    }
    let total_calls: u64 = by_op.values().sum();
    let stats = store.stats();
    let delivered = api.events_delivered();
    let passes = passes.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let hours = duration.as_secs_f64() / 3600.0;
    ModeReport {
        mode: mode.as_str().to_string(),
        total_calls,
        calls_per_hour: total_calls as f64 / hours,
        throttled: failed.get("throttled").copied().unwrap_or(0),
        calls: by_op,
        failed,
        mutations: obs.mutations(),
        minimum_mutations: timeline.minimum.total() + driver.removed,
        routes_removed_behind: driver.removed,
        routes: obs.route_stats(),
        passes,
        node_events: NodeEvents {
            delivered,
            heartbeats: driver.heartbeats,
            triggers: stats.triggers,
            absorbed: stats.absorbed,
        },
        condition_writes: api.condition_writes(),
        warnings: api.warnings(),
        routes_at_end: cloud.routes(CLUSTER).len() as u64,
        nodes_at_end: store.len() as u64,
        wall_seconds: 0.0,
        series_step_s: obs.bucket().as_secs_f64(),
        cumulative_calls: obs.cumulative(),
    }
}

/// Plays the timeline: Node changes, heartbeats and changes behind the
/// controller's back, each at its virtual time.
struct Driver<'a> {
    scenario: &'a Scenario,
    timeline: &'a Timeline,
    api: &'a ApiServer,
    cloud: &'a MemoryCloud,
    obs: &'a Observer,
    alive: Vec<bool>,
    /// Next heartbeat of each live Node.
    heap: BinaryHeap<Reverse<(Duration, u32)>>,
    /// Picks the routes removed behind the controller's back; separate from
    /// the timeline's RNG because the choice depends on the cloud's table.
    rng: StdRng,
    heartbeats: u64,
    removed: u64,
    strays: u64,
}

impl Driver<'_> {
    async fn run(&mut self, start: Instant) {
        let period = self.scenario.heartbeat_period.0;
        let end = self.scenario.duration.0;
        for id in 0..self.timeline.initial {
            self.alive[id as usize] = true;
            self.schedule_heartbeat(id, Duration::ZERO);
        }
        let actions = &self.timeline.actions;
        let mut next_action = 0;
        loop {
            let a = actions.get(next_action).map(|(t, _)| *t);
            let h = self.heap.peek().map(|Reverse((t, _))| *t);
            let now = match (a, h) {
                (Some(a), Some(h)) => a.min(h),
                (Some(t), None) | (None, Some(t)) => t,
                (None, None) => break,
            };
            if now > end {
                break;
            }
            tokio::time::sleep_until(start + now).await;
            while let Some((t, action)) = actions.get(next_action)
                && *t <= now
            {
                self.apply(*t, action);
                next_action += 1;
            }
            while let Some(&Reverse((t, id))) = self.heap.peek()
                && t <= now
            {
                self.heap.pop();
                if self.alive[id as usize] {
                    let name = &self.timeline.nodes[id as usize].name;
                    self.api.heartbeat(name);
                    self.heartbeats += 1;
                    self.heap.push(Reverse((t + period, id)));
                }
            }
        }
    }

    fn schedule_heartbeat(&mut self, id: u32, now: Duration) {
        if !self.scenario.heartbeat_period.0.is_zero() {
            let first = now + self.timeline.heartbeat_phase[id as usize];
            self.heap.push(Reverse((first, id)));
        }
    }

    fn apply(&mut self, now: Duration, action: &Action) {
        let nodes = &self.timeline.nodes;
        match action {
            Action::Create(id) => {
                let spec = &nodes[*id as usize];
                let with_cidr = self.scenario.pod_cidr_delay.0.is_zero();
                self.api.create(node_view(spec, with_cidr));
                if with_cidr {
                    self.obs.node_visible(&spec.name, spec.cidr);
                }
                self.alive[*id as usize] = true;
                self.schedule_heartbeat(*id, now);
            }
            Action::AssignCidr(id) => {
                let spec = &nodes[*id as usize];
                if self.alive[*id as usize] {
                    self.api.update(&spec.name, |v| {
                        v.pod_cidrs = vec![PodCidr::Valid(spec.cidr)]
                    });
                    self.obs.node_visible(&spec.name, spec.cidr);
                }
            }
            Action::Delete(id) => {
                let spec = &nodes[*id as usize];
                self.alive[*id as usize] = false;
                self.api.delete(&spec.name);
                self.obs.node_gone(&spec.name);
            }
            Action::ChangeAddress(id, addr) => {
                let spec = &nodes[*id as usize];
                self.api.update(&spec.name, |v| {
                    if let Some(a) = v.addresses.iter_mut().find(|a| a.kind == "InternalIP") {
                        a.address = addr.to_string().into();
                    }
                });
            }
            Action::RemoveRoutes(n) => {
                // Only routes of live Nodes: removing a route that is due for
                // deletion anyway would not need a repair.
                let candidates: Vec<Route> = self
                    .cloud
                    .routes(CLUSTER)
                    .into_iter()
                    .filter(|r| self.api.exists(&r.node))
                    .collect();
                let k = (*n as usize).min(candidates.len());
                for i in sample(&mut self.rng, candidates.len(), k) {
                    let r = &candidates[i];
                    if self.cloud.remove_route(CLUSTER, &r.destination).is_some() {
                        // Gone from every route table.
                        self.removed += self.cloud.targets().len().max(1) as u64;
                        self.obs
                            .route_down(&r.node, r.destination.cidr(), None, false);
                    }
                }
            }
            Action::StormStart(retry_after) => self.cloud.set_storm(Some(*retry_after)),
            Action::StormEnd => self.cloud.set_storm(None),
            Action::AddStrays(cidrs) => {
                for c in cidrs {
                    self.strays += 1;
                    let r = Route::new(format!("gone-node-{}", self.strays), Destination::Cidr(*c));
                    let tables = self.cloud.targets();
                    if tables.is_empty() {
                        self.cloud.insert_route(CLUSTER, r);
                    } else {
                        for t in tables {
                            self.cloud.insert_route(CLUSTER, r.clone().in_table(t));
                        }
                    }
                }
            }
        }
    }
}
