//! The route quota, in process, on each provider's faithful server: the
//! real reconcile engine ([`route_controller::Controller`]), driven pass by
//! pass, against the stateful fakes of Hetzner Cloud, Compute Engine and
//! ARM, a real neutron-server and moto.
//!
//! Each test has room for [`ROOM`] routes and [`ROOM`] + [`WAITING`] Nodes:
//!
//! 1. the first pass routes [`ROOM`] Nodes; the [`WAITING`] others say
//!    `RouteQuotaExceeded` and get one `RouteQuotaExceeded` Warning each;
//! 2. two more passes send no creation the cloud refuses: a creation refused
//!    for room waits at least [`QUOTA_RETRY_FLOOR`] (or until a route is
//!    deleted), and a limit the provider knows refuses without a request;
//! 3. [`WAITING`] routed Nodes go: their routes are deleted in the next pass,
//!    and in the pass after it every waiting Node is routed.
//!
//! Where the limit comes from differs by provider. Hetzner Cloud and Compute
//! Engine have one route at a time and their providers know a higher limit,
//! so the quota answer is the cloud's (`403 resource_limit_exceeded`,
//! `403 quotaExceeded`). Azure and OpenStack write a table or router as one
//! batch, which the cloud refuses as a whole when it would not fit, so their
//! providers are told the server's limit and refuse the extra creations
//! themselves. Moto has no route limit: the test proxy in front of it
//! enforces one (`RouteLimitExceeded`), and the AWS provider is told it too,
//! so it refuses the extra creations without a request.
//!
//! Real time throughout (the fakes are HTTP servers); a scenario takes a
//! few seconds, far less than [`QUOTA_RETRY_FLOOR`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use route_cloud::CloudRoutes;
use route_controller::controller::Controller;
use route_controller::nodes::{NodeEvent, NodeStore};
use route_controller::retry::QUOTA_RETRY_FLOOR;
use route_controller::schedule::{Mode, PassKind, SyncTrigger};
use route_controller::status::RecordingStatusWriter;
use route_controller::testing::Fixture;
use route_controller::warnings::Reason;
use route_core::{Cidr, NetworkCondition, NodeAddress, NodeView};

/// Routes the cloud (or the provider's configured limit) has room for.
const ROOM: usize = 10;
/// Nodes beyond the room: they wait for it.
const WAITING: usize = 10;
/// Every Node of a scenario.
const NODES: usize = ROOM + WAITING;

/// The pod CIDR of Node `i`.
fn pod_cidr(i: usize) -> String {
    format!("10.244.{i}.0/24")
}

/// What a scenario reads from the cloud side.
trait CloudSide {
    /// The routes the server holds (the controller's only: no foreign ones
    /// are set up).
    async fn routes(&self) -> usize;
    /// Route writes the server refused for room, as its own counters (or,
    /// for a real server without them, the provider's) tell.
    fn refused(&self) -> u64;
    /// Every request the server counted, for the report.
    fn requests(&self) -> String;
}

/// Creation requests a provider saw refused with `QuotaExceeded` (its
/// request statistics, one per request sent).
fn refused_by_stats(cloud: &dyn CloudRoutes) -> u64 {
    cloud
        .stats()
        .snapshot()
        .into_iter()
        .filter(|((_, result), _)| *result == "quota_exceeded")
        .map(|(_, n)| n)
        .sum()
}

fn stats_text(cloud: &dyn CloudRoutes) -> String {
    format!("{:?}", cloud.stats().snapshot())
}

/// The controller in process over `cloud`, with `nodes` in its cache.
struct Rig {
    ctl: Controller,
    status: Arc<RecordingStatusWriter>,
    store: Arc<NodeStore>,
    nodes: Vec<NodeView>,
    passes: usize,
}

impl Rig {
    fn new(cluster: &str, cloud: Arc<dyn CloudRoutes>, nodes: Vec<NodeView>) -> Self {
        assert_eq!(nodes.len(), NODES);
        let mut fx = Fixture::new(Mode::Incremental, &nodes);
        fx.config.cluster_name = cluster.into();
        fx.config.status_concurrency = 4;
        Self {
            ctl: fx.controller(cloud),
            status: fx.status,
            store: fx.nodes,
            nodes,
            passes: 0,
        }
    }

