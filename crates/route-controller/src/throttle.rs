//! Pacing cloud calls after throttling, and recovering from it.
//!
//! A throttled answer closes the gate until its retry-after. When the pause
//! ends, exactly one call — the probe — goes out; everything else waits for
//! its answer. A throttled probe closes the gate again, for its retry-after or
//! twice the last pause if that is longer (at most [`MAX_PROBE_BACKOFF`]), so
//! while the cloud refuses everything the controller sends one request per
//! pause, however many operations are queued. A probe that goes through
//! reopens the gate at a paced rate that grows with the successes that follow,
//! and pacing ends once the rate passes [`UNPACED_RATE`].
//!
//! How fast it grows depends on what the refusals said:
//!
//! - A budget: the cloud refused a burst, and a call after the retry-after
//!   went through soon. The rate starts at what the retry-after implies (one
//!   call per retry-after) and doubles only after every [`PACE_GROW_AFTER`]
//!   successes in a row, or once no refusal came for [`PACE_GROW_QUIET`] and
//!   [`PACE_GROW_QUIET_CALLS`] paced intervals, if that comes first (at a
//!   slow pace ten successes take many minutes, and a limit that was lifted
//!   must not be crept up on for that long; a steady slow budget costs a
//!   refused call every few of its intervals); a
//!   refusal of paced traffic halves it (or drops it to
//!   what that retry-after implies, if lower). A steady limit, or a budget
//!   whose refill busier clients take first, is approached from below instead
//!   of being hit again and again.
//! - A storm: [`STORM_PROBES`] probes in a row were refused, each with about
//!   as long a retry-after as the answer before (at least half of it), so the
//!   cloud kept refusing single calls made after waiting as told — its
//!   refusals were not about this controller's rate. (A probe refused with a
//!   much shorter retry-after found a budget about to refill.) Once a probe
//!   goes through, the rate doubles (at least +1 call/s) with every success,
//!   and the queue drains within seconds of the cloud answering again.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Successes in a row at a rate known to be near the cloud's limit before
/// the rate doubles.
pub const PACE_GROW_AFTER: u32 = 10;

/// Paced at a rate near the cloud's limit, the rate also doubles after this
/// long without a refusal…
pub const PACE_GROW_QUIET: Duration = Duration::from_secs(8);

/// …when that is also at least this many intervals of the current pace.
pub const PACE_GROW_QUIET_CALLS: u32 = 3;

/// Above this many calls per second pacing ends.
pub const UNPACED_RATE: f64 = 50.0;

/// The shortest pause after a throttled answer.
const MIN_PAUSE: Duration = Duration::from_millis(100);

/// Probes refused in a row (each with about as long a retry-after as the
/// answer before it) that make a throttling episode a storm.
pub const STORM_PROBES: u32 = 3;

/// Refused probes double the pause up to this (a longer retry-after still
/// wins): a budget shared with busier clients, whose refill others take first,
/// is not probed every retry-after all day, and a storm that ends is noticed
/// within this long.
pub const MAX_PROBE_BACKOFF: Duration = Duration::from_secs(8);

/// The slowest pace, whatever the retry-after: one call an hour.
const MIN_RATE: f64 = 1.0 / 3600.0;

/// The gate. Shared by all calls of one executor.
#[derive(Debug, Default)]
pub struct Throttle {
    state: Mutex<GateState>,
    changed: Notify,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Probe {
    /// No probe needed.
    #[default]
    None,
    /// The next call after the pause is the probe.
    Due,
    /// The probe is out; the others wait for its answer.
    InFlight,
}

#[derive(Debug)]
struct GateState {
    until: Option<Instant>,
    probe: Probe,
    /// Allowed calls per second; `None` is unpaced.
    rate: Option<f64>,
    /// Up to this rate every success doubles the rate; from it on, only
    /// every [`PACE_GROW_AFTER`] successes do.
    threshold: f64,
    successes: u32,
    /// The retry-after of the last throttled answer.
    pause: Duration,
    /// The pause the gate took after it.
    waited: Duration,
    /// Probes refused in a row, each with about as long a retry-after as before.
    refused_probes: u32,
    next_slot: Option<Instant>,
    /// When the last paced call went out.
    last_paced: Option<Instant>,
    last_throttle: Option<Instant>,
    /// When the rate last doubled on the careful path.
    last_grow: Option<Instant>,
}

impl Default for GateState {
    fn default() -> Self {
        Self {
            until: None,
            probe: Probe::None,
            rate: None,
            threshold: f64::INFINITY,
            successes: 0,
            pause: Duration::ZERO,
            waited: Duration::ZERO,
            refused_probes: 0,
            next_slot: None,
            last_paced: None,
            last_throttle: None,
            last_grow: None,
        }
    }
}

/// Permission for one call, from [`Throttle::pass`]. Report its answer
/// with [`Ticket::succeeded`], [`Ticket::throttled`] or [`Ticket::answered`];
/// a ticket dropped unreported (the call was abandoned) hands the probe on to
/// the next caller.
#[must_use = "report the call's answer"]
#[derive(Debug)]
pub struct Ticket<'a> {
    gate: &'a Throttle,
    probe: bool,
    started: Instant,
    /// Time spent held back by throttling (zero when the gate was open).
    pub held: Duration,
    reported: bool,
}

