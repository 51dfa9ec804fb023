//! When to reconcile: the three modes as one small state machine.
//!
//! The [`Scheduler`] is owned by the reconcile loop and never does I/O. It is
//! told about triggers, retries, uncertain cloud answers and leadership, and
//! answers one question: run a pass now (full or against the cached route
//! table), or sleep until when. The mode only changes the answer:
//!
//! * `periodic` — a full pass every `period`, measured from the start of the
//!   previous one; node events are ignored (upstream with the gate off).
//! * `watch` — a full pass when something is pending, at least
//!   `min_interval` after the previous pass started; a trigger after a quiet
//!   period runs at once, with no token debt (upstream KEP-5237, minus the debt).
//! * `incremental` — a pass against the cached route table as soon as
//!   something is pending; a full pass (list first) at start, after gaining
//!   leadership, after an answer that makes the cache uncertain (spaced by
//!   `min_interval`) and on the resync timer.
//!
//! In `watch` and `incremental` a full pass also runs every `resync`, a
//! random interval in `[min_resync, 2 × min_resync)` chosen once at start.
//!
//! In every mode a full pass also runs when no pass has listed the cloud
//! for `drift` (the drift check, `--route-drift-check-period`): it is what
//! finds what changed in the cloud behind the controller's back (a route
//! deleted or retargeted by someone else, another cluster's route gone, a
//! forwarding prerequisite undone) within one period rather than at the
//! resync, 12–24 h later. The periodic mode lists every `period` anyway, so
//! there the drift check only sets how often the prerequisites are read.
//!
//! The end of a hold (the deletion grace, a held repair) wakes the loop in
//! every mode, unspaced, as a retry's backoff does in `incremental`: a
//! held deletion runs when its hold ends, not a whole period later.

use std::time::Duration;

use tokio::time::Instant;

/// The reconcile mode (`--reconcile-mode`). What a mode *means* is said
/// here, by the methods below; the rest of the crate asks them instead of
/// comparing modes, so a new mode is one variant plus its answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Mode {
    /// Upstream, feature gate off: a full pass every period.
    Periodic,
    /// Upstream KEP-5237, feature gate on: a full pass on Node events.
    Watch,
    /// Plan Node events against the cached route table; list only to resync.
    Incremental,
}

impl Mode {
    /// Every mode, in the order the docs and charts show them.
    pub const ALL: [Mode; 3] = [Mode::Periodic, Mode::Watch, Mode::Incremental];

    /// The flag value.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Periodic => "periodic",
            Mode::Watch => "watch",
            Mode::Incremental => "incremental",
        }
    }

    /// The mode `--feature-gates=CloudControllerManagerWatchBasedRoutesReconciliation=<gate>`
    /// selects, as upstream: `watch` when on, `periodic` when off.
    pub fn for_watch_gate(gate: bool) -> Mode {
        if gate { Mode::Watch } else { Mode::Periodic }
    }

    /// The mode from `--reconcile-mode` and the feature gate: the flag if
    /// given, else what the gate selects, else `incremental`. A flag that
    /// contradicts the gate is an error carrying `(flag, implied)`.
    pub fn resolve(flag: Option<Mode>, gate: Option<bool>) -> Result<Mode, (Mode, Mode)> {
        match (flag, gate.map(Mode::for_watch_gate)) {
            (Some(m), Some(implied)) if m != implied => Err((m, implied)),
            (Some(m), _) | (None, Some(m)) => Ok(m),
            (None, None) => Ok(Mode::Incremental),
        }
    }

    /// Keeps the route table between passes and plans Node events against
    /// it, listing the cloud only to resync.
    pub fn caches_route_table(self) -> bool {
        matches!(self, Mode::Incremental)
    }

    /// Node events make a pass pending (otherwise only the period does).
    pub fn follows_node_events(self) -> bool {
        !matches!(self, Mode::Periodic)
    }

    /// Runs the long random resync (`--min-resync-period`); the periodic
    /// mode lists every period anyway.
    pub fn resyncs(self) -> bool {
        !matches!(self, Mode::Periodic)
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Mode::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Mode::ALL.iter().map(|m| m.as_str()).collect();
                format!("unknown reconcile mode {s:?}: use {}", names.join(", "))
            })
    }
}

/// Whether a pass lists the cloud first or plans against the cached table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PassKind {
    /// List routes, then plan.
    Full,
    /// Plan against the cached route table (incremental mode only).
    Cached,
}

