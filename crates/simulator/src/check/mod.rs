//! `cloud-route-controller check`: a randomized model checker.
//!
//! Each seed generates a [`Case`] ([`steps`]): Nodes created, deleted and
//! re-created, late providerIDs and addresses, address changes, stopped
//! instances, routes changed behind the controller's back, foreign and
//! unparsable routes, cloud errors, timeouts that took effect, throttle
//! storms, eventual consistency, slow calls, lost leadership, late Lease
//! renewals, refusals for stopped instances, API-server outages, lost
//! forwarding prerequisites, route tables tagged and untagged, quotas,
//! whole-table writes that meet another writer, a Node watch held back or
//! relisting from a stale cache, a second live replica sharing the
//! Lease, and Lease requests answered slowly while the binary's own
//! election runs against them ([`lease`]) — each class switched on or off
//! by [`Faults`]. [`run_case`] plays it, on tokio's paused
//! clock, against the unchanged [`Controller`] in the seed's mode, with the
//! memory cloud behind a wrapper ([`cloud`]) that checks every call:
//!
//! * no deletion of a route a live Node needs, in the pass's snapshot and
//!   now (a blackhole, or a route whose addresses or instance changed, may be
//!   replaced);
//! * no call about a route outside the cluster CIDRs, unparsable or foreign,
//!   and no creation of a route no Node of the snapshot claims alone;
//! * no mutation started after the replica was told it is not leader, and
//!   none landing after its Lease expired ([`LEASE_GRACE`] later);
//! * nothing written in a table the controller's last list did not name;
//! * `RouteCreated` only when every table the controller knows holds the
//!   Node's routes ([`TARGET_KNOWN`]);
//! * with a second replica, every write checked against the writer's own
//!   fence and Lease, and never both replicas inside their fencing deadline;
//! * no spinning: [`LIVELOCK_PASSES`] passes at one virtual instant stop the run;
//! * no NetworkUnavailable patch says `RouteCreated` for a Node whose
//!   forwarding prerequisite the cloud's last answer about it (same UID)
//!   said is off, and a prerequisite lost behind the controller's back is
//!   repaired within [`FORWARDING_REPAIR_SLACK`] past the drift period;
//! * no Node reads `RouteCreated` for longer than the drift period plus
//!   [`DRIFT_SLACK`] while a route it claims, removed behind the
//!   controller's back, is missing from the cloud;
//! * the election keeps a Lease nobody else wants while every Lease request
//!   is answered within a quarter of the renew deadline.
//!
//! After every step the foreign routes must still be there, unchanged. Once
//! the last step and the last fault are over, the run goes on for a stated
//! bound ([`bound`]) and then the cloud must hold exactly the routes the
//! Nodes need ([`expect`]), every NetworkUnavailable condition must be
//! right, and no destination may have seen more than
//! [`CALL_FACTOR`] × its minimum + [`CALL_SLACK`] mutations. A failing case
//! is shrunk by removing steps while the same kind of violation persists
//! ([`shrink`]), and its report names the command that replays it.

pub mod cloud;
pub mod expect;
pub mod lease;
pub mod steps;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use provider_memory::{
    ErrorRate, LatencyConfig, MemoryCloud, MemoryConfig, Operation, RateLimitConfig,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use route_cloud::{CloudRoutes, ErrorKind, TokioClock};
use route_controller::{
    BackoffConfig, Controller, ControllerConfig, Fence, Mode, NodeStore, Timing, pick_resync,
};
use route_core::{
    Cidr, Destination, NetworkCondition, NodeAddress, NodeView, PlanConfig, PodCidr, Route,
};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::{ApiServer, CatchUp};
use crate::run::CLUSTER;
use cloud::{CheckedCloud, Lease, Replica, ReplicaState, World, lock};
use expect::{claims, in_cluster, points_at, wants};
pub use steps::{
    Case, CloudShape, Extra, Faults, ForwardingStyle, NodeSpec, Step, TimedStep, generate,
    mode_of_seed,
};

/// Time between the replica being told it lost leadership and its Lease
/// expiring: the binary's defaults, `--leader-elect-lease-duration` 15 s
/// minus `--leader-elect-renew-deadline` 10 s.
pub const LEASE_GRACE: Duration = Duration::from_secs(5);

/// `--leader-elect-renew-deadline` of the checked replica: its fence closes
/// this long after the send of its last successful renewal.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);

/// `--leader-elect-lease-duration`: a Lease not renewed for this long may
/// be taken by another replica.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);

/// `--leader-elect-retry-period`: how often the replica renews.
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);

/// After a late renewal reopens the fence, a pass must start within this
/// long if the last one had changes cut off: work cut off is redone at once,
/// not at the next resync. A pass already under way (a list slowed down to
/// 9 s) may finish first.
pub const REDO_BOUND: Duration = Duration::from_secs(10);

/// `--route-reconciliation-period` of the checked controller.
pub const PERIOD: Duration = Duration::from_secs(10);

/// `--min-resync-period` of the checked controller (the resync is drawn from
/// `[60 s, 120 s)`), short so that changes behind its back are repaired
/// within a run.
pub const MIN_RESYNC: Duration = Duration::from_secs(60);

/// `--route-target-discovery-period` of the checked controller: short, as
/// the resync is, so that a table tagged late in a run is found within it.
pub const DISCOVERY: Duration = Duration::from_secs(60);

/// Added to the bound when tables were tagged or untagged: the controller
/// looks the targets up every [`DISCOVERY`] in which no list ran, and a
/// changed set lists at once (one pass, the least interval apart).
pub const TARGETS_BOUND: Duration = Duration::from_secs(90);

/// A table tagged this long ago is known to the controller (see
/// [`TARGETS_BOUND`]): a Node's condition may only say `RouteCreated` when
/// every such table holds its route.
pub const TARGET_KNOWN: Duration = TARGETS_BOUND;

/// The convergence bound without faults: two resyncs' worth, since a
/// change behind the controller's back waits for the next resync (< 120 s).
pub const BASE_BOUND: Duration = Duration::from_secs(150);

/// Added to the bound when eventual consistency was on: a route hidden from
/// one list may only show at the next resync.
pub const LAG_BOUND: Duration = Duration::from_secs(120);

/// Added to the bound when a forwarding prerequisite changed or an
/// instance started without it: the controller reads a Node's prerequisite
/// afresh at the full read of each resync interval, but only for a Node
/// whose route is in the table the pass started from. A route that pass
/// had to repair waits for the next full read: two intervals (< 240 s)
/// where [`BASE_BOUND`] covers one. (A prerequisite found off is also read
/// every `forwarding::RECHECK`, 5 min: later than the full reads here.)
pub const FORWARDING_BOUND: Duration = Duration::from_secs(120);

/// `--route-drift-check-period` of the checked controller: shorter than
/// the resync, so the drift check, not the resync, is what finds a change
/// behind the controller's back.
pub const DRIFT: Duration = Duration::from_secs(30);

/// A route removed behind the controller's back is back (or its Node no
/// longer reads `RouteCreated`) this long after the drift period: one
/// pass, spaced by the least interval, and its calls.
pub const DRIFT_SLACK: Duration = Duration::from_secs(15);

/// A prerequisite lost behind the controller's back on the instance of a
/// routed Node must be on again this long after the resync interval has
/// passed since the loss (the full read's pass: the least interval of 10 s
/// and the pass's own calls), unless a fault window overlaps.
pub const FORWARDING_REPAIR_SLACK: Duration = Duration::from_secs(30);

/// Passes at one virtual instant after which the controller counts as
/// spinning: the paused clock only moves when every task waits, so a loop
/// that never waits would otherwise hang the run.
pub const LIVELOCK_PASSES: u32 = 1000;

/// Mutations per destination may be at most this many times the minimum…
pub const CALL_FACTOR: u64 = 2;
/// …plus this many.
pub const CALL_SLACK: u64 = 2;

/// The fault classes `cloud-route-controller check` and the test run by
/// default: every one of them, since every invariant holds under each.
pub const PASSING: Faults = Faults::ALL;

