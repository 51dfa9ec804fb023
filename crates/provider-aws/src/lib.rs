//! The AWS EC2 provider: pod-CIDR routes in one or more VPC route tables
//! (e.g. one private table per zone), each pointing at a node's instance, or
//! at its primary network interface when the instance has several.
//!
//! This crate owns everything EC2-specific: finding the route tables, mapping
//! instances and interfaces to nodes, the per-action request budget and the
//! classification of EC2's error codes. It decides nothing about which
//! routes should exist. Each table is one route target
//! ([`CloudRoutes::targets`]): the planner puts every Node's route in each.
//!
//! Ownership: a listed route is this cluster's only if its `Origin` is
//! `CreateRoute` and it points at an instance or a network interface; the
//! planner further keeps only those inside the cluster CIDRs. The local
//! route EC2 makes with the table (`CreateRouteTable`), propagated routes,
//! gateways, NAT, peering, transit gateways and endpoints are never listed,
//! so never deleted. A route another tool made with `CreateRoute`
//! (CloudFormation's `AWS::EC2::Route`, Terraform's `aws_route`) to an
//! instance or interface looks exactly like ours: only a destination
//! outside the cluster CIDRs keeps it safe.
//!
//! Requests per operation (with the defaults and a warm cache):
//! - list: 1 `DescribeRouteTables` per page (by the configured ids, or
//!   filtered by the cluster tag; never unfiltered), whatever the number of
//!   tables. No `DescribeInstances`: instances map to nodes through the
//!   Nodes' `spec.providerID` ([`CloudRoutes::observe_nodes`]); a route that
//!   names only an unknown interface costs one `DescribeNetworkInterfaces`
//!   for all of them, once.
//! - create: 1 `CreateRoute` (or `ReplaceRoute` over a blackhole), plus, the
//!   first time this process routes to an instance, one `DescribeInstances`
//!   (how many interfaces it has; shared by every instance looked up at the
//!   same time, and filled up to 200 ids with the observed Nodes' instances
//!   not yet prepared) and one `ModifyInstanceAttribute` (or
//!   `ModifyNetworkInterfaceAttribute` on a multi-NIC instance's primary
//!   interface) `SourceDestCheck=false`.
//! - delete: 1 `DeleteRoute`.
//! - forwarding check at the drift check: 1 `DescribeInstances` per 200
//!   routed instances, filtered by `source-dest-check=true` for instances
//!   whose check this process last saw off, so each answer carries only the
//!   offenders; instances never seen, or routed through an interface, are
//!   described whole. 1 write per check found on again.
//!
//! The SDK's own retries are off: every request goes through this crate's
//! token buckets and counters exactly once, throttling pauses the bucket of
//! the throttled action, and the controller's backoff owns retrying. Two
//! retry layers would multiply requests under throttling and hide the real
//! request count.

pub mod assume_role;
mod config;
mod entry;
mod error;
mod index;
pub mod native;
pub mod permissions;
#[cfg(feature = "testing")]
pub mod testing;

pub use entry::PROVIDER;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_ec2::Client;
use aws_sdk_ec2::config::retry::RetryConfig;
use aws_sdk_ec2::config::timeout::TimeoutConfig;
use aws_sdk_ec2::types::{AttributeBooleanValue, Filter, RouteOrigin, RouteState, RouteTable};
use provider_kit::Meter;
use route_cloud::ratelimit::TokenBucket;
use route_cloud::{
    Capabilities, CloudError, CloudRoutes, ErrorKind, Forwarding, ForwardingCheck, RequestStats,
};
use route_core::{Cidr, Destination, IpFamily, NodeView, Route, TargetNeeds, Text};
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

/// The legacy tag key whose value names the cluster (`KubernetesCluster=<id>`),
/// which cloud-provider-aws still reads beside [`cluster_tag_key`].
pub const LEGACY_CLUSTER_TAG: &str = "KubernetesCluster";

/// The cluster an instance's tags say it belongs to: `Ok(())` when tagged for
/// `cluster` (`kubernetes.io/cluster/<cluster>` or `KubernetesCluster=<cluster>`),
/// `Err(Some(other))` when tagged only for another cluster, `Err(None)` when
/// tagged for none.
fn tagged_cluster<'a>(
    tags: impl IntoIterator<Item = (&'a str, &'a str)> + Clone,
    cluster: &str,
) -> Result<(), Option<String>> {
    let ours = cluster_tag_key(cluster);
    if tags
        .clone()
        .into_iter()
        .any(|(k, v)| k == ours || (k == LEGACY_CLUSTER_TAG && v == cluster))
    {
        return Ok(());
    }
    Err(tags.into_iter().find_map(|(k, v)| {
        k.strip_prefix("kubernetes.io/cluster/")
            .map(str::to_string)
            .or_else(|| (k == LEGACY_CLUSTER_TAG && !v.is_empty()).then(|| v.to_string()))
    }))
}

/// The EC2 actions this provider calls; each has its own budget, as in EC2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    DescribeRouteTables,
    DescribeInstances,
    DescribeNetworkInterfaces,
    CreateRoute,
    ReplaceRoute,
    DeleteRoute,
    ModifyInstanceAttribute,
    ModifyNetworkInterfaceAttribute,
}

impl Op {
    const ALL: [Op; 8] = [
        Op::DescribeRouteTables,
        Op::DescribeInstances,
        Op::DescribeNetworkInterfaces,
        Op::CreateRoute,
        Op::ReplaceRoute,
        Op::DeleteRoute,
        Op::ModifyInstanceAttribute,
        Op::ModifyNetworkInterfaceAttribute,
    ];

    fn name(self) -> &'static str {
        match self {
            Op::DescribeRouteTables => "DescribeRouteTables",
            Op::DescribeInstances => "DescribeInstances",
            Op::DescribeNetworkInterfaces => "DescribeNetworkInterfaces",
            Op::CreateRoute => "CreateRoute",
            Op::ReplaceRoute => "ReplaceRoute",
            Op::DeleteRoute => "DeleteRoute",
            Op::ModifyInstanceAttribute => "ModifyInstanceAttribute",
            Op::ModifyNetworkInterfaceAttribute => "ModifyNetworkInterfaceAttribute",
        }
    }

    fn is_write(self) -> bool {
        !matches!(
            self,
            Op::DescribeRouteTables | Op::DescribeInstances | Op::DescribeNetworkInterfaces
        )
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

    fn bucket(&self, op: Op) -> &TokenBucket {
        &self.buckets[op.index()]
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
    /// Route tables per cluster (sorted ids), as the last list found them.
    tables: HashMap<String, Vec<String>>,
    /// Per table and family, the non-propagated routes the last list did
    /// not return (the local route, gateways, NAT, peerings, endpoints):
    /// EC2's "routes per route table" quota counts them too.
    unlisted: HashMap<(String, IpFamily), usize>,
    /// The tables the last list covered: what `targets()` answers.
    last_tables: Vec<String>,
    /// Destinations (as EC2 writes them) listed as blackholes, per table, so a
    /// create over one replaces it in one call.
    blackholes: HashMap<String, HashSet<String>>,
    /// Instances prepared as route targets by this process, or being
    /// prepared: what a route to each targets (the instance, or its primary
    /// network interface when it has several, learned with a shared
    /// `DescribeInstances`), and its source/destination check turned off.
    /// Concurrent creations for one instance (a dual-stack Node's two routes,
    /// one route per table) share one preparation.
    prepared: HashMap<String, Arc<tokio::sync::OnceCell<RouteTarget>>>,
    /// Network interface -> the instance it is attached to (empty when
    /// detached), from creations and `DescribeNetworkInterfaces`.
    interfaces: HashMap<String, String>,
    /// Instance lookups waiting for a shared `DescribeInstances`.
    lookups: Lookups,
    /// Instances routes target that no Node names, by the cluster tags they
    /// carry: the other cluster whose they provably are (tagged
    /// `kubernetes.io/cluster/<other>` and not for this cluster), or `None`.
    /// Instances do not change clusters: each is described once.
    owners: HashMap<String, Option<String>>,
    /// Targets of observed Nodes' instances described ahead of their first
    /// route, by a request sent for other instances; taken on first use.
    described: HashMap<String, RouteTarget>,
    /// Whether new instances are described before they are prepared: set
    /// once EC2 refused an instance-level request for an instance with
    /// several network interfaces.
    describe_first: bool,
    index: NodeIndex,
}

/// One waiter's answer from a shared `DescribeInstances`.
type Lookup = tokio::sync::oneshot::Sender<Result<RouteTarget, CloudError>>;

/// Queued instance lookups and whether a caller is leading them.
#[derive(Default)]
struct Lookups {
    pending: Vec<(String, Lookup)>,
    /// A caller is sending the queued lookups; new ones only queue.
    leading: bool,
}

/// EC2's limit of values per filter (DescribeInstances documents up to
/// 200 values for a filter); one request covers at most this many instances.
const MAX_FILTER_VALUES: usize = 200;

/// Hands the lead on when a leader is dropped mid-request: clears `leading`
/// and then drops every sender it held or that was queued, so each of their
/// waiters wakes, queues again, and one of them leads.
struct LeadGuard<'a> {
    routes: &'a Ec2Routes,
    batch: Vec<(String, Lookup)>,
    done: bool,
}

