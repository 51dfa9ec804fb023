//! End to end, issue 23's sequences on AWS: the real binary, the real API
//! server, moto behind the EC2-faithful proxy. Nothing the controller set
//! out to do is silently dropped:
//!
//! - a sole replica stopped (SIGSTOP) past its renew deadline in the middle
//!   of 100 creations, or of 80 deletions, renews its Lease late when it
//!   resumes and redoes everything its fence cut off;
//! - a route table tagged for the cluster while it runs gets every Node's
//!   route within the discovery period plus one pass, in all three modes;
//! - a terminated instance whose replacement EC2 refuses
//!   (`IncorrectInstanceState`) costs at most 3 `ReplaceRoute` in 5
//!   minutes, with one Warning, in all three modes (on a control plane of
//!   its own, so its five minutes do not hold up the shared one).

mod common;

use std::time::{Duration, Instant};

use common::{Controller, TempDir, free_port, http_get, metric_sum, pod_routes, signal};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::Api;
use kube::api::ListParams;
use provider_aws::cluster_tag_key;
use provider_aws::testing::{
    Client, Instance, Network, Proxy, client, create_network, create_route_table, moto_endpoint,
    run_instances, unique_cluster,
};
use test_cluster::{ControlPlane, StartOptions, TestCluster, TestNode, wait_until};

const NAMESPACE: &str = "default";
const LEASE: &str = "cloud-route-controller";

/// One Node per instance, `<prefix>-<i>` with pod CIDR `10.244.<i>.0/24`.
async fn create_nodes(nodes: &Api<Node>, prefix: &str, instances: &[Instance]) {
    for (i, inst) in instances.iter().enumerate() {
        let node = TestNode::new(format!("{prefix}-{i}"))
            .pod_cidrs([format!("10.244.{i}.0/24")])
            .internal_ip(format!("10.60.{}.{}", i / 200, 10 + i % 200))
            .provider_id(&inst.provider_id)
            .to_node();
        nodes
            .create(&Default::default(), &node)
            .await
            .expect("create the test Node");
    }
}

/// The routes `instances` should have, sorted.
fn expected(instances: &[Instance]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = instances
        .iter()
        .enumerate()
        .map(|(i, inst)| (format!("10.244.{i}.0/24"), inst.id.clone()))
        .collect();
    v.sort();
    v
}

/// Writes the AWS cloud config for `endpoint`; a generous write budget
/// unless `write_per_second` paces the writes.
fn aws_config(dir: &TempDir, endpoint: &str, write_per_second: u32) -> String {
    let cfg = dir.path().join("aws.yaml");
    std::fs::write(
        &cfg,
        format!(
            "region: us-east-1\nendpoint: {endpoint}\nrate_limit:\n  write: {{per_second: {write_per_second}, burst: {write_per_second}}}\n"
        ),
    )
    .expect("write the cloud config");
    cfg.to_str().expect("utf-8 path").to_string()
}

const AWS_ENV: [(&str, &str); 3] = [
    ("AWS_ACCESS_KEY_ID", "testing"),
    ("AWS_SECRET_ACCESS_KEY", "testing"),
    ("AWS_REGION", "us-east-1"),
];

/// The Lease's renewTime, as text.
async fn renew_time(leases: &Api<Lease>) -> Option<String> {
    common::lease_renew_time(leases, LEASE).await
}

