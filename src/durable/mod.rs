//! Durable Object classes: each loads its state, asks the core to decide,
//! and persists the decision.

pub mod key_guard;
