//! Two controller processes against the real API server and one cloud-sim
//! server, electing a leader on a `coordination.k8s.io/v1` Lease: only the
//! leader calls the cloud (the simulated cloud records the caller of every
//! call), a stopped leader hands over within the lease duration, a killed one
//! only after it, and the two never mutate at the same time.

mod common;

use std::time::{Duration, Instant};

use cloud_sim::wire::LogEntry;
use cloud_sim::{AdminClient, SimServer};
use common::{
    Controller, TempDir, free_port, http_get_async, metric_sum, signal, sim_cloud_config, wait_http,
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use provider_memory::{MemoryConfig, Operation};
use test_cluster::{ClusterGuard, TestCluster, TestNode, wait_until};

const CLUSTER: &str = "kubernetes";
const NAMESPACE: &str = "default";
const LEASE_NAME: &str = "cloud-route-controller";
/// Long enough that a renewal slowed by a loaded API server does not cost
/// the leader its Lease (renew deadline 6 s, retries every second).
const LEASE: Duration = Duration::from_secs(8);
/// Allowance for a loaded 2-core machine on top of the lease duration: one
/// retry period to notice, a full sync, the creation, and scheduling delays.
const MARGIN: Duration = Duration::from_secs(8);

struct Replica {
    ctl: Controller,
    metrics: String,
}

fn start(c: &ClusterGuard, dir: &TempDir, id: &str, config: &std::path::Path) -> Replica {
    let addr = format!("127.0.0.1:{}", free_port());
    let ctl = Controller::start(
        c.kubeconfig_path(),
        dir.path(),
        id,
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "memory",
            "--cloud-config",
            config.to_str().expect("temporary paths are UTF-8"),
            "--leader-elect=true",
            "--leader-elect-identity",
            id,
            "--leader-elect-resource-namespace",
            NAMESPACE,
            "--leader-elect-lease-duration",
            "8s",
            "--leader-elect-renew-deadline",
            "6s",
            "--leader-elect-retry-period",
            "1s",
            "--metrics-bind-address",
            &addr,
        ],
    );
    Replica {
        ctl,
        metrics: format!("http://{addr}"),
    }
}

