//! `WebhookShard`: one SQLite-backed Durable Object per (project, time
//! bucket) holding that bucket's events, deliveries, attempts and outbox
//! state (ADR 0035). A thin adapter: every write is a function of
//! `postguard_core::webhooks::records` run over [`Sql`] (the
//! `WebhookStore` port) inside one `transactionSync`, so a call commits all
//! or nothing; this file holds the SQL and nothing else decides.
//!
//! Concurrency: an object runs one call at a time and these functions never
//! `await`, so a claim, a hold or a settle is a compare-and-set by
//! construction. Retention deletes the whole object (`drop`).

use std::cell::{Cell, RefCell};

use postguard_core::webhooks::capacity::Usage;
use postguard_core::webhooks::delivery::Status;
use postguard_core::webhooks::records::{
    self, AttemptRecord, ClaimJob, DeliveryQuery, DeliveryRecord, EventColumns, EventQuery,
    EventRecord, FeedRow, Imported, Limits, NewEvent, RecoverStep, Settle, Summary, WebhookStore,
};
use postguard_core::webhooks::shard::ShardKey;
use serde::{Deserialize, Serialize};
use wasm_bindgen::JsValue;
use worker::{
    durable_object, DurableObject, Env, ObjectNamespace, Request, Response, Result, SqlStorage,
    SqlStorageValue, State,
};

use crate::bindings;
use worker::wasm_bindgen_futures::JsFuture;

/// No `project` column: the shard is one project's. The outbox is the
/// deliveries with no `queued_at` (a partial index), the manual-attempt
/// count a column: fewer rows per event than D1's tables (ADR 0035).
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS events (id TEXT PRIMARY KEY, event_type TEXT NOT NULL, payload TEXT NOT NULL,
  created_at INTEGER NOT NULL, request_id TEXT);
CREATE INDEX IF NOT EXISTS events_created ON events (created_at, id);
CREATE TABLE IF NOT EXISTS deliveries (id TEXT PRIMARY KEY, event_id TEXT NOT NULL, event_type TEXT NOT NULL,
  subscription_id TEXT NOT NULL, url TEXT NOT NULL, status TEXT NOT NULL, attempts_made INTEGER NOT NULL,
  next_attempt_at INTEGER, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, queued_at INTEGER,
  manual INTEGER NOT NULL DEFAULT 0, claimed_until INTEGER);
