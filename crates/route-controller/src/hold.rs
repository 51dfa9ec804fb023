//! Operations the loop holds back on purpose, as opposed to the retry
//! book's failed ones: a deletion whose Node just disappeared, and the repair
//! of a blackhole that came back.
//!
//! Owned by the reconcile loop, like the [`crate::retry::RetryBook`]. Each
//! pass asks which of its plan's operations are held and when the earliest
//! hold ends, so the loop wakes itself then.
//!
//! - **Deletion grace.** A Node deleted and re-created under the same name
//!   with the same pod CIDR (a replaced VM, a kubelet re-registering) would
//!   lose its route for the time of a delete and a create. A deletion whose
//!   only cause is that its Node is gone waits `grace`; if the Node is back by
//!   then, the route is simply kept. The same holds for a live Node that
//!   seems to have lost its pod CIDR: pod CIDRs cannot change once set, so
//!   that is a stale view (a relist served from the API server's watch cache
//!   can be older than what the watch already showed) and the watch catches
//!   up within the grace. Deletions that free a CIDR or room another Node
//!   needs, blackholes and address changes never wait: waiting would harm.
//! - **Blackholes that cannot be repaired.** A route whose instance is
//!   stopped is a blackhole; replacing it points it at the same stopped
//!   instance and the next listing shows a blackhole again. The first repair
//!   is immediate; each recurrence waits twice as long as the one before,
//!   from [`BLACKHOLE_REPAIR_FLOOR`] up to the backoff maximum, and is
//!   reported once. Until the cloud-node-lifecycle controller deletes the
//!   Node, that is all that can be done.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use route_core::{Cidr, Creation, CreationReason, DeletionReason, Plan, Text};
use tokio::time::Instant;

use crate::retry::OpKey;

/// A blackhole repair is the Node's by name and instance, not by UID: a Node
/// re-created under the same name on the same stopped instance has the same
/// blackhole, and repairing it at once again would change nothing.
type RepairKey = (Text, Cidr, Option<Text>);

fn repair_key(c: &Creation, cidr: Cidr) -> RepairKey {
    (
        c.route.target_node.clone(),
        cidr,
        c.route.target_provider_id.clone(),
    )
}

/// Deletions that may wait for the grace: their Node, or its pod CIDR, is
/// gone from the view, which a re-creation or a stale relist explains.
fn may_wait(reason: DeletionReason) -> bool {
    matches!(
        reason,
        DeletionReason::NodeGone | DeletionReason::CidrNotAssigned
    )
}

/// The least wait before repairing a blackhole that came back. A route that
/// is a blackhole again right after its repair names an instance that is
/// stopped, and instances stay stopped for minutes; when it runs again, its
/// route is active again without any call.
pub const BLACKHOLE_REPAIR_FLOOR: Duration = Duration::from_secs(60);

/// Which operations of one plan are held, and until when.
#[derive(Debug, Default, Clone)]
pub struct Held {
    /// One flag per `plan.deletions`.
    pub deletions: Vec<bool>,
    /// One flag per `plan.creations`.
    pub creations: Vec<bool>,
    /// When the earliest hold ends.
    pub until: Option<Instant>,
    /// Blackholes found to have come back in this pass, first time each:
    /// (node name, node UID, CIDR, next repair).
    pub new_recurrences: Vec<(String, String, Cidr, Instant)>,
}

#[derive(Debug, Clone, Copy)]
struct Repair {
    /// Successful replacements so far.
    repairs: u32,
    /// When the last one succeeded.
    last: Instant,
    /// The recurrence has been reported.
    reported: bool,
    /// The repair was held until then; when that passes, only a fresh
    /// listing may decide it, since the instance may be running again.
    held_until: Option<Instant>,
}

/// See the module docs.
#[derive(Debug)]
pub struct Holds {
    grace: Duration,
    max_wait: Duration,
    /// Deletions held for grace, by when they were first planned.
    gone_since: HashMap<OpKey, Instant>,
    /// Blackhole repairs by (node name, CIDR, providerID).
    repairs: HashMap<RepairKey, Repair>,
}

impl Holds {
    /// Deletions of gone Nodes wait `grace`; blackhole repairs wait at most `max_wait`.
    pub fn new(grace: Duration, max_wait: Duration) -> Self {
        Self {
            grace,
            max_wait: max_wait.max(BLACKHOLE_REPAIR_FLOOR),
            gone_since: HashMap::new(),
            repairs: HashMap::new(),
        }
    }

