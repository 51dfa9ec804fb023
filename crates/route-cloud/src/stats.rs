//! Request counters every provider keeps, read by the controller's `/metrics`.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

/// Counts of cloud API requests by operation and result, plus the time spent
/// waiting on rate limits. Cheap to update from many tasks.
#[derive(Debug, Default)]
pub struct RequestStats {
    counts: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    rate_limit_wait: Mutex<Duration>,
}

impl RequestStats {
    /// Records one request of `operation` (e.g. `list`, `create`, `delete`,
    /// `get_network`) that ended in `result` (`ok` or an `ErrorKind` label).
    pub fn record(&self, operation: &'static str, result: &'static str) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        *c.entry((operation, result)).or_default() += 1;
    }

    /// Adds time spent waiting for the client-side budget or a server's retry-after.
    pub fn add_rate_limit_wait(&self, d: Duration) {
        *self
            .rate_limit_wait
            .lock()
            .unwrap_or_else(|e| e.into_inner()) += d;
    }

    /// A copy of the counters.
    pub fn snapshot(&self) -> BTreeMap<(&'static str, &'static str), u64> {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Total rate-limit wait so far.
    pub fn rate_limit_wait(&self) -> Duration {
        *self
            .rate_limit_wait
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Total requests of one operation, any result.
    pub fn total(&self, operation: &str) -> u64 {
        self.snapshot()
            .iter()
            .filter(|((op, _), _)| *op == operation)
            .map(|(_, n)| n)
            .sum()
    }
}
