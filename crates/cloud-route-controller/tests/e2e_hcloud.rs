//! End to end: the binary with `--cloud-provider hcloud` against the real
//! API server and a stateful fake of the Hetzner Cloud API that enforces the
//! 3,600 requests/hour budget (RateLimit headers, 429), serialised actions per
//! network and the 100-routes-per-network limit.

mod common;

use std::time::Duration;

use common::{Controller, TempDir, free_port, http_get};
use provider_hcloud::testing::{FakeConfig, FakeHcloud};
use test_cluster::{TestCluster, TestNode, wait_until};

const NETWORK: u64 = 4711;

/// Writes the fake's token and an hcloud `--cloud-config` pointing at it.
fn write_config(dir: &TempDir, fake: &FakeHcloud) -> std::path::PathBuf {
    let token = dir.path().join("token");
    std::fs::write(&token, fake.token()).expect("write the test fixture file");
    let config = dir.path().join("hcloud.yaml");
    std::fs::write(
        &config,
        format!(
            "network: \"{NETWORK}\"\nendpoint: {}\ntoken_file: {}\n",
            fake.base_url(),
            token.display()
        ),
    )
    .expect("write the test fixture file");
    config
}

/// Starts the binary on the fake's network with `extra` flags after the
/// common ones.
fn start(
    c: &test_cluster::ClusterGuard,
    dir: &TempDir,
    config: &std::path::Path,
    cluster_cidr: &str,
    extra: &[&str],
) -> Controller {
    let mut args = vec![
        "--cluster-cidr",
        cluster_cidr,
        "--cloud-provider",
        "hcloud",
        "--cloud-config",
        config.to_str().expect("utf-8 path"),
        "--leader-elect=false",
    ];
    args.extend_from_slice(extra);
    Controller::start(c.kubeconfig_path(), dir.path(), "controller", &args)
}