/// The kinds of violation, one per invariant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// A route a live Node needs was deleted.
    NeededRouteDeleted,
    /// A route outside the cluster CIDRs, unparsable or foreign was touched.
    TouchedForeign,
    /// A route no Node claims alone was created.
    UnneededCreate,
    /// A mutation while the replica was not leader.
    MutationWithoutLeadership,
    /// A mutation sent or landing while the replica's fence was closed (its
    /// renew deadline had passed), whatever its leader flag said.
    MutationPastDeadline,
    /// Changes the fence cut off were not taken up again within
    /// [`REDO_BOUND`] of the fence reopening (no pass started).
    NotRedone,
    /// After the bound, the cloud does not hold exactly the desired routes.
    NotConverged,
    /// After the bound, a NetworkUnavailable condition is wrong.
    WrongCondition,
    /// A destination saw more mutations than the bound allows.
    TooManyCalls,
    /// The controller ran pass after pass without virtual time moving.
    Livelock,
    /// A Node's condition was written `RouteCreated` while the cloud's last
    /// answer about its forwarding prerequisite said it is off.
    RouteCreatedWithoutForwarding,
    /// A forwarding prerequisite lost behind the controller's back on a
    /// routed Node's instance was not repaired in time.
    ForwardingNotRepaired,
    /// A forwarding check, though the cloud's capabilities say it has none.
    UnexpectedForwardingCheck,
    /// A Node's condition was written `RouteCreated` while a route table
    /// the controller knows lacked one of its routes.
    RouteCreatedWithoutRoute,
    /// Both replicas of a `rival` run were inside their fencing deadline
    /// at one instant: both could write.
    TwoInsideDeadline,
    /// A Node still read `RouteCreated` [`DRIFT`] + [`DRIFT_SLACK`] after a
    /// route it claims was removed behind the controller's back, and the
    /// route was still missing.
    RouteCreatedPastDrift,
    /// The election lost its Lease although every Lease request was
    /// answered within a quarter of the renew deadline and nobody else
    /// wanted it (`slow_lease_api`).
    LeaseLostToSlowAnswers,
    /// One pass turned more working Nodes `True`, or deleted more live
    /// routes no Node needs, than the controller's bounds allow.
    PassUnbounded,
}

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Virtual time since the start of the run.
    pub at: Duration,
    /// Which invariant.
    pub kind: Kind,
    /// What happened.
    pub detail: String,
}

/// Counters of one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunStats {
    /// List calls.
    pub lists: u64,
    /// Create and delete calls, any result.
    pub attempts: u64,
    /// Mutations that took effect.
    pub mutations: u64,
    /// The sum of the per-destination minimums.
    pub minimum: u64,
    /// When the final state was checked, since the start.
    pub checked_at: Duration,
    /// Forwarding check calls.
    pub forwarding_checks: u64,
    /// Forwarding prerequisites repaired by those checks.
    pub forwarding_repairs: u64,
    /// Whole-table writes refused for a stale version (`412`).
    pub conflicts: u64,
    /// Times the Lease moved from one live replica to the other.
    pub lease_moves: u64,
    /// The final state was held by the settings check, not converged.
    pub held_at_end: bool,
}

/// What one run found.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Every violation, in the order found.
    pub violations: Vec<Violation>,
    /// Counters.
    pub stats: RunStats,
    /// One line per cloud call.
    pub trace: Vec<String>,
}

impl Outcome {
    /// No invariant broke.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Settings of a run beyond its case; the defaults check the controller as
/// the binary configures it.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Cluster CIDRs given to the controller instead of the real ones (to
    /// show that the checker catches a controller that claims too much).
    pub controller_cluster_cidrs: Option<Vec<Cidr>>,
    /// The controller's drift period instead of [`DRIFT`] (zero: a
    /// controller without the drift check, to show the checker catches it).
    pub drift: Option<Duration>,
}

/// The cluster CIDRs of every run.
pub fn cluster_cidrs() -> Vec<Cidr> {
    ["10.244.0.0/16", "fd00:10::/48"]
        .iter()
        .filter_map(|c| Cidr::parse(c).ok())
        .collect()
}

/// The convergence bound of `case`: [`BASE_BOUND`], plus [`LAG_BOUND`] if
/// eventual consistency was on, plus [`FORWARDING_BOUND`] if a forwarding
/// prerequisite was off at some time, plus twice the longest stretch of
/// overlapping faults — retries back off exponentially while faults last,
/// so a correct controller may wait about as long again after they end.
pub fn bound(case: &Case) -> Duration {
    let mut windows: Vec<(Duration, Duration)> = case
        .steps
        .iter()
        .filter_map(|s| s.step.fault_duration().map(|d| (s.at, s.at + d)))
        .collect();
    windows.sort();
    let mut longest = Duration::ZERO;
    let mut current: Option<(Duration, Duration)> = None;
    for (a, b) in windows {
        current = match current {
            Some((s, e)) if a <= e => Some((s, e.max(b))),
            _ => Some((a, b)),
        };
        if let Some((s, e)) = current {
            longest = longest.max(e - s);
        }
    }
    let lag = case
        .steps
        .iter()
        .any(|s| matches!(s.step, Step::Lag { .. }));
    let forwarding = case.cloud.forwarding.is_some()
        && case.steps.iter().any(|s| match &s.step {
            Step::LoseForwarding { .. } | Step::FixForwarding { .. } => true,
            Step::Create(n) | Step::Recreate(n) => n.forwarding_off,
            _ => false,
        });
    let targets = case
        .steps
        .iter()
        .any(|s| matches!(s.step, Step::AddTarget { .. } | Step::DropTarget { .. }));
    BASE_BOUND
        + if lag { LAG_BOUND } else { Duration::ZERO }
        + if targets {
            TARGETS_BOUND
        } else {
            Duration::ZERO
        }
        + if forwarding {
            FORWARDING_BOUND
        } else {
            Duration::ZERO
        }
        + longest * 2
}

/// Whether a fault window of `case` overlaps `[from, to]`.
fn fault_between(case: &Case, from: Duration, to: Duration) -> bool {
    case.steps.iter().any(|s| {
        s.step
            .fault_duration()
            .is_some_and(|d| !d.is_zero() && s.at <= to && s.at + d >= from)
    })
}

/// Runs `case` and checks it.
pub fn run_case(case: &Case) -> Outcome {
    run_case_with(case, &Options::default())
}

/// Runs `case` with `options` and checks it.
pub fn run_case_with(case: &Case, options: &Options) -> Outcome {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime with only the timer enabled builds");
    let out = rt.block_on(drive(case, options));
    // Dropping the runtime ends the controller and every helper task.
    drop(rt);
    out
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Window {
    Errors(Operation),
    Throttle,
    Lag,
    Slow,
    ApiOutage,
    Quota,
    Watch(CatchUp),
    LeaseSlow,
}

#[derive(Debug, Clone)]
enum Act {
    Step(usize),
    /// The providerID and InternalIP of a late Node arrive (if it is still that incarnation).
    Data {
        name: String,
        uid: String,
        instance: u32,
        ip: u32,
    },
    Start(String),
    End(Window),
    LeaseExpires,
    Regain,
    /// A renewal arrives after a stall, late; renewals go on in time.
    RenewLate,
    /// The rival replica's renewals go on after a stall.
    RivalResume,
    /// [`REDO_BOUND`] after the fence reopened at this time: the pass of
    /// this number had changes cut off, and a later one must have started.
    CheckRedo(Duration, u64),
    /// The forwarding prerequisite of instance `pid` was lost behind the
    /// controller's back at `lost_at`, when `node` was routed: unless a
    /// fault got in the way, it must be on again by now.
    CheckRepaired {
        pid: String,
        node: String,
        lost_at: Duration,
    },
    /// The route of `node` for `cidr` was removed behind the controller's
    /// back at `removed_at`: unless a fault got in the way, by now it is
    /// back or the Node no longer reads `RouteCreated`.
    CheckSeen {
        node: String,
        cidr: Cidr,
        removed_at: Duration,
    },
}

/// The route signature the minimum is counted on.
type Sig = (String, Option<String>, Vec<NodeAddress>);

struct Driver<'a> {
    case: &'a Case,
    cluster: Vec<Cidr>,
    api: Arc<ApiServer>,
    cloud: MemoryCloud,
    world: Arc<Mutex<World>>,
    fence: Fence,
    leader: Arc<watch::Sender<bool>>,
    /// Pending acts: (when, order, what).
    pending: Vec<(Duration, u64, Act)>,
    order: u64,
    desired: BTreeMap<Cidr, Sig>,
    minimum: BTreeMap<Destination, u64>,
    extras: u32,
    /// The controller's resync interval.
    resync: Duration,
    /// The controller's drift period; zero with the drift check off.
    drift: Duration,
    /// The latency of the `slow_lease_api` election's Lease store.
    lease_latency: Arc<std::sync::atomic::AtomicU64>,
}

fn view_of(spec: &NodeSpec) -> NodeView {
    let cidrs: Vec<&str> = spec.pod_cidrs.iter().map(String::as_str).collect();
    let hostname = NodeAddress::new("Hostname", spec.name.clone());
    let v = NodeView::new(&spec.name, &spec.uid, &cidrs);
    if spec.late.is_some() {
        // Registered by the kubelet with --cloud-provider=external: the
        // cloud's node controller fills in the rest later.
        return v.with_addresses(vec![hostname]);
    }
    v.with_addresses(vec![
        NodeAddress::internal_ip(steps::ip_text(spec.ip)),
        hostname,
    ])
    .with_provider_id(steps::provider_id(spec.instance))
}

