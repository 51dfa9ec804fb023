//! The JSON shapes of the simulated cloud's HTTP API, shared by the server
//! and both clients so the two ends cannot drift apart.
//!
//! Routes travel as [`WireRoute`]: the same fields as [`route_core::Route`]
//! but with the destination as plain text (`"10.244.1.0/24"`), so scripts
//! can read and write them with `curl` and `jq`. The conversion is exact for
//! every destination a provider can produce ([`Destination::parse`] is how
//! both ends read it back).

use std::time::Duration;

use provider_memory::{ErrorRate, MemoryConfig, Operation, RateLimitConfig};
use route_cloud::{Capabilities, CloudError, ErrorKind};
use route_core::{Destination, NodeAddress, Route, TargetNeeds, Text};
use serde::{Deserialize, Deserializer, Serialize};

/// The header that carries the caller's identity (recorded in the call log).
pub const CALLER_HEADER: &str = "x-caller";

/// The caller tag recorded when a request has no `X-Caller` header.
pub const ANONYMOUS_CALLER: &str = "anonymous";

/// The longest caller tag the server accepts.
pub const MAX_CALLER_LEN: usize = 253;

/// A route on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireRoute {
    /// The cloud's name for the route (empty on routes to create).
    #[serde(default)]
    pub name: String,
    /// The target node.
    #[serde(default)]
    pub node: String,
    /// The destination as text.
    pub destination: String,
    /// The route's target is gone.
    #[serde(default)]
    pub blackhole: bool,
    /// The target node's addresses (`{"type": "InternalIP", "address": ...}`).
    #[serde(default)]
    pub node_addresses: Vec<NodeAddress>,
    /// The addresses are reliable.
    #[serde(default)]
    pub enable_node_addresses: bool,
    /// What the route points at in the cloud's terms.
    #[serde(default)]
    pub next_hop: String,
    /// The target node's `spec.providerID`.
    #[serde(default)]
    pub node_provider_id: Option<String>,
    /// The route table it lives in (empty: the cluster's one table).
    #[serde(default)]
    pub target: String,
}

impl From<&Route> for WireRoute {
    fn from(r: &Route) -> Self {
        Self {
            name: r.name.to_string(),
            node: r.node.to_string(),
            destination: r.destination.to_string(),
            blackhole: r.blackhole,
            node_addresses: r.node_addresses.clone(),
            enable_node_addresses: r.enable_node_addresses,
            next_hop: r.next_hop.to_string(),
            node_provider_id: r.node_provider_id.as_deref().map(String::from),
            target: r.table.to_string(),
        }
    }
}

impl From<WireRoute> for Route {
    fn from(w: WireRoute) -> Self {
        Route {
            name: w.name.into(),
            node: w.node.into(),
            destination: Destination::parse(&w.destination),
            blackhole: w.blackhole,
            node_addresses: w.node_addresses,
            enable_node_addresses: w.enable_node_addresses,
            next_hop: w.next_hop.into(),
            node_provider_id: w.node_provider_id.map(Text::from),
            table: w.target.into(),
            // The wire protocol has no ownership evidence.
            foreign: None,
        }
    }
}

/// `POST /v1/clusters/{cluster}/routes`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    /// Goes into the created route's name (the node's uid, by convention).
    #[serde(default)]
    pub name_hint: String,
    /// The route to create; its name is ignored.
    pub route: WireRoute,
}

/// `POST /v1/clusters/{cluster}/routes/delete`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteRequest {
    /// The route as listed; a non-empty name must match the stored one.
    pub route: WireRoute,
}

/// One creation inside a batch.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchCreate {
    /// As in [`CreateRequest`].
    #[serde(default)]
    pub name_hint: String,
    /// As in [`CreateRequest`].
    pub route: WireRoute,
}

/// `POST /v1/clusters/{cluster}/batch`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BatchRequest {
    /// Routes to delete, applied first.
    pub delete: Vec<WireRoute>,
    /// Routes to create, applied after the deletions.
    pub create: Vec<BatchCreate>,
}

/// The outcome of one change of a batch, naming the change it answers:
/// `{"index": 2, "route": ...}` for a creation, `{"index": 0}` for a
/// deletion, `{"index": 1, "error": ...}` for a failed change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchItem {
    /// Which change of the request this answers: its position in the
    /// request's `delete`, or the number of deletions plus its position in
    /// `create`. The client maps it back to the key it holds the change
    /// under, so the answer is read by change, not by its own order.
    pub index: usize,
    /// The created route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<WireRoute>,
    /// Why the change failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<WireError>,
}

/// The answer to a batch: one item per change, each naming its change by
/// [`BatchItem::index`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchResponse {
    /// In no particular order.
    pub results: Vec<BatchItem>,
}

