//! One benchmark run: a fresh control plane, one controller, and the same
//! cluster life driven through the API for every controller.
//!
//! Phases, in order: a burst of Node creations; the wait until every one of
//! them has its route confirmed; an idle period; a trickle of single Node
//! creations at a steady rate (the reaction time of a controller on a quiet
//! cluster); a scale-down; an address change of a few Nodes; a settle period.
//! Kubelet-like heartbeats (strategic-merge patches of `nodes/status` bumping
//! the Ready condition) run for every live Node throughout.
//!
//! A route counts as confirmed when a watch on Nodes, opened before the first
//! creation, delivers the Node with `NetworkUnavailable=False` and reason
//! `RouteCreated`, the condition both controllers set once a Node's routes
//! exist. Latency runs from just before the create request is sent.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde::Serialize;
use serde_json::json;
use test_cluster::{Binaries, ControlPlane, NETWORK_UNAVAILABLE, StartOptions, TestNode};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::aws::{self, AwsRun, AwsSettings, TableCheck, World};
use crate::controller::{self, Kind, Setup};
use crate::probe::{self, OpCount, ProcSample};
use crate::stats::{Summary, summarize};

/// The cluster life every controller is put through.
#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    /// Nodes created in the burst.
    pub nodes: usize,
    /// Create requests in flight during the burst.
    pub create_concurrency: usize,
    /// Nodes created one by one after the idle period.
    pub trickle: usize,
    /// Gap between two trickle creations.
    #[serde(serialize_with = "secs")]
    pub trickle_interval: Duration,
    /// Each live Node's status is patched once per period.
    #[serde(serialize_with = "secs")]
    pub heartbeat_period: Duration,
    /// Heartbeat patches in flight at most; a heartbeat due while all are
    /// busy is skipped and counted.
    pub heartbeat_concurrency: usize,
    #[serde(serialize_with = "secs")]
    pub idle: Duration,
    /// Burst Nodes deleted in the scale-down.
    pub scale_down: usize,
    /// Surviving burst Nodes whose InternalIP changes.
    pub address_changes: usize,
    #[serde(serialize_with = "secs")]
    pub settle: Duration,
    /// Longest wait for the burst's routes.
    #[serde(serialize_with = "secs")]
    pub converge_timeout: Duration,
    /// Route tables of the cloud (one per zone on AWS): every Node's route
    /// must be in each.
    pub tables: usize,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Scenario {
    /// Cloud mutations no controller can do without: one creation per Node,
    /// one deletion per removed Node, a deletion and a creation per changed
    /// address (the route's target changes).
    /// Each of them once per route table.
    pub fn min_mutations(&self) -> u64 {
        ((self.nodes + self.trickle + self.scale_down + 2 * self.address_changes)
            * self.tables.max(1)) as u64
    }

    /// Routes in the cloud at the end, over all route tables.
    pub fn routes_expected(&self) -> i64 {
        ((self.nodes + self.trickle) as i64 - self.scale_down as i64) * self.tables.max(1) as i64
    }

    /// Indices of the burst Nodes removed in the scale-down, spread evenly.
    fn scale_down_indices(&self) -> Vec<usize> {
        if self.scale_down == 0 || self.nodes == 0 {
            return Vec::new();
        }
        let n = self.scale_down.min(self.nodes);
        (0..n).map(|k| k * self.nodes / n).collect()
    }
}

pub fn node_name(i: usize) -> String {
    format!("node-{i:05}")
}

fn nth_address(base: Ipv4Addr, i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base).wrapping_add(i as u32 + 1))
}

/// Node `i`: pod CIDR `10.<hi>.<lo>.0/24` (cluster CIDR 10.0.0.0/8, so up to
/// 65,536 Nodes), InternalIP from 100.64.0.0/16, a memory-provider id.
pub fn test_node(i: usize) -> TestNode {
    let name = node_name(i);
    TestNode::new(&name)
        .pod_cidrs([pod_cidr(i)])
        .internal_ip(nth_address(Ipv4Addr::new(100, 64, 0, 0), i).to_string())
        .provider_id(format!("memory://{name}"))
}

fn pod_cidr(i: usize) -> String {
    format!("10.{}.{}.0/24", (i >> 8) & 255, i & 255)
}

