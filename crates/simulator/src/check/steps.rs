//! What the checker generates: fault classes, steps, and the seeded generator.
//!
//! A [`Case`] is everything one run needs: the mode, the shape of the cloud
//! and a list of [`TimedStep`]s at absolute virtual times. Steps name Nodes
//! and carry every parameter they need, so that removing any of them (the
//! shrinker does) leaves a sequence the driver can still play: a step about a
//! Node that does not exist at that moment does nothing.

use std::fmt;
use std::time::Duration;

use provider_memory::Operation;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use route_cloud::ErrorKind;
use route_controller::Mode;

use crate::api::CatchUp;

/// The fault classes the generator can draw from; each can be switched on
/// or off. Node creation and deletion are always generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Faults {
    /// A Node deleted and registered again at once under the same name (new
    /// UID), on the same instance, with the same or another pod CIDR.
    pub recreate: bool,
    /// The same, on a new instance (new providerID and InternalIP).
    pub new_instance: bool,
    /// A Node registered without providerID and InternalIP, its pod CIDR
    /// assigned at once, the rest seconds later (the external cloud provider order).
    pub late_data: bool,
    /// A Node's InternalIP changes.
    pub address_change: bool,
    /// A Node's instance stops for a while: the cloud reports its routes as blackholes.
    pub instance_stop: bool,
    /// Routes removed from or added to the table behind the controller's back,
    /// inside the cluster CIDRs: strays to gone Nodes, host routes (/32, /128),
    /// a Node's CIDR pointed elsewhere, a previous leader's correct route.
    pub behind_back: bool,
    /// Routes the controller must never touch: outside the cluster CIDRs
    /// (default route, peering, host routes) and unparsable destinations.
    pub foreign: bool,
    /// Pod CIDRs that get no route: not a CIDR, outside the cluster CIDRs,
    /// or claimed by two Nodes.
    pub odd_pod_cidrs: bool,
    /// Windows in which list, create or delete calls fail (transient, conflict).
    pub errors: bool,
    /// Creations or deletions that take effect but answer `Timeout`.
    pub timeouts: bool,
    /// Windows in which the cloud's rate limit drops to a request every few seconds.
    pub throttle: bool,
    /// Windows in which newly created routes are missing from the next list.
    pub lag: bool,
    /// Windows in which every call takes seconds.
    pub slow: bool,
    /// The replica loses its Lease for a while, then wins it back.
    pub leader: bool,
    /// Lease renewals stall past the renew deadline (a slow API server, a
    /// paused sole replica) and then succeed: the fence closes and reopens
    /// while the replica keeps its Lease.
    pub late_renewal: bool,
    /// The cloud refuses routes to stopped instances (EC2
    /// `IncorrectInstanceState`) instead of accepting them as blackholes;
    /// drawn per run, so both behaviours are checked.
    pub refuse_stopped: bool,
    /// The API server is unavailable for 5–120 s: status patches and
    /// Warning Events fail.
    pub api_outage: bool,
    /// The cloud checks Nodes' forwarding prerequisites, in a style drawn
    /// per run ([`ForwardingStyle`]): instances lose it behind the
    /// controller's back and the provider repairs it (AWS), or some start
    /// without it and the operator fixes them later (GCE, Azure).
    pub forwarding_lost: bool,
    /// The cloud has 1–3 named route targets (tables) instead of one, and
    /// tables are tagged for the cluster (appear) or untagged (go) while
    /// the controller runs.
    pub targets: bool,
    /// Windows in which each table holds at most a few routes more (or
    /// fewer) than it has: creations beyond answer `QuotaExceeded` until
    /// the window ends and room opens again.
    pub quota: bool,
    /// Per run, half the time: the cloud takes changes only as whole-table
    /// writes under a version (Azure's route table, a Neutron router), and
    /// another writer slips in between read and write (`412`), so the
    /// shared re-read loop must run.
    pub batch: bool,
    /// Windows of 1–30 s in which the Node watch delivers nothing, after
    /// which the events arrive late, or the watch ends and relists (from
    /// the current state, or from a stale cache first).
    pub watch_delay: bool,
    /// Per run, half the time: a second live replica shares the cloud and
    /// the Lease, standing by; leadership moves by the Lease when the
    /// leader's renewals stall past the lease duration, and the rival's
    /// own renewals stall too.
    pub rival: bool,
    /// Windows in which every Lease request takes 0.3 s up to a quarter of
    /// the renew deadline, as an API server busy with the leader's own
    /// condition burst answers: the binary's election runs against them
    /// and must keep the Lease ([`super::lease`]).
    pub slow_lease_api: bool,
}

impl Faults {
    /// Every class, by its name on the command line.
    pub const NAMES: [&'static str; 24] = [
        "recreate",
        "new_instance",
        "late_data",
        "address_change",
        "instance_stop",
        "behind_back",
        "foreign",
        "odd_pod_cidrs",
        "errors",
        "timeouts",
        "throttle",
        "lag",
        "slow",
        "leader",
        "late_renewal",
        "refuse_stopped",
        "api_outage",
        "forwarding_lost",
        "targets",
        "quota",
        "batch",
        "watch_delay",
        "rival",
        "slow_lease_api",
    ];

