//! The AWS EC2 provider: pod-CIDR routes in one VPC route table, each pointing
//! at a node's instance.
//!
//! This crate owns everything EC2-specific: finding the route table, mapping
//! instances to nodes, the per-action request budget and the classification
//! of EC2's error codes. It decides nothing about which routes should exist.
//!
//! Requests per operation (with the defaults and a warm cache):
//! - list: 1 `DescribeRouteTables` (by id, or filtered by the cluster tag;
//!   never unfiltered). No `DescribeInstances`: instances map to nodes
//!   through the Nodes' `spec.providerID` ([`CloudRoutes::observe_nodes`]).
//! - create: 1 `CreateRoute` (or `ReplaceRoute` over a blackhole), plus one
//!   `ModifyInstanceAttribute SourceDestCheck=false` the first time this
//!   process routes to an instance.
//! - delete: 1 `DeleteRoute`.
//!
//! The SDK's own retries are off: every request goes through this crate's
//! token buckets and counters exactly once, throttling pauses the bucket of
//! the throttled action, and the controller's backoff owns retrying. Two
//! retry layers would multiply requests under throttling and hide the real
//! request count.

mod config;
mod error;
mod index;
#[cfg(feature = "testing")]
pub mod testing;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_ec2::Client;
use aws_sdk_ec2::config::retry::RetryConfig;
use aws_sdk_ec2::config::timeout::TimeoutConfig;
use aws_sdk_ec2::types::{AttributeBooleanValue, Filter, RouteState, RouteTable};
use route_cloud::ratelimit::TokenBucket;
use route_cloud::{Capabilities, CloudError, CloudRoutes, ErrorKind, RequestStats};
use route_core::{Cidr, Destination, NodeView, Route, TargetNeeds};
use tracing::{debug, info, warn};

pub use config::{AwsConfig, Budget, ConfigError, RateLimitConfig};
pub use error::{classify, kind_of_code};
pub use index::{NodeIndex, instance_id_from_provider_id, is_instance_id};

/// Sets the IPv4 or IPv6 destination of a route request builder.
macro_rules! with_destination {
    ($builder:expr, $dest:expr) => {{
        let d: &Cidr = $dest;
        if d.network().is_ipv6() {
            $builder.destination_ipv6_cidr_block(d.to_string())
        } else {
            $builder.destination_cidr_block(d.to_string())
        }
    }};
}

/// The tag key that marks a cluster's route table (any value).
pub fn cluster_tag_key(cluster: &str) -> String {
    format!("kubernetes.io/cluster/{cluster}")
}

/// The EC2 actions this provider calls; each has its own budget, as in EC2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    DescribeRouteTables,
    DescribeInstances,
    CreateRoute,
    ReplaceRoute,
    DeleteRoute,
    ModifyInstanceAttribute,
}

impl Op {
    const ALL: [Op; 6] = [
        Op::DescribeRouteTables,
        Op::DescribeInstances,
        Op::CreateRoute,
        Op::ReplaceRoute,
        Op::DeleteRoute,
        Op::ModifyInstanceAttribute,
    ];

