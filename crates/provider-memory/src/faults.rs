//! Fault injection: what makes the simulated cloud misbehave on purpose.
//!
//! Owns [`Faults`]: the "fail the next N calls" slots, the seeded random
//! failures' generator and the throttling storm. `state` keeps it under the
//! cloud's lock; `provider` asks it about every call and exposes the
//! controls a test or the simulator turns (`MemoryCloud::fail_next`,
//! `MemoryCloud::set_storm`, `MemoryCloud::set_error_rate`). Below `state`
//! and `provider`, so it knows nothing of tables or handles.
//!
//! An injected error is never sticky: it fails the calls it was meant for
//! and nothing after them.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use route_cloud::ErrorKind;

use crate::config::{ErrorRates, Operation};

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

    /// Fails the next `n` calls of `op` with `kind`, replacing any earlier
    /// pending failures of `op`; `n = 0` clears them.
    pub(crate) fn fail_next(&mut self, op: Operation, n: u32, kind: ErrorKind) {
        self.pending[op.index()] = (n > 0).then_some(Pending { remaining: n, kind });
    }

    /// Starts (`Some`, with the retry-after to answer) or ends (`None`) a storm.
    pub(crate) fn set_storm(&mut self, storm: Option<Option<Duration>>) {
        self.storm = storm;
    }

    /// The storm in progress: `Some(retry_after)` while every call is throttled.
    pub(crate) fn storm(&self) -> Option<Option<Duration>> {
        self.storm
    }
}
