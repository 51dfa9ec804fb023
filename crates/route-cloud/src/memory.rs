//! The simulated cloud (`--cloud-provider memory`).
//!
//! [`MemoryCloud`] keeps one route table per cluster name in memory and behaves
//! like a cloud API with the knobs a test, the simulator or a demo needs:
//! per-call latency, a server-side rate limit that answers `Throttled` with a
//! retry-after, a route quota, IPv6 on or off, batches on or off, and fault
//! injection (random errors, "fail the next N calls", timeouts that still take
//! effect, routes that vanish or appear behind the controller's back, and lists
//! that lag behind creations).
//!
//! Ownership: this module owns the simulated table and its call log. The
//! controller only sees the [`CloudRoutes`] trait; tests keep a second handle
//! (handles are cheap clones sharing one table) and read [`MemoryCloud::log`],
//! the [`RequestStats`] and the table directly.
//!
//! Every wait goes through `tokio::time`, so a paused test clock makes latency
//! and rate-limit refills virtual and the tests deterministic. Unlike the fake
//! cloud of the upstream route controller, an injected error is never sticky:
//! it fails the calls it was meant for and nothing after them.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use route_core::{Destination, IpFamily, Route, TargetNeeds};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::{Batch, BatchResult, Capabilities, CloudError, CloudRoutes, ErrorKind, RequestStats};

/// One kind of call the simulated API answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    /// `list_routes`.
    List,
    /// `create_route` (and each creation inside a batch, in the log).
    Create,
    /// `delete_route` (and each deletion inside a batch, in the log).
    Delete,
    /// `apply_batch`, counted once per call.
    Batch,
}

impl Operation {
    /// The label used in [`RequestStats`] and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::List => "list",
            Operation::Create => "create",
            Operation::Delete => "delete",
            Operation::Batch => "batch",
        }
    }

    const ALL: [Operation; 4] = [
        Operation::List,
        Operation::Create,
        Operation::Delete,
        Operation::Batch,
    ];

    fn index(self) -> usize {
        match self {
            Operation::List => 0,
            Operation::Create => 1,
            Operation::Delete => 2,
            Operation::Batch => 3,
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Latency per operation in milliseconds. Every call sleeps this long on the
/// tokio clock before the simulated server acts on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LatencyConfig {
    /// `list_routes`.
    pub list_ms: u64,
    /// `create_route`.
    pub create_ms: u64,
    /// `delete_route`.
    pub delete_ms: u64,
    /// `apply_batch`.
    pub batch_ms: u64,
}

impl LatencyConfig {
    /// The same latency for every operation.
    pub fn uniform(ms: u64) -> Self {
        Self {
            list_ms: ms,
            create_ms: ms,
            delete_ms: ms,
            batch_ms: ms,
        }
    }

    fn get(&self, op: Operation) -> Duration {
        Duration::from_millis(match op {
            Operation::List => self.list_ms,
            Operation::Create => self.create_ms,
            Operation::Delete => self.delete_ms,
            Operation::Batch => self.batch_ms,
        })
    }

    fn set(&mut self, op: Operation, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        match op {
            Operation::List => self.list_ms = ms,
            Operation::Create => self.create_ms = ms,
            Operation::Delete => self.delete_ms = ms,
            Operation::Batch => self.batch_ms = ms,
        }
    }
}

/// A server-side token bucket shared by every call of every handle: `burst`
/// tokens, refilled at `requests` per `period_secs`. A call that finds the
/// bucket empty is answered `Throttled` with the time until the next token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Requests allowed per period.
    pub requests: u32,
    /// The period in seconds (3600 for "per hour").
    #[serde(default = "default_period_secs")]
    pub period_secs: u64,
    /// The bucket size: how many requests may arrive at once on a full bucket.
    pub burst: u32,
}

fn default_period_secs() -> u64 {
    3600
}

impl RateLimitConfig {
    /// Hetzner Cloud's documented default: 3,600 requests per hour per
    /// project, refilled at one per second; bursts are allowed and the
    /// `RateLimit-Remaining` count starts at the full hour's budget.
    pub fn hetzner_like() -> Self {
        Self {
            requests: 3600,
            period_secs: 3600,
            burst: 3600,
        }
    }

    fn per_second(&self) -> f64 {
        f64::from(self.requests) / self.period_secs as f64
    }
}

/// Random failures of one operation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorRate {
    /// Probability in `[0, 1]` that a call fails.
    pub probability: f64,
    /// The error class answered.
    pub kind: ErrorKind,
}

/// Random failures per operation; operations left out never fail at random.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ErrorRates {
    /// `list_routes`.
    pub list: Option<ErrorRate>,
    /// `create_route`.
    pub create: Option<ErrorRate>,
    /// `delete_route`.
    pub delete: Option<ErrorRate>,
    /// `apply_batch` (fails the whole batch).
    pub batch: Option<ErrorRate>,
}

impl ErrorRates {
    fn get(&self, op: Operation) -> Option<ErrorRate> {
        match op {
            Operation::List => self.list,
            Operation::Create => self.create,
            Operation::Delete => self.delete,
            Operation::Batch => self.batch,
        }
    }

    fn set(&mut self, op: Operation, rate: Option<ErrorRate>) {
        match op {
            Operation::List => self.list = rate,
            Operation::Create => self.create = rate,
            Operation::Delete => self.delete = rate,
            Operation::Batch => self.batch = rate,
        }
    }
}

/// Configuration of the `memory` provider, read from `--cloud-config` (YAML
/// or TOML) for `--cloud-provider memory`. Every field is optional; the
/// defaults give a fast, unlimited, faultless cloud.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryConfig {
    /// Latency per operation.
    pub latency: LatencyConfig,
    /// Server-side rate limit; `None` (the default) means unlimited.
    pub rate_limit: Option<RateLimitConfig>,
    /// Most routes one cluster's table holds; a creation beyond it answers
    /// `QuotaExceeded`. `None` (the default) means no limit.
    pub max_routes: Option<usize>,
    /// IPv6 destinations are accepted (default true); when false they answer
    /// `InvalidRequest`.
    pub supports_ipv6: bool,
    /// Listed routes mark their target addresses as reliable
    /// (`Route::enable_node_addresses`, default true).
    pub reports_node_addresses: bool,
    /// Advertised `Capabilities::max_concurrent_operations` (default 10).
    pub max_concurrent_operations: usize,
    /// When true, a create/delete/batch that would exceed
    /// `max_concurrent_operations` calls in flight answers `Conflict` (as
    /// Hetzner answers `locked` for a second action on one network). Default false.
    pub enforce_max_concurrency: bool,
    /// `apply_batch` is supported (default false).
    pub supports_batch: bool,
    /// Random failures per operation (default none).
    pub error_rates: ErrorRates,
    /// Seed of the random failures, so a failing run can be replayed (default 0).
    pub seed: u64,
    /// Eventual consistency: a newly created route is missing from this many
    /// following lists of its cluster (default 0).
    pub list_lag: u32,
    /// What a creation needs from its Node (default nothing): `provider_id`
    /// refuses creations without `spec.providerID` as AWS does,
    /// `internal_ip` those without an InternalIP of the family as OpenStack does.
    pub needs: TargetNeeds,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            latency: LatencyConfig::default(),
            rate_limit: None,
            max_routes: None,
            supports_ipv6: true,
            reports_node_addresses: true,
            max_concurrent_operations: 10,
            enforce_max_concurrency: false,
            supports_batch: false,
            error_rates: ErrorRates::default(),
            seed: 0,
            list_lag: 0,
            needs: TargetNeeds::Nothing,
        }
    }
}