impl Driver<'_> {
    fn later(&mut self, at: Duration, act: Act) {
        self.order += 1;
        self.pending.push((at, self.order, act));
    }

    fn next(&mut self) -> Option<(Duration, Act)> {
        let i = (0..self.pending.len()).min_by_key(|&i| (self.pending[i].0, self.pending[i].1))?;
        let (at, _, act) = self.pending.swap_remove(i);
        Some((at, act))
    }

    fn reports(&self) -> bool {
        self.case.cloud.reports_node_addresses
    }

    fn signature(&self) -> BTreeMap<Cidr, Sig> {
        let reports = self.reports();
        wants(&self.api.nodes(), &self.cluster)
            .into_iter()
            .map(|(c, w)| {
                let addrs = if reports { w.addresses } else { Vec::new() };
                (c, (w.node, w.provider_id, addrs))
            })
            .collect()
    }

    fn charge(&mut self, d: &Destination, n: u64) {
        *self.minimum.entry(d.clone()).or_default() += n;
    }

    /// Adds what the change of the desired routes costs at least: a
    /// creation per new route, a deletion per route no longer needed, both
    /// for a route that must point elsewhere.
    fn account(&mut self) {
        let now = self.signature();
        let old = std::mem::take(&mut self.desired);
        let stopped = lock(&self.world).stopped.clone();
        for (c, s) in &now {
            let cost = match old.get(c) {
                None => 1,
                Some(o) if o != s => 2,
                Some(_) => continue,
            };
            // A route made to a stopped instance is a blackhole from the
            // start; a controller that cannot know the instance will run
            // again repairs it once, as for a stop that comes later.
            let blackholed = s.1.as_ref().is_some_and(|p| stopped.contains(p));
            self.charge(
                &Destination::Cidr(*c),
                cost + if blackholed { 2 } else { 0 },
            );
        }
        for c in old.keys() {
            if !now.contains_key(c) {
                self.charge(&Destination::Cidr(*c), 1);
            }
        }
        self.desired = now;
    }

    /// Whether `node` (by name) is live on instance `pid` and a route in
    /// the table points at it (a blackhole of a stopped instance counts:
    /// the controller sees it as the Node's).
    /// How often the controller reads every routed Node's prerequisite
    /// afresh: every drift check, or every resync with it off.
    fn prerequisite_period(&self) -> Duration {
        if self.drift.is_zero() {
            self.resync
        } else {
            self.drift.min(self.resync)
        }
    }

    fn routed_on(&self, node: &str, pid: &str) -> bool {
        self.api
            .get(node)
            .is_some_and(|v| v.provider_id.as_deref() == Some(pid))
            && self
                .cloud
                .routes(CLUSTER)
                .iter()
                .any(|r| r.node == node && r.node_provider_id.as_deref() == Some(pid))
    }

    fn create(&mut self, at: Duration, spec: &NodeSpec) {
        if self.api.get(&spec.name).is_some() {
            return;
        }
        if spec.forwarding_off {
            let mut w = lock(&self.world);
            if w.forwarding.is_some() {
                let now = w.now();
                w.forwarding_off
                    .insert(steps::provider_id(spec.instance), now);
            }
        }
        self.api.create(view_of(spec));
        if let Some(late) = spec.late {
            let full = NodeSpec {
                late: None,
                ..spec.clone()
            };
            let v = view_of(&full);
            lock(&self.world).eventual.insert(
                spec.uid.clone(),
                (steps::provider_id(spec.instance), v.addresses),
            );
            self.later(
                at + late,
                Act::Data {
                    name: spec.name.clone(),
                    uid: spec.uid.clone(),
                    instance: spec.instance,
                    ip: spec.ip,
                },
            );
        }
    }

    /// Puts an in-cluster route behind the controller's back into the
    /// cluster's first table.
    fn insert(&mut self, route: Route) {
        let first = self.tables().swap_remove(0);
        let route = route.in_table(first.clone());
        let now = {
            let mut w = lock(&self.world);
            let now = w.now();
            w.behind_back_at = Some(now);
            now
        };
        // A route of a Node replaced by this one is gone for that Node as
        // much as a deleted one.
        if let Some(c) = route.destination.cidr()
            && let Some(ours) = self
                .cloud
                .routes_in(CLUSTER, &first)
                .into_iter()
                .find(|r| r.destination == route.destination && r.foreign.is_none())
            && !ours.node.is_empty()
            && ours.node != route.node
        {
            self.later(
                now + DRIFT + DRIFT_SLACK,
                Act::CheckSeen {
                    node: ours.node.to_string(),
                    cidr: c,
                    removed_at: now,
                },
            );
        }
        let d = route.destination.clone();
        if let Some(c) = d.cidr()
            && in_cluster(&self.cluster, &c)
        {
            let cost = if self.desired.contains_key(&c) { 2 } else { 1 };
            self.charge(&d, cost);
        }
        self.cloud.insert_route(CLUSTER, route);
    }

    /// The route tables of the cluster now: the named ones, or the one
    /// unnamed table.
    fn tables(&self) -> Vec<String> {
        let w = lock(&self.world);
        if w.targets.is_empty() {
            vec![String::new()]
        } else {
            w.targets.keys().cloned().collect()
        }
    }

    fn extra_name(&mut self, what: &str) -> String {
        self.extras += 1;
        format!("{CLUSTER}-{what}-{}", self.extras)
    }

    fn apply(&mut self, at: Duration, act: Act) {
        match act {
            Act::Step(i) => self.step(at, i),
            Act::Data {
                name,
                uid,
                instance,
                ip,
            } => {
                if self.api.get(&name).is_some_and(|v| v.uid == uid) {
                    self.api.update(&name, |v| {
                        v.provider_id = Some(steps::provider_id(instance));
                        v.addresses
                            .insert(0, NodeAddress::internal_ip(steps::ip_text(ip)));
                    });
                }
            }
            Act::Start(pid) => {
                lock(&self.world).stopped.remove(&pid);
            }
            Act::End(w) => match w {
                Window::Errors(op) => self.cloud.set_error_rate(op, None),
                Window::Throttle => self.cloud.set_rate_limit(None),
                Window::Lag => self.cloud.set_list_lag(0),
                Window::Slow => self.set_latency(self.case.cloud.latency_ms),
                Window::ApiOutage => self.api.set_outage(false),
                Window::Quota => self.cloud.set_max_routes(None),
                Window::Watch(end) => self.api.release_watch(end),
                Window::LeaseSlow => self
                    .lease_latency
                    .store(lease::BASE_LATENCY_MS, std::sync::atomic::Ordering::SeqCst),
            },
            Act::LeaseExpires => lock(&self.world).lease_held = false,
            Act::Regain => {
                {
                    let mut w = lock(&self.world);
                    w.lease_held = true;
                    w.checked.told_leader = true;
                }
                // Winning the Lease is a successful renewal.
                self.fence.renewed(self.fence.mark(), RENEW_DEADLINE);
                self.fence.set_leader(true);
                self.leader.send_replace(true);
            }
            Act::RivalResume => lock(&self.world).renewal_answered(Replica::Rival),
            Act::RenewLate => {
                let check = {
                    let mut w = lock(&self.world);
                    if w.lease.is_some() {
                        // The stuck answer; the rival may hold the Lease by
                        // now, which the next round tells.
                        w.renewal_answered(Replica::Checked);
                    } else {
                        w.checked.renewing = true;
                        self.fence.renewed(self.fence.mark(), RENEW_DEADLINE);
                    }
                    // The latest pass had changes cut off and none started since.
                    // Only if the answer reopened the fence: in a rival run the
                    // answer of a renewal sent before a long stall comes back
                    // past its own deadline (the fence counts from the send),
                    // and the replica must not write again (seed 174 of 10,000).
                    w.cut_off_pass.filter(|p| {
                        *p == w.passes_started && w.checked.told_leader && self.fence.is_open()
                    })
                };
                if let Some(pass) = check {
                    self.later(at + REDO_BOUND, Act::CheckRedo(at, pass));
                }
            }
            Act::CheckRedo(reopened, pass) => {
                // A throttle storm or slow calls may hold a pass that was
                // under way when the fence reopened past the bound.
                let held_up = self.case.steps.iter().any(|s| match s.step {
                    Step::Throttle { duration, .. } | Step::Slow { duration, .. } => {
                        s.at <= at && s.at + duration >= reopened
                    }
                    _ => false,
                });
                let mut w = lock(&self.world);
                if w.passes_started == pass && !held_up && w.checked.told_leader {
                    w.violation(
                        Kind::NotRedone,
                        format!(
                            "the fence reopened at {reopened:?} after pass {pass} had changes cut off, and no pass started within {REDO_BOUND:?}"
                        ),
                    );
                }
            }
            Act::CheckSeen {
                node,
                cidr,
                removed_at,
            } => {
                let Some(view) = self.api.get(&node) else {
                    return;
                };
                let claims = view.valid_pod_cidrs().contains(&cidr);
                let reads_routed =
                    NetworkCondition::RouteCreated.already_set(view.network_unavailable.as_ref());
                let missing =
                    !self.cloud.routes(CLUSTER).iter().any(|r| {
                        r.destination == Destination::Cidr(cidr) && r.node == node.as_str()
                    });
                let lagged = self.case.steps.iter().any(|s| match s.step {
                    Step::Lag { duration, .. } => s.at + duration + DRIFT >= removed_at,
                    _ => false,
                });
                let mut w = lock(&self.world);
                // A later change behind the controller's back has a check of
                // its own (or is not one the controller must undo).
                let changed_since = w.behind_back_at.is_some_and(|t| t > removed_at);
                if claims
                    && reads_routed
                    && missing
                    && !changed_since
                    && !view.excluded
                    && !fault_between(self.case, removed_at, at)
                    && !lagged
                {
                    w.violation(
                        Kind::RouteCreatedPastDrift,
                        format!(
                            "{node} still reads RouteCreated {:?} after its route for {cidr} was removed behind the controller's back, and the route is still missing (drift period {DRIFT:?})",
                            at - removed_at
                        ),
                    );
                }
            }
            Act::CheckRepaired { pid, node, lost_at } => {
                // Routed throughout, as far as the repair goes: a route
                // created in between prepares the instance on the way.
                let routed = self.routed_on(&node, &pid);
                let mut w = lock(&self.world);
                // A route created while lists lagged may be missing from
                // the next list, a resync later in `incremental`: that
                // full read does not read the Node afresh.
                let lagged = self.case.steps.iter().any(|s| match s.step {
                    Step::Lag { duration, .. } => s.at + duration + self.resync >= lost_at,
                    _ => false,
                });
                if routed
                    && w.forwarding_off.get(&pid) == Some(&lost_at)
                    && !fault_between(self.case, lost_at, at)
                    && !lagged
                {
                    w.violation(
                        Kind::ForwardingNotRepaired,
                        format!(
                            "the forwarding prerequisite of {node}'s instance {pid}, lost at {lost_at:?} while routed, is still off {:?} later (drift period {:?})",
                            at - lost_at,
                            self.prerequisite_period()
                        ),
                    );
                }
            }
        }
    }

    fn set_latency(&self, ms: u64) {
        let d = Duration::from_millis(ms);
        for op in [
            Operation::List,
            Operation::Create,
            Operation::Delete,
            Operation::Batch,
        ] {
            self.cloud.set_latency(op, d);
        }
    }

    fn step(&mut self, at: Duration, i: usize) {
        let step = self.case.steps[i].step.clone();
        match step {
            Step::Create(spec) => self.create(at, &spec),
            Step::Delete { node } => self.api.delete(&node),
            Step::Recreate(spec) => {
                self.api.delete(&spec.name);
                self.create(at, &spec);
            }
            Step::ChangeAddress { node, ip } => self.api.update(&node, |v| {
                if let Some(a) = v.addresses.iter_mut().find(|a| a.kind == "InternalIP") {
                    a.address = steps::ip_text(ip).into();
                }
            }),
            Step::StopInstance { node, duration } => {
                let Some(pid) = self.api.get(&node).and_then(|v| v.provider_id) else {
                    return;
                };
                let routed: Vec<Cidr> = self
                    .desired
                    .iter()
                    .filter(|(_, s)| s.1.as_deref() == Some(pid.as_str()))
                    .map(|(c, _)| *c)
                    .collect();
                for c in routed {
                    self.charge(&Destination::Cidr(c), 2);
                }
                lock(&self.world).stopped.insert(pid.clone());
                self.later(at + duration, Act::Start(pid));
            }
            Step::RemoveRoute { pick } => {
                let inside: Vec<Route> = self
                    .cloud
                    .routes(CLUSTER)
                    .into_iter()
                    .filter(|r| {
                        r.destination
                            .cidr()
                            .is_some_and(|c| in_cluster(&self.cluster, &c))
                    })
                    .collect();
                if inside.is_empty() {
                    return;
                }
                let r = &inside[pick as usize % inside.len()];
                if let Some(c) = r.destination.cidr()
                    && self.desired.contains_key(&c)
                {
                    self.charge(&r.destination, 1);
                }
                if let Some(c) = r.destination.cidr()
                    && r.foreign.is_none()
                    && !r.node.is_empty()
                {
                    self.later(
                        at + DRIFT + DRIFT_SLACK,
                        Act::CheckSeen {
                            node: r.node.to_string(),
                            cidr: c,
                            removed_at: at,
                        },
                    );
                }
                self.cloud.remove_route(CLUSTER, &r.destination);
                let mut w = lock(&self.world);
                w.behind_back_at = Some(w.now());
            }
            Step::AddRoute(extra) => self.add_route(extra),
            Step::Errors {
                op,
                kind,
                percent,
                duration,
            } => {
                // A cloud that writes whole tables fails its writes.
                let op = if self.case.cloud.batch && op != Operation::List {
                    Operation::Batch
                } else {
                    op
                };
                self.cloud.set_error_rate(
                    op,
                    Some(ErrorRate {
                        probability: f64::from(percent) / 100.0,
                        kind,
                    }),
                );
                self.later(at + duration, Act::End(Window::Errors(op)));
            }
            Step::Timeouts { op, n } => {
                let op = if self.case.cloud.batch {
                    Operation::Batch
                } else {
                    op
                };
                self.cloud.fail_next(op, n, ErrorKind::Timeout);
            }
            Step::Throttle {
                every_secs,
                burst,
                duration,
            } => {
                self.cloud.set_rate_limit(Some(RateLimitConfig {
                    requests: 1,
                    period_secs: every_secs,
                    burst,
                }));
                self.later(at + duration, Act::End(Window::Throttle));
            }
            Step::Lag { lists, duration } => {
                self.cloud.set_list_lag(lists);
                self.later(at + duration, Act::End(Window::Lag));
            }
            Step::Slow { ms, duration } => {
                self.set_latency(ms);
                self.later(at + duration, Act::End(Window::Slow));
            }
            Step::LeaseSlow { ms, duration } => {
                self.lease_latency
                    .store(ms, std::sync::atomic::Ordering::SeqCst);
                self.later(at + duration, Act::End(Window::LeaseSlow));
            }
            Step::ApiOutage { duration } => {
                self.api.set_outage(true);
                self.later(at + duration, Act::End(Window::ApiOutage));
            }
            Step::LoseForwarding { node } => {
                // Only the provider of this style can repair it; a read-only
                // cloud's instances never lose it while they run.
                let Some(pid) = self.api.get(&node).and_then(|v| v.provider_id) else {
                    return;
                };
                let routed = self.routed_on(&node, &pid);
                let lost_at = {
                    let mut w = lock(&self.world);
                    if w.forwarding != Some(ForwardingStyle::Repairable) {
                        return;
                    }
                    // Lost again before the repair: still the first loss.
                    *w.forwarding_off.entry(pid.clone()).or_insert(at)
                };
                if routed && lost_at == at {
                    self.later(
                        at + self.prerequisite_period() + FORWARDING_REPAIR_SLACK,
                        Act::CheckRepaired { pid, node, lost_at },
                    );
                }
            }
            Step::FixForwarding { node } => {
                let Some(pid) = self.api.get(&node).and_then(|v| v.provider_id) else {
                    return;
                };
                lock(&self.world).forwarding_off.remove(&pid);
            }
            Step::AddTarget { name } => {
                let mut w = lock(&self.world);
                w.targets.insert(name, at);
                let now: Vec<String> = w.targets.keys().cloned().collect();
                drop(w);
                self.cloud.set_targets(now);
                // Every route the Nodes need is one more creation, in the
                // new table.
                let needed: Vec<Cidr> = self.desired.keys().copied().collect();
                for c in needed {
                    self.charge(&Destination::Cidr(c), 1);
                }
            }
            Step::DropTarget { name } => {
                let mut w = lock(&self.world);
                // The cluster keeps one table: the generator never drops the last.
                if w.targets.len() <= 1 {
                    return;
                }
                w.targets.remove(&name);
                // Its routes are no longer the cluster's: foreign ones in it
                // are no longer watched.
                w.foreign.retain(|f| f.table != name.as_str());
                let now: Vec<String> = w.targets.keys().cloned().collect();
                drop(w);
                self.cloud.set_targets(now);
            }
            Step::Quota { max, duration } => {
                self.cloud.set_max_routes(Some(max));
                self.later(at + duration, Act::End(Window::Quota));
            }
            Step::ConflictingWrites { n } => lock(&self.world).conflicts += n,
            Step::WatchDelay { duration, end } => {
                self.api.hold_watch();
                self.later(at + duration, Act::End(Window::Watch(end)));
            }
            Step::LateRenewal { stall } => {
                let mut w = lock(&self.world);
                if w.lease.is_some() {
                    w.renewal_stuck(Replica::Checked);
                } else {
                    w.checked.renewing = false;
                }
                drop(w);
                self.later(at + stall, Act::RenewLate);
            }
            Step::RivalStall { stall } => {
                let mut w = lock(&self.world);
                if w.rival.is_none() {
                    return;
                }
                w.renewal_stuck(Replica::Rival);
                drop(w);
                self.later(at + stall, Act::RivalResume);
            }
            Step::LeaderLoss { duration } => {
                {
                    let mut w = lock(&self.world);
                    // With a rival, leadership moves by the Lease alone.
                    if !w.checked.told_leader || w.lease.is_some() {
                        return;
                    }
                    w.checked.told_leader = false;
                }
                // As the binary does: the fence follows leadership at once,
                // not only between passes.
                self.fence.set_leader(false);
                self.leader.send_replace(false);
                self.later(at + LEASE_GRACE.min(duration), Act::LeaseExpires);
                self.later(at + duration, Act::Regain);
            }
        }
    }

    fn add_route(&mut self, extra: Extra) {
        match extra {
            Extra::Stray { cidr, target } => {
                let name = self.extra_name("stray");
                let mut r = Route::from_text(target, &cidr).named(name);
                r.next_hop = "eni-gone".into();
                self.insert(r);
            }
            Extra::Hijack { node, target } => {
                let Some(v) = self.api.get(&node) else { return };
                let Some(c) = v
                    .valid_pod_cidrs()
                    .into_iter()
                    .find(|c| in_cluster(&self.cluster, c))
                else {
                    return;
                };
                let name = self.extra_name("hijack");
                let reports = self.reports();
                let mut r = Route::new(target.clone(), Destination::Cidr(c)).named(name);
                r.next_hop = "eni-elsewhere".into();
                // A route names the Node whose instance it points at. A
                // Node still waiting for its providerID runs on an instance
                // all the same, and a cloud that reports instances names it
                // (a route without one would be kept as unknown, which no
                // real listing produces).
                if let Some(t) = self.api.get(&target) {
                    r = r.with_addresses(t.addresses.clone(), reports);
                    let eventual = lock(&self.world)
                        .eventual
                        .get(&t.uid)
                        .map(|(p, _)| p.clone());
                    r.node_provider_id = t.provider_id.clone().or(eventual).map(Into::into);
                }
                self.insert(r);
            }
            Extra::Correct { node } => {
                let Some(v) = self.api.get(&node) else { return };
                let Some(pid) = v.provider_id.clone() else {
                    return;
                };
                let reports = self.reports();
                for c in v.valid_pod_cidrs() {
                    if !in_cluster(&self.cluster, &c) {
                        continue;
                    }
                    let mut r = Route::new(node.clone(), Destination::Cidr(c))
                        .named(format!("{CLUSTER}-{}-previous-{c}", v.uid))
                        .with_addresses(v.addresses.clone(), reports);
                    r.next_hop = pid.clone().into();
                    r.node_provider_id = Some(pid.clone().into());
                    // Only a route that replaces another one costs anything.
                    for table in self.tables() {
                        let replaces = self
                            .cloud
                            .routes_in(CLUSTER, &table)
                            .iter()
                            .any(|x| x.destination == r.destination);
                        if replaces {
                            self.charge(&r.destination, 1);
                        }
                        self.cloud.insert_route(CLUSTER, r.clone().in_table(table));
                    }
                }
                let mut w = lock(&self.world);
                w.behind_back_at = Some(w.now());
            }
            Extra::Foreign {
                destination,
                target,
            } => {
                let name = self.extra_name("foreign");
                let mut r = Route::from_text(target, &destination).named(name);
                r.next_hop = "igw-1".into();
                for table in self.tables() {
                    let r = r.clone().in_table(table);
                    let mut w = lock(&self.world);
                    w.foreign
                        .retain(|f| f.destination != r.destination || f.table != r.table);
                    w.foreign.push(r.clone());
                    drop(w);
                    self.cloud.insert_route(CLUSTER, r);
                }
            }
        }
    }

    /// The continuous check between steps: every foreign route is still there, unchanged.
    fn check_foreign(&self) {
        let table = self.cloud.routes(CLUSTER);
        let mut w = lock(&self.world);
        let missing: Vec<String> = w
            .foreign
            .iter()
            .filter(|f| !table.contains(f))
            .map(|f| format!("{} -> {:?}", f.destination, f.node))
            .collect();
        for m in missing {
            w.violation(
                Kind::TouchedForeign,
                format!("foreign route {m} was changed or removed"),
            );
        }
    }

    /// The final check: exact routes, conditions, mutations per destination.
    fn check_final(&self) {
        let nodes = self.api.nodes();
        // A cluster whose Nodes mostly disagree with the settings (odd pod
        // CIDRs on most live Nodes) is held by the controller's settings
        // check, and a last pass that held changes past a bound holds them
        // on purpose: nothing converges, and the continuous invariants
        // (nothing foreign or live deleted, every pass within its bounds)
        // are what holds.
        let settings = route_core::PlanConfig {
            cluster_cidrs: self.cluster.clone(),
            ..route_core::PlanConfig::default()
        };
        if lock(&self.world).held_at_end
            || route_core::check_configuration(&nodes, &settings).is_some()
        {
            lock(&self.world).held_at_end = true;
            return;
        }
        let reports = self.reports();
        let want = wants(&nodes, &self.cluster);
        let claimed = claims(&nodes, &self.cluster);
        // Every table of the cluster on its own: each must hold every route.
        for name in self.tables() {
            let table = self.cloud.routes_in(CLUSTER, &name);
            let mut w = lock(&self.world);
            let of = if name.is_empty() {
                String::new()
            } else {
                format!(" in table {name}")
            };
            for (c, x) in &want {
                let at: Vec<&Route> = table
                    .iter()
                    .filter(|r| r.destination == Destination::Cidr(*c))
                    .collect();
                match at.as_slice() {
                    [] => w.violation(
                        Kind::NotConverged,
                        format!("no route for {c}{of}, the pod CIDR of {}", x.node),
                    ),
                    [r] if points_at(r, x, reports) => {}
                    [r, ..] => w.violation(
                        Kind::NotConverged,
                        format!(
                            "the route for {c}{of} points at {:?} ({}, blackhole {}, addresses {:?}); {} ({}) needs it",
                            r.node,
                            r.node_provider_id.as_deref().unwrap_or("no providerID"),
                            r.blackhole,
                            r.node_addresses.iter().map(|a| a.address.as_str()).collect::<Vec<_>>(),
                            x.node,
                            x.provider_id.as_deref().unwrap_or("no providerID"),
                        ),
                    ),
                }
            }
            for r in &table {
                let Some(c) = r
                    .destination
                    .cidr()
                    .filter(|c| in_cluster(&self.cluster, c))
                else {
                    continue;
                };
                if want.contains_key(&c) {
                    continue;
                }
                // A conflict keeps an existing route to one of its claimants.
                let kept = !r.blackhole
                    && claimed
                        .iter()
                        .any(|x| x.conflicted && x.cidr == c && x.node == r.node.as_str());
                if !kept {
                    w.violation(
                        Kind::NotConverged,
                        format!("stale route {c} -> {:?}{of} is still in the table", r.node),
                    );
                }
            }
        }
        let tables: Vec<Vec<Route>> = self
            .tables()
            .iter()
            .map(|t| self.cloud.routes_in(CLUSTER, t))
            .collect();
        let mut w = lock(&self.world);
        // Upstream leaves the condition of a Node without pod CIDRs alone
        // unless some route targets it; this checker does not judge those.
        for n in nodes.iter().filter(|n| !n.pod_cidrs.is_empty()) {
            let off = n
                .provider_id
                .as_ref()
                .is_some_and(|p| w.forwarding_off.contains_key(p));
            let expected = expected_condition(
                n,
                &claimed,
                &tables,
                &self.cluster,
                off && w.forwarding == Some(ForwardingStyle::ReadOnly),
            );
            if w.forwarding_answered_off.get(&n.uid) == Some(&true)
                && NetworkCondition::RouteCreated.already_set(n.network_unavailable.as_ref())
            {
                w.violation(
                    Kind::RouteCreatedWithoutForwarding,
                    format!(
                        "{} reads RouteCreated, though the cloud last answered that its forwarding prerequisite is off",
                        n.name
                    ),
                );
            }
            // A routed Node's prerequisite is read afresh at every full
            // read, which repairs it.
            if off
                && w.forwarding == Some(ForwardingStyle::Repairable)
                && expected == NetworkCondition::RouteCreated
            {
                w.violation(
                    Kind::ForwardingNotRepaired,
                    format!(
                        "the forwarding prerequisite of {}'s instance is still off at the end",
                        n.name
                    ),
                );
            }
            if !expected.already_set(n.network_unavailable.as_ref()) {
                w.violation(
                    Kind::WrongCondition,
                    format!(
                        "{} has NetworkUnavailable {:?}, expected {}/{}",
                        n.name,
                        n.network_unavailable,
                        expected.status(),
                        expected.reason()
                    ),
                );
            }
        }
        let over: Vec<String> = w
            .mutations
            .iter()
            .filter_map(|((t, d), n)| {
                let min = self.minimum.get(d).copied().unwrap_or(0);
                let of = if t.is_empty() {
                    String::new()
                } else {
                    format!(" in table {t}")
                };
                (*n > CALL_FACTOR * min + CALL_SLACK)
                    .then(|| format!("{d}{of}: {n} mutations, minimum {min}"))
            })
            .collect();
        for o in over {
            w.violation(Kind::TooManyCalls, o);
        }
    }
}

