//! `KeyGuard`: one SQLite-backed Durable Object per API key (and per portal
//! session, deployment secret and client address), holding the key's
//! rate-limit windows, its revoked flag, its profile, its Idempotency-Key
//! records and its asynchronous operations.
//!
//! A thin class: each operation of the typed protocol
//! (`postguard_core::guard::Operation`) is decoded, run through the core's
//! orchestration (`postguard_core::store`) over [`sql::Sql`], the object's
//! synchronous storage port — no `await` between reading state and writing
//! the decision, so two requests never interleave between check and claim —
//! and answered; then the alarm is armed for what it wrote (only ever
//! earlier). The object calls nothing above it: its alarm's outbox (events
//! to publish, operations to hand to the queue, R2 objects to delete) is run
//! by the shell (`src/operations/outbox.rs`), which the object's JS class
//! (`src/entry.mjs`) hands the alarm to and which drives it through the
//! `DueWork`, `Published`, `Requeued` and `Sweep` operations.
//!
//! The same class serves two roles: a key's own object (the *home*, named
//! by the key's id) and, when `limits.edge` is on, an *edge* of the key in
//! one location (`edge.rs`, ADR 0040), which calls the home's `Lease`.

mod edge;
mod rendezvous;
mod sql;

use std::cell::{Cell, RefCell};

use postguard_core::frame;
use postguard_core::guard::{
    self, Admit, AdmitRequest, AdmitResponse, Complete, DueWork, EdgeAdmit, EdgeEnd, Finish,
    FinishOp, GetOp, GuardError, GuardState, ImportKeys, Lease, ListOps, Operation, Published,
    Release, Reply, Requeued, Revoke, StartOp, Sweep, SweepReply, SweepRequest, Update, Verified,
    Verify,
};
use postguard_core::operations::NEVER;
use postguard_core::store::{self, GuardStore};
use wasm_bindgen::JsValue;
use worker::{durable_object, DurableObject, Env, Request, Response, Result, State};

use crate::runtime::now_ms;
use sql::{storage, Sql, Sr, FORGET_AT, SCHEMA};

#[durable_object]
pub struct KeyGuard {
    state: State,
    env: Env,
    /// The object's SQL handle, fetched once (each fetch is two JS calls).
    sql: worker::SqlStorage,
    schema_ready: Cell<bool>,
    /// The key's revoked flag, windows and profile, loaded once from `meta`
    /// and written through: this object is the only writer, so memory and
    /// storage never disagree.
    limiter: RefCell<Option<GuardState>>,
    /// Earliest alarm known to be set (epoch ms); 0 = unknown.
    alarm_at: Cell<u64>,
    /// The first requests with a key not known yet (`auth.verify_unknown_keys`).
    rendezvous: rendezvous::Rendezvous,
    /// The edge role (ADR 0040): an object named for a key in one location
    /// keeps that key's leases here, in memory only.
    edge: edge::EdgeRole,
}