    /// Which operations of `plan` are held at `now`. `full` says the plan was
    /// made from a fresh listing, which is the only evidence that a repaired
    /// blackhole is healthy again. `room` is how many routes a route target
    /// (table) can still take (`None`: no limit): when the plan's creations
    /// in a target fit only if gone Nodes' routes go, those deletions do not
    /// wait. `due` says whether a creation's retry backoff lets it run now.
    pub fn hold(
        &mut self,
        plan: &Plan,
        now: Instant,
        full: bool,
        room: impl Fn(&str) -> Option<usize>,
        due: impl Fn(&Creation) -> bool,
    ) -> Held {
        let mut held = Held {
            deletions: vec![false; plan.deletions.len()],
            creations: vec![false; plan.creations.len()],
            ..Held::default()
        };
        let earliest = |t: Instant, held: &mut Held| {
            held.until = Some(held.until.map_or(t, |u| u.min(t)));
        };

        // Deletion grace.
        let needed: HashSet<usize> = plan
            .creations
            .iter()
            .flat_map(|c| c.after.iter().copied())
            .collect();
        let mut planned = HashSet::new();
        // Per target: creations, and deletions that go at once anyway.
        let mut per_target: HashMap<&str, (usize, usize)> = HashMap::new();
        for c in &plan.creations {
            per_target.entry(c.route.target.as_str()).or_default().0 += 1;
        }
        for d in plan.deletions.iter().filter(|d| !may_wait(d.reason)) {
            per_target.entry(d.route.target.as_str()).or_default().1 += 1;
        }
        let short_of_room = per_target.iter().any(|(target, (creations, freed))| {
            room(target).is_some_and(|r| *creations > r.saturating_add(*freed))
        });
        if !self.grace.is_zero() && !short_of_room {
            for (i, d) in plan.deletions.iter().enumerate() {
                if !may_wait(d.reason) || needed.contains(&i) {
                    continue;
                }
                let key = OpKey::delete(d);
                let since = *self.gone_since.entry(key.clone()).or_insert(now);
                planned.insert(key);
                let until = since + self.grace;
                if now < until {
                    held.deletions[i] = true;
                    earliest(until, &mut held);
                }
            }
        }
        self.gone_since.retain(|k, _| planned.contains(k));

        // Blackholes that came back.
        let mut replacing = HashSet::new();
        for (i, c) in plan.creations.iter().enumerate() {
            if c.reason != CreationReason::ReplacesBlackhole {
                continue;
            }
            let Some(cidr) = c.route.destination.cidr() else {
                continue;
            };
            let key = repair_key(c, cidr);
            replacing.insert(key.clone());
            // A blackhole is deleted only to be replaced: while its
            // replacement waits for a retry backoff, deleting it would change
            // nothing for the better and cost a call each pass.
            let mut hold_deletion = !due(c);
            if let Some(r) = self.repairs.get_mut(&key) {
                let wait = BLACKHOLE_REPAIR_FLOOR
                    .saturating_mul(1u32 << (r.repairs.saturating_sub(1)).min(16))
                    .min(self.max_wait);
                let until = r.last + wait;
                if full && r.held_until.is_some_and(|u| now >= u) {
                    r.held_until = None;
                }
                if now < until {
                    r.held_until = Some(until);
                    held.creations[i] = true;
                    hold_deletion = true;
                    earliest(until, &mut held);
                }
                if !r.reported {
                    r.reported = true;
                    held.new_recurrences.push((
                        c.route.target_node.to_string(),
                        c.name_hint.clone(),
                        cidr,
                        until.max(now),
                    ));
                }
            }
            if hold_deletion {
                for &d in &c.after {
                    if plan.deletions[d].reason == DeletionReason::Blackhole {
                        held.deletions[d] = true;
                    }
                }
            }
        }
        if full {
            // A listing with a live route for the pair (nothing to create)
            // or without the Node: repaired for good, or moot. A pair whose
            // route is missing is mid-repair (its blackhole was deleted, the
            // creation is pending) and stays.
            let creating: HashSet<RepairKey> = plan
                .creations
                .iter()
                .filter_map(|c| Some(repair_key(c, c.route.destination.cidr()?)))
                .collect();
            self.repairs
                .retain(|k, _| replacing.contains(k) || creating.contains(k));
        }
        held
    }

    /// Deletion `deletion` of `plan` took effect (or may have: its answer
    /// was lost) at `now`: a blackhole deleted to be replaced is one repair,
    /// however its creation then fares.
    pub fn deletion_landed(&mut self, plan: &Plan, deletion: usize, now: Instant) {
        if plan.deletions[deletion].reason != DeletionReason::Blackhole {
            return;
        }
        if let Some(c) = plan
            .creations
            .iter()
            .find(|c| c.reason == CreationReason::ReplacesBlackhole && c.after.contains(&deletion))
        {
            self.repaired(c, now);
        }
    }

