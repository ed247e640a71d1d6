//! Binding and variable names, as declared in `wrangler.toml`, and the one
//! way a binding is held for the isolate ([`per_isolate`]).

use std::cell::RefCell;
use std::thread::LocalKey;

/// Reads a binding once per isolate: a binding (a namespace, a bucket) is not
/// an I/O object of the request that read it (a stub is, and is made per
/// call), so later requests reuse it instead of looking it up by name and
/// checking its type again (ADR 0029). Only a successful read is kept.
pub fn per_isolate<T: Clone, E>(
    slot: &'static LocalKey<RefCell<Option<T>>>,
    read: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    if let Some(known) = slot.with(|s| s.borrow().clone()) {
        return Ok(known);
    }
    let found = read()?;
    slot.with(|s| *s.borrow_mut() = Some(found.clone()));
    Ok(found)
}

/// Durable Object namespace: one `KeyGuard` per API key.
pub const KEY_GUARD: &str = "KEY_GUARD";
/// Durable Object namespace: one `AuditShard` per (project, time bucket).
pub const AUDIT: &str = "AUDIT";
/// Durable Object namespace: one `WebhookShard` per (project, time bucket) (ADR 0035).
pub const WEBHOOKS: &str = "WEBHOOKS";
/// Durable Object namespace: one `ProjectHub` per project (ADR 0046).
pub const PROJECTS: &str = "PROJECTS";
/// KV namespace holding API keys by hash.
pub const API_KEYS: &str = "API_KEYS";

pub const ORIGIN_URL: &str = "ORIGIN_URL";
pub const POSTGUARD_CONFIG: &str = "POSTGUARD_CONFIG";
/// Workers Analytics Engine dataset of request and delivery data points.
pub const METRICS: &str = "METRICS";
pub const ADMIN_TOKEN: &str = "ADMIN_TOKEN";
pub const ORIGIN_TOKEN: &str = "ORIGIN_TOKEN";
pub const ORIGIN_SIGNING_SECRET: &str = "ORIGIN_SIGNING_SECRET";
/// D1 database: the audit and webhook shard directories, subscriptions, tasks, inspectors,
/// and the legacy webhook rows read until retention empties them (schema in `migrations/`).
pub const DB: &str = "DB";
/// Queue carrying webhook delivery attempts, and its dead-letter queue.
pub const DELIVERIES: &str = "DELIVERIES";
pub const DELIVERIES_DLQ: &str = "postguard-deliveries-dlq";
/// Queue carrying asynchronous operations to run (one message per attempt to
/// start; the key's object hands it on again when a message is lost, ADR 0037).
pub const OPERATIONS: &str = "OPERATIONS";
pub const OPERATIONS_QUEUE: &str = "postguard-operations";
/// R2 bucket: response bodies replayed under an Idempotency-Key that do not fit the object.
pub const REPLAYS: &str = "REPLAYS";
/// R2 bucket: the compliance archive and exports (ADR 0038).
pub const ARCHIVE: &str = "ARCHIVE";
/// Static assets (`[assets]`): the dashboard, and the API document the worker serves itself (ADR 0030).
pub const ASSETS: &str = "ASSETS";
