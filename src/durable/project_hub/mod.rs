//! `ProjectHub`: one SQLite-backed Durable Object per project (ADR 0046),
//! the project's own place on the publish path: a copy of its subscribers
//! (so a publish reads nothing of the D1 every tenant shares) and its
//! ordering lanes (ADR 0043). A thin class over the typed protocol
//! `postguard_core::webhooks::hub`: the core plans and chains
//! (`hub::prepare`) over [`sql::Sql`] (the `LaneStore` port) inside one
//! `transactionSync`.
//!
//! The copy lives in the object's memory only: an evicted object reads D1
//! once on its next publish. A read that an invalidation overtook is not
//! kept (`generation`), so a change is never hidden behind a load that
//! began before it.

mod d1;
mod sql;

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use postguard_core::webhooks::capacity::utc_day;
use postguard_core::webhooks::hub::{self, Invalidate, Prepare, Prepared, ReservationOf, Snapshot};
use postguard_core::webhooks::ordering;
use postguard_core::webhooks::protocol::{Done, Operation};
use worker::{
    durable_object, DurableObject, Env, ObjectNamespace, Request, Response, Result, SqlStorage,
    State,
};

use super::encode;
use crate::bindings;
use crate::runtime::new_ulid_parts;
use sql::{err, Sql};

#[durable_object]
pub struct ProjectHub {
    state: State,
    env: Env,
    sql: SqlStorage,
    schema_ready: Cell<bool>,
    copy: RefCell<Option<Rc<Snapshot>>>,
    /// Bumped by every invalidation: a load that began under an older one
    /// is used for its publish but not kept.
    generation: Cell<u64>,
}

fn decode<O: Operation>(body: &[u8]) -> Result<O::Request> {
    serde_json::from_slice(body).map_err(err)
}

impl ProjectHub {
    fn store(&self) -> Result<Sql<'_>> {
        if !self.schema_ready.get() {
            Sql::prepare(&self.sql)?;
            self.schema_ready.set(true);
        }
        Ok(Sql(&self.sql))
    }

    /// The project's subscribers: the copy while fresh, else D1's rows.
    async fn snapshot(&self, project: &str, now: u64) -> Result<Rc<Snapshot>> {
        let day = utc_day(now);
        if let Some(s) = self.copy.borrow().as_ref().filter(|s| s.fresh(now, day)) {
            return Ok(Rc::clone(s));
        }
        let generation = self.generation.get();
        let snap = Rc::new(d1::load(&self.env, project, day, now).await?);
        if self.generation.get() == generation {
            *self.copy.borrow_mut() = Some(Rc::clone(&snap));
        }
        Ok(snap)
    }

    async fn dispatch(&self, path: &str, body: &[u8]) -> Result<String> {
        match path {
            Prepare::PATH => {
                let req = decode::<Prepare>(body)?;
                let snap = self.snapshot(&req.shard.project, req.now).await?;
                let mut store = self.store()?;
                let deliveries = super::atomically(
                    &self.state.storage(),
                    || hub::prepare(&mut store, &snap.subscribers, &req, || new_ulid_parts().1),
                    err,
                )?;
                encode(&Prepared {
                    deliveries,
                    bytes_today: snap.bytes_today,
                    d1_bytes: snap.d1_bytes,
                    loaded_at: snap.loaded_at,
                })
            }
            Invalidate::PATH => {
                self.generation.set(self.generation.get().wrapping_add(1));
                *self.copy.borrow_mut() = None;
                encode(&Done {})
            }
            ReservationOf::PATH => {
                let req = decode::<ReservationOf>(body)?;
                encode(&ordering::reservation(
                    &mut self.store()?,
                    &req.lane,
                    &req.delivery_id,
                )?)
            }
            _ => Err(err("unknown operation")),
        }
    }
}

super::json_rpc!(ProjectHub);

impl DurableObject for ProjectHub {
    fn new(state: State, env: Env) -> Self {
        ProjectHub {
            sql: state.storage().sql(),
            state,
            env,
            schema_ready: Cell::new(false),
            copy: RefCell::new(None),
            generation: Cell::new(0),
        }
    }

    /// The same operations over HTTP, for tests and operators.
    async fn fetch(&self, mut req: Request) -> Result<Response> {
        let (path, body) = (req.path(), req.bytes().await?);
        super::http_answer(self.dispatch(&path, &body).await)
    }
}

thread_local! {
    /// The `PROJECTS` namespace, held for the isolate.
    static NAMESPACE: RefCell<Option<ObjectNamespace>> = const { RefCell::new(None) };
}

/// Calls operation `O` on `project`'s object; its typed answer.
pub async fn call<O: Operation>(env: &Env, project: &str, req: &O::Request) -> Result<O::Response> {
    let ns = bindings::per_isolate(&NAMESPACE, || env.durable_object(bindings::PROJECTS))?;
    super::call_json::<O>(&ns, project, "project object", req).await
}

/// Tells `project`'s object its subscribers changed (after the D1 write).
/// A failure is logged, not raised: the change is already stored, and the
/// copy is read again within `hub::SUBSCRIBERS_TTL_MS` anyway.
pub async fn invalidate(env: &Env, project: &str) {
    if let Err(e) = call::<Invalidate>(env, project, &Done {}).await {
        crate::log::emit(
            postguard_core::log::Line::warn("the project object did not take an invalidation")
                .err(e),
        );
    }
}
