//! Prometheus metrics: the one place they are registered and updated.
//!
//! One [`Metrics`] per process, registered in an explicit registry (no global
//! state, so tests can run side by side). Everything else reports through a
//! [`MetricsHandle`], whose methods say *what happened* (a pass ended, a
//! Node event was absorbed, a call waited at the throttle) and which
//! turns that into metric updates here; a handle without metrics (tests, the
//! simulator) does nothing. The binary's HTTP server encodes the registry.
//! Cloud request counters are read from the provider's
//! [`route_cloud::RequestStats`] at scrape time, so they count real API
//! requests (an action poll is a request too), not controller intentions.
//! Every metric is in base units (seconds); docs/reference/metrics.md is
//! generated from this registry ([`crate::reference`]).

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use route_cloud::{CloudRoutes, Fence};

use crate::schedule::{PassKind, SyncTrigger};

/// Labels of `route_controller_route_sync_total`, as upstream.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SyncLabels {
    /// `node_change` or `periodic`.
    pub trigger: &'static str,
    /// `changed`, `noop` or `error`.
    pub outcome: &'static str,
}

/// Labels of the reconcile duration histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PassLabels {
    /// `full` or `cached`.
    pub kind: &'static str,
}

/// All metrics of the controller.
pub struct Metrics {
    /// Passes by trigger and outcome.
    route_sync: Family<SyncLabels, Counter>,
    /// Reconcile pass duration.
    reconcile_duration: Family<PassLabels, Histogram>,
    /// Time from a Node first having a pod CIDR to its route being confirmed.
    route_latency: Histogram,
    /// Operations planned but not yet done (waiting for backoff or in flight).
    pending_operations: Gauge,
    /// Operations waiting for a retry after a failure.
    retrying_operations: Gauge,
    /// Route changes made by resync passes (drift the event path missed).
    route_corrections: Counter,
    /// 1 while this replica is the leader.
    leader: Gauge,
    /// Node events that triggered a pass vs. were absorbed (heartbeats, conditions).
    node_events: Family<EventLabels, Counter>,
    /// Warning events emitted.
    warnings: Family<ReasonLabels, Counter>,
    /// Seconds waited at the executor's throttle (server retry-after).
    throttle_wait: Counter<f64, AtomicU64>,
    /// Blackholes that came back after a repair and are retried with backoff.
    recurring_blackholes: Gauge,
    /// Operations the fence cut off (not sent, or abandoned); each is redone.
    fenced_operations: Counter,
    /// The route targets (tables, routers) in use: 1 per target.
    route_targets: Family<TargetLabels, Gauge>,
    /// Routes in each table (and family, where the cloud counts them apart).
    table_routes: Family<PoolLabels, Gauge>,
    /// The cloud's route limit of each table (and family).
    table_route_limit: Family<PoolLabels, Gauge>,
    /// Nodes per `NetworkUnavailable` reason of this controller's set.
    nodes_by_reason: Family<NodeReasonLabels, Gauge>,
    /// Changes found in the cloud that this controller did not make.
    drift: Family<DriftLabels, Counter>,
    /// 1 while a setting disagrees with the whole cluster, by check.
    configuration_error: Family<CheckLabels, Gauge>,
    /// Changes the bounds held in the last pass, by kind.
    held_changes: Family<HeldLabels, Gauge>,
    /// `--dry-run`: what the last pass would change, by operation and reason.
    dry_run_pending: Family<DryRunLabels, Gauge>,
    /// `--dry-run`: 1 when the last pass found nothing to do.
    dry_run_agreeing: Gauge,
    /// `--dry-run`: Unix time since when the passes agree; 0 while not.
    dry_run_agreeing_since: Gauge,
}

/// Labels of `route_controller_held_changes`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HeldLabels {
    /// `route_deletion` or `unavailable_node`.
    pub kind: &'static str,
}

/// Labels of `route_controller_dry_run_pending_operations`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DryRunLabels {
    /// `create`, `delete`, `condition` or `prerequisite`.
    pub operation: &'static str,
    /// The creation's or deletion's reason, the condition's target
    /// reason, or `prerequisite_off`.
    pub reason: &'static str,
}

