//! End to end on Azure: the binary with `--cloud-provider azure` against the
//! real API server and the stateful fake of ARM's `routeTables` resource
//! (whole-table `PUT` with `If-Match`, long-running operations of a second
//! each, ARM's throttling, a client-secret token from the fake's Entra
//! endpoint). A burst of 100 Nodes is a handful of `PUT`s; a second writer
//! that changes the table between the controller's read and its write gets
//! its route kept (the `412` is answered with a fresh read, not a lost
//! update); 10 deleted Nodes lose their routes in one or two `PUT`s; routes
//! that are not this cluster's survive every write and `cleanup`.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{Controller, TempDir, binary, cleanup_deletes, free_port, http_get, metric_sum};
use provider_azure::testing::{FakeAzure, FakeConfig};
use test_cluster::{TestCluster, TestNode, wait_until};

const TABLE: &str = "k8s-routes";
const NODES: u32 = 100;
const DELETED: u32 = 10;

fn ip(i: u32) -> String {
    format!("10.0.0.{}", 10 + i)
}

/// Our routes in the table: `(name, prefix, next hop)`, sorted.
fn ours(fake: &FakeAzure) -> Vec<(String, String, String)> {
    let mut v: Vec<(String, String, String)> = fake
        .routes(TABLE)
        .into_iter()
        .filter(|r| r.0.starts_with("az-"))
        .map(|(n, p, _, h)| (n, p, h))
        .collect();
    v.sort();
    v
}

