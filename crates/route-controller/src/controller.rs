//! The reconcile loop and its pass driver.
//!
//! One task owns all reconcile state: the [`Scheduler`], the [`RetryBook`],
//! the [`Holds`], the [`RouteCache`] and the [`PlanWarnings`] already
//! emitted. Node events reach it only through the [`NodeStore`]'s
//! notification, so passes never overlap and a trigger during a pass becomes
//! exactly one follow-up pass.
//!
//! [`Controller::pass`] is the driver: it calls one step per module, in the
//! order data flows. What it decides itself is only how the steps join: a
//! pass whose listing failed or is too old to trust ends before planning, and
//! an answer that made the cached table uncertain asks for a full pass:
//!
//! ```text
//! snapshot ─► prerequisites ─► plan ─► gate ─► warn ─► execute ─► absorb ─► status ─► finish
//! (cloud I/O  (cloud I/O when   (pure)  (pure)  (Events) (cloud I/O) (pure)  (nodes/status)
//!  on a full   a check is due)
//!  pass)
//! ```
//!
//! A full pass compares its listing with the table as last seen
//! ([`crate::drift`]): what someone else changed is counted, planned from
//! the listing like any other difference, and the Node whose route was
//! created again gets a `RouteRepaired` Warning.
//!
//! Each pass runs in a `pass{id, trigger, kind, mode}` span, and each cloud
//! request in a `cloud{op, ...}` span inside it, so the log lines of one
//! pass share its id (JSON logs carry the spans' fields flat, the id as `pass`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use route_cloud::{CloudError, CloudRoutes};
use route_core::{NetworkCondition, Plan, PlanConfig};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::absorb::{self, Absorbed};
use crate::bounds::{self, Bounds, Held, HeldKind};
use crate::dry_run::{DryRun, DryRunReport};
use crate::execute::{Executor, Fence, OpRecords, Writes};
use crate::forwarding::Prerequisites;
use crate::gate::{self, Gated, Holds, Pool, Room};
use crate::metrics::{Metrics, MetricsHandle, PassOutcome};
use crate::nodes::{NodeRef, NodeStore};
use crate::retry::{BackoffConfig, OpKey, RetryBook};
use crate::schedule::{Decision, Mode, PassKind, Scheduler, SyncTrigger, Timing};
use crate::settings_check::{ConfigAlarm, SettingsCheck};
use crate::snapshot::{self, RouteCache, Snapshot};
use crate::status::{self, StatusWriter};
use crate::warnings::{PlanWarnings, Warning};

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
    /// `--max-unavailable-nodes` and `--max-route-deletions`: how much one
    /// pass may take away at once ([`crate::bounds`]).
    pub bounds: Bounds,
}

/// The longest wait before condition patches that failed are retried.
const STATUS_RETRY_MAX: Duration = Duration::from_secs(30);

/// The default of `--route-deletion-grace`.
pub const DEFAULT_DELETION_GRACE: Duration = Duration::from_secs(2);

/// What one pass did; returned for tests, the simulator and logs.
#[derive(Debug, Clone)]
pub struct PassReport {
    /// Full or cached.
    pub kind: PassKind,
    /// Metric trigger label.
    pub trigger: SyncTrigger,
    /// The plan (empty when listing failed).
    pub plan: Plan,
    /// Its operations' records: verdict and result, by key.
    pub ops: OpRecords,
    /// Listing failed with this error.
    pub list_error: Option<CloudError>,
    /// Conditions written.
    pub conditions: Vec<(String, NetworkCondition)>,
    /// The settings disagreed with the cluster: the plan was made and
    /// nothing of it carried out.
    pub misconfigured: Option<route_core::Misconfiguration>,
    /// What the pass's bounds held back.
    pub held: Vec<Held>,
    /// Under `--dry-run`: what the pass would have changed.
    pub dry_run: Option<DryRunReport>,
}

