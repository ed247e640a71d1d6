//! `AuditShard`: one SQLite-backed Durable Object per (project, time bucket)
//! holding that bucket's audit rows and their hourly roll-ups (ADR 0016).
//! A thin class: each operation of the typed protocol
//! (`postguard_core::audit_shard::protocol`) is decoded, run through the
//! core (`audit_shard::ingest`) or one query over [`sql::Sql`], and
//! answered as JSON. Retention deletes the whole object (`Drop`).

mod sql;

use std::cell::{Cell, RefCell};

use postguard_core::audit_shard::protocol::{
    self as op, Add, Done, Drop, Ingest, Keys, KeysQuery, Operation, Page, PageQuery, Query,
    ShardQuery, Size, SizeReply, Stats, Usage,
};
use postguard_core::audit_shard::usage::UsageQuery;
use postguard_core::audit_shard::{self, Shard, ShardStore, StatsQuery};
use wasm_bindgen::JsValue;
use worker::{
    durable_object, DurableObject, Env, ObjectNamespace, Request, Response, Result, SqlStorage,
    SqlStorageValue, State,
};

use super::encode;
use crate::{bindings, http};
use sql::{err, int, Sql};

#[durable_object]
pub struct AuditShard {
    state: State,
    sql: SqlStorage,
    schema_ready: Cell<bool>,
}

/// The request of operation `O` from a call's body.
fn decode<O: Operation>(body: &[u8]) -> Result<O::Request> {
    serde_json::from_slice(body).map_err(err)
}

impl AuditShard {
    fn sql(&self) -> Result<Sql<'_>> {
        if !self.schema_ready.get() {
            Sql::prepare(&self.sql)?;
            self.schema_ready.set(true);
        }
        Ok(Sql(&self.sql))
    }

    fn atomically<T>(&self, f: impl FnOnce(&mut Sql<'_>) -> Result<T>) -> Result<T> {
        let mut store = self.sql()?;
        super::atomically(&self.state.storage(), || f(&mut store), err)
    }

    fn query(&self, q: ShardQuery) -> Result<String> {
        let (inner, args) = q.q.sql_on("rows", sql::COLUMNS, false, q.take);
        let text = format!("SELECT json_group_array({}) FROM ({inner})", sql::ROW_JSON);
        self.sql()?.scalar(&text, super::sql_args(args))
    }

    fn page(&self, q: PageQuery) -> Result<String> {
        let text = sql::PAGE.replace("{ROW}", sql::ROW_JSON);
        let binds = vec![
            int(q.since),
            int(q.until),
            int(q.after.0),
            SqlStorageValue::String(q.after.1),
            int(u64::from(q.take)),
        ];
        self.sql()?.scalar(&text, binds)
    }

    fn keys(&self, q: KeysQuery) -> Result<String> {
        let text = format!(
            "SELECT json_group_array(json_object('key_prefix', key_prefix, 'requests', requests, \
             'errors', errors, 'last_used_at', last_used_at)) FROM ({})",
            audit_shard::KEY_ACTIVITY_SQL
        );
        self.sql()?.scalar(&text, vec![int(q.since_ms)])
    }

    fn stats(&self, q: StatsQuery) -> Result<String> {
        let kp = q
            .key_prefix
            .map_or(SqlStorageValue::Null, SqlStorageValue::String);
        let text = sql::STATS.replace("{GATEWAY}", postguard_core::routes::GATEWAY_PATH_SQL);
        let exclude = int(u64::from(q.exclude_gateway));
        self.sql()?
            .scalar(&text, vec![int(q.since_ms), kp, exclude])
    }

    fn usage(&self, q: UsageQuery) -> Result<String> {
        let project = q
            .project
            .map_or(SqlStorageValue::Null, SqlStorageValue::String);
        let binds = vec![int(q.since_ms), int(q.until_ms), project];
        self.sql()?.scalar(sql::USAGE, binds)
    }

    /// Runs the operation at `path` on a call's body; its JSON answer.
    async fn run(&self, path: &str, body: &[u8]) -> Result<String> {
        match path {
            // A batch and its roll-ups in one transaction: all or nothing.
            Ingest::PATH => {
                let rows = decode::<Ingest>(body)?;
                encode(&self.atomically(|s| audit_shard::ingest(s, &rows))?)
            }
            Add::PATH => {
                let rollups = decode::<Add>(body)?;
                self.atomically(|s| s.add(&rollups))?;
                encode(&Done {})
            }
            Query::PATH => self.query(decode::<Query>(body)?),
            Page::PATH => self.page(decode::<Page>(body)?),
            Stats::PATH => self.stats(decode::<Stats>(body)?),
            Keys::PATH => self.keys(decode::<Keys>(body)?),
            Usage::PATH => self.usage(decode::<Usage>(body)?),
            Drop::PATH => {
                // Every row, roll-up and the schema go with the object's storage.
                self.state.storage().delete_all().await?;
                self.schema_ready.set(false);
                encode(&Done {})
            }
            Size::PATH => encode(&SizeReply {
                bytes: self.sql.database_size() as u64,
            }),
            _ => Err(err("unknown operation")),
        }
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
        match self.run(&path, &body).await {
            Ok(text) => Response::ok(text),
            Err(e) => Ok(Response::error(e.to_string(), 500)?),
        }
    }
}

thread_local! {
    /// The `AUDIT` namespace, held for the isolate ([`bindings::per_isolate`]).
    static NAMESPACE: RefCell<Option<ObjectNamespace>> = const { RefCell::new(None) };
}

/// Calls operation `path` (an `Operation::PATH`) on `shard`'s object with
/// its request (`protocol::request`); the answer's bytes, which
/// `protocol::answer` reads. One function for every operation: the
/// fan-outs join one future type (ADR 0026).
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

/// The typed request and answer of `O`, for callers of [`call`].
pub fn request<O: Operation>(r: &O::Request) -> Result<Vec<u8>> {
    op::request::<O>(r).map_err(err)
}

pub fn answer<O: Operation>(bytes: &[u8]) -> Result<O::Response> {
    op::answer::<O>(bytes).map_err(err)
}
