//! What each cloud answer means for the loop, in one table.
//!
//! A provider classifies its cloud's answer into an [`ErrorKind`]; this
//! module says what that class does to everything after it, and nothing
//! else in the engine decides it: the retry book reads [`Policy::retry`],
//! absorb reads [`Policy::uncertain`], [`Policy::deletion`] and
//! [`Policy::warn`], the status step reads [`Policy::condition`]. A gate
//! verdict that refuses an operation without a request stands for the
//! answer the cloud would have given ([`refusal`]), so it is treated by the
//! same row. Adding an error class is one row here and its line in the
//! table test.
//!
//! | kind | retry | table uncertain | a deletion answered so | creation's Node reads | Warning | a listing answered so marks a Node never routed |
//! |---|---|---|---|---|---|---|
//! | `throttled` | paced by the throttle, backoff not grown | no | failed | `NoRouteCreated` | `FailedToCreateRoute` each attempt | no |
//! | `conflict` | backoff | no | failed | `NoRouteCreated` | `FailedToCreateRoute` each attempt | no |
//! | `already_exists` | backoff | yes | failed | `NoRouteCreated` | `FailedToCreateRoute` each attempt | no |
//! | `not_found` | backoff | yes | reached its goal | `NoRouteCreated` | `FailedToCreateRoute` each attempt | no |
//! | `quota_exceeded` | until room: 60 s floor, released by a deletion | no | failed | `RouteQuotaExceeded` | `RouteQuotaExceeded` once per Node | no |
//! | `invalid_request` | rarely: the backoff maximum | no | failed | `NoRouteCreated` | `FailedToCreateRoute` each attempt | no |
//! | `transient` | backoff | no | failed | `NoRouteCreated` | `FailedToCreateRoute` each attempt | no |
//! | `timeout` | backoff | yes | failed | `NoRouteCreated` | `FailedToCreateRoute` each attempt | no |
//! | `permanent` | rarely: the backoff maximum | no | failed | `NoRouteCreated` | `FailedToCreateRoute` each attempt | `NoRouteCreated`, naming the refusal |
//! | `target_unavailable` | until the instance runs: 60 s doubling, kept while not wanted | no | failed | `InstanceNotRunning` | `FailedToCreateRoute` once per Node | no |
//! | `fenced` | never an answer: the executor records the operation as not sent | no | failed | `NoRouteCreated` | `FailedToCreateRoute` each attempt | no |
//!
//! A failed deletion warns `FailedToDeleteRoute` on every attempt.

use std::time::Duration;

use route_cloud::ErrorKind;
use route_core::NetworkCondition;

use crate::gate::Verdict;
use crate::warnings::Reason;

/// The least wait before retrying a creation refused for quota: a full
/// table frees up only when something is deleted, and that releases the
/// creation at once; retrying sooner only spends budget.
pub const QUOTA_RETRY_FLOOR: Duration = Duration::from_secs(60);

/// The least wait before repairing a blackhole that came back, and before
/// retrying a creation refused for its instance's state. A route that is a
/// blackhole again right after its repair names an instance that is
/// stopped, and instances stay stopped for minutes; when it runs again, its
/// route is active again without any call. The gate holds recurring
/// repairs by it ([`crate::gate`]).
pub const BLACKHOLE_REPAIR_FLOOR: Duration = Duration::from_secs(60);

/// When an operation that got an answer of a class is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Exponential backoff with jitter, at least the answer's retry-after.
    Backoff,
    /// The cloud refused the rate, not the route: due again at once, its
    /// backoff not grown; the executor's throttle holds it until the cloud
    /// accepts calls again.
    Paced,
    /// The same request will be refused again (an IPv6 route on an
    /// IPv4-only cloud, bad credentials): at the backoff maximum.
    Rarely,
    /// No room in the table: at least [`QUOTA_RETRY_FLOOR`], and at once
    /// when a deletion lands.
    UntilRoom,
    /// The target instance is stopped or gone: like a blackhole repair
    /// that came back, from [`BLACKHOLE_REPAIR_FLOOR`] doubling per refusal
    /// up to the backoff maximum; remembered while the plan does not want
    /// the operation for a moment, so it is not resent early.
    UntilInstanceRuns,
}

