//! A scenario turned into a list of timed cluster events.
//!
//! Everything here is decided once per scenario and seed, before any mode
//! runs, so that every mode sees exactly the same cluster: which Nodes exist,
//! their names, UIDs, pod CIDRs (from an allocator shaped like the node IPAM
//! controller's range allocator) and addresses, when each is created and
//! deleted, and when addresses change. Only the choice of which cloud routes
//! are removed behind the controller's back waits until run time, because it
//! depends on what the cloud holds in that mode at that moment.
//!
//! The minimum number of mutations a scenario needs is computed here from
//! these events (see [`Minimum`]).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use route_core::Cidr;
use serde::Serialize;

use crate::scenario::{Scenario, Wave};

/// One Node of the scenario (initial or added later).
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// Unique over the whole day: a name is never reused.
    pub name: String,
    /// Unique too.
    pub uid: String,
    /// The pod CIDR the allocator gave it. A CIDR freed by a deleted Node may
    /// come back later, always under a new name and UID.
    pub cidr: Cidr,
    /// InternalIP when created.
    pub address: Ipv4Addr,
}

/// A timed change to the cluster or, behind the controller's back, the cloud.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// The Node object is created (with its pod CIDR unless it is set later).
    Create(u32),
    /// The IPAM allocator sets the Node's pod CIDR.
    AssignCidr(u32),
    /// The Node object is deleted.
    Delete(u32),
    /// The Node's InternalIP changes to this address.
    ChangeAddress(u32, Ipv4Addr),
    /// This many routes of live Nodes vanish from the cloud.
    RemoveRoutes(u32),
    /// Routes to no Node appear in the cloud for these CIDRs.
    AddStrays(Vec<Cidr>),
    /// The cloud starts throttling every call, with this retry-after.
    StormStart(Option<Duration>),
    /// The cloud stops throttling every call.
    StormEnd,
}

/// The minimum number of mutations the scenario needs, by cause; the run
/// adds one repair per route it actually removed behind the controller's back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Minimum {
    /// Creations for the Nodes that exist at the start (0 when their routes exist already).
    pub initial_creates: u64,
    /// One creation per Node added during the day.
    pub added_creates: u64,
    /// One deletion per Node deleted (that had a pod CIDR).
    pub removed_deletes: u64,
    /// A deletion and a creation per address change, when the provider
    /// reports node addresses (otherwise the route is kept as it is).
    pub address_changes: u64,
    /// One deletion per stray route added behind the controller's back.
    pub stray_deletes: u64,
}

impl Minimum {
    /// The sum, without behind-the-back removals.
    pub fn total(&self) -> u64 {
        self.initial_creates
            + self.added_creates
            + self.removed_deletes
            + self.address_changes
            + self.stray_deletes
    }
}

/// The scenario as events.
#[derive(Debug, Clone)]
pub struct Timeline {
    /// Every Node of the day; actions refer to them by index.
    pub nodes: Vec<NodeSpec>,
    /// Nodes present at the start (indices `0..initial`).
    pub initial: u32,
    /// Changes in time order (stable for equal times).
    pub actions: Vec<(Duration, Action)>,
    /// First heartbeat of each Node, as an offset after its creation, in
    /// `(0, heartbeat_period]`; heartbeats then repeat every period.
    pub heartbeat_phase: Vec<Duration>,
    /// The minimum mutations (see [`Minimum`]).
    pub minimum: Minimum,
    /// The resync interval drawn for the watch and incremental modes.
    pub resync: Duration,
    /// Scale-down events that found no Node to delete.
    pub skipped_deletes: u64,
    /// Most Nodes alive at once.
    pub peak_nodes: u32,
}

