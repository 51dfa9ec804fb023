//! The cloud as the checked controller sees it: the memory cloud behind a
//! wrapper that checks every call as it is made and as it lands.
//!
//! The wrapper also models what the memory cloud does not: routes target an
//! instance (a creation without `spec.providerID` is refused, as the AWS
//! provider refuses it), a stopped instance makes every route to it list as
//! a blackhole until it starts again, and, in `forwarding_lost` runs, each
//! instance's forwarding prerequisite and a provider that checks it
//! ([`ForwardingStyle`]): it remembers what it saw per instance, as the AWS
//! and GCE providers do, so a check that is not fresh may answer what is
//! no longer true.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use provider_memory::MemoryCloud;
use route_cloud::conditional::ConditionalWrite;
use route_cloud::{
    Batch, BatchResult, Capabilities, CloudError, CloudRoutes, ErrorKind, Forwarding,
    ForwardingCheck, RequestStats,
};
use route_core::{Cidr, Destination, NodeAddress, NodeView, Route};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::expect::{Want, claims, in_cluster, points_at};
use super::steps::ForwardingStyle;
use super::{Kind, Violation};
use crate::api::ApiServer;

/// Which replica a call comes from (`rival` runs have two).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replica {
    /// The replica every run has; it holds the Lease at the start.
    Checked,
    /// The second replica of a `rival` run, standing by at the start.
    Rival,
}

/// The Lease both replicas of a `rival` run compete for.
#[derive(Debug, Clone, Copy)]
pub struct Lease {
    /// Who holds it.
    pub holder: Replica,
    /// When the holder last renewed it.
    pub renewed: Duration,
}

/// What the checker knows of one replica.
pub struct ReplicaState {
    /// Its fence, checked at every mutation's start and landing.
    pub fence: route_cloud::Fence,
    /// It has been told it leads (its fence is open).
    pub told_leader: bool,
    /// Its Lease renewals arrive (off while a `LateRenewal` or a
    /// `RivalStall` lasts).
    pub renewing: bool,
    /// The Nodes of its latest pass (from `observe_nodes`).
    pub snapshot: Vec<Arc<NodeView>>,
    /// Tells its controller whether it leads.
    pub leader: Arc<watch::Sender<bool>>,
    /// In a `rival` run, a renewal whose answer is stuck (a slow API
    /// server, a paused process): the API server renewed the Lease when it
    /// was sent, at this [`route_cloud::Fence::mark`], and the replica
    /// learns so only when the answer arrives.
    pub stuck: Option<Duration>,
}

impl ReplicaState {
    /// A replica that leads (`leads`) or stands by, with `fence` and the
    /// sender that tells its controller.
    pub fn new(fence: route_cloud::Fence, leader: Arc<watch::Sender<bool>>, leads: bool) -> Self {
        Self {
            fence,
            told_leader: leads,
            renewing: true,
            snapshot: Vec::new(),
            leader,
            stuck: None,
        }
    }
}

