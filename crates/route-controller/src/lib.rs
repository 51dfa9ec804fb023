//! The reconcile engine of cloud-route-controller.
//!
//! Data flows one way, one module per step:
//!
//! ```text
//! watch ──► nodes ──► schedule ──► controller (snapshot + route_core::plan) ──► execute ──► status
//! (kube      (cache,    (modes:      (one task owns the loop state)              (cloud,      (conditions,
//!  watcher)   triggers)  when/what)                                               retries)     events)
//! ```
//!
//! The decisions about *what* must exist live in `route-core`; this crate
//! decides *when* to plan, with which route table, and carries the plan out.

pub mod controller;
pub mod execute;
pub mod hold;
pub mod metrics;
pub mod nodes;
pub mod retry;
pub mod schedule;
pub mod status;
pub mod throttle;
pub mod watch;

pub use controller::{Controller, ControllerConfig, NodeStore, PassReport};
pub use execute::{Fence, OpResult, Outcome};
pub use metrics::Metrics;
pub use nodes::{NodeEvent, node_view};
pub use retry::BackoffConfig;
pub use schedule::{Mode, PassKind, SyncTrigger, Timing, pick_resync};
pub use status::{KubeStatusWriter, NodeRef, RecordingStatusWriter, StatusError, StatusWriter};
