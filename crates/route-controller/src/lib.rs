//! The reconcile engine of cloud-route-controller.
//!
//! Data flows one way, one module per step:
//!
//! ```text
//! watch ──► nodes ──► schedule ──► controller::pass ─────────────────────────────────────────────────► metrics
//! (kube      (cache,    (modes:      snapshot ─► plan ─► gate ──► warnings ─► execute ─► absorb ─► status
//!  watcher)   latency,   when/what)  (table:     (route   (one      (Warning    (cloud,     (retry    (conditions,
//!             triggers)              cached or    core)    verdict   Events)     throttle)   book,     Events)
//!                                    listed)               per op)                          cache)
//! ```
//!
//! Each planned operation is carried through the pass as one record, by its
//! key ([`OpRecord`]: the gate's verdict, then the executor's result);
//! absorb and status read it, and what a cloud answer means for retries,
//! the cached table, the Node's condition and Warnings is one table,
//! [`policy`].
//!
//! The decisions about *what* must exist live in `route-core`; this crate
//! decides *when* to plan, with which route table, and carries the plan out.
//! Who owns what: the [`NodeStore`] owns the Node cache and latency
//! measurements (written by the watcher, read by the loop); the
//! [`Controller`]'s task owns everything else (scheduler, retry book, holds,
//! route cache, warnings already emitted) and is the only code that calls
//! the cloud or writes to the cluster.
//!
//! Under `--dry-run` the same passes run and write nothing: one switch
//! ([`Writes`]) is read where a write would start (the executor, the status
//! step), and [`dry_run`] reports each pass's plan as what the controller
//! would change.

pub mod absorb;
pub mod bounds;
pub mod controller;
pub mod drift;
pub mod dry_run;
pub mod execute;
pub mod forwarding;
pub mod gate;
pub mod latency;
pub mod leader;
pub mod metrics;
pub mod nodes;
pub mod policy;
pub mod reference;
pub mod retry;
pub mod schedule;
pub mod select;
pub mod settings_check;
pub mod snapshot;
pub mod status;
#[cfg(feature = "testing")]
pub mod testing;
pub mod throttle;
pub mod warnings;
pub mod watch;

pub use controller::{Controller, ControllerConfig, DEFAULT_DELETION_GRACE, PassReport};
pub use dry_run::{DryRunOp, DryRunReport};
pub use execute::{Fence, OpRecord, OpRecords, OpResult, Writes};
pub use metrics::{Metrics, MetricsHandle};
pub use nodes::{NodeEvent, NodeRef, NodeStore, node_view};
pub use retry::BackoffConfig;
pub use schedule::{Mode, PassKind, SyncTrigger, Timing, pick_resync};
pub use settings_check::ConfigAlarm;
pub use status::{KubeStatusWriter, RecordingStatusWriter, StatusError, StatusWriter};
pub use warnings::{Reason, Warning};
