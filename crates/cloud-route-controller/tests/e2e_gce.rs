//! End to end: the binary with `--cloud-provider gce` against the real API
//! server and the stateful fake of the Compute Engine REST API (global
//! `routes`, asynchronous `globalOperations`, the static-routes quota per
//! network, per-window rate quotas answering 403 `rateLimitExceeded`),
//! reached through Google's official client with anonymous credentials.

mod common;

use std::time::{Duration, Instant};

use common::{Controller, TempDir, cleanup_deletes, free_port, http_get};
use provider_gce::testing::{FakeConfig, FakeGce, FakeRoute};
use test_cluster::{TestCluster, TestNode, wait_until};

const NETWORK: &str = "k8s";
const ZONE: &str = "europe-west1-b";
const NODES: usize = 60;
const DELETED: usize = 10;

/// Writes a gce `--cloud-config` pointing at the fake.
fn write_config(dir: &TempDir, fake: &FakeGce, extra: &str) -> std::path::PathBuf {
    let config = dir.path().join("gce.yaml");
    std::fs::write(
        &config,
        format!(
            "project: {}\nnetwork: {NETWORK}\nendpoint: {}\nanonymous: true\n\
             operation_poll_min_ms: 100\n{extra}",
            fake.project(),
            fake.endpoint(),
        ),
    )
    .expect("write the test fixture file");
    config
}

fn pod_cidr(i: usize) -> String {
    format!("10.244.{i}.0/24")
}

fn node(fake: &FakeGce, i: usize) -> TestNode {
    let name = format!("gce-{i}");
    TestNode::new(name.clone())
        .pod_cidrs([pod_cidr(i)])
        .internal_ip(format!("10.0.0.{}", i + 2))
        .provider_id(format!("gce://{}/{ZONE}/{name}", fake.project()))
}

/// The routes cluster `kubernetes` made in the fake's network `k8s`.
fn ours(fake: &FakeGce) -> Vec<FakeRoute> {
    fake.routes()
        .into_iter()
        .filter(|r| {
            r.name.starts_with("kubernetes-10-")
                && r.description == "k8s-node-route"
                && r.network == fake.network_url(NETWORK)
        })
        .collect()
}

fn destinations(routes: &[FakeRoute]) -> Vec<String> {
    let mut d: Vec<String> = routes.iter().map(|r| r.dest_range.clone()).collect();
    d.sort();
    d
}

fn expect(range: std::ops::Range<usize>) -> Vec<String> {
    let mut d: Vec<String> = range.map(pod_cidr).collect();
    d.sort();
    d
}

