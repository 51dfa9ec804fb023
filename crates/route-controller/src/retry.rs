//! Per-operation retry bookkeeping.
//!
//! Owned by the reconcile loop. Every failed creation or deletion gets its own
//! exponential backoff (1 s doubling to 5 min by default, with jitter), and the
//! loop wakes itself when the earliest one is due — so a failed route is
//! retried without waiting for another Node event or the next resync, which is
//! what upstream's watch mode does. How each class of answer bends that rule
//! (a throttled operation due again at once, a refusal for room or for a
//! stopped instance waiting longer) is [`crate::policy`]'s [`Retry`] column;
//! this book only carries it out.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use route_cloud::ErrorKind;
use tokio::time::Instant;

use crate::policy::{self, Retry};
pub use crate::policy::{BLACKHOLE_REPAIR_FLOOR, QUOTA_RETRY_FLOOR};

/// Operations are known by their plan key, across passes.
pub use route_core::OpKey;

/// Backoff settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackoffConfig {
    /// Delay after the first failure.
    pub initial: Duration,
    /// Upper bound.
    pub max: Duration,
    /// Relative jitter added on top (0.2 = up to +20 %).
    pub jitter: f64,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(300),
            jitter: 0.2,
        }
    }
}

impl BackoffConfig {
    /// The delay after `failures` consecutive failures, before jitter.
    pub fn delay(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(30);
        self.initial.saturating_mul(1u32 << exp).min(self.max)
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    failures: u32,
    next_at: Instant,
    /// The last answer's class, when its retry rule waits for a cause to
    /// end (room, a running instance) rather than for time alone.
    refusal: Option<ErrorKind>,
    /// Made due by [`RetryBook::release_quota_waiters`] and not woken for yet.
    released: bool,
    /// The latest plan wants this operation; the loop wakes only for those.
    wanted: bool,
}

/// The retry book. See the module docs.
#[derive(Debug, Default)]
pub struct RetryBook {
    cfg: BackoffConfig,
    entries: HashMap<OpKey, Entry>,
}

impl RetryBook {
    /// An empty book.
    pub fn new(cfg: BackoffConfig) -> Self {
        Self {
            cfg,
            entries: HashMap::new(),
        }
    }

    /// May this operation be attempted at `now`?
    pub fn is_due(&self, key: &OpKey, now: Instant) -> bool {
        self.due_at(key, now).is_none()
    }

    /// When this operation's backoff ends, if it has not ended at `now`.
    pub fn due_at(&self, key: &OpKey, now: Instant) -> Option<Instant> {
        self.entries
            .get(key)
            .map(|e| e.next_at)
            .filter(|&at| now < at)
    }

    /// Records a failure; returns when the operation may be retried.
    /// `unit` is a random number in `[0, 1)` for the jitter. The tests'
    /// shorthand for [`RetryBook::answered`].
    #[cfg(test)]
    pub fn failed(
        &mut self,
        key: OpKey,
        err: &route_cloud::CloudError,
        now: Instant,
        unit: f64,
    ) -> Instant {
        self.answered(key, err.kind, err.retry_after, now, unit)
    }

    /// Records an answer of class `kind` (the cloud's, or the one a gate
    /// verdict gives in its place, [`policy::refusal`]) that asked for a
    /// wait of `retry_after`; returns when the operation may be retried.
    /// The wait follows `kind`'s [`Retry`] rule.
    pub fn answered(
        &mut self,
        key: OpKey,
        kind: ErrorKind,
        retry_after: Option<Duration>,
        now: Instant,
        unit: f64,
    ) -> Instant {
        let rule = policy::of(kind).retry;
        let e = self.entries.entry(key).or_insert(Entry {
            failures: 0,
            next_at: now,
            refusal: None,
            released: false,
            wanted: true,
        });
        e.refusal = matches!(rule, Retry::UntilRoom | Retry::UntilInstanceRuns).then_some(kind);
        e.wanted = true;
        e.released = false;
        if rule == Retry::Paced {
            // Retried when the throttle reopens, not at a backoff that grew
            // with every probe of a throttling storm; the throttle paces it,
            // and the loop wakes for it once.
            e.next_at = now;
            e.released = true;
            return now;
        }
        e.failures = e.failures.saturating_add(1);
        let base = self.cfg.delay(e.failures);
        let jittered = base
            .mul_f64(1.0 + self.cfg.jitter * unit.clamp(0.0, 1.0))
            .min(self.cfg.max.mul_f64(1.0 + self.cfg.jitter));
        let wait = jittered.max(retry_after.unwrap_or_default());
        let floor = match rule {
            Retry::Backoff | Retry::Paced => Duration::ZERO,
            Retry::Rarely => self.cfg.max,
            Retry::UntilInstanceRuns => BLACKHOLE_REPAIR_FLOOR
                .saturating_mul(1u32 << e.failures.saturating_sub(1).min(16))
                .min(self.cfg.max.max(BLACKHOLE_REPAIR_FLOOR)),
            Retry::UntilRoom => QUOTA_RETRY_FLOOR,
        };
        e.next_at = now + wait.max(floor);
        e.next_at
    }