/// Why a timeline cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimelineError {
    /// The scenario was not validated.
    #[error("{0}")]
    Scenario(String),
    /// More Nodes (plus stray routes) than pod CIDRs at some moment.
    #[error(
        "the cluster CIDR {cluster} has room for {capacity} /{mask} pod CIDRs, which runs out at {at:?} into the scenario"
    )]
    IpamExhausted {
        /// The cluster CIDR.
        cluster: String,
        /// Pod CIDRs it holds.
        capacity: u64,
        /// Their prefix length.
        mask: u8,
        /// When.
        at: Duration,
    },
}

/// Hands out pod CIDRs like the range allocator: a bitmap searched from the
/// slot after the last one handed out, wrapping around, so a freed CIDR is
/// reused only after the others have been tried.
#[derive(Debug)]
pub struct Ipam {
    cluster: Cidr,
    base: u32,
    mask: u8,
    used: Vec<bool>,
    next: usize,
    free: usize,
}

impl Ipam {
    /// An allocator of `/mask` blocks inside `cluster` (IPv4).
    pub fn new(cluster: Cidr, mask: u8) -> Self {
        let base = match cluster.network() {
            IpAddr::V4(a) => u32::from(a),
            IpAddr::V6(_) => 0,
        };
        let bits = u32::from(mask.saturating_sub(cluster.prefix_len())).min(24);
        let size = 1usize << bits;
        Self {
            cluster,
            base,
            mask,
            used: vec![false; size],
            next: 0,
            free: size,
        }
    }

    /// How many blocks the cluster CIDR holds.
    pub fn capacity(&self) -> usize {
        self.used.len()
    }

    /// The next free block, or `None` when all are in use.
    pub fn allocate(&mut self) -> Option<Cidr> {
        if self.free == 0 {
            return None;
        }
        let n = self.used.len();
        for k in 0..n {
            let i = (self.next + k) % n;
            if !self.used[i] {
                self.used[i] = true;
                self.free -= 1;
                self.next = (i + 1) % n;
                return Some(self.block(i));
            }
        }
        None
    }

    /// Returns a block.
    pub fn release(&mut self, cidr: &Cidr) {
        let IpAddr::V4(a) = cidr.network() else {
            return;
        };
        let step = 1u64 << (32 - u32::from(self.mask));
        let offset = u64::from(u32::from(a).wrapping_sub(self.base)) / step;
        if let Some(slot) = usize::try_from(offset)
            .ok()
            .and_then(|i| self.used.get_mut(i))
            && *slot
        {
            *slot = false;
            self.free += 1;
        }
    }

    fn block(&self, i: usize) -> Cidr {
        let step = 1u64 << (32 - u32::from(self.mask));
        let addr = u64::from(self.base) + i as u64 * step;
        let addr = Ipv4Addr::from(u32::try_from(addr).unwrap_or(u32::MAX));
        // The prefix is at most 30 (validated), so this cannot fail; fall back
        // to a host route rather than panic.
        // The mask is at most 30 (validated), so this cannot fail.
        Cidr::new(IpAddr::V4(addr), self.mask).unwrap_or(self.cluster)
    }
}

/// Node addresses come from 172.16.0.0/12, one fresh address per Node and
/// per address change.
struct Addresses(u32);

