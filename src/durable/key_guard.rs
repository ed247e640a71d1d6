//! `KeyGuard`: one SQLite-backed Durable Object per API key, holding the key's
//! rate-limit window, its revoked flag and its Idempotency-Key records.
//!
//! Concurrency: every handler reads its request body first (the only `await`
//! before the decision), then reads state, decides (`postguard_core::guard`)
//! and writes with synchronous SQL calls — no `await` in between — so two
//! requests can never interleave between check and claim. Alarm scheduling
//! happens after the writes and only ever moves an alarm earlier.
//!
//! Tables: `meta(k, v)` (window, revoked), `idem(k, record, expires_at)`,
//! `idem_body(k, seq, data)` (response bodies in chunks under the row limit).
//! Expired records are deleted by the alarm in bounded batches.

use std::cell::Cell;

use postguard_core::frame;
use postguard_core::guard::{
    self, Ack, AdmitRequest, AdmitResponse, CompleteRequest, ReleaseRequest,
};
use postguard_core::idempotency::{Decision, Record};
use postguard_core::rate_limit::Window;
use serde::Serialize;
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
";

/// Body chunk size: well under SQLite-in-DO's 2 MB row limit.
const CHUNK: usize = 512 * 1024;
/// Records deleted per alarm run; more are left to an immediate next run.
const SWEEP_BATCH: i64 = 500;

/// Revoked flag and rate window, as cached in memory.
#[derive(Clone, Copy)]
struct LimiterState {
    revoked: bool,
    window: Option<Window>,
}

#[durable_object]
pub struct KeyGuard {
    state: State,
    /// The object's SQL handle, fetched once (each fetch is two JS calls).
    sql: SqlStorage,
    schema_ready: Cell<bool>,
    /// The key's limiter state, loaded once from `meta` and written through:
    /// this object is the only writer, so memory and storage never disagree.
    limiter: Cell<Option<LimiterState>>,
    /// Earliest alarm known to be set (epoch ms); 0 = unknown.
    alarm_at: Cell<u64>,
}

