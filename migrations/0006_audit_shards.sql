-- The directory of audit shards (ADR 0016): one row per existing AuditShard object,
-- i.e. per (project, time bucket) that holds rows. Written INSERT OR IGNORE by the
-- audit writer at most once per shard per isolate; read by /audit and /stats to visit
-- only shards that exist, and by retention to drop whole buckets. The rows themselves
-- live in the objects. `audit_log` (0001) is no longer written: it is read as the
-- oldest, legacy source until retention has emptied it.
CREATE TABLE IF NOT EXISTS audit_shards (
  project TEXT NOT NULL,
  start_ms INTEGER NOT NULL,
  end_ms INTEGER NOT NULL,
  created_at INTEGER NOT NULL,
  PRIMARY KEY (project, start_ms)
);
-- The operator's cross-project view (per bucket, newest first) and retention (by end).
CREATE INDEX IF NOT EXISTS audit_shards_start ON audit_shards (start_ms DESC);
CREATE INDEX IF NOT EXISTS audit_shards_end ON audit_shards (end_ms);