/// Node `i` for `world`: its instance's provider id (`aws:///<zone>/i-…`)
/// instead of the memory one.
fn node_for(i: usize, world: Option<&World>) -> TestNode {
    let node = test_node(i);
    match world.and_then(|w| w.instances.get(i)) {
        Some(inst) => node.provider_id(inst.provider_id.clone()),
        None => node,
    }
}

pub const CLUSTER_CIDR: &str = "10.0.0.0/8";

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Create times and confirmations, shared with the watch task.
#[derive(Default)]
struct Tracker {
    created: Mutex<HashMap<String, Instant>>,
    confirmed: Mutex<HashMap<String, Duration>>,
}

impl Tracker {
    fn observe(&self, node: &Node) {
        let Some(name) = node.metadata.name.as_deref() else {
            return;
        };
        let ok = test_cluster::condition(node, NETWORK_UNAVAILABLE)
            .is_some_and(|c| c.status == "False" && c.reason.as_deref() == Some("RouteCreated"));
        if !ok {
            return;
        }
        let now = Instant::now();
        let Some(created) = lock(&self.created).get(name).copied() else {
            return;
        };
        lock(&self.confirmed)
            .entry(name.to_owned())
            .or_insert_with(|| now.saturating_duration_since(created));
    }

    fn latencies(&self, names: &[String]) -> (Vec<Duration>, usize) {
        let confirmed = lock(&self.confirmed);
        let got: Vec<Duration> = names
            .iter()
            .filter_map(|n| confirmed.get(n))
            .copied()
            .collect();
        let missing = names.len() - got.len();
        (got, missing)
    }