/// Labels of `route_controller_configuration_error`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabels {
    /// `cluster_cidr`, `route_ip_families` or `node_selector`.
    pub check: &'static str,
}

/// Labels of `route_controller_drift_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DriftLabels {
    /// `route_missing`, `route_foreign`, `route_changed` or `prerequisite_lost`.
    pub kind: &'static str,
}

/// Labels of the route-limit gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    /// The route table (router, network); empty with a single table.
    pub table: String,
    /// `IPv4` or `IPv6` where the cloud counts the families apart (AWS),
    /// `any` where one limit counts both.
    pub family: &'static str,
}

/// Labels of `route_controller_nodes`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeReasonLabels {
    /// The condition's reason.
    pub reason: &'static str,
}

/// Labels of `route_controller_route_target`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabels {
    /// The target's id (route table id, router id); empty for a provider
    /// with a single table.
    pub target: String,
}

/// Labels for node events.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    /// `trigger` or `absorbed`.
    pub result: &'static str,
}

/// Labels for warnings.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
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
            throttle_wait: Counter::default(),
            recurring_blackholes: Gauge::default(),
            fenced_operations: Counter::default(),
            route_targets: Family::default(),
            table_routes: Family::default(),
            table_route_limit: Family::default(),
            nodes_by_reason: Family::default(),
            drift: Family::default(),
            configuration_error: Family::default(),
            held_changes: Family::default(),
            dry_run_pending: Family::default(),
            dry_run_agreeing: Gauge::default(),
            dry_run_agreeing_since: Gauge::default(),
        });
        for kind in crate::bounds::HeldKind::ALL {
            let _ = m.held_changes.get_or_create(&HeldLabels {
                kind: kind.as_str(),
            });
        }
        registry.register(
            "route_controller_held_changes",
            "Changes the last pass held because they would take away more at once than a bound allows (kind: route_deletion for --max-route-deletions, unavailable_node for --max-unavailable-nodes); 0 when nothing is held",
            m.held_changes.clone(),
        );
        for check in route_core::Misconfiguration::CHECKS {
            // Present at zero, so an alert reads a series before the first
            // mismatch.
            let _ = m.configuration_error.get_or_create(&CheckLabels { check });
        }
        registry.register(
            "route_controller_configuration_error",
            "1 while a setting of the controller disagrees with the whole cluster (check: cluster_cidr, route_ip_families, node_selector) and the controller changes nothing; the log and a ConfigurationMismatch Warning say which flag and why",
            m.configuration_error.clone(),
        );
        for kind in crate::drift::DriftKind::ALL {
            // Present at zero from the start, so an alert on its rate has
            // a series to read before the first drift.
            let _ = m.drift.get_or_create(&DriftLabels {
                kind: kind.as_str(),
            });
        }
        registry.register(
            "route_controller_drift",
            "Changes found in the cloud that this controller did not make (a route deleted, pointed elsewhere or changed; a forwarding prerequisite turned off), by kind; each is repaired or reported",
            m.drift.clone(),
        );
        registry.register(
            "route_controller_route_sync",
            "Reconcile passes by trigger (node_change, periodic, and drift_check for the drift check) and outcome (changed, noop, error); upstream's names and labels",
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
            "Node watch events by whether they triggered a pass (trigger) or were absorbed (absorbed: heartbeats, conditions, labels)",
            m.node_events.clone(),
        );
        registry.register(
            "route_controller_warning_events",
            "Warning Events emitted, by reason",
            m.warnings.clone(),
        );
        registry.register(
            "route_controller_throttle_wait_seconds",
            "Time cloud calls waited at the throttle because the cloud answered throttled",
            m.throttle_wait.clone(),
        );
        registry.register(
            "route_controller_recurring_blackholes",
            "Routes replaced after a blackhole that are blackholes again (instance stopped or gone); repairs back off",
            m.recurring_blackholes.clone(),
        );
        registry.register(
            "route_controller_fenced_operations",
            "Route changes the fence cut off (not sent or abandoned: renew deadline passed, leadership lost, shutting down); each is redone once this replica may write again",
            m.fenced_operations.clone(),
        );
        registry.register(
            "route_controller_route_target",
            "The route targets (route tables, routers) the controller keeps routes in, 1 each; target=\"\" for a provider with one table",
            m.route_targets.clone(),
        );
        registry.register(
            "route_controller_route_table_routes",
            "Routes in each route table after the last pass; family is IPv4/IPv6 where the cloud limits the families apart (AWS), any otherwise; only with a route limit",
            m.table_routes.clone(),
        );
        registry.register(
            "route_controller_route_table_route_limit",
            "The cloud's route limit per route table (and family); absent where the cloud has none",
            m.table_route_limit.clone(),
        );
        registry.register(
            "route_controller_nodes",
            "Nodes by the reason of the NetworkUnavailable condition this controller gives them (RouteCreated, NoRouteCreated, RouteQuotaExceeded, ...); Nodes without one of its reasons are not counted",
            m.nodes_by_reason.clone(),
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

impl Metrics {
    /// Registers the gauges of `--dry-run` (only a dry-run replica shows
    /// them: on a replica that writes they would read as a disagreement).
    pub fn register_dry_run(&self, registry: &mut Registry) {
        registry.register(
            "route_controller_dry_run_pending_operations",
            "Only with --dry-run: what the last pass would have changed and did not, by operation (create, delete: routes; condition: a Node's NetworkUnavailable; prerequisite: a forwarding prerequisite repair) and reason (the creation's or deletion's reason, the condition's reason, prerequisite_off); each is logged once as a dry run line",
            self.dry_run_pending.clone(),
        );
        registry.register(
            "route_controller_dry_run_agreeing",
            "Only with --dry-run: 1 when the last pass found nothing to change (no route to create or delete, no condition to set, no prerequisite to repair): the cloud and the Nodes are as this controller would make them",
            self.dry_run_agreeing.clone(),
        );
        registry.register(
            "route_controller_dry_run_agreeing_since_seconds",
            "Only with --dry-run: Unix time since when every pass has found nothing to change; 0 while the last pass found something",
            self.dry_run_agreeing_since.clone(),
        );
    }

    /// Registers the count of `fence`'s late renewals, read at scrape time.
    pub fn register_fence(registry: &mut Registry, fence: Fence) {
        registry.register_collector(Box::new(FenceCollector { fence }));
    }
}

/// Reads the fence's late renewals at scrape time.
#[derive(Debug)]
struct FenceCollector {
    fence: Fence,
}

impl Collector for FenceCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let enc = encoder.encode_descriptor(
            "route_controller_late_lease_renewals",
            "Lease renewals that came back after the renew deadline while this replica kept leadership: the fence closed and reopened",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        ConstCounter::new(self.fence.late_renewals()).encode(enc)?;
        Ok(())
    }
}

