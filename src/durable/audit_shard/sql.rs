//! The audit shard's tables and its storage port: what the core's
//! `audit_shard::ShardStore` and the typed operations read and write, as
//! SQL. SQLite reads the batch and builds the answers' JSON itself
//! (`json_each`, `json_group_array`), so a call costs a handful of JS
//! crossings whatever its number of rows.
//!
//! Tables: `rows` (no `project` column: the shard is one project's);
//! `paths(hour, key_prefix, path)` and `latency(hour, key_prefix, ms)`
//! counters; `latency_gw` (the gateway's own calls' part of `latency`);
//! `usage(hour, project, key_prefix)` (what `/usage` and the missing keys of
//! `/stats` count). Tables and columns added after a shard was made are
//! added on its next call.

use postguard_core::audit::AuditRow;
use postguard_core::audit_shard::{Rollups, ShardStore};
use serde::Deserialize;
use worker::{Result, SqlStorage, SqlStorageValue};

/// Only the indexes the filters need: the primary key (INSERT OR IGNORE,
/// `request_id=`), newest-first paging, and `idempotency_key=`.
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS rows (
  request_id TEXT PRIMARY KEY, time INTEGER NOT NULL, method TEXT NOT NULL, path TEXT NOT NULL,
  status INTEGER NOT NULL, response_bytes INTEGER, response_time_ms INTEGER NOT NULL,
  client_ip TEXT, user_agent TEXT, key_prefix TEXT, idempotency_key TEXT,
  replayed INTEGER NOT NULL, rate_limit_remaining INTEGER);