/// The bounds the checked controller runs with: the production defaults.
const BOUNDS: route_controller::bounds::Bounds = route_controller::bounds::Bounds::DEFAULT;

/// Where pass `r` went past `bounds` in a cluster of `nodes` Nodes: more
/// bounded deletions sent than `--max-route-deletions` allows, or more
/// working Nodes written `True` than
/// `--max-unavailable-nodes` allows.
fn unbounded(
    r: &route_controller::PassReport,
    bounds: route_controller::bounds::Bounds,
    nodes: usize,
) -> Vec<String> {
    let mut broken = Vec::new();
    // Counted per table, as the bound is: a Node gone from a cluster with
    // three tables is one deletion in each.
    let mut per_table: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for d in r
        .plan
        .deletions
        .iter()
        .filter(|d| route_controller::bounds::bounded_deletion(d))
        .filter(|d| r.ops.of(&d.key()).is_done())
    {
        *per_table.entry(d.route.table.as_str()).or_default() += 1;
    }
    for (table, deleted) in per_table {
        // The report does not carry the live routes listed, so a
        // percentage is judged against what the pass deleted, which is at
        // most that; the checker runs with a count, which needs neither.
        let max = bounds.deletions.max(deleted);
        if deleted > max {
            broken.push(format!(
                "one pass deleted {deleted} live routes no Node needs in table {table:?}; --max-route-deletions {} allows {max}",
                bounds.deletions
            ));
        }
    }
    let was_working: std::collections::HashMap<&str, bool> = r
        .plan
        .nodes
        .iter()
        .map(|n| {
            let working = n
                .current
                .as_ref()
                .is_some_and(|c| c.status == "False" || c.status == "Unknown");
            (n.node.as_str(), working)
        })
        .collect();
    let turned = r
        .conditions
        .iter()
        .filter(|(n, c)| c.status() == "True" && was_working.get(n.as_str()) == Some(&true))
        .count();
    let max = bounds.unavailable.max(nodes);
    if turned > max {
        broken.push(format!(
            "one pass turned {turned} working Nodes NetworkUnavailable=True; --max-unavailable-nodes {} allows {max} of {nodes}",
            bounds.unavailable
        ));
    }
    broken
}

