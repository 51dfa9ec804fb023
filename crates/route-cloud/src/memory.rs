//! The simulated cloud.