/// Every error answer's body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireError {
    /// The [`ErrorKind`] label.
    pub kind: ErrorKind,
    /// What went wrong.
    pub message: String,
    /// How long to wait before retrying (throttling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

impl From<&CloudError> for WireError {
    fn from(e: &CloudError) -> Self {
        Self {
            kind: e.kind,
            message: e.message.clone(),
            retry_after_ms: e.retry_after.map(duration_ms_ceil),
        }
    }
}

impl From<WireError> for CloudError {
    fn from(w: WireError) -> Self {
        CloudError {
            kind: w.kind,
            message: w.message,
            retry_after: w.retry_after_ms.map(Duration::from_millis),
        }
    }
}

/// Whole milliseconds, rounded up so a client never retries too early.
pub fn duration_ms_ceil(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// The HTTP status the server answers for each error class.
pub fn status_for(kind: ErrorKind) -> u16 {
    match kind {
        ErrorKind::InvalidRequest => 400,
        ErrorKind::Permanent => 401,
        ErrorKind::QuotaExceeded => 403,
        ErrorKind::NotFound => 404,
        ErrorKind::Conflict | ErrorKind::AlreadyExists => 409,
        ErrorKind::Throttled => 429,
        ErrorKind::Transient => 503,
        ErrorKind::Timeout => 504,
        // The target cannot take the route in its state: the request was
        // understood and refused, as WebDAV's "unprocessable".
        ErrorKind::TargetUnavailable => 422,
        // A refusal the client makes of itself; a simulated cloud told to
        // inject it answers like a lock held by someone else.
        ErrorKind::Fenced => 423,
    }
}

/// The class of an error answer whose body is not a [`WireError`] (a proxy,
/// a wrong endpoint, a crashed handler). A 4xx that does not come from the
/// simulated cloud means the endpoint is misconfigured, which needs an operator.
pub fn kind_for_bare_status(status: u16) -> ErrorKind {
    match status {
        429 => ErrorKind::Throttled,
        504 => ErrorKind::Timeout,
        500..=599 => ErrorKind::Transient,
        _ => ErrorKind::Permanent,
    }
}

/// `GET /v1/capabilities`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireCapabilities {
    /// [`Capabilities::max_concurrent_operations`].
    pub max_concurrent_operations: usize,
    /// [`Capabilities::supports_batch`].
    pub supports_batch: bool,
    /// [`Capabilities::reports_node_addresses`].
    pub reports_node_addresses: bool,
    /// [`Capabilities::supports_ipv6`].
    pub supports_ipv6: bool,
    /// [`Capabilities::max_routes`].
    pub max_routes: Option<usize>,
    /// [`Capabilities::needs`]; absent from older servers.
    #[serde(default)]
    pub needs: TargetNeeds,
    /// [`Capabilities::replaces_blackholes`]; absent from older servers.
    #[serde(default)]
    pub replaces_blackholes: bool,
    /// The route tables of each cluster (`CloudRoutes::targets`); absent
    /// from older servers and empty for a cloud with one table per cluster.
    #[serde(default)]
    pub targets: Vec<String>,
}

impl From<&Capabilities> for WireCapabilities {
    fn from(c: &Capabilities) -> Self {
        Self {
            max_concurrent_operations: c.max_concurrent_operations,
            supports_batch: c.supports_batch,
            reports_node_addresses: c.reports_node_addresses,
            supports_ipv6: c.supports_ipv6,
            max_routes: c.max_routes,
            needs: c.needs,
            replaces_blackholes: c.replaces_blackholes,
            targets: Vec::new(),
        }
    }
}

impl From<WireCapabilities> for Capabilities {
    fn from(w: WireCapabilities) -> Self {
        Capabilities {
            // A server answering 0 would stall the executor; one is the floor.
            max_concurrent_operations: w.max_concurrent_operations.max(1),
            supports_batch: w.supports_batch,
            reports_node_addresses: w.reports_node_addresses,
            supports_ipv6: w.supports_ipv6,
            max_routes: w.max_routes,
            needs: w.needs,
            replaces_blackholes: w.replaces_blackholes,
            // The wire protocol has no forwarding check.
            checks_forwarding: false,
            max_routes_per_family: false,
        }
    }
}

// ---- admin ----

/// `GET /admin/state`: every cluster's table as stored (including routes a
/// lagging list still hides), plus the configuration in force.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateSnapshot {
    /// Cluster name → routes, ordered by destination.
    pub clusters: std::collections::BTreeMap<String, Vec<WireRoute>>,
    /// The configuration in force (after fault changes).
    pub config: MemoryConfig,
    /// The most create/delete/batch calls that were in flight at once.
    pub peak_concurrency: usize,
}

/// One counter of `GET /admin/stats`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Count {
    /// `list`, `create`, `delete` or `batch`.
    pub operation: String,
    /// `ok` or an [`ErrorKind`] label.
    pub result: String,
    /// How many.
    pub count: u64,
}

