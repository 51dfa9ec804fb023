//! Executing a plan against the cloud.
//!
//! The executor owns no state between passes: the retry book and the route
//! cache belong to the reconcile loop, which hands them in. It runs the plan's
//! deletions and the creations that depend on nothing concurrently, bounded by
//! the provider's `max_concurrent_operations`; a creation that must follow a
//! deletion (address change, blackhole replacement) starts only after that
//! deletion succeeded. Providers that take batches get the whole plan in one
//! call. A throttled answer closes a shared [`ThrottleGate`] until its
//! retry-after, so the rest of the pass waits instead of piling more requests
//! on the cloud.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
pub use route_cloud::Fence;
use route_cloud::{Batch, CloudError, CloudRoutes, ErrorKind};
use route_core::{Plan, Route};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::hold::Held;
use crate::metrics::MetricsHandle;
use crate::retry::{OpKey, RetryBook};
use crate::throttle::{ThrottleGate, Ticket};

/// The result of one planned operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    /// Done; for creations, the route as the cloud now lists it.
    Done(Option<Route>),
    /// The cloud refused or failed.
    Failed(CloudError),
    /// Waiting for its backoff; not attempted.
    Deferred,
    /// A deletion it depends on did not succeed in this pass.
    Blocked,
    /// Not sent: the fence was closed (leadership lost, renew deadline
    /// passed, shutting down). Redone once this replica may write again.
    Cancelled,
    /// Possibly sent, its answer abandoned when the fence closed: whether
    /// it took effect is unknown, so the table is listed before it is redone.
    Abandoned,
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

/// What a pass did.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    /// One result per `plan.deletions`.
    pub deletions: Vec<OpResult>,
    /// One result per `plan.creations`.
    pub creations: Vec<OpResult>,
}

impl Outcome {
    /// Number of successful mutations.
    pub fn changed(&self) -> usize {
        self.deletions
            .iter()
            .chain(&self.creations)
            .filter(|r| r.is_done())
            .count()
    }

    /// How many operations the fence cut off.
    pub fn fenced(&self) -> usize {
        self.deletions
            .iter()
            .chain(&self.creations)
            .filter(|r| r.is_fenced())
            .count()
    }

    /// Any operation failed.
    pub fn any_failed(&self) -> bool {
        self.deletions
            .iter()
            .chain(&self.creations)
            .any(|r| matches!(r, OpResult::Failed(_)))
    }
}

/// Runs plans against one cloud.
pub struct Executor {
    cloud: Arc<dyn CloudRoutes>,
    cluster: String,
    gate: Arc<ThrottleGate>,
    fence: Fence,
    metrics: MetricsHandle,
}

impl Executor {
    /// An executor for `cluster` on `cloud`; it checks `fence` before every
    /// call and reports its waits at the throttle gate to `metrics`.
    pub fn new(
        cloud: Arc<dyn CloudRoutes>,
        cluster: impl Into<String>,
        fence: Fence,
        metrics: MetricsHandle,
    ) -> Self {
        Self {
            cloud,
            cluster: cluster.into(),
            gate: Arc::new(ThrottleGate::default()),
            fence,
            metrics,
        }
    }

    /// The provider.
    pub fn cloud(&self) -> &Arc<dyn CloudRoutes> {
        &self.cloud
    }

    /// The fence this executor checks.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// Lists the cloud's routes (through the throttle gate).
    pub async fn list(&self) -> Result<Vec<Route>, CloudError> {
        let ticket = self.wait_gate().await;
        let r = self.cloud.list_routes(&self.cluster).await;
        note(ticket, r.as_ref().map(|_| ()));
        r
    }

    /// Looks up the route targets again (through the throttle gate); `None`
    /// when the provider's targets are fixed by configuration.
    pub async fn discover_targets(&self) -> Result<Option<Vec<route_core::Text>>, CloudError> {
        let ticket = self.wait_gate().await;
        let r = self.cloud.discover_targets(&self.cluster).await;
        note(ticket, r.as_ref().map(|_| ()));
        r
    }

