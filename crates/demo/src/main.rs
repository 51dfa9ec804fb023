//! `crc-demo` (`make demo`, through `scripts/demo.sh`): the controller's main
//! job on built-in defaults, end to end and visible.
//!
//! It starts a private local control plane (real etcd + kube-apiserver, in a
//! fresh directory, never someone else's), the simulated cloud (`cloud-sim`)
//! and the controller (incremental mode, `memory` provider pointed at the
//! simulator, no leader election). Then it creates Nodes, changes some Nodes'
//! addresses and deletes Nodes, printing the cloud's route table as it
//! changes, and ends with the cloud calls each step cost and how long routes
//! took. Everything it started is stopped on exit, on error and on Ctrl-C.
//!
//! This binary only drives and observes: routing decisions are the
//! controller's, the route table is the simulator's (`/admin/state`,
//! `/admin/stats`).

use std::collections::{BTreeMap, HashMap};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use cloud_sim::AdminClient;
use cloud_sim::wire::StatsSnapshot;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use test_cluster::{ControlPlane, NETWORK_UNAVAILABLE, StartOptions, TestNode, condition};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const CLUSTER: &str = "kubernetes";
const CLUSTER_CIDR: &str = "10.244.0.0/16";
const LABEL: &str = "crc-demo";
/// Longest wait for one step before the demo gives up and shows the log.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, Parser)]
#[command(
    name = "crc-demo",
    about = "Runs cloud-route-controller against a local control plane and a simulated cloud, and shows what it does."
)]
struct Args {
    /// The cloud-route-controller binary.
    #[arg(long)]
    controller: PathBuf,
    /// The cloud-sim binary.
    #[arg(long)]
    cloud_sim: PathBuf,
    /// Nodes to create (at most 250).
    #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u16).range(3..=250))]
    nodes: u16,
    /// Simulated latency of each route creation and deletion, in milliseconds.
    #[arg(long, default_value_t = 150)]
    cloud_latency_ms: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let ui = Ui::new();
    let mut stack = Stack::new();
    let outcome = tokio::select! {
        r = demo(&args, &ui, &mut stack) => Some(r),
        _ = tokio::signal::ctrl_c() => None,
    };
    let code = match &outcome {
        Some(Ok(())) => ExitCode::SUCCESS,
        None => {
            ui.end_line();
            ui.say("\nInterrupted.");
            ExitCode::from(130)
        }
        Some(Err(e)) => {
            ui.end_line();
            eprintln!("\ndemo failed: {e:#}");
            if let Some(log) = &stack.controller_log {
                eprintln!("{}", tail(log, 25));
            }
            ExitCode::FAILURE
        }
    };
    ui.say("\nCleaning up: controller, simulated cloud, control plane ...");
    stack.shutdown().await;
    ui.say("Done.");
    code
}

/// Everything the demo started, stopped in reverse order.
struct Stack {
    dir: PathBuf,
    plane: Option<ControlPlane>,
    sim: Option<Child>,
    controller: Option<Child>,
    controller_log: Option<PathBuf>,
}

