//! Scenario files: what happens to the cluster and how the cloud behaves.
//!
//! A scenario is a TOML file read into [`Scenario`]. Every table rejects
//! unknown keys, durations are written like `"90s"`, `"10m"` or `"1h30m"`, and
//! [`Scenario::validate`] checks what serde cannot (the cluster CIDR, the
//! node CIDR size, rates within `[0, 1]`, events inside the day). This module
//! owns the file format only; [`crate::timeline`] turns a scenario into
//! events and [`crate::run`] plays them.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use provider_memory::{ErrorRate, ErrorRates, LatencyConfig, MemoryConfig, RateLimitConfig};
use route_cloud::ErrorKind;
use route_core::{Cidr, IpFamily};
use serde::{Deserialize, Deserializer, Serialize};

/// The scenarios shipped with the simulator, by name.
pub const SHIPPED: &[(&str, &str)] = &[
    ("idle-1000", include_str!("../scenarios/idle-1000.toml")),
    (
        "autoscaling-5000",
        include_str!("../scenarios/autoscaling-5000.toml"),
    ),
    (
        "flaky-hetzner",
        include_str!("../scenarios/flaky-hetzner.toml"),
    ),
    (
        "throttle-storm-50",
        include_str!("../scenarios/throttle-storm-50.toml"),
    ),
    (
        "azure-kubenet-400",
        include_str!("../scenarios/azure-kubenet-400.toml"),
    ),
    (
        "gce-routes-300",
        include_str!("../scenarios/gce-routes-300.toml"),
    ),
];

/// Why a scenario cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("cannot read scenario file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Neither a file nor a shipped scenario.
    #[error("no scenario file {0:?} and no shipped scenario of that name (shipped: {names})", names = shipped_names())]
    Unknown(String),
    /// The TOML is malformed or has unknown or mistyped keys.
    #[error("scenario {origin}: {message}")]
    Parse {
        /// File path or shipped name.
        origin: String,
        /// The TOML parser's message (with line and column).
        message: String,
    },
    /// A value is out of range.
    #[error("scenario {origin}: {message}")]
    Invalid {
        /// File path or shipped name.
        origin: String,
        /// What is wrong.
        message: String,
    },
}

fn shipped_names() -> String {
    SHIPPED
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A duration written as `"500ms"`, `"10s"`, `"5m"`, `"12h"`, `"1d"` or a
/// sum such as `"1h30m"`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Span(pub Duration);

impl fmt::Debug for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", format_duration(self.0))
    }
}

impl Serialize for Span {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration(&s)
            .map(Span)
            .map_err(serde::de::Error::custom)
    }
}

/// Parses `"1h30m"`-style durations (units `ms`, `s`, `m`, `h`, `d`; decimals allowed).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err("empty duration: write e.g. \"10s\", \"5m\" or \"1h30m\"".into());
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(format!(
                "invalid duration {text:?}: expected a number at {rest:?}"
            ));
        }
        let value: f64 = rest[..num_len].parse().map_err(|_| {
            format!(
                "invalid duration {text:?}: bad number {:?}",
                &rest[..num_len]
            )
        })?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let secs = match &rest[..unit_len] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86400.0,
            "" => {
                return Err(format!(
                    "invalid duration {text:?}: missing unit (ms, s, m, h or d)"
                ));
            }
            u => {
                return Err(format!(
                    "invalid duration {text:?}: unknown unit {u:?} (use ms, s, m, h or d)"
                ));
            }
        };
        rest = &rest[unit_len..];
        total += value * secs;
    }
    if !total.is_finite() || total > 365.0 * 86400.0 {
        return Err(format!("invalid duration {text:?}: longer than a year"));
    }
    Ok(Duration::from_secs_f64(total))
}

/// Formats a duration the way [`parse_duration`] reads it.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    if !ms.is_multiple_of(1000) {
        return format!("{ms}ms");
    }
    let mut s = (ms / 1000) as u64;
    let mut out = String::new();
    for (unit, len) in [("d", 86400), ("h", 3600), ("m", 60), ("s", 1)] {
        if s >= len {
            out.push_str(&format!("{}{unit}", s / len));
            s %= len;
        }
    }
    out
}