CREATE INDEX IF NOT EXISTS deliveries_created ON deliveries (created_at, id);
CREATE INDEX IF NOT EXISTS deliveries_event ON deliveries (event_id);
CREATE INDEX IF NOT EXISTS deliveries_sub ON deliveries (subscription_id, status, created_at, id);
CREATE INDEX IF NOT EXISTS deliveries_next ON deliveries (next_attempt_at) WHERE next_attempt_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS deliveries_unsent ON deliveries (created_at) WHERE queued_at IS NULL AND next_attempt_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS attempts (delivery_id TEXT NOT NULL, request_id TEXT NOT NULL, attempt INTEGER NOT NULL,
  url TEXT NOT NULL, status_code INTEGER, error TEXT, response_excerpt TEXT, duration_ms INTEGER NOT NULL,
  at INTEGER NOT NULL, next_retry_at INTEGER, PRIMARY KEY (delivery_id, request_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS usage (day INTEGER PRIMARY KEY, events INTEGER NOT NULL, deliveries INTEGER NOT NULL,
  bytes INTEGER NOT NULL);
";

/// Columns added to a table after its first release: created by each
/// object on its first call, in shards made before them too (an old row
/// reads NULL). `attempts.signed` and `.response_headers` (0.4): what an
/// attempt keeps of its headers (`webhooks::trace`), as JSON.
const ADDED_COLUMNS: &[(&str, &str, &str)] = &[
    ("attempts", "signed", "TEXT"),
    ("attempts", "response_headers", "TEXT"),
    ("deliveries", "claimed_until", "INTEGER"),
];

/// An attempt as one JSON object (its kept headers as JSON, not text).
const ATTEMPT_JSON: &str = "json_object('delivery_id', delivery_id, 'request_id', request_id, \
'attempt', attempt, 'url', url, 'status_code', status_code, 'error', error, \
'response_excerpt', response_excerpt, 'duration_ms', duration_ms, 'at', at, \
'next_retry_at', next_retry_at, 'signed', json(signed), 'response_headers', json(response_headers))";

const DELIVERY_COLUMNS: &str =
    "id, event_id, event_type, subscription_id, url, status, attempts_made, \
next_attempt_at, created_at, updated_at, queued_at, manual, claimed_until";

/// A delivery with its event's `request_id` (the log's trace).
const LIST_COLUMNS: &str = "SELECT d.id, d.event_id, d.event_type, d.subscription_id, d.url, d.status, \
d.attempts_made, d.next_attempt_at, d.created_at, d.updated_at, d.queued_at, d.manual, e.request_id \
FROM deliveries d LEFT JOIN events e ON e.id = d.event_id";

const EVENT_COLUMNS: &str = "id, event_type, payload, created_at, request_id";

/// The operations (each one `POST https://webhook-shard/<op>` with a JSON
/// body, answered with JSON).
pub mod op {
    pub const PUBLISH: &str = "/publish";
    pub const MARK_SENT: &str = "/mark-sent";
    pub const UNSENT: &str = "/unsent";
    pub const CLAIM: &str = "/claim";
    pub const SETTLE: &str = "/settle";
    pub const RELEASE: &str = "/release";
    pub const UNCLAIM: &str = "/unclaim";
    pub const MANUAL: &str = "/manual";
    pub const RECOVER: &str = "/recover";
    pub const COUNT_RECOVERABLE: &str = "/count-recoverable";
    pub const REQUEUE: &str = "/requeue";
    pub const DETAIL: &str = "/detail";
    pub const LIST: &str = "/list";
    pub const FEED: &str = "/feed";
    pub const IMPORT: &str = "/import";
    pub const RESTORE: &str = "/restore";
    pub const DUMP: &str = "/dump";
    pub const DROP: &str = "/drop";
    pub const SIZE: &str = "/size";
    /// A page of delivery records, oldest first (the archive, exports).
    pub const ARCHIVE: &str = "/archive";
    /// Attempts of the last 24 h per subscription (`webhooks::health`).
    pub const HEALTH: &str = "/health";
    /// Size and the oldest due delivery (the alerts' check).
    pub const VITALS: &str = "/vitals";
}

#[derive(Serialize, Deserialize)]
pub struct PublishReq {
    /// Delivery ids sent to the queue since this isolate's last call (their
    /// outbox marks ride in this transaction).
    pub sent: Vec<String>,
    pub events: Vec<NewEvent>,
    pub limits: Limits,
    pub now: u64,
}

#[derive(Serialize, Deserialize)]
pub struct IdsReq {
    pub ids: Vec<String>,
    pub now: u64,
}

#[derive(Serialize, Deserialize)]
pub struct BeforeReq {
    pub before: u64,
    pub limit: u32,
    pub now: u64,
    /// `/requeue`: day counters before this UTC day go (retention).
    #[serde(default)]
    pub oldest_day: u64,
}

#[derive(Serialize, Deserialize)]
pub struct ClaimReq {
    pub jobs: Vec<ClaimJob>,
    pub now: u64,
    /// How long a claimed scheduled attempt is in flight (a worker of an
    /// earlier build sends none: then no attempt is marked in flight).
    #[serde(default)]
    pub lease_ms: u64,
}

#[derive(Serialize, Deserialize)]
pub struct SettleReq {
    pub attempts: Vec<Settle>,
    pub schedule: Vec<u32>,
    pub now: u64,
}

#[derive(Serialize, Deserialize)]
pub struct ReleaseReq {
    pub subscription_id: String,
    pub limit: u32,
    pub now: u64,
}

#[derive(Serialize, Deserialize)]
pub struct ManualReq {
    pub delivery_id: String,
    pub max: u32,
    pub now: u64,
}

#[derive(Serialize, Deserialize)]
pub struct RecoverReq {
    pub step: RecoverStep,
    pub now: u64,
}

#[derive(Serialize, Deserialize)]
pub struct CountReq {
    pub subscription_id: String,
    pub since: u64,
    pub until: u64,
}

#[derive(Serialize, Deserialize)]
pub struct DetailReq {
    pub delivery_id: String,
}

/// `/unclaim`: attempt `attempt` of the delivery was claimed, not sent.
#[derive(Serialize, Deserialize)]
pub struct UnclaimReq {
    pub delivery_id: String,
    pub attempt: u32,
    pub now: u64,
}

#[derive(Serialize, Deserialize)]
pub struct ListReq {
    pub q: DeliveryQuery,
    pub take: u32,
}

/// `/archive`: deliveries created in `[since, until)` after `after`.
#[derive(Serialize, Deserialize)]
pub struct ArchiveReq {
    pub since: u64,
    pub until: u64,
    pub after: (u64, String),
    pub take: u32,
}

/// `/health`: the attempts at or after `since` of these subscriptions.
#[derive(Serialize, Deserialize)]
pub struct HealthReq {
    pub subscription_ids: Vec<String>,
    pub since: u64,
}

/// `/vitals`' answer.
#[derive(Serialize, Deserialize)]
pub struct Vitals {
    pub bytes: u64,
    pub oldest_due: Option<(u64, String)>,
}

#[derive(Serialize, Deserialize)]
pub struct FeedReq {
    pub q: EventQuery,
    pub take: u32,
}

/// Everything a shard holds (tests, and an operator's export).
#[derive(Serialize, Deserialize, Default)]
pub struct Dump {
    pub events: Vec<EventRecord>,
    pub deliveries: Vec<DeliveryRecord>,
    pub attempts: Vec<AttemptRecord>,
    pub usage: Vec<DayUsage>,
    pub bytes: u64,
}

#[derive(Serialize, Deserialize)]
pub struct DayUsage {
    pub day: u64,
    pub events: u64,
    pub deliveries: u64,
    pub bytes: u64,
}

#[durable_object]
pub struct WebhookShard {
    state: State,
    sql: SqlStorage,
    schema_ready: Cell<bool>,
}

fn int(v: u64) -> SqlStorageValue {
    SqlStorageValue::Integer(i64::try_from(v).unwrap_or(i64::MAX))
}

fn opt_int(v: Option<u64>) -> SqlStorageValue {
    v.map_or(SqlStorageValue::Null, int)
}

fn opt_text(v: Option<&str>) -> SqlStorageValue {
    v.map_or(SqlStorageValue::Null, |s| {
        SqlStorageValue::String(s.to_string())
    })
}

fn text(v: &str) -> SqlStorageValue {
    SqlStorageValue::String(v.to_string())
}

fn err(e: impl std::fmt::Display) -> worker::Error {
    worker::Error::RustError(e.to_string())
}

/// The storage port over the object's tables.
struct Sql<'a>(&'a SqlStorage);

impl Sql<'_> {
    fn rows<T: serde::de::DeserializeOwned>(
        &self,
        q: &str,
        binds: Vec<SqlStorageValue>,
    ) -> Result<Vec<T>> {
        self.0.exec(q, Some(binds))?.to_array()
    }

    fn run(&self, q: &str, binds: Vec<SqlStorageValue>) -> Result<()> {
        self.0.exec(q, Some(binds))?;
        Ok(())
    }

    /// Attempts matching `filter` (a `WHERE … ORDER BY …` over `attempts`).
    fn attempt_rows(
        &self,
        filter: &str,
        binds: Vec<SqlStorageValue>,
    ) -> Result<Vec<AttemptRecord>> {
        let q = format!(
            "SELECT json_group_array(json(r)) FROM (SELECT {ATTEMPT_JSON} AS r FROM attempts {filter})"
        );
        let mut rows = self.0.exec(&q, Some(binds))?.raw();
        let text = match rows.next() {
            Some(row) => match row?.into_iter().next() {
                Some(SqlStorageValue::String(s)) => s,
                _ => "[]".to_string(),
            },
            None => "[]".to_string(),
        };
        serde_json::from_str(&text).map_err(err)
    }

    fn select_deliveries(
        &self,
        filter: &str,
        binds: Vec<SqlStorageValue>,
    ) -> Result<Vec<DeliveryRecord>> {
        self.rows(
            &format!("SELECT {DELIVERY_COLUMNS} FROM deliveries {filter}"),
            binds,
        )
    }
}

