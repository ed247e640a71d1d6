//! Durable Object classes and their callers: each object loads its state,
//! asks the core to decide and persists the decision; the caller side speaks
//! the same typed protocol (`postguard_core::guard::protocol`).

pub mod audit_shard;
pub mod client;
pub mod key_guard;
pub mod webhook_shard;

/// The core's query arguments as SQLite values of an object's storage.
pub fn sql_args(args: Vec<postguard_core::audit::Arg>) -> Vec<worker::SqlStorageValue> {
    use postguard_core::audit::Arg;
    args.into_iter()
        .map(|a| match a {
            Arg::Text(s) => worker::SqlStorageValue::String(s),
            Arg::Int(i) => worker::SqlStorageValue::Integer(i),
        })
        .collect()
}
