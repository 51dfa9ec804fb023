//! The simulated `memory` cloud as a separate process.
//!
//! [`provider_memory::MemoryCloud`] lives inside one process; leader
//! election between two controller processes, a controller killed between a
//! route creation and its status patch, and the demo and benchmark reading
//! the route table from outside all need a cloud that outlives and is shared
//! by controller processes. This crate provides it:
//!
//! - [`server`]: an HTTP/JSON server owning one `MemoryCloud` (the `cloud-sim`
//!   binary runs it);
//! - [`client::RemoteMemoryCloud`]: a [`route_cloud::CloudRoutes`] provider
//!   that talks to it, classifying answers into the same `CloudError`s the
//!   in-process cloud gives;
//! - [`admin::AdminClient`]: the route tables, counters, call log, faults and
//!   behind-the-back edits, for tests, the demo and the benchmark;
//! - [`wire`]: the JSON shapes both ends share;
//! - [`process::SimProcess`] and [`parent`]: running the binary as a child
//!   that dies with its parent;
//! - [`PROVIDER`]: `--cloud-provider memory`, in process or remote by its
//!   `--cloud-config`, for the binary's registry.

pub mod admin;
pub mod client;
pub mod config;
mod entry;
pub mod parent;
pub mod process;
pub mod server;
pub mod wire;

pub use admin::{AdminClient, AdminError};
pub use client::{RemoteConfig, RemoteConfigError, RemoteMemoryCloud};
pub use entry::PROVIDER;
pub use server::{ServeError, SimServer};