impl PassKind {
    /// Metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            PassKind::Full => "full",
            PassKind::Cached => "cached",
        }
    }
}

/// What started a pass; the `trigger` label of `route_controller_route_sync_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SyncTrigger {
    /// Node events (and retries of failed operations).
    NodeChange,
    /// The period (periodic mode) or the resync timer.
    Periodic,
    /// The drift check: no pass listed the cloud for the drift period.
    DriftCheck,
}

impl SyncTrigger {
    /// Metric label, as upstream.
    pub fn as_str(self) -> &'static str {
        match self {
            SyncTrigger::NodeChange => "node_change",
            SyncTrigger::Periodic => "periodic",
            SyncTrigger::DriftCheck => "drift_check",
        }
    }
}

/// The scheduler's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Start a pass now.
    Run(PassKind, SyncTrigger),
    /// Nothing to do before this instant (or before the next event).
    Sleep(Option<Instant>),
}

/// Timing settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// `--route-reconciliation-period` (periodic mode).
    pub period: Duration,
    /// The least time between two pass starts in `watch` mode, and between
    /// two uncertainty-driven full passes in `incremental` mode (10 s, KEP-5237).
    pub min_interval: Duration,
    /// The resync interval, already randomised.
    pub resync: Duration,
    /// `--route-target-discovery-period`: how often the route targets
    /// (tables, routers) are looked up again without listing routes, when
    /// no full pass has listed (and so rediscovered) them meanwhile.
    pub discovery: Duration,
    /// `--route-drift-check-period`: the longest time without a listing of
    /// the cloud, and how often the forwarding prerequisites are read
    /// afresh; zero turns the drift check off (the resync still runs).
    pub drift: Duration,
}

impl Timing {
    /// How often every Node's forwarding prerequisite is read afresh: every
    /// drift check or every resync, whichever comes more often (the resync
    /// alone with the drift check off).
    pub fn prerequisite_period(&self) -> Duration {
        if self.drift.is_zero() {
            self.resync
        } else {
            self.drift.min(self.resync)
        }
    }
}

/// The default of `--route-drift-check-period`. On AWS it costs one
/// `DescribeRouteTables` (which replaces the discovery's, so no request
/// more than without it) and one `DescribeInstances` per 200 routed Nodes
/// every 5 minutes; the other providers' costs are in BENCHMARKS.md.
pub const DEFAULT_DRIFT_PERIOD: Duration = Duration::from_secs(300);

/// The default of `--route-target-discovery-period`: on AWS one filtered
/// `DescribeRouteTables` every 5 minutes of an idle cluster, 12 an hour.
pub const DEFAULT_DISCOVERY_PERIOD: Duration = Duration::from_secs(300);

/// The mode state machine. See the module docs.
#[derive(Debug)]
pub struct Scheduler {
    mode: Mode,
    timing: Timing,
    last_start: Option<Instant>,
    last_full_start: Option<Instant>,
    /// Consecutive full passes whose list failed; spaces the next attempts.
    list_failures: u32,
    next_resync: Instant,
    pending: bool,
    full_needed: bool,
    retry_at: Option<Instant>,
    resync_due: bool,
    /// The fence cut off changes: run a pass as soon as the fence is open
    /// again, in every mode and without spacing.
    redo: bool,
    /// When the route targets are looked up again unless a listing does it first.
    next_discovery: Instant,
    /// When the drift check lists the cloud unless a full pass does it first.
    next_drift: Option<Instant>,
    drift_due: bool,
    /// When the earliest hold ends: a pass runs then in every mode.
    hold_at: Option<Instant>,
    /// The start of the last pass a period or more after the one before
    /// (periodic mode): a pass for a hold's end or a redo in between does
    /// not move the period's phase.
    last_tick: Option<Instant>,
}