/// How often a failed creation warns its Node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarnEvery {
    /// On every failed attempt.
    Attempt,
    /// At the first refusal only: the cause lasts (a stopped instance, a
    /// full table) and its end releases the creation by itself.
    Node,
}

/// What a deletion that got an answer of a class has done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDeletion {
    /// It failed; it is retried and warned about.
    Failed,
    /// The route is gone already: the goal is reached.
    Reached,
}

/// What one class of cloud answer means. See the module docs' table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// When it is tried again.
    pub retry: Retry,
    /// After this answer the cached route table cannot be trusted (the
    /// change may have happened, or the table was not what we thought): it
    /// is forgotten and listed again before planning.
    pub uncertain: bool,
    /// What a deletion answered so has done.
    pub deletion: OnDeletion,
    /// The NetworkUnavailable reason of the Node whose creation failed so,
    /// or waits out such a refusal.
    pub condition: NetworkCondition,
    /// The Warning a failed creation emits, and how often.
    pub warn: (Reason, WarnEvery),
    /// A creation answered so inside a batch whose deletion before it
    /// failed is reported blocked: the answer only says the old route is
    /// still there. Any other refusal is the creation's own and keeps its
    /// answer, so its retry rule applies.
    pub explained_by_failed_deletion: bool,
    /// A listing answered so writes `True`/`NoRouteCreated`, its message
    /// naming the refusal, on every routable Node that has no
    /// `NetworkUnavailable` condition yet (one that joined while the cloud
    /// refuses the controller): the refusal lasts until an operator acts,
    /// and a Node without the condition takes pods it has no route for.
    /// A Node that has a condition keeps it (a routed one follows the
    /// `RouteUnverified` rule); answers that pass by themselves (an
    /// outage, throttling) write nothing until a listing succeeds.
    pub marks_unrouted_nodes: bool,
}

const BACKOFF: Policy = Policy {
    retry: Retry::Backoff,
    uncertain: false,
    deletion: OnDeletion::Failed,
    condition: NetworkCondition::NoRouteCreated,
    warn: (Reason::FailedToCreateRoute, WarnEvery::Attempt),
    explained_by_failed_deletion: false,
    marks_unrouted_nodes: false,
};

/// The policy of answers of class `kind`.
pub const fn of(kind: ErrorKind) -> Policy {
    match kind {
        ErrorKind::Throttled => Policy {
            retry: Retry::Paced,
            ..BACKOFF
        },
        ErrorKind::Conflict | ErrorKind::Transient | ErrorKind::Fenced => BACKOFF,
        ErrorKind::AlreadyExists => Policy {
            uncertain: true,
            explained_by_failed_deletion: true,
            ..BACKOFF
        },
        ErrorKind::NotFound => Policy {
            uncertain: true,
            deletion: OnDeletion::Reached,
            ..BACKOFF
        },
        ErrorKind::Timeout => Policy {
            uncertain: true,
            ..BACKOFF
        },
        ErrorKind::InvalidRequest => Policy {
            retry: Retry::Rarely,
            ..BACKOFF
        },
        ErrorKind::Permanent => Policy {
            retry: Retry::Rarely,
            marks_unrouted_nodes: true,
            ..BACKOFF
        },
        ErrorKind::QuotaExceeded => Policy {
            retry: Retry::UntilRoom,
            condition: NetworkCondition::RouteQuotaExceeded,
            warn: (Reason::RouteQuotaExceeded, WarnEvery::Node),
            ..BACKOFF
        },
        ErrorKind::TargetUnavailable => Policy {
            retry: Retry::UntilInstanceRuns,
            condition: NetworkCondition::InstanceNotRunning,
            warn: (Reason::FailedToCreateRoute, WarnEvery::Node),
            ..BACKOFF
        },
    }
}

/// The answer a verdict gives in the cloud's place, when it refuses an
/// operation without a request: no room in the table is the cloud's quota
/// refusal, known beforehand. Holds and backoffs answer nothing.
pub fn refusal(verdict: &Verdict) -> Option<ErrorKind> {
    match verdict {
        Verdict::NoRoom { .. } => Some(ErrorKind::QuotaExceeded),
        Verdict::Run
        | Verdict::BackingOff { .. }
        | Verdict::Held { .. }
        | Verdict::Blocked { .. }
        | Verdict::Bounded { .. } => None,
    }
}

