//! Fuzz target bodies, shared by the cargo-fuzz binaries in `fuzz_targets/`
//! and the corpus replay test of the main workspace.
#![forbid(unsafe_code)]

pub mod targets;