/// How the rest of the crate reports to the metrics: one method per thing
/// that happened. Cheap to clone; does nothing without metrics.
#[derive(Clone, Default)]
pub struct MetricsHandle(Option<Arc<Metrics>>);

impl From<Option<Arc<Metrics>>> for MetricsHandle {
    fn from(m: Option<Arc<Metrics>>) -> Self {
        Self(m)
    }
}

/// How a pass ended, for `route_controller_route_sync_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassOutcome {
    /// Some operation failed (or the list did).
    Error,
    /// Something changed in the cloud.
    Changed,
    /// Nothing to do.
    Noop,
}

impl PassOutcome {
    /// The label value, as upstream.
    pub fn as_str(self) -> &'static str {
        match self {
            PassOutcome::Error => "error",
            PassOutcome::Changed => "changed",
            PassOutcome::Noop => "noop",
        }
    }
}

impl MetricsHandle {
    /// This replica holds the Lease, or not.
    pub fn leader(&self, leader: bool) {
        if let Some(m) = &self.0 {
            m.leader.set(i64::from(leader));
            if !leader {
                // What only the leader's passes set would otherwise stay at
                // its last value on a replica that lost the Lease, and an
                // alert taking the max over replicas would read the stale
                // one: a standby has nothing pending, retrying or held.
                m.pending_operations.set(0);
                m.retrying_operations.set(0);
                m.recurring_blackholes.set(0);
                m.nodes_by_reason.clear();
                m.table_routes.clear();
                m.table_route_limit.clear();
                for check in route_core::Misconfiguration::CHECKS {
                    m.configuration_error
                        .get_or_create(&CheckLabels { check })
                        .set(0);
                }
                for kind in crate::bounds::HeldKind::ALL {
                    m.held_changes
                        .get_or_create(&HeldLabels {
                            kind: kind.as_str(),
                        })
                        .set(0);
                }
            }
        }
    }

