//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's
//! semantics.
//!
//! Every write is a `replace` carrying the resourceVersion that was read, so
//! two candidates can never both win a round: the API server refuses the
//! second write with 409 Conflict. Expiry is judged by *local* observation —
//! a holder is considered gone only when its record has not changed for a
//! whole lease duration as seen by this process's monotonic clock — so clock
//! skew between machines does not matter. Each successful renewal extends the
//! [`Fence`] to the moment its request was sent plus the renew deadline,
//! measured on a clock that counts suspended time, so a leader that is paused
//! past its deadline is fenced the instant it resumes, before this loop runs
//! again. The leader that cannot renew within the renew deadline reports the
//! loss; the binary then exits so it restarts clean.

//!
//! The Lease is read and written through a [`LeaseStore`]: [`KubeLeases`]
//! on the API server, an in-memory store with answers as slow as a fault
//! says in the model checker.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use route_cloud::Fence;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Settings (the `--leader-elect-*` flags).
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// `--leader-elect-resource-namespace`.
    pub namespace: String,
    /// `--leader-elect-resource-name`.
    pub name: String,
    /// `--leader-elect-identity`: this replica's name in the Lease.
    pub identity: String,
    /// `--leader-elect-lease-duration`: how long others wait for a renewal.
    pub lease_duration: Duration,
    /// `--leader-elect-renew-deadline`: how long the leader keeps trying.
    pub renew_deadline: Duration,
    /// `--leader-elect-retry-period`: how often it renews.
    pub retry_period: Duration,
}

/// Why leadership ended.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// No renewal succeeded within the renew deadline, or another holds the Lease.
    #[error("lost leadership: could not renew the Lease {0} within the renew deadline")]
    Lost(String),
}

/// Why a Lease request failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// 409: someone wrote the Lease since it was read (or it exists already).
    #[error("conflict")]
    Conflict,
    /// Anything else: the API server could not be asked, refused, timed out.
    #[error("{0}")]
    Other(String),
}

/// Reads and writes the one Lease of an election.
pub trait LeaseStore: Send + Sync {
    /// The Lease, or `None` when it does not exist.
    fn get(&self) -> impl Future<Output = Result<Option<Lease>, StoreError>> + Send;
    /// Creates it; [`StoreError::Conflict`] when it exists.
    fn create(&self, lease: &Lease) -> impl Future<Output = Result<Lease, StoreError>> + Send;
    /// Replaces it if its `resourceVersion` is still the one read;
    /// [`StoreError::Conflict`] otherwise.
    fn replace(&self, lease: &Lease) -> impl Future<Output = Result<Lease, StoreError>> + Send;
}

/// The Lease `name` in `namespace` on the API server.
pub struct KubeLeases {
    api: Api<Lease>,
    name: String,
}

impl KubeLeases {
    /// The Lease `name` in `namespace`, through `client`.
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
        }
    }
}

fn store_error(e: kube::Error) -> StoreError {
    match e {
        kube::Error::Api(a) if a.code == 409 => StoreError::Conflict,
        e => StoreError::Other(e.to_string()),
    }
}

impl LeaseStore for KubeLeases {
    async fn get(&self) -> Result<Option<Lease>, StoreError> {
        self.api.get_opt(&self.name).await.map_err(store_error)
    }
    async fn create(&self, lease: &Lease) -> Result<Lease, StoreError> {
        self.api
            .create(&PostParams::default(), lease)
            .await
            .map_err(store_error)
    }
    async fn replace(&self, lease: &Lease) -> Result<Lease, StoreError> {
        // `replace` sends metadata.resourceVersion: a concurrent writer makes it fail.
        self.api
            .replace(&self.name, &PostParams::default(), lease)
            .await
            .map_err(store_error)
    }
}

