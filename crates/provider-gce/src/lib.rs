//! The Google Compute Engine provider (`--cloud-provider gce`): routes-based
//! clusters, one global `Route` resource per Node pod CIDR in one VPC network.
//!
//! A GCE route is `{name, network, destRange, nextHopInstance, priority,
//! description}`. Inserting and deleting one are asynchronous operations of
//! the `globalOperations` collection, and every request counts against the
//! project's per-minute quotas, which answer 403 `rateLimitExceeded` when
//! spent and refill at the next minute boundary. This provider:
//!
//! - talks to the API through Google's official client
//!   (`google-cloud-compute-v1`, services `routes`, `networks` and
//!   `global-operations` only), with the client's own retries off so every
//!   request passes this crate's budget and counters once;
//! - lists with `routes.list` filtered on the server as upstream
//!   (`gce_routes.go`) does: name `<cluster[:26]>-.*`, the network's URL and
//!   description `k8s-node-route`, one request per page of up to 500, and
//!   checks the three again on every answer, the name strictly (see
//!   [`owned_name`]: upstream's `<cluster>-.*` also matches cluster
//!   `<cluster>-prod`), so routes of other clusters, networks or tools in the
//!   same project are never listed, hence never deleted;
//! - creates with one `routes.insert` (priority 1000, description
//!   `k8s-node-route`, `nextHopInstance` from the Node's providerID
//!   `gce://<project>/<zone>/<instance>`, no `instances.get`), deletes with
//!   one `routes.delete` by name, and follows each operation with
//!   `globalOperations.wait` (one request while it runs, usually), never
//!   reading one operation twice within `operation_poll_min_ms` and never
//!   more than 5 operation reads per second, bounded by
//!   `operation_timeout_secs`;
//! - names a route after its destination (`<cluster[:26]>-10-244-1-0-24`),
//!   not after the Node's UID as upstream does: a retried insert then meets
//!   its own route (409, read back, the same: done), and a dual-stack Node's
//!   two routes do not share one name (upstream's second insert answers 409,
//!   is taken for success, and the IPv6 route never exists);
//! - refuses IPv6 destinations unless the network has an internal IPv6
//!   range (`enableUlaInternalIpv6`, read once at start) or `ipv6: true`;
//! - checks that each Node's instance can forward pod traffic
//!   (`canIpForward`), with one `instances.get` per instance, remembered,
//!   and never changes it (see `forwarding.rs` and the crate's README).
//!
//! Ownership: this crate translates; the controller decides what should
//! exist. The [`testing`] module (feature `testing`) is a stateful stand-in for
//! the REST API used by tests here and in the controller's end-to-end suite.

pub mod alt_token;
pub mod config;
mod entry;
mod error;
mod forwarding;
pub mod native;
pub mod permissions;
#[cfg(feature = "testing")]
pub mod testing;

pub use entry::PROVIDER;

use std::collections::HashMap;
use std::hash::Hasher;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use google_cloud_compute_v1::client::{GlobalOperations, Instances, Networks, Routes};
use google_cloud_compute_v1::model::Operation;
use google_cloud_compute_v1::model::operation::Status as OpStatus;
use google_cloud_gax::options::RequestOptionsBuilder as _;
use google_cloud_gax::retry_policy::NeverRetry;
use provider_kit::Meter;
use route_cloud::ratelimit::TokenBucket;
use route_cloud::{
    Capabilities, CloudError, CloudRoutes, ErrorKind, Fence, Forwarding, ForwardingCheck,
    RequestStats,
};
use route_core::{Cidr, Destination, IpFamily, NodeView, Route, TargetNeeds, Text};
use tokio::time::Instant;
use tracing::{debug, info, warn};

pub use crate::config::{ConfigError, GceConfig};
pub use crate::error::{classify, kind_of_answer, kind_of_operation_error};
pub use crate::forwarding::{disabled_fix, disabled_what};

/// The description upstream gives the routes it creates, and the third part
/// of its list filter (`k8sNodeRouteTag` in `gce.go`).
pub const ROUTE_DESCRIPTION: &str = "k8s-node-route";

/// The priority upstream gives its routes.
pub const ROUTE_PRIORITY: u32 = 1000;

/// The prefix of Compute Engine instances' `spec.providerID`.
pub const PROVIDER_ID_PREFIX: &str = "gce://";