    /// No fault class: Nodes come and go, nothing else happens.
    pub const NONE: Faults = Faults {
        recreate: false,
        new_instance: false,
        late_data: false,
        address_change: false,
        instance_stop: false,
        behind_back: false,
        foreign: false,
        odd_pod_cidrs: false,
        errors: false,
        timeouts: false,
        throttle: false,
        lag: false,
        slow: false,
        leader: false,
        late_renewal: false,
        refuse_stopped: false,
        api_outage: false,
        forwarding_lost: false,
        targets: false,
        quota: false,
        batch: false,
        watch_delay: false,
        rival: false,
        slow_lease_api: false,
    };

    /// Every fault class.
    pub const ALL: Faults = Faults {
        recreate: true,
        new_instance: true,
        late_data: true,
        address_change: true,
        instance_stop: true,
        behind_back: true,
        foreign: true,
        odd_pod_cidrs: true,
        errors: true,
        timeouts: true,
        throttle: true,
        lag: true,
        slow: true,
        leader: true,
        late_renewal: true,
        refuse_stopped: true,
        api_outage: true,
        forwarding_lost: true,
        targets: true,
        quota: true,
        batch: true,
        watch_delay: true,
        rival: true,
        slow_lease_api: true,
    };

    fn slot(&mut self, name: &str) -> Option<&mut bool> {
        Some(match name {
            "recreate" => &mut self.recreate,
            "new_instance" => &mut self.new_instance,
            "late_data" => &mut self.late_data,
            "address_change" => &mut self.address_change,
            "instance_stop" => &mut self.instance_stop,
            "behind_back" => &mut self.behind_back,
            "foreign" => &mut self.foreign,
            "odd_pod_cidrs" => &mut self.odd_pod_cidrs,
            "errors" => &mut self.errors,
            "timeouts" => &mut self.timeouts,
            "throttle" => &mut self.throttle,
            "lag" => &mut self.lag,
            "slow" => &mut self.slow,
            "leader" => &mut self.leader,
            "late_renewal" => &mut self.late_renewal,
            "refuse_stopped" => &mut self.refuse_stopped,
            "api_outage" => &mut self.api_outage,
            "forwarding_lost" => &mut self.forwarding_lost,
            "targets" => &mut self.targets,
            "quota" => &mut self.quota,
            "batch" => &mut self.batch,
            "watch_delay" => &mut self.watch_delay,
            "rival" => &mut self.rival,
            "slow_lease_api" => &mut self.slow_lease_api,
            _ => return None,
        })
    }

    /// Whether the class `name` is on.
    pub fn get(&self, name: &str) -> Option<bool> {
        // `slot` is the one table of names; a copy lends it to a reader.
        let mut copy = *self;
        copy.slot(name).map(|b| *b)
    }

    /// Parses a comma-separated list of class names; `all` and `none` stand
    /// for every class and no class.
    pub fn parse(s: &str) -> Result<Faults, String> {
        let mut f = Faults::NONE;
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "all" => f = Faults::ALL,
                "none" => f = Faults::NONE,
                _ => match f.slot(name) {
                    Some(b) => *b = true,
                    None => {
                        return Err(format!(
                            "unknown fault class {name:?}; known: all, none, {}",
                            Faults::NAMES.join(", ")
                        ));
                    }
                },
            }
        }
        Ok(f)
    }
}

impl fmt::Display for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on: Vec<&str> = Faults::NAMES
            .iter()
            .copied()
            .filter(|n| self.get(n) == Some(true))
            .collect();
        if on.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&on.join(","))
        }
    }
}

/// A Node incarnation as a step registers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `spec.podCIDRs`, verbatim (may hold text that is not a CIDR).
    pub pod_cidrs: Vec<String>,
    /// The instance; `spec.providerID` is `sim:///i-<instance>`.
    pub instance: u32,
    /// The InternalIP, as a number (see [`ip_text`]).
    pub ip: u32,
    /// Registered without providerID and InternalIP; they arrive this much later.
    pub late: Option<Duration>,
    /// The instance is new and starts without its forwarding prerequisite
    /// ([`ForwardingStyle::ReadOnly`]: the operator forgot it at creation).
    pub forwarding_off: bool,
}

/// The InternalIP numbered `n`.
pub fn ip_text(n: u32) -> String {
    format!("10.0.{}.{}", n / 200, n % 200 + 1)
}

/// The providerID of instance `n`.
pub fn provider_id(instance: u32) -> String {
    format!("sim:///i-{instance}")
}

/// A route put in the table behind the controller's back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Extra {
    /// An in-cluster route to a Node that does not exist; the controller deletes it.
    Stray {
        /// Destination.
        cidr: String,
        /// Target node name.
        target: String,
    },
    /// A Node's pod CIDR pointed at another (or no) node; the controller replaces it.
    Hijack {
        /// The Node whose CIDR is taken.
        node: String,
        /// Where the route points now.
        target: String,
    },
    /// The route a previous leader created for a Node, exactly right.
    Correct {
        /// The Node.
        node: String,
    },
    /// A route the controller must never touch: outside the cluster CIDRs or
    /// not a CIDR at all.
    Foreign {
        /// Destination, verbatim.
        destination: String,
        /// Target node name (usually empty: a gateway).
        target: String,
    },
}