/// Runs the election until `shutdown`; publishes leadership on `tx` and
/// extends `fence` (a [`Fence::leased`]) on every renewal. Returns `Err` if
/// leadership, once held, was lost.
pub async fn run(
    api: impl LeaseStore,
    cfg: LeaseConfig,
    tx: watch::Sender<bool>,
    fence: Fence,
    shutdown: CancellationToken,
) -> Result<(), LeaderError> {
    let mut observed: Option<(String, Option<MicroTime>, Option<i32>)> = None;
    let mut observed_at = Instant::now();
    // On the fence's clock, which counts time this process was stopped.
    let mut last_renew: Option<Duration> = None;
    let mut ticker = tokio::time::interval(cfg.retry_period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.cancelled() => {
                if tx.borrow().to_owned() {
                    tx.send_replace(false);
                    release(&api, &cfg).await;
                }
                return Ok(());
            }
        }
        let leading = *tx.borrow();
        let sent_at = fence.mark();
        // A leader's renewal may take until its renew deadline, as
        // client-go's does: cutting it off after one retry period (1 s with
        // a short Lease) made a renewal that an API server busy with the
        // leader's own condition burst answered in 1.2 s count as failed,
        // while its write still landed and made the next renewal conflict
        // with it.
        // An acquisition may take as long: the fence counts from the send.
        let budget = match (leading, last_renew) {
            (true, Some(t)) => cfg.renew_deadline.saturating_sub(sent_at.saturating_sub(t)),
            _ => cfg.renew_deadline,
        }
        .max(cfg.retry_period)
        .max(Duration::from_secs(1));
        let attempt = tokio::time::timeout(
            budget,
            try_acquire_or_renew(&api, &cfg, &mut observed, &mut observed_at),
        )
        .await;
        let won = matches!(attempt, Ok(Ok(Round::Holds)));
        match &attempt {
            Ok(Err(e)) => warn!(error = %e, lease = %cfg.name, "leader election request failed"),
            Err(_) if leading => {
                warn!(lease = %cfg.name, waited_ms = budget.as_millis() as u64, "the Lease renewal got no answer in time; trying again until the renew deadline")
            }
            Ok(Ok(Round::Conflict)) if leading => {
                warn!(lease = %cfg.name, "the Lease renewal conflicted with another write (a renewal of ours that landed after it was given up, or a rival); reading it again")
            }
            _ => {}
        }
        if won {
            // Before publishing leadership, so the first mutation already
            // has its deadline.
            if fence.renewed(sent_at, cfg.renew_deadline) {
                // The fence closed while this replica still held the Lease;
                // the controller redoes what it cut off now that it is open.
                warn!(
                    lease = %cfg.name,
                    late_renewals = fence.late_renewals(),
                    "the Lease was renewed after the renew deadline; cloud changes were paused meanwhile and are redone now"
                );
            }
            last_renew = Some(sent_at);
            if !leading {
                info!(identity = %cfg.identity, lease = %format!("{}/{}", cfg.namespace, cfg.name), "became leader");
                tx.send_replace(true);
            }
        } else if leading {
            let since = last_renew.map_or(Duration::MAX, |t| fence.mark().saturating_sub(t));
            // Another holder seen in a fresh read ends leadership at once;
            // anything else (an error, no answer, a conflict, which may be
            // with our own late write) only once the renew deadline passed.
            if since >= cfg.renew_deadline || matches!(attempt, Ok(Ok(Round::HeldByOther))) {
                // Stop mutating first, then tell the caller to exit.
                tx.send_replace(false);
                return Err(LeaderError::Lost(format!("{}/{}", cfg.namespace, cfg.name)));
            }
        }
    }
}

type Observed = Option<(String, Option<MicroTime>, Option<i32>)>;

/// How one round ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Round {
    /// This process holds the Lease (acquired or renewed).
    Holds,
    /// The Lease is another's and has not expired.
    HeldByOther,
    /// The write lost a race (409): someone wrote the Lease between our
    /// read and our write. Not proof of another holder: a renewal of ours
    /// given up while in flight may have landed meanwhile.
    Conflict,
}