/// Upstream truncates the cluster name to 26 characters so that the prefix,
/// a dash and a 36-character UID fit GCE's 63-character names.
pub const CLUSTER_PREFIX_LEN: usize = 26;

/// The longest resource name GCE accepts.
const MAX_NAME_LEN: usize = 63;

/// The longest one `globalOperations.wait` stays open on the server (the
/// API documents "approach the 2 minute deadline").
const SERVER_WAIT: Duration = Duration::from_secs(120);

/// Route warnings that mean the next hop cannot take traffic.
const BLACKHOLE_WARNINGS: [&str; 2] = ["NEXT_HOP_INSTANCE_NOT_FOUND", "NEXT_HOP_NOT_RUNNING"];

/// The route-name prefix of `cluster`, as upstream (`truncateClusterName`).
pub fn cluster_prefix(cluster: &str) -> &str {
    match cluster.char_indices().nth(CLUSTER_PREFIX_LEN) {
        Some((i, _)) => &cluster[..i],
        None => cluster,
    }
}

/// The name of `cluster`'s route for `destination`: the prefix, a dash and
/// the destination spelled with dashes (`10-244-1-0-24`; IPv6 as `v6-`, the
/// prefix's hex digits and its length). When that is longer than GCE's 63
/// characters, `d` and 16 hex digits of a hash of the destination instead.
pub fn route_name(cluster: &str, destination: &Cidr) -> String {
    let prefix = cluster_prefix(cluster);
    let spelled = match destination.network() {
        IpAddr::V4(a) => {
            let o = a.octets();
            format!(
                "{}-{}-{}-{}-{}",
                o[0],
                o[1],
                o[2],
                o[3],
                destination.prefix_len()
            )
        }
        IpAddr::V6(a) => {
            let hex: String = a.octets().iter().map(|b| format!("{b:02x}")).collect();
            let nibbles = usize::from(destination.prefix_len()).div_ceil(4).max(1);
            format!("v6-{}-{}", &hex[..nibbles], destination.prefix_len())
        }
    };
    let name = format!("{prefix}-{spelled}");
    if name.len() <= MAX_NAME_LEN {
        return name;
    }
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    h.write(destination.to_string().as_bytes());
    format!("{prefix}-d{:016x}", h.finish())
}

struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// An instance as `(project, zone, name)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InstanceRef {
    /// The instance's project.
    pub project: String,
    /// Its zone.
    pub zone: String,
    /// Its name.
    pub name: String,
}

impl InstanceRef {
    /// Parses a Node's `spec.providerID`, `gce://<project>/<zone>/<instance>`.
    pub fn from_provider_id(id: &str) -> Option<Self> {
        let rest = id.trim().strip_prefix(PROVIDER_ID_PREFIX)?;
        let mut parts = rest.split('/');
        let (project, zone, name) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || [project, zone, name].iter().any(|p| p.is_empty()) {
            return None;
        }
        Some(Self {
            project: project.into(),
            zone: zone.into(),
            name: name.into(),
        })
    }

    /// Parses a `nextHopInstance` as the API shows it: a full URL
    /// (`https://www.googleapis.com/compute/v1/projects/p/zones/z/instances/i`)
    /// or a partial one (`projects/p/zones/z/instances/i`).
    pub fn from_url(url: &str) -> Option<Self> {
        let at = url.find("projects/")?;
        let mut parts = url[at..].split('/');
        match (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) {
            (
                Some("projects"),
                Some(p),
                Some("zones"),
                Some(z),
                Some("instances"),
                Some(n),
                None,
            ) if !p.is_empty() && !z.is_empty() && !n.is_empty() => Some(Self {
                project: p.into(),
                zone: z.into(),
                name: n.into(),
            }),
            _ => None,
        }
    }

    /// `projects/<p>/zones/<z>/instances/<i>`, the form this provider sends
    /// and reports as a route's cloud target.
    pub fn path(&self) -> String {
        format!(
            "projects/{}/zones/{}/instances/{}",
            self.project, self.zone, self.name
        )
    }

    /// `gce://<p>/<z>/<i>`.
    pub fn provider_id(&self) -> String {
        format!(
            "{PROVIDER_ID_PREFIX}{}/{}/{}",
            self.project, self.zone, self.name
        )
    }
}