/// One thing that happens to the cluster or the cloud.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// A Node registers.
    Create(NodeSpec),
    /// A Node is deleted.
    Delete {
        /// Its name.
        node: String,
    },
    /// A Node is deleted and registered again at once under the same name.
    Recreate(NodeSpec),
    /// A Node's InternalIP changes.
    ChangeAddress {
        /// Its name.
        node: String,
        /// The new InternalIP number.
        ip: u32,
    },
    /// The instance of a Node stops, and starts again `duration` later.
    StopInstance {
        /// The Node.
        node: String,
        /// How long it stays stopped.
        duration: Duration,
    },
    /// A route disappears from the table; `pick` chooses among the routes present.
    RemoveRoute {
        /// Index, modulo the number of in-cluster routes present.
        pick: u32,
    },
    /// A route appears in the table.
    AddRoute(Extra),
    /// Calls of `op` fail with `kind` with this probability, for a while.
    Errors {
        /// The operation.
        op: Operation,
        /// The answer.
        kind: ErrorKind,
        /// Percent of calls that fail.
        percent: u8,
        /// How long.
        duration: Duration,
    },
    /// The next `n` calls of `op` take effect and answer `Timeout`.
    Timeouts {
        /// Create or delete.
        op: Operation,
        /// How many.
        n: u32,
    },
    /// The cloud admits `burst` requests, then one every `every_secs`, for a while.
    Throttle {
        /// Seconds per request.
        every_secs: u64,
        /// Bucket size.
        burst: u32,
        /// How long.
        duration: Duration,
    },
    /// Routes created during this window are missing from the next `lists` lists.
    Lag {
        /// Lists that miss a new route.
        lists: u32,
        /// How long.
        duration: Duration,
    },
    /// Every call takes `ms` milliseconds, for a while.
    Slow {
        /// Latency.
        ms: u64,
        /// How long.
        duration: Duration,
    },
    /// The replica is told it lost leadership; its Lease expires
    /// [`super::LEASE_GRACE`] later and it wins it back after `duration`.
    LeaderLoss {
        /// Time without leadership.
        duration: Duration,
    },
    /// No Lease renewal arrives for `stall` (longer than the renew deadline,
    /// so the fence closes); then one does, late, and the replica keeps
    /// the Lease.
    LateRenewal {
        /// Time without a renewal.
        stall: Duration,
    },
    /// The API server is unavailable for a while: status patches and
    /// Warning Events fail.
    ApiOutage {
        /// How long.
        duration: Duration,
    },
    /// The instance of a Node loses its forwarding prerequisite behind the
    /// controller's back (someone turns the source/destination check on
    /// again); the provider can repair it.
    LoseForwarding {
        /// The Node.
        node: String,
    },
    /// The operator turns the forwarding prerequisite of a Node's instance
    /// on (it cannot be changed by the provider).
    FixForwarding {
        /// The Node.
        node: String,
    },
    /// A route table is tagged for the cluster (a new zone), or tagged
    /// again after it went: its routes, if any, are as it left them.
    AddTarget {
        /// The table.
        name: String,
    },
    /// A route table loses the cluster's tag: it is no longer the
    /// cluster's, and nothing in it may be written once the controller
    /// has listed without it.
    DropTarget {
        /// The table.
        name: String,
    },
    /// Each table holds at most `max` routes for a while; the quota is
    /// lifted when the window ends.
    Quota {
        /// Routes per table.
        max: usize,
        /// How long.
        duration: Duration,
    },
    /// The next `n` whole-table writes meet another writer between their
    /// read and their write: the cloud answers `412` and the writer must
    /// read again.
    ConflictingWrites {
        /// How many writes.
        n: u32,
    },
    /// The rival replica's Lease renewals stall for `stall` (it is paused,
    /// or its API server is slow), then go on.
    RivalStall {
        /// Time without a renewal.
        stall: Duration,
    },
    /// Every Lease request takes `ms` milliseconds, for a while.
    LeaseSlow {
        /// Latency of each Lease read and write.
        ms: u64,
        /// How long.
        duration: Duration,
    },
    /// The Node watch delivers nothing for `duration`; then `end` happens.
    WatchDelay {
        /// How long events are held back.
        duration: Duration,
        /// How the watch catches up.
        end: CatchUp,
    },
}

