//! The absorb step: folding a pass's records back into the loop's state.
//!
//! No I/O: each operation's [`OpRecord`](crate::execute::OpRecord) is
//! folded by its key into the [`RetryBook`] (backoff), the [`Holds`]
//! (deletion grace, blackhole repairs) and the [`RouteCache`]. What an
//! answer means (how it is retried, whether the cached table becomes
//! uncertain, whether a deletion reached its goal, which Warning and how
//! often) is read from [`crate::policy`]; a verdict that refused an
//! operation in the cloud's place counts as that refusal. It returns what
//! the rest of the pass must act on: the Warnings the failures call for
//! (emitted by the status step) and whether the cached table became
//! uncertain (the scheduler then asks for a full pass).

use rand::Rng;
use route_cloud::ErrorKind;
use route_core::{Creation, Plan, Route};
use tokio::time::Instant;
use tracing::info;

use crate::execute::{OpRecords, OpResult};
use crate::gate::Holds;
use crate::nodes::NodeRef;
use crate::nodes::NodeStore;
use crate::policy::{self, OnDeletion, WarnEvery};
use crate::retry::RetryBook;
use crate::snapshot::RouteCache;
use crate::warnings::{Reason, Warning};

/// The loop state an outcome is folded into.
pub struct State<'a> {
    /// Backoff of failed operations.
    pub book: &'a mut RetryBook,
    /// Deletion grace and blackhole repairs.
    pub holds: &'a mut Holds,
    /// The cached route table.
    pub routes: &'a mut RouteCache,
}

/// What the rest of the pass must act on.
#[derive(Debug, Default)]
pub struct Absorbed {
    /// One per failed operation whose Node is known.
    pub warnings: Vec<Warning>,
    /// An answer (already exists, not found, timeout) made the cached table
    /// uncertain; it has been forgotten and a full pass must follow. An
    /// operation abandoned by the fence without its answer does the same.
    pub uncertain: bool,
}

/// How a record ends for the loop's state.
enum Fold {
    /// Done (or, for a deletion, its goal reached); for a creation, the
    /// route as the cloud lists it, when it said.
    Done(Option<Route>),
    /// Refused or failed with an answer of this class.
    Refused {
        kind: ErrorKind,
        retry_after: Option<std::time::Duration>,
        text: String,
    },
    /// Abandoned by the fence: it may have happened.
    MayHaveHappened,
    /// Not sent and answering nothing (held, backing off, blocked, cut off
    /// before sending): nothing to fold; the loop redoes it.
    Nothing,
}

fn fold(ops: &OpRecords, key: &route_core::OpKey, now: Instant) -> Fold {
    match ops.of(key) {
        OpResult::Done(created) => Fold::Done(created.clone()),
        OpResult::Abandoned => Fold::MayHaveHappened,
        _ => match ops.record(key).and_then(|r| r.refusal(now)) {
            Some((kind, retry_after, text)) => Fold::Refused {
                kind,
                retry_after,
                text,
            },
            None => Fold::Nothing,
        },
    }
}

/// Folds the records `ops` of `plan` into `state` at `now`. `nodes` names
/// the Nodes Warnings are about.
pub fn absorb(
    plan: &Plan,
    ops: &OpRecords,
    state: State<'_>,
    nodes: &NodeStore,
    now: Instant,
) -> Absorbed {
    let State {
        book,
        holds,
        routes,
    } = state;
    let mut out = Absorbed::default();
    let jitter = || rand::rng().random::<f64>();
    for d in &plan.deletions {
        let key = d.key();
        match fold(ops, &key, now) {
            Fold::Done(_) => {
                book.succeeded(&key);
                book.release_quota_waiters(now);
                routes.remove(&d.route);
                holds.deletion_landed(plan, &key, now);
            }
            Fold::Refused {
                kind,
                retry_after,
                text,
            } => {
                let p = policy::of(kind);
                out.uncertain |= p.uncertain;
                if p.uncertain {
                    // It may well have happened.
                    holds.deletion_landed(plan, &key, now);
                }
                if p.deletion == OnDeletion::Reached {
                    // Gone already: the goal is reached; the resync that
                    // follows checks the rest of the table.
                    book.succeeded(&key);
                    routes.remove(&d.route);
                    continue;
                }
                let at = book.answered(key.clone(), kind, retry_after, now, jitter());
                if let Some(v) = nodes.get(&d.route.node) {
                    let node = NodeRef {
                        name: v.name.clone(),
                        uid: v.uid.clone(),
                    };
                    out.warnings.push(Warning::failed_to_delete(
                        node,
                        d,
                        &text,
                        kind,
                        book.failures(&key),
                        at - now,
                    ));
                }
            }
            Fold::MayHaveHappened => {
                out.uncertain = true;
                holds.deletion_landed(plan, &key, now);
            }
            Fold::Nothing => {}
        }
    }
    for c in &plan.creations {
        let key = c.key();
        match fold(ops, &key, now) {
            Fold::Done(created) => {
                book.succeeded(&key);
                if let Some(replaced) = &c.replaces {
                    holds.repaired(c, now);
                    routes.remove(replaced);
                }
                routes.add(created.unwrap_or_else(|| c.route.clone()));
            }
            Fold::Refused {
                kind,
                retry_after,
                text,
            } => {
                let p = policy::of(kind);
                out.uncertain |= p.uncertain;
                // A replacement whose answer was lost may well have landed;
                // if the next listing shows a blackhole again, that is a
                // recurrence like any other.
                if p.uncertain && c.replaces.is_some() {
                    holds.repaired(c, now);
                }
                let at = book.answered(key.clone(), kind, retry_after, now, jitter());
                let (reason, every) = p.warn;
                if every == WarnEvery::Node && book.failures(&key) > 1 {
                    continue;
                }
                out.warnings.push(creation_warning(
                    c,
                    reason,
                    &text,
                    kind,
                    book.failures(&key),
                    at - now,
                ));
            }
            Fold::MayHaveHappened => {
                out.uncertain = true;
                // Like a lost answer: the replacement may have landed.
                if c.replaces.is_some() {
                    holds.repaired(c, now);
                }
            }
            Fold::Nothing => {}
        }
    }
    if out.uncertain {
        info!(
            "a cloud answer (or one abandoned by the fence) made the cached route table uncertain; a full sync follows"
        );
        // Planning from a table known to be stale would repeat the failing
        // call; the next pass lists instead.
        routes.forget();
    }
    out
}

