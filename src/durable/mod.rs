//! Durable Object classes and their callers: each object loads its state,
//! asks the core to decide and persists the decision; the caller side speaks
//! the same typed protocol (`postguard_core::guard::protocol`).

pub mod audit_shard;
pub mod client;
pub mod key_guard;
pub mod webhook_shard;
