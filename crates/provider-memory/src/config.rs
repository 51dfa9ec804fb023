//! What the simulated cloud is told to be.
//!
//! Owns [`MemoryConfig`] (read from `--cloud-config` by the binary, built in
//! code by tests and the simulator), its parts and its validation, and the
//! [`Operation`] names every other module keys latency, faults and the call
//! log by. Nothing here runs, and nothing here uses another module of this
//! crate: every other module reads these values.

use std::fmt;
use std::time::Duration;

use route_cloud::ErrorKind;
use route_core::TargetNeeds;
use serde::{Deserialize, Serialize};

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
    /// The label used in [`route_cloud::RequestStats`] and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::List => "list",
            Operation::Create => "create",
            Operation::Delete => "delete",
            Operation::Batch => "batch",
        }
    }

    /// Every operation, for checks that walk all of them.
    pub(crate) const ALL: [Operation; 4] = [
        Operation::List,
        Operation::Create,
        Operation::Delete,
        Operation::Batch,
    ];

    /// The slot of this operation in per-operation arrays (pending faults).
    pub(crate) fn index(self) -> usize {
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

    pub(crate) fn get(&self, op: Operation) -> Duration {
        Duration::from_millis(match op {
            Operation::List => self.list_ms,
            Operation::Create => self.create_ms,
            Operation::Delete => self.delete_ms,
            Operation::Batch => self.batch_ms,
        })
    }

    pub(crate) fn set(&mut self, op: Operation, d: Duration) {
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

    pub(crate) fn per_second(&self) -> f64 {
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
    pub(crate) fn get(&self, op: Operation) -> Option<ErrorRate> {
        match op {
            Operation::List => self.list,
            Operation::Create => self.create,
            Operation::Delete => self.delete,
            Operation::Batch => self.batch,
        }
    }

    pub(crate) fn set(&mut self, op: Operation, rate: Option<ErrorRate>) {
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
    /// Route tables of each cluster (default: one, unnamed): with names,
    /// every route lives in one of them (`Route::target`), as AWS route
    /// tables or OpenStack routers do, and `max_routes` applies to each.
    pub targets: Vec<String>,
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
            targets: Vec::new(),
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
        for (i, t) in self.targets.iter().enumerate() {
            if t.trim().is_empty() || self.targets[..i].contains(t) {
                return Err(MemoryConfigError::Targets(self.targets.clone()));
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
    /// An empty or repeated route table name.
    #[error("memory cloud: targets must be distinct, non-empty route table names, got {0:?}")]
    Targets(Vec<String>),
}
