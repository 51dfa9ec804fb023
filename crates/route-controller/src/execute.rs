//! Executing a plan against the cloud.
//!
//! The executor owns no state between passes. The gate ([`crate::gate`])
//! gave each operation its verdict; the executor writes each operation's
//! [`OpRecord`]: those whose verdict is
//! [`Verdict::Run`](crate::gate::Verdict::Run) it runs and records what the
//! cloud answered, the others it records as [`OpResult::NotSent`] (the
//! verdict says why). One result it decides from the run itself: a creation
//! whose deletion failed or was cut off in this pass is
//! [`OpResult::Blocked`]. What an answer means for the loop is
//! [`crate::policy`]'s, not the executor's. It runs the deletions and the
//! creations that depend on nothing concurrently, bounded by the provider's
//! `max_concurrent_operations`; a creation that must follow a deletion
//! (address change, blackhole replacement) starts only after that deletion
//! succeeded. Providers that take batches get the whole plan in one call,
//! each change under its key, and answer by key. A throttled answer closes
//! a shared [`Throttle`] until its retry-after, so the rest of the pass
//! waits instead of piling more requests on the cloud. Results are keyed
//! like the plan's operations ([`OpKey`]).

use std::sync::Arc;
use std::time::Duration;

use std::collections::HashMap;

use futures::future::join_all;
pub use route_cloud::Fence;
use route_cloud::{Batch, CloudError, CloudRoutes, ErrorKind};
use route_core::{Creation, Deletion, OpKey, Plan, Route};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tracing::{Instrument, error, info, info_span, warn};

use crate::gate::{Gated, Verdict};
use crate::metrics::MetricsHandle;
use crate::policy;
use crate::throttle::{Throttle, Ticket};

/// The result of one planned operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    /// Done; for creations, the route as the cloud now lists it.
    Done(Option<Route>),
    /// The cloud refused or failed.
    Failed(CloudError),
    /// Kept back by its verdict ([`OpRecord::verdict`] says why); no request.
    NotSent,
    /// A deletion it depends on failed or was cut off in this pass.
    Blocked,
    /// Not sent: the fence was closed (leadership lost, renew deadline
    /// passed, shutting down). Redone once this replica may write again.
    Cancelled,
    /// Possibly sent, its answer abandoned when the fence closed: whether
    /// it took effect is unknown, so the table is listed before it is redone.
    Abandoned,
    /// Let run by the gate, and not sent: this replica writes nothing
    /// (`--dry-run`). Like a fence cut-off it answers nothing, but it is
    /// not redone: the next pass plans it again and finds it not sent again.
    DryRun,
}

impl OpResult {
    /// The operation succeeded.
    pub fn is_done(&self) -> bool {
        matches!(self, OpResult::Done(_))
    }

    /// The fence cut the operation off; it was not given up on, it is redone.
    pub fn is_fenced(&self) -> bool {
        matches!(self, OpResult::Cancelled | OpResult::Abandoned)
    }
}

/// One planned operation through a pass: the gate's verdict, and what came
/// of it. Everything that kept it from being sent is one of the two: a
/// verdict given before the pass sent anything, or a result it came back
/// with (blocked by a deletion that failed, cut off by the fence).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpRecord {
    /// The gate's verdict.
    pub verdict: Verdict,
    /// What came of it; `None` until the executor has recorded it.
    pub result: Option<OpResult>,
}

impl OpRecord {
    /// The class of answer the operation counts as having had, when it is
    /// not done: the cloud's failure, or the refusal its verdict gives in
    /// the cloud's place ([`policy::refusal`]).
    pub fn refused(&self) -> Option<ErrorKind> {
        match &self.result {
            Some(OpResult::Failed(e)) => Some(e.kind),
            Some(OpResult::NotSent) => policy::refusal(&self.verdict),
            _ => None,
        }
    }

    /// [`OpRecord::refused`], with the answer's retry-after and its text.
    pub fn refusal(&self, now: Instant) -> Option<(ErrorKind, Option<Duration>, String)> {
        match &self.result {
            Some(OpResult::Failed(e)) => Some((e.kind, e.retry_after, e.to_string())),
            _ => self
                .refused()
                .map(|k| (k, None, self.verdict.describe(now))),
        }
    }
}

/// A pass's operations, one record each, by key: the gate writes the
/// verdicts, the executor the results, and absorb, status, warnings and
/// latency read them.
#[derive(Debug, Default, Clone)]
pub struct OpRecords {
    records: HashMap<OpKey, OpRecord>,
}

