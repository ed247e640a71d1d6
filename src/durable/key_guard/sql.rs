//! The SQL adapter of a key's object: the core's `GuardStore` port
//! (`postguard_core::store`) over the object's SQLite tables, each call
//! synchronous, so an operation runs with no `await` between reading and
//! writing.
//!
//! Tables: `meta(k, v)` (`windows` — or a build's single `window` before
//! several policies, read as the `default` policy's —, `revoked`, `profile`,
//! `forget_at`, `ledger`: the blocks leased to edges), `idem(k, record, expires_at)`, `idem_body(k, seq, data)`
//! (response bodies in chunks under the row limit), `slots(id, until)`
//! (concurrency slots of requests at the origin), `ops(id, …, record)` and
//! `op_body(id, part, seq, data)` (asynchronous operations and their request
//! and result bodies, ADR 0037), `outbox(id, event, …)` (events to publish).

use std::cell::RefCell;

use postguard_core::guard::{GuardError, GuardState, Profile};
use postguard_core::idempotency::Record;
use postguard_core::lease::Ledger;
use postguard_core::limits::{Windows, DEFAULT_POLICY};
use postguard_core::operations::{self, NEVER};
use postguard_core::rate_limit::Window;
use postguard_core::response_events::PendingEvent;
use postguard_core::store::{GuardStore, Part, Pending};
use worker::{SqlStorage, SqlStorageValue};

pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS idem (k TEXT PRIMARY KEY, record TEXT NOT NULL, expires_at INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS idem_expires ON idem(expires_at);
CREATE TABLE IF NOT EXISTS idem_body (k TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (k, seq));
CREATE TABLE IF NOT EXISTS slots (id TEXT PRIMARY KEY, until INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS ops (id TEXT PRIMARY KEY, project TEXT NOT NULL, state TEXT NOT NULL, created_at INTEGER NOT NULL, due_at INTEGER, expires_at INTEGER NOT NULL, record TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS ops_list ON ops(project, created_at, id);
CREATE INDEX IF NOT EXISTS ops_due ON ops(due_at) WHERE due_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS ops_expires ON ops(expires_at);
CREATE TABLE IF NOT EXISTS op_body (id TEXT NOT NULL, part INTEGER NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (id, part, seq));
CREATE TABLE IF NOT EXISTS outbox (id TEXT PRIMARY KEY, event TEXT NOT NULL, attempts INTEGER NOT NULL, first_at INTEGER NOT NULL, next_at INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS outbox_next ON outbox(next_at);
";

/// The `meta` entry of a transient object: when it forgets everything.
pub const FORGET_AT: &str = "forget_at";
/// The `meta` entry of the blocks leased to edges (ADR 0040), written in
/// the same transaction as the windows they were charged to.
const LEDGER: &str = "ledger";
/// Body chunk size: well under SQLite-in-DO's 2 MB row limit.
const CHUNK: usize = 512 * 1024;

pub fn storage(e: impl std::fmt::Display) -> GuardError {
    GuardError::Storage(e.to_string())
}

fn int(v: u64) -> SqlStorageValue {
    SqlStorageValue::Integer(i64::try_from(v).unwrap_or(i64::MAX))
}

/// The storage port over the object's SQLite tables.
pub struct Sql<'a> {
    pub sql: &'a SqlStorage,
    pub limiter: &'a RefCell<Option<GuardState>>,
}

pub type Sr<T> = std::result::Result<T, GuardError>;

impl Sql<'_> {
    fn exec(&self, query: &str, binds: Vec<SqlStorageValue>) -> Sr<worker::SqlCursor> {
        self.sql.exec(query, Some(binds)).map_err(storage)
    }

    /// The first column of each row.
    fn column(&self, query: &str, binds: Vec<SqlStorageValue>) -> Sr<Vec<SqlStorageValue>> {
        let mut out = Vec::new();
        for row in self.exec(query, binds)?.raw() {
            out.extend(row.map_err(storage)?.into_iter().next());
        }
        Ok(out)
    }

    pub fn meta_get(&self, k: &str) -> Sr<Option<String>> {
        let values = self.column("SELECT v FROM meta WHERE k = ?", vec![k.into()])?;
        Ok(values.into_iter().find_map(|v| match v {
            SqlStorageValue::String(s) => Some(s),
            _ => None,
        }))
    }

    pub fn meta_put(&self, k: &str, v: &str) -> Sr<()> {
        self.exec(
            "INSERT INTO meta (k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
            vec![k.into(), v.into()],
        )?;
        Ok(())
    }
}

impl Sql<'_> {
    /// Applies `f` to the cached state (loaded first if needed).
    fn with_state(&mut self, f: impl FnOnce(&mut GuardState)) -> Sr<()> {
        let mut state = self.state()?;
        f(&mut state);
        *self.limiter.borrow_mut() = Some(state);
        Ok(())
    }

    /// The first column of each row, as strings.
    fn texts(&self, query: &str, binds: Vec<SqlStorageValue>) -> Sr<Vec<String>> {
        Ok(self
            .column(query, binds)?
            .into_iter()
            .filter_map(|v| match v {
                SqlStorageValue::String(s) => Some(s),
                _ => None,
            })
            .collect())
    }

    /// The JSON documents of the first column, read as `T`.
    fn documents<T: serde::de::DeserializeOwned>(
        &self,
        query: &str,
        binds: Vec<SqlStorageValue>,
    ) -> Sr<Vec<T>> {
        self.texts(query, binds)?
            .iter()
            .map(|t| serde_json::from_str(t).map_err(storage))
            .collect()
    }

    /// The smallest integer of the first column's first row.
    fn earliest(&self, query: &str) -> Sr<Option<u64>> {
        let min = self.column(query, vec![])?;
        Ok(min.into_iter().next().and_then(|v| match v {
            SqlStorageValue::Integer(i) => u64::try_from(i).ok(),
            _ => None,
        }))
    }

    /// Chunks of a blob column, concatenated.
    fn blob(&self, query: &str, binds: Vec<SqlStorageValue>) -> Sr<Vec<u8>> {
        let mut out = Vec::new();
        for c in self.column(query, binds)? {
            if let SqlStorageValue::Blob(b) = c {
                out.extend_from_slice(&b);
            }
        }
        Ok(out)
    }

    fn count(&self, query: &str, binds: Vec<SqlStorageValue>) -> Sr<u32> {
        let values = self.column(query, binds)?;
        Ok(match values.into_iter().next() {
            Some(SqlStorageValue::Integer(n)) => u32::try_from(n).unwrap_or(u32::MAX),
            _ => 0,
        })
    }
}

/// Stored but unreadable JSON fails closed: windows read as used up (never
/// a fresh window), a profile as none (the worker's record then applies).
fn read_windows(windows: Option<String>, legacy: Option<String>) -> Windows {
    let unreadable = || vec![(DEFAULT_POLICY.to_string(), Window::UNREADABLE)];
    match (windows, legacy) {
        (Some(text), _) => serde_json::from_slice(text.as_bytes()).unwrap_or_else(|_| unreadable()),
        (None, Some(text)) => {
            let w = serde_json::from_slice(text.as_bytes()).unwrap_or(Window::UNREADABLE);
            vec![(DEFAULT_POLICY.to_string(), w)]
        }
        (None, None) => Vec::new(),
    }
}

impl GuardStore for Sql<'_> {
    type Error = GuardError;

    fn state(&mut self) -> Sr<GuardState> {
        if let Some(state) = self.limiter.borrow().as_ref() {
            return Ok(state.clone());
        }
        let state = GuardState {
            revoked: self.meta_get("revoked")?.is_some(),
            windows: read_windows(self.meta_get("windows")?, self.meta_get("window")?),
            profile: self
                .meta_get("profile")?
                .and_then(|p| serde_json::from_slice(p.as_bytes()).ok()),
            // Unreadable, it is empty: the units it accounted for stay
            // charged in the windows, so losing it loses no safety.
            ledger: self
                .meta_get(LEDGER)?
                .and_then(|l| serde_json::from_slice(l.as_bytes()).ok())
                .unwrap_or_default(),
        };
        *self.limiter.borrow_mut() = Some(state.clone());
        Ok(state)
    }

    fn put_windows(&mut self, windows: &Windows) -> Sr<()> {
        self.meta_put("windows", &serde_json::to_string(windows).map_err(storage)?)?;
        self.with_state(|s| s.windows = windows.clone())
    }

    fn put_revoked(&mut self, at_ms: u64) -> Sr<()> {
        self.meta_put("revoked", &at_ms.to_string())?;
        self.with_state(|s| s.revoked = true)
    }

    fn put_profile(&mut self, profile: &Profile) -> Sr<()> {
        self.meta_put("profile", &serde_json::to_string(profile).map_err(storage)?)?;
        self.with_state(|s| s.profile = Some(profile.clone()))
    }

    fn put_ledger(&mut self, ledger: &Ledger) -> Sr<()> {
        self.meta_put(LEDGER, &serde_json::to_string(ledger).map_err(storage)?)?;
        self.with_state(|s| s.ledger = ledger.clone())
    }

    fn slots_in_use(&mut self, now_ms: u64) -> Sr<u32> {
        self.count(
            "SELECT COUNT(*) FROM slots WHERE until > ?",
            vec![int(now_ms)],
        )
    }

    fn put_slot(&mut self, id: &str, until_ms: u64) -> Sr<()> {
        self.exec(
            "INSERT INTO slots (id, until) VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET until = excluded.until",
            vec![id.into(), int(until_ms)],
        )?;
        Ok(())
    }

    fn delete_slot(&mut self, id: &str) -> Sr<()> {
        self.exec("DELETE FROM slots WHERE id = ?", vec![id.into()])?;
        Ok(())
    }

    fn delete_expired_slots(&mut self, now_ms: u64) -> Sr<()> {
        self.exec("DELETE FROM slots WHERE until <= ?", vec![int(now_ms)])?;
        Ok(())
    }

    fn record(&mut self, key: &str) -> Sr<Option<Record>> {
        let values = self.column("SELECT record FROM idem WHERE k = ?", vec![key.into()])?;
        match values.into_iter().next() {
            Some(SqlStorageValue::String(s)) => serde_json::from_slice(s.as_bytes())
                .map(Some)
                .map_err(storage),
            _ => Ok(None),
        }
    }

    fn put_record(&mut self, key: &str, record: &Record) -> Sr<()> {
        let text = serde_json::to_string(record).map_err(storage)?;
        self.exec(
            "INSERT INTO idem (k, record, expires_at) VALUES (?, ?, ?)
             ON CONFLICT(k) DO UPDATE SET record = excluded.record, expires_at = excluded.expires_at",
            vec![key.into(), text.into(), int(record.expires_at_ms())],
        )?;
        Ok(())
    }

    fn delete_record(&mut self, key: &str) -> Sr<()> {
        self.exec("DELETE FROM idem WHERE k = ?", vec![key.into()])?;
        Ok(())
    }

    fn body(&mut self, key: &str) -> Sr<Vec<u8>> {
        let chunks = self.column(
            "SELECT data FROM idem_body WHERE k = ? ORDER BY seq",
            vec![key.into()],
        )?;
        let mut out = Vec::new();
        for c in chunks {
            if let SqlStorageValue::Blob(b) = c {
                out.extend_from_slice(&b);
            }
        }
        Ok(out)
    }

    fn put_body(&mut self, key: &str, body: &[u8]) -> Sr<()> {
        for (seq, chunk) in body.chunks(CHUNK).enumerate() {
            self.exec(
                "INSERT INTO idem_body (k, seq, data) VALUES (?, ?, ?)",
                vec![
                    key.into(),
                    int(seq as u64),
                    SqlStorageValue::Blob(chunk.to_vec()),
                ],
            )?;
        }
        Ok(())
    }

    fn delete_body(&mut self, key: &str) -> Sr<()> {
        self.exec("DELETE FROM idem_body WHERE k = ?", vec![key.into()])?;
        Ok(())
    }

    fn expired(&mut self, now_ms: u64, limit: usize) -> Sr<Vec<String>> {
        let keys = self.column(
            "SELECT k FROM idem WHERE expires_at <= ? ORDER BY expires_at LIMIT ?",
            vec![int(now_ms), int(limit as u64)],
        )?;
        Ok(keys
            .into_iter()
            .filter_map(|v| match v {
                SqlStorageValue::String(s) => Some(s),
                _ => None,
            })
            .collect())
    }

    fn next_expiry(&mut self) -> Sr<Option<u64>> {
        self.earliest("SELECT MIN(expires_at) FROM idem")
    }

    fn operation(&mut self, id: &str) -> Sr<Option<operations::Operation>> {
        let found = self.documents("SELECT record FROM ops WHERE id = ?", vec![id.into()])?;
        Ok(found.into_iter().next())
    }

    fn put_operation(&mut self, op: &operations::Operation) -> Sr<()> {
        let text = serde_json::to_string(op).map_err(storage)?;
        let due = op.due_at.map_or(SqlStorageValue::Null, int);
        self.exec(
            "INSERT INTO ops (id, project, state, created_at, due_at, expires_at, record) VALUES (?, ?, ?, ?, ?, ?, ?)
             ON CONFLICT(id) DO UPDATE SET state = excluded.state, due_at = excluded.due_at,
             expires_at = excluded.expires_at, record = excluded.record",
            vec![
                op.id.as_str().into(),
                op.project().into(),
                op.state.as_str().into(),
                int(op.created_at),
                due,
                int(op.expires_at),
                text.into(),
            ],
        )?;
        Ok(())
    }

    fn delete_operation(&mut self, id: &str) -> Sr<()> {
        self.exec("DELETE FROM ops WHERE id = ?", vec![id.into()])?;
        self.exec("DELETE FROM op_body WHERE id = ?", vec![id.into()])?;
        Ok(())
    }

    fn op_body(&mut self, id: &str, part: Part) -> Sr<Vec<u8>> {
        self.blob(
            "SELECT data FROM op_body WHERE id = ? AND part = ? ORDER BY seq",
            vec![id.into(), int(part as u64)],
        )
    }

    fn put_op_body(&mut self, id: &str, part: Part, body: &[u8]) -> Sr<()> {
        for (seq, chunk) in body.chunks(CHUNK).enumerate() {
            self.exec(
                "INSERT OR REPLACE INTO op_body (id, part, seq, data) VALUES (?, ?, ?, ?)",
                vec![
                    id.into(),
                    int(part as u64),
                    int(seq as u64),
                    SqlStorageValue::Blob(chunk.to_vec()),
                ],
            )?;
        }
        Ok(())
    }

    fn operations(&mut self, page: &operations::Page) -> Sr<Vec<operations::Operation>> {
        let (at, id) = page.before.clone().unwrap_or((NEVER, String::new()));
        let mut binds = vec![page.project.as_str().into(), int(at), int(at), id.into()];
        let state = match page.state {
            Some(s) => {
                binds.push(s.as_str().into());
                " AND state = ?"
            }
            None => "",
        };
        binds.push(int(u64::from(page.limit)));
        self.documents(
            &format!(
                "SELECT record FROM ops WHERE project = ? AND (created_at < ? OR (created_at = ? AND id < ?)){state}
                 ORDER BY created_at DESC, id DESC LIMIT ?"
            ),
            binds,
        )
    }

    fn due_operations(&mut self, now_ms: u64, limit: usize) -> Sr<Vec<operations::Operation>> {
        self.documents(
            "SELECT record FROM ops WHERE due_at IS NOT NULL AND due_at <= ? ORDER BY due_at LIMIT ?",
            vec![int(now_ms), int(limit as u64)],
        )
    }

    fn expired_operations(&mut self, now_ms: u64, limit: usize) -> Sr<Vec<operations::Operation>> {
        self.documents(
            "SELECT record FROM ops WHERE expires_at <= ? ORDER BY expires_at LIMIT ?",
            vec![int(now_ms), int(limit as u64)],
        )
    }

    fn next_operation_expiry(&mut self) -> Sr<Option<u64>> {
        self.earliest("SELECT MIN(expires_at) FROM ops")
    }

    fn put_pending(&mut self, ev: &PendingEvent, now_ms: u64) -> Sr<()> {
        let text = serde_json::to_string(ev).map_err(storage)?;
        self.exec(
            "INSERT OR IGNORE INTO outbox (id, event, attempts, first_at, next_at) VALUES (?, ?, 0, ?, ?)",
            vec![ev.id.as_str().into(), text.into(), int(now_ms), int(now_ms)],
        )?;
        Ok(())
    }

    fn pending(&mut self, now_ms: u64, limit: usize) -> Sr<Vec<Pending>> {
        let rows = self
            .exec(
                "SELECT event, attempts, first_at FROM outbox WHERE next_at <= ? ORDER BY next_at LIMIT ?",
                vec![int(now_ms), int(limit as u64)],
            )?
            .raw();
        let mut out = Vec::new();
        for row in rows {
            let row = row.map_err(storage)?;
            let (Some(SqlStorageValue::String(ev)), Some(attempts), Some(first_at)) =
                (row.first(), row.get(1), row.get(2))
            else {
                continue;
            };
            let number = |v: &SqlStorageValue| match v {
                SqlStorageValue::Integer(i) => u64::try_from(*i).unwrap_or(0),
                _ => 0,
            };
            out.push(Pending {
                event: serde_json::from_str(ev).map_err(storage)?,
                attempts: u32::try_from(number(attempts)).unwrap_or(u32::MAX),
                first_at: number(first_at),
            });
        }
        Ok(out)
    }

    fn retry_pending(&mut self, id: &str, attempts: u32, next_at: u64) -> Sr<()> {
        self.exec(
            "UPDATE outbox SET attempts = ?, next_at = ? WHERE id = ?",
            vec![int(u64::from(attempts)), int(next_at), id.into()],
        )?;
        Ok(())
    }

    fn delete_pending(&mut self, id: &str) -> Sr<()> {
        self.exec("DELETE FROM outbox WHERE id = ?", vec![id.into()])?;
        Ok(())
    }

    fn next_work(&mut self) -> Sr<Option<u64>> {
        let ops = self.earliest("SELECT MIN(due_at) FROM ops")?;
        let events = self.earliest("SELECT MIN(next_at) FROM outbox")?;
        Ok(ops.into_iter().chain(events).min())
    }
}