/// Stops the replica for `pause` right after it renewed its Lease (so no
/// renewal is in flight while it is stopped), then resumes it.
async fn pause_after_a_renewal(ctl: &Controller, leases: &Api<Lease>, pause: Duration) -> Instant {
    let before = renew_time(leases).await;
    wait_until(Duration::from_secs(10), "a Lease renewal", || async {
        let now = renew_time(leases).await;
        (now.is_some() && now != before).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    signal(ctl, "-STOP");
    tokio::time::sleep(pause).await;
    signal(ctl, "-CONT");
    Instant::now()
}

/// One controller per mode over the same Nodes, each with a cluster of its
/// own whose first route table is created and tagged here; `extra` flags
/// after the common ones.
async fn start_per_mode(
    kubeconfig: &std::path::Path,
    dir: &TempDir,
    e: &Ec2,
    extra: &[&str],
) -> Vec<(&'static str, String, String, Controller)> {
    let cfg = aws_config(dir, &e.proxy.url(), 100);
    let mut runs = Vec::new();
    for mode in ["periodic", "watch", "incremental"] {
        let cluster = format!("{}-{mode}", e.cluster);
        let tag = cluster_tag_key(&cluster);
        let table = create_route_table(&e.ec2, &e.net.vpc_id, &[(&tag, "owned")])
            .await
            .expect("table");
        let mut args = vec![
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cluster-name",
            &cluster,
            "--cloud-provider",
            "aws",
            "--cloud-config",
            &cfg,
            "--reconcile-mode",
            mode,
            "--leader-elect=false",
            "--metrics-bind-address",
            "0",
        ];
        args.extend_from_slice(extra);
        let ctl = Controller::start_with_env(kubeconfig, dir.path(), mode, &args, &AWS_ENV);
        runs.push((mode, tag, table, ctl));
    }
    runs
}

struct Ec2 {
    ec2: Client,
    proxy: Proxy,
    net: Network,
    cluster: String,
}

async fn ec2(name: &str, vpc: &str) -> Ec2 {
    let endpoint = moto_endpoint().await.expect("moto");
    let proxy = Proxy::start(&endpoint).await.expect("proxy");
    let ec2 = client(&endpoint).await;
    let cluster = unique_cluster(name);
    let net = create_network(&ec2, vpc, Some(&cluster))
        .await
        .expect("network");
    Ec2 {
        ec2,
        proxy,
        net,
        cluster,
    }
}

/// A sole replica with leader election on (the defaults: 15 s lease, 10 s
/// renew deadline, 2 s retry), metrics on a free port.
fn start_leader(
    kubeconfig: &std::path::Path,
    dir: &TempDir,
    e: &Ec2,
    per_second: u32,
) -> Controller {
    let cfg = aws_config(dir, &e.proxy.url(), per_second);
    start_leader_with(kubeconfig, dir, e, &cfg, &[])
}

/// [`start_leader`] with the cloud config `cfg` and `extra` flags.
fn start_leader_with(
    kubeconfig: &std::path::Path,
    dir: &TempDir,
    e: &Ec2,
    cfg: &str,
    extra: &[&str],
) -> Controller {
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut args = vec![
        "--cluster-cidr",
        "10.244.0.0/16",
        "--cluster-name",
        &e.cluster,
        "--cloud-provider",
        "aws",
        "--cloud-config",
        cfg,
        "--leader-elect-resource-namespace",
        NAMESPACE,
        "--metrics-bind-address",
        &metrics,
        // These runs delete waves of Nodes on purpose to interrupt the
        // leader mid-wave; the bound on deletions has tests of its own.
        "--max-route-deletions=100%",
    ];
    args.extend_from_slice(extra);
    Controller::start_with_env(kubeconfig, dir.path(), "controller", &args, &AWS_ENV)
}

fn late_renewals(ctl: &Controller) -> f64 {
    let base = ctl.metrics.as_deref().expect("metrics address");
    http_get(base, "/metrics")
        .map(|(_, body)| metric_sum(&body, "route_controller_late_lease_renewals_total", &[]))
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sole_replica_stopped_past_its_renew_deadline_during_100_creations_redoes_them_when_it_resumes()
 {
    const NODES: usize = 100;
    let c = TestCluster::acquire().await.expect("API server");
    let e = ec2("late-renewal", "10.60.0.0/16").await;
    let instances = run_instances(&e.ec2, &e.net, NODES as i32)
        .await
        .expect("instances");
    create_nodes(&c.nodes(), "late", &instances).await;
    // Every answer takes 300 ms and writes are paced at 20/s: the 200
    // writes (a source/destination check and a route per instance) take
    // about 10 s, so the replica is stopped in the middle of them.
    e.proxy.set_latency(Duration::from_millis(300));
    let dir = TempDir::new("aws-late-renewal");
    let mut ctl = start_leader(c.kubeconfig_path(), &dir, &e, 20);
    wait_until(Duration::from_secs(60), "the first CreateRoute", || async {
        e.proxy
            .log()
            .iter()
            .any(|r| r.action == "CreateRoute")
            .then_some(())
    })
    .await
    .unwrap_or_else(|err| panic!("{err}\n{}", ctl.log_text()));
    let leases: Api<Lease> = Api::namespaced(c.client(), NAMESPACE);
    // Past the 10 s renew deadline, within the 15 s lease: no one else
    // could have taken it, and the replica's next renewal succeeds, late.
    let resumed = pause_after_a_renewal(&ctl, &leases, Duration::from_secs(12)).await;
    let routed_at_resume = pod_routes(&e.ec2, &e.net.route_table_id)
        .await
        .map_or(0, |r| r.len());
    let all = expected(&instances);
    wait_until(Duration::from_secs(60), "all 100 routes", || async {
        (pod_routes(&e.ec2, &e.net.route_table_id).await? == all).then_some(())
    })
    .await
    .unwrap_or_else(|err| panic!("{err}\n{}", ctl.log_text()));
    let took = resumed.elapsed();
    assert!(ctl.is_running(), "kept its Lease: {}", ctl.log_text());
    let log = ctl.log_text();
    assert!(
        log.contains("renewed after the renew deadline"),
        "the late renewal is logged: {log}"
    );
    assert!(late_renewals(&ctl) >= 1.0, "and counted");
    assert!(
        routed_at_resume < NODES,
        "the pause cut the burst off ({routed_at_resume} routed)"
    );
    eprintln!(
        "{routed_at_resume} of {NODES} routed when the replica resumed; all {NODES} {took:?} later"
    );
    assert_eq!(ctl.stop(), Some(0), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sole_replica_paused_20s_during_80_deletions_deletes_them_all_without_waiting_for_a_resync()
 {
    const NODES: usize = 80;
    let c = TestCluster::acquire().await.expect("API server");
    let e = ec2("paused-deletions", "10.61.0.0/16").await;
    let instances = run_instances(&e.ec2, &e.net, NODES as i32)
        .await
        .expect("instances");
    create_nodes(&c.nodes(), "wave", &instances).await;
    let dir = TempDir::new("aws-paused-deletions");
    let mut ctl = start_leader(c.kubeconfig_path(), &dir, &e, 20);
    let all = expected(&instances);
    wait_until(Duration::from_secs(120), "80 routes", || async {
        (pod_routes(&e.ec2, &e.net.route_table_id).await? == all).then_some(())
    })
    .await
    .unwrap_or_else(|err| panic!("{err}\n{}", ctl.log_text()));
    e.proxy.set_latency(Duration::from_millis(300));
    let mark = e.proxy.log().len();
    for i in 0..NODES {
        c.delete_node(&format!("wave-{i}"))
            .await
            .expect("delete Node");
    }
    wait_until(Duration::from_secs(30), "the first DeleteRoute", || async {
        e.proxy.log()[mark..]
            .iter()
            .any(|r| r.action == "DeleteRoute")
            .then_some(())
    })
    .await
    .unwrap_or_else(|err| panic!("{err}\n{}", ctl.log_text()));
    let leases: Api<Lease> = Api::namespaced(c.client(), NAMESPACE);
    signal(&ctl, "-STOP");
    tokio::time::sleep(Duration::from_secs(20)).await;
    let left_at_resume = pod_routes(&e.ec2, &e.net.route_table_id)
        .await
        .map_or(0, |r| r.len());
    // The latency only stretched the wave so that the pause lands inside
    // it; what is measured from here is how fast the replica picks the wave
    // up again, not how slow the emulator was told to be.
    e.proxy.set_latency(Duration::ZERO);
    signal(&ctl, "-CONT");
    let resumed = Instant::now();
    // The replica resyncs every 12 h and backs off up to 300 s: 120 s tells
    // "redone at once" from either, even on a CI machine busy with every
    // other test (about 3 s on a quiet one; once over 60 s in CI, whose
    // excerpt did not show why: the failure now leads with the log's tail).
    wait_until(Duration::from_secs(120), "every route gone", || async {
        pod_routes(&e.ec2, &e.net.route_table_id)
            .await?
            .is_empty()
            .then_some(())
    })
    .await
    .unwrap_or_else(|err| {
        panic!(
            "{err} within 120 s of resuming ({left_at_resume} left when it resumed)\n{}",
            ctl.log_tail(80)
        )
    });
    let took = resumed.elapsed();
    assert!(left_at_resume > 0, "the pause cut the wave off");
    assert!(ctl.is_running(), "kept its Lease: {}", ctl.log_text());
    assert!(renew_time(&leases).await.is_some());
    eprintln!(
        "{left_at_resume} of {NODES} routes left when the replica resumed; all gone {took:?} later"
    );
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_table_tagged_at_runtime_is_routed_within_the_discovery_period_in_every_mode() {
    const NODES: usize = 30;
    const DISCOVERY: Duration = Duration::from_secs(5);
    let c = TestCluster::acquire().await.expect("API server");
    let e = ec2("discovery", "10.62.0.0/16").await;
    let instances = run_instances(&e.ec2, &e.net, NODES as i32)
        .await
        .expect("instances");
    create_nodes(&c.nodes(), "zone", &instances).await;
    let dir = TempDir::new("aws-discovery");
    let runs = start_per_mode(
        c.kubeconfig_path(),
        &dir,
        &e,
        &["--route-target-discovery-period", "5s"],
    )
    .await;
    let all = expected(&instances);
    for (mode, _, first, ctl) in &runs {
        wait_until(
            Duration::from_secs(120),
            "30 routes in the first table",
            || async { (pod_routes(&e.ec2, first).await? == all).then_some(()) },
        )
        .await
        .unwrap_or_else(|err| panic!("{mode}: {err}\n{}", ctl.log_text()));
    }
    // A new zone: a table created and tagged for each cluster while it runs.
    let tagged = Instant::now();
    let mut second = Vec::new();
    for (_, tag, _, _) in &runs {
        second.push(
            create_route_table(&e.ec2, &e.net.vpc_id, &[(tag, "owned")])
                .await
                .expect("table"),
        );
    }
    // The discovery period plus one pass (10 s apart at most in periodic
    // and watch), with room for a loaded machine.
    let bound = DISCOVERY + Duration::from_secs(115);
    for ((mode, _, _, ctl), table) in runs.iter().zip(&second) {
        wait_until(
            bound,
            "30 routes in the table tagged at runtime",
            || async { (pod_routes(&e.ec2, table).await? == all).then_some(()) },
        )
        .await
        .unwrap_or_else(|err| panic!("{mode}: {err}\n{}", ctl.log_text()));
        eprintln!(
            "{mode}: the new table routed {:?} after it was tagged",
            tagged.elapsed()
        );
    }
    for ((mode, _, _, mut ctl), table) in runs.into_iter().zip(&second) {
        assert!(ctl.is_running(), "{mode}");
        let log = ctl.log_text();
        // Found by the discovery ("route targets changed") or, in `watch`
        // and `periodic`, by a pass's list that came first ("using route
        // tables"): either line names the new table.
        let found = log.lines().any(|l| {
            l.contains(table.as_str())
                && (l.contains("route targets changed") || l.contains("using route tables"))
        });
        assert!(
            found,
            "{mode}: the new table {table} is named as found: {log}"
        );
        assert!(
            log.contains("route targets changed") || mode != "incremental",
            "{mode}: incremental lists only at start and resync, so only the discovery finds it: {log}"
        );
        assert_eq!(ctl.stop(), Some(0), "{mode}: {log}");
    }
}

/// Five minutes of refusals, so on a control plane of its own: the shared
/// one serves one test at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_instance_whose_replacement_ec2_refuses_costs_at_most_3_replace_routes_in_5_minutes_in_every_mode()
 {
    let plane = ControlPlane::start(StartOptions::default())
        .await
        .expect("a control plane of this test's own");
    let kube = test_cluster::client_from_kubeconfig(plane.kubeconfig())
        .await
        .expect("client");
    let nodes: Api<Node> = Api::all(kube.clone());
    let e = ec2("refused", "10.63.0.0/16").await;
    let instances = run_instances(&e.ec2, &e.net, 2).await.expect("instances");
    create_nodes(&nodes, "refused", &instances).await;
    let dir = TempDir::new("aws-refused");
    // watch and incremental see a blackhole at a list: resync every 20-40 s.
    let runs = start_per_mode(
        plane.kubeconfig(),
        &dir,
        &e,
        &["--min-resync-period", "20s"],
    )
    .await;
    let all = expected(&instances);
    for (mode, _, table, ctl) in &runs {
        wait_until(Duration::from_secs(120), "2 routes", || async {
            (pod_routes(&e.ec2, table).await? == all).then_some(())
        })
        .await
        .unwrap_or_else(|err| panic!("{mode}: {err}\n{}", ctl.log_text()));
    }
    // The instance behind node 1 is terminated: its routes list as
    // blackholes, and EC2 refuses every route to it.
    let victim = &instances[1].id;
    let dest = "10.244.1.0/24";
    let mark = e.proxy.log().len();
    e.proxy.stop_instance(victim);
    tokio::time::sleep(Duration::from_secs(300)).await;
    let log = e.proxy.log();
    for (mode, _, table, ctl) in &runs {
        let attempts = log[mark..]
            .iter()
            .filter(|r| {
                matches!(r.action.as_str(), "CreateRoute" | "ReplaceRoute")
                    && r.param("RouteTableId") == table
                    && r.param("DestinationCidrBlock").replace("%2F", "/") == dest
            })
            .count();
        assert!(
            (1..=3).contains(&attempts),
            "{mode}: {attempts} refused repairs in 5 minutes\n{}",
            ctl.log_text()
        );
        eprintln!("{mode}: {attempts} ReplaceRoute/CreateRoute in 5 minutes");
    }
    let events: Api<Event> = Api::all(kube);
    let warned = events
        .list(
            &ListParams::default().fields("involvedObject.kind=Node,involvedObject.name=refused-1"),
        )
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|ev| ev.reason.as_deref() == Some("FailedToCreateRoute"))
        .map(|ev| ev.count.unwrap_or(1))
        .sum::<i32>();
    assert_eq!(warned, 3, "one Warning per controller (mode)");
    for (mode, _, _, mut ctl) in runs {
        assert!(ctl.is_running(), "{mode}");
        let text = ctl.log_text();
        assert_eq!(ctl.stop(), Some(0), "{mode}: {text}");
    }
    plane.stop().expect("stop the control plane");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sole_replica_with_a_short_lease_paused_three_times_during_100_creations_under_ec2_buckets_keeps_its_lease()
 {
    // Regression: with a 6 s Lease, 4 s renew deadline and 1 s retry, the
    // leader exited ("could not renew the Lease within the renew deadline")
    // about 8 s after its last pause while it wrote 100 Nodes' conditions.
    const NODES: usize = 100;
    let c = TestCluster::acquire().await.expect("API server");
    let e = ec2("short-lease", "10.62.0.0/16").await;
    let instances = run_instances(&e.ec2, &e.net, NODES as i32)
        .await
        .expect("instances");
    create_nodes(&c.nodes(), "short", &instances).await;
    e.proxy
        .enforce_buckets(Some(provider_aws::testing::Buckets::EC2));
    let dir = TempDir::new("aws-short-lease");
    let cfg = dir.path().join("aws.yaml");
    std::fs::write(
        &cfg,
        format!("region: us-east-1\nendpoint: {}\n", e.proxy.url()),
    )
    .expect("write the cloud config");
    let mut ctl = start_leader_with(
        c.kubeconfig_path(),
        &dir,
        &e,
        cfg.to_str().expect("utf-8 path"),
        &[
            "--leader-elect-lease-duration",
            "6s",
            "--leader-elect-renew-deadline",
            "4s",
            "--leader-elect-retry-period",
            "1s",
        ],
    );
    let leases: Api<Lease> = Api::namespaced(c.client(), NAMESPACE);
    let pauses = std::sync::Mutex::new(Vec::new());
    let done = std::sync::atomic::AtomicBool::new(false);
    let sampling = common::lease_renewal_gaps(&leases, LEASE, &pauses, &done);
    let scenario = async {
        wait_until(Duration::from_secs(60), "the first CreateRoute", || async {
            e.proxy
                .log()
                .iter()
                .any(|r| r.action == "CreateRoute")
                .then_some(())
        })
        .await
        .unwrap_or_else(|err| panic!("{err}\n{}", ctl.log_text()));
        for _ in 0..3 {
            let from = Instant::now();
            let to = pause_after_a_renewal(&ctl, &leases, Duration::from_secs(5)).await;
            pauses.lock().expect("not poisoned").push((from, to));
            assert!(ctl.is_running(), "exited after a pause: {}", ctl.log_text());
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let all = expected(&instances);
        wait_until(Duration::from_secs(180), "all 100 routes", || async {
            (pod_routes(&e.ec2, &e.net.route_table_id).await? == all).then_some(())
        })
        .await
        .unwrap_or_else(|err| panic!("{err}\n{}", ctl.log_text()));
        wait_until(
            Duration::from_secs(120),
            "RouteCreated on all 100 Nodes",
            || async {
                for i in 0..NODES {
                    let cond = c.network_unavailable(&format!("short-{i}")).await.ok()??;
                    if cond.reason.as_deref() != Some("RouteCreated") {
                        return None;
                    }
                }
                Some(())
            },
        )
        .await
        .unwrap_or_else(|err| panic!("{err}\n{}", ctl.log_text()));
        // The catching up is over; the Lease must still be held after it.
        tokio::time::sleep(Duration::from_secs(8)).await;
        done.store(true, std::sync::atomic::Ordering::SeqCst);
    };
    let (gaps, ()) = tokio::join!(sampling, scenario);
    let log = ctl.log_text();
    assert!(
        ctl.is_running(),
        "the leader exited outside its pauses: {log}"
    );
    assert!(!log.contains("lost leadership"), "{log}");
    let (n, p99, max) = common::gap_stats(gaps);
    eprintln!(
        "Lease renewals outside the pauses: {n} gaps, p99 {p99:?}, max {max:?} (retry period 1 s, renew deadline 4 s)"
    );
    assert_eq!(ctl.stop(), Some(0), "{log}");
}
