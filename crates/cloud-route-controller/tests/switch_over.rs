//! The switch-over from the cloud-controller-manager's route controller,
//! end to end (docs/switching-over.md): the
//! unmodified upstream route controller (`tools/upstream-route-controller`,
//! `k8s.io/cloud-provider/controllers/route` with the real
//! `k8s.io/cloud-provider-aws`, or with hcloud-go as
//! hcloud-cloud-controller-manager uses it) routes a cluster; in the order
//! of docs/switching-over.md, `plan` with the same configuration shows no
//! change and a `--dry-run` shadow beside the running upstream agrees, with
//! nothing changed in the cloud meanwhile; upstream is stopped (the CCM's
//! route controller off); then this controller starts with the same
//! configuration and, over several passes, sends not one mutating request
//! to the cloud.
//!
//! - AWS on moto: one INI file in cloud-provider-aws's format
//!   (`[Global] Region, VPC, SubnetID, KubernetesClusterID` and an EC2
//!   `[ServiceOverride]`), read by both controllers; both reach moto only
//!   through provider-aws's counting proxy.
//! - Hetzner on the fake API: the env block of hcloud-cloud-controller-
//!   manager (`HCLOUD_TOKEN`, `HCLOUD_NETWORK`, `HCLOUD_ENDPOINT`); the
//!   upstream tool takes the network and endpoint as flags, since it is not
//!   the CCM, with the same values.
//!
//! The memory cloud is not here: the upstream tool's in-memory cloud lives
//! inside its process, so its routes end with it and there is nothing left
//! for a second controller to take over.
//!
//! The upstream binary comes from `CRC_UPSTREAM_ROUTE_CONTROLLER`
//! (`scripts/test.sh` builds it and runs this test beside the other Rust
//! tests once it is built) or is built by
//! `tools/upstream-route-controller/build.sh` (cached per machine).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::switch::{CLUSTER_CIDR, plan, run_ours, shadow_agrees};
use common::{TempDir, repo};
use provider_aws::testing::proxy::is_mutating;
use provider_aws::testing::{
    Proxy, client, create_network, moto_endpoint, run_instances, unique_cluster,
};
use provider_hcloud::testing::{FakeConfig, FakeHcloud};
use test_cluster::{ClusterGuard, TestCluster, TestNode, wait_until};

/// Nodes in each cluster.
const NODES: usize = 20;

/// The upstream route controller binary.
fn upstream_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("CRC_UPSTREAM_ROUTE_CONTROLLER").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let script = repo().join("tools/upstream-route-controller/build.sh");
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    assert!(out.status.success(), "{} failed", script.display());
    PathBuf::from(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .expect("build.sh prints the binary's path")
            .trim(),
    )
}

/// The upstream controller's process; killed when dropped unless stopped.
struct Upstream {
    child: Child,
    log: PathBuf,
    stats: PathBuf,
}

