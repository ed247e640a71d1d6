-- What each inspector's capture URL took from its (unauthenticated) senders in the
-- current minute and UTC day (issue 23; `webhooks::capture` decides): a budget of its
-- own, so captures never touch the project's webhook quotas. Written compare-and-set
-- with each capture; deleted with its inspector. Idempotent (re-applied by the tests).
CREATE TABLE IF NOT EXISTS inspector_usage (
  inspector_id TEXT PRIMARY KEY,
  minute INTEGER NOT NULL,
  minute_count INTEGER NOT NULL,
  minute_bytes INTEGER NOT NULL,
  day INTEGER NOT NULL,
  day_count INTEGER NOT NULL,
  day_bytes INTEGER NOT NULL
);