/// The route controller. Build with [`Controller::new`], run with [`Controller::run`].
pub struct Controller {
    cfg: ControllerConfig,
    nodes: Arc<NodeStore>,
    status: Arc<dyn StatusWriter>,
    executor: Executor,
    metrics: MetricsHandle,
    scheduler: Scheduler,
    book: RetryBook,
    holds: Holds,
    routes: RouteCache,
    warned: PlanWarnings,
    prerequisites: Prerequisites,
    reports: Option<tokio::sync::mpsc::UnboundedSender<PassReport>>,
    first_sync: Option<Arc<AtomicBool>>,
    /// Passes in a row whose condition patches failed, and when the next
    /// pass rewrites them.
    status_retry: (u32, Option<Instant>),
    /// Route limits already warned as past 80 %, until they drop below.
    nearly_full: std::collections::HashSet<Pool>,
    /// Passes run so far; the id of the next pass's span.
    passes: u64,
    /// When the last listing that succeeded started: what a Node's
    /// `RouteCreated` rests on.
    last_listed: Option<Instant>,
    /// The settings held against the cluster, and what was reported of it.
    settings: SettingsCheck,
    /// What the bounds held in the last pass that held anything, so the
    /// log line and the Warning come once per hold, not once per pass.
    held: Vec<Held>,
    /// Under `--dry-run`: what was reported of the differences.
    dry_run: Option<DryRun>,
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
        let metrics = MetricsHandle::from(metrics);
        let executor = Executor::new(cloud, cfg.cluster_name.clone(), fence, metrics.clone());
        let prerequisites = Prerequisites::new(cfg.timing.prerequisite_period());
        Self {
            routes: RouteCache::new(cfg.mode),
            cfg,
            nodes,
            status,
            executor,
            metrics,
            scheduler,
            book,
            holds,
            warned: PlanWarnings::new(),
            prerequisites,
            reports: None,
            first_sync: None,
            status_retry: (0, None),
            nearly_full: std::collections::HashSet::new(),
            passes: 0,
            last_listed: None,
            settings: SettingsCheck::default(),
            held: Vec::new(),
            dry_run: None,
        }
    }

    /// `--dry-run`: the controller plans, reads the cloud and the Nodes as
    /// usual and writes nothing (no route change, no prerequisite repair, no
    /// condition, no Event); it reports what it would change instead
    /// ([`crate::dry_run`]).
    pub fn with_dry_run(mut self) -> Self {
        self.executor.set_writes(Writes::DryRun);
        self.dry_run = Some(DryRun::new());
        self
    }

    /// Sets `flag` once the first full pass after gaining leadership listed
    /// the cloud and ran its plan (for `/readyz`).
    pub fn with_first_sync(mut self, flag: Arc<AtomicBool>) -> Self {
        self.first_sync = Some(flag);
        self
    }

    /// Raises `alarm` (read by `/readyz`) while the settings disagree with
    /// the cluster.
    pub fn with_config_alarm(mut self, alarm: ConfigAlarm) -> Self {
        self.settings = SettingsCheck::with_alarm(alarm);
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
            self.metrics.leader(is_leader);
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
                    f.store(false, Ordering::SeqCst);
                }
                self.scheduler.became_leader();
                self.prerequisites.became_leader();
                self.routes.forget();
                self.settings.forget();
            }
            if !self.executor.fence().is_open() {
                // Still leader, but the fence is closed: the renewal is late
                // (a slow API server, a paused process). A pass now would
                // only cut its changes off again; wait for the renewal.
                info!(
                    "leader, but the Lease renewal is late: waiting for it before changing the cloud"
                );
                tokio::select! {
                    _ = self.executor.fence().opened() => {}
                    r = leader.changed(), if leader_open => if r.is_err() { leader_open = false },
                    _ = shutdown.cancelled() => return,
                }
                continue;
            }
            if self.scheduler.discovery_due(Instant::now()) {
                self.discover().await;
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
                        _ = self.nodes.changed() => self.scheduler.node_changed(),
                        _ = sleep => {}
                        r = leader.changed(), if leader_open => if r.is_err() { leader_open = false },
                        _ = shutdown.cancelled() => return,
                    }
                }
            }
        }
    }

    /// Runs one pass now (also used by tests and tools), in a span of its
    /// own that groups the pass's log lines.
    pub async fn pass(&mut self, kind: PassKind, trigger: SyncTrigger) -> PassReport {
        self.passes += 1;
        let span = info_span!(
            "pass",
            id = self.passes,
            trigger = trigger.as_str(),
            kind = kind.as_str(),
            mode = self.cfg.mode.as_str()
        );
        self.run_pass(kind, trigger).instrument(span).await
    }

    /// The pass's steps, one call each; the steps that talk to the cloud or
    /// the API server say so.
    async fn run_pass(&mut self, kind: PassKind, trigger: SyncTrigger) -> PassReport {
        let started = Instant::now();
        let mut report = PassReport::new(kind, trigger);
        // 1. Snapshot: the Nodes and the route table, cached or listed (cloud I/O).
        let use_cache = kind == PassKind::Cached && !self.holds.wants_listing(started);
        let mut snap =
            match snapshot::take(&self.nodes, &mut self.routes, &self.executor, use_cache).await {
                Ok(snap) => snap,
                Err(e) => return self.list_failed(report, e, started).await,
            };
        // 1b. Prerequisites: what the cloud needs on a Node's instance before
        //     it delivers the pod traffic the Node forwards, when a check is
        //     due (cloud I/O).
        self.check_prerequisites(&mut snap).await;
        if snap.listed {
            self.last_listed = Some(started);
            self.scheduler.full_pass_listed(started);
            // A provider that discovers its route tables does so when listing.
            self.cfg.plan.tables = self.executor.cloud().targets();
            self.metrics.targets(&self.cfg.plan.tables);
        }
        // 2. Plan: what must exist, from the snapshot alone (pure).
        let plan = route_core::plan(&snap.nodes, &snap.routes, &self.cfg.plan);
        // 2b. Check the settings against the cluster (pure): a setting the
        //     whole cluster disagrees with holds every change of the pass.
        let (mismatch, warning) = self.settings.check(&snap.nodes, &self.cfg.plan);
        self.metrics
            .configuration(mismatch.as_ref().map(route_core::Misconfiguration::check));
        if let Some(m) = mismatch {
            self.emit(warning.as_slice()).await;
            self.routes.keep(snap.routes);
            return self.held(report, plan, m, started);
        }
        // 3. Gate: one verdict per operation: run now, or why not (pure).
        let room = self.room(&snap);
        let gated = self.gate(&plan, &room, snap.listed);
        // 4. Warn about what the plan refused and repairs that back off (Events).
        let warnings = self.plan_warnings(&plan, &gated);
        self.emit(&warnings).await;
        // 5. Execute what the gate lets through (cloud I/O).
        let outcome = self.executor.execute(&plan, &gated).await;
        self.routes.keep(snap.routes);
        // 6. Absorb the outcome into the retry book, holds and route cache (pure).
        let absorbed = self.absorb(&plan, &outcome);
        self.emit(&absorbed.warnings).await;
        let repaired = self.drift_repaired(&snap.drift, &plan, &outcome);
        self.emit(&repaired).await;
        let headroom = self.headroom(&room, &plan, &outcome);
        self.emit(&headroom).await;
        // 7. Status: NetworkUnavailable conditions (nodes/status I/O) and latency.
        let (conditions, held_nodes) = self.update_status(&plan, &outcome).await;
        report.conditions = conditions;
        // 7a. What the bounds held, said once per hold (Events).
        report.held = gated.held.iter().cloned().chain(held_nodes).collect();
        let held = self.report_held(&report.held, &plan);
        self.emit(&held).await;
        self.count_reasons();
        // 7c. Dry run: what the pass would have changed.
        report.dry_run = self.observe_dry_run(&plan);
        // 8. Finish: metrics, and when the next pass is due.
        self.finish(&mut report, plan, outcome, gated, started);
        report
    }

    /// Step 1b: asks the provider about the Nodes whose forwarding
    /// prerequisite is due a check, records the findings on the Nodes'
    /// views (in the store, and in this pass's snapshot, where the planner
    /// reads them) and emits their Warnings.
    async fn check_prerequisites(&mut self, snap: &mut Snapshot) {
        if !self.executor.cloud().capabilities().checks_forwarding {
            return;
        }
        // A repair for a Node without a route yet would be its preparation
        // (an instance's check is on until its first route): only Nodes
        // with a route are read afresh and warned about.
        let routed: std::collections::HashSet<&str> = snap
            .routes
            .iter()
            .filter(|r| r.foreign.is_none())
            .map(|r| r.node.as_str())
            .collect();
        // Hands off what is not routed: a Node left out by --node-selector,
        // or one whose pod CIDRs are all of a family not routed, gets no
        // check, no repair and no Warning, whatever routes point at it.
        let plan = &self.cfg.plan;
        let routable: Vec<Arc<route_core::NodeView>> = snap
            .nodes
            .iter()
            .filter(|n| {
                !n.excluded
                    && n.pod_cidrs.iter().any(|c| {
                        matches!(c, route_core::PodCidr::Valid(c) if plan.routes_family(c.family()))
                    })
            })
            .cloned()
            .collect();
        let now = Instant::now();
        let due = self
            .prerequisites
            .due(&routable, |n| routed.contains(n), now);
        if due.is_empty() {
            return;
        }
        let mut answers = Vec::new();
        let mut failed = crate::forwarding::Due::default();
        let asks = [(&due.fresh, true), (&due.new, false)];
        // Asked to repair; the executor only reads under --dry-run.
        for (asked, fresh) in asks.into_iter().filter(|(a, _)| !a.is_empty()) {
            let check = route_cloud::ForwardingCheck {
                fresh,
                repair: true,
            };
            match self.executor.check_forwarding(asked, check).await {
                Ok(found) => answers.extend(found),
                Err(e) => {
                    warn!(error = %e, nodes = asked.len(), fresh, "could not check the Nodes' forwarding prerequisites; asking again later");
                    if fresh {
                        failed.fresh = asked.clone();
                    } else {
                        failed.new = asked.clone();
                    }
                }
            }
        }
        if let Some(d) = &mut self.dry_run {
            d.prerequisites(&answers);
        }
        let found =
            self.prerequisites
                .absorb(&due, answers, |n| routed.contains(n), Instant::now());
        self.prerequisites.failed(&failed);
        self.nodes.record_forwarding(
            found
                .changed
                .iter()
                .map(|(n, u, d)| (n.as_str(), u.as_str(), *d)),
        );
        if !found.changed.is_empty() {
            let changed: std::collections::HashMap<&str, (&str, bool)> = found
                .changed
                .iter()
                .map(|(n, u, d)| (n.as_str(), (u.as_str(), *d)))
                .collect();
            for v in &mut snap.nodes {
                if let Some(&(uid, disabled)) = changed.get(v.name.as_str())
                    && v.uid == uid
                {
                    Arc::make_mut(v).forwarding_disabled = disabled;
                }
            }
        }
        for w in &found.warnings {
            if matches!(
                w.reason,
                crate::warnings::Reason::ForwardingRepaired
                    | crate::warnings::Reason::ForwardingDisabled
            ) {
                self.metrics
                    .drift(crate::drift::DriftKind::PrerequisiteLost);
            }
        }
        self.emit(&found.warnings).await;
    }

    /// Step 6c: counts the drift the listing found and warns the Nodes whose
    /// route this pass created again.
    fn drift_repaired(
        &self,
        drift: &[crate::drift::RouteDrift],
        plan: &Plan,
        outcome: &OpRecords,
    ) -> Vec<Warning> {
        let mut warnings = Vec::new();
        for d in drift {
            self.metrics.drift(d.kind);
            let repaired = plan.creations.iter().find(|c| {
                c.route.node == d.was.node
                    && c.route.destination == d.was.destination
                    && c.route.table == d.was.table
            });
            let Some(c) = repaired.filter(|c| outcome.of(&c.key()).is_done()) else {
                // Not created again in this pass: the Node is gone or left
                // out, or the creation failed and warns for itself.
                continue;
            };
            let node = NodeRef {
                name: c.route.node.to_string(),
                uid: c.node_uid.clone(),
            };
            warnings.push(Warning::route_repaired(node, &d.describe()));
        }
        warnings
    }

    /// Step 3: prunes the retry book to what this plan still wants and
    /// gives every operation its verdict.
    fn gate(&mut self, plan: &Plan, room: &Room, listed: bool) -> Gated {
        let wanted: std::collections::HashSet<OpKey> = plan
            .deletions
            .iter()
            .map(route_core::Deletion::key)
            .chain(plan.creations.iter().map(route_core::Creation::key))
            .collect();
        let now = Instant::now();
        self.book.retain(&wanted, now);
        self.metrics.pending_operations(wanted.len());
        let gated = gate::gate(plan, &mut self.holds, &self.book, room, now, listed);
        if !plan.is_noop() {
            debug!(
                deletions = plan.deletions.len(),
                creations = plan.creations.len(),
                run = gated.iter().filter(|(_, v)| v.runs()).count(),
                "executing plan"
            );
            for (key, verdict) in gated.iter() {
                debug!(operation = %key, verdict = %verdict.describe(now), "gate");
            }
        }
        gated
    }

    /// The provider's route limit and what the snapshot holds against it.
    fn room(&self, snap: &Snapshot) -> Room {
        let caps = self.executor.cloud().capabilities();
        Room::new(caps.max_routes, caps.max_routes_per_family, &snap.routes)
            .with_unlisted(self.executor.cloud().unlisted_routes())
            .with_deletion_budget(self.cfg.bounds.deletions, &snap.routes)
    }

    /// Step 6b: how full each table is after the pass, as metrics, and a
    /// Warning on the Node whose new route took a table past 80 % of the
    /// cloud's limit (once per crossing).
    fn headroom(&mut self, room: &Room, plan: &Plan, outcome: &OpRecords) -> Vec<Warning> {
        let Some(max) = room.max() else {
            return Vec::new();
        };
        let mut used: HashMap<Pool, usize> = room.listed().map(|(p, n)| (p.clone(), n)).collect();
        let mut newest: HashMap<Pool, &route_core::Creation> = HashMap::new();
        for d in &plan.deletions {
            if outcome.of(&d.key()).is_done()
                && let Some(n) = used.get_mut(&room.pool(&d.route))
            {
                *n = n.saturating_sub(1);
            }
        }
        // The Node to warn is the one whose route took the table across
        // 80 %, not the last one of a burst (which would read 100 %).
        let mut crossed: HashMap<Pool, (&route_core::Creation, usize)> = HashMap::new();
        for c in &plan.creations {
            if outcome.of(&c.key()).is_done() {
                let pool = room.pool(&c.route);
                let n = used.entry(pool.clone()).or_default();
                if c.replaces.is_none() {
                    *n += 1;
                }
                if *n * 5 >= max * 4 && !crossed.contains_key(&pool) {
                    crossed.insert(pool.clone(), (c, *n));
                }
                newest.insert(pool, c);
            }
        }
        // Tables the cloud lists empty still have a limit.
        for t in &self.cfg.plan.tables {
            used.entry((t.clone(), None)).or_default();
        }
        self.metrics.route_room(&used, max);
        let mut warnings = Vec::new();
        for (pool, n) in &used {
            let full = *n * 5 >= max * 4;
            if !full {
                self.nearly_full.remove(pool);
                continue;
            }
            if !self.nearly_full.insert(pool.clone()) {
                continue;
            }
            let (table, family) = pool;
            warn!(table = %table, family = ?family, routes = n, limit = max, "a route table passed 80 % of the cloud's route limit");
            let at_crossing = crossed.get(pool).copied();
            if let Some((c, n)) = at_crossing.or_else(|| newest.get(pool).map(|c| (*c, *n))) {
                let node = NodeRef {
                    name: c.route.node.to_string(),
                    uid: c.node_uid.clone(),
                };
                warnings.push(Warning::route_table_nearly_full(node, table, n, max));
            }
        }
        warnings
    }

    /// Step 7b: Nodes per condition reason, from the cache (which holds the
    /// conditions just written).
    fn count_reasons(&self) {
        if !self.metrics.enabled() {
            return;
        }
        let mut counts: Vec<(NetworkCondition, usize)> =
            NetworkCondition::ALL.iter().map(|c| (*c, 0)).collect();
        for n in self.nodes.snapshot() {
            let Some(c) = n.network_unavailable.as_ref() else {
                continue;
            };
            if let Some(i) = NetworkCondition::ALL
                .iter()
                .position(|k| k.reason() == c.reason && k.status() == c.status)
            {
                counts[i].1 += 1;
            }
        }
        self.metrics.nodes_by_reason(&counts);
    }

    /// Step 4: the Warnings the plan and the gate call for, each once.
    fn plan_warnings(&mut self, plan: &Plan, gated: &Gated) -> Vec<Warning> {
        let nodes = &self.nodes;
        let mut warnings = self
            .warned
            .new_warnings(plan, &self.cfg.plan.cluster_cidrs, |name| {
                nodes.get(name).map(|v| v.uid.clone())
            });
        let now = Instant::now();
        for r in &gated.new_recurrences {
            let node = NodeRef {
                name: r.node.clone(),
                uid: r.uid.clone(),
            };
            let wait = r.next_repair.saturating_duration_since(now);
            warnings.push(Warning::route_blackholed(node, r.cidr, wait));
        }
        warnings
    }

    /// Emits Warning Events (API I/O), through the one emitter.
    async fn emit(&self, warnings: &[Warning]) {
        let writes = self.executor.writes();
        for w in warnings {
            status::emit(
                w,
                &*self.status,
                self.executor.fence(),
                writes,
                &self.metrics,
            )
            .await;
        }
    }

    /// Step 7c, under `--dry-run`: reports what the pass would have
    /// changed (log lines, gauges). A pass that found something looks
    /// again with a fresh listing after the least interval between passes:
    /// a cached table does not show the routes the route controller
    /// beside it made meanwhile, and a difference it has since resolved
    /// should not stand until the next drift check.
    fn observe_dry_run(&mut self, plan: &Plan) -> Option<DryRunReport> {
        let d = self.dry_run.as_mut()?;
        let nodes = &self.nodes;
        let report = d.observe(
            plan,
            |n| nodes.get(n).is_some(),
            &self.metrics,
            std::time::SystemTime::now(),
        );
        if !report.agreeing() {
            self.scheduler.cache_uncertain();
        }
        Some(report)
    }

    /// Step 6; an uncertain answer makes the next pass a full one.
    fn absorb(&mut self, plan: &Plan, outcome: &OpRecords) -> Absorbed {
        let state = absorb::State {
            book: &mut self.book,
            holds: &mut self.holds,
            routes: &mut self.routes,
        };
        let absorbed = absorb::absorb(plan, outcome, state, &self.nodes, Instant::now());
        if absorbed.uncertain {
            self.scheduler.cache_uncertain();
        }
        let fenced = outcome.fenced();
        if fenced > 0 {
            // Cut off is not done: the next pass (after a fresh list where
            // an answer was abandoned) redoes it as soon as the fence opens.
            self.metrics.fenced(fenced);
            self.scheduler.redo();
            info!(
                operations = fenced,
                "the fence cut off route changes; they are redone as soon as this replica may change the cloud again"
            );
        }
        absorbed
    }

    /// Looks the route targets up again without listing routes (cloud I/O).
    /// A target that appeared or went makes the cached table incomplete, so
    /// a full pass follows: it lists every target and routes every Node in
    /// a new one. A target that went is only dropped; nothing in it is
    /// deleted.
    async fn discover(&mut self) {
        self.scheduler.discovered(Instant::now());
        let found = match self.executor.discover_targets().await {
            Ok(Some(found)) => found,
            Ok(None) => return,
            Err(e) => {
                warn!(error = %e, "could not look up the route targets; trying again at the next discovery");
                return;
            }
        };
        let mut known = self.cfg.plan.tables.clone();
        let mut found_sorted = found.clone();
        known.sort();
        found_sorted.sort();
        if known != found_sorted {
            info!(
                before = ?known,
                now = ?found_sorted,
                "the route targets changed; a full sync follows"
            );
            self.routes.forget();
            self.scheduler.cache_uncertain();
        }
    }

    /// Step 7: ends the latency measurements the outcome completes, then
    /// patches conditions.
    async fn update_status(
        &mut self,
        plan: &Plan,
        outcome: &OpRecords,
    ) -> (Vec<(String, NetworkCondition)>, Option<Held>) {
        let fence = self.executor.fence();
        if !fence.is_open() {
            return (Vec::new(), None);
        }
        let failed = |k: &OpKey| !outcome.of(k).is_done();
        for waited in self.nodes.confirm_routes(plan, failed) {
            self.metrics.route_confirmed(waited);
        }
        let concurrency = self.cfg.status_concurrency;
        let book = &self.book;
        let failure = |k: &OpKey| status::explain(outcome, book, k);
        // A pass whose listing is older than the drift period plus one
        // pass (a pass slowed down by throttling for minutes) writes no
        // RouteCreated, not even for the routes it created: a route deleted
        // or a table tagged since would go unseen. The full pass that
        // follows at once writes it from what it sees.
        let stale = self.listing_stale(Instant::now());
        // Bounded passes: more working Nodes turned True at once than
        // --max-unavailable-nodes allows are none of them turned.
        let turning = plan
            .nodes
            .iter()
            .filter(|n| bounds::turns_unavailable(n, &failure))
            .count();
        let budget = self.cfg.bounds.unavailable;
        let max = budget.max(self.nodes.len());
        let held = (turning > max).then_some(Held {
            kind: HeldKind::UnavailableNodes,
            planned: turning,
            max,
            budget,
        });
        let confirmed;
        let plan = if stale || held.is_some() {
            let mut p = plan.clone();
            if stale {
                p.nodes
                    .retain(|n| n.planned() != NetworkCondition::RouteCreated);
                self.scheduler.cache_uncertain();
            }
            if held.is_some() {
                p.nodes.retain(|n| !bounds::turns_unavailable(n, &failure));
            }
            confirmed = p;
            &confirmed
        } else {
            plan
        };
        let written = status::write_conditions(
            plan,
            &failure,
            &self.nodes,
            &self.status,
            fence,
            self.executor.writes(),
            concurrency,
        )
        .await;
        self.status_retry = if written.failed == 0 {
            (0, None)
        } else {
            // The patch is planned again from the Node's unchanged
            // condition; without a pass of its own it would wait for the
            // next Node event or the resync.
            // Patches are cheap writes to the API server: an outage is
            // over for the Nodes at most 30 s after it ends.
            let failures = self.status_retry.0.saturating_add(1);
            let wait = self.cfg.backoff.delay(failures).min(STATUS_RETRY_MAX);
            warn!(
                failed = written.failed,
                retry_in_ms = wait.as_millis() as u64,
                "could not update NetworkUnavailable conditions; retrying"
            );
            (failures, Some(Instant::now() + wait))
        };
        (written.conditions, held)
    }

    /// Step 7a: what the bounds held in this pass, as metrics, and a log
    /// line and a `ChangesHeld` Warning when a hold starts or changes.
    fn report_held(&mut self, held: &[Held], plan: &Plan) -> Vec<Warning> {
        self.metrics.held(held);
        if held == self.held.as_slice() {
            return Vec::new();
        }
        self.held = held.to_vec();
        let mut warnings = Vec::new();
        for h in held {
            warn!(
                kind = h.kind.as_str(),
                planned = h.planned,
                max = h.max,
                flag = h.kind.flag(),
                "{h}"
            );
            // Filed under a Node the hold concerns where there is one,
            // else the first Node by name, so it is found beside the
            // Nodes' own Events.
            let concerned = match h.kind {
                HeldKind::UnavailableNodes => plan
                    .nodes
                    .iter()
                    .filter(|n| n.current.as_ref().is_some_and(|c| c.status != "True"))
                    .map(|n| (n.node.clone(), n.uid.clone()))
                    .min(),
                HeldKind::RouteDeletions => None,
            };
            let node = concerned.or_else(|| {
                self.nodes
                    .snapshot()
                    .iter()
                    .map(|n| (n.name.clone(), n.uid.clone()))
                    .min()
            });
            if let Some((name, uid)) = node {
                warnings.push(Warning::changes_held(NodeRef { name, uid }, h));
            }
        }
        warnings
    }

    /// Step 8: records the pass and tells the scheduler when the earliest
    /// retry or hold ends.
    fn finish(
        &mut self,
        report: &mut PassReport,
        plan: Plan,
        outcome: OpRecords,
        gated: Gated,
        started: Instant,
    ) {
        let result = if outcome.any_failed() {
            PassOutcome::Error
        } else if outcome.changed() > 0 {
            PassOutcome::Changed
        } else {
            PassOutcome::Noop
        };
        self.metrics.pending_operations(outcome.pending());
        self.metrics
            .backlog(self.book.len(), self.holds.recurring_blackholes());
        let (trigger, kind) = (report.trigger, report.kind);
        let took = started.elapsed();
        self.metrics
            .pass_finished(trigger, kind, result, outcome.changed(), took);
        let wake = [
            self.book.next_wake(started),
            self.status_retry.1,
            self.prerequisites.next_wake(),
        ]
        .into_iter()
        .flatten()
        .min();
        self.scheduler.retry_at(wake);
        self.scheduler.hold_ends(gated.until);
        if kind == PassKind::Full
            && let Some(f) = &self.first_sync
        {
            f.store(true, Ordering::SeqCst);
        }
        report.plan = plan;
        report.ops = outcome;
    }

    /// Step 2b's end of a pass: the settings disagree with the cluster, so
    /// nothing of the plan runs and no condition is written. The plan is
    /// reported (for `plan` and tests); the next Node event or resync
    /// checks again.
    fn held(
        &mut self,
        mut report: PassReport,
        plan: Plan,
        m: route_core::Misconfiguration,
        started: Instant,
    ) -> PassReport {
        self.metrics.pending_operations(0);
        let took = started.elapsed();
        self.metrics
            .pass_finished(report.trigger, report.kind, PassOutcome::Error, 0, took);
        // A dry run reports the plan it holds: what it would change once
        // the setting agrees with the cluster. It looks again at the next
        // Node event or resync, like the pass that writes.
        if let Some(d) = &mut self.dry_run {
            let nodes = &self.nodes;
            report.dry_run = Some(d.observe(
                &plan,
                |n| nodes.get(n).is_some(),
                &self.metrics,
                std::time::SystemTime::now(),
            ));
        }
        report.plan = plan;
        report.misconfigured = Some(m);
        report
    }

    /// No listing has succeeded for the drift period plus one pass: what
    /// the controller knows of the cloud is older than it promises.
    fn listing_stale(&self, now: Instant) -> bool {
        let drift = self.cfg.timing.drift;
        !drift.is_zero()
            && self.last_listed.is_some_and(|t| {
                now.saturating_duration_since(t) >= drift + self.cfg.timing.min_interval
            })
    }

    /// A listing refused the controller itself (credentials, permissions):
    /// the routable Nodes that have no `NetworkUnavailable` condition yet
    /// read `True`/`NoRouteCreated`, the message naming the refusal, so
    /// that no pod lands on a Node no route can be made for until an
    /// operator acts (status I/O). Returns the conditions written.
    async fn mark_refused(&self, e: &CloudError) -> Vec<(String, NetworkCondition)> {
        let plan = &self.cfg.plan;
        let routable = |n: &route_core::NodeView| {
            n.pod_cidrs.iter().any(
                |c| matches!(c, route_core::PodCidr::Valid(c) if plan.routes_family(c.family())),
            )
        };
        let message = refusal_message(e);
        let written = status::mark_refused(
            &self.nodes,
            routable,
            &message,
            &self.status,
            self.executor.fence(),
            self.cfg.status_concurrency,
        )
        .await;
        if !written.conditions.is_empty() {
            warn!(
                nodes = written.conditions.len(),
                error = %e,
                "the cloud refused the controller's listing: Nodes with pod CIDRs and no NetworkUnavailable condition yet now read True/NoRouteCreated until a listing succeeds"
            );
        }
        written.conditions
    }

    /// The list of a full pass failed: nothing else runs, and the scheduler
    /// spaces the next attempt. Once no listing has succeeded for the drift
    /// period plus one pass, the Nodes that read `RouteCreated` say
    /// `Unknown`/`RouteUnverified` instead: nothing has looked at their
    /// routes for longer than the controller promises (status I/O).
    async fn list_failed(
        &mut self,
        mut report: PassReport,
        e: CloudError,
        started: Instant,
    ) -> PassReport {
        error!(error = %e, "could not list routes; will retry");
        self.scheduler.full_pass_failed();
        if self.listing_stale(started)
            && let Some(seen) = self.last_listed
        {
            let written = status::mark_unverified(
                &self.nodes,
                &self.status,
                self.executor.fence(),
                self.executor.writes(),
                self.cfg.status_concurrency,
            )
            .await;
            if !written.conditions.is_empty() {
                warn!(
                    nodes = written.conditions.len(),
                    last_listed_s_ago = started.saturating_duration_since(seen).as_secs(),
                    "no listing of the cloud's routes succeeded for longer than the drift check period: Nodes that read RouteCreated now read Unknown/RouteUnverified until a listing succeeds"
                );
            }
            report.conditions = written.conditions;
        }
        if crate::policy::of(e.kind).marks_unrouted_nodes {
            report.conditions.extend(self.mark_refused(&e).await);
        }
        let took = started.elapsed();
        self.metrics
            .pass_finished(report.trigger, report.kind, PassOutcome::Error, 0, took);
        report.list_error = Some(e);
        report
    }
}