impl Step {
    /// When the fault this step starts is over, relative to the step (zero
    /// for Node changes and instant faults).
    pub fn fault_duration(&self) -> Option<Duration> {
        match self {
            Step::StopInstance { duration, .. }
            | Step::Errors { duration, .. }
            | Step::Throttle { duration, .. }
            | Step::Lag { duration, .. }
            | Step::Slow { duration, .. }
            | Step::LeaderLoss { duration }
            | Step::LateRenewal { stall: duration }
            | Step::RivalStall { stall: duration }
            | Step::ApiOutage { duration }
            | Step::Quota { duration, .. }
            | Step::WatchDelay { duration, .. }
            | Step::LeaseSlow { duration, .. } => Some(*duration),
            Step::Timeouts { .. } => Some(Duration::ZERO),
            _ => None,
        }
    }
}

impl fmt::Display for NodeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} uid={} podCIDRs=[{}] instance=i-{} ip={}",
            self.name,
            self.uid,
            self.pod_cidrs.join(","),
            self.instance,
            ip_text(self.ip)
        )?;
        if let Some(l) = self.late {
            write!(f, " providerID+InternalIP {:?} later", l)?;
        }
        if self.forwarding_off {
            f.write_str(" (a new instance without its forwarding prerequisite)")?;
        }
        Ok(())
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Create(s) => write!(f, "create {s}"),
            Step::Delete { node } => write!(f, "delete {node}"),
            Step::Recreate(s) => write!(f, "recreate {s}"),
            Step::ChangeAddress { node, ip } => {
                write!(f, "change address of {node} to {}", ip_text(*ip))
            }
            Step::StopInstance { node, duration } => {
                write!(f, "stop the instance of {node} for {duration:?}")
            }
            Step::RemoveRoute { pick } => write!(f, "remove in-cluster route #{pick}"),
            Step::AddRoute(e) => match e {
                Extra::Stray { cidr, target } => write!(f, "add stray route {cidr} -> {target:?}"),
                Extra::Hijack { node, target } => {
                    write!(f, "point the pod CIDR of {node} at {target:?}")
                }
                Extra::Correct { node } => write!(f, "add the correct route of {node}"),
                Extra::Foreign {
                    destination,
                    target,
                } => write!(f, "add foreign route {destination} -> {target:?}"),
            },
            Step::Errors {
                op,
                kind,
                percent,
                duration,
            } => write!(f, "{percent}% of {op} calls fail {kind} for {duration:?}"),
            Step::Timeouts { op, n } => write!(f, "next {n} {op} calls time out (taking effect)"),
            Step::Throttle {
                every_secs,
                burst,
                duration,
            } => write!(
                f,
                "throttle storm: burst {burst}, one request per {every_secs}s, for {duration:?}"
            ),
            Step::Lag { lists, duration } => write!(
                f,
                "eventual consistency: new routes miss {lists} list(s), for {duration:?}"
            ),
            Step::Slow { ms, duration } => write!(f, "every call takes {ms}ms for {duration:?}"),
            Step::LeaderLoss { duration } => write!(f, "leadership lost for {duration:?}"),
            Step::LateRenewal { stall } => {
                write!(f, "no Lease renewal for {stall:?}, then a late one")
            }
            Step::ApiOutage { duration } => {
                write!(
                    f,
                    "the API server refuses status patches and Events for {duration:?}"
                )
            }
            Step::LoseForwarding { node } => write!(
                f,
                "the instance of {node} loses its forwarding prerequisite behind the controller's back"
            ),
            Step::FixForwarding { node } => write!(
                f,
                "the operator turns the forwarding prerequisite of {node}'s instance on"
            ),
            Step::AddTarget { name } => write!(f, "route table {name} is tagged for the cluster"),
            Step::DropTarget { name } => write!(f, "route table {name} loses the cluster's tag"),
            Step::Quota { max, duration } => {
                write!(
                    f,
                    "each route table holds at most {max} routes for {duration:?}"
                )
            }
            Step::RivalStall { stall } => write!(
                f,
                "no Lease renewal from the rival replica for {stall:?}, then renewals go on"
            ),
            Step::ConflictingWrites { n } => write!(
                f,
                "the next {n} whole-table writes meet another writer (412) and must read again"
            ),
            Step::LeaseSlow { ms, duration } => {
                write!(f, "every Lease request takes {ms}ms for {duration:?}")
            }
            Step::WatchDelay { duration, end } => write!(
                f,
                "the Node watch delivers nothing for {duration:?}, then {}",
                match end {
                    CatchUp::Late => "the events arrive late",
                    CatchUp::Relist => "it relists",
                    CatchUp::StaleRelist => "it relists from a stale cache and catches up",
                }
            ),
        }
    }
}

/// A step at its virtual time since the start of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct TimedStep {
    /// Since the start.
    pub at: Duration,
    /// What happens.
    pub step: Step,
}

/// The cloud's shape for one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudShape {
    /// Latency of every call outside `slow` windows, ms.
    pub latency_ms: u64,
    /// Listed routes carry the target's addresses (the planner compares them).
    pub reports_node_addresses: bool,
    /// Calls in flight at once.
    pub max_concurrent_operations: usize,
    /// Routes to stopped instances are refused (`TargetUnavailable`), not
    /// accepted as blackholes.
    pub refuses_stopped: bool,
    /// The cloud checks forwarding prerequisites, in this style; `None`:
    /// it does not (`checks_forwarding` is false), as before the class.
    pub forwarding: Option<ForwardingStyle>,
    /// The named route targets the cloud starts with (`targets`); empty:
    /// one unnamed table, as before the class.
    pub targets: Vec<String>,
    /// Changes are whole-table writes under a version (`batch`).
    pub batch: bool,
}