/// What a release build answers for an operation no result was recorded
/// for (a bug: see [`OpRecords::of`]).
static NO_RESULT: OpResult = OpResult::NotSent;

impl OpRecords {
    /// The records of `plan`'s operations with their verdicts from
    /// `gated`: [`OpResult::NotSent`] for those it keeps back, no result yet
    /// for those it lets run.
    pub fn gated(plan: &Plan, gated: &Gated) -> Self {
        let mut records = HashMap::new();
        for key in plan
            .deletions
            .iter()
            .map(Deletion::key)
            .chain(plan.creations.iter().map(Creation::key))
        {
            let verdict = gated.verdict(&key).cloned();
            debug_assert!(verdict.is_some(), "the gate gave {key} no verdict");
            let verdict = verdict.unwrap_or_else(|| {
                error!(operation = %key, "the gate gave this operation no verdict; it is not sent");
                Verdict::Blocked { by: Vec::new() }
            });
            // What the verdict keeps back has its result now; the executor
            // records the others'.
            let result = (!verdict.runs()).then_some(OpResult::NotSent);
            records.insert(key, OpRecord { verdict, result });
        }
        Self { records }
    }

    /// The result of operation `key`, one of the plan the pass executed.
    ///
    /// The executor records a result for every planned operation, sent or
    /// not, so a key without one was never planned or was dropped by a
    /// bug: a debug build panics, rather than passing it off as not sent;
    /// a release build logs it and answers [`OpResult::NotSent`].
    pub fn of(&self, key: &OpKey) -> &OpResult {
        let r = self.records.get(key).and_then(|r| r.result.as_ref());
        debug_assert!(
            r.is_some(),
            "no result recorded for {key}: asked about an operation that was not planned or not executed"
        );
        r.unwrap_or_else(|| {
            error!(operation = %key, "no result recorded for this operation; taking it as not sent");
            &NO_RESULT
        })
    }

    /// The record of operation `key`.
    pub fn record(&self, key: &OpKey) -> Option<&OpRecord> {
        self.records.get(key)
    }

    /// The result of creation `c`.
    pub fn creation(&self, c: &Creation) -> &OpResult {
        self.of(&c.key())
    }

    /// The result of deletion `d`.
    pub fn deletion(&self, d: &Deletion) -> &OpResult {
        self.of(&d.key())
    }

    /// Records the result of operation `key`; an operation the gate did
    /// not see (tests) counts as let run.
    pub fn set(&mut self, key: OpKey, result: OpResult) {
        self.records
            .entry(key)
            .or_insert(OpRecord {
                verdict: Verdict::Run,
                result: None,
            })
            .result = Some(result);
    }

    /// Every result, in no particular order.
    pub fn results(&self) -> impl Iterator<Item = (&OpKey, &OpResult)> {
        self.records
            .iter()
            .filter_map(|(k, r)| r.result.as_ref().map(|r| (k, r)))
    }

    /// Number of successful mutations.
    pub fn changed(&self) -> usize {
        self.results().filter(|(_, r)| r.is_done()).count()
    }

    /// How many operations the fence cut off.
    pub fn fenced(&self) -> usize {
        self.results().filter(|(_, r)| r.is_fenced()).count()
    }

    /// Any operation failed, or was refused by its verdict in the cloud's
    /// place.
    pub fn any_failed(&self) -> bool {
        self.records.values().any(|r| r.refused().is_some())
    }

    /// Operations not done by the end of the pass.
    pub fn pending(&self) -> usize {
        self.results().filter(|(_, r)| !r.is_done()).count()
    }
}

/// Whether this replica writes: the one switch of `--dry-run`, read where
/// a write would start (the executor's cloud changes and prerequisite
/// repairs, [`crate::status`]'s condition patches and Events) and nowhere
/// else; reads (listings, prerequisite checks, the Node watch) go on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Writes {
    /// Changes the cloud and the cluster (the default).
    #[default]
    Allowed,
    /// Plans, reads and reports; writes nothing (`--dry-run`).
    DryRun,
}

impl Writes {
    /// Nothing is written.
    pub fn dry_run(self) -> bool {
        self == Writes::DryRun
    }
}

/// Runs plans against one cloud.
pub struct Executor {
    cloud: Arc<dyn CloudRoutes>,
    cluster: String,
    gate: Arc<Throttle>,
    fence: Fence,
    metrics: MetricsHandle,
    writes: Writes,
}

