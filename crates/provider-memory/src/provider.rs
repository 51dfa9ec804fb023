//! The simulated cloud as a [`CloudRoutes`] provider.
//!
//! Owns [`MemoryCloud`], the handle the controller, tests and the simulator
//! hold (clones share one table, one budget, one call log and one set of
//! counters; each carries its own caller tag), every control it offers (the
//! runtime knobs, the injected faults, the changes behind the controller's
//! back and the call log; none of them is counted or logged, they are not
//! API calls) and `call`, the one path every API call takes: latency, then
//! the storm, the server-side budget, the concurrency limit and injected
//! faults, then the server's answer, counted in [`RequestStats`] and logged.
//!
//! The top layer: the controls are thin, the work behind them is done by
//! `state`, `faults` and `log`, which never refer back to this module.
//!
//! Every wait goes through `tokio::time`, so a paused test clock makes latency
//! and rate-limit refills virtual and the tests deterministic.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use route_cloud::{
    Batch, BatchResult, Capabilities, CloudError, CloudRoutes, ErrorKind, RequestStats,
};
use route_core::{Destination, Route};
use tokio::time::Instant;

use crate::config::{ErrorRate, MemoryConfig, MemoryConfigError, Operation, RateLimitConfig};
use crate::log::CallRecord;
use crate::state::{State, table_key};

/// What every handle of one simulated cloud shares.
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
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State::new(config)),
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

    /// The state behind the one lock. A panic while it was held leaves a
    /// table a test still wants to read, so poisoning is ignored.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the current configuration.
    pub fn config(&self) -> MemoryConfig {
        self.lock().config.clone()
    }

    // ---- knobs of the simulated server (never counted, never logged) ----

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

    /// Sets the route targets (tables) of this cloud, as an operator adding
    /// or untagging a route table while the controller runs: a table that
    /// goes keeps its routes but is no longer listed or written; one that
    /// comes back shows them again. The controller learns of the change by
    /// [`CloudRoutes::discover_targets`] or its next list.
    pub fn set_targets(&self, targets: Vec<String>) {
        self.lock().config.targets = targets;
    }

    /// Sets how many lists a newly created route stays invisible to.
    pub fn set_list_lag(&self, lists: u32) {
        self.lock().config.list_lag = lists;
    }

    // ---- injected faults (never counted, never logged) ----

    /// Fails the next `n` calls of `op` with `kind` (after which calls behave
    /// normally again). A `Timeout` on a create, delete or batch still takes
    /// effect, like a real answer lost on the way back. Replaces any earlier
    /// pending failures of `op`; `n = 0` clears them.
    pub fn fail_next(&self, op: Operation, n: u32, kind: ErrorKind) {
        self.lock().faults.fail_next(op, n, kind);
    }

    /// Starts (`Some`, with the retry-after to answer) or ends (`None`) a
    /// throttling storm: while it lasts every call is answered `Throttled`,
    /// whatever the budget — a cloud whose API is overloaded by others.
    pub fn set_storm(&self, storm: Option<Option<Duration>>) {
        self.lock().faults.set_storm(storm);
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

    /// The tables of `cluster` as stored, every route target's (including
    /// routes a lagging list hides).
    pub fn routes(&self, cluster: &str) -> Vec<Route> {
        let s = self.lock();
        s.table_keys(cluster)
            .iter()
            .filter_map(|k| s.tables.get(k))
            .flat_map(|t| t.values().map(|s| s.route.clone()))
            .collect()
    }

    /// The routes of one route target of `cluster`, as stored.
    pub fn routes_in(&self, cluster: &str, target: &str) -> Vec<Route> {
        let s = self.lock();
        s.tables
            .get(&table_key(cluster, target))
            .map(|t| t.values().map(|s| s.route.clone()).collect())
            .unwrap_or_default()
    }

    // ---- changes behind the controller's back (never counted, never logged) ----

    /// Puts `route` in the table behind the controller's back, replacing any
    /// route for the same destination; returns the replaced one. An empty name
    /// becomes `<cluster>-external-<n>`.
    /// The route goes into the table its `table` names.
    pub fn insert_route(&self, cluster: &str, route: Route) -> Option<Route> {
        self.lock().insert(cluster, route)
    }

    /// Removes the route for `destination` behind the controller's back,
    /// from every route table of the cluster; returns one removed.
    pub fn remove_route(&self, cluster: &str, destination: &Destination) -> Option<Route> {
        self.lock().remove(cluster, destination)
    }

    /// Marks the route for `destination` as a blackhole (its target died) in
    /// every route table of the cluster; returns whether such a route exists.
    pub fn blackhole_route(&self, cluster: &str, destination: &Destination) -> bool {
        self.lock().blackhole(cluster, destination)
    }

    // ---- what the simulated server saw ----

    /// A copy of the call log.
    pub fn log(&self) -> Vec<CallRecord> {
        self.lock().log.records().to_vec()
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
        let refused = if let Some(retry_after) = s.faults.storm() {
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
                    batch_seq =
                        Some(
                            s.log
                                .push(now, &self.caller, cluster, op, None, None, Ok(())),
                        );
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
            Some(seq) => s.log.set_result(seq, result),
            None => {
                s.log
                    .push(now, &self.caller, cluster, op, route, None, result);
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
            checks_forwarding: false,
            max_routes_per_family: false,
        }
    }

    fn targets(&self) -> Vec<route_core::Text> {
        let s = self.lock();
        s.listed_targets
            .as_ref()
            .unwrap_or(&s.config.targets)
            .iter()
            .map(|t| t.as_str().into())
            .collect()
    }

    async fn discover_targets(
        &self,
        _cluster: &str,
    ) -> Result<Option<Vec<route_core::Text>>, CloudError> {
        let s = self.lock();
        if s.config.targets.is_empty() {
            // One table, nothing to discover.
            return Ok(None);
        }
        self.shared.stats.record("discover", "ok");
        Ok(Some(
            s.config.targets.iter().map(|t| t.as_str().into()).collect(),
        ))
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
            let mut out = BatchResult::new();
            for (key, r) in &batch.delete {
                let res = s.delete(cluster, r).map(|()| None);
                let kind = res.as_ref().map(|_| ()).map_err(|e| e.kind);
                s.log
                    .push(now, caller, cluster, Operation::Delete, Some(r), seq, kind);
                out.insert(key.clone(), res);
            }
            for (key, hint, r) in &batch.create {
                let res = s.create(cluster, hint, r).map(Some);
                let kind = res.as_ref().map(|_| ()).map_err(|e| e.kind);
                s.log
                    .push(now, caller, cluster, Operation::Create, Some(r), seq, kind);
                out.insert(key.clone(), res);
            }
            Ok(out)
        })
        .await
    }
}