/// How the cloud of a `forwarding_lost` run treats forwarding prerequisites.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardingStyle {
    /// AWS: instances lose it behind the controller's back; a fresh check
    /// with repair turns it on again and answers `Repaired`; a check that
    /// is not fresh answers from what the provider last saw.
    Repairable,
    /// GCE, Azure: some instances start without it and only the operator
    /// turns it on; checks answer `Disabled` while it is off.
    ReadOnly,
}

impl ForwardingStyle {
    /// How reports name it.
    pub fn as_str(self) -> &'static str {
        match self {
            ForwardingStyle::Repairable => "repairable",
            ForwardingStyle::ReadOnly => "read-only",
        }
    }
}

/// Everything one run needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    /// The seed it was generated from.
    pub seed: u64,
    /// The fault classes it was generated with.
    pub faults: Faults,
    /// The reconcile mode.
    pub mode: Mode,
    /// The cloud.
    pub cloud: CloudShape,
    /// A second replica shares the cloud and the Lease (`rival`).
    pub rival: bool,
    /// The steps, in time order.
    pub steps: Vec<TimedStep>,
}

/// The mode a seed runs in unless one is given: the seeds cycle through all three.
pub fn mode_of_seed(seed: u64) -> Mode {
    Mode::ALL[(seed % Mode::ALL.len() as u64) as usize]
}

/// The most Nodes alive at once.
const MAX_LIVE: usize = 8;
/// Pod CIDR slots `10.244.<k>.0/24` (and `fd00:10:0:<k>::/64`).
const SLOTS: u32 = 16;

struct Live {
    name: String,
    instance: u32,
    ip: u32,
    slot: Option<u32>,
}

struct Gen {
    rng: StdRng,
    faults: Faults,
    steps: Vec<TimedStep>,
    live: Vec<Live>,
    names: u32,
    incarnations: u32,
    instances: u32,
    ips: u32,
    extras: u32,
    /// Per window kind, when the current window ends (windows of one kind never overlap).
    busy: [Duration; 13],
    /// The run's forwarding style (`forwarding_lost`).
    forwarding: Option<ForwardingStyle>,
    /// Instances numbered up to this one have had their prerequisite drawn.
    drawn: u32,
    /// Instances whose prerequisite is off now.
    forwarding_off: Vec<u32>,
    /// The tables tagged for the cluster now (`targets`), and how many
    /// were ever named.
    targets: Vec<String>,
    tables_named: u32,
    /// The run has a rival replica.
    rival: bool,
}

impl Gen {
    fn push(&mut self, at: Duration, step: Step) {
        self.steps.push(TimedStep { at, step });
    }

    fn free_slot(&mut self) -> Option<u32> {
        let used: Vec<u32> = self.live.iter().filter_map(|l| l.slot).collect();
        let free: Vec<u32> = (0..SLOTS).filter(|s| !used.contains(s)).collect();
        (!free.is_empty()).then(|| free[self.rng.random_range(0..free.len())])
    }

    /// Pod CIDRs for a new incarnation; `keep` is the slot of the previous one.
    fn pod_cidrs(&mut self, keep: Option<u32>) -> (Vec<String>, Option<u32>) {
        if self.faults.odd_pod_cidrs && self.rng.random_bool(0.15) {
            let k = self.rng.random_range(0..SLOTS);
            let odd = match self.rng.random_range(0..4) {
                0 => format!("10.244.{k}.0/33"),
                1 => format!("192.168.{k}.0/24"),
                // Claimed by two Nodes: equal or nested blocks.
                2 => format!("10.244.{k}.0/24"),
                _ => format!("10.244.{k}.128/25"),
            };
            return (vec![odd], None);
        }
        if self.rng.random_bool(0.05) {
            return (Vec::new(), None);
        }
        let slot = match keep {
            Some(s) => Some(s),
            None => self.free_slot(),
        };
        let Some(s) = slot else {
            return (Vec::new(), None);
        };
        let mut cidrs = vec![format!("10.244.{s}.0/24")];
        if self.rng.random_bool(0.25) {
            cidrs.push(format!("fd00:10:0:{s:x}::/64"));
        }
        (cidrs, Some(s))
    }

