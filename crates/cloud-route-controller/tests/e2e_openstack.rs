//! End to end: the binary with `--cloud-provider openstack` against the real
//! API server and a real neutron-server (SQLite, noauth) with a router.

mod common;

use std::time::Duration;

use common::{Controller, TempDir, free_port, http_get, metric_sum};
use provider_openstack::testing::{Admin, Keystone, neutron_server};
use test_cluster::{TestCluster, TestNode, wait_until};

async fn router_routes(admin: &Admin, router: &str) -> Vec<(String, String)> {
    admin
        .routes(router)
        .await
        .map(|(r, _)| r)
        .unwrap_or_default()
}

fn config(dir: &TempDir, url: &str, router: &str, subnet: &str, extra: &str) -> std::path::PathBuf {
    let path = dir.path().join("openstack.yaml");
    std::fs::write(
        &path,
        format!(
            "auth_type: noauth\nendpoint: {url}\nrouter_id: {router}\nnode_subnets: [{subnet}]\n{extra}"
        ),
    )
    .expect("write the test fixture file");
    path
}

#[tokio::test]
async fn a_burst_of_50_nodes_is_one_router_update_and_deletions_follow() {
    let c = TestCluster::acquire().await.unwrap();
    let neutron = neutron_server().await.unwrap();
    let admin = Admin::new(&neutron.url);
    let router = admin
        .create_router("e2e-burst", "10.20.0.0/24")
        .await
        .unwrap();
    admin
        .set_route_quota(&router.project_id, 100)
        .await
        .unwrap();
    for i in 0..50 {
        c.create_node(
            &TestNode::new(format!("os-{i}"))
                .pod_cidrs([format!("10.244.{i}.0/24")])
                .internal_ip(format!("10.20.0.{}", 10 + i)),
        )
        .await
        .unwrap();
    }
    let dir = TempDir::new("openstack");
    let cfg = config(&dir, &neutron.url, &router.router_id, "10.20.0.0/24", "");
    let metrics = format!("127.0.0.1:{}", free_port());
    let ctl = Controller::start(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "openstack",
            "--cloud-config",
            cfg.to_str().unwrap(),
            "--leader-elect=false",
            "--metrics-bind-address",
            &metrics,
        ],
    );
    wait_until(
        Duration::from_secs(120),
        "50 routes on the router",
        || async { (router_routes(&admin, &router.router_id).await.len() == 50).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let scrape = || {
        http_get(&format!("http://{metrics}"), "/metrics")
            .unwrap()
            .1
    };
    let changing_passes = |m: &str| {
        metric_sum(
            m,
            "route_controller_route_sync_total",
            &["outcome=\"changed\""],
        )
    };
    // The routes are on the router before neutron's answer is counted: read
    // the count once the pass that sent it has ended.
    wait_until(
        Duration::from_secs(30),
        "the adding pass to end",
        || async { (changing_passes(&scrape()) >= 1.0).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let m = scrape();
    let adds = metric_sum(
        &m,
        "route_controller_cloud_requests_total",
        &["provider=\"openstack\"", "operation=\"add_extraroutes\""],
    );
    assert_eq!(adds, 1.0, "the burst of 50 went in one update call\n{m}");
    let routes = router_routes(&admin, &router.router_id).await;
    assert!(
        routes.contains(&("10.244.7.0/24".to_string(), "10.20.0.17".to_string())),
        "{routes:?}"
    );
    for i in 0..10 {
        c.delete_node(&format!("os-{i}")).await.unwrap();
    }
    wait_until(Duration::from_secs(60), "40 routes left", || async {
        (router_routes(&admin, &router.router_id).await.len() == 40).then_some(())
    })
    .await
    .unwrap();
    // The routes leave the router before the pass ends: it still removes
    // the pods' address pairs from the ports. A slow machine may split the
    // ten deletions over two passes: wait until the counts stand still.
    let counts = |m: &str| {
        (
            metric_sum(
                m,
                "route_controller_cloud_requests_total",
                &["provider=\"openstack\"", "operation=\"remove_extraroutes\""],
            ),
            changing_passes(m),
        )
    };
    let mut last = ((0.0, 0.0), std::time::Instant::now());
    wait_until(
        Duration::from_secs(60),
        "the deleting passes to end (counts unchanged for 3 s)",
        || {
            let now = counts(&scrape());
            if now != last.0 {
                last = (now, std::time::Instant::now());
            }
            let still = last.1.elapsed() >= Duration::from_secs(3);
            async move { (now.1 >= 2.0 && still).then_some(()) }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let m = scrape();
    let removes = metric_sum(
        &m,
        "route_controller_cloud_requests_total",
        &["provider=\"openstack\"", "operation=\"remove_extraroutes\""],
    );
    let changed = metric_sum(
        &m,
        "route_controller_route_sync_total",
        &["outcome=\"changed\""],
    );
    assert!(
        removes >= 1.0 && removes < changed,
        "one update per reconcile: {removes} removal calls for {changed} changing passes\n{m}"
    );
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");
}

#[tokio::test]
async fn the_routers_route_quota_gives_a_clear_warning() {
    let c = TestCluster::acquire().await.unwrap();
    let neutron = neutron_server().await.unwrap();
    let admin = Admin::new(&neutron.url);
    let router = admin
        .create_router("e2e-quota", "10.21.0.0/24")
        .await
        .unwrap();
    admin.set_route_quota(&router.project_id, 3).await.unwrap();
    for i in 0..5 {
        c.create_node(
            &TestNode::new(format!("oq-{i}"))
                .pod_cidrs([format!("10.244.{}.0/24", 100 + i)])
                .internal_ip(format!("10.21.0.{}", 10 + i)),
        )
        .await
        .unwrap();
    }
    let dir = TempDir::new("openstack-quota");
    // With the quota known, the controller fills the router up to it and
    // refuses the rest itself; without it Neutron refuses the whole batch.
    let cfg = config(
        &dir,
        &neutron.url,
        &router.router_id,
        "10.21.0.0/24",
        "max_routes: 3\n",
    );
    let ctl = Controller::start(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "openstack",
            "--cloud-config",
            cfg.to_str().unwrap(),
            "--leader-elect=false",
            "--metrics-bind-address",
            "0",
        ],
    );
    wait_until(
        Duration::from_secs(120),
        "3 routes, 2 quota warnings and 2 Nodes saying RouteQuotaExceeded",
        || async {
            let routes = router_routes(&admin, &router.router_id).await;
            let mut warned = 0;
            for i in 0..5 {
                let ev = c.node_events(&format!("oq-{i}")).await.ok()?;
                if ev.iter().any(|e| {
                    e.reason.as_deref() == Some("RouteQuotaExceeded")
                        && e.message
                            .as_deref()
                            .unwrap_or("")
                            .contains("at most 3 routes")
                }) {
                    warned += 1;
                }
            }
            // The Warning is posted before the status patch lands, so wait
            // for both.
            let mut waiting = 0;
            for i in 0..5 {
                let reason = c
                    .network_unavailable(&format!("oq-{i}"))
                    .await
                    .ok()?
                    .and_then(|c| c.reason);
                if reason.as_deref() == Some("RouteQuotaExceeded") {
                    waiting += 1;
                }
            }
            (routes.len() == 3 && warned == 2 && waiting == 2).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    // The two waiting Nodes say why, and were warned once each.
    let mut waiting = 0;
    for i in 0..5 {
        let name = format!("oq-{i}");
        let reason = c
            .network_unavailable(&name)
            .await
            .unwrap()
            .and_then(|c| c.reason);
        if reason.as_deref() == Some("RouteQuotaExceeded") {
            waiting += 1;
            let ev = c.node_events(&name).await.unwrap();
            let n: i32 = ev
                .iter()
                .filter(|e| e.reason.as_deref() == Some("RouteQuotaExceeded"))
                .map(|e| e.count.unwrap_or(1))
                .sum();
            assert_eq!(n, 1, "{name}: {ev:?}");
        }
    }
    assert_eq!(waiting, 2);
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");
}

/// The openstack-cloud-controller-manager's own `cloud.conf` (password auth
/// through Keystone, `[Route] router-id`, LB and metadata sections the
/// route code does not read), joined with our YAML for what cloud.conf
/// cannot say (the Nodes' subnet, the router's route quota): the Nodes are
/// routed on the real neutron-server, and a key set in both files is
/// refused before anything is sent.
#[tokio::test]
async fn the_openstack_ccms_cloud_conf_routes_nodes() {
    let c = TestCluster::acquire().await.unwrap();
    let neutron = neutron_server().await.unwrap();
    let admin = Admin::new(&neutron.url);
    let router = admin
        .create_router("e2e-cloudconf", "10.22.0.0/24")
        .await
        .unwrap();
    let keystone = Keystone::start(&neutron.url).await.unwrap();
    for i in 0..4 {
        c.create_node(
            &TestNode::new(format!("occm-{i}"))
                .pod_cidrs([format!("10.244.{}.0/24", 120 + i)])
                .internal_ip(format!("10.22.0.{}", 10 + i)),
        )
        .await
        .unwrap();
    }
    let dir = TempDir::new("openstack-cloud-conf");
    let cloud_conf = dir.path().join("cloud.conf");
    std::fs::write(
        &cloud_conf,
        format!(
            "[Global]\nauth-url = {}\nusername = \"k8s-ccm\"\npassword = \"pa;ss#word\"\n\
             tenant-name = demo\ndomain-name = Default\nregion = RegionOne\n\n\
             [LoadBalancer]\nfloating-network-id = 0b5f0a5e-0000-4000-8000-000000000001\n\n\
             [Route]\nrouter-id = {}\n\n[Metadata]\nsearch-order = configDrive,metadataService\n",
            keystone.auth_url, router.router_id
        ),
    )
    .unwrap();
    let ours = dir.path().join("routes.yaml");
    std::fs::write(&ours, "node_subnets: [10.22.0.0/24]\nmax_routes: 50\n").unwrap();
    let ctl = Controller::start(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "openstack",
            "--cloud-config",
            cloud_conf.to_str().unwrap(),
            "--cloud-config",
            ours.to_str().unwrap(),
            "--leader-elect=false",
            "--metrics-bind-address",
            "0",
        ],
    );
    wait_until(
        Duration::from_secs(120),
        "4 routes on the router",
        || async { (router_routes(&admin, &router.router_id).await.len() == 4).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let routes = router_routes(&admin, &router.router_id).await;
    assert!(
        routes.contains(&("10.244.122.0/24".to_string(), "10.22.0.12".to_string())),
        "{routes:?}"
    );
    let sent = keystone.requests();
    assert!(!sent.is_empty());
    let identity = &sent[0]["auth"];
    assert_eq!(identity["identity"]["password"]["user"]["name"], "k8s-ccm");
    assert_eq!(
        identity["identity"]["password"]["user"]["password"],
        "pa;ss#word"
    );
    assert_eq!(identity["scope"]["project"]["name"], "demo");
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");
    assert!(log.contains("cloud-provider-openstack cloud.conf"), "{log}");
    assert!(
        !log.contains("pa;ss#word"),
        "the password never reaches the log"
    );

    // The router set in both files: refused, naming both.
    std::fs::write(&ours, format!("router_id: {}\n", router.router_id)).unwrap();
    let out = std::process::Command::new(common::binary())
        .args([
            "plan",
            "--kubeconfig",
            c.kubeconfig_path().to_str().unwrap(),
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "openstack",
            "--cloud-config",
            cloud_conf.to_str().unwrap(),
            "--cloud-config",
            ours.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("`router_id` is set both by [Route] router-id"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_pair_removed_from_a_nodes_port_is_back_within_the_drift_period_in_incremental() {
    // Regression: in the default mode nothing looked at the ports again
    // before the resync, 12-24 h later, while the Node read RouteCreated.
    let c = TestCluster::acquire().await.unwrap();
    let neutron = neutron_server().await.unwrap();
    let admin = Admin::new(&neutron.url);
    let router = admin
        .create_router("e2e-drift-pair", "10.21.0.0/24")
        .await
        .unwrap();
    let ports = admin
        .create_ports(
            &router,
            &[
                (
                    "os-pair-0".into(),
                    "10.21.0.10".into(),
                    serde_json::json!([]),
                ),
                (
                    "os-pair-1".into(),
                    "10.21.0.11".into(),
                    serde_json::json!([]),
                ),
            ],
        )
        .await
        .unwrap();
    for i in 0..2 {
        c.create_node(
            &TestNode::new(format!("os-pair-{i}"))
                .pod_cidrs([format!("10.244.{}.0/24", 210 + i)])
                .internal_ip(format!("10.21.0.{}", 10 + i)),
        )
        .await
        .unwrap();
    }
    let dir = TempDir::new("openstack-drift");
    let cfg = config(&dir, &neutron.url, &router.router_id, "10.21.0.0/24", "");
    let ctl = Controller::start(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "openstack",
            "--cloud-config",
            cfg.to_str().unwrap(),
            "--leader-elect=false",
            "--metrics-bind-address",
            "0",
            "--route-drift-check-period",
            "8s",
        ],
    );
    let pod = "10.244.210.0/24".to_string();
    wait_until(
        Duration::from_secs(90),
        "both pairs on the ports",
        || async {
            let a = admin.pair_ips(&ports[0]).await.ok()?;
            let b = admin.pair_ips(&ports[1]).await.ok()?;
            (a.contains(&pod) && b.contains(&"10.244.211.0/24".to_string())).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    // Another tool rewrites the port's pairs without ours.
    admin
        .set_pairs(&ports[0], serde_json::json!([]))
        .await
        .unwrap();
    let removed = std::time::Instant::now();
    wait_until(
        Duration::from_secs(8 + 12),
        "the pair back within the drift period plus one pass",
        || async {
            admin
                .pair_ips(&ports[0])
                .await
                .ok()?
                .contains(&pod)
                .then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    eprintln!("the removed pair was back after {:?}", removed.elapsed());
    assert_eq!(router_routes(&admin, &router.router_id).await.len(), 2);
    let cond = c.network_unavailable("os-pair-0").await.unwrap().unwrap();
    assert_eq!(cond.reason.as_deref(), Some("RouteCreated"));
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");
    for i in 0..2 {
        c.delete_node(&format!("os-pair-{i}")).await.unwrap();
    }
}
