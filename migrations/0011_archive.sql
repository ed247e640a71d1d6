-- The compliance archive's exports and the operational alerts (issue 27, ADR 0038).
-- New tables only, every statement idempotent (the test harness re-applies migrations).

-- One row per export (POST /_postguard/v1/exports): its range, state and, once done, the
-- object it wrote to the ARCHIVE bucket (exports/<id>.ndjson.gz). Rows and objects older
-- than 7 days are deleted by the daily job.
CREATE TABLE IF NOT EXISTS exports (
  id TEXT PRIMARY KEY,
  project TEXT NOT NULL,
  kind TEXT NOT NULL,                   -- audit | deliveries
  since INTEGER NOT NULL,               -- epoch ms, inclusive
  until INTEGER NOT NULL,               -- epoch ms, exclusive
  state TEXT NOT NULL,                  -- queued | running | done | failed
  rows INTEGER,
  bytes INTEGER,                        -- the gzip object's size
  sha256 TEXT,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS exports_created ON exports (created_at);

-- When each alert condition was last published: at most one alert per condition and
-- alerts.period_s (a compare-and-set on fired_at).
CREATE TABLE IF NOT EXISTS alerts (
  condition TEXT PRIMARY KEY,
  fired_at INTEGER NOT NULL
);