impl Drop for LeadGuard<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let queued = {
            let mut st = self.routes.state();
            st.lookups.leading = false;
            std::mem::take(&mut st.lookups.pending)
        };
        drop(queued);
        self.batch.clear();
    }
}

/// What a route to one instance points at in EC2.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RouteTarget {
    /// `InstanceId`: an instance with one network interface.
    Instance(String),
    /// `NetworkInterfaceId`: the primary interface (device index 0) of an
    /// instance with several, as gardener/aws-custom-route-controller does;
    /// EC2 refuses `InstanceId` for such an instance.
    Interface(String),
}

impl RouteTarget {
    fn id(&self) -> &str {
        match self {
            RouteTarget::Instance(i) | RouteTarget::Interface(i) => i,
        }
    }
}

/// Whether a table is its VPC's main table.
fn is_main_table(t: &RouteTable) -> bool {
    t.associations().iter().any(|a| a.main() == Some(true))
}

/// The AWS EC2 route-table provider.
pub struct Ec2Routes {
    client: Client,
    config: AwsConfig,
    meter: Meter,
    limiter: Limiter,
    state: Mutex<State>,
}

impl std::fmt::Debug for Ec2Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ec2Routes")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Ec2Routes {
    /// The cluster id the tags name: `cluster_id` when configured (the
    /// cloud config's `KubernetesClusterID`), else `--cluster-name`.
    fn tag_cluster<'a>(&'a self, cluster: &'a str) -> &'a str {
        self.config.cluster_id.as_deref().unwrap_or(cluster)
    }

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
        let Some(role) = &config.role_arn else {
            return Self::from_sdk_config(config, &sdk);
        };
        // cloud-provider-aws's RoleARN: the standard chain's credentials
        // assume the role, and the role's (refreshed before they expire)
        // sign every EC2 request.
        let mut sts = sdk.clone();
        if let Some(e) = &config.sts_endpoint {
            sts = sts.into_builder().endpoint_url(e).build();
        }
        let assumed = assume_role::AssumedRole::new(&sts, role, config.source_arn.as_deref());
        let sdk = sdk
            .into_builder()
            .credentials_provider(
                aws_credential_types::provider::SharedCredentialsProvider::new(assumed),
            )
            .build();
        info!(role = %role, source_arn = ?config.source_arn, "EC2 requests use the assumed role");
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
                    .connect_timeout(provider_kit::connect_timeout(timeout))
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
            route_tables = ?config.configured_tables(),
            endpoint = ?config.endpoint,
            "AWS EC2 provider configured"
        );
        Ok(Self {
            client: Client::from_conf(ec2),
            limiter: Limiter::new(&config.rate_limit),
            config,
            meter: Meter::default(),
            state: Mutex::new(State::default()),
        })
    }

    /// Checks `fence` after every wait of this provider's own (its token
    /// bucket, throttling pauses) before sending a change, so a change that
    /// waited past this replica's renew deadline is never sent.
    pub fn with_fence(mut self, fence: route_cloud::Fence) -> Self {
        self.meter.set_fence(fence);
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
        let answer = self
            .meter
            .call(
                op.name(),
                self.limiter.bucket(op),
                op.is_write(),
                request(),
                |e| classify(op.name(), &e),
            )
            .await;
        match &answer {
            Ok(_) => self.limiter.succeeded(op),
            Err(e) if e.kind == ErrorKind::Throttled => {
                let pause = self.limiter.throttled(op, e.retry_after).await;
                warn!(
                    operation = op.name(),
                    pause_ms = pause.as_millis() as u64,
                    "EC2 throttled the request; pausing this action"
                );
            }
            Err(e) => debug!(operation = op.name(), error = %e, "EC2 request failed"),
        }
        answer
    }

    /// Describes the cluster's route tables: the configured ids, or every
    /// table carrying the cluster tag (and the extra `route_table_tags`,
    /// narrowed to `vpc_id` when set), page by page, without the VPC main
    /// tables. Remembers their ids (sorted) as this cluster's targets.
    async fn describe_tables(&self, cluster: &str) -> Result<Vec<RouteTable>, CloudError> {
        let configured = self.config.configured_tables();
        let mut tables = if configured.is_empty() {
            self.discover_tables(cluster).await?
        } else {
            self.configured_route_tables(&configured).await?
        };
        tables.sort_by(|a, b| a.route_table_id().cmp(&b.route_table_id()));
        let ids: Vec<String> = tables
            .iter()
            .filter_map(|t| t.route_table_id().map(str::to_string))
            .collect();
        if ids.len() != tables.len() {
            return Err(CloudError::new(
                ErrorKind::Transient,
                "DescribeRouteTables returned a table without an id",
            ));
        }
        let mut st = self.state();
        if st.tables.get(cluster) != Some(&ids) {
            info!(cluster, route_table_ids = ?ids, "using route tables");
            st.tables.insert(cluster.to_string(), ids.clone());
        }
        st.last_tables = ids;
        Ok(tables)
    }

    /// The configured tables, by id; each must exist.
    async fn configured_route_tables(
        &self,
        configured: &[String],
    ) -> Result<Vec<RouteTable>, CloudError> {
        let req = self
            .client
            .describe_route_tables()
            .set_route_table_ids(Some(configured.to_vec()));
        let out = self
            .call(Op::DescribeRouteTables, || req.send())
            .await
            .map_err(|e| match e.kind {
                // A configured table that does not exist needs an operator.
                ErrorKind::InvalidRequest | ErrorKind::NotFound
                    if e.message.contains("InvalidRouteTableID") =>
                {
                    CloudError::new(
                        ErrorKind::Permanent,
                        format!(
                            "route table {} (route_table_id/route_table_ids) does not exist: {}",
                            configured.join(", "),
                            e.message
                        ),
                    )
                }
                _ => e,
            })?;
        let tables = out.route_tables.unwrap_or_default();
        let missing: Vec<&str> = configured
            .iter()
            .filter(|id| {
                !tables
                    .iter()
                    .any(|t| t.route_table_id() == Some(id.as_str()))
            })
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(CloudError::new(
                ErrorKind::Permanent,
                format!(
                    "route table {} (route_table_id/route_table_ids) was not found",
                    missing.join(", ")
                ),
            ));
        }
        Ok(tables)
    }

    /// Every table tagged for `cluster` (with `legacy_cluster_tag`, by either
    /// tag), all pages, main tables left out.
    async fn discover_tables(&self, cluster: &str) -> Result<Vec<RouteTable>, CloudError> {
        let mut found = self
            .tables_tagged(
                Filter::builder()
                    .name("tag-key")
                    .values(cluster_tag_key(cluster)),
            )
            .await?;
        if self.config.legacy_cluster_tag {
            // EC2 ANDs filters, so the legacy tag takes a list of its own.
            let legacy = self
                .tables_tagged(
                    Filter::builder()
                        .name(format!("tag:{LEGACY_CLUSTER_TAG}"))
                        .values(cluster),
                )
                .await?;
            let known: HashSet<String> = found
                .iter()
                .filter_map(|t| t.route_table_id().map(str::to_string))
                .collect();
            found.extend(
                legacy
                    .into_iter()
                    .filter(|t| t.route_table_id().is_none_or(|id| !known.contains(id))),
            );
        }
        // The VPC's main table is never a cluster's routing table, even when
        // tagged: it is the implicit table of every subnet without an
        // association (public ones included), usually owned by the VPC's
        // tooling. gardener/aws-custom-route-controller skips the main table
        // likewise (it skips the main table whose `Name` tag equals the
        // cluster name, `pkg/updater/routes.go`); this rule is wider: every
        // main table is left out of discovery. A configured id is used as
        // given, main table or not.
        let (main, tables): (Vec<RouteTable>, Vec<RouteTable>) =
            found.into_iter().partition(is_main_table);
        if !main.is_empty() {
            let ids: Vec<&str> = main.iter().filter_map(|t| t.route_table_id()).collect();
            debug!(cluster, main_tables = ?ids, "tagged main route tables left out");
        }
        if tables.is_empty() {
            return Err(CloudError::new(
                ErrorKind::Permanent,
                format!(
                    "no route table other than a VPC main table carries the tag {}{}{}{}; tag the cluster's route tables or set route_table_ids",
                    cluster_tag_key(cluster),
                    if self.config.legacy_cluster_tag {
                        format!(" or {LEGACY_CLUSTER_TAG}={cluster}")
                    } else {
                        String::new()
                    },
                    if self.config.route_table_tags.is_empty() {
                        String::new()
                    } else {
                        format!(" and the tags {:?}", self.config.route_table_tags)
                    },
                    self.config
                        .vpc_id
                        .as_deref()
                        .map(|v| format!(" in {v}"))
                        .unwrap_or_default()
                ),
            ));
        }
        Ok(tables)
    }

    /// Every table matching `tag` and the configured VPC and extra tags, all
    /// pages.
    async fn tables_tagged(
        &self,
        tag: aws_sdk_ec2::types::builders::FilterBuilder,
    ) -> Result<Vec<RouteTable>, CloudError> {
        let tag = tag.build();
        let mut found = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut req = self
                .client
                .describe_route_tables()
                .max_results(100)
                .filters(tag.clone());
            if let Some(vpc) = &self.config.vpc_id {
                req = req.filters(Filter::builder().name("vpc-id").values(vpc).build());
            }
            for (k, v) in &self.config.route_table_tags {
                req = req.filters(Filter::builder().name(format!("tag:{k}")).values(v).build());
            }
            if let Some(t) = token.take() {
                req = req.next_token(t);
            }
            let out = self.call(Op::DescribeRouteTables, || req.send()).await?;
            token = out
                .next_token()
                .filter(|t| !t.is_empty())
                .map(str::to_string);
            found.extend(out.route_tables.unwrap_or_default());
            if token.is_none() {
                return Ok(found);
            }
        }
    }

    /// The table a route goes to or comes from: its `target`, or, for a route
    /// that names none, the cluster's only table.
    async fn table_of(&self, cluster: &str, route: &Route) -> Result<String, CloudError> {
        let known = self.state().tables.get(cluster).cloned();
        if !route.table.is_empty() {
            // Only a table this cluster manages: never another one, whatever
            // a caller passes.
            let managed = known
                .clone()
                .unwrap_or_else(|| self.config.configured_tables());
            if managed.is_empty() || managed.iter().any(|t| *t == route.table) {
                return Ok(route.table.to_string());
            }
            return Err(CloudError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "route {} names route table {}, which is not one of cluster {cluster}'s ({})",
                    route.destination,
                    route.table,
                    managed.join(", ")
                ),
            ));
        }
        let tables = match known {
            Some(t) => t,
            None => {
                let configured = self.config.configured_tables();
                if configured.len() == 1 {
                    configured
                } else {
                    self.describe_tables(cluster)
                        .await?
                        .iter()
                        .filter_map(|t| t.route_table_id().map(str::to_string))
                        .collect()
                }
            }
        };
        match tables.as_slice() {
            [one] => Ok(one.clone()),
            many => Err(CloudError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "route {} names no route table and cluster {cluster} has {} ({})",
                    route.destination,
                    many.len(),
                    many.join(", ")
                ),
            )),
        }
    }

    /// Maps the instances of routes to node names. Before the controller has
    /// shown any nodes, unknown instances are looked up with one filtered
    /// `DescribeInstances` and named by their private DNS name (upstream's
    /// node naming), so a controller that never calls `observe_nodes` still
    /// sees its routes as its nodes'.
    /// Marks the routes to instances tagged for another cluster (and not
    /// for this one) as that cluster's ([`Route::foreign`]): with two
    /// clusters on one route table and overlapping cluster CIDRs, neither
    /// deletes the other's routes. Each instance no Node names is described
    /// once (one `DescribeInstances` per 200); a failure fails the list,
    /// since without the tags nothing proves whose a route is.
    async fn mark_other_clusters(
        &self,
        cluster: &str,
        routes: &mut [Route],
    ) -> Result<(), CloudError> {
        let candidate =
            |r: &Route| r.node.is_empty() && !r.blackhole && r.next_hop.starts_with("i-");
        let unknown: Vec<String> = {
            let st = self.state();
            routes
                .iter()
                .filter(|r| candidate(r) && !st.owners.contains_key(r.next_hop.as_str()))
                .map(|r| r.next_hop.to_string())
                .collect::<HashSet<_>>()
                .into_iter()
                .collect()
        };
        for chunk in unknown.chunks(200) {
            // A filter, not InstanceIds: a terminated id must not fail the call.
            let req = self.client.describe_instances().filters(
                Filter::builder()
                    .name("instance-id")
                    .set_values(Some(chunk.to_vec()))
                    .build(),
            );
            let out = self.call(Op::DescribeInstances, || req.send()).await?;
            let mut found: Vec<(String, Option<String>)> =
                chunk.iter().map(|id| (id.clone(), None)).collect();
            for i in out.reservations().iter().flat_map(|r| r.instances()) {
                let Some(id) = i.instance_id() else { continue };
                let tags = i
                    .tags()
                    .iter()
                    .filter_map(|t| Some((t.key()?, t.value().unwrap_or(""))));
                found.push((
                    id.to_string(),
                    tagged_cluster(tags, cluster).err().flatten(),
                ));
            }
            self.state().owners.extend(found);
        }
        let st = self.state();
        for r in routes.iter_mut().filter(|r| candidate(r)) {
            if let Some(Some(other)) = st.owners.get(r.next_hop.as_str()) {
                r.foreign = Some(
                    format!("cluster {other} (instance {} is tagged for it)", r.next_hop).into(),
                );
            }
        }
        Ok(())
    }

    /// Whose `r` is, when it is provably another cluster's.
    async fn other_cluster_of(
        &self,
        cluster: &str,
        r: &aws_sdk_ec2::types::Route,
    ) -> Result<Option<Text>, CloudError> {
        let route = {
            let st = self.state();
            to_route(r, &st.index, &st.interfaces)
        };
        let Some(route) = route else {
            return Ok(None);
        };
        let mut one = [route];
        self.mark_other_clusters(cluster, &mut one).await?;
        let [route] = one;
        Ok(route.foreign)
    }

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
        if let Some(pid) = route.node_provider_id.as_deref() {
            return instance_id_from_provider_id(pid)
                .map(str::to_string)
                .ok_or_else(|| {
                    CloudError::new(
                        ErrorKind::InvalidRequest,
                        format!(
                            "node {}: provider id {pid:?} does not name an EC2 instance (aws:///<zone>/i-...)",
                            route.node
                        ),
                    )
                });
        }
        if route.node.is_empty() {
            return Err(CloudError::new(
                ErrorKind::InvalidRequest,
                "a route to create needs a target node",
            ));
        }
        if let Some(i) = self.state().index.instance_of(&route.node) {
            return Ok(i.to_string());
        }
        // No provider id yet: upstream's fallback, the node name as the
        // instance's private DNS name.
        let req = self.client.describe_instances().filters(
            Filter::builder()
                .name("private-dns-name")
                .values(route.node.as_str())
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
                    route.node
                ),
            )),
            _ => Err(CloudError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "node {} has no spec.providerID and {} instances have it as private DNS name",
                    route.node,
                    ids.len()
                ),
            )),
        }
    }

    /// Prepares `instance` as a route target once per process: finds what
    /// a route to it must point at and turns its source/destination check
    /// off (on the instance, or on the primary interface of a multi-NIC
    /// instance, where EC2 refuses the instance-level attribute).
    ///
    /// Most instances have one interface, so the check is first turned off
    /// on the instance without looking it up: EC2 refuses that on a
    /// multi-NIC instance (`InvalidInstanceID`, "multiple interfaces"), and
    /// only then is it described. Once one instance was refused, every
    /// later one is described first: the cluster has multi-NIC Nodes, and a
    /// shared `DescribeInstances` is cheaper than a refused write per Node.
    async fn prepare_instance(&self, instance: &str) -> Result<RouteTarget, CloudError> {
        let once = self
            .state()
            .prepared
            .entry(instance.to_string())
            .or_default()
            .clone();
        // A failed attempt leaves the cell empty, so the next creation tries again.
        let target = once
            .get_or_try_init(|| async {
                let known = self.state().described.remove(instance);
                let target = match known {
                    Some(t) => t,
                    None if self.state().describe_first => self.route_target_of(instance).await?,
                    None => match self.turn_off_source_dest_check(instance).await {
                        Ok(()) => return Ok(RouteTarget::Instance(instance.to_string())),
                        Err(e) if refused_for_several_interfaces(&e) => {
                            info!(
                                instance,
                                "instance has several network interfaces; describing instances before preparing them from now on"
                            );
                            self.state().describe_first = true;
                            self.route_target_of(instance).await?
                        }
                        Err(e) => return Err(e),
                    },
                };
                self.turn_off_check_of(&target).await?;
                Ok::<_, CloudError>(target)
            })
            .await?;
        Ok(target.clone())
    }

    /// Whether the source/destination check is on for each of `ids` that
    /// EC2 shows, with what a route to it targets: the instance's own
    /// attribute, or its primary interface's when it has several (the one
    /// the route points at). One `DescribeInstances` for up to
    /// [`MAX_FILTER_VALUES`] instances. With `only_on`, EC2 answers only the
    /// instances whose check is on, so the answer grows with the offenders,
    /// not with the Nodes: for instances whose own attribute a route
    /// depends on and that were last seen off.
    async fn source_dest_checks(
        &self,
        ids: &[&str],
        only_on: bool,
    ) -> Result<Vec<(String, (RouteTarget, bool))>, CloudError> {
        // A filter, not InstanceIds: an id EC2 does not know must not fail
        // the others.
        let mut req = self.client.describe_instances().filters(
            Filter::builder()
                .name("instance-id")
                .set_values(Some(ids.iter().map(|s| s.to_string()).collect()))
                .build(),
        );
        if only_on {
            req = req.filters(
                Filter::builder()
                    .name("source-dest-check")
                    .values("true")
                    .build(),
            );
        }
        let out = self.call(Op::DescribeInstances, || req.send()).await?;
        let mut found = Vec::new();
        for i in out.reservations().iter().flat_map(|r| r.instances()) {
            let Some(id) = i.instance_id() else { continue };
            let target = self.target_of_described(id, i);
            let on = match &target {
                RouteTarget::Instance(_) => i.source_dest_check(),
                RouteTarget::Interface(eni) => i
                    .network_interfaces()
                    .iter()
                    .find(|n| n.network_interface_id() == Some(eni.as_str()))
                    .and_then(|n| n.source_dest_check()),
            };
            // An answer without the attribute says nothing: not "on".
            if let Some(on) = on {
                found.push((id.to_string(), (target, on)));
            }
        }
        Ok(found)
    }

    /// Turns the source/destination check off on what a route targets.
    async fn turn_off_check_of(&self, target: &RouteTarget) -> Result<(), CloudError> {
        match target {
            RouteTarget::Instance(i) => self.turn_off_source_dest_check(i).await,
            RouteTarget::Interface(eni) => {
                let req = self
                    .client
                    .modify_network_interface_attribute()
                    .network_interface_id(eni)
                    .source_dest_check(AttributeBooleanValue::builder().value(false).build());
                self.call(Op::ModifyNetworkInterfaceAttribute, || req.send())
                    .await
                    .map(|_| ())
            }
        }
    }

    /// Turns the source/destination check of a single-NIC instance off.
    async fn turn_off_source_dest_check(&self, instance: &str) -> Result<(), CloudError> {
        let req = self
            .client
            .modify_instance_attribute()
            .instance_id(instance)
            .source_dest_check(AttributeBooleanValue::builder().value(false).build());
        self.call(Op::ModifyInstanceAttribute, || req.send())
            .await
            .map(|_| ())
    }

    /// Forgets how `instance` was prepared, after EC2 refused an
    /// instance-level route to it: it has gained an interface since, and its
    /// next creation describes it.
    fn forget_preparation(&self, instance: &str) {
        let mut st = self.state();
        st.prepared.remove(instance);
        st.described.remove(instance);
        st.describe_first = true;
    }

    /// What a route to `instance` targets: the instance itself, or its
    /// primary network interface when it has several. An instance EC2 does
    /// not show (yet) is targeted by id, and `CreateRoute` says what is wrong
    /// with it.
    ///
    /// Concurrent lookups share `DescribeInstances` requests: a caller queues
    /// its id; the first with none in flight leads, sending one request for
    /// everything queued (up to [`MAX_FILTER_VALUES`]) and repeating while
    /// more is queued; the others wait for their answer. The room left in a
    /// request describes observed Nodes' instances not yet prepared, ahead:
    /// under EC2's write bucket the creations are paced, so lookups rarely
    /// overlap, and a burst of new Nodes would otherwise still cost about
    /// one request per instance.
    async fn route_target_of(&self, instance: &str) -> Result<RouteTarget, CloudError> {
        if let Some(t) = self.state().described.remove(instance) {
            return Ok(t);
        }
        loop {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let lead = {
                let mut st = self.state();
                st.lookups.pending.push((instance.to_string(), tx));
                !std::mem::replace(&mut st.lookups.leading, true)
            };
            if lead {
                self.lead_lookups().await;
            }
            match rx.await {
                Ok(answer) => return answer,
                // The leader was dropped before answering; its guard handed
                // the lead on, so queue again (perhaps as the new leader).
                Err(_) => continue,
            }
        }
    }

    /// Sends the queued lookups, a request at a time, until none is left.
    async fn lead_lookups(&self) {
        let mut guard = LeadGuard {
            routes: self,
            batch: Vec::new(),
            done: false,
        };
        let mut prefetch: Vec<String>;
        loop {
            guard.batch = {
                let mut st = self.state();
                let q = &mut st.lookups.pending;
                if q.is_empty() {
                    st.lookups.leading = false;
                    guard.done = true;
                    return;
                }
                let mut ids = HashSet::new();
                let mut batch = Vec::new();
                let mut rest = Vec::new();
                for (id, tx) in q.drain(..) {
                    if ids.contains(&id) || ids.len() < MAX_FILTER_VALUES {
                        ids.insert(id.clone());
                        batch.push((id, tx));
                    } else {
                        rest.push((id, tx));
                    }
                }
                *q = rest;
                let ahead: Vec<String> = {
                    let st = &*st;
                    st.index
                        .observed_instances()
                        .filter(|i| {
                            !ids.contains(*i)
                                && !st.prepared.contains_key(*i)
                                && !st.described.contains_key(*i)
                        })
                        .take(MAX_FILTER_VALUES.saturating_sub(ids.len()))
                        .map(str::to_string)
                        .collect()
                };
                prefetch = ahead;
                batch
            };
            let mut ids: Vec<String> = guard.batch.iter().map(|(id, _)| id.clone()).collect();
            ids.sort();
            ids.dedup();
            ids.extend(prefetch.iter().cloned());
            // A filter, not InstanceIds: an id EC2 does not know must not fail
            // the others' lookups.
            let req = self.client.describe_instances().filters(
                Filter::builder()
                    .name("instance-id")
                    .set_values(Some(ids))
                    .build(),
            );
            let answer = self.call(Op::DescribeInstances, || req.send()).await;
            let batch = std::mem::take(&mut guard.batch);
            match answer {
                Err(e) => {
                    for (_, tx) in batch {
                        // A waiter that went away needs no answer.
                        let _ = tx.send(Err(e.clone()));
                    }
                }
                Ok(out) => {
                    let found: HashMap<&str, &aws_sdk_ec2::types::Instance> = out
                        .reservations()
                        .iter()
                        .flat_map(|r| r.instances())
                        .filter_map(|i| i.instance_id().map(|id| (id, i)))
                        .collect();
                    for (id, tx) in batch {
                        let target = match found.get(id.as_str()) {
                            Some(i) => self.target_of_described(&id, i),
                            None => RouteTarget::Instance(id),
                        };
                        let _ = tx.send(Ok(target));
                    }
                    // An instance not shown yet is left to its own lookup.
                    for id in &prefetch {
                        if let Some(i) = found.get(id.as_str()) {
                            let target = self.target_of_described(id, i);
                            self.state().described.insert(id.clone(), target);
                        }
                    }
                }
            }
        }
    }

    /// The target of a described instance: its primary interface when it
    /// has several (remembering them all as its), else the instance.
    fn target_of_described(
        &self,
        instance: &str,
        found: &aws_sdk_ec2::types::Instance,
    ) -> RouteTarget {
        let nics = found.network_interfaces();
        if nics.len() > 1
            && let Some(eni) = nics
                .iter()
                .find(|n| n.attachment().and_then(|a| a.device_index()) == Some(0))
                .and_then(|n| n.network_interface_id())
        {
            let mut st = self.state();
            for n in nics {
                if let Some(id) = n.network_interface_id() {
                    st.interfaces.insert(id.to_string(), instance.to_string());
                }
            }
            return RouteTarget::Interface(eni.to_string());
        }
        RouteTarget::Instance(instance.to_string())
    }

    /// Maps the network interfaces of listed routes that name no instance
    /// (routes to an interface; moto never names the instance there, EC2
    /// does for an attached interface) to their instances with one filtered
    /// `DescribeNetworkInterfaces`. A failure only leaves them unmapped.
    async fn resolve_interfaces(&self, interfaces: HashSet<String>) {
        let unknown: Vec<String> = {
            let st = self.state();
            interfaces
                .into_iter()
                .filter(|e| !st.interfaces.contains_key(e))
                .collect()
        };
        if unknown.is_empty() {
            return;
        }
        // A filter, not NetworkInterfaceIds: a deleted id must not fail the call.
        let req = self.client.describe_network_interfaces().filters(
            Filter::builder()
                .name("network-interface-id")
                .set_values(Some(unknown.clone()))
                .build(),
        );
        match self
            .call(Op::DescribeNetworkInterfaces, || req.send())
            .await
        {
            Ok(out) => {
                let mut st = self.state();
                for id in &unknown {
                    st.interfaces.insert(id.clone(), String::new());
                }
                for n in out.network_interfaces() {
                    if let (Some(id), Some(i)) = (
                        n.network_interface_id(),
                        n.attachment().and_then(|a| a.instance_id()),
                    ) {
                        st.interfaces.insert(id.to_string(), i.to_string());
                    }
                }
            }
            Err(e) => warn!(
                error = %e,
                interfaces = ?unknown,
                "could not map network interfaces to instances; their routes are listed without a node"
            ),
        }
    }

    /// Whether an existing EC2 route is this cluster's (by the ownership
    /// rule) and points at an instance no Node names.
    fn is_orphan(&self, r: &aws_sdk_ec2::types::Route) -> bool {
        let st = self.state();
        // Before the controller has shown its Nodes, an unknown instance
        // may well be a Node's.
        st.index.has_observed()
            && to_route(r, &st.index, &st.interfaces).is_some_and(|route| route.node.is_empty())
    }

    async fn replace(
        &self,
        table: &str,
        dest: &Cidr,
        target: &RouteTarget,
    ) -> Result<(), CloudError> {
        let req = with_destination!(self.client.replace_route().route_table_id(table), dest);
        let req = match target {
            RouteTarget::Instance(i) => req.instance_id(i),
            RouteTarget::Interface(e) => req.network_interface_id(e),
        };
        self.call(Op::ReplaceRoute, || req.send()).await?;
        Ok(())
    }

    async fn create(
        &self,
        table: &str,
        dest: &Cidr,
        target: &RouteTarget,
    ) -> Result<(), CloudError> {
        let req = with_destination!(self.client.create_route().route_table_id(table), dest);
        let req = match target {
            RouteTarget::Instance(i) => req.instance_id(i),
            RouteTarget::Interface(e) => req.network_interface_id(e),
        };
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
/// not a route this controller could have made. The ownership rule: its
/// `Origin` is `CreateRoute` (never `CreateRouteTable`, the local route EC2
/// makes with the table, nor `EnableVgwRoutePropagation`), and it
/// points at an instance or a network interface, not at a gateway, NAT,
/// peering, transit gateway, endpoint or any other target. The planner then
/// keeps only those inside the cluster CIDRs. `interfaces` maps network
/// interfaces to instances, for routes that name only the interface.
fn to_route(
    r: &aws_sdk_ec2::types::Route,
    index: &NodeIndex,
    interfaces: &HashMap<String, String>,
) -> Option<Route> {
    let dest = r
        .destination_cidr_block()
        .or(r.destination_ipv6_cidr_block())?;
    if r.origin() != Some(&RouteOrigin::CreateRoute) {
        return None;
    }
    let blackhole = matches!(r.state(), Some(RouteState::Blackhole));
    let other_target = r.gateway_id().is_some()
        || r.nat_gateway_id().is_some()
        || r.transit_gateway_id().is_some()
        || r.vpc_peering_connection_id().is_some()
        || r.egress_only_internet_gateway_id().is_some()
        || r.local_gateway_id().is_some()
        || r.carrier_gateway_id().is_some()
        || r.core_network_arn().is_some()
        || r.destination_prefix_list_id().is_some();
    if other_target {
        return None;
    }
    // A route to an interface names the interface; EC2 names its instance
    // too while attached. A terminated instance leaves a blackhole that
    // names only its (deleted) interface.
    let eni = r.network_interface_id();
    let instance = r
        .instance_id()
        .or_else(|| eni.and_then(|e| interfaces.get(e)).map(String::as_str))
        .filter(|i| !i.is_empty());
    // The instance where EC2 names one (it does for a route to an attached
    // interface too), else the interface.
    let target = r.instance_id().or(eni)?;
    let node = instance.and_then(|i| index.node_of(i)).unwrap_or_default();
    let mut route = Route::new(node, Destination::parse(dest)).named(dest);
    route.blackhole = blackhole;
    route.next_hop = target.to_string().into();
    // As `create_route` returns it, so a cached creation and a later list
    // agree (the trait promises that).
    route.node_provider_id = instance
        .and_then(|i| index.provider_id_of(i))
        .map(Into::into);
    Some(route)
}

/// Whether EC2 refused an instance-level request because the instance has
/// several network interfaces (`InvalidInstanceID`, HTTP 400, "There are
/// multiple interfaces attached to instance ..."); the error code alone
/// also covers other refusals.
fn refused_for_several_interfaces(e: &CloudError) -> bool {
    e.message.contains("InvalidInstanceID (HTTP") && e.message.contains("multiple interfaces")
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
            // Per route table, as EC2's quota.
            max_routes: self.config.max_routes,
            // The route's target is the instance of `spec.providerID`.
            needs: TargetNeeds::ProviderId,
            // A creation over a listed blackhole is one `ReplaceRoute`.
            replaces_blackholes: true,
            // The source/destination check, verified at start and on resync.
            checks_forwarding: true,
            // EC2 counts IPv4 and IPv6 routes against separate quotas.
            max_routes_per_family: true,
        }
    }

    fn stats(&self) -> &RequestStats {
        self.meter.stats()
    }

    async fn check_forwarding(
        &self,
        _cluster: &str,
        nodes: &[Arc<NodeView>],
        check: ForwardingCheck,
    ) -> Result<Vec<(String, Forwarding)>, CloudError> {
        let of_node: Vec<(&str, &str)> = nodes
            .iter()
            .filter_map(|n| {
                let id = instance_id_from_provider_id(n.provider_id.as_deref()?)?;
                Some((n.name.as_str(), id))
            })
            .collect();
        if !check.fresh {
            // An instance this process prepared had its check turned off;
            // the others are prepared by their first route's creation.
            let st = self.state();
            return Ok(of_node
                .into_iter()
                .filter(|(_, i)| st.prepared.get(*i).is_some_and(|c| c.initialized()))
                .map(|(n, _)| (n.to_string(), Forwarding::Ready))
                .collect());
        }
        let mut ids: Vec<&str> = of_node.iter().map(|(_, i)| *i).collect();
        ids.sort_unstable();
        ids.dedup();
        // An instance whose own check was last seen off (turned off or read
        // off by this process) is asked only whether it is on again: an
        // instance the answer leaves out is as last seen. The others (never
        // seen, or routed through an interface, whose attribute the
        // instance filter does not read) are described whole.
        let last_off: HashSet<&str> = {
            let st = self.state();
            ids.iter()
                .copied()
                .filter(|i| {
                    st.prepared.get(*i).and_then(|c| c.get())
                        == Some(&RouteTarget::Instance(i.to_string()))
                })
                .collect()
        };
        let (known, unknown): (Vec<&str>, Vec<&str>) =
            ids.iter().partition(|i| last_off.contains(*i));
        let mut found = HashMap::new();
        for id in &known {
            found.insert(
                id.to_string(),
                (RouteTarget::Instance(id.to_string()), false),
            );
        }
        for chunk in known.chunks(MAX_FILTER_VALUES) {
            for (id, on) in self.source_dest_checks(chunk, true).await? {
                found.insert(id, on);
            }
        }
        for chunk in unknown.chunks(MAX_FILTER_VALUES) {
            for (id, (target, on)) in self.source_dest_checks(chunk, false).await? {
                if !on {
                    // Seen off: the next check asks only whether it is on
                    // again, and its first route needs no write.
                    self.state().prepared.insert(
                        id.clone(),
                        Arc::new(tokio::sync::OnceCell::new_with(Some(target.clone()))),
                    );
                }
                found.insert(id, (target, on));
            }
        }
        let mut out = Vec::new();
        for (node, instance) in of_node {
            let Some((target, on)) = found.get(instance) else {
                // Not shown (terminated, or not yet visible): no news.
                continue;
            };
            if !on {
                out.push((node.to_string(), Forwarding::Ready));
                continue;
            }
            let what = match target {
                RouteTarget::Instance(i) => {
                    format!("the source/destination check of instance {i} was on")
                }
                RouteTarget::Interface(e) => format!(
                    "the source/destination check of network interface {e} (instance {instance}) was on"
                ),
            };
            if !check.repair {
                out.push((node.to_string(), Forwarding::WouldRepair { what }));
                continue;
            }
            if let Err(e) = self.turn_off_check_of(target).await {
                // One refused repair must not hide the others' answers; the
                // Node reads ForwardingDisabled and is read again (and
                // repaired) within minutes.
                warn!(node, instance, error = %e, "{what}; could not turn it off");
                let fix = format!(
                    "The controller could not turn it off ({e}) and tries again within minutes; `aws ec2 modify-instance-attribute --no-source-dest-check` does it by hand."
                );
                out.push((node.to_string(), Forwarding::Disabled { what, fix }));
                continue;
            }
            // Prepared again, for the next creations' sake.
            let cell = tokio::sync::OnceCell::new_with(Some(target.clone()));
            self.state()
                .prepared
                .insert(instance.to_string(), Arc::new(cell));
            info!(node, instance, "{what}; turned it off");
            out.push((node.to_string(), Forwarding::Repaired { what }));
        }
        Ok(out)
    }

    fn unlisted_routes(&self) -> Vec<((Text, IpFamily), usize)> {
        self.state()
            .unlisted
            .iter()
            .map(|((t, f), n)| ((t.as_str().into(), *f), *n))
            .collect()
    }

    fn observe_nodes(&self, nodes: &[Arc<NodeView>]) {
        let mut st = self.state();
        st.index.observe(nodes);
        let State {
            index, described, ..
        } = &mut *st;
        described.retain(|i, _| index.node_of(i).is_some());
    }

    fn targets(&self) -> Vec<Text> {
        let st = self.state();
        if st.last_tables.is_empty() {
            self.config
                .configured_tables()
                .into_iter()
                .map(Into::into)
                .collect()
        } else {
            st.last_tables.iter().map(|t| t.as_str().into()).collect()
        }
    }

    async fn discover_targets(&self, cluster: &str) -> Result<Option<Vec<Text>>, CloudError> {
        let cluster = self.tag_cluster(cluster);
        if !self.config.configured_tables().is_empty() {
            // Configured ids are the targets; a list checks they still exist.
            return Ok(None);
        }
        // One filtered DescribeRouteTables (a page per 100 tables); the
        // routes it carries are not used, the full pass that follows a
        // change lists them with everything else.
        let mut ids: Vec<Text> = self
            .discover_tables(cluster)
            .await?
            .iter()
            .filter_map(|t| t.route_table_id().map(Text::from))
            .collect();
        ids.sort();
        Ok(Some(ids))
    }

    async fn list_routes(&self, cluster: &str) -> Result<Vec<Route>, CloudError> {
        let cluster = self.tag_cluster(cluster);
        let tables = self.describe_tables(cluster).await?;
        let all = || tables.iter().flat_map(|t| t.routes());
        let instances: Vec<String> = all()
            .filter_map(|r| r.instance_id().map(str::to_string))
            .collect();
        self.resolve_unknown_instances(&instances).await?;
        let interfaces: HashSet<String> = all()
            .filter(|r| {
                r.instance_id().is_none()
                    && r.origin() == Some(&RouteOrigin::CreateRoute)
                    && !matches!(r.state(), Some(RouteState::Blackhole))
            })
            .filter_map(|r| r.network_interface_id().map(str::to_string))
            .collect();
        self.resolve_interfaces(interfaces).await;
        let mut routes = Vec::new();
        {
            let mut st = self.state();
            let mut blackholes: Vec<(String, HashSet<String>)> = Vec::new();
            let mut unlisted: HashMap<(String, IpFamily), usize> = HashMap::new();
            for t in &tables {
                let id = t.route_table_id().unwrap_or_default();
                let mut holes = HashSet::new();
                for r in t.routes() {
                    if let Some(route) = to_route(r, &st.index, &st.interfaces) {
                        if route.blackhole {
                            holes.insert(route.name.to_string());
                        }
                        routes.push(route.in_table(id));
                    } else if r.origin() != Some(&RouteOrigin::EnableVgwRoutePropagation) {
                        // Propagated routes have a quota of their own.
                        let family = if r.destination_ipv6_cidr_block().is_some() {
                            IpFamily::V6
                        } else {
                            IpFamily::V4
                        };
                        *unlisted.entry((id.to_string(), family)).or_default() += 1;
                    }
                }
                blackholes.push((id.to_string(), holes));
            }
            st.unlisted = unlisted;
            for (id, holes) in blackholes {
                st.blackholes.insert(id, holes);
            }
        }
        self.mark_other_clusters(cluster, &mut routes).await?;
        // One unknown instance never fails the list (upstream fails the
        // whole ListRoutes): its route names no node, and the planner
        // deletes it only inside the cluster CIDRs when no Node claims it.
        let unknown: Vec<String> = routes
            .iter()
            .filter(|r| r.node.is_empty() && !r.blackhole && r.foreign.is_none())
            .map(|r| format!("{} {} -> {}", r.table, r.name, r.next_hop))
            .collect();
        if !unknown.is_empty() {
            warn!(
                cluster,
                count = unknown.len(),
                routes = ?unknown.iter().take(10).collect::<Vec<_>>(),
                "routes to instances no Node names"
            );
        }
        Ok(routes)
    }

    async fn create_route(
        &self,
        cluster: &str,
        _name_hint: &str,
        route: &Route,
    ) -> Result<Route, CloudError> {
        let cluster = self.tag_cluster(cluster);
        let dest = route.destination.cidr().ok_or_else(|| {
            CloudError::new(
                ErrorKind::InvalidRequest,
                format!("route destination {} is not a CIDR", route.destination),
            )
        })?;
        let dest_text = dest.to_string();
        let instance = self.target_instance(route).await?;
        let table = self.table_of(cluster, route).await?;
        let target = self.prepare_instance(&instance).await?;

        let over_blackhole = self
            .state()
            .blackholes
            .get(&table)
            .is_some_and(|b| b.contains(&dest_text));
        let created = if over_blackhole {
            match self.replace(&table, &dest, &target).await {
                // Someone removed the blackhole meanwhile.
                Err(e) if e.kind == ErrorKind::NotFound => {
                    self.create(&table, &dest, &target).await
                }
                r => r,
            }
        } else {
            self.create(&table, &dest, &target).await
        };
        match created {
            Ok(()) => {}
            Err(e) if e.kind == ErrorKind::AlreadyExists => {
                // One extra read decides between done, replace and conflict.
                match self.existing_route(&table, &dest).await? {
                    // A dead target is replaced in one call. A live route to
                    // another instance is a conflict the planner resolves.
                    Some(r) if matches!(r.state(), Some(RouteState::Blackhole)) => {
                        self.replace(&table, &dest, &target).await?;
                    }
                    Some(r)
                        if r.instance_id() == Some(instance.as_str())
                            || r.network_interface_id() == Some(target.id()) =>
                    {
                        debug!(destination = %dest, instance, table, "route already in place");
                    }
                    // A route of ours (by the ownership rule) to an
                    // instance no Node names any more, e.g. the Node's
                    // previous instance: moved in one `ReplaceRoute`
                    // instead of a delete and a create.
                    Some(r) if self.is_orphan(&r) => {
                        // Unless the instance is another cluster's: taking
                        // its route would start the fight two clusters on
                        // one table must not have. The planner sees the
                        // route at the next list and reports the overlap.
                        if let Some(owner) = self.other_cluster_of(cluster, &r).await? {
                            info!(destination = %dest, table, owner = %owner, "the destination is routed to another cluster's instance; not replaced");
                            return Err(CloudError::new(
                                ErrorKind::AlreadyExists,
                                format!("{dest} in {table} is routed to {owner}"),
                            ));
                        }
                        info!(
                            destination = %dest,
                            table,
                            from = ?r.instance_id().or(r.network_interface_id()),
                            to = target.id(),
                            "replacing a route to an instance no Node names"
                        );
                        self.replace(&table, &dest, &target).await?;
                    }
                    _ => return Err(e),
                }
            }
            Err(e) if refused_for_several_interfaces(&e) => {
                self.forget_preparation(&instance);
                return Err(CloudError::new(
                    ErrorKind::Transient,
                    format!(
                        "{}; the instance is described again on the next attempt",
                        e.message
                    ),
                ));
            }
            Err(e) => return Err(e),
        }

        let mut st = self.state();
        if let Some(b) = st.blackholes.get_mut(&table) {
            b.remove(&dest_text);
        }
        st.index.learn(&instance, &route.node);
        drop(st);
        info!(cluster, table, destination = %dest, target = target.id(), node = %route.node, "created route");
        let mut created = Route::new(route.node.clone(), dest)
            .named(dest_text)
            .in_table(table.as_str());
        created.next_hop = target.id().into();
        created.node_provider_id = route.node_provider_id.clone();
        Ok(created)
    }

    async fn delete_route(&self, cluster: &str, route: &Route) -> Result<(), CloudError> {
        let cluster = self.tag_cluster(cluster);
        let dest = destination_of(route)?;
        let table = self.table_of(cluster, route).await?;
        let req = with_destination!(self.client.delete_route().route_table_id(&table), &dest);
        self.call(Op::DeleteRoute, || req.send()).await?;
        if let Some(b) = self.state().blackholes.get_mut(&table) {
            b.remove(&dest.to_string());
        }
        info!(cluster, table, destination = %dest, target = %route.next_hop, "deleted route");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_is_the_clusters_by_either_tag_and_anothers_by_either() {
        let c = "prod";
        assert_eq!(
            tagged_cluster([("kubernetes.io/cluster/prod", "owned")], c),
            Ok(())
        );
        assert_eq!(tagged_cluster([("KubernetesCluster", "prod")], c), Ok(()));
        assert_eq!(
            tagged_cluster([("kubernetes.io/cluster/dev", "owned")], c),
            Err(Some("dev".to_string()))
        );
        assert_eq!(
            tagged_cluster([("Name", "x"), ("KubernetesCluster", "dev")], c),
            Err(Some("dev".to_string()))
        );
        // Tagged for both: ours, never deleted as a stray of another.
        assert_eq!(
            tagged_cluster(
                [
                    ("KubernetesCluster", "dev"),
                    ("kubernetes.io/cluster/prod", "")
                ],
                c
            ),
            Ok(())
        );
        assert_eq!(tagged_cluster([("KubernetesCluster", "")], c), Err(None));
        assert_eq!(tagged_cluster([("Name", "prod")], c), Err(None));
    }
    use aws_sdk_ec2::types::Route as Ec2Route;

    fn index_with(instance: &str, node: &str) -> NodeIndex {
        let mut ix = NodeIndex::default();
        ix.observe(&[
            NodeView::new(node, "u", &[]).with_provider_id(format!("aws:///z/{instance}"))
        ]);
        ix
    }

    fn owned(b: aws_sdk_ec2::types::builders::RouteBuilder) -> Ec2Route {
        b.origin(RouteOrigin::CreateRoute).build()
    }

    #[test]
    fn only_created_routes_to_instances_and_interfaces_are_listed() {
        let ix = index_with("i-0000000a", "node-a");
        let mut enis = HashMap::new();
        enis.insert("eni-1".to_string(), "i-0000000a".to_string());
        let none = HashMap::new();
        let local = Ec2Route::builder()
            .destination_cidr_block("10.0.0.0/16")
            .gateway_id("local")
            .origin(RouteOrigin::CreateRouteTable)
            .state(RouteState::Active)
            .build();
        let igw = owned(
            Ec2Route::builder()
                .destination_cidr_block("0.0.0.0/0")
                .gateway_id("igw-1")
                .state(RouteState::Active),
        );
        let nat_blackhole = owned(
            Ec2Route::builder()
                .destination_cidr_block("10.1.0.0/16")
                .nat_gateway_id("nat-1")
                .state(RouteState::Blackhole),
        );
        let peering = owned(
            Ec2Route::builder()
                .destination_cidr_block("10.244.7.0/24")
                .vpc_peering_connection_id("pcx-1")
                .state(RouteState::Active),
        );
        let tgw = owned(
            Ec2Route::builder()
                .destination_cidr_block("10.244.8.0/24")
                .transit_gateway_id("tgw-1")
                .state(RouteState::Active),
        );
        let endpoint = owned(
            Ec2Route::builder()
                .destination_cidr_block("10.244.9.0/24")
                .gateway_id("vpce-1")
                .state(RouteState::Active),
        );
        // CloudFormation/Terraform: part of the table's own definition.
        let stack = Ec2Route::builder()
            .destination_cidr_block("10.244.10.0/24")
            .instance_id("i-0000000a")
            .origin(RouteOrigin::CreateRouteTable)
            .state(RouteState::Active)
            .build();
        let propagated = Ec2Route::builder()
            .destination_cidr_block("10.244.11.0/24")
            .instance_id("i-0000000a")
            .origin(RouteOrigin::EnableVgwRoutePropagation)
            .state(RouteState::Active)
            .build();
        let no_origin = Ec2Route::builder()
            .destination_cidr_block("10.244.12.0/24")
            .instance_id("i-0000000a")
            .state(RouteState::Active)
            .build();
        for r in [
            &local,
            &igw,
            &nat_blackhole,
            &peering,
            &tgw,
            &endpoint,
            &stack,
            &propagated,
            &no_origin,
        ] {
            assert!(to_route(r, &ix, &enis).is_none(), "{r:?} was listed");
        }

        let eni_active = owned(
            Ec2Route::builder()
                .destination_cidr_block("10.2.0.0/16")
                .network_interface_id("eni-1")
                .state(RouteState::Active),
        );
        let r = to_route(&eni_active, &ix, &enis).unwrap();
        assert_eq!(
            r.node, "node-a",
            "the interface maps back to its instance's Node"
        );
        assert_eq!(r.next_hop, "eni-1");
        assert_eq!(r.node_provider_id.as_deref(), Some("aws:///z/i-0000000a"));
        let r = to_route(&eni_active, &ix, &none).unwrap();
        assert_eq!(r.node, "", "an unmapped interface names no node");

        let mine = owned(
            Ec2Route::builder()
                .destination_cidr_block("10.244.1.0/24")
                .instance_id("i-0000000a")
                .network_interface_id("eni-2")
                .state(RouteState::Active),
        );
        let r = to_route(&mine, &ix, &none).unwrap();
        assert_eq!(r.node, "node-a");
        assert_eq!(r.name, "10.244.1.0/24");
        assert_eq!(r.next_hop, "i-0000000a");
        assert!(!r.blackhole);
        assert_eq!(
            r.node_provider_id.as_deref(),
            Some("aws:///z/i-0000000a"),
            "the observed Node's providerID, as a creation returns it"
        );

        let stranger = owned(
            Ec2Route::builder()
                .destination_ipv6_cidr_block("fd00:10:244:2::/64")
                .instance_id("i-0000000b")
                .state(RouteState::Active),
        );
        let r = to_route(&stranger, &ix, &none).unwrap();
        assert_eq!(r.node, "", "unknown instance names no node");
        assert_eq!(r.node_provider_id, None);
        assert_eq!(r.destination.to_string(), "fd00:10:244:2::/64");

        let gone = owned(
            Ec2Route::builder()
                .destination_cidr_block("10.244.3.0/24")
                .network_interface_id("eni-3")
                .state(RouteState::Blackhole),
        );
        let r = to_route(&gone, &ix, &none).unwrap();
        assert!(r.blackhole);
        assert_eq!(r.next_hop, "eni-3");
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
        let e = l
            .bucket(Op::CreateRoute)
            .acquire_fenced(&fence)
            .await
            .unwrap_err();
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
        l.bucket(Op::DeleteRoute).acquire().await;
        assert_eq!(t0.elapsed(), Duration::ZERO);
        let waited = l.bucket(Op::CreateRoute).acquire().await;
        assert!(waited >= Duration::from_secs(1), "{waited:?}");
    }
}
