//! Liveness and readiness, shared by the HTTP server and the tasks it reports on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use route_controller::{Fence, NodeStore};

/// Set by the tasks, read by `/healthz` and `/readyz`.
pub struct Health {
    pub nodes: Arc<NodeStore>,
    /// The reconcile loop finished its first full pass as leader.
    pub first_sync: Arc<AtomicBool>,
    /// Leadership, as the executor sees it.
    pub leader: Fence,
    /// A task that must run for the process to be useful has stopped.
    pub task_died: AtomicBool,
}

impl Health {
    pub fn new(nodes: Arc<NodeStore>, first_sync: Arc<AtomicBool>, leader: Fence) -> Arc<Self> {
        Arc::new(Self {
            nodes,
            first_sync,
            leader,
            task_died: AtomicBool::new(false),
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

    /// The node cache is synced and, on the leader, the first full sync is done.
    pub fn ready(&self) -> Result<(), &'static str> {
        self.live()?;
        if !self.nodes.is_synced() {
            return Err("node cache not synced");
        }
        if self.leader.is_leader() && !self.first_sync.load(Ordering::SeqCst) {
            return Err("leader has not finished its first full sync");
        }
        Ok(())
    }
}