/// One per-caller counter of `GET /admin/stats`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallerCount {
    /// The `X-Caller` tag.
    pub caller: String,
    /// `list`, `create`, `delete`, `batch` or `capabilities`.
    pub operation: String,
    /// `ok` or an [`ErrorKind`] label.
    pub result: String,
    /// How many.
    pub count: u64,
}

/// `GET /admin/stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsSnapshot {
    /// The simulated cloud's own counters, one per request (a batch is one).
    pub counts: Vec<Count>,
    /// API requests per caller as the server answered them.
    pub by_caller: Vec<CallerCount>,
    /// The most create/delete/batch calls that were in flight at once.
    pub peak_concurrency: usize,
}

impl StatsSnapshot {
    /// Requests of `operation` ending in `result`.
    pub fn count(&self, operation: &str, result: &str) -> u64 {
        self.counts
            .iter()
            .filter(|c| c.operation == operation && c.result == result)
            .map(|c| c.count)
            .sum()
    }

    /// Requests of `operation`, any result.
    pub fn total(&self, operation: &str) -> u64 {
        self.counts
            .iter()
            .filter(|c| c.operation == operation)
            .map(|c| c.count)
            .sum()
    }

    /// Requests of `operation` (any result) made by `caller`.
    pub fn caller_total(&self, caller: &str, operation: &str) -> u64 {
        self.by_caller
            .iter()
            .filter(|c| c.caller == caller && c.operation == operation)
            .map(|c| c.count)
            .sum()
    }
}

/// One entry of `GET /admin/log`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    /// Position in the log, from 0 (restarts after a clear or reset).
    pub seq: u64,
    /// Milliseconds since the server started, when the call took effect.
    pub at_ms: u64,
    /// The `X-Caller` tag.
    pub caller: String,
    /// The cluster.
    pub cluster: String,
    /// What was called.
    pub op: Operation,
    /// The route's target node (creations and deletions).
    pub node: Option<String>,
    /// The route's destination (creations and deletions).
    pub destination: Option<String>,
    /// The `seq` of the batch a change belongs to.
    pub batch: Option<u64>,
    /// `ok` or the [`ErrorKind`] label answered.
    pub result: String,
}

impl LogEntry {
    /// A create or delete that changed the table.
    pub fn is_mutation(&self) -> bool {
        matches!(self.op, Operation::Create | Operation::Delete) && self.result == "ok"
    }
}

/// "Fail the next `count` calls of `op` with `kind`".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailNext {
    /// The operation.
    pub op: Operation,
    /// How many calls; 0 clears a pending failure.
    pub count: u32,
    /// The error class answered.
    pub kind: ErrorKind,
}

/// `POST /admin/faults`: every field is optional and only the fields given
/// change anything. `null` clears `rate_limit` and `max_routes`, and an
/// operation mapped to `null` in `error_rates` stops failing at random.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Pending failures to set, per operation.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fail_next: Vec<FailNext>,
    /// Random failure rates to set or clear, per operation.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub error_rates: std::collections::BTreeMap<Operation, Option<ErrorRate>>,
    /// Latency in milliseconds to set, per operation.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub latency_ms: std::collections::BTreeMap<Operation, u64>,
    /// `Some(None)` removes the rate limit; `Some(Some(..))` sets it with a full bucket.
    #[serde(deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<Option<RateLimitConfig>>,
    /// `Some(None)` removes the route quota.
    #[serde(deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub max_routes: Option<Option<usize>>,
    /// Lists a new route stays hidden from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub list_lag: Option<u32>,
}

/// A field that is present (even as `null`) becomes `Some(..)`; an absent one
/// keeps the `default` of `None`.
fn present<'de, T, D>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    T: Deserialize<'de>,
    D: Deserializer<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// `POST /admin/routes/insert`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InsertRoute {
    /// The cluster.
    pub cluster: String,
    /// The route; an empty name becomes `<cluster>-external-<n>`.
    pub route: WireRoute,
}

/// `POST /admin/routes/remove` and `POST /admin/routes/blackhole`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteRef {
    /// The cluster.
    pub cluster: String,
    /// The destination as text.
    pub destination: String,
}

/// The answer of insert (the replaced route) and remove (the removed route).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteChange {
    /// The route replaced or removed, if there was one.
    pub route: Option<WireRoute>,
}

/// The answer of blackhole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Found {
    /// A route for the destination exists (and is now a blackhole).
    pub found: bool,
}