    fn name(self) -> &'static str {
        match self {
            Op::DescribeRouteTables => "DescribeRouteTables",
            Op::DescribeInstances => "DescribeInstances",
            Op::CreateRoute => "CreateRoute",
            Op::ReplaceRoute => "ReplaceRoute",
            Op::DeleteRoute => "DeleteRoute",
            Op::ModifyInstanceAttribute => "ModifyInstanceAttribute",
        }
    }

    fn is_write(self) -> bool {
        !matches!(self, Op::DescribeRouteTables | Op::DescribeInstances)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Longest pause of one action's bucket after repeated throttling.
const MAX_THROTTLE_PAUSE: Duration = Duration::from_secs(30);

/// One token bucket per action plus its run of throttling answers.
struct Limiter {
    buckets: Vec<TokenBucket>,
    streaks: Vec<AtomicU32>,
    base_pause: Duration,
}

impl Limiter {
    fn new(c: &RateLimitConfig) -> Self {
        Self {
            buckets: Op::ALL
                .iter()
                .map(|op| {
                    let b = if op.is_write() { c.write } else { c.read };
                    TokenBucket::new(b.per_second, b.burst)
                })
                .collect(),
            streaks: Op::ALL.iter().map(|_| AtomicU32::new(0)).collect(),
            base_pause: Duration::from_millis(c.throttle_pause_ms),
        }
    }

    async fn acquire(&self, op: Op) -> Duration {
        self.buckets[op.index()].acquire().await
    }

    async fn acquire_fenced(
        &self,
        op: Op,
        fence: &route_cloud::Fence,
    ) -> Result<Duration, CloudError> {
        self.buckets[op.index()].acquire_fenced(fence).await
    }

    fn succeeded(&self, op: Op) {
        self.streaks[op.index()].store(0, Ordering::Relaxed);
    }

    /// Stops `op`'s bucket for a pause that doubles with each throttle in a
    /// row, or for the server's retry-after when it is longer. Returns the pause.
    async fn throttled(&self, op: Op, retry_after: Option<Duration>) -> Duration {
        let n = self.streaks[op.index()].fetch_add(1, Ordering::Relaxed);
        let backoff = self
            .base_pause
            .saturating_mul(1u32 << n.min(16))
            .min(MAX_THROTTLE_PAUSE);
        let pause = backoff.max(retry_after.unwrap_or_default());
        self.buckets[op.index()]
            .pause_until(tokio::time::Instant::now() + pause)
            .await;
        pause
    }
}

/// What the provider remembers between calls.
#[derive(Default)]
struct State {
    /// Route table per cluster, once known.
    tables: HashMap<String, String>,
    /// Destinations (as EC2 writes them) listed as blackholes, per table, so a
    /// create over one replaces it in one call.
    blackholes: HashMap<String, HashSet<String>>,
    /// Instances whose source/destination check this process turned off, or being turned
    /// off: concurrent creations for one instance (a dual-stack Node's two
    /// routes) share one `ModifyInstanceAttribute`.
    source_dest_off: HashMap<String, Arc<tokio::sync::OnceCell<()>>>,
    index: NodeIndex,
}

/// The AWS EC2 route-table provider.
pub struct Ec2Routes {
    client: Client,
    config: AwsConfig,
    stats: RequestStats,
    limiter: Limiter,
    state: Mutex<State>,
    fence: route_cloud::Fence,
}

impl std::fmt::Debug for Ec2Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ec2Routes")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Ec2Routes {
    /// Loads credentials and region from the standard AWS chain (environment,
    /// profile, web identity, container and instance metadata), with the
    /// configuration's region and endpoint taking precedence.
    pub async fn connect(config: AwsConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(r) = &config.region {
            loader = loader.region(Region::new(r.clone()));
        }
        let sdk = loader.load().await;
        Self::from_sdk_config(config, &sdk)
    }

    /// Builds the provider on an already loaded SDK configuration (tests pass
    /// static credentials this way).
    pub fn from_sdk_config(config: AwsConfig, sdk: &SdkConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let timeout = config.request_timeout();
        let mut b = aws_sdk_ec2::config::Builder::from(sdk)
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(timeout.min(Duration::from_secs(10)))
                    .operation_attempt_timeout(timeout)
                    .operation_timeout(timeout)
                    .build(),
            );
        if let Some(r) = &config.region {
            b = b.region(Region::new(r.clone()));
        }
        if let Some(e) = &config.endpoint {
            b = b.endpoint_url(e);
        }
        let ec2 = b.build();
        if ec2.region().is_none() {
            return Err(ConfigError::Invalid(
                "no region: set `region` in the cloud config or AWS_REGION".into(),
            ));
        }
        info!(
            region = ?ec2.region().map(|r| r.as_ref()),
            route_table_id = ?config.route_table_id,
            endpoint = ?config.endpoint,
            "AWS EC2 provider configured"
        );
        Ok(Self {
            client: Client::from_conf(ec2),
            limiter: Limiter::new(&config.rate_limit),
            config,
            stats: RequestStats::default(),
            state: Mutex::new(State::default()),
            fence: route_cloud::Fence::default(),
        })
    }

    /// Checks `fence` after every wait of this provider's own (its token
    /// bucket, throttling pauses) before sending a change, so a change that
    /// waited past this replica's renew deadline is never sent.
    pub fn with_fence(mut self, fence: route_cloud::Fence) -> Self {
        self.fence = fence;
        self
    }

    /// The SDK client (tests use it to set up fixtures).
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs one EC2 request inside the budget of `op` and counts it.
    async fn call<T, E, Fut>(&self, op: Op, request: impl FnOnce() -> Fut) -> Result<T, CloudError>
    where
        Fut: Future<
            Output = Result<
                T,
                aws_sdk_ec2::error::SdkError<E, aws_sdk_ec2::config::http::HttpResponse>,
            >,
        >,
        E: aws_sdk_ec2::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        // A change (ModifyInstanceAttribute, CreateRoute, ...) may have waited
        // for its token past this replica's renew deadline; then it is not sent.
        let waited = if op.is_write() {
            self.limiter.acquire_fenced(op, &self.fence).await?
        } else {
            self.limiter.acquire(op).await
        };
        if !waited.is_zero() {
            self.stats.add_rate_limit_wait(waited);
        }
        match request().await {
            Ok(v) => {
                self.stats.record(op.name(), "ok");
                self.limiter.succeeded(op);
                Ok(v)
            }
            Err(e) => {
                let ce = classify(op.name(), &e);
                self.stats.record(op.name(), ce.kind.as_str());
                if ce.kind == ErrorKind::Throttled {
                    let pause = self.limiter.throttled(op, ce.retry_after).await;
                    warn!(
                        operation = op.name(),
                        pause_ms = pause.as_millis() as u64,
                        "EC2 throttled the request; pausing this action"
                    );
                } else {
                    debug!(operation = op.name(), error = %ce, "EC2 request failed");
                }
                Err(ce)
            }
        }
    }

    /// Describes the cluster's route table: by the configured id, or by the
    /// cluster tag (narrowed to `vpc_id` when set). Remembers its id.
    async fn describe_table(&self, cluster: &str) -> Result<RouteTable, CloudError> {
        let mut req = self.client.describe_route_tables();
        if let Some(id) = &self.config.route_table_id {
            req = req.route_table_ids(id);
        } else {
            req = req.filters(
                Filter::builder()
                    .name("tag-key")
                    .values(cluster_tag_key(cluster))
                    .build(),
            );
            if let Some(vpc) = &self.config.vpc_id {
                req = req.filters(Filter::builder().name("vpc-id").values(vpc).build());
            }
        }
        let out = self
            .call(Op::DescribeRouteTables, || req.send())
            .await
            .map_err(|e| match (&self.config.route_table_id, e.kind) {
                // A configured table that does not exist needs an operator.
                (Some(id), ErrorKind::InvalidRequest)
                    if e.message.contains("InvalidRouteTableID") =>
                {
                    CloudError::new(
                        ErrorKind::Permanent,
                        format!(
                            "route table {id} (route_table_id) does not exist: {}",
                            e.message
                        ),
                    )
                }
                _ => e,
            })?;
        let mut tables = out.route_tables.unwrap_or_default();
        let table = match tables.len() {
            1 => tables.remove(0),
            0 => {
                self.state().tables.remove(cluster);
                return Err(CloudError::new(
                    ErrorKind::Permanent,
                    match &self.config.route_table_id {
                        Some(id) => format!("route table {id} (route_table_id) was not found"),
                        None => format!(
                            "no route table carries the tag {}{}; tag the cluster's route table or set route_table_id",
                            cluster_tag_key(cluster),
                            self.config
                                .vpc_id
                                .as_deref()
                                .map(|v| format!(" in {v}"))
                                .unwrap_or_default()
                        ),
                    },
                ));
            }
            n => {
                let ids: Vec<&str> = tables.iter().filter_map(|t| t.route_table_id()).collect();
                return Err(CloudError::new(
                    ErrorKind::Permanent,
                    format!(
                        "{n} route tables carry the tag {} ({}); set route_table_id or vpc_id to pick one",
                        cluster_tag_key(cluster),
                        ids.join(", ")
                    ),
                ));
            }
        };
        let Some(id) = table.route_table_id() else {
            return Err(CloudError::new(
                ErrorKind::Transient,
                "DescribeRouteTables returned a table without an id",
            ));
        };
        let mut st = self.state();
        if st.tables.get(cluster).map(String::as_str) != Some(id) {
            info!(cluster, route_table_id = id, "using route table");
            st.tables.insert(cluster.to_string(), id.to_string());
        }
        Ok(table)
    }

    /// The cluster's route table id, describing it only when not yet known.
    async fn table_id(&self, cluster: &str) -> Result<String, CloudError> {
        if let Some(id) = &self.config.route_table_id {
            return Ok(id.clone());
        }
        if let Some(id) = self.state().tables.get(cluster) {
            return Ok(id.clone());
        }
        let t = self.describe_table(cluster).await?;
        Ok(t.route_table_id().unwrap_or_default().to_string())
    }

    /// Maps the instances of routes to node names. Before the controller has
    /// shown any nodes, unknown instances are looked up with one filtered
    /// `DescribeInstances` and named by their private DNS name (upstream's
    /// node naming), so a controller that never calls `observe_nodes` still
    /// sees its routes as its nodes'.
    async fn resolve_unknown_instances(&self, instances: &[String]) -> Result<(), CloudError> {
        let unknown: Vec<String> = {
            let st = self.state();
            if st.index.has_observed() {
                return Ok(());
            }
            instances
                .iter()
                .filter(|i| st.index.node_of(i).is_none())
                .cloned()
                .collect::<HashSet<_>>()
                .into_iter()
                .collect()
        };
        if unknown.is_empty() {
            return Ok(());
        }
        // A filter, not InstanceIds: a terminated id must not fail the call.
        let req = self.client.describe_instances().filters(
            Filter::builder()
                .name("instance-id")
                .set_values(Some(unknown))
                .build(),
        );
        let out = self.call(Op::DescribeInstances, || req.send()).await?;
        let mut st = self.state();
        for i in out.reservations().iter().flat_map(|r| r.instances()) {
            if let (Some(id), Some(dns)) = (i.instance_id(), i.private_dns_name())
                && !dns.is_empty()
            {
                st.index.learn(id, dns);
            }
        }
        Ok(())
    }

    /// The instance a route to `route` must target.
    async fn target_instance(&self, route: &Route) -> Result<String, CloudError> {
        if let Some(pid) = route.target_provider_id.as_deref() {
            return instance_id_from_provider_id(pid)
                .map(str::to_string)
                .ok_or_else(|| {
                    CloudError::new(
                        ErrorKind::InvalidRequest,
                        format!(
                            "node {}: provider id {pid:?} does not name an EC2 instance (aws:///<zone>/i-...)",
                            route.target_node
                        ),
                    )
                });
        }
        if route.target_node.is_empty() {
            return Err(CloudError::new(
                ErrorKind::InvalidRequest,
                "a route to create needs a target node",
            ));
        }
        if let Some(i) = self.state().index.instance_of(&route.target_node) {
            return Ok(i.to_string());
        }
        // No provider id yet: upstream's fallback, the node name as the
        // instance's private DNS name.
        let req = self.client.describe_instances().filters(
            Filter::builder()
                .name("private-dns-name")
                .values(route.target_node.as_str())
                .build(),
        );
        let out = self.call(Op::DescribeInstances, || req.send()).await?;
        let ids: Vec<&str> = out
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .filter_map(|i| i.instance_id())
            .collect();
        match ids.as_slice() {
            [id] => Ok(id.to_string()),
            [] => Err(CloudError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "node {} has no spec.providerID and no instance has it as private DNS name",
                    route.target_node
                ),
            )),
            _ => Err(CloudError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "node {} has no spec.providerID and {} instances have it as private DNS name",
                    route.target_node,
                    ids.len()
                ),
            )),
        }
    }

    async fn disable_source_dest_check(&self, instance: &str) -> Result<(), CloudError> {
        let once = self
            .state()
            .source_dest_off
            .entry(instance.to_string())
            .or_default()
            .clone();
        // A failed attempt leaves the cell empty, so the next creation tries again.
        once.get_or_try_init(|| async {
            let req = self
                .client
                .modify_instance_attribute()
                .instance_id(instance)
                .source_dest_check(AttributeBooleanValue::builder().value(false).build());
            self.call(Op::ModifyInstanceAttribute, || req.send())
                .await
                .map(|_| ())
        })
        .await?;
        Ok(())
    }

    async fn replace(&self, table: &str, dest: &Cidr, instance: &str) -> Result<(), CloudError> {
        let req = with_destination!(self.client.replace_route().route_table_id(table), dest)
            .instance_id(instance);
        self.call(Op::ReplaceRoute, || req.send()).await?;
        Ok(())
    }

    async fn create(&self, table: &str, dest: &Cidr, instance: &str) -> Result<(), CloudError> {
        let req = with_destination!(self.client.create_route().route_table_id(table), dest)
            .instance_id(instance);
        self.call(Op::CreateRoute, || req.send()).await?;
        Ok(())
    }

    /// After `RouteAlreadyExists`: what the existing route for `dest` is.
    async fn existing_route(
        &self,
        table: &str,
        dest: &Cidr,
    ) -> Result<Option<aws_sdk_ec2::types::Route>, CloudError> {
        let dest_text = dest.to_string();
        let filter = if dest.network().is_ipv6() {
            "route.destination-ipv6-cidr-block"
        } else {
            "route.destination-cidr-block"
        };
        let req = self
            .client
            .describe_route_tables()
            .route_table_ids(table)
            .filters(Filter::builder().name(filter).values(&dest_text).build());
        let out = self.call(Op::DescribeRouteTables, || req.send()).await?;
        Ok(out
            .route_tables()
            .iter()
            .flat_map(|t| t.routes())
            .find(|r| {
                r.destination_cidr_block()
                    .or(r.destination_ipv6_cidr_block())
                    .and_then(|d| Cidr::parse(d).ok())
                    == Some(*dest)
            })
            .cloned())
    }
}

