//! `KeyGuard`: one SQLite-backed Durable Object per API key, holding the key's
//! rate-limit window, its revoked flag and its Idempotency-Key records.
//!
//! Concurrency: every handler reads its request body first (the only `await`
//! before the decision), then runs the core's orchestration
//! (`postguard_core::store`) over [`Sql`], a synchronous storage port — no
//! `await` between reading state and writing the decision, so two requests
//! can never interleave between check and claim. Alarm scheduling happens
//! after the writes and only ever moves an alarm earlier.
//!
//! Tables: `meta(k, v)` (`windows` — or a build's single `window` before
//! several policies, read as the `default` policy's —, `revoked`, `profile`),
//! `idem(k, record, expires_at)`, `idem_body(k, seq, data)` (response bodies
//! in chunks under the row limit), `slots(id, until)` (concurrency slots of
//! requests at the origin), `ops(id, …, record)` and `op_body(id, part, seq,
//! data)` (asynchronous operations and their request and result bodies,
//! ADR 0037), `outbox(id, event, …)` (events to publish: an operation's
//! completion, a response's event). Expired records, operations and slots
//! are deleted by the alarm in bounded batches.
//!
//! The alarm is also the outbox's worker (`alarm`): it hands due operations
//! to the `OPERATIONS` queue and publishes the events written to publish,
//! then records what it did — so a queue message is never the only copy of
//! an operation, and an event stored with a response is published even if
//! the isolate died right after the store.

use std::cell::{Cell, RefCell};

use postguard_core::frame;
use postguard_core::guard::{
    self, Admit, AdmitRequest, AdmitResponse, Complete, Finish, FinishOp, GetOp, GuardError,
    GuardState, ListOps, Operation, Profile, Release, Reply, Revoke, StartOp, Update,
};
use postguard_core::idempotency::Record;
use postguard_core::limits::{Windows, DEFAULT_POLICY};
use postguard_core::log::Line;
use postguard_core::operations::{self, NEVER};
use postguard_core::rate_limit::Window;
use postguard_core::response_events::PendingEvent;
use postguard_core::store::{self, GuardStore, Part, Pending};
use wasm_bindgen::JsValue;
use worker::{
    durable_object, DurableObject, Env, Request, Response, Result, ScheduledTime, SqlStorage,
    SqlStorageValue, State,
};

use crate::runtime::now_ms;

const SCHEMA: &str = "
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
const FORGET_AT: &str = "forget_at";
/// Body chunk size: well under SQLite-in-DO's 2 MB row limit.
const CHUNK: usize = 512 * 1024;
/// Records deleted per alarm run; more are left to an immediate next run.
const SWEEP_BATCH: usize = 500;
/// Operations handed to the queue, and events published, per alarm run.
const WORK_BATCH: usize = 50;
/// An operation the queue refused is handed on again after this long (ms).
const SEND_RETRY_MS: u64 = 5_000;

#[durable_object]
pub struct KeyGuard {
    state: State,
    env: Env,
    /// The object's SQL handle, fetched once (each fetch is two JS calls).
    sql: SqlStorage,
    schema_ready: Cell<bool>,
    /// The key's revoked flag, windows and profile, loaded once from `meta`
    /// and written through: this object is the only writer, so memory and
    /// storage never disagree.
    limiter: RefCell<Option<GuardState>>,
    /// Earliest alarm known to be set (epoch ms); 0 = unknown.
    alarm_at: Cell<u64>,
}

fn storage(e: impl std::fmt::Display) -> GuardError {
    GuardError::Storage(e.to_string())
}

/// An absolute alarm time. (`worker` reads a bare integer as an offset from
/// now, which would schedule epoch-ms alarms decades ahead.)
fn at_epoch_ms(ms: u64) -> ScheduledTime {
    ScheduledTime::new(worker::js_sys::Date::new(
        &worker::wasm_bindgen::JsValue::from_f64(ms as f64),
    ))
}

fn int(v: u64) -> SqlStorageValue {
    SqlStorageValue::Integer(i64::try_from(v).unwrap_or(i64::MAX))
}

