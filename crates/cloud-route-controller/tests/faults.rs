//! Fault injection against the real binary, the real API server and the
//! simulated cloud (`cloud-sim`, served from this test process so the test
//! reads its call log and table directly).
//!
//! Every test runs an [`Invariants`] checker next to the controller. It reads
//! each new cloud call as it is logged and fails the test on the first
//! violation of:
//!
//! 1. no route is deleted while its Node is alive and still claims that pod
//!    CIDR (no test here changes Node addresses, so no delete is excused as
//!    the first half of an address-change update);
//! 2. no call touches a route outside the cluster CIDRs, an unparsable route,
//!    or a route of another cluster name (every test seeds all three);
//! 3. after the faults stop, the cloud converges to the desired routes within
//!    [`CONVERGE`] (the binary's 10 s least interval between full passes, a
//!    few backoff steps and a loaded 2-core machine);
//! 4. during a throttling storm the requests per window stay within the
//!    server's budget (checked in that test, from the call log).
//!
//! The long variants (more Nodes, longer storms) run with `CRC_LONG_FAULTS=1`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloud_sim::SimServer;
use common::{Controller, TempDir};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;
use provider_memory::{CallRecord, ErrorRate, MemoryCloud, MemoryConfig, Operation};
use route_cloud::ErrorKind;
use route_core::{Cidr, Destination, IpFamily, Route};
use test_cluster::{TestCluster, TestNode, wait_until};
use tokio::task::JoinHandle;

const CLUSTER: &str = "kubernetes";
const OTHER_CLUSTER: &str = "other-cluster";
const CLUSTER_CIDRS: &str = "10.244.0.0/16,fd00:10::/56";
/// Bound on convergence once the faults stop.
const CONVERGE: Duration = Duration::from_secs(90);

fn long_run() -> bool {
    std::env::var("CRC_LONG_FAULTS").is_ok_and(|v| v == "1")
}

fn in_cluster(c: &Cidr) -> bool {
    route_core::parse_cluster_cidrs(CLUSTER_CIDRS)
        .expect("cluster CIDRs")
        .iter()
        .any(|k| k.covers(c))
}

/// The pod CIDR of test node `i` (a /26 each, as in the e2e tests).
fn pod_cidr(i: usize) -> String {
    format!("10.244.{}.{}/26", i / 4, (i % 4) * 64)
}

// ---------------------------------------------------------------------------
// The simulated cloud and the controller process.
// ---------------------------------------------------------------------------

struct Sim {
    _server: SimServer,
    cloud: MemoryCloud,
    config: PathBuf,
}

/// Starts `cloud-sim` in this process and writes the controller's
/// `--cloud-config` for it.
async fn start_sim(dir: &Path, config: MemoryConfig) -> Sim {
    let server = SimServer::start_local(config).await.expect("cloud-sim");
    let cloud = server.cloud();
    let path = dir.join("cloud.yaml");
    std::fs::write(
        &path,
        format!("endpoint: {}\nrequest_timeout_ms: 10000\n", server.url()),
    )
    .expect("cloud config");
    Sim {
        _server: server,
        cloud,
        config: path,
    }
}

/// Routes no test may ever see touched: outside the cluster CIDRs,
/// unparsable, and another cluster's routes for the same pod CIDRs.
fn seed_foreign_routes(cloud: &MemoryCloud) -> Vec<(String, Route)> {
    let mut seeded = vec![
        (
            CLUSTER.to_string(),
            Route::from_text("vpn-gw", "192.168.77.0/24").named("vpn"),
        ),
        (
            CLUSTER.to_string(),
            Route::from_text("f-0", "10.244.999.0/24").named("garbage-1"),
        ),
        (
            CLUSTER.to_string(),
            Route::from_text("", "{not a cidr}").named("garbage-2"),
        ),
    ];
    for i in 0..4 {
        seeded.push((
            OTHER_CLUSTER.to_string(),
            Route::from_text(format!("f-{i}"), &pod_cidr(i)).named(format!("other-{i}")),
        ));
    }
    for (cluster, r) in &seeded {
        cloud.insert_route(cluster, r.clone());
    }
    seeded
}