    fn spec(&mut self, name: String, keep: Option<(u32, u32, Option<u32>)>) -> NodeSpec {
        self.incarnations += 1;
        let (instance, ip, slot) = match keep {
            Some(k) => k,
            None => {
                self.instances += 1;
                self.ips += 1;
                (self.instances, self.ips, None)
            }
        };
        let (pod_cidrs, slot) = self.pod_cidrs(slot);
        let late = (self.faults.late_data && self.rng.random_bool(0.4))
            .then(|| Duration::from_secs(self.rng.random_range(1..=15)));
        // Drawn once per instance, when it first appears: a Node re-created
        // on it finds it as it was.
        let mut forwarding_off = false;
        if instance > self.drawn {
            self.drawn = instance;
            if self.forwarding == Some(ForwardingStyle::ReadOnly) && self.rng.random_bool(0.3) {
                forwarding_off = true;
                self.forwarding_off.push(instance);
            }
        }
        self.live.retain(|l| l.name != name);
        self.live.push(Live {
            name: name.clone(),
            instance,
            ip,
            slot,
        });
        NodeSpec {
            uid: format!("{name}-{}", self.incarnations),
            name,
            pod_cidrs,
            instance,
            ip,
            late,
            forwarding_off,
        }
    }

    fn pick_live(&mut self) -> Option<usize> {
        (!self.live.is_empty()).then(|| self.rng.random_range(0..self.live.len()))
    }

    /// A window of kind `k` starting at `at` if none of that kind is open.
    fn window(&mut self, k: usize, at: Duration, duration: Duration) -> bool {
        if self.busy[k] > at {
            return false;
        }
        self.busy[k] = at + duration;
        true
    }

    fn secs(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_secs(self.rng.random_range(lo..=hi))
    }

    fn node_step(&mut self, at: Duration) {
        let f = self.faults;
        let mut choices: Vec<u8> = vec![0, 0, 1];
        if f.recreate {
            choices.extend([2, 2]);
        }
        if f.new_instance {
            choices.extend([3, 3]);
        }
        if f.address_change {
            choices.push(4);
        }
        if f.instance_stop {
            choices.push(5);
        }
        match choices[self.rng.random_range(0..choices.len())] {
            0 => {
                if self.live.len() >= MAX_LIVE {
                    return self.delete(at);
                }
                // A fresh name: re-use of a name is what `recreate` and
                // `new_instance` are about.
                self.names += 1;
                let spec = self.spec(format!("n{}", self.names), None);
                self.push(at, Step::Create(spec));
            }
            1 => self.delete(at),
            kind @ (2 | 3) => {
                let Some(i) = self.pick_live() else { return };
                let (name, instance, ip, slot) = {
                    let l = &self.live[i];
                    (l.name.clone(), l.instance, l.ip, l.slot)
                };
                // Another pod CIDR once the old one is released, or the same one.
                let slot = if self.rng.random_bool(0.6) {
                    slot
                } else {
                    None
                };
                let keep = if kind == 2 {
                    Some((instance, ip, slot))
                } else {
                    self.instances += 1;
                    self.ips += 1;
                    Some((self.instances, self.ips, slot))
                };
                let spec = self.spec(name, keep);
                self.push(at, Step::Recreate(spec));
            }
            4 => {
                let Some(i) = self.pick_live() else { return };
                self.ips += 1;
                self.live[i].ip = self.ips;
                let node = self.live[i].name.clone();
                self.push(at, Step::ChangeAddress { node, ip: self.ips });
            }
            _ => {
                let Some(i) = self.pick_live() else { return };
                let node = self.live[i].name.clone();
                let duration = self.secs(30, 90);
                self.push(at, Step::StopInstance { node, duration });
            }
        }
    }

    fn delete(&mut self, at: Duration) {
        let Some(i) = self.pick_live() else { return };
        let node = self.live.remove(i).name;
        self.push(at, Step::Delete { node });
    }

    fn route_step(&mut self, at: Duration) {
        let f = self.faults;
        let mut choices: Vec<u8> = Vec::new();
        if f.behind_back {
            choices.extend([0, 0, 1, 2, 3, 4]);
        }
        if f.foreign {
            choices.extend([5, 5]);
        }
        if choices.is_empty() {
            return;
        }
        self.extras += 1;
        let k = self.extras;
        let step = match choices[self.rng.random_range(0..choices.len())] {
            0 => Step::RemoveRoute {
                pick: self.rng.random_range(0..64),
            },
            1 => {
                let slot = self.rng.random_range(0..SLOTS);
                Step::AddRoute(Extra::Stray {
                    cidr: format!("10.244.{slot}.0/24"),
                    target: format!("gone-{k}"),
                })
            }
            2 => {
                // Host routes inside the cluster CIDRs are the cluster's: upstream deletes them.
                let cidr = if self.rng.random_bool(0.5) {
                    format!("10.244.200.{}/32", k % 250)
                } else {
                    format!("fd00:10::{k:x}/128")
                };
                let target = if self.rng.random_bool(0.5) {
                    String::new()
                } else {
                    format!("gone-{k}")
                };
                Step::AddRoute(Extra::Stray { cidr, target })
            }
            3 => {
                let Some(i) = self.pick_live() else { return };
                let node = self.live[i].name.clone();
                let target = match self.pick_live() {
                    Some(j) if j != i => self.live[j].name.clone(),
                    _ => format!("gone-{k}"),
                };
                Step::AddRoute(Extra::Hijack { node, target })
            }
            4 => {
                let Some(i) = self.pick_live() else { return };
                Step::AddRoute(Extra::Correct {
                    node: self.live[i].name.clone(),
                })
            }
            _ => {
                let (destination, target) = match self.rng.random_range(0..6) {
                    0 => ("0.0.0.0/0".to_string(), String::new()),
                    1 => ("172.16.0.0/12".to_string(), String::new()),
                    2 => (format!("192.168.{}.7/32", k % 250), "bastion".to_string()),
                    3 => (format!("2001:db8::{k:x}/128"), "bastion".to_string()),
                    4 => (format!("pl-{k:05x}"), String::new()),
                    _ => (
                        format!("10.{}.0.0/16", 100 + k % 100),
                        format!("n{}", k % 8),
                    ),
                };
                Step::AddRoute(Extra::Foreign {
                    destination,
                    target,
                })
            }
        };
        self.push(at, step);
    }