    /// One pass: the first lists the cloud, the others plan against the
    /// cached table (the controller lists again when it needs to).
    async fn pass(&mut self) {
        let kind = if self.passes == 0 {
            PassKind::Full
        } else {
            PassKind::Cached
        };
        self.passes += 1;
        let r = self.ctl.pass(kind, SyncTrigger::NodeChange).await;
        assert!(
            r.list_error.is_none(),
            "pass {}: listing failed: {:?}",
            self.passes,
            r.list_error
        );
    }

    fn names_with(&self, names: &[String], cond: NetworkCondition) -> Vec<String> {
        names
            .iter()
            .filter(|n| self.status.condition_of(n) == Some(cond))
            .cloned()
            .collect()
    }

    fn all_names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name.clone()).collect()
    }

    /// `RouteQuotaExceeded` Warnings per Node.
    fn quota_warnings(&self) -> BTreeMap<String, usize> {
        let mut by_node = BTreeMap::new();
        for (node, reason, _) in self.status.recorded().events {
            if reason == Reason::RouteQuotaExceeded.as_str() {
                *by_node.entry(node.name).or_default() += 1;
            }
        }
        by_node
    }

    fn delete(&self, name: &str) {
        let view = self
            .nodes
            .iter()
            .find(|n| n.name == name)
            .expect("a Node of the scenario")
            .clone();
        self.store.apply(NodeEvent::Delete(view));
    }
}

/// The scenario of the module docs; returns the refused requests counted.
async fn scenario(provider: &str, mut rig: Rig, cloud: &impl CloudSide) -> u64 {
    let started = Instant::now();
    let all = rig.all_names();

    // 1. Room for ROOM routes: ROOM Nodes routed, WAITING told why, once.
    rig.pass().await;
    assert_eq!(
        cloud.routes().await,
        ROOM,
        "{provider}: the cloud holds as many routes as it has room for; {}",
        cloud.requests()
    );
    let routed = rig.names_with(&all, NetworkCondition::RouteCreated);
    let waiting = rig.names_with(&all, NetworkCondition::RouteQuotaExceeded);
    assert_eq!(routed.len(), ROOM, "{provider}: routed {routed:?}");
    assert_eq!(waiting.len(), WAITING, "{provider}: waiting {waiting:?}");
    let expected: BTreeMap<String, usize> = waiting.iter().map(|n| (n.clone(), 1)).collect();
    assert_eq!(
        rig.quota_warnings(),
        expected,
        "{provider}: one RouteQuotaExceeded Warning per waiting Node, on no other"
    );
    let refused_first = cloud.refused();

    // 2. Two more passes send nothing the cloud refuses. The bound over the
    //    whole test: at most one refused creation request per waiting Node
    //    (WAITING). A creation the cloud refused for room is not retried
    //    before QUOTA_RETRY_FLOOR (60 s, longer than this test) unless a
    //    deletion makes room, and then it fits; a creation refused by the
    //    provider's own limit is never sent at all.
    rig.pass().await;
    rig.pass().await;
    let refused_waiting = cloud.refused();
    assert!(
        refused_waiting <= WAITING as u64,
        "{provider}: {refused_waiting} refused requests for {WAITING} waiting Nodes; {}",
        cloud.requests()
    );
    assert_eq!(
        refused_waiting,
        refused_first,
        "{provider}: a pass within {QUOTA_RETRY_FLOOR:?} of the refusal sent the creation again; {}",
        cloud.requests()
    );
    assert_eq!(cloud.routes().await, ROOM, "{provider}");
    assert_eq!(
        rig.names_with(&all, NetworkCondition::RouteQuotaExceeded),
        waiting,
        "{provider}: the waiting Nodes still say why"
    );
    assert_eq!(
        rig.quota_warnings(),
        expected,
        "{provider}: waiting passes warn no more"
    );

    // 3. WAITING routed Nodes go: their routes are deleted in the next pass,
    //    and the room they leave is the waiting Nodes' in the pass after it:
    //    the deleting pass releases them from their quota backoff, and the
    //    loop runs that pass at once in incremental mode, one interval later
    //    in watch and periodic (timing.rs pins when).
    let leaving = &routed[..WAITING];
    for name in leaving {
        rig.delete(name);
    }
    rig.pass().await;
    // The leaving Nodes' routes are gone; waiting Nodes routed in the same
    // pass (if any) took their place.
    let routed_at_once = rig
        .names_with(&waiting, NetworkCondition::RouteCreated)
        .len();
    assert_eq!(
        cloud.routes().await,
        ROOM - leaving.len() + routed_at_once,
        "{provider}: the deleting pass; {}",
        cloud.requests()
    );
    let mut extra = 0;
    while rig
        .names_with(&waiting, NetworkCondition::RouteCreated)
        .len()
        < WAITING
    {
        extra += 1;
        assert!(
            extra <= 1,
            "{provider}: a pass after the deletions, still waiting: {:?}; {}",
            waiting
                .iter()
                .filter(|n| rig.status.condition_of(n) != Some(NetworkCondition::RouteCreated))
                .collect::<Vec<_>>(),
            cloud.requests()
        );
        rig.pass().await;
    }
    assert_eq!(
        cloud.routes().await,
        ROOM,
        "{provider}: the waiting Nodes' routes took the room; {}",
        cloud.requests()
    );
    let refused = cloud.refused();
    assert!(
        refused <= WAITING as u64,
        "{provider}: {refused} refused requests for {WAITING} waiting Nodes over the test; {}",
        cloud.requests()
    );
    assert_eq!(
        rig.quota_warnings(),
        expected,
        "{provider}: no Warning once routed"
    );
    eprintln!(
        "{provider}: refused creation requests: {refused} (after the first pass {refused_first}); \
         passes after the deletions until all were routed: {}; {} passes in {:?}; requests: {}",
        extra + 1,
        rig.passes,
        started.elapsed(),
        cloud.requests()
    );
    refused
}