/// What the checker knows while a run goes on; shared by the driver and the wrapper.
pub struct World {
    /// When the run started.
    pub start: Instant,
    /// The cluster CIDRs.
    pub cluster: Vec<Cidr>,
    /// The cloud lists target addresses.
    pub reports_addresses: bool,
    /// The replica every run has.
    pub checked: ReplicaState,
    /// The replica holds the Lease: no other replica may write.
    pub lease_held: bool,
    /// The Lease of a `rival` run; `None`: one replica, whose Lease the
    /// `leader` and `late_renewal` classes move by hand.
    pub lease: Option<Lease>,
    /// The second replica of a `rival` run.
    pub rival: Option<ReplicaState>,
    /// Times the Lease moved from one replica to the other.
    pub lease_moves: u64,
    /// Routes to stopped instances are refused rather than blackholed.
    pub refuses_stopped: bool,
    /// When a creation for (replica and Node UID, table, destination) was last refused because
    /// its instance is stopped: the next may come only after the repair
    /// floor ([`route_controller::gate::BLACKHOLE_REPAIR_FLOOR`]).
    pub refused_at: HashMap<(String, String, Destination), Duration>,
    /// Passes started so far (each starts with `observe_nodes`).
    pub passes_started: u64,
    /// The latest pass (numbered from 1, in start order) whose report had
    /// changes the fence cut off.
    pub cut_off_pass: Option<u64>,
    /// ProviderIDs of stopped instances.
    pub stopped: BTreeSet<String>,
    /// Routes that must never be touched, as inserted.
    pub foreign: Vec<Route>,
    /// The final state disagreed with the settings (most live Nodes' pod
    /// CIDRs outside the cluster CIDR): the controller held it on purpose.
    pub held_at_end: bool,
    /// Everything found so far.
    pub violations: Vec<Violation>,
    /// Mutations that took effect, per route table and destination.
    pub mutations: BTreeMap<(String, Destination), u64>,
    /// The route tables tagged for the cluster now (`targets` runs; empty:
    /// one unnamed table), with when each was tagged.
    pub targets: BTreeMap<String, Duration>,
    /// Whole-table writes still to meet another writer between their read
    /// and their write (`batch` runs).
    pub conflicts: u32,
    /// The version of each table, as a whole-table writer reads it: every
    /// write and every other writer's change moves it on.
    pub versions: HashMap<String, u64>,
    /// Whole-table writes refused for a stale version (`412`).
    pub conflicts_met: u64,
    /// When the latest change behind the controller's back (a route removed,
    /// pointed elsewhere or added inside the cluster CIDRs) happened: until
    /// the next resync the controller cannot know of it.
    pub behind_back_at: Option<Duration>,
    /// Create and delete calls, any result.
    pub attempts: u64,
    /// List calls.
    pub lists: u64,
    /// One line per cloud call, for the report of a failing case.
    pub trace: Vec<String>,
    /// The providerID and addresses a Node registered without them will
    /// get, by UID: what it needs is judged by what it will be.
    pub eventual: HashMap<String, (String, Vec<NodeAddress>)>,
    /// The cloud checks forwarding prerequisites, in this style.
    pub forwarding: Option<ForwardingStyle>,
    /// ProviderIDs of instances whose forwarding prerequisite is off now,
    /// with the time it went off.
    pub forwarding_off: BTreeMap<String, Duration>,
    /// What the provider last saw per instance (providerID): off or not.
    pub forwarding_seen: HashMap<String, bool>,
    /// Per Node UID, whether the wrapper's last answer about it said the
    /// prerequisite is off (`Disabled` or `WouldRepair`).
    pub forwarding_answered_off: HashMap<String, bool>,
    /// Forwarding check calls, any answer.
    pub forwarding_checks: u64,
    /// Prerequisites the provider turned on again in a check.
    pub forwarding_repairs: u64,
}

impl World {
    /// What the checker knows of `who` (`None`: no rival in this run).
    pub fn replica(&self, who: Replica) -> Option<&ReplicaState> {
        match who {
            Replica::Checked => Some(&self.checked),
            Replica::Rival => self.rival.as_ref(),
        }
    }

    fn replica_mut(&mut self, who: Replica) -> Option<&mut ReplicaState> {
        match who {
            Replica::Checked => Some(&mut self.checked),
            Replica::Rival => self.rival.as_mut(),
        }
    }

    /// The fence of `who`.
    pub fn fence_of(&self, who: Replica) -> Option<&route_cloud::Fence> {
        self.replica(who).map(|r| &r.fence)
    }

    /// Whether `who` has been told it leads.
    pub fn told(&self, who: Replica) -> bool {
        self.replica(who).is_some_and(|r| r.told_leader)
    }

    /// Whether `who` holds an unexpired Lease now: no one else may write.
    pub fn holds_lease(&self, who: Replica) -> bool {
        match self.lease {
            Some(l) => l.holder == who && self.now() < l.renewed + super::LEASE_DURATION,
            None => who == Replica::Checked && self.lease_held,
        }
    }

    /// The Nodes of the latest pass of `who`.
    pub fn snapshot_of(&self, who: Replica) -> &[Arc<NodeView>] {
        self.replica(who).map_or(&[], |r| &r.snapshot)
    }

    /// The Nodes of the latest pass of the replica that leads now (the one
    /// whose status writes count).
    pub fn leading_snapshot(&self) -> &[Arc<NodeView>] {
        if self.told(Replica::Rival) {
            self.snapshot_of(Replica::Rival)
        } else {
            &self.checked.snapshot
        }
    }