fn controller_args(sim: &Sim, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--cluster-cidr",
        CLUSTER_CIDRS,
        "--cloud-provider",
        "memory",
        "--cloud-config",
        sim.config.to_str().expect("utf-8 path"),
        "--metrics-bind-address",
        "0",
        "--min-resync-period",
        "1h",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if !extra.iter().any(|a| a.starts_with("--leader-elect")) {
        args.push("--leader-elect=false".into());
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn start_controller(kubeconfig: &Path, dir: &Path, name: &str, args: &[String]) -> Controller {
    start_logging_at(kubeconfig, dir, name, args, "info")
}

/// Starts the binary with its log filter (`RUST_LOG`) at `level`.
fn start_logging_at(
    kubeconfig: &Path,
    dir: &Path,
    name: &str,
    args: &[String],
    level: &str,
) -> Controller {
    let log = dir.join(format!("{name}.log"));
    let out = std::fs::File::create(&log).expect("log file");
    let child = std::process::Command::new(common::binary())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .args(["--secure-port", "0"])
        .env("RUST_LOG", level)
        .stdout(std::process::Stdio::null())
        .stderr(out)
        .spawn()
        .expect("start cloud-route-controller");
    Controller {
        child,
        log,
        metrics: None,
    }
}

// ---------------------------------------------------------------------------
// The invariant checker.
// ---------------------------------------------------------------------------

#[derive(Default)]
struct CheckState {
    violation: Option<String>,
    /// Log entries already checked.
    seen: usize,
    /// Successful deletions still to be checked against the Nodes.
    pending_deletes: Vec<CallRecord>,
    deletes_checked: usize,
    calls_checked: usize,
}

/// Polls the cloud's call log and the API's Nodes; see the module docs.
struct Invariants {
    state: Arc<Mutex<CheckState>>,
    task: JoinHandle<()>,
    cloud: MemoryCloud,
    nodes: Api<Node>,
    seeded: Vec<(String, Route)>,
    /// The cloud takes IPv6 routes (else IPv6 pod CIDRs are not desired).
    ipv6: bool,
}

impl Invariants {
    fn start(cloud: &MemoryCloud, client: kube::Client, seeded: Vec<(String, Route)>) -> Self {
        let state = Arc::new(Mutex::new(CheckState::default()));
        let nodes: Api<Node> = Api::all(client);
        let task = {
            let (state, cloud, nodes) = (state.clone(), cloud.clone(), nodes.clone());
            tokio::spawn(async move {
                loop {
                    check_once(&state, &cloud, &nodes).await;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        Self {
            state,
            task,
            cloud: cloud.clone(),
            nodes,
            seeded,
            ipv6: cloud.config().supports_ipv6,
        }
    }

    /// Panics with the first violation seen so far.
    fn assert_ok(&self) {
        if let Some(v) = &self.state.lock().expect("checker state").violation {
            panic!("invariant violated: {v}");
        }
    }

    /// Waits until the cloud holds exactly the desired routes, failing on the
    /// first invariant violation or after `bound`. Returns the time it took.
    async fn converge(&self, bound: Duration, ctl: &Controller) -> Duration {
        let started = std::time::Instant::now();
        loop {
            self.assert_ok();
            let last = match self.diff().await {
                Some(d) if d.is_empty() => return started.elapsed(),
                Some(d) => d,
                None => "the API server is unreachable".into(),
            };
            if started.elapsed() > bound {
                panic!(
                    "no convergence within {bound:?}: {last}\n--- controller log ---\n{}",
                    ctl.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// What differs between the desired and the actual routes (empty when
    /// none), or `None` when the Nodes cannot be read.
    async fn diff(&self) -> Option<String> {
        let nodes = self.nodes.list(&ListParams::default()).await.ok()?;
        let want = desired(&nodes.items, self.ipv6);
        let have: BTreeSet<(String, String)> = self
            .cloud
            .routes(CLUSTER)
            .into_iter()
            .filter(|r| {
                r.destination
                    .cidr()
                    .is_some_and(|c| in_cluster(&c) && (self.ipv6 || c.family() == IpFamily::V4))
            })
            .map(|r| (r.node.to_string(), r.destination.to_string()))
            .collect();
        let missing: Vec<_> = want.difference(&have).collect();
        let extra: Vec<_> = have.difference(&want).collect();
        Some(if missing.is_empty() && extra.is_empty() {
            String::new()
        } else {
            format!("missing {missing:?}, unexpected {extra:?}")
        })
    }

    /// Final check: every log entry examined, seeded routes untouched.
    async fn finish(self) -> (usize, usize) {
        wait_until(Duration::from_secs(30), "all deletions checked", || async {
            check_once(&self.state, &self.cloud, &self.nodes).await;
            let s = self.state.lock().expect("checker state");
            (s.violation.is_some() || s.pending_deletes.is_empty()).then_some(())
        })
        .await
        .expect("the checker could not read the Nodes");
        self.task.abort();
        self.assert_ok();
        for (cluster, r) in &self.seeded {
            let now = self.cloud.routes(cluster);
            assert!(
                now.contains(r),
                "seeded route {:?} {} of cluster {cluster} changed or vanished",
                r.name,
                r.destination
            );
        }
        let s = self.state.lock().expect("checker state");
        (s.calls_checked, s.deletes_checked)
    }
}

/// `(node, pod CIDR)` for every valid, in-cluster, unconflicted pod CIDR.
fn desired(nodes: &[Node], ipv6: bool) -> BTreeSet<(String, String)> {
    let mut claims: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for n in nodes {
        if n.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = n.metadata.name.clone().unwrap_or_default();
        for c in n
            .spec
            .as_ref()
            .and_then(|s| s.pod_cidrs.clone())
            .unwrap_or_default()
        {
            if let Ok(c) = Cidr::parse(&c)
                && in_cluster(&c)
                && (ipv6 || c.family() == IpFamily::V4)
            {
                claims.entry(c.to_string()).or_default().push(name.clone());
            }
        }
    }
    claims
        .into_iter()
        .filter(|(_, n)| n.len() == 1)
        .map(|(c, n)| (n[0].clone(), c))
        .collect()
}

fn live_claims(nodes: &[Node], node: &str, destination: &Destination) -> bool {
    nodes.iter().any(|n| {
        n.metadata.name.as_deref() == Some(node)
            && n.metadata.deletion_timestamp.is_none()
            && n.spec
                .as_ref()
                .and_then(|s| s.pod_cidrs.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| Cidr::parse(c).ok() == destination.cidr()))
    })
}

async fn check_once(state: &Mutex<CheckState>, cloud: &MemoryCloud, nodes: &Api<Node>) {
    let log = cloud.log();
    {
        let mut s = state.lock().expect("checker state");
        if s.violation.is_some() {
            return;
        }
        let start = s.seen.min(log.len());
        for e in &log[start..] {
            s.calls_checked += 1;
            if e.op == Operation::List {
                continue;
            }
            if e.cluster != CLUSTER {
                s.violation = Some(format!("a call touched cluster {:?}: {e:?}", e.cluster));
                break;
            }
            if let Some(d) = &e.destination
                && !d.cidr().is_some_and(|c| in_cluster(&c))
            {
                s.violation = Some(format!(
                    "a call touched {d:?}, outside the cluster CIDR: {e:?}"
                ));
                break;
            }
            // A lost answer (timeout) of a deletion still deleted the route.
            if e.op == Operation::Delete && matches!(e.result, Ok(()) | Err(ErrorKind::Timeout)) {
                s.pending_deletes.push(e.clone());
            }
        }
        s.seen = log.len();
        if s.pending_deletes.is_empty() {
            return;
        }
    }
    // Listed after the deletions happened: a Node that still claims the CIDR
    // now claimed it when the route went away. While the API server is
    // unreachable the deletions wait.
    let Ok(list) =
        tokio::time::timeout(Duration::from_secs(3), nodes.list(&ListParams::default())).await
    else {
        return;
    };
    let Ok(list) = list else { return };
    let mut s = state.lock().expect("checker state");
    let pending = std::mem::take(&mut s.pending_deletes);
    for e in pending {
        let node = e.node.clone().unwrap_or_default();
        let dest = e.destination.clone().unwrap_or(Destination::parse(""));
        s.deletes_checked += 1;
        if live_claims(&list.items, &node, &dest) {
            s.violation = Some(format!(
                "route {dest:?} of live node {node:?} was deleted: {e:?}"
            ));
            return;
        }
    }
}

/// Successful creations per destination (a route created twice is a duplicate).
fn creations_per_destination(cloud: &MemoryCloud) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for e in cloud.log() {
        if e.op == Operation::Create
            && e.result.is_ok()
            && let Some(d) = e.destination
        {
            *m.entry(d.to_string()).or_default() += 1;
        }
    }
    m
}

fn count(cloud: &MemoryCloud, op: Operation, result: Result<(), ErrorKind>) -> usize {
    cloud
        .log()
        .iter()
        .filter(|e| e.op == op && e.result == result)
        .count()
}

fn node(i: usize) -> TestNode {
    TestNode::new(format!("n-{i}"))
        .pod_cidrs([pod_cidr(i)])
        .internal_ip(format!("10.0.{}.{}", i / 250, i % 250 + 2))
}

// ---------------------------------------------------------------------------
// Cloud faults.
// ---------------------------------------------------------------------------

/// 5xx bursts, lost answers of changes that took effect, conflicts and
/// eventual consistency, one after another against one controller; after each
/// phase the faults stop and the cloud must converge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloud_faults_never_lose_or_wrongly_delete_a_route() {
    let c = TestCluster::acquire().await.unwrap();
    let dir = TempDir::new("faults-cloud");
    let sim = start_sim(dir.path(), MemoryConfig::default()).await;
    let seeded = seed_foreign_routes(&sim.cloud);
    let inv = Invariants::start(&sim.cloud, c.client(), seeded);
    let per_phase = if long_run() { 24 } else { 6 };
    let ctl = start_controller(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &controller_args(&sim, &[]),
    );
    let mut next = 0usize;
    let mut timings = Vec::new();

    // Phase 1: a burst of server errors on every operation.
    sim.cloud
        .fail_next(Operation::List, 3, ErrorKind::Transient);
    sim.cloud
        .fail_next(Operation::Create, 5, ErrorKind::Transient);
    for _ in 0..per_phase {
        c.create_node(&node(next)).await.unwrap();
        next += 1;
    }
    timings.push(("5xx burst", inv.converge(CONVERGE, &ctl).await));
    sim.cloud
        .fail_next(Operation::Delete, 2, ErrorKind::Transient);
    c.delete_node("n-0").await.unwrap();
    timings.push(("5xx on delete", inv.converge(CONVERGE, &ctl).await));

    // Phase 2: timeouts whose changes took effect (the answer was lost).
    sim.cloud
        .fail_next(Operation::Create, 3, ErrorKind::Timeout);
    sim.cloud
        .fail_next(Operation::Delete, 1, ErrorKind::Timeout);
    for _ in 0..per_phase {
        c.create_node(&node(next)).await.unwrap();
        next += 1;
    }
    c.delete_node("n-1").await.unwrap();
    timings.push(("lost answers", inv.converge(CONVERGE, &ctl).await));

    // Phase 3: conflicts (a concurrent change on the table) at random.
    sim.cloud.set_error_rate(
        Operation::Create,
        Some(ErrorRate {
            probability: 0.5,
            kind: ErrorKind::Conflict,
        }),
    );
    for _ in 0..per_phase {
        c.create_node(&node(next)).await.unwrap();
        next += 1;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    inv.assert_ok();
    sim.cloud.set_error_rate(Operation::Create, None);
    timings.push(("conflicts", inv.converge(CONVERGE, &ctl).await));

    // Phase 4: eventual consistency: new routes are missing from the next
    // two lists, and a deletion behind the back forces a full list.
    sim.cloud.set_list_lag(2);
    for _ in 0..per_phase {
        c.create_node(&node(next)).await.unwrap();
        next += 1;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    sim.cloud
        .fail_next(Operation::Create, 1, ErrorKind::NotFound);
    c.create_node(&node(next)).await.unwrap();
    next += 1;
    timings.push(("eventual consistency", inv.converge(CONVERGE, &ctl).await));
    sim.cloud.set_list_lag(0);

    let dup: Vec<_> = creations_per_destination(&sim.cloud)
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .collect();
    // A destination is created twice only if its Node was deleted in between;
    // none is here.
    assert!(dup.is_empty(), "routes created more than once: {dup:?}");
    let log = ctl.log_text();
    assert!(
        log.contains("unparsable destination"),
        "the garbage route is warned about:\n{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
    let (calls, deletes) = inv.finish().await;
    eprintln!(
        "cloud faults: {next} nodes, {calls} cloud calls checked, {deletes} deletions checked; convergence per phase: {timings:?}"
    );
    assert_eq!(ctl.stop(), Some(0));
}

/// A throttling storm: the server takes 5 requests per second (burst 5) and
/// answers 429 with a retry-after beyond that. The controller must pace itself
/// instead of retrying into the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_storm_stays_within_the_server_budget() {
    let c = TestCluster::acquire().await.unwrap();
    let dir = TempDir::new("faults-throttle");
    let sim = start_sim(dir.path(), MemoryConfig::default()).await;
    let seeded = seed_foreign_routes(&sim.cloud);
    let nodes = if long_run() { 200 } else { 40 };
    for i in 0..nodes {
        c.create_node(&node(i)).await.unwrap();
    }
    let (rate, burst) = (5u32, 5u32);
    sim.cloud
        .set_rate_limit(Some(provider_memory::RateLimitConfig {
            requests: rate,
            period_secs: 1,
            burst,
        }));
    let inv = Invariants::start(&sim.cloud, c.client(), seeded);
    let ctl = start_controller(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &controller_args(&sim, &[]),
    );
    let took = inv.converge(CONVERGE, &ctl).await;
    let log = sim.cloud.log();
    let total = log.iter().filter(|e| e.batch.is_none()).count();
    let throttled = log
        .iter()
        .filter(|e| e.result == Err(ErrorKind::Throttled))
        .count();
    // Requests (accepted or refused) in every 2 s window. The server accepts
    // at most burst + 2 s × rate; a client that honours retry-after and paces
    // itself adds at most one wave of refused calls (the 10 it may have in
    // flight when the first 429 arrives). A retry storm sends many times it.
    let window = Duration::from_secs(2);
    let budget = (burst + 2 * rate) as usize;
    let wave = 10;
    let mut worst = 0;
    for (i, e) in log.iter().enumerate() {
        let n = log[i..]
            .iter()
            .take_while(|x| x.at.duration_since(e.at) < window)
            .count();
        worst = worst.max(n);
    }
    eprintln!(
        "throttling storm: {nodes} nodes converged in {took:?}; {total} requests, {throttled} throttled; worst 2 s window {worst} requests (server budget {budget})"
    );
    assert!(
        worst <= budget + wave,
        "retry storm: {worst} requests in 2 s against a budget of {budget}"
    );
    assert!(
        throttled * 3 <= total,
        "{throttled} of {total} requests were throttled"
    );
    let dup: Vec<_> = creations_per_destination(&sim.cloud)
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .collect();
    assert!(dup.is_empty(), "routes created more than once: {dup:?}");
    inv.finish().await;
    assert_eq!(ctl.stop(), Some(0));
}

/// A batch cloud (one call per plan) that is IPv4-only: every batch mixes
/// creations that succeed with IPv6 creations the cloud refuses, and a
/// deletion of a route already gone behind the back. The good half is kept,
/// the refused routes are warned about on their Nodes and not retried in a
/// loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_batch_failures_keep_the_good_half_and_warn_about_the_rest() {
    let c = TestCluster::acquire().await.unwrap();
    let dir = TempDir::new("faults-batch");
    let sim = start_sim(
        dir.path(),
        MemoryConfig {
            supports_batch: true,
            supports_ipv6: false,
            ..Default::default()
        },
    )
    .await;
    let seeded = seed_foreign_routes(&sim.cloud);
    let inv = Invariants::start(&sim.cloud, c.client(), seeded);
    let ctl = start_controller(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &controller_args(&sim, &[]),
    );
    let dual = |i: usize| {
        TestNode::new(format!("n-{i}"))
            .pod_cidrs([pod_cidr(i), format!("fd00:10:0:{i:x}::/64")])
            .internal_ip(format!("10.0.0.{}", i + 2))
    };
    for i in 0..4 {
        c.create_node(&dual(i)).await.unwrap();
    }
    let took = inv.converge(CONVERGE, &ctl).await;
    // The route of n-0 vanishes behind the back, then n-0 goes away while two
    // more Nodes arrive: one batch deletes a missing route and creates others.
    let gone = Destination::parse(&pod_cidr(0));
    sim.cloud.remove_route(CLUSTER, &gone);
    c.delete_node("n-0").await.unwrap();
    for i in 4..6 {
        c.create_node(&dual(i)).await.unwrap();
    }
    inv.converge(CONVERGE, &ctl).await;
    for i in 1..6 {
        let name = format!("n-{i}");
        let v6 = format!("fd00:10:0:{i:x}::/64");
        wait_until(Duration::from_secs(60), "IPv6 warning", || async {
            let ev = c.node_events(&name).await.ok()?;
            ev.iter()
                .any(|e| {
                    e.reason.as_deref() == Some("FailedToCreateRoute")
                        && e.type_.as_deref() == Some("Warning")
                        && e.message.as_deref().unwrap_or("").contains(&v6)
                })
                .then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    }
    // Refused as invalid: tried once per destination in this test's time,
    // the retry waits for the backoff maximum.
    let mut v6_attempts: BTreeMap<String, usize> = BTreeMap::new();
    for e in sim.cloud.log() {
        if e.op == Operation::Create
            && let Some(d) = &e.destination
            && d.cidr().is_some_and(|c| c.family() == IpFamily::V6)
        {
            *v6_attempts.entry(d.to_string()).or_default() += 1;
        }
    }
    assert!(
        v6_attempts.values().all(|n| *n == 1),
        "IPv6 creations retried: {v6_attempts:?}"
    );
    let batches = count(&sim.cloud, Operation::Batch, Ok(()));
    let partial = sim
        .cloud
        .log()
        .iter()
        .filter(|e| e.batch.is_some() && e.result.is_err())
        .count();
    eprintln!(
        "partial batches: converged in {took:?}; {batches} batches, {partial} refused changes inside them, IPv6 attempts {v6_attempts:?}"
    );
    assert!(partial >= 6, "the batches were partial: {partial}");
    inv.finish().await;
    assert_eq!(ctl.stop(), Some(0));
}

/// SIGKILL right after the cloud logged a route creation and before the
/// controller patched the Node's condition; the restarted controller finds
/// the route (no second creation) and sets the condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_killed_between_route_creation_and_status_patch() {
    let c = TestCluster::acquire().await.unwrap();
    let dir = TempDir::new("faults-kill");
    // One change at a time, 3 s each: the pass that creates the first route
    // is still busy for 9 s when it is killed, so no condition is written yet.
    let sim = start_sim(
        dir.path(),
        MemoryConfig {
            max_concurrent_operations: 1,
            latency: provider_memory::LatencyConfig {
                create_ms: 3000,
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await;
    let seeded = seed_foreign_routes(&sim.cloud);
    let inv = Invariants::start(&sim.cloud, c.client(), seeded);
    for i in 0..4 {
        c.create_node(&node(i)).await.unwrap();
    }
    let mut ctl = start_controller(
        c.kubeconfig_path(),
        dir.path(),
        "first",
        &controller_args(&sim, &[]),
    );
    let first = wait_until(Duration::from_secs(60), "a route creation", || async {
        sim.cloud
            .log()
            .into_iter()
            .find(|e| e.op == Operation::Create && e.result.is_ok())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    ctl.child.kill().expect("SIGKILL the controller");
    let _ = ctl.child.wait();
    let victim = first.node.clone().unwrap_or_default();
    let cond = c.network_unavailable(&victim).await.unwrap();
    assert!(
        cond.is_none(),
        "the condition was written before the kill ({cond:?}); the window was missed; peak concurrency {}; calls {:?}\n{}",
        sim.cloud.peak_concurrency(),
        sim.cloud.log(),
        ctl.log_text()
    );
    assert_eq!(
        sim.cloud.routes(CLUSTER).len(),
        seeded_count(&sim.cloud) + 1
    );
    let ctl = start_controller(
        c.kubeconfig_path(),
        dir.path(),
        "second",
        &controller_args(&sim, &[]),
    );
    let took = inv.converge(CONVERGE, &ctl).await;
    for i in 0..4 {
        let name = format!("n-{i}");
        wait_until(Duration::from_secs(60), "RouteCreated", || async {
            let cond = c.network_unavailable(&name).await.ok()??;
            (cond.status == "False" && cond.reason.as_deref() == Some("RouteCreated")).then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    }
    // The route found on restart is not asked for again. (A creation that was
    // in flight at the kill may still land after the restart's first list;
    // its `already_exists` answer is ordinary uncertainty, not a duplicate.)
    let dest = first.destination.clone().expect("destination");
    let attempts = sim
        .cloud
        .log()
        .iter()
        .filter(|e| e.op == Operation::Create && e.destination.as_ref() == Some(&dest))
        .count();
    assert_eq!(
        attempts, 1,
        "the route created before the kill was requested again"
    );
    let dup: Vec<_> = creations_per_destination(&sim.cloud)
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .collect();
    assert!(dup.is_empty(), "routes created more than once: {dup:?}");
    let already = count(&sim.cloud, Operation::Create, Err(ErrorKind::AlreadyExists));
    eprintln!(
        "killed after creating {victim}'s route; restart converged in {took:?}; {already} creation(s) answered already_exists (in flight at the kill)"
    );
    inv.finish().await;
    assert_eq!(ctl.stop(), Some(0));
}

/// Routes the seeding put into our cluster's table.
fn seeded_count(cloud: &MemoryCloud) -> usize {
    cloud
        .routes(CLUSTER)
        .iter()
        .filter(|r| !r.destination.cidr().is_some_and(|c| in_cluster(&c)))
        .count()
}

/// Another identity takes the Lease while the leader is in the middle of a
/// slow reconcile: the leader stops mutating at once and exits non-zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_losing_its_lease_mid_reconcile_stops_and_exits_non_zero() {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let c = TestCluster::acquire().await.unwrap();
    let dir = TempDir::new("faults-lease");
    let latency = Duration::from_millis(1500);
    let sim = start_sim(
        dir.path(),
        MemoryConfig {
            max_concurrent_operations: 1,
            latency: provider_memory::LatencyConfig {
                create_ms: latency.as_millis() as u64,
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await;
    let seeded = seed_foreign_routes(&sim.cloud);
    let inv = Invariants::start(&sim.cloud, c.client(), seeded);
    let nodes = 10;
    for i in 0..nodes {
        c.create_node(&node(i)).await.unwrap();
    }
    let mut ctl = start_controller(
        c.kubeconfig_path(),
        dir.path(),
        "leader",
        &controller_args(
            &sim,
            &[
                "--leader-elect=true",
                "--leader-elect-identity",
                "crc-a",
                "--leader-elect-resource-namespace",
                "kube-system",
                "--leader-elect-lease-duration",
                "8s",
                "--leader-elect-renew-deadline",
                "5s",
                "--leader-elect-retry-period",
                "1s",
            ],
        ),
    );
    wait_until(Duration::from_secs(60), "two routes created", || async {
        (count(&sim.cloud, Operation::Create, Ok(())) >= 2).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let leases: Api<Lease> = Api::namespaced(c.client(), "kube-system");
    // When the overwrite landed, and crc-a's last renewal before it.
    let (taken, renewed) = loop {
        let mut l = leases.get("cloud-route-controller").await.unwrap();
        let spec = l.spec.get_or_insert_with(Default::default);
        assert_eq!(spec.holder_identity.as_deref(), Some("crc-a"));
        let renewed = spec.renew_time.clone().expect("crc-a renewed").0;
        spec.holder_identity = Some("intruder".into());
        spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        spec.lease_duration_seconds = Some(3600);
        match leases
            .replace("cloud-route-controller", &Default::default(), &l)
            .await
        {
            Ok(_) => break (tokio::time::Instant::now(), renewed),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => panic!("overwrite the Lease: {e}"),
        }
    };
    let renewal_age =
        Duration::try_from(k8s_openapi::jiff::Timestamp::now().duration_since(renewed))
            .unwrap_or_default()
            .saturating_sub(taken.elapsed());
    let created_at_loss = count(&sim.cloud, Operation::Create, Ok(()));
    let code = wait_until(Duration::from_secs(20), "the leader exits", || {
        let r = ctl.child.try_wait().ok().flatten();
        async move { r }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()))
    .code();
    let exited = taken.elapsed();
    let log = ctl.log_text();
    assert!(
        matches!(code, Some(c) if c != 0),
        "exit code {code:?}\n{log}"
    );
    assert!(log.contains("lost leadership"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    // The fence: no change starts once the last renewal is a renew deadline
    // old, whether or not the loss was seen by then (a renewal slowed by a
    // loaded API server sees it late); one already in flight may still land.
    let renew_deadline = Duration::from_secs(5);
    let fenced = taken.checked_sub(renewal_age).unwrap_or(taken) + renew_deadline;
    let cutoff = fenced + 2 * latency + Duration::from_secs(1);
    eprintln!("leader lost: its last renewal was {renewal_age:?} before the overwrite");
    let late: Vec<_> = sim
        .cloud
        .log()
        .into_iter()
        .filter(|e| e.op != Operation::List && e.at > cutoff)
        .collect();
    assert!(
        late.is_empty(),
        "mutations after the Lease was lost: {late:?}"
    );
    let created = count(&sim.cloud, Operation::Create, Ok(()));
    assert!(
        created < nodes && created <= created_at_loss + 2,
        "{created} routes created, {created_at_loss} at the loss"
    );
    let holder = leases
        .get("cloud-route-controller")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some("intruder"));
    eprintln!(
        "lease lost: exited {exited:?} after the overwrite with {code:?}; {created_at_loss} routes at the loss, {created} in the end"
    );
    inv.finish().await;
}

// ---------------------------------------------------------------------------
// The API server goes away.
// ---------------------------------------------------------------------------

/// A second kube-apiserver on the etcd of a private control plane, owned by
/// this test so it can be killed and restarted (the control plane's own
/// supervisor stops everything when its apiserver dies).
struct ExtraApiserver {
    program: String,
    args: Vec<String>,
    log: PathBuf,
    child: Option<std::process::Child>,
}

impl ExtraApiserver {
    /// Same flags as the plane's apiserver (read from /proc), another port.
    fn new(plane: &test_cluster::ControlPlane, port: u16, log: PathBuf) -> Self {
        let pids = std::fs::read_to_string(plane.dir().join("pids")).expect("pids file");
        let api = pids.split_whitespace().nth(1).expect("apiserver pid");
        let cmdline = std::fs::read(format!("/proc/{api}/cmdline")).expect("apiserver cmdline");
        let mut words: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|w| !w.is_empty())
            .map(|w| String::from_utf8_lossy(w).into_owned())
            .collect();
        let program = words.remove(0);
        let args = words
            .into_iter()
            .map(|w| {
                if w.starts_with("--secure-port=") {
                    format!("--secure-port={port}")
                } else {
                    w
                }
            })
            .collect();
        Self {
            program,
            args,
            log,
            child: None,
        }
    }

    fn start(&mut self) {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("apiserver log");
        let child = std::process::Command::new(&self.program)
            .args(&self.args)
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().expect("log handle"))
            .stderr(out)
            .spawn()
            .expect("start kube-apiserver");
        self.child = Some(child);
    }

    /// SIGKILL: connections drop without a goodbye.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for ExtraApiserver {
    fn drop(&mut self) {
        self.kill();
    }
}

/// etcd's v3 JSON gateway: compacts to the current revision, returns it.
fn compact_etcd(etcd_url: &str) -> i64 {
    let post = |path: &str, body: &str| -> serde_json::Value {
        use std::io::{Read, Write};
        let addr = etcd_url.trim_start_matches("http://");
        let mut s = std::net::TcpStream::connect(addr).expect("connect etcd");
        s.set_read_timeout(Some(Duration::from_secs(10))).ok();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .expect("write etcd request");
        let mut buf = String::new();
        s.read_to_string(&mut buf).expect("read etcd answer");
        let json = buf.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        // Chunked or not, the JSON object is the outermost braces.
        let (a, b) = (json.find('{'), json.rfind('}'));
        match (a, b) {
            (Some(a), Some(b)) => serde_json::from_str(&json[a..=b]).expect("etcd JSON"),
            _ => panic!("etcd answered {buf}"),
        }
    };
    let range = post("/v3/kv/range", r#"{"key":"Lw==","limit":1}"#);
    let rev: i64 = range["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .expect("revision");
    post(
        "/v3/kv/compaction",
        &format!(r#"{{"revision":"{rev}","physical":true}}"#),
    );
    rev
}

/// kube-apiserver SIGKILLed under a running controller (its watch connection
/// drops), Nodes deleted and created while it is down, etcd compacted past
/// the controller's resourceVersion, and the apiserver restarted: nothing is
/// deleted while blind, and afterwards the watcher relists and routes
/// converge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_killed_and_restarted_mid_run() {
    let plane = test_cluster::ControlPlane::start(test_cluster::StartOptions::default())
        .await
        .expect("private control plane");
    let dir = TempDir::new("faults-apiserver");
    let port = common::free_port();
    let mut api2 = ExtraApiserver::new(&plane, port, dir.path().join("apiserver2.log"));
    api2.start();
    let kubeconfig2 = dir.path().join("kubeconfig2");
    let text = std::fs::read_to_string(plane.kubeconfig()).expect("kubeconfig");
    std::fs::write(
        &kubeconfig2,
        text.replace(plane.server(), &format!("https://127.0.0.1:{port}")),
    )
    .expect("write kubeconfig");
    let ready = |path: PathBuf| async move {
        wait_until(Duration::from_secs(120), "second apiserver ready", || {
            let path = path.clone();
            async move {
                let c = test_cluster::client_from_kubeconfig(&path).await.ok()?;
                let nodes: Api<Node> = Api::all(c);
                nodes.list(&ListParams::default().limit(1)).await.ok()
            }
        })
        .await
        .expect("second apiserver");
    };
    ready(kubeconfig2.clone()).await;

    let admin = test_cluster::client_from_kubeconfig(plane.kubeconfig())
        .await
        .expect("admin client");
    let nodes_api: Api<Node> = Api::all(admin.clone());
    let create = |i: usize| {
        let api = nodes_api.clone();
        async move {
            api.create(&Default::default(), &node(i).to_node())
                .await
                .expect("create node");
        }
    };
    let sim = start_sim(dir.path(), MemoryConfig::default()).await;
    let seeded = seed_foreign_routes(&sim.cloud);
    let inv = Invariants::start(&sim.cloud, admin.clone(), seeded);
    let n = if long_run() { 60 } else { 8 };
    for i in 0..n {
        create(i).await;
    }
    let mut ctl = start_controller(
        &kubeconfig2,
        dir.path(),
        "controller",
        &controller_args(&sim, &[]),
    );
    let first = inv.converge(CONVERGE, &ctl).await;

    api2.kill();
    let killed = std::time::Instant::now();
    // While the controller is blind: two Nodes go, two arrive, and enough
    // writes happen that the compaction leaves its resourceVersion behind.
    nodes_api.delete("n-0", &Default::default()).await.unwrap();
    nodes_api.delete("n-1", &Default::default()).await.unwrap();
    create(n).await;
    create(n + 1).await;
    for round in 0..20 {
        for i in 2..6 {
            let patch = serde_json::json!({"metadata": {"labels": {"round": round.to_string()}}});
            nodes_api
                .patch(
                    &format!("n-{i}"),
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&patch),
                )
                .await
                .unwrap();
        }
    }
    let revision = compact_etcd(plane.etcd_url());
    tokio::time::sleep(Duration::from_secs(8)).await;
    inv.assert_ok();
    assert!(ctl.is_running(), "{}", ctl.log_text());
    let mutations_while_down = sim
        .cloud
        .log()
        .iter()
        .filter(|e| e.is_mutation() && e.cluster == CLUSTER)
        .count();
    let down_for = killed.elapsed();

    api2.start();
    ready(kubeconfig2.clone()).await;
    let after = inv.converge(CONVERGE, &ctl).await;
    let log = ctl.log_text();
    // The compaction was real: the watcher's resourceVersion was gone.
    let gone = log
        .lines()
        .find(|l| l.contains("410") || l.to_lowercase().contains("too old"))
        .map(str::to_string);
    let relisted_after_gone = gone.is_some();
    eprintln!(
        "apiserver restart: first convergence {first:?}; down {down_for:?} (etcd compacted at revision {revision}); {mutations_while_down} mutations in all before the restart; converged {after:?} after it was back; 410 seen in the log: {relisted_after_gone}"
    );
    assert!(!log.contains("panicked"), "{log}");
    assert!(
        relisted_after_gone,
        "no 410 Gone reached the watcher after the compaction:\n{log}"
    );
    eprintln!("the watcher saw: {}", gone.unwrap_or_default());
    inv.finish().await;
    assert_eq!(ctl.stop(), Some(0));
    drop(api2);
    plane.stop().expect("stop the private control plane");
}

// ---------------------------------------------------------------------------
// Bad input.
// ---------------------------------------------------------------------------

/// Pod CIDRs outside the cluster CIDRs and pod CIDRs claimed by two Nodes
/// get Warning events and no route; everything else is routed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_pod_cidrs_are_warned_about_and_never_routed() {
    let c = TestCluster::acquire().await.unwrap();
    let dir = TempDir::new("faults-podcidr");
    let sim = start_sim(dir.path(), MemoryConfig::default()).await;
    let seeded = seed_foreign_routes(&sim.cloud);
    let inv = Invariants::start(&sim.cloud, c.client(), seeded);
    let ctl = start_controller(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &controller_args(&sim, &[]),
    );
    c.create_node(&TestNode::new("outside").pod_cidrs(["10.99.0.0/24"]))
        .await
        .unwrap();
    for name in ["twin-a", "twin-b"] {
        c.create_node(&TestNode::new(name).pod_cidrs(["10.244.50.0/24"]))
            .await
            .unwrap();
    }
    c.create_node(&node(1)).await.unwrap();
    inv.converge(CONVERGE, &ctl).await;
    for (name, reason) in [
        ("outside", "PodCIDROutsideClusterCIDR"),
        ("twin-a", "PodCIDRConflict"),
        ("twin-b", "PodCIDRConflict"),
    ] {
        wait_until(Duration::from_secs(60), reason, || async {
            let ev = c.node_events(name).await.ok()?;
            ev.into_iter().find(|e| {
                e.reason.as_deref() == Some(reason) && e.type_.as_deref() == Some("Warning")
            })
        })
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}\n{}", ctl.log_text()));
    }
    let routed: Vec<String> = sim
        .cloud
        .routes(CLUSTER)
        .into_iter()
        .map(|r| r.node.to_string())
        .collect();
    for name in ["outside", "twin-a", "twin-b"] {
        assert!(!routed.iter().any(|r| r == name), "{name} got a route");
    }
    assert_eq!(
        count(&sim.cloud, Operation::Create, Ok(())),
        1,
        "only n-1 is routed"
    );
    inv.finish().await;
    assert_eq!(ctl.stop(), Some(0));
}

/// Runs the binary to completion (it must exit by itself within 30 s).
fn run_to_exit(args: &[&str]) -> (Option<i32>, String) {
    let mut child = std::process::Command::new(common::binary())
        .args(args)
        .env("RUST_LOG", "info")
        .env_remove("RUST_BACKTRACE")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the binary");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// The case of the invalid-flags test that leaves `--cloud-provider` out
/// (every other case gets `memory` when it names no provider).
const NO_PROVIDER: &str = "without --cloud-provider";

/// Every flag and config file mistake ends the process with a non-zero code
/// and one clear message: no panic, no backtrace, no start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_flags_and_config_files_exit_non_zero_with_a_clear_message() {
    let cluster = TestCluster::shared().await.unwrap();
    let dir = TempDir::new("faults-flags");
    let kubeconfig = cluster.kubeconfig_path().to_str().unwrap().to_string();
    let file = |name: &str, body: &[u8]| -> String {
        let p = dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        p.to_str().unwrap().to_string()
    };
    let bad_memory = [
        ("unknown-key.yaml", &b"laytency: {list_ms: 5}\n"[..]),
        (
            "probability.yaml",
            b"error_rates: {create: {probability: 2.0, kind: transient}}\n",
        ),
        ("truncated.yaml", b"latency: {list_ms: "),
        ("binary.yaml", b"\x00\xff\xfe\x01garbage\x80"),
        (
            "bad-kind.yaml",
            b"error_rates: {list: {probability: 0.1, kind: oops}}\n",
        ),
        ("zero-rate.yaml", b"rate_limit: {requests: 0, burst: 1}\n"),
        ("bad.toml", b"latency = [\n"),
        ("endpoint.yaml", b"endpoint: 12\ncaller: [1]\n"),
    ];
    let mut cases: Vec<(String, Vec<String>)> = Vec::new();
    let flag_cases: &[&[&str]] = &[
        &["--cluster-cidr", "10.244.0.0/33"],
        &["--cluster-cidr", "not-a-cidr"],
        &["--cluster-cidr", "10.244.0.0/16,10.245.0.0/16,fd00::/56"],
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--reconcile-mode",
            "sometimes",
        ],
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--route-reconciliation-period",
            "ten seconds",
        ],
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--route-reconciliation-period",
            "0s",
        ],
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--min-resync-period",
            "-5m",
        ],
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--leader-elect=true",
            "--leader-elect-renew-deadline",
            "20s",
        ],
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--leader-elect=true",
            "--leader-elect-retry-period",
            "0s",
        ],
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--feature-gates",
            "Bogus=true",
        ],
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "azure",
        ],
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-config",
            "/nonexistent/cloud.yaml",
        ],
        &["--cluster-cidr", "10.244.0.0/16", "--kube-api-qps", "-1"],
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--concurrent-status-updates",
            "0",
        ],
        &["--cluster-cidr", "10.244.0.0/16", "--cluster-name", ""],
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--metrics-bind-address",
            "not-an-address",
        ],
        &["--cluster-cidr", "10.244.0.0/16", "--no-such-flag"],
    ];
    for f in flag_cases {
        cases.push((f.join(" "), f.iter().map(|s| s.to_string()).collect()));
    }
    cases.push((
        NO_PROVIDER.into(),
        vec!["--cluster-cidr".into(), "10.244.0.0/16".into()],
    ));
    for (name, body) in bad_memory {
        let path = file(name, body);
        cases.push((
            format!("memory config {name}"),
            vec![
                "--cluster-cidr".into(),
                "10.244.0.0/16".into(),
                "--cloud-config".into(),
                path,
            ],
        ));
    }
    let hcloud_cases: [(&str, &[u8]); 4] = [
        ("hcloud-empty.yaml", b""),
        ("hcloud-no-network.yaml", b"token_file: /nonexistent\n"),
        (
            "hcloud-token-file.yaml",
            b"network: \"1\"\ntoken_file: /nonexistent/token\n",
        ),
        (
            "hcloud-bad-endpoint.yaml",
            b"network: \"1\"\nendpoint: \"::not a url\"\ntoken_file: TOKEN\n",
        ),
    ];
    let token = file("token", b"t0ken");
    for (name, body) in hcloud_cases {
        let body = String::from_utf8_lossy(body).replace("TOKEN", &token);
        let path = file(name, body.as_bytes());
        cases.push((
            format!("hcloud config {name}"),
            vec![
                "--cluster-cidr".into(),
                "10.244.0.0/16".into(),
                "--cloud-provider".into(),
                "hcloud".into(),
                "--cloud-config".into(),
                path,
            ],
        ));
    }
    let openstack = file("openstack.yaml", b"auth: [this is: not a mapping\n");
    cases.push((
        "openstack config garbage".into(),
        vec![
            "--cluster-cidr".into(),
            "10.244.0.0/16".into(),
            "--cloud-provider".into(),
            "openstack".into(),
            "--cloud-config".into(),
            openstack,
        ],
    ));
    let mut failures = Vec::new();
    for (what, args) in &cases {
        // The case's flags, plus defaults for the flags it does not set.
        let mut full: Vec<&str> = vec!["--kubeconfig", &kubeconfig];
        let sets = |flag: &str| {
            args.iter()
                .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
        };
        if !sets("--leader-elect") {
            full.push("--leader-elect=false");
        }
        if !sets("--metrics-bind-address") {
            full.extend(["--metrics-bind-address", "0"]);
        }
        if !sets("--secure-port") {
            full.extend(["--secure-port", "0"]);
        }
        if !sets("--cloud-provider") && what != NO_PROVIDER {
            full.extend(["--cloud-provider", "memory"]);
        }
        full.extend(args.iter().map(String::as_str));
        let (code, out) = run_to_exit(&full);
        let first = out
            .lines()
            .rev()
            .find(|l| l.contains("error"))
            .unwrap_or("");
        eprintln!("{what}: exit {code:?}: {first}");
        let bad = match code {
            None => Some("killed: did not exit by itself"),
            Some(0) => Some("exit code 0"),
            _ if out.contains("panicked") || out.contains("backtrace") => Some("panic"),
            _ if !out.to_lowercase().contains("error") => Some("no error message"),
            _ if out.len() > 4000 => Some("more than a short message"),
            _ => None,
        };
        if let Some(why) = bad {
            failures.push(format!("{what}: {why}\n{out}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n---\n"));
}

/// `--cloud-provider=memory` against a cluster whose Nodes run on EC2 (a
/// copied manifest with the wrong provider) is refused before it writes a
/// condition, with a message naming the Nodes' cloud; the unsafe flag says
/// the simulation is meant, and then it starts and routes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_provider_against_nodes_with_aws_provider_ids_is_refused_unless_the_simulation_is_meant()
 {
    let c = TestCluster::acquire().await.unwrap();
    for i in 1..=4 {
        c.create_node(&node(i).provider_id(format!("aws:///us-east-1a/i-{i:017x}")))
            .await
            .unwrap();
    }
    let kubeconfig = c.kubeconfig_path().to_str().unwrap().to_string();
    let base = [
        "--kubeconfig",
        kubeconfig.as_str(),
        "--cluster-cidr",
        CLUSTER_CIDRS,
        "--cloud-provider",
        "memory",
        "--leader-elect=false",
        "--metrics-bind-address",
        "0",
        "--secure-port",
        "0",
    ];
    let (code, out) = run_to_exit(&base);
    assert_eq!(code, Some(1), "refused:\n{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("one error line:\n{out}"));
    for needle in [
        "simulated cloud",
        "4 Nodes on aws (n-1, n-2, n-3 and 1 more)",
        "--cloud-provider=aws",
        "--unsafe-memory-provider-on-cloud-nodes",
    ] {
        assert!(line.contains(needle), "{needle:?} missing: {line}");
    }
    let nodes: Api<Node> = Api::all(c.client());
    for n in nodes.list(&ListParams::default()).await.unwrap() {
        let conditions = n.status.and_then(|s| s.conditions).unwrap_or_default();
        assert!(
            conditions.iter().all(|c| c.type_ != "NetworkUnavailable"),
            "nothing was written before the refusal: {conditions:?}"
        );
    }

    let dir = TempDir::new("faults-memory-meant");
    // start_controller adds the kubeconfig and --secure-port 0.
    let mut args: Vec<String> = base[2..base.len() - 2]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push("--unsafe-memory-provider-on-cloud-nodes".into());
    let ctl = start_controller(c.kubeconfig_path(), dir.path(), "controller", &args);
    wait_until(
        Duration::from_secs(60),
        "the 4 Nodes read RouteCreated",
        || async { (common::route_created_count(&nodes).await == 4).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
}

const NETWORK: u64 = 4711;

/// An hcloud `--cloud-config` for `endpoint` with `token` in a file.
fn hcloud_config(dir: &Path, endpoint: &str, token: &str) -> PathBuf {
    let token_file = dir.join("token");
    std::fs::write(&token_file, token).expect("write the test fixture file");
    let config = dir.join("hcloud.yaml");
    std::fs::write(
        &config,
        format!(
            "network: \"{NETWORK}\"\nendpoint: {endpoint}\ntoken_file: {}\n",
            token_file.display()
        ),
    )
    .expect("write the test fixture file");
    config
}

fn hcloud_args(config: &Path, metrics: &str) -> Vec<String> {
    [
        "--cluster-cidr",
        "10.244.0.0/16,fd00:10::/56",
        "--cloud-provider",
        "hcloud",
        "--cloud-config",
        config.to_str().expect("temporary paths are UTF-8"),
        "--leader-elect=false",
        "--metrics-bind-address",
        metrics,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A wrong hcloud token: every answer is 401. The controller says so in plain
/// words, stays up (readiness tells), and asks again only at the least
/// interval between full passes — no request loop. The token is not logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_hcloud_token_is_permanent_clear_and_not_hammered() {
    let c = TestCluster::acquire().await.unwrap();
    let fake = provider_hcloud::testing::FakeHcloud::start(Default::default())
        .await
        .unwrap();
    fake.add_network(NETWORK, "k8s", "10.0.0.0/8", &["10.0.0.0/16"]);
    fake.add_server(1, "n-1", NETWORK, "10.0.0.3");
    let dir = TempDir::new("faults-token");
    let wrong = "wrong-token-7f3a9c1e5b2d4e6f8a0b";
    let config = hcloud_config(dir.path(), &fake.base_url(), wrong);
    c.create_node(&node(1).provider_id("hcloud://1"))
        .await
        .unwrap();
    let args = hcloud_args(&config, "0");
    let mut ctl = start_logging_at(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &args,
        "debug",
    );
    // From the first refusal, however long a loaded machine took to start
    // the controller, a fixed window.
    wait_until(Duration::from_secs(60), "the first 401", || async {
        (fake.with_status(401) >= 1).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let watch_for = Duration::from_secs(25);
    tokio::time::sleep(watch_for).await;
    let log = ctl.log_text();
    assert!(ctl.is_running(), "the controller exited:\n{log}");
    let requests = fake.total();
    let unauthorized = fake.with_status(401);
    eprintln!(
        "wrong token: {requests} requests in {watch_for:?}, {unauthorized} answered 401; log says: {}",
        log.lines()
            .find(|l| l.contains("could not list routes"))
            .unwrap_or("")
    );
    assert!(unauthorized >= 1, "{log}");
    // One list per 10 s least interval, plus at most one lookup each.
    assert!(
        requests <= 8,
        "{requests} requests in {watch_for:?}:\n{log}"
    );
    assert!(
        log.contains("permanent"),
        "the failure is classified as permanent:\n{log}"
    );
    assert!(!log.contains(wrong), "the token is in the log:\n{log}");
    assert!(fake.routes(NETWORK).is_empty());
    assert_eq!(ctl.stop(), Some(0));
}

/// The provider's token and the cloud config never show up in the log (at
/// trace level), the Events or /metrics, while the controller works, warns
/// and fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_appear_in_logs_events_or_metrics() {
    use k8s_openapi::api::core::v1::Event;
    let c = TestCluster::acquire().await.unwrap();
    let token = "s3cr3t-hcloud-token-4b9e2d71c0a8f6e3";
    let fake = provider_hcloud::testing::FakeHcloud::start(provider_hcloud::testing::FakeConfig {
        token: token.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    fake.add_network(NETWORK, "k8s", "10.0.0.0/8", &["10.0.0.0/16"]);
    let dir = TempDir::new("faults-secret");
    let config = hcloud_config(dir.path(), &fake.base_url(), token);
    for i in 0..3usize {
        fake.add_server(
            1 + i as u64,
            &format!("n-{i}"),
            NETWORK,
            &format!("10.0.0.{}", i + 2),
        );
        c.create_node(
            &TestNode::new(format!("n-{i}"))
                .pod_cidrs([pod_cidr(i), format!("fd00:10:0:{i:x}::/64")])
                .internal_ip(format!("10.0.0.{}", i + 2))
                .provider_id(format!("hcloud://{}", 1 + i)),
        )
        .await
        .unwrap();
    }
    // Failures carry the server's messages into logs and Events.
    fake.fail_next("add_route", 2, 500, "server_error");
    let metrics = format!("127.0.0.1:{}", common::free_port());
    let args = hcloud_args(&config, &metrics);
    let ctl = start_logging_at(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &args,
        "trace",
    );
    wait_until(Duration::from_secs(90), "three IPv4 routes", || async {
        (fake.routes(NETWORK).len() == 3).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    wait_until(Duration::from_secs(60), "warnings recorded", || async {
        let ev = c.node_events("n-0").await.ok()?;
        (!ev.is_empty()).then_some(())
    })
    .await
    .unwrap();
    let (code, body) = common::http_get(&format!("http://{metrics}"), "/metrics").unwrap();
    assert_eq!(code, 200);
    let events: Api<Event> = Api::all(c.client());
    let events =
        serde_json::to_string(&events.list(&ListParams::default()).await.unwrap().items).unwrap();
    let log = ctl.log_text();
    eprintln!(
        "secrets: searched {} bytes of trace log, {} bytes of Events, {} bytes of metrics",
        log.len(),
        events.len(),
        body.len()
    );
    assert!(log.len() > 10_000, "the trace log is suspiciously short");
    for (what, text) in [("log", &log), ("Events", &events), ("/metrics", &body)] {
        assert!(!text.contains(token), "the token is in the {what}");
        // Also no prefix of it long enough to identify it.
        assert!(
            !text.contains(&token[..12]),
            "part of the token is in the {what}"
        );
    }
    assert_eq!(ctl.stop(), Some(0));
}

/// A fake cloud API that answers every request with the same broken bytes
/// and counts the requests.
async fn broken_server(answer: &'static str) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a local port");
    let addr = listener
        .local_addr()
        .expect("the bound listener has an address");
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16384];
                let mut got = Vec::new();
                // Read the request head (bodies are small and ignored).
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = s.write_all(answer.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    (format!("http://{addr}"), hits)
}

/// Malformed and truncated provider answers: the hcloud provider and the
/// remote simulated cloud get a body cut off mid-JSON, a well-formed body of
/// the wrong shape, and an HTML error page. Each is a clear error, the
/// controller stays up, and it does not retry in a loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_truncated_provider_answers_are_clear_errors() {
    let c = TestCluster::acquire().await.unwrap();
    c.create_node(&node(1).provider_id("hcloud://1"))
        .await
        .unwrap();
    let answers: [(&str, &'static str); 3] = [
        (
            "truncated JSON",
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 30\r\nConnection: close\r\n\r\n{\"network\": {\"id\": 4711, \"rou",
        ),
        (
            "wrong shape",
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 24\r\nConnection: close\r\n\r\n{\"routes\": \"everything\"}",
        ),
        (
            "HTML error page",
            "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\nContent-Length: 33\r\nConnection: close\r\n\r\n<html><h1>502 oops</h1></html>\n\n\n",
        ),
    ];
    let mut report = Vec::new();
    for (what, answer) in answers {
        for provider in ["hcloud", "memory"] {
            let (url, hits) = broken_server(answer).await;
            let dir = TempDir::new("faults-malformed");
            let args: Vec<String> = if provider == "hcloud" {
                let config = hcloud_config(dir.path(), &format!("{url}/v1"), "t0ken");
                hcloud_args(&config, "0")
            } else {
                let config = dir.path().join("cloud.yaml");
                std::fs::write(&config, format!("endpoint: {url}\n")).unwrap();
                [
                    "--cluster-cidr",
                    "10.244.0.0/16",
                    "--cloud-provider",
                    "memory",
                    "--cloud-config",
                    config.to_str().unwrap(),
                    "--leader-elect=false",
                    "--metrics-bind-address",
                    "0",
                    // The test's Node is the hcloud case's (hcloud://1).
                    "--unsafe-memory-provider-on-cloud-nodes",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect()
            };
            let mut ctl = start_controller(c.kubeconfig_path(), dir.path(), provider, &args);
            // From the first failed list, however long a loaded machine
            // took to start the controller, a fixed window.
            wait_until(Duration::from_secs(60), "a failed list", || async {
                ctl.log_text()
                    .contains("could not list routes")
                    .then_some(())
            })
            .await
            .unwrap_or_else(|e| panic!("{provider}/{what}: {e}\n{}", ctl.log_text()));
            let watch_for = Duration::from_secs(12);
            tokio::time::sleep(watch_for).await;
            let log = ctl.log_text();
            assert!(ctl.is_running(), "{provider}/{what}: exited\n{log}");
            assert!(!log.contains("panicked"), "{provider}/{what}:\n{log}");
            let line = log
                .lines()
                .find(|l| l.contains("could not list routes"))
                .unwrap_or_else(|| panic!("{provider}/{what}: no clear error\n{log}"))
                .to_string();
            let n = hits.load(std::sync::atomic::Ordering::SeqCst);
            // Two full-pass attempts fit in 12 s at the 10 s least interval;
            // each may take a few requests (lookups, a provider retry).
            assert!(
                n <= 10,
                "{provider}/{what}: {n} requests in {watch_for:?}\n{log}"
            );
            report.push(format!("{provider}/{what}: {n} requests; {line}"));
            assert_eq!(ctl.stop(), Some(0), "{provider}/{what}");
        }
    }
    eprintln!("malformed answers:\n{}", report.join("\n"));
}

// ---------------------------------------------------------------------------
// --dry-run beside a controller that writes.
// ---------------------------------------------------------------------------

/// `controller_args` with the plain metrics port at `addr`.
fn args_serving_metrics(sim: &Sim, addr: &str, extra: &[&str]) -> Vec<String> {
    let mut args = controller_args(sim, extra);
    let at = args
        .iter()
        .position(|a| a == "--metrics-bind-address")
        .expect("--metrics-bind-address");
    args[at + 1] = addr.to_string();
    args
}

/// The value of the sample `sample` (name and labels) in a scrape of `base`.
async fn sample(base: &str, sample: &str) -> Option<f64> {
    let b = base.to_string();
    let (code, text) = tokio::task::spawn_blocking(move || common::http_get(&b, "/metrics"))
        .await
        .ok()??;
    (code == 200).then_some(())?;
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
}

/// A shadow (`--dry-run`) starts first, alone, over Nodes without routes:
/// it lists the cloud and says what it would do, and writes nothing (no
/// route, no condition, no Event). A controller that writes then routes the
/// Nodes; the shadow, under a Lease of its own, never changes anything and
/// agrees once the writer has converged. The simulated cloud's call log
/// names each call's caller (the Lease identity), and Events name their
/// reporting instance (the same identity).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_beside_a_writing_controller_writes_nothing_and_agrees_once_the_writer_converged()
{
    const NODES: usize = 3;
    let c = TestCluster::acquire().await.unwrap();
    let dir = TempDir::new("faults-dry-run");
    let sim = start_sim(dir.path(), MemoryConfig::default()).await;
    for i in 0..NODES {
        c.create_node(&node(i)).await.unwrap();
    }
    let leases = [
        "--leader-elect=true",
        "--leader-elect-resource-namespace",
        "default",
    ];
    let shadow_addr = format!("127.0.0.1:{}", common::free_port());
    let shadow_base = format!("http://{shadow_addr}");
    let mut extra = vec!["--dry-run", "--leader-elect-identity", "shadow"];
    extra.extend(leases);
    let shadow = start_controller(
        c.kubeconfig_path(),
        dir.path(),
        "shadow",
        &args_serving_metrics(&sim, &shadow_addr, &extra),
    );
    let create =
        r#"route_controller_dry_run_pending_operations{operation="create",reason="missing"}"#;
    wait_until(
        Duration::from_secs(60),
        "the shadow's planned creations",
        || async { (sample(&shadow_base, create).await == Some(NODES as f64)).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", shadow.log_text()));
    let agreeing = "route_controller_dry_run_agreeing";
    let since = "route_controller_dry_run_agreeing_since_seconds";
    assert_eq!(sample(&shadow_base, agreeing).await, Some(0.0));
    assert_eq!(sample(&shadow_base, since).await, Some(0.0));
    let condition = r#"route_controller_dry_run_pending_operations{operation="condition",reason="RouteCreated"}"#;
    assert_eq!(sample(&shadow_base, condition).await, Some(NODES as f64));
    let mutations = |who: Option<&str>| {
        sim.cloud
            .log()
            .into_iter()
            .filter(|e| e.op != Operation::List)
            .filter(|e| who.is_none_or(|w| &*e.caller == w))
            .count()
    };
    assert_eq!(mutations(None), 0, "{:?}", sim.cloud.log());
    assert!(
        sim.cloud.log().iter().any(|e| &*e.caller == "shadow"),
        "the shadow lists the cloud"
    );
    for i in 0..NODES {
        let name = format!("n-{i}");
        assert_eq!(c.network_unavailable(&name).await.unwrap(), None, "{name}");
        assert_eq!(c.node_events(&name).await.unwrap(), [], "{name}");
    }
    let text = shadow.log_text();
    assert!(text.contains("dry run: nothing is written"), "{text}");
    assert!(
        text.contains(&format!(
            "dry run: would create route {} to n-0 (missing)",
            pod_cidr(0)
        )),
        "{text}"
    );

    // The writer, under the default Lease, converges.
    let mut extra = vec!["--leader-elect-identity", "writer"];
    extra.extend(leases);
    let writer = start_controller(
        c.kubeconfig_path(),
        dir.path(),
        "writer",
        &controller_args(&sim, &extra),
    );
    for i in 0..NODES {
        let name = format!("n-{i}");
        wait_until(Duration::from_secs(60), "RouteCreated", || async {
            let cond = c.network_unavailable(&name).await.ok()??;
            (cond.status == "False" && cond.reason.as_deref() == Some("RouteCreated")).then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", writer.log_text()));
    }
    assert_eq!(sim.cloud.routes(CLUSTER).len(), NODES);
    wait_until(Duration::from_secs(60), "the shadow agrees", || async {
        (sample(&shadow_base, agreeing).await == Some(1.0)).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", shadow.log_text()));
    let agreed = sample(&shadow_base, since).await.expect("agreeing since");
    assert!(agreed > 1.6e9, "{agreed}");
    assert_eq!(sample(&shadow_base, create).await, None, "no creation left");

    // Every change is the writer's; the shadow made none.
    assert_eq!(mutations(Some("shadow")), 0, "{:?}", sim.cloud.log());
    assert_eq!(mutations(Some("writer")), mutations(None));
    for i in 0..NODES {
        let events = c.node_events(&format!("n-{i}")).await.unwrap();
        assert!(
            events
                .iter()
                .all(|e| e.reporting_instance.as_deref() != Some("shadow")
                    && e.source.as_ref().and_then(|s| s.host.as_deref()) != Some("shadow")),
            "{events:?}"
        );
    }
    // Each under a Lease of its own: neither took the other's.
    let lease_api: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(c.client(), "default");
    for (name, holder) in [
        ("cloud-route-controller", "writer"),
        ("cloud-route-controller-dry-run", "shadow"),
    ] {
        let lease = lease_api.get(name).await.unwrap();
        let held = lease.spec.and_then(|s| s.holder_identity);
        assert_eq!(held.as_deref(), Some(holder), "{name}");
    }
    // Each difference was logged once, and went away.
    let text = shadow.log_text();
    let line = format!(
        "dry run: would create route {} to n-0 (missing)",
        pod_cidr(0)
    );
    assert_eq!(text.matches(&line).count(), 1, "{text}");
    assert!(text.contains("dry run: nothing to do"), "{text}");
    assert_eq!(writer.stop(), Some(0));
    assert_eq!(shadow.stop(), Some(0));
}