impl Executor {
    /// An executor for `cluster` on `cloud`; it checks `fence` before every
    /// call and reports its waits at the throttle to `metrics`.
    pub fn new(
        cloud: Arc<dyn CloudRoutes>,
        cluster: impl Into<String>,
        fence: Fence,
        metrics: MetricsHandle,
    ) -> Self {
        Self {
            cloud,
            cluster: cluster.into(),
            gate: Arc::new(Throttle::default()),
            fence,
            metrics,
            writes: Writes::Allowed,
        }
    }

    /// Sets whether this executor writes (`--dry-run`: it sends nothing).
    pub fn set_writes(&mut self, writes: Writes) {
        self.writes = writes;
    }

    /// Whether this executor writes.
    pub fn writes(&self) -> Writes {
        self.writes
    }

    /// The provider.
    pub fn cloud(&self) -> &Arc<dyn CloudRoutes> {
        &self.cloud
    }

    /// The fence this executor checks.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// Lists the cloud's routes (through the throttle).
    pub async fn list(&self) -> Result<Vec<Route>, CloudError> {
        let ticket = self.wait_gate().await;
        let r = self.cloud.list_routes(&self.cluster).await;
        note(ticket, r.as_ref().map(|_| ()));
        r
    }

    /// Looks up the route targets again (through the throttle); `None`
    /// when the provider's targets are fixed by configuration.
    pub async fn discover_targets(&self) -> Result<Option<Vec<route_core::Text>>, CloudError> {
        let ticket = self.wait_gate().await;
        let r = self.cloud.discover_targets(&self.cluster).await;
        note(ticket, r.as_ref().map(|_| ()));
        r
    }

    /// Checks the forwarding prerequisite of `nodes` (through the throttle
    /// gate, inside the fence: a repair is a write). Under `--dry-run` it
    /// only reads: what it would repair answers
    /// [`route_cloud::Forwarding::WouldRepair`].
    pub async fn check_forwarding(
        &self,
        nodes: &[Arc<route_core::NodeView>],
        mut check: route_cloud::ForwardingCheck,
    ) -> Result<Vec<(String, route_cloud::Forwarding)>, CloudError> {
        check.repair &= !self.writes.dry_run();
        let ticket = self.fence.guard(self.wait_gate()).await?;
        self.fence.check()?;
        let r = self
            .fence
            .guard(self.cloud.check_forwarding(&self.cluster, nodes, check))
            .await?;
        note(ticket, r.as_ref().map(|_| ()));
        r
    }