#[tokio::test]
async fn sixty_nodes_routed_ten_deleted_foreign_routes_untouched_and_cleanup_leaves_them() {
    let c = TestCluster::acquire().await.unwrap();
    let fake = FakeGce::start(FakeConfig {
        // Route operations take seconds on GCE; long enough here that
        // every insert is followed by a blocking wait, not an answer
        // already done.
        operation_duration: Duration::from_millis(300),
        ..FakeConfig::default()
    })
    .await
    .unwrap();
    fake.add_network(NETWORK, false);
    fake.add_network("other-net", false);
    for i in 0..NODES {
        fake.add_instance(ZONE, &format!("gce-{i}"));
    }
    let other_instance = fake.instance_url(ZONE, "other-node");
    fake.add_instance(ZONE, "other-node");
    // What other writers keep in the same project, inside our cluster CIDR:
    // another cluster's route (its own prefix), a route with our prefix
    // but another tool's description, one of our shape in another network,
    // and the network's default internet route.
    let foreign = [
        (
            "prod-10-244-200-0-24",
            NETWORK,
            "10.244.200.0/24",
            Some(other_instance.as_str()),
            "k8s-node-route",
        ),
        (
            "kubernetes-terraform-pinned",
            NETWORK,
            "10.244.201.0/24",
            Some(other_instance.as_str()),
            "managed by terraform",
        ),
        (
            "kubernetes-10-244-202-0-24",
            "other-net",
            "10.244.202.0/24",
            Some(other_instance.as_str()),
            "k8s-node-route",
        ),
        (
            "default-route-0123456789abcdef",
            NETWORK,
            "0.0.0.0/0",
            None,
            "Default route to the Internet.",
        ),
    ];
    for (name, net, dest, hop, description) in foreign {
        fake.insert_route(name, net, dest, hop, description);
    }
    let dir = TempDir::new("gce");
    let config = write_config(&dir, &fake, "");
    let port = free_port();
    let metrics = format!("127.0.0.1:{port}");
    let t0 = Instant::now();
    let mut ctl = Controller::start(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "gce",
            "--cloud-config",
            config.to_str().unwrap(),
            "--leader-elect=false",
            "--metrics-bind-address",
            &metrics,
        ],
    );
    for i in 0..NODES {
        c.create_node(&node(&fake, i)).await.unwrap();
    }
    wait_until(
        Duration::from_secs(120),
        "a route per Node in the network",
        || async { (destinations(&ours(&fake)) == expect(0..NODES)).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let routed = t0.elapsed();
    // Shaped as upstream's routes: priority 1000, the tag, the instance.
    for r in ours(&fake) {
        assert_eq!(r.priority, 1000, "{r:?}");
        assert_eq!(r.network, fake.network_url(NETWORK), "{r:?}");
        let i: usize = r.dest_range.split('.').nth(2).unwrap().parse().unwrap();
        assert_eq!(
            r.next_hop_instance.as_deref(),
            Some(fake.instance_url(ZONE, &format!("gce-{i}")).as_str()),
            "{r:?}"
        );
        assert_eq!(r.name, format!("kubernetes-10-244-{i}-0-24"));
    }
    let after_create = fake.requests();
    for i in NODES - DELETED..NODES {
        c.delete_node(&format!("gce-{i}")).await.unwrap();
    }
    wait_until(
        Duration::from_secs(120),
        "the deleted Nodes' routes gone",
        || async { (destinations(&ours(&fake)) == expect(0..NODES - DELETED)).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    // A route disappears when its operation ends; the controller's wait
    // for that operation is answered a moment later.
    let ops = (NODES + DELETED) as u64;
    let reads = |fake: &FakeGce| fake.count("wait_operation") + fake.count("get_operation");
    wait_until(Duration::from_secs(10), "every operation read", || async {
        (reads(&fake) >= ops).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {:?}", fake.requests()));
    let requests = fake.requests();
    eprintln!(
        "gce: {NODES} Nodes routed after {routed:?}, {DELETED} deleted after {:?}; requests after the creations: {after_create:?}; in all: {requests:?}",
        t0.elapsed()
    );
    let count =
        |m: &std::collections::BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    assert_eq!(
        count(&after_create, "insert"),
        NODES as u64,
        "{after_create:?}"
    );
    assert_eq!(count(&requests, "delete"), DELETED as u64, "{requests:?}");
    // One network read at start, and a list at start-up only: incremental
    // mode plans Node events against its cached table.
    assert_eq!(count(&requests, "get_network"), 1, "{requests:?}");
    assert!(count(&requests, "list") <= 2, "{requests:?}");
    // Each operation is followed by one wait while it runs (300 ms) and
    // never re-read sooner than 100 ms: at most 2 reads per operation here.
    assert!(reads(&fake) <= 2 * ops, "{requests:?}");
    assert_eq!(fake.throttled(), 0, "{requests:?}");
    for (name, ..) in foreign {
        assert!(
            fake.routes().iter().any(|r| r.name == name),
            "the foreign route {name} was touched"
        );
    }
    let (code, body) = http_get(&format!("http://{metrics}"), "/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(
        body.contains("route_controller_cloud_requests_total{provider=\"gce\""),
        "{body}"
    );
    assert!(ctl.is_running(), "{}", ctl.log_text());
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");

    let config_path = config.to_str().expect("utf-8 path");
    let args = [
        "--cluster-cidr",
        "10.244.0.0/16",
        "--cloud-provider",
        "gce",
        "--cloud-config",
        config_path,
    ];
    cleanup_deletes(&args, &[], NODES - DELETED).await;
    let mut left: Vec<String> = fake.routes().into_iter().map(|r| r.name).collect();
    left.sort();
    let mut want: Vec<String> = foreign.iter().map(|f| f.0.to_string()).collect();
    want.sort();
    assert_eq!(left, want, "only the foreign routes are left");
}

#[tokio::test]
async fn a_spent_write_quota_is_waited_out_until_the_window_turns() {
    let c = TestCluster::acquire().await.unwrap();
    // A 2-second window standing for GCE's minute: 8 writes per window.
    let fake = FakeGce::start(FakeConfig {
        writes_per_window: 8,
        window: Duration::from_secs(2),
        ..FakeConfig::default()
    })
    .await
    .unwrap();
    fake.add_network(NETWORK, false);
    const N: usize = 24;
    for i in 0..N {
        fake.add_instance(ZONE, &format!("gce-{i}"));
    }
    let dir = TempDir::new("gce-quota");
    let config = write_config(&dir, &fake, "quota_window_secs: 2\n");
    // Every Node before the controller starts, so its first pass sends the
    // 24 inserts together, however slowly this machine creates Nodes.
    let t0 = Instant::now();
    for i in 0..N {
        c.create_node(&node(&fake, i)).await.unwrap();
    }
    let ctl = Controller::start(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "gce",
            "--cloud-config",
            config.to_str().unwrap(),
            "--leader-elect=false",
            "--metrics-bind-address",
            "0",
        ],
    );
    wait_until(
        Duration::from_secs(120),
        "every Node routed through a spent write quota",
        || async { (destinations(&ours(&fake)) == expect(0..N)).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let took = t0.elapsed();
    let requests = fake.requests();
    let throttled = fake.throttled();
    eprintln!(
        "gce: {N} routes through a write quota of 8 per 2 s in {took:?}; {throttled} refused; {requests:?}"
    );
    // 24 writes at 8 per window need at least two more windows.
    assert!(throttled > 0, "the quota was never reached: {requests:?}");
    // A refusal pauses every write until the window turns, so refused
    // requests stay few: not one per route per retry.
    assert!(
        throttled <= N as u64,
        "{throttled} refusals for {N} routes: {requests:?}"
    );
    wait_until(
        Duration::from_secs(60),
        "every Node's NetworkUnavailable condition False",
        || async {
            for i in 0..N {
                let cond = c.network_unavailable(&format!("gce-{i}")).await.ok()??;
                if cond.status != "False" {
                    return None;
                }
            }
            Some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");
}

#[tokio::test]
async fn a_node_on_an_instance_without_can_ip_forward_keeps_its_route_and_reads_forwarding_disabled()
 {
    let t0 = Instant::now();
    let c = TestCluster::acquire().await.unwrap();
    let fake = FakeGce::start(FakeConfig::default()).await.unwrap();
    fake.add_network(NETWORK, false);
    // gce-0 can forward; gce-1 was created without `--can-ip-forward`.
    fake.add_instance(ZONE, "gce-0");
    fake.add_instance(ZONE, "gce-1");
    assert!(fake.set_can_ip_forward(ZONE, "gce-1", false));
    let dir = TempDir::new("gce-forwarding");
    let config = write_config(&dir, &fake, "");
    let ctl = Controller::start(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "gce",
            "--cloud-config",
            config.to_str().unwrap(),
            "--leader-elect=false",
            "--metrics-bind-address",
            "0",
        ],
    );
    for i in 0..2 {
        c.create_node(&node(&fake, i)).await.unwrap();
    }
    wait_until(
        Duration::from_secs(120),
        "both Nodes routed, the one that cannot forward too",
        || async { (destinations(&ours(&fake)) == expect(0..2)).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let conditions = wait_until(
        Duration::from_secs(20),
        "gce-0 RouteCreated and gce-1 ForwardingDisabled",
        || async {
            let on = c.network_unavailable("gce-0").await.ok()??;
            let off = c.network_unavailable("gce-1").await.ok()??;
            (on.reason.as_deref() == Some("RouteCreated")
                && off.reason.as_deref() == Some("ForwardingDisabled"))
            .then_some((on, off))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    assert_eq!(conditions.0.status, "False", "{:?}", conditions.0);
    assert_eq!(conditions.1.status, "True", "{:?}", conditions.1);
    let warnings = |name: &'static str| {
        let c = &c;
        async move {
            c.node_events(name)
                .await
                .unwrap()
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("ForwardingDisabled"))
                .collect::<Vec<_>>()
        }
    };
    wait_until(
        Duration::from_secs(10),
        "gce-1's ForwardingDisabled Warning",
        || async { (!warnings("gce-1").await.is_empty()).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    // The passes that follow (Node updates, condition writes) must not
    // repeat it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events = warnings("gce-1").await;
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(e.count.unwrap_or(1), 1, "{e:?}");
    let message = e.message.as_deref().unwrap_or_default();
    assert!(
        message.contains("instance gce-1") && message.contains("canIpForward false"),
        "{message}"
    );
    assert!(
        message.contains("--can-ip-forward")
            && message.contains(&format!("update-from-file gce-1 --zone {ZONE}")),
        "{message}"
    );
    assert!(warnings("gce-0").await.is_empty());
    // One read per instance: the Node updates that followed cost none.
    assert_eq!(fake.count("get_instance"), 2, "{:?}", fake.requests());
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");
    // `plan` lists the missing prerequisite beside the routes, and the
    // condition the controller keeps.
    // Async: the fake serves from this test's runtime.
    let out = tokio::process::Command::new(common::binary())
        .arg("plan")
        .arg("--kubeconfig")
        .arg(c.kubeconfig_path())
        .args(["--cluster-cidr", "10.244.0.0/16", "--cloud-provider", "gce"])
        .arg("--cloud-config")
        .arg(&config)
        .output()
        .await
        .expect("run plan");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("FORWARDING PREREQUISITES MISSING (1)")
            && stdout.contains("instance gce-1")
            && stdout.contains("--can-ip-forward"),
        "{stdout}"
    );
    assert!(
        stdout.contains("no change needed") || !stdout.contains("ROUTES TO"),
        "{stdout}"
    );
    eprintln!("gce forwarding: took {:?}", t0.elapsed());
}

/// Writes cloud-provider-gcp's own `gce.conf`, shaped like the one
/// cluster/gce's configure-helper writes for a control plane, pointed at the
/// fake through `api-endpoint` (upstream's compute base path).
fn write_gce_conf(dir: &TempDir, fake: &FakeGce) -> std::path::PathBuf {
    let config = dir.path().join("gce.conf");
    std::fs::write(
        &config,
        format!(
            "[global]\n\
             project-id = {}\n\
             network-name = {NETWORK}\n\
             subnetwork-name = k8s-subnet\n\
             node-tags = k8s-node\n\
             node-instance-prefix = gce\n\
             multizone = true\n\
             local-zone = {ZONE}\n\
             api-endpoint = {}/compute/v1/\n\
             token-url = nil\n\
             alpha-features = ILBSubsets\n",
            fake.project(),
            fake.endpoint(),
        ),
    )
    .expect("write the test fixture file");
    config
}

/// The controller with `gce_conf` and our `yaml` beside it.
fn start_with_gce_conf(
    c: &TestCluster,
    dir: &TempDir,
    gce_conf: &std::path::Path,
    yaml: &std::path::Path,
    env: &[(&str, &str)],
) -> Controller {
    Controller::start_with_env(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "gce",
            "--cloud-config",
            gce_conf.to_str().expect("a UTF-8 path"),
            "--cloud-config",
            yaml.to_str().expect("a UTF-8 path"),
            "--leader-elect=false",
            "--metrics-bind-address",
            "0",
        ],
        env,
    )
}

#[tokio::test]
async fn a_gce_conf_of_cloud_provider_gcp_routes_nodes_with_our_yaml_beside_it() {
    let c = TestCluster::acquire().await.unwrap();
    let fake = FakeGce::start(FakeConfig::default()).await.unwrap();
    fake.add_network(NETWORK, false);
    for i in 0..3 {
        fake.add_instance(ZONE, &format!("gce-{i}"));
    }
    let dir = TempDir::new("gce-native");
    let gce_conf = write_gce_conf(&dir, &fake);
    // What gce.conf cannot say: the fake takes no credentials, and its
    // operations end at once.
    let yaml = dir.path().join("ours.yaml");
    std::fs::write(&yaml, "anonymous: true\noperation_poll_min_ms: 100\n")
        .expect("write the test fixture file");
    let ctl = start_with_gce_conf(&c, &dir, &gce_conf, &yaml, &[]);
    for i in 0..3 {
        c.create_node(&node(&fake, i)).await.unwrap();
    }
    wait_until(
        Duration::from_secs(30),
        "the three Nodes routed in the gce.conf's network",
        || async { (destinations(&ours(&fake)) == expect(0..3)).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    for r in ours(&fake) {
        let i: usize = r.name["kubernetes-10-244-".len()..]
            .split('-')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("route name {}", r.name));
        assert_eq!(
            r.next_hop_instance.as_deref(),
            Some(fake.instance_url(ZONE, &format!("gce-{i}")).as_str()),
            "{r:?}"
        );
    }
    let log = ctl.log_text();
    // The keys only load balancers and zones use are named once, as
    // having no effect here.
    for key in ["node-tags = k8s-node", "subnetwork-name", "local-zone"] {
        assert_eq!(log.matches(key).count(), 1, "{key}: {log}");
    }
    assert_eq!(ctl.stop(), Some(0), "{log}");
}

/// A `gce.conf` with a `token-url` of its own, as cloud-provider-gcp's
/// AltTokenSource reads it: the token for every Compute request comes from
/// the endpoint (the fake's `generateAccessToken`), asked once with the
/// metadata server's token and the file's `token-body`.
#[tokio::test]
async fn a_gce_conf_token_url_signs_every_request_with_its_token() {
    let c = TestCluster::acquire().await.unwrap();
    let fake = FakeGce::start(FakeConfig::default()).await.unwrap();
    fake.add_network(NETWORK, false);
    for i in 0..2 {
        fake.add_instance(ZONE, &format!("gce-{i}"));
    }
    let dir = TempDir::new("gce-token-url");
    let account = "routes@p.iam.gserviceaccount.com";
    let body = r#"{"scope": ["https://www.googleapis.com/auth/compute"]}"#;
    let gce_conf = dir.path().join("gce.conf");
    std::fs::write(
        &gce_conf,
        format!(
            "[global]\nproject-id = {}\nnetwork-name = {NETWORK}\n\
             api-endpoint = {}/compute/v1/\ntoken-url = {}\n\
             token-body = \"{}\"\n",
            fake.project(),
            fake.endpoint(),
            fake.token_url(account),
            body.replace('"', "\\\""),
        ),
    )
    .expect("write the test fixture file");
    let yaml = dir.path().join("ours.yaml");
    std::fs::write(&yaml, "operation_poll_min_ms: 100\n").expect("write the test fixture file");
    let home = dir.path().to_str().unwrap().to_string();
    // No key file, no gcloud login: the metadata server is the base.
    let ctl = start_with_gce_conf(
        &c,
        &dir,
        &gce_conf,
        &yaml,
        &[
            ("GCE_METADATA_HOST", fake.metadata_host().as_str()),
            ("HOME", home.as_str()),
        ],
    );
    for i in 0..2 {
        c.create_node(&node(&fake, i)).await.unwrap();
    }
    wait_until(
        Duration::from_secs(30),
        "the two Nodes routed with the token-url's token",
        || async { (destinations(&ours(&fake)) == expect(0..2)).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");
    let seen = fake.authorizations();
    assert_eq!(
        seen.keys().collect::<Vec<_>>(),
        vec![&format!("Bearer ya29.generated-1-for-{account}")],
        "{seen:?}"
    );
    assert_eq!(fake.token_bodies(), vec![body.to_string()]);
    assert!(!log.contains("ya29."), "a token in the log: {log}");
}

#[tokio::test]
async fn a_key_set_in_gce_conf_and_in_our_yaml_stops_the_start_naming_both() {
    let c = TestCluster::acquire().await.unwrap();
    let fake = FakeGce::start(FakeConfig::default()).await.unwrap();
    fake.add_network(NETWORK, false);
    let dir = TempDir::new("gce-native-twice");
    let gce_conf = write_gce_conf(&dir, &fake);
    let yaml = dir.path().join("ours.yaml");
    std::fs::write(&yaml, "anonymous: true\nnetwork: other-net\n")
        .expect("write the test fixture file");
    let run = tokio::process::Command::new(common::binary())
        .arg("--kubeconfig")
        .arg(c.kubeconfig_path())
        .args(["--cluster-cidr", "10.244.0.0/16", "--cloud-provider", "gce"])
        .args(["--leader-elect=false", "--metrics-bind-address", "0"])
        .arg("--cloud-config")
        .arg(&gce_conf)
        .arg("--cloud-config")
        .arg(&yaml)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the controller exits by itself")
        .expect("run the controller");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "`network` is set both by [global] network-name (cloud-provider-gcp gce.conf) and in the YAML file"
        ) && stderr.contains(yaml.to_str().unwrap()),
        "{stderr}"
    );
    assert_eq!(fake.total(), 0, "{:?}", fake.requests());
}