/// One scenario file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name (used in the chart's file name).
    pub name: String,
    /// One or two sentences on what the scenario models.
    #[serde(default)]
    pub description: String,
    /// Simulated time.
    pub duration: Span,
    /// Seed of every random choice of the scenario (and of the cloud's faults).
    #[serde(default)]
    pub seed: u64,
    /// The cluster CIDR (IPv4); pod CIDRs are carved from it.
    pub cluster_cidr: String,
    /// Prefix length of each node's pod CIDR (`--node-cidr-mask-size`, default 24).
    #[serde(default = "default_mask")]
    pub node_cidr_mask: u8,
    /// Nodes at the start.
    pub initial_nodes: u32,
    /// The cloud already has the initial nodes' routes (a controller restart
    /// on a running cluster) instead of an empty table.
    #[serde(default)]
    pub routes_exist_at_start: bool,
    /// How often each kubelet patches its Node's status (changes nothing the
    /// routes depend on; the controller must filter them). `"0s"` = never.
    #[serde(default = "default_heartbeat")]
    pub heartbeat_period: Span,
    /// Time from a Node's creation to the IPAM allocator setting its pod
    /// CIDR; zero creates Nodes with their pod CIDR already set.
    #[serde(default)]
    pub pod_cidr_delay: Span,
    /// Controller settings.
    #[serde(default)]
    pub controller: ControllerSpec,
    /// The simulated cloud.
    #[serde(default)]
    pub cloud: CloudSpec,
    /// Waves of new Nodes.
    #[serde(default)]
    pub scale_up: Vec<Wave>,
    /// Waves of deleted Nodes (chosen at random among live ones).
    #[serde(default)]
    pub scale_down: Vec<Wave>,
    /// Nodes whose InternalIP changes (chosen at random among live ones).
    #[serde(default)]
    pub address_changes: Vec<Wave>,
    /// Routes of live Nodes deleted in the cloud behind the controller's back.
    #[serde(default)]
    pub routes_removed: Vec<Burst>,
    /// Stray routes (inside the cluster CIDR, to no Node) added behind its back.
    #[serde(default)]
    pub routes_added: Vec<Burst>,
    /// Spans in which the cloud answers every call `Throttled` (EC2's
    /// `RequestLimitExceeded` while other clients exhaust the account's budget).
    #[serde(default)]
    pub throttle_storms: Vec<Storm>,
}

fn default_mask() -> u8 {
    24
}

fn default_heartbeat() -> Span {
    Span(Duration::from_secs(60))
}

/// Controller flags that matter to the simulation.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ControllerSpec {
    /// `--route-reconciliation-period` (periodic mode), default 10 s.
    pub route_reconciliation_period: Span,
    /// `--min-resync-period`, default 12 h; the resync interval is drawn in
    /// `[this, 2 × this)` from the scenario's seed, as production draws it at start.
    pub min_resync_period: Span,
    /// Relative jitter of retry backoff (production: 0.2). Jitter comes from
    /// the controller's own unseeded RNG, so runs with failed calls vary a
    /// little unless this is 0.
    pub retry_jitter: f64,
    /// `--concurrent-status-updates` (default 10).
    pub status_concurrency: usize,
    /// `--route-drift-check-period` (default 5 min; `0s` turns it off).
    pub route_drift_check_period: Span,
}

impl Default for ControllerSpec {
    fn default() -> Self {
        Self {
            route_reconciliation_period: Span(Duration::from_secs(10)),
            min_resync_period: Span(Duration::from_secs(12 * 3600)),
            retry_jitter: 0.2,
            status_concurrency: 10,
            route_drift_check_period: Span(route_controller::schedule::DEFAULT_DRIFT_PERIOD),
        }
    }
}

/// Latency per operation.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LatencySpec {
    /// `list_routes`.
    pub list: Span,
    /// `create_route`.
    pub create: Span,
    /// `delete_route`.
    pub delete: Span,
    /// `apply_batch`.
    pub batch: Span,
}

/// A server-side rate limit: `requests` per `per`, bucket of `burst`.
#[derive(Debug, Clone, Copy, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitSpec {
    /// Requests per period.
    pub requests: u32,
    /// The period (default 1 h).
    #[serde(default = "one_hour")]
    pub per: Span,
    /// Bucket size (default: `requests`, a full period's budget at once).
    #[serde(default)]
    pub burst: Option<u32>,
}

fn one_hour() -> Span {
    Span(Duration::from_secs(3600))
}