    async fn wait_gate(&self) -> Ticket<'_> {
        let t = self.gate.pass().await;
        if !t.held.is_zero() {
            self.metrics.throttle_waited(t.held);
        }
        t
    }

    /// Executes the operations of `plan` that `gated` lets run; the others
    /// are recorded as not sent, their verdict saying why. Under
    /// `--dry-run` nothing is sent: those the gate lets run are
    /// [`OpResult::DryRun`].
    pub async fn execute(&self, plan: &Plan, gated: &Gated) -> OpRecords {
        let mut out = OpRecords::gated(plan, gated);
        if self.writes.dry_run() {
            for r in out.records.values_mut().filter(|r| r.result.is_none()) {
                r.result = Some(OpResult::DryRun);
            }
        } else if self.cloud.capabilities().supports_batch {
            self.execute_batch(plan, gated, &mut out).await;
        } else {
            self.execute_each(plan, gated, &mut out).await;
        }
        debug_assert!(
            out.records.values().all(|r| r.result.is_some()),
            "an operation the gate let run has no result"
        );
        out
    }

    async fn execute_each(&self, plan: &Plan, gated: &Gated, out: &mut OpRecords) {
        let permits = Arc::new(Semaphore::new(
            self.cloud.capabilities().max_concurrent_operations.max(1),
        ));
        let runs = |key: &OpKey| gated.runs(key);
        let deletions = plan
            .deletions
            .iter()
            .map(|d| (d.key(), d))
            .filter(|(k, _)| runs(k))
            .map(|(key, d)| {
                let permits = permits.clone();
                async move {
                    let _p = permits.acquire().await;
                    (key, self.delete(&d.route).await)
                }
            });
        let (independent, dependent): (Vec<_>, Vec<_>) = plan
            .creations
            .iter()
            .map(|c| (c.key(), c))
            .filter(|(k, _)| runs(k))
            .partition(|(_, c)| c.after.is_empty());
        let first = independent.into_iter().map(|(key, c)| {
            let permits = permits.clone();
            async move {
                let _p = permits.acquire().await;
                (key, self.create(&c.node_uid, &c.route).await)
            }
        });
        let (deleted, created) = futures::join!(join_all(deletions), join_all(first));
        for (key, r) in deleted.into_iter().chain(created) {
            out.set(key, r);
        }
        let out_ref = &*out;
        let then = dependent.into_iter().map(|(key, c)| {
            let permits = permits.clone();
            async move {
                if !c.after.iter().all(|d| out_ref.of(d).is_done()) {
                    return (key, OpResult::Blocked);
                }
                let _p = permits.acquire().await;
                (key, self.create(&c.node_uid, &c.route).await)
            }
        });
        let results = join_all(then).await;
        for (key, r) in results {
            out.set(key, r);
        }
    }

    async fn execute_batch(&self, plan: &Plan, gated: &Gated, out: &mut OpRecords) {
        // The gate blocked every creation whose deletions do not run, so a
        // dependent creation rides along with its deletions: a batch applies
        // deletions first.
        let deletions: Vec<(OpKey, &Deletion)> = plan
            .deletions
            .iter()
            .map(|d| (d.key(), d))
            .filter(|(k, _)| gated.runs(k))
            .collect();
        let creations: Vec<(OpKey, &Creation)> = plan
            .creations
            .iter()
            .map(|c| (c.key(), c))
            .filter(|(k, _)| gated.runs(k))
            .collect();
        if deletions.is_empty() && creations.is_empty() {
            return;
        }
        let batch = Batch {
            delete: deletions
                .iter()
                .map(|(k, d)| (k.clone(), d.route.clone()))
                .collect(),
            create: creations
                .iter()
                .map(|(k, c)| (k.clone(), c.node_uid.clone(), c.route.clone()))
                .collect(),
        };
        let all = |out: &mut OpRecords, r: &OpResult| {
            for (k, _) in &deletions {
                out.set(k.clone(), r.clone());
            }
            for (k, _) in &creations {
                out.set(k.clone(), r.clone());
            }
        };
        let Ok(ticket) = self.fence.guard(self.wait_gate()).await else {
            all(out, &OpResult::Cancelled);
            return;
        };
        // Checked here rather than inside the guard below, so a batch the
        // fence refuses outright is known not to have been sent.
        if self.fence.check().is_err() {
            all(out, &OpResult::Cancelled);
            return;
        }
        let started = Instant::now();
        let span = info_span!(
            "cloud",
            op = "batch",
            deletions = deletions.len(),
            creations = creations.len()
        );
        let answer = match self
            .fence
            .guard(self.cloud.apply_batch(&self.cluster, &batch))
            .instrument(span)
            .await
        {
            Ok(Err(e)) if e.kind == ErrorKind::Fenced => {
                // The provider's own check after a wait of its own: not sent.
                info!(reason = %e.message, "batch route update not sent; it is redone once this replica may write again");
                all(out, &OpResult::Cancelled);
                return;
            }
            Ok(a) => a,
            Err(e) => {
                info!(reason = %e.message, "batch route update abandoned; it is redone after a fresh list");
                all(out, &OpResult::Abandoned);
                return;
            }
        };
        match answer {
            Ok(mut results) => {
                // A provider writing several tables answers each table's
                // failure inside the results (OpenStack with several
                // routers): a throttled write must still slow the gate
                // down, or its changes, due again at once, spin the loop.
                let throttled = deletions
                    .iter()
                    .map(|(k, _)| k)
                    .chain(creations.iter().map(|(k, _)| k))
                    .filter_map(|k| results.get(k))
                    .find_map(|r| r.as_ref().err().filter(|e| paces(e)));
                match throttled {
                    Some(e) => note(ticket, Err(e)),
                    None => ticket.succeeded(),
                }
                // Each change takes its own answer, by the key it was sent
                // under.
                for (key, del) in &deletions {
                    let r = batch_result(key, results.remove(key));
                    log_op("delete", &del.route, &r, started);
                    out.set(key.clone(), r);
                }
                for (key, cre) in &creations {
                    let r = match batch_result(key, results.remove(key)) {
                        OpResult::Done(None) => OpResult::Done(Some(cre.route.clone())),
                        r => r,
                    };
                    log_op("create", &cre.route, &r, started);
                    out.set(key.clone(), r);
                }
                // An answer for a change that was not sent names nothing
                // to record it under. A provider that mangled a key also
                // left the change it was sent for unanswered, which is
                // then of unknown outcome: the table is listed again.
                debug_assert!(
                    results.is_empty(),
                    "the batch answer has results for changes not sent: {:?}",
                    results.keys().collect::<Vec<_>>()
                );
                if !results.is_empty() {
                    error!(
                        results = results.len(),
                        "the batch answer has results for changes that were not sent; ignoring them"
                    );
                }
                // A creation whose deletion failed inside the batch is
                // blocked, when that is why it failed (the old route is
                // still there). A refusal of its own (a stopped instance, a
                // full table) keeps its answer: the retry book must see it,
                // or the creation goes out again at the next pass.
                for (key, cre) in &creations {
                    let own_refusal = matches!(
                        out.of(key),
                        OpResult::Failed(e) if !policy::of(e.kind).explained_by_failed_deletion
                    );
                    if !cre.after.iter().all(|d| out.of(d).is_done())
                        && !out.of(key).is_done()
                        && !own_refusal
                    {
                        out.set(key.clone(), OpResult::Blocked);
                    }
                }
            }
            Err(e) => {
                note(ticket, Err(&e));
                warn!(error = %e, deletions = deletions.len(), creations = creations.len(), "batch route update failed");
                all(out, &OpResult::Failed(e));
            }
        }
    }

    async fn delete(&self, route: &Route) -> OpResult {
        // The gate may hold a call for a long time: the fence is checked
        // again after it, and the call abandoned if the fence closes while
        // it is waiting inside the provider or in flight.
        let Ok(ticket) = self.fence.guard(self.wait_gate()).await else {
            return OpResult::Cancelled;
        };
        if let Err(e) = self.fence.check() {
            return cancelled("delete", route, &e, OpResult::Cancelled);
        }
        let started = Instant::now();
        let span = info_span!("cloud", op = "delete", node = %route.node, destination = %route.destination);
        let answer = self
            .fence
            .guard(self.cloud.delete_route(&self.cluster, route))
            .instrument(span)
            .await;
        let r = match answer {
            Err(e) => return cancelled("delete", route, &e, OpResult::Abandoned),
            // The provider's own fence check after a wait of its own: not sent.
            Ok(Err(e)) if e.kind == ErrorKind::Fenced => {
                return cancelled("delete", route, &e, OpResult::Cancelled);
            }
            Ok(Ok(())) => {
                ticket.succeeded();
                OpResult::Done(None)
            }
            Ok(Err(e)) => {
                note(ticket, Err(&e));
                OpResult::Failed(e)
            }
        };
        log_op("delete", route, &r, started);
        r
    }

    async fn create(&self, hint: &str, route: &Route) -> OpResult {
        let Ok(ticket) = self.fence.guard(self.wait_gate()).await else {
            return OpResult::Cancelled;
        };
        if let Err(e) = self.fence.check() {
            return cancelled("create", route, &e, OpResult::Cancelled);
        }
        let started = Instant::now();
        let span = info_span!("cloud", op = "create", node = %route.node, destination = %route.destination);
        let answer = self
            .fence
            .guard(self.cloud.create_route(&self.cluster, hint, route))
            .instrument(span)
            .await;
        let r = match answer {
            Err(e) => return cancelled("create", route, &e, OpResult::Abandoned),
            // The provider's own fence check after a wait of its own: not sent.
            Ok(Err(e)) if e.kind == ErrorKind::Fenced => {
                return cancelled("create", route, &e, OpResult::Cancelled);
            }
            Ok(Ok(created)) => {
                ticket.succeeded();
                OpResult::Done(Some(created))
            }
            Ok(Err(e)) => {
                note(ticket, Err(&e));
                OpResult::Failed(e)
            }
        };
        log_op("create", route, &r, started);
        r
    }
}

