//! The provider conformance suite: the contract of [`CloudRoutes`] every
//! provider must meet, written once and run by each provider's own tests
//! against its real server or fake (`tests/conformance.rs` in each provider
//! crate).
//!
//! Ownership: this crate owns the *contract*, that is the checks and what they
//! accept. A provider's test owns its *fixture*: it builds a [`Subject`] (the
//! provider pointed at a fresh table, the Nodes routes may target, and the
//! knobs of its server or fake) and hands a factory of subjects to
//! [`run_all`]. Every check gets a subject of its own, so no check sees
//! another's routes.
//!
//! The checks ([`Check`]), each a separate `pub async fn` so a failure names
//! the one that broke:
//!
//! - [`list_after_create`]: a created route is listed with its destination
//!   and target node, not as a blackhole, and exactly as `create_route`
//!   returned it (the trait promises that, so the controller can cache it);
//! - [`delete_gone`]: deleting a route that is already gone answers `Ok` or
//!   [`ErrorKind::NotFound`] (both mean "the goal is reached", as the trait
//!   documents), and it stays gone;
//! - [`create_existing`]: creating a route that already exists answers `Ok`
//!   or [`ErrorKind::AlreadyExists`], and the table still holds it once;
//! - [`error_classes`]: every error the fixture's server can be made to
//!   answer is classified as the [`ErrorKind`] the fixture claims, the
//!   refused change did not happen, and the next call works (not sticky);
//! - [`ipv6`]: an IPv6 route works where [`Capabilities::supports_ipv6`] says
//!   so and is refused with [`ErrorKind::InvalidRequest`] where it does not;
//! - [`quota`]: a full table refuses one more route with
//!   [`ErrorKind::QuotaExceeded`] and accepts it again once one is deleted
//!   (where the cloud has a limit at all);
//! - [`batch`]: `apply_batch` answers one result per change, under the
//!   change's key, where the capabilities claim batches, and refuses with
//!   [`ErrorKind::InvalidRequest`] where they do not;
//! - [`cancel_safety`]: dropping a create or delete mid-flight leaves the
//!   provider usable and a later list consistent with either outcome;
//! - [`request_counters`]: the provider's [`RequestStats`] count exactly the
//!   requests its server saw;
//! - [`forwarding`]: `check_forwarding` answers only about the Nodes asked,
//!   once each, finds a routed Node on an instance that can forward
//!   `Ready`, never repairs when asked not to, and answers a remembered
//!   check after a fresh one without a request (nothing at all without
//!   [`Capabilities::checks_forwarding`]).
//!
//! What the fixtures have in common lives here too: [`FaultTable`] turns a
//! table of the server's error answers into its [`Faults`], and
//! [`run_all_within`] bounds the whole suite in time.
//!
//! A check that needs a knob the subject does not have (no fault injection,
//! no quota, no server-side request count) fails rather than passing
//! quietly: a provider that cannot run it says so with an [`Exemption`] and
//! its reason, next to its fixture.
//!
//! [`Capabilities::supports_ipv6`]: route_cloud::Capabilities::supports_ipv6
//! [`Capabilities::checks_forwarding`]: route_cloud::Capabilities::checks_forwarding
//! [`RequestStats`]: route_cloud::RequestStats

mod checks;
mod faults;

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use route_cloud::{CloudRoutes, ErrorKind};
use route_core::NodeView;

pub use checks::{
    batch, cancel_safety, create_existing, delete_gone, error_classes, forwarding, ipv6,
    list_after_create, quota, request_counters,
};
pub use faults::FaultTable;

/// An operation a fault can be injected on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `list_routes`.
    List,
    /// `create_route`.
    Create,
    /// `delete_route`.
    Delete,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::List => "list",
            Op::Create => "create",
            Op::Delete => "delete",
        })
    }
}

/// The fault knobs of a provider's server or fake.
pub trait Faults: Send + Sync {
    /// The failures this server can be made to answer: each pair is checked
    /// to reach the caller of `op` as exactly that [`ErrorKind`].
    fn injectable(&self) -> Vec<(Op, ErrorKind)>;

    /// Makes the server answer the next request of `op` with the failure the
    /// provider must classify as `kind`, without acting on the request.
    fn fail_next(&self, op: Op, kind: ErrorKind);
}

/// A provider under test and its fixture. Build one with [`Subject::new`]
/// and the `with_*` methods.
pub struct Subject {
    /// The provider, pointed at a table that holds no routes of `cluster`.
    pub cloud: Arc<dyn CloudRoutes>,
    /// The cluster name passed to every call.
    pub cluster: String,
    /// Nodes the cloud accepts as route targets (at least one); shown to the
    /// provider with `observe_nodes` before every list, as the controller
    /// does. Where the provider supports IPv6, the first one must be able
    /// to take an IPv6 route too (e.g. carry an IPv6 InternalIP).
    pub nodes: Vec<Arc<NodeView>>,
    /// The server's fault knobs, if it has any.
    pub faults: Option<Box<dyn Faults>>,
    /// The number of requests the server has seen so far, if it can say.
    pub server_requests: Option<Box<dyn Fn() -> u64 + Send + Sync>>,
    /// How many routes the fixture's table accepts, if it has a limit.
    pub quota: Option<usize>,
    /// Fixtures that must live as long as the subject (a fake server, a proxy).
    pub keep_alive: Vec<Box<dyn Any + Send + Sync>>,
}