/// The condition a Node should carry once routes are in place in every
/// table of `tables`, given
/// whether its instance's forwarding prerequisite is off and only the
/// operator can turn it on.
fn expected_condition(
    n: &NodeView,
    claimed: &[expect::Claim],
    tables: &[Vec<Route>],
    cluster: &[Cidr],
    forwarding_disabled: bool,
) -> NetworkCondition {
    // Why each pod CIDR has no route, if it has none; the most pressing
    // explanation is the Node's (`NetworkCondition::or`).
    let unrouted = n.pod_cidrs.iter().filter_map(|pc| match pc {
        PodCidr::Invalid(_) => Some(NetworkCondition::InvalidPodCidr),
        // Outside the cluster CIDRs: no route is created, but one already
        // in every table (someone else's) routes the Node all the same.
        PodCidr::Valid(c) if !in_cluster(cluster, c) => {
            let routed = tables.iter().all(|table| {
                table.iter().any(|r| {
                    !r.blackhole
                        && r.destination == Destination::Cidr(*c)
                        && r.node == n.name.as_str()
                })
            });
            (!routed).then_some(NetworkCondition::InvalidPodCidr)
        }
        PodCidr::Valid(c) => {
            let conflicted = claimed
                .iter()
                .any(|x| x.node == n.name && x.cidr == *c && x.conflicted);
            if conflicted {
                // Every table must hold the route a conflict keeps.
                let kept = tables.iter().all(|table| {
                    table.iter().any(|r| {
                        !r.blackhole
                            && r.destination == Destination::Cidr(*c)
                            && r.node == n.name.as_str()
                    })
                });
                (!kept).then_some(NetworkCondition::PodCidrConflict)
            } else if n.provider_id.is_none() {
                Some(NetworkCondition::AwaitingNodeData)
            } else {
                None
            }
        }
    });
    match (unrouted.reduce(NetworkCondition::or), forwarding_disabled) {
        (Some(why), _) => why,
        (None, true) => NetworkCondition::ForwardingDisabled,
        (None, false) => NetworkCondition::RouteCreated,
    }
}

