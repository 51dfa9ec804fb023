//! The gate: one verdict for every planned operation, and the one place
//! that answers "why was this route not sent?".
//!
//! The planner says *what* must change; [`gate`] says, for each operation
//! of the plan by its [`OpKey`], whether it runs in this pass:
//!
//! | verdict | why | ends |
//! |---|---|---|
//! | [`Verdict::Run`] | nothing holds it | |
//! | [`Verdict::BackingOff`] | it failed before and its retry backoff runs ([`RetryBook`]) | at the backoff's end |
//! | [`Verdict::Held`] [`Hold::DeletionGrace`] | its Node (or the Node's pod CIDR) just went from the view: a same-name re-creation or a stale relist explains that | after `--route-deletion-grace` |
//! | [`Verdict::Held`] [`Hold::BlackholeRecurring`] | a blackhole came back after its repair: the instance is stopped | 60 s, doubling per recurrence, up to the backoff maximum |
//! | [`Verdict::Held`] [`Hold::ReplacementWaits`] | a blackhole deleted only to be replaced, while its replacement waits | with its replacement |
//! | [`Verdict::NoRoom`] | the provider's per-table route limit leaves no room in its table | when a deletion frees room |
//! | [`Verdict::Blocked`] | it must follow deletions that do not run in this pass | with those deletions |
//! | [`Verdict::Bounded`] | a deletion of a live route no Node needs, in a pass that would make more of them than `--max-route-deletions` allows ([`crate::bounds`]) | when the pass plans fewer, or the bound is raised |
//!
//! Two things delay an operation after the gate and are not verdicts: the
//! executor's throttle paces what runs when the cloud throttles (it
//! delays, never drops), and a creation whose deletion fails during the pass
//! is reported blocked by the executor.
//!
//! Room has one rule: a table holds what was listed in it, less the
//! deletions that run in this pass, plus the creations that run (a
//! replacement in place takes none). The deletion grace is waived in a table
//! whose creations (those that run, and those waiting for their backoff,
//! such as one refused for a full table) would not fit otherwise: waiting
//! would keep a Node dark.
//!
//! State: [`Holds`] is owned by the reconcile loop, like the
//! [`RetryBook`]: when each gone Node's route was first planned for
//! deletion, and each blackhole's repairs. The gate reads and updates it;
//! `absorb` records repairs as they land.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use route_core::{
    Cidr, Creation, CreationReason, DeletionReason, IpFamily, OpKey, Plan, Route, Text,
};
use tokio::time::Instant;

use crate::bounds::{Budget, Held, HeldKind, bounded_deletion};
use crate::retry::RetryBook;

pub use crate::retry::BLACKHOLE_REPAIR_FLOOR;

/// Whether an operation runs in this pass, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Sent in this pass.
    Run,
    /// Failed before; its retry backoff ends at `until`.
    BackingOff {
        /// When it is due.
        until: Instant,
    },
    /// Held back on purpose until `until`.
    Held {
        /// When the hold ends.
        until: Instant,
        /// Why.
        why: Hold,
    },
    /// Its table is full under the provider's route limit: refused without
    /// a request.
    NoRoom {
        /// The table (empty with a single table).
        table: Text,
        /// The provider's limit per table.
        max: usize,
    },
    /// It must follow these deletions, which do not run in this pass.
    Blocked {
        /// The deletions it waits for.
        by: Vec<OpKey>,
    },
    /// One of more deletions of live routes than `--max-route-deletions`
    /// allows in one pass: none of them runs.
    Bounded {
        /// The deletions of the kind the pass planned.
        planned: usize,
        /// How many the bound allows.
        max: usize,
    },
}

/// Why an operation is held back on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// The route's Node or its pod CIDR just went from the view.
    DeletionGrace,
    /// A repaired blackhole came back: its instance is stopped.
    BlackholeRecurring,
    /// A blackhole deleted only to be replaced, while its replacement waits.
    ReplacementWaits,
}

impl Verdict {
    /// The verdict runs the operation.
    pub fn runs(&self) -> bool {
        matches!(self, Verdict::Run)
    }