    fn fault_step(&mut self, at: Duration) {
        let f = self.faults;
        let mut choices: Vec<u8> = Vec::new();
        for (on, c) in [
            (f.errors, 0),
            (f.timeouts, 1),
            (f.throttle, 2),
            (f.lag, 3),
            (f.slow, 4),
            (f.leader, 5),
            (f.late_renewal, 6),
            (f.api_outage, 7),
            (f.forwarding_lost, 8),
            (f.targets, 9),
            (f.quota, 10),
            (f.batch, 11),
            (f.watch_delay, 12),
            (self.rival, 13),
            (f.slow_lease_api, 14),
        ] {
            if on {
                choices.push(c);
            }
        }
        if f.watch_delay {
            // A held-back watch matters only when Nodes change meanwhile:
            // drawn more often than the other classes, so that 300 seeds
            // hold enough of those.
            choices.extend([12, 12]);
        }
        if choices.is_empty() {
            return;
        }
        match choices[self.rng.random_range(0..choices.len())] {
            0 => {
                let (op, k) = match self.rng.random_range(0..3) {
                    0 => (Operation::List, 0),
                    1 => (Operation::Create, 1),
                    _ => (Operation::Delete, 2),
                };
                let duration = self.secs(5, 20);
                if !self.window(k, at, duration) {
                    return;
                }
                let kind = if self.rng.random_bool(0.7) {
                    ErrorKind::Transient
                } else {
                    ErrorKind::Conflict
                };
                let percent = self.rng.random_range(20..=100);
                self.push(
                    at,
                    Step::Errors {
                        op,
                        kind,
                        percent,
                        duration,
                    },
                );
            }
            1 => {
                let op = if self.rng.random_bool(0.5) {
                    Operation::Create
                } else {
                    Operation::Delete
                };
                let n = self.rng.random_range(1..=3);
                self.push(at, Step::Timeouts { op, n });
            }
            2 => {
                let duration = self.secs(20, 60);
                if !self.window(3, at, duration) {
                    return;
                }
                let every_secs = self.rng.random_range(1..=20);
                let burst = self.rng.random_range(1..=3);
                self.push(
                    at,
                    Step::Throttle {
                        every_secs,
                        burst,
                        duration,
                    },
                );
            }
            3 => {
                let duration = self.secs(5, 30);
                if !self.window(4, at, duration) {
                    return;
                }
                let lists = self.rng.random_range(1..=2);
                self.push(at, Step::Lag { lists, duration });
            }
            4 => {
                let duration = self.secs(5, 30);
                if !self.window(5, at, duration) {
                    return;
                }
                let ms = self.rng.random_range(1_000..=9_000);
                self.push(at, Step::Slow { ms, duration });
            }
            5 => {
                let duration = self.secs(8, 40);
                if !self.window(6, at, duration) {
                    return;
                }
                self.push(at, Step::LeaderLoss { duration });
            }
            6 => {
                // Past the renew deadline (10 s), up to past the Lease.
                let stall = self.secs(11, 40);
                if !self.window(7, at, stall) {
                    return;
                }
                self.push(at, Step::LateRenewal { stall });
            }
            7 => {
                let duration = self.secs(5, 120);
                if !self.window(8, at, duration) {
                    return;
                }
                self.push(at, Step::ApiOutage { duration });
            }
            8 => self.forwarding_step(at),
            9 => self.target_step(at),
            10 => {
                let duration = self.secs(20, 90);
                if !self.window(9, at, duration) {
                    return;
                }
                // About as many routes as the live Nodes need, give or take:
                // sometimes room for all, sometimes not.
                let max = (self.live.len() + self.rng.random_range(0..=2)).saturating_sub(2);
                self.push(at, Step::Quota { max, duration });
            }
            11 => {
                let n = self.rng.random_range(1..=4);
                self.push(at, Step::ConflictingWrites { n });
            }
            13 => {
                // Past the renew deadline, up to well past the lease.
                let stall = self.secs(11, 40);
                if !self.window(11, at, stall) {
                    return;
                }
                self.push(at, Step::RivalStall { stall });
            }
            14 => {
                let duration = self.secs(10, 60);
                if !self.window(12, at, duration) {
                    return;
                }
                let ms = self.rng.random_range(300..=super::lease::MAX_LATENCY_MS);
                self.push(at, Step::LeaseSlow { ms, duration });
            }
            _ => {
                let duration = self.secs(1, 30);
                if !self.window(10, at, duration) {
                    return;
                }
                let end = match self.rng.random_range(0..3) {
                    0 => CatchUp::Late,
                    1 => CatchUp::Relist,
                    _ => CatchUp::StaleRelist,
                };
                self.push(at, Step::WatchDelay { duration, end });
            }
        }
    }

