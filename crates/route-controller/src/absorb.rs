//! The absorb step: folding a pass's outcome back into the loop's state.
//!
//! No I/O: results are folded by operation key, and each landed or failed
//! operation updates the
//! [`RetryBook`] (backoff), the [`Holds`] (deletion grace, blackhole
//! repairs) and the [`RouteCache`]. It returns what the rest of the pass must
//! act on: the Warnings the failures call for (emitted by the status step)
//! and whether an answer made the cached table uncertain (the scheduler then
//! asks for a full pass). It also applies part of what a cloud answer means:
//! a deletion answered `NotFound` counts as done, and a refusal for a
//! stopped instance or a full table warns once per Node, not per attempt.

use rand::Rng;
use route_cloud::ErrorKind;
use route_core::Plan;
use tokio::time::Instant;
use tracing::info;

use crate::execute::{OpResult, OpResults};
use crate::gate::Holds;
use crate::nodes::NodeRef;
use crate::nodes::NodeStore;
use crate::retry::RetryBook;
use crate::snapshot::RouteCache;
use crate::warnings::Warning;

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

/// Folds `outcome` of `plan` into `state` at `now`. `nodes` names the Nodes
/// Warnings are about.
pub fn absorb(
    plan: &Plan,
    outcome: &OpResults,
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
    for d in &plan.deletions {
        let key = d.key();
        match outcome.of(&key) {
            OpResult::Done(_) => {
                book.succeeded(&key);
                book.release_quota_waiters(now);
                routes.remove(&d.route);
                holds.deletion_landed(plan, &key, now);
            }
            OpResult::Failed(e) => {
                out.uncertain |= e.makes_cache_uncertain();
                if e.makes_cache_uncertain() {
                    // It may well have happened.
                    holds.deletion_landed(plan, &key, now);
                }
                if e.kind == ErrorKind::NotFound {
                    // Gone already: the goal is reached; the resync that
                    // follows checks the rest of the table.
                    book.succeeded(&key);
                    routes.remove(&d.route);
                    continue;
                }
                let at = book.failed(key.clone(), e, now, rand::rng().random::<f64>());
                if let Some(v) = nodes.get(&d.route.node) {
                    let node = NodeRef {
                        name: v.name.clone(),
                        uid: v.uid.clone(),
                    };
                    out.warnings.push(Warning::failed_to_delete(
                        node,
                        d,
                        e,
                        book.failures(&key),
                        at - now,
                    ));
                }
            }
            OpResult::Abandoned => {
                out.uncertain = true;
                holds.deletion_landed(plan, &key, now);
            }
            // Not sent: the loop redoes it (`OpResults::fenced`), nothing to fold.
            OpResult::Cancelled | OpResult::NotSent | OpResult::Blocked => {}
        }
    }
    for c in &plan.creations {
        let key = c.key();
        match outcome.of(&key) {
            OpResult::Done(created) => {
                book.succeeded(&key);
                if let Some(replaced) = &c.replaces {
                    holds.repaired(c, now);
                    routes.remove(replaced);
                }
                routes.add(created.clone().unwrap_or_else(|| c.route.clone()));
            }
            OpResult::Failed(e) => {
                out.uncertain |= e.makes_cache_uncertain();
                // A replacement whose answer was lost may well have landed;
                // if the next listing shows a blackhole again, that is a
                // recurrence like any other.
                if e.makes_cache_uncertain() && c.replaces.is_some() {
                    holds.repaired(c, now);
                }
                let at = book.failed(key.clone(), e, now, rand::rng().random::<f64>());
                if matches!(
                    e.kind,
                    ErrorKind::TargetUnavailable | ErrorKind::QuotaExceeded
                ) && book.failures(&key) > 1
                {
                    // Warned at the first refusal: a stopped instance stays
                    // stopped for a while, and a full table stays full until
                    // a deletion, which releases the creation at once.
                    continue;
                }
                let node = NodeRef {
                    name: c.route.node.to_string(),
                    uid: c.node_uid.clone(),
                };
                if e.kind == ErrorKind::QuotaExceeded {
                    out.warnings.push(Warning::route_quota_exceeded(node, c, e));
                    continue;
                }
                out.warnings.push(Warning::failed_to_create(
                    node,
                    c,
                    e,
                    book.failures(&key),
                    at - now,
                ));
            }
            OpResult::Abandoned => {
                out.uncertain = true;
                // Like a lost answer: the replacement may have landed.
                if c.replaces.is_some() {
                    holds.repaired(c, now);
                }
            }
            OpResult::Cancelled | OpResult::NotSent | OpResult::Blocked => {}
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

        fn absorb(&mut self, plan: &Plan, outcome: &OpResults) -> Absorbed {
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
    fn outcome(p: &Plan, deletion: OpResult, creation: OpResult) -> OpResults {
        let mut o = OpResults::default();
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
