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
    /// Not sent, or abandoned before its answer came: the fence closed
    /// (leadership lost, renew deadline passed, shutting down).
    Cancelled,
}

impl OpResult {
    /// The operation succeeded.
    pub fn is_done(&self) -> bool {
        matches!(self, OpResult::Done(_))
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
    /// Time spent at the throttle gate, for metrics.
    pub throttle_wait: Arc<std::sync::Mutex<Duration>>,
}

impl Executor {
    /// An executor for `cluster` on `cloud`.
    pub fn new(cloud: Arc<dyn CloudRoutes>, cluster: impl Into<String>, fence: Fence) -> Self {
        Self {
            cloud,
            cluster: cluster.into(),
            gate: Arc::new(ThrottleGate::default()),
            fence,
            throttle_wait: Arc::default(),
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

    async fn wait_gate(&self) -> Ticket<'_> {
        let t = self.gate.pass().await;
        if !t.held.is_zero() {
            *self.throttle_wait.lock().unwrap_or_else(|e| e.into_inner()) += t.held;
        }
        t
    }

    /// Executes `plan`, skipping operations whose backoff is not due in
    /// `book` and those `held` back. `existing_routes` is the size of the
    /// route table the plan was made from: with a provider route limit,
    /// creations that cannot fit are refused here, without spending a
    /// request on a certain refusal.
    pub async fn execute(
        &self,
        plan: &Plan,
        book: &RetryBook,
        held: &Held,
        existing_routes: usize,
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
            // Only deletions attempted in this pass may free room; a held or
            // backed-off one leaves its route in the table.
            let freed = del_due.iter().filter(|d| **d).count();
            let mut room = max.saturating_sub(existing_routes.saturating_sub(freed));
            for (i, due) in cre_due.iter_mut().enumerate() {
                // A replacement in place takes no room.
                if !*due || plan.creations[i].replaces.is_some() {
                    continue;
                }
                if room == 0 {
                    *due = false;
                    over_limit[i] = true;
                } else {
                    room -= 1;
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
                out.creations[i] = OpResult::Failed(CloudError::new(
                    ErrorKind::QuotaExceeded,
                    format!(
                        "the {} provider allows at most {} routes and the route table is full; delete routes or raise the limit",
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
        let cancel = |out: &mut Outcome| {
            for &i in &del_idx {
                out.deletions[i] = OpResult::Cancelled;
            }
            for &i in &cre_idx {
                out.creations[i] = OpResult::Cancelled;
            }
        };
        let Ok(ticket) = self.fence.guard(self.wait_gate()).await else {
            cancel(&mut out);
            return out;
        };
        let started = Instant::now();
        let answer = match self
            .fence
            .guard(self.cloud.apply_batch(&self.cluster, &batch))
            .await
        {
            Ok(Err(e)) if e.kind == ErrorKind::Fenced => Err(e),
            Ok(a) => Ok(a),
            Err(e) => Err(e),
        };
        let answer = match answer {
            Ok(a) => a,
            Err(e) => {
                info!(reason = %e.message, "batch route update not sent or abandoned");
                cancel(&mut out);
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
        let started = Instant::now();
        let answer = self
            .fence
            .guard(self.cloud.delete_route(&self.cluster, route))
            .await;
        let r = match answer.and_then(unfenced) {
            Err(e) => return cancelled("delete", route, &e),
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
        let started = Instant::now();
        let answer = self
            .fence
            .guard(self.cloud.create_route(&self.cluster, hint, route))
            .await;
        let r = match answer.and_then(unfenced) {
            Err(e) => return cancelled("create", route, &e),
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

/// A provider's own fence refusal (after a wait of its own) is the same as
/// the executor's: moved to the outer error.
fn unfenced<T>(r: Result<T, CloudError>) -> Result<Result<T, CloudError>, CloudError> {
    match r {
        Err(e) if e.kind == ErrorKind::Fenced => Err(e),
        r => Ok(r),
    }
}

fn cancelled(op: &str, route: &Route, e: &CloudError) -> OpResult {
    info!(
        operation = op,
        node = %route.target_node,
        destination = %route.destination,
        reason = %e.message,
        "route change not sent or abandoned"
    );
    OpResult::Cancelled
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
