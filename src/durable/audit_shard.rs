//! `AuditShard`: one SQLite-backed Durable Object per (project, time bucket)
//! holding that bucket's audit rows and their hourly roll-ups (ADR 0016).
//! A thin adapter: what to store, count and answer is decided by
//! `postguard_core::audit_shard`; this file holds the SQL.
//!
//! Each call carries one JSON document and answers one: the batch of rows,
//! the query, the roll-ups. SQLite reads and builds the JSON itself
//! (`json_each`, `json_group_array`), so a call costs a handful of JS
//! crossings whatever its number of rows.
//!
//! Tables: `rows` (no `project` column: the shard is one project's),
//! `paths(hour, key_prefix, path)` and `latency(hour, key_prefix, ms)`
//! counters, and `latency_gw` (the gateway's own calls' part of `latency`,
//! created in shards that predate it on their next call). Retention deletes the whole object (`/drop`).

use std::cell::{Cell, RefCell};

use postguard_core::audit::{AuditQuery, AuditRow};
use postguard_core::audit_shard::{self, Ingested, Rollups, Shard, ShardStore, StatsQuery};
use serde::Deserialize;
use wasm_bindgen::JsValue;
use worker::{
    durable_object, DurableObject, Env, ObjectNamespace, Request, Response, Result, SqlStorage,
    SqlStorageValue, State,
};

use crate::{bindings, http};

/// Only the indexes the filters need: the primary key (INSERT OR IGNORE,
/// `request_id=`), newest-first paging, and `idempotency_key=`.
const SCHEMA: &str = "
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
";

/// The shard's columns (an `AuditRow` without `project`).
const COLUMNS: &str = "request_id, time, method, path, status, response_bytes, response_time_ms, \
client_ip, user_agent, key_prefix, idempotency_key, replayed, rate_limit_remaining";

/// A row as a JSON object (`replayed` as a boolean).
const ROW_JSON: &str = "json_object('request_id', request_id, 'time', time, 'method', method, \
'path', path, 'status', status, 'response_bytes', response_bytes, 'response_time_ms', response_time_ms, \
'client_ip', client_ip, 'user_agent', user_agent, 'key_prefix', key_prefix, 'project', NULL, \
'idempotency_key', idempotency_key, 'replayed', json(iif(replayed, 'true', 'false')), \
'rate_limit_remaining', rate_limit_remaining)";

const INSERT: &str = "INSERT OR IGNORE INTO rows (request_id, time, method, path, status, response_bytes, \
response_time_ms, client_ip, user_agent, key_prefix, idempotency_key, replayed, rate_limit_remaining) \
SELECT value->>'request_id', value->>'time', value->>'method', value->>'path', value->>'status', \
value->>'response_bytes', value->>'response_time_ms', value->>'client_ip', value->>'user_agent', \
value->>'key_prefix', value->>'idempotency_key', value->>'replayed', value->>'rate_limit_remaining' \
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

/// `?1` = since (hour ms), `?2` = key prefix or NULL, `?3` = 1 to leave the
/// gateway's own calls out (`{GATEWAY}`: `routes::GATEWAY_PATH_SQL`): their
/// paths from `paths`, their latencies (`latency_gw`) subtracted from `latency`.
const STATS: &str = "SELECT json_object(
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
         GROUP BY ms HAVING SUM(n) > 0 ORDER BY ms)))";

pub const INGEST: &str = "/ingest";
/// Roll-up counts only (the cross-project shard of a bucket).
pub const ADD: &str = "/add";
pub const QUERY: &str = "/query";
pub const STATS_PATH: &str = "/stats";
/// Per key: requests, errors and the latest use since an hour (`GET /keys/activity`).
pub const KEYS_PATH: &str = "/keys";

/// `/keys`: from this hour (ms) on.
#[derive(serde::Serialize, Deserialize)]
pub struct KeysQuery {
    pub since_ms: u64,
}
pub const DROP: &str = "/drop";
pub const SIZE: &str = "/size";
/// Rows of a time window, oldest first, after a cursor (the archive).
pub const PAGE: &str = "/page";

/// `/page`: rows with `since <= time < until` after `after`, oldest first.
#[derive(serde::Serialize, Deserialize)]
pub struct PageQuery {
    pub since: u64,
    pub until: u64,
    pub after: (u64, String),
    pub take: u32,
}

/// `?1` since, `?2` until, `?3`/`?4` the cursor, `?5` how many.
const PAGE_SQL: &str = "SELECT json_group_array(json(r)) FROM (SELECT {ROW} AS r FROM rows \
WHERE time >= ?1 AND time < ?2 AND (time > ?3 OR (time = ?3 AND request_id > ?4)) \
ORDER BY time, request_id LIMIT ?5)";

/// `/query`: the audit query and how many rows to return at most.
#[derive(serde::Serialize, Deserialize)]
pub struct ShardQuery {
    pub q: AuditQuery,
    pub take: u32,
}

#[durable_object]
pub struct AuditShard {
    state: State,
    sql: SqlStorage,
    schema_ready: Cell<bool>,
}

fn int(v: u64) -> SqlStorageValue {
    SqlStorageValue::Integer(i64::try_from(v).unwrap_or(i64::MAX))
}

fn text_of(v: Option<SqlStorageValue>) -> String {
    match v {
        Some(SqlStorageValue::String(s)) => s,
        _ => "[]".to_string(),
    }
}

fn err(e: impl std::fmt::Display) -> worker::Error {
    worker::Error::RustError(e.to_string())
}

/// The storage port over the object's tables.
struct Sql<'a>(&'a SqlStorage);

