-- One row per request that reached postguard (docs/audit-log.md). No bodies, query
-- strings, secrets or full API keys. Idempotent so test harnesses can re-apply it.
CREATE TABLE IF NOT EXISTS audit_log (
  request_id TEXT PRIMARY KEY,
  time INTEGER NOT NULL,
  method TEXT NOT NULL,
  path TEXT NOT NULL,
  status INTEGER NOT NULL,
  response_bytes INTEGER,
  response_time_ms INTEGER NOT NULL,
  client_ip TEXT,
  user_agent TEXT,
  key_prefix TEXT,
  project TEXT,
  idempotency_key TEXT,
  replayed INTEGER NOT NULL DEFAULT 0,
  rate_limit_remaining INTEGER
);
-- Newest-first listing, per project and overall; retention scans by time.
CREATE INDEX IF NOT EXISTS audit_project_time ON audit_log (project, time DESC, request_id DESC);
CREATE INDEX IF NOT EXISTS audit_time ON audit_log (time DESC, request_id DESC);
CREATE INDEX IF NOT EXISTS audit_project_idem ON audit_log (project, idempotency_key);