/// An absolute alarm time. (`worker` reads a bare integer as an offset from
/// now, which would schedule epoch-ms alarms decades ahead.)
fn at_epoch_ms(ms: u64) -> worker::ScheduledTime {
    worker::ScheduledTime::new(worker::js_sys::Date::new(&JsValue::from_f64(ms as f64)))
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
    async fn alarm_by(&self, at: u64) -> Sr<()> {
        let known = self.alarm_at.get();
        if known != 0 && known <= at {
            return Ok(());
        }
        let storage = self.state.storage();
        let current = storage
            .get_alarm()
            .await
            .map_err(storage_err)?
            .and_then(|t| u64::try_from(t).ok());
        match current {
            Some(t) if t <= at => self.alarm_at.set(t),
            _ => {
                storage
                    .set_alarm(at_epoch_ms(at))
                    .await
                    .map_err(storage_err)?;
                self.alarm_at.set(at);
            }
        }
        Ok(())
    }

    /// Arms the alarm for what an operation wrote: the sweep of what expires
    /// (`store::sweep_at`), work due (an operation, an event), a transient
    /// object's end.
    async fn arm<T>(&self, done: &store::Done<T>) -> Sr<()> {
        if let Some(at) = done.alarm_by.filter(|at| *at < NEVER) {
            self.alarm_by(store::sweep_at(at, self.lookup_grace_ms()))
                .await?;
        }
        if let Some(at) = done.work_at {
            self.alarm_by(at).await?;
        }
        if let Some(at) = done.forget_at {
            self.directly(|s| s.meta_put(FORGET_AT, &at.to_string()))?;
            self.alarm_by(at).await?;
        }
        Ok(())
    }

    async fn admit(&self, frame_bytes: Vec<u8>) -> Result<Vec<u8>> {
        let (req, body) = match decode::<Admit>(frame_bytes) {
            Ok(decoded) => decoded,
            Err(e) => return reply::<Admit>(Err(e)),
        };
        let (head, payload) = match self.admitted(&req, &body).await {
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
        // Decided before the match: its borrow of the limiter must end first.
        let tx = store::admit_needs_transaction(req, self.limiter.borrow().as_ref(), now);
        let done = match tx {
            true => self.atomically(|s| store::admit(s, req, body, now))?,
            false => self.directly(|s| store::admit(s, req, body, now))?,
        };
        self.arm(&done).await?;
        Ok((done.answer, done.payload))
    }

    /// An operation run in one transaction, then the alarm armed for what
    /// it wrote.
    async fn transact<O: Operation, T>(
        &self,
        frame_bytes: Vec<u8>,
        f: impl FnOnce(&mut Sql<'_>, &O::Request, &[u8], u64) -> Sr<store::Done<T>>,
        into: impl FnOnce(T) -> O::Response,
    ) -> Sr<(O::Response, Vec<u8>)> {
        let (req, body) = decode::<O>(frame_bytes)?;
        let now = now_ms();
        let done = self.atomically(|s| f(s, &req, &body, now))?;
        self.arm(&done).await?;
        Ok((into(done.answer), done.payload))
    }

    /// An operation that writes nothing the alarm cares about: `f` in one
    /// transaction (or directly, `tx` false), its answer.
    fn plain<O: Operation>(
        &self,
        frame_bytes: Vec<u8>,
        tx: bool,
        f: impl FnOnce(&mut Sql<'_>, &O::Request, u64) -> Sr<O::Response>,
    ) -> Sr<(O::Response, Vec<u8>)> {
        let (req, _) = decode::<O>(frame_bytes)?;
        let now = now_ms();
        let answer = match tx {
            true => self.atomically(|s| f(s, &req, now))?,
            false => self.directly(|s| f(s, &req, now))?,
        };
        Ok((answer, Vec::new()))
    }

    /// Runs operation `op` (its `Operation::PATH`) on a request frame and
    /// answers the reply frame: the one dispatcher of RPC and `fetch` alike.
    async fn run(&self, op: &str, body: Vec<u8>) -> Result<Vec<u8>> {
        use store as st;
        match op {
            Admit::PATH => self.admit(body).await,
            Complete::PATH => reply::<Complete>(
                self.transact::<Complete, _>(
                    body,
                    |s, r, b, now| st::complete(s, r, b, now),
                    |a| a,
                )
                .await,
            ),
            Release::PATH => {
                reply::<Release>(self.plain::<Release>(body, true, |s, r, _| st::release(s, r)))
            }
            Revoke::PATH => {
                reply::<Revoke>(self.plain::<Revoke>(body, true, |s, _, now| st::revoke(s, now)))
            }
            Finish::PATH => {
                reply::<Finish>(self.plain::<Finish>(body, false, |s, r, _| st::finish(s, &r.slot)))
            }
            Update::PATH => reply::<Update>(
                self.plain::<Update>(body, true, |s, r, _| st::update(s, &r.profile)),
            ),
            StartOp::PATH => reply::<StartOp>(
                self.transact::<StartOp, _>(
                    body,
                    |s, r, _, now| st::start_operation(s, r, now),
                    |a| a,
                )
                .await,
            ),
            FinishOp::PATH => reply::<FinishOp>(
                self.transact::<FinishOp, _>(
                    body,
                    |s, r, b, now| st::finish_operation(s, r, b, now),
                    |a| a,
                )
                .await,
            ),
            GetOp::PATH => reply::<GetOp>(
                self.transact::<GetOp, _>(body, |s, r, _, now| st::get_operation(s, r, now), |a| a)
                    .await,
            ),
            ListOps::PATH => reply::<ListOps>(
                self.plain::<ListOps>(body, false, |s, r, _| st::list_operations(s, r)),
            ),
            DueWork::PATH => reply::<DueWork>(
                self.plain::<DueWork>(body, false, |s, r, now| st::work(s, now, r.batch as usize)),
            ),
            Published::PATH => {
                reply::<Published>(self.plain::<Published>(body, true, |s, r, now| {
                    st::published(s, &r.pending, r.ok, now)
                }))
            }
            Requeued::PATH => reply::<Requeued>(self.plain::<Requeued>(body, true, |s, r, now| {
                st::requeued(s, &r.sends, now, r.requeue_ms)?;
                Ok(guard::Ack { applied: true })
            })),
            // Not the key's state: a chunk of an import, stored in KV by a
            // call of its own (ADR 0041).
            ImportKeys::PATH => reply::<ImportKeys>(match decode::<ImportKeys>(body) {
                Ok((chunk, _)) => crate::keystore::import_chunk(&self.env, chunk)
                    .await
                    .map(|a| (a, Vec::new()))
                    .map_err(|e| GuardError::Storage(format!("{e:?}"))),
                Err(e) => Err(e),
            }),
            Verify::PATH => reply::<Verify>(match decode::<Verify>(body) {
                Ok((r, _)) => Ok((self.rendezvous.verify(&r).await, Vec::new())),
                Err(e) => Err(e),
            }),
            Verified::PATH => reply::<Verified>(decode::<Verified>(body).map(|(r, _)| {
                self.rendezvous.verified(&r);
                (guard::Ack { applied: true }, Vec::new())
            })),
            // The home's side of an edge's call: admission and grant in one
            // transaction (ADR 0040).
            Lease::PATH => reply::<Lease>(
                self.transact::<Lease, _>(body, |s, r, b, now| st::lease(s, r, b, now), |a| a)
                    .await,
            ),
            // The edge role: memory only, no storage.
            EdgeAdmit::PATH => reply::<EdgeAdmit>(match decode::<EdgeAdmit>(body) {
                Ok((r, _)) => self.edge.admit(&self.env, &r).await,
                Err(e) => Err(e),
            }),
            EdgeEnd::PATH => reply::<EdgeEnd>(decode::<EdgeEnd>(body).map(|(r, _)| {
                self.edge.end(r.life);
                (guard::Ack { applied: true }, Vec::new())
            })),
            Sweep::PATH => reply::<Sweep>(match decode::<Sweep>(body) {
                Ok((r, _)) => self.sweep(&r).await.map(|a| (a, Vec::new())),
                Err(e) => Err(e),
            }),
            // Any operation's reply type carries an error alike; `Revoke`'s is the smallest.
            other => reply::<Revoke>(Err(GuardError::UnknownOperation(
                other.chars().take(64).collect(),
            ))),
        }
    }

    /// `Sweep`, the alarm's last step: a transient object past its end
    /// forgets everything (nothing is left per client address once its
    /// window is over); any other deletes one batch of what expired and sets
    /// its next alarm (`store::next_alarm`).
    async fn sweep(&self, r: &SweepRequest) -> Sr<SweepReply> {
        let now = now_ms();
        self.alarm_at.set(0);
        let forget_at = self
            .directly(|s| s.meta_get(FORGET_AT))?
            .and_then(|v| v.parse::<u64>().ok());
        if forget_at.is_some_and(|at| at <= now) {
            self.state
                .storage()
                .delete_all()
                .await
                .map_err(storage_err)?;
            *self.limiter.borrow_mut() = None;
            self.schema_ready.set(false);
            return Ok(SweepReply {
                objects: Vec::new(),
                next_alarm: None,
                forgotten: true,
            });
        }
        let swept = self.atomically(|s| store::sweep(s, now, r.batch as usize, r.grace_ms))?;
        let work = self.directly(|s| s.next_work())?;
        let next = store::next_alarm(swept.next, work, r.worked, now)
            .into_iter()
            .chain(forget_at)
            .min();
        if let Some(at) = next {
            self.state
                .storage()
                .set_alarm(at_epoch_ms(at))
                .await
                .map_err(storage_err)?;
            self.alarm_at.set(at);
        }
        Ok(SweepReply {
            objects: swept.objects,
            next_alarm: next,
            forgotten: false,
        })
    }

    /// `idempotency.lookup_grace_s` in ms. The worker validated the config
    /// before calling; if it cannot be read here, records are swept at expiry.
    fn lookup_grace_ms(&self) -> u64 {
        crate::runtime::config(&self.env)
            .map(|c| u64::from(c.settings.idempotency.lookup_grace_s) * 1000)
            .unwrap_or(0)
    }
}

fn storage_err(e: worker::Error) -> GuardError {
    storage(e)
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
            rendezvous: rendezvous::Rendezvous::default(),
            edge: edge::EdgeRole::default(),
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

    /// The runtime's alarm, if it ever calls the class directly rather than
    /// through the JS class (which hands it to `src/operations/outbox.rs`):
    /// the object's own part only — the sweep and the next alarm; the outbox
    /// waits for the next alarm the shell runs, and the R2 objects of what
    /// this sweep deletes are left (never replayed: their records are gone).
    async fn alarm(&self) -> Result<Response> {
        let r = SweepRequest {
            grace_ms: self.lookup_grace_ms(),
            batch: 500,
            worked: false,
        };
        self.sweep(&r)
            .await
            .map_err(|e| worker::Error::RustError(e.to_string()))?;
        Response::ok("swept")
    }
}
