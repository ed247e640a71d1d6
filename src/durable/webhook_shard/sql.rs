//! The webhook shard's tables and its storage port: the core's
//! `WebhookStore` (`webhooks::records`) in SQL. No function here decides
//! anything: each answers one read or write of the port.
//!
//! No `project` column: the shard is one project's. The outbox is the
//! deliveries with no `queued_at` (a partial index), the manual-attempt
//! count a column: fewer rows per event than D1's tables (ADR 0035).

use postguard_core::webhooks::capacity::Usage;
use postguard_core::webhooks::delivery::Status;
use postguard_core::webhooks::protocol::Dump;
use postguard_core::webhooks::records::{
    AttemptRecord, DeliveryQuery, DeliveryRecord, EventColumns, EventQuery, EventRecord, FeedRow,
    Summary, WebhookStore,
};
use serde::{Deserialize, Serialize};
use worker::{Result, SqlStorage, SqlStorageValue};

/// No `project` column: the shard is one project's. The outbox is the
/// deliveries with no `queued_at` (a partial index), the manual-attempt
/// count a column: fewer rows per event than D1's tables (ADR 0035).
pub const SCHEMA: &str = "
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
    ("deliveries", "ordering_key", "TEXT"),
    ("deliveries", "ordering_seq", "INTEGER"),
    ("deliveries", "blocked_by", "TEXT"),
    ("events", "ordering_key", "TEXT"),
];

/// Indexes over added columns, made after them: the wake-up's lookup.
const ADDED_INDEXES: &str = "CREATE INDEX IF NOT EXISTS deliveries_blocked ON deliveries (blocked_by) WHERE blocked_by IS NOT NULL;";

/// An attempt as one JSON object (its kept headers as JSON, not text).
const ATTEMPT_JSON: &str = "json_object('delivery_id', delivery_id, 'request_id', request_id, \
'attempt', attempt, 'url', url, 'status_code', status_code, 'error', error, \
'response_excerpt', response_excerpt, 'duration_ms', duration_ms, 'at', at, \
'next_retry_at', next_retry_at, 'signed', json(signed), 'response_headers', json(response_headers))";

const DELIVERY_COLUMNS: &str =
    "id, event_id, event_type, subscription_id, url, status, attempts_made, \
next_attempt_at, created_at, updated_at, queued_at, manual, claimed_until, ordering_key, ordering_seq, blocked_by";

/// A delivery with its event's `request_id` (the log's trace).
const LIST_COLUMNS: &str = "SELECT d.id, d.event_id, d.event_type, d.subscription_id, d.url, d.status, \
d.attempts_made, d.next_attempt_at, d.created_at, d.updated_at, d.queued_at, d.manual, e.request_id, \
d.ordering_key, d.blocked_by FROM deliveries d LEFT JOIN events e ON e.id = d.event_id";

const EVENT_COLUMNS: &str = "id, event_type, payload, created_at, request_id, ordering_key";

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

pub use crate::durable::err;

/// The storage port over the object's tables.
pub struct Sql<'a>(pub &'a SqlStorage);

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
            "INSERT OR IGNORE INTO events (id, event_type, payload, created_at, request_id, ordering_key) VALUES (?, ?, ?, ?, ?, ?)",
            vec![text(&e.id), text(&e.event_type), text(&e.payload), int(e.created_at), opt_text(e.request_id.as_deref()), opt_text(e.ordering_key.as_deref())],
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
            &format!("INSERT OR REPLACE INTO deliveries ({DELIVERY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"),
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
                opt_text(d.ordering_key.as_deref()),
                opt_int(d.ordering_seq),
                opt_text(d.blocked_by.as_deref()),
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

    fn blocked_on(&mut self, id: &str, limit: usize) -> Result<Vec<DeliveryRecord>> {
        self.select_deliveries(
            "WHERE blocked_by = ? LIMIT ?",
            vec![text(id), int(limit as u64)],
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
            super::super::sql_args(args),
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
            super::super::sql_args(args),
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
                 AND status IN ({set}) AND blocked_by IS NULL ORDER BY next_attempt_at, id LIMIT 1"
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
            "INSERT OR IGNORE INTO events (id, event_type, payload, created_at, request_id, ordering_key) \
             SELECT value->>'id', value->>'event_type', value->>'payload', value->>'created_at', value->>'request_id', \
             value->>'ordering_key' FROM json_each(?)",
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
                 value->>'claimed_until', value->>'ordering_key', value->>'ordering_seq', value->>'blocked_by' FROM json_each(?)"
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

impl Sql<'_> {
    /// Makes the tables, and adds the [`ADDED_COLUMNS`] a shard made before
    /// them lacks (an additive change: no row is rewritten, old rows read NULL).
    pub fn prepare(sql: &SqlStorage) -> Result<()> {
        #[derive(Deserialize)]
        struct Column {
            name: String,
        }
        sql.exec(SCHEMA, None)?;
        let mut tables: Vec<&str> = ADDED_COLUMNS.iter().map(|(t, _, _)| *t).collect();
        tables.dedup();
        for table in tables {
            let have: Vec<Column> = sql
                .exec(
                    &format!("SELECT name FROM pragma_table_info('{table}')"),
                    None,
                )?
                .to_array()?;
            for (_, column, kind) in ADDED_COLUMNS.iter().filter(|(t, _, _)| *t == table) {
                if !have.iter().any(|c| c.name == *column) {
                    sql.exec(
                        &format!("ALTER TABLE {table} ADD COLUMN {column} {kind}"),
                        None,
                    )?;
                }
            }
        }
        sql.exec(ADDED_INDEXES, None)?;
        Ok(())
    }

    /// Everything the shard holds.
    pub fn dump(&self) -> Result<Dump> {
        Ok(Dump {
            events: self.rows(
                &format!("SELECT {EVENT_COLUMNS} FROM events ORDER BY created_at, id"),
                vec![],
            )?,
            deliveries: self.select_deliveries("ORDER BY created_at, id", vec![])?,
            attempts: self.attempt_rows("ORDER BY at", vec![])?,
            usage: self.rows(
                "SELECT day, events, deliveries, bytes FROM usage ORDER BY day",
                vec![],
            )?,
            bytes: self.0.database_size() as u64,
        })
    }
}
