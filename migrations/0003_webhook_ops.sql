-- Operating webhooks (docs/operating-webhooks.md, ADR 0014). New tables only, no ALTER TABLE:
-- every statement is idempotent (IF NOT EXISTS), so applying the file again on a
-- database that has it (the test harness re-applies migrations on restart) is a no-op.

-- One row per subscription that was ever paused, disabled, throttled or failing;
-- no row = active, unthrottled, healthy.
CREATE TABLE IF NOT EXISTS subscription_ops (
  subscription_id TEXT PRIMARY KEY,
  project TEXT NOT NULL,
  state TEXT NOT NULL DEFAULT 'active', -- active | paused | disabled
  disabled_reason TEXT,                 -- endpoint_gone | failing
  disabled_at INTEGER,
  failing_since INTEGER,                -- first failure after the last success
  rate_limit_per_s INTEGER,             -- NULL = no limit
  next_send_at INTEGER                  -- throttle: when the next reserved slot begins
);

-- The X-Request-Id of the publish request that created an event (trace).
CREATE TABLE IF NOT EXISTS event_requests (
  project TEXT NOT NULL,
  event_id TEXT NOT NULL,
  request_id TEXT NOT NULL,
  PRIMARY KEY (project, event_id)
);
CREATE INDEX IF NOT EXISTS events_project_created ON events (project, created_at, id);
CREATE INDEX IF NOT EXISTS deliveries_subscription ON deliveries (subscription_id, status, created_at, id);

-- Background tasks (bulk recover), resumable from their cursor.
CREATE TABLE IF NOT EXISTS tasks (
  id TEXT PRIMARY KEY,
  project TEXT NOT NULL,
  kind TEXT NOT NULL,                   -- recover
  state TEXT NOT NULL,                  -- queued | running | done | failed
  subscription_id TEXT NOT NULL,
  since INTEGER NOT NULL,
  until INTEGER,
  total INTEGER NOT NULL DEFAULT 0,
  done INTEGER NOT NULL DEFAULT 0,
  failed INTEGER NOT NULL DEFAULT 0,
  cursor_at INTEGER,                    -- the last delivery handled: (created_at, id)
  cursor_id TEXT,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
);

-- Inspectors: capture URLs on the gateway, and what they received.
CREATE TABLE IF NOT EXISTS inspectors (
  id TEXT PRIMARY KEY,
  project TEXT NOT NULL,
  token TEXT NOT NULL UNIQUE,
  expires_at INTEGER NOT NULL,
  created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS inspector_requests (
  inspector_id TEXT NOT NULL,
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  at INTEGER NOT NULL,
  method TEXT NOT NULL,
  headers TEXT NOT NULL,                -- JSON object
  body TEXT NOT NULL,
  signature_valid INTEGER               -- 1, 0, or NULL without a webhook-signature
);
CREATE INDEX IF NOT EXISTS inspector_requests_by ON inspector_requests (inspector_id, seq);
