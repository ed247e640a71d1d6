-- Which API key created each webhook subscription, and whether that key was revoked
-- (issue 15, ADR 0015). A table of its own rather than new columns on `subscriptions`:
-- CREATE … IF NOT EXISTS keeps the migration re-runnable, and the subscription schema of
-- other work is left alone. A subscription with key_revoked_at set receives nothing:
-- publishing creates no deliveries for it, the consumer and the cron re-queue skip it.
CREATE TABLE IF NOT EXISTS subscription_owners (
  subscription_id TEXT PRIMARY KEY,
  key_id TEXT NOT NULL,
  key_revoked_at INTEGER            -- epoch ms when the creating key was revoked; NULL = live
);
CREATE INDEX IF NOT EXISTS subscription_owners_key ON subscription_owners (key_id);