/// The continuous check of a `RouteCreated` patch for `node`: every table
/// tagged for the cluster long enough for the controller to know it
/// ([`TARGET_KNOWN`]) holds a route to the Node for each pod CIDR it
/// claims alone in the controller's latest snapshot. Skipped within
/// `slack` of a change behind the controller's back (it learns of those at
/// the next resync, and a removed route may be in its cached table).
fn route_created_needs_every_table(
    w: &mut World,
    cloud: &MemoryCloud,
    node: &route_controller::NodeRef,
    slack: Duration,
) {
    let now = w.now();
    if w.behind_back_at.is_some_and(|t| now < t + slack) {
        return;
    }
    let snapshot = w.leading_snapshot().to_vec();
    let Some(view) = snapshot.iter().find(|n| n.uid == node.uid).cloned() else {
        return;
    };
    let claimed = claims(&snapshot, &w.cluster);
    let alone: Vec<Cidr> = claimed
        .iter()
        .filter(|x| x.node == view.name && !x.conflicted)
        .map(|x| x.cidr)
        .collect();
    let tables: Vec<String> = if w.targets.is_empty() {
        vec![String::new()]
    } else {
        w.targets
            .iter()
            .filter(|(_, since)| now >= **since + TARGET_KNOWN)
            .map(|(t, _)| t.clone())
            .collect()
    };
    for t in tables {
        let routes = cloud.routes_in(CLUSTER, &t);
        for c in &alone {
            let has = routes
                .iter()
                .any(|r| r.destination == Destination::Cidr(*c) && r.node == view.name.as_str());
            if !has {
                w.violation(
                    Kind::RouteCreatedWithoutRoute,
                    format!(
                        "RouteCreated written for {}, but table {t:?} has no route for its pod CIDR {c}",
                        view.name
                    ),
                );
            }
        }
    }
}