impl Scheduler {
    /// A scheduler that runs a full pass as soon as it is asked (start-up).
    pub fn new(mode: Mode, timing: Timing, now: Instant) -> Self {
        Self {
            mode,
            timing,
            last_start: None,
            last_full_start: None,
            list_failures: 0,
            next_resync: now + timing.resync,
            pending: true,
            full_needed: true,
            retry_at: None,
            resync_due: false,
            redo: false,
            next_discovery: now + timing.discovery,
            next_drift: (!timing.drift.is_zero()).then(|| now + timing.drift),
            drift_due: false,
            hold_at: None,
            last_tick: None,
        }
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// A Node change (or the end of a relist) was observed.
    pub fn node_changed(&mut self) {
        if self.mode.follows_node_events() {
            self.pending = true;
        }
    }

    /// The cached route table can no longer be trusted.
    pub fn cache_uncertain(&mut self) {
        self.full_needed = true;
        self.pending = true;
    }

    /// This replica became leader: start over with a full pass.
    pub fn became_leader(&mut self) {
        self.full_needed = true;
        self.pending = true;
        self.last_start = None;
        self.last_tick = None;
    }

    /// The fence cut off changes of the last pass: the next pass runs as
    /// soon as the loop finds the fence open, whatever the mode.
    pub fn redo(&mut self) {
        self.redo = true;
    }

    /// The route targets should be looked up again at `now`.
    pub fn discovery_due(&self, now: Instant) -> bool {
        // The drift check's listing looks the targets up too (AWS: the very
        // same DescribeRouteTables), so a discovery due no earlier than it
        // would only repeat its request.
        now >= self.next_discovery && self.next_drift.is_none_or(|d| d > self.next_discovery)
    }

    /// The route targets were looked up at `now` (by a discovery or a listing).
    pub fn discovered(&mut self, now: Instant) {
        self.next_discovery = now + self.timing.discovery;
    }

    /// A failed operation may be retried at `at`.
    pub fn retry_at(&mut self, at: Option<Instant>) {
        self.retry_at = at;
    }

    /// The earliest hold (deletion grace, held repair) ends at `at`.
    pub fn hold_ends(&mut self, at: Option<Instant>) {
        self.hold_at = at;
    }

    /// What to do at `now`.
    pub fn decide(&mut self, now: Instant) -> Decision {
        if now >= self.next_resync && self.mode.resyncs() {
            self.resync_due = true;
        }
        if self.next_drift.is_some_and(|t| now >= t) {
            self.drift_due = true;
        }
        let retry_due = self.retry_at.is_some_and(|t| now >= t);
        let hold_due = self.hold_at.is_some_and(|t| now >= t);
        if self.redo {
            // Rare (a late renewal, a pause) and never a storm: the work the
            // fence cut off is redone at once rather than at the next period.
            let full = !self.mode.caches_route_table() || self.full_needed || self.resync_due;
            let kind = if full {
                PassKind::Full
            } else {
                PassKind::Cached
            };
            return Decision::Run(kind, SyncTrigger::NodeChange);
        }
        if hold_due && self.last_start.is_some() && !self.mode.caches_route_table() {
            // The modes that list every pass list for it; a hold ends once,
            // so this is never a storm.
            return Decision::Run(PassKind::Full, SyncTrigger::NodeChange);
        }
        let decision = match self.mode {
            Mode::Periodic => match self.last_tick {
                None => Decision::Run(PassKind::Full, SyncTrigger::Periodic),
                Some(t) if now >= t + self.timing.period => {
                    Decision::Run(PassKind::Full, SyncTrigger::Periodic)
                }
                Some(t) => Decision::Sleep(Some(t + self.timing.period)),
            },
            Mode::Watch => {
                let wanted = self.pending || self.resync_due || self.drift_due || retry_due;
                let earliest = self.last_start.map(|t| t + self.spacing());
                if wanted {
                    match earliest {
                        Some(e) if now < e => Decision::Sleep(Some(e)),
                        _ => Decision::Run(PassKind::Full, self.label()),
                    }
                } else {
                    Decision::Sleep(Some(self.wake_after(earliest)))
                }
            }
            Mode::Incremental => {
                if self.full_needed || self.resync_due || self.drift_due {
                    let earliest = self.last_full_start.map(|t| t + self.spacing());
                    // A resync, drift check or first pass runs at once; only
                    // uncertainty storms are spaced, so that faults cannot
                    // cause list storms.
                    let scheduled = self.resync_due || self.drift_due;
                    match earliest {
                        Some(e) if now < e && !scheduled => Decision::Sleep(Some(e)),
                        _ => Decision::Run(PassKind::Full, self.label()),
                    }
                } else if self.pending || retry_due || hold_due {
                    Decision::Run(PassKind::Cached, SyncTrigger::NodeChange)
                } else {
                    Decision::Sleep(Some(self.wake_after(None)))
                }
            }
        };
        match decision {
            Decision::Sleep(Some(t)) => {
                // A wake that is due already was answered above (or waits
                // for the spacing); sleeping until it would spin.
                let wakes = [Some(self.next_discovery), self.next_drift, self.hold_at];
                let t = wakes
                    .into_iter()
                    .flatten()
                    .filter(|w| *w > now)
                    .fold(t, Instant::min);
                Decision::Sleep(Some(t))
            }
            d => d,
        }
    }

    fn label(&self) -> SyncTrigger {
        if self.pending {
            SyncTrigger::NodeChange
        } else if self.resync_due {
            SyncTrigger::Periodic
        } else if self.drift_due {
            SyncTrigger::DriftCheck
        } else {
            SyncTrigger::NodeChange
        }
    }

    fn wake_after(&self, floor: Option<Instant>) -> Instant {
        let mut t = self.next_resync;
        if let Some(r) = self.retry_at {
            t = t.min(r);
        }
        match floor {
            Some(f) => t.max(f),
            None => t,
        }
    }

    /// A pass of `kind` starts at `now`; clears what it covers.
    pub fn started(&mut self, kind: PassKind, now: Instant) {
        self.last_start = Some(now);
        if self.last_tick.is_none_or(|t| now >= t + self.timing.period) {
            self.last_tick = Some(now);
        }
        self.pending = false;
        self.redo = false;
        if self.retry_at.is_some_and(|t| now >= t) {
            self.retry_at = None;
        }
        if self.hold_at.is_some_and(|t| now >= t) {
            self.hold_at = None;
        }
        if kind == PassKind::Full {
            self.last_full_start = Some(now);
            self.full_needed = false;
            self.drift_due = false;
            if !self.timing.drift.is_zero() {
                self.next_drift = Some(now + self.timing.drift);
            }
            if self.resync_due {
                self.resync_due = false;
                self.next_resync = now + self.timing.resync;
            }
        }
    }

    /// A full pass could not list the cloud: try again, spaced like
    /// uncertainty at first and doubling with every further failure up to
    /// [`MAX_LIST_SPACING`], so a cloud that refuses every list (bad
    /// credentials, an outage) is not asked every 10 s forever.
    pub fn full_pass_failed(&mut self) {
        self.full_needed = true;
        self.pending = true;
        self.list_failures = self.list_failures.saturating_add(1);
    }

    /// A full pass listed the cloud (and so rediscovered its targets) at `now`.
    pub fn full_pass_listed(&mut self, now: Instant) {
        self.list_failures = 0;
        self.discovered(now);
    }

    fn spacing(&self) -> Duration {
        let doublings = self.list_failures.saturating_sub(1).min(16);
        self.timing
            .min_interval
            .saturating_mul(1 << doublings)
            .min(MAX_LIST_SPACING.max(self.timing.min_interval))
    }
}

/// The longest wait between list attempts after repeated list failures.
pub const MAX_LIST_SPACING: Duration = Duration::from_secs(300);

/// Picks the resync interval once: uniform in `[min, 2 × min)`, like the
/// cloud-controller-manager's informer resync.
pub fn pick_resync(min: Duration, unit: f64) -> Duration {
    min.mul_f64(1.0 + unit.clamp(0.0, 0.999_999_999))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_comes_from_the_flag_else_the_gate_else_incremental() {
        assert_eq!(Mode::resolve(None, None), Ok(Mode::Incremental));
        assert_eq!(Mode::resolve(None, Some(true)), Ok(Mode::Watch));
        assert_eq!(Mode::resolve(None, Some(false)), Ok(Mode::Periodic));
        assert_eq!(
            Mode::resolve(Some(Mode::Watch), Some(true)),
            Ok(Mode::Watch)
        );
        assert_eq!(
            Mode::resolve(Some(Mode::Incremental), Some(true)),
            Err((Mode::Incremental, Mode::Watch))
        );
        for m in Mode::ALL {
            assert_eq!(m.as_str().parse::<Mode>(), Ok(m));
        }
        assert!("fast".parse::<Mode>().is_err());
    }

    fn timing() -> Timing {
        Timing {
            period: Duration::from_secs(10),
            min_interval: Duration::from_secs(10),
            resync: Duration::from_secs(12 * 3600),
            // Longer than any test here looks ahead, so it never wakes them.
            discovery: Duration::from_secs(48 * 3600),
            drift: Duration::ZERO,
        }
    }

    #[test]
    fn periodic_ignores_node_changes_and_ticks_from_pass_start() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(Mode::Periodic, timing(), t0);
        assert_eq!(
            s.decide(t0),
            Decision::Run(PassKind::Full, SyncTrigger::Periodic)
        );
        s.started(PassKind::Full, t0);
        s.node_changed();
        assert_eq!(
            s.decide(t0 + Duration::from_secs(3)),
            Decision::Sleep(Some(t0 + Duration::from_secs(10)))
        );
    }