/// The answer refuses the rate, not the change: the throttle closes until
/// its retry-after ([`policy::Retry::Paced`]).
fn paces(e: &CloudError) -> bool {
    policy::of(e.kind).retry == policy::Retry::Paced
}

/// Tells the gate how the cloud answered.
fn note(ticket: Ticket<'_>, r: Result<(), &CloudError>) {
    match r {
        Ok(()) => ticket.succeeded(),
        Err(e) if paces(e) => {
            ticket.throttled(e.retry_after.unwrap_or(Duration::from_secs(1)));
        }
        Err(_) => ticket.answered(),
    }
}

fn cancelled(op: &str, route: &Route, e: &CloudError, r: OpResult) -> OpResult {
    let what = if r == OpResult::Abandoned {
        "route change abandoned without its answer; it is redone after a fresh list once this replica may write again"
    } else {
        "route change not sent; it is redone once this replica may write again"
    };
    info!(
        operation = op,
        node = %route.node,
        destination = %route.destination,
        reason = %e.message,
        "{what}"
    );
    r
}

/// The result of the change sent under `key`, from its entry in the batch
/// answer. A change the provider left unanswered (a provider bug, which a
/// debug build, a test, panics on) has an unknown outcome: the table is
/// listed again before it is redone.
fn batch_result(key: &OpKey, answer: Option<Result<Option<Route>, CloudError>>) -> OpResult {
    debug_assert!(answer.is_some(), "the batch answer has no result for {key}");
    match answer {
        Some(r) => to_result(r),
        None => {
            error!(operation = %key, "the batch answer has no result for this change; treating its outcome as unknown");
            OpResult::Failed(CloudError::new(
                ErrorKind::Timeout,
                format!(
                    "the batch answer has no result for {key}; treating the outcome as unknown"
                ),
            ))
        }
    }
}