// ---------------------------------------------------------------- hcloud

mod hcloud {
    use super::*;
    use provider_hcloud::testing::{FakeConfig, FakeHcloud};
    use provider_hcloud::{HcloudConfig, HcloudRoutes, Token};

    const NET: u64 = 4711;

    pub struct Side {
        pub fake: FakeHcloud,
        pub cloud: Arc<HcloudRoutes>,
    }

    impl CloudSide for Side {
        async fn routes(&self) -> usize {
            self.fake.routes(NET).len()
        }
        fn refused(&self) -> u64 {
            let answers = self.fake.answers();
            let by_fake = answers
                .get(&("add_route".to_string(), 403))
                .copied()
                .unwrap_or(0);
            assert_eq!(
                by_fake,
                refused_by_stats(&*self.cloud),
                "the fake's 403s and the provider's quota errors"
            );
            by_fake
        }
        fn requests(&self) -> String {
            format!("{:?} {:?}", self.fake.answers(), self.fake.requests())
        }
    }

    pub async fn setup() -> (Rig, Side) {
        let fake = FakeHcloud::start(FakeConfig {
            max_routes: ROOM,
            ..FakeConfig::default()
        })
        .await
        .expect("the fake Hetzner Cloud API starts");
        fake.add_network(NET, "k8s", "10.0.0.0/8", &["10.0.0.0/16"]);
        let nodes: Vec<NodeView> = (0..NODES)
            .map(|i| {
                let name = format!("hc-{i}");
                let ip = format!("10.0.0.{}", i + 2);
                let id = 1000 + i as u64;
                fake.add_server(id, &name, NET, &ip);
                NodeView::new(name.clone(), format!("uid-{name}"), &[&pod_cidr(i)])
                    .with_addresses(vec![NodeAddress::internal_ip(ip)])
                    .with_provider_id(format!("hcloud://{id}"))
            })
            .collect();
        let config = HcloudConfig {
            endpoint: fake.base_url(),
            action_poll_initial_ms: 10,
            action_poll_max_ms: 40,
            request_timeout_secs: 5,
            action_timeout_secs: 10,
            requests_per_hour: 3_600_000,
            keep_in_reserve: 0,
            ..HcloudConfig::for_network(NET.to_string())
        };
        let cloud = Arc::new(
            HcloudRoutes::new(config, Token::new(fake.token()).expect("a token"))
                .expect("a valid config"),
        );
        let limit = cloud.capabilities().max_routes;
        assert!(
            limit.is_none_or(|m| m > ROOM),
            "the provider's own limit ({limit:?}) is above the fake's, so the refusal is the API's"
        );
        let rig = Rig::new("quota", cloud.clone(), nodes);
        (rig, Side { fake, cloud })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hcloud_a_network_with_room_for_10_routes_and_20_nodes_routes_10_warns_10_once_and_routes_them_when_10_go()
 {
    let (rig, side) = hcloud::setup().await;
    let refused = scenario("hcloud", rig, &side).await;
    assert!(refused > 0, "the API refused the creations past its limit");
}

// ---------------------------------------------------------------- gce

mod gce {
    use super::*;
    use provider_gce::testing::{FakeConfig, FakeGce};
    use provider_gce::{GceConfig, GceRoutes};

    const NETWORK: &str = "k8s";
    const ZONE: &str = "europe-west1-b";

    pub struct Side {
        pub fake: FakeGce,
        pub cloud: Arc<GceRoutes>,
    }

    impl CloudSide for Side {
        async fn routes(&self) -> usize {
            self.fake.routes().len()
        }
        fn refused(&self) -> u64 {
            let by_fake = self
                .fake
                .answers()
                .get(&("insert".to_string(), 403))
                .copied()
                .unwrap_or(0);
            assert_eq!(
                by_fake,
                refused_by_stats(&*self.cloud),
                "the fake's 403s and the provider's quota errors"
            );
            by_fake
        }
        fn requests(&self) -> String {
            format!("{:?} {:?}", self.fake.answers(), self.fake.requests())
        }
    }

    pub async fn setup() -> (Rig, Side) {
        let fake = FakeGce::start(FakeConfig {
            max_routes: ROOM,
            ..FakeConfig::default()
        })
        .await
        .expect("the fake Compute Engine API starts");
        fake.add_network(NETWORK, false);
        let project = fake.project();
        let nodes: Vec<NodeView> = (0..NODES)
            .map(|i| {
                let name = format!("gce-{i}");
                fake.add_instance(ZONE, &name);
                NodeView::new(name.clone(), format!("uid-{name}"), &[&pod_cidr(i)])
                    .with_addresses(vec![NodeAddress::internal_ip(format!("10.0.0.{}", i + 2))])
                    .with_provider_id(format!("gce://{project}/{ZONE}/{name}"))
            })
            .collect();
        let config = GceConfig {
            endpoint: fake.endpoint(),
            anonymous: true,
            request_timeout_secs: 5,
            operation_timeout_secs: 10,
            operation_poll_min_ms: 20,
            operation_polls_per_second: 1000.0,
            operation_poll_burst: 100,
            quota_window_secs: 1,
            // Above the fake's quota: the refusal is the API's.
            max_routes: ROOM * 10,
            ..GceConfig::for_network(project, NETWORK)
        };
        let cloud = Arc::new(
            GceRoutes::connect(config)
                .await
                .expect("the provider connects"),
        );
        let rig = Rig::new("quota", cloud.clone(), nodes);
        (rig, Side { fake, cloud })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gce_a_network_with_room_for_10_routes_and_20_nodes_routes_10_warns_10_once_and_routes_them_when_10_go()
 {
    let (rig, side) = gce::setup().await;
    let refused = scenario("gce", rig, &side).await;
    assert!(refused > 0, "the API refused the creations past its quota");
}

// ---------------------------------------------------------------- azure

mod azure {
    use super::*;
    use provider_azure::testing::{FakeAzure, FakeConfig};
    use provider_azure::{AzureConfig, AzureRoutes};

    const TABLE: &str = "k8s-routes";

    pub struct Side {
        pub fake: FakeAzure,
        pub cloud: Arc<AzureRoutes>,
    }

    impl CloudSide for Side {
        async fn routes(&self) -> usize {
            self.fake.routes(TABLE).len()
        }
        fn refused(&self) -> u64 {
            // ARM refuses a table past its limit with `400 QuotaExceeded`;
            // no other 400 is expected here.
            let by_fake = self.fake.count_status("put_table", 400);
            assert_eq!(
                by_fake,
                refused_by_stats(&*self.cloud),
                "the fake's 400s and the provider's quota errors"
            );
            by_fake
        }
        fn requests(&self) -> String {
            format!("{:?}", self.fake.answers())
        }
    }

    pub async fn setup() -> (Rig, Side) {
        let fake = FakeAzure::start(FakeConfig {
            max_routes: ROOM,
            operation_duration: Duration::from_millis(20),
            ..FakeConfig::default()
        })
        .await
        .expect("the fake ARM starts");
        fake.add_table(TABLE);
        let nodes: Vec<NodeView> = (0..NODES)
            .map(|i| {
                let name = format!("az-{i}");
                let ip = format!("10.0.0.{}", i + 5);
                let provider_id = fake.add_vm(&name, &ip);
                NodeView::new(name.clone(), format!("uid-{name}"), &[&pod_cidr(i)])
                    .with_addresses(vec![NodeAddress::internal_ip(ip)])
                    .with_provider_id(provider_id)
            })
            .collect();
        let mut config = AzureConfig::from_yaml(&fake.cloud_config(TABLE)).expect("a config");
        // The table is written as a whole: the provider refuses what would
        // not fit rather than have ARM refuse the whole batch.
        config.max_routes = ROOM;
        let cloud = Arc::new(AzureRoutes::new(config).expect("a valid config"));
        let rig = Rig::new("quota", cloud.clone(), nodes);
        (rig, Side { fake, cloud })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_a_table_with_room_for_10_routes_and_20_nodes_routes_10_warns_10_once_and_routes_them_when_10_go()
 {
    let (rig, side) = azure::setup().await;
    let refused = scenario("azure", rig, &side).await;
    assert_eq!(
        refused, 0,
        "the provider's own limit sends nothing ARM refuses"
    );
}

// ---------------------------------------------------------------- openstack

mod openstack {
    use super::*;
    use provider_openstack::testing::{Admin, TestRouter, neutron_server};
    use provider_openstack::{OpenStackConfig, OpenStackRoutes};

    pub struct Side {
        pub admin: Admin,
        pub router: TestRouter,
        pub cloud: Arc<OpenStackRoutes>,
    }

    impl CloudSide for Side {
        async fn routes(&self) -> usize {
            self.admin
                .routes(&self.router.router_id)
                .await
                .expect("the router's routes")
                .0
                .len()
        }
        fn refused(&self) -> u64 {
            // Neutron keeps no request counters: the provider's statistics
            // count every answer it got.
            refused_by_stats(&*self.cloud)
        }
        fn requests(&self) -> String {
            stats_text(&*self.cloud)
        }
    }

    pub async fn setup() -> (Rig, Side) {
        let server = neutron_server().await.unwrap_or_else(|e| {
            panic!("a neutron-server is needed for this test (scripts/neutron.sh): {e}")
        });
        let admin = Admin::new(&server.url);
        let router = admin
            .create_router("quota", "10.20.0.0/24")
            .await
            .expect("a router");
        admin
            .set_route_quota(&router.project_id, ROOM as i64)
            .await
            .expect("the router route quota");
        let nodes: Vec<NodeView> = (0..NODES)
            .map(|i| {
                let name = format!("os-{i}");
                NodeView::new(name.clone(), format!("uid-{name}"), &[&pod_cidr(i)]).with_addresses(
                    vec![NodeAddress::internal_ip(format!("10.20.0.{}", 10 + i))],
                )
            })
            .collect();
        let mut config = OpenStackConfig::noauth(&server.url, &router.router_id);
        config.node_subnets = vec![Cidr::parse("10.20.0.0/24").expect("a CIDR")];
        // The router is written as a whole: the provider refuses what would
        // not fit rather than have Neutron refuse the whole update.
        config.max_routes = Some(ROOM);
        let cloud = Arc::new(OpenStackRoutes::new(config).expect("a valid config"));
        let rig = Rig::new("quota", cloud.clone(), nodes);
        (
            rig,
            Side {
                admin,
                router,
                cloud,
            },
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openstack_a_router_with_room_for_10_routes_and_20_nodes_routes_10_warns_10_once_and_routes_them_when_10_go()
 {
    let (rig, side) = openstack::setup().await;
    let refused = scenario("openstack", rig, &side).await;
    assert_eq!(
        refused, 0,
        "the provider's own limit sends nothing Neutron refuses"
    );
}

// ---------------------------------------------------------------- aws

mod aws {
    use super::*;
    use provider_aws::testing::{self, Instance, Network, Proxy};
    use provider_aws::{AwsConfig, Ec2Routes};

    pub struct Side {
        pub ec2: testing::Client,
        pub net: Network,
        pub instances: Vec<Instance>,
        pub proxy: Proxy,
        pub cloud: Arc<Ec2Routes>,
    }

    impl CloudSide for Side {
        async fn routes(&self) -> usize {
            testing::table_routes(&self.ec2, &self.net.route_table_id)
                .await
                .expect("the table's routes")
                .iter()
                .filter(|(_, target, _)| target.starts_with("i-"))
                .count()
        }
        fn refused(&self) -> u64 {
            // The proxy answers nothing but `RouteLimitExceeded` with an
            // error here.
            let by_proxy = self
                .proxy
                .counts()
                .get("CreateRoute")
                .map_or(0, |c| c.errors);
            assert_eq!(
                by_proxy,
                refused_by_stats(&*self.cloud),
                "the proxy's refusals and the provider's quota errors"
            );
            by_proxy
        }
        fn requests(&self) -> String {
            format!("{:?}", self.proxy.counts())
        }
    }

    pub async fn setup() -> (Rig, Side) {
        let endpoint = testing::moto_endpoint().await.unwrap_or_else(|e| {
            panic!("a moto server is needed for this test (scripts/moto.sh): {e}")
        });
        let ec2 = testing::client(&endpoint).await;
        let net = testing::create_network(&ec2, "10.30.0.0/16", None)
            .await
            .expect("a VPC");
        let instances = testing::run_instances(&ec2, &net, NODES as i32)
            .await
            .expect("instances");
        let nodes: Vec<NodeView> = instances
            .iter()
            .enumerate()
            .map(|(i, inst)| {
                let name = format!("aws-{i}");
                NodeView::new(name.clone(), format!("uid-{name}"), &[&pod_cidr(i)])
                    .with_provider_id(&inst.provider_id)
            })
            .collect();
        let proxy = Proxy::start(&endpoint).await.expect("the proxy starts");
        // Moto has no route limit: the proxy enforces one, and the provider
        // is told it. EC2's quota counts the table's local route too, so
        // room for ROOM Node routes is a quota of ROOM + 1.
        proxy.limit_routes(ROOM as u64 + 1);
        let config = AwsConfig {
            route_table_id: Some(net.route_table_id.clone()),
            max_routes: Some(ROOM + 1),
            ..AwsConfig::default()
        };
        let cloud = Arc::new(
            testing::provider(&proxy.url(), config)
                .await
                .expect("the provider"),
        );
        let cluster = testing::unique_cluster("quota");
        let rig = Rig::new(&cluster, cloud.clone(), nodes);
        (
            rig,
            Side {
                ec2,
                net,
                instances,
                proxy,
                cloud,
            },
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_a_table_with_room_for_10_routes_and_20_nodes_routes_10_warns_10_once_and_routes_them_when_10_go()
 {
    let (rig, side) = aws::setup().await;
    let refused = scenario("aws", rig, &side).await;
    assert_eq!(
        refused, 0,
        "the provider's own limit sends nothing EC2 refuses"
    );
    // The proxy's limit was there to refuse: one creation more is refused.
    let through_proxy = provider_aws::testing::client(&side.proxy.url()).await;
    let err = through_proxy
        .create_route()
        .route_table_id(&side.net.route_table_id)
        .destination_cidr_block("10.245.0.0/24")
        .instance_id(&side.instances[0].id)
        .send()
        .await
        .expect_err("the table is full");
    let err = format!("{err:?}");
    assert!(err.contains("RouteLimitExceeded"), "{err}");
}