/// The Warning of policy `reason` for creation `c`, refused with `text`.
fn creation_warning(
    c: &Creation,
    reason: Reason,
    text: &str,
    kind: ErrorKind,
    failures: u32,
    wait: std::time::Duration,
) -> Warning {
    let node = NodeRef {
        name: c.route.node.to_string(),
        uid: c.node_uid.clone(),
    };
    match reason {
        Reason::RouteQuotaExceeded => Warning::route_quota_exceeded(node, c, text),
        _ => Warning::failed_to_create(node, c, text, kind, failures, wait),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::BackoffConfig;
    use crate::schedule::Mode;
    use crate::warnings::Reason;
    use route_cloud::CloudError;
    use route_core::{Cidr, NodeView, PlanConfig, Route};
    use std::sync::Arc;
    use std::time::Duration;

    struct Loop {
        book: RetryBook,
        holds: Holds,
        routes: RouteCache,
        nodes: Arc<NodeStore>,
    }

    impl Loop {
        fn new() -> Self {
            let nodes = NodeStore::new(None);
            nodes.apply(crate::NodeEvent::Init);
            nodes.apply(crate::NodeEvent::InitApply(NodeView::new(
                "a",
                "uid-a",
                &["10.0.1.0/24"],
            )));
            nodes.apply(crate::NodeEvent::InitDone);
            let mut routes = RouteCache::new(Mode::Incremental);
            routes.keep(vec![Route::new("gone", cidr("10.0.9.0/24"))]);
            Self {
                book: RetryBook::new(BackoffConfig::default()),
                holds: Holds::new(Duration::ZERO, Duration::from_secs(300)),
                routes,
                nodes,
            }
        }

        fn absorb(&mut self, plan: &Plan, outcome: &OpRecords) -> Absorbed {
            let state = State {
                book: &mut self.book,
                holds: &mut self.holds,
                routes: &mut self.routes,
            };
            absorb(plan, outcome, state, &self.nodes, Instant::now())
        }
    }

    fn cidr(s: &str) -> Cidr {
        Cidr::parse(s).unwrap()
    }

    fn plan(l: &Loop) -> Plan {
        route_core::plan(
            &l.nodes.snapshot(),
            &[Route::new("gone", cidr("10.0.9.0/24"))],
            &PlanConfig {
                cluster_cidrs: vec![cidr("10.0.0.0/16")],
                ..PlanConfig::default()
            },
        )
    }

    /// The outcome of a plan of one deletion and one creation.
    fn outcome(p: &Plan, deletion: OpResult, creation: OpResult) -> OpRecords {
        let mut o = OpRecords::default();
        o.set(p.deletions[0].key(), deletion);
        o.set(p.creations[0].key(), creation);
        o
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_creation_backs_off_and_warns_with_upstreams_reason() {
        let mut l = Loop::new();
        let p = plan(&l);
        let outcome = outcome(
            &p,
            OpResult::Done(None),
            OpResult::Failed(CloudError::new(ErrorKind::Transient, "boom")),
        );
        let a = l.absorb(&p, &outcome);
        assert!(!a.uncertain);
        assert_eq!(a.warnings.len(), 1);
        assert_eq!(a.warnings[0].reason, Reason::FailedToCreateRoute);
        assert_eq!(a.warnings[0].node.name, "a");
        assert!(!l.book.is_due(&p.creations[0].key(), Instant::now()));
        assert!(l.book.is_due(&p.deletions[0].key(), Instant::now()));
        assert!(l.routes.is_warm(), "a plain failure keeps the cached table");
    }

    #[tokio::test(start_paused = true)]
    async fn an_uncertain_answer_forgets_the_cached_table() {
        let mut l = Loop::new();
        let p = plan(&l);
        let outcome = outcome(
            &p,
            OpResult::Done(None),
            OpResult::Failed(CloudError::new(ErrorKind::AlreadyExists, "exists")),
        );
        let a = l.absorb(&p, &outcome);
        assert!(a.uncertain);
        assert!(!l.routes.is_warm());
    }

    #[tokio::test(start_paused = true)]
    async fn a_deletion_not_found_is_reached_and_not_warned_about() {
        let mut l = Loop::new();
        let p = plan(&l);
        let outcome = outcome(
            &p,
            OpResult::Failed(CloudError::new(ErrorKind::NotFound, "no such route")),
            OpResult::Done(None),
        );
        let a = l.absorb(&p, &outcome);
        assert!(a.warnings.is_empty());
        assert!(
            a.uncertain,
            "not found means the table was not what we thought"
        );
        assert!(l.book.is_due(&p.deletions[0].key(), Instant::now()));
    }
}
