//! The call log: what the simulated server was asked, by whom, and when.
//!
//! Owns [`CallRecord`] and the log itself (`CallLog`, kept under the cloud's
//! lock by `state`). `provider` appends one entry per call as the server
//! acts on it; tests read it through [`MemoryCloud::log`] to check the order
//! and the callers of calls (e.g. that a fenced replica sent nothing). Below
//! `state` and `provider`: the links to [`MemoryCloud`] here are
//! documentation, not a dependency.
//!
//! [`MemoryCloud`]: crate::MemoryCloud
//! [`MemoryCloud::log`]: crate::MemoryCloud::log

use std::sync::Arc;

use route_cloud::ErrorKind;
use route_core::{Destination, Route};
use tokio::time::Instant;

use crate::config::Operation;

/// One entry of the call log. Batches log one [`Operation::Batch`] entry and
/// then one entry per change inside them (with `batch` set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRecord {
    /// Position in the log, from 0 (restarts after
    /// [`MemoryCloud::clear_log`](crate::MemoryCloud::clear_log)).
    pub seq: u64,
    /// When the simulated server acted on the call (after its latency).
    pub at: Instant,
    /// The tag of the handle that made the call (see
    /// [`MemoryCloud::with_caller`](crate::MemoryCloud::with_caller)).
    pub caller: Arc<str>,
    /// The cluster name passed.
    pub cluster: String,
    /// What was called.
    pub op: Operation,
    /// The route's target node (creations and deletions).
    pub node: Option<String>,
    /// The route's destination (creations and deletions).
    pub destination: Option<Destination>,
    /// The `seq` of the batch this change belongs to.
    pub batch: Option<u64>,
    /// The outcome: `Ok` or the error class answered.
    pub result: Result<(), ErrorKind>,
}

impl CallRecord {
    /// A create or delete (alone or in a batch) that changed the table.
    pub fn is_mutation(&self) -> bool {
        matches!(self.op, Operation::Create | Operation::Delete) && self.result.is_ok()
    }
}

/// The entries so far, in the order the server acted on them.
#[derive(Debug, Default)]
pub(crate) struct CallLog {
    records: Vec<CallRecord>,
}

impl CallLog {
    /// Appends one entry and returns its `seq`.
    #[allow(
        clippy::too_many_arguments,
        reason = "one field of the log entry each; a struct would only repeat them"
    )]
    pub(crate) fn push(
        &mut self,
        now: Instant,
        caller: &Arc<str>,
        cluster: &str,
        op: Operation,
        route: Option<&Route>,
        batch: Option<u64>,
        result: Result<(), ErrorKind>,
    ) -> u64 {
        let seq = self.records.len() as u64;
        self.records.push(CallRecord {
            seq,
            at: now,
            caller: Arc::clone(caller),
            cluster: cluster.to_string(),
            op,
            node: route.map(|r| r.node.to_string()),
            destination: route.map(|r| r.destination.clone()),
            batch,
            result,
        });
        seq
    }

    /// The entries so far.
    pub(crate) fn records(&self) -> &[CallRecord] {
        &self.records
    }

    /// Forgets every entry; the next one gets `seq` 0 again.
    pub(crate) fn clear(&mut self) {
        self.records.clear();
    }

    /// Sets the outcome of the entry `seq`: a batch's own entry is written
    /// before its changes run, so its result is only known afterwards.
    pub(crate) fn set_result(&mut self, seq: u64, result: Result<(), ErrorKind>) {
        if let Some(entry) = usize::try_from(seq)
            .ok()
            .and_then(|i| self.records.get_mut(i))
        {
            entry.result = result;
        }
    }
}