    /// The refusal an operation waits out, when the cloud's last answer
    /// (or a verdict in its place) was one whose retry waits for a cause to
    /// end: no room, or a target not running.
    pub fn refusal(&self, key: &OpKey) -> Option<ErrorKind> {
        self.entries.get(key)?.refusal
    }

    /// Consecutive failures of an operation so far.
    pub fn failures(&self, key: &OpKey) -> u32 {
        self.entries.get(key).map_or(0, |e| e.failures)
    }

    /// Forgets an operation that succeeded.
    pub fn succeeded(&mut self, key: &OpKey) {
        self.entries.remove(key);
    }

    /// A route was deleted: creations that waited for room may try at `now`.
    pub fn release_quota_waiters(&mut self, now: Instant) {
        for e in self.entries.values_mut().filter(|e| {
            e.refusal
                .is_some_and(|k| policy::of(k).retry == Retry::UntilRoom)
        }) {
            e.next_at = e.next_at.min(now);
            e.released = true;
        }
    }

    /// Forgets operations the latest plan no longer wants, except a
    /// creation refused for its instance's state while its backoff runs: a
    /// Node whose route is wanted, then not (a pod CIDR conflict for a
    /// moment), then again must not resend it to the stopped instance early.
    pub fn retain(&mut self, wanted: &HashSet<OpKey>, now: Instant) {
        self.entries.retain(|k, e| {
            e.wanted = wanted.contains(k);
            let kept_unwanted = e
                .refusal
                .is_some_and(|k| policy::of(k).retry == Retry::UntilInstanceRuns);
            e.wanted || (kept_unwanted && e.next_at > now)
        });
    }

    /// When the earliest pending retry is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.entries
            .values()
            .filter(|e| e.wanted)
            .map(|e| e.next_at)
            .min()
    }

    /// When the loop must wake next for a retry, as seen at the end of a
    /// pass that started at `started`. An operation that was already due when
    /// the pass started and is still waiting was not attempted because it
    /// waits for something else (a creation blocked by a deletion still
    /// backing off): waking for it at once would spin. Operations that came
    /// due while the pass ran, later retries, and operations just released
    /// for room (once) all count.
    pub fn next_wake(&mut self, started: Instant) -> Option<Instant> {
        let mut wake: Option<Instant> = None;
        for e in self.entries.values_mut().filter(|e| e.wanted) {
            let at = if std::mem::take(&mut e.released) {
                e.next_at.min(started)
            } else if e.next_at > started {
                e.next_at
            } else {
                continue;
            };
            wake = Some(wake.map_or(at, |w| w.min(at)));
        }
        wake
    }

    /// Operations waiting for a retry.
    pub fn len(&self) -> usize {
        self.entries.values().filter(|e| e.wanted).count()
    }

    /// No operation is waiting.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use route_cloud::CloudError;

    fn key() -> OpKey {
        OpKey::Create {
            node_uid: "u".into(),
            destination: route_core::Destination::parse("10.0.0.0/24"),
            table: Default::default(),
        }
    }

