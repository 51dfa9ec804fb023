//! Scenario (d), "a Hetzner day": one hcloud network at its limit of 100
//! routes, autoscaler waves, and the project's 3,600 requests/hour shared
//! with other clients, run against the fake Hetzner Cloud API of
//! crates/provider-hcloud (in this process, on loopback) and a fresh real
//! API server per controller.
//!
//! Phases: wave 1 (servers and Nodes join), a quiet idle window whose
//! request rate is the idle cost, wave 2 up to the route limit, a
//! scale-down (servers deleted with their Nodes), a settle period. Every
//! number is read from the fake (its request counters, its route table
//! sampled every 100 ms, its budget), never from the controllers.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use provider_hcloud::testing::{FakeConfig, FakeHcloud};
use serde::Serialize;
use test_cluster::{Binaries, ControlPlane, StartOptions, TestNode};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::controller::{self, HcloudTarget, Kind, Setup};
use crate::probe::{self, ProcSample};
use crate::scenario::{Beats, Fleet, ensure_alive, lock, start_heartbeats};
use crate::stats::{Summary, summarize};

/// The network every route goes into.
pub const NETWORK: u64 = 4711;
/// Pod CIDRs are `10.244.<i>.0/24`; servers sit in 10.0.0.0/16.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// Hetzner's default project budget.
pub const BUDGET_PER_HOUR: f64 = 3600.0;