impl fmt::Debug for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subject")
            .field("provider", &self.cloud.name())
            .field("cluster", &self.cluster)
            .field("nodes", &self.nodes.len())
            .field("faults", &self.faults.is_some())
            .field("server_requests", &self.server_requests.is_some())
            .field("quota", &self.quota)
            .finish_non_exhaustive()
    }
}

impl Subject {
    /// A subject without fault knobs, server counter or quota.
    pub fn new(
        cloud: Arc<dyn CloudRoutes>,
        cluster: impl Into<String>,
        nodes: Vec<NodeView>,
    ) -> Self {
        Self {
            cloud,
            cluster: cluster.into(),
            nodes: nodes.into_iter().map(Arc::new).collect(),
            faults: None,
            server_requests: None,
            quota: None,
            keep_alive: Vec::new(),
        }
    }

    /// Adds the server's fault knobs.
    pub fn with_faults(mut self, faults: impl Faults + 'static) -> Self {
        self.faults = Some(Box::new(faults));
        self
    }

    /// Adds the server's request count.
    pub fn with_server_requests(mut self, count: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        self.server_requests = Some(Box::new(count));
        self
    }

    /// Says how many routes the fixture's table accepts.
    pub fn with_quota(mut self, routes: usize) -> Self {
        self.quota = Some(routes);
        self
    }

    /// Keeps `fixture` alive as long as the subject.
    pub fn keep_alive(mut self, fixture: impl Any + Send + Sync) -> Self {
        self.keep_alive.push(Box::new(fixture));
        self
    }
}

/// One check of the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Check {
    /// [`list_after_create`].
    ListAfterCreate,
    /// [`delete_gone`].
    DeleteGone,
    /// [`create_existing`].
    CreateExisting,
    /// [`error_classes`].
    ErrorClasses,
    /// [`ipv6`].
    Ipv6,
    /// [`quota`].
    Quota,
    /// [`batch`].
    Batch,
    /// [`cancel_safety`].
    CancelSafety,
    /// [`request_counters`].
    RequestCounters,
    /// [`forwarding`].
    Forwarding,
}

impl Check {
    /// Every check, in the order [`run_all`] runs them.
    pub const ALL: [Check; 10] = [
        Check::ListAfterCreate,
        Check::DeleteGone,
        Check::CreateExisting,
        Check::ErrorClasses,
        Check::Ipv6,
        Check::Quota,
        Check::Batch,
        Check::CancelSafety,
        Check::RequestCounters,
        Check::Forwarding,
    ];

    /// The check's function name, as failures report it.
    pub fn name(self) -> &'static str {
        match self {
            Check::ListAfterCreate => "list_after_create",
            Check::DeleteGone => "delete_gone",
            Check::CreateExisting => "create_existing",
            Check::ErrorClasses => "error_classes",
            Check::Ipv6 => "ipv6",
            Check::Quota => "quota",
            Check::Batch => "batch",
            Check::CancelSafety => "cancel_safety",
            Check::RequestCounters => "request_counters",
            Check::Forwarding => "forwarding",
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A check a provider does not run, and why. The reason is printed with
/// every run, so an exemption stays visible.
#[derive(Debug, Clone, Copy)]
pub struct Exemption {
    /// The check not run.
    pub check: Check,
    /// Why this provider cannot meet or run it.
    pub reason: &'static str,
}

/// Runs one check against `subject`; `Err` says what broke.
pub async fn run(check: Check, subject: &Subject) -> Result<(), String> {
    match check {
        Check::ListAfterCreate => list_after_create(subject).await,
        Check::DeleteGone => delete_gone(subject).await,
        Check::CreateExisting => create_existing(subject).await,
        Check::ErrorClasses => error_classes(subject).await,
        Check::Ipv6 => ipv6(subject).await,
        Check::Quota => quota(subject).await,
        Check::Batch => batch(subject).await,
        Check::CancelSafety => cancel_safety(subject).await,
        Check::RequestCounters => request_counters(subject).await,
        Check::Forwarding => forwarding(subject).await,
    }
}

/// Runs every check not exempted, each on a fresh subject from `factory`,
/// and panics naming every check that failed. Prints one line per check.
pub async fn run_all<F>(mut factory: F, exemptions: &[Exemption])
where
    F: AsyncFnMut() -> Subject,
{
    for (i, e) in exemptions.iter().enumerate() {
        assert!(
            !e.reason.trim().is_empty(),
            "the exemption of {} needs a reason",
            e.check
        );
        assert!(
            exemptions[..i].iter().all(|o| o.check != e.check),
            "{} is exempted twice",
            e.check
        );
    }
    let mut failures = Vec::new();
    let mut provider = "?";
    for check in Check::ALL {
        if let Some(e) = exemptions.iter().find(|e| e.check == check) {
            eprintln!("conformance {check}: EXEMPT: {}", e.reason);
            continue;
        }
        let subject = factory().await;
        provider = subject.cloud.name();
        match run(check, &subject).await {
            Ok(()) => eprintln!("conformance {provider} {check}: ok"),
            Err(why) => {
                eprintln!("conformance {provider} {check}: FAILED: {why}");
                failures.push(format!("{check}: {why}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} conformance check(s) of the {provider} provider failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// [`run_all`] bounded by `limit`: a server that stops answering fails the
/// test instead of hanging it.
pub async fn run_all_within<F>(limit: Duration, factory: F, exemptions: &[Exemption])
where
    F: AsyncFnMut() -> Subject,
{
    tokio::time::timeout(limit, run_all(factory, exemptions))
        .await
        .expect("the suite finishes in time");
}