    fn tell(&mut self, who: Replica, leads: bool) {
        let Some(r) = self.replica_mut(who) else {
            return;
        };
        r.told_leader = leads;
        if leads {
            // Winning the Lease is a successful renewal.
            r.fence.renewed(r.fence.mark(), super::RENEW_DEADLINE);
        }
        r.fence.set_leader(leads);
        r.leader.send_replace(leads);
    }

    /// One election round of `who` in a `rival` run, as client-go's
    /// leader election does it every retry period: the holder renews; a
    /// replica that finds another holder's Lease unexpired learns that it
    /// does not lead; one that finds it expired takes it. A replica whose
    /// renewals stall does nothing meanwhile.
    pub fn lease_round(&mut self, who: Replica) {
        let now = self.now();
        let Some(lease) = self.lease else { return };
        if !self.replica(who).is_some_and(|r| r.renewing) {
            return;
        }
        if lease.holder == who {
            self.lease = Some(Lease {
                holder: who,
                renewed: now,
            });
            if let Some(f) = self.fence_of(who) {
                f.renewed(f.mark(), super::RENEW_DEADLINE);
            }
        } else if now < lease.renewed + super::LEASE_DURATION {
            if self.told(who) {
                self.note(format!("{who:?} finds the Lease taken and stops leading"));
                self.tell(who, false);
            }
        } else {
            self.note(format!(
                "{who:?} takes the Lease, expired since {:?}",
                lease.renewed + super::LEASE_DURATION
            ));
            self.lease = Some(Lease {
                holder: who,
                renewed: now,
            });
            self.lease_moves += 1;
            self.tell(who, true);
        }
        self.check_one_inside();
    }

    /// A `rival` run's replica `who` sends a renewal whose answer will be
    /// stuck until [`World::renewal_answered`]: the API server renews the
    /// Lease now if `who` holds it; no further rounds until the answer.
    pub fn renewal_stuck(&mut self, who: Replica) {
        let now = self.now();
        let Some(lease) = self.lease else { return };
        let Some(r) = self.replica_mut(who) else {
            return;
        };
        r.renewing = false;
        r.stuck = (lease.holder == who).then(|| r.fence.mark());
        if r.stuck.is_some() {
            self.lease = Some(Lease {
                holder: who,
                renewed: now,
            });
        }
    }

    /// The stuck answer of `who`'s renewal arrives: a success, counted from
    /// when it was sent; rounds go on from the next retry period.
    pub fn renewal_answered(&mut self, who: Replica) {
        if let Some(r) = self.replica_mut(who) {
            r.renewing = true;
            if let Some(sent) = r.stuck.take() {
                r.fence.renewed(sent, super::RENEW_DEADLINE);
            }
        }
        self.check_one_inside();
    }

    /// At most one replica may be inside its fencing deadline at any instant.
    pub fn check_one_inside(&mut self) {
        let inside = [Replica::Checked, Replica::Rival]
            .into_iter()
            .filter(|r| {
                self.fence_of(*r)
                    .is_some_and(|f| f.is_leader() && f.is_open())
            })
            .count();
        if inside > 1 {
            self.violation(
                Kind::TwoInsideDeadline,
                "both replicas are inside their fencing deadline".to_string(),
            );
        }
    }

    /// A mutation `what` (started, landed) by `who` while its fence is
    /// closed: the renew deadline passed, so another replica may already
    /// be leading.
    fn check_fence(&mut self, who: Replica, op: &str, route: &Route, what: &str) {
        let call = format!("{op} {} -> {:?}", route.destination, route.node);
        self.check_fence_of(who, &call, what);
    }

    /// [`World::check_fence`] for any write, described by `call`.
    fn check_fence_of(&mut self, who: Replica, call: &str, what: &str) {
        if self
            .fence_of(who)
            .is_some_and(|f| f.is_leader() && !f.is_open())
        {
            self.violation(
                Kind::MutationPastDeadline,
                format!("{call} {what} by {who:?} after its renew deadline had passed"),
            );
        }
        self.check_one_inside();
    }

    /// A write that starts and lands at once (a forwarding repair): it
    /// obeys the fence and leadership as route writes do.
    fn check_instant_write(&mut self, who: Replica, call: &str) {
        self.check_fence_of(who, call, "started and landed");
        if !self.told(who) || !self.holds_lease(who) {
            self.violation(
                Kind::MutationWithoutLeadership,
                format!("{call} while {who:?} was not leader"),
            );
        }
    }