impl Addresses {
    fn next(&mut self) -> Ipv4Addr {
        self.0 += 1;
        Ipv4Addr::from(u32::from(Ipv4Addr::new(172, 16, 0, 0)) + (self.0 % (1 << 20)))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Intent {
    Up,
    Down,
    Address,
    Remove(u32),
    Strays(u32),
    Storm(Option<Duration>),
    StormEnd,
}

fn spread(rng: &mut StdRng, w: &Wave) -> Duration {
    let over = u64::try_from(w.over.0.as_millis()).unwrap_or(u64::MAX);
    let offset = if over == 0 {
        0
    } else {
        rng.random_range(0..over)
    };
    w.at.0 + Duration::from_millis(offset)
}

/// Live Nodes, with O(1) random removal.
#[derive(Default)]
struct Live {
    ids: Vec<u32>,
    pos: BTreeMap<u32, usize>,
}

impl Live {
    fn insert(&mut self, id: u32) {
        self.pos.insert(id, self.ids.len());
        self.ids.push(id);
    }

    fn pick(&self, rng: &mut StdRng) -> Option<u32> {
        (!self.ids.is_empty()).then(|| self.ids[rng.random_range(0..self.ids.len())])
    }

    fn remove(&mut self, id: u32) {
        if let Some(i) = self.pos.remove(&id) {
            self.ids.swap_remove(i);
            if let Some(&moved) = self.ids.get(i) {
                self.pos.insert(moved, i);
            }
        }
    }
}

impl Timeline {
    /// Builds the events of `scenario`.
    pub fn build(scenario: &Scenario) -> Result<Self, TimelineError> {
        scenario.validate().map_err(TimelineError::Scenario)?;
        let cluster = scenario.cluster().map_err(TimelineError::Scenario)?;
        let mut ipam = Ipam::new(cluster, scenario.node_cidr_mask);
        let exhausted = |at: Duration, ipam: &Ipam| TimelineError::IpamExhausted {
            cluster: scenario.cluster_cidr.clone(),
            capacity: ipam.capacity() as u64,
            mask: scenario.node_cidr_mask,
            at,
        };
        let mut rng = StdRng::seed_from_u64(scenario.seed);
        let resync = route_controller::pick_resync(
            scenario.controller.min_resync_period.0,
            rng.random::<f64>(),
        );
        let mut addresses = Addresses(0);
        let mut nodes: Vec<NodeSpec> = Vec::new();
        // When each Node's pod CIDR becomes visible; `None` if it never does.
        let mut cidr_at: Vec<Option<Duration>> = Vec::new();
        let mut live = Live::default();
        let new_node = |ipam: &mut Ipam,
                        nodes: &mut Vec<NodeSpec>,
                        addresses: &mut Addresses,
                        at: Duration|
         -> Result<u32, TimelineError> {
            let cidr = ipam.allocate().ok_or_else(|| exhausted(at, ipam))?;
            let i = nodes.len();
            nodes.push(NodeSpec {
                name: format!("node-{i:06}"),
                uid: format!("uid-{i:06}-{:08x}", mix(scenario.seed, i as u64)),
                cidr,
                address: addresses.next(),
            });
            Ok(i as u32)
        };
        for _ in 0..scenario.initial_nodes {
            let id = new_node(&mut ipam, &mut nodes, &mut addresses, Duration::ZERO)?;
            live.insert(id);
            cidr_at.push(Some(Duration::ZERO));
        }
        let initial = scenario.initial_nodes;

        let mut intents: Vec<(Duration, u64, Intent)> = Vec::new();
        for (waves, kind) in [
            (&scenario.scale_up, Intent::Up),
            (&scenario.scale_down, Intent::Down),
            (&scenario.address_changes, Intent::Address),
        ] {
            for w in waves {
                for _ in 0..w.count {
                    let t = spread(&mut rng, w);
                    intents.push((t, intents.len() as u64, kind));
                }
            }
        }
        for b in &scenario.routes_removed {
            intents.push((b.at.0, intents.len() as u64, Intent::Remove(b.count)));
        }
        for b in &scenario.routes_added {
            intents.push((b.at.0, intents.len() as u64, Intent::Strays(b.count)));
        }
        for s in &scenario.throttle_storms {
            let retry_after = s.retry_after.map(|r| r.0);
            intents.push((s.at.0, intents.len() as u64, Intent::Storm(retry_after)));
            let end = s.at.0 + s.lasting.0;
            intents.push((end, intents.len() as u64, Intent::StormEnd));
        }
        intents.sort();

        let mut minimum = Minimum {
            initial_creates: if scenario.routes_exist_at_start {
                0
            } else {
                u64::from(initial)
            },
            ..Minimum::default()
        };
        let mut actions: Vec<(Duration, u64, Action)> = Vec::new();
        let mut skipped_deletes = 0;
        let mut peak = initial;
        let delay = scenario.pod_cidr_delay.0;
        // Intents are handled in time order, so allocations and releases
        // happen in the order the range allocator would see them.
        for (t, seq, intent) in intents {
            match intent {
                Intent::Up => {
                    let id = new_node(&mut ipam, &mut nodes, &mut addresses, t)?;
                    live.insert(id);
                    peak = peak.max(live.ids.len() as u32);
                    actions.push((t, seq, Action::Create(id)));
                    cidr_at.push(Some(t + delay));
                    if !delay.is_zero() {
                        actions.push((t + delay, seq, Action::AssignCidr(id)));
                    }
                    minimum.added_creates += 1;
                }
                Intent::Down => {
                    let Some(id) = live.pick(&mut rng) else {
                        skipped_deletes += 1;
                        continue;
                    };
                    live.remove(id);
                    actions.push((t, seq, Action::Delete(id)));
                    let slot = &mut cidr_at[id as usize];
                    if slot.is_some_and(|at| at <= t) {
                        minimum.removed_deletes += 1;
                    } else {
                        // Deleted before the allocator got to it: it never
                        // had a pod CIDR, nor a route.
                        *slot = None;
                        minimum.added_creates -= 1;
                    }
                    ipam.release(&nodes[id as usize].cidr);
                }
                Intent::Address => {
                    if let Some(id) = live.pick(&mut rng) {
                        actions.push((t, seq, Action::ChangeAddress(id, addresses.next())));
                        if scenario.cloud.reports_node_addresses
                            && cidr_at[id as usize].is_some_and(|at| at <= t)
                        {
                            minimum.address_changes += 2;
                        }
                    }
                }
                Intent::Remove(n) => actions.push((t, seq, Action::RemoveRoutes(n))),
                Intent::Storm(r) => actions.push((t, seq, Action::StormStart(r))),
                Intent::StormEnd => actions.push((t, seq, Action::StormEnd)),
                Intent::Strays(n) => {
                    let mut cidrs = Vec::with_capacity(n as usize);
                    for _ in 0..n {
                        // Never released: a stray's block must not go to a Node.
                        cidrs.push(ipam.allocate().ok_or_else(|| exhausted(t, &ipam))?);
                    }
                    minimum.stray_deletes += u64::from(n);
                    actions.push((t, seq, Action::AddStrays(cidrs)));
                }
            }
        }
        actions.retain(|(_, _, a)| match a {
            Action::AssignCidr(id) => cidr_at[*id as usize].is_some(),
            _ => true,
        });
        actions.sort_by_key(|a| (a.0, a.1));

        let period_ms = u64::try_from(scenario.heartbeat_period.0.as_millis()).unwrap_or(u64::MAX);
        let mut hb = StdRng::seed_from_u64(u64::from(mix(scenario.seed, u64::MAX)));
        let heartbeat_phase = (0..nodes.len())
            .map(|_| {
                if period_ms == 0 {
                    Duration::ZERO
                } else {
                    // Whole seconds: heartbeats due in the same second are
                    // delivered together, which keeps the event loop short.
                    let secs = (period_ms / 1000).max(1);
                    Duration::from_secs(hb.random_range(1..=secs))
                }
            })
            .collect();
        // Every route exists once per route table.
        let tables = u64::from(scenario.cloud.tables.max(1));
        minimum.initial_creates *= tables;
        minimum.added_creates *= tables;
        minimum.removed_deletes *= tables;
        minimum.address_changes *= tables;
        minimum.stray_deletes *= tables;
        Ok(Timeline {
            nodes,
            initial,
            actions: actions.into_iter().map(|(t, _, a)| (t, a)).collect(),
            heartbeat_phase,
            minimum,
            resync,
            skipped_deletes,
            peak_nodes: peak,
        })
    }
}

fn mix(seed: u64, i: u64) -> u32 {
    // SplitMix64: a distinct, reproducible UID suffix per Node and seed.
    let mut z = seed.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as u32
}
