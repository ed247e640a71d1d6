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
//! requests at the origin). Expired records and slots are deleted by the
//! alarm in bounded batches.

use std::cell::{Cell, RefCell};

use postguard_core::frame;
use postguard_core::guard::{
    self, Admit, AdmitRequest, AdmitResponse, Complete, Finish, GuardError, GuardState, Operation,
    Profile, Release, Reply, Revoke, Update,
};
use postguard_core::idempotency::Record;
use postguard_core::limits::{Windows, DEFAULT_POLICY};
use postguard_core::rate_limit::Window;
use postguard_core::store::{self, GuardStore};
use wasm_bindgen::{JsCast, JsValue};
use worker::{
    durable_object, DurableObject, Env, Request, Response, Result, ScheduledTime, SqlStorage,
    SqlStorageValue, State,
};

use crate::runtime::now_ms;

#[wasm_bindgen::prelude::wasm_bindgen]
extern "C" {
    /// The object's `DurableObjectStorage`, for the one method `worker` lacks.
    type TxStorage;
    /// Runs the callback in a storage transaction: a callback that throws
    /// rolls back every write it made.
    #[wasm_bindgen(method, catch, js_name = transactionSync)]
    fn transaction_sync(
        this: &TxStorage,
        f: &mut dyn FnMut() -> std::result::Result<JsValue, JsValue>,
    ) -> std::result::Result<JsValue, JsValue>;
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS idem (k TEXT PRIMARY KEY, record TEXT NOT NULL, expires_at INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS idem_expires ON idem(expires_at);
CREATE TABLE IF NOT EXISTS idem_body (k TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (k, seq));
CREATE TABLE IF NOT EXISTS slots (id TEXT PRIMARY KEY, until INTEGER NOT NULL);
";

/// Body chunk size: well under SQLite-in-DO's 2 MB row limit.
const CHUNK: usize = 512 * 1024;
/// Records deleted per alarm run; more are left to an immediate next run.
const SWEEP_BATCH: usize = 500;

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

fn storage_js(e: &JsValue) -> GuardError {
    GuardError::Storage(e.as_string().unwrap_or_else(|| format!("{e:?}")))
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
        let min = self.column("SELECT MIN(expires_at) FROM idem", vec![])?;
        Ok(min.into_iter().next().and_then(|v| match v {
            SqlStorageValue::Integer(i) => u64::try_from(i).ok(),
            _ => None,
        }))
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
        let mut f = Some(f);
        let mut out: Option<Sr<T>> = None;
        let raw = self.state.storage();
        let storage: &TxStorage = raw.as_raw().unchecked_ref();
        let ran = storage.transaction_sync(&mut || {
            let result = match f.take() {
                Some(f) => f(&mut store),
                None => Err(GuardError::Storage("transaction callback ran twice".into())),
            };
            let failed = result.is_err();
            out = Some(result);
            match failed {
                // Throwing is what makes the runtime roll back.
                true => Err(JsValue::from_str("rolled back")),
                false => Ok(JsValue::UNDEFINED),
            }
        });
        let result = match (ran, out) {
            (Ok(_), Some(result)) => result,
            (Err(_), Some(Err(e))) => Err(e),
            (Err(e), _) => Err(storage_js(&e)),
            (Ok(_), None) => Err(GuardError::Storage("transaction did not run".into())),
        };
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
        let (req, _) = match decode::<Admit>(frame_bytes) {
            Ok(decoded) => decoded,
            Err(e) => return reply::<Admit>(Err(e)),
        };
        let answer = self.admitted(&req).await;
        let (head, payload) = match answer {
            Ok((r, p)) => (Ok(r), p),
            Err(e) => (Err(e), Vec::new()),
        };
        // In the layout the caller reads (ADR 0029).
        guard::encode_admit_reply(&head, req.v, &payload)
            .map_err(|e| worker::Error::RustError(e.to_string()))
    }

    async fn admitted(&self, req: &AdmitRequest) -> Sr<(AdmitResponse, Vec<u8>)> {
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
            true => self.atomically(|s| store::admit(s, req, now))?,
            false => self.directly(|s| store::admit(s, req, now))?,
        };
        self.arm(done.alarm_by).await?;
        Ok((done.answer, done.payload))
    }

    async fn complete(
        &self,
        frame_bytes: Vec<u8>,
    ) -> Sr<(<Complete as Operation>::Response, Vec<u8>)> {
        let (req, body) = decode::<Complete>(frame_bytes)?;
        let now = now_ms();
        let done = self.atomically(|s| store::complete(s, &req, &body, now))?;
        self.arm(done.alarm_by).await?;
        Ok((done.answer, Vec::new()))
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
            // Any operation's reply type carries an error alike; `Revoke`'s is the smallest.
            other => reply::<Revoke>(Err(GuardError::UnknownOperation(
                other.chars().take(64).collect(),
            ))),
        }
    }

    /// Arms the sweep for something written that expires at `expires_at`.
    async fn arm(&self, expires_at: Option<u64>) -> Sr<()> {
        match expires_at {
            Some(at) => {
                let due = store::sweep_at(at, self.lookup_grace_ms());
                self.alarm_by(due).await.map_err(storage)
            }
            None => Ok(()),
        }
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
        let swept = self
            .atomically(|s| store::sweep(s, now, SWEEP_BATCH, self.lookup_grace_ms()))
            .map_err(err)?;
        // After the commit: an object whose record is gone is never replayed.
        crate::replays::delete(&self.env, swept.objects).await;
        if let Some(next) = swept.next {
            let at = next.max(now);
            self.state.storage().set_alarm(at_epoch_ms(at)).await?;
            self.alarm_at.set(at);
        }
        Response::ok("swept")
    }
}

fn err(e: GuardError) -> worker::Error {
    worker::Error::RustError(e.to_string())
}
