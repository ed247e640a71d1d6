//! Binding and variable names, as declared in `wrangler.toml`.

/// Durable Object namespace: one `KeyGuard` per API key.
pub const KEY_GUARD: &str = "KEY_GUARD";
/// Durable Object namespace: one `AuditShard` per (project, time bucket).
pub const AUDIT: &str = "AUDIT";
/// KV namespace holding API keys by hash.
pub const API_KEYS: &str = "API_KEYS";

pub const ORIGIN_URL: &str = "ORIGIN_URL";
pub const POSTGUARD_CONFIG: &str = "POSTGUARD_CONFIG";
pub const ADMIN_TOKEN: &str = "ADMIN_TOKEN";
pub const ORIGIN_TOKEN: &str = "ORIGIN_TOKEN";
pub const ORIGIN_SIGNING_SECRET: &str = "ORIGIN_SIGNING_SECRET";
/// D1 database: audit log, webhook subscriptions and deliveries (schema in `migrations/`).
pub const DB: &str = "DB";
/// Queue carrying webhook delivery attempts, and its dead-letter queue.
pub const DELIVERIES: &str = "DELIVERIES";
pub const DELIVERIES_DLQ: &str = "postguard-deliveries-dlq";
/// R2 bucket: response bodies replayed under an Idempotency-Key that do not fit the object.
pub const REPLAYS: &str = "REPLAYS";
/// Static assets (`[assets]`): the dashboard, and the API document the worker serves itself (ADR 0030).
pub const ASSETS: &str = "ASSETS";