    async fn wait_all(&self, names: &[String], timeout: Duration) -> Option<Instant> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.latencies(names).1 == 0 {
                return Some(Instant::now());
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Watches Nodes and feeds the tracker; returns once the initial list is in.
async fn start_watch(api: Api<Node>, tracker: Arc<Tracker>) -> anyhow::Result<JoinHandle<()>> {
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(async move {
        let mut ready = Some(ready_tx);
        let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => tracker.observe(&n),
                Ok(watcher::Event::InitDone) => {
                    if let Some(tx) = ready.take() {
                        let _ = tx.send(());
                    }
                }
                Ok(watcher::Event::Delete(_) | watcher::Event::Init) => {}
                Err(e) => {
                    warn!(error = %e, "node watch error; the watcher retries");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(30), ready_rx)
        .await
        .context("node watch did not sync within 30 s")?
        .context("node watch ended before its first list")?;
    Ok(handle)
}

/// Live Nodes by index, shared with the heartbeat task.
#[derive(Default)]
pub(crate) struct Fleet {
    live: Mutex<Vec<Option<String>>>,
}

impl Fleet {
    pub(crate) fn add(&self, i: usize, name: String) {
        let mut live = lock(&self.live);
        if live.len() <= i {
            live.resize(i + 1, None);
        }
        live[i] = Some(name);
    }

    pub(crate) fn remove(&self, i: usize) {
        if let Some(slot) = lock(&self.live).get_mut(i) {
            *slot = None;
        }
    }

    /// Live Nodes whose heartbeat slot is `slot` of `slots`.
    fn in_slot(&self, slot: usize, slots: usize) -> Vec<String> {
        lock(&self.live)
            .iter()
            .skip(slot)
            .step_by(slots.max(1))
            .flatten()
            .cloned()
            .collect()
    }
}

/// Heartbeat counters.
#[derive(Debug, Default)]
pub(crate) struct Beats {
    ok: AtomicU64,
    failed: AtomicU64,
    skipped: AtomicU64,
    latency: Mutex<Vec<Duration>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct HeartbeatReport {
    pub ok: u64,
    pub failed: u64,
    /// Due while `heartbeat_concurrency` patches were still in flight: the
    /// API server (or the driver) could not keep the cadence.
    pub skipped: u64,
    pub per_second: f64,
    pub patch_latency: Option<Summary>,
}

/// Spreads each Node's heartbeat over the period in 100 ms slots, so the
/// load is even rather than a thundering herd every period.
pub(crate) fn start_heartbeats(
    api: Api<Node>,
    fleet: Arc<Fleet>,
    beats: Arc<Beats>,
    period: Duration,
    concurrency: usize,
) -> JoinHandle<()> {
    const TICK: Duration = Duration::from_millis(100);
    let slots = (period.as_millis() / TICK.as_millis()).max(1) as usize;
    let permits = Arc::new(Semaphore::new(concurrency.max(1)));
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(TICK);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut tick: usize = 0;
        loop {
            interval.tick().await;
            for name in fleet.in_slot(tick % slots, slots) {
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    beats.skipped.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                let (api, beats) = (api.clone(), beats.clone());
                tokio::spawn(async move {
                    let began = Instant::now();
                    match api
                        .patch_status(
                            &name,
                            &PatchParams::default(),
                            &Patch::Strategic(heartbeat_patch()),
                        )
                        .await
                    {
                        Ok(_) => {
                            beats.ok.fetch_add(1, Ordering::Relaxed);
                            lock(&beats.latency).push(began.elapsed());
                        }
                        Err(_) => {
                            beats.failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    drop(permit);
                });
            }
            tick = tick.wrapping_add(1);
        }
    })
}

/// What a kubelet sends: the Ready condition with a new heartbeat time
/// (whole seconds, as the API stores it; one period apart, so always a change).
fn heartbeat_patch() -> serde_json::Value {
    let now = Timestamp::from_second(Timestamp::now().as_second()).unwrap_or(Timestamp::UNIX_EPOCH);
    json!({ "status": { "conditions": [{
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
        "lastHeartbeatTime": Time(now),
    }]}})
}

/// One row of the results.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub controller: &'static str,
    pub label: String,
    pub error: Option<String>,
    pub control_plane_startup_seconds: f64,
    /// Controller start to controller stop.
    pub wall_seconds: f64,
    /// First burst creation to the last burst creation answered.
    pub burst_create_seconds: f64,
    /// First burst creation to every burst Node confirmed; `None` on timeout.
    pub converge_seconds: Option<f64>,
    pub burst_latency: Option<Summary>,
    pub burst_unconfirmed: usize,
    pub trickle_latency: Option<Summary>,
    pub trickle_unconfirmed: usize,
    pub calls: BTreeMap<String, OpCount>,
    pub total_calls: u64,
    pub min_mutations: u64,
    pub routes_expected: i64,
    pub routes_at_end: Option<i64>,
    pub controller_process: Option<ProcSample>,
    pub controller_exit_ok: bool,
    pub heartbeats: Option<HeartbeatReport>,
    /// The driver's own CPU during the run (it shares the machine).
    pub driver_cpu_seconds: f64,
    /// 1-minute load average when the controller started and when it was
    /// sampled: other work on the machine shows up here.
    pub load_average: [f64; 2],
    /// `--cloud aws`: what the proxy counted and moto's final table.
    pub aws: Option<AwsRun>,
}

impl RunResult {
    fn failed(kind: Kind, scenario: &Scenario, error: String) -> Self {
        RunResult {
            controller: kind.name(),
            label: kind.label(),
            error: Some(error),
            control_plane_startup_seconds: 0.0,
            wall_seconds: 0.0,
            burst_create_seconds: 0.0,
            converge_seconds: None,
            burst_latency: None,
            burst_unconfirmed: 0,
            trickle_latency: None,
            trickle_unconfirmed: 0,
            calls: BTreeMap::new(),
            total_calls: 0,
            min_mutations: scenario.min_mutations(),
            routes_expected: scenario.routes_expected(),
            routes_at_end: None,
            controller_process: None,
            controller_exit_ok: false,
            heartbeats: None,
            driver_cpu_seconds: 0.0,
            load_average: [0.0; 2],
            aws: None,
        }
    }
}

fn driver_cpu(ticks: u64) -> f64 {
    probe::sample_process(std::process::id(), ticks).map_or(0.0, |s| s.cpu_seconds)
}

/// Runs `kind` through `scenario` on a control plane of its own.
pub async fn run(
    bins: &Binaries,
    setup: &Setup,
    scenario: &Scenario,
    kind: Kind,
    run_dir: &Path,
    aws_settings: Option<AwsSettings>,
) -> RunResult {
    let world = match aws_settings {
        Some(settings) => {
            let name = format!("bench-{}-{}", kind.name(), std::process::id());
            match World::start(&name, scenario.nodes + scenario.trickle, settings).await {
                Ok(w) => Some((w, settings)),
                Err(e) => return RunResult::failed(kind, scenario, format!("moto: {e:#}")),
            }
        }
        None => None,
    };
    let plane_began = Instant::now();
    let plane = match ControlPlane::start_with(bins.clone(), StartOptions::default()).await {
        Ok(p) => p,
        Err(e) => {
            if let Some((w, _)) = world {
                w.stop().await;
            }
            return RunResult::failed(kind, scenario, format!("control plane: {e}"));
        }
    };
    let startup = plane_began.elapsed();
    let result = drive(
        &plane,
        setup,
        scenario,
        kind,
        run_dir,
        world.as_ref().map(|(w, s)| (w, *s)),
    )
    .await;
    if let Err(e) = plane.stop() {
        warn!(error = %e, "stopping the control plane");
    }
    if let Some((w, _)) = world {
        w.stop().await;
    }
    match result {
        Ok(mut r) => {
            r.control_plane_startup_seconds = startup.as_secs_f64();
            r
        }
        Err(e) => RunResult::failed(kind, scenario, format!("{e:#}")),
    }
}

async fn drive(
    plane: &ControlPlane,
    setup: &Setup,
    scenario: &Scenario,
    kind: Kind,
    run_dir: &Path,
    world: Option<(&World, AwsSettings)>,
) -> anyhow::Result<RunResult> {
    let settings = world.map(|(_, s)| s);
    let world = world.map(|(w, _)| w);
    let ticks = probe::clock_ticks();
    let driver_cpu_before = driver_cpu(ticks);
    let client = test_cluster::client_from_kubeconfig(plane.kubeconfig()).await?;
    let api: Api<Node> = Api::all(client);
    let tracker = Arc::new(Tracker::default());
    let watch = start_watch(api.clone(), tracker.clone()).await?;

    std::fs::create_dir_all(run_dir).with_context(|| format!("create {}", run_dir.display()))?;
    let configs = world.map(|w| w.write_configs(run_dir)).transpose()?;
    let mut ctl =
        controller::start(setup, kind, plane.kubeconfig(), run_dir, configs.as_ref()).await?;
    let load_before = probe::load_average();

    let fleet = Arc::new(Fleet::default());
    let beats = Arc::new(Beats::default());
    let beats_began = Instant::now();
    let heartbeats = start_heartbeats(
        api.clone(),
        fleet.clone(),
        beats.clone(),
        scenario.heartbeat_period,
        scenario.heartbeat_concurrency,
    );

    // Burst.
    info!(
        controller = kind.name(),
        nodes = scenario.nodes,
        "burst: creating nodes"
    );
    let burst_names: Vec<String> = (0..scenario.nodes).map(node_name).collect();
    let burst_began = Instant::now();
    // A storm begins once half the burst is created and ends by itself.
    let created = Arc::new(AtomicU64::new(0));
    let storm = match (world, settings) {
        (Some(w), Some(s)) if s.storm_s > 0 => {
            let (proxy, created) = (w.proxy.clone(), created.clone());
            let half = (scenario.nodes / 2) as u64;
            let lasting = Duration::from_secs(s.storm_s);
            Some(tokio::spawn(async move {
                while created.load(Ordering::SeqCst) < half {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let began = Instant::now();
                proxy.throttle_every(1);
                info!(
                    seconds = lasting.as_secs(),
                    "throttle storm: every request answered RequestLimitExceeded"
                );
                tokio::time::sleep(lasting).await;
                proxy.throttle_every(0);
                info!("throttle storm over");
                (began, created.load(Ordering::SeqCst))
            }))
        }
        _ => None,
    };
    futures::stream::iter(0..scenario.nodes)
        .map(|i| {
            let created = created.clone();
            let (api, tracker, fleet) = (&api, &tracker, &fleet);
            async move {
                create(api, tracker, fleet, node_for(i, world)).await?;
                created.fetch_add(1, Ordering::SeqCst);
                Ok::<(), anyhow::Error>(())
            }
        })
        .buffer_unordered(scenario.create_concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await?;
    let burst_create = burst_began.elapsed();
    info!(
        seconds = burst_create.as_secs_f64(),
        "burst: all nodes created; waiting for routes"
    );
    let converged = tracker
        .wait_all(&burst_names, scenario.converge_timeout)
        .await
        .map(|t| t.duration_since(burst_began));
    match converged {
        Some(d) => info!(seconds = d.as_secs_f64(), "burst: every route confirmed"),
        None => warn!("burst: not every route confirmed within the timeout"),
    }
    let storm_at = match storm {
        Some(h) => Some(h.await.context("storm task")?),
        None => None,
    };
    let burst_last_route =
        world.and_then(|w| aws::last_ok_after(&w.proxy, "CreateRoute", burst_began));
    let burst_routes = match world {
        Some(w) => w.table().await?.len(),
        None => 0,
    };

    info!(seconds = scenario.idle.as_secs(), "idle");
    let idle_before = world.map(|w| aws::total(&aws::requests(&w.proxy)));
    tokio::time::sleep(scenario.idle).await;
    let idle_requests = world
        .zip(idle_before)
        .map(|(w, before)| aws::total(&aws::requests(&w.proxy)) - before);
    ensure_alive(&mut ctl)?;

    // Trickle: one Node at a time on a fixed schedule, each create on its own
    // task so a slow answer does not shift the next one.
    info!(
        nodes = scenario.trickle,
        "trickle: creating nodes one by one"
    );
    let trickle_names: Vec<String> = (scenario.nodes..scenario.nodes + scenario.trickle)
        .map(node_name)
        .collect();
    let trickle_began = tokio::time::Instant::now();
    let mut creations = Vec::new();
    for (k, i) in (scenario.nodes..scenario.nodes + scenario.trickle).enumerate() {
        tokio::time::sleep_until(trickle_began + scenario.trickle_interval * k as u32).await;
        let (api, tracker, fleet) = (api.clone(), tracker.clone(), fleet.clone());
        let node = node_for(i, world);
        creations.push(tokio::spawn(async move {
            create(&api, &tracker, &fleet, node).await
        }));
    }
    for c in creations {
        c.await.context("trickle task")??;
    }
    // A periodic or paced controller may take a full period after the last one.
    if tracker
        .wait_all(&trickle_names, Duration::from_secs(60))
        .await
        .is_none()
    {
        warn!("trickle: not every route confirmed within 60 s");
    }
    watch.abort();

    // Scale-down.
    let doomed = scenario.scale_down_indices();
    let scale_down_began = Instant::now();
    // Every other removed Node's instance is terminated first (an
    // autoscaler's scale-down); the rest keep running (a Node deleted from
    // the cluster, its instance left alone).
    let terminated: Vec<usize> = doomed.iter().copied().step_by(2).collect();
    if let Some(w) = world {
        info!(
            instances = terminated.len(),
            "scale-down: terminating instances"
        );
        w.terminate(&terminated).await?;
    }
    info!(nodes = doomed.len(), "scale-down: deleting nodes");
    for &i in &doomed {
        fleet.remove(i);
    }
    delete_nodes(
        &api,
        doomed.iter().map(|&i| node_name(i)),
        scenario.create_concurrency,
    )
    .await?;

    // Address change: the kubelet reports a new InternalIP.
    let changed: Vec<usize> = (0..scenario.nodes)
        .filter(|i| !doomed.contains(i))
        .take(scenario.address_changes)
        .collect();
    info!(nodes = changed.len(), "address change");
    for &i in &changed {
        let ip = nth_address(Ipv4Addr::new(100, 96, 0, 0), i).to_string();
        let patch = json!({ "status": { "addresses": [{ "type": "InternalIP", "address": ip }] } });
        api.patch_status(
            &node_name(i),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .with_context(|| format!("change the address of {}", node_name(i)))?;
    }

    info!(seconds = scenario.settle.as_secs(), "settle");
    tokio::time::sleep(scenario.settle).await;
    ensure_alive(&mut ctl)?;

    let sample = probe::sample_process(ctl.pid, ticks)?;
    let load_after = probe::load_average();
    heartbeats.abort();
    let beats_elapsed = beats_began.elapsed();
    let started = ctl.started;
    let outcome = ctl.stop().await?;
    let wall = started.elapsed();

    let aws_run = match (world, settings) {
        (Some(w), Some(s)) => {
            let requests = aws::requests(&w.proxy);
            let want: BTreeMap<String, String> = (0..scenario.nodes + scenario.trickle)
                .filter(|i| !doomed.contains(i))
                .map(|i| (pod_cidr(i), w.instances[i].id.clone()))
                .collect();
            let table = TableCheck::compare(&w.table().await?, &want);
            let storm = storm_at.map(|(t, created)| {
                (
                    t.duration_since(burst_began).as_secs_f64(),
                    s.storm_s as f64,
                    created,
                )
            });
            Some(AwsRun {
                total_requests: aws::total(&requests),
                throttled: requests.values().map(|c| c.throttled).sum(),
                requests,
                limits: aws::limits(
                    scenario.nodes as u64,
                    scenario.trickle as u64,
                    doomed.len() as u64,
                    s.buckets,
                    storm,
                ),
                burst_last_route_s: burst_last_route,
                burst_routes,
                storm_start_s: storm.map(|(t, _, _)| t),
                last_deletion_s: aws::last_ok_after(&w.proxy, "DeleteRoute", scale_down_began),
                removed_terminated: terminated.len(),
                idle_requests_per_min: idle_requests.unwrap_or(0) as f64 * 60.0
                    / scenario.idle.as_secs_f64().max(1e-9),
                table,
            })
        }
        _ => None,
    };
    let (burst, burst_missing) = tracker.latencies(&burst_names);
    let (trickle, trickle_missing) = tracker.latencies(&trickle_names);
    let ok = beats.ok.load(Ordering::Relaxed);
    let heartbeat = HeartbeatReport {
        ok,
        failed: beats.failed.load(Ordering::Relaxed),
        skipped: beats.skipped.load(Ordering::Relaxed),
        per_second: ok as f64 / beats_elapsed.as_secs_f64().max(1e-9),
        patch_latency: summarize(&lock(&beats.latency)),
    };
    let (calls, total_calls, routes_at_end) = match &aws_run {
        // The proxy's count, not the controller's own.
        Some(a) => (
            a.requests
                .iter()
                .map(|(k, c)| {
                    (
                        k.clone(),
                        OpCount {
                            calls: c.requests,
                            errors: c.throttled + c.errors,
                        },
                    )
                })
                .collect(),
            a.total_requests,
            a.table.routes as i64,
        ),
        None => (
            outcome.calls.clone(),
            outcome.calls.values().map(|c| c.calls).sum(),
            outcome.routes_at_end,
        ),
    };
    Ok(RunResult {
        controller: kind.name(),
        label: kind.label(),
        error: None,
        control_plane_startup_seconds: 0.0,
        wall_seconds: wall.as_secs_f64(),
        burst_create_seconds: burst_create.as_secs_f64(),
        converge_seconds: converged.map(|d| d.as_secs_f64()),
        burst_latency: summarize(&burst),
        burst_unconfirmed: burst_missing,
        trickle_latency: summarize(&trickle),
        trickle_unconfirmed: trickle_missing,
        calls,
        total_calls,
        min_mutations: scenario.min_mutations(),
        routes_expected: scenario.routes_expected(),
        routes_at_end: Some(routes_at_end),
        controller_process: Some(sample),
        controller_exit_ok: outcome.exit_ok,
        heartbeats: Some(heartbeat),
        driver_cpu_seconds: driver_cpu(ticks) - driver_cpu_before,
        load_average: [load_before, load_after],
        aws: aws_run,
    })
}

pub(crate) fn ensure_alive(ctl: &mut controller::Running) -> anyhow::Result<()> {
    if !ctl.alive() {
        bail!(
            "{} exited during the run (see its controller.log)",
            ctl.kind.name()
        );
    }
    Ok(())
}

async fn create(
    api: &Api<Node>,
    tracker: &Tracker,
    fleet: &Fleet,
    node: TestNode,
) -> anyhow::Result<()> {
    let i = node_index(&node.name)?;
    lock(&tracker.created).insert(node.name.clone(), Instant::now());
    api.create(&PostParams::default(), &node.to_node())
        .await
        .with_context(|| format!("create {}", node.name))?;
    fleet.add(i, node.name);
    Ok(())
}

fn node_index(name: &str) -> anyhow::Result<usize> {
    name.strip_prefix("node-")
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("{name} is not a bench node name"))
}

/// Deletes the named Nodes, `concurrency` requests in flight, as a scale-down
/// would; the first failure is the error.
pub async fn delete_nodes(
    api: &Api<Node>,
    names: impl Iterator<Item = String>,
    concurrency: usize,
) -> anyhow::Result<()> {
    futures::stream::iter(names)
        .map(|name| {
            let api = api.clone();
            async move {
                api.delete(&name, &DeleteParams::default())
                    .await
                    .with_context(|| format!("delete {name}"))
            }
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(nodes: usize, scale_down: usize) -> Scenario {
        Scenario {
            nodes,
            create_concurrency: 1,
            trickle: 50,
            trickle_interval: Duration::from_millis(500),
            heartbeat_period: Duration::from_secs(10),
            heartbeat_concurrency: 1,
            idle: Duration::ZERO,
            scale_down,
            address_changes: 10,
            settle: Duration::ZERO,
            converge_timeout: Duration::ZERO,
            tables: 1,
        }
    }

    #[test]
    fn scale_down_spreads_and_stays_in_range() {
        let s = scenario(1000, 100);
        let idx = s.scale_down_indices();
        assert_eq!(idx.len(), 100);
        assert_eq!(idx[..3], [0, 10, 20]);
        assert!(idx.windows(2).all(|w| w[0] < w[1]));
        assert!(idx.iter().all(|&i| i < 1000));
        // Asking for more than exist deletes each once.
        let idx = scenario(3, 10).scale_down_indices();
        assert_eq!(idx, vec![0, 1, 2]);
        assert!(scenario(0, 10).scale_down_indices().is_empty());
    }

    #[test]
    fn minimum_mutations_count_every_unavoidable_change() {
        let s = scenario(1000, 100);
        // 1,050 creations, 100 deletions, 10 × (delete + create).
        assert_eq!(s.min_mutations(), 1170);
        assert_eq!(s.routes_expected(), 950);
        // Three route tables: every change happens in each.
        let three = Scenario { tables: 3, ..s };
        assert_eq!(three.min_mutations(), 3 * 1170);
        assert_eq!(three.routes_expected(), 3 * 950);
    }

    #[test]
    fn nodes_get_distinct_cidrs_and_addresses() {
        let a = test_node(0);
        let b = test_node(256);
        let c = test_node(5049);
        assert_eq!(a.pod_cidrs, vec!["10.0.0.0/24".to_string()]);
        assert_eq!(b.pod_cidrs, vec!["10.1.0.0/24".to_string()]);
        assert_eq!(c.pod_cidrs, vec!["10.19.185.0/24".to_string()]);
        assert_eq!(a.addresses[0].1, "100.64.0.1");
        assert_eq!(b.addresses[0].1, "100.64.1.1");
        assert_eq!(c.provider_id.as_deref(), Some("memory://node-05049"));
    }

    #[test]
    fn fleet_slots_cover_each_live_node_once() {
        let fleet = Fleet::default();
        for i in 0..25 {
            fleet.add(i, node_name(i));
        }
        fleet.remove(7);
        let mut seen: Vec<String> = (0..10).flat_map(|s| fleet.in_slot(s, 10)).collect();
        seen.sort();
        assert_eq!(seen.len(), 24);
        assert!(!seen.contains(&node_name(7)));
        assert_eq!(
            fleet.in_slot(3, 10),
            vec![node_name(3), node_name(13), node_name(23)]
        );
    }

    #[test]
    fn heartbeat_patch_is_a_ready_condition_in_whole_seconds() {
        let p = heartbeat_patch();
        let c = &p["status"]["conditions"][0];
        assert_eq!(c["type"], "Ready");
        let t = c["lastHeartbeatTime"].as_str().expect("time string");
        assert!(t.ends_with('Z') && !t.contains('.'), "{t}");
    }
}