impl MemoryConfig {
    /// A cloud shaped like Hetzner Cloud networks: 3,600 requests per hour,
    /// 100 routes, IPv4 only, one action at a time (a second concurrent one
    /// answers `Conflict`), no batches, no node addresses on listed routes.
    /// The latencies are round numbers of the right order, not measurements.
    pub fn hetzner_like() -> Self {
        Self {
            latency: LatencyConfig {
                list_ms: 100,
                create_ms: 1000,
                delete_ms: 1000,
                batch_ms: 0,
            },
            rate_limit: Some(RateLimitConfig::hetzner_like()),
            max_routes: Some(100),
            supports_ipv6: false,
            reports_node_addresses: false,
            max_concurrent_operations: 1,
            enforce_max_concurrency: true,
            supports_batch: false,
            ..Self::default()
        }
    }

    /// Checks the values a file may get wrong.
    pub fn validate(&self) -> Result<(), MemoryConfigError> {
        if let Some(rl) = &self.rate_limit
            && (rl.requests == 0 || rl.period_secs == 0 || rl.burst == 0)
        {
            return Err(MemoryConfigError::RateLimit(*rl));
        }
        if self.max_concurrent_operations == 0 {
            return Err(MemoryConfigError::Concurrency);
        }
        for op in Operation::ALL {
            if let Some(r) = self.error_rates.get(op)
                && !(0.0..=1.0).contains(&r.probability)
            {
                return Err(MemoryConfigError::Probability(op, r.probability));
            }
        }
        Ok(())
    }
}

/// Why a [`MemoryConfig`] is unusable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MemoryConfigError {
    /// A zero in the rate limit.
    #[error("memory cloud: rate_limit needs requests, period_secs and burst above zero, got {0:?}")]
    RateLimit(RateLimitConfig),
    /// Zero concurrency.
    #[error("memory cloud: max_concurrent_operations must be at least 1")]
    Concurrency,
    /// A probability outside `[0, 1]`.
    #[error("memory cloud: error_rates.{0}.probability must be within [0, 1], got {1}")]
    Probability(Operation, f64),
}

/// One entry of the call log. Batches log one [`Operation::Batch`] entry and
/// then one entry per change inside them (with `batch` set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRecord {
    /// Position in the log, from 0 (restarts after [`MemoryCloud::clear_log`]).
    pub seq: u64,
    /// When the simulated server acted on the call (after its latency).
    pub at: Instant,
    /// The tag of the handle that made the call (see [`MemoryCloud::with_caller`]).
    pub caller: Arc<str>,
    /// The cluster name passed.
    pub cluster: String,
    /// What was called.
    pub op: Operation,
    /// The route's target node (creations and deletions).
    pub target_node: Option<String>,
    /// The route's destination (creations and deletions).
    pub destination: Option<Destination>,
    /// The `seq` of the batch this change belongs to.
    pub batch: Option<u64>,
    /// The outcome: `Ok` or the error class answered.
    pub result: Result<(), ErrorKind>,
}

impl CallRecord {
    /// A create or delete (alone or in a batch) that changed the table.
    pub fn is_mutation(&self) -> bool {
        matches!(self.op, Operation::Create | Operation::Delete) && self.result.is_ok()
    }
}

/// An injected failure for the next calls of one operation.
#[derive(Debug, Clone, Copy)]
struct Pending {
    remaining: u32,
    kind: ErrorKind,
}

#[derive(Debug, Clone)]
struct Stored {
    route: Route,
    /// Lists still to come that must not show this route (eventual consistency).
    hidden_lists: u32,
}

#[derive(Debug)]
struct State {
    config: MemoryConfig,
    tables: BTreeMap<String, BTreeMap<Destination, Stored>>,
    log: Vec<CallRecord>,
    pending: [Option<Pending>; 4],
    rng: StdRng,
    tokens: f64,
    refilled: Instant,
    /// Every call is answered `Throttled`, with this retry-after.
    storm: Option<Option<Duration>>,
}