async fn drive(case: &Case, options: &Options) -> Outcome {
    let start = Instant::now();
    let cluster = cluster_cidrs();
    let cloud = MemoryCloud::new(MemoryConfig {
        latency: LatencyConfig::uniform(case.cloud.latency_ms),
        reports_node_addresses: case.cloud.reports_node_addresses,
        max_concurrent_operations: case.cloud.max_concurrent_operations,
        seed: case.seed,
        targets: case.cloud.targets.clone(),
        supports_batch: case.cloud.batch,
        ..MemoryConfig::default()
    })
    .expect("the checker's memory cloud settings are valid");
    let store = NodeStore::new(None);
    let api = Arc::new(ApiServer::new(store.clone()));
    // The rival replica's watch sees what the checked one sees.
    let rival_store = case.rival.then(|| {
        let s = NodeStore::new(None);
        api.also_feed(s.clone());
        s
    });
    let (leader, leader_rx) = watch::channel(true);
    let leader = Arc::new(leader);
    // As the binary's: open only until the last renewal's send plus the
    // renew deadline, on the virtual clock.
    let fence = Fence::leased(Arc::new(TokioClock::new()));
    fence.renewed(fence.mark(), RENEW_DEADLINE);
    fence.set_leader(true);
    let world = Arc::new(Mutex::new(World {
        start,
        cluster: cluster.clone(),
        reports_addresses: case.cloud.reports_node_addresses,
        checked: ReplicaState::new(fence.clone(), leader.clone(), true),
        lease_held: true,
        refuses_stopped: case.cloud.refuses_stopped,
        refused_at: Default::default(),
        passes_started: 0,
        cut_off_pass: None,
        stopped: Default::default(),
        foreign: Vec::new(),
        violations: Vec::new(),
        mutations: BTreeMap::new(),
        attempts: 0,
        lists: 0,
        trace: Vec::new(),
        eventual: Default::default(),
        forwarding: case.cloud.forwarding,
        forwarding_off: Default::default(),
        forwarding_seen: Default::default(),
        forwarding_answered_off: Default::default(),
        forwarding_checks: 0,
        forwarding_repairs: 0,
        targets: case
            .cloud
            .targets
            .iter()
            .map(|t| (t.clone(), Duration::ZERO))
            .collect(),
        conflicts: 0,
        versions: Default::default(),
        conflicts_met: 0,
        behind_back_at: None,
        lease_moves: 0,
        held_at_end: false,
        lease: case.rival.then_some(Lease {
            holder: Replica::Checked,
            renewed: Duration::ZERO,
        }),
        rival: None,
    }));
    {
        // Every patch the controller sends, including those an outage refuses.
        let world = world.clone();
        let cloud = cloud.with_caller("checker");
        let resync_slack = MIN_RESYNC * 2 + PERIOD;
        api.on_condition(move |node, cond| {
            let mut w = lock(&world);
            if cond == NetworkCondition::RouteCreated {
                route_created_needs_every_table(&mut w, &cloud, node, resync_slack);
            }
            if cond == NetworkCondition::RouteCreated
                && w.forwarding_answered_off.get(&node.uid) == Some(&true)
            {
                w.violation(
                    Kind::RouteCreatedWithoutForwarding,
                    format!(
                        "RouteCreated written for {}, whose forwarding prerequisite the cloud last answered is off",
                        node.name
                    ),
                );
            }
        });
    }
    let mut rng = StdRng::seed_from_u64(case.seed ^ 0x00c4_ec4e_4000);
    let resync = pick_resync(MIN_RESYNC, rng.random::<f64>());
    {
        // The election loop: a renewal every retry period, unless a
        // `LateRenewal` stalls them.
        let (fence, world) = (fence.clone(), world.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RETRY_PERIOD).await;
                let mut w = lock(&world);
                if w.lease.is_some() {
                    // Both replicas' election rounds.
                    w.lease_round(Replica::Checked);
                    w.lease_round(Replica::Rival);
                } else if w.checked.renewing {
                    fence.renewed(fence.mark(), RENEW_DEADLINE);
                }
            }
        });
    }
    let mut d = Driver {
        case,
        cluster: cluster.clone(),
        api: api.clone(),
        cloud: cloud.with_caller("checker"),
        world: world.clone(),
        fence: fence.clone(),
        leader,
        pending: Vec::new(),
        order: 0,
        desired: BTreeMap::new(),
        minimum: BTreeMap::new(),
        extras: 0,
        resync,
        drift: options.drift.unwrap_or(DRIFT),
        lease_latency: Arc::new(std::sync::atomic::AtomicU64::new(lease::BASE_LATENCY_MS)),
    };
    // The binary's election against slow Lease answers, when the case has them.
    let election_stop = CancellationToken::new();
    let election = case
        .steps
        .iter()
        .any(|s| matches!(s.step, Step::LeaseSlow { .. }))
        .then(|| {
            lease::start(
                lease::SlowLeases::new(d.lease_latency.clone()),
                election_stop.clone(),
            )
        });
    for i in 0..case.steps.len() {
        d.later(case.steps[i].at, Act::Step(i));
    }

    // Steps at 0 s are the cluster and the cloud the controller finds when
    // it starts: the watcher's first list, the table a previous leader left.
    while d.pending.iter().any(|p| p.0.is_zero()) {
        let Some((at, act)) = d.next() else { break };
        d.apply(at, act);
        d.account();
    }
    api.initial_list(api.nodes());

    let cfg = ControllerConfig {
        cluster_name: CLUSTER.into(),
        plan: PlanConfig {
            cluster_cidrs: options
                .controller_cluster_cidrs
                .clone()
                .unwrap_or_else(|| cluster.clone()),
            ..PlanConfig::default()
        },
        mode: case.mode,
        timing: Timing {
            period: PERIOD,
            min_interval: crate::run::MIN_INTERVAL,
            resync,
            discovery: DISCOVERY,
            drift: options.drift.unwrap_or(DRIFT),
        },
        // No jitter: the controller draws it from a thread-local RNG, and a
        // failing seed must replay exactly.
        backoff: BackoffConfig {
            jitter: 0.0,
            ..BackoffConfig::default()
        },
        status_concurrency: 4,
        deletion_grace: route_controller::controller::DEFAULT_DELETION_GRACE,
        bounds: BOUNDS,
    };
    let shutdown = CancellationToken::new();
    let checked = CheckedCloud::new(
        cloud.with_caller("controller"),
        world.clone(),
        api.clone(),
        shutdown.clone(),
    );
    let (reports, mut report_rx) = tokio::sync::mpsc::unbounded_channel();
    if let Some(rival_store) = rival_store {
        // Standing by: its fence closed, not told it leads, until it takes
        // the Lease.
        let rival_fence = Fence::leased(Arc::new(TokioClock::new()));
        let (tx, rx) = watch::channel(false);
        lock(&world).rival = Some(ReplicaState::new(rival_fence.clone(), Arc::new(tx), false));
        let rival_cloud = CheckedCloud::new(
            cloud.with_caller("rival"),
            world.clone(),
            api.clone(),
            shutdown.clone(),
        )
        .for_rival();
        let rival = Controller::new(
            cfg.clone(),
            rival_store,
            Arc::new(rival_cloud) as Arc<dyn CloudRoutes>,
            api.clone(),
            rival_fence,
            None,
        );
        tokio::spawn(rival.run(rx, shutdown.clone()));
    }
    let controller = Controller::new(
        cfg,
        store,
        Arc::new(checked) as Arc<dyn CloudRoutes>,
        api.clone(),
        fence,
        None,
    )
    .with_reports(reports);
    {
        // Which passes had changes cut off by the fence, whether each
        // pass stayed within the bounds, and whether the last one held.
        let world = world.clone();
        let api = api.clone();
        tokio::spawn(async move {
            // Reports come in pass order, one per pass started.
            let mut pass = 0;
            while let Some(r) = report_rx.recv().await {
                pass += 1;
                let nodes = api.nodes().len();
                let mut w = lock(&world);
                if r.ops.fenced() > 0 {
                    w.cut_off_pass = Some(pass);
                }
                for broken in unbounded(&r, BOUNDS, nodes) {
                    w.violation(Kind::PassUnbounded, broken);
                }
                w.held_at_end = !r.held.is_empty() || r.misconfigured.is_some();
            }
        });
    }
    let stop = shutdown.clone();
    tokio::spawn(controller.run(leader_rx, shutdown));

    let mut quiet_from = Duration::ZERO;
    while let Some((at, act)) = d.next() {
        tokio::time::sleep_until(start + at).await;
        d.apply(at, act);
        d.account();
        d.check_foreign();
        quiet_from = at;
    }
    let checked_at = quiet_from + bound(case);
    tokio::time::sleep_until(start + checked_at).await;
    d.check_final();
    stop.cancel();
    if let Some(e) = election {
        let lost = e.lost.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some((when, why)) = lost {
            lock(&world).violations.push(Violation {
                at: when.saturating_duration_since(start),
                kind: Kind::LeaseLostToSlowAnswers,
                detail: format!(
                    "the election ended ({why}) though no Lease request took more than {} ms",
                    lease::MAX_LATENCY_MS
                ),
            });
        } else if !e.won.load(std::sync::atomic::Ordering::SeqCst) {
            lock(&world).violation(
                Kind::LeaseLostToSlowAnswers,
                "the election never won the Lease nobody else wanted".into(),
            );
        }
    }
    election_stop.cancel();

    let minimum = d.minimum.values().sum();
    let mut w = lock(&world);
    Outcome {
        violations: std::mem::take(&mut w.violations),
        stats: RunStats {
            lists: w.lists,
            attempts: w.attempts,
            mutations: w.mutations.values().sum(),
            minimum,
            checked_at,
            forwarding_checks: w.forwarding_checks,
            forwarding_repairs: w.forwarding_repairs,
            conflicts: w.conflicts_met,
            lease_moves: w.lease_moves,
            held_at_end: w.held_at_end,
        },
        trace: std::mem::take(&mut w.trace),
    }
}

/// Removes steps from `case`, one at a time from the end, for as long as a
/// violation of `kind` persists; repeats until no single step can go.
/// Stops after `budget` runs.
pub fn shrink(case: &Case, kind: Kind, options: &Options, budget: usize) -> Case {
    let mut best = case.clone();
    let mut runs = 0;
    loop {
        let mut progress = false;
        let mut i = best.steps.len();
        while i > 0 && runs < budget {
            i -= 1;
            let mut c = best.clone();
            c.steps.remove(i);
            runs += 1;
            if run_case_with(&c, options)
                .violations
                .iter()
                .any(|v| v.kind == kind)
            {
                best = c;
                progress = true;
            }
        }
        if !progress || runs >= budget {
            return best;
        }
    }
}

/// The command that replays `case` (its seed, classes and mode).
pub fn replay_command(case: &Case) -> String {
    let mode = if case.mode == mode_of_seed(case.seed) {
        String::new()
    } else {
        format!(" --mode {}", case.mode.as_str())
    };
    format!(
        "cargo run -p cloud-route-controller -- check --seed {} --faults {}{mode}",
        case.seed, case.faults
    )
}