impl Upstream {
    fn start(dir: &Path, kubeconfig: &Path, args: &[&str], env: &[(&str, &str)]) -> Upstream {
        let log = dir.join("upstream.log");
        let stats = dir.join("upstream-stats.json");
        let child = Command::new(upstream_bin())
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--cluster-cidr={CLUSTER_CIDR}"))
            .arg("--metrics-addr=")
            .arg(format!("--stats-out={}", stats.display()))
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("upstream log file"))
            .spawn()
            .expect("start the upstream route controller");
        Upstream { child, log, stats }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, as a Deployment scaled down sends it; its exit stats.
    fn stop(mut self) -> serde_json::Value {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "upstream did not stop within 30 s:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "upstream: {status}\n{}", self.log_text());
        let text = std::fs::read_to_string(&self.stats).expect("upstream's exit stats");
        serde_json::from_str(&text).expect("upstream's exit stats are JSON")
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether every Node in `names` says `NetworkUnavailable=False/RouteCreated`.
async fn all_route_created(c: &ClusterGuard, names: &[String]) -> bool {
    for n in names {
        match c.network_unavailable(n).await {
            Ok(Some(cond))
                if cond.status == "False" && cond.reason.as_deref() == Some("RouteCreated") => {}
            _ => return false,
        }
    }
    true
}

/// The proxy's counters as action → requests.
fn counts(proxy: &Proxy) -> BTreeMap<String, u64> {
    proxy
        .counts()
        .into_iter()
        .map(|(k, v)| (k, v.requests))
        .collect()
}

/// The `CreateRoute` calls of the upstream controller that succeeded: its
/// stats count every call, and one that fails (after its SDK's retries)
/// is called again at its next pass.
fn succeeded_creates(stats: &serde_json::Value) -> u64 {
    let n = |k: &str| {
        stats[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k} in {stats}"))
    };
    n("create") - n("create_errors")
}

fn mutating(counts: &BTreeMap<String, u64>) -> u64 {
    counts
        .iter()
        .filter(|(a, _)| is_mutating(a))
        .map(|(_, n)| n)
        .sum()
}

#[tokio::test]
async fn aws_routes_upstream_made_are_taken_over_with_the_same_ini_and_no_mutating_request() {
    let began = Instant::now();
    let c = TestCluster::acquire().await.unwrap();
    let endpoint = moto_endpoint().await.unwrap();
    let ec2 = client(&endpoint).await;
    let cluster = unique_cluster("switch");
    let net = create_network(&ec2, "10.40.0.0/16", Some(&cluster))
        .await
        .unwrap();
    let instances = run_instances(&ec2, &net, NODES as i32).await.unwrap();
    let proxy = Proxy::start(&endpoint).await.unwrap();
    let names: Vec<String> = (0..NODES).map(|i| format!("so-aws-{i}")).collect();
    for (i, inst) in instances.iter().enumerate() {
        c.create_node(
            &TestNode::new(&names[i])
                .pod_cidrs([format!("10.244.{i}.0/24")])
                .internal_ip(format!("10.40.0.{}", 10 + i))
                .provider_id(&inst.provider_id),
        )
        .await
        .unwrap();
    }
    let dir = TempDir::new("switch-aws");
    // One file in cloud-provider-aws's format, as its docs/development.md
    // shapes it for a control plane off EC2: the VPC, a subnet and the
    // cluster id let it skip the metadata service; the table is found by
    // its kubernetes.io/cluster/<id> tag. `Service = EC2` is the SDK's
    // service id, which cloud-provider-aws matches exactly.
    let ini = dir.path().join("cloud.conf");
    std::fs::write(
        &ini,
        format!(
            "[Global]\nRegion = us-east-1\nVPC = {}\nSubnetID = {}\nKubernetesClusterID = {cluster}\n\n\
             [ServiceOverride \"1\"]\nService = EC2\nRegion = us-east-1\nURL = {}\nSigningRegion = us-east-1\n",
            net.vpc_id,
            net.subnet_id,
            proxy.url()
        ),
    )
    .unwrap();
    let ini = ini.to_str().unwrap();
    // Credentials only: the region, the endpoint and the cluster come from
    // the file.
    let env = [
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ];

    let upstream = Upstream::start(
        dir.path(),
        c.kubeconfig_path(),
        &[
            &format!("--cluster-name={cluster}"),
            "--cloud=aws",
            &format!("--cloud-config={ini}"),
        ],
        &env,
    );
    let routes = || async {
        common::pod_routes(&ec2, &net.route_table_id)
            .await
            .filter(|r| r.len() == NODES)
    };
    let made = wait_until(
        Duration::from_secs(120),
        "upstream: every Node's route and RouteCreated",
        || async {
            let r = routes().await?;
            all_route_created(&c, &names).await.then_some(r)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", upstream.log_text()));
    let upstream_took = began.elapsed();
    let by_upstream = counts(&proxy);
    // The Go SDK resends a request moto answered with an error (moto, on a
    // busy machine, now and then fails one of 20 concurrent creations with
    // a 500), so the requests can exceed the routes; the creations moto
    // answered with success are exactly one per Node.
    let creates = proxy
        .counts()
        .get("CreateRoute")
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        creates.requests - creates.errors - creates.throttled,
        NODES as u64,
        "{creates:?}"
    );
    for (i, inst) in instances.iter().enumerate() {
        assert!(
            made.contains(&(format!("10.244.{i}.0/24"), inst.id.clone())),
            "{made:?}"
        );
    }
    proxy.reset_counts();

    let args = [
        "--cluster-name",
        &cluster,
        "--cloud-provider",
        "aws",
        "--cloud-config",
        ini,
    ];
    let shown = plan(
        c.kubeconfig_path(),
        &[&args[..], &["--cluster-cidr", CLUSTER_CIDR]].concat(),
        &env,
    )
    .await;
    assert!(
        shown.contains(&format!("{NODES} nodes, {NODES} cloud routes"))
            && shown.contains("no change needed"),
        "{shown}"
    );
    let by_plan = counts(&proxy);
    assert_eq!(mutating(&by_plan), 0, "plan only reads: {by_plan:?}");
    proxy.reset_counts();

    // The shadow beside upstream, which still runs: it agrees, and neither
    // changes anything (upstream's own passes are counted too).
    shadow_agrees(&c, &dir, &args, &env).await;
    let by_shadow = counts(&proxy);
    assert_eq!(
        mutating(&by_shadow),
        0,
        "the shadow (or upstream) changed the cloud: {by_shadow:?}"
    );
    // The CCM's route controller off: upstream stopped.
    let stats = upstream.stop();
    assert_eq!(succeeded_creates(&stats), NODES as u64, "{stats}");
    proxy.reset_counts();

    let (ctl, ours_took) = run_ours(&c, &dir, &args, &env, NODES).await;
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");
    let by_ours = counts(&proxy);
    eprintln!(
        "switch-over on moto, {NODES} Nodes: upstream made the routes in {upstream_took:?} with {by_upstream:?} \
         (exit stats {stats}); plan sent {by_plan:?}; the shadow beside upstream {by_shadow:?}; \
         ours ran {ours_took:?} and sent {by_ours:?}"
    );
    assert_eq!(
        mutating(&by_ours),
        0,
        "this controller changed what upstream made: {by_ours:?}\n{log}"
    );
    assert!(
        by_ours.get("DescribeRouteTables").copied().unwrap_or(0) >= 3,
        "it did list the table on every pass: {by_ours:?}"
    );
    assert_eq!(
        routes().await,
        Some(made.clone()),
        "the table is as upstream left it"
    );

    // Rolling back: ours stopped, upstream takes the routes back as they
    // are, with nothing created or replaced in two of its passes.
    proxy.reset_counts();
    let upstream = Upstream::start(
        dir.path(),
        c.kubeconfig_path(),
        &[
            &format!("--cluster-name={cluster}"),
            "--cloud=aws",
            &format!("--cloud-config={ini}"),
        ],
        &env,
    );
    wait_until(
        Duration::from_secs(60),
        "upstream again: two passes over the table",
        || async {
            (counts(&proxy)
                .get("DescribeRouteTables")
                .copied()
                .unwrap_or(0)
                >= 2)
                .then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", upstream.log_text()));
    let stats = upstream.stop();
    let by_upstream_again = counts(&proxy);
    eprintln!("rolled back: upstream sent {by_upstream_again:?} (exit stats {stats})");
    assert_eq!(
        mutating(&by_upstream_again),
        0,
        "upstream changed what this controller kept: {by_upstream_again:?}"
    );
    assert_eq!(routes().await, Some(made), "the table is as it was");
}

const NETWORK: u64 = 4711;
const NETWORK_NAME: &str = "k8s-switch";

#[tokio::test]
async fn hcloud_routes_upstream_made_are_taken_over_with_the_ccms_env_and_no_route_action() {
    let began = Instant::now();
    let c = TestCluster::acquire().await.unwrap();
    let fake = FakeHcloud::start(FakeConfig::default()).await.unwrap();
    fake.add_network(NETWORK, NETWORK_NAME, "10.0.0.0/8", &["10.0.0.0/16"]);
    let names: Vec<String> = (0..NODES).map(|i| format!("so-hc-{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        let ip = format!("10.0.5.{}", i + 2);
        fake.add_server(500 + i as u64, name, NETWORK, &ip);
        c.create_node(
            &TestNode::new(name)
                .pod_cidrs([format!("10.244.{i}.0/24")])
                .internal_ip(ip)
                .provider_id(format!("hcloud://{}", 500 + i)),
        )
        .await
        .unwrap();
    }
    let dir = TempDir::new("switch-hcloud");
    let token = fake.token();
    let endpoint = fake.base_url();
    // The env block of hcloud-cloud-controller-manager's Deployment.
    let env = [
        ("HCLOUD_TOKEN", token.as_str()),
        ("HCLOUD_NETWORK", NETWORK_NAME),
        ("HCLOUD_ENDPOINT", endpoint.as_str()),
    ];

    let upstream = Upstream::start(
        dir.path(),
        c.kubeconfig_path(),
        &[
            "--cloud=hcloud",
            &format!("--hcloud-endpoint={endpoint}"),
            &format!("--hcloud-network={NETWORK_NAME}"),
        ],
        &env[..1],
    );
    let routes = || {
        let mut r = fake.routes(NETWORK);
        r.sort();
        r
    };
    wait_until(
        Duration::from_secs(120),
        "upstream: every Node's route and RouteCreated",
        || async { (routes().len() == NODES && all_route_created(&c, &names).await).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", upstream.log_text()));
    let upstream_took = began.elapsed();
    let made = routes();
    let by_upstream = fake.requests();
    // Upstream creates in parallel and retries the 409s of a network busy
    // with another action; what counts is that each route was added once.
    let added: u64 = fake
        .answers()
        .iter()
        .filter(|((e, status), _)| e == "add_route" && *status < 300)
        .map(|(_, n)| n)
        .sum();
    assert_eq!(added, NODES as u64, "{:?}", fake.answers());

    let args = ["--cloud-provider", "hcloud"];
    let shown = plan(
        c.kubeconfig_path(),
        &[&args[..], &["--cluster-cidr", CLUSTER_CIDR]].concat(),
        &env,
    )
    .await;
    assert!(
        shown.contains(&format!("{NODES} nodes, {NODES} cloud routes"))
            && shown.contains("no change needed"),
        "{shown}"
    );
    let after_plan = fake.requests();

    // The shadow beside upstream, which still runs: it agrees, and no
    // route is added or deleted meanwhile (upstream's passes included).
    shadow_agrees(&c, &dir, &args, &env).await;
    let after_shadow = fake.requests();
    // The CCM's route controller off: upstream stopped.
    let stats = upstream.stop();
    assert_eq!(succeeded_creates(&stats), NODES as u64, "{stats}");
    let after_plan_and_shadow = fake.requests();

    let (ctl, ours_took) = run_ours(&c, &dir, &args, &env, NODES).await;
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");
    let after_ours = fake.requests();
    let by = |after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>| {
        after
            .iter()
            .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .collect::<BTreeMap<_, _>>()
    };
    let by_plan = by(&after_plan, &by_upstream);
    let by_shadow = by(&after_shadow, &after_plan);
    let by_ours = by(&after_ours, &after_plan_and_shadow);
    eprintln!(
        "switch-over on the Hetzner fake, {NODES} Nodes: upstream made the routes in {upstream_took:?} with \
         {by_upstream:?} (exit stats {stats}); plan sent {by_plan:?} (upstream's passes included); \
         the shadow beside upstream {by_shadow:?}; ours ran {ours_took:?} and sent {by_ours:?}"
    );
    for action in ["add_route", "delete_route"] {
        assert_eq!(
            by_plan.get(action).copied().unwrap_or(0)
                + by_shadow.get(action).copied().unwrap_or(0)
                + by_ours.get(action).copied().unwrap_or(0),
            0,
            "{action} after the switch: plan {by_plan:?}, shadow {by_shadow:?}, ours {by_ours:?}\n{log}"
        );
    }
    assert!(
        log.contains("hcloud-cloud-controller-manager environment"),
        "configured by the CCM's environment: {log}"
    );
    assert_eq!(routes(), made, "the network is as upstream left it");

    // Rolling back: ours stopped, upstream takes the routes back as they
    // are, with no route added or deleted in two of its passes. (Its server
    // cache refreshes when empty, as the CCM's does since #1269: before,
    // the first list after a start mapped no gateway to a server and every
    // route looked like a blackhole, deleted and added again.)
    let before_again = fake.requests();
    let upstream = Upstream::start(
        dir.path(),
        c.kubeconfig_path(),
        &[
            "--cloud=hcloud",
            &format!("--hcloud-endpoint={endpoint}"),
            &format!("--hcloud-network={NETWORK_NAME}"),
        ],
        &env[..1],
    );
    let network_reads = |r: &BTreeMap<String, u64>| {
        r.iter()
            .filter(|(k, _)| k.contains("network") && !k.contains("route"))
            .map(|(_, n)| *n)
            .sum::<u64>()
    };
    // Its start reads the network twice (by name, then by id), each pass once.
    let reads_before = network_reads(&before_again);
    wait_until(
        Duration::from_secs(60),
        "upstream again: its start and two passes over the network",
        || async { (network_reads(&fake.requests()) >= reads_before + 4).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", upstream.log_text()));
    let stats = upstream.stop();
    let by_upstream_again = by(&fake.requests(), &before_again);
    eprintln!("rolled back: upstream sent {by_upstream_again:?} (exit stats {stats})");
    for action in ["add_route", "delete_route"] {
        assert_eq!(
            by_upstream_again.get(action).copied().unwrap_or(0),
            0,
            "upstream changed what this controller kept: {by_upstream_again:?}"
        );
    }
    assert_eq!(routes(), made, "the network is as it was");
}
