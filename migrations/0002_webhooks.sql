-- Webhook subscriptions, published events, deliveries and their attempts (docs/webhooks.md).
CREATE TABLE IF NOT EXISTS subscriptions (
  id TEXT PRIMARY KEY,
  project TEXT NOT NULL,
  url TEXT NOT NULL,
  events TEXT NOT NULL,               -- JSON array of filters ("*", "payment.succeeded", "payment.*")
  description TEXT,
  secret TEXT NOT NULL,               -- whsec_…; signs every delivery
  previous_secret TEXT,               -- after a rotation, keeps signing until previous_secret_until
  previous_secret_until INTEGER,
  created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS subscriptions_project ON subscriptions (project, created_at DESC, id DESC);

CREATE TABLE IF NOT EXISTS events (
  project TEXT NOT NULL,
  id TEXT NOT NULL,
  type TEXT NOT NULL,
  payload TEXT NOT NULL,              -- the exact body delivered ({id, type, timestamp, data})
  created_at INTEGER NOT NULL,
  PRIMARY KEY (project, id)
);
CREATE INDEX IF NOT EXISTS events_created ON events (created_at);

CREATE TABLE IF NOT EXISTS deliveries (
  id TEXT PRIMARY KEY,
  project TEXT NOT NULL,
  event_id TEXT NOT NULL,
  event_type TEXT NOT NULL,
  subscription_id TEXT NOT NULL,
  url TEXT NOT NULL,
  status TEXT NOT NULL,               -- pending | delivered | failed | dead_letter
  attempts_made INTEGER NOT NULL DEFAULT 0,
  next_attempt_at INTEGER,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS deliveries_project ON deliveries (project, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS deliveries_created ON deliveries (created_at);

CREATE TABLE IF NOT EXISTS attempts (
  delivery_id TEXT NOT NULL,
  request_id TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  url TEXT NOT NULL,
  status_code INTEGER,
  error TEXT,
  response_excerpt TEXT,
  duration_ms INTEGER NOT NULL,
  at INTEGER NOT NULL,
  next_retry_at INTEGER,
  PRIMARY KEY (delivery_id, request_id)
);