enum Wait {
    Until(Instant),
    ProbeAnswer,
}

impl Throttle {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until a call may start.
    pub async fn pass(&self) -> Ticket<'_> {
        let start = Instant::now();
        let mut held = false;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let wait = {
                let mut s = self.lock();
                let now = Instant::now();
                match s.until {
                    Some(t) if now < t => Wait::Until(t),
                    _ => match (s.probe, s.rate) {
                        (Probe::InFlight, _) => Wait::ProbeAnswer,
                        (Probe::Due, rate) => {
                            s.probe = Probe::InFlight;
                            // The probe is a paced call too: the next one
                            // keeps its distance from it.
                            if let Some(rate) = rate {
                                s.next_slot = Some(now + Duration::from_secs_f64(1.0 / rate));
                                s.last_paced = Some(now);
                            }
                            return self.ticket(true, start, held);
                        }
                        (Probe::None, Some(rate)) => {
                            let slot = s.next_slot.unwrap_or(now).max(now);
                            if slot > now {
                                Wait::Until(slot)
                            } else {
                                s.next_slot = Some(now + Duration::from_secs_f64(1.0 / rate));
                                s.last_paced = Some(now);
                                return self.ticket(false, start, held);
                            }
                        }
                        (Probe::None, None) => return self.ticket(false, start, held),
                    },
                }
            };
            held = true;
            match wait {
                Wait::Until(t) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(t) => {}
                        _ = &mut notified => {}
                    }
                }
                Wait::ProbeAnswer => notified.await,
            }
        }
    }

    fn ticket(&self, probe: bool, start: Instant, held: bool) -> Ticket<'_> {
        Ticket {
            gate: self,
            probe,
            started: Instant::now(),
            held: if held {
                start.elapsed()
            } else {
                Duration::ZERO
            },
            reported: false,
        }
    }

    /// The allowed rate in calls per second; `None` when unpaced.
    pub fn rate(&self) -> Option<f64> {
        self.lock().rate
    }

    fn report(&self, probe: bool, f: impl FnOnce(&mut GateState)) {
        {
            let mut s = self.lock();
            if probe && s.probe == Probe::InFlight {
                s.probe = Probe::None;
            }
            f(&mut s);
        }
        self.changed.notify_waiters();
    }
}