/// The storage port over the object's SQLite tables.
struct Sql<'a> {
    sql: &'a SqlStorage,
    limiter: &'a RefCell<Option<GuardState>>,
}

type Sr<T> = std::result::Result<T, GuardError>;

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

    fn meta_get(&self, k: &str) -> Sr<Option<String>> {
        let values = self.column("SELECT v FROM meta WHERE k = ?", vec![k.into()])?;
        Ok(values.into_iter().find_map(|v| match v {
            SqlStorageValue::String(s) => Some(s),
            _ => None,
        }))
    }

    fn meta_put(&self, k: &str, v: &str) -> Sr<()> {
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

/// The request of operation `O` from a frame.
fn decode<O: Operation>(frame_bytes: Vec<u8>) -> Sr<(O::Request, Vec<u8>)> {
    frame::decode(frame_bytes).map_err(|e| GuardError::BadRequest(e.to_string()))
}

/// The framed reply of operation `O`.
fn reply<O: Operation>(reply: Sr<(O::Response, Vec<u8>)>) -> Result<Vec<u8>> {
    let (head, payload): (Reply<O::Response>, Vec<u8>) = match reply {
        Ok((r, p)) => (Ok(r), p),
        Err(e) => (Err(e), Vec::new()),
    };
    frame::encode(&head, &payload).map_err(|e| worker::Error::RustError(e.to_string()))
}

impl KeyGuard {
    fn store(&self) -> Sr<Sql<'_>> {
        if !self.schema_ready.get() {
            self.sql.exec(SCHEMA, None).map_err(storage)?;
            self.schema_ready.set(true);
        }
        Ok(Sql {
            sql: &self.sql,
            limiter: &self.limiter,
        })
    }

    /// Runs `f` over the storage port inside `transactionSync`: every write
    /// of one operation (the charge and the claim, a record and its body…)
    /// commits together or not at all. On failure the cached limiter state is
    /// dropped, so memory never keeps a write that was rolled back.
    fn atomically<T>(&self, f: impl FnOnce(&mut Sql<'_>) -> Sr<T>) -> Sr<T> {
        let mut store = self.store()?;
        let result =
            super::atomically(&self.state.storage(), || f(&mut store), GuardError::Storage);
        if result.is_err() {
            *self.limiter.borrow_mut() = None;
        }
        result
    }

    /// Runs `f` over the storage port without a transaction: for an
    /// operation that writes at most one statement (atomic on its own). As
    /// in [`Self::atomically`], a failure drops the cached limiter state.
    fn directly<T>(&self, f: impl FnOnce(&mut Sql<'_>) -> Sr<T>) -> Sr<T> {
        let result = f(&mut self.store()?);
        if result.is_err() {
            *self.limiter.borrow_mut() = None;
        }
        result
    }

    /// Makes sure an alarm fires no later than `at` (epoch ms).
    async fn alarm_by(&self, at: u64) -> Result<()> {
        let known = self.alarm_at.get();
        if known != 0 && known <= at {
            return Ok(());
        }
        let storage = self.state.storage();
        let current = storage
            .get_alarm()
            .await?
            .and_then(|t| u64::try_from(t).ok());
        match current {
            Some(t) if t <= at => self.alarm_at.set(t),
            _ => {
                storage.set_alarm(at_epoch_ms(at)).await?;
                self.alarm_at.set(at);
            }
        }
        Ok(())
    }

    /// Runs one operation: decode, the synchronous orchestration, then the
    /// alarm for what it wrote.
    async fn admit(&self, frame_bytes: Vec<u8>) -> Result<Vec<u8>> {
        let (req, body) = match decode::<Admit>(frame_bytes) {
            Ok(decoded) => decoded,
            Err(e) => return reply::<Admit>(Err(e)),
        };
        let answer = self.admitted(&req, &body).await;
        let (head, payload) = match answer {
            Ok((r, p)) => (Ok(r), p),
            Err(e) => (Err(e), Vec::new()),
        };
        // In the layout the caller reads (ADR 0029).
        guard::encode_admit_reply(&head, req.v, &payload)
            .map_err(|e| worker::Error::RustError(e.to_string()))
    }

    async fn admitted(&self, req: &AdmitRequest, body: &[u8]) -> Sr<(AdmitResponse, Vec<u8>)> {
        let now = now_ms();
        // A 429 (or a peek) with the limiter in memory writes nothing: no
        // transaction to open, no alarm to arm.
        let fast = self
            .limiter
            .borrow()
            .as_ref()
            .and_then(|state| store::admit_in_memory(state, req, now));
        if let Some(answer) = fast {
            return Ok((answer, Vec::new()));
        }
        let done = match store::admit_needs_transaction(req) {
            true => self.atomically(|s| store::admit(s, req, body, now))?,
            false => self.directly(|s| store::admit(s, req, body, now))?,
        };
        self.arm(done.alarm_by).await?;
        self.arm_work(done.work_at).await?;
        if let Some(at) = done.forget_at {
            self.directly(|s| s.meta_put(FORGET_AT, &at.to_string()))?;
            self.alarm_by(at).await.map_err(storage)?;
        }
        Ok((done.answer, done.payload))
    }

    /// A transient object past its `forget_at` deletes all it stores (and
    /// what it holds in memory): nothing is left per client address once
    /// its window is over. `true` when it did.
    async fn forget_if_over(&self, now: u64) -> Result<bool> {
        let at = self
            .directly(|s| s.meta_get(FORGET_AT))
            .map_err(err)?
            .and_then(|v| v.parse::<u64>().ok());
        match at {
            Some(at) if at <= now => {
                self.state.storage().delete_all().await?;
                *self.limiter.borrow_mut() = None;
                self.schema_ready.set(false);
                Ok(true)
            }
            Some(at) => {
                self.alarm_by(at).await?;
                Ok(false)
            }
            None => Ok(false),
        }
    }

    async fn complete(
        &self,
        frame_bytes: Vec<u8>,
    ) -> Sr<(<Complete as Operation>::Response, Vec<u8>)> {
        let (req, body) = decode::<Complete>(frame_bytes)?;
        let now = now_ms();
        let done = self.atomically(|s| store::complete(s, &req, &body, now))?;
        self.arm(done.alarm_by).await?;
        self.arm_work(done.work_at).await?;
        Ok((done.answer, Vec::new()))
    }

    /// An operation's call (`start`, `finish`, `get`): run in one
    /// transaction, then arm the alarm for what it wrote.
    async fn on_operation<O: Operation, T>(
        &self,
        frame_bytes: Vec<u8>,
        f: impl FnOnce(&mut Sql<'_>, &O::Request, &[u8], u64) -> Sr<store::Done<T>>,
        into: impl FnOnce(T) -> O::Response,
    ) -> Sr<(O::Response, Vec<u8>)> {
        let (req, body) = decode::<O>(frame_bytes)?;
        let now = now_ms();
        let done = self.atomically(|s| f(s, &req, &body, now))?;
        self.arm(done.alarm_by).await?;
        self.arm_work(done.work_at).await?;
        Ok((into(done.answer), done.payload))
    }

    /// Runs operation `op` (its `Operation::PATH`) on a request frame and
    /// answers the reply frame: the one dispatcher of RPC and `fetch` alike.
    async fn run(&self, op: &str, body: Vec<u8>) -> Result<Vec<u8>> {
        match op {
            Admit::PATH => self.admit(body).await,
            Complete::PATH => reply::<Complete>(self.complete(body).await),
            Release::PATH => {
                reply::<Release>(decode::<Release>(body).and_then(|(r, _)| {
                    Ok((self.atomically(|s| store::release(s, &r))?, Vec::new()))
                }))
            }
            Revoke::PATH => reply::<Revoke>(decode::<Revoke>(body).and_then(|_| {
                let now = now_ms();
                Ok((self.atomically(|s| store::revoke(s, now))?, Vec::new()))
            })),
            Finish::PATH => reply::<Finish>(decode::<Finish>(body).and_then(|(r, _)| {
                Ok((self.directly(|s| store::finish(s, &r.slot))?, Vec::new()))
            })),
            Update::PATH => reply::<Update>(decode::<Update>(body).and_then(|(r, _)| {
                Ok((
                    self.atomically(|s| store::update(s, &r.profile))?,
                    Vec::new(),
                ))
            })),
            StartOp::PATH => reply::<StartOp>(
                self.on_operation::<StartOp, _>(
                    body,
                    |s, r, _, now| store::start_operation(s, r, now),
                    |a| a,
                )
                .await,
            ),
            FinishOp::PATH => reply::<FinishOp>(
                self.on_operation::<FinishOp, _>(
                    body,
                    |s, r, b, now| store::finish_operation(s, r, b, now),
                    |a| a,
                )
                .await,
            ),
            GetOp::PATH => reply::<GetOp>(
                self.on_operation::<GetOp, _>(
                    body,
                    |s, r, _, now| store::get_operation(s, r, now),
                    |a| a,
                )
                .await,
            ),
            ListOps::PATH => reply::<ListOps>(decode::<ListOps>(body).and_then(|(r, _)| {
                Ok((
                    self.directly(|s| store::list_operations(s, &r))?,
                    Vec::new(),
                ))
            })),
            // Any operation's reply type carries an error alike; `Revoke`'s is the smallest.
            other => reply::<Revoke>(Err(GuardError::UnknownOperation(
                other.chars().take(64).collect(),
            ))),
        }
    }

    /// Arms the sweep for something written that expires at `expires_at`.
    async fn arm(&self, expires_at: Option<u64>) -> Sr<()> {
        match expires_at.filter(|at| *at < NEVER) {
            Some(at) => {
                let due = store::sweep_at(at, self.lookup_grace_ms());
                self.alarm_by(due).await.map_err(storage)
            }
            None => Ok(()),
        }
    }

    /// Arms the alarm for work due at `at` (an operation, an event).
    async fn arm_work(&self, at: Option<u64>) -> Sr<()> {
        match at {
            Some(at) => self.alarm_by(at).await.map_err(storage),
            None => Ok(()),
        }
    }

    /// The alarm's outbox work: publish the events due, hand the operations
    /// due to the queue, then record each result. Each step's failure is
    /// logged and left to a later alarm; none stops the sweep. `false` when
    /// the configuration cannot be read (the worker refuses every request
    /// meanwhile): then nothing is done until it is fixed.
    async fn work(&self, now: u64) -> bool {
        let Ok(cfg) = crate::runtime::config(&self.env) else {
            return false;
        };
        let due = match self.directly(|s| store::work(s, now, WORK_BATCH)) {
            Ok(w) => w,
            Err(e) => {
                crate::log::emit(Line::error("reading the outbox failed").err(e));
                return true;
            }
        };
        for p in &due.publishes {
            let ok = match crate::operations::publish::one(&self.env, &cfg, &p.event).await {
                Ok(()) => true,
                Err(e) => {
                    crate::log::emit(
                        Line::warn("publishing an event failed; retried later")
                            .field("event_id", p.event.id.as_str())
                            .field("request_id", p.event.request_id.as_str())
                            .err(e),
                    );
                    false
                }
            };
            match self.atomically(|s| store::published(s, p, ok, now_ms())) {
                Ok(true) => crate::log::emit(
                    Line::error("an event could not be published for a day and is dropped")
                        .field("event_id", p.event.id.as_str())
                        .field("request_id", p.event.request_id.as_str()),
                ),
                Ok(false) => {}
                Err(e) => crate::log::emit(Line::error("recording a publish failed").err(e)),
            }
        }
        if due.sends.is_empty() {
            return true;
        }
        let ids: Vec<&str> = due.sends.iter().map(|(id, _)| id.as_str()).collect();
        // Handed on: looked at again after `requeue_after_s`; not handed on:
        // tried again in a few seconds.
        let requeue_ms = match crate::operations::queue::send(&self.env, &ids).await {
            Ok(()) => u64::from(cfg.settings.async_ops.requeue_after_s) * 1000,
            Err(e) => {
                crate::log::emit(Line::error("handing operations to the queue failed").err(e));
                SEND_RETRY_MS
            }
        };
        if let Err(e) = self.atomically(|s| store::requeued(s, &due.sends, now_ms(), requeue_ms)) {
            crate::log::emit(Line::error("recording operations handed to the queue failed").err(e));
        }
        true
    }

    /// `idempotency.lookup_grace_s` in ms. The worker validated the config
    /// before calling; if it cannot be read here, records are swept at expiry.
    fn lookup_grace_ms(&self) -> u64 {
        crate::runtime::config(&self.env)
            .map(|c| u64::from(c.settings.idempotency.lookup_grace_s) * 1000)
            .unwrap_or(0)
    }
}

/// The object's RPC method, called by `run` of the JS class that the worker's
/// entry (`src/entry.mjs`) exports as `KeyGuard` (the runtime offers RPC
/// only on a class extending `DurableObject`, which the `durable_object`
/// macro's class does not; ADR 0018). A JS RPC call costs the isolate less
/// than a `fetch` to the object: no Request, Response or Headers built on
/// either side, no body stream.
#[wasm_bindgen::prelude::wasm_bindgen(
    wasm_bindgen = ::worker::wasm_bindgen,
    wasm_bindgen_futures = ::worker::wasm_bindgen_futures,
    js_sys = ::worker::js_sys
)]
impl KeyGuard {
    /// Operation `op` (an `Operation::PATH`) on a request frame; resolves
    /// to the reply frame. Rejects only when the reply cannot be encoded.
    pub async fn rpc(
        &self,
        op: String,
        frame: Vec<u8>,
    ) -> std::result::Result<worker::js_sys::Uint8Array, JsValue> {
        let out = self.run(&op, frame).await.map_err(JsValue::from)?;
        Ok(worker::js_sys::Uint8Array::from(out.as_slice()))
    }
}

impl DurableObject for KeyGuard {
    fn new(state: State, env: Env) -> Self {
        KeyGuard {
            env,
            sql: state.storage().sql(),
            state,
            schema_ready: Cell::new(false),
            limiter: RefCell::new(None),
            alarm_at: Cell::new(0),
        }
    }

    /// The same operations over HTTP (`POST https://key-guard/<op>`, the frame
    /// as body): the worker calls [`KeyGuard::rpc`]; this stays for callers
    /// without the RPC glue (a test flagging an object revoked directly).
    async fn fetch(&self, mut req: Request) -> Result<Response> {
        let path = req.path();
        let body = req.bytes().await?;
        Ok(Response::from_bytes(self.run(&path, body).await?)?.with_status(200))
    }

    async fn alarm(&self) -> Result<Response> {
        self.alarm_at.set(0);
        let now = now_ms();
        if self.forget_if_over(now).await? {
            return Response::ok("forgotten");
        }
        let worked = self.work(now).await;
        let swept = self
            .atomically(|s| store::sweep(s, now, SWEEP_BATCH, self.lookup_grace_ms()))
            .map_err(err)?;
        // After the commit: an object whose record is gone is never replayed.
        crate::replays::delete(&self.env, swept.objects).await;
        // Work that failed or was left (a full batch) is due again; a failed
        // publish a little later (its own retry time).
        let pause = if worked { 1_000 } else { 60_000 };
        let work = self
            .directly(|s| s.next_work())
            .map_err(err)?
            .map(|at| at.max(now.saturating_add(pause)));
        let next = swept.next.into_iter().chain(work).min();
        if let Some(next) = next {
            let at = next.max(now_ms());
            self.state.storage().set_alarm(at_epoch_ms(at)).await?;
            self.alarm_at.set(at);
        }
        Response::ok("swept")
    }
}

fn err(e: GuardError) -> worker::Error {
    worker::Error::RustError(e.to_string())
}