fn err(e: impl std::fmt::Display) -> worker::Error {
    worker::Error::RustError(e.to_string())
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

impl KeyGuard {
    fn sql(&self) -> Result<&SqlStorage> {
        if !self.schema_ready.get() {
            self.sql.exec(SCHEMA, None)?;
            self.schema_ready.set(true);
        }
        Ok(&self.sql)
    }

    fn limiter(&self, sql: &SqlStorage) -> Result<LimiterState> {
        if let Some(state) = self.limiter.get() {
            return Ok(state);
        }
        let state = LimiterState {
            revoked: Self::meta_get(sql, "revoked")?.is_some(),
            window: Self::meta_get(sql, "window")?.and_then(|s| serde_json::from_str(&s).ok()),
        };
        self.limiter.set(Some(state));
        Ok(state)
    }

    fn meta_get(sql: &SqlStorage, k: &str) -> Result<Option<String>> {
        let rows = sql
            .exec("SELECT v FROM meta WHERE k = ?", vec![k.into()])?
            .raw();
        for row in rows {
            if let Some(SqlStorageValue::String(s)) = row?.into_iter().next() {
                return Ok(Some(s));
            }
        }
        Ok(None)
    }

    fn meta_put(sql: &SqlStorage, k: &str, v: &str) -> Result<()> {
        sql.exec(
            "INSERT INTO meta (k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v",
            vec![k.into(), v.into()],
        )?;
        Ok(())
    }

    fn record(sql: &SqlStorage, key: &str) -> Result<Option<Record>> {
        let rows = sql
            .exec("SELECT record FROM idem WHERE k = ?", vec![key.into()])?
            .raw();
        for row in rows {
            if let Some(SqlStorageValue::String(s)) = row?.into_iter().next() {
                return serde_json::from_str(&s).map(Some).map_err(err);
            }
        }
        Ok(None)
    }

    fn put_record(sql: &SqlStorage, key: &str, rec: &Record) -> Result<()> {
        let text = serde_json::to_string(rec).map_err(err)?;
        sql.exec(
            "INSERT INTO idem (k, record, expires_at) VALUES (?, ?, ?)
             ON CONFLICT(k) DO UPDATE SET record = excluded.record, expires_at = excluded.expires_at",
            vec![key.into(), text.into(), int(rec.expires_at_ms())],
        )?;
        Ok(())
    }

    fn delete_body(sql: &SqlStorage, key: &str) -> Result<()> {
        sql.exec("DELETE FROM idem_body WHERE k = ?", vec![key.into()])?;
        Ok(())
    }

    /// Writes a body for a key that has none.
    fn put_body(sql: &SqlStorage, key: &str, body: &[u8]) -> Result<()> {
        for (seq, chunk) in body.chunks(CHUNK).enumerate() {
            sql.exec(
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

    fn body(sql: &SqlStorage, key: &str) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for row in sql
            .exec(
                "SELECT data FROM idem_body WHERE k = ? ORDER BY seq",
                vec![key.into()],
            )?
            .raw()
        {
            if let Some(SqlStorageValue::Blob(b)) = row?.into_iter().next() {
                out.extend_from_slice(&b);
            }
        }
        Ok(out)
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

    async fn admit(&self, frame_bytes: Vec<u8>) -> Result<Response> {
        let (req, _): (AdmitRequest, Vec<u8>) = frame::decode(frame_bytes).map_err(err)?;
        let now = now_ms();
        // ---- synchronous section: read, decide, write ----
        let sql = self.sql()?;
        let LimiterState { revoked, window } = self.limiter(sql)?;
        let record = match &req.claim {
            Some(c) => Self::record(sql, &c.key)?,
            None => None,
        };
        let plan = guard::admit(revoked, window, record.as_ref(), &req, now);
        if let Some(w) = plan.window {
            Self::meta_put(sql, "window", &serde_json::to_string(&w).map_err(err)?)?;
            self.limiter.set(Some(LimiterState {
                revoked,
                window: Some(w),
            }));
        }
        let mut payload = Vec::new();
        if let (Some(c), Some(new_claim)) = (&req.claim, &plan.claim) {
            Self::put_record(sql, &c.key, new_claim)?;
            // A claim that replaces an expired record drops its old body.
            if record.is_some() {
                Self::delete_body(sql, &c.key)?;
            }
        }
        if let (
            Some(c),
            AdmitResponse::Admitted {
                idempotency: Some(Decision::Replay),
                replay: Some(r),
                ..
            },
        ) = (&req.claim, &plan.response)
        {
            if !r.body_omitted {
                payload = Self::body(sql, &c.key)?;
            }
        }
        // ---- end of synchronous section ----
        if let Some(rec) = &plan.claim {
            self.alarm_by(rec.expires_at_ms()).await?;
        }
        framed(&plan.response, &payload)
    }

    async fn complete(&self, frame_bytes: Vec<u8>) -> Result<Response> {
        let (req, body): (CompleteRequest, Vec<u8>) = frame::decode(frame_bytes).map_err(err)?;
        let now = now_ms();
        let sql = self.sql()?;
        let current = Self::record(sql, &req.key)?;
        let stored = guard::complete(current.as_ref(), &req, now);
        if let Some(rec) = &stored {
            Self::put_record(sql, &req.key, rec)?;
            // Only an in-progress claim completes, and claiming removed any
            // older body, so there is nothing to delete first.
            if !req.response.body_omitted {
                Self::put_body(sql, &req.key, &body)?;
            }
        }
        if let Some(rec) = &stored {
            self.alarm_by(rec.expires_at_ms()).await?;
        }
        framed(
            &Ack {
                applied: stored.is_some(),
            },
            &[],
        )
    }

    fn release(&self, frame_bytes: Vec<u8>) -> Result<Response> {
        let (req, _): (ReleaseRequest, Vec<u8>) = frame::decode(frame_bytes).map_err(err)?;
        let sql = self.sql()?;
        let current = Self::record(sql, &req.key)?;
        let applied = guard::should_release(current.as_ref(), &req);
        if applied {
            // Only an in-flight claim is released, and it has no body.
            sql.exec(
                "DELETE FROM idem WHERE k = ?",
                vec![req.key.as_str().into()],
            )?;
        }
        framed(&Ack { applied }, &[])
    }

    fn revoke(&self) -> Result<Response> {
        let sql = self.sql()?;
        let current = self.limiter(sql)?;
        Self::meta_put(sql, "revoked", &now_ms().to_string())?;
        self.limiter.set(Some(LimiterState {
            revoked: true,
            ..current
        }));
        framed(&Ack { applied: true }, &[])
    }

    /// Deletes expired records (one bounded batch) and re-arms the alarm for
    /// the next expiry.
    fn sweep(&self, now: u64) -> Result<Option<u64>> {
        let sql = self.sql()?;
        let expired: Vec<String> = sql
            .exec(
                "SELECT k FROM idem WHERE expires_at <= ? ORDER BY expires_at LIMIT ?",
                vec![int(now), SWEEP_BATCH.into()],
            )?
            .raw()
            .filter_map(|row| match row.ok()?.into_iter().next()? {
                SqlStorageValue::String(s) => Some(s),
                _ => None,
            })
            .collect();
        for k in &expired {
            sql.exec("DELETE FROM idem WHERE k = ?", vec![k.as_str().into()])?;
            Self::delete_body(sql, k)?;
        }
        if expired.len() as i64 == SWEEP_BATCH {
            return Ok(Some(now));
        }
        let next = sql
            .exec("SELECT MIN(expires_at) FROM idem", None)?
            .raw()
            .next()
            .and_then(|r| r.ok())
            .and_then(|r| r.into_iter().next())
            .and_then(|v| match v {
                SqlStorageValue::Integer(i) => u64::try_from(i).ok(),
                _ => None,
            });
        Ok(next)
    }
}

fn framed<T: Serialize>(meta: &T, payload: &[u8]) -> Result<Response> {
    let bytes = frame::encode(meta, payload).map_err(err)?;
    Ok(Response::from_bytes(bytes)?.with_status(200))
}

impl DurableObject for KeyGuard {
    fn new(state: State, _env: Env) -> Self {
        KeyGuard {
            sql: state.storage().sql(),
            state,
            schema_ready: Cell::new(false),
            limiter: Cell::new(None),
            alarm_at: Cell::new(0),
        }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        let path = req.path();
        let body = req.bytes().await?;
        let result = match path.as_str() {
            "/admit" => self.admit(body).await,
            "/complete" => self.complete(body).await,
            "/release" => self.release(body),
            "/revoke" => self.revoke(),
            _ => return Response::error("unknown key-guard operation", 404),
        };
        match result {
            Ok(r) => Ok(r),
            Err(e) => Response::error(format!("key guard error: {e}"), 500),
        }
    }

    async fn alarm(&self) -> Result<Response> {
        self.alarm_at.set(0);
        let now = now_ms();
        if let Some(next) = self.sweep(now)? {
            let at = next.max(now);
            self.state.storage().set_alarm(at_epoch_ms(at)).await?;
            self.alarm_at.set(at);
        }
        Response::ok("swept")
    }
}