    /// Until when a verdict that ends by itself holds the operation.
    fn until(&self) -> Option<Instant> {
        match self {
            Verdict::BackingOff { until } | Verdict::Held { until, .. } => Some(*until),
            _ => None,
        }
    }

    /// The verdict in words, with waits counted from `now`.
    pub fn describe(&self, now: Instant) -> String {
        let wait = |until: &Instant| {
            let d = until.saturating_duration_since(now);
            format!("{:.1}s", d.as_secs_f64())
        };
        match self {
            Verdict::Run => "runs in this pass".into(),
            Verdict::BackingOff { until } => {
                format!("retry backoff after a failure, due in {}", wait(until))
            }
            Verdict::Held { until, why } => format!("{why}, for {} more", wait(until)),
            Verdict::NoRoom { table, max } => {
                let table = if table.is_empty() {
                    "the route table".to_string()
                } else {
                    format!("route table {table}")
                };
                format!(
                    "no room: the provider allows at most {max} routes and {table} is full; delete routes or raise the limit"
                )
            }
            Verdict::Bounded { planned, max } => format!(
                "held: one of {planned} deletions of live routes no Node needs in this pass, more than --max-route-deletions allows ({max}); raise it if they are meant"
            ),
            Verdict::Blocked { by } => {
                let by: Vec<String> = by.iter().map(ToString::to_string).collect();
                format!(
                    "waits for {}, which does not run in this pass",
                    by.join(", ")
                )
            }
        }
    }
}

impl fmt::Display for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Hold::DeletionGrace => {
                "held for the deletion grace (its Node or pod CIDR just went from the view)"
            }
            Hold::BlackholeRecurring => {
                "held: the blackhole came back after its repair (the instance is stopped)"
            }
            Hold::ReplacementWaits => "held: the blackhole's replacement waits",
        })
    }
}

/// A blackhole found to have come back, reported once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recurrence {
    /// The Node's name.
    pub node: String,
    /// The Node's UID.
    pub uid: String,
    /// The pod CIDR.
    pub cidr: Cidr,
    /// When the next repair is sent.
    pub next_repair: Instant,
}

/// The verdicts of one plan.
#[derive(Debug, Default, Clone)]
pub struct Gated {
    verdicts: HashMap<OpKey, Verdict>,
    /// When the earliest hold ends (the loop wakes then; backoffs wake it
    /// through the retry book).
    pub until: Option<Instant>,
    /// Blackholes found to have come back in this pass, first time each.
    pub new_recurrences: Vec<Recurrence>,
    /// Deletions held by `--max-route-deletions`, if any.
    pub held: Option<Held>,
}

impl Gated {
    /// Every operation of `plan` runs (tests and tools).
    pub fn run_all(plan: &Plan) -> Self {
        let mut g = Gated::default();
        for k in keys(plan) {
            g.verdicts.insert(k, Verdict::Run);
        }
        g
    }

    /// The verdict for `key`; `None` for an operation that was not gated,
    /// which therefore does not run.
    pub fn verdict(&self, key: &OpKey) -> Option<&Verdict> {
        self.verdicts.get(key)
    }

    /// The operation runs in this pass.
    pub fn runs(&self, key: &OpKey) -> bool {
        self.verdict(key).is_some_and(Verdict::runs)
    }

    /// Every verdict, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&OpKey, &Verdict)> {
        self.verdicts.iter()
    }

    /// Sets a verdict (tests).
    pub fn set(&mut self, key: OpKey, verdict: Verdict) {
        self.verdicts.insert(key, verdict);
    }

    fn hold_until(&mut self, t: Instant) {
        self.until = Some(self.until.map_or(t, |u| u.min(t)));
    }
}

fn keys(plan: &Plan) -> impl Iterator<Item = OpKey> + '_ {
    plan.deletions
        .iter()
        .map(|d| d.key())
        .chain(plan.creations.iter().map(Creation::key))
}

/// How many routes each table can take: the provider's limit per table and
/// what the listing found in each.
#[derive(Debug, Clone, Default)]
pub struct Room {
    max: Option<usize>,
    per_family: bool,
    listed: HashMap<Pool, usize>,
    /// `--max-route-deletions`, and the live routes listed per table it is
    /// a share of.
    deletions: Option<(Budget, HashMap<Text, usize>)>,
}