/// Whether `name` is one `cluster` gives its route to `dest_range`: the
/// prefix and a dash, then either this provider's spelling of the
/// destination ([`route_name`]) or a UID (upstream's `<prefix>-<node UID>`,
/// so routes upstream created are adopted). Upstream's `<prefix>-.*` alone
/// would also claim cluster `k8s-prod`'s routes for cluster `k8s`.
pub fn owned_name(cluster: &str, name: &str, dest_range: &str) -> bool {
    let Some(suffix) = name
        .strip_prefix(cluster_prefix(cluster))
        .and_then(|s| s.strip_prefix('-'))
    else {
        return false;
    };
    if is_uid(suffix) {
        return true;
    }
    Cidr::parse(dest_range).is_ok_and(|d| route_name(cluster, &d) == name)
}

/// A Kubernetes UID: 8-4-4-4-12 lowercase hex digits.
fn is_uid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups.iter().zip([8, 4, 4, 4, 12]).all(|(g, n)| {
            g.len() == n
                && g.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

/// The `projects/...` path of a resource URL (`network`, `selfLink`), so a
/// full URL and a partial one compare equal.
fn resource_path(url: &str) -> &str {
    url.find("projects/").map_or(url, |at| &url[at..])
}

/// Escapes RE2 metacharacters, so a filter value matches only itself.
fn re2_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The server-side list filter: upstream's (k8s-cloud-provider's
/// `filter.Regexp(..).AndRegexp(..)`, each value an RE2 expression that
/// must match the whole field) without its name term, so that every
/// cluster's node routes in the network are listed. Another cluster's are
/// then known as such ([`Route::foreign`]): never deleted, and a pod CIDR
/// over one gets a Warning instead of a second route for the destination.
pub fn list_filter(network_url: &str) -> String {
    format!(
        "(network eq \"{}\") (description eq \"{}\")",
        re2_escape(network_url),
        re2_escape(ROUTE_DESCRIPTION)
    )
}

/// The Google Compute Engine route provider.
#[derive(Debug)]
pub struct GceRoutes {
    config: GceConfig,
    routes: Routes,
    operations: GlobalOperations,
    /// Only `instances.get`, for the forwarding check.
    instances: Instances,
    /// The network's `selfLink`, as routes carry it.
    network_url: String,
    supports_ipv6: bool,
    meter: Meter,
    /// The client's budget for list, insert, get and delete.
    requests: TokenBucket,
    /// Upstream's `operationPollRateLimiter`: operation reads per second.
    polls: TokenBucket,
    /// Instances to Node names, from the Nodes' providerIDs.
    nodes: Mutex<HashMap<InstanceRef, Text>>,
    /// `canIpForward` of every instance read so far.
    forwarding: Mutex<HashMap<InstanceRef, bool>>,
}

/// Builds one service client of the official library with this crate's
/// endpoint, credentials and no retries of its own.
macro_rules! client {
    ($ty:ty, $config:expr, $creds:expr) => {
        <$ty>::builder()
            .with_endpoint($config.endpoint.trim_end_matches('/'))
            .with_credentials($creds.clone())
            .with_retry_policy(NeverRetry)
            .build()
            .await
            .map_err(|e| ConfigError::Client(e.to_string()))?
    };
}

impl GceRoutes {
    /// Builds the clients and reads the network once (its URL for the list
    /// filter and new routes, and whether it has an internal IPv6 range).
    pub async fn connect(config: GceConfig) -> Result<Self, ConfigError> {
        let config = config.resolve()?;
        let creds = credentials(&config)?;
        let routes = client!(Routes, config, creds);
        let operations = client!(GlobalOperations, config, creds);
        let networks = client!(Networks, config, creds);
        let instances = client!(Instances, config, creds);
        let meter = Meter::default();
        let project = config.routes_project().to_string();
        let answer = networks
            .get()
            .set_project(&project)
            .set_network(&config.network)
            .with_attempt_timeout(config.request_timeout())
            .send()
            .await;
        let answer = answer.map_err(|e| classify("networks.get", &e));
        meter.count("get_network", &answer);
        let network = answer.map_err(|e| ConfigError::Network {
            project: project.clone(),
            network: config.network.clone(),
            reason: e.message,
        })?;
        let network_url = network.self_link.clone().unwrap_or_else(|| {
            format!(
                "https://www.googleapis.com/compute/v1/projects/{project}/global/networks/{}",
                config.network
            )
        });
        let has_v6 = network.enable_ula_internal_ipv_6.unwrap_or(false)
            || network.internal_ipv_6_range.is_some();
        let supports_ipv6 = config.ipv6.unwrap_or(has_v6);
        info!(
            network = %network_url,
            ipv6 = supports_ipv6,
            "gce: managing the routes of one network"
        );
        let requests = TokenBucket::per_period(
            config.requests_per_minute,
            Duration::from_secs(60),
            config.burst,
        );
        let polls = TokenBucket::new(
            config.operation_polls_per_second,
            config.operation_poll_burst,
        );
        Ok(Self {
            config,
            routes,
            operations,
            instances,
            network_url,
            supports_ipv6,
            meter,
            requests,
            polls,
            nodes: Mutex::new(HashMap::new()),
            forwarding: Mutex::new(HashMap::new()),
        })
    }

    /// Checks `fence` after every wait of this provider's own (its budget,
    /// throttling pauses) before sending a change, so a change that waited
    /// past this replica's renew deadline is never sent.
    pub fn with_fence(mut self, fence: Fence) -> Self {
        self.meter.set_fence(fence);
        self
    }

    /// The configuration in use.
    pub fn config(&self) -> &GceConfig {
        &self.config
    }

    /// The managed network's URL.
    pub fn network_url(&self) -> &str {
        &self.network_url
    }

    fn project(&self) -> &str {
        self.config.routes_project()
    }

    /// Sends one request inside `bucket` (a `change` through the fence)
    /// and counts it under `operation`; on a throttling answer pauses
    /// `bucket` until the API's quota window turns over and says so in the
    /// error.
    async fn send<T>(
        &self,
        operation: &'static str,
        bucket: &TokenBucket,
        change: bool,
        request: impl Future<Output = Result<T, google_cloud_gax::error::Error>>,
    ) -> Result<T, CloudError> {
        let mut answer = self
            .meter
            .call(operation, bucket, change, request, |e| {
                classify(operation, &e)
            })
            .await;
        if let Err(err) = &mut answer
            && err.kind == ErrorKind::Throttled
        {
            let wait = until_window_turns(self.config.quota_window_secs);
            bucket.pause_until(Instant::now() + wait).await;
            err.retry_after = Some(wait);
        }
        answer
    }

    /// Follows an insert's or a delete's operation until it is `DONE`, with
    /// `globalOperations.wait`, within `operation_timeout_secs`. A read that
    /// fails or a deadline that passes leaves the outcome unknown: `Timeout`.
    async fn finish(&self, mut op: Operation, creating: bool) -> Result<(), CloudError> {
        let deadline = Instant::now() + Duration::from_secs(self.config.operation_timeout_secs);
        let min_gap = Duration::from_millis(self.config.operation_poll_min_ms);
        let cap = Duration::from_secs(self.config.operation_wait_secs).min(SERVER_WAIT);
        let name = op.name.clone().unwrap_or_default();
        let mut last_read: Option<Instant> = None;
        loop {
            if op.status == Some(OpStatus::Done) {
                return operation_result(&op, creating);
            }
            if name.is_empty() {
                return Err(CloudError::new(
                    ErrorKind::Timeout,
                    "gce: the API answered an operation without a name; its outcome is unknown",
                ));
            }
            if let Some(t) = last_read {
                tokio::time::sleep_until(t + min_gap).await;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CloudError::new(
                    ErrorKind::Timeout,
                    format!(
                        "gce: operation {name} not done after {} s; its outcome is unknown",
                        self.config.operation_timeout_secs
                    ),
                ));
            }
            // The attempt is cut to what is left once the poll's token came.
            let wait = async {
                last_read = Some(Instant::now());
                let attempt = cap.min(deadline.saturating_duration_since(Instant::now()));
                self.operations
                    .wait()
                    .set_project(self.project())
                    .set_operation(&name)
                    .with_attempt_timeout(attempt.max(Duration::from_millis(1)))
                    .send()
                    .await
            };
            match self.send("wait_operation", &self.polls, false, wait).await {
                Ok(next) => op = next,
                // A wait that the client cut at its own attempt timeout is
                // no answer about the operation: ask again.
                Err(e) if e.is_retryable() && Instant::now() < deadline => {
                    debug!(operation = %name, error = %e, "gce: reading the operation again");
                }
                Err(e) => {
                    return Err(CloudError::new(
                        ErrorKind::Timeout,
                        format!("gce: the outcome of operation {name} is unknown: {e}"),
                    ));
                }
            }
        }
    }

    /// Reads one route by name (after an insert answered "already exists").
    async fn get_route(
        &self,
        name: &str,
    ) -> Result<google_cloud_compute_v1::model::Route, CloudError> {
        let get = self
            .routes
            .get()
            .set_project(self.project())
            .set_route(name)
            .with_attempt_timeout(self.config.request_timeout());
        self.send("get_route", &self.requests, false, get.send())
            .await
    }

    /// Whether a listed route is this cluster's: the name prefix, the
    /// network and the description, checked again on this side.
    fn owned(&self, cluster: &str, r: &google_cloud_compute_v1::model::Route) -> bool {
        r.name
            .as_deref()
            .zip(r.dest_range.as_deref())
            .is_some_and(|(n, d)| owned_name(cluster, n, d))
            && r.network
                .as_deref()
                .is_some_and(|n| resource_path(n) == resource_path(&self.network_url))
            && r.description.as_deref() == Some(ROUTE_DESCRIPTION)
    }

    /// A route of the network with upstream's description whose name is not
    /// this cluster's: another cluster's node route.
    fn other_clusters(&self, r: &google_cloud_compute_v1::model::Route) -> Option<Route> {
        let same_network = r
            .network
            .as_deref()
            .is_some_and(|n| resource_path(n) == resource_path(&self.network_url));
        if !same_network || r.description.as_deref() != Some(ROUTE_DESCRIPTION) {
            return None;
        }
        let name = r.name.as_deref()?;
        let mut route = Route::from_text("", r.dest_range.as_deref()?).named(name);
        route.next_hop = r.next_hop_instance.clone().unwrap_or_default().into();
        route.foreign = Some(format!("another cluster (its route {name})").into());
        Some(route)
    }

    /// Converts an owned route; `None` for one without an instance next hop
    /// (not a route this provider makes).
    fn to_route(&self, r: &google_cloud_compute_v1::model::Route) -> Option<Route> {
        let dest = r.dest_range.as_deref()?;
        let instance = InstanceRef::from_url(r.next_hop_instance.as_deref()?)?;
        let node = self
            .nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&instance)
            .cloned()
            // Upstream's rule where no Node claims the instance: on GCE the
            // Node name is the instance name.
            .unwrap_or_else(|| instance.name.as_str().into());
        let mut route =
            Route::from_text(node.as_str(), dest).named(r.name.clone().unwrap_or_default());
        route.next_hop = instance.path().into();
        route.node_provider_id = Some(instance.provider_id().into());
        route.blackhole = r.warnings.iter().any(|w| {
            w.code
                .as_ref()
                .and_then(|c| c.name())
                .is_some_and(|c| BLACKHOLE_WARNINGS.contains(&c))
        });
        Some(route)
    }

    /// The route `create_route` reports for `name`, as a list would show it.
    fn created(&self, name: &str, cidr: Cidr, route: &Route, instance: &InstanceRef) -> Route {
        let mut created = Route::new(route.node.clone(), Destination::Cidr(cidr)).named(name);
        created.next_hop = instance.path().into();
        created.node_provider_id = Some(instance.provider_id().into());
        created
    }
}

