//! `--dry-run`: what a replica that writes nothing would do, and whether
//! the cloud and the Nodes already agree with it.
//!
//! A dry-run controller runs every step of a pass but sends no write
//! ([`crate::execute::Writes`]): the executor records what the gate lets
//! run as [`OpResult::DryRun`](crate::OpResult::DryRun), which absorb
//! folds into nothing (not done, not failed, not redone), and the status
//! step patches no condition and emits no Event. This module reads each
//! pass's plan instead: every route creation and deletion, every
//! `NetworkUnavailable` condition the plan would change and every forwarding
//! prerequisite the provider would repair is a *difference* between what
//! this controller would do and what is there. Run beside the route
//! controller it is to replace, no difference means the two agree.
//!
//! Each difference is logged once, when it first appears (again only after
//! it went away and came back), and the last pass's differences are the
//! `route_controller_dry_run_*` gauges: by operation and reason, whether
//! the pass agreed, and since when it has agreed without interruption.

use std::collections::{BTreeMap, HashSet};
use std::time::SystemTime;

use route_cloud::Forwarding;
use route_core::{CreationReason, DeletionReason, Plan};
use tracing::info;

use crate::metrics::MetricsHandle;

/// The kind of a difference: the `operation` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DryRunOp {
    /// A route would be created.
    Create,
    /// A route would be deleted.
    Delete,
    /// A Node's `NetworkUnavailable` condition would be set.
    Condition,
    /// A Node's forwarding prerequisite would be repaired.
    Prerequisite,
}

impl DryRunOp {
    /// Every kind, in label order.
    pub const ALL: [DryRunOp; 4] = [
        DryRunOp::Create,
        DryRunOp::Delete,
        DryRunOp::Condition,
        DryRunOp::Prerequisite,
    ];

    /// The `operation` label.
    pub fn as_str(self) -> &'static str {
        match self {
            DryRunOp::Create => "create",
            DryRunOp::Delete => "delete",
            DryRunOp::Condition => "condition",
            DryRunOp::Prerequisite => "prerequisite",
        }
    }
}

/// One thing a dry-run pass would change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// What kind of change.
    pub op: DryRunOp,
    /// Why: the creation's or deletion's reason, the condition's target
    /// reason, `prerequisite_off` for a prerequisite.
    pub reason: &'static str,
    /// Its identity across passes (the operation key, or the Node).
    pub key: String,
    /// The log line's text after `dry run: `.
    pub says: String,
}

/// What one dry-run pass found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DryRunReport {
    /// Every difference, in plan order.
    pub differences: Vec<Difference>,
}

impl DryRunReport {
    /// Nothing to do: the cloud and the Nodes are as this controller
    /// would make them.
    pub fn agreeing(&self) -> bool {
        self.differences.is_empty()
    }

    /// The differences of kind `op`.
    pub fn count(&self, op: DryRunOp) -> usize {
        self.differences.iter().filter(|d| d.op == op).count()
    }

    /// Differences by operation and reason, for the gauges.
    pub fn by_reason(&self) -> BTreeMap<(DryRunOp, &'static str), usize> {
        let mut out = BTreeMap::new();
        for d in &self.differences {
            *out.entry((d.op, d.reason)).or_default() += 1;
        }
        out
    }
}

/// Every creation reason, for the reference page.
pub const CREATION_REASONS: [CreationReason; 4] = [
    CreationReason::Missing,
    CreationReason::AddressesChanged,
    CreationReason::ReplacesBlackhole,
    CreationReason::TargetChanged,
];

/// Every deletion reason, for the reference page.
pub const DELETION_REASONS: [DeletionReason; 8] = [
    DeletionReason::NodeGone,
    DeletionReason::NoTargetNode,
    DeletionReason::CidrNotAssigned,
    DeletionReason::Blackhole,
    DeletionReason::NodeExcluded,
    DeletionReason::AddressesChanged,
    DeletionReason::Duplicate,
    DeletionReason::TargetChanged,
];

/// The `reason` values of `operation`, for the reference page.
pub fn reasons(op: DryRunOp) -> Vec<&'static str> {
    match op {
        DryRunOp::Create => CREATION_REASONS.into_iter().map(creation_reason).collect(),
        DryRunOp::Delete => DELETION_REASONS.into_iter().map(deletion_reason).collect(),
        DryRunOp::Condition => route_core::NetworkCondition::ALL
            .iter()
            .map(|c| c.reason())
            .collect(),
        DryRunOp::Prerequisite => vec![PREREQUISITE_OFF],
    }
}

/// The `reason` of a prerequisite the provider would repair.
pub const PREREQUISITE_OFF: &str = "prerequisite_off";

/// The label of a creation's reason.
pub fn creation_reason(r: CreationReason) -> &'static str {
    match r {
        CreationReason::Missing => "missing",
        CreationReason::AddressesChanged => "addresses_changed",
        CreationReason::ReplacesBlackhole => "replaces_blackhole",
        CreationReason::TargetChanged => "target_changed",
    }
}