/// The longest cloud message a condition quotes: EC2 appends an encoded
/// authorization message of kilobytes to some refusals.
const REFUSAL_QUOTE_MAX: usize = 512;

/// The message of a Node marked for a refused listing: upstream's
/// `NoRouteCreated` message and what the cloud refused, e.g. "...: the
/// cloud refused DescribeRouteTables: UnauthorizedOperation (HTTP 403):
/// You are not authorized to perform this operation.".
fn refusal_message(e: &CloudError) -> String {
    let mut quoted = e.message.as_str();
    if quoted.len() > REFUSAL_QUOTE_MAX {
        let mut end = REFUSAL_QUOTE_MAX;
        while !quoted.is_char_boundary(end) {
            end -= 1;
        }
        quoted = &quoted[..end];
    }
    let cut = if quoted.len() < e.message.len() {
        "…"
    } else {
        ""
    };
    format!(
        "{}: the cloud refused {quoted}{cut}",
        NetworkCondition::NoRouteCreated.message()
    )
}

impl PassReport {
    fn new(kind: PassKind, trigger: SyncTrigger) -> Self {
        Self {
            kind,
            trigger,
            plan: Plan::default(),
            ops: OpRecords::default(),
            list_error: None,
            conditions: Vec::new(),
            misconfigured: None,
            held: Vec::new(),
            dry_run: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodes::NodeEvent;
    use crate::status::RecordingStatusWriter;
    use crate::warnings::Reason;
    use provider_memory::{MemoryCloud, MemoryConfig, Operation};
    use route_cloud::ErrorKind;
    use route_core::{Cidr, NodeView};

    struct Fixture {
        ctl: Controller,
        cloud: Arc<MemoryCloud>,
        status: Arc<RecordingStatusWriter>,
        nodes: Arc<NodeStore>,
    }

    fn fixture(mode: Mode, nodes: &[NodeView]) -> Fixture {
        fixture_with(mode, nodes, MemoryConfig::default())
    }

    fn fixture_with(mode: Mode, nodes: &[NodeView], cloud: MemoryConfig) -> Fixture {
        fixture_metered(mode, nodes, cloud, None)
    }

    fn fixture_metered(
        mode: Mode,
        nodes: &[NodeView],
        cloud: MemoryConfig,
        metrics: Option<Arc<Metrics>>,
    ) -> Fixture {
        let store = NodeStore::new(None);
        store.apply(NodeEvent::Init);
        for n in nodes {
            store.apply(NodeEvent::InitApply(n.clone()));
        }
        store.apply(NodeEvent::InitDone);
        let cloud = Arc::new(MemoryCloud::new(cloud).unwrap());
        let status = Arc::new(RecordingStatusWriter::default());
        let cfg = ControllerConfig {
            cluster_name: "c".into(),
            plan: PlanConfig {
                cluster_cidrs: vec![Cidr::parse("10.0.0.0/16").unwrap()],
                ..PlanConfig::default()
            },
            mode,
            timing: Timing {
                period: Duration::from_secs(10),
                min_interval: Duration::from_secs(10),
                resync: Duration::from_secs(12 * 3600),
                discovery: crate::schedule::DEFAULT_DISCOVERY_PERIOD,
                drift: crate::schedule::DEFAULT_DRIFT_PERIOD,
            },
            backoff: BackoffConfig {
                jitter: 0.0,
                ..BackoffConfig::default()
            },
            status_concurrency: 4,
            deletion_grace: Duration::ZERO,
            bounds: Bounds::NONE,
        };
        let ctl = Controller::new(
            cfg,
            store.clone(),
            cloud.clone(),
            status.clone(),
            Fence::new(true),
            metrics,
        );
        Fixture {
            ctl,
            cloud,
            status,
            nodes: store,
        }
    }

    fn node(name: &str, cidr: &str) -> NodeView {
        NodeView::new(name, format!("uid-{name}"), &[cidr])
    }

    fn lists(cloud: &MemoryCloud) -> usize {
        cloud
            .log()
            .iter()
            .filter(|c| c.op == Operation::List)
            .count()
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_whose_list_fails_plans_and_writes_nothing() {
        let mut f = fixture(Mode::Watch, &[node("a", "10.0.1.0/24")]);
        f.cloud.fail_next(Operation::List, 1, ErrorKind::Transient);
        let r = f.ctl.pass(PassKind::Full, SyncTrigger::NodeChange).await;
        assert!(r.list_error.is_some());
        assert!(r.plan.is_noop() && r.conditions.is_empty());
        assert_eq!(f.cloud.log().len(), 1, "only the list was sent");
        assert!(f.status.recorded().conditions.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_listing_refused_for_permissions_marks_only_nodes_without_a_condition_and_names_the_refusal()
     {
        let mut f = fixture(Mode::Watch, &[node("a", "10.0.1.0/24")]);
        f.ctl.pass(PassKind::Full, SyncTrigger::NodeChange).await;
        assert_eq!(
            f.status.condition_of("a"),
            Some(NetworkCondition::RouteCreated)
        );
        // Joining while the cloud refuses the controller: b has no
        // condition; c has one a CNI wrote; d has no pod CIDR.
        f.nodes.apply(NodeEvent::Apply(node("b", "10.0.2.0/24")));
        f.nodes.apply(NodeEvent::Apply(
            node("c", "10.0.3.0/24").with_condition("False", "CalicoIsUp"),
        ));
        f.nodes
            .apply(NodeEvent::Apply(NodeView::new("d", "uid-d", &[])));
        // An outage marks nobody.
        f.cloud.fail_next(Operation::List, 1, ErrorKind::Transient);
        let r = f.ctl.pass(PassKind::Full, SyncTrigger::NodeChange).await;
        assert!(r.list_error.is_some() && r.conditions.is_empty());
        f.cloud.fail_next(Operation::List, 2, ErrorKind::Permanent);
        let r = f.ctl.pass(PassKind::Full, SyncTrigger::NodeChange).await;
        assert_eq!(
            r.conditions,
            [("b".to_string(), NetworkCondition::NoRouteCreated)]
        );
        let messages = f.status.recorded().messages;
        assert_eq!(messages.len(), 1, "{messages:?}");
        let prefix = format!(
            "{}: the cloud refused ",
            NetworkCondition::NoRouteCreated.message()
        );
        assert!(
            messages[0].0 == "b" && messages[0].1.starts_with(&prefix),
            "{messages:?}"
        );
        assert_eq!(
            f.status.condition_of("a"),
            Some(NetworkCondition::RouteCreated),
            "a routed Node is never made True by a refusal"
        );
        assert_eq!(f.status.condition_of("c"), None);
        assert_eq!(f.status.condition_of("d"), None);
        // Written once: the next refusal finds b marked.
        let r = f.ctl.pass(PassKind::Full, SyncTrigger::NodeChange).await;
        assert!(r.list_error.is_some() && r.conditions.is_empty());
        // The refusal ends: b is routed and reads RouteCreated.
        f.ctl.pass(PassKind::Full, SyncTrigger::NodeChange).await;
        assert_eq!(
            f.status.condition_of("b"),
            Some(NetworkCondition::RouteCreated)
        );
    }

    #[test]
    fn a_refusal_quoted_in_a_condition_is_cut_to_its_bound_on_a_char_boundary() {
        let short = CloudError::new(
            route_cloud::ErrorKind::Permanent,
            "DescribeRouteTables: UnauthorizedOperation (HTTP 403): You are not authorized to perform this operation.",
        );
        assert_eq!(
            refusal_message(&short),
            "RouteController failed to create a route: the cloud refused DescribeRouteTables: UnauthorizedOperation (HTTP 403): You are not authorized to perform this operation."
        );
        let long = CloudError::new(route_cloud::ErrorKind::Permanent, "é".repeat(600));
        let m = refusal_message(&long);
        assert!(m.ends_with('…') && m.len() < REFUSAL_QUOTE_MAX + 100, "{m}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_pass_routes_every_node_and_marks_it() {
        let mut f = fixture(
            Mode::Periodic,
            &[node("a", "10.0.1.0/24"), node("b", "10.0.2.0/24")],
        );
        let r = f.ctl.pass(PassKind::Full, SyncTrigger::Periodic).await;
        assert_eq!(r.ops.changed(), 2);
        assert_eq!(f.cloud.routes("c").len(), 2);
        assert_eq!(
            f.status.condition_of("a"),
            Some(NetworkCondition::RouteCreated)
        );
        let again = f.ctl.pass(PassKind::Full, SyncTrigger::Periodic).await;
        assert!(again.plan.is_noop(), "a settled cluster plans nothing");
        assert!(again.conditions.is_empty(), "and patches nothing again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cluster_cidr_no_node_lies_in_holds_every_change_until_the_nodes_agree() {
        // Upstream routed these Nodes; this controller runs with a
        // --cluster-cidr (10.0.0.0/16) that is not the cluster's.
        let nodes: Vec<NodeView> = (1..=3)
            .map(|i| {
                node(&format!("n{i}"), &format!("10.42.{i}.0/24"))
                    .with_condition("False", "RouteCreated")
            })
            .collect();
        let mut f = fixture(Mode::Watch, &nodes);
        // A route inside the configured CIDR, to a gone Node:
        // deletable, were the settings right.
        f.cloud.insert_route(
            "c",
            route_core::Route::new("gone", "10.0.9.0/24".parse::<Cidr>().unwrap()),
        );
        let r = f.ctl.pass(PassKind::Full, SyncTrigger::NodeChange).await;
        let held = r.misconfigured.as_ref().expect("held for the setting");
        assert_eq!(held.flag(), "--cluster-cidr");
        assert!(
            !r.plan.deletions.is_empty(),
            "the plan is made: {:?}",
            r.plan
        );
        assert!(r.ops.results().next().is_none() && r.conditions.is_empty());
        assert!(
            f.cloud.log().iter().all(|c| c.op == Operation::List),
            "only the listing was sent: {:?}",
            f.cloud.log()
        );
        let recorded = f.status.recorded();
        assert!(recorded.conditions.is_empty(), "no condition written");
        let warned: Vec<(&str, &str)> = recorded
            .events
            .iter()
            .map(|(n, r, _)| (n.name.as_str(), r.as_str()))
            .collect();
        assert_eq!(warned, [("n1", Reason::ConfigurationMismatch.as_str())]);
        assert!(recorded.events[0].2.contains("10.42.1.0/24"));
        // Passes go on checking, and say it once.
        let again = f.ctl.pass(PassKind::Full, SyncTrigger::Periodic).await;
        assert!(again.misconfigured.is_some());
        assert_eq!(
            f.status.recorded().events.len(),
            1,
            "one Warning per mismatch"
        );
        // The Nodes are re-created with pod CIDRs inside it: reconciled, no restart.
        for i in 1..=3 {
            f.nodes.apply(NodeEvent::Apply(node(
                &format!("n{i}"),
                &format!("10.0.{i}.0/24"),
            )));
        }
        let fixed = f.ctl.pass(PassKind::Full, SyncTrigger::NodeChange).await;
        assert!(fixed.misconfigured.is_none());
        assert_eq!(fixed.ops.changed(), 4, "three creations, one deletion");
        assert_eq!(
            f.status.condition_of("n2"),
            Some(NetworkCondition::RouteCreated)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_that_would_delete_more_live_routes_than_the_bound_deletes_none_and_says_so() {
        // Twelve live routes to instances no Node names (a VPN's, a NAT's,
        // another cluster's inside a too-wide --cluster-cidr), one Node.
        let mut f = fixture(Mode::Watch, &[node("a", "10.0.1.0/24")]);
        f.ctl.cfg.bounds = Bounds::DEFAULT;
        for i in 0..12 {
            f.cloud.insert_route(
                "c",
                route_core::Route::new(
                    format!("appliance-{i}").as_str(),
                    format!("10.0.{}.0/24", 100 + i).parse::<Cidr>().unwrap(),
                ),
            );
        }
        let r = f.ctl.pass(PassKind::Full, SyncTrigger::NodeChange).await;
        assert_eq!(r.plan.deletions.len(), 12);
        assert_eq!(
            r.held,
            vec![Held {
                kind: HeldKind::RouteDeletions,
                planned: 12,
                max: 10,
                budget: bounds::Budget::Count(10),
            }]
        );
        assert!(
            f.cloud.log().iter().all(|c| c.op != Operation::Delete),
            "nothing deleted"
        );
        assert_eq!(f.cloud.routes("c").len(), 13, "the Node's route is created");
        assert_eq!(
            f.status.condition_of("a"),
            Some(NetworkCondition::RouteCreated),
            "and everything else goes on"
        );
        let events = f.status.recorded().events;
        let held: Vec<&String> = events
            .iter()
            .filter(|(_, r, _)| r == Reason::ChangesHeld.as_str())
            .map(|(_, _, m)| m)
            .collect();
        assert_eq!(held.len(), 1, "{events:?}");
        assert!(held[0].contains("--max-route-deletions"), "{}", held[0]);
        f.ctl.pass(PassKind::Full, SyncTrigger::Periodic).await;
        assert_eq!(f.status.recorded().events.len(), events.len(), "said once");
        // The operator means it: the bound lifted, they go.
        f.ctl.cfg.bounds.deletions = bounds::Budget::Percent(100);
        let r = f.ctl.pass(PassKind::Full, SyncTrigger::Periodic).await;
        assert!(r.held.is_empty());
        assert_eq!(f.cloud.routes("c").len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_that_would_turn_more_working_nodes_true_than_the_bound_writes_none_of_them() {
        // Ten routed Nodes whose routes all fail to be re-created at once
        // (someone emptied the table; the cloud refuses every creation).
        let nodes: Vec<NodeView> = (1..=10)
            .map(|i| node(&format!("n{i:02}"), &format!("10.0.{i}.0/24")))
            .collect();
        let mut f = fixture(Mode::Watch, &nodes);
        f.ctl.cfg.bounds = Bounds::DEFAULT;
        f.ctl.pass(PassKind::Full, SyncTrigger::NodeChange).await;
        assert_eq!(
            f.status.condition_of("n05"),
            Some(NetworkCondition::RouteCreated)
        );
        let written = f.status.recorded().conditions.len();
        for r in f.cloud.routes("c") {
            f.cloud.remove_route("c", &r.destination);
        }
        f.cloud
            .fail_next(Operation::Create, 10, ErrorKind::InvalidRequest);
        let r = f.ctl.pass(PassKind::Full, SyncTrigger::Periodic).await;
        assert_eq!(
            r.held,
            vec![Held {
                kind: HeldKind::UnavailableNodes,
                planned: 10,
                max: 2,
                budget: bounds::Budget::Percent(10),
            }]
        );
        assert_eq!(
            f.status.recorded().conditions.len(),
            written,
            "no Node turned True"
        );
        assert!(
            f.status
                .recorded()
                .events
                .iter()
                .any(|(_, r, m)| r == Reason::ChangesHeld.as_str()
                    && m.contains("--max-unavailable-nodes")),
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_cached_pass_plans_against_the_cached_table_without_listing() {
        let mut f = fixture(Mode::Incremental, &[node("a", "10.0.1.0/24")]);
        f.ctl.pass(PassKind::Full, SyncTrigger::NodeChange).await;
        assert_eq!(lists(&f.cloud), 1);
        f.nodes.apply(NodeEvent::Apply(node("b", "10.0.2.0/24")));
        let r = f.ctl.pass(PassKind::Cached, SyncTrigger::NodeChange).await;
        assert_eq!(r.plan.creations.len(), 1, "only the new Node");
        assert_eq!(lists(&f.cloud), 1, "no list in a cached pass");
        assert_eq!(f.cloud.routes("c").len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_creation_warns_once_per_failure_and_is_retried_after_its_backoff() {
        let mut f = fixture(Mode::Incremental, &[node("a", "10.0.1.0/24")]);
        f.cloud
            .fail_next(Operation::Create, 1, ErrorKind::Transient);
        f.ctl.pass(PassKind::Full, SyncTrigger::NodeChange).await;
        let events = f.status.recorded().events;
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].1, Reason::FailedToCreateRoute.as_str());
        assert_eq!(
            f.status.condition_of("a"),
            Some(NetworkCondition::NoRouteCreated)
        );
        // Not due yet: the retry is deferred, nothing is sent.
        let r = f.ctl.pass(PassKind::Cached, SyncTrigger::NodeChange).await;
        assert_eq!(
            *r.ops.creation(&r.plan.creations[0]),
            crate::OpResult::NotSent
        );
        tokio::time::advance(Duration::from_secs(2)).await;
        let r = f.ctl.pass(PassKind::Cached, SyncTrigger::NodeChange).await;
        assert!(r.ops.creation(&r.plan.creations[0]).is_done());
        assert_eq!(
            f.status.condition_of("a"),
            Some(NetworkCondition::RouteCreated)
        );
        assert_eq!(f.status.recorded().events.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_conflict_warns_both_nodes_once_across_passes() {
        let mut f = fixture(
            Mode::Periodic,
            &[node("a", "10.0.1.0/24"), node("b", "10.0.1.0/24")],
        );
        f.ctl.pass(PassKind::Full, SyncTrigger::Periodic).await;
        f.ctl.pass(PassKind::Full, SyncTrigger::Periodic).await;
        let reasons: Vec<(String, String)> = f
            .status
            .recorded()
            .events
            .into_iter()
            .map(|(n, reason, _)| (n.name, reason))
            .collect();
        let conflict = Reason::PodCidrConflict.as_str().to_string();
        assert_eq!(
            reasons,
            [
                ("a".to_string(), conflict.clone()),
                ("b".to_string(), conflict)
            ]
        );
        assert!(f.cloud.routes("c").is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_that_fills_a_table_warns_the_node_whose_route_crossed_80_percent_not_the_last()
    {
        // Regression: the Warning named the burst's last Node, at 100 %.
        let nodes: Vec<NodeView> = (0..10)
            .map(|i| node(&format!("n{i}"), &format!("10.0.{}.0/24", i + 1)))
            .collect();
        let cloud = MemoryConfig {
            max_routes: Some(10),
            ..MemoryConfig::default()
        };
        let mut f = fixture_with(Mode::Incremental, &nodes, cloud);
        let r = f.ctl.pass(PassKind::Full, SyncTrigger::NodeChange).await;
        assert_eq!(f.cloud.routes("c").len(), 10);
        let eighth = r.plan.creations[7].route.node.to_string();
        let full: Vec<_> = f
            .status
            .recorded()
            .events
            .into_iter()
            .filter(|(_, reason, _)| reason == Reason::RouteTableNearlyFull.as_str())
            .collect();
        assert_eq!(full.len(), 1, "{full:?}");
        assert_eq!(full[0].0.name, eighth, "{full:?}");
        assert!(full[0].2.contains("holds 8 of the 10"), "{}", full[0].2);
    }

    #[tokio::test(start_paused = true)]
    async fn every_node_is_routed_in_every_table_the_provider_has_within_each_tables_quota() {
        let tables = ["rtb-a", "rtb-b", "rtb-c"];
        let cloud = MemoryConfig {
            targets: tables.iter().map(|t| t.to_string()).collect(),
            max_routes: Some(2),
            ..MemoryConfig::default()
        };
        let nodes = [
            node("a", "10.0.1.0/24"),
            node("b", "10.0.2.0/24"),
            node("c", "10.0.3.0/24"),
        ];
        let mut f = fixture_with(Mode::Incremental, &nodes, cloud);
        let r = f.ctl.pass(PassKind::Full, SyncTrigger::NodeChange).await;
        for t in tables {
            assert_eq!(f.cloud.routes_in("c", t).len(), 2, "{t} is full at 2");
        }
        let refused = r
            .plan
            .creations
            .iter()
            .filter_map(|c| r.ops.record(&c.key()))
            .filter(|o| {
                o.refusal(Instant::now())
                    .is_some_and(|(kind, ..)| kind == ErrorKind::QuotaExceeded)
            })
            .count();
        assert_eq!(refused, 3, "one per table, refused without a request");
        let creates = f
            .cloud
            .log()
            .iter()
            .filter(|c| c.op == Operation::Create)
            .count();
        assert_eq!(creates, 6);
        // The Node that fits nowhere says RouteQuotaExceeded; the others are routed.
        let unrouted: Vec<&str> = nodes
            .iter()
            .map(|n| n.name.as_str())
            .filter(|n| f.status.condition_of(n) == Some(NetworkCondition::RouteQuotaExceeded))
            .collect();
        assert_eq!(unrouted.len(), 1, "{unrouted:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_dry_run_writes_nothing_reports_what_it_would_do_and_agrees_once_another_did_it() {
        let nodes = [node("a", "10.0.1.0/24"), node("b", "10.0.2.0/24")];
        let mut registry = prometheus_client::registry::Registry::default();
        let cloud = Arc::new(crate::reference::Idle(route_cloud::RequestStats::default()));
        let metrics = Metrics::register(&mut registry, cloud);
        metrics.register_dry_run(&mut registry);
        let Fixture {
            ctl,
            cloud,
            status,
            nodes: store,
        } = fixture_metered(
            Mode::Incremental,
            &nodes,
            MemoryConfig::default(),
            Some(metrics),
        );
        let mut ctl = ctl.with_dry_run();
        let scrape = || crate::metrics::encode(&registry);
        let gauge = |text: &str, name: &str| -> Option<String> {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ').map(String::from))
        };
        for kind in [PassKind::Full, PassKind::Cached] {
            ctl.scheduler.started(kind, Instant::now());
            let r = ctl.pass(kind, SyncTrigger::NodeChange).await;
            assert!(
                f_mutations(&cloud).is_empty(),
                "a dry run sends no change: {:?}",
                cloud.log()
            );
            let recorded = status.recorded();
            assert!(recorded.conditions.is_empty(), "{:?}", recorded.conditions);
            assert!(recorded.events.is_empty(), "{:?}", recorded.events);
            assert!(r.conditions.is_empty());
            assert_eq!(r.ops.changed(), 0);
            assert!(
                r.plan
                    .creations
                    .iter()
                    .all(|c| *r.ops.creation(c) == crate::OpResult::DryRun),
                "{:?}",
                r.ops
            );
            let d = r.dry_run.expect("a dry-run report");
            assert_eq!(d.count(crate::DryRunOp::Create), 2, "{d:?}");
            assert_eq!(d.count(crate::DryRunOp::Condition), 2, "{d:?}");
            assert!(!d.agreeing());
            let text = scrape();
            assert!(
                text.contains(
                    "route_controller_dry_run_pending_operations{operation=\"create\",reason=\"missing\"} 2"
                ),
                "{text}"
            );
            assert!(
                text.contains(
                    "route_controller_dry_run_pending_operations{operation=\"condition\",reason=\"RouteCreated\"} 2"
                ),
                "{text}"
            );
            assert_eq!(
                gauge(&text, "route_controller_dry_run_agreeing").as_deref(),
                Some("0")
            );
            assert_eq!(
                gauge(&text, "route_controller_dry_run_agreeing_since_seconds").as_deref(),
                Some("0")
            );
            assert_eq!(
                gauge(&text, "route_controller_retrying_operations").as_deref(),
                Some("0"),
                "nothing failed: nothing waits for a retry"
            );
        }
        assert!(
            matches!(ctl.scheduler.decide(Instant::now()), Decision::Sleep(_)),
            "nothing is redone at once"
        );
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(
            ctl.scheduler.decide(Instant::now()),
            Decision::Run(PassKind::Full, SyncTrigger::NodeChange),
            "a disagreement is looked at again with a listing after the least interval"
        );
        // Another route controller routes both Nodes and marks them.
        for n in &nodes {
            let cidr = n.valid_pod_cidrs()[0];
            cloud.insert_route("c", route_core::Route::new(n.name.as_str(), cidr));
            store.apply(NodeEvent::Apply(
                n.clone().with_condition("False", "RouteCreated"),
            ));
        }
        let r = ctl.pass(PassKind::Full, SyncTrigger::DriftCheck).await;
        let d = r.dry_run.expect("a dry-run report");
        assert!(d.agreeing(), "{d:?}");
        assert!(f_mutations(&cloud).is_empty());
        assert!(status.recorded().conditions.is_empty() && status.recorded().events.is_empty());
        let text = scrape();
        assert_eq!(
            gauge(&text, "route_controller_dry_run_agreeing").as_deref(),
            Some("1")
        );
        assert!(
            gauge(&text, "route_controller_dry_run_agreeing_since_seconds")
                .is_some_and(|s| s.parse::<u64>().unwrap() > 1_600_000_000),
            "{text}"
        );
        assert!(
            !text.contains("route_controller_dry_run_pending_operations{"),
            "{text}"
        );
    }

    fn f_mutations(cloud: &MemoryCloud) -> Vec<provider_memory::CallRecord> {
        cloud
            .log()
            .into_iter()
            .filter(|c| c.op != Operation::List)
            .collect()
    }
}
