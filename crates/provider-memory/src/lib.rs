//! The simulated cloud (`--cloud-provider memory`).
//!
//! [`MemoryCloud`] keeps one route table per cluster name in memory and behaves
//! like a cloud API with the knobs a test, the simulator or a demo needs:
//! per-call latency, a server-side rate limit that answers `Throttled` with a
//! retry-after, a route quota, IPv6 on or off, batches on or off, and fault
//! injection (random errors, "fail the next N calls", timeouts that still take
//! effect, routes that vanish or appear behind the controller's back, and lists
//! that lag behind creations).
//!
//! Ownership: this crate owns the simulated table and its call log; the
//! interface it implements ([`route_cloud::CloudRoutes`]), the error classes
//! and the request counters belong to `route-cloud`. The controller only sees
//! the trait; tests keep a second handle (handles are cheap clones sharing
//! one table) and read [`MemoryCloud::log`], the
//! [`route_cloud::RequestStats`] and the table directly.
//!
//! The modules follow the simulated server's seams and form layers; a module
//! uses only the ones listed before it, so none refers back to a layer above:
//!
//! - `config`: [`MemoryConfig`], what the cloud is told to be, and
//!   [`Operation`]; uses no other module;
//! - `log`: the call log ([`CallRecord`]); uses `config`;
//! - `faults`: pending and random failures and the throttling storm; uses
//!   `config`;
//! - `state`: the tables, the server-side budget, the log and the faults
//!   behind the one lock, and the changes behind the controller's back; uses
//!   `config`, `log` and `faults`;
//! - `provider`: [`MemoryCloud`], every control it offers (all its `impl`
//!   blocks live here) and its [`route_cloud::CloudRoutes`] impl; uses all
//!   of the above.
//!
//! A control a test needs goes on [`MemoryCloud`] in `provider`, with the
//! work it does in the lowest layer that owns the data; `log` and `faults`
//! stay independent of each other and of the tables.
//!
//! Unlike the fake cloud of the upstream route controller, an injected error
//! is never sticky: it fails the calls it was meant for and nothing after them.

mod config;
mod faults;
mod log;
mod provider;
mod state;

pub use config::{
    ErrorRate, ErrorRates, LatencyConfig, MemoryConfig, MemoryConfigError, Operation,
    RateLimitConfig,
};
pub use log::CallRecord;
pub use provider::MemoryCloud;

#[cfg(test)]
mod tests;