fn expect(live: std::ops::Range<u32>) -> Vec<(String, String, String)> {
    let mut v: Vec<(String, String, String)> = live
        .map(|i| (format!("az-{i}"), format!("10.244.{i}.0/24"), ip(i)))
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_100_nodes_is_a_handful_of_puts_and_a_concurrent_writer_keeps_its_route() {
    let t0 = std::time::Instant::now();
    let c = TestCluster::acquire().await.expect("API server");
    let fake = FakeAzure::start(FakeConfig {
        // NRP operations take seconds; changes that arrive meanwhile wait
        // for the next write.
        operation_duration: Duration::from_secs(1),
        ..FakeConfig::default()
    })
    .await
    .expect("the fake starts");
    fake.add_table(TABLE);
    // Other tools' routes: a default route to a firewall in the hub network,
    // and a route with a Node-like name inside the cluster CIDR whose next
    // hop is outside the Nodes' subnet.
    fake.put_route(
        TABLE,
        "Default_Route",
        "0.0.0.0/0",
        "VirtualAppliance",
        Some("10.1.0.4"),
    );
    fake.put_route(
        TABLE,
        "hub-nva",
        "10.244.250.0/24",
        "VirtualAppliance",
        Some("10.1.0.5"),
    );

    let dir = TempDir::new("azure");
    let cfg = dir.path().join("azure.json");
    let mut doc: serde_json::Value =
        serde_json::from_str(&fake.cloud_config(TABLE)).expect("the fake's azure.json");
    doc["nodeSubnets"] = serde_json::json!(["10.0.0.0/24"]);
    std::fs::write(&cfg, doc.to_string()).expect("write the cloud config");
    let port = free_port();
    let metrics = format!("127.0.0.1:{port}");
    let mut ctl = Controller::start(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "azure",
            "--cloud-config",
            cfg.to_str().expect("utf-8 path"),
            "--leader-elect=false",
            "--metrics-bind-address",
            &metrics,
        ],
    );
    wait_until(
        Duration::from_secs(60),
        "the first list of the table",
        || async { (fake.count("get_table") > 0).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));

    // Another writer changes the table between the controller's read and
    // its first write.
    fake.put_route_before_next_put(
        TABLE,
        "peering",
        "10.50.0.0/16",
        "VirtualNetworkGateway",
        None,
    );
    // The first write's operation runs until the whole burst is in the API
    // server, however slow the machine: what arrives meanwhile must wait for
    // the next write instead of becoming writes of its own.
    fake.hold_operations(true);
    let burst = std::time::Instant::now();
    for i in 0..NODES {
        c.create_node(
            &TestNode::new(format!("az-{i}"))
                .pod_cidrs([format!("10.244.{i}.0/24")])
                .internal_ip(ip(i)),
        )
        .await
        .expect("create the test Node");
    }
    let created_in = burst.elapsed();
    wait_until(Duration::from_secs(60), "the first write", || async {
        (fake.count_status("put_table", 200) > 0).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    // Until the watch has delivered every Node (each creation triggers a
    // pass), however slow the machine: then they all wait for one write.
    wait_until(
        Duration::from_secs(60),
        "the watch to deliver every Node",
        || async {
            let (_, text) = http_get(&format!("http://{metrics}"), "/metrics")?;
            (metric_sum(
                &text,
                "route_controller_node_events_total",
                &["result=\"trigger\""],
            ) >= NODES as f64)
                .then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    fake.hold_operations(false);
    wait_until(
        Duration::from_secs(180),
        "100 Node routes in the table",
        || async { (ours(&fake) == expect(0..NODES)).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{:?}\n{}", fake.answers(), ctl.log_text()));
    let routed_in = burst.elapsed();
    let burst_puts = fake.count("put_table");
    let conflicts = fake.count_status("put_table", 412);
    eprintln!(
        "azure: {NODES} Nodes created in {created_in:?}, routed after {routed_in:?} with {burst_puts} PUTs ({conflicts} answered 412); requests {:?}",
        fake.answers()
    );
    assert!(
        burst_puts <= 4,
        "a burst of {NODES} Nodes took {burst_puts} whole-table PUTs: {:?}",
        fake.answers()
    );
    assert_eq!(
        conflicts, 1,
        "the second writer's change makes exactly one PUT stale"
    );
    let names: Vec<String> = fake.routes(TABLE).into_iter().map(|r| r.0).collect();
    for foreign in ["Default_Route", "hub-nva", "peering"] {
        assert!(
            names.iter().any(|n| n == foreign),
            "{foreign} was lost: {names:?}"
        );
    }

    let before = fake.count("put_table");
    for i in NODES - DELETED..NODES {
        c.delete_node(&format!("az-{i}"))
            .await
            .expect("delete Node");
    }
    wait_until(
        Duration::from_secs(120),
        "the 10 deleted Nodes' routes gone",
        || async { (ours(&fake) == expect(0..NODES - DELETED)).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let delete_puts = fake.count("put_table") - before;
    eprintln!("azure: {DELETED} deletions took {delete_puts} PUTs");
    assert!(
        (1..=3).contains(&delete_puts),
        "{DELETED} deletions took {delete_puts} PUTs"
    );
    assert_eq!(fake.with_status(429), 0, "the controller was throttled");

    let (code, body) = http_get(&format!("http://{metrics}"), "/metrics").expect("metrics");
    assert_eq!(code, 200);
    assert!(
        body.contains("route_controller_cloud_requests_total{provider=\"azure\""),
        "{body}"
    );
    assert!(ctl.is_running(), "{}", ctl.log_text());
    let log = ctl.log_text();
    assert!(
        !log.contains(&fake.config().client_secret),
        "the client secret is in the log"
    );
    assert_eq!(ctl.stop(), Some(0), "{log}");

    // The table takes one operation at a time: cleanup's write would be
    // refused while the controller's last one runs.
    wait_until(
        Duration::from_secs(30),
        "the last operation to end",
        || async { (!fake.operation_running(TABLE)).then_some(()) },
    )
    .await
    .expect("the operation ends");
    let cfg_path = cfg.to_str().expect("utf-8 path");
    let args = [
        "--cluster-cidr",
        "10.244.0.0/16",
        "--cloud-provider",
        "azure",
        "--cloud-config",
        cfg_path,
    ];
    cleanup_deletes(&args, &[], (NODES - DELETED) as usize).await;
    let mut left: Vec<String> = fake.routes(TABLE).into_iter().map(|r| r.0).collect();
    left.sort();
    assert_eq!(left, ["Default_Route", "hub-nva", "peering"]);
    eprintln!("azure e2e done after {:?}", t0.elapsed());
}

/// Workload identity (the projected token as client assertion), trace
/// logging, and failures whose messages reach logs and Events: neither the
/// federated token nor an ARM access token appears in the log, the Events
/// or `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workload_identity_secrets_never_appear_in_trace_logs_events_or_metrics() {
    let c = TestCluster::acquire().await.expect("API server");
    let fake = FakeAzure::start(FakeConfig::default())
        .await
        .expect("the fake starts");
    fake.add_table(TABLE);
    let dir = TempDir::new("azure-wi");
    let token_file = dir.path().join("azure-identity-token");
    let federated = fake.config().federated_token;
    std::fs::write(&token_file, &federated).expect("write the token file");
    let mut doc: serde_json::Value =
        serde_json::from_str(&fake.cloud_config(TABLE)).expect("the fake's azure.json");
    let obj = doc.as_object_mut().expect("an object");
    obj.remove("aadClientSecret");
    obj.insert(
        "useFederatedWorkloadIdentityExtension".into(),
        serde_json::json!(true),
    );
    obj.insert(
        "aadFederatedTokenFile".into(),
        serde_json::json!(token_file.to_str().expect("utf-8 path")),
    );
    let cfg = dir.path().join("azure.json");
    std::fs::write(&cfg, doc.to_string()).expect("write the cloud config");
    // Failures carry ARM's messages into logs and Events.
    fake.fail_next("put_table", 2, 500, "InternalServerError");
    let port = free_port();
    let metrics = format!("127.0.0.1:{port}");
    let log = dir.path().join("controller.log");
    let child = std::process::Command::new(binary())
        .arg("--kubeconfig")
        .arg(c.kubeconfig_path())
        .args([
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "azure",
            "--cloud-config",
            cfg.to_str().expect("utf-8 path"),
            "--leader-elect=false",
            "--metrics-bind-address",
            &metrics,
            "--secure-port",
            "0",
        ])
        .env("RUST_LOG", "trace")
        .env_remove("AZURE_CLIENT_SECRET")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("start cloud-route-controller");
    let ctl = Controller {
        child,
        log,
        metrics: None,
    };
    for i in 0..3u32 {
        c.create_node(
            &TestNode::new(format!("wi-{i}"))
                .pod_cidrs([format!("10.244.{}.0/24", 100 + i)])
                .internal_ip(ip(100 + i)),
        )
        .await
        .expect("create the test Node");
    }
    wait_until(
        Duration::from_secs(120),
        "3 routes after the 500s",
        || async { (fake.routes(TABLE).len() == 3).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{:?}\n{}", fake.answers(), ctl.log_text()));
    assert_eq!(
        fake.count_status("put_table", 500),
        2,
        "{:?}",
        fake.answers()
    );
    assert!(fake.count_status("token", 200) >= 1, "{:?}", fake.answers());
    let (code, body) = http_get(&format!("http://{metrics}"), "/metrics").expect("metrics");
    assert_eq!(code, 200);
    let mut events = String::new();
    for i in 0..3u32 {
        let ev = c.node_events(&format!("wi-{i}")).await.expect("events");
        events.push_str(&serde_json::to_string(&ev).expect("events as JSON"));
    }
    let text = ctl.log_text();
    assert!(
        text.len() > 10_000,
        "the trace log is too short to mean anything"
    );
    for (what, haystack) in [("log", &text), ("Events", &events), ("metrics", &body)] {
        assert!(
            !haystack.contains(&federated),
            "the federated token is in the {what}"
        );
        assert!(
            !haystack.contains("fake-arm-token-"),
            "an ARM access token is in the {what}"
        );
    }
    eprintln!(
        "azure workload identity: {} KB of trace log, {} KB of Events, {} KB of metrics searched",
        text.len() / 1024,
        events.len() / 1024,
        body.len() / 1024
    );
    assert_eq!(ctl.stop(), Some(0), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_nic_has_ip_forwarding_off_keeps_its_route_and_reads_forwarding_disabled() {
    let t0 = std::time::Instant::now();
    let c = TestCluster::acquire().await.expect("API server");
    let fake = FakeAzure::start(FakeConfig::default())
        .await
        .expect("the fake starts");
    fake.add_table(TABLE);
    // azf-0's NIC forwards; azf-1's was created without IP forwarding.
    let ids: Vec<String> = (0..2u32)
        .map(|i| fake.add_vm(&format!("azf-{i}"), &ip(200 + i)))
        .collect();
    assert!(fake.set_ip_forwarding("azf-1-nic", false));
    let dir = TempDir::new("azure-forwarding");
    let cfg = dir.path().join("azure.json");
    std::fs::write(&cfg, fake.cloud_config(TABLE)).expect("write the cloud config");
    let ctl = Controller::start(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "azure",
            "--cloud-config",
            cfg.to_str().expect("utf-8 path"),
            "--leader-elect=false",
            "--metrics-bind-address",
            "0",
        ],
    );
    for (i, id) in (0..2u32).zip(&ids) {
        c.create_node(
            &TestNode::new(format!("azf-{i}"))
                .pod_cidrs([format!("10.244.{}.0/24", 200 + i)])
                .internal_ip(ip(200 + i))
                .provider_id(id.clone()),
        )
        .await
        .expect("create the test Node");
    }
    wait_until(
        Duration::from_secs(120),
        "both Nodes routed, the one whose NIC cannot forward too",
        || async {
            let mut names: Vec<String> = fake.routes(TABLE).into_iter().map(|r| r.0).collect();
            names.sort();
            (names == ["azf-0", "azf-1"]).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let (on, off) = wait_until(
        Duration::from_secs(20),
        "azf-0 RouteCreated and azf-1 ForwardingDisabled",
        || async {
            let on = c.network_unavailable("azf-0").await.ok()??;
            let off = c.network_unavailable("azf-1").await.ok()??;
            (on.reason.as_deref() == Some("RouteCreated")
                && off.reason.as_deref() == Some("ForwardingDisabled"))
            .then_some((on, off))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    assert_eq!(on.status, "False", "{on:?}");
    assert_eq!(off.status, "True", "{off:?}");
    let warnings = |name: &'static str| {
        let c = &c;
        async move {
            c.node_events(name)
                .await
                .expect("events")
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("ForwardingDisabled"))
                .collect::<Vec<_>>()
        }
    };
    wait_until(
        Duration::from_secs(10),
        "azf-1's ForwardingDisabled Warning",
        || async { (!warnings("azf-1").await.is_empty()).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    // The passes that follow (Node updates, condition writes) must not
    // repeat it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events = warnings("azf-1").await;
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(e.count.unwrap_or(1), 1, "{e:?}");
    let message = e.message.as_deref().unwrap_or_default();
    assert!(
        message.contains("NIC azf-1-nic of VM azf-1 has enableIPForwarding false"),
        "{message}"
    );
    assert!(
        message.contains(
            "az network nic update --resource-group k8s-rg --name azf-1-nic --ip-forwarding true"
        ),
        "{message}"
    );
    assert!(warnings("azf-0").await.is_empty());
    // One read per VM and per NIC: the Node updates that followed cost none.
    assert_eq!(
        (fake.count("get_vm"), fake.count("get_nic")),
        (2, 2),
        "{:?}",
        fake.answers()
    );
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");
    eprintln!("azure forwarding: took {:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ccms_own_azure_json_with_its_load_balancer_keys_routes_nodes() {
    let c = TestCluster::acquire().await.expect("API server");
    let fake = FakeAzure::start(FakeConfig::default())
        .await
        .expect("the fake starts");
    fake.add_table(TABLE);
    let dir = TempDir::new("azure-ccm-json");
    // The fake's endpoints and credential, in a file shaped like the
    // example of cloud-provider-azure's config page: `tenantID` spelled
    // as there, the network's and the load balancer's keys beside the
    // route table's.
    let fakes: serde_json::Value =
        serde_json::from_str(&fake.cloud_config(TABLE)).expect("the fake's azure.json");
    let mut doc = serde_json::json!({
        "cloud": "AzurePublicCloud",
        "tenantID": fakes["tenantId"],
        "subscriptionId": fakes["subscriptionId"],
        "aadClientId": fakes["aadClientId"],
        "aadClientSecret": fakes["aadClientSecret"],
        "resourceGroup": fakes["resourceGroup"],
        "location": fakes["location"],
        "vmType": "standard",
        "subnetName": "nodes",
        "securityGroupName": "k8s-nsg",
        "securityGroupResourceGroup": fakes["resourceGroup"],
        "vnetName": "k8s-vnet",
        "vnetResourceGroup": "",
        "routeTableName": TABLE,
        "routeTableResourceGroup": fakes["resourceGroup"],
        "primaryAvailabilitySetName": "agentpool-as",
        "cloudProviderBackoff": true,
        "cloudProviderBackoffRetries": 6,
        "cloudProviderRateLimit": true,
        "cloudProviderRateLimitQPS": 10,
        "cloudProviderRateLimitBucket": 100,
        "useManagedIdentityExtension": false,
        "userAssignedIdentityID": "",
        "useInstanceMetadata": true,
        "loadBalancerSku": "Standard",
        "excludeMasterFromStandardLB": false,
        "maximumLoadBalancerRuleCount": 250,
        "routeUpdateIntervalInSeconds": 30,
        "routeTableCacheTTLInSeconds": 120,
        "cloudConfigType": "file",
    });
    // Where the fake listens (our keys: the CCM learns them from
    // resourceManagerEndpoint's metadata), and its quick operations.
    for key in [
        "resourceManagerEndpoint",
        "activeDirectoryAuthorityHost",
        "imdsEndpoint",
        "operationPollIntervalMs",
        "operationPollMaxMs",
    ] {
        doc[key] = fakes[key].clone();
    }
    let cfg = dir.path().join("azure.json");
    std::fs::write(
        &cfg,
        serde_json::to_string_pretty(&doc).expect("the azure.json"),
    )
    .expect("write the cloud config");
    let ctl = Controller::start(
        c.kubeconfig_path(),
        dir.path(),
        "controller",
        &[
            "--cluster-cidr",
            "10.244.0.0/16",
            "--cloud-provider",
            "azure",
            "--cloud-config",
            cfg.to_str().expect("utf-8 path"),
            "--leader-elect=false",
            "--metrics-bind-address",
            "0",
        ],
    );
    for i in 0..3u32 {
        c.create_node(
            &TestNode::new(format!("az-{i}"))
                .pod_cidrs([format!("10.244.{i}.0/24")])
                .internal_ip(ip(i)),
        )
        .await
        .expect("create the test Node");
    }
    wait_until(
        Duration::from_secs(30),
        "the three Nodes routed in the azure.json's table",
        || async { (ours(&fake) == expect(0..3)).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", ctl.log_text()));
    let log = ctl.log_text();
    // Keys of the route code upstream that do nothing here, one line each;
    // the load balancer's named once; no value of the file in the log.
    for said in [
        "useInstanceMetadata: ",
        "routeUpdateIntervalInSeconds: ",
        "location: ",
        "loadBalancerSku",
    ] {
        assert_eq!(log.matches(said).count(), 1, "{said}: {log}");
    }
    let secret = fakes["aadClientSecret"].as_str().expect("a secret");
    assert!(!log.contains(secret), "{log}");
    assert_eq!(ctl.stop(), Some(0), "{log}");
}
