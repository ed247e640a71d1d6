//! `WebhookShard`: one SQLite-backed Durable Object per (project, time
//! bucket) holding that bucket's events, deliveries, attempts and outbox
//! state (ADR 0035). A thin class: each operation of the typed protocol
//! (`postguard_core::webhooks::protocol`) is decoded, run through a
//! function of `postguard_core::webhooks::records` over [`sql::Sql`] (the
//! `WebhookStore` port) inside one `transactionSync` — a call commits all
//! or nothing — and answered.
//!
//! Concurrency: an object runs one call at a time and these functions never
//! `await`, so a claim, a hold or a settle is a compare-and-set by
//! construction. Retention deletes the whole object (`Drop`).

mod sql;

use std::cell::{Cell, RefCell};

use postguard_core::webhooks::protocol::{
    self as op, Archive, ClaimAttempts, CountRecoverable, DetailOf, Done, Drop, DumpAll, Feed,
    Health, Import, List, ManualAttempt, MarkSent, Operation, Peek, Publish, Recover, Release,
    Requeue, RestoreRecords, SettleAttempts, Size, SizeReply, Unclaim, Unsent, Vitals, VitalsOf,
};
use postguard_core::webhooks::records::{self, WebhookStore};
use postguard_core::webhooks::shard::ShardKey;
use worker::{
    durable_object, DurableObject, Env, ObjectNamespace, Request, Response, Result, SqlStorage,
    State,
};

use super::encode;
use crate::bindings;
use sql::{err, Sql};

#[durable_object]
pub struct WebhookShard {
    state: State,
    sql: SqlStorage,
    schema_ready: Cell<bool>,
}

/// The request of operation `O` from a call's body.
fn decode<O: Operation>(body: &[u8]) -> Result<O::Request> {
    serde_json::from_slice(body).map_err(err)
}