CREATE INDEX IF NOT EXISTS rows_time ON rows (time DESC, request_id DESC);
CREATE INDEX IF NOT EXISTS rows_idem ON rows (idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE TABLE IF NOT EXISTS paths (hour INTEGER NOT NULL, key_prefix TEXT NOT NULL, path TEXT NOT NULL,
  requests INTEGER NOT NULL, errors INTEGER NOT NULL, server_errors INTEGER NOT NULL,
  PRIMARY KEY (hour, key_prefix, path)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS latency (hour INTEGER NOT NULL, key_prefix TEXT NOT NULL, ms INTEGER NOT NULL,
  n INTEGER NOT NULL, PRIMARY KEY (hour, key_prefix, ms)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS latency_gw (hour INTEGER NOT NULL, key_prefix TEXT NOT NULL, ms INTEGER NOT NULL,
  n INTEGER NOT NULL, PRIMARY KEY (hour, key_prefix, ms)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS usage (hour INTEGER NOT NULL, project TEXT NOT NULL, key_prefix TEXT NOT NULL,
  requests INTEGER NOT NULL, admitted INTEGER NOT NULL, billable INTEGER NOT NULL,
  replays INTEGER NOT NULL, refused INTEGER NOT NULL, missing_key INTEGER NOT NULL,
  PRIMARY KEY (hour, project, key_prefix)) WITHOUT ROWID;
";

/// Columns added to `rows` after shards were first made (0.4): added on a
/// shard's first call when missing; old rows read NULL.
const ADDED_COLUMNS: &[(&str, &str)] = &[("origin", "TEXT"), ("would_refuse", "TEXT")];

/// The shard's columns (an `AuditRow` without `project`).
pub const COLUMNS: &str = "request_id, time, method, path, status, response_bytes, response_time_ms, \
client_ip, user_agent, key_prefix, idempotency_key, replayed, rate_limit_remaining, origin, would_refuse";

/// A row as a JSON object (`replayed` as a boolean).
pub const ROW_JSON: &str = "json_object('request_id', request_id, 'time', time, 'method', method, \
'path', path, 'status', status, 'response_bytes', response_bytes, 'response_time_ms', response_time_ms, \
'client_ip', client_ip, 'user_agent', user_agent, 'key_prefix', key_prefix, 'project', NULL, \
'idempotency_key', idempotency_key, 'replayed', json(iif(replayed, 'true', 'false')), \
'rate_limit_remaining', rate_limit_remaining, 'origin', origin, 'would_refuse', would_refuse)";

const INSERT: &str = "INSERT OR IGNORE INTO rows (request_id, time, method, path, status, response_bytes, \
response_time_ms, client_ip, user_agent, key_prefix, idempotency_key, replayed, rate_limit_remaining, \
origin, would_refuse) \
SELECT value->>'request_id', value->>'time', value->>'method', value->>'path', value->>'status', \
value->>'response_bytes', value->>'response_time_ms', value->>'client_ip', value->>'user_agent', \
value->>'key_prefix', value->>'idempotency_key', value->>'replayed', value->>'rate_limit_remaining', \
value->>'origin', value->>'would_refuse' \
FROM json_each(?)";

const ADD_PATHS: &str =
    "INSERT INTO paths (hour, key_prefix, path, requests, errors, server_errors) \
SELECT value->>'hour', value->>'key_prefix', value->>'path', value->>'requests', value->>'errors', \
value->>'server_errors' FROM json_each(?, '$.paths') WHERE true \
ON CONFLICT (hour, key_prefix, path) DO UPDATE SET requests = requests + excluded.requests, \
errors = errors + excluded.errors, server_errors = server_errors + excluded.server_errors";

const ADD_LATENCY: &str = "INSERT INTO latency (hour, key_prefix, ms, n) \
SELECT value->>'hour', value->>'key_prefix', value->>'ms', value->>'n' \
FROM json_each(?, '$.latency') WHERE true \
ON CONFLICT (hour, key_prefix, ms) DO UPDATE SET n = n + excluded.n";

/// The gateway's own calls' share of `latency` (a batch from before 0.4 has
/// no `latency_gateway`: `json_each` of a missing member is empty).
const ADD_LATENCY_GW: &str = "INSERT INTO latency_gw (hour, key_prefix, ms, n) \
SELECT value->>'hour', value->>'key_prefix', value->>'ms', value->>'n' \
FROM json_each(?, '$.latency_gateway') WHERE true \
ON CONFLICT (hour, key_prefix, ms) DO UPDATE SET n = n + excluded.n";

const ADD_USAGE: &str = "INSERT INTO usage (hour, project, key_prefix, requests, admitted, billable, \
replays, refused, missing_key) \
SELECT value->>'hour', value->>'project', value->>'key_prefix', value->>'requests', value->>'admitted', \
value->>'billable', value->>'replays', value->>'refused', value->>'missing_key' \
FROM json_each(?, '$.usage') WHERE true \
ON CONFLICT (hour, project, key_prefix) DO UPDATE SET requests = requests + excluded.requests, \
admitted = admitted + excluded.admitted, billable = billable + excluded.billable, \
replays = replays + excluded.replays, refused = refused + excluded.refused, \
missing_key = missing_key + excluded.missing_key";

/// `?1` = since (hour ms), `?2` = key prefix or NULL, `?3` = 1 to leave the
/// gateway's own calls out (`{GATEWAY}`: `routes::GATEWAY_PATH_SQL`): their
/// paths from `paths`, their latencies (`latency_gw`) subtracted from `latency`.
pub const STATS: &str = "SELECT json_object(
 'hours', (SELECT json_group_array(json_object('hour', hour, 'requests', r, 'errors', e, 'server_errors', s))
   FROM (SELECT hour, SUM(requests) AS r, SUM(errors) AS e, SUM(server_errors) AS s FROM paths
         WHERE hour >= ?1 AND (?2 IS NULL OR key_prefix = ?2) AND (?3 = 0 OR NOT {GATEWAY}) GROUP BY hour)),
 'paths', (SELECT json_group_array(json_object('path', path, 'requests', r))
   FROM (SELECT path, SUM(requests) AS r FROM paths
         WHERE hour >= ?1 AND (?2 IS NULL OR key_prefix = ?2) AND (?3 = 0 OR NOT {GATEWAY}) GROUP BY path)),
 'latency', (SELECT json_group_array(json_array(ms, c))
   FROM (SELECT ms, SUM(n) AS c FROM (
           SELECT ms, n FROM latency WHERE hour >= ?1 AND (?2 IS NULL OR key_prefix = ?2)
           UNION ALL
           SELECT ms, -n FROM latency_gw WHERE ?3 = 1 AND hour >= ?1 AND (?2 IS NULL OR key_prefix = ?2))
         GROUP BY ms HAVING SUM(n) > 0 ORDER BY ms)),
 'missing', (SELECT json_group_array(json_object('hour', hour, 'key_prefix', key_prefix, 'requests', m))
   FROM (SELECT hour, key_prefix, SUM(missing_key) AS m FROM usage
         WHERE hour >= ?1 AND (?2 IS NULL OR key_prefix = ?2) GROUP BY hour, key_prefix HAVING m > 0)))";

/// `?1` since, `?2` until (hours), `?3` the project or NULL.
pub const USAGE: &str = "SELECT json_group_array(json_object('hour', hour, 'project', project, \
'key_prefix', key_prefix, 'requests', requests, 'admitted', admitted, 'billable', billable, \
'replays', replays, 'refused', refused, 'missing_key', missing_key)) FROM usage \
WHERE hour >= ?1 AND hour < ?2 AND (?3 IS NULL OR project = ?3)";

/// `?1` since, `?2` until, `?3`/`?4` the cursor, `?5` how many.
pub const PAGE: &str = "SELECT json_group_array(json(r)) FROM (SELECT {ROW} AS r FROM rows \
WHERE time >= ?1 AND time < ?2 AND (time > ?3 OR (time = ?3 AND request_id > ?4)) \
ORDER BY time, request_id LIMIT ?5)";

pub fn int(v: u64) -> SqlStorageValue {
    SqlStorageValue::Integer(i64::try_from(v).unwrap_or(i64::MAX))
}

pub use crate::durable::err;

/// The storage port over the object's tables.
pub struct Sql<'a>(pub &'a SqlStorage);

impl Sql<'_> {
    /// Makes the tables, and adds the [`ADDED_COLUMNS`] a shard made by an
    /// earlier build lacks (an additive change: no row is rewritten).
    pub fn prepare(sql: &SqlStorage) -> Result<()> {
        #[derive(Deserialize)]
        struct Column {
            name: String,
        }
        sql.exec(SCHEMA, None)?;
        let have: Vec<Column> = sql
            .exec("SELECT name FROM pragma_table_info('rows')", None)?
            .to_array()?;
        for (column, kind) in ADDED_COLUMNS {
            if !have.iter().any(|c| c.name == *column) {
                sql.exec(
                    &format!("ALTER TABLE rows ADD COLUMN {column} {kind}"),
                    None,
                )?;
            }
        }
        Ok(())
    }

    /// The single value of a one-row, one-column query (its JSON answer).
    pub fn scalar(&self, query: &str, binds: Vec<SqlStorageValue>) -> Result<String> {
        let mut rows = self.0.exec(query, Some(binds))?.raw();
        let first = match rows.next() {
            Some(row) => row?.into_iter().next(),
            None => None,
        };
        Ok(match first {
            Some(SqlStorageValue::String(s)) => s,
            _ => "[]".to_string(),
        })
    }
}

impl ShardStore for Sql<'_> {
    type Error = worker::Error;

    fn existing(&mut self, ids: &[&str]) -> Result<Vec<String>> {
        let ids = serde_json::to_string(ids).map_err(err)?;
        let found = self.scalar(
            "SELECT json_group_array(request_id) FROM rows WHERE request_id IN (SELECT value FROM json_each(?))",
            vec![ids.into()],
        )?;
        serde_json::from_slice(found.as_bytes()).map_err(err)
    }

    fn insert(&mut self, rows: &[&AuditRow]) -> Result<()> {
        let json = serde_json::to_string(rows).map_err(err)?;
        self.0.exec(INSERT, Some(vec![json.into()]))?;
        Ok(())
    }

    fn add(&mut self, rollups: &Rollups) -> Result<()> {
        let json = serde_json::to_string(rollups).map_err(err)?;
        for statement in [ADD_PATHS, ADD_LATENCY, ADD_LATENCY_GW, ADD_USAGE] {
            self.0.exec(statement, Some(vec![json.clone().into()]))?;
        }
        Ok(())
    }
}
