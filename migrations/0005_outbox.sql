-- The publish outbox (issue 10 §5): one row per delivery created by a publish,
-- written in the same transaction as the delivery; `enqueued_at` is set once its
-- first attempt was handed to the queue. A publish retried after a failed send,
-- and the every-minute sweep, enqueue the rows still unsent.
CREATE TABLE IF NOT EXISTS outbox (
  delivery_id TEXT PRIMARY KEY,
  project TEXT NOT NULL,
  event_id TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  enqueued_at INTEGER
);
CREATE INDEX IF NOT EXISTS outbox_event ON outbox (project, event_id);
CREATE INDEX IF NOT EXISTS outbox_unsent ON outbox (enqueued_at, created_at);
-- One delivery per (event, subscription): concurrent publishes of one event id
-- are told apart by this constraint (INSERT OR IGNORE), never by an error's text.
CREATE UNIQUE INDEX IF NOT EXISTS deliveries_event_subscription ON deliveries (project, event_id, subscription_id);