    #[test]
    fn watch_runs_a_trigger_after_quiet_at_once_and_spaces_bursts() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(Mode::Watch, timing(), t0);
        assert!(matches!(s.decide(t0), Decision::Run(PassKind::Full, _)));
        s.started(PassKind::Full, t0);
        s.node_changed();
        assert_eq!(
            s.decide(t0 + Duration::from_secs(1)),
            Decision::Sleep(Some(t0 + Duration::from_secs(10)))
        );
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(
            s.decide(t1),
            Decision::Run(PassKind::Full, SyncTrigger::NodeChange)
        );
        s.started(PassKind::Full, t1);
        // A long quiet period: the next trigger runs immediately (no debt).
        let t2 = t1 + Duration::from_secs(600);
        s.node_changed();
        assert_eq!(
            s.decide(t2),
            Decision::Run(PassKind::Full, SyncTrigger::NodeChange)
        );
    }

    #[test]
    fn incremental_plans_against_cache_and_spaces_uncertainty_lists() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(Mode::Incremental, timing(), t0);
        assert!(matches!(s.decide(t0), Decision::Run(PassKind::Full, _)));
        s.started(PassKind::Full, t0);
        s.node_changed();
        assert_eq!(
            s.decide(t0),
            Decision::Run(PassKind::Cached, SyncTrigger::NodeChange)
        );
        s.started(PassKind::Cached, t0);
        s.cache_uncertain();
        assert_eq!(
            s.decide(t0 + Duration::from_secs(2)),
            Decision::Sleep(Some(t0 + Duration::from_secs(10)))
        );
        assert!(matches!(
            s.decide(t0 + Duration::from_secs(10)),
            Decision::Run(PassKind::Full, _)
        ));
    }

    #[test]
    fn failing_lists_back_off_to_five_minutes_and_reset_on_success() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(Mode::Incremental, timing(), t0);
        let mut t = t0;
        let mut gaps = Vec::new();
        for _ in 0..8 {
            let Decision::Run(PassKind::Full, _) = s.decide(t) else {
                let Decision::Sleep(Some(next)) = s.decide(t) else {
                    panic!()
                };
                gaps.push((next - t).as_secs());
                t = next;
                assert!(matches!(s.decide(t), Decision::Run(PassKind::Full, _)));
                s.started(PassKind::Full, t);
                s.full_pass_failed();
                continue;
            };
            s.started(PassKind::Full, t);
            s.full_pass_failed();
        }
        assert_eq!(gaps, vec![10, 20, 40, 80, 160, 300, 300]);
        s.full_pass_listed(Instant::now());
        s.started(PassKind::Full, t);
        s.full_pass_failed();
        assert_eq!(
            s.decide(t),
            Decision::Sleep(Some(t + Duration::from_secs(10)))
        );
    }

    #[test]
    fn changes_cut_off_by_the_fence_are_redone_at_once_in_every_mode() {
        for mode in Mode::ALL {
            let t0 = Instant::now();
            let mut s = Scheduler::new(mode, timing(), t0);
            s.started(PassKind::Full, t0);
            let t1 = t0 + Duration::from_secs(1);
            assert!(matches!(s.decide(t1), Decision::Sleep(_)), "{mode}");
            s.redo();
            let want = if mode.caches_route_table() {
                PassKind::Cached
            } else {
                PassKind::Full
            };
            // Not at the next period or after the 10 s spacing: now.
            assert_eq!(
                s.decide(t1),
                Decision::Run(want, SyncTrigger::NodeChange),
                "{mode}"
            );
            s.started(want, t1);
            assert!(matches!(s.decide(t1), Decision::Sleep(_)), "{mode}: once");
            // An abandoned answer also made the cache uncertain: list first.
            s.cache_uncertain();
            s.redo();
            assert_eq!(
                s.decide(t1),
                Decision::Run(PassKind::Full, SyncTrigger::NodeChange),
                "{mode}"
            );
        }
    }

    #[test]
    fn route_targets_are_looked_up_on_their_own_clock_unless_a_listing_did() {
        let t0 = Instant::now();
        let timing = Timing {
            discovery: Duration::from_secs(300),
            ..timing()
        };
        let mut s = Scheduler::new(Mode::Incremental, timing, t0);
        s.started(PassKind::Full, t0);
        s.full_pass_listed(t0);
        let five = t0 + Duration::from_secs(300);
        assert_eq!(
            s.decide(t0),
            Decision::Sleep(Some(five)),
            "an idle loop wakes for it"
        );
        assert!(!s.discovery_due(t0) && s.discovery_due(five));
        // A listing in between looks the targets up too.
        let t1 = t0 + Duration::from_secs(200);
        s.full_pass_listed(t1);
        assert!(!s.discovery_due(five));
        s.discovered(t1 + Duration::from_secs(300));
        assert!(!s.discovery_due(t1 + Duration::from_secs(599)));
    }

    #[test]
    fn a_holds_end_runs_a_pass_in_every_mode_and_leaves_the_periodic_phase_alone() {
        for mode in Mode::ALL {
            let t0 = Instant::now();
            let mut s = Scheduler::new(mode, timing(), t0);
            assert!(matches!(s.decide(t0), Decision::Run(PassKind::Full, _)));
            s.started(PassKind::Full, t0);
            let end = t0 + Duration::from_secs(3);
            s.hold_ends(Some(end));
            let Decision::Sleep(Some(wake)) = s.decide(t0 + Duration::from_secs(1)) else {
                panic!("{mode}: nothing due yet")
            };
            assert_eq!(wake, end, "{mode}: the loop wakes when the hold ends");
            let Decision::Run(kind, _) = s.decide(end) else {
                panic!("{mode}: a pass when the hold ends")
            };
            s.started(kind, end);
            if mode == Mode::Periodic {
                // The next tick is still a period after the last tick.
                assert_eq!(
                    s.decide(end),
                    Decision::Sleep(Some(t0 + Duration::from_secs(10)))
                );
            }
        }
    }

    #[test]
    fn the_drift_check_lists_when_no_pass_listed_for_its_period_and_takes_the_discoverys_place() {
        let drift = Duration::from_secs(300);
        let with_drift = Timing {
            drift,
            discovery: Duration::from_secs(300),
            ..timing()
        };
        for mode in [Mode::Watch, Mode::Incremental] {
            let t0 = Instant::now();
            let mut s = Scheduler::new(mode, with_drift, t0);
            assert!(matches!(s.decide(t0), Decision::Run(PassKind::Full, _)));
            s.started(PassKind::Full, t0);
            s.full_pass_listed(t0);
            assert_eq!(s.decide(t0), Decision::Sleep(Some(t0 + drift)), "{mode}");
            let due = t0 + drift;
            assert!(
                !s.discovery_due(due),
                "{mode}: the drift check's list discovers"
            );
            assert_eq!(
                s.decide(due),
                Decision::Run(PassKind::Full, SyncTrigger::DriftCheck),
                "{mode}"
            );
            s.started(PassKind::Full, due);
            s.full_pass_listed(due);
            assert_eq!(s.decide(due), Decision::Sleep(Some(due + drift)), "{mode}");
        }
        // Off: nothing before the resync.
        let off = Timing {
            drift: Duration::ZERO,
            discovery: Duration::from_secs(48 * 3600),
            ..timing()
        };
        let t0 = Instant::now();
        let mut s = Scheduler::new(Mode::Incremental, off, t0);
        s.started(PassKind::Full, t0);
        assert_eq!(
            s.decide(t0),
            Decision::Sleep(Some(t0 + Duration::from_secs(12 * 3600)))
        );
    }

    #[test]
    fn resync_is_labelled_periodic() {
        let t0 = Instant::now();
        let mut s = Scheduler::new(Mode::Incremental, timing(), t0);
        s.started(PassKind::Full, t0);
        let later = t0 + Duration::from_secs(12 * 3600);
        assert_eq!(
            s.decide(later),
            Decision::Run(PassKind::Full, SyncTrigger::Periodic)
        );
        s.started(PassKind::Full, later);
        assert_eq!(
            s.decide(later),
            Decision::Sleep(Some(later + Duration::from_secs(12 * 3600)))
        );
    }

    #[test]
    fn resync_interval_lies_in_its_range() {
        let min = Duration::from_secs(12 * 3600);
        assert_eq!(pick_resync(min, 0.0), min);
        assert!(pick_resync(min, 0.999_999_999_999) < min * 2);
        assert!(pick_resync(min, 5.0) < min * 2);
    }
}