/// `?`s for `values`, and the values as binds.
fn set_of(values: &[&str]) -> (String, Vec<SqlStorageValue>) {
    (
        vec!["?"; values.len()].join(", "),
        values.iter().map(|v| text(v)).collect(),
    )
}

impl WebhookStore for Sql<'_> {
    type Error = worker::Error;

    fn event(&mut self, id: &str) -> Result<Option<EventRecord>> {
        let q = format!("SELECT {EVENT_COLUMNS} FROM events WHERE id = ?");
        Ok(self.rows(&q, vec![text(id)])?.into_iter().next())
    }

    fn insert_event(&mut self, e: &EventRecord) -> Result<()> {
        self.run(
            "INSERT OR IGNORE INTO events (id, event_type, payload, created_at, request_id) VALUES (?, ?, ?, ?, ?)",
            vec![text(&e.id), text(&e.event_type), text(&e.payload), int(e.created_at), opt_text(e.request_id.as_deref())],
        )
    }

    fn delivery(&mut self, id: &str) -> Result<Option<DeliveryRecord>> {
        Ok(self
            .select_deliveries("WHERE id = ?", vec![text(id)])?
            .into_iter()
            .next())
    }

    fn put_delivery(&mut self, d: &DeliveryRecord) -> Result<()> {
        self.run(
            &format!("INSERT OR REPLACE INTO deliveries ({DELIVERY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"),
            vec![
                text(&d.id),
                text(&d.event_id),
                text(&d.event_type),
                text(&d.subscription_id),
                text(&d.url),
                text(d.status.as_str()),
                int(u64::from(d.attempts_made)),
                opt_int(d.next_attempt_at),
                int(d.created_at),
                int(d.updated_at),
                opt_int(d.queued_at),
                int(u64::from(d.manual)),
                opt_int(d.claimed_until),
            ],
        )
    }

    fn deliveries_of(&mut self, event_id: &str) -> Result<Vec<DeliveryRecord>> {
        self.select_deliveries("WHERE event_id = ?", vec![text(event_id)])
    }

    fn insert_attempt(&mut self, a: &AttemptRecord) -> Result<()> {
        let json_of = |v: Option<String>| v.map_or(SqlStorageValue::Null, SqlStorageValue::String);
        let signed = a
            .signed
            .as_ref()
            .map(serde_json::to_string)
            .transpose()
            .map_err(err)?;
        let headers = a
            .response_headers
            .as_ref()
            .map(serde_json::to_string)
            .transpose()
            .map_err(err)?;
        self.run(
            "INSERT OR IGNORE INTO attempts (delivery_id, request_id, attempt, url, status_code, error, response_excerpt, duration_ms, at, next_retry_at, signed, response_headers) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            vec![
                text(&a.delivery_id),
                text(&a.request_id),
                int(u64::from(a.attempt)),
                text(&a.url),
                opt_int(a.status_code.map(u64::from)),
                opt_text(a.error.as_deref()),
                opt_text(a.response_excerpt.as_deref()),
                int(a.duration_ms),
                int(a.at),
                opt_int(a.next_retry_at),
                json_of(signed),
                json_of(headers),
            ],
        )
    }

    fn attempts(&mut self, delivery_id: &str) -> Result<Vec<AttemptRecord>> {
        self.attempt_rows(
            "WHERE delivery_id = ? ORDER BY at, attempt",
            vec![text(delivery_id)],
        )
    }

    fn health(
        &mut self,
        subscription_ids: &[&str],
        since: u64,
    ) -> Result<Vec<postguard_core::webhooks::health::Tally>> {
        if subscription_ids.is_empty() {
            return Ok(Vec::new());
        }
        self.rows(
            postguard_core::webhooks::health::TALLY_SQL,
            vec![json_text(subscription_ids)?, int(since)],
        )
    }

    fn unsent(&mut self, before: u64, limit: usize) -> Result<Vec<DeliveryRecord>> {
        self.select_deliveries("WHERE queued_at IS NULL AND next_attempt_at IS NOT NULL AND created_at <= ? ORDER BY created_at, id LIMIT ?",
            vec![int(before), int(limit as u64)],
        )
    }

    fn held(&mut self, subscription_id: &str, limit: usize) -> Result<Vec<DeliveryRecord>> {
        self.select_deliveries(
            "WHERE subscription_id = ? AND status = ? ORDER BY created_at, id LIMIT ?",
            vec![
                text(subscription_id),
                text(Status::Paused.as_str()),
                int(limit as u64),
            ],
        )
    }

    fn overdue(&mut self, before: u64, limit: usize) -> Result<Vec<DeliveryRecord>> {
        // Only in-progress deliveries have a next attempt.
        self.select_deliveries(
            "WHERE next_attempt_at IS NOT NULL AND next_attempt_at < ? LIMIT ?",
            vec![int(before), int(limit as u64)],
        )
    }

    fn recoverable(
        &mut self,
        subscription_id: &str,
        since: u64,
        until: u64,
        after: &(u64, String),
        limit: usize,
    ) -> Result<Vec<DeliveryRecord>> {
        let (set, mut binds) = set_of(&[Status::Failed.as_str(), Status::DeadLetter.as_str()]);
        binds.splice(0..0, [text(subscription_id)]);
        binds.extend([
            int(since),
            int(until),
            int(after.0),
            int(after.0),
            text(&after.1),
        ]);
        binds.push(int(u64::try_from(limit)
            .unwrap_or(u64::MAX)
            .min(i64::MAX as u64)));
        self.select_deliveries(&format!("WHERE subscription_id = ? AND status IN ({set}) AND created_at >= ? AND created_at <= ? \
                      AND (created_at > ? OR (created_at = ? AND id > ?)) ORDER BY created_at, id LIMIT ?"),
            binds,
        )
    }

    fn list(&mut self, q: &DeliveryQuery, limit: usize) -> Result<Vec<DeliveryRecord>> {
        let (conditions, args) = q.sql_conditions(limit as u64);
        self.rows(
            &format!("{LIST_COLUMNS} WHERE 1{conditions}"),
            super::sql_args(args),
        )
    }

    fn feed(&mut self, q: &EventQuery, limit: usize) -> Result<Vec<FeedRow>> {
        let columns = EventColumns {
            created_at: "created_at",
            id: "id",
            event_type: "event_type",
        };
        let (filter, args) = q.sql_conditions(columns, limit as u64);
        let events: Vec<EventRecord> = self.rows(
            &format!("SELECT {EVENT_COLUMNS} FROM events WHERE 1{filter}"),
            super::sql_args(args),
        )?;
        #[derive(Deserialize)]
        struct Count {
            event_id: String,
            status: Status,
            n: u32,
        }
        // One bound JSON array, whatever the page size (a statement binds at most 100 values).
        let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
        let counts: Vec<Count> = if ids.is_empty() {
            Vec::new()
        } else {
            self.rows(
                "SELECT event_id, status, COUNT(*) AS n FROM deliveries \
                 WHERE event_id IN (SELECT value FROM json_each(?)) GROUP BY event_id, status",
                vec![text(&serde_json::to_string(&ids).map_err(err)?)],
            )?
        };
        Ok(events
            .into_iter()
            .map(|event| {
                let mut summary = Summary::default();
                for c in counts.iter().filter(|c| c.event_id == event.id) {
                    for _ in 0..c.n {
                        summary.count(c.status);
                    }
                }
                FeedRow { event, summary }
            })
            .collect())
    }

    fn usage(&mut self, day: u64) -> Result<Usage> {
        let rows: Vec<Usage> = self.rows(
            "SELECT events, deliveries, bytes FROM usage WHERE day = ?",
            vec![int(day)],
        )?;
        Ok(rows.into_iter().next().unwrap_or_default())
    }

    fn put_usage(&mut self, day: u64, u: &Usage) -> Result<()> {
        self.run(
            "INSERT OR REPLACE INTO usage (day, events, deliveries, bytes) VALUES (?, ?, ?, ?)",
            vec![int(day), int(u.events), int(u.deliveries), int(u.bytes)],
        )
    }

    fn drop_usage_before(&mut self, day: u64) -> Result<()> {
        self.run("DELETE FROM usage WHERE day < ?", vec![int(day)])
    }

    fn size(&mut self) -> Result<u64> {
        Ok(self.0.database_size() as u64)
    }

    fn oldest_due(&mut self) -> Result<Option<(u64, String)>> {
        #[derive(Deserialize)]
        struct Due {
            at: u64,
            id: String,
        }
        let (set, mut binds) = set_of(&[Status::Pending.as_str(), Status::Failed.as_str()]);
        binds.insert(0, int(0));
        let due: Vec<Due> = self.rows(
            &format!(
                "SELECT next_attempt_at AS at, id FROM deliveries WHERE next_attempt_at >= ? \
                 AND status IN ({set}) ORDER BY next_attempt_at, id LIMIT 1"
            ),
            binds,
        )?;
        Ok(due.into_iter().next().map(|d| (d.at, d.id)))
    }

    fn oldest(
        &mut self,
        since: u64,
        until: u64,
        after: &(u64, String),
        limit: usize,
    ) -> Result<Vec<DeliveryRecord>> {
        self.rows(
            &format!(
                "{LIST_COLUMNS} WHERE d.created_at >= ? AND d.created_at < ? \
                 AND (d.created_at > ? OR (d.created_at = ? AND d.id > ?)) ORDER BY d.created_at, d.id LIMIT ?"
            ),
            vec![
                int(since),
                int(until),
                int(after.0),
                int(after.0),
                text(&after.1),
                int(limit as u64),
            ],
        )
    }

    fn attempts_of(&mut self, ids: &[&str]) -> Result<Vec<AttemptRecord>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        self.attempt_rows(
            "WHERE delivery_id IN (SELECT value FROM json_each(?))",
            vec![json_text(ids)?],
        )
    }

    // One statement each, whatever the number of rows: the rows travel as
    // one bound JSON array (`json_each`), within the 100-value bound limit.

    fn events(&mut self, ids: &[&str]) -> Result<Vec<EventRecord>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let q = format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE id IN (SELECT value FROM json_each(?))"
        );
        self.rows(&q, vec![json_text(ids)?])
    }

    fn insert_events(&mut self, es: &[EventRecord]) -> Result<()> {
        self.run(
            "INSERT OR IGNORE INTO events (id, event_type, payload, created_at, request_id) \
             SELECT value->>'id', value->>'event_type', value->>'payload', value->>'created_at', value->>'request_id' FROM json_each(?)",
            vec![json_text(es)?],
        )
    }

    fn deliveries(&mut self, ids: &[&str]) -> Result<Vec<DeliveryRecord>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        self.select_deliveries(
            "WHERE id IN (SELECT value FROM json_each(?))",
            vec![json_text(ids)?],
        )
    }

    fn put_deliveries(&mut self, ds: &[DeliveryRecord]) -> Result<()> {
        self.run(
            &format!(
                "INSERT OR REPLACE INTO deliveries ({DELIVERY_COLUMNS}) SELECT value->>'id', value->>'event_id', \
                 value->>'event_type', value->>'subscription_id', value->>'url', value->>'status', value->>'attempts_made', \
                 value->>'next_attempt_at', value->>'created_at', value->>'updated_at', value->>'queued_at', value->>'manual', \
                 value->>'claimed_until' FROM json_each(?)"
            ),
            vec![json_text(ds)?],
        )
    }

    fn insert_attempts(&mut self, rows: &[AttemptRecord]) -> Result<()> {
        self.run(
            "INSERT OR IGNORE INTO attempts (delivery_id, request_id, attempt, url, status_code, error, response_excerpt, \
             duration_ms, at, next_retry_at, signed, response_headers) SELECT value->>'delivery_id', value->>'request_id', \
             value->>'attempt', value->>'url', value->>'status_code', value->>'error', value->>'response_excerpt', \
             value->>'duration_ms', value->>'at', value->>'next_retry_at', value->'signed', value->'response_headers' \
             FROM json_each(?)",
            vec![json_text(rows)?],
        )
    }
}