    /// A Node watch event after the first sync: it triggered a pass, or was
    /// absorbed (heartbeat, condition, label).
    pub fn node_event(&self, triggered: bool) {
        if let Some(m) = &self.0 {
            let result = if triggered { "trigger" } else { "absorbed" };
            m.node_events.get_or_create(&EventLabels { result }).inc();
        }
    }

    /// A Warning Event with this reason was emitted.
    pub fn warning(&self, reason: &'static str) {
        if let Some(m) = &self.0 {
            m.warnings.get_or_create(&ReasonLabels { reason }).inc();
        }
    }

    /// A cloud call waited this long at the throttle.
    pub fn throttle_waited(&self, waited: Duration) {
        if let Some(m) = &self.0 {
            m.throttle_wait.inc_by(waited.as_secs_f64());
        }
    }

    /// A Node's pod CIDR got its first route this long after it was first seen.
    pub fn route_confirmed(&self, latency: Duration) {
        if let Some(m) = &self.0 {
            m.route_latency.observe(latency.as_secs_f64());
        }
    }

    /// Operations planned and not done yet.
    pub fn pending_operations(&self, n: usize) {
        if let Some(m) = &self.0 {
            m.pending_operations.set(gauge(n));
        }
    }

    /// The fence cut off `n` planned operations.
    pub fn fenced(&self, n: usize) {
        if let Some(m) = &self.0
            && n > 0
        {
            m.fenced_operations.inc_by(n as u64);
        }
    }

    /// A change behind the controller's back was found.
    pub fn drift(&self, kind: crate::drift::DriftKind) {
        if let Some(m) = &self.0 {
            m.drift
                .get_or_create(&DriftLabels {
                    kind: kind.as_str(),
                })
                .inc();
        }
    }

    /// The route targets now in use.
    pub fn targets(&self, targets: &[route_core::Text]) {
        if let Some(m) = &self.0 {
            m.route_targets.clear();
            if targets.is_empty() {
                m.route_targets
                    .get_or_create(&TargetLabels {
                        target: String::new(),
                    })
                    .set(1);
            }
            for t in targets {
                m.route_targets
                    .get_or_create(&TargetLabels {
                        target: t.to_string(),
                    })
                    .set(1);
            }
        }
    }

    /// The configuration check's verdict of the last pass: the check that
    /// failed, or none.
    pub fn configuration(&self, failed: Option<&'static str>) {
        if let Some(m) = &self.0 {
            for check in route_core::Misconfiguration::CHECKS {
                m.configuration_error
                    .get_or_create(&CheckLabels { check })
                    .set(i64::from(failed == Some(check)));
            }
        }
    }

    /// What the bounds held in the last pass.
    pub fn held(&self, held: &[crate::bounds::Held]) {
        if let Some(m) = &self.0 {
            for kind in crate::bounds::HeldKind::ALL {
                let n = held
                    .iter()
                    .filter(|h| h.kind == kind)
                    .map(|h| h.planned)
                    .sum::<usize>();
                m.held_changes
                    .get_or_create(&HeldLabels {
                        kind: kind.as_str(),
                    })
                    .set(gauge(n));
            }
        }
    }

