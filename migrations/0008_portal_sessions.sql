-- Portal sessions (docs/dashboard-and-portal.md; issue 23): a registry the operator lists and ends
-- sessions by, written when a portal link is exchanged and when sessions end. Never read
-- on a session's requests: each session's own object (a KeyGuard named `ses:<id>`)
-- charges its budget and holds its ended flag. Idempotent statements only (the test
-- harness re-applies migrations).
CREATE TABLE IF NOT EXISTS portal_sessions (
  id TEXT PRIMARY KEY,                  -- ses_…
  project TEXT NOT NULL,
  plan TEXT NOT NULL,                   -- the budget it is charged from
  created_at INTEGER NOT NULL,
  expires_at INTEGER NOT NULL,
  ended_at INTEGER                      -- ended by the operator, or with the project's last key
);
CREATE INDEX IF NOT EXISTS portal_sessions_project ON portal_sessions (project, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS portal_sessions_expires ON portal_sessions (expires_at);

-- When the operator last ended all of a project's sessions: a link issued before it can
-- no longer be exchanged (the exchange's insert checks it in the same transaction).
CREATE TABLE IF NOT EXISTS portal_cutoffs (
  project TEXT PRIMARY KEY,
  ended_at INTEGER NOT NULL
);