    /// The provider's answer about one Node's instance `pid` (and what it
    /// remembers and repairs on the way), or `None` for no news; `read`
    /// is set when the cloud had to be asked.
    fn forwarding_of(
        &mut self,
        who: Replica,
        style: ForwardingStyle,
        node: &str,
        pid: &str,
        check: ForwardingCheck,
        read: &mut bool,
    ) -> Forwarding {
        let seen = self.forwarding_seen.get(pid).copied();
        let what = format!("instance {pid} of node {node} may not forward pod traffic");
        match style {
            ForwardingStyle::Repairable => {
                // What was seen on (or turned on) is trusted until a fresh
                // check: exactly what a loss behind the back hides.
                if !check.fresh && seen == Some(false) {
                    return Forwarding::Ready;
                }
                *read = true;
                let off = self.forwarding_off.contains_key(pid);
                if off && check.repair {
                    self.check_instant_write(who, &format!("forwarding repair of {pid} ({node})"));
                    self.forwarding_off.remove(pid);
                    self.forwarding_repairs += 1;
                    self.forwarding_seen.insert(pid.to_string(), false);
                    return Forwarding::Repaired { what };
                }
                self.forwarding_seen.insert(pid.to_string(), off);
                if off {
                    Forwarding::WouldRepair { what }
                } else {
                    Forwarding::Ready
                }
            }
            ForwardingStyle::ReadOnly => {
                // Once on it cannot be turned off while the instance runs:
                // never read again. Off is read again only when asked fresh.
                let off = match seen {
                    Some(false) => false,
                    Some(true) if !check.fresh => true,
                    _ => {
                        *read = true;
                        let off = self.forwarding_off.contains_key(pid);
                        self.forwarding_seen.insert(pid.to_string(), off);
                        off
                    }
                };
                if off {
                    Forwarding::Disabled {
                        what,
                        fix: format!("turn IP forwarding on for instance {pid}"),
                    }
                } else {
                    Forwarding::Ready
                }
            }
        }
    }

    /// Virtual time since the start.
    pub fn now(&self) -> Duration {
        Instant::now().saturating_duration_since(self.start)
    }

    /// Records a violation found now.
    pub fn violation(&mut self, kind: Kind, detail: String) {
        let at = self.now();
        self.violations.push(Violation { at, kind, detail });
    }

    /// Whether one of `nodes` needs exactly `route`: it claims the
    /// destination alone, and the route points at it — judged by the
    /// providerID and addresses the Node has, or will have if it registered
    /// without them. A blackhole, or a route to another instance or with
    /// other addresses (when the cloud reports them), is not needed.
    pub fn needs(&self, nodes: &[Arc<NodeView>], route: &Route) -> bool {
        let Some(c) = route.destination.cidr() else {
            return false;
        };
        let Some(n) = nodes.iter().find(|n| n.name == route.node.as_str()) else {
            return false;
        };
        let alone = claims(nodes, &self.cluster)
            .iter()
            .any(|x| x.node == n.name && x.cidr == c && !x.conflicted);
        if !alone {
            return false;
        }
        let (provider_id, mut addresses) = match (&n.provider_id, self.eventual.get(&n.uid)) {
            (Some(p), _) => (p.clone(), n.addresses.clone()),
            (None, Some((p, a))) => (p.clone(), a.clone()),
            (None, None) => return false,
        };
        addresses.sort();
        let want = Want {
            node: n.name.clone(),
            provider_id: Some(provider_id),
            addresses,
        };
        points_at(route, &want, self.reports_addresses)
    }

    fn note(&mut self, line: String) {
        let at = self.now();
        self.trace
            .push(format!("{:>9.3}s  {line}", at.as_secs_f64()));
    }
}

/// Re-reads after a `412` before a whole-table write gives up: the Azure
/// and OpenStack providers' `max_conflict_retries` (default 5) is of this
/// kind; fewer here, so that a run of conflicts also makes a write fail.
pub const WRITE_RETRIES: u32 = 3;

/// Locks the shared world.
pub fn lock(world: &Mutex<World>) -> MutexGuard<'_, World> {
    world.lock().unwrap_or_else(|e| e.into_inner())
}

