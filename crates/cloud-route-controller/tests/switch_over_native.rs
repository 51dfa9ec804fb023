//! The switch-over of docs/switching-over.md for the clouds whose
//! cloud-controller-manager is not built here (OpenStack, GCE, Azure):
//! tests/switch_over.rs runs the real upstream route controller for AWS and
//! Hetzner, so here the test itself leaves the cloud and the Nodes as each
//! CCM's route controller leaves them — its route naming and marks, its
//! forwarding step, `NetworkUnavailable=False/RouteCreated` patched as
//! `k8s.io/cloud-provider`'s route controller patches it — and then runs the
//! same steps:
//!
//! 1. `plan` with the same configuration shows no change;
//! 2. a `--dry-run` shadow agrees (`route_controller_dry_run_agreeing` 1
//!    after at least 3 passes, never a `dry run: would` line);
//! 3. this controller, writing (the CCM's route controller off), makes at
//!    least 3 passes and calls every Node `RouteCreated`;
//!
//! and through all three not one mutating request reaches the cloud, as
//! counted by the cloud's side (neutron-server behind provider-openstack's
//! counting proxy; the GCE and Azure fakes' own counters), and the routes
//! are exactly as the CCM left them.
//!
//! What each CCM leaves, from its source:
//!
//! - cloud-provider-openstack (`pkg/openstack/routes.go`, `CreateRoute`):
//!   a router `routes` entry `{destination: pod CIDR, nexthop: the Node's
//!   InternalIP}`, and the pod CIDR as an allowed-address pair
//!   `{ip_address: pod CIDR}` on the Node's port (Neutron fills in the
//!   port's MAC); configured by its `cloud.conf` (`[Global]` Keystone
//!   password auth, `[Route] router-id`), which is what this controller is
//!   given too.
//! - cloud-provider-gcp (`providers/gce/gce_routes.go`, `CreateRoute`): name
//!   `truncateClusterName(cluster)` (its first 26 characters) `+ "-" +` the
//!   Node's UID (the route controller's name hint), description
//!   `k8s-node-route`, priority 1000, the network's URL, `nextHopInstance`
//!   the instance's URL.
//! - cloud-provider-azure (`pkg/provider/azure_routes.go`, `CreateRoute`):
//!   name `<node>____<pod CIDR without : . />` (`NewCloud` sets
//!   `ipv6DualStackEnabled` always, so this is the only format it writes),
//!   next hop type `VirtualAppliance` to the VM's primary IP, the Node's
//!   InternalIP; configured by its `azure.json`.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::TempDir;
use common::switch::{CLUSTER_CIDR, plan, run_ours, shadow_agrees};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use provider_azure::testing::{FakeAzure, FakeConfig as AzureConfig};
use provider_gce::testing::{FakeConfig as GceConfig, FakeGce, FakeRoute};
use provider_openstack::testing::{Admin, Keystone, Proxy, neutron_server};
use test_cluster::{ClusterGuard, TestCluster, TestNode};

/// Nodes in each cluster.
const NODES: usize = 10;

fn pod_cidr(i: usize) -> String {
    format!("10.244.{i}.0/24")
}

/// Requests the cloud received so far, by kind (an endpoint of a fake, or
/// `METHOD /path` at the Neutron proxy).
type Counts = BTreeMap<String, u64>;

/// The cloud's side of the count: what it received, and which of it
/// changes something.
struct Cloud<'a> {
    counts: &'a dyn Fn() -> Counts,
    mutating: fn(&str) -> bool,
    /// The request each pass lists the routes with: the writing
    /// controller must have looked at the routes, not skipped them.
    listing: String,
}