/// The label of a deletion's reason.
pub fn deletion_reason(r: DeletionReason) -> &'static str {
    match r {
        DeletionReason::NodeGone => "node_gone",
        DeletionReason::NoTargetNode => "no_target_node",
        DeletionReason::CidrNotAssigned => "cidr_not_assigned",
        DeletionReason::Blackhole => "blackhole",
        DeletionReason::NodeExcluded => "node_excluded",
        DeletionReason::AddressesChanged => "addresses_changed",
        DeletionReason::Duplicate => "duplicate",
        DeletionReason::TargetChanged => "target_changed",
    }
}

/// The dry-run state of the reconcile task: the differences already
/// logged, the prerequisites the provider would repair, and since when
/// the passes agree.
#[derive(Debug, Default)]
pub struct DryRun {
    /// Keys of the differences of the last pass (logged when they appeared).
    logged: HashSet<(DryRunOp, String)>,
    /// Node name → what the provider would turn back on, from its last answer.
    would_repair: BTreeMap<String, String>,
    /// When the passes started agreeing; `None` while they disagree.
    agreeing_since: Option<SystemTime>,
    /// A pass has been observed.
    observed: bool,
}

impl DryRun {
    /// A dry run that has observed nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes a prerequisite check's answers: a Node whose prerequisite
    /// the provider would repair is a difference until an answer says it
    /// is in place (or not the provider's to change).
    pub fn prerequisites<'a>(
        &mut self,
        answers: impl IntoIterator<Item = &'a (String, Forwarding)>,
    ) {
        for (node, answer) in answers {
            match answer {
                Forwarding::WouldRepair { what } => {
                    self.would_repair.insert(node.clone(), what.clone());
                }
                _ => {
                    self.would_repair.remove(node);
                }
            }
        }
    }

    /// Reads the differences of `plan` (the plan of a pass that sent
    /// nothing), logs the new ones, and sets the gauges; `live` says
    /// whether a Node still exists, `now` is the wall clock.
    pub fn observe(
        &mut self,
        plan: &Plan,
        live: impl Fn(&str) -> bool,
        metrics: &MetricsHandle,
        now: SystemTime,
    ) -> DryRunReport {
        // A Node gone needs no repair.
        self.would_repair.retain(|n, _| live(n));
        let report = differences(plan, &self.would_repair);
        let mut now_logged = HashSet::new();
        for d in &report.differences {
            let key = (d.op, d.key.clone());
            if !self.logged.contains(&key) {
                info!(
                    operation = d.op.as_str(),
                    reason = d.reason,
                    "dry run: {}",
                    d.says
                );
            }
            now_logged.insert(key);
        }
        self.logged = now_logged;
        let was = self.agreeing_since;
        self.agreeing_since = if report.agreeing() {
            Some(was.unwrap_or(now))
        } else {
            None
        };
        if report.agreeing() && (was.is_none() || !self.observed) {
            info!(
                "dry run: nothing to do; the cloud's routes and the Nodes' conditions are as this controller would make them"
            );
        }
        self.observed = true;
        let since = self
            .agreeing_since
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        metrics.dry_run(&report.by_reason(), report.agreeing(), since);
        report
    }
}

/// Every difference `plan` holds: its creations and deletions, the
/// conditions it would set once every creation succeeded, and the
/// prerequisites in `would_repair`.
pub fn differences(plan: &Plan, would_repair: &BTreeMap<String, String>) -> DryRunReport {
    let mut out = Vec::new();
    let in_table = |t: &route_core::Text| {
        if t.is_empty() {
            String::new()
        } else {
            format!(" in {t}")
        }
    };
    for c in &plan.creations {
        let reason = creation_reason(c.reason);
        out.push(Difference {
            op: DryRunOp::Create,
            reason,
            key: c.key().to_string(),
            says: format!(
                "would create route {} to {}{} ({reason})",
                c.route.destination,
                c.route.node,
                in_table(&c.route.table)
            ),
        });
    }
    for d in &plan.deletions {
        let reason = deletion_reason(d.reason);
        out.push(Difference {
            op: DryRunOp::Delete,
            reason,
            key: d.key().to_string(),
            says: format!(
                "would delete route {} to {}{} ({reason})",
                d.route.destination,
                d.route.node,
                in_table(&d.route.table)
            ),
        });
    }
    for n in &plan.nodes {
        // What the writer would set once its creations landed.
        let Some(want) = n.condition_given(|_| None) else {
            continue;
        };
        out.push(Difference {
            op: DryRunOp::Condition,
            reason: want.reason(),
            key: format!("{} {}", n.node, n.uid),
            says: format!(
                "would set NetworkUnavailable on {} to {}/{}",
                n.node,
                want.status(),
                want.reason()
            ),
        });
    }
    for (node, what) in would_repair {
        out.push(Difference {
            op: DryRunOp::Prerequisite,
            reason: PREREQUISITE_OFF,
            key: node.clone(),
            says: format!("would repair the forwarding prerequisite of {node} ({what})"),
        });
    }
    DryRunReport { differences: out }
}