impl State {
    /// Takes one token from the server-side bucket, or says how long until one exists.
    fn take_token(&mut self, now: Instant) -> Result<(), Duration> {
        let Some(rl) = self.config.rate_limit else {
            return Ok(());
        };
        let rate = rl.per_second();
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(f64::from(rl.burst));
        self.refilled = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / rate))
        }
    }

    /// The injected failure for this call, if any: "fail next N" first, then the random rate.
    fn injected(&mut self, op: Operation) -> Option<ErrorKind> {
        let slot = &mut self.pending[op.index()];
        if let Some(p) = slot {
            let kind = p.kind;
            p.remaining = p.remaining.saturating_sub(1);
            if p.remaining == 0 {
                *slot = None;
            }
            return Some(kind);
        }
        let rate = self.config.error_rates.get(op)?;
        (self.rng.random::<f64>() < rate.probability).then_some(rate.kind)
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        now: Instant,
        caller: &Arc<str>,
        cluster: &str,
        op: Operation,
        route: Option<&Route>,
        batch: Option<u64>,
        result: Result<(), ErrorKind>,
    ) -> u64 {
        let seq = self.log.len() as u64;
        self.log.push(CallRecord {
            seq,
            at: now,
            caller: Arc::clone(caller),
            cluster: cluster.to_string(),
            op,
            target_node: route.map(|r| r.target_node.to_string()),
            destination: route.map(|r| r.destination.clone()),
            batch,
            result,
        });
        seq
    }

    fn list(&mut self, cluster: &str) -> Vec<Route> {
        let Some(table) = self.tables.get_mut(cluster) else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(table.len());
        for s in table.values_mut() {
            if s.hidden_lists > 0 {
                s.hidden_lists -= 1;
            } else {
                out.push(s.route.clone());
            }
        }
        out
    }

    fn create(
        &mut self,
        cluster: &str,
        name_hint: &str,
        route: &Route,
    ) -> Result<Route, CloudError> {
        let Some(cidr) = route.destination.cidr() else {
            return Err(CloudError::new(
                ErrorKind::InvalidRequest,
                format!("destination {} is not a CIDR", route.destination),
            ));
        };
        if cidr.family() == IpFamily::V6 && !self.config.supports_ipv6 {
            return Err(CloudError::new(
                ErrorKind::InvalidRequest,
                format!("destination {cidr}: this cloud accepts IPv4 destinations only"),
            ));
        }
        let refused = match self.config.needs {
            TargetNeeds::Nothing => None,
            TargetNeeds::ProviderId => route
                .target_provider_id
                .as_deref()
                .is_none_or(|p| p.trim().is_empty())
                .then(|| format!("node {:?} has no spec.providerID", route.target_node)),
            TargetNeeds::InternalIp => (!route.target_node_addresses.iter().any(|a| {
                a.kind == "InternalIP"
                    && route_core::cidr::parse_ip_sloppy(&a.address)
                        .is_some_and(|ip| ip.is_ipv4() == (cidr.family() == IpFamily::V4))
            }))
            .then(|| {
                format!(
                    "node {:?} has no {} InternalIP to route {cidr} to",
                    route.target_node,
                    cidr.family()
                )
            }),
        };
        if let Some(msg) = refused {
            return Err(CloudError::new(ErrorKind::InvalidRequest, msg));
        }
        let max_routes = self.config.max_routes;
        let reports = self.config.reports_node_addresses;
        let list_lag = self.config.list_lag;
        let table = self.tables.entry(cluster.to_string()).or_default();
        if let Some(existing) = table.get(&route.destination) {
            let msg = if existing.route.target_node == route.target_node {
                format!(
                    "a route for {cidr} to node {:?} already exists",
                    route.target_node
                )
            } else {
                format!(
                    "the route table already has a route for {cidr} (to node {:?})",
                    existing.route.target_node
                )
            };
            return Err(CloudError::new(ErrorKind::AlreadyExists, msg));
        }
        if let Some(max) = max_routes
            && table.len() >= max
        {
            return Err(CloudError::new(
                ErrorKind::QuotaExceeded,
                format!("the route table of cluster {cluster:?} is full ({max} routes)"),
            ));
        }
        let cidr_text: String = cidr
            .to_string()
            .chars()
            .map(|c| if c == '/' || c == ':' { '-' } else { c })
            .collect();
        let cloud_target = route
            .target_node_addresses
            .iter()
            .find(|a| a.kind == "InternalIP")
            .map(|a| a.address.clone())
            .or_else(|| route.target_provider_id.clone())
            .unwrap_or_else(|| route.target_node.clone());
        let stored = Route {
            name: format!("{cluster}-{name_hint}-{cidr_text}").into(),
            target_node: route.target_node.clone(),
            destination: route.destination.clone(),
            blackhole: false,
            target_node_addresses: route.target_node_addresses.clone(),
            enable_node_addresses: reports,
            cloud_target,
            target_provider_id: route.target_provider_id.clone(),
        };
        table.insert(
            route.destination.clone(),
            Stored {
                route: stored.clone(),
                hidden_lists: list_lag,
            },
        );
        Ok(stored)
    }

    fn delete(&mut self, cluster: &str, route: &Route) -> Result<(), CloudError> {
        let missing = || {
            CloudError::new(
                ErrorKind::NotFound,
                format!(
                    "no route {:?} for {} in the table of cluster {cluster:?}",
                    route.name, route.destination
                ),
            )
        };
        let table = self.tables.get_mut(cluster).ok_or_else(missing)?;
        let found = table.get(&route.destination).ok_or_else(missing)?;
        // A route re-created under another name since it was listed is not the
        // one the caller means.
        if !route.name.is_empty() && found.route.name != route.name {
            return Err(missing());
        }
        table.remove(&route.destination);
        Ok(())
    }
}

struct Shared {
    state: Mutex<State>,
    stats: RequestStats,
    in_flight: AtomicUsize,
    peak_in_flight: AtomicUsize,
}

/// The simulated cloud. Cloning gives another handle on the same table,
/// counters and log; each handle carries its own caller tag.
#[derive(Clone)]
pub struct MemoryCloud {
    shared: Arc<Shared>,
    caller: Arc<str>,
}

impl fmt::Debug for MemoryCloud {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryCloud")
            .field("caller", &self.caller)
            .finish_non_exhaustive()
    }
}

impl Default for MemoryCloud {
    fn default() -> Self {
        Self::build(MemoryConfig::default())
    }
}

