//! Fencing: whether this process may change the cloud right now.
//!
//! A leader elected through a Lease may mutate only while
//! `now < last successful renew + renew deadline`. The other replicas take
//! over a whole lease duration after they last saw the record change, so as
//! long as the renew deadline is shorter than the lease duration, two leaders
//! never mutate at the same time — provided `now` keeps counting while this
//! process is stopped (SIGSTOP, a paused VM, a suspended host). A flag that
//! flips only after the next Lease round trip does not: a process resumed
//! after its Lease expired would act on the stale flag before its election
//! loop ran again. So the deadline is measured on a [`Clock`] that counts
//! suspended time, and it is checked immediately before every mutating
//! request — by the executor and again by the providers after each wait of
//! their own (token buckets, throttle pauses, retry pauses).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use crate::{CloudError, ErrorKind};

/// A clock for fencing deadlines: time since a fixed origin that keeps counting
/// while the process or the machine is stopped.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The time elapsed since this clock's origin.
    fn now(&self) -> Duration;
}

/// The production clock.
///
/// On Linux, `CLOCK_BOOTTIME`: monotonic, and unlike `CLOCK_MONOTONIC` it
/// includes time the machine spent suspended. Elsewhere, the larger of the
/// monotonic and the wall-clock time elapsed since the clock was made: the
/// wall clock keeps running through a suspend, the monotonic one through a
/// wall-clock step backwards, and a step forwards can only close the fence
/// early, never keep it open late.
#[derive(Debug)]
pub struct BootClock {
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    origin: (std::time::Instant, std::time::SystemTime),
}

impl BootClock {
    /// The clock, with its origin now.
    pub fn new() -> Self {
        Self {
            #[cfg(not(any(target_os = "linux", target_os = "android")))]
            origin: (std::time::Instant::now(), std::time::SystemTime::now()),
        }
    }
}

impl Default for BootClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for BootClock {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn now(&self) -> Duration {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        Duration::new(
            u64::try_from(t.tv_sec).unwrap_or(0),
            u32::try_from(t.tv_nsec).unwrap_or(0),
        )
    }

    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    fn now(&self) -> Duration {
        let mono = self.origin.0.elapsed();
        let wall = self.origin.1.elapsed().unwrap_or_default();
        mono.max(wall)
    }
}

/// Tokio's clock, so a paused test runtime drives fencing deadlines (and a
/// test can "suspend" the process by advancing it).
#[derive(Debug)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// The clock, with its origin now.
    pub fn new() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// No deadline: a replica that is leader for its whole life (no election).
const UNBOUNDED: u64 = u64::MAX;

/// How long [`Fence::closed`] sleeps at most before looking at the clock
/// again. Tokio's timers run on the monotonic clock, which stands still while
/// the machine is suspended; re-reading the fencing clock this often bounds
/// how long a wait can outlive a deadline that passed during a suspend.
const RECHECK: Duration = Duration::from_secs(1);

/// Whether this process may change the cloud now. Cheap to clone; clones
/// share state. See the module docs.
#[derive(Clone)]
pub struct Fence {
    inner: Arc<Inner>,
}

struct Inner {
    clock: Arc<dyn Clock>,
    leader: AtomicBool,
    stopping: AtomicBool,
    /// The clock reading (nanoseconds) from which mutations are refused.
    deadline: AtomicU64,
    /// Renewals that came back after the deadline had passed while this
    /// replica still held leadership: the fence closed and opened again.
    late_renewals: AtomicU64,
    changed: Notify,
}

impl fmt::Debug for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fence")
            .field("leader", &self.is_leader())
            .field("stopping", &self.inner.stopping.load(Ordering::SeqCst))
            .field("remaining", &self.remaining())
            .finish()
    }
}

impl Default for Fence {
    /// Open for the life of the process.
    fn default() -> Self {
        Self::new(true)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(UNBOUNDED - 1)
}

impl Fence {
    /// A fence without a deadline that starts open (`leader`) or closed: for
    /// a replica that does not take part in an election.
    pub fn new(leader: bool) -> Self {
        Self::build(Arc::new(BootClock::new()), leader, UNBOUNDED)
    }

    /// A fence for a Lease holder: closed until the first [`Fence::renewed`],
    /// then open only until each renewal's deadline.
    pub fn leased(clock: Arc<dyn Clock>) -> Self {
        Self::build(clock, false, 0)
    }