/// `v` as one JSON text value to bind.
fn json_text<T: Serialize + ?Sized>(v: &T) -> Result<SqlStorageValue> {
    Ok(SqlStorageValue::String(
        serde_json::to_string(v).map_err(err)?,
    ))
}

impl WebhookShard {
    fn store(&self) -> Result<Sql<'_>> {
        if !self.schema_ready.get() {
            self.sql.exec(SCHEMA, None)?;
            self.add_columns()?;
            self.schema_ready.set(true);
        }
        Ok(Sql(&self.sql))
    }

    /// [`ADDED_COLUMNS`] that a shard made before them lacks, added (an
    /// additive change: no row is rewritten, old rows read NULL).
    fn add_columns(&self) -> Result<()> {
        #[derive(Deserialize)]
        struct Column {
            name: String,
        }
        let mut tables: Vec<&str> = ADDED_COLUMNS.iter().map(|(t, _, _)| *t).collect();
        tables.dedup();
        for table in tables {
            let have: Vec<Column> = self
                .sql
                .exec(
                    &format!("SELECT name FROM pragma_table_info('{table}')"),
                    None,
                )?
                .to_array()?;
            for (_, column, kind) in ADDED_COLUMNS.iter().filter(|(t, _, _)| *t == table) {
                if !have.iter().any(|c| c.name == *column) {
                    self.sql.exec(
                        &format!("ALTER TABLE {table} ADD COLUMN {column} {kind}"),
                        None,
                    )?;
                }
            }
        }
        Ok(())
    }

    /// Runs `f` over the port in one storage transaction: all or nothing.
    fn atomically<T>(&self, f: impl FnOnce(&mut Sql<'_>) -> Result<T>) -> Result<T> {
        let mut store = self.store()?;
        super::atomically(&self.state.storage(), || f(&mut store), err)
    }

    fn dump(&self) -> Result<Dump> {
        let s = self.store()?;
        Ok(Dump {
            events: s.rows(
                &format!("SELECT {EVENT_COLUMNS} FROM events ORDER BY created_at, id"),
                vec![],
            )?,
            deliveries: s.select_deliveries("ORDER BY created_at, id", vec![])?,
            attempts: s.attempt_rows("ORDER BY at", vec![])?,
            usage: s.rows(
                "SELECT day, events, deliveries, bytes FROM usage ORDER BY day",
                vec![],
            )?,
            bytes: self.sql.database_size() as u64,
        })
    }

    fn answer(&self, path: &str, body: &[u8]) -> Result<String> {
        fn parse<T: serde::de::DeserializeOwned>(b: &[u8]) -> Result<T> {
            serde_json::from_slice(b).map_err(err)
        }
        fn json<T: Serialize>(v: &T) -> Result<String> {
            serde_json::to_string(v).map_err(err)
        }
        match path {
            op::PUBLISH => {
                let r: PublishReq = parse(body)?;
                json(&self.atomically(|s| {
                    records::mark_sent(s, &r.sent, r.now)?;
                    records::publish(s, &r.events, &r.limits, r.now)
                })?)
            }
            op::MARK_SENT => {
                let r: IdsReq = parse(body)?;
                self.atomically(|s| records::mark_sent(s, &r.ids, r.now))?;
                Ok("{}".into())
            }
            op::UNSENT => {
                let r: BeforeReq = parse(body)?;
                json(&records::unsent(
                    &mut self.store()?,
                    r.before,
                    r.limit as usize,
                )?)
            }
            op::CLAIM => {
                let r: ClaimReq = parse(body)?;
                json(&self.atomically(|s| records::claim(s, &r.jobs, r.now, r.lease_ms))?)
            }
            op::SETTLE => {
                let r: SettleReq = parse(body)?;
                let follow: Vec<Option<(u64, u64)>> = self
                    .atomically(|s| records::settle(s, &r.attempts, &r.schedule, r.now))?
                    .into_iter()
                    .map(|f| f.map(|f| (f.at, f.delay_s)))
                    .collect();
                json(&follow)
            }
            op::RELEASE => {
                let r: ReleaseReq = parse(body)?;
                json(&self.atomically(|s| {
                    records::release(s, &r.subscription_id, r.limit as usize, r.now)
                })?)
            }
            op::UNCLAIM => {
                let r: UnclaimReq = parse(body)?;
                json(&self.atomically(|s| records::unclaim(s, &r.delivery_id, r.attempt, r.now))?)
            }
            op::MANUAL => {
                let r: ManualReq = parse(body)?;
                json(&self.atomically(|s| records::manual(s, &r.delivery_id, r.max, r.now))?)
            }
            op::RECOVER => {
                let r: RecoverReq = parse(body)?;
                json(&self.atomically(|s| records::recover(s, &r.step, r.now))?)
            }
            op::COUNT_RECOVERABLE => {
                let r: CountReq = parse(body)?;
                json(&records::count_recoverable(
                    &mut self.store()?,
                    &r.subscription_id,
                    r.since,
                    r.until,
                )?)
            }
            op::REQUEUE => {
                let r: BeforeReq = parse(body)?;
                json(&self.atomically(|s| {
                    records::requeue(s, r.before, r.limit as usize, r.now, r.oldest_day)
                })?)
            }
            op::DETAIL => {
                let r: DetailReq = parse(body)?;
                json(&records::detail(&mut self.store()?, &r.delivery_id)?)
            }
            op::LIST => {
                let r: ListReq = parse(body)?;
                json(&self.store()?.list(&r.q, r.take as usize)?)
            }
            op::FEED => {
                let r: FeedReq = parse(body)?;
                json(&self.store()?.feed(&r.q, r.take as usize)?)
            }
            op::IMPORT => {
                let r: Vec<Imported> = parse(body)?;
                json(&self.atomically(|s| records::import(s, &r))?)
            }
            op::RESTORE => {
                let r: records::Restore = parse(body)?;
                json(&self.atomically(|s| records::restore(s, &r))?)
            }
            op::DUMP => json(&self.dump()?),
            op::ARCHIVE => {
                let r: ArchiveReq = parse(body)?;
                json(&records::archive_page(
                    &mut self.store()?,
                    r.since,
                    r.until,
                    &r.after,
                    r.take as usize,
                )?)
            }
            op::HEALTH => {
                let r: HealthReq = parse(body)?;
                let ids: Vec<&str> = r.subscription_ids.iter().map(String::as_str).collect();
                json(&self.store()?.health(&ids, r.since)?)
            }
            op::VITALS => {
                let mut s = self.store()?;
                json(&Vitals {
                    oldest_due: s.oldest_due()?,
                    bytes: s.size()?,
                })
            }
            op::SIZE => Ok(format!("{{\"bytes\":{}}}", self.sql.database_size())),
            _ => Err(err("unknown operation")),
        }
    }
}