/// Converts one EC2 route into the controller's view, or `None` when it is
/// not a route to an instance (local, gateways, NAT, peering, endpoints).
fn to_route(r: &aws_sdk_ec2::types::Route, index: &NodeIndex) -> Option<Route> {
    let dest = r
        .destination_cidr_block()
        .or(r.destination_ipv6_cidr_block())?;
    let blackhole = matches!(r.state(), Some(RouteState::Blackhole));
    let other_target = r.gateway_id().is_some()
        || r.nat_gateway_id().is_some()
        || r.transit_gateway_id().is_some()
        || r.vpc_peering_connection_id().is_some()
        || r.egress_only_internet_gateway_id().is_some()
        || r.local_gateway_id().is_some()
        || r.carrier_gateway_id().is_some()
        || r.core_network_arn().is_some();
    let target = match (r.instance_id(), r.network_interface_id()) {
        (Some(i), _) if !other_target => i,
        // A terminated instance leaves a blackhole that names only its
        // (deleted) network interface.
        (None, Some(eni)) if blackhole && !other_target => eni,
        _ => return None,
    };
    let node = r
        .instance_id()
        .and_then(|i| index.node_of(i))
        .unwrap_or_default();
    let mut route = Route::new(node, Destination::parse(dest)).named(dest);
    route.blackhole = blackhole;
    route.cloud_target = target.to_string().into();
    // As `create_route` returns it, so a cached creation and a later list
    // agree (the trait promises that).
    route.target_provider_id = r
        .instance_id()
        .and_then(|i| index.provider_id_of(i))
        .map(Into::into);
    Some(route)
}

