//! What the simulator measures, and the probe that sees the cloud calls.
//!
//! [`Probe`] sits between the controller and the [`MemoryCloud`]: it passes
//! every call through unchanged and tells the [`Observer`] what happened and
//! when (virtual time). The observer owns all measurements of one run: calls
//! by operation and result, the calls over time for the chart, and per Node
//! the time from its pod CIDR appearing to its route existing in the cloud and
//! every stretch during which a live Node had no route. The scenario driver
//! reports the cluster side (Node visible, Node gone, route removed behind the
//! controller's back); the probe reports the cloud side.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use provider_memory::MemoryCloud;
use route_cloud::{
    Batch, BatchResult, Capabilities, CloudError, CloudRoutes, ErrorKind, RequestStats,
};
use route_core::{Cidr, NodeView, Route, Text};
use tokio::time::Instant;

/// One Node's pod CIDR and its route.
#[derive(Debug, Clone)]
struct Track {
    cidr: Cidr,
    visible_at: Instant,
    alive: bool,
    /// The route tables that hold the Node's route now.
    up: BTreeSet<Text>,
    /// In every table.
    routed: bool,
    /// Counted in the latency figures (false for routes that existed at start).
    measured: bool,
    first_route: Option<Duration>,
    missing_since: Option<Instant>,
    missing: Duration,
}

#[derive(Debug, Default)]
struct State {
    calls: BTreeMap<(&'static str, &'static str), u64>,
    buckets: Vec<u64>,
    mutations: u64,
    tracks: HashMap<String, Track>,
}

/// Measurements of one run; see the module docs.
#[derive(Debug)]
pub struct Observer {
    start: Instant,
    end: Instant,
    bucket: Duration,
    /// The cloud's route tables (one unnamed table when empty): a Node is
    /// routed once its route is in all of them.
    tables: Vec<Text>,
    state: Mutex<State>,
}

/// Node-to-route latency and missing-route time, summarised.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct RouteStats {
    /// Nodes whose first route was created during the run.
    pub routed: u64,
    /// Median time from pod CIDR to route, seconds.
    pub p50_s: f64,
    /// 99th percentile (nearest rank), seconds.
    pub p99_s: f64,
    /// Longest, seconds.
    pub max_s: f64,
    /// Nodes that never got a route (deleted first, or still waiting at the end).
    pub never_routed: u64,
    /// Of those, Nodes still alive and without a route at the end.
    pub unrouted_at_end: u64,
    /// Sum over Nodes of the time they existed (with a pod CIDR) without a
    /// route, seconds.
    pub missing_node_seconds: f64,
}