/// Called by JS RPC through the class `src/entry.mjs` exports (as `WebhookShard`,
/// ADRs 0018 and 0035): no Request, Response or body stream on either side.
#[wasm_bindgen::prelude::wasm_bindgen(
    wasm_bindgen = ::worker::wasm_bindgen,
    wasm_bindgen_futures = ::worker::wasm_bindgen_futures,
    js_sys = ::worker::js_sys
)]
impl WebhookShard {
    /// Operation `op` (an [`op`] path) on a JSON request; resolves to the
    /// JSON answer, rejects with the error's text (the transaction rolled back).
    pub async fn rpc(&self, op: String, body: String) -> std::result::Result<String, JsValue> {
        self.dispatch(&op, body.as_bytes())
            .await
            .map_err(|e| JsValue::from_str(&e.to_string()))
    }
}

impl WebhookShard {
    /// Every operation, by RPC or by `fetch`.
    async fn dispatch(&self, path: &str, body: &[u8]) -> Result<String> {
        if path == op::DROP {
            // Every record and the schema go with the object's storage.
            self.state.storage().delete_all().await?;
            self.schema_ready.set(false);
            return Ok("{}".to_string());
        }
        self.answer(path, body)
    }
}

impl DurableObject for WebhookShard {
    fn new(state: State, _env: Env) -> Self {
        WebhookShard {
            sql: state.storage().sql(),
            state,
            schema_ready: Cell::new(false),
        }
    }

