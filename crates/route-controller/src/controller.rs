//! The reconcile loop: trigger → snapshot → plan → execute → status.
//!
//! One task owns all reconcile state: the [`Scheduler`], the [`RetryBook`],
//! the cached route table (incremental mode) and the set of warnings already
//! emitted. Node events reach it only through the [`NodeStore`]'s notification,
//! so passes never overlap and a trigger during a pass becomes exactly one
//! follow-up pass. Planning is the pure [`route_core::plan`]; the loop only
//! decides when, with which route table, and what to do with the outcome.

use futures::StreamExt;
use rand::Rng;
use route_cloud::{CloudError, CloudRoutes, ErrorKind};
use route_core::{NetworkCondition, NodeView, Plan, PlanConfig, Route};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::execute::{Executor, Fence, OpResult, Outcome};
use crate::hold::Holds;
use crate::metrics::{EventLabels, Metrics, PassLabels, ReasonLabels, SyncLabels};
use crate::nodes::{NodeCache, NodeEvent, Trigger};
use crate::retry::{BackoffConfig, OpKey, RetryBook};
use crate::schedule::{Decision, Mode, PassKind, Scheduler, SyncTrigger, Timing};
use crate::status::{NodeRef, StatusWriter, reasons};

/// Everything the loop needs to know, from flags.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// `--cluster-name`.
    pub cluster_name: String,
    /// Cluster CIDRs.
    pub plan: PlanConfig,
    /// `--reconcile-mode`.
    pub mode: Mode,
    /// Periods.
    pub timing: Timing,
    /// Retry backoff of failed operations.
    pub backoff: BackoffConfig,
    /// Concurrent NetworkUnavailable patches.
    pub status_concurrency: usize,
    /// `--route-deletion-grace`: how long the route of a Node that
    /// disappeared is kept, so a same-name re-creation keeps its route.
    pub deletion_grace: Duration,
}

/// The default of `--route-deletion-grace`.
pub const DEFAULT_DELETION_GRACE: Duration = Duration::from_secs(2);

/// The Node side: the cache plus the notification the loop waits on.
/// Written by one feeder (the watcher or a simulator), read by the loop.
pub struct NodeStore {
    cache: Mutex<NodeCache>,
    changed: Notify,
    synced: watch::Sender<bool>,
    metrics: Option<Arc<Metrics>>,
}

