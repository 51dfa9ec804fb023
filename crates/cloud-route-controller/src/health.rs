//! Liveness and readiness, shared by the HTTP server and the tasks it reports on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use route_controller::{ConfigAlarm, Fence, NodeStore};

/// Set by the tasks, read by `/healthz` and `/readyz`.
pub struct Health {
    pub nodes: Arc<NodeStore>,
    /// The reconcile loop finished its first full pass as leader.
    pub first_sync: Arc<AtomicBool>,
    /// Leadership, as the executor sees it.
    pub leader: Fence,
    /// A task that must run for the process to be useful has stopped.
    pub task_died: AtomicBool,
    /// Raised while the settings disagree with the cluster.
    pub config: ConfigAlarm,
    /// `--configure-cloud-routes=false`: nothing runs, so nothing can be
    /// behind; ready for as long as the process is up.
    pub routes_off: bool,
}

impl Health {
    pub fn new(
        nodes: Arc<NodeStore>,
        first_sync: Arc<AtomicBool>,
        leader: Fence,
        config: ConfigAlarm,
    ) -> Arc<Self> {
        Arc::new(Self {
            nodes,
            first_sync,
            leader,
            task_died: AtomicBool::new(false),
            config,
            routes_off: false,
        })
    }

    /// The health of a process that configures no routes: live and ready.
    pub fn routes_off() -> Arc<Self> {
        Arc::new(Self {
            nodes: NodeStore::new(None),
            first_sync: Arc::new(AtomicBool::new(true)),
            leader: Fence::new(false),
            task_died: AtomicBool::new(false),
            config: ConfigAlarm::default(),
            routes_off: true,
        })
    }

    /// The process and its loops are alive.
    pub fn live(&self) -> Result<(), &'static str> {
        if self.task_died.load(Ordering::SeqCst) {
            Err("a controller task has stopped")
        } else {
            Ok(())
        }
    }

    /// The node cache is synced and, on the leader, the first full sync is
    /// done and the settings agree with the cluster. A leader holding every
    /// change for a wrong setting is not ready: a rollout that brought the
    /// setting stops there, and `kubectl get pods` shows it.
    pub fn ready(&self) -> Result<(), String> {
        self.live()?;
        if self.routes_off {
            return Ok(());
        }
        if !self.nodes.is_synced() {
            return Err("node cache not synced".into());
        }
        if self.leader.is_leader() {
            if let Some(why) = self.config.reason() {
                return Err(format!(
                    "the settings disagree with the cluster, no change is made: {why}"
                ));
            }
            if !self.first_sync.load(Ordering::SeqCst) {
                return Err("leader has not finished its first full sync".into());
            }
        }
        Ok(())
    }
}
