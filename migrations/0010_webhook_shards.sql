-- The directory of webhook shards (ADR 0035): one row per WebhookShard object, i.e.
-- per (project, time bucket of the event) that holds records. Written INSERT OR IGNORE
-- by the publish path at most once per shard per isolate; read by the delivery log and
-- the event feed to visit only shards that exist, by the sweeps, and by retention to drop
-- whole buckets. The records themselves live in the objects. The webhook tables of
-- 0002-0007 (events, deliveries, attempts, outbox, event_requests, manual_attempts,
-- webhook_usage) are no longer written but by moving an event into its shard: they are
-- read as the oldest, legacy source until retention has emptied them.
CREATE TABLE IF NOT EXISTS webhook_shards (
  project TEXT NOT NULL,
  start_ms INTEGER NOT NULL,
  end_ms INTEGER NOT NULL,
  created_at INTEGER NOT NULL,
  PRIMARY KEY (project, start_ms)
);
CREATE INDEX IF NOT EXISTS webhook_shards_end ON webhook_shards (end_ms);