/// `POST /admin/reset`: an empty body keeps the configuration the server
/// started with.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Reset {
    /// A new configuration (also the one later resets fall back to).
    pub config: Option<MemoryConfig>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use route_core::Cidr;

    #[test]
    fn every_route_shape_round_trips() {
        let full = Route::new("n1", Cidr::parse("fd00:1::/64").unwrap())
            .named("c-u-fd00-1---64")
            .with_addresses(
                vec![
                    NodeAddress::internal_ip("10.0.0.7"),
                    NodeAddress {
                        kind: "Hostname".into(),
                        address: "n1".into(),
                    },
                ],
                true,
            )
            .blackholed();
        let mut full = full;
        full.next_hop = "i-123".into();
        full.node_provider_id = Some("memory://n1".into());
        let shapes = [
            full,
            Route::new("", Cidr::parse("10.244.1.0/24").unwrap()),
            Route::from_text("odd", "not a cidr"),
            Route::from_text("odd", ""),
            Route::from_text("x", "10.244.1.0/33"),
        ];
        for r in shapes {
            let json = serde_json::to_string(&WireRoute::from(&r)).unwrap();
            let back: WireRoute = serde_json::from_str(&json).unwrap();
            assert_eq!(Route::from(back), r, "{json}");
        }
    }

    #[test]
    fn a_minimal_route_needs_only_a_destination() {
        let w: WireRoute = serde_json::from_str(r#"{"destination": "10.0.0.0/8"}"#).unwrap();
        let r = Route::from(w);
        assert_eq!(
            r.destination.cidr(),
            Some(Cidr::parse("10.0.0.0/8").unwrap())
        );
        assert!(r.name.is_empty() && r.node.is_empty() && !r.blackhole);
        assert!(serde_json::from_str::<WireRoute>(r#"{"destination": "x", "extra": 1}"#).is_err());
    }

    #[test]
    fn errors_round_trip_with_a_rounded_up_wait() {
        let e = CloudError::throttled("slow down", Some(Duration::from_micros(1500)));
        let w = WireError::from(&e);
        assert_eq!(w.retry_after_ms, Some(2));
        let json = serde_json::to_value(&w).unwrap();
        assert_eq!(json["kind"], "throttled");
        let back = CloudError::from(serde_json::from_value::<WireError>(json).unwrap());
        assert_eq!(back.kind, ErrorKind::Throttled);
        assert_eq!(back.retry_after, Some(Duration::from_millis(2)));
        let plain = serde_json::to_value(WireError::from(&CloudError::new(
            ErrorKind::NotFound,
            "gone",
        )))
        .unwrap();
        assert!(plain.get("retry_after_ms").is_none());
    }

    #[test]
    fn statuses_differ_except_for_the_two_stale_cache_conflicts() {
        use ErrorKind::*;
        let kinds = [
            Throttled,
            Conflict,
            AlreadyExists,
            NotFound,
            QuotaExceeded,
            InvalidRequest,
            Transient,
            Timeout,
            Permanent,
            TargetUnavailable,
        ];
        let mut seen = std::collections::BTreeSet::new();
        for k in kinds {
            let s = status_for(k);
            assert!((400..600).contains(&s), "{k}: {s}");
            if k != AlreadyExists {
                assert!(seen.insert(s), "{k} shares status {s}");
            }
        }
        assert_eq!(status_for(AlreadyExists), status_for(Conflict));
        assert_eq!(kind_for_bare_status(429), Throttled);
        assert_eq!(kind_for_bare_status(504), Timeout);
        assert_eq!(kind_for_bare_status(502), Transient);
        assert_eq!(kind_for_bare_status(404), Permanent);
    }

    #[test]
    fn faults_tell_absent_from_null() {
        let f: Faults = serde_json::from_str(r#"{"rate_limit": null}"#).unwrap();
        assert_eq!(f.rate_limit, Some(None));
        assert_eq!(f.max_routes, None);
        let f: Faults = serde_json::from_str(
            r#"{"max_routes": 3, "error_rates": {"create": {"probability": 0.5, "kind": "conflict"}, "list": null},
                "latency_ms": {"delete": 20}, "fail_next": [{"op": "list", "count": 2, "kind": "transient"}]}"#,
        )
        .unwrap();
        assert_eq!(f.max_routes, Some(Some(3)));
        assert_eq!(f.error_rates[&Operation::List], None);
        assert_eq!(
            f.error_rates[&Operation::Create].unwrap().kind,
            ErrorKind::Conflict
        );
        assert_eq!(f.latency_ms[&Operation::Delete], 20);
        assert_eq!(f.fail_next[0].count, 2);
        // What a client sends is what the server reads.
        let back: Faults = serde_json::from_str(&serde_json::to_string(&f).unwrap()).unwrap();
        assert_eq!(back, f);
        let clear = Faults {
            rate_limit: Some(None),
            ..Faults::default()
        };
        let back: Faults = serde_json::from_str(&serde_json::to_string(&clear).unwrap()).unwrap();
        assert_eq!(back.rate_limit, Some(None));
        assert!(serde_json::from_str::<Faults>(r#"{"latency": {}}"#).is_err());
    }
}