    /// Blackhole replacement `c` took effect (or may have) at `now`.
    pub fn repaired(&mut self, c: &Creation, now: Instant) {
        let Some(cidr) = c.route.destination.cidr() else {
            return;
        };
        let r = self.repairs.entry(repair_key(c, cidr)).or_insert(Repair {
            repairs: 0,
            last: now,
            reported: false,
            held_until: None,
        });
        r.repairs = r.repairs.saturating_add(1);
        r.last = now;
    }

    /// A held repair is due: the next pass must list the cloud rather than
    /// trust a cached table that still shows the blackhole it saw then.
    pub fn wants_listing(&self, now: Instant) -> bool {
        self.repairs
            .values()
            .any(|r| r.held_until.is_some_and(|u| now >= u))
    }

    /// Blackholes repaired at least once and seen again, not yet healthy.
    pub fn recurring_blackholes(&self) -> usize {
        self.repairs.values().filter(|r| r.reported).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use route_core::{NodeView, PlanConfig, Route, parse_cluster_cidrs, plan};

    fn cfg() -> PlanConfig {
        PlanConfig {
            cluster_cidrs: parse_cluster_cidrs("10.244.0.0/16").unwrap(),
            ..PlanConfig::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn gone_nodes_route_waits_the_grace_and_a_needed_cidr_does_not() {
        let mut h = Holds::new(Duration::from_secs(2), Duration::from_secs(300));
        let gone = Route::from_text("node-1", "10.244.1.0/24").named("r1");
        let moved = Route::from_text("node-2", "10.244.2.0/24").named("r2");
        let nodes = [NodeView::new("node-3", "u3", &["10.244.2.0/24"])];
        let p = plan(&nodes, &[gone, moved], &cfg());
        assert_eq!(p.deletions.len(), 2);
        let t0 = Instant::now();
        let held = h.hold(&p, t0, true, |_| None, |_| true);
        // The first frees nothing anyone needs; the second frees node-3's CIDR.
        assert_eq!(held.deletions, vec![true, false]);
        assert_eq!(held.until, Some(t0 + Duration::from_secs(2)));
        let later = h.hold(&p, t0 + Duration::from_secs(2), false, |_| None, |_| true);
        assert_eq!(later.deletions, vec![false, false]);
        // A full table: node-3's creation fits only once the gone routes go.
        let mut h = Holds::new(Duration::from_secs(2), Duration::from_secs(300));
        let full = h.hold(&p, t0, true, |_| Some(0), |_| true);
        assert_eq!(full.deletions, vec![false, false]);
    }

    #[tokio::test(start_paused = true)]
    async fn blackhole_repairs_back_off_after_the_first_and_report_once() {
        let mut h = Holds::new(Duration::from_secs(2), Duration::from_secs(300));
        let nodes = [NodeView::new("node-1", "u1", &["10.244.1.0/24"])];
        let bh = Route::from_text("node-1", "10.244.1.0/24")
            .named("r1")
            .blackholed();
        let p = plan(&nodes, &[bh], &cfg());
        let t0 = Instant::now();
        let first = h.hold(&p, t0, true, |_| None, |_| true);
        assert!(
            !first.creations[0] && !first.deletions[0],
            "first repair is immediate"
        );
        h.repaired(&p.creations[0], t0);
        // The next listing shows it blackholed again.
        let t1 = t0 + Duration::from_secs(10);
        let again = h.hold(&p, t1, true, |_| None, |_| true);
        assert!(again.creations[0] && again.deletions[0]);
        assert_eq!(again.until, Some(t0 + BLACKHOLE_REPAIR_FLOOR));
        assert_eq!(again.new_recurrences.len(), 1);
        assert_eq!(h.recurring_blackholes(), 1);
        let t2 = t0 + BLACKHOLE_REPAIR_FLOOR;
        assert!(!h.hold(&p, t2, true, |_| None, |_| true).creations[0]);
        h.repaired(&p.creations[0], t2);
        let third = h.hold(&p, t2 + Duration::from_secs(10), true, |_| None, |_| true);
        assert_eq!(third.until, Some(t2 + 2 * BLACKHOLE_REPAIR_FLOOR));
        assert!(third.new_recurrences.is_empty(), "reported once");
        // Healthy in a listing: forgotten.
        let healthy = plan(
            &nodes,
            &[Route::from_text("node-1", "10.244.1.0/24")],
            &cfg(),
        );
        h.hold(
            &healthy,
            t2 + Duration::from_secs(20),
            true,
            |_| None,
            |_| true,
        );
        assert_eq!(h.recurring_blackholes(), 0);
    }
}