/// The day every controller is put through.
#[derive(Debug, Clone, Serialize)]
pub struct Day {
    /// Servers and Nodes added by the first autoscaler wave.
    pub wave1: usize,
    /// Added by the second wave; `wave1 + wave2` is at most the route limit.
    pub wave2: usize,
    /// Removed (server and Node) in the scale-down.
    pub scale_down: usize,
    /// Node creations in flight at once within a wave.
    pub create_concurrency: usize,
    /// Requests per hour other clients of the project spend (CSI driver,
    /// monitoring, Terraform), evenly.
    pub other_clients_per_hour: u32,
    /// What is left of the 3,600 when the day starts (other clients spent
    /// the rest earlier).
    pub budget_at_start: u32,
    /// Requests the autoscaler spends per server it creates or deletes
    /// (create, poll, attach to the network), taken from the budget at once.
    pub autoscaler_requests_per_server: u32,
    /// How long one network action (add or delete a route) runs; the API
    /// runs one at a time per network.
    #[serde(serialize_with = "secs")]
    pub action_duration: Duration,
    /// Quiet time after a wave converged before the idle window opens.
    #[serde(serialize_with = "secs")]
    pub quiet: Duration,
    /// The idle window whose request rate is reported per hour.
    #[serde(serialize_with = "secs")]
    pub idle: Duration,
    #[serde(serialize_with = "secs")]
    pub settle: Duration,
    /// Longest wait for one wave's routes or deletions.
    #[serde(serialize_with = "secs")]
    pub wave_timeout: Duration,
    #[serde(serialize_with = "secs")]
    pub heartbeat_period: Duration,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Day {
    fn nodes(&self) -> usize {
        self.wave1 + self.wave2
    }

    /// Route changes no controller can avoid.
    pub fn mutations(&self) -> u64 {
        (self.nodes() + self.scale_down) as u64
    }

    /// The fewest requests the day can take: one read of the network, then
    /// per change one action request and one poll (an action runs for
    /// `action_duration`, so its first answer is `running`).
    pub fn min_requests(&self) -> u64 {
        1 + 2 * self.mutations()
    }

    /// The budget's net refill per second once other clients took theirs.
    fn net_refill(&self) -> f64 {
        (1.0 - f64::from(self.other_clients_per_hour) / BUDGET_PER_HOUR).max(1e-9)
    }

    /// The fastest a wave of `n` route changes can finish: the network runs
    /// one action at a time, and the `2n` requests must fit the budget
    /// (`available` at the start, refilled at the net rate).
    pub fn fastest(&self, n: usize, available: f64) -> Duration {
        let serial = self.action_duration.as_secs_f64() * n as f64;
        let short = (2.0 * n as f64 - available).max(0.0);
        Duration::from_secs_f64(serial.max(short / self.net_refill()))
    }
}

fn server_id(i: usize) -> u64 {
    1000 + i as u64
}

fn server_ip(i: usize) -> String {
    format!("10.0.{}.{}", i / 250, i % 250 + 2)
}

fn pod_cidr(i: usize) -> String {
    format!("10.244.{i}.0/24")
}

fn node_name(i: usize) -> String {
    format!("hc-{i:03}")
}

fn test_node(i: usize) -> TestNode {
    TestNode::new(node_name(i))
        .pod_cidrs([pod_cidr(i)])
        .internal_ip(server_ip(i))
        .provider_id(format!("hcloud://{}", server_id(i)))
}

/// When each destination first appeared with its gateway and last
/// disappeared, sampled from the fake's table every 100 ms (test hooks, not
/// requests).
#[derive(Default)]
struct RouteLog {
    appeared: Mutex<HashMap<(String, String), Instant>>,
    vanished: Mutex<HashMap<String, Instant>>,
}

fn start_sampler(fake: Arc<FakeHcloud>, log: Arc<RouteLog>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut present: Vec<(String, String)> = Vec::new();
        loop {
            let now = Instant::now();
            let routes = fake.routes(NETWORK);
            for r in &routes {
                lock(&log.appeared).entry(r.clone()).or_insert(now);
            }
            for old in &present {
                if !routes.iter().any(|r| r.0 == old.0) {
                    lock(&log.vanished).insert(old.0.clone(), now);
                }
            }
            present = routes;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// Requests the fake answered, by endpoint, and how many were 429.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Requests {
    pub by_endpoint: BTreeMap<String, u64>,
    /// `endpoint status` → answers.
    pub by_status: BTreeMap<String, u64>,
    pub total: u64,
    pub refused_by_budget: u64,
}

fn requests(fake: &FakeHcloud) -> Requests {
    Requests {
        by_endpoint: fake.requests(),
        by_status: fake
            .answers()
            .into_iter()
            .map(|((e, s), n)| (format!("{e} {s}"), n))
            .collect(),
        total: fake.total(),
        refused_by_budget: fake.throttled(),
    }
}

/// One wave's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Wave {
    pub changes: usize,
    /// Wave start to the last route in (or out); `None`: not within the timeout.
    pub seconds: Option<f64>,
    /// What the network's serialisation and the budget allow.
    pub fastest_seconds: f64,
    pub budget_at_start: u64,
}

/// One controller's day.
#[derive(Debug, Clone, Serialize)]
pub struct DayResult {
    pub controller: &'static str,
    pub label: String,
    pub error: Option<String>,
    pub requests: Requests,
    pub wave1: Option<Wave>,
    pub wave2: Option<Wave>,
    pub scale_down: Option<Wave>,
    /// Requests in the idle window, per hour, and as a share of 3,600/h.
    pub idle_requests: u64,
    pub idle_seconds: f64,
    pub idle_per_hour: f64,
    pub idle_share_of_budget: f64,
    /// Node creation to its route in the network.
    pub node_to_route: Option<Summary>,
    /// Per Node: seconds from the run's start to its creation and to its
    /// route in the network.
    pub node_timeline: Vec<(String, f64, Option<f64>)>,
    pub routes_expected: usize,
    pub routes_at_end: usize,
    /// Expected routes not in the network, and routes there that should not be.
    pub missing: Vec<String>,
    pub extra: Vec<String>,
    /// The simulated other clients: served and refused.
    pub other_clients: (u64, u64),
    pub controller_process: Option<ProcSample>,
    pub controller_exit_ok: bool,
}

impl DayResult {
    fn failed(kind: Kind, error: String) -> Self {
        DayResult {
            controller: kind.name(),
            label: kind.label(),
            error: Some(error),
            requests: Requests::default(),
            wave1: None,
            wave2: None,
            scale_down: None,
            idle_requests: 0,
            idle_seconds: 0.0,
            idle_per_hour: 0.0,
            idle_share_of_budget: 0.0,
            node_to_route: None,
            node_timeline: Vec::new(),
            routes_expected: 0,
            routes_at_end: 0,
            missing: Vec::new(),
            extra: Vec::new(),
            other_clients: (0, 0),
            controller_process: None,
            controller_exit_ok: false,
        }
    }
}

/// Runs `kind` through `day` on a control plane and a fake of its own.
pub async fn run(
    bins: &Binaries,
    setup: &Setup,
    day: &Day,
    kind: Kind,
    run_dir: &Path,
) -> DayResult {
    let plane = match ControlPlane::start_with(bins.clone(), StartOptions::default()).await {
        Ok(p) => p,
        Err(e) => return DayResult::failed(kind, format!("control plane: {e}")),
    };
    let result = drive(&plane, setup, day, kind, run_dir).await;
    if let Err(e) = plane.stop() {
        warn!(error = %e, "stopping the control plane");
    }
    result.unwrap_or_else(|e| DayResult::failed(kind, format!("{e:#}")))
}

async fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while !done() {
        if Instant::now() >= deadline {
            warn!("{what}: not within {timeout:?}");
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    true
}

async fn drive(
    plane: &ControlPlane,
    setup: &Setup,
    day: &Day,
    kind: Kind,
    run_dir: &Path,
) -> anyhow::Result<DayResult> {
    if day.nodes() > 100 {
        bail!("a Hetzner network holds at most 100 routes");
    }
    let fake = Arc::new(
        FakeHcloud::start(FakeConfig {
            enforce_budget: true,
            action_duration: day.action_duration,
            other_clients_per_hour: day.other_clients_per_hour,
            ..FakeConfig::default()
        })
        .await
        .context("start the fake Hetzner Cloud API")?,
    );
    fake.add_network(NETWORK, "k8s", "10.0.0.0/8", &["10.0.0.0/16"]);
    fake.consume_budget((BUDGET_PER_HOUR as u32).saturating_sub(day.budget_at_start));
    let setup = Setup {
        cluster_cidr: CLUSTER_CIDR.into(),
        hcloud: Some(HcloudTarget {
            endpoint: fake.base_url(),
            network: NETWORK,
            token: fake.token(),
        }),
        ..setup.clone()
    };
    let client = test_cluster::client_from_kubeconfig(plane.kubeconfig()).await?;
    let api: Api<Node> = Api::all(client);
    let log = Arc::new(RouteLog::default());
    let sampler = start_sampler(fake.clone(), log.clone());
    let mut ctl = controller::start(&setup, kind, plane.kubeconfig(), run_dir, None).await?;
    let ctl_started = Instant::now();
    let fleet = Arc::new(Fleet::default());
    let heartbeats = start_heartbeats(
        api.clone(),
        fleet.clone(),
        Arc::new(Beats::default()),
        day.heartbeat_period,
        16,
    );
    let created: Arc<Mutex<HashMap<usize, Instant>>> = Arc::default();

    // Waits read the sampler's log, so the times reported are the times the
    // wait saw.
    let has_route =
        |_: &FakeHcloud, i: usize| lock(&log.appeared).contains_key(&(pod_cidr(i), server_ip(i)));
    let join = |range: std::ops::Range<usize>| {
        let (api, fake, fleet, created) =
            (api.clone(), fake.clone(), fleet.clone(), created.clone());
        async move {
            // The autoscaler creates the servers (its own requests come out
            // of the same budget), then the kubelets register the Nodes.
            for i in range.clone() {
                fake.add_server(server_id(i), &node_name(i), NETWORK, &server_ip(i));
            }
            fake.consume_budget(day.autoscaler_requests_per_server * range.len() as u32);
            futures::stream::iter(range)
                .map(|i| {
                    let (api, fleet, created) = (api.clone(), fleet.clone(), created.clone());
                    async move {
                        lock(&created).insert(i, Instant::now());
                        api.create(&PostParams::default(), &test_node(i).to_node())
                            .await
                            .with_context(|| format!("create {}", node_name(i)))?;
                        fleet.add(i, node_name(i));
                        anyhow::Ok(())
                    }
                })
                .buffer_unordered(day.create_concurrency.max(1))
                .try_collect::<Vec<()>>()
                .await
        }
    };
    let last_appeared = |range: std::ops::Range<usize>| {
        let appeared = lock(&log.appeared);
        range
            .filter_map(|i| appeared.get(&(pod_cidr(i), server_ip(i))).copied())
            .max()
    };

    // Wave 1.
    info!(controller = kind.name(), nodes = day.wave1, "wave 1");
    let budget = fake.budget_remaining();
    let began = Instant::now();
    join(0..day.wave1).await?;
    let ok = wait_for("wave 1 routes", day.wave_timeout, || {
        (0..day.wave1).all(|i| has_route(&fake, i))
    })
    .await;
    let wave1 = Wave {
        changes: day.wave1,
        seconds: ok
            .then(|| last_appeared(0..day.wave1))
            .flatten()
            .map(|t| t.duration_since(began).as_secs_f64()),
        fastest_seconds: day.fastest(day.wave1, budget as f64).as_secs_f64(),
        budget_at_start: budget,
    };

    // Idle.
    tokio::time::sleep(day.quiet).await;
    ensure_alive(&mut ctl)?;
    info!(seconds = day.idle.as_secs(), "idle window");
    let idle_from = fake.total();
    let idle_began = Instant::now();
    tokio::time::sleep(day.idle).await;
    let idle_requests = fake.total() - idle_from;
    let idle_seconds = idle_began.elapsed().as_secs_f64();
    ensure_alive(&mut ctl)?;

    // Wave 2, up to the network's route limit.
    info!(nodes = day.wave2, "wave 2");
    let all = 0..day.nodes();
    let budget = fake.budget_remaining();
    let began = Instant::now();
    join(day.wave1..day.nodes()).await?;
    let ok = wait_for("wave 2 routes", day.wave_timeout, || {
        all.clone().all(|i| has_route(&fake, i))
    })
    .await;
    let wave2 = Wave {
        changes: day.wave2,
        seconds: ok
            .then(|| last_appeared(day.wave1..day.nodes()))
            .flatten()
            .map(|t| t.duration_since(began).as_secs_f64()),
        fastest_seconds: day.fastest(day.wave2, budget as f64).as_secs_f64(),
        budget_at_start: budget,
    };

    // Scale-down: the autoscaler deletes servers and their Nodes go.
    let doomed: Vec<usize> = (0..day.scale_down.min(day.nodes()))
        .map(|k| k * day.nodes() / day.scale_down.max(1))
        .collect();
    info!(nodes = doomed.len(), "scale-down");
    let budget = fake.budget_remaining();
    let began = Instant::now();
    for &i in &doomed {
        fleet.remove(i);
        fake.remove_server(server_id(i));
    }
    fake.consume_budget(day.autoscaler_requests_per_server * doomed.len() as u32);
    crate::scenario::delete_nodes(
        &api,
        doomed.iter().map(|&i| node_name(i)),
        day.create_concurrency,
    )
    .await?;
    let ok = wait_for("scale-down deletions", day.wave_timeout, || {
        let routes = fake.routes(NETWORK);
        let vanished = lock(&log.vanished);
        doomed.iter().all(|&i| {
            vanished.contains_key(&pod_cidr(i)) && !routes.iter().any(|(d, _)| *d == pod_cidr(i))
        })
    })
    .await;
    let vanished = {
        let v = lock(&log.vanished);
        doomed
            .iter()
            .filter_map(|&i| v.get(&pod_cidr(i)).copied())
            .max()
    };
    let scale_down = Wave {
        changes: doomed.len(),
        seconds: ok
            .then_some(vanished)
            .flatten()
            .map(|t| t.duration_since(began).as_secs_f64()),
        fastest_seconds: day.fastest(doomed.len(), budget as f64).as_secs_f64(),
        budget_at_start: budget,
    };

    tokio::time::sleep(day.settle).await;
    ensure_alive(&mut ctl)?;
    let sample = probe::sample_process(ctl.pid, probe::clock_ticks())?;
    heartbeats.abort();
    sampler.abort();
    let outcome = ctl.stop().await?;

    let final_routes = fake.routes(NETWORK);
    let expected: Vec<(String, String)> = (0..day.nodes())
        .filter(|i| !doomed.contains(i))
        .map(|i| (pod_cidr(i), server_ip(i)))
        .collect();
    let missing = expected
        .iter()
        .filter(|r| !final_routes.contains(r))
        .map(|(d, g)| format!("{d} via {g}"))
        .collect();
    let extra = final_routes
        .iter()
        .filter(|r| !expected.contains(r))
        .map(|(d, g)| format!("{d} via {g}"))
        .collect();
    let latencies: Vec<Duration> = {
        let created = lock(&created);
        let appeared = lock(&log.appeared);
        (0..day.nodes())
            .filter_map(|i| {
                let c = created.get(&i)?;
                let a = appeared.get(&(pod_cidr(i), server_ip(i)))?;
                Some(a.saturating_duration_since(*c))
            })
            .collect()
    };
    let node_timeline = {
        let created = lock(&created);
        let appeared = lock(&log.appeared);
        let t0 = ctl_started;
        (0..day.nodes())
            .filter_map(|i| {
                let c = created.get(&i)?;
                let a = appeared.get(&(pod_cidr(i), server_ip(i)));
                Some((
                    node_name(i),
                    c.saturating_duration_since(t0).as_secs_f64(),
                    a.map(|a| a.saturating_duration_since(t0).as_secs_f64()),
                ))
            })
            .collect()
    };
    let idle_per_hour = idle_requests as f64 * 3600.0 / idle_seconds.max(1e-9);
    Ok(DayResult {
        controller: kind.name(),
        label: kind.label(),
        error: None,
        requests: requests(&fake),
        wave1: Some(wave1),
        wave2: Some(wave2),
        scale_down: Some(scale_down),
        idle_requests,
        idle_seconds,
        idle_per_hour,
        idle_share_of_budget: idle_per_hour / BUDGET_PER_HOUR,
        node_to_route: summarize(&latencies),
        node_timeline,
        routes_expected: expected.len(),
        routes_at_end: final_routes.len(),
        missing,
        extra,
        other_clients: fake.other_clients(),
        controller_process: Some(sample),
        controller_exit_ok: outcome.exit_ok,
    })
}

/// A whole run of the day: what, where, and each controller's result.
#[derive(Debug, Clone, Serialize)]
pub struct DayReport {
    pub machine: probe::Machine,
    pub day: Day,
    pub min_requests: u64,
    pub runs: Vec<DayResult>,
}

fn opt_s(w: &Option<Wave>) -> String {
    match w {
        Some(Wave {
            seconds: Some(s),
            fastest_seconds: f,
            ..
        }) => format!("{s:.1} s ({:.2}×)", s / f.max(1e-9)),
        Some(_) => "not within the timeout".into(),
        None => "–".into(),
    }
}

impl DayReport {
    /// The Markdown tables BENCHMARKS.md quotes.
    pub fn markdown(&self) -> String {
        let d = &self.day;
        let mut out = format!(
            "Hetzner day: {} + {} Nodes (route limit 100), {} removed; actions {:.1} s each, one at a time per network; \
             budget 3,600/h ({} left at the start), other clients {}/h, autoscaler {} requests per server.\n\n\
             Physical limits: at least {} requests (1 network read, then per route change 1 action request + 1 poll); \
             fastest waves: {:.1} s / {:.1} s / {:.1} s when the budget does not bind (one action at a time); each ratio below uses the budget the fake had left when that wave began.\n\n",
            d.wave1,
            d.wave2,
            d.scale_down,
            d.action_duration.as_secs_f64(),
            d.budget_at_start,
            d.other_clients_per_hour,
            d.autoscaler_requests_per_server,
            self.min_requests,
            d.fastest(d.wave1, f64::INFINITY).as_secs_f64(),
            d.fastest(d.wave2, f64::INFINITY).as_secs_f64(),
            d.fastest(d.scale_down, f64::INFINITY).as_secs_f64(),
        );
        out.push_str("| controller | requests (× min) | 429 | wave 1 last route (× fastest) | wave 2 | last deletion | final table | node→route p50 / p99 | idle requests/h (share of 3,600) | peak RSS | CPU |\n");
        out.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
        for r in &self.runs {
            if let Some(e) = &r.error {
                out.push_str(&format!(
                    "| {} | failed: {} | | | | | | | | | |\n",
                    r.label,
                    e.replace('|', "/")
                ));
                continue;
            }
            let table = if r.missing.is_empty() && r.extra.is_empty() {
                format!("exact ({})", r.routes_at_end)
            } else {
                format!(
                    "{} of {}: {} missing, {} extra",
                    r.routes_at_end,
                    r.routes_expected,
                    r.missing.len(),
                    r.extra.len()
                )
            };
            let lat = r.node_to_route.map_or("–".into(), |s| {
                format!("{:.1} s / {:.1} s", s.p50_ms / 1000.0, s.p99_ms / 1000.0)
            });
            let proc = r.controller_process;
            out.push_str(&format!(
                "| {} | {} ({:.2}×) | {} | {} | {} | {} | {} | {} | {:.0} ({:.1} %) | {} | {} |\n",
                r.label,
                r.requests.total,
                r.requests.total as f64 / self.min_requests.max(1) as f64,
                r.requests.refused_by_budget,
                opt_s(&r.wave1),
                opt_s(&r.wave2),
                opt_s(&r.scale_down),
                table,
                lat,
                r.idle_per_hour,
                100.0 * r.idle_share_of_budget,
                proc.map_or("–".into(), |p| format!(
                    "{:.1} MiB",
                    p.peak_rss_kib as f64 / 1024.0
                )),
                proc.map_or("–".into(), |p| format!("{:.2} s", p.cpu_seconds)),
            ));
        }
        out.push_str("\nRequests by endpoint (as the fake counted them, 429s included):\n\n");
        let endpoints: std::collections::BTreeSet<&String> = self
            .runs
            .iter()
            .flat_map(|r| r.requests.by_endpoint.keys())
            .collect();
        out.push_str("| controller |");
        for e in &endpoints {
            out.push_str(&format!(" {e} |"));
        }
        out.push_str("\n| --- |");
        for _ in &endpoints {
            out.push_str(" --- |");
        }
        out.push('\n');
        for r in &self.runs {
            out.push_str(&format!("| {} |", r.label));
            for e in &endpoints {
                out.push_str(&format!(
                    " {} |",
                    r.requests.by_endpoint.get(*e).copied().unwrap_or(0)
                ));
            }
            out.push('\n');
        }
        for r in &self.runs {
            if !r.missing.is_empty() || !r.extra.is_empty() {
                out.push_str(&format!(
                    "\n{}: missing {:?}; extra {:?}\n",
                    r.label, r.missing, r.extra
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day() -> Day {
        Day {
            wave1: 60,
            wave2: 40,
            scale_down: 30,
            create_concurrency: 10,
            other_clients_per_hour: 1800,
            budget_at_start: 3600,
            autoscaler_requests_per_server: 5,
            action_duration: Duration::from_millis(500),
            quiet: Duration::ZERO,
            idle: Duration::ZERO,
            settle: Duration::ZERO,
            wave_timeout: Duration::ZERO,
            heartbeat_period: Duration::from_secs(10),
        }
    }

    #[test]
    fn minimum_requests_are_two_per_change_plus_one_read() {
        // 100 creations and 30 deletions.
        assert_eq!(day().min_requests(), 261);
    }

    #[test]
    fn fastest_wave_is_bound_by_serial_actions_or_by_the_budget() {
        let d = day();
        // A full budget: 60 actions one after another.
        assert_eq!(d.fastest(60, 3600.0), Duration::from_secs(30));
        // An empty one: 120 requests at a net 0.5 per second.
        assert_eq!(d.fastest(60, 0.0), Duration::from_secs(240));
    }

    #[test]
    fn nodes_and_servers_agree_on_addresses() {
        let n = test_node(251);
        assert_eq!(n.pod_cidrs, vec!["10.244.251.0/24".to_string()]);
        assert_eq!(n.addresses[0].1, "10.0.1.3");
        assert_eq!(n.provider_id.as_deref(), Some("hcloud://1251"));
    }
}