/// One round: whether this process holds the Lease after it.
async fn try_acquire_or_renew(
    api: &impl LeaseStore,
    cfg: &LeaseConfig,
    observed: &mut Observed,
    observed_at: &mut Instant,
) -> Result<Round, StoreError> {
    let now = MicroTime(Timestamp::now());
    let secs = i32::try_from(cfg.lease_duration.as_secs()).unwrap_or(i32::MAX);
    let current = match api.get().await? {
        Some(l) => l,
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(cfg.name.clone()),
                    namespace: Some(cfg.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(cfg.identity.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match api.create(&lease).await {
                Ok(_) => Ok(Round::Holds),
                Err(StoreError::Conflict) => Ok(Round::Conflict),
                Err(e) => Err(e),
            };
        }
    };
    let spec = current.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let record = (
        holder.clone(),
        spec.renew_time.clone(),
        spec.lease_transitions,
    );
    if observed.as_ref() != Some(&record) {
        *observed = Some(record);
        *observed_at = Instant::now();
    }
    let held_by_me = holder == cfg.identity;
    let expired = holder.is_empty() || observed_at.elapsed() >= cfg.lease_duration;
    if !held_by_me && !expired {
        return Ok(Round::HeldByOther);
    }
    let mut next = current.clone();
    let mut s = spec;
    if !held_by_me {
        s.holder_identity = Some(cfg.identity.clone());
        s.acquire_time = Some(now.clone());
        s.lease_transitions = Some(s.lease_transitions.unwrap_or(0) + 1);
    }
    s.renew_time = Some(now);
    s.lease_duration_seconds = Some(secs);
    next.spec = Some(s);
    match api.replace(&next).await {
        Ok(l) => {
            let sp = l.spec.unwrap_or_default();
            *observed = Some((
                sp.holder_identity.unwrap_or_default(),
                sp.renew_time,
                sp.lease_transitions,
            ));
            *observed_at = Instant::now();
            Ok(Round::Holds)
        }
        Err(StoreError::Conflict) => Ok(Round::Conflict),
        Err(e) => Err(e),
    }
}

/// Gives the Lease up on clean shutdown so another replica takes over at once.
async fn release(api: &impl LeaseStore, cfg: &LeaseConfig) {
    let Ok(Some(mut l)) = api.get().await else {
        return;
    };
    let Some(s) = l.spec.as_mut() else { return };
    if s.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        return;
    }
    s.holder_identity = None;
    s.renew_time = Some(MicroTime(Timestamp::now()));
    s.lease_duration_seconds = Some(1);
    match api.replace(&l).await {
        Ok(_) => info!(lease = %cfg.name, "released the Lease"),
        Err(e) => warn!(error = %e, lease = %cfg.name, "could not release the Lease"),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use crate::{
        BackoffConfig, Controller, ControllerConfig, Mode, NodeEvent, NodeStore,
        RecordingStatusWriter, Timing,
    };
    use http::{Request, Response, StatusCode};
    use kube::client::Body;
    use provider_memory::{MemoryCloud, Operation};
    use route_cloud::{CloudRoutes, TokioClock};
    use route_core::{NodeAddress, NodeView, PlanConfig, parse_cluster_cidrs};

    use super::*;

    /// An API server whose Lease endpoint answers the first acquisition (no
    /// Lease yet, then a successful create) and, once `stall` is set, never
    /// answers again.
    fn lease_api(stall: Arc<AtomicBool>) -> kube::Client {
        let svc = tower::service_fn(move |req: Request<Body>| {
            let stall = stall.clone();
            async move {
                if stall.load(Ordering::SeqCst) {
                    std::future::pending::<()>().await;
                }
                let (status, body) = if req.method() == http::Method::GET {
                    (
                        StatusCode::NOT_FOUND,
                        serde_json::json!({
                            "kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "reason": "NotFound", "code": 404, "message": "not found"
                        }),
                    )
                } else {
                    let bytes = req.into_body().collect_bytes().await.unwrap_or_default();
                    let mut lease: serde_json::Value =
                        serde_json::from_slice(&bytes).unwrap_or_default();
                    lease["metadata"]["resourceVersion"] = "1".into();
                    (StatusCode::CREATED, lease)
                };
                let resp = Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&body).unwrap_or_default()))
                    .expect("a valid response");
                Ok::<_, std::convert::Infallible>(resp)
            }
        });
        kube::Client::new(svc, "kube-system")
    }

    fn node(i: usize) -> NodeView {
        NodeView::new(
            format!("node-{i}"),
            format!("uid-{i}"),
            &[&format!("10.244.{i}.0/24")],
        )
        .with_addresses(vec![NodeAddress::internal_ip(format!("10.0.0.{}", i + 1))])
    }

    #[tokio::test(start_paused = true)]
    async fn lease_api_stalls_while_cloud_answers_no_mutation_after_renew_deadline() {
        let renew_deadline = Duration::from_secs(10);
        let cfg = LeaseConfig {
            namespace: "kube-system".into(),
            name: "cloud-route-controller".into(),
            identity: "a".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline,
            retry_period: Duration::from_secs(2),
        };
        let stall = Arc::new(AtomicBool::new(false));
        let fence = Fence::leased(Arc::new(TokioClock::new()));
        let (tx, rx) = watch::channel(false);
        let shutdown = CancellationToken::new();
        let t0 = Instant::now();
        let election = tokio::spawn(run(
            KubeLeases::new(
                lease_api(stall.clone()),
                "kube-system",
                "cloud-route-controller",
            ),
            cfg,
            tx,
            fence.clone(),
            shutdown.clone(),
        ));
        let mut leading = rx.clone();
        leading.wait_for(|l| *l).await.unwrap();
        // Acquired at t0; from now on no renewal gets an answer.
        stall.store(true, Ordering::SeqCst);

        let nodes = NodeStore::new(None);
        nodes.apply(NodeEvent::Init);
        nodes.apply(NodeEvent::InitDone);
        let cloud = MemoryCloud::default();
        let controller = Controller::new(
            ControllerConfig {
                cluster_name: "kubernetes".into(),
                plan: PlanConfig {
                    cluster_cidrs: parse_cluster_cidrs("10.244.0.0/16").unwrap(),
                    ..PlanConfig::default()
                },
                mode: Mode::Incremental,
                timing: Timing {
                    period: Duration::from_secs(10),
                    min_interval: Duration::from_secs(10),
                    resync: Duration::from_secs(3600),
                    discovery: crate::schedule::DEFAULT_DISCOVERY_PERIOD,
                    drift: std::time::Duration::ZERO,
                },
                backoff: BackoffConfig::default(),
                status_concurrency: 4,
                deletion_grace: crate::controller::DEFAULT_DELETION_GRACE,
                bounds: crate::bounds::Bounds::NONE,
            },
            nodes.clone(),
            Arc::new(cloud.clone()) as Arc<dyn CloudRoutes>,
            Arc::new(RecordingStatusWriter::default()),
            fence.clone(),
            None,
        );
        tokio::spawn(controller.run(rx, shutdown.clone()));
        // A Node every 250 ms for 20 s; the cloud answers every call.
        for i in 0..80 {
            nodes.apply(NodeEvent::Apply(node(i)));
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let creates: Vec<Instant> = cloud
            .log()
            .into_iter()
            .filter(|c| c.op == Operation::Create)
            .map(|c| c.at)
            .collect();
        assert!(
            creates.len() >= 30,
            "the leader worked until its deadline: {} creations",
            creates.len()
        );
        let last = creates.iter().max().copied().unwrap();
        assert!(
            last < t0 + renew_deadline,
            "a route was created {:?} after the last renewal was sent",
            last - t0
        );
        let r = tokio::time::timeout(Duration::from_secs(10), election)
            .await
            .expect("the election gives up")
            .unwrap();
        assert!(matches!(r, Err(LeaderError::Lost(_))));
        shutdown.cancel();
    }

    /// A Lease endpoint that takes `latency` per request, as an API server
    /// busy with the leader's own condition burst does, and applies a write
    /// even when its client gave up waiting (the server does not know).
    fn slow_lease_api(latency: Duration) -> kube::Client {
        let state: Arc<std::sync::Mutex<Option<serde_json::Value>>> = Arc::default();
        let svc = tower::service_fn(move |req: Request<Body>| {
            let state = state.clone();
            async move {
                let method = req.method().clone();
                let bytes = req.into_body().collect_bytes().await.unwrap_or_default();
                let work = tokio::spawn(async move {
                    tokio::time::sleep(latency).await;
                    let mut current = state.lock().expect("not poisoned");
                    let rv = |l: &serde_json::Value| {
                        l["metadata"]["resourceVersion"]
                            .as_str()
                            .and_then(|v| v.parse::<u64>().ok())
                    };
                    let status = |code: u16, reason: &str| {
                        serde_json::json!({
                            "kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "reason": reason, "code": code, "message": reason
                        })
                    };
                    if method == http::Method::GET {
                        return match current.as_ref() {
                            Some(l) => (StatusCode::OK, l.clone()),
                            None => (StatusCode::NOT_FOUND, status(404, "NotFound")),
                        };
                    }
                    let mut lease: serde_json::Value =
                        serde_json::from_slice(&bytes).unwrap_or_default();
                    let next = match (method == http::Method::POST, current.as_ref()) {
                        (true, None) => 1,
                        (false, Some(l)) if rv(&lease) == rv(l) => rv(l).unwrap_or(0) + 1,
                        _ => return (StatusCode::CONFLICT, status(409, "Conflict")),
                    };
                    lease["metadata"]["resourceVersion"] = next.to_string().into();
                    *current = Some(lease.clone());
                    (StatusCode::OK, lease)
                });
                let (status, body) = work.await.expect("the handler does not panic");
                let resp = Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&body).unwrap_or_default()))
                    .expect("a valid response");
                Ok::<_, std::convert::Infallible>(resp)
            }
        });
        kube::Client::new(svc, "kube-system")
    }

    /// Regression: with a short Lease (6 s / 4 s / 1 s) each renewal was cut
    /// off after one retry period. An API server answering in 0.8 s a
    /// request (a renewal is a read and a write) never renewed in time; the
    /// write of a renewal given up still landed, so the next one conflicted
    /// with it, and a conflict was taken for another holder: the leader
    /// exited although nobody else wanted the Lease.
    #[tokio::test(start_paused = true)]
    async fn a_leader_whose_api_server_answers_slower_than_the_retry_period_keeps_its_lease() {
        let cfg = LeaseConfig {
            namespace: "kube-system".into(),
            name: "cloud-route-controller".into(),
            identity: "a".into(),
            lease_duration: Duration::from_secs(6),
            renew_deadline: Duration::from_secs(4),
            retry_period: Duration::from_secs(1),
        };
        let fence = Fence::leased(Arc::new(TokioClock::new()));
        let (tx, rx) = watch::channel(false);
        let shutdown = CancellationToken::new();
        let election = tokio::spawn(run(
            KubeLeases::new(
                slow_lease_api(Duration::from_millis(800)),
                "kube-system",
                "cloud-route-controller",
            ),
            cfg,
            tx,
            fence.clone(),
            shutdown.clone(),
        ));
        let mut leading = rx.clone();
        tokio::time::timeout(Duration::from_secs(10), leading.wait_for(|l| *l))
            .await
            .expect("acquired")
            .unwrap();
        let mut lost = rx.clone();
        let held = tokio::time::timeout(Duration::from_secs(120), lost.wait_for(|l| !*l)).await;
        assert!(held.is_err(), "leadership lost within 2 minutes");
        assert!(!election.is_finished(), "the election is still running");
        // The binary's leadership task sets this; the deadline is the election's.
        fence.set_leader(true);
        assert!(fence.is_open(), "and renewed within its renew deadline");
        shutdown.cancel();
        assert!(matches!(election.await.unwrap(), Ok(())));
    }
}
