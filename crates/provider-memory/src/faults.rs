//! Fault injection: what makes the simulated cloud misbehave on purpose.
//!
//! Owns [`Faults`] (the "fail the next N calls" slots, the seeded random
//! failures' generator and the throttling storm) and the controls a test or
//! the simulator uses to make the cloud fail or change behind the
//! controller's back: [`MemoryCloud::fail_next`], [`MemoryCloud::set_storm`],
//! [`MemoryCloud::set_error_rate`], [`MemoryCloud::insert_route`],
//! [`MemoryCloud::remove_route`] and [`MemoryCloud::blackhole_route`]. The
//! controls are never counted and never logged: they are not API calls.
//!
//! An injected error is never sticky: it fails the calls it was meant for
//! and nothing after them.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use route_cloud::ErrorKind;
use route_core::{Destination, Route};

use crate::config::{ErrorRate, ErrorRates, Operation};
use crate::provider::MemoryCloud;
use crate::state::{Stored, table_key};

/// An injected failure for the next calls of one operation.
#[derive(Debug, Clone, Copy)]
struct Pending {
    remaining: u32,
    kind: ErrorKind,
}

/// The injected failures still to come.
#[derive(Debug)]
pub(crate) struct Faults {
    pending: [Option<Pending>; 4],
    rng: StdRng,
    /// Every call is answered `Throttled`, with this retry-after.
    storm: Option<Option<Duration>>,
}

impl Faults {
    /// No pending failures; random ones drawn from `seed` so a run replays.
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            pending: [None; 4],
            rng: StdRng::seed_from_u64(seed),
            storm: None,
        }
    }

    /// The injected failure for this call, if any: "fail next N" first, then the random rate.
    pub(crate) fn injected(&mut self, op: Operation, rates: &ErrorRates) -> Option<ErrorKind> {
        let slot = &mut self.pending[op.index()];
        if let Some(p) = slot {
            let kind = p.kind;
            p.remaining = p.remaining.saturating_sub(1);
            if p.remaining == 0 {
                *slot = None;
            }
            return Some(kind);
        }
        let rate = rates.get(op)?;
        (self.rng.random::<f64>() < rate.probability).then_some(rate.kind)
    }

    /// The storm in progress: `Some(retry_after)` while every call is throttled.
    pub(crate) fn storm(&self) -> Option<Option<Duration>> {
        self.storm
    }
}

impl MemoryCloud {
    /// Fails the next `n` calls of `op` with `kind` (after which calls behave
    /// normally again). A `Timeout` on a create, delete or batch still takes
    /// effect, like a real answer lost on the way back. Replaces any earlier
    /// pending failures of `op`; `n = 0` clears them.
    pub fn fail_next(&self, op: Operation, n: u32, kind: ErrorKind) {
        self.lock().faults.pending[op.index()] = (n > 0).then_some(Pending { remaining: n, kind });
    }

    /// Starts (`Some`, with the retry-after to answer) or ends (`None`) a
    /// throttling storm: while it lasts every call is answered `Throttled`,
    /// whatever the budget — a cloud whose API is overloaded by others.
    pub fn set_storm(&self, storm: Option<Option<Duration>>) {
        self.lock().faults.storm = storm;
    }

    /// Sets or clears the random failure rate of `op`. Probabilities outside
    /// `[0, 1]` are clamped (NaN counts as 0).
    pub fn set_error_rate(&self, op: Operation, rate: Option<ErrorRate>) {
        let rate = rate.map(|mut r| {
            r.probability = if r.probability.is_nan() {
                0.0
            } else {
                r.probability.clamp(0.0, 1.0)
            };
            r
        });
        self.lock().config.error_rates.set(op, rate);
    }

    /// Puts `route` in the table behind the controller's back, replacing any
    /// route for the same destination; returns the replaced one. An empty name
    /// becomes `<cluster>-external-<n>`.
    /// The route goes into the table its `target` names.
    pub fn insert_route(&self, cluster: &str, mut route: Route) -> Option<Route> {
        let mut s = self.lock();
        let key = table_key(cluster, &route.table);
        let table = s.tables.entry(key).or_default();
        if route.name.is_empty() {
            route.name = format!("{cluster}-external-{}", table.len()).into();
        }
        table
            .insert(
                route.destination.clone(),
                Stored {
                    route,
                    hidden_lists: 0,
                },
            )
            .map(|s| s.route)
    }

    /// Removes the route for `destination` behind the controller's back,
    /// from every route table of the cluster; returns one removed.
    pub fn remove_route(&self, cluster: &str, destination: &Destination) -> Option<Route> {
        let mut s = self.lock();
        let mut removed = None;
        for key in s.table_keys(cluster) {
            if let Some(gone) = s.tables.get_mut(&key).and_then(|t| t.remove(destination)) {
                removed.get_or_insert(gone.route);
            }
        }
        removed
    }

    /// Marks the route for `destination` as a blackhole (its target died) in
    /// every route table of the cluster; returns whether such a route exists.
    pub fn blackhole_route(&self, cluster: &str, destination: &Destination) -> bool {
        let mut s = self.lock();
        let mut found = false;
        for key in s.table_keys(cluster) {
            if let Some(stored) = s.tables.get_mut(&key).and_then(|t| t.get_mut(destination)) {
                stored.route.blackhole = true;
                found = true;
            }
        }
        found
    }
}