impl Ticket<'_> {
    /// The call went through.
    pub fn succeeded(mut self) {
        self.reported = true;
        self.gate.report(self.probe, |s| {
            s.refused_probes = 0;
            if let Some(r) = s.rate {
                let next = if r < s.threshold {
                    (r * 2.0).max(r + 1.0).min(s.threshold)
                } else {
                    s.successes += 1;
                    let now = Instant::now();
                    let calm_since = match (s.last_throttle, s.last_grow) {
                        (Some(a), Some(b)) => Some(a.max(b)),
                        (a, b) => a.or(b),
                    };
                    let needed = PACE_GROW_QUIET.max(Duration::from_secs_f64(
                        f64::from(PACE_GROW_QUIET_CALLS) / r,
                    ));
                    let quiet = calm_since.is_some_and(|t| now - t >= needed);
                    if s.successes >= PACE_GROW_AFTER || quiet {
                        s.successes = 0;
                        s.last_grow = Some(now);
                        r * 2.0
                    } else {
                        r
                    }
                };
                s.rate = (next < UNPACED_RATE).then_some(next);
                // The slot already handed out was spaced for the old rate;
                // without this, every answer's increase would lag one call.
                if let (Some(rate), Some(last), Some(slot)) = (s.rate, s.last_paced, s.next_slot) {
                    s.next_slot = Some(slot.min(last + Duration::from_secs_f64(1.0 / rate)));
                }
            }
        });
    }

    /// The call was throttled: close for `retry_after`, then probe.
    pub fn throttled(mut self, retry_after: Duration) {
        self.reported = true;
        // A zero retry-after would let the probes spin.
        let retry_after = retry_after.max(MIN_PAUSE);
        let (probe, started) = (self.probe, self.started);
        self.gate.report(probe, |s| {
            let now = Instant::now();
            // Calls that were in flight together are one throttling event:
            // only a call started after the last throttled answer lowers
            // the rate.
            let fresh = s.last_throttle.is_none_or(|t| started > t);
            s.last_throttle = Some(now);
            let wait = if probe {
                retry_after.max((s.waited * 2).min(MAX_PROBE_BACKOFF))
            } else {
                retry_after
            };
            s.waited = wait;
            let t = now + wait;
            if s.until.is_none_or(|u| u < t) {
                s.until = Some(t);
            }
            if s.probe != Probe::InFlight {
                s.probe = Probe::Due;
            }
            let told = (1.0 / retry_after.as_secs_f64().max(0.001)).clamp(MIN_RATE, UNPACED_RATE);
            s.successes = 0;
            if probe && retry_after * 2 >= s.pause {
                s.refused_probes += 1;
                if s.refused_probes >= STORM_PROBES {
                    s.threshold = f64::INFINITY;
                }
            } else {
                s.refused_probes = 0;
            }
            s.pause = retry_after;
            s.rate = Some(match s.rate {
                // Calls sent before the last throttle, and a probe (one call
                // after waiting as told), say nothing new about the rate.
                Some(r) if !fresh || probe => r,
                // Paced traffic was too fast: halve, or go down to what the
                // retry-after implies if that is slower (a budget refilled
                // once a minute says so at once), and grow carefully from now on.
                Some(r) => {
                    let lower = (r / 2.0).min(told);
                    s.threshold = lower;
                    lower
                }
                // Unpaced traffic was throttled: start from the rate the
                // retry-after implies, and grow carefully unless refused
                // probes show a storm.
                None => {
                    s.threshold = told;
                    told
                }
            });
            s.next_slot = Some(t);
        });
    }

    /// The cloud answered with something other than throttling.
    pub fn answered(mut self) {
        self.reported = true;
        self.gate.report(self.probe, |_| {});
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.reported || !self.probe {
            return;
        }
        {
            let mut s = self.gate.lock();
            if s.probe == Probe::InFlight {
                s.probe = Probe::Due;
            }
        }
        self.gate.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn open_gate_does_not_wait() {
        let g = Throttle::default();
        let t = g.pass().await;
        assert_eq!(t.held, Duration::ZERO);
        t.succeeded();
        assert_eq!(g.rate(), None);
    }

    /// Throttles unpaced traffic with `retry_after`, then refuses the probe
    /// with the same: a storm that is still going on.
    async fn storm(g: &Throttle, retry_after: Duration) {
        g.pass().await.throttled(retry_after);
        for _ in 0..STORM_PROBES {
            let t = g.pass().await;
            assert!(t.probe);
            t.throttled(retry_after);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn after_the_pause_one_probe_goes_out_and_the_rest_wait_for_its_answer() {
        let g = Arc::new(Throttle::default());
        g.pass().await.throttled(Duration::from_secs(5));
        let passed = Arc::new(AtomicU32::new(0));
        let waiters: Vec<_> = (0..10)
            .map(|_| {
                let (g, passed) = (g.clone(), passed.clone());
                tokio::spawn(async move {
                    let t = g.pass().await;
                    passed.fetch_add(1, Ordering::SeqCst);
                    // Every answer takes 100 ms.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    t.succeeded();
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(5_050)).await;
        assert_eq!(passed.load(Ordering::SeqCst), 1, "only the probe");
        for w in waiters {
            w.await.unwrap();
        }
        assert_eq!(passed.load(Ordering::SeqCst), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn refused_probes_back_off_to_eight_seconds_so_a_storm_costs_few_calls() {
        let g = Throttle::default();
        g.pass().await.throttled(Duration::from_secs(2));
        let t0 = Instant::now();
        let mut probes = Vec::new();
        while t0.elapsed() < Duration::from_secs(30) {
            g.pass().await.throttled(Duration::from_secs(2));
            probes.push(t0.elapsed().as_secs());
        }
        assert_eq!(probes, [2, 6, 14, 22, 30], "pauses of 2, 4, 8, 8, 8 s");
    }

    #[tokio::test(start_paused = true)]
    async fn a_longer_retry_after_than_the_backoff_wins() {
        let g = Throttle::default();
        g.pass().await.throttled(Duration::from_secs(1));
        let t0 = Instant::now();
        g.pass().await.throttled(Duration::from_secs(20));
        g.pass().await.succeeded();
        assert_eq!(t0.elapsed(), Duration::from_secs(21));
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_storm_the_first_successful_probe_ramps_up_to_unpaced_within_seconds() {
        let g = Throttle::default();
        storm(&g, Duration::from_secs(10)).await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        let t0 = Instant::now();
        let mut n = 0;
        while g.rate().is_some() {
            g.pass().await.succeeded();
            n += 1;
        }
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert!(n <= 10, "{n} calls to recover");
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_refused_burst_the_rate_starts_at_the_retry_after_and_doubles_per_ten() {
        let g = Throttle::default();
        g.pass().await.throttled(Duration::from_millis(200));
        tokio::time::sleep(Duration::from_millis(200)).await;
        for _ in 1..PACE_GROW_AFTER {
            g.pass().await.succeeded(); // the probe, then at 5/s
            assert_eq!(g.rate(), Some(5.0));
        }
        g.pass().await.succeeded();
        assert_eq!(g.rate(), Some(10.0));
    }

    #[tokio::test(start_paused = true)]
    async fn paced_calls_are_spaced_by_the_rate() {
        let g = Throttle::default();
        g.pass().await.throttled(Duration::from_millis(500));
        tokio::time::sleep(Duration::from_millis(500)).await;
        g.pass().await.succeeded(); // the probe
        assert_eq!(g.rate(), Some(2.0));
        let mut starts = Vec::new();
        for _ in 0..4 {
            let t = g.pass().await;
            starts.push(Instant::now());
            t.succeeded();
        }
        for pair in starts.windows(2) {
            assert_eq!(pair[1] - pair[0], Duration::from_millis(500), "{starts:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_pace_grows_after_a_quiet_period_before_ten_successes() {
        let g = Throttle::default();
        let t0 = Instant::now();
        g.pass().await.throttled(Duration::from_secs(2));
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut successes = 0;
        while g.rate() == Some(0.5) || successes == 0 {
            g.pass().await.succeeded();
            successes += 1;
            assert!(successes < PACE_GROW_AFTER, "grew only by count");
        }
        assert_eq!(g.rate(), Some(1.0));
        let grew_at = t0.elapsed();
        assert!(
            grew_at >= PACE_GROW_QUIET && grew_at < PACE_GROW_QUIET + Duration::from_secs(2),
            "{grew_at:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn throttled_paced_traffic_halves_the_rate_and_then_grows_carefully() {
        let g = Throttle::default();
        storm(&g, Duration::from_millis(250)).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
        g.pass().await.succeeded(); // the probe: 4/s -> 8/s
        g.pass().await.succeeded(); // 8/s -> 16/s
        assert_eq!(g.rate(), Some(16.0));
        tokio::time::sleep(Duration::from_secs(1)).await;
        g.pass().await.throttled(Duration::from_millis(100));
        assert_eq!(g.rate(), Some(8.0), "halved: the retry-after allows 10/s");
        tokio::time::sleep(Duration::from_millis(100)).await;
        for _ in 1..PACE_GROW_AFTER {
            g.pass().await.succeeded(); // the probe, then at the threshold
            assert_eq!(g.rate(), Some(8.0));
        }
        g.pass().await.succeeded();
        assert_eq!(g.rate(), Some(16.0));
    }

    #[tokio::test(start_paused = true)]
    async fn throttled_paced_traffic_drops_to_the_rate_a_long_retry_after_implies() {
        let g = Throttle::default();
        g.pass().await.throttled(Duration::from_millis(250));
        tokio::time::sleep(Duration::from_millis(250)).await;
        g.pass().await.succeeded(); // the probe, at 4/s
        g.pass().await.throttled(Duration::from_secs(50));
        assert_eq!(g.rate(), Some(1.0 / 50.0));
    }

    #[tokio::test(start_paused = true)]
    async fn probe_refused_with_a_much_shorter_retry_after_is_no_storm() {
        let g = Throttle::default();
        g.pass().await.throttled(Duration::from_secs(1));
        g.pass().await.throttled(Duration::from_millis(1));
        tokio::time::sleep(Duration::from_millis(100)).await;
        g.pass().await.succeeded();
        assert_eq!(g.rate(), Some(1.0), "still growing carefully");
    }

    #[tokio::test(start_paused = true)]
    async fn abandoned_probe_hands_the_probe_to_the_next_caller() {
        let g = Throttle::default();
        g.pass().await.throttled(Duration::from_secs(1));
        let probe = g.pass().await;
        drop(probe);
        let next = tokio::time::timeout(Duration::from_millis(1), g.pass())
            .await
            .expect("not stuck behind an abandoned probe");
        next.succeeded();
    }
}