/// What arrived between two readings of the counters.
fn since(after: &Counts, before: &Counts) -> Counts {
    after
        .iter()
        .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// The mutating part of `sent`.
fn writes(cloud: &Cloud<'_>, sent: &Counts) -> Counts {
    sent.iter()
        .filter(|(k, _)| (cloud.mutating)(k))
        .map(|(k, n)| (k.clone(), *n))
        .collect()
}

/// What each step sent to the cloud.
struct Sent {
    plan: Counts,
    shadow: Counts,
    ours: Counts,
    ours_took: Duration,
}

/// Creates the Node and patches its `NetworkUnavailable` as upstream's
/// route controller does once the Node's route exists (`updateNetworkingCondition`
/// through `nodeutil.SetNodeCondition`: a strategic-merge patch of
/// `nodes/status` with the heartbeat set to now). Its UID.
async fn create_routed_node(c: &ClusterGuard, node: &TestNode) -> String {
    let created = c.create_node(node).await.expect("create the Node");
    let name = created.metadata.name.clone().expect("a Node has a name");
    let now = Time(Timestamp::now());
    let patch = serde_json::json!({"status": {"conditions": [{
        "type": "NetworkUnavailable",
        "status": "False",
        "reason": "RouteCreated",
        "message": "RouteController created a route",
        "lastTransitionTime": now,
        "lastHeartbeatTime": now,
    }]}});
    c.nodes()
        .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .expect("patch the Node's NetworkUnavailable");
    created.metadata.uid.expect("a created Node has a UID")
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

/// Steps 2 to 5 of docs/switching-over.md on a cluster whose routes and
/// conditions the CCM made: `plan`, the shadow, the CCM's route controller
/// off (nothing of it runs here), this controller writing. Each step sends
/// no mutating request; what each sent.
async fn plan_shadow_and_take_over(
    c: &ClusterGuard,
    dir: &TempDir,
    cloud: &Cloud<'_>,
    names: &[String],
    args: &[&str],
    env: &[(&str, &str)],
) -> Sent {
    let before = (cloud.counts)();
    let shown = plan(
        c.kubeconfig_path(),
        &[args, &["--cluster-cidr", CLUSTER_CIDR]].concat(),
        env,
    )
    .await;
    assert!(
        shown.contains(&format!("{NODES} nodes, {NODES} cloud routes"))
            && shown.contains("no change needed"),
        "plan, with the CCM's routes in place:\n{shown}"
    );
    let after_plan = (cloud.counts)();
    let by_plan = since(&after_plan, &before);
    assert_eq!(
        writes(cloud, &by_plan),
        Counts::new(),
        "plan only reads: {by_plan:?}"
    );

    shadow_agrees(c, dir, args, env).await;
    let after_shadow = (cloud.counts)();
    let by_shadow = since(&after_shadow, &after_plan);
    assert_eq!(
        writes(cloud, &by_shadow),
        Counts::new(),
        "the shadow changed the cloud: {by_shadow:?}"
    );

    let (ctl, ours_took) = run_ours(c, dir, args, env, NODES).await;
    let log = ctl.log_text();
    assert_eq!(ctl.stop(), Some(0), "{log}");
    let by_ours = since(&(cloud.counts)(), &after_shadow);
    assert_eq!(
        writes(cloud, &by_ours),
        Counts::new(),
        "this controller changed what the CCM made: {by_ours:?}\n{log}"
    );
    assert!(
        by_ours.get(&cloud.listing).copied().unwrap_or(0) >= 3,
        "it listed the routes ({}) on every pass: {by_ours:?}",
        cloud.listing
    );
    assert!(
        all_route_created(c, names).await,
        "every Node still RouteCreated"
    );
    Sent {
        plan: by_plan,
        shadow: by_shadow,
        ours: by_ours,
        ours_took,
    }
}

/// A Neutron port's revision: any update of the port raises it.
async fn port_revision(admin: &Admin, port: &str) -> u64 {
    admin.port(port).await.expect("read the port")["revision_number"]
        .as_u64()
        .expect("the port has a revision_number")
}

/// The router's routes sorted, its revision, and each port's pairs and
/// revision: what a write to any of them would change.
async fn neutron_state(
    admin: &Admin,
    router: &str,
    ports: &[String],
) -> (Vec<(String, String)>, u64, Vec<(Vec<String>, u64)>) {
    let (mut routes, revision) = admin.routes(router).await.expect("read the router");
    routes.sort();
    let mut of_ports = Vec::new();
    for p in ports {
        of_ports.push((
            admin.pair_ips(p).await.expect("read the port's pairs"),
            port_revision(admin, p).await,
        ));
    }
    (routes, revision, of_ports)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openstack_routes_made_as_the_ccm_makes_them_are_shadowed_planned_and_taken_over_with_no_write()
 {
    let c = TestCluster::acquire().await.unwrap();
    // Timed from here: the tests of this file hold the cluster in turn.
    let began = Instant::now();
    let neutron = neutron_server().await.unwrap();
    let admin = Admin::new(&neutron.url);
    let router = admin
        .create_router("switch-native", "10.30.0.0/24")
        .await
        .unwrap();
    let names: Vec<String> = (0..NODES).map(|i| format!("so-os-{i}")).collect();
    let ip = |i: usize| format!("10.30.0.{}", 10 + i);
    let server = |i: usize| format!("5e7e0000-0000-4000-8000-{:012x}", i + 1);
    // The CCM's forwarding step: the pod CIDR as a pair of the port that
    // holds the next hop, given as `{ip_address}` only.
    let ports = admin
        .create_ports(
            &router,
            &(0..NODES)
                .map(|i| {
                    (
                        server(i),
                        ip(i),
                        serde_json::json!([{"ip_address": pod_cidr(i)}]),
                    )
                })
                .collect::<Vec<_>>(),
        )
        .await
        .unwrap();
    let routes: Vec<(String, String)> = (0..NODES).map(|i| (pod_cidr(i), ip(i))).collect();
    admin
        .add_routes(
            &router.router_id,
            &routes
                .iter()
                .map(|(d, n)| (d.as_str(), n.as_str()))
                .collect::<Vec<_>>(),
        )
        .await
        .unwrap();
    for (i, name) in names.iter().enumerate() {
        create_routed_node(
            &c,
            &TestNode::new(name)
                .pod_cidrs([pod_cidr(i)])
                .internal_ip(ip(i))
                .provider_id(format!("openstack:///{}", server(i))),
        )
        .await;
    }
    let made = neutron_state(&admin, &router.router_id, &ports).await;
    let mut want = routes.clone();
    want.sort();
    assert_eq!(made.0, want, "the CCM's routes on the router");
    for (i, (pairs, _)) in made.2.iter().enumerate() {
        assert_eq!(pairs, &vec![pod_cidr(i)], "the CCM's pair on port {i}");
    }

    // Every Neutron request of plan, the shadow and ours passes the proxy:
    // the CCM's cloud.conf names Keystone, whose catalog names the proxy.
    let proxy = Proxy::start(&neutron.url).await.unwrap();
    let keystone = Keystone::start(&proxy.url()).await.unwrap();
    let dir = TempDir::new("switch-openstack");
    let cloud_conf = dir.path().join("cloud.conf");
    std::fs::write(
        &cloud_conf,
        format!(
            "[Global]\nauth-url = {}\nusername = \"k8s-ccm\"\npassword = \"secret\"\n\
             tenant-name = demo\ndomain-name = Default\nregion = RegionOne\n\n\
             [Route]\nrouter-id = {}\n",
            keystone.auth_url, router.router_id
        ),
    )
    .unwrap();
    let args = [
        "--cloud-provider",
        "openstack",
        "--cloud-config",
        cloud_conf.to_str().unwrap(),
    ];
    let counts = || proxy.counts();
    let cloud = Cloud {
        counts: &counts,
        mutating: |k| !(k.starts_with("GET ") || k.starts_with("HEAD ")),
        listing: format!("GET /v2.0/routers/{}", router.router_id),
    };
    let sent = plan_shadow_and_take_over(&c, &dir, &cloud, &names, &args, &[]).await;
    eprintln!(
        "switch-over on neutron-server, {NODES} Nodes in {:?}: plan sent {:?}; the shadow {:?}; \
         ours ran {:?} and sent {:?}; Keystone token requests {}",
        began.elapsed(),
        sent.plan,
        sent.shadow,
        sent.ours_took,
        sent.ours,
        keystone.requests().len()
    );
    assert!(
        sent.ours.keys().any(|k| k.starts_with("GET /v2.0/ports")),
        "it read the ports' pairs: {:?}",
        sent.ours
    );
    assert_eq!(
        neutron_state(&admin, &router.router_id, &ports).await,
        made,
        "the router and the ports are as the CCM left them (routes, pairs, revisions)"
    );
}

const GCE_NETWORK: &str = "k8s";
const GCE_ZONE: &str = "europe-west1-b";
/// Longer than the 26 characters upstream keeps of it in route names.
const GCE_CLUSTER: &str = "switch-over-cluster-europe-west1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gce_routes_made_as_the_ccm_makes_them_are_shadowed_planned_and_taken_over_with_no_write() {
    let c = TestCluster::acquire().await.unwrap();
    // Timed from here: the tests of this file hold the cluster in turn.
    let began = Instant::now();
    let fake = FakeGce::start(GceConfig::default()).await.unwrap();
    fake.add_network(GCE_NETWORK, false);
    let names: Vec<String> = (0..NODES).map(|i| format!("so-gce-{i}")).collect();
    // upstream's truncateClusterName, spelled here rather than taken from
    // the provider, whose reading of it is what is under test.
    let prefix = &GCE_CLUSTER[..26];
    for (i, name) in names.iter().enumerate() {
        fake.add_instance(GCE_ZONE, name);
        let uid = create_routed_node(
            &c,
            &TestNode::new(name)
                .pod_cidrs([pod_cidr(i)])
                .internal_ip(format!("10.0.0.{}", i + 2))
                .provider_id(format!("gce://{}/{GCE_ZONE}/{name}", fake.project())),
        )
        .await;
        fake.insert_route(
            &format!("{prefix}-{uid}"),
            GCE_NETWORK,
            &pod_cidr(i),
            Some(&fake.instance_url(GCE_ZONE, name)),
            "k8s-node-route",
        );
    }
    let made = fake.routes();
    assert_eq!(made.len(), NODES, "{made:?}");
    for r in &made {
        assert_eq!(r.name.len(), 63, "the longest name GCE takes: {r:?}");
        assert_eq!(r.priority, 1000, "{r:?}");
        assert_eq!(r.network, fake.network_url(GCE_NETWORK), "{r:?}");
    }

    let dir = TempDir::new("switch-gce");
    let config = dir.path().join("gce.yaml");
    std::fs::write(
        &config,
        format!(
            "project: {}\nnetwork: {GCE_NETWORK}\nendpoint: {}\nanonymous: true\n",
            fake.project(),
            fake.endpoint(),
        ),
    )
    .unwrap();
    let args = [
        "--cluster-name",
        GCE_CLUSTER,
        "--cloud-provider",
        "gce",
        "--cloud-config",
        config.to_str().unwrap(),
    ];
    let counts = || fake.requests();
    let cloud = Cloud {
        counts: &counts,
        mutating: |k| matches!(k, "insert" | "delete"),
        listing: "list".into(),
    };
    let sent = plan_shadow_and_take_over(&c, &dir, &cloud, &names, &args, &[]).await;
    eprintln!(
        "switch-over on the GCE fake, {NODES} Nodes in {:?}: plan sent {:?}; the shadow {:?}; \
         ours ran {:?} and sent {:?}",
        began.elapsed(),
        sent.plan,
        sent.shadow,
        sent.ours_took,
        sent.ours
    );
    let now: Vec<FakeRoute> = fake.routes();
    assert_eq!(
        now, made,
        "the routes are the CCM's, not re-created (same ids and creation times)"
    );
}

const AZURE_TABLE: &str = "k8s-routes";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_routes_made_as_the_ccm_makes_them_are_shadowed_planned_and_taken_over_with_no_write()
{
    let c = TestCluster::acquire().await.unwrap();
    // Timed from here: the tests of this file hold the cluster in turn.
    let began = Instant::now();
    let fake = FakeAzure::start(AzureConfig::default()).await.unwrap();
    fake.add_table(AZURE_TABLE);
    let names: Vec<String> = (0..NODES).map(|i| format!("so-az-{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        let ip = format!("10.0.0.{}", 10 + i);
        let provider_id = fake.add_vm(name, &ip);
        create_routed_node(
            &c,
            &TestNode::new(name)
                .pod_cidrs([pod_cidr(i)])
                .internal_ip(&ip)
                .provider_id(provider_id),
        )
        .await;
        // upstream's cidrtoRfc1035, spelled here rather than taken from the
        // provider, whose reading of it is what is under test.
        let cidr = pod_cidr(i);
        let spelled: String = cidr.chars().filter(|c| !":./".contains(*c)).collect();
        fake.put_route(
            AZURE_TABLE,
            &format!("{name}____{spelled}"),
            &cidr,
            "VirtualAppliance",
            Some(&ip),
        );
    }
    let made = fake.routes(AZURE_TABLE);
    let etag = fake.etag(AZURE_TABLE);
    assert_eq!(made.len(), NODES, "{made:?}");
    assert!(
        made.iter().any(|r| r.0 == "so-az-3____102443024"),
        "{made:?}"
    );

    let dir = TempDir::new("switch-azure");
    let config = dir.path().join("azure.json");
    std::fs::write(&config, fake.cloud_config(AZURE_TABLE)).unwrap();
    let args = [
        "--cloud-provider",
        "azure",
        "--cloud-config",
        config.to_str().unwrap(),
    ];
    let counts = || {
        let mut by = Counts::new();
        for ((endpoint, _), n) in fake.answers() {
            *by.entry(endpoint).or_default() += n;
        }
        by
    };
    let cloud = Cloud {
        counts: &counts,
        mutating: |k| k == "put_table",
        listing: "get_table".into(),
    };
    let sent = plan_shadow_and_take_over(&c, &dir, &cloud, &names, &args, &[]).await;
    eprintln!(
        "switch-over on the Azure fake, {NODES} Nodes in {:?}: plan sent {:?}; the shadow {:?}; \
         ours ran {:?} and sent {:?}",
        began.elapsed(),
        sent.plan,
        sent.shadow,
        sent.ours_took,
        sent.ours
    );
    assert_eq!(
        fake.routes(AZURE_TABLE),
        made,
        "the table is as the CCM left it"
    );
    assert_eq!(
        fake.etag(AZURE_TABLE),
        etag,
        "the table was not written at all"
    );
}