    fn build(clock: Arc<dyn Clock>, leader: bool, deadline: u64) -> Self {
        Self {
            inner: Arc::new(Inner {
                clock,
                leader: AtomicBool::new(leader),
                stopping: AtomicBool::new(false),
                deadline: AtomicU64::new(deadline),
                late_renewals: AtomicU64::new(0),
                changed: Notify::new(),
            }),
        }
    }

    /// The fencing clock now; take it *before* sending a renewal and hand it
    /// to [`Fence::renewed`], so the deadline counts from the earliest moment
    /// the other replicas can have seen the renewed record.
    pub fn mark(&self) -> Duration {
        self.inner.clock.now()
    }

    /// A renewal sent at `sent_at` (a [`Fence::mark`]) succeeded: mutations
    /// are allowed until `sent_at + renew_deadline`. Returns `true` when the
    /// renewal reopened a fence whose deadline had passed while this replica
    /// still held leadership (a late renewal: a slow API server, a paused
    /// process); the changes the fence cut off meanwhile must be redone.
    pub fn renewed(&self, sent_at: Duration, renew_deadline: Duration) -> bool {
        let until = nanos(sent_at.saturating_add(renew_deadline));
        let now = nanos(self.inner.clock.now());
        let d = &self.inner.deadline;
        // A fence without a deadline stays without one; a renewal never
        // shortens the deadline an earlier, later-sent renewal granted.
        let before = d.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |cur| {
            (cur != UNBOUNDED && cur < until).then_some(until)
        });
        // `0` is the deadline of a fence never renewed: the first renewal
        // opens it, that is no lapse.
        let late =
            matches!(before, Ok(cur) if cur != 0 && cur <= now && until > now) && self.is_leader();
        if late {
            self.inner.late_renewals.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.changed.notify_waiters();
        late
    }

    /// How many renewals reopened the fence after its deadline had passed
    /// while this replica held leadership (see [`Fence::renewed`]).
    pub fn late_renewals(&self) -> u64 {
        self.inner.late_renewals.load(Ordering::SeqCst)
    }

    /// Sets leadership.
    pub fn set_leader(&self, leader: bool) {
        self.inner.leader.store(leader, Ordering::SeqCst);
        self.inner.changed.notify_waiters();
    }

    /// This replica holds leadership (its deadline may still have passed).
    pub fn is_leader(&self) -> bool {
        self.inner.leader.load(Ordering::SeqCst)
    }

    /// Shutting down: no new mutation may start.
    pub fn stop(&self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
        self.inner.changed.notify_waiters();
    }

    /// Time left before the deadline; `None` without a deadline. Zero once
    /// it has passed.
    pub fn remaining(&self) -> Option<Duration> {
        let d = self.inner.deadline.load(Ordering::SeqCst);
        if d == UNBOUNDED {
            return None;
        }
        Some(Duration::from_nanos(d).saturating_sub(self.inner.clock.now()))
    }

    /// Mutations are allowed now.
    pub fn is_open(&self) -> bool {
        self.is_leader()
            && !self.inner.stopping.load(Ordering::SeqCst)
            && self.remaining().is_none_or(|r| !r.is_zero())
    }

    /// `Ok` when a mutation may be sent now; otherwise the error to return
    /// instead of sending it.
    pub fn check(&self) -> Result<(), CloudError> {
        if self.is_open() {
            Ok(())
        } else {
            Err(self.refusal())
        }
    }

    fn refusal(&self) -> CloudError {
        let why = if self.inner.stopping.load(Ordering::SeqCst) {
            "shutting down"
        } else if !self.is_leader() {
            "not the leader"
        } else {
            "the Lease was not renewed within the renew deadline"
        };
        CloudError::new(
            ErrorKind::Fenced,
            format!("not sent: this replica may not change the cloud now ({why})"),
        )
    }

