-- Webhook records held within a proven D1 bound (issue 16, ADR 0017). New tables
-- only, every statement idempotent (the test harness re-applies migrations).

-- One row per project and UTC day (days since the epoch): what its publishes
-- stored that day. Updated in publish's own batch, read by one point lookup
-- before the next publish: the daily quotas never need a COUNT(*) scan.
-- `bytes` is what `webhooks::capacity::event_bytes` charges (payload, rows,
-- automatic attempts at their largest) plus each manual attempt.
CREATE TABLE IF NOT EXISTS webhook_usage (
  project TEXT NOT NULL,
  day INTEGER NOT NULL,
  events INTEGER NOT NULL DEFAULT 0,
  deliveries INTEGER NOT NULL DEFAULT 0,
  bytes INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (project, day)
);

-- Manual attempts (retries and redirects) queued per delivery: a compare-and-
-- increment bounds them at `webhooks.manual_attempts_per_delivery`, however
-- many requests race. Swept with its delivery (src/webhooks/retention.rs).
CREATE TABLE IF NOT EXISTS manual_attempts (
  delivery_id TEXT PRIMARY KEY,
  queued INTEGER NOT NULL,
  created_at INTEGER NOT NULL
);