/// Where credentials come from: none for a test server, a key file, or
/// Application Default Credentials; with `token_url`, those authorize the
/// request for a token there.
fn credentials(
    config: &GceConfig,
) -> Result<google_cloud_auth::credentials::Credentials, ConfigError> {
    let base = base_credentials(config)?;
    Ok(match &config.token_url {
        Some(url) => alt_token::AltToken::new(
            base,
            url,
            config.token_body.as_deref().unwrap_or(""),
            Duration::from_secs(config.request_timeout_secs),
        )
        .into(),
        None => base,
    })
}

fn base_credentials(
    config: &GceConfig,
) -> Result<google_cloud_auth::credentials::Credentials, ConfigError> {
    use google_cloud_auth::credentials;
    if config.anonymous {
        return Ok(credentials::anonymous::Builder::new().build());
    }
    if let Some(path) = &config.credentials_file {
        let bad = |reason: String| ConfigError::CredentialsFile {
            path: path.clone(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        // The file's contents are a secret: only serde's position, never the text.
        let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            bad(format!(
                "not JSON (line {}, column {})",
                e.line(),
                e.column()
            ))
        })?;
        return match json.get("type").and_then(|t| t.as_str()) {
            Some("service_account") => credentials::service_account::Builder::new(json)
                .build()
                .map_err(|e| bad(e.to_string())),
            Some("external_account") => credentials::external_account::Builder::new(json)
                .build()
                .map_err(|e| bad(e.to_string())),
            other => Err(bad(format!(
                "`type` is {other:?}; expected \"service_account\" or \"external_account\""
            ))),
        };
    }
    credentials::Builder::default()
        .build()
        .map_err(|e| ConfigError::Client(format!("Application Default Credentials: {e}")))
}