impl Sql<'_> {
    /// The single value of a one-row, one-column query.
    fn scalar(&self, query: &str, binds: Vec<SqlStorageValue>) -> Result<String> {
        let mut rows = self.0.exec(query, Some(binds))?.raw();
        let first = match rows.next() {
            Some(row) => row?.into_iter().next(),
            None => None,
        };
        Ok(text_of(first))
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
        self.0.exec(ADD_PATHS, Some(vec![json.clone().into()]))?;
        self.0.exec(ADD_LATENCY, Some(vec![json.clone().into()]))?;
        self.0.exec(ADD_LATENCY_GW, Some(vec![json.into()]))?;
        Ok(())
    }
}

impl AuditShard {
    fn sql(&self) -> Result<Sql<'_>> {
        if !self.schema_ready.get() {
            self.sql.exec(SCHEMA, None)?;
            self.schema_ready.set(true);
        }
        Ok(Sql(&self.sql))
    }

    /// A batch and its roll-ups in one transaction: all or nothing.
    fn ingest(&self, body: &[u8]) -> Result<Ingested> {
        let rows: Vec<AuditRow> = serde_json::from_slice(body).map_err(err)?;
        self.atomically(|store| audit_shard::ingest(store, &rows))
    }

    /// Roll-up counts alone, in one transaction.
    fn add(&self, body: &[u8]) -> Result<()> {
        let rollups: Rollups = serde_json::from_slice(body).map_err(err)?;
        self.atomically(|store| store.add(&rollups))
    }

    fn atomically<T>(&self, f: impl FnOnce(&mut Sql<'_>) -> Result<T>) -> Result<T> {
        let mut store = self.sql()?;
        super::atomically(&self.state.storage(), || f(&mut store), err)
    }

    fn query(&self, body: &[u8]) -> Result<String> {
        let sq: ShardQuery = serde_json::from_slice(body).map_err(err)?;
        let (inner, args) = sq.q.sql_on("rows", COLUMNS, false, sq.take);
        let sql = format!("SELECT json_group_array({ROW_JSON}) FROM ({inner})");
        self.sql()?.scalar(&sql, super::sql_args(args))
    }

    fn page(&self, body: &[u8]) -> Result<String> {
        let q: PageQuery = serde_json::from_slice(body).map_err(err)?;
        let sql = PAGE_SQL.replace("{ROW}", ROW_JSON);
        let binds = vec![
            int(q.since),
            int(q.until),
            int(q.after.0),
            SqlStorageValue::String(q.after.1),
            int(u64::from(q.take)),
        ];
        self.sql()?.scalar(&sql, binds)
    }

    fn keys(&self, body: &[u8]) -> Result<String> {
        let q: KeysQuery = serde_json::from_slice(body).map_err(err)?;
        let sql = format!(
            "SELECT json_group_array(json_object('key_prefix', key_prefix, 'requests', requests, \
             'errors', errors, 'last_used_at', last_used_at)) FROM ({})",
            audit_shard::KEY_ACTIVITY_SQL
        );
        self.sql()?.scalar(&sql, vec![int(q.since_ms)])
    }

    fn stats(&self, body: &[u8]) -> Result<String> {
        let q: StatsQuery = serde_json::from_slice(body).map_err(err)?;
        let kp = q
            .key_prefix
            .map_or(SqlStorageValue::Null, SqlStorageValue::String);
        let sql = STATS.replace("{GATEWAY}", postguard_core::routes::GATEWAY_PATH_SQL);
        let exclude = int(u64::from(q.exclude_gateway));
        self.sql()?.scalar(&sql, vec![int(q.since_ms), kp, exclude])
    }
}

impl DurableObject for AuditShard {
    fn new(state: State, _env: Env) -> Self {
        AuditShard {
            sql: state.storage().sql(),
            state,
            schema_ready: Cell::new(false),
        }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        let path = req.path();
        let body = req.bytes().await?;
        let answer = match path.as_str() {
            INGEST => self
                .ingest(&body)
                .and_then(|i| serde_json::to_string(&i).map_err(err)),
            ADD => self.add(&body).map(|()| "{}".to_string()),
            QUERY => self.query(&body),
            STATS_PATH => self.stats(&body),
            KEYS_PATH => self.keys(&body),
            PAGE => self.page(&body),
            DROP => {
                // Every row, roll-up and the schema go with the object's storage.
                self.state.storage().delete_all().await?;
                self.schema_ready.set(false);
                Ok("{}".to_string())
            }
            SIZE => Ok(format!("{{\"bytes\":{}}}", self.sql.database_size())),
            _ => Err(err("unknown operation")),
        };
        match answer {
            Ok(text) => Response::ok(text),
            Err(e) => Ok(Response::error(e.to_string(), 500)?),
        }
    }
}

thread_local! {
    /// The `AUDIT` namespace, held for the isolate ([`bindings::per_isolate`]).
    static NAMESPACE: RefCell<Option<ObjectNamespace>> = const { RefCell::new(None) };
}

/// Calls operation `path` on `shard`'s object with a JSON body; its JSON answer.
pub async fn call(env: &Env, shard: &Shard, path: &str, body: &[u8]) -> Result<Vec<u8>> {
    let ns = bindings::per_isolate(&NAMESPACE, || env.durable_object(bindings::AUDIT))?;
    let stub: JsValue = ns.id_from_name(&shard.name())?.get_stub()?.into_rpc();
    let init = http::request_init("POST", body);
    let resp = http::raw_fetch(&stub, &format!("https://audit-shard{path}"), &init).await?;
    let bytes = http::read_body(&resp).await?;
    if resp.status() != 200 {
        let shown = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
        return Err(err(format!(
            "audit shard {path} answered {}: {shown}",
            resp.status()
        )));
    }
    Ok(bytes)
}