/// The report of a failing case: the violations, the replay command, the
/// shrunk sequence and the cloud calls of the shrunk run.
pub fn report(case: &Case, outcome: &Outcome, options: &Options) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "seed {} failed: mode {}, faults {}, cloud latency {} ms, {} concurrent calls, addresses {}",
        case.seed,
        case.mode.as_str(),
        case.faults,
        case.cloud.latency_ms,
        case.cloud.max_concurrent_operations,
        if case.cloud.reports_node_addresses {
            "reported"
        } else {
            "not reported"
        }
    );
    if let Some(style) = case.cloud.forwarding {
        let _ = writeln!(s, "  forwarding prerequisites: {}", style.as_str());
    }
    if !case.cloud.targets.is_empty() {
        let _ = writeln!(
            s,
            "  route tables at start: {}",
            case.cloud.targets.join(", ")
        );
    }
    if case.cloud.refuses_stopped {
        let _ = writeln!(s, "  routes to stopped instances are refused");
    }
    if case.cloud.batch {
        let _ = writeln!(s, "  changes are whole-table writes under a version");
    }
    if case.rival {
        let _ = writeln!(s, "  a second replica shares the cloud and the Lease");
    }
    for v in outcome.violations.iter().take(8) {
        let _ = writeln!(
            s,
            "  {:>9.3}s  {:?}: {}",
            v.at.as_secs_f64(),
            v.kind,
            v.detail
        );
    }
    if outcome.violations.len() > 8 {
        let _ = writeln!(s, "  ... {} more", outcome.violations.len() - 8);
    }
    let _ = writeln!(s, "replay: {}", replay_command(case));
    let _ = writeln!(
        s,
        "    or: CRC_CHECK_SEED={} CRC_CHECK_FAULTS={}{} cargo test -p simulator --test check -- --nocapture",
        case.seed,
        case.faults,
        if case.mode == mode_of_seed(case.seed) {
            String::new()
        } else {
            format!(" CRC_CHECK_MODE={}", case.mode.as_str())
        }
    );
    let Some(first) = outcome.violations.first() else {
        return s;
    };
    let shrunk = shrink(case, first.kind, options, 300);
    let rerun = run_case_with(&shrunk, options);
    let _ = writeln!(
        s,
        "shrunk to {} of {} steps (still {:?}, converged state checked at {:.0}s):",
        shrunk.steps.len(),
        case.steps.len(),
        first.kind,
        rerun.stats.checked_at.as_secs_f64()
    );
    for t in &shrunk.steps {
        let _ = writeln!(s, "  {:>9.3}s  {}", t.at.as_secs_f64(), t.step);
    }
    let _ = writeln!(s, "its violations:");
    for v in rerun.violations.iter().take(4) {
        let _ = writeln!(
            s,
            "  {:>9.3}s  {:?}: {}",
            v.at.as_secs_f64(),
            v.kind,
            v.detail
        );
    }
    // The calls that led to the first violation, and a few after it: the
    // end of a long run is mostly quiet lists.
    let first_at = rerun
        .violations
        .first()
        .map_or(f64::MAX, |v| v.at.as_secs_f64());
    let upto = rerun
        .trace
        .iter()
        .position(|l| {
            l.trim_start()
                .split('s')
                .next()
                .and_then(|t| t.parse::<f64>().ok())
                .is_some_and(|t| t > first_at)
        })
        .unwrap_or(rerun.trace.len());
    let from = upto.saturating_sub(TRACE_BEFORE);
    let to = (upto + TRACE_AFTER).min(rerun.trace.len());
    let _ = writeln!(
        s,
        "its cloud calls ({} to {} of {}, around the first violation):",
        from + 1,
        to,
        rerun.trace.len()
    );
    for line in &rerun.trace[from..to] {
        let _ = writeln!(s, "  {line}");
    }
    s
}

/// Cloud calls a report shows up to the first violation…
const TRACE_BEFORE: usize = 40;
/// …and after it.
const TRACE_AFTER: usize = 10;

/// The result of many seeds.
#[derive(Debug, Default)]
pub struct Summary {
    /// Seeds run.
    pub seeds: u64,
    /// Failing seeds and their outcome, in seed order.
    pub failures: Vec<(Case, Outcome)>,
    /// Virtual time checked, summed over the runs.
    pub virtual_time: Duration,
    /// Mutations that took effect, summed.
    pub mutations: u64,
    /// The per-destination minimums, summed.
    pub minimum: u64,
    /// Times the Lease moved between two live replicas, summed.
    pub lease_moves: u64,
    /// Whole-table writes refused for a stale version (`412`), summed.
    pub conflicts: u64,
    /// Runs whose final state the settings check held.
    pub held: u64,
}

/// Runs `count` seeds from `first` on `threads` threads.
pub fn run_seeds(
    first: u64,
    count: u64,
    faults: Faults,
    mode: Option<Mode>,
    threads: usize,
) -> Summary {
    let next = std::sync::atomic::AtomicU64::new(first);
    let end = first.saturating_add(count);
    let parts: Vec<Summary> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|_| {
                let next = &next;
                s.spawn(move || {
                    let mut part = Summary::default();
                    loop {
                        let seed = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if seed >= end {
                            return part;
                        }
                        let case = generate(seed, faults, mode);
                        let out = run_case(&case);
                        part.seeds += 1;
                        part.virtual_time += out.stats.checked_at;
                        part.mutations += out.stats.mutations;
                        part.minimum += out.stats.minimum;
                        part.lease_moves += out.stats.lease_moves;
                        part.conflicts += out.stats.conflicts;
                        part.held += u64::from(out.stats.held_at_end);
                        if !out.passed() {
                            part.failures.push((case, out));
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a checker thread panicked"))
            .collect()
    });
    let mut total = Summary::default();
    for p in parts {
        total.seeds += p.seeds;
        total.failures.extend(p.failures);
        total.virtual_time += p.virtual_time;
        total.mutations += p.mutations;
        total.minimum += p.minimum;
        total.lease_moves += p.lease_moves;
        total.conflicts += p.conflicts;
        total.held += p.held;
    }
    total.failures.sort_by_key(|(c, _)| c.seed);
    total
}

/// Flags of `cloud-route-controller check`.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckArgs {
    /// Replay this one seed and print its report.
    #[arg(long, conflicts_with_all = ["seeds", "first_seed"])]
    pub seed: Option<u64>,

    /// Run this many seeds.
    #[arg(long, default_value_t = 1000)]
    pub seeds: u64,

    /// The first of the seeds run.
    #[arg(long, default_value_t = 0)]
    pub first_seed: u64,

    /// Fault classes, comma-separated (or all, none); default: the classes that pass on this build.
    #[arg(long, value_parser = Faults::parse)]
    pub faults: Option<Faults>,

    /// Run every seed in this mode instead of cycling through the three.
    #[arg(long, value_parser = |s: &str| s.parse::<Mode>())]
    pub mode: Option<Mode>,
}

/// The `check` subcommand; returns whether every seed passed.
pub fn check(args: CheckArgs) -> bool {
    let faults = args.faults.unwrap_or(PASSING);
    let options = Options::default();
    if let Some(seed) = args.seed {
        let case = generate(seed, faults, args.mode);
        let out = run_case(&case);
        if out.passed() {
            println!(
                "seed {seed} passed: mode {}, faults {faults}, {} steps, {} mutations (minimum {}), state checked at {:.0}s",
                case.mode.as_str(),
                case.steps.len(),
                out.stats.mutations,
                out.stats.minimum,
                out.stats.checked_at.as_secs_f64()
            );
            return true;
        }
        print!("{}", report(&case, &out, &options));
        return false;
    }
    let wall = std::time::Instant::now();
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let summary = run_seeds(args.first_seed, args.seeds, faults, args.mode, threads);
    println!(
        "{} seeds ({}..{}), faults {faults}: {} failed; {:.1} h of virtual time in {:.1} s; {} mutations, minimum {}; {} Lease moves between two replicas; {} whole-table writes refused 412; {} ended held (settings check or a bound)",
        summary.seeds,
        args.first_seed,
        args.first_seed.saturating_add(args.seeds),
        summary.failures.len(),
        summary.virtual_time.as_secs_f64() / 3600.0,
        wall.elapsed().as_secs_f64(),
        summary.mutations,
        summary.minimum,
        summary.lease_moves,
        summary.conflicts,
        summary.held
    );
    if let Some((case, out)) = summary.failures.first() {
        let seeds: Vec<String> = summary
            .failures
            .iter()
            .take(20)
            .map(|(c, _)| c.seed.to_string())
            .collect();
        println!("failing seeds: {}", seeds.join(", "));
        // What each failing seed broke first, so one bug does not hide another.
        let mut by_kind: BTreeMap<(Kind, &str), Vec<u64>> = BTreeMap::new();
        for (c, o) in &summary.failures {
            if let Some(v) = o.violations.first() {
                by_kind
                    .entry((v.kind, c.mode.as_str()))
                    .or_default()
                    .push(c.seed);
            }
        }
        for ((kind, mode), seeds) in &by_kind {
            let first: Vec<String> = seeds.iter().take(5).map(u64::to_string).collect();
            println!(
                "  first broken {kind:?} in {mode}: {} seeds ({}{})",
                seeds.len(),
                first.join(", "),
                if seeds.len() > 5 { ", ..." } else { "" }
            );
        }
        print!("{}", report(case, out, &options));
    }
    summary.failures.is_empty()
}