/// The simulated cloud (the `memory` provider).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CloudSpec {
    /// Latency per operation.
    pub latency: LatencySpec,
    /// Probability that any call fails (list, create, delete, batch).
    pub error_rate: f64,
    /// The class of those failures (default `transient`).
    pub error_kind: ErrorKind,
    /// Server-side rate limit (default: none).
    pub rate_limit: Option<RateLimitSpec>,
    /// Calls per hour other clients make against the same budget (e.g. the
    /// rest of a cloud project), spread evenly; they are not counted as the
    /// controller's calls.
    pub other_calls_per_hour: u32,
    /// Advertised concurrent mutations (default 10).
    pub max_concurrent_operations: usize,
    /// A mutation beyond `max_concurrent_operations` in flight answers
    /// `conflict` (one action at a time, as Hetzner's `locked`).
    pub enforce_max_concurrency: bool,
    /// Listed routes carry node addresses, so an address change replaces the
    /// route (default true).
    pub reports_node_addresses: bool,
    /// Batches supported (default false).
    pub supports_batch: bool,
    /// Route quota (default none).
    pub max_routes: Option<usize>,
    /// Lists a new route stays invisible to (eventual consistency, default 0).
    pub list_lag: u32,
    /// Route tables per cluster (default 1): with more, every Node's route
    /// must be in each (one private table per zone on AWS), and `max_routes`
    /// applies per table.
    pub tables: u32,
}

impl Default for CloudSpec {
    fn default() -> Self {
        Self {
            latency: LatencySpec::default(),
            error_rate: 0.0,
            error_kind: ErrorKind::Transient,
            rate_limit: None,
            other_calls_per_hour: 0,
            max_concurrent_operations: 10,
            enforce_max_concurrency: false,
            reports_node_addresses: true,
            supports_batch: false,
            max_routes: None,
            list_lag: 0,
            tables: 1,
        }
    }
}

/// Nodes spread uniformly at random over `[at, at + over)`.
#[derive(Debug, Clone, Copy, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Wave {
    /// Start, from the beginning of the day.
    pub at: Span,
    /// How many Nodes.
    pub count: u32,
    /// Spread (default 0: all at once).
    #[serde(default)]
    pub over: Span,
}

/// A span of time in which every call is throttled.
#[derive(Debug, Clone, Copy, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Storm {
    /// Start.
    pub at: Span,
    /// How long it lasts.
    pub lasting: Span,
    /// The retry-after every throttled answer carries (none: the answer
    /// says nothing, like EC2's).
    #[serde(default)]
    pub retry_after: Option<Span>,
}

/// A number of changes at one instant.
#[derive(Debug, Clone, Copy, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Burst {
    /// When.
    pub at: Span,
    /// How many routes.
    pub count: u32,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl CloudSpec {
    /// The `memory` provider configuration this spec describes.
    pub fn memory_config(&self, seed: u64) -> MemoryConfig {
        let rate = (self.error_rate > 0.0).then_some(ErrorRate {
            probability: self.error_rate,
            kind: self.error_kind,
        });
        MemoryConfig {
            latency: LatencyConfig {
                list_ms: ms(self.latency.list.0),
                create_ms: ms(self.latency.create.0),
                delete_ms: ms(self.latency.delete.0),
                batch_ms: ms(self.latency.batch.0),
            },
            rate_limit: self.rate_limit.map(|r| RateLimitConfig {
                requests: r.requests,
                period_secs: r.per.0.as_secs(),
                burst: r.burst.unwrap_or(r.requests),
            }),
            max_routes: self.max_routes,
            supports_ipv6: false,
            reports_node_addresses: self.reports_node_addresses,
            max_concurrent_operations: self.max_concurrent_operations,
            enforce_max_concurrency: self.enforce_max_concurrency,
            supports_batch: self.supports_batch,
            error_rates: ErrorRates {
                list: rate,
                create: rate,
                delete: rate,
                batch: rate,
            },
            seed,
            list_lag: self.list_lag,
            targets: if self.tables > 1 {
                (1..=self.tables).map(|i| format!("table-{i}")).collect()
            } else {
                Vec::new()
            },
            ..MemoryConfig::default()
        }
    }
}

