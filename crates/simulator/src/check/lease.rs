//! The `slow_lease_api` class: the binary's own election
//! ([`route_controller::leader::run`]) against a Lease store that answers
//! as slowly as the case says, as an API server busy with the leader's own
//! condition burst after a pause does. A write is applied even when the
//! election gave up waiting for its answer (the server cannot know), so a
//! renewal cut off early makes the next one conflict with it.
//!
//! The invariant: a replica whose every Lease request is answered within a
//! quarter of the renew deadline keeps its Lease. A renewal is a read and a
//! write, and the next one may start only once it is answered, so two of
//! them fit into the renew deadline that runs from the last successful
//! renewal's send; nobody else wants the Lease.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use route_cloud::{Fence, TokioClock};
use route_controller::leader::{self, LeaseConfig, LeaseStore, StoreError};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD};

/// The latency outside the class's windows.
pub const BASE_LATENCY_MS: u64 = 20;

/// The slowest answer a window may give: below a quarter of the renew
/// deadline (see the module docs).
pub const MAX_LATENCY_MS: u64 = RENEW_DEADLINE.as_millis() as u64 / 4 - 100;

/// A Lease held in memory, each request taking the current latency.
#[derive(Clone)]
pub struct SlowLeases {
    lease: Arc<Mutex<Option<Lease>>>,
    latency_ms: Arc<AtomicU64>,
}

impl SlowLeases {
    /// An empty store whose answers take `latency_ms` (set by the driver).
    pub fn new(latency_ms: Arc<AtomicU64>) -> Self {
        Self {
            lease: Arc::default(),
            latency_ms,
        }
    }

    async fn answer<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Option<Lease>) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let latency = Duration::from_millis(self.latency_ms.load(Ordering::SeqCst));
        let lease = self.lease.clone();
        // Spawned: the write lands whether or not the caller still waits.
        tokio::spawn(async move {
            tokio::time::sleep(latency).await;
            let mut l = lease.lock().unwrap_or_else(|p| p.into_inner());
            work(&mut l)
        })
        .await
        .unwrap_or_else(|e| Err(StoreError::Other(e.to_string())))
    }
}

fn version(l: &Lease) -> u64 {
    l.metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl LeaseStore for SlowLeases {
    async fn get(&self) -> Result<Option<Lease>, StoreError> {
        self.answer(|l| Ok(l.clone())).await
    }

    async fn create(&self, lease: &Lease) -> Result<Lease, StoreError> {
        let mut new = lease.clone();
        self.answer(move |l| {
            if l.is_some() {
                return Err(StoreError::Conflict);
            }
            new.metadata.resource_version = Some("1".into());
            *l = Some(new.clone());
            Ok(new)
        })
        .await
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease, StoreError> {
        let mut new = lease.clone();
        self.answer(move |l| {
            let Some(current) = l.as_ref() else {
                return Err(StoreError::Other("not found".into()));
            };
            if version(&new) != version(current) {
                return Err(StoreError::Conflict);
            }
            new.metadata.resource_version = Some((version(current) + 1).to_string());
            *l = Some(new.clone());
            Ok(new)
        })
        .await
    }
}

/// What the election did in a run.
#[derive(Debug, Default)]
pub struct Election {
    /// Leadership was won at least once.
    pub won: AtomicBool,
    /// When and why leadership ended, if it did (the election's own words).
    pub lost: Mutex<Option<(tokio::time::Instant, String)>>,
}

/// Starts the binary's election as the sole candidate, with the checked
/// replica's Lease settings, against `store`; `shutdown` ends it.
pub fn start(store: SlowLeases, shutdown: CancellationToken) -> Arc<Election> {
    let cfg = LeaseConfig {
        namespace: "kube-system".into(),
        name: "cloud-route-controller".into(),
        identity: "checked".into(),
        lease_duration: LEASE_DURATION,
        renew_deadline: RENEW_DEADLINE,
        retry_period: RETRY_PERIOD,
    };
    let fence = Fence::leased(Arc::new(TokioClock::new()));
    let (tx, mut rx) = watch::channel(false);
    let election = Arc::new(Election::default());
    let seen = election.clone();
    tokio::spawn(async move {
        let run = tokio::spawn(leader::run(store, cfg, tx, fence, shutdown.clone()));
        loop {
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let leading = *rx.borrow_and_update();
                    if leading {
                        seen.won.store(true, Ordering::SeqCst);
                    } else if seen.won.load(Ordering::SeqCst) && !shutdown.is_cancelled() {
                        let mut lost = seen.lost.lock().unwrap_or_else(|p| p.into_inner());
                        lost.get_or_insert((tokio::time::Instant::now(), "leadership ended".into()));
                    }
                }
                () = shutdown.cancelled() => break,
            }
        }
        if let Ok(Err(e)) = run.await {
            let mut lost = seen.lost.lock().unwrap_or_else(|p| p.into_inner());
            let at = lost
                .as_ref()
                .map_or_else(tokio::time::Instant::now, |l| l.0);
            *lost = Some((at, e.to_string()));
        }
    });
    election
}