impl WebhookShard {
    fn store(&self) -> Result<Sql<'_>> {
        if !self.schema_ready.get() {
            Sql::prepare(&self.sql)?;
            self.schema_ready.set(true);
        }
        Ok(Sql(&self.sql))
    }

    /// Runs `f` over the port in one storage transaction: all or nothing.
    fn atomically<T>(&self, f: impl FnOnce(&mut Sql<'_>) -> Result<T>) -> Result<T> {
        let mut store = self.store()?;
        super::atomically(&self.state.storage(), || f(&mut store), err)
    }

    /// Operation `O`: its request decoded, `f` run over the port in one
    /// transaction, its answer encoded.
    fn tx<O: Operation>(
        &self,
        body: &[u8],
        f: impl FnOnce(&mut Sql<'_>, O::Request) -> Result<O::Response>,
    ) -> Result<String> {
        let r = decode::<O>(body)?;
        encode(&self.atomically(|s| f(s, r))?)
    }

    /// Operation `O` that only reads: no transaction.
    fn read<O: Operation>(
        &self,
        body: &[u8],
        f: impl FnOnce(&mut Sql<'_>, O::Request) -> Result<O::Response>,
    ) -> Result<String> {
        let r = decode::<O>(body)?;
        encode(&f(&mut self.store()?, r)?)
    }

    /// Runs the operation at `path` (an `Operation::PATH`) on a call's body.
    async fn dispatch(&self, path: &str, body: &[u8]) -> Result<String> {
        match path {
            Publish::PATH => self.tx::<Publish>(body, |s, r| {
                records::mark_sent(s, &r.sent, r.now)?;
                records::publish(s, &r.events, &r.limits, r.now)
            }),
            MarkSent::PATH => self.tx::<MarkSent>(body, |s, r| {
                records::mark_sent(s, &r.ids, r.now).map(|()| Done {})
            }),
            Unsent::PATH => {
                self.read::<Unsent>(body, |s, r| records::unsent(s, r.before, r.limit as usize))
            }
            ClaimAttempts::PATH => {
                self.tx::<ClaimAttempts>(body, |s, r| records::claim(s, &r.jobs, r.now, r.lease_ms))
            }
            SettleAttempts::PATH => self.tx::<SettleAttempts>(body, |s, r| {
                let settled = records::settle(s, &r.attempts, &r.schedule, r.now)?;
                Ok(op::SettleReply {
                    follow_ups: settled
                        .follow_ups
                        .into_iter()
                        .map(|f| f.map(|f| (f.at, f.delay_s)))
                        .collect(),
                    wakes: settled.wakes,
                })
            }),
            Peek::PATH => self.read::<Peek>(body, |s, r| records::peek(s, &r.ids)),
            Release::PATH => self.tx::<Release>(body, |s, r| {
                records::release(s, &r.subscription_id, r.limit as usize, r.now)
            }),
            Unclaim::PATH => self.tx::<Unclaim>(body, |s, r| {
                records::unclaim(s, &r.delivery_id, r.attempt, r.now)
            }),
            ManualAttempt::PATH => self.tx::<ManualAttempt>(body, |s, r| {
                records::manual(s, &r.delivery_id, r.max, r.now)
            }),
            Recover::PATH => self.tx::<Recover>(body, |s, r| records::recover(s, &r.step, r.now)),
            CountRecoverable::PATH => self.read::<CountRecoverable>(body, |s, r| {
                records::count_recoverable(s, &r.subscription_id, r.since, r.until)
            }),
            Requeue::PATH => self.tx::<Requeue>(body, |s, r| {
                records::requeue(s, r.before, r.limit as usize, r.now, r.oldest_day)
            }),
            DetailOf::PATH => {
                self.read::<DetailOf>(body, |s, r| records::detail(s, &r.delivery_id))
            }
            List::PATH => self.read::<List>(body, |s, r| s.list(&r.q, r.take as usize)),
            Feed::PATH => self.read::<Feed>(body, |s, r| s.feed(&r.q, r.take as usize)),
            Import::PATH => self.tx::<Import>(body, |s, r| records::import(s, &r)),
            RestoreRecords::PATH => self.tx::<RestoreRecords>(body, |s, r| records::restore(s, &r)),
            Archive::PATH => self.read::<Archive>(body, |s, r| {
                records::archive_page(s, r.since, r.until, &r.after, r.take as usize)
            }),
            Health::PATH => self.read::<Health>(body, |s, r| {
                let ids: Vec<&str> = r.subscription_ids.iter().map(String::as_str).collect();
                s.health(&ids, r.since)
            }),
            // These take no request: whatever the body, none is read.
            DumpAll::PATH => encode(&self.store()?.dump()?),
            VitalsOf::PATH => {
                let mut s = self.store()?;
                encode(&Vitals {
                    oldest_due: s.oldest_due()?,
                    bytes: s.size()?,
                })
            }
            Size::PATH => encode(&SizeReply {
                bytes: self.sql.database_size() as u64,
            }),
            Drop::PATH => {
                // Every record and the schema go with the object's storage.
                self.state.storage().delete_all().await?;
                self.schema_ready.set(false);
                encode(&Done {})
            }
            _ => Err(err("unknown operation")),
        }
    }
}

super::json_rpc!(WebhookShard);

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
        let (path, body) = (req.path(), req.bytes().await?);
        super::http_answer(self.dispatch(&path, &body).await)
    }
}

thread_local! {
    /// The `WEBHOOKS` namespace, held for the isolate ([`bindings::per_isolate`]).
    static NAMESPACE: RefCell<Option<ObjectNamespace>> = const { RefCell::new(None) };
}

/// Calls operation `O` on `shard`'s object; its typed answer.
pub async fn call<O: Operation>(
    env: &Env,
    shard: &ShardKey,
    req: &O::Request,
) -> Result<O::Response> {
    let ns = bindings::per_isolate(&NAMESPACE, || env.durable_object(bindings::WEBHOOKS))?;
    super::call_json::<O>(&ns, &shard.name(), "webhook shard", req).await
}

// The protocol's request types, for the callers that build them.
pub use op::{
    ArchiveReq, BeforeReq, ClaimReq, CountReq, DetailReq, FeedReq, HealthReq, IdsReq, ListReq,
    ManualReq, PublishReq, RecoverReq, ReleaseReq, SettleReq, UnclaimReq,
};
