//! Every change of some Nodes' `NetworkUnavailable` condition, read all
//! through a test: "no routed Node was ever `True`" needs the whole history,
//! not the state at the end.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::ListParams;

/// How often the Nodes are listed.
pub const POLL: Duration = Duration::from_millis(200);

/// One change of a Node's condition, as read.
#[derive(Debug, Clone)]
pub struct Seen {
    pub node: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

/// Lists the Nodes every [`POLL`] until dropped and keeps every change of
/// the named Nodes' conditions (status and reason; the message of each).
pub struct Watcher {
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Watcher {
    pub fn start(nodes: kube::Api<Node>, names: Vec<String>) -> Watcher {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let out = seen.clone();
        let task = tokio::spawn(async move {
            let mut last: HashMap<String, (String, String)> = HashMap::new();
            loop {
                if let Ok(list) = nodes.list(&ListParams::default()).await {
                    for node in &list.items {
                        let name = node.metadata.name.clone().unwrap_or_default();
                        if !names.contains(&name) {
                            continue;
                        }
                        let (status, reason, message) =
                            test_cluster::condition(node, test_cluster::NETWORK_UNAVAILABLE)
                                .map(|c| {
                                    (
                                        c.status.clone(),
                                        c.reason.clone().unwrap_or_default(),
                                        c.message.clone().unwrap_or_default(),
                                    )
                                })
                                .unwrap_or_default();
                        let now = (status.clone(), reason.clone());
                        if last.get(&name) != Some(&now) {
                            last.insert(name.clone(), now);
                            out.lock().unwrap_or_else(|e| e.into_inner()).push(Seen {
                                node: name,
                                status,
                                reason,
                                message,
                            });
                        }
                    }
                }
                tokio::time::sleep(POLL).await;
            }
        });
        Watcher { seen, task }
    }

    /// Every change read so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The conditions `node` was read with (`status/reason`), in order,
    /// each change once.
    pub fn reasons_of(&self, node: &str) -> Vec<String> {
        self.seen()
            .into_iter()
            .filter(|s| s.node == node)
            .map(|s| format!("{}/{}", s.status, s.reason))
            .collect()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}