/// Decrements the in-flight count when a mutating call ends or is dropped.
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl MemoryCloud {
    /// A simulated cloud with `config`; the caller tag is `"default"`.
    pub fn new(config: MemoryConfig) -> Result<Self, MemoryConfigError> {
        config.validate()?;
        Ok(Self::build(config))
    }

    fn build(config: MemoryConfig) -> Self {
        let tokens = config.rate_limit.map_or(0.0, |rl| f64::from(rl.burst));
        let rng = StdRng::seed_from_u64(config.seed);
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    config,
                    tables: BTreeMap::new(),
                    log: Vec::new(),
                    pending: [None; 4],
                    rng,
                    tokens,
                    refilled: Instant::now(),
                    storm: None,
                }),
                stats: RequestStats::default(),
                in_flight: AtomicUsize::new(0),
                peak_in_flight: AtomicUsize::new(0),
            }),
            caller: Arc::from("default"),
        }
    }

    /// Another handle on the same cloud whose calls are logged with `caller`
    /// (e.g. one per controller instance in a leader-election test).
    pub fn with_caller(&self, caller: &str) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            caller: Arc::from(caller),
        }
    }

    /// Changes this handle's caller tag.
    pub fn set_caller(&mut self, caller: &str) {
        self.caller = Arc::from(caller);
    }

    /// This handle's caller tag.
    pub fn caller(&self) -> &str {
        &self.caller
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the current configuration.
    pub fn config(&self) -> MemoryConfig {
        self.lock().config.clone()
    }

    // ---- test and simulator controls (never counted, never logged) ----

    /// Fails the next `n` calls of `op` with `kind` (after which calls behave
    /// normally again). A `Timeout` on a create, delete or batch still takes
    /// effect, like a real answer lost on the way back. Replaces any earlier
    /// pending failures of `op`; `n = 0` clears them.
    pub fn fail_next(&self, op: Operation, n: u32, kind: ErrorKind) {
        self.lock().pending[op.index()] = (n > 0).then_some(Pending { remaining: n, kind });
    }

    /// Starts (`Some`, with the retry-after to answer) or ends (`None`) a
    /// throttling storm: while it lasts every call is answered `Throttled`,
    /// whatever the budget — a cloud whose API is overloaded by others.
    pub fn set_storm(&self, storm: Option<Option<Duration>>) {
        self.lock().storm = storm;
    }

    /// Sets or clears the random failure rate of `op`. Probabilities outside
    /// `[0, 1]` are clamped (NaN counts as 0).
    pub fn set_error_rate(&self, op: Operation, rate: Option<ErrorRate>) {
        let rate = rate.map(|mut r| {
            r.probability = if r.probability.is_nan() {
                0.0
            } else {
                r.probability.clamp(0.0, 1.0)
            };
            r
        });
        self.lock().config.error_rates.set(op, rate);
    }

    /// Sets the latency of `op`.
    pub fn set_latency(&self, op: Operation, latency: Duration) {
        self.lock().config.latency.set(op, latency);
    }

    /// Sets or removes the server-side rate limit; the bucket starts full.
    /// A limit with a zero field is ignored (the old one stays).
    pub fn set_rate_limit(&self, limit: Option<RateLimitConfig>) {
        if limit.is_some_and(|rl| rl.requests == 0 || rl.period_secs == 0 || rl.burst == 0) {
            return;
        }
        let mut s = self.lock();
        s.config.rate_limit = limit;
        s.tokens = limit.map_or(0.0, |rl| f64::from(rl.burst));
        s.refilled = Instant::now();
    }

    /// Sets the route quota per cluster.
    pub fn set_max_routes(&self, max: Option<usize>) {
        self.lock().config.max_routes = max;
    }

    /// Sets how many lists a newly created route stays invisible to.
    pub fn set_list_lag(&self, lists: u32) {
        self.lock().config.list_lag = lists;
    }

    /// The table of `cluster` as stored (including routes a lagging list hides).
    pub fn routes(&self, cluster: &str) -> Vec<Route> {
        self.lock()
            .tables
            .get(cluster)
            .map(|t| t.values().map(|s| s.route.clone()).collect())
            .unwrap_or_default()
    }

    /// Puts `route` in the table behind the controller's back, replacing any
    /// route for the same destination; returns the replaced one. An empty name
    /// becomes `<cluster>-external-<n>`.
    pub fn insert_route(&self, cluster: &str, mut route: Route) -> Option<Route> {
        let mut s = self.lock();
        let table = s.tables.entry(cluster.to_string()).or_default();
        if route.name.is_empty() {
            route.name = format!("{cluster}-external-{}", table.len()).into();
        }
        table
            .insert(
                route.destination.clone(),
                Stored {
                    route,
                    hidden_lists: 0,
                },
            )
            .map(|s| s.route)
    }

    /// Removes the route for `destination` behind the controller's back.
    pub fn remove_route(&self, cluster: &str, destination: &Destination) -> Option<Route> {
        self.lock()
            .tables
            .get_mut(cluster)?
            .remove(destination)
            .map(|s| s.route)
    }

    /// Marks the route for `destination` as a blackhole (its target died);
    /// returns whether such a route exists.
    pub fn blackhole_route(&self, cluster: &str, destination: &Destination) -> bool {
        let mut s = self.lock();
        match s
            .tables
            .get_mut(cluster)
            .and_then(|t| t.get_mut(destination))
        {
            Some(stored) => {
                stored.route.blackhole = true;
                true
            }
            None => false,
        }
    }

    /// A copy of the call log.
    pub fn log(&self) -> Vec<CallRecord> {
        self.lock().log.clone()
    }

    /// Empties the call log (counters are kept).
    pub fn clear_log(&self) {
        self.lock().log.clear();
    }

    /// The most create/delete/batch calls that were in flight at once.
    pub fn peak_concurrency(&self) -> usize {
        self.shared.peak_in_flight.load(Ordering::SeqCst)
    }

    // ---- the simulated server ----

    /// Waits the latency, then runs `act` under the lock once the rate limit,
    /// the concurrency limit and fault injection have had their say; counts
    /// and logs the call.
    async fn call<T>(
        &self,
        op: Operation,
        cluster: &str,
        route: Option<&Route>,
        act: impl FnOnce(&mut State, &Arc<str>, Instant, Option<u64>) -> Result<T, CloudError>,
    ) -> Result<T, CloudError> {
        let mutating = op != Operation::List;
        let _guard = if mutating {
            let now = self.shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.shared.peak_in_flight.fetch_max(now, Ordering::SeqCst);
            Some(InFlight(&self.shared.in_flight))
        } else {
            None
        };
        let (latency, over_limit) = {
            let s = self.lock();
            let over = mutating
                && s.config.enforce_max_concurrency
                && self.shared.in_flight.load(Ordering::SeqCst)
                    > s.config.max_concurrent_operations;
            (s.config.latency.get(op), over)
        };
        tokio::time::sleep(latency).await;

        let now = Instant::now();
        let mut s = self.lock();
        let mut lost_answer = false;
        let refused = if let Some(retry_after) = s.storm {
            Some(CloudError::throttled(
                "request limit exceeded (storm)",
                retry_after,
            ))
        } else if let Err(wait) = s.take_token(now) {
            Some(CloudError::throttled(
                "request rate limit exceeded",
                Some(wait),
            ))
        } else if over_limit {
            Some(CloudError::new(
                ErrorKind::Conflict,
                "another change is in progress on this route table",
            ))
        } else {
            match s.injected(op) {
                // The change happens; only the answer is lost.
                Some(ErrorKind::Timeout) if mutating => {
                    lost_answer = true;
                    None
                }
                Some(kind) => Some(CloudError::new(kind, format!("injected {kind} failure"))),
                None => None,
            }
        };
        let mut batch_seq = None;
        let answer = match refused {
            Some(e) => Err(e),
            None => {
                // A batch's own entry comes before the entries of its changes.
                if op == Operation::Batch {
                    batch_seq = Some(s.record(now, &self.caller, cluster, op, None, None, Ok(())));
                }
                let r = act(&mut s, &self.caller, now, batch_seq);
                if lost_answer {
                    Err(CloudError::new(
                        ErrorKind::Timeout,
                        "no answer in time (injected)",
                    ))
                } else {
                    r
                }
            }
        };
        let result = answer.as_ref().map(|_| ()).map_err(|e| e.kind);
        match batch_seq {
            Some(seq) => {
                if let Some(entry) = usize::try_from(seq).ok().and_then(|i| s.log.get_mut(i)) {
                    entry.result = result;
                }
            }
            None => {
                s.record(now, &self.caller, cluster, op, route, None, result);
            }
        }
        drop(s);
        self.shared
            .stats
            .record(op.as_str(), result.err().map_or("ok", ErrorKind::as_str));
        if let Err(e) = &answer {
            tracing::debug!(provider = "memory", caller = %self.caller, %op, cluster, error = %e, "simulated call failed");
        }
        answer
    }
}