impl Replica {
    /// Waits until this replica holds the Lease.
    async fn wait_holds_lease(&self, c: &ClusterGuard, id: &str) {
        wait_until(
            Duration::from_secs(60),
            &format!("{id} holds the Lease"),
            || async { holder(c).await.filter(|(h, _)| h == id) },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", self.ctl.log_text()));
    }

    /// Waits until this replica answers `/readyz` with 200.
    async fn wait_ready(&self) {
        wait_http(&self.metrics, "/readyz", 200, Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", self.ctl.log_text()));
    }
}

async fn holder(c: &ClusterGuard) -> Option<(String, i32)> {
    let leases: Api<Lease> = Api::namespaced(c.client(), NAMESPACE);
    let spec = leases.get_opt(LEASE_NAME).await.ok()??.spec?;
    Some((spec.holder_identity?, spec.lease_transitions.unwrap_or(0)))
}

/// The Lease's holder with its acquireTime and renewTime, in microseconds
/// since the epoch.
async fn lease_times(c: &ClusterGuard) -> Option<(String, i64, i64)> {
    let leases: Api<Lease> = Api::namespaced(c.client(), NAMESPACE);
    let spec = leases.get_opt(LEASE_NAME).await.ok()??.spec?;
    Some((
        spec.holder_identity?,
        spec.acquire_time?.0.as_microsecond(),
        spec.renew_time?.0.as_microsecond(),
    ))
}

async fn leader_gauge(r: &Replica) -> Option<f64> {
    let (code, body) = http_get_async(&r.metrics, "/metrics").await?;
    (code == 200).then(|| metric_sum(&body, "route_controller_leader", &[]))
}

fn pod_cidr(i: u32) -> String {
    format!("10.244.{i}.0/24")
}

async fn add_node(c: &ClusterGuard, i: u32) {
    c.create_node(&TestNode::new(format!("le-{i}")).pod_cidrs([pod_cidr(i)]))
        .await
        .expect("create the test Node");
}

/// Waits for the route of node `i`; returns the log entry that created it.
async fn routed(
    admin: &AdminClient,
    i: u32,
    timeout: Duration,
    ctx: &dyn Fn() -> String,
) -> LogEntry {
    let dest = pod_cidr(i);
    wait_until(timeout, &format!("route for le-{i}"), || async {
        admin.log(0).await.ok()?.into_iter().find(|e| {
            e.is_mutation() && e.op == Operation::Create && e.destination.as_deref() == Some(&dest)
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctx()))
}

fn mutations_by<'a>(log: &'a [LogEntry], caller: &'a str) -> impl Iterator<Item = &'a LogEntry> {
    log.iter()
        .filter(move |e| e.is_mutation() && e.caller == caller)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_mutates_and_leadership_moves_on_stop_and_on_kill() {
    let c = TestCluster::acquire().await.unwrap();
    let sim = SimServer::start_local(MemoryConfig::default())
        .await
        .unwrap();
    let admin = AdminClient::new(&sim.url()).unwrap();
    let dir = TempDir::new("leader");
    // No `caller:`: each replica tags its calls with its own identity.
    let config = sim_cloud_config(dir.path(), "cloud", &sim.url(), None);

    // A wins the empty Lease; B starts once A holds it.
    let a = start(&c, &dir, "crc-a", &config);
    a.wait_holds_lease(&c, "crc-a").await;
    let b = start(&c, &dir, "crc-b", &config);
    // A non-leader is ready once its Node cache is synced.
    b.wait_ready().await;
    a.wait_ready().await;
    assert_eq!(leader_gauge(&a).await, Some(1.0));
    assert_eq!(leader_gauge(&b).await, Some(0.0));

    for i in 1..=3 {
        add_node(&c, i).await;
    }
    let ctx = || format!("A:\n{}\nB:\n{}", a.ctl.log_text(), b.ctl.log_text());
    for i in 1..=3 {
        let e = routed(&admin, i, Duration::from_secs(60), &ctx).await;
        assert_eq!(e.caller, "crc-a", "the leader creates the routes");
    }
    // Give the follower time to misbehave if it would.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before_stop = admin.log(0).await.unwrap();
    assert!(
        before_stop.iter().all(|e| e.caller == "crc-a"),
        "the follower made cloud calls: {:?}",
        before_stop
            .iter()
            .filter(|e| e.caller != "crc-a")
            .collect::<Vec<_>>()
    );
    let (_, transitions_a) = holder(&c).await.unwrap();

    // SIGTERM the leader: it releases the Lease, B takes over and routes a
    // Node created once A has exited (a Node created while A is still
    // handling the signal may legitimately be routed by A).
    let a_log = a.ctl.log.clone();
    let a_code = tokio::task::spawn_blocking(move || a.ctl.stop())
        .await
        .unwrap();
    let stopped = Instant::now();
    add_node(&c, 4).await;
    let ctx = || {
        format!(
            "A:\n{}\nB:\n{}",
            std::fs::read_to_string(&a_log).unwrap_or_default(),
            b.ctl.log_text()
        )
    };
    let e = routed(&admin, 4, LEASE + MARGIN, &ctx).await;
    let handover = stopped.elapsed();
    eprintln!("handover after SIGTERM: route of a new Node after {handover:?}");
    assert_eq!(e.caller, "crc-b", "{}", ctx());
    assert_eq!(a_code, Some(0), "{}", ctx());
    let a_text = std::fs::read_to_string(&a_log).unwrap();
    assert!(a_text.contains("released the Lease"), "{a_text}");
    let (h, transitions_b) = holder(&c).await.unwrap();
    assert_eq!(h, "crc-b");
    assert!(
        transitions_b > transitions_a,
        "a hand-over counts a transition"
    );
    assert_eq!(leader_gauge(&b).await, Some(1.0));

    let log = admin.log(0).await.unwrap();
    let last_a = mutations_by(&log, "crc-a").map(|e| e.at_ms).max().unwrap();
    let first_b = mutations_by(&log, "crc-b").map(|e| e.at_ms).min().unwrap();
    assert!(
        last_a < first_b,
        "A mutated at {last_a} ms, B already at {first_b} ms: {log:?}"
    );
    assert!(
        log.iter()
            .filter(|e| e.caller == "crc-b")
            .all(|e| e.seq >= before_stop.len() as u64),
        "B called the cloud before A stopped"
    );

    // A comes back as a follower; then B is killed (no release): A may take
    // over only once B's last renewal is a lease duration old.
    let a2 = start(&c, &dir, "crc-a2", &config);
    wait_http(&a2.metrics, "/readyz", 200, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", a2.ctl.log_text()));
    // Let A2 watch B renew for a while.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(leader_gauge(&a2).await, Some(0.0));
    let before_kill = admin.log(0).await.unwrap();
    assert!(
        !before_kill.iter().any(|e| e.caller == "crc-a2"),
        "the new follower made cloud calls"
    );
    let mut b = b;
    let killed = Instant::now();
    b.ctl.child.kill().unwrap();
    let _ = b.ctl.child.wait();
    // B's last renewal, now that B renews no more.
    let (h, _, b_renewed) = lease_times(&c).await.expect("the Lease");
    assert_eq!(h, "crc-b");
    add_node(&c, 5).await;
    let ctx = || format!("A2:\n{}\nB:\n{}", a2.ctl.log_text(), b.ctl.log_text());
    let e = routed(&admin, 5, LEASE + MARGIN, &ctx).await;
    let takeover = killed.elapsed();
    eprintln!("takeover after SIGKILL: route of a new Node after {takeover:?}");
    assert_eq!(e.caller, "crc-a2", "{}", ctx());
    // A2 may take the Lease only once B's last renewal is a lease duration
    // old (both clocks are this machine's); how long before the kill that
    // renewal was depends on how fast the API server answered B.
    let (h, a2_acquired, _) = lease_times(&c).await.expect("the Lease");
    assert_eq!(h, "crc-a2");
    let waited = Duration::from_micros(u64::try_from(a2_acquired - b_renewed).unwrap_or(0));
    assert!(
        waited >= LEASE,
        "A2 acquired the Lease {waited:?} after B's last renewal, before it expired"
    );
    let (h, transitions) = holder(&c).await.unwrap();
    assert_eq!(h, "crc-a2");
    assert!(transitions > transitions_b);

    let log = admin.log(0).await.unwrap();
    let last_b = mutations_by(&log, "crc-b").map(|e| e.at_ms).max().unwrap();
    let first_a2 = mutations_by(&log, "crc-a2").map(|e| e.at_ms).min().unwrap();
    assert!(last_b < first_a2, "{log:?}");
    // Every mutation's caller held the Lease: A, then B, then A2, never interleaved.
    let callers: Vec<&str> = log
        .iter()
        .filter(|e| e.is_mutation())
        .map(|e| e.caller.as_str())
        .collect();
    let mut runs = callers.clone();
    runs.dedup();
    assert_eq!(runs, ["crc-a", "crc-b", "crc-a2"], "{callers:?}");
    // Every node is routed exactly once, nothing was deleted.
    let routes = admin.routes(CLUSTER).await.unwrap();
    assert_eq!(routes.len(), 5, "{routes:?}");
    assert!(!log.iter().any(|e| e.op == Operation::Delete), "{log:?}");
    let log_a2 = a2.ctl.log_text();
    assert_eq!(a2.ctl.stop(), Some(0), "{log_a2}");
}

/// A leader stopped (SIGSTOP) past its renew deadline, with a creation
/// held at its throttle, is resumed (SIGCONT) after the throttle's pause has
/// run out and after a new leader took over: the timer of the held creation
/// fires at once, well before the election loop's next Lease round trip could
/// tell it that it lost. It must send nothing — its fence closed at the
/// deadline, whatever its leader flag still says — and exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumed_leader_past_renew_deadline_sends_no_cloud_mutation() {
    let c = TestCluster::acquire().await.unwrap();
    let sim = SimServer::start_local(MemoryConfig::default())
        .await
        .unwrap();
    let admin = AdminClient::new(&sim.url()).unwrap();
    let dir = TempDir::new("leader-sigstop");
    let config = sim_cloud_config(dir.path(), "cloud", &sim.url(), None);

    let a = start(&c, &dir, "crc-a", &config);
    a.wait_holds_lease(&c, "crc-a").await;
    a.wait_ready().await;
    let b = start(&c, &dir, "crc-b", &config);
    b.wait_ready().await;
    add_node(&c, 1).await;
    let ctx = || format!("A:\n{}\nB:\n{}", a.ctl.log_text(), b.ctl.log_text());
    assert_eq!(
        routed(&admin, 1, Duration::from_secs(60), &ctx)
            .await
            .caller,
        "crc-a"
    );

    // A's creation for node 2 is throttled with a retry-after of 8 s; A is
    // frozen while its gate holds the creation, and the storm ends.
    let retry_after = Duration::from_secs(8);
    let cloud = sim.cloud();
    cloud.set_storm(Some(Some(retry_after)));
    add_node(&c, 2).await;
    let dest = pod_cidr(2);
    wait_until(Duration::from_secs(30), "crc-a throttled", || {
        let hit = cloud.log().iter().any(|e| {
            &*e.caller == "crc-a"
                && e.op == Operation::Create
                && e.result.is_err()
                && e.destination.as_ref().map(|d| d.to_string()) == Some(dest.clone())
        });
        async move { hit.then_some(()) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctx()));
    signal(&a.ctl, "-STOP");
    let throttled = Instant::now();
    cloud.set_storm(None);
    let frozen_at = admin.log(0).await.unwrap().len() as u64;

    wait_until(LEASE + MARGIN, "crc-b holds the Lease", || async {
        holder(&c).await.filter(|(h, _)| h == "crc-b")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctx()));
    add_node(&c, 3).await;
    for i in 2..=3 {
        let e = routed(&admin, i, Duration::from_secs(60), &ctx).await;
        assert_eq!(e.caller, "crc-b");
    }
    // A's gate reopened while it was frozen; its renew deadline (6 s) is
    // long past, and nothing has told it yet that it lost the Lease.
    let reopened = throttled + retry_after + Duration::from_secs(1);
    tokio::time::sleep(reopened.saturating_duration_since(Instant::now())).await;
    signal(&a.ctl, "-CONT");
    let mut a = a;
    let exited = wait_until(Duration::from_secs(30), "crc-a exits", || {
        let code = a.ctl.child.try_wait().ok().flatten().map(|s| s.code());
        async move { code }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", a.ctl.log_text()));
    let log = admin.log(0).await.unwrap();
    // Any change request counts, whatever it was answered.
    let late: Vec<&LogEntry> = log
        .iter()
        .filter(|e| e.caller == "crc-a" && e.seq >= frozen_at && e.op != Operation::List)
        .collect();
    let a_text = a.ctl.log_text();
    assert!(
        late.is_empty(),
        "the resumed leader changed the cloud: {late:?}\n{a_text}"
    );
    assert_eq!(exited, Some(1), "{a_text}");
    assert!(a_text.contains("lost leadership"), "{a_text}");
    let routes = admin.routes(CLUSTER).await.unwrap();
    assert_eq!(routes.len(), 3, "{routes:?}");
    assert_eq!(holder(&c).await.map(|(h, _)| h).as_deref(), Some("crc-b"));
    let b_text = b.ctl.log_text();
    assert_eq!(b.ctl.stop(), Some(0), "{b_text}");
}