impl Scenario {
    /// Reads a scenario from TOML text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ScenarioError> {
        let scenario: Scenario = toml::from_str(text).map_err(|e| ScenarioError::Parse {
            origin: origin.to_string(),
            message: e.to_string().trim_end().to_string(),
        })?;
        scenario
            .validate()
            .map_err(|message| ScenarioError::Invalid {
                origin: origin.to_string(),
                message,
            })?;
        Ok(scenario)
    }

    /// Loads `arg`: a file if one exists at that path, else a shipped scenario
    /// by name (with or without `.toml`).
    pub fn load(arg: &Path) -> Result<Self, ScenarioError> {
        if arg.is_file() {
            let text = std::fs::read_to_string(arg).map_err(|source| ScenarioError::Read {
                path: arg.to_path_buf(),
                source,
            })?;
            return Self::parse(&text, &arg.display().to_string());
        }
        let name = arg.to_string_lossy();
        let name = name.strip_suffix(".toml").unwrap_or(&name);
        let name = name.rsplit('/').next().unwrap_or(name);
        match SHIPPED.iter().find(|(n, _)| *n == name) {
            Some((n, text)) => Self::parse(text, n),
            None => Err(ScenarioError::Unknown(arg.display().to_string())),
        }
    }

    /// The cluster CIDR, parsed.
    pub fn cluster(&self) -> Result<Cidr, String> {
        let c = Cidr::parse(&self.cluster_cidr)
            .map_err(|e| format!("cluster_cidr {:?}: {e}", self.cluster_cidr))?;
        if c.family() != IpFamily::V4 {
            return Err(format!(
                "cluster_cidr {:?}: the simulator allocates IPv4 pod CIDRs only",
                self.cluster_cidr
            ));
        }
        Ok(c)
    }

    /// Checks what serde cannot.
    pub fn validate(&self) -> Result<(), String> {
        if self.name.trim().is_empty() {
            return Err("name must not be empty".into());
        }
        if self.duration.0.is_zero() {
            return Err("duration must be above zero".into());
        }
        let cluster = self.cluster()?;
        if self.node_cidr_mask > 30 || self.node_cidr_mask < cluster.prefix_len() {
            return Err(format!(
                "node_cidr_mask {} must lie between the cluster CIDR's prefix /{} and /30",
                self.node_cidr_mask,
                cluster.prefix_len()
            ));
        }
        let c = &self.controller;
        if c.route_reconciliation_period.0.is_zero() {
            return Err("controller.route_reconciliation_period must be above zero".into());
        }
        if c.min_resync_period.0.is_zero() {
            return Err("controller.min_resync_period must be above zero".into());
        }
        if !(0.0..=1.0).contains(&c.retry_jitter) {
            return Err(format!(
                "controller.retry_jitter must lie within [0, 1], got {}",
                c.retry_jitter
            ));
        }
        if c.status_concurrency == 0 {
            return Err("controller.status_concurrency must be at least 1".into());
        }
        let cl = &self.cloud;
        if !(0.0..=1.0).contains(&cl.error_rate) {
            return Err(format!(
                "cloud.error_rate must lie within [0, 1], got {}",
                cl.error_rate
            ));
        }
        if let Some(rl) = &cl.rate_limit
            && (rl.requests == 0 || rl.per.0.as_secs() == 0 || rl.burst == Some(0))
        {
            return Err(
                "cloud.rate_limit needs requests, per (at least 1s) and burst above zero".into(),
            );
        }
        if cl.max_concurrent_operations == 0 {
            return Err("cloud.max_concurrent_operations must be at least 1".into());
        }
        if cl.tables == 0 || cl.tables > 16 {
            return Err(format!(
                "cloud.tables must be between 1 and 16, got {}",
                cl.tables
            ));
        }
        let end = self.duration.0;
        let waves = [
            ("scale_up", &self.scale_up),
            ("scale_down", &self.scale_down),
            ("address_changes", &self.address_changes),
        ];
        for (what, list) in waves {
            for (i, w) in list.iter().enumerate() {
                if w.at.0 + w.over.0 > end {
                    return Err(format!(
                        "{what}[{i}] (at {:?} over {:?}) ends after the scenario's duration {:?}",
                        w.at, w.over, self.duration
                    ));
                }
            }
        }
        for (i, s) in self.throttle_storms.iter().enumerate() {
            if s.lasting.0.is_zero() || s.at.0 + s.lasting.0 > end {
                return Err(format!(
                    "throttle_storms[{i}] (at {:?} lasting {:?}) must last and end within the scenario's duration {:?}",
                    s.at, s.lasting, self.duration
                ));
            }
        }
        for (what, list) in [
            ("routes_removed", &self.routes_removed),
            ("routes_added", &self.routes_added),
        ] {
            for (i, b) in list.iter().enumerate() {
                if b.at.0 > end {
                    return Err(format!(
                        "{what}[{i}] at {:?} is after the scenario's duration {:?}",
                        b.at, self.duration
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_and_print() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert!(parse_duration("10").unwrap_err().contains("missing unit"));
        assert!(parse_duration("5w").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("h").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("9999999d").is_err());
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h30m");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_duration(Duration::ZERO), "0s");
    }

    #[test]
    fn every_shipped_scenario_parses() {
        for (name, text) in SHIPPED {
            let s = Scenario::parse(text, name).unwrap();
            assert_eq!(&s.name, name);
            assert!(!s.description.is_empty());
        }
    }
}