/// The checked cloud handed to the controller.
pub struct CheckedCloud {
    inner: MemoryCloud,
    world: Arc<Mutex<World>>,
    api: Arc<ApiServer>,
    /// Ends the controller when it spins (see [`super::LIVELOCK_PASSES`]).
    shutdown: CancellationToken,
    /// The virtual instant of the latest pass, and how many passes started at it.
    passes: Mutex<(Option<Instant>, u32)>,
    /// Whose calls these are.
    replica: Replica,
}

impl CheckedCloud {
    /// Wraps `inner`; `api` is the truth about the Nodes.
    pub fn new(
        inner: MemoryCloud,
        world: Arc<Mutex<World>>,
        api: Arc<ApiServer>,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            inner,
            world,
            api,
            shutdown,
            passes: Mutex::new((None, 0)),
            replica: Replica::Checked,
        }
    }

    /// The same, for the rival replica's calls.
    pub fn for_rival(mut self) -> Self {
        self.replica = Replica::Rival;
        self
    }

    /// Checks made when a mutating call starts.
    fn before_mutation(&self, w: &mut World, op: &str, route: &Route) {
        let who = self.replica;
        w.check_fence(who, op, route, "started");
        if !w.told(who) {
            w.violation(
                Kind::MutationWithoutLeadership,
                format!(
                    "{op} {} -> {:?} started after {who:?} was told it is not leader",
                    route.destination, route.node
                ),
            );
        }
        if !w.targets.is_empty() || !route.table.is_empty() {
            // A table the last list did not name is no longer the cluster's
            // as far as the controller knows: nothing in it is to be written.
            let listed = self.inner.targets();
            if !listed.contains(&route.table) {
                w.violation(
                    Kind::TouchedForeign,
                    format!(
                        "{op} of {} -> {:?} in table {:?}, which the controller's last list did not name (listed: {:?})",
                        route.destination, route.node, route.table, listed
                    ),
                );
            }
        }
        let inside = route
            .destination
            .cidr()
            .is_some_and(|c| in_cluster(&w.cluster, &c));
        let foreign = w.foreign.iter().any(|f| f.destination == route.destination);
        if !inside || foreign {
            w.violation(
                Kind::TouchedForeign,
                format!(
                    "{op} of {} -> {:?}, which is outside the cluster CIDRs, unparsable or foreign",
                    route.destination, route.node
                ),
            );
        }
    }

    /// Checks made when a creation starts, and the refusals the wrapper
    /// models (a stopped instance where the cloud refuses those, no
    /// providerID): `Err` is the cloud's answer, the memory cloud is not called.
    fn admit_creation(
        &self,
        name_hint: &str,
        route: &Route,
        answered_now: bool,
    ) -> Result<(), CloudError> {
        let mut w = lock(&self.world);
        w.attempts += 1;
        self.before_mutation(&mut w, "create", route);
        let claimed = route.destination.cidr().is_some_and(|c| {
            claims(w.snapshot_of(self.replica), &w.cluster)
                .iter()
                .any(|x| x.cidr == c && !x.conflicted && x.node == route.node.as_str())
        });
        if !claimed {
            w.violation(
                Kind::UnneededCreate,
                format!(
                    "created {} -> {:?}, which no Node of the pass's snapshot claims alone",
                    route.destination, route.node
                ),
            );
        }
        if w.refuses_stopped
            && route
                .node_provider_id
                .as_deref()
                .is_some_and(|p| w.stopped.contains(p))
        {
            // As EC2 answers CreateRoute and ReplaceRoute to a stopped
            // or terminated instance.
            let now = w.now();
            // Each replica keeps its own backoff: a new leader may try once.
            let key = (
                format!("{:?}/{name_hint}", self.replica),
                route.table.to_string(),
                route.destination.clone(),
            );
            // The refusal counts from when its answer reached the
            // controller: at once for a single call, at the end of a batch
            // (whose answer the fence may abandon).
            let prev = if answered_now {
                w.refused_at.insert(key, now)
            } else {
                w.refused_at.get(&key).copied()
            };
            if let Some(prev) = prev {
                let floor = route_controller::gate::BLACKHOLE_REPAIR_FLOOR;
                if now - prev < floor {
                    w.violation(
                    Kind::TooManyCalls,
                    format!(
                        "create {} -> {:?} sent again {:?} after the cloud refused it for the instance's state; such refusals back off from {floor:?}",
                        route.destination,
                        route.node,
                        now - prev
                    ),
                );
                }
            }
            w.note(format!(
                "create {} -> {:?}: refused, the instance is stopped",
                route.destination, route.node
            ));
            return Err(CloudError::new(
                ErrorKind::TargetUnavailable,
                format!(
                    "IncorrectInstanceState: the instance of node {} is stopped",
                    route.node
                ),
            ));
        }
        if route.node_provider_id.is_none() {
            let e = CloudError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "node {} has no spec.providerID: no instance to route {} to",
                    route.node, route.destination
                ),
            );
            w.note(format!(
                "create {} -> {:?}: refused, no providerID",
                route.destination, route.node
            ));
            return Err(e);
        }
        Ok(())
    }

    /// Checks made when a deletion starts.
    fn admit_deletion(&self, route: &Route) {
        let mut w = lock(&self.world);
        w.attempts += 1;
        self.before_mutation(&mut w, "delete", route);
        let truth: Vec<Arc<NodeView>> = self.api.nodes().into_iter().map(Arc::new).collect();
        if w.needs(w.snapshot_of(self.replica), route) && w.needs(&truth, route) {
            w.violation(
                Kind::NeededRouteDeleted,
                format!(
                    "deleted {} -> {:?} ({}), the route that Node needs (in the pass's snapshot and now)",
                    route.destination,
                    route.node,
                    route.node_provider_id.as_deref().unwrap_or("no providerID")
                ),
            );
        }
    }

    /// One table's share of a batch, written as a whole-table writer
    /// writes: under the version it read, read again after a `412`, by the
    /// loop the Azure and OpenStack providers share.
    async fn write_table(
        &self,
        cluster: &str,
        table: &str,
        batch: Batch,
    ) -> Result<BatchResult, CloudError> {
        let world = &self.world;
        let out = route_cloud::write_conditionally(
            WRITE_RETRIES,
            None,
            || {
                let version = lock(world).versions.get(table).copied().unwrap_or(0);
                async move { Ok::<_, CloudError>(((), version)) }
            },
            |_: &()| Ok(Some(batch.clone())),
            |b: Batch, version: u64| async move {
                {
                    let mut w = lock(world);
                    if w.conflicts > 0 {
                        // Another writer changed the table since it was read.
                        w.conflicts -= 1;
                        *w.versions.entry(table.to_string()).or_default() += 1;
                    }
                    if w.versions.get(table).copied().unwrap_or(0) != version {
                        w.conflicts_met += 1;
                        w.note(format!(
                            "batch on table {table:?}: 412, the table changed since it was read"
                        ));
                        return Err(CloudError::new(
                            ErrorKind::Conflict,
                            format!(
                                "412 Precondition Failed: table {table:?} changed since it was read"
                            ),
                        ));
                    }
                }
                let r = self.inner.apply_batch(cluster, &b).await;
                *lock(world).versions.entry(table.to_string()).or_default() += 1;
                r
            },
            |_| {},
        )
        .await?;
        Ok(match out {
            // Nothing left to write: every change is as asked.
            ConditionalWrite::Unchanged(()) => batch
                .delete
                .iter()
                .map(|(k, _)| (k.clone(), Ok(None)))
                .chain(
                    batch
                        .create
                        .iter()
                        .map(|(k, _, r)| (k.clone(), Ok(Some(r.clone())))),
                )
                .collect(),
            ConditionalWrite::Written(r) => r,
        })
    }

    /// Checks made when a mutating call has come back; an answer of `Ok` or
    /// `Timeout` means it took effect.
    fn after_mutation(&self, op: &str, route: &Route, result: &Result<(), CloudError>) {
        let mut w = lock(&self.world);
        let landed = match result {
            Ok(()) => true,
            Err(e) => e.kind == ErrorKind::Timeout,
        };
        w.note(format!(
            "{op} {}{} -> {:?} ({}): {}",
            route.destination,
            if route.table.is_empty() {
                String::new()
            } else {
                format!(" in {}", route.table)
            },
            route.node,
            route.node_provider_id.as_deref().unwrap_or("no providerID"),
            match result {
                Ok(()) => "ok".to_string(),
                Err(e) => e.kind.to_string(),
            }
        ));
        if !landed {
            return;
        }
        let who = self.replica;
        w.check_fence(who, op, route, "landed");
        if !w.holds_lease(who) {
            w.violation(
                Kind::MutationWithoutLeadership,
                format!(
                    "{op} {} -> {:?} landed after the Lease of {who:?} had expired",
                    route.destination, route.node
                ),
            );
        }
        *w.mutations
            .entry((route.table.to_string(), route.destination.clone()))
            .or_default() += 1;
        if op == "create"
            && w.forwarding == Some(ForwardingStyle::Repairable)
            && let Some(pid) = route.node_provider_id.as_deref()
        {
            // As the AWS provider prepares an instance with its route.
            w.forwarding_off.remove(pid);
            w.forwarding_seen.insert(pid.to_string(), false);
        }
    }
}