/// What one route limit counts: a table, and with a cloud that counts IPv4
/// and IPv6 routes apart (AWS), one family of it.
pub type Pool = (Text, Option<IpFamily>);

impl Room {
    /// Room under `max` routes per table (`None`: no limit), counted per
    /// address family when `per_family`, given `table`, the routes the plan
    /// was made from.
    pub fn new(max: Option<usize>, per_family: bool, table: &[Route]) -> Self {
        let mut room = Self {
            max,
            per_family,
            listed: HashMap::new(),
            deletions: None,
        };
        // Counting every route on every pass of a cloud without a limit
        // would be wasted work.
        if max.is_some() {
            for r in table {
                *room.listed.entry(room.pool(r)).or_default() += 1;
            }
        }
        room
    }

    /// Bounds the deletions of live routes no Node needs, per table, to what
    /// `budget` allows of the live routes listed in that table
    /// ([`crate::bounds`]).
    pub fn with_deletion_budget(mut self, budget: Budget, table: &[Route]) -> Self {
        let mut live: HashMap<Text, usize> = HashMap::new();
        for r in table.iter().filter(|r| !r.blackhole) {
            *live.entry(r.table.clone()).or_default() += 1;
        }
        self.deletions = Some((budget, live));
        self
    }

    /// Adds the routes the listing left out but the cloud counts against
    /// its limit ([`route_cloud::CloudRoutes::unlisted_routes`]).
    pub fn with_unlisted(
        mut self,
        unlisted: impl IntoIterator<Item = ((Text, IpFamily), usize)>,
    ) -> Self {
        if self.max.is_some() {
            for ((table, family), n) in unlisted {
                let family = self.per_family.then_some(family);
                *self.listed.entry((table, family)).or_default() += n;
            }
        }
        self
    }

    /// No limit.
    pub fn unlimited() -> Self {
        Self::default()
    }

    /// The limit this route counts against.
    pub fn pool(&self, r: &Route) -> Pool {
        let family = if self.per_family {
            r.destination.cidr().map(|c| c.family())
        } else {
            None
        };
        (r.table.clone(), family)
    }

    /// The limit per table (or per table and family), if the cloud has one.
    pub fn max(&self) -> Option<usize> {
        self.max
    }

    /// The routes listed against each limit.
    pub fn listed(&self) -> impl Iterator<Item = (&Pool, usize)> {
        self.listed.iter().map(|(p, n)| (p, *n))
    }

    /// Routes per limit once the deletions of `plan` that `lands` lets
    /// through have landed: the one count both room rules start from.
    fn after_deletions(&self, plan: &Plan, lands: impl Fn(&OpKey) -> bool) -> HashMap<Pool, usize> {
        let mut used = self.listed.clone();
        for d in &plan.deletions {
            if lands(&d.key())
                && let Some(n) = used.get_mut(&self.pool(&d.route))
            {
                *n = n.saturating_sub(1);
            }
        }
        used
    }
}

/// A blackhole repair is the Node's by name and instance, not by UID: a Node
/// re-created under the same name on the same stopped instance has the same
/// blackhole, and repairing it at once again would change nothing.
type RepairKey = (Text, Cidr, Option<Text>);

fn repair_key(c: &Creation) -> Option<RepairKey> {
    Some((
        c.route.node.clone(),
        c.route.destination.cidr()?,
        c.route.node_provider_id.clone(),
    ))
}

/// Whether `key` deletes a blackhole: the planner deletes a listed
/// blackhole for that reason alone ([`DeletionReason::Blackhole`]).
fn deletes_blackhole(key: &OpKey) -> bool {
    matches!(key, OpKey::Delete { route, .. } if route.blackhole)
}

