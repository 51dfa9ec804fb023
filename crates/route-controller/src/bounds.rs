//! Bounded passes: how much one pass may take away at once.
//!
//! Other controllers that can hurt many Nodes at once stop when a change
//! looks too large to be meant: the node lifecycle controller when a zone
//! looks unhealthy, cluster-autoscaler past 45 % unready Nodes, Cluster
//! API's `maxUnhealthy`, Karpenter's disruption budget of 10 %. This
//! controller has two such bounds, both pure arithmetic here:
//!
//! - `--max-unavailable-nodes` (default 10 %): a pass that would turn more
//!   Nodes from a working `NetworkUnavailable` (`False` or `Unknown`) to
//!   `True` than the budget allows writes none of those; every other write
//!   goes on. A percentage never allows fewer than 2, so the bound bites at
//!   3 Nodes and more.
//! - `--max-route-deletions` (default 10, cluster-autoscaler's scale-down
//!   parallelism): a pass that would delete more live routes that no Node
//!   needs (their Node is gone or left out, or they name none) from one
//!   route table than the budget allows deletes none of them from it. A blackhole's target is gone and a
//!   replaced route is created again, so neither counts, and creating a
//!   route is never held.
//!
//! A held change is planned again at every pass and held again, until the
//! cause goes away or an operator raises the bound (`100%` lifts it).

use std::fmt;
use std::str::FromStr;

use route_core::{Deletion, DeletionReason, NetworkCondition, NodePlan, OpKey};

/// The fewest a percentage allows: "more than 10 % and at least 3".
const PERCENT_FLOOR: usize = 2;

/// A bound: a number, or a percentage of what there is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// At most this many.
    Count(usize),
    /// At most this share (0–100) of the whole, and never fewer than 2.
    Percent(u8),
}

impl Budget {
    /// How many of `of` the budget allows in one pass.
    pub fn max(self, of: usize) -> usize {
        match self {
            Budget::Count(n) => n,
            Budget::Percent(100) => of,
            Budget::Percent(p) => (of * usize::from(p) / 100).max(PERCENT_FLOOR),
        }
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Budget::Count(n) => write!(f, "{n}"),
            Budget::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// Why a budget does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a count or a percentage from 0% to 100% (e.g. 10 or 10%)")]
pub struct BudgetError(String);

impl FromStr for Budget {
    type Err = BudgetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let bad = || BudgetError(s.to_string());
        match t.strip_suffix('%') {
            Some(p) => match p.trim().parse::<u8>() {
                Ok(p) if p <= 100 => Ok(Budget::Percent(p)),
                _ => Err(bad()),
            },
            None => t.parse::<usize>().map(Budget::Count).map_err(|_| bad()),
        }
    }
}

/// The two bounds of a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// `--max-unavailable-nodes`, of the Nodes in the cluster.
    pub unavailable: Budget,
    /// `--max-route-deletions`, of the live routes listed.
    pub deletions: Budget,
}

impl Bounds {
    /// The production defaults.
    pub const DEFAULT: Bounds = Bounds {
        unavailable: Budget::Percent(10),
        deletions: Budget::Count(10),
    };

    /// No bound at all (tests and simulations that judge other things).
    pub const NONE: Bounds = Bounds {
        unavailable: Budget::Percent(100),
        deletions: Budget::Percent(100),
    };
}

impl Default for Bounds {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What a pass held back, for the log, the Warning, the metric and `plan`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// Deletions or condition writes.
    pub kind: HeldKind,
    /// How many the pass would have made.
    pub planned: usize,
    /// How many the bound allows.
    pub max: usize,
    /// The bound as configured.
    pub budget: Budget,
}

/// What kind of change was held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HeldKind {
    /// Deletions of live routes no Node needs.
    RouteDeletions,
    /// Nodes turned from working to `NetworkUnavailable=True`.
    UnavailableNodes,
}

impl HeldKind {
    /// Both kinds.
    pub const ALL: [HeldKind; 2] = [HeldKind::RouteDeletions, HeldKind::UnavailableNodes];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            HeldKind::RouteDeletions => "route_deletion",
            HeldKind::UnavailableNodes => "unavailable_node",
        }
    }

    /// The flag that bounds it.
    pub fn flag(self) -> &'static str {
        match self {
            HeldKind::RouteDeletions => "--max-route-deletions",
            HeldKind::UnavailableNodes => "--max-unavailable-nodes",
        }
    }
}

impl fmt::Display for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            HeldKind::RouteDeletions => "delete live routes that no Node needs",
            HeldKind::UnavailableNodes => "turn working Nodes NetworkUnavailable=True",
        };
        write!(
            f,
            "held: this pass would {what} for {} at once, more than {} {} allows ({}); none of them is made. If the change is meant, raise {} (100% lifts it)",
            self.planned,
            self.kind.flag(),
            self.budget,
            self.max,
            self.kind.flag()
        )
    }
}

/// Whether `d` counts against `--max-route-deletions`: a live route that
/// goes with nothing created in its place.
pub fn bounded_deletion(d: &Deletion) -> bool {
    !d.route.blackhole
        && matches!(
            d.reason,
            DeletionReason::NodeGone
                | DeletionReason::NoTargetNode
                | DeletionReason::CidrNotAssigned
                | DeletionReason::NodeExcluded
        )
}

/// Whether writing `n`'s condition after the pass turns a working Node
/// (`False` or `Unknown` now) `True`. A Node with no condition yet, or one
/// `True` already, is not counted: holding it would take nothing back.
pub fn turns_unavailable(
    n: &NodePlan,
    failure: &dyn Fn(&OpKey) -> Option<NetworkCondition>,
) -> bool {
    let Some(after) = n.condition_given(failure) else {
        return false;
    };
    after.status() == "True"
        && n.current
            .as_ref()
            .is_some_and(|c| c.status == "False" || c.status == "Unknown")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse_as_counts_and_percentages_and_refuse_the_rest() {
        assert_eq!("10%".parse(), Ok(Budget::Percent(10)));
        assert_eq!(" 7 ".parse(), Ok(Budget::Count(7)));
        assert_eq!("100%".parse(), Ok(Budget::Percent(100)));
        for bad in ["101%", "-1", "ten", "", "%"] {
            assert!(bad.parse::<Budget>().is_err(), "{bad}");
        }
    }

    #[test]
    fn ten_percent_holds_three_of_ten_and_eleven_of_a_hundred_but_not_two() {
        let b = Budget::Percent(10);
        assert_eq!(b.max(10), 2);
        assert_eq!(b.max(3), 2);
        assert_eq!(b.max(100), 10);
        assert_eq!(Budget::Percent(100).max(0), 0);
        assert_eq!(Budget::Percent(100).max(5000), 5000);
        assert_eq!(Budget::Count(10).max(3), 10);
    }
}
