-- Receivers that say how fast (issue 36, docs/webhooks.md "Receivers that say how fast"): the
-- limit a subscription's receiver last advertised (RateLimit, X-RateLimit-*), read by the
-- delivery consumer with the batch's subscriptions and shown as `receiver_limit` on
-- GET /webhooks/{id}. A row is dropped once its reset has passed (or left: a past reset means
-- nothing). New table only, every statement idempotent (the test harness re-applies migrations).
CREATE TABLE IF NOT EXISTS receiver_limits (
  subscription_id TEXT PRIMARY KEY,
  remaining INTEGER NOT NULL,           -- requests the receiver said were left
  reset_at INTEGER NOT NULL,            -- epoch ms when its window resets
  updated_at INTEGER NOT NULL
);