/// Deletions that may wait for the grace: their Node, or its pod CIDR, is
/// gone from the view, which a re-creation or a stale relist explains.
/// Blackholes and address changes never wait: waiting would harm.
fn may_wait(reason: DeletionReason) -> bool {
    matches!(
        reason,
        DeletionReason::NodeGone | DeletionReason::CidrNotAssigned
    )
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

/// What the gate remembers between passes. See the module docs.
#[derive(Debug)]
pub struct Holds {
    grace: Duration,
    max_wait: Duration,
    /// Deletions that may wait for the grace, by when they were first planned.
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

    /// Deletion `key` of `plan` took effect (or may have: its answer was
    /// lost) at `now`: a blackhole deleted to be replaced is one repair,
    /// however its creation then fares.
    pub fn deletion_landed(&mut self, plan: &Plan, key: &OpKey, now: Instant) {
        if !deletes_blackhole(key) {
            return;
        }
        if let Some(c) = plan
            .creations
            .iter()
            .find(|c| c.reason == CreationReason::ReplacesBlackhole && c.after.contains(key))
        {
            self.repaired(c, now);
        }
    }

    /// Blackhole replacement `c` took effect (or may have) at `now`.
    pub fn repaired(&mut self, c: &Creation, now: Instant) {
        let Some(key) = repair_key(c) else {
            return;
        };
        let r = self.repairs.entry(key).or_insert(Repair {
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

    /// When the repair of blackhole replacement `c` may run, if it must
    /// wait, reporting a first recurrence into `gated`.
    fn repair_wait(
        &mut self,
        c: &Creation,
        now: Instant,
        listed: bool,
        gated: &mut Gated,
    ) -> Option<Instant> {
        let r = self.repairs.get_mut(&repair_key(c)?)?;
        let wait = BLACKHOLE_REPAIR_FLOOR
            .saturating_mul(1u32 << (r.repairs.saturating_sub(1)).min(16))
            .min(self.max_wait);
        let until = r.last + wait;
        if listed && r.held_until.is_some_and(|u| now >= u) {
            r.held_until = None;
        }
        if !r.reported {
            r.reported = true;
            gated.new_recurrences.push(Recurrence {
                node: c.route.node.to_string(),
                uid: c.node_uid.clone(),
                cidr: c.route.destination.cidr()?,
                next_repair: until.max(now),
            });
        }
        (now < until).then(|| {
            r.held_until = Some(until);
            until
        })
    }
}

/// Gives every operation of `plan` its verdict at `now`. `listed` says the
/// plan was made from a fresh listing, the only evidence that a repaired
/// blackhole is healthy again. See the module docs for the rules.
pub fn gate(
    plan: &Plan,
    holds: &mut Holds,
    book: &RetryBook,
    room: &Room,
    now: Instant,
    listed: bool,
) -> Gated {
    let mut g = Gated::default();

    // Retry backoff, for every operation that failed before.
    for key in keys(plan) {
        let v = match book.due_at(&key, now) {
            Some(until) => Verdict::BackingOff { until },
            None => Verdict::Run,
        };
        g.verdicts.insert(key, v);
    }

    // Blackholes that came back, and the deletions of blackholes whose
    // replacement waits: deleting one would change nothing for the better
    // and cost a call each pass.
    let mut replacing = HashSet::new();
    for c in plan
        .creations
        .iter()
        .filter(|c| c.reason == CreationReason::ReplacesBlackhole)
    {
        replacing.extend(repair_key(c));
        let key = c.key();
        if let Some(until) = holds.repair_wait(c, now, listed, &mut g) {
            g.verdicts.insert(
                key.clone(),
                Verdict::Held {
                    until,
                    why: Hold::BlackholeRecurring,
                },
            );
            g.hold_until(until);
        }
        let Some(until) = g.verdicts.get(&key).and_then(Verdict::until) else {
            continue;
        };
        for d in c.after.iter().filter(|k| deletes_blackhole(k)) {
            if let Some(v) = g.verdicts.get_mut(d)
                && v.runs()
            {
                *v = Verdict::Held {
                    until,
                    why: Hold::ReplacementWaits,
                };
            }
        }
    }
    if listed {
        // A listing with a live route for the pair (nothing to create) or
        // without the Node: repaired for good, or moot. A pair whose route
        // is missing is mid-repair (its blackhole was deleted, the creation
        // is pending) and stays.
        let creating: HashSet<RepairKey> = plan.creations.iter().filter_map(repair_key).collect();
        holds
            .repairs
            .retain(|k, _| replacing.contains(k) || creating.contains(k));
    }

    // Deletion grace, waived in a table whose creations would not fit.
    let needed: HashSet<&OpKey> = plan.creations.iter().flat_map(|c| &c.after).collect();
    let graced: Vec<OpKey> = plan
        .deletions
        .iter()
        .filter(|d| may_wait(d.reason))
        .map(|d| d.key())
        .filter(|k| !needed.contains(k))
        .collect();
    let short = short_of_room(plan, &g, room, &graced);
    let mut planned = HashSet::new();
    if !holds.grace.is_zero() {
        for key in graced {
            if short.contains(table_of(&key)) {
                continue;
            }
            let since = *holds.gone_since.entry(key.clone()).or_insert(now);
            let until = since + holds.grace;
            if now < until
                && let Some(v) = g.verdicts.get_mut(&key)
                && v.runs()
            {
                *v = Verdict::Held {
                    until,
                    why: Hold::DeletionGrace,
                };
                g.hold_until(until);
            }
            planned.insert(key);
        }
    }
    holds.gone_since.retain(|k, _| planned.contains(k));

    // Bounded passes: deletions of live routes no Node needs, when more
    // of them would run in one table than the bound allows of that table
    // (crate::bounds). A Node gone from a cluster with three tables is one
    // deletion in each, not three. Before the creations that follow them
    // are judged, so those wait too.
    if let Some((budget, live)) = &room.deletions {
        let mut by_table: HashMap<&Text, Vec<OpKey>> = HashMap::new();
        for d in plan.deletions.iter().filter(|d| bounded_deletion(d)) {
            let key = d.key();
            if g.runs(&key) {
                by_table.entry(&d.route.table).or_default().push(key);
            }
        }
        let mut tables: Vec<_> = by_table.into_iter().collect();
        tables.sort_by(|a, b| a.0.cmp(b.0));
        for (table, keys) in tables {
            let max = budget.max(live.get(table).copied().unwrap_or_default());
            if keys.len() <= max {
                continue;
            }
            let planned = keys.len();
            for key in keys {
                g.verdicts.insert(key, Verdict::Bounded { planned, max });
            }
            // One report for the pass: the table that went furthest past.
            if g.held.as_ref().is_none_or(|h| planned > h.planned) {
                g.held = Some(Held {
                    kind: HeldKind::RouteDeletions,
                    planned,
                    max,
                    budget: *budget,
                });
            }
        }
    }

    // Creations that must follow deletions which do not run.
    for c in &plan.creations {
        let key = c.key();
        if !g.runs(&key) {
            continue;
        }
        let by: Vec<OpKey> = c.after.iter().filter(|d| !g.runs(d)).cloned().collect();
        if !by.is_empty() {
            g.verdicts.insert(key, Verdict::Blocked { by });
        }
    }

    // Room, in plan order.
    if let Some(max) = room.max {
        let mut used = room.after_deletions(plan, |k| g.runs(k));
        for c in plan.creations.iter().filter(|c| c.replaces.is_none()) {
            let key = c.key();
            if !g.runs(&key) {
                continue;
            }
            let n = used.entry(room.pool(&c.route)).or_default();
            if *n >= max {
                let table = c.route.table.clone();
                g.verdicts.insert(key, Verdict::NoRoom { table, max });
            } else {
                *n += 1;
            }
        }
    }
    g
}

fn table_of(key: &OpKey) -> &Text {
    match key {
        OpKey::Create { table, .. } => table,
        OpKey::Delete { route, .. } => &route.table,
    }
}

/// The tables whose creations that run or wait for their backoff would not
/// fit if the deletions in `graced` waited for the grace.
fn short_of_room<'p>(
    plan: &'p Plan,
    g: &Gated,
    room: &Room,
    graced: &[OpKey],
) -> HashSet<&'p Text> {
    let Some(max) = room.max else {
        return HashSet::new();
    };
    let graced: HashSet<&OpKey> = graced.iter().collect();
    let mut used = room.after_deletions(plan, |k| g.runs(k) && !graced.contains(k));
    let mut short = HashSet::new();
    for c in plan.creations.iter().filter(|c| c.replaces.is_none()) {
        // A creation in its backoff counts: one refused for a full table
        // waits for exactly the room these deletions would free, and is
        // released the moment one lands.
        if !matches!(
            g.verdict(&c.key()),
            Some(Verdict::Run | Verdict::BackingOff { .. })
        ) {
            continue;
        }
        let n = used.entry(room.pool(&c.route)).or_default();
        *n += 1;
        if *n > max {
            short.insert(&c.route.table);
        }
    }
    short
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::BackoffConfig;
    use route_cloud::{CloudError, ErrorKind};
    use route_core::{NodeView, PlanConfig, parse_cluster_cidrs, plan};

    fn cfg() -> PlanConfig {
        PlanConfig {
            cluster_cidrs: parse_cluster_cidrs("10.244.0.0/16").unwrap(),
            ..PlanConfig::default()
        }
    }

    fn book() -> RetryBook {
        RetryBook::new(BackoffConfig {
            jitter: 0.0,
            ..BackoffConfig::default()
        })
    }

    fn holds() -> Holds {
        Holds::new(Duration::from_secs(2), Duration::from_secs(300))
    }

    fn verdict(g: &Gated, key: &OpKey) -> Verdict {
        g.verdict(key).cloned().expect("every operation is gated")
    }

    /// `--route-deletion-grace` is for a Node (or pod CIDR) gone from the
    /// view; a Node labelled out of `--node-selector` loses its routes at
    /// once, as `run --help` and docs/flags.md say.
    #[test]
    fn only_a_vanished_node_or_cidr_waits_for_the_deletion_grace() {
        for (reason, waits) in [
            (DeletionReason::NodeGone, true),
            (DeletionReason::CidrNotAssigned, true),
            (DeletionReason::NodeExcluded, false),
            (DeletionReason::NoTargetNode, false),
            (DeletionReason::Blackhole, false),
            (DeletionReason::AddressesChanged, false),
            (DeletionReason::Duplicate, false),
            (DeletionReason::TargetChanged, false),
        ] {
            assert_eq!(may_wait(reason), waits, "{reason:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn run_when_nothing_holds_it() {
        let nodes = [NodeView::new("node-1", "u1", &["10.244.1.0/24"])];
        let p = plan(&nodes, &[], &cfg());
        let g = gate(
            &p,
            &mut holds(),
            &book(),
            &Room::unlimited(),
            Instant::now(),
            true,
        );
        assert_eq!(verdict(&g, &p.creations[0].key()), Verdict::Run);
        assert_eq!(g.until, None);
    }

    #[tokio::test(start_paused = true)]
    async fn deferred_while_the_retry_backoff_runs() {
        let nodes = [NodeView::new("node-1", "u1", &["10.244.1.0/24"])];
        let p = plan(&nodes, &[], &cfg());
        let mut b = book();
        let t0 = Instant::now();
        let e = CloudError::new(ErrorKind::Transient, "boom");
        let due = b.failed(p.creations[0].key(), &e, t0, 0.0);
        let g = gate(&p, &mut holds(), &b, &Room::unlimited(), t0, false);
        assert_eq!(
            verdict(&g, &p.creations[0].key()),
            Verdict::BackingOff { until: due }
        );
        let g = gate(&p, &mut holds(), &b, &Room::unlimited(), due, false);
        assert_eq!(verdict(&g, &p.creations[0].key()), Verdict::Run);
    }

    #[tokio::test(start_paused = true)]
    async fn held_for_the_deletion_grace_unless_its_cidr_is_needed() {
        let mut h = holds();
        let gone = Route::from_text("node-1", "10.244.1.0/24").named("r1");
        let moved = Route::from_text("node-2", "10.244.2.0/24").named("r2");
        let nodes = [NodeView::new("node-3", "u3", &["10.244.2.0/24"])];
        let p = plan(&nodes, &[gone, moved], &cfg());
        let (gone, moved) = (p.deletions[0].key(), p.deletions[1].key());
        let t0 = Instant::now();
        let g = gate(&p, &mut h, &book(), &Room::unlimited(), t0, true);
        let until = t0 + Duration::from_secs(2);
        assert_eq!(
            verdict(&g, &gone),
            Verdict::Held {
                until,
                why: Hold::DeletionGrace
            }
        );
        assert_eq!(verdict(&g, &moved), Verdict::Run, "node-3 needs its CIDR");
        assert_eq!(g.until, Some(until));
        let later = gate(&p, &mut h, &book(), &Room::unlimited(), until, false);
        assert_eq!(verdict(&later, &gone), Verdict::Run);
    }

    #[test]
    fn routes_the_listing_left_out_take_room_under_the_limit_in_their_family() {
        let table = [Route::from_text("a", "10.244.1.0/24").named("r1")];
        let unlisted = [
            (("rtb-1".into(), IpFamily::V4), 3),
            (("rtb-1".into(), IpFamily::V6), 1),
        ];
        let mut t = table.clone();
        t[0].table = "rtb-1".into();
        let per_family = Room::new(Some(50), true, &t).with_unlisted(unlisted.clone());
        let mut used: Vec<(Pool, usize)> =
            per_family.listed().map(|(p, n)| (p.clone(), n)).collect();
        used.sort();
        assert_eq!(
            used,
            [
                (("rtb-1".into(), Some(IpFamily::V4)), 4),
                (("rtb-1".into(), Some(IpFamily::V6)), 1)
            ]
        );
        let together = Room::new(Some(50), false, &t).with_unlisted(unlisted.clone());
        assert_eq!(together.listed().map(|(_, n)| n).sum::<usize>(), 5);
        let unlimited = Room::new(None, true, &t).with_unlisted(unlisted);
        assert_eq!(
            unlimited.listed().count(),
            0,
            "nothing counted without a limit"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_grace_is_waived_in_a_table_whose_creations_would_not_fit() {
        // Two listed routes of gone Nodes in a table of at most two: the
        // new Node's route fits only once one of them goes.
        let table = [
            Route::from_text("gone-1", "10.244.1.0/24").named("r1"),
            Route::from_text("gone-2", "10.244.2.0/24").named("r2"),
        ];
        let nodes = [NodeView::new("node-3", "u3", &["10.244.3.0/24"])];
        let p = plan(&nodes, &table, &cfg());
        let room = Room::new(Some(2), false, &table);
        let g = gate(&p, &mut holds(), &book(), &room, Instant::now(), true);
        assert!(p.deletions.iter().all(|d| g.runs(&d.key())), "{g:?}");
        assert!(g.runs(&p.creations[0].key()));
        // A creation refused for the full table and waiting for its backoff
        // wants that room too (regression: the grace then kept the gone
        // Nodes' routes, and the waiting Node dark, for the grace).
        let mut b = book();
        let quota = CloudError::new(ErrorKind::QuotaExceeded, "full");
        b.failed(p.creations[0].key(), &quota, Instant::now(), 0.0);
        let g = gate(&p, &mut holds(), &b, &room, Instant::now(), true);
        assert!(p.deletions.iter().all(|d| g.runs(&d.key())), "{g:?}");
        // With room to spare, the same deletions wait.
        let room = Room::new(Some(3), false, &table);
        let g = gate(&p, &mut holds(), &book(), &room, Instant::now(), true);
        assert!(p.deletions.iter().all(|d| !g.runs(&d.key())), "{g:?}");
        assert!(g.runs(&p.creations[0].key()));
    }

    #[tokio::test(start_paused = true)]
    async fn no_room_when_the_table_is_full_after_the_deletions_that_run() {
        let nodes: Vec<NodeView> = (1..=3)
            .map(|i| {
                NodeView::new(
                    format!("n{i}"),
                    format!("u{i}"),
                    &[format!("10.244.{i}.0/24").as_str()],
                )
            })
            .collect();
        let p = plan(&nodes, &[], &cfg());
        let g = gate(
            &p,
            &mut holds(),
            &book(),
            &Room::new(Some(2), false, &[]),
            Instant::now(),
            true,
        );
        let verdicts: Vec<Verdict> = p.creations.iter().map(|c| verdict(&g, &c.key())).collect();
        assert_eq!(
            verdicts,
            [
                Verdict::Run,
                Verdict::Run,
                Verdict::NoRoom {
                    table: Text::default(),
                    max: 2
                }
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn blocked_when_a_deletion_it_follows_does_not_run() {
        // An address change: delete, then re-create; the deletion backs off.
        let node = NodeView::new("n1", "u1", &["10.244.1.0/24"])
            .with_addresses(vec![route_core::NodeAddress::internal_ip("10.0.0.2")]);
        let stale = Route::from_text("n1", "10.244.1.0/24")
            .named("r1")
            .with_addresses(vec![route_core::NodeAddress::internal_ip("10.0.0.1")], true);
        let p = plan(&[node], &[stale], &cfg());
        assert_eq!(p.creations[0].after, vec![p.deletions[0].key()]);
        let mut b = book();
        let t0 = Instant::now();
        let e = CloudError::new(ErrorKind::Transient, "boom");
        b.failed(p.deletions[0].key(), &e, t0, 0.0);
        let g = gate(&p, &mut holds(), &b, &Room::unlimited(), t0, true);
        assert_eq!(
            verdict(&g, &p.creations[0].key()),
            Verdict::Blocked {
                by: vec![p.deletions[0].key()]
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_recurring_blackhole_is_held_doubling_and_reported_once() {
        let mut h = holds();
        let nodes = [NodeView::new("node-1", "u1", &["10.244.1.0/24"])];
        let bh = Route::from_text("node-1", "10.244.1.0/24")
            .named("r1")
            .blackholed();
        let p = plan(&nodes, &[bh], &cfg());
        let (del, cre) = (p.deletions[0].key(), p.creations[0].key());
        let t0 = Instant::now();
        let first = gate(&p, &mut h, &book(), &Room::unlimited(), t0, true);
        assert!(
            first.runs(&cre) && first.runs(&del),
            "the first repair is immediate"
        );
        h.deletion_landed(&p, &del, t0);
        // The next listing shows it blackholed again.
        let t1 = t0 + Duration::from_secs(10);
        let again = gate(&p, &mut h, &book(), &Room::unlimited(), t1, true);
        let until = t0 + BLACKHOLE_REPAIR_FLOOR;
        assert_eq!(
            verdict(&again, &cre),
            Verdict::Held {
                until,
                why: Hold::BlackholeRecurring
            }
        );
        assert_eq!(
            verdict(&again, &del),
            Verdict::Held {
                until,
                why: Hold::ReplacementWaits
            }
        );
        assert_eq!(again.until, Some(until));
        assert_eq!(again.new_recurrences.len(), 1);
        assert_eq!(h.recurring_blackholes(), 1);
        assert!(gate(&p, &mut h, &book(), &Room::unlimited(), until, true).runs(&cre));
        h.repaired(&p.creations[0], until);
        let third = gate(
            &p,
            &mut h,
            &book(),
            &Room::unlimited(),
            until + Duration::from_secs(10),
            true,
        );
        assert_eq!(third.until, Some(until + 2 * BLACKHOLE_REPAIR_FLOOR));
        assert!(third.new_recurrences.is_empty(), "reported once");
        // Healthy in a listing: forgotten.
        let healthy = plan(
            &nodes,
            &[Route::from_text("node-1", "10.244.1.0/24")],
            &cfg(),
        );
        gate(
            &healthy,
            &mut h,
            &book(),
            &Room::unlimited(),
            until + Duration::from_secs(20),
            true,
        );
        assert_eq!(h.recurring_blackholes(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_blackholes_deletion_waits_with_its_backed_off_replacement() {
        let nodes = [NodeView::new("node-1", "u1", &["10.244.1.0/24"])];
        let bh = Route::from_text("node-1", "10.244.1.0/24")
            .named("r1")
            .blackholed();
        let p = plan(&nodes, &[bh], &cfg());
        let mut b = book();
        let t0 = Instant::now();
        let e = CloudError::new(ErrorKind::Transient, "boom");
        let due = b.failed(p.creations[0].key(), &e, t0, 0.0);
        let g = gate(&p, &mut holds(), &b, &Room::unlimited(), t0, true);
        assert_eq!(
            verdict(&g, &p.deletions[0].key()),
            Verdict::Held {
                until: due,
                why: Hold::ReplacementWaits
            }
        );
    }
}