    /// A dry-run pass found these differences (by operation and reason):
    /// it agrees when there are none, since `since` (Unix seconds, 0 while
    /// it disagrees).
    pub fn dry_run(
        &self,
        pending: &std::collections::BTreeMap<(crate::dry_run::DryRunOp, &'static str), usize>,
        agreeing: bool,
        since: u64,
    ) {
        if let Some(m) = &self.0 {
            m.dry_run_pending.clear();
            for ((op, reason), n) in pending {
                m.dry_run_pending
                    .get_or_create(&DryRunLabels {
                        operation: op.as_str(),
                        reason,
                    })
                    .set(gauge(*n));
            }
            m.dry_run_agreeing.set(i64::from(agreeing));
            m.dry_run_agreeing_since
                .set(i64::try_from(since).unwrap_or(i64::MAX));
        }
    }

    /// Metrics are kept (a registry was given).
    pub fn enabled(&self) -> bool {
        self.0.is_some()
    }

    /// Routes per route limit after a pass, and the limit.
    pub fn route_room(
        &self,
        used: &std::collections::HashMap<crate::gate::Pool, usize>,
        max: usize,
    ) {
        if let Some(m) = &self.0 {
            m.table_routes.clear();
            m.table_route_limit.clear();
            for ((table, family), n) in used {
                let labels = PoolLabels {
                    table: table.to_string(),
                    family: match family {
                        Some(route_core::IpFamily::V4) => "IPv4",
                        Some(route_core::IpFamily::V6) => "IPv6",
                        None => "any",
                    },
                };
                m.table_routes.get_or_create(&labels).set(gauge(*n));
                m.table_route_limit.get_or_create(&labels).set(gauge(max));
            }
        }
    }

    /// How many Nodes carry each reason of this controller's set.
    pub fn nodes_by_reason(&self, counts: &[(route_core::NetworkCondition, usize)]) {
        if let Some(m) = &self.0 {
            for (c, n) in counts {
                m.nodes_by_reason
                    .get_or_create(&NodeReasonLabels { reason: c.reason() })
                    .set(gauge(*n));
            }
        }
    }

    /// The state a pass left behind: operations waiting for a retry, and
    /// blackholes that came back after a repair.
    pub fn backlog(&self, retrying: usize, recurring_blackholes: usize) {
        if let Some(m) = &self.0 {
            m.retrying_operations.set(gauge(retrying));
            m.recurring_blackholes.set(gauge(recurring_blackholes));
        }
    }

    /// A pass ended: its trigger, kind, outcome and duration, and how many
    /// routes it changed (counted as corrections when a resync made them).
    pub fn pass_finished(
        &self,
        trigger: SyncTrigger,
        kind: PassKind,
        outcome: PassOutcome,
        changed: usize,
        took: Duration,
    ) {
        let Some(m) = &self.0 else { return };
        if trigger == SyncTrigger::Periodic && kind == PassKind::Full {
            m.route_corrections.inc_by(changed as u64);
        }
        m.route_sync
            .get_or_create(&SyncLabels {
                trigger: trigger.as_str(),
                outcome: outcome.as_str(),
            })
            .inc();
        m.reconcile_duration
            .get_or_create(&PassLabels {
                kind: kind.as_str(),
            })
            .observe(took.as_secs_f64());
    }
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
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
            prometheus_client::metrics::MetricType::Counter,
        )?;
        ConstCounter::new(wait).encode(enc)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use route_cloud::RequestStats;

    #[test]
    fn throttle_waits_are_counted_in_seconds() {
        let mut registry = Registry::default();
        let cloud = Arc::new(crate::reference::Idle(RequestStats::default()));
        let m = MetricsHandle::from(Some(Metrics::register(&mut registry, cloud)));
        m.throttle_waited(Duration::from_millis(1500));
        m.throttle_waited(Duration::from_millis(500));
        let text = encode(&registry);
        assert!(
            text.lines()
                .any(|l| l == "route_controller_throttle_wait_seconds_total 2.0"),
            "{text}"
        );
    }
}