/// Every class, for the table test and the reference docs.
pub const ALL_KINDS: [ErrorKind; 11] = [
    ErrorKind::Throttled,
    ErrorKind::Conflict,
    ErrorKind::AlreadyExists,
    ErrorKind::NotFound,
    ErrorKind::QuotaExceeded,
    ErrorKind::InvalidRequest,
    ErrorKind::Transient,
    ErrorKind::Timeout,
    ErrorKind::Permanent,
    ErrorKind::TargetUnavailable,
    ErrorKind::Fenced,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The module docs' table, row by row: a change of meaning shows here
    /// and in the docs together.
    #[test]
    fn every_answer_class_has_the_meaning_the_table_documents() {
        use NetworkCondition::{InstanceNotRunning, NoRouteCreated};
        use OnDeletion::*;
        use Reason::FailedToCreateRoute;
        use Retry::*;
        use WarnEvery::*;
        #[rustfmt::skip]
        let table: [(ErrorKind, Retry, bool, OnDeletion, NetworkCondition, Reason, WarnEvery); 11] = [
            (ErrorKind::Throttled, Paced, false, Failed, NoRouteCreated, FailedToCreateRoute, Attempt),
            (ErrorKind::Conflict, Backoff, false, Failed, NoRouteCreated, FailedToCreateRoute, Attempt),
            (ErrorKind::AlreadyExists, Backoff, true, Failed, NoRouteCreated, FailedToCreateRoute, Attempt),
            (ErrorKind::NotFound, Backoff, true, Reached, NoRouteCreated, FailedToCreateRoute, Attempt),
            (ErrorKind::QuotaExceeded, UntilRoom, false, Failed, NetworkCondition::RouteQuotaExceeded, Reason::RouteQuotaExceeded, Node),
            (ErrorKind::InvalidRequest, Rarely, false, Failed, NoRouteCreated, FailedToCreateRoute, Attempt),
            (ErrorKind::Transient, Backoff, false, Failed, NoRouteCreated, FailedToCreateRoute, Attempt),
            (ErrorKind::Timeout, Backoff, true, Failed, NoRouteCreated, FailedToCreateRoute, Attempt),
            (ErrorKind::Permanent, Rarely, false, Failed, NoRouteCreated, FailedToCreateRoute, Attempt),
            (ErrorKind::TargetUnavailable, UntilInstanceRuns, false, Failed, InstanceNotRunning, FailedToCreateRoute, Node),
            (ErrorKind::Fenced, Backoff, false, Failed, NoRouteCreated, FailedToCreateRoute, Attempt),
        ];
        assert_eq!(
            table.map(|r| r.0),
            ALL_KINDS,
            "one row per class, in the docs' order"
        );
        for (kind, retry, uncertain, deletion, condition, reason, every) in table {
            let p = of(kind);
            assert_eq!(p.retry, retry, "{kind}");
            assert_eq!(p.uncertain, uncertain, "{kind}");
            assert_eq!(p.deletion, deletion, "{kind}");
            assert_eq!(p.condition, condition, "{kind}");
            assert_eq!(p.warn, (reason, every), "{kind}");
            assert_eq!(
                p.retry == Retry::Rarely,
                !route_cloud::CloudError::new(kind, "").is_retryable(),
                "{kind}: what providers poll again is what the engine retries soon"
            );
            assert_eq!(
                p.explained_by_failed_deletion,
                kind == ErrorKind::AlreadyExists,
                "{kind}"
            );
            assert_eq!(
                p.marks_unrouted_nodes,
                kind == ErrorKind::Permanent,
                "{kind}: only a refusal of the controller's credentials or permissions marks a Node never routed"
            );
        }
    }

    #[test]
    fn only_a_full_table_refuses_in_the_clouds_place() {
        let now = tokio::time::Instant::now();
        assert_eq!(
            refusal(&Verdict::NoRoom {
                table: Default::default(),
                max: 50
            }),
            Some(ErrorKind::QuotaExceeded)
        );
        for v in [
            Verdict::Run,
            Verdict::BackingOff { until: now },
            Verdict::Blocked { by: Vec::new() },
        ] {
            assert_eq!(refusal(&v), None, "{v:?}");
        }
    }
}
