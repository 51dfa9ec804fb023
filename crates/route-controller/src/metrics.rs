//! Prometheus metrics.
//!
//! One [`Metrics`] per process, registered in an explicit registry (no global
//! state, so tests can run side by side). The reconcile loop updates them; the
//! binary's HTTP server encodes them. Cloud request counters are read from the
//! provider's [`route_cloud::RequestStats`] at scrape time, so they count real
//! API requests (an action poll is a request too), not controller intentions.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use route_cloud::CloudRoutes;

/// Labels of `route_controller_route_sync_total`, as upstream.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SyncLabels {
    /// `node_change` or `periodic`.
    pub trigger: &'static str,
    /// `changed`, `noop` or `error`.
    pub outcome: &'static str,
}

/// Labels of the reconcile duration histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PassLabels {
    /// `full` or `cached`.
    pub kind: &'static str,
}

/// All metrics of the controller.
pub struct Metrics {
    /// Passes by trigger and outcome.
    pub route_sync: Family<SyncLabels, Counter>,
    /// Reconcile pass duration.
    pub reconcile_duration: Family<PassLabels, Histogram>,
    /// Time from a Node first having a pod CIDR to its route being confirmed.
    pub route_latency: Histogram,
    /// Operations planned but not yet done (waiting for backoff or in flight).
    pub pending_operations: Gauge,
    /// Operations waiting for a retry after a failure.
    pub retrying_operations: Gauge,
    /// Route changes made by resync passes (drift the event path missed).
    pub route_corrections: Counter,
    /// 1 while this replica is the leader.
    pub leader: Gauge,
    /// Node events that triggered a pass vs. were absorbed (heartbeats, conditions).
    pub node_events: Family<EventLabels, Counter>,
    /// Warning events emitted.
    pub warnings: Family<ReasonLabels, Counter>,
    /// Seconds waited at the executor's throttle gate (server retry-after).
    pub throttle_wait_micros: Counter<u64, AtomicU64>,
    /// Blackholes that came back after a repair and are retried with backoff.
    pub recurring_blackholes: Gauge,
}

/// Labels for node events.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// `trigger` or `absorbed`.
    pub result: &'static str,
}

/// Labels for warnings.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Event reason.
    pub reason: &'static str,
}

impl Metrics {
    /// Creates the metrics and registers them (and the cloud's request
    /// counters) in `registry`.
    pub fn register(registry: &mut Registry, cloud: Arc<dyn CloudRoutes>) -> Arc<Self> {
        let m = Arc::new(Self {
            route_sync: Family::default(),
            reconcile_duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 18))
            }),
            route_latency: Histogram::new(exponential_buckets(0.05, 2.0, 14)),
            pending_operations: Gauge::default(),
            retrying_operations: Gauge::default(),
            route_corrections: Counter::default(),
            leader: Gauge::default(),
            node_events: Family::default(),
            warnings: Family::default(),
            throttle_wait_micros: Counter::default(),
            recurring_blackholes: Gauge::default(),
        });
        registry.register(
            "route_controller_route_sync",
            "Reconcile passes by trigger (node_change, periodic) and outcome (changed, noop, error)",
            m.route_sync.clone(),
        );
        registry.register(
            "route_controller_reconcile_duration_seconds",
            "Duration of reconcile passes, by kind (full: listed the cloud; cached: planned against the cached route table)",
            m.reconcile_duration.clone(),
        );
        registry.register(
            "route_controller_node_route_latency_seconds",
            "Time from a Node first being seen with a pod CIDR to its route being confirmed in the cloud",
            m.route_latency.clone(),
        );
        registry.register(
            "route_controller_pending_operations",
            "Route creations and deletions planned and not yet done",
            m.pending_operations.clone(),
        );
        registry.register(
            "route_controller_retrying_operations",
            "Route creations and deletions waiting for a retry after a failure",
            m.retrying_operations.clone(),
        );
        registry.register(
            "route_controller_route_corrections",
            "Route changes made by resync passes: drift that node events did not explain",
            m.route_corrections.clone(),
        );
        registry.register(
            "route_controller_leader",
            "1 if this replica holds the leader Lease",
            m.leader.clone(),
        );
        registry.register(
            "route_controller_node_events",
            "Node watch events by whether they triggered a reconcile or were absorbed",
            m.node_events.clone(),
        );
        registry.register(
            "route_controller_warning_events",
            "Warning Events emitted, by reason",
            m.warnings.clone(),
        );
        registry.register(
            "route_controller_throttle_wait_microseconds",
            "Time cloud calls waited because the cloud answered throttled",
            m.throttle_wait_micros.clone(),
        );
        registry.register(
            "route_controller_recurring_blackholes",
            "Routes replaced after a blackhole that are blackholes again (instance stopped or gone); repairs back off",
            m.recurring_blackholes.clone(),
        );
        registry.register(
            "route_controller_build",
            "Build information",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        registry.register_collector(Box::new(CloudCollector { cloud }));
        m
    }
}

/// Reads the provider's request counters at scrape time.
struct CloudCollector {
    cloud: Arc<dyn CloudRoutes>,
}

impl std::fmt::Debug for CloudCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CloudCollector({})", self.cloud.name())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CloudLabels {
    provider: &'static str,
    operation: &'static str,
    result: &'static str,
}

impl Collector for CloudCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let stats = self.cloud.stats();
        let provider = self.cloud.name();
        {
            let mut enc = encoder.encode_descriptor(
                "route_controller_cloud_requests",
                "Cloud API requests by provider, operation and result",
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for ((operation, result), n) in stats.snapshot() {
                let labels = CloudLabels {
                    provider,
                    operation,
                    result,
                };
                ConstCounter::new(n).encode(enc.encode_family(&labels)?)?;
            }
        }
        let wait = stats.rate_limit_wait().as_secs_f64();
        let enc = encoder.encode_descriptor(
            "route_controller_cloud_rate_limit_wait_seconds",
            "Time the provider client waited for its request budget or a server's reset",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        ConstGauge::new(wait).encode(enc)?;
        Ok(())
    }
}

/// Encodes a registry as Prometheus text.
pub fn encode(registry: &Registry) -> String {
    let mut s = String::new();
    if prometheus_client::encoding::text::encode(&mut s, registry).is_err() {
        let _ = writeln!(s, "# encoding failed");
    }
    s
}