    /// Resolves once the fence is closed.
    pub async fn closed(&self) {
        loop {
            let notified = self.inner.changed.notified();
            tokio::pin!(notified);
            // Registered before the check, so a change in between wakes us.
            notified.as_mut().enable();
            if !self.is_open() {
                return;
            }
            match self.remaining() {
                Some(r) => {
                    tokio::select! {
                        _ = tokio::time::sleep(r.min(RECHECK)) => {}
                        _ = &mut notified => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Resolves once the fence is open. Only a renewal, a leadership change
    /// or shutdown can open or close it for good, and each of them wakes this.
    pub async fn opened(&self) {
        loop {
            let notified = self.inner.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_open() {
                return;
            }
            notified.await;
        }
    }

    /// Runs `work` while the fence is open: refuses it outright if closed, and
    /// drops it (a request not yet sent is then never sent) if the fence
    /// closes before it finishes.
    pub async fn guard<F: Future>(&self, work: F) -> Result<F::Output, CloudError> {
        self.check()?;
        tokio::select! {
            biased;
            _ = self.closed() => Err(self.refusal()),
            out = work => Ok(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leased() -> Fence {
        let f = Fence::leased(Arc::new(TokioClock::new()));
        f.set_leader(true);
        f
    }

    #[tokio::test(start_paused = true)]
    async fn leased_fence_is_closed_until_the_first_renewal() {
        let f = leased();
        assert!(!f.is_open());
        assert_eq!(f.check().unwrap_err().kind, ErrorKind::Fenced);
        f.renewed(f.mark(), Duration::from_secs(10));
        assert!(f.is_open());
    }

    #[tokio::test(start_paused = true)]
    async fn closes_at_renew_deadline_counted_from_the_send() {
        let f = leased();
        let sent = f.mark();
        // The answer took 3 s; the deadline still counts from the send.
        tokio::time::advance(Duration::from_secs(3)).await;
        f.renewed(sent, Duration::from_secs(10));
        tokio::time::advance(Duration::from_millis(6_999)).await;
        assert!(f.is_open());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!f.is_open(), "open at exactly sent + renew deadline");
        assert!(f.check().unwrap_err().message.contains("renew deadline"));
    }

    #[tokio::test(start_paused = true)]
    async fn each_renewal_extends_and_none_shortens() {
        let f = leased();
        let early = f.mark();
        tokio::time::advance(Duration::from_secs(2)).await;
        f.renewed(f.mark(), Duration::from_secs(10));
        // A late answer to an earlier renewal does not pull the deadline in.
        f.renewed(early, Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(f.is_open());
        assert_eq!(f.remaining(), Some(Duration::from_secs(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn resumed_leader_past_renew_deadline_is_closed_before_its_election_loop_runs() {
        let f = leased();
        f.renewed(f.mark(), Duration::from_secs(10));
        // Stopped for 30 s: nothing ran, the leader flag is still set.
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(f.is_leader());
        assert!(!f.is_open());
    }

    #[tokio::test(start_paused = true)]
    async fn fence_without_a_deadline_ignores_renewals_and_stops_on_shutdown() {
        let f = Fence::new(true);
        assert_eq!(f.remaining(), None);
        f.renewed(Duration::ZERO, Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!(f.is_open());
        f.stop();
        assert!(f.check().unwrap_err().message.contains("shutting down"));
        assert!(!Fence::new(false).is_open());
    }

    #[tokio::test(start_paused = true)]
    async fn guard_drops_work_that_is_still_waiting_at_the_deadline() {
        let f = leased();
        f.renewed(f.mark(), Duration::from_secs(10));
        let start = tokio::time::Instant::now();
        let sent = AtomicBool::new(false);
        let r = f
            .guard(async {
                tokio::time::sleep(Duration::from_secs(25)).await;
                sent.store(true, Ordering::SeqCst);
            })
            .await;
        assert_eq!(r.unwrap_err().kind, ErrorKind::Fenced);
        assert!(!sent.load(Ordering::SeqCst));
        assert_eq!(start.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_after_the_deadline_reopens_the_fence_and_is_counted_as_late() {
        let f = leased();
        assert!(
            !f.renewed(f.mark(), Duration::from_secs(10)),
            "the first opens it"
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(!f.renewed(f.mark(), Duration::from_secs(10)), "in time");
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(!f.is_open());
        let g = f.clone();
        let waiter = tokio::spawn(async move { g.opened().await });
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(!waiter.is_finished(), "closed until the renewal");
        assert!(f.renewed(f.mark(), Duration::from_secs(10)), "late");
        tokio::time::timeout(Duration::from_millis(1), waiter)
            .await
            .expect("opened() resolves on the late renewal")
            .unwrap();
        assert_eq!(f.late_renewals(), 1);
        // Not a leader any more: a renewal answer after that is no lapse.
        tokio::time::advance(Duration::from_secs(11)).await;
        f.set_leader(false);
        assert!(!f.renewed(f.mark(), Duration::from_secs(10)));
        assert_eq!(f.late_renewals(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn closed_wakes_on_lost_leadership() {
        let f = leased();
        f.renewed(f.mark(), Duration::from_secs(3600));
        let g = f.clone();
        let t = tokio::spawn(async move { g.closed().await });
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(!t.is_finished());
        f.set_leader(false);
        tokio::time::timeout(Duration::from_millis(1), t)
            .await
            .expect("closed() resolves when leadership is lost")
            .unwrap();
    }
}