    /// A table tagged for the cluster (a new one, or one that went), or
    /// one of several untagged; the cluster keeps at least one.
    fn target_step(&mut self, at: Duration) {
        let gone: Vec<String> = (1..=self.tables_named)
            .map(|k| format!("rtb-{k}"))
            .filter(|t| !self.targets.contains(t))
            .collect();
        let add = self.targets.len() < 2 || (self.targets.len() < 3 && self.rng.random_bool(0.5));
        if add {
            let name = if !gone.is_empty() && self.rng.random_bool(0.3) {
                gone[self.rng.random_range(0..gone.len())].clone()
            } else {
                self.tables_named += 1;
                format!("rtb-{}", self.tables_named)
            };
            self.targets.push(name.clone());
            self.push(at, Step::AddTarget { name });
        } else {
            let name = self
                .targets
                .remove(self.rng.random_range(0..self.targets.len()));
            self.push(at, Step::DropTarget { name });
        }
    }

    fn forwarding_step(&mut self, at: Duration) {
        match self.forwarding {
            Some(ForwardingStyle::Repairable) => {
                let Some(i) = self.pick_live() else { return };
                let node = self.live[i].name.clone();
                self.push(at, Step::LoseForwarding { node });
            }
            Some(ForwardingStyle::ReadOnly) => {
                let off: Vec<usize> = (0..self.live.len())
                    .filter(|&i| self.forwarding_off.contains(&self.live[i].instance))
                    .collect();
                if off.is_empty() {
                    return;
                }
                let i = off[self.rng.random_range(0..off.len())];
                let (node, instance) = (self.live[i].name.clone(), self.live[i].instance);
                self.forwarding_off.retain(|&x| x != instance);
                self.push(at, Step::FixForwarding { node });
            }
            None => {}
        }
    }
}

/// Generates the case of `seed` with the fault classes `faults`, in `mode`
/// (or the seed's mode).
pub fn generate(seed: u64, faults: Faults, mode: Option<Mode>) -> Case {
    let mut g = Gen {
        rng: StdRng::seed_from_u64(seed),
        faults,
        steps: Vec::new(),
        live: Vec::new(),
        names: 0,
        incarnations: 0,
        instances: 0,
        ips: 0,
        extras: 0,
        busy: [Duration::ZERO; 13],
        forwarding: None,
        drawn: 0,
        forwarding_off: Vec::new(),
        targets: Vec::new(),
        tables_named: 0,
        rival: false,
    };
    let cloud = CloudShape {
        latency_ms: g.rng.random_range(0..=200),
        reports_node_addresses: g.rng.random_bool(0.5),
        max_concurrent_operations: g.rng.random_range(1..=10),
        refuses_stopped: faults.refuse_stopped && g.rng.random_bool(0.5),
        // Drawn only when the class is on, so runs without it generate
        // exactly what they did before it existed.
        forwarding: faults.forwarding_lost.then(|| {
            if g.rng.random_bool(0.5) {
                ForwardingStyle::Repairable
            } else {
                ForwardingStyle::ReadOnly
            }
        }),
        targets: Vec::new(),
        batch: false,
    };
    // Drawn only when their classes are on, as above.
    let mut cloud = cloud;
    if faults.targets {
        for _ in 0..g.rng.random_range(1..=3) {
            g.tables_named += 1;
            g.targets.push(format!("rtb-{}", g.tables_named));
        }
        cloud.targets = g.targets.clone();
    }
    cloud.batch = faults.batch && g.rng.random_bool(0.5);
    g.rival = faults.rival && g.rng.random_bool(0.5);
    g.forwarding = cloud.forwarding;
    // The cluster and the cloud as the controller finds them at start.
    for _ in 0..g.rng.random_range(0..=4) {
        g.node_step(Duration::ZERO);
    }
    if faults.behind_back || faults.foreign {
        for _ in 0..g.rng.random_range(0..=3) {
            g.route_step(Duration::ZERO);
        }
    }
    let n = g.rng.random_range(10..=35);
    let mut at = Duration::ZERO;
    for _ in 0..n {
        at += Duration::from_millis(g.rng.random_range(0..=12_000));
        // Several changes at one instant are common (a scale-up, a re-create).
        if g.rng.random_bool(0.15) {
            at = Duration::from_secs(at.as_secs());
        }
        match g.rng.random_range(0..10) {
            0..=4 => g.node_step(at),
            5..=6 => g.route_step(at),
            _ => g.fault_step(at),
        }
    }
    Case {
        seed,
        faults,
        mode: mode.unwrap_or_else(|| mode_of_seed(seed)),
        cloud,
        rival: g.rival,
        steps: g.steps,
    }
}