/// Nearest-rank percentile of a sorted slice.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Observer {
    /// An observer of the run `[start, end]`, counting calls in buckets of `bucket`.
    pub fn new(start: Instant, end: Instant, bucket: Duration) -> Self {
        let bucket = bucket.max(Duration::from_millis(1));
        let n = ((end - start).as_secs_f64() / bucket.as_secs_f64()).ceil() as usize + 1;
        Self {
            start,
            end,
            bucket,
            tables: vec![Text::default()],
            state: Mutex::new(State {
                buckets: vec![0; n],
                ..State::default()
            }),
        }
    }

    /// The cloud has these route tables (several: every Node's route must be
    /// in each before it counts as routed).
    pub fn with_tables(mut self, tables: Vec<Text>) -> Self {
        if !tables.is_empty() {
            self.tables = tables;
        }
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now_in_run(&self) -> Option<Instant> {
        let now = Instant::now();
        (now <= self.end).then_some(now)
    }

    /// A call of `op` was answered with `result` now.
    fn call(&self, op: &'static str, result: Result<(), ErrorKind>) {
        let Some(now) = self.now_in_run() else { return };
        let mut s = self.lock();
        let label = result.err().map_or("ok", ErrorKind::as_str);
        *s.calls.entry((op, label)).or_default() += 1;
        let i = ((now - self.start).as_secs_f64() / self.bucket.as_secs_f64()) as usize;
        if let Some(b) = s.buckets.get_mut(i) {
            *b += 1;
        }
    }

    /// A Node's pod CIDR became visible to the controller now.
    pub fn node_visible(&self, name: &str, cidr: Cidr) {
        let Some(now) = self.now_in_run() else { return };
        self.lock().tracks.insert(
            name.to_string(),
            Track {
                cidr,
                visible_at: now,
                alive: true,
                up: BTreeSet::new(),
                routed: false,
                measured: true,
                first_route: None,
                missing_since: Some(now),
                missing: Duration::ZERO,
            },
        );
    }

    /// The Node's route already exists at the start (not a latency sample).
    pub fn preexisting(&self, name: &str) {
        if let Some(t) = self.lock().tracks.get_mut(name) {
            t.up = self.tables.iter().cloned().collect();
            t.routed = true;
            t.measured = false;
            t.missing_since = None;
        }
    }

    /// The Node object was deleted now.
    pub fn node_gone(&self, name: &str) {
        let Some(now) = self.now_in_run() else { return };
        if let Some(t) = self.lock().tracks.get_mut(name)
            && t.alive
        {
            t.alive = false;
            if let Some(s) = t.missing_since.take() {
                t.missing += now - s;
            }
        }
    }

    /// A route to `node` for `cidr` exists in route table `table` from now on.
    pub fn route_up(&self, node: &str, cidr: Option<Cidr>, table: &Text) {
        let (Some(now), Some(cidr)) = (self.now_in_run(), cidr) else {
            return;
        };
        let mut s = self.lock();
        s.mutations += 1;
        if let Some(t) = s.tracks.get_mut(node)
            && t.cidr == cidr
            && t.alive
        {
            t.up.insert(table.clone());
            if !t.routed && self.tables.iter().all(|x| t.up.contains(x)) {
                t.routed = true;
                if let Some(since) = t.missing_since.take() {
                    t.missing += now - since;
                }
                if t.first_route.is_none() && t.measured {
                    t.first_route = Some(now - t.visible_at);
                }
            }
        }
    }

    /// The route to `node` for `cidr` is gone from route table `table` (every
    /// table: `None`) from now on; `by_controller` counts it as one of the
    /// controller's mutations.
    pub fn route_down(
        &self,
        node: &str,
        cidr: Option<Cidr>,
        table: Option<&Text>,
        by_controller: bool,
    ) {
        let (Some(now), Some(cidr)) = (self.now_in_run(), cidr) else {
            return;
        };
        let mut s = self.lock();
        if by_controller {
            s.mutations += 1;
        }
        if let Some(t) = s.tracks.get_mut(node)
            && t.cidr == cidr
            && t.alive
        {
            match table {
                Some(table) => {
                    t.up.remove(table);
                }
                None => t.up.clear(),
            }
            if t.routed {
                t.routed = false;
                t.missing_since = Some(now);
            }
        }
    }

    /// Calls by (operation, result label), within the run.
    pub fn calls(&self) -> BTreeMap<(&'static str, &'static str), u64> {
        self.lock().calls.clone()
    }

    /// Successful creations and deletions (including those whose answer was lost).
    pub fn mutations(&self) -> u64 {
        self.lock().mutations
    }

    /// Cumulative calls at the end of each bucket.
    pub fn cumulative(&self) -> Vec<u64> {
        let mut total = 0;
        self.lock()
            .buckets
            .iter()
            .map(|b| {
                total += b;
                total
            })
            .collect()
    }

    /// The bucket width of [`Observer::cumulative`].
    pub fn bucket(&self) -> Duration {
        self.bucket
    }

    /// Latency and missing-route figures, closing open stretches at the end.
    pub fn route_stats(&self) -> RouteStats {
        let s = self.lock();
        let mut latencies: Vec<Duration> = Vec::new();
        let mut out = RouteStats::default();
        let mut missing = Duration::ZERO;
        for t in s.tracks.values() {
            match t.first_route {
                Some(d) => latencies.push(d),
                None if t.measured => {
                    out.never_routed += 1;
                    if t.alive {
                        out.unrouted_at_end += 1;
                    }
                }
                None => {}
            }
            missing += t.missing;
            if t.alive
                && let Some(since) = t.missing_since
            {
                missing += self.end.saturating_duration_since(since);
            }
        }
        latencies.sort_unstable();
        out.routed = latencies.len() as u64;
        out.p50_s = percentile(&latencies, 50.0).as_secs_f64();
        out.p99_s = percentile(&latencies, 99.0).as_secs_f64();
        out.max_s = latencies.last().copied().unwrap_or_default().as_secs_f64();
        out.missing_node_seconds = missing.as_secs_f64();
        out
    }
}

/// Passes calls through to the memory cloud and reports them to the observer.
#[derive(Clone)]
pub struct Probe {
    cloud: MemoryCloud,
    obs: Arc<Observer>,
}

impl Probe {
    /// A probe in front of `cloud`.
    pub fn new(cloud: MemoryCloud, obs: Arc<Observer>) -> Self {
        Self { cloud, obs }
    }

    /// Whether the table now holds a route to `node` for this destination. Only
    /// asked after a lost answer (injected timeout), whose effect is unknown.
    fn holds(&self, cluster: &str, route: &Route) -> bool {
        self.cloud
            .routes(cluster)
            .iter()
            .any(|r| r.destination == route.destination && r.node == route.node)
    }