/// The destination of a route to delete: as listed (its name), else the parsed CIDR.
fn destination_of(route: &Route) -> Result<Cidr, CloudError> {
    route
        .destination
        .cidr()
        .or_else(|| Cidr::parse(&route.name).ok())
        .ok_or_else(|| {
            CloudError::new(
                ErrorKind::InvalidRequest,
                format!("route destination {} is not a CIDR", route.destination),
            )
        })
}

#[async_trait]
impl CloudRoutes for Ec2Routes {
    fn name(&self) -> &'static str {
        "aws"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            max_concurrent_operations: self.config.max_concurrent_operations,
            supports_batch: false,
            reports_node_addresses: false,
            supports_ipv6: true,
            max_routes: self.config.max_routes,
            // The route's target is the instance of `spec.providerID`.
            needs: TargetNeeds::ProviderId,
            // A creation over a listed blackhole is one `ReplaceRoute`.
            replaces_blackholes: true,
        }
    }

    fn stats(&self) -> &RequestStats {
        &self.stats
    }

    fn observe_nodes(&self, nodes: &[Arc<NodeView>]) {
        self.state().index.observe(nodes);
    }

    async fn list_routes(&self, cluster: &str) -> Result<Vec<Route>, CloudError> {
        let table = self.describe_table(cluster).await?;
        let instances: Vec<String> = table
            .routes()
            .iter()
            .filter_map(|r| r.instance_id().map(str::to_string))
            .collect();
        self.resolve_unknown_instances(&instances).await?;
        let mut st = self.state();
        let routes: Vec<Route> = table
            .routes()
            .iter()
            .filter_map(|r| to_route(r, &st.index))
            .collect();
        let blackholes = routes
            .iter()
            .filter(|r| r.blackhole)
            .map(|r| r.name.to_string())
            .collect();
        if let Some(id) = table.route_table_id() {
            st.blackholes.insert(id.to_string(), blackholes);
        }
        Ok(routes)
    }

    async fn create_route(
        &self,
        cluster: &str,
        _name_hint: &str,
        route: &Route,
    ) -> Result<Route, CloudError> {
        let dest = route.destination.cidr().ok_or_else(|| {
            CloudError::new(
                ErrorKind::InvalidRequest,
                format!("route destination {} is not a CIDR", route.destination),
            )
        })?;
        let dest_text = dest.to_string();
        let instance = self.target_instance(route).await?;
        let table = self.table_id(cluster).await?;
        self.disable_source_dest_check(&instance).await?;

        let over_blackhole = self
            .state()
            .blackholes
            .get(&table)
            .is_some_and(|b| b.contains(&dest_text));
        let created = if over_blackhole {
            match self.replace(&table, &dest, &instance).await {
                // Someone removed the blackhole meanwhile.
                Err(e) if e.kind == ErrorKind::NotFound => {
                    self.create(&table, &dest, &instance).await
                }
                r => r,
            }
        } else {
            self.create(&table, &dest, &instance).await
        };
        match created {
            Ok(()) => {}
            Err(e) if e.kind == ErrorKind::AlreadyExists => {
                // One extra read decides between done, replace and conflict.
                match self.existing_route(&table, &dest).await? {
                    Some(r) if matches!(r.state(), Some(RouteState::Blackhole)) => {
                        self.replace(&table, &dest, &instance).await?;
                    }
                    Some(r) if r.instance_id() == Some(instance.as_str()) => {
                        debug!(destination = %dest, instance, "route already in place");
                    }
                    _ => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }

        let mut st = self.state();
        if let Some(b) = st.blackholes.get_mut(&table) {
            b.remove(&dest_text);
        }
        st.index.learn(&instance, &route.target_node);
        drop(st);
        info!(cluster, destination = %dest, instance, node = %route.target_node, "created route");
        let mut created = Route::new(route.target_node.clone(), dest).named(dest_text);
        created.cloud_target = instance.into();
        created.target_provider_id = route.target_provider_id.clone();
        Ok(created)
    }

    async fn delete_route(&self, cluster: &str, route: &Route) -> Result<(), CloudError> {
        let dest = destination_of(route)?;
        let table = self.table_id(cluster).await?;
        let req = with_destination!(self.client.delete_route().route_table_id(&table), &dest);
        self.call(Op::DeleteRoute, || req.send()).await?;
        if let Some(b) = self.state().blackholes.get_mut(&table) {
            b.remove(&dest.to_string());
        }
        info!(cluster, destination = %dest, target = %route.cloud_target, "deleted route");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ec2::types::Route as Ec2Route;

    fn index_with(instance: &str, node: &str) -> NodeIndex {
        let mut ix = NodeIndex::default();
        ix.observe(&[
            NodeView::new(node, "u", &[]).with_provider_id(format!("aws:///z/{instance}"))
        ]);
        ix
    }

    #[test]
    fn only_instance_routes_are_listed() {
        let ix = index_with("i-0000000a", "node-a");
        let local = Ec2Route::builder()
            .destination_cidr_block("10.0.0.0/16")
            .gateway_id("local")
            .state(RouteState::Active)
            .build();
        let igw = Ec2Route::builder()
            .destination_cidr_block("0.0.0.0/0")
            .gateway_id("igw-1")
            .state(RouteState::Active)
            .build();
        let nat_blackhole = Ec2Route::builder()
            .destination_cidr_block("10.1.0.0/16")
            .nat_gateway_id("nat-1")
            .state(RouteState::Blackhole)
            .build();
        let eni_active = Ec2Route::builder()
            .destination_cidr_block("10.2.0.0/16")
            .network_interface_id("eni-1")
            .state(RouteState::Active)
            .build();
        assert!(to_route(&local, &ix).is_none());
        assert!(to_route(&igw, &ix).is_none());
        assert!(to_route(&nat_blackhole, &ix).is_none());
        assert!(to_route(&eni_active, &ix).is_none());

        let mine = Ec2Route::builder()
            .destination_cidr_block("10.244.1.0/24")
            .instance_id("i-0000000a")
            .network_interface_id("eni-2")
            .state(RouteState::Active)
            .build();
        let r = to_route(&mine, &ix).unwrap();
        assert_eq!(r.target_node, "node-a");
        assert_eq!(r.name, "10.244.1.0/24");
        assert_eq!(r.cloud_target, "i-0000000a");
        assert!(!r.blackhole);
        assert_eq!(
            r.target_provider_id.as_deref(),
            Some("aws:///z/i-0000000a"),
            "the observed Node's providerID, as a creation returns it"
        );

        let stranger = Ec2Route::builder()
            .destination_ipv6_cidr_block("fd00:10:244:2::/64")
            .instance_id("i-0000000b")
            .state(RouteState::Active)
            .build();
        let r = to_route(&stranger, &ix).unwrap();
        assert_eq!(r.target_node, "", "unknown instance names no node");
        assert_eq!(r.target_provider_id, None);
        assert_eq!(r.destination.to_string(), "fd00:10:244:2::/64");

        let gone = Ec2Route::builder()
            .destination_cidr_block("10.244.3.0/24")
            .network_interface_id("eni-3")
            .state(RouteState::Blackhole)
            .build();
        let r = to_route(&gone, &ix).unwrap();
        assert!(r.blackhole);
        assert_eq!(r.cloud_target, "eni-3");
    }

    #[test]
    fn deletion_needs_a_cidr() {
        let r = Route::from_text("n", "not-a-cidr");
        assert_eq!(
            destination_of(&r).unwrap_err().kind,
            ErrorKind::InvalidRequest
        );
        let r = Route::from_text("n", "10.244.0.0/24");
        assert_eq!(destination_of(&r).unwrap().to_string(), "10.244.0.0/24");
    }

    #[tokio::test(start_paused = true)]
    async fn create_route_paused_by_throttling_past_the_renew_deadline_is_fenced() {
        let l = Limiter::new(&RateLimitConfig::default());
        let fence = route_cloud::Fence::leased(std::sync::Arc::new(route_cloud::TokioClock::new()));
        fence.set_leader(true);
        fence.renewed(fence.mark(), Duration::from_secs(5));
        l.throttled(Op::CreateRoute, Some(Duration::from_secs(20)))
            .await;
        let t0 = tokio::time::Instant::now();
        let e = l.acquire_fenced(Op::CreateRoute, &fence).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Fenced);
        assert_eq!(
            t0.elapsed(),
            Duration::from_secs(5),
            "given up at the deadline"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn throttling_pauses_grow_and_reset() {
        let l = Limiter::new(&RateLimitConfig::default());
        assert_eq!(
            l.throttled(Op::CreateRoute, None).await,
            Duration::from_secs(1)
        );
        assert_eq!(
            l.throttled(Op::CreateRoute, None).await,
            Duration::from_secs(2)
        );
        assert_eq!(
            l.throttled(Op::CreateRoute, Some(Duration::from_secs(9)))
                .await,
            Duration::from_secs(9),
            "a longer retry-after wins"
        );
        for _ in 0..10 {
            l.throttled(Op::CreateRoute, None).await;
        }
        assert_eq!(l.throttled(Op::CreateRoute, None).await, MAX_THROTTLE_PAUSE);
        l.succeeded(Op::CreateRoute);
        assert_eq!(
            l.throttled(Op::CreateRoute, None).await,
            Duration::from_secs(1)
        );
        // Other actions keep their own budget.
        let t0 = tokio::time::Instant::now();
        l.acquire(Op::DeleteRoute).await;
        assert_eq!(t0.elapsed(), Duration::ZERO);
        let waited = l.acquire(Op::CreateRoute).await;
        assert!(waited >= Duration::from_secs(1), "{waited:?}");
    }
}