impl Stack {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("crc-demo-{}", std::process::id()));
        Stack {
            dir,
            plane: None,
            sim: None,
            controller: None,
            controller_log: None,
        }
    }

    async fn shutdown(&mut self) {
        if let Some(mut c) = self.controller.take() {
            // SIGTERM first: the controller finishes in-flight calls and exits.
            if let Some(pid) = c.id() {
                let _ = Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status()
                    .await;
            }
            if tokio::time::timeout(Duration::from_secs(10), c.wait())
                .await
                .is_err()
            {
                let _ = c.kill().await;
            }
        }
        if let Some(mut s) = self.sim.take() {
            let _ = s.kill().await;
        }
        if let Some(p) = self.plane.take() {
            let _ = tokio::task::spawn_blocking(move || p.stop()).await;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A consistent view of the world, read between steps.
struct World {
    admin: AdminClient,
    nodes: Api<Node>,
    metrics: String,
}

/// One route as the demo shows it: destination → (node, address).
type Table = BTreeMap<String, (String, String)>;

impl World {
    async fn table(&self) -> anyhow::Result<Table> {
        let state = self.admin.state().await.context("reading /admin/state")?;
        Ok(state
            .clusters
            .get(CLUSTER)
            .into_iter()
            .flatten()
            .map(|r| {
                let addr = r
                    .node_addresses
                    .iter()
                    .find(|a| a.kind == "InternalIP")
                    .or(r.node_addresses.first())
                    .map(|a| a.address.to_string())
                    .unwrap_or_else(|| "-".into());
                (r.destination.clone(), (r.node.clone(), addr))
            })
            .collect())
    }

    /// Names of the demo's Nodes whose NetworkUnavailable is False/RouteCreated.
    async fn routed_nodes(&self) -> anyhow::Result<Vec<String>> {
        let list = self
            .nodes
            .list(&ListParams::default().labels(LABEL))
            .await
            .context("listing Nodes")?;
        Ok(list
            .items
            .iter()
            .filter(|n| {
                condition(n, NETWORK_UNAVAILABLE).is_some_and(|c| {
                    c.status == "False" && c.reason.as_deref() == Some("RouteCreated")
                })
            })
            .filter_map(|n| n.metadata.name.clone())
            .collect())
    }
}

async fn demo(args: &Args, ui: &Ui, stack: &mut Stack) -> anyhow::Result<()> {
    let began = Instant::now();
    let n = usize::from(args.nodes);
    std::fs::create_dir_all(&stack.dir).context("creating the demo's directory")?;
    ui.title("cloud-route-controller demo");
    ui.say(&format!(
        "A real kube-apiserver, a simulated cloud ({} ms per route change) and the controller\nin incremental mode. {n} Nodes are created, {} change address, {} are deleted.\n",
        args.cloud_latency_ms,
        n / 3,
        n / 2
    ));

    // 1. Control plane: private, in a fresh directory, stopped with this process.
    let t = Instant::now();
    ui.step("Starting a local control plane (etcd + kube-apiserver v1.37)");
    let plane = ControlPlane::start(StartOptions::default())
        .await
        .context("starting the local control plane")?;
    let kubeconfig = plane.kubeconfig().to_owned();
    stack.plane = Some(plane);
    ui.done(&format!("ready in {:.1} s", t.elapsed().as_secs_f64()));

    // 2. The simulated cloud.
    let t = Instant::now();
    ui.step("Starting the simulated cloud (cloud-sim)");
    let sim_config = stack.dir.join("cloud-sim.yaml");
    std::fs::write(
        &sim_config,
        format!(
            "latency: {{list_ms: 20, create_ms: {l}, delete_ms: {l}}}\nmax_concurrent_operations: 10\n",
            l = args.cloud_latency_ms
        ),
    )?;
    let (sim, sim_url) = start_sim(&args.cloud_sim, &sim_config, &stack.dir).await?;
    stack.sim = Some(sim);
    ui.done(&format!("{sim_url} in {:.1} s", t.elapsed().as_secs_f64()));

    // 3. The controller, talking to both.
    let t = Instant::now();
    ui.step("Starting cloud-route-controller (incremental, memory provider via cloud-sim)");
    let cloud_config = stack.dir.join("cloud.yaml");
    std::fs::write(&cloud_config, format!("endpoint: {sim_url}\n"))?;
    let port = free_port()?;
    let metrics = format!("127.0.0.1:{port}");
    let log = stack.dir.join("controller.log");
    stack.controller_log = Some(log.clone());
    let controller = Command::new(&args.controller)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--cluster-cidr", CLUSTER_CIDR])
        .args(["--cluster-name", CLUSTER])
        // The demo deletes half its Nodes at once to show their routes go;
        // by default more than 10 such deletions in one pass are held.
        .arg("--max-route-deletions=100%")
        .args(["--reconcile-mode", "incremental"])
        .args(["--cloud-provider", "memory"])
        .arg("--cloud-config")
        .arg(&cloud_config)
        .arg("--leader-elect=false")
        .args(["--metrics-bind-address", &metrics])
        // Plain HTTP on loopback for the demo's own reads; no secure port.
        .args(["--secure-port", "0"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        // Ctrl-C reaches the demo only; it stops the controller itself, in order.
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", args.controller.display()))?;
    stack.controller = Some(controller);
    let world = World {
        admin: AdminClient::new(&sim_url).map_err(|e| anyhow::anyhow!("{e}"))?,
        nodes: Api::all(test_cluster::client_from_kubeconfig(&kubeconfig).await?),
        metrics: format!("http://{metrics}"),
    };
    wait_ready(&world, stack).await?;
    ui.done(&format!("ready in {:.1} s", t.elapsed().as_secs_f64()));

    let mut steps: Vec<StepReport> = Vec::new();
    let mut before = world.admin.stats().await?;
    steps.push(StepReport::calls("start-up (first list)", &before, None));
    let mut table = world.table().await?;

    // 4. Create Nodes.
    let names: Vec<String> = (1..=n).map(|i| format!("demo-{i:02}")).collect();
    let address = |i: usize, subnet: u8| format!("10.0.{subnet}.{}", i + 10);
    let cidr = |i: usize| format!("10.244.{i}.0/24");
    ui.phase(1, &format!("create {n} Nodes, each with a /24 pod CIDR"));
    let t0 = Instant::now();
    let mut started = HashMap::new();
    for (i, name) in names.iter().enumerate() {
        let node = TestNode::new(name)
            .pod_cidrs([cidr(i + 1)])
            .internal_ip(address(i + 1, 0))
            .label(LABEL, "true");
        world
            .nodes
            .create(&PostParams::default(), &node.to_node())
            .await
            .with_context(|| format!("creating Node {name}"))?;
        started.insert(name.clone(), Instant::now());
    }
    let expected: HashMap<String, String> = names
        .iter()
        .enumerate()
        .map(|(i, name)| (name.clone(), address(i + 1, 0)))
        .collect();
    let waited = wait_step(
        ui,
        &world,
        &mut table,
        t0,
        &started,
        "routed",
        |name, table| {
            table
                .values()
                .any(|(node, addr)| node == name && Some(addr) == expected.get(name))
        },
        true,
    )
    .await?;
    let after = world.admin.stats().await?;
    steps.push(StepReport::new(
        format!("create {n} Nodes"),
        &before,
        &after,
        waited,
        "Node created → route in the cloud",
    ));
    before = after;

    // 5. Change addresses: the route must follow the Node to its new address.
    let changed: Vec<usize> = (0..n).filter(|i| i % 3 == 0).collect();
    ui.phase(
        2,
        &format!(
            "change the InternalIP of {} Nodes (10.0.0.x → 10.0.1.x)",
            changed.len()
        ),
    );
    let t0 = Instant::now();
    let mut started = HashMap::new();
    for &i in &changed {
        let name = &names[i];
        let patch = json!({"status": {"addresses": [{"type": "InternalIP", "address": address(i + 1, 1)}]}});
        world
            .nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("changing the address of {name}"))?;
        started.insert(name.clone(), Instant::now());
    }
    let expected: HashMap<String, String> = changed
        .iter()
        .map(|&i| (names[i].clone(), address(i + 1, 1)))
        .collect();
    let waited = wait_step(
        ui,
        &world,
        &mut table,
        t0,
        &started,
        "re-routed",
        |name, table| {
            table
                .values()
                .any(|(node, addr)| node == name && Some(addr) == expected.get(name))
        },
        false,
    )
    .await?;
    let after = world.admin.stats().await?;
    steps.push(StepReport::new(
        format!("change {} addresses", changed.len()),
        &before,
        &after,
        waited,
        "address changed → route replaced",
    ));
    before = after;

    // 6. Quiet: no Node changes, so no cloud calls (upstream lists every 10 s).
    let quiet = Duration::from_secs(5);
    ui.phase(
        3,
        &format!(
            "nothing changes for {} s (heartbeats only)",
            quiet.as_secs()
        ),
    );
    let t0 = Instant::now();
    let mut beats = 0;
    while t0.elapsed() < quiet {
        // What a kubelet does: heartbeats must not trigger anything.
        for name in names.iter().take(4) {
            let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now())}]}});
            world
                .nodes
                .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
                .await
                .with_context(|| format!("heartbeat of {name}"))?;
            beats += 1;
        }
        ui.progress(&format!(
            "  {beats} heartbeats sent, {:.0} s to go",
            (quiet.saturating_sub(t0.elapsed())).as_secs_f64()
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let after = world.admin.stats().await?;
    let quiet_calls = after.counts.iter().map(|c| c.count).sum::<u64>()
        - before.counts.iter().map(|c| c.count).sum::<u64>();
    ui.end_line();
    ui.say(&format!(
        "  {quiet_calls} cloud calls while nothing changed"
    ));
    steps.push(StepReport::calls(
        &format!("quiet {} s", quiet.as_secs()),
        &after,
        Some(&before),
    ));
    before = after;

    // 7. Delete Nodes: their routes go.
    let deleted: Vec<usize> = (0..n).filter(|i| i % 2 == 1).collect();
    ui.phase(4, &format!("delete {} Nodes", deleted.len()));
    let t0 = Instant::now();
    let mut started = HashMap::new();
    for &i in &deleted {
        let name = &names[i];
        world
            .nodes
            .delete(name, &DeleteParams::default())
            .await
            .with_context(|| format!("deleting Node {name}"))?;
        started.insert(name.clone(), Instant::now());
    }
    let waited = wait_step(
        ui,
        &world,
        &mut table,
        t0,
        &started,
        "removed",
        |name, table| !table.values().any(|(node, _)| node == name),
        false,
    )
    .await?;
    let after = world.admin.stats().await?;
    steps.push(StepReport::new(
        format!("delete {} Nodes", deleted.len()),
        &before,
        &after,
        waited,
        "Node deleted → route gone",
    ));

    // 8. The result.
    ui.title("Route table at the end");
    print_table(&table);
    ui.title("Cloud calls per step (counted by the simulated cloud)");
    print_summary(&steps);
    if let Ok(body) = http_get(&world.metrics, "/metrics").await {
        let syncs: Vec<&str> = body
            .lines()
            .filter(|l| l.starts_with("route_controller_route_sync_total{"))
            .collect();
        if !syncs.is_empty() {
            ui.say("\nController metrics (/metrics):");
            for l in syncs {
                ui.say(&format!("  {l}"));
            }
        }
    }
    ui.say(&format!(
        "\nDemo finished in {:.1} s.",
        began.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// Starts `cloud-sim serve` (exits with this process) and returns its URL.
async fn start_sim(binary: &Path, config: &Path, dir: &Path) -> anyhow::Result<(Child, String)> {
    let mut child = Command::new(binary)
        .arg("serve")
        .args(["--listen", "127.0.0.1:0"])
        .arg("--config")
        .arg(config)
        .args(["--parent-pid", &std::process::id().to_string()])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("cloud-sim.log"))?)
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let stdout = child.stdout.take().context("cloud-sim stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .context("cloud-sim printed nothing in 30 s")??;
    let url = first
        .as_deref()
        .and_then(|l| l.strip_prefix("LISTENING "))
        .map(str::to_string)
        .with_context(|| format!("cloud-sim did not start: {first:?}"))?;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, url))
}

async fn wait_ready(world: &World, stack: &mut Stack) -> anyhow::Result<()> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        if let Ok(body) = http_get(&world.metrics, "/readyz").await
            && body.starts_with("200")
        {
            return Ok(());
        }
        if let Some(c) = stack.controller.as_mut()
            && let Ok(Some(status)) = c.try_wait()
        {
            bail!("the controller exited during start-up ({status})");
        }
        if Instant::now() >= deadline {
            bail!("the controller was not ready after {STEP_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls the route table until `done` holds for every Node in `started`,
/// printing each change of the table as it is seen. Returns, per Node, the
/// time from its change to `done`.
#[allow(
    clippy::too_many_arguments,
    reason = "independent values the demo's main loop owns; a struct would only rename them"
)]
async fn wait_step(
    ui: &Ui,
    world: &World,
    table: &mut Table,
    t0: Instant,
    started: &HashMap<String, Instant>,
    verb: &str,
    done: impl Fn(&str, &Table) -> bool,
    await_condition: bool,
) -> anyhow::Result<Waited> {
    let total = started.len();
    let mut route_times: HashMap<String, Duration> = HashMap::new();
    let mut condition_times: HashMap<String, Duration> = HashMap::new();
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        let now_table = world.table().await?;
        for line in diff(table, &now_table) {
            ui.event(&format!("{line:<52} +{:.2} s", t0.elapsed().as_secs_f64()));
        }
        *table = now_table;
        let now = Instant::now();
        for (name, at) in started {
            if !route_times.contains_key(name) && done(name, table) {
                route_times.insert(name.clone(), now - *at);
            }
        }
        if await_condition {
            for name in world.routed_nodes().await? {
                if let Some(at) = started.get(&name) {
                    condition_times.entry(name).or_insert(now - *at);
                }
            }
        }
        let finished =
            route_times.len() == total && (!await_condition || condition_times.len() == total);
        ui.bar(route_times.len(), total, verb, t0.elapsed(), finished);
        if finished {
            ui.end_line();
            return Ok(Waited {
                route: route_times.into_values().collect(),
                condition: condition_times.into_values().collect(),
                wall: t0.elapsed(),
            });
        }
        if Instant::now() >= deadline {
            bail!(
                "only {}/{total} Nodes {verb} after {STEP_TIMEOUT:?}",
                route_times.len()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Route-table changes as `- …` then `+ …` lines.
fn diff(old: &Table, new: &Table) -> Vec<String> {
    let show = |sign: char, dest: &str, (node, addr): &(String, String)| {
        format!("{sign} {dest:<16} → {node:<9} via {addr}")
    };
    let mut out = Vec::new();
    for (dest, v) in old {
        if new.get(dest) != Some(v) {
            out.push(show('-', dest, v));
        }
    }
    for (dest, v) in new {
        if old.get(dest) != Some(v) {
            out.push(show('+', dest, v));
        }
    }
    out
}

fn print_table(table: &Table) {
    println!("  {:<16}  {:<9}  next hop", "destination", "node");
    let mut rows: Vec<_> = table.iter().collect();
    // Numeric order of the third octet reads better than text order.
    rows.sort_by_key(|(dest, _)| {
        dest.split(['.', '/'])
            .nth(2)
            .and_then(|o| o.parse::<u32>().ok())
            .unwrap_or(u32::MAX)
    });
    for (dest, (node, addr)) in rows {
        println!("  {dest:<16}  {node:<9}  {addr}");
    }
    println!("  ({} routes)", table.len());
}

/// What one step waited for.
struct Waited {
    route: Vec<Duration>,
    condition: Vec<Duration>,
    wall: Duration,
}

struct StepReport {
    name: String,
    calls: BTreeMap<&'static str, u64>,
    errors: u64,
    waited: Option<(Waited, &'static str)>,
}

const OPERATIONS: [&str; 4] = ["list", "create", "delete", "batch"];

impl StepReport {
    fn calls(name: &str, after: &StatsSnapshot, before: Option<&StatsSnapshot>) -> Self {
        let count = |s: Option<&StatsSnapshot>, op: &str, ok: bool| -> u64 {
            s.map_or(0, |s| {
                s.counts
                    .iter()
                    .filter(|c| c.operation == op && (c.result == "ok") == ok)
                    .map(|c| c.count)
                    .sum()
            })
        };
        let calls = OPERATIONS
            .iter()
            .map(|&op| {
                (
                    op,
                    count(Some(after), op, true).saturating_sub(count(before, op, true)),
                )
            })
            .collect();
        let errors = OPERATIONS
            .iter()
            .map(|&op| count(Some(after), op, false).saturating_sub(count(before, op, false)))
            .sum();
        StepReport {
            name: name.to_string(),
            calls,
            errors,
            waited: None,
        }
    }

    fn new(
        name: String,
        before: &StatsSnapshot,
        after: &StatsSnapshot,
        waited: Waited,
        what: &'static str,
    ) -> Self {
        let mut r = Self::calls(&name, after, Some(before));
        r.waited = Some((waited, what));
        r
    }
}

fn print_summary(steps: &[StepReport]) {
    println!(
        "  {:<24} {:>6} {:>7} {:>7} {:>6} {:>7}",
        "step", "list", "create", "delete", "batch", "errors"
    );
    let mut totals = [0u64; 5];
    for s in steps {
        let v = [
            s.calls["list"],
            s.calls["create"],
            s.calls["delete"],
            s.calls["batch"],
            s.errors,
        ];
        for (t, x) in totals.iter_mut().zip(v) {
            *t += x;
        }
        println!(
            "  {:<24} {:>6} {:>7} {:>7} {:>6} {:>7}",
            s.name, v[0], v[1], v[2], v[3], v[4]
        );
    }
    println!(
        "  {:<24} {:>6} {:>7} {:>7} {:>6} {:>7}",
        "total", totals[0], totals[1], totals[2], totals[3], totals[4]
    );
    println!("\nHow long it took (per Node, from the change in the API server):");
    for s in steps {
        if let Some((w, what)) = &s.waited {
            println!(
                "  {:<40} median {:>6}  max {:>6}  (all done in {:.2} s)",
                what,
                ms(percentile(&w.route, 50)),
                ms(percentile(&w.route, 100)),
                w.wall.as_secs_f64()
            );
            if !w.condition.is_empty() {
                println!(
                    "  {:<40} median {:>6}  max {:>6}",
                    "Node created → NetworkUnavailable=False",
                    ms(percentile(&w.condition, 50)),
                    ms(percentile(&w.condition, 100)),
                );
            }
        }
    }
}

fn percentile(v: &[Duration], p: usize) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    let mut s = v.to_vec();
    s.sort();
    let idx = ((s.len() - 1) * p.min(100)).div_ceil(100);
    s[idx]
}

fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

/// Minimal HTTP/1.0 GET on loopback: returns "STATUS\nBODY".
async fn http_get(base: &str, path: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut s = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        .await??;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut buf = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut buf)).await??;
    let status = buf.split_whitespace().nth(1).unwrap_or("").to_string();
    let body = buf.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok(format!("{status}\n{body}"))
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    let from = all.len().saturating_sub(lines);
    format!(
        "--- controller log (last {} lines) ---\n{}",
        all.len() - from,
        all[from..].join("\n")
    )
}

/// Terminal output: a progress line redrawn in place on a terminal, plain
/// lines otherwise (CI logs, pipes).
struct Ui {
    tty: bool,
}

impl Ui {
    fn new() -> Self {
        Ui {
            tty: std::io::stdout().is_terminal(),
        }
    }

    fn say(&self, s: &str) {
        println!("{s}");
    }

    fn title(&self, s: &str) {
        println!("\n{s}\n{}", "─".repeat(s.chars().count()));
    }

    fn step(&self, s: &str) {
        print!("  • {s} ... ");
        let _ = std::io::stdout().flush();
    }

    fn done(&self, s: &str) {
        println!("{s}");
    }

    fn phase(&self, n: usize, s: &str) {
        println!("\n[{n}/4] {s}");
    }

    /// A line about the route table, printed above the progress line.
    fn event(&self, s: &str) {
        if self.tty {
            print!("\r\x1b[2K");
        }
        println!("  {s}");
    }

    fn progress(&self, s: &str) {
        if self.tty {
            print!("\r\x1b[2K{s}");
            let _ = std::io::stdout().flush();
        }
    }

    fn bar(&self, done: usize, total: usize, verb: &str, elapsed: Duration, last: bool) {
        const WIDTH: usize = 30;
        let filled = (done * WIDTH)
            .checked_div(total)
            .unwrap_or(WIDTH)
            .min(WIDTH);
        let line = format!(
            "  [{}{}] {done}/{total} Nodes {verb}  {:.1} s",
            "█".repeat(filled),
            "░".repeat(WIDTH - filled),
            elapsed.as_secs_f64()
        );
        if self.tty {
            self.progress(&line);
        } else if last {
            println!("{line}");
        }
    }

    /// Ends a progress line (a newline on a terminal).
    fn end_line(&self) {
        if self.tty {
            println!();
        }
    }
}