    fn created(&self, cluster: &str, route: &Route, ok: bool, lost: bool) {
        if ok || (lost && self.holds(cluster, route)) {
            self.obs
                .route_up(&route.node, route.destination.cidr(), &route.table);
        }
    }

    fn deleted(&self, cluster: &str, route: &Route, ok: bool, lost: bool) {
        if ok || (lost && !self.holds(cluster, route)) {
            self.obs.route_down(
                &route.node,
                route.destination.cidr(),
                Some(&route.table),
                true,
            );
        }
    }
}

fn lost<T>(r: &Result<T, CloudError>) -> bool {
    matches!(r, Err(e) if e.kind == ErrorKind::Timeout)
}

fn kind<T>(r: &Result<T, CloudError>) -> Result<(), ErrorKind> {
    r.as_ref().map(|_| ()).map_err(|e| e.kind)
}

#[async_trait]
impl CloudRoutes for Probe {
    fn name(&self) -> &'static str {
        self.cloud.name()
    }

    fn targets(&self) -> Vec<Text> {
        self.cloud.targets()
    }

    fn capabilities(&self) -> Capabilities {
        self.cloud.capabilities()
    }

    fn stats(&self) -> &RequestStats {
        self.cloud.stats()
    }

    async fn list_routes(&self, cluster: &str) -> Result<Vec<Route>, CloudError> {
        let r = self.cloud.list_routes(cluster).await;
        self.obs.call("list", kind(&r));
        r
    }

    async fn create_route(
        &self,
        cluster: &str,
        name_hint: &str,
        route: &Route,
    ) -> Result<Route, CloudError> {
        let r = self.cloud.create_route(cluster, name_hint, route).await;
        self.obs.call("create", kind(&r));
        self.created(cluster, route, r.is_ok(), lost(&r));
        r
    }

    async fn delete_route(&self, cluster: &str, route: &Route) -> Result<(), CloudError> {
        let r = self.cloud.delete_route(cluster, route).await;
        self.obs.call("delete", kind(&r));
        self.deleted(cluster, route, r.is_ok(), lost(&r));
        r
    }

    async fn apply_batch(&self, cluster: &str, batch: &Batch) -> Result<BatchResult, CloudError> {
        let r = self.cloud.apply_batch(cluster, batch).await;
        self.obs.call("batch", kind(&r));
        let whole_lost = lost(&r);
        let results = r.as_ref().ok();
        let item = |key| results.and_then(|v| v.get(key));
        for (key, d) in &batch.delete {
            let ok = item(key).is_some_and(|x| x.is_ok());
            self.deleted(cluster, d, ok, whole_lost);
        }
        for (key, _, c) in &batch.create {
            let ok = item(key).is_some_and(|x| x.is_ok());
            self.created(cluster, c, ok, whole_lost);
        }
        r
    }

    fn observe_nodes(&self, nodes: &[Arc<NodeView>]) {
        self.cloud.observe_nodes(nodes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_secs).collect();
        assert_eq!(percentile(&v, 50.0), Duration::from_secs(50));
        assert_eq!(percentile(&v, 99.0), Duration::from_secs(99));
        assert_eq!(percentile(&v, 100.0), Duration::from_secs(100));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
        let one = [Duration::from_secs(3)];
        assert_eq!(percentile(&one, 99.0), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn missing_time_covers_waits_gaps_and_ends() {
        let start = Instant::now();
        let obs = Observer::new(
            start,
            start + Duration::from_secs(100),
            Duration::from_secs(10),
        );
        let c = Cidr::parse("10.0.0.0/24").ok();
        let d = Cidr::parse("10.0.1.0/24").ok();
        obs.node_visible("a", c.unwrap());
        obs.node_visible("b", d.unwrap());
        tokio::time::advance(Duration::from_secs(5)).await;
        obs.route_up("a", c, &Text::default());
        // A route for another CIDR does not count for b.
        obs.route_up("b", c, &Text::default());
        tokio::time::advance(Duration::from_secs(10)).await;
        obs.route_down("a", c, None, false);
        tokio::time::advance(Duration::from_secs(20)).await;
        obs.route_up("a", c, &Text::default());
        obs.node_gone("b");
        let s = obs.route_stats();
        assert_eq!(s.routed, 1);
        assert_eq!(s.p50_s, 5.0);
        assert_eq!(s.never_routed, 1);
        assert_eq!(s.unrouted_at_end, 0);
        // a: 5 s waiting + 20 s removed; b: 35 s until deleted.
        assert_eq!(s.missing_node_seconds, 60.0);
    }
}
