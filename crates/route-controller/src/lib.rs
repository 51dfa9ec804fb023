//! The reconcile engine.