#[tokio::test]
async fn scale_up_of_500_nodes_never_gets_a_429_and_stops_at_the_route_limit() {
    let c = TestCluster::acquire().await.unwrap();
    // The budget on: the test is that pacing by the RateLimit headers
    // keeps a 500-Node scale-up free of 429s.
    let fake = FakeHcloud::start(FakeConfig {
        enforce_budget: true,
        ..FakeConfig::default()
    })
    .await
    .unwrap();
    fake.add_network(NETWORK, "k8s", "10.0.0.0/8", &["10.0.0.0/16"]);
    let dir = TempDir::new("hcloud");
    let config = write_config(&dir, &fake);
    for i in 0..500u64 {
        fake.add_server(
            1000 + i,
            &format!("hc-{i}"),
            NETWORK,
            &format!("10.0.{}.{}", i / 250, i % 250 + 2),
        );
    }
    let port = free_port();
    let metrics = format!("127.0.0.1:{port}");
    let ctl = start(
        &c,
        &dir,
        &config,
        "10.244.0.0/16",
        &["--metrics-bind-address", &metrics],
    );
    for i in 0..500u64 {
        c.create_node(
            &TestNode::new(format!("hc-{i}"))
                .pod_cidrs([format!("10.244.{}.{}/26", i / 4, (i % 4) * 64)])
                .internal_ip(format!("10.0.{}.{}", i / 250, i % 250 + 2))
                .provider_id(format!("hcloud://{}", 1000 + i)),
        )
        .await
        .unwrap();
    }
    wait_until(
        Duration::from_secs(180),
        "100 routes in the network",
        || async { (fake.routes(NETWORK).len() == 100).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    // Give the refused creations time to be retried once (60 s floor) would be
    // too slow for a test; what matters is that none of them reached the API.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(fake.throttled(), 0, "the controller received a 429");
    assert_eq!(fake.routes(NETWORK).len(), 100);
    let requests = fake.requests();
    let total = fake.total();
    eprintln!("hcloud requests for a 500-node scale-up: {total} in all, by endpoint: {requests:?}");
    assert_eq!(
        requests.get("add_route").copied().unwrap_or(0),
        100,
        "{requests:?}"
    );
    // Nodes beyond the limit are told why (Events arrive at --kube-api-qps).
    let routed: std::collections::HashSet<String> =
        fake.routes(NETWORK).into_iter().map(|(d, _)| d).collect();
    let unrouted = (0..500u64)
        .find(|i| !routed.contains(&format!("10.244.{}.{}/26", i / 4, (i % 4) * 64)))
        .unwrap();
    let name = format!("hc-{unrouted}");
    wait_until(
        Duration::from_secs(120),
        "a quota warning on an unrouted node",
        || async {
            let ev = c.node_events(&name).await.ok()?;
            ev.iter()
                .any(|e| {
                    e.reason.as_deref() == Some("RouteQuotaExceeded")
                        && e.message
                            .as_deref()
                            .unwrap_or("")
                            .contains("at most 100 routes")
                })
                .then_some(())
        },
    )
    .await
    .unwrap();
    let (code, body) = http_get(&format!("http://{metrics}"), "/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(
        body.contains("route_controller_cloud_requests_total{provider=\"hcloud\""),
        "{body}"
    );
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");
}

#[tokio::test]
async fn ipv6_pod_cidrs_get_a_warning_not_a_request() {
    let c = TestCluster::acquire().await.unwrap();
    let fake = FakeHcloud::start(FakeConfig::default()).await.unwrap();
    fake.add_network(NETWORK, "k8s", "10.0.0.0/8", &["10.0.0.0/16"]);
    fake.add_server(1, "v6", NETWORK, "10.0.0.9");
    let dir = TempDir::new("hcloud6");
    let config = write_config(&dir, &fake);
    let ctl = start(
        &c,
        &dir,
        &config,
        "10.244.0.0/16,fd00:10::/56",
        &["--metrics-bind-address", "0"],
    );
    c.create_node(
        &TestNode::new("v6")
            .pod_cidrs(["10.244.9.0/24", "fd00:10:0:9::/64"])
            .internal_ip("10.0.0.9")
            .provider_id("hcloud://1"),
    )
    .await
    .unwrap();
    wait_until(
        Duration::from_secs(60),
        "IPv4 route and an IPv6 warning",
        || async {
            let ev = c.node_events("v6").await.ok()?;
            let warned = ev.iter().any(|e| {
                e.reason.as_deref() == Some("FailedToCreateRoute")
                    && e.message
                        .as_deref()
                        .unwrap_or("")
                        .contains("fd00:10:0:9::/64")
            });
            (warned && fake.routes(NETWORK).len() == 1).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    assert_eq!(
        fake.count("add_route"),
        1,
        "the IPv6 route never reached the API"
    );
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");
}

const ROOT_SERVER: &str = "instance.hetzner.cloud/is-root-server";

async fn label(c: &test_cluster::ClusterGuard, node: &str, value: Option<&str>) {
    use kube::api::{Patch, PatchParams};
    let patch = serde_json::json!({ "metadata": { "labels": { ROOT_SERVER: value } } });
    c.nodes()
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("label the Node");
}

async fn reason(c: &test_cluster::ClusterGuard, node: &str) -> Option<String> {
    c.network_unavailable(node)
        .await
        .ok()
        .flatten()
        .and_then(|cond| cond.reason)
}

// hcloud-cloud-controller-manager #133/#789: a cluster of cloud servers and
// dedicated (Robot) servers joined over a vSwitch. The dedicated ones must get
// no route, and the routes someone made for them by hand must stay.
#[tokio::test]
async fn dedicated_servers_outside_the_node_selector_are_left_alone_and_label_changes_move_nodes_in_and_out()
 {
    let c = TestCluster::acquire().await.unwrap();
    let fake = FakeHcloud::start(FakeConfig::default()).await.unwrap();
    fake.add_network(
        NETWORK,
        "k8s",
        "10.0.0.0/8",
        &["10.0.0.0/16", "10.1.0.0/24"],
    );
    let dir = TempDir::new("hcloud-selector");
    let config = write_config(&dir, &fake);
    for i in 0..20u64 {
        fake.add_server(
            100 + i,
            &format!("hc-{i}"),
            NETWORK,
            &format!("10.0.0.{}", i + 2),
        );
    }
    // The dedicated servers' routes, made by hand through the vSwitch.
    for i in 0..5 {
        fake.insert_route(
            NETWORK,
            &format!("10.244.{}.0/24", 100 + i),
            &format!("10.1.0.{}", i + 2),
        );
    }
    for i in 0..20u64 {
        c.create_node(
            &TestNode::new(format!("hc-{i}"))
                .pod_cidrs([format!("10.244.{i}.0/24")])
                .internal_ip(format!("10.0.0.{}", i + 2))
                .provider_id(format!("hcloud://{}", 100 + i)),
        )
        .await
        .unwrap();
    }
    for i in 0..5 {
        c.create_node(
            &TestNode::new(format!("robot-{i}"))
                .pod_cidrs([format!("10.244.{}.0/24", 100 + i)])
                .internal_ip(format!("10.1.0.{}", i + 2))
                .provider_id(format!("hrobot://{}", 900 + i))
                .label(ROOT_SERVER, "true"),
        )
        .await
        .unwrap();
    }
    // The controller starts in the cluster as it is, dedicated servers
    // already joined: a hand-made route to a server no Node names yet is a
    // stray inside the cluster CIDRs, as upstream treats it.
    let selector = format!("{ROOT_SERVER}!=true");
    let ctl = start(
        &c,
        &dir,
        &config,
        "10.244.0.0/16",
        &["--node-selector", &selector, "--metrics-bind-address", "0"],
    );
    let routed = |n: usize| {
        let fake = &fake;
        let c = &c;
        async move {
            let mut ok = 0;
            for i in 0..20 {
                if reason(c, &format!("hc-{i}")).await.as_deref() == Some("RouteCreated") {
                    ok += 1;
                }
            }
            (ok == n && fake.routes(NETWORK).len() == 25).then_some(())
        }
    };
    wait_until(Duration::from_secs(120), "20 cloud servers routed", || {
        routed(20)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    assert_eq!(fake.count("add_route"), 20);
    assert_eq!(
        fake.count("delete_route"),
        0,
        "the hand-made routes are not ours"
    );
    for i in 0..5 {
        let name = format!("robot-{i}");
        assert_eq!(reason(&c, &name).await, None, "{name}: condition untouched");
        let events = c.node_events(&name).await.unwrap();
        assert!(events.is_empty(), "{name}: no Warning: {events:?}");
    }

    // hc-0 becomes a dedicated server's stand-in: it leaves the selection
    // and loses the route a route controller made, after the deletion grace.
    label(&c, "hc-0", Some("true")).await;
    wait_until(
        Duration::from_secs(60),
        "hc-0 unrouted and NodeExcluded",
        || async {
            let gone = !fake
                .routes(NETWORK)
                .iter()
                .any(|(d, _)| d == "10.244.0.0/24");
            (gone && reason(&c, "hc-0").await.as_deref() == Some("NodeExcluded")).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let cond = c.network_unavailable("hc-0").await.unwrap().unwrap();
    assert_eq!(
        cond.status, "False",
        "left out on purpose is not a network outage"
    );
    assert_eq!(fake.count("delete_route"), 1);

    // One label change moves one Node in and another out: hc-0 comes back
    // (routed at once) as hc-1 leaves (unrouted after the grace).
    label(&c, "hc-0", None).await;
    label(&c, "hc-1", Some("true")).await;
    wait_until(
        Duration::from_secs(60),
        "hc-0 routed again, hc-1 unrouted and NodeExcluded",
        || async {
            let routes = fake.routes(NETWORK);
            let has = |dest: &str| routes.iter().any(|(d, _)| d == dest);
            (has("10.244.0.0/24")
                && !has("10.244.1.0/24")
                && reason(&c, "hc-0").await.as_deref() == Some("RouteCreated")
                && reason(&c, "hc-1").await.as_deref() == Some("NodeExcluded"))
            .then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    assert_eq!(fake.count("add_route"), 21);
    assert_eq!(
        fake.count("delete_route"),
        2,
        "hc-0's and hc-1's routes only: the dedicated servers' routes stayed"
    );
    assert_eq!(fake.routes(NETWORK).len(), 24);
    for i in 0..5 {
        let dest = format!("10.244.{}.0/24", 100 + i);
        assert!(
            fake.routes(NETWORK)
                .iter()
                .any(|(d, g)| *d == dest && *g == format!("10.1.0.{}", i + 2))
        );
    }
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");
}

#[tokio::test]
async fn a_dual_stack_cluster_with_ipv6_switched_off_routes_ipv4_only_and_says_so() {
    let c = TestCluster::acquire().await.unwrap();
    let fake = FakeHcloud::start(FakeConfig::default()).await.unwrap();
    fake.add_network(NETWORK, "k8s", "10.0.0.0/8", &["10.0.0.0/16"]);
    fake.add_server(1, "ds", NETWORK, "10.0.0.9");
    let dir = TempDir::new("hcloud-v4only");
    let config = write_config(&dir, &fake);
    let ctl = start(
        &c,
        &dir,
        &config,
        "10.244.0.0/16,fd00:10::/56",
        &["--route-ip-families", "IPv4", "--metrics-bind-address", "0"],
    );
    c.create_node(
        &TestNode::new("ds")
            .pod_cidrs(["10.244.9.0/24", "fd00:10:0:9::/64"])
            .internal_ip("10.0.0.9")
            .provider_id("hcloud://1"),
    )
    .await
    .unwrap();
    wait_until(
        Duration::from_secs(60),
        "the IPv4 route and RouteCreated",
        || async {
            (fake.routes(NETWORK).len() == 1
                && reason(&c, "ds").await.as_deref() == Some("RouteCreated"))
            .then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(fake.count("add_route"), 1);
    let events = c.node_events("ds").await.unwrap();
    assert!(
        events.is_empty(),
        "no Warning for a family switched off: {events:?}"
    );
    let log = ctl.log_text();
    assert!(
        log.contains("not routing this address family") && log.contains("IPv6"),
        "{log}"
    );
    assert_eq!(ctl.stop(), Some(0), "{log}");
}

/// Starts the binary with no `--cloud-config` (unless `config` is given)
/// and `env` added: the env block hcloud-cloud-controller-manager's chart
/// and manifests set.
fn start_with_ccm_env(
    c: &test_cluster::ClusterGuard,
    dir: &TempDir,
    name: &str,
    config: Option<&std::path::Path>,
    env: &[(&str, &str)],
) -> Controller {
    let mut args = vec![
        "--cluster-cidr",
        "10.244.0.0/16",
        "--cloud-provider",
        "hcloud",
        "--leader-elect=false",
        "--metrics-bind-address",
        "0",
    ];
    if let Some(config) = config {
        args.extend(["--cloud-config", config.to_str().expect("utf-8 path")]);
    }
    Controller::start_with_env(c.kubeconfig_path(), dir.path(), name, &args, env)
}

/// Waits up to 30 s for the process to exit by itself; its exit code.
fn exit_code(ctl: &mut Controller) -> Option<i32> {
    for _ in 0..600 {
        if let Ok(Some(s)) = ctl.child.try_wait() {
            return s.code();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("still running after 30 s:\n{}", ctl.log_text());
}

// Issue 26: the Secret and env block of hcloud-cloud-controller-manager's
// Deployment (deploy/ccm-networks.yaml: HCLOUD_TOKEN from the Secret,
// HCLOUD_NETWORK; HCLOUD_ENDPOINT for another API) configure the controller
// without a file; the network is named once by name and once by id.
#[tokio::test]
async fn the_ccms_env_block_alone_routes_nodes_with_the_network_by_name_or_id() {
    let c = TestCluster::acquire().await.unwrap();
    let fake = FakeHcloud::start(FakeConfig::default()).await.unwrap();
    fake.add_network(NETWORK, "k8s-env", "10.0.0.0/8", &["10.0.0.0/16"]);
    for i in 0..4u64 {
        fake.add_server(
            300 + i,
            &format!("env-{i}"),
            NETWORK,
            &format!("10.0.3.{}", i + 2),
        );
    }
    let dir = TempDir::new("hcloud-env");
    let token = fake.token();
    let endpoint = fake.base_url();
    let node = |i: u64| {
        TestNode::new(format!("env-{i}"))
            .pod_cidrs([format!("10.244.{}.0/24", 200 + i)])
            .internal_ip(format!("10.0.3.{}", i + 2))
            .provider_id(format!("hcloud://{}", 300 + i))
    };
    for i in 0..2 {
        c.create_node(&node(i)).await.unwrap();
    }
    let routed = |n: usize| {
        let fake = &fake;
        async move { (fake.routes(NETWORK).len() == n).then_some(()) }
    };

    for (run, network, nodes) in [("by-name", "k8s-env", 2usize), ("by-id", "4711", 4)] {
        let ctl = start_with_ccm_env(
            &c,
            &dir,
            run,
            None,
            &[
                ("HCLOUD_TOKEN", &token),
                ("HCLOUD_NETWORK", network),
                ("HCLOUD_ENDPOINT", &endpoint),
            ],
        );
        if nodes == 4 {
            for i in 2..4 {
                c.create_node(&node(i)).await.unwrap();
            }
        }
        wait_until(
            Duration::from_secs(60),
            &format!("{nodes} routes, network {network}"),
            || routed(nodes),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
        let log = ctl.log_text();
        assert!(
            log.contains("hcloud-cloud-controller-manager environment")
                && log.contains("HCLOUD_NETWORK"),
            "the log names where the configuration came from: {log}"
        );
        assert_eq!(ctl.stop(), Some(0), "{log}");
    }
    let mut routes = fake.routes(NETWORK);
    routes.sort();
    let want: Vec<(String, String)> = (0..4)
        .map(|i| {
            (
                format!("10.244.{}.0/24", 200 + i),
                format!("10.0.3.{}", i + 2),
            )
        })
        .collect();
    assert_eq!(routes, want);
    assert_eq!(fake.count("add_route"), 4, "each route created once");
    assert_eq!(fake.count("delete_route"), 0);
}

#[tokio::test]
async fn hcloud_network_beside_a_yaml_network_or_with_routes_switched_off_refuses_to_start() {
    let c = TestCluster::acquire().await.unwrap();
    let fake = FakeHcloud::start(FakeConfig::default()).await.unwrap();
    fake.add_network(NETWORK, "k8s", "10.0.0.0/8", &["10.0.0.0/16"]);
    let dir = TempDir::new("hcloud-env-both");
    let config = write_config(&dir, &fake);
    let token = fake.token();
    let endpoint = fake.base_url();

    // HCLOUD_NETWORK and a YAML `network`: which one would win is not
    // guessed.
    let mut ctl = start_with_ccm_env(
        &c,
        &dir,
        "both",
        Some(&config),
        &[("HCLOUD_TOKEN", &token), ("HCLOUD_NETWORK", "k8s")],
    );
    let code = exit_code(&mut ctl);
    let log = ctl.log_text();
    assert!(code.is_some_and(|c| c != 0), "{code:?}: {log}");
    assert!(
        log.contains("`network` is set both by HCLOUD_NETWORK"),
        "the message names the key and the variable: {log}"
    );

    // The CCM's own switch for routes, copied along with the rest.
    let mut ctl = start_with_ccm_env(
        &c,
        &dir,
        "routes-off",
        None,
        &[
            ("HCLOUD_TOKEN", &token),
            ("HCLOUD_NETWORK", "k8s"),
            ("HCLOUD_ENDPOINT", &endpoint),
            ("HCLOUD_NETWORK_ROUTES_ENABLED", "false"),
        ],
    );
    let code = exit_code(&mut ctl);
    let log = ctl.log_text();
    assert!(code.is_some_and(|c| c != 0), "{code:?}: {log}");
    assert!(
        log.contains("routes are switched off in this environment"),
        "{log}"
    );
    assert_eq!(fake.total(), 0, "nothing reached the API: {log}");
}
