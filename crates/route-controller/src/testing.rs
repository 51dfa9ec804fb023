//! The controller fixture the tests share (feature `testing`): a
//! configuration to start from, a Node cache as the watcher leaves it after
//! its first list, a recording status writer, an open fence, and the loop
//! running on a cloud of the test's choosing. Never enabled by the released
//! binary; dependents enable it from dev-dependencies only.
//!
//! A test that needs something else says so by overriding a field of
//! [`Fixture`] (its `config` most often) before it starts the controller,
//! so what the test deliberately changes stays written in the test.

use std::sync::Arc;
use std::time::Duration;

use route_cloud::CloudRoutes;
use route_core::{NodeView, PlanConfig, parse_cluster_cidrs};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::schedule::DEFAULT_DISCOVERY_PERIOD;
use crate::{
    BackoffConfig, Controller, ControllerConfig, Fence, Mode, NodeEvent, NodeStore, PassReport,
    RecordingStatusWriter, StatusWriter, Timing,
};

/// The cluster name of [`config`].
pub const CLUSTER: &str = "kubernetes";

/// The configuration the tests start from, in `mode`: cluster [`CLUSTER`]
/// with pod CIDRs in 10.244.0.0/16; a 10 s period and spacing; a resync
/// every 12 h and no drift check, so neither runs unless a test asks for
/// it; the production target discovery period; backoff without jitter, so
/// retries land at the instants a test waits for; no deletion grace, so a
/// deleted Node's routes go in the next pass.
pub fn config(mode: Mode) -> ControllerConfig {
    ControllerConfig {
        cluster_name: CLUSTER.into(),
        plan: PlanConfig {
            cluster_cidrs: parse_cluster_cidrs("10.244.0.0/16")
                .expect("the fixture's cluster CIDR is valid"),
            ..PlanConfig::default()
        },
        mode,
        timing: Timing {
            period: Duration::from_secs(10),
            min_interval: Duration::from_secs(10),
            resync: Duration::from_secs(12 * 3600),
            discovery: DEFAULT_DISCOVERY_PERIOD,
            drift: Duration::ZERO,
        },
        backoff: BackoffConfig {
            jitter: 0.0,
            ..BackoffConfig::default()
        },
        status_concurrency: 10,
        deletion_grace: Duration::ZERO,
        bounds: crate::bounds::Bounds::NONE,
    }
}

/// A Node cache as the watcher leaves it after its first list found
/// `initial`: synced, so the first pass runs at once.
pub fn synced_store(initial: &[NodeView]) -> Arc<NodeStore> {
    let nodes = NodeStore::new(None);
    nodes.apply(NodeEvent::Init);
    for n in initial {
        nodes.apply(NodeEvent::InitApply(n.clone()));
    }
    nodes.apply(NodeEvent::InitDone);
    nodes
}

/// What a controller under test is built from. Fields are public so a test
/// overrides what it needs between [`Fixture::new`] and starting.
pub struct Fixture {
    /// Starts as [`config`].
    pub config: ControllerConfig,
    /// Starts as [`synced_store`] of the initial Nodes.
    pub nodes: Arc<NodeStore>,
    /// Where the controller's conditions and Warnings land, unless a test
    /// hands it another writer.
    pub status: Arc<RecordingStatusWriter>,
    /// Starts open for the life of the process (no election).
    pub fence: Fence,
}

impl Fixture {
    /// The fixture for a controller in `mode` whose cache holds `initial`.
    pub fn new(mode: Mode, initial: &[NodeView]) -> Self {
        Self {
            config: config(mode),
            nodes: synced_store(initial),
            status: Arc::new(RecordingStatusWriter::default()),
            fence: Fence::default(),
        }
    }

    /// A controller over `cloud` writing to [`Fixture::status`], not
    /// running: for a test that drives passes itself.
    pub fn controller(&self, cloud: Arc<dyn CloudRoutes>) -> Controller {
        self.controller_writing_to(cloud, self.status.clone())
    }

    /// A controller over `cloud` writing to `status`, not running.
    pub fn controller_writing_to(
        &self,
        cloud: Arc<dyn CloudRoutes>,
        status: Arc<dyn StatusWriter>,
    ) -> Controller {
        Controller::new(
            self.config.clone(),
            self.nodes.clone(),
            cloud,
            status,
            self.fence.clone(),
            None,
        )
    }

    /// The controller's loop over `cloud`, told it leads, writing to
    /// [`Fixture::status`].
    pub fn start(self, cloud: Arc<dyn CloudRoutes>) -> Running {
        let status = self.status.clone();
        self.start_writing_to(cloud, status)
    }

    /// The controller's loop over `cloud`, told it leads, writing to
    /// `status`.
    pub fn start_writing_to(
        self,
        cloud: Arc<dyn CloudRoutes>,
        status: Arc<dyn StatusWriter>,
    ) -> Running {
        let (tx, reports) = mpsc::unbounded_channel();
        let (leader, leader_rx) = watch::channel(true);
        let shutdown = CancellationToken::new();
        let ctl = self.controller_writing_to(cloud, status).with_reports(tx);
        let task = tokio::spawn(ctl.run(leader_rx, shutdown.clone()));
        Running {
            nodes: self.nodes,
            status: self.status,
            fence: self.fence,
            reports,
            shutdown,
            task,
            _leader: leader,
        }
    }
}

/// A running controller loop; dropping it shuts the loop down.
pub struct Running {
    /// The cache the loop reads; apply Node events here as the watcher would.
    pub nodes: Arc<NodeStore>,
    /// The fixture's recording writer.
    pub status: Arc<RecordingStatusWriter>,
    /// The loop's fence.
    pub fence: Fence,
    /// One report per pass, in pass order.
    pub reports: mpsc::UnboundedReceiver<PassReport>,
    /// Cancelled on drop; cancel it to stop the loop early.
    pub shutdown: CancellationToken,
    task: JoinHandle<()>,
    // Held so the loop keeps being told it leads.
    _leader: watch::Sender<bool>,
}

impl Running {
    /// The reports of the passes finished since the last call.
    pub fn passes(&mut self) -> Vec<PassReport> {
        let mut v = Vec::new();
        while let Ok(r) = self.reports.try_recv() {
            v.push(r);
        }
        v
    }

    /// Stops the loop and waits until it has returned.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        let _ = (&mut self.task).await;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