    /// Checks the forwarding prerequisite of `nodes` (through the throttle
    /// gate, inside the fence: a repair is a write).
    pub async fn check_forwarding(
        &self,
        nodes: &[Arc<route_core::NodeView>],
        check: route_cloud::ForwardingCheck,
    ) -> Result<Vec<(String, route_cloud::Forwarding)>, CloudError> {
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

    /// Executes `plan`, skipping operations whose backoff is not due in
    /// `book` and those `held` back. `table` is the route table the plan was
    /// made from: with a provider route limit (per route target), creations
    /// that cannot fit are refused here, without spending a request on a
    /// certain refusal.
    pub async fn execute(
        &self,
        plan: &Plan,
        book: &RetryBook,
        held: &Held,
        table: &[Route],
    ) -> Outcome {
        let now = Instant::now();
        let caps = self.cloud.capabilities();
        let is_held = |flags: &[bool], i: usize| flags.get(i).copied().unwrap_or(false);
        let del_due: Vec<bool> = plan
            .deletions
            .iter()
            .enumerate()
            .map(|(i, d)| !is_held(&held.deletions, i) && book.is_due(&OpKey::delete(d), now))
            .collect();
        let mut cre_due: Vec<bool> = plan
            .creations
            .iter()
            .enumerate()
            .map(|(i, c)| !is_held(&held.creations, i) && book.is_due(&OpKey::create(c), now))
            .collect();
        let mut over_limit = vec![false; plan.creations.len()];
        if let Some(max) = caps.max_routes {
            // Room per route target. Only deletions attempted in this pass
            // may free it; a held or backed-off one leaves its route in place.
            let mut used = table_sizes(table);
            for (d, due) in plan.deletions.iter().zip(&del_due) {
                if *due && let Some(n) = used.get_mut(d.route.target.as_str()) {
                    *n = n.saturating_sub(1);
                }
            }
            for (i, due) in cre_due.iter_mut().enumerate() {
                let c = &plan.creations[i];
                // A replacement in place takes no room.
                if !*due || c.replaces.is_some() {
                    continue;
                }
                let n = used.entry(c.route.target.as_str()).or_default();
                if *n >= max {
                    *due = false;
                    over_limit[i] = true;
                } else {
                    *n += 1;
                }
            }
        }
        let mut out = if caps.supports_batch {
            self.execute_batch(plan, &del_due, &cre_due).await
        } else {
            self.execute_each(plan, &del_due, &cre_due).await
        };
        for (i, over) in over_limit.into_iter().enumerate() {
            if over {
                let target = &plan.creations[i].route.target;
                let table = if target.is_empty() {
                    "the route table".to_string()
                } else {
                    format!("route table {target}")
                };
                out.creations[i] = OpResult::Failed(CloudError::new(
                    ErrorKind::QuotaExceeded,
                    format!(
                        "the {} provider allows at most {} routes and {table} is full; delete routes or raise the limit",
                        self.cloud.name(),
                        caps.max_routes.unwrap_or_default()
                    ),
                ));
            }
        }
        out
    }

    async fn execute_each(&self, plan: &Plan, del_due: &[bool], cre_due: &[bool]) -> Outcome {
        let permits = Arc::new(Semaphore::new(
            self.cloud.capabilities().max_concurrent_operations.max(1),
        ));
        let deletions = plan.deletions.iter().enumerate().map(|(i, d)| {
            let permits = permits.clone();
            async move {
                if !del_due[i] {
                    return OpResult::Deferred;
                }
                let _p = permits.acquire().await;
                self.delete(&d.route).await
            }
        });
        let independent = plan.creations.iter().enumerate().map(|(i, c)| {
            let permits = permits.clone();
            async move {
                if !c.after.is_empty() {
                    return None;
                }
                if !cre_due[i] {
                    return Some(OpResult::Deferred);
                }
                let _p = permits.acquire().await;
                Some(self.create(&c.name_hint, &c.route).await)
            }
        });
        let (deletions, first) = futures::join!(join_all(deletions), join_all(independent));
        let dependent = plan.creations.iter().enumerate().map(|(i, c)| {
            let permits = permits.clone();
            let deletions = &deletions;
            let already = first[i].clone();
            async move {
                if let Some(r) = already {
                    return r;
                }
                if !c.after.iter().all(|&d| deletions[d].is_done()) {
                    return OpResult::Blocked;
                }
                if !cre_due[i] {
                    return OpResult::Deferred;
                }
                let _p = permits.acquire().await;
                self.create(&c.name_hint, &c.route).await
            }
        });
        let creations = join_all(dependent).await;
        Outcome {
            deletions,
            creations,
        }
    }

    async fn execute_batch(&self, plan: &Plan, del_due: &[bool], cre_due: &[bool]) -> Outcome {
        let mut out = Outcome {
            deletions: vec![OpResult::Deferred; plan.deletions.len()],
            creations: vec![OpResult::Deferred; plan.creations.len()],
        };
        let del_idx: Vec<usize> = (0..plan.deletions.len()).filter(|&i| del_due[i]).collect();
        let mut cre_idx = Vec::new();
        for (i, c) in plan.creations.iter().enumerate() {
            if !cre_due[i] {
                continue;
            }
            // A batch applies deletions first, so a dependent creation may
            // ride along only if its deletions are in the same batch.
            if c.after.iter().all(|d| del_due[*d]) {
                cre_idx.push(i);
            } else {
                out.creations[i] = OpResult::Blocked;
            }
        }
        if del_idx.is_empty() && cre_idx.is_empty() {
            return out;
        }
        let batch = Batch {
            delete: del_idx
                .iter()
                .map(|&i| plan.deletions[i].route.clone())
                .collect(),
            create: cre_idx
                .iter()
                .map(|&i| {
                    (
                        plan.creations[i].name_hint.clone(),
                        plan.creations[i].route.clone(),
                    )
                })
                .collect(),
        };
        let cancel = |out: &mut Outcome, r: OpResult| {
            for &i in &del_idx {
                out.deletions[i] = r.clone();
            }
            for &i in &cre_idx {
                out.creations[i] = r.clone();
            }
        };
        let Ok(ticket) = self.fence.guard(self.wait_gate()).await else {
            cancel(&mut out, OpResult::Cancelled);
            return out;
        };
        // Checked here rather than inside the guard below, so a batch the
        // fence refuses outright is known not to have been sent.
        if self.fence.check().is_err() {
            cancel(&mut out, OpResult::Cancelled);
            return out;
        }
        let started = Instant::now();
        let answer = match self
            .fence
            .guard(self.cloud.apply_batch(&self.cluster, &batch))
            .await
        {
            Ok(Err(e)) if e.kind == ErrorKind::Fenced => {
                // The provider's own check after a wait of its own: not sent.
                info!(reason = %e.message, "batch route update not sent; it is redone once this replica may write again");
                cancel(&mut out, OpResult::Cancelled);
                return out;
            }
            Ok(a) => a,
            Err(e) => {
                info!(reason = %e.message, "batch route update abandoned; it is redone after a fresh list");
                cancel(&mut out, OpResult::Abandoned);
                return out;
            }
        };
        match answer {
            Ok(results) if results.len() == del_idx.len() + cre_idx.len() => {
                ticket.succeeded();
                let (d, c) = results.split_at(del_idx.len());
                for (&i, r) in del_idx.iter().zip(d) {
                    out.deletions[i] = to_result(r.clone());
                    log_op(
                        "delete",
                        &plan.deletions[i].route,
                        &out.deletions[i],
                        started,
                    );
                }
                for (&i, r) in cre_idx.iter().zip(c) {
                    let r = to_result(r.clone());
                    out.creations[i] = match (r, &plan.creations[i]) {
                        (OpResult::Done(None), cr) => OpResult::Done(Some(cr.route.clone())),
                        (r, _) => r,
                    };
                    log_op(
                        "create",
                        &plan.creations[i].route,
                        &out.creations[i],
                        started,
                    );
                }
                // A creation whose deletion failed inside the batch is blocked.
                for &i in &cre_idx {
                    if !plan.creations[i]
                        .after
                        .iter()
                        .all(|&d| out.deletions[d].is_done())
                        && !out.creations[i].is_done()
                    {
                        out.creations[i] = OpResult::Blocked;
                    }
                }
            }
            Ok(results) => {
                ticket.answered();
                let e = CloudError::new(
                    ErrorKind::Timeout,
                    format!(
                        "batch answer has {} results for {} changes; treating the outcome as unknown",
                        results.len(),
                        del_idx.len() + cre_idx.len()
                    ),
                );
                fail_all(&mut out, &del_idx, &cre_idx, &e);
            }
            Err(e) => {
                note(ticket, Err(&e));
                warn!(error = %e, deletions = del_idx.len(), creations = cre_idx.len(), "batch route update failed");
                fail_all(&mut out, &del_idx, &cre_idx, &e);
            }
        }
        out
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
        let answer = self
            .fence
            .guard(self.cloud.delete_route(&self.cluster, route))
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
        let answer = self
            .fence
            .guard(self.cloud.create_route(&self.cluster, hint, route))
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

/// How many routes each route target of `table` holds.
pub fn table_sizes(table: &[Route]) -> std::collections::HashMap<&str, usize> {
    let mut sizes = std::collections::HashMap::new();
    for r in table {
        *sizes.entry(r.target.as_str()).or_default() += 1;
    }
    sizes
}

/// Tells the gate how the cloud answered.
fn note(ticket: Ticket<'_>, r: Result<(), &CloudError>) {
    match r {
        Ok(()) => ticket.succeeded(),
        Err(e) if e.kind == ErrorKind::Throttled => {
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
        node = %route.target_node,
        destination = %route.destination,
        reason = %e.message,
        "{what}"
    );
    r
}

fn to_result(r: Result<Option<Route>, CloudError>) -> OpResult {
    match r {
        Ok(route) => OpResult::Done(route),
        Err(e) => OpResult::Failed(e),
    }
}

fn fail_all(out: &mut Outcome, del: &[usize], cre: &[usize], e: &CloudError) {
    for &i in del {
        out.deletions[i] = OpResult::Failed(e.clone());
    }
    for &i in cre {
        out.creations[i] = OpResult::Failed(e.clone());
    }
}

fn log_op(op: &str, route: &Route, r: &OpResult, started: Instant) {
    let elapsed_ms = started.elapsed().as_millis() as u64;
    match r {
        OpResult::Done(_) => info!(
            operation = op,
            node = %route.target_node,
            destination = %route.destination,
            elapsed_ms,
            result = "ok",
            "{op}d route"
        ),
        OpResult::Failed(e) => warn!(
            operation = op,
            node = %route.target_node,
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
    use crate::retry::BackoffConfig;
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

    fn nothing_held(plan: &Plan) -> Held {
        Held {
            deletions: vec![false; plan.deletions.len()],
            creations: vec![false; plan.creations.len()],
            ..Held::default()
        }
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
        let out = ex.execute(&p, &book, &nothing_held(&p), &[]).await;
        let refused: Vec<&OpResult> = out
            .creations
            .iter()
            .filter(|r| matches!(r, OpResult::Failed(e) if e.kind == ErrorKind::QuotaExceeded))
            .collect();
        assert_eq!(refused.len(), 1, "{out:?}");
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
        book.failed(OpKey::create(&p.creations[1]), &e, Instant::now(), 0.5);
        let mut held = nothing_held(&p);
        held.creations[2] = true;
        let out = ex.execute(&p, &book, &held, &[]).await;
        assert!(out.creations[0].is_done());
        assert_eq!(out.creations[1], OpResult::Deferred, "in backoff");
        assert_eq!(out.creations[2], OpResult::Deferred, "held");
        assert_eq!(calls(&cloud, Operation::Create), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_fence_sends_nothing() {
        let cloud = cloud(MemoryConfig::default());
        let ex = executor(&cloud, Fence::new(false));
        let p = plan(&nodes(2), &[]);
        let book = RetryBook::new(BackoffConfig::default());
        let out = ex.execute(&p, &book, &nothing_held(&p), &[]).await;
        assert!(
            out.creations.iter().all(|r| *r == OpResult::Cancelled),
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
            vec![0],
            "the creation follows the deletion"
        );
        cloud.fail_next(Operation::Delete, 1, ErrorKind::Transient);
        let book = RetryBook::new(BackoffConfig::default());
        let out = ex.execute(&p, &book, &nothing_held(&p), &table).await;
        assert!(matches!(out.deletions[0], OpResult::Failed(_)));
        assert_eq!(out.creations[0], OpResult::Blocked);
        assert_eq!(calls(&cloud, Operation::Create), 0);
        let out = ex.execute(&p, &book, &nothing_held(&p), &table).await;
        assert!(
            out.deletions[0].is_done() && out.creations[0].is_done(),
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
        let book = RetryBook::new(BackoffConfig::default());
        let out = ex.execute(&p, &book, &nothing_held(&p), &listed).await;
        assert_eq!(out.changed(), 4, "{out:?}");
        assert_eq!(calls(&cloud, Operation::Batch), 1);
        assert_eq!(cloud.routes(CLUSTER).len(), 3);
    }
}