#[async_trait]
impl CloudRoutes for CheckedCloud {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // Creations without a providerID are refused (below), as AWS
            // does; the controller is told so, as AWS's provider tells it.
            needs: route_core::TargetNeeds::ProviderId,
            checks_forwarding: lock(&self.world).forwarding.is_some(),
            max_routes_per_family: false,
            ..self.inner.capabilities()
        }
    }

    fn stats(&self) -> &RequestStats {
        self.inner.stats()
    }

    fn targets(&self) -> Vec<route_core::Text> {
        self.inner.targets()
    }

    async fn discover_targets(
        &self,
        cluster: &str,
    ) -> Result<Option<Vec<route_core::Text>>, CloudError> {
        self.inner.discover_targets(cluster).await
    }

    async fn apply_batch(&self, cluster: &str, batch: &Batch) -> Result<BatchResult, CloudError> {
        // Each change is checked as it starts, as a single call is; the
        // ones the wrapper refuses get their answer without a write.
        let mut results = BatchResult::new();
        let mut tables: BTreeMap<String, Batch> = BTreeMap::new();
        let mut refused: Vec<(String, Route)> = Vec::new();
        for (key, r) in &batch.delete {
            self.admit_deletion(r);
            let b = tables.entry(r.table.to_string()).or_default();
            b.delete.push((key.clone(), r.clone()));
        }
        for (key, hint, r) in &batch.create {
            match self.admit_creation(hint, r, false) {
                Err(e) => {
                    if e.kind == ErrorKind::TargetUnavailable {
                        refused.push((hint.clone(), r.clone()));
                    }
                    results.insert(key.clone(), Err(e));
                }
                Ok(()) => {
                    let b = tables.entry(r.table.to_string()).or_default();
                    b.create.push((key.clone(), hint.clone(), r.clone()));
                }
            }
        }
        for (table, b) in tables {
            let keys: Vec<route_core::OpKey> = b.keys().cloned().collect();
            match self.write_table(cluster, &table, b).await {
                Ok(mut r) if keys.iter().all(|k| r.contains_key(k)) => {
                    results.extend(keys.iter().filter_map(|k| r.remove_entry(k)));
                }
                Ok(r) => {
                    return Err(CloudError::new(
                        ErrorKind::Transient,
                        format!(
                            "the memory cloud answered {} of {} changes",
                            keys.iter().filter(|k| r.contains_key(k)).count(),
                            keys.len()
                        ),
                    ));
                }
                Err(e) => {
                    for k in keys {
                        results.insert(k, Err(e.clone()));
                    }
                }
            }
        }
        {
            // The batch's answer reaches the controller now, its refusals with it.
            let mut w = lock(&self.world);
            let now = w.now();
            for (hint, r) in refused {
                let key = (
                    format!("{:?}/{hint}", self.replica),
                    r.table.to_string(),
                    r.destination.clone(),
                );
                w.refused_at.insert(key, now);
            }
        }
        let no_result = || Err(CloudError::new(ErrorKind::Transient, "no result"));
        for (key, r) in &batch.delete {
            let res = results.entry(key.clone()).or_insert_with(no_result);
            self.after_mutation("delete", r, &res.as_ref().map(|_| ()).map_err(Clone::clone));
        }
        for (key, _, r) in &batch.create {
            let res = results.entry(key.clone()).or_insert_with(no_result);
            self.after_mutation("create", r, &res.as_ref().map(|_| ()).map_err(Clone::clone));
        }
        Ok(results)
    }

    async fn list_routes(&self, cluster: &str) -> Result<Vec<Route>, CloudError> {
        let r = self.inner.list_routes(cluster).await;
        let mut w = lock(&self.world);
        w.lists += 1;
        let r = r.map(|mut routes| {
            for route in &mut routes {
                if route
                    .node_provider_id
                    .as_deref()
                    .is_some_and(|p| w.stopped.contains(p))
                {
                    route.blackhole = true;
                }
            }
            routes
        });
        let line = match &r {
            Ok(routes) => format!("list: {} routes", routes.len()),
            Err(e) => format!("list: {}", e.kind),
        };
        w.note(line);
        r
    }

    async fn create_route(
        &self,
        cluster: &str,
        name_hint: &str,
        route: &Route,
    ) -> Result<Route, CloudError> {
        self.admit_creation(name_hint, route, true)?;
        let r = self.inner.create_route(cluster, name_hint, route).await;
        self.after_mutation(
            "create",
            route,
            &r.as_ref().map(|_| ()).map_err(Clone::clone),
        );
        r
    }

    async fn delete_route(&self, cluster: &str, route: &Route) -> Result<(), CloudError> {
        self.admit_deletion(route);
        let r = self.inner.delete_route(cluster, route).await;
        self.after_mutation("delete", route, &r);
        r
    }

    async fn check_forwarding(
        &self,
        _cluster: &str,
        nodes: &[Arc<NodeView>],
        check: ForwardingCheck,
    ) -> Result<Vec<(String, Forwarding)>, CloudError> {
        let mut w = lock(&self.world);
        w.forwarding_checks += 1;
        let Some(style) = w.forwarding else {
            w.violation(
                Kind::UnexpectedForwardingCheck,
                format!(
                    "forwarding check of {} Nodes, though the capabilities say the cloud has none",
                    nodes.len()
                ),
            );
            return Ok(Vec::new());
        };
        let mut answers = Vec::new();
        let mut read = false;
        let mut line = Vec::new();
        for n in nodes {
            // No instance known yet: no news, as a real provider answers.
            let Some(pid) = n.provider_id.as_deref() else {
                line.push(format!("{} no providerID", n.name));
                continue;
            };
            let answer = w.forwarding_of(self.replica, style, &n.name, pid, check, &mut read);
            let off = matches!(
                answer,
                Forwarding::Disabled { .. } | Forwarding::WouldRepair { .. }
            );
            w.forwarding_answered_off.insert(n.uid.clone(), off);
            line.push(format!(
                "{} {}",
                n.name,
                match answer {
                    Forwarding::Ready => "ready",
                    Forwarding::Repaired { .. } => "repaired",
                    Forwarding::WouldRepair { .. } => "would repair",
                    Forwarding::Disabled { .. } => "disabled",
                }
            ));
            answers.push((n.name.clone(), answer));
        }
        w.note(format!(
            "check forwarding ({}{}, {}): {}",
            if check.fresh { "fresh" } else { "remembered" },
            if check.repair { ", repair" } else { "" },
            if read { "read" } else { "no request" },
            line.join(", ")
        ));
        Ok(answers)
    }

    fn observe_nodes(&self, nodes: &[Arc<NodeView>]) {
        let mut w = lock(&self.world);
        if let Some(r) = w.replica_mut(self.replica) {
            r.snapshot = nodes.to_vec();
        }
        if self.replica == Replica::Checked {
            w.passes_started += 1;
        }
        // A loop that never waits keeps the paused clock from moving and
        // would hang the run; every pass starts here, so this is where it
        // is caught and the controller told to stop after its pass.
        let now = Instant::now();
        let mut p = self.passes.lock().unwrap_or_else(|e| e.into_inner());
        if p.0 == Some(now) {
            p.1 += 1;
        } else {
            *p = (Some(now), 0);
        }
        if p.1 == super::LIVELOCK_PASSES {
            w.violation(
                Kind::Livelock,
                format!(
                    "{} passes without virtual time moving; the controller was stopped",
                    super::LIVELOCK_PASSES
                ),
            );
            self.shutdown.cancel();
        }
    }
}
