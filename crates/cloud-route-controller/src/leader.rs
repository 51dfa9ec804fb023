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
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// Why leadership ended.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("lost leadership: could not renew the Lease {0} within the renew deadline")]
    Lost(String),
}

/// Runs the election until `shutdown`; publishes leadership on `tx` and
/// extends `fence` (a [`Fence::leased`]) on every renewal. Returns `Err` if
/// leadership, once held, was lost.
pub async fn run(
    client: kube::Client,
    cfg: LeaseConfig,
    tx: watch::Sender<bool>,
    fence: Fence,
    shutdown: CancellationToken,
) -> Result<(), LeaderError> {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
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
        let attempt = tokio::time::timeout(
            cfg.retry_period.max(Duration::from_secs(1)),
            try_acquire_or_renew(&api, &cfg, &mut observed, &mut observed_at),
        )
        .await;
        let won = matches!(attempt, Ok(Ok(true)));
        if let Ok(Err(e)) = &attempt {
            warn!(error = %e, lease = %cfg.name, "leader election request failed");
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
            if since >= cfg.renew_deadline || matches!(attempt, Ok(Ok(false))) {
                // Stop mutating first, then tell the caller to exit.
                tx.send_replace(false);
                return Err(LeaderError::Lost(format!("{}/{}", cfg.namespace, cfg.name)));
            }
        }
    }
}

type Observed = Option<(String, Option<MicroTime>, Option<i32>)>;

/// One round: returns whether this process holds the Lease after it.
async fn try_acquire_or_renew(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
    observed: &mut Observed,
    observed_at: &mut Instant,
) -> Result<bool, kube::Error> {
    let now = MicroTime(Timestamp::now());
    let secs = i32::try_from(cfg.lease_duration.as_secs()).unwrap_or(i32::MAX);
    let current = match api.get_opt(&cfg.name).await? {
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
            return match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
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
        return Ok(false);
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
    // `replace` sends metadata.resourceVersion: a concurrent writer makes it fail.
    match api.replace(&cfg.name, &PostParams::default(), &next).await {
        Ok(l) => {
            let sp = l.spec.unwrap_or_default();
            *observed = Some((
                sp.holder_identity.unwrap_or_default(),
                sp.renew_time,
                sp.lease_transitions,
            ));
            *observed_at = Instant::now();
            Ok(true)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives the Lease up on clean shutdown so another replica takes over at once.
async fn release(api: &Api<Lease>, cfg: &LeaseConfig) {
    let Ok(Some(mut l)) = api.get_opt(&cfg.name).await else {
        return;
    };
    let Some(s) = l.spec.as_mut() else { return };
    if s.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        return;
    }
    s.holder_identity = None;
    s.renew_time = Some(MicroTime(Timestamp::now()));
    s.lease_duration_seconds = Some(1);
    match api.replace(&cfg.name, &PostParams::default(), &l).await {
        Ok(_) => info!(lease = %cfg.name, "released the Lease"),
        Err(e) => warn!(error = %e, lease = %cfg.name, "could not release the Lease"),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use http::{Request, Response, StatusCode};
    use kube::client::Body;
    use provider_memory::{MemoryCloud, Operation};
    use route_cloud::{CloudRoutes, TokioClock};
    use route_controller::{
        BackoffConfig, Controller, ControllerConfig, Mode, NodeEvent, NodeStore,
        RecordingStatusWriter, Timing,
    };
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
            lease_api(stall.clone()),
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
                    discovery: route_controller::schedule::DEFAULT_DISCOVERY_PERIOD,
                },
                backoff: BackoffConfig::default(),
                status_concurrency: 4,
                deletion_grace: route_controller::controller::DEFAULT_DELETION_GRACE,
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
}