impl NodeStore {
    /// An empty store.
    pub fn new(metrics: Option<Arc<Metrics>>) -> Arc<Self> {
        Arc::new(Self {
            cache: Mutex::new(NodeCache::new()),
            changed: Notify::new(),
            synced: watch::channel(false).0,
            metrics,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, NodeCache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies a watch event; wakes the loop if it may change routes.
    pub fn apply(&self, event: NodeEvent) {
        let trigger = self.lock().apply(event);
        if let Some(m) = &self.metrics {
            let synced = *self.synced.borrow();
            if trigger.is_some() || synced {
                let result = if trigger.is_some() {
                    "trigger"
                } else {
                    "absorbed"
                };
                m.node_events.get_or_create(&EventLabels { result }).inc();
            }
        }
        match trigger {
            Some(Trigger::Synced) => {
                self.synced.send_replace(true);
                self.changed.notify_one();
            }
            Some(Trigger::NodeChanged) => self.changed.notify_one(),
            None => {}
        }
    }

    /// The first full list has been applied.
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Resolves once the first full list has been applied.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// All Nodes now.
    pub fn snapshot(&self) -> Vec<Arc<NodeView>> {
        self.lock().snapshot()
    }

    /// Number of Nodes.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// No Nodes.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Trigger/absorb counters.
    pub fn stats(&self) -> crate::nodes::CacheStats {
        self.lock().stats()
    }
}

/// What one pass did; returned for tests, the simulator and logs.
#[derive(Debug, Clone)]
pub struct PassReport {
    /// Full or cached.
    pub kind: PassKind,
    /// Metric trigger label.
    pub trigger: SyncTrigger,
    /// The plan (empty when listing failed).
    pub plan: Plan,
    /// Results of its operations.
    pub outcome: Outcome,
    /// Listing failed with this error.
    pub list_error: Option<CloudError>,
    /// Conditions written.
    pub conditions: Vec<(String, NetworkCondition)>,
}

/// The route controller. Build with [`Controller::new`], run with [`Controller::run`].
pub struct Controller {
    cfg: ControllerConfig,
    nodes: Arc<NodeStore>,
    status: Arc<dyn StatusWriter>,
    executor: Executor,
    metrics: Option<Arc<Metrics>>,
    scheduler: Scheduler,
    book: RetryBook,
    holds: Holds,
    route_cache: Option<Vec<Route>>,
    warned: HashSet<(String, &'static str, String)>,
    reports: Option<tokio::sync::mpsc::UnboundedSender<PassReport>>,
    first_sync: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl Controller {
    /// A controller over `nodes` that changes `cloud` and writes through `status`.
    pub fn new(
        cfg: ControllerConfig,
        nodes: Arc<NodeStore>,
        cloud: Arc<dyn CloudRoutes>,
        status: Arc<dyn StatusWriter>,
        fence: Fence,
        metrics: Option<Arc<Metrics>>,
    ) -> Self {
        let mut cfg = cfg;
        // The planner waits for what this provider needs on a Node rather
        // than send creations the cloud would refuse.
        let caps = cloud.capabilities();
        cfg.plan.needs = caps.needs;
        cfg.plan.replace_blackholes = caps.replaces_blackholes;
        let scheduler = Scheduler::new(cfg.mode, cfg.timing, Instant::now());
        let book = RetryBook::new(cfg.backoff);
        let holds = Holds::new(cfg.deletion_grace, cfg.backoff.max);
        let executor = Executor::new(cloud, cfg.cluster_name.clone(), fence);
        Self {
            cfg,
            nodes,
            status,
            executor,
            metrics,
            scheduler,
            book,
            holds,
            route_cache: None,
            warned: HashSet::new(),
            reports: None,
            first_sync: None,
        }
    }

    /// Sets `flag` once the first full pass after gaining leadership listed
    /// the cloud and ran its plan (for `/readyz`).
    pub fn with_first_sync(mut self, flag: Arc<std::sync::atomic::AtomicBool>) -> Self {
        self.first_sync = Some(flag);
        self
    }

    /// Sends a copy of every pass report to `tx` (tests, simulator).
    pub fn with_reports(mut self, tx: tokio::sync::mpsc::UnboundedSender<PassReport>) -> Self {
        self.reports = Some(tx);
        self
    }

    /// Runs until `shutdown` is cancelled. Passes run only while `leader` is
    /// true; on becoming leader the controller starts over with a full pass.
    pub async fn run(mut self, mut leader: watch::Receiver<bool>, shutdown: CancellationToken) {
        tokio::select! {
            _ = self.nodes.wait_synced() => {}
            _ = shutdown.cancelled() => return,
        }
        info!(
            mode = self.cfg.mode.as_str(),
            nodes = self.nodes.len(),
            "node cache synced; starting route reconciliation"
        );
        let mut was_leader = false;
        // A dropped sender means leadership is final (e.g. no election).
        let mut leader_open = true;
        loop {
            let is_leader = *leader.borrow_and_update();
            self.executor.fence().set_leader(is_leader);
            if let Some(m) = &self.metrics {
                m.leader.set(i64::from(is_leader));
            }
            if !is_leader {
                was_leader = false;
                tokio::select! {
                    r = leader.changed(), if leader_open => if r.is_err() { leader_open = false },
                    _ = shutdown.cancelled() => return,
                }
                if !leader_open {
                    // Never leader and never will be: wait for shutdown.
                    shutdown.cancelled().await;
                    return;
                }
                continue;
            }
            if !was_leader {
                was_leader = true;
                if let Some(f) = &self.first_sync {
                    f.store(false, std::sync::atomic::Ordering::SeqCst);
                }
                self.scheduler.became_leader();
                self.route_cache = None;
            }
            match self.scheduler.decide(Instant::now()) {
                Decision::Run(kind, trigger) => {
                    self.scheduler.started(kind, Instant::now());
                    let report = self.pass(kind, trigger).await;
                    if let Some(tx) = &self.reports {
                        let _ = tx.send(report);
                    }
                    if shutdown.is_cancelled() {
                        return;
                    }
                }
                Decision::Sleep(until) => {
                    let sleep = async {
                        match until {
                            Some(t) => tokio::time::sleep_until(t).await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        _ = self.nodes.changed.notified() => self.scheduler.node_changed(),
                        _ = sleep => {}
                        r = leader.changed(), if leader_open => if r.is_err() { leader_open = false },
                        _ = shutdown.cancelled() => return,
                    }
                }
            }
        }
    }

    /// Runs one pass now (also used by tests and tools).
    pub async fn pass(&mut self, kind: PassKind, trigger: SyncTrigger) -> PassReport {
        let started = Instant::now();
        // Triggers that arrived before this snapshot are covered by it.
        let _ = futures::FutureExt::now_or_never(self.nodes.changed.notified());
        let nodes = self.nodes.snapshot();
        self.executor.cloud().observe_nodes(&nodes);
        let mut report = PassReport {
            kind,
            trigger,
            plan: Plan::default(),
            outcome: Outcome::default(),
            list_error: None,
            conditions: Vec::new(),
        };
        // The cached table is moved out for planning and back before the
        // outcome is folded in, so a cached pass copies nothing.
        let cached = match (kind, self.cfg.mode) {
            (PassKind::Cached, Mode::Incremental) if !self.holds.wants_listing(started) => {
                self.route_cache.take()
            }
            _ => None,
        };
        let listed = cached.is_none();
        let routes = match cached {
            Some(mut cached) => {
                let cloud = self.executor.cloud();
                if cloud.capabilities().reports_node_addresses {
                    for r in cached.iter_mut() {
                        if let Some(fresh) = cloud.refresh_route(r) {
                            *r = fresh;
                        }
                    }
                }
                cached
            }
            None => match self.executor.list().await {
                Ok(listed) => {
                    self.scheduler.full_pass_listed();
                    if self.cfg.mode == Mode::Incremental
                        && let Some(old) = &self.route_cache
                    {
                        let drift = drift(old, &listed);
                        if drift > 0 {
                            info!(
                                drift,
                                "full sync found routes that differ from the cached table"
                            );
                        }
                    }
                    listed
                }
                Err(e) => {
                    error!(error = %e, "could not list routes; will retry");
                    self.scheduler.full_pass_failed();
                    self.record_sync(trigger, "error", kind, started);
                    report.list_error = Some(e);
                    return report;
                }
            },
        };
        let plan = route_core::plan(&nodes, &routes, &self.cfg.plan);
        self.warn_about(&plan).await;
        let wanted: HashSet<OpKey> = plan
            .deletions
            .iter()
            .map(OpKey::delete)
            .chain(plan.creations.iter().map(OpKey::create))
            .collect();
        self.book.retain(&wanted);
        if let Some(m) = &self.metrics {
            m.pending_operations.set(wanted.len() as i64);
        }
        if !plan.is_noop() {
            debug!(
                deletions = plan.deletions.len(),
                creations = plan.creations.len(),
                "executing plan"
            );
        }
        let room = self
            .executor
            .cloud()
            .capabilities()
            .max_routes
            .map(|max| max.saturating_sub(routes.len()));
        let now = Instant::now();
        let book = &self.book;
        let held = self.holds.hold(&plan, now, listed, room, |c| {
            book.is_due(&OpKey::create(c), now)
        });
        for (node, uid, cidr, next) in &held.new_recurrences {
            let node = NodeRef {
                name: node.clone(),
                uid: uid.clone(),
            };
            let message = format!(
                "route {cidr} for node {} was replaced and is a blackhole again (its instance may be stopped or gone); next repair in {:?}",
                node.name,
                next.saturating_duration_since(Instant::now())
            );
            self.emit(&node, reasons::ROUTE_BLACKHOLED, message).await;
        }
        let outcome = self
            .executor
            .execute(&plan, &self.book, &held, routes.len())
            .await;
        if self.cfg.mode == Mode::Incremental {
            self.route_cache = Some(routes);
        }
        self.absorb(&plan, &outcome).await;
        report.conditions = self.write_conditions(&plan, &outcome).await;

        let outcome_label = if outcome.any_failed() {
            "error"
        } else if outcome.changed() > 0 {
            "changed"
        } else {
            "noop"
        };
        if let Some(m) = &self.metrics {
            if trigger == SyncTrigger::Periodic && kind == PassKind::Full {
                m.route_corrections.inc_by(outcome.changed() as u64);
            }
            m.retrying_operations.set(self.book.len() as i64);
            m.recurring_blackholes
                .set(self.holds.recurring_blackholes() as i64);
            let remaining = outcome
                .deletions
                .iter()
                .chain(&outcome.creations)
                .filter(|r| !r.is_done())
                .count();
            m.pending_operations.set(remaining as i64);
            let waited = *self
                .executor
                .throttle_wait
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let already = m.throttle_wait_micros.get();
            let now = waited.as_micros() as u64;
            if now > already {
                m.throttle_wait_micros.inc_by(now - already);
            }
        }
        self.record_sync(trigger, outcome_label, kind, started);
        let wake = match (self.book.next_wake(started), held.until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.scheduler.retry_at(wake);
        if kind == PassKind::Full
            && let Some(f) = &self.first_sync
        {
            f.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        report.plan = plan;
        report.outcome = outcome;
        report
    }

    fn record_sync(
        &self,
        trigger: SyncTrigger,
        outcome: &'static str,
        kind: PassKind,
        started: Instant,
    ) {
        if let Some(m) = &self.metrics {
            m.route_sync
                .get_or_create(&SyncLabels {
                    trigger: trigger.as_str(),
                    outcome,
                })
                .inc();
            m.reconcile_duration
                .get_or_create(&PassLabels {
                    kind: kind.as_str(),
                })
                .observe(started.elapsed().as_secs_f64());
        }
    }

    /// Folds an outcome into the retry book, the route cache and the scheduler.
    async fn absorb(&mut self, plan: &Plan, outcome: &Outcome) {
        let now = Instant::now();
        let mut uncertain = false;
        for (i, (d, r)) in plan.deletions.iter().zip(&outcome.deletions).enumerate() {
            let key = OpKey::delete(d);
            match r {
                OpResult::Done(_) => {
                    self.book.succeeded(&key);
                    self.book.release_quota_waiters(now);
                    self.cache_remove(&d.route);
                    self.holds.deletion_landed(plan, i, now);
                }
                OpResult::Failed(e) => {
                    uncertain |= e.makes_cache_uncertain();
                    if e.makes_cache_uncertain() {
                        // It may well have happened.
                        self.holds.deletion_landed(plan, i, now);
                    }
                    if e.kind == ErrorKind::NotFound {
                        // Gone already: the goal is reached; the resync that
                        // follows checks the rest of the table.
                        self.book.succeeded(&key);
                        self.cache_remove(&d.route);
                        continue;
                    }
                    let unit = rand::rng().random::<f64>();
                    let at = self.book.failed(key.clone(), e, now, unit);
                    let failures = self.book.failures(&key);
                    if let Some(node) = node_ref_for_route(&self.nodes, &d.route) {
                        self.emit(
                            &node,
                            reasons::FAILED_TO_DELETE_ROUTE,
                            format!(
                                "Could not delete route {} {} for node {} ({}): {e}",
                                d.route.name,
                                d.route.destination,
                                d.route.target_node,
                                next_attempt(e, failures, at - now)
                            ),
                        )
                        .await;
                    }
                }
                _ => {}
            }
        }
        for (c, r) in plan.creations.iter().zip(&outcome.creations) {
            let key = OpKey::create(c);
            match r {
                OpResult::Done(created) => {
                    self.book.succeeded(&key);
                    if let Some(replaced) = &c.replaces {
                        self.holds.repaired(c, now);
                        self.cache_remove(replaced);
                    }
                    if let Some(cache) = &mut self.route_cache {
                        cache.push(created.clone().unwrap_or_else(|| c.route.clone()));
                    }
                }
                OpResult::Failed(e) => {
                    uncertain |= e.makes_cache_uncertain();
                    // A replacement whose answer was lost may well have
                    // landed; if the next listing shows a blackhole again,
                    // that is a recurrence like any other.
                    if e.makes_cache_uncertain() && c.replaces.is_some() {
                        self.holds.repaired(c, now);
                    }
                    let unit = rand::rng().random::<f64>();
                    let at = self.book.failed(key.clone(), e, now, unit);
                    let node = NodeRef {
                        name: c.route.target_node.to_string(),
                        uid: c.name_hint.clone(),
                    };
                    // Upstream's wording, plus when the next attempt is.
                    self.emit(
                        &node,
                        reasons::FAILED_TO_CREATE_ROUTE,
                        format!(
                            "Could not create route {} {} for node {}: {e} ({})",
                            c.name_hint,
                            c.route.destination,
                            c.route.target_node,
                            next_attempt(e, self.book.failures(&key), at - now)
                        ),
                    )
                    .await;
                }
                _ => {}
            }
        }
        if uncertain {
            info!("a cloud answer made the cached route table uncertain; a full sync follows");
            self.scheduler.cache_uncertain();
            // Planning from a table known to be stale would repeat the
            // failing call; the next pass lists instead.
            self.route_cache = None;
        }
    }

    fn cache_remove(&mut self, route: &Route) {
        if let Some(cache) = &mut self.route_cache
            && let Some(i) = cache.iter().position(|r| r == route)
        {
            cache.swap_remove(i);
        }
    }

    async fn write_conditions(
        &mut self,
        plan: &Plan,
        outcome: &Outcome,
    ) -> Vec<(String, NetworkCondition)> {
        if !self.executor.fence().is_open() {
            return Vec::new();
        }
        let failed = |i: usize| !outcome.creations[i].is_done();
        let wanted: Vec<(NodeRef, NetworkCondition)> = plan
            .nodes
            .iter()
            .filter_map(|n| {
                let cond = n.condition_after(failed)?;
                // The node may have been deleted or re-created since the snapshot.
                self.nodes_get(&n.node).filter(|v| v.uid == n.uid)?;
                let node = NodeRef {
                    name: n.node.clone(),
                    uid: n.uid.clone(),
                };
                Some((node, cond))
            })
            .collect();
        // Latency: every node whose routes are all in place now is confirmed.
        // Only Nodes still awaiting a route are looked at, so a pass on a
        // settled cluster does no per-node work here.
        {
            let mut cache = self.nodes.lock();
            if cache.awaiting_routes() {
                for n in plan.nodes.iter().filter(|n| n.routed_after(failed)) {
                    if !cache.awaits_route(&n.uid) {
                        continue;
                    }
                    let Some(v) = cache.get(&n.node) else {
                        continue;
                    };
                    for c in v.valid_pod_cidrs() {
                        if let Some(d) = cache.confirm_route(&v.uid, c)
                            && let Some(m) = &self.metrics
                        {
                            m.route_latency.observe(d.as_secs_f64());
                        }
                    }
                }
                let planned: HashSet<&str> = plan.nodes.iter().map(|n| n.node.as_str()).collect();
                cache.forget_settled(|name| planned.contains(name));
            }
        }
        let status = self.status.clone();
        let fence = self.executor.fence().clone();
        let results: Vec<(NodeRef, NetworkCondition, bool)> =
            futures::stream::iter(wanted.into_iter().map(|(node, cond)| {
                let status = status.clone();
                let fence = fence.clone();
                async move {
                    // Checked per patch: a status write is a mutation too, and
                    // one queued behind slow ones may come after the deadline.
                    let ok = match fence.guard(status.set_condition(&node, cond)).await {
                        Ok(Ok(())) => true,
                        Ok(Err(e)) => {
                            warn!(node = %node.name, error = %e, "failed to update networking condition");
                            false
                        }
                        Err(_) => false,
                    };
                    (node, cond, ok)
                }
            }))
            .buffer_unordered(self.cfg.status_concurrency.max(1))
            .collect()
            .await;
        let mut written = Vec::new();
        let mut cache = self.nodes.lock();
        for (node, cond, ok) in results {
            if ok {
                cache.record_condition(&node.name, &node.uid, cond);
                written.push((node.name, cond));
            }
        }
        written
    }

    fn nodes_get(&self, name: &str) -> Option<Arc<NodeView>> {
        self.nodes.lock().get(name)
    }

    /// Warns once per node, reason and detail about what the planner refused.
    async fn warn_about(&mut self, plan: &Plan) {
        let mut current: HashSet<(String, &'static str, String)> = HashSet::new();
        let mut todo: Vec<(NodeRef, &'static str, String)> = Vec::new();
        let uid_of = |name: &str| self.nodes_get(name).map(|v| v.uid.clone());
        for c in &plan.conflicts {
            for n in &c.nodes {
                let Some(uid) = uid_of(n) else { continue };
                let others: Vec<&str> = c
                    .nodes
                    .iter()
                    .filter(|o| *o != n)
                    .map(String::as_str)
                    .collect();
                let detail = format!(
                    "pod CIDR {} is also claimed by node(s) {}; no route is created for it until the conflict is resolved",
                    c.cidr,
                    others.join(", ")
                );
                todo.push((
                    NodeRef {
                        name: n.clone(),
                        uid,
                    },
                    reasons::POD_CIDR_CONFLICT,
                    detail,
                ));
            }
        }
        for o in &plan.outside_cluster {
            let Some(uid) = uid_of(&o.node) else { continue };
            let detail = format!(
                "pod CIDR {} is outside every cluster CIDR ({}); no route is created for it",
                o.cidr,
                self.cfg
                    .plan
                    .cluster_cidrs
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            todo.push((
                NodeRef {
                    name: o.node.clone(),
                    uid,
                },
                reasons::POD_CIDR_OUTSIDE_CLUSTER,
                detail,
            ));
        }
        for i in &plan.invalid_pod_cidrs {
            let Some(uid) = uid_of(&i.node) else { continue };
            let detail = format!(
                "pod CIDR {:?} is not a valid CIDR; no route is created for it",
                i.text
            );
            todo.push((
                NodeRef {
                    name: i.node.clone(),
                    uid,
                },
                reasons::INVALID_POD_CIDR,
                detail,
            ));
        }
        for r in &plan.unparsable_routes {
            let key = (
                r.name.to_string(),
                "UnparsableRoute",
                r.destination.to_string(),
            );
            if !self.warned.contains(&key) {
                warn!(route = %r.name, destination = %r.destination, "ignoring cloud route with an unparsable destination; it is never deleted");
            }
            current.insert(key);
        }
        for (node, reason, detail) in todo {
            let key = (node.uid.clone(), reason, detail.clone());
            if !self.warned.contains(&key) {
                self.emit(&node, reason, detail).await;
            }
            current.insert(key);
        }
        // Forget warnings whose cause is gone, so a recurrence warns again.
        self.warned = current;
    }

    async fn emit(&self, node: &NodeRef, reason: &'static str, message: String) {
        if !self.executor.fence().is_open() {
            return;
        }
        warn!(node = %node.name, reason, "{message}");
        if let Some(m) = &self.metrics {
            m.warnings.get_or_create(&ReasonLabels { reason }).inc();
        }
        if let Ok(Err(e)) = self
            .executor
            .fence()
            .guard(self.status.warn(node, reason, &message))
            .await
        {
            warn!(node = %node.name, error = %e, "could not record event");
        }
    }
}

/// When a failed operation is tried again, for its Event.
fn next_attempt(e: &CloudError, failures: u32, wait: std::time::Duration) -> String {
    if e.kind == ErrorKind::Throttled {
        "throttled; retrying as soon as the cloud accepts calls again".into()
    } else {
        format!("attempt {failures}, retrying in {wait:?}")
    }
}

fn node_ref_for_route(nodes: &NodeStore, route: &Route) -> Option<NodeRef> {
    let v = nodes.lock().get(&route.target_node)?;
    Some(NodeRef {
        name: v.name.clone(),
        uid: v.uid.clone(),
    })
}

/// Routes present in one table and not the other (by node, destination, blackhole).
fn drift(cached: &[Route], listed: &[Route]) -> usize {
    fn key(r: &Route) -> (&str, &route_core::Destination, bool) {
        (r.target_node.as_str(), &r.destination, r.blackhole)
    }
    let mut counts: HashMap<_, i64> = HashMap::with_capacity(cached.len());
    for r in cached {
        *counts.entry(key(r)).or_default() += 1;
    }
    for r in listed {
        *counts.entry(key(r)).or_default() -= 1;
    }
    counts.values().map(|v| v.unsigned_abs() as usize).sum()
}