    /// The same operations over HTTP (`POST https://webhook-shard/<op>`): the
    /// worker calls [`WebhookShard::rpc`]; tests and operators reach the
    /// object this way through the runtime's Durable Object API.
    async fn fetch(&self, mut req: Request) -> Result<Response> {
        let path = req.path();
        let body = req.bytes().await?;
        match self.dispatch(&path, &body).await {
            Ok(text) => Response::ok(text),
            Err(e) => Ok(Response::error(e.to_string(), 500)?),
        }
    }
}

#[wasm_bindgen::prelude::wasm_bindgen]
extern "C" {
    /// A `WebhookShard` stub: `run` is the RPC method of the object's JS
    /// class (`src/entry.mjs`), which hands the call to [`WebhookShard::rpc`].
    type ShardStub;
    #[wasm_bindgen(method, catch)]
    fn run(this: &ShardStub, op: &str, body: &str) -> std::result::Result<JsValue, JsValue>;
}

thread_local! {
    /// The `WEBHOOKS` namespace, held for the isolate ([`bindings::per_isolate`]).
    static NAMESPACE: RefCell<Option<ObjectNamespace>> = const { RefCell::new(None) };
}

/// Calls operation `path` on `shard`'s object with `req` as JSON; its answer.
pub async fn call<Q: Serialize, A: serde::de::DeserializeOwned>(
    env: &Env,
    shard: &ShardKey,
    path: &str,
    req: &Q,
) -> Result<A> {
    let ns = bindings::per_isolate(&NAMESPACE, || env.durable_object(bindings::WEBHOOKS))?;
    let stub: ShardStub = ns
        .id_from_name(&shard.name())?
        .get_stub()?
        .into_rpc::<ShardStub>();
    let body = serde_json::to_string(req).map_err(err)?;
    let pending = stub.run(path, &body).map_err(worker::Error::from)?;
    // An RPC call answers a thenable, not necessarily a `Promise`.
    let answer = JsFuture::from(worker::js_sys::Promise::resolve(&pending))
        .await
        .map_err(|e| {
            err(format!(
                "webhook shard {path}: {}",
                e.as_string().unwrap_or_else(|| format!("{e:?}"))
            ))
        })?;
    let text = answer
        .as_string()
        .ok_or_else(|| err(format!("webhook shard {path} answered no text")))?;
    serde_json::from_str(&text).map_err(err)
}
