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
use route_cloud::ErrorKind;
use route_cloud::memory::{CallRecord, ErrorRate, MemoryCloud, MemoryConfig, Operation};
use route_core::{Cidr, Destination, Route};
use test_cluster::{TestCluster, TestNode, wait_until};
use tokio::task::JoinHandle;

const CLUSTER: &str = "kubernetes";
const OTHER_CLUSTER: &str = "other-cluster";
const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// Bound on convergence once the faults stop.
const CONVERGE: Duration = Duration::from_secs(90);

fn long_run() -> bool {
    std::env::var("CRC_LONG_FAULTS").is_ok_and(|v| v == "1")
}

fn cluster_cidr() -> Cidr {
    Cidr::parse(CLUSTER_CIDR).expect("cluster CIDR")
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
        CLUSTER_CIDR,
        "--cloud-provider",
        "memory",
        "--cloud-config",
        sim.config.to_str().expect("utf-8 path"),
        "--leader-elect=false",
        "--metrics-bind-address",
        "0",
        "--min-resync-period",
        "1h",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn start_controller(kubeconfig: &Path, dir: &Path, name: &str, args: &[String]) -> Controller {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    Controller::start(kubeconfig, dir, name, &refs)
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
        let want = desired(&nodes.items);
        let have: BTreeSet<(String, String)> = self
            .cloud
            .routes(CLUSTER)
            .into_iter()
            .filter(|r| {
                r.destination
                    .cidr()
                    .is_some_and(|c| cluster_cidr().covers(&c))
            })
            .map(|r| (r.target_node, r.destination.to_string()))
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
fn desired(nodes: &[Node]) -> BTreeSet<(String, String)> {
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
                && cluster_cidr().covers(&c)
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
                && !d.cidr().is_some_and(|c| cluster_cidr().covers(&c))
            {
                s.violation = Some(format!(
                    "a call touched {d:?}, outside the cluster CIDR: {e:?}"
                ));
                break;
            }
            if e.op == Operation::Delete && e.result.is_ok() {
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
        let node = e.target_node.clone().unwrap_or_default();
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