/// How long until the API's current quota window ends (windows aligned on
/// the wall clock, as Compute Engine's per-minute quotas are), plus a margin
/// for clock skew.
fn until_window_turns(window_secs: u64) -> Duration {
    let window = Duration::from_secs(window_secs.max(1));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let into =
        Duration::from_nanos(u64::try_from(now.as_nanos() % window.as_nanos()).unwrap_or_default());
    window.saturating_sub(into) + Duration::from_millis(100)
}

/// The result of a `DONE` operation.
fn operation_result(op: &Operation, creating: bool) -> Result<(), CloudError> {
    let Some(error) = op.error.as_ref().filter(|e| !e.errors.is_empty()) else {
        return Ok(());
    };
    let first = &error.errors[0];
    let code = first.code.as_deref().unwrap_or("UNKNOWN");
    Err(CloudError::new(
        kind_of_operation_error(code, creating),
        format!(
            "gce: operation {} failed: {code}: {}",
            op.name.as_deref().unwrap_or("?"),
            first.message.as_deref().unwrap_or("")
        ),
    ))
}

#[async_trait]
impl CloudRoutes for GceRoutes {
    fn name(&self) -> &'static str {
        "gce"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            max_concurrent_operations: self.config.max_concurrent_operations,
            supports_batch: false,
            reports_node_addresses: false,
            supports_ipv6: self.supports_ipv6,
            max_routes: (self.config.max_routes > 0).then_some(self.config.max_routes),
            needs: TargetNeeds::ProviderId,
            replaces_blackholes: false,
            // Routes to an instance without `canIpForward` carry nothing.
            checks_forwarding: true,
            max_routes_per_family: false,
        }
    }

    fn stats(&self) -> &RequestStats {
        self.meter.stats()
    }

    fn observe_nodes(&self, nodes: &[Arc<NodeView>]) {
        let map: HashMap<InstanceRef, Text> = nodes
            .iter()
            .filter_map(|n| {
                let id = n.provider_id.as_deref()?;
                Some((InstanceRef::from_provider_id(id)?, n.name.as_str().into()))
            })
            .collect();
        *self.nodes.lock().unwrap_or_else(|e| e.into_inner()) = map;
    }

    /// One `routes.list` per page of `page_size`, filtered on the server.
    async fn list_routes(&self, cluster: &str) -> Result<Vec<Route>, CloudError> {
        let filter = list_filter(&self.network_url);
        let mut out = Vec::new();
        let mut token = String::new();
        // Bounded so a server that keeps announcing a next page cannot loop us.
        for _ in 0..10_000 {
            let mut call = self
                .routes
                .list()
                .set_project(self.project())
                .set_filter(&filter)
                .set_max_results(self.config.page_size)
                .with_attempt_timeout(self.config.request_timeout());
            if !token.is_empty() {
                call = call.set_page_token(&token);
            }
            let page = self
                .send("list", &self.requests, false, call.send())
                .await?;
            for r in &page.items {
                if !self.owned(cluster, r) {
                    if let Some(theirs) = self.other_clusters(r) {
                        out.push(theirs);
                    } else {
                        // The server's filter let it through; this side does not.
                        warn!(route = ?r.name, "gce: the list answered a route outside the filter; ignored");
                    }
                    continue;
                }
                match self.to_route(r) {
                    Some(route) => out.push(route),
                    None => {
                        debug!(route = ?r.name, "gce: a route of ours without an instance next hop; ignored")
                    }
                }
            }
            match page.next_page_token {
                Some(t) if !t.is_empty() && t != token => token = t,
                _ => return Ok(out),
            }
        }
        Err(CloudError::new(
            ErrorKind::Transient,
            "gce: routes.list kept announcing further pages",
        ))
    }

    /// One `routes.insert` plus the wait for its operation; one `routes.get`
    /// more only when the name is taken (a retried insert).
    async fn create_route(
        &self,
        cluster: &str,
        _name_hint: &str,
        route: &Route,
    ) -> Result<Route, CloudError> {
        let Some(cidr) = route.destination.cidr() else {
            return Err(CloudError::new(
                ErrorKind::InvalidRequest,
                format!("gce: destination {} is not a CIDR", route.destination),
            ));
        };
        if cidr.family() == IpFamily::V6 && !self.supports_ipv6 {
            return Err(CloudError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "gce: cannot route {cidr} to node {:?}: network {} has no internal IPv6 range \
                     (enableUlaInternalIpv6); set `ipv6: true` to send IPv6 routes anyway",
                    route.node, self.config.network
                ),
            ));
        }
        let Some(instance) = route
            .node_provider_id
            .as_deref()
            .and_then(InstanceRef::from_provider_id)
        else {
            return Err(CloudError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "gce: node {:?} has no providerID of the form gce://<project>/<zone>/<instance> (got {:?})",
                    route.node, route.node_provider_id
                ),
            ));
        };
        let name = route_name(cluster, &cidr);
        let created = self.created(&name, cidr, route, &instance);
        let body = google_cloud_compute_v1::model::Route::new()
            .set_name(&name)
            .set_network(&self.network_url)
            .set_dest_range(cidr.to_string())
            .set_next_hop_instance(instance.path())
            .set_priority(ROUTE_PRIORITY)
            .set_description(ROUTE_DESCRIPTION);
        let insert = self
            .routes
            .insert()
            .set_project(self.project())
            .set_body(body)
            .with_attempt_timeout(self.config.request_timeout());
        let done = match self
            .send("insert", &self.requests, true, insert.send())
            .await
        {
            Ok(op) => self.finish(op, true).await,
            Err(e) => Err(e),
        };
        match done {
            Ok(()) => Ok(created),
            Err(e) if e.kind == ErrorKind::AlreadyExists => {
                // Routes are immutable: the name is ours only if the route
                // behind it is exactly the one asked for.
                let existing = match self.get_route(&name).await {
                    Ok(r) => r,
                    // The name is taken by an insert still running (one
                    // whose answer was lost or cut): done soon, either way.
                    Err(g) if g.kind == ErrorKind::NotFound => {
                        return Err(CloudError::new(
                            ErrorKind::Conflict,
                            format!(
                                "gce: route {name} is being created by an operation still running"
                            ),
                        ));
                    }
                    Err(g) => return Err(g),
                };
                let same = existing.dest_range.as_deref() == Some(cidr.to_string().as_str())
                    && existing
                        .next_hop_instance
                        .as_deref()
                        .and_then(InstanceRef::from_url)
                        .as_ref()
                        == Some(&instance)
                    && existing
                        .network
                        .as_deref()
                        .is_some_and(|n| resource_path(n) == resource_path(&self.network_url));
                if same {
                    Ok(created)
                } else {
                    Err(CloudError::new(
                        ErrorKind::Conflict,
                        format!(
                            "gce: route {name} exists with another target ({:?} via {:?}); it must be deleted first",
                            existing.dest_range, existing.next_hop_instance
                        ),
                    ))
                }
            }
            Err(e) => Err(e),
        }
    }

    /// One `instances.get` per instance the first time it is asked about;
    /// none for an instance found with `canIpForward` on, which cannot be
    /// turned off while it runs; one more per fresh check for an instance
    /// found with it off. Never changes anything (`check.repair` is moot:
    /// the field cannot be changed on a running instance).
    async fn check_forwarding(
        &self,
        _cluster: &str,
        nodes: &[Arc<NodeView>],
        check: ForwardingCheck,
    ) -> Result<Vec<(String, Forwarding)>, CloudError> {
        self.check_can_ip_forward(nodes, check).await
    }

    /// One `routes.delete` by name plus the wait for its operation.
    async fn delete_route(&self, cluster: &str, route: &Route) -> Result<(), CloudError> {
        if !owned_name(cluster, &route.name, &route.destination.to_string()) {
            // Never delete a route whose name this cluster does not own.
            return Err(CloudError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "gce: route {:?} for {} is not named as cluster {cluster:?}'s routes are; not deleted",
                    route.name, route.destination
                ),
            ));
        }
        let delete = self
            .routes
            .delete()
            .set_project(self.project())
            .set_route(route.name.as_str())
            .with_attempt_timeout(self.config.request_timeout());
        let op = self
            .send("delete", &self.requests, true, delete.send())
            .await?;
        self.finish(op, false).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_destination_and_fit_gce_names() {
        let c = |s: &str| Cidr::parse(s).unwrap();
        assert_eq!(
            route_name("kubernetes", &c("10.244.1.0/24")),
            "kubernetes-10-244-1-0-24"
        );
        assert_eq!(
            route_name("k8s", &c("fd00:10:244:1::/64")),
            "k8s-v6-fd00001002440001-64"
        );
        let long = "a-very-long-cluster-name-that-goes-on";
        let n = route_name(long, &c("10.244.1.0/24"));
        assert!(n.starts_with("a-very-long-cluster-name-t-"), "{n}");
        let v6 = route_name(long, &c("fd00:10:244:1:2:3:4:0/120"));
        assert!(
            v6.len() <= MAX_NAME_LEN && v6.starts_with("a-very-long-cluster-name-t-d"),
            "{v6}"
        );
        assert_ne!(v6, route_name(long, &c("fd00:10:244:1:2:3:5:0/120")));
        assert_eq!(cluster_prefix("short"), "short");
    }

    #[test]
    fn a_cluster_owns_its_spelled_names_and_upstream_uid_names_only() {
        assert!(owned_name("k8s", "k8s-10-244-1-0-24", "10.244.1.0/24"));
        assert!(owned_name(
            "k8s",
            "k8s-3f2504e0-4f89-11d3-9a0c-0305e82c3301",
            "10.244.1.0/24"
        ));
        // Cluster k8s-prod's routes match upstream's `k8s-.*` too.
        assert!(!owned_name(
            "k8s",
            "k8s-prod-10-244-1-0-24",
            "10.244.1.0/24"
        ));
        assert!(!owned_name(
            "k8s",
            "k8s-prod-3f2504e0-4f89-11d3-9a0c-0305e82c3301",
            "10.244.1.0/24"
        ));
        assert!(!owned_name("k8s", "k8s-10-244-1-0-24", "10.244.2.0/24"));
        assert!(!owned_name("k8s", "k8s10-244-1-0-24", "10.244.1.0/24"));
        assert!(!owned_name("k8s", "k8s-terraform-pinned", "10.244.1.0/24"));
    }

    #[test]
    fn instances_parse_from_provider_ids_and_urls() {
        let i = InstanceRef::from_provider_id("gce://proj/europe-west1-b/node-1").unwrap();
        assert_eq!(
            i.path(),
            "projects/proj/zones/europe-west1-b/instances/node-1"
        );
        assert_eq!(i.provider_id(), "gce://proj/europe-west1-b/node-1");
        assert_eq!(
            InstanceRef::from_url(
                "https://www.googleapis.com/compute/v1/projects/proj/zones/europe-west1-b/instances/node-1"
            ),
            Some(i.clone())
        );
        assert_eq!(InstanceRef::from_url(&i.path()), Some(i));
        assert_eq!(InstanceRef::from_provider_id("aws:///zone/i-1"), None);
        assert_eq!(InstanceRef::from_provider_id("gce://p/z"), None);
        assert_eq!(InstanceRef::from_url("zones/z/instances/n"), None);
    }

    #[test]
    fn the_filter_is_upstreams_with_values_escaped() {
        assert_eq!(
            list_filter("https://www.googleapis.com/compute/v1/projects/p/global/networks/n"),
            "(network eq \"https://www\\.googleapis\\.com/compute/v1/projects/p/global/networks/n\") \
             (description eq \"k8s-node-route\")"
        );
    }
}