fn to_result(r: Result<Option<Route>, CloudError>) -> OpResult {
    match r {
        Ok(route) => OpResult::Done(route),
        Err(e) => OpResult::Failed(e),
    }
}

fn log_op(op: &str, route: &Route, r: &OpResult, started: Instant) {
    let elapsed_ms = started.elapsed().as_millis() as u64;
    match r {
        OpResult::Done(_) => info!(
            operation = op,
            node = %route.node,
            destination = %route.destination,
            elapsed_ms,
            result = "ok",
            "{op}d route"
        ),
        OpResult::Failed(e) => warn!(
            operation = op,
            node = %route.node,
            destination = %route.destination,
            elapsed_ms,
            result = e.kind.as_str(),
            error = %e.message,
            "could not {op} route"
        ),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::{Gated, Room, Verdict};
    use crate::retry::{BackoffConfig, RetryBook};
    use provider_memory::{MemoryCloud, MemoryConfig, Operation};
    use route_core::{Cidr, NodeView, PlanConfig};

    const CLUSTER: &str = "c";

    fn cidr(s: &str) -> Cidr {
        Cidr::parse(s).unwrap()
    }

    fn cloud(cfg: MemoryConfig) -> Arc<MemoryCloud> {
        Arc::new(MemoryCloud::new(cfg).unwrap())
    }

    fn executor(cloud: &Arc<MemoryCloud>, fence: Fence) -> Executor {
        Executor::new(cloud.clone(), CLUSTER, fence, MetricsHandle::default())
    }

    fn nodes(n: usize) -> Vec<Arc<NodeView>> {
        (0..n)
            .map(|i| {
                Arc::new(NodeView::new(
                    format!("n{i}"),
                    format!("uid-{i}"),
                    &[format!("10.0.{i}.0/24").as_str()],
                ))
            })
            .collect()
    }

    fn plan(nodes: &[Arc<NodeView>], routes: &[Route]) -> Plan {
        route_core::plan(
            nodes,
            routes,
            &PlanConfig {
                cluster_cidrs: vec![cidr("10.0.0.0/16")],
                ..PlanConfig::default()
            },
        )
    }

    /// The gate's verdicts for `plan` with no history, under `room`.
    fn gated(plan: &Plan, book: &RetryBook, room: &Room) -> Gated {
        let mut holds = crate::gate::Holds::new(Duration::ZERO, Duration::from_secs(300));
        crate::gate::gate(plan, &mut holds, book, room, Instant::now(), true)
    }

    fn calls(cloud: &MemoryCloud, op: Operation) -> usize {
        cloud.log().iter().filter(|c| c.op == op).count()
    }

    #[tokio::test(start_paused = true)]
    async fn creations_that_cannot_fit_are_refused_locally_without_a_request() {
        let cloud = cloud(MemoryConfig {
            max_routes: Some(2),
            ..MemoryConfig::default()
        });
        let ex = executor(&cloud, Fence::new(true));
        let p = plan(&nodes(3), &[]);
        let book = RetryBook::new(BackoffConfig::default());
        let room = Room::new(cloud.capabilities().max_routes, false, &[]);
        let out = ex.execute(&p, &gated(&p, &book, &room)).await;
        let refused: Vec<&OpRecord> = p
            .creations
            .iter()
            .filter_map(|c| out.record(&c.key()))
            .filter(|r| matches!(r.verdict, Verdict::NoRoom { max: 2, .. }))
            .collect();
        assert_eq!(refused.len(), 1, "{out:?}");
        assert_eq!(refused[0].result, Some(OpResult::NotSent));
        assert_eq!(
            refused[0].refusal(Instant::now()).map(|r| r.0),
            Some(ErrorKind::QuotaExceeded),
            "it counts as the cloud's quota refusal"
        );
        assert!(out.any_failed());
        assert_eq!(
            calls(&cloud, Operation::Create),
            2,
            "the third is never sent"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn held_and_backed_off_operations_are_deferred_not_sent() {
        let cloud = cloud(MemoryConfig::default());
        let ex = executor(&cloud, Fence::new(true));
        let p = plan(&nodes(3), &[]);
        let mut book = RetryBook::new(BackoffConfig::default());
        let e = CloudError::new(ErrorKind::Transient, "boom");
        book.failed(p.creations[1].key(), &e, Instant::now(), 0.5);
        let mut gated = gated(&p, &book, &Room::unlimited());
        gated.set(
            p.creations[2].key(),
            Verdict::Held {
                until: Instant::now() + Duration::from_secs(1),
                why: crate::gate::Hold::DeletionGrace,
            },
        );
        let out = ex.execute(&p, &gated).await;
        assert!(out.creation(&p.creations[0]).is_done());
        assert_eq!(
            *out.creation(&p.creations[1]),
            OpResult::NotSent,
            "in backoff"
        );
        assert_eq!(*out.creation(&p.creations[2]), OpResult::NotSent, "held");
        assert_eq!(calls(&cloud, Operation::Create), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_fence_sends_nothing() {
        let cloud = cloud(MemoryConfig::default());
        let ex = executor(&cloud, Fence::new(false));
        let p = plan(&nodes(2), &[]);
        let out = ex.execute(&p, &Gated::run_all(&p)).await;
        assert!(
            p.creations
                .iter()
                .all(|c| *out.creation(c) == OpResult::Cancelled),
            "{out:?}"
        );
        assert!(cloud.log().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_replacement_waits_for_its_deletion_and_is_blocked_when_it_fails() {
        let cloud = cloud(MemoryConfig::default());
        let ex = executor(&cloud, Fence::new(true));
        let nodes = nodes(1);
        let mut hole = Route::new("n0", cidr("10.0.0.0/24"));
        hole.blackhole = true;
        cloud.insert_route(CLUSTER, hole.clone());
        let table = [hole];
        let p = plan(&nodes, &table);
        assert_eq!((p.deletions.len(), p.creations.len()), (1, 1));
        assert_eq!(
            p.creations[0].after,
            vec![p.deletions[0].key()],
            "the creation follows the deletion"
        );
        cloud.fail_next(Operation::Delete, 1, ErrorKind::Transient);
        let out = ex.execute(&p, &Gated::run_all(&p)).await;
        assert!(matches!(out.deletion(&p.deletions[0]), OpResult::Failed(_)));
        assert_eq!(*out.creation(&p.creations[0]), OpResult::Blocked);
        assert_eq!(calls(&cloud, Operation::Create), 0);
        let out = ex.execute(&p, &Gated::run_all(&p)).await;
        assert!(
            out.deletion(&p.deletions[0]).is_done() && out.creation(&p.creations[0]).is_done(),
            "{out:?}"
        );
        let ops: Vec<Operation> = cloud.log().iter().map(|c| c.op).collect();
        assert_eq!(
            ops,
            [Operation::Delete, Operation::Delete, Operation::Create],
            "the creation went out only after its deletion landed"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_batching_provider_gets_the_whole_plan_in_one_call() {
        let cloud = cloud(MemoryConfig {
            supports_batch: true,
            ..MemoryConfig::default()
        });
        let ex = executor(&cloud, Fence::new(true));
        cloud.insert_route(CLUSTER, Route::new("gone", cidr("10.0.99.0/24")));
        let listed = ex.list().await.unwrap();
        let p = plan(&nodes(3), &listed);
        let out = ex.execute(&p, &Gated::run_all(&p)).await;
        assert_eq!(out.changed(), 4, "{out:?}");
        assert_eq!(calls(&cloud, Operation::Batch), 1);
        assert_eq!(cloud.routes(CLUSTER).len(), 3);
    }

    /// A batching memory cloud whose batch answers a test garbles.
    struct Garbling {
        inner: Arc<MemoryCloud>,
        garble: fn(&Batch, &mut route_cloud::BatchResult),
    }

    #[async_trait::async_trait]
    impl CloudRoutes for Garbling {
        fn name(&self) -> &'static str {
            "garbling"
        }

        fn capabilities(&self) -> route_cloud::Capabilities {
            self.inner.capabilities()
        }

        fn stats(&self) -> &route_cloud::RequestStats {
            self.inner.stats()
        }

        async fn list_routes(&self, cluster: &str) -> Result<Vec<Route>, CloudError> {
            self.inner.list_routes(cluster).await
        }

        async fn create_route(
            &self,
            cluster: &str,
            name_hint: &str,
            route: &Route,
        ) -> Result<Route, CloudError> {
            self.inner.create_route(cluster, name_hint, route).await
        }

        async fn delete_route(&self, cluster: &str, route: &Route) -> Result<(), CloudError> {
            self.inner.delete_route(cluster, route).await
        }

        async fn apply_batch(
            &self,
            cluster: &str,
            batch: &Batch,
        ) -> Result<route_cloud::BatchResult, CloudError> {
            let mut r = self.inner.apply_batch(cluster, batch).await?;
            (self.garble)(batch, &mut r);
            Ok(r)
        }
    }

    /// Runs a plan of one deletion and three creations against a batching
    /// cloud that garbles its answers with `garble`.
    async fn garbled(garble: fn(&Batch, &mut route_cloud::BatchResult)) -> (Plan, OpRecords) {
        let inner = cloud(MemoryConfig {
            supports_batch: true,
            ..MemoryConfig::default()
        });
        inner.insert_route(CLUSTER, Route::new("gone", cidr("10.0.99.0/24")));
        let ex = Executor::new(
            Arc::new(Garbling { inner, garble }),
            CLUSTER,
            Fence::new(true),
            MetricsHandle::default(),
        );
        let listed = ex.list().await.unwrap();
        let p = plan(&nodes(3), &listed);
        let out = ex.execute(&p, &Gated::run_all(&p)).await;
        (p, out)
    }

    /// Leaves the answer of the batch's first creation out.
    fn drop_first_creation(batch: &Batch, r: &mut route_cloud::BatchResult) {
        r.remove(&batch.create[0].0);
    }

    #[cfg(debug_assertions)]
    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "the batch answer has no result for create 10.0.0.0/24")]
    async fn a_change_the_batch_answer_leaves_out_fails_a_test() {
        garbled(drop_first_creation).await;
    }

    #[cfg(not(debug_assertions))]
    #[tokio::test(start_paused = true)]
    async fn a_change_the_batch_answer_leaves_out_has_an_unknown_outcome() {
        let (p, out) = garbled(drop_first_creation).await;
        assert!(
            matches!(out.creation(&p.creations[0]), OpResult::Failed(e) if policy::of(e.kind).uncertain),
            "{out:?}"
        );
        assert!(out.deletion(&p.deletions[0]).is_done(), "{out:?}");
        assert!(
            p.creations[1..].iter().all(|c| out.creation(c).is_done()),
            "{out:?}"
        );
    }

    #[cfg(debug_assertions)]
    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "the batch answer has results for changes not sent")]
    async fn an_answer_for_a_change_not_sent_fails_a_test() {
        garbled(|batch, r| {
            let (_, hint, route) = &batch.create[0];
            let stray = OpKey::Create {
                node_uid: format!("{hint}-other"),
                destination: route.destination.clone(),
                table: route.table.clone(),
            };
            r.insert(stray, Ok(None));
        })
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn every_planned_operation_gets_a_result_sent_or_not() {
        let cloud = cloud(MemoryConfig::default());
        let ex = executor(&cloud, Fence::new(true));
        let p = plan(&nodes(3), &[]);
        let mut gated = Gated::run_all(&p);
        gated.set(
            p.creations[1].key(),
            Verdict::Held {
                until: Instant::now() + Duration::from_secs(1),
                why: crate::gate::Hold::DeletionGrace,
            },
        );
        let out = ex.execute(&p, &gated).await;
        assert_eq!(out.results().count(), p.creations.len(), "{out:?}");
        assert_eq!(*out.creation(&p.creations[1]), OpResult::NotSent);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "no result recorded for create 10.0.0.0/24")]
    fn asking_about_an_operation_that_was_not_planned_fails_a_test() {
        let p = plan(&nodes(1), &[]);
        let _ = OpRecords::default().creation(&p.creations[0]);
    }
}