    #[test]
    fn doubles_from_one_second_to_five_minutes() {
        let c = BackoffConfig::default();
        let ds: Vec<u64> = (1..=12).map(|n| c.delay(n).as_secs()).collect();
        assert_eq!(ds, vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
    }

    #[tokio::test(start_paused = true)]
    async fn failure_defers_until_due_and_success_forgets() {
        let mut b = RetryBook::new(BackoffConfig {
            jitter: 0.0,
            ..Default::default()
        });
        let now = Instant::now();
        let err = CloudError::new(ErrorKind::Transient, "boom");
        let at = b.failed(key(), &err, now, 0.5);
        assert_eq!(at, now + Duration::from_secs(1));
        assert!(!b.is_due(&key(), now));
        assert!(b.is_due(&key(), at));
        let at2 = b.failed(key(), &err, at, 0.5);
        assert_eq!(at2, at + Duration::from_secs(2));
        assert_eq!(b.next_due(), Some(at2));
        b.succeeded(&key());
        assert!(b.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn creation_blocked_by_a_backing_off_deletion_does_not_spin() {
        // Regression: a due creation waiting for a deletion still in its
        // backoff made next_due() lie in the past, so every pass asked for
        // the next at once.
        let mut b = RetryBook::new(BackoffConfig {
            jitter: 0.0,
            ..Default::default()
        });
        let t0 = Instant::now();
        let err = CloudError::new(ErrorKind::Transient, "boom");
        b.failed(key(), &err, t0, 0.0);
        let deletion = OpKey::Delete {
            route: route_core::Route::from_text("gone", "10.0.0.0/24").named("stray"),
            copy: 0,
        };
        b.failed(deletion.clone(), &err, t0, 0.0);
        let t1 = t0 + Duration::from_secs(1);
        let d_at = b.failed(deletion, &err, t1, 0.0);
        assert_eq!(b.next_due(), Some(t1), "the creation is due");
        assert_eq!(b.next_wake(t1), Some(d_at), "wake for the deletion");
    }

    #[tokio::test(start_paused = true)]
    async fn retry_that_came_due_while_a_pass_ran_still_wakes_the_loop() {
        // Regression: with cloud latency, a retry due in the middle of a
        // pass (not attempted: it was not due when the pass planned) was
        // treated like a blocked one and never woken for.
        let mut b = RetryBook::new(BackoffConfig {
            jitter: 0.0,
            ..Default::default()
        });
        let t0 = Instant::now();
        let err = CloudError::new(ErrorKind::Transient, "boom");
        let due = b.failed(key(), &err, t0, 0.0);
        let pass_started = due - Duration::from_millis(300);
        assert_eq!(b.next_wake(pass_started), Some(due));
    }

    #[tokio::test(start_paused = true)]
    async fn throttled_operation_is_due_at_once_and_keeps_its_backoff() {
        let mut b = RetryBook::new(BackoffConfig {
            jitter: 0.0,
            ..Default::default()
        });
        let now = Instant::now();
        let transient = CloudError::new(ErrorKind::Transient, "boom");
        b.failed(key(), &transient, now, 0.0);
        b.failed(key(), &transient, now, 0.0);
        let throttled = CloudError::throttled("slow down", Some(Duration::from_secs(42)));
        for _ in 0..20 {
            assert_eq!(b.failed(key(), &throttled, now, 0.0), now);
        }
        assert!(b.is_due(&key(), now));
        assert_eq!(b.next_wake(now), Some(now), "the loop wakes for it once");
        assert_eq!(b.next_wake(now), None, "and does not spin on it");
        assert_eq!(
            b.failures(&key()),
            2,
            "throttling is not the route's failure"
        );
        let at = b.failed(key(), &transient, now, 0.0);
        assert_eq!(at, now + Duration::from_secs(4));
    }

    #[tokio::test(start_paused = true)]
    async fn a_route_to_a_stopped_instance_is_retried_like_a_blackhole_repair() {
        let mut b = RetryBook::new(BackoffConfig {
            jitter: 0.0,
            ..Default::default()
        });
        let t0 = Instant::now();
        let refused = CloudError::new(ErrorKind::TargetUnavailable, "IncorrectInstanceState");
        let waits: Vec<u64> = (0..4)
            .map(|_| (b.failed(key(), &refused, t0, 0.0) - t0).as_secs())
            .collect();
        assert_eq!(waits, [60, 120, 240, 300]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_for_a_stopped_instance_outlives_a_moment_the_route_is_not_wanted() {
        // Regression (checker seed 8630): the Node's pod CIDR was in a
        // conflict for 10 s, the book forgot the refusal, and the creation
        // went to the stopped instance again 30 s after the first.
        let mut b = RetryBook::new(BackoffConfig {
            jitter: 0.0,
            ..Default::default()
        });
        let t0 = Instant::now();
        let refused = CloudError::new(ErrorKind::TargetUnavailable, "IncorrectInstanceState");
        let due = b.failed(key(), &refused, t0, 0.0);
        let later = t0 + Duration::from_secs(30);
        b.retain(&HashSet::new(), later);
        assert_eq!(b.len(), 0, "not counted while not wanted");
        assert_eq!(b.next_wake(later), None, "nor woken for");
        b.retain(&HashSet::from([key()]), later);
        assert!(!b.is_due(&key(), later), "still backing off");
        assert!(b.is_due(&key(), due));
        // A plain failure is forgotten with the want.
        let transient = CloudError::new(ErrorKind::Transient, "boom");
        let other = OpKey::Create {
            node_uid: "v".into(),
            destination: route_core::Destination::parse("10.0.1.0/24"),
            table: Default::default(),
        };
        b.failed(other.clone(), &transient, t0, 0.0);
        b.retain(&HashSet::from([key()]), t0);
        assert!(b.is_due(&other, t0));
    }

    #[tokio::test(start_paused = true)]
    async fn jitter_stays_within_bounds() {
        let mut b = RetryBook::new(BackoffConfig::default());
        let now = Instant::now();
        let err = CloudError::new(ErrorKind::Transient, "x");
        for _ in 0..20 {
            b.failed(key(), &err, now, 0.999);
        }
        let at = b.next_due().unwrap();
        assert!(at - now <= Duration::from_secs(360), "{:?}", at - now);
    }
}