#[async_trait]
impl CloudRoutes for MemoryCloud {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        let s = self.lock();
        Capabilities {
            max_concurrent_operations: s.config.max_concurrent_operations,
            supports_batch: s.config.supports_batch,
            reports_node_addresses: s.config.reports_node_addresses,
            supports_ipv6: s.config.supports_ipv6,
            max_routes: s.config.max_routes,
            needs: s.config.needs,
            replaces_blackholes: false,
        }
    }

    fn stats(&self) -> &RequestStats {
        &self.shared.stats
    }

    async fn list_routes(&self, cluster: &str) -> Result<Vec<Route>, CloudError> {
        self.call(Operation::List, cluster, None, |s, _, _, _| {
            Ok(s.list(cluster))
        })
        .await
    }

    async fn create_route(
        &self,
        cluster: &str,
        name_hint: &str,
        route: &Route,
    ) -> Result<Route, CloudError> {
        self.call(Operation::Create, cluster, Some(route), |s, _, _, _| {
            s.create(cluster, name_hint, route)
        })
        .await
    }

    async fn delete_route(&self, cluster: &str, route: &Route) -> Result<(), CloudError> {
        self.call(Operation::Delete, cluster, Some(route), |s, _, _, _| {
            s.delete(cluster, route)
        })
        .await
    }

    async fn apply_batch(&self, cluster: &str, batch: &Batch) -> Result<BatchResult, CloudError> {
        if !self.lock().config.supports_batch {
            self.shared.stats.record(
                Operation::Batch.as_str(),
                ErrorKind::InvalidRequest.as_str(),
            );
            return Err(CloudError::new(
                ErrorKind::InvalidRequest,
                "batches are switched off for this memory cloud (supports_batch: false)",
            ));
        }
        self.call(Operation::Batch, cluster, None, |s, caller, now, seq| {
            let mut out: BatchResult = Vec::with_capacity(batch.delete.len() + batch.create.len());
            for r in &batch.delete {
                let res = s.delete(cluster, r).map(|()| None);
                let kind = res.as_ref().map(|_| ()).map_err(|e| e.kind);
                s.record(now, caller, cluster, Operation::Delete, Some(r), seq, kind);
                out.push(res);
            }
            for (hint, r) in &batch.create {
                let res = s.create(cluster, hint, r).map(Some);
                let kind = res.as_ref().map(|_| ()).map_err(|e| e.kind);
                s.record(now, caller, cluster, Operation::Create, Some(r), seq, kind);
                out.push(res);
            }
            Ok(out)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use route_core::{Cidr, NodeAddress};

    const C: &str = "c1";

    fn cidr(s: &str) -> Destination {
        Destination::Cidr(Cidr::parse(s).unwrap())
    }

    fn want(node: &str, dest: &str) -> Route {
        let mut r = Route::new(node, cidr(dest)).with_addresses(
            vec![
                NodeAddress {
                    kind: "Hostname".into(),
                    address: node.into(),
                },
                NodeAddress::internal_ip("10.0.0.7"),
            ],
            false,
        );
        r.target_provider_id = Some(format!("memory://{node}").into());
        r
    }

    fn cloud(config: MemoryConfig) -> MemoryCloud {
        MemoryCloud::new(config).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn create_list_delete_round_trip() {
        let c = MemoryCloud::default();
        let v4 = c
            .create_route(C, "uid-a", &want("a", "10.244.1.0/24"))
            .await
            .unwrap();
        let v6 = c
            .create_route(C, "uid-a", &want("a", "fd00:1::/64"))
            .await
            .unwrap();
        assert_eq!(v4.name, "c1-uid-a-10.244.1.0-24");
        assert_eq!(
            v6.name, "c1-uid-a-fd00-1---64",
            "dual-stack routes differ by CIDR"
        );
        assert_eq!(v4.cloud_target, "10.0.0.7", "the first InternalIP");
        assert!(v4.enable_node_addresses);
        assert_eq!(
            v4.target_node_addresses,
            want("a", "10.244.1.0/24").target_node_addresses
        );
        assert_eq!(v4.target_provider_id.as_deref(), Some("memory://a"));

        let listed = c.list_routes(C).await.unwrap();
        assert_eq!(listed.len(), 2);
        assert!(
            listed.contains(&v4) && listed.contains(&v6),
            "list shows what create returned"
        );
        assert!(
            c.list_routes("other").await.unwrap().is_empty(),
            "tables are per cluster"
        );

        c.delete_route(C, &v4).await.unwrap();
        assert_eq!(c.list_routes(C).await.unwrap(), vec![v6]);
    }

    #[tokio::test(start_paused = true)]
    async fn one_route_per_destination_and_missing_deletes() {
        let c = MemoryCloud::default();
        let a = c
            .create_route(C, "ua", &want("a", "10.244.1.0/24"))
            .await
            .unwrap();
        let same = c
            .create_route(C, "ua", &want("a", "10.244.1.0/24"))
            .await
            .unwrap_err();
        assert_eq!(same.kind, ErrorKind::AlreadyExists);
        let other = c
            .create_route(C, "ub", &want("b", "10.244.1.0/24"))
            .await
            .unwrap_err();
        assert_eq!(other.kind, ErrorKind::AlreadyExists);
        assert!(other.message.contains("\"a\""), "{}", other.message);

        c.delete_route(C, &a).await.unwrap();
        assert_eq!(
            c.delete_route(C, &a).await.unwrap_err().kind,
            ErrorKind::NotFound
        );
        assert_eq!(
            c.delete_route("nope", &a).await.unwrap_err().kind,
            ErrorKind::NotFound
        );
        // Re-created for another node: the stale listing no longer names it.
        c.create_route(C, "ub", &want("b", "10.244.1.0/24"))
            .await
            .unwrap();
        assert_eq!(
            c.delete_route(C, &a).await.unwrap_err().kind,
            ErrorKind::NotFound
        );
        assert_eq!(c.routes(C).len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn node_address_reporting_follows_the_switch() {
        let c = cloud(MemoryConfig {
            reports_node_addresses: false,
            ..MemoryConfig::default()
        });
        let r = c
            .create_route(C, "u", &want("a", "10.244.1.0/24"))
            .await
            .unwrap();
        assert!(!r.enable_node_addresses);
        assert!(!c.list_routes(C).await.unwrap()[0].enable_node_addresses);
        assert!(!c.capabilities().reports_node_addresses);
        assert!(MemoryCloud::default().capabilities().reports_node_addresses);
    }

    #[tokio::test(start_paused = true)]
    async fn counters_are_exact_per_operation_and_result() {
        let c = MemoryCloud::default();
        let r = c
            .create_route(C, "u", &want("a", "10.244.1.0/24"))
            .await
            .unwrap();
        let _ = c.create_route(C, "u", &want("a", "10.244.1.0/24")).await;
        c.list_routes(C).await.unwrap();
        c.list_routes(C).await.unwrap();
        c.delete_route(C, &r).await.unwrap();
        let _ = c.delete_route(C, &r).await;
        let snap = c.stats().snapshot();
        let expect: BTreeMap<(&str, &str), u64> = [
            (("create", "ok"), 1),
            (("create", "already_exists"), 1),
            (("list", "ok"), 2),
            (("delete", "ok"), 1),
            (("delete", "not_found"), 1),
        ]
        .into_iter()
        .collect();
        assert_eq!(snap, expect);
        // Test controls are free.
        c.routes(C);
        c.insert_route(C, Route::new("x", cidr("10.244.9.0/24")));
        assert_eq!(c.stats().snapshot(), expect);
    }

    #[tokio::test(start_paused = true)]
    async fn log_tags_callers_and_uses_virtual_time() {
        let base = cloud(MemoryConfig {
            latency: LatencyConfig::uniform(250),
            ..MemoryConfig::default()
        });
        let t0 = Instant::now();
        let a = base.with_caller("controller-a");
        let mut b = base.clone();
        b.set_caller("controller-b");
        assert_eq!(base.caller(), "default");
        a.create_route(C, "u1", &want("n1", "10.244.1.0/24"))
            .await
            .unwrap();
        b.create_route(C, "u2", &want("n2", "10.244.2.0/24"))
            .await
            .unwrap();
        base.list_routes(C).await.unwrap();
        assert_eq!(
            t0.elapsed(),
            Duration::from_millis(750),
            "latency is on the tokio clock"
        );

        let log = base.log();
        let who: Vec<(&str, Operation, u64)> = log
            .iter()
            .map(|r| {
                (
                    &*r.caller,
                    r.op,
                    u64::try_from((r.at - t0).as_millis()).unwrap(),
                )
            })
            .collect();
        assert_eq!(
            who,
            vec![
                ("controller-a", Operation::Create, 250),
                ("controller-b", Operation::Create, 500),
                ("default", Operation::List, 750),
            ]
        );
        assert_eq!(log[1].target_node.as_deref(), Some("n2"));
        assert_eq!(log[1].destination, Some(cidr("10.244.2.0/24")));
        assert!(log[0].is_mutation() && !log[2].is_mutation());
        base.clear_log();
        assert!(a.log().is_empty(), "handles share one log");
    }

    #[tokio::test(start_paused = true)]
    async fn latency_per_operation_overlaps_across_tasks() {
        let c = MemoryCloud::default();
        c.set_latency(Operation::Create, Duration::from_secs(2));
        c.set_latency(Operation::List, Duration::from_millis(100));
        let t0 = Instant::now();
        let (r1, r2) = (want("n1", "10.244.1.0/24"), want("n2", "10.244.2.0/24"));
        let (x, y) = tokio::join!(c.create_route(C, "u1", &r1), c.create_route(C, "u2", &r2));
        x.unwrap();
        y.unwrap();
        assert_eq!(t0.elapsed(), Duration::from_secs(2));
        c.list_routes(C).await.unwrap();
        assert_eq!(t0.elapsed(), Duration::from_millis(2100));
        assert_eq!(c.peak_concurrency(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limit_throttles_with_retry_after_and_refills() {
        let c = cloud(MemoryConfig {
            rate_limit: Some(RateLimitConfig {
                requests: 60,
                period_secs: 60,
                burst: 3,
            }),
            ..MemoryConfig::default()
        });
        for _ in 0..3 {
            c.list_routes(C).await.unwrap();
        }
        let e = c.list_routes(C).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Throttled);
        let wait = e.retry_after.expect("retry-after is given");
        assert!(
            wait > Duration::from_millis(990) && wait <= Duration::from_secs(1),
            "{wait:?}"
        );
        // Throttled answers cost nothing from the budget: waiting as told works.
        tokio::time::sleep(wait).await;
        c.list_routes(C).await.unwrap();
        assert_eq!(c.stats().snapshot()[&("list", "throttled")], 1);
        assert_eq!(c.stats().total("list"), 5);

        c.set_rate_limit(None);
        for _ in 0..10 {
            c.list_routes(C).await.unwrap();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn hetzner_preset_allows_an_hour_of_burst_then_one_per_second() {
        let c = cloud(MemoryConfig {
            latency: LatencyConfig::default(),
            ..MemoryConfig::hetzner_like()
        });
        for _ in 0..3600 {
            c.list_routes(C).await.unwrap();
        }
        let e = c.list_routes(C).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Throttled);
        assert!(e.retry_after.unwrap() <= Duration::from_secs(1));
        tokio::time::sleep(Duration::from_secs(10)).await;
        for _ in 0..10 {
            c.list_routes(C).await.unwrap();
        }
        assert_eq!(
            c.list_routes(C).await.unwrap_err().kind,
            ErrorKind::Throttled
        );

        let caps = c.capabilities();
        assert_eq!(caps.max_routes, Some(100));
        assert_eq!(caps.max_concurrent_operations, 1);
        assert!(!caps.supports_ipv6 && !caps.supports_batch && !caps.reports_node_addresses);
    }

    #[tokio::test(start_paused = true)]
    async fn quota_answers_quota_exceeded_until_a_route_is_deleted() {
        let c = cloud(MemoryConfig {
            max_routes: Some(2),
            ..MemoryConfig::default()
        });
        let first = c
            .create_route(C, "u", &want("a", "10.244.1.0/24"))
            .await
            .unwrap();
        c.create_route(C, "u", &want("b", "10.244.2.0/24"))
            .await
            .unwrap();
        let e = c
            .create_route(C, "u", &want("c", "10.244.3.0/24"))
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::QuotaExceeded);
        // The quota is per cluster table.
        c.create_route("c2", "u", &want("c", "10.244.3.0/24"))
            .await
            .unwrap();
        c.delete_route(C, &first).await.unwrap();
        c.create_route(C, "u", &want("c", "10.244.3.0/24"))
            .await
            .unwrap();
        c.set_max_routes(None);
        c.create_route(C, "u", &want("d", "10.244.4.0/24"))
            .await
            .unwrap();
        assert_eq!(c.routes(C).len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn ipv6_and_unparsable_destinations_are_invalid_requests() {
        let c = cloud(MemoryConfig {
            supports_ipv6: false,
            ..MemoryConfig::default()
        });
        let e = c
            .create_route(C, "u", &want("a", "fd00::/64"))
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidRequest);
        assert!(e.message.contains("IPv4"), "{}", e.message);
        let bad = Route::from_text("a", "not-a-cidr");
        let e = c.create_route(C, "u", &bad).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidRequest);
        assert!(c.routes(C).is_empty());
        assert!(!c.capabilities().supports_ipv6);
    }

    #[tokio::test(start_paused = true)]
    async fn batches_need_the_switch_and_apply_deletions_then_creations() {
        let off = MemoryCloud::default();
        let e = off.apply_batch(C, &Batch::default()).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidRequest);

        let c = cloud(MemoryConfig {
            supports_batch: true,
            ..MemoryConfig::default()
        });
        assert!(c.capabilities().supports_batch);
        let old = c
            .create_route(C, "ua", &want("a", "10.244.1.0/24"))
            .await
            .unwrap();
        c.clear_log();
        let batch = Batch {
            delete: vec![old.clone(), Route::new("gone", cidr("10.244.7.0/24"))],
            // The first creation reuses the destination freed by the deletion.
            create: vec![
                ("ub".into(), want("b", "10.244.1.0/24")),
                ("uc".into(), want("c", "fd00:1::/64")),
                ("ud".into(), Route::from_text("d", "junk")),
            ],
        };
        let out = c.with_caller("ctl").apply_batch(C, &batch).await.unwrap();
        assert_eq!(out.len(), 5);
        assert_eq!(out[0], Ok(None));
        assert_eq!(out[1].as_ref().unwrap_err().kind, ErrorKind::NotFound);
        assert_eq!(out[2].as_ref().unwrap().as_ref().unwrap().target_node, "b");
        assert!(out[3].as_ref().unwrap().is_some());
        assert_eq!(out[4].as_ref().unwrap_err().kind, ErrorKind::InvalidRequest);
        let mut nodes: Vec<String> = c
            .routes(C)
            .into_iter()
            .map(|r| r.target_node.to_string())
            .collect();
        nodes.sort();
        assert_eq!(nodes, ["b", "c"]);

        assert_eq!(c.stats().total("batch"), 1, "a batch is one request");
        let log = c.log();
        assert_eq!(log[0].op, Operation::Batch);
        assert_eq!(log.len(), 6);
        assert!(
            log[1..]
                .iter()
                .all(|r| r.batch == Some(log[0].seq) && &*r.caller == "ctl")
        );
        assert_eq!(log.iter().filter(|r| r.is_mutation()).count(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn random_errors_are_seeded_and_reproducible() {
        async fn pattern(seed: u64) -> Vec<bool> {
            let c = cloud(MemoryConfig {
                seed,
                error_rates: ErrorRates {
                    list: Some(ErrorRate {
                        probability: 0.3,
                        kind: ErrorKind::Transient,
                    }),
                    ..ErrorRates::default()
                },
                ..MemoryConfig::default()
            });
            let mut out = Vec::new();
            for _ in 0..400 {
                match c.list_routes(C).await {
                    Ok(_) => out.push(false),
                    Err(e) => {
                        assert_eq!(e.kind, ErrorKind::Transient);
                        out.push(true);
                    }
                }
            }
            // Not sticky: once the rate is off, everything succeeds.
            c.set_error_rate(Operation::List, None);
            c.list_routes(C).await.unwrap();
            // Other operations are untouched by the list's rate.
            c.create_route(C, "u", &want("a", "10.244.1.0/24"))
                .await
                .unwrap();
            out
        }
        let a = pattern(7).await;
        assert_eq!(a, pattern(7).await, "same seed, same failures");
        assert_ne!(a, pattern(8).await, "another seed, other failures");
        let failures = a.iter().filter(|f| **f).count();
        assert!(
            (80..=160).contains(&failures),
            "about 30% of 400, got {failures}"
        );
        // An earlier failure never poisons a later success.
        assert!(a.windows(2).any(|w| w[0] && !w[1]));
    }

    #[tokio::test(start_paused = true)]
    async fn fail_next_fails_exactly_n_calls_of_one_operation() {
        let c = MemoryCloud::default();
        c.fail_next(Operation::Create, 2, ErrorKind::Conflict);
        for _ in 0..2 {
            let e = c
                .create_route(C, "u", &want("a", "10.244.1.0/24"))
                .await
                .unwrap_err();
            assert_eq!(e.kind, ErrorKind::Conflict);
        }
        assert!(c.routes(C).is_empty(), "failed calls change nothing");
        c.list_routes(C).await.unwrap();
        c.create_route(C, "u", &want("a", "10.244.1.0/24"))
            .await
            .unwrap();
        c.fail_next(Operation::List, 1, ErrorKind::Permanent);
        c.fail_next(Operation::List, 0, ErrorKind::Permanent);
        c.list_routes(C).await.unwrap();
        assert_eq!(c.stats().snapshot()[&("create", "conflict")], 2);
    }

    #[tokio::test(start_paused = true)]
    async fn storm_throttles_every_call_until_it_ends() {
        let c = MemoryCloud::default();
        c.set_storm(Some(Some(Duration::from_secs(3))));
        for _ in 0..3 {
            let e = c.list_routes(C).await.unwrap_err();
            assert_eq!(e.kind, ErrorKind::Throttled);
            assert_eq!(e.retry_after, Some(Duration::from_secs(3)));
        }
        assert!(
            c.create_route(C, "u", &want("a", "10.244.1.0/24"))
                .await
                .is_err()
        );
        c.set_storm(None);
        c.create_route(C, "u", &want("a", "10.244.1.0/24"))
            .await
            .unwrap();
        assert_eq!(c.stats().snapshot()[&("list", "throttled")], 3);
    }

    #[tokio::test(start_paused = true)]
    async fn injected_timeouts_still_take_effect() {
        let c = MemoryCloud::default();
        c.fail_next(Operation::Create, 1, ErrorKind::Timeout);
        let e = c
            .create_route(C, "u", &want("a", "10.244.1.0/24"))
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Timeout);
        assert!(e.makes_cache_uncertain());
        let listed = c.list_routes(C).await.unwrap();
        assert_eq!(listed.len(), 1, "the creation happened");
        c.fail_next(Operation::Delete, 1, ErrorKind::Timeout);
        let e = c.delete_route(C, &listed[0]).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Timeout);
        assert!(c.routes(C).is_empty(), "the deletion happened");
        // A timed-out list changes nothing and answers nothing.
        c.fail_next(Operation::List, 1, ErrorKind::Timeout);
        assert_eq!(c.list_routes(C).await.unwrap_err().kind, ErrorKind::Timeout);
        let log = c.log();
        assert_eq!(log[0].result, Err(ErrorKind::Timeout));
    }

    #[tokio::test(start_paused = true)]
    async fn routes_vanish_appear_and_die_behind_the_controllers_back() {
        let c = MemoryCloud::default();
        let r = c
            .create_route(C, "u", &want("a", "10.244.1.0/24"))
            .await
            .unwrap();
        let gone = c.remove_route(C, &r.destination).unwrap();
        assert_eq!(gone, r);
        assert!(c.list_routes(C).await.unwrap().is_empty());
        assert_eq!(
            c.delete_route(C, &r).await.unwrap_err().kind,
            ErrorKind::NotFound
        );

        assert!(
            c.insert_route(C, Route::new("stranger", cidr("10.244.5.0/24")))
                .is_none()
        );
        let listed = c.list_routes(C).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].target_node, "stranger");
        assert!(!listed[0].name.is_empty());
        c.delete_route(C, &listed[0]).await.unwrap();

        c.create_route(C, "u", &want("a", "10.244.1.0/24"))
            .await
            .unwrap();
        assert!(c.blackhole_route(C, &cidr("10.244.1.0/24")));
        assert!(!c.blackhole_route(C, &cidr("10.244.2.0/24")));
        assert!(c.list_routes(C).await.unwrap()[0].blackhole);
    }

    #[tokio::test(start_paused = true)]
    async fn clones_share_table_counters_and_limits() {
        let test_handle = cloud(MemoryConfig {
            rate_limit: Some(RateLimitConfig {
                requests: 1,
                period_secs: 3600,
                burst: 2,
            }),
            ..MemoryConfig::default()
        });
        let controller_handle = test_handle.with_caller("controller");
        controller_handle
            .create_route(C, "u", &want("a", "10.244.1.0/24"))
            .await
            .unwrap();
        assert_eq!(test_handle.routes(C).len(), 1);
        assert_eq!(test_handle.stats().total("create"), 1);
        test_handle.list_routes(C).await.unwrap();
        let e = controller_handle.list_routes(C).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Throttled, "one budget for all handles");
    }

    #[tokio::test(start_paused = true)]
    async fn lagging_lists_hide_new_routes_for_k_lists() {
        let c = cloud(MemoryConfig {
            list_lag: 2,
            ..MemoryConfig::default()
        });
        c.create_route(C, "u", &want("a", "10.244.1.0/24"))
            .await
            .unwrap();
        assert!(c.list_routes(C).await.unwrap().is_empty());
        assert!(c.list_routes(C).await.unwrap().is_empty());
        assert_eq!(c.list_routes(C).await.unwrap().len(), 1);
        // Still there even while hidden: a second create is refused.
        c.set_list_lag(1);
        c.create_route(C, "u", &want("b", "10.244.2.0/24"))
            .await
            .unwrap();
        let e = c
            .create_route(C, "u", &want("b", "10.244.2.0/24"))
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::AlreadyExists);
        assert_eq!(c.list_routes(C).await.unwrap().len(), 1);
        assert_eq!(c.list_routes(C).await.unwrap().len(), 2);
        assert_eq!(c.routes(C).len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn enforced_concurrency_answers_conflict_to_the_second_caller() {
        let c = cloud(MemoryConfig {
            max_concurrent_operations: 1,
            enforce_max_concurrency: true,
            latency: LatencyConfig::uniform(500),
            ..MemoryConfig::default()
        });
        let (r1, r2) = (want("n1", "10.244.1.0/24"), want("n2", "10.244.2.0/24"));
        let (x, y) = tokio::join!(c.create_route(C, "u1", &r1), c.create_route(C, "u2", &r2));
        assert!(x.is_ok());
        assert_eq!(y.unwrap_err().kind, ErrorKind::Conflict);
        // One at a time is fine, and lists do not count.
        let (l, z) = tokio::join!(c.list_routes(C), c.create_route(C, "u2", &r2));
        l.unwrap();
        z.unwrap();
        assert_eq!(c.capabilities().max_concurrent_operations, 1);
    }

    #[test]
    fn config_reads_from_files_and_rejects_nonsense() {
        let cfg: MemoryConfig = serde_json::from_str(
            r#"{
                "latency": {"create_ms": 20},
                "rate_limit": {"requests": 3600, "burst": 10},
                "max_routes": 100,
                "supports_ipv6": false,
                "error_rates": {"delete": {"probability": 0.5, "kind": "throttled"}},
                "seed": 42,
                "list_lag": 1
            }"#,
        )
        .unwrap();
        assert_eq!(cfg.latency.create_ms, 20);
        assert_eq!(cfg.latency.list_ms, 0);
        assert_eq!(cfg.rate_limit.unwrap().period_secs, 3600);
        assert_eq!(cfg.error_rates.delete.unwrap().kind, ErrorKind::Throttled);
        assert!(
            cfg.reports_node_addresses,
            "unset fields keep their defaults"
        );
        assert!(cfg.validate().is_ok());

        let empty: MemoryConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(empty, MemoryConfig::default());
        assert!(serde_json::from_str::<MemoryConfig>(r#"{"max_route": 3}"#).is_err());
        assert!(
            serde_json::from_str::<MemoryConfig>(
                r#"{"error_rates": {"list": {"probability": 0.1, "kind": "weird"}}}"#
            )
            .is_err()
        );

        let bad = MemoryConfig {
            error_rates: ErrorRates {
                create: Some(ErrorRate {
                    probability: 1.5,
                    kind: ErrorKind::Transient,
                }),
                ..ErrorRates::default()
            },
            ..MemoryConfig::default()
        };
        let e = MemoryCloud::new(bad).unwrap_err();
        assert!(e.to_string().contains("error_rates.create"), "{e}");
        let zero = MemoryConfig {
            rate_limit: Some(RateLimitConfig {
                requests: 0,
                period_secs: 3600,
                burst: 1,
            }),
            ..MemoryConfig::default()
        };
        assert!(matches!(
            zero.validate(),
            Err(MemoryConfigError::RateLimit(_))
        ));
        let nothing = MemoryConfig {
            max_concurrent_operations: 0,
            ..MemoryConfig::default()
        };
        assert_eq!(nothing.validate(), Err(MemoryConfigError::Concurrency));
    }

    #[tokio::test(start_paused = true)]
    async fn runtime_error_rate_is_clamped_not_panicking() {
        let c = MemoryCloud::default();
        c.set_error_rate(
            Operation::List,
            Some(ErrorRate {
                probability: f64::NAN,
                kind: ErrorKind::Transient,
            }),
        );
        c.list_routes(C).await.unwrap();
        c.set_error_rate(
            Operation::List,
            Some(ErrorRate {
                probability: 7.0,
                kind: ErrorKind::Transient,
            }),
        );
        assert_eq!(
            c.list_routes(C).await.unwrap_err().kind,
            ErrorKind::Transient
        );
    }
}
