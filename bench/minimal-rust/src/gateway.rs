//! The minimal gateway of bench/passthrough.mjs (REFERENCE) in Rust, plain `worker` crate
//! style: `#[event(fetch)]`, `#[durable_object]` classes called by `fetch`, `worker`'s
//! Request/Response/Headers wrappers. Same I/O in the same order, same SQL statements, same
//! wire format between worker and objects; nothing else. Hashing and the HMAC run in wasm
//! (the `sha2`/`hmac` crates, as postguard does) where the JS side uses WebCrypto.
//!
//! With the `rpc` feature the worker calls both objects by JS RPC instead (REFERENCE_RPC):
//! the objects export wasm-bindgen methods that a JS class extending `DurableObject`
//! forwards to (bench/minimal-rust/rpc-entry.mjs, the shape of postguard's src/entry.mjs).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Duration;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use wasm_bindgen::prelude::wasm_bindgen;
use wasm_bindgen::{JsCast, JsValue};
use worker::js_sys::{Array, Date, Promise, Uint8Array};
use worker::wasm_bindgen_futures::JsFuture;
use worker::{
    durable_object, event, Context, Delay, DurableObject, Env, Fetch, Headers, Method, Request,
    RequestInit, RequestRedirect, Response, ResponseBody, ResponseBuilder, Result, SqlStorage,
    SqlStorageValue, State, Stub, Url,
};

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = crypto, js_name = randomUUID)]
    fn random_uuid() -> String;

    /// The object's `DurableObjectStorage`, for `transactionSync` (which `worker` lacks).
    type TxStorage;
    #[wasm_bindgen(method, catch, js_name = transactionSync)]
    fn transaction_sync(
        this: &TxStorage,
        f: &mut dyn FnMut() -> std::result::Result<JsValue, JsValue>,
    ) -> std::result::Result<JsValue, JsValue>;

    /// A stub of the JS classes in rpc-entry.mjs: `admit`, `complete`, `write` by JS RPC.
    type RpcStub;
    #[wasm_bindgen(method, catch)]
    fn admit(
        this: &RpcStub,
        limit: f64,
        window_ms: f64,
        k: Option<String>,
        fp: &str,
    ) -> std::result::Result<JsValue, JsValue>;
    #[wasm_bindgen(method, catch)]
    fn complete(
        this: &RpcStub,
        k: &str,
        status: u16,
        body: &Uint8Array,
    ) -> std::result::Result<JsValue, JsValue>;
    #[wasm_bindgen(method, catch)]
    fn write(this: &RpcStub, rows: String) -> std::result::Result<JsValue, JsValue>;
}

const RPC: bool = cfg!(feature = "rpc");

/// Awaits a JS RPC call's result (a thenable, made a Promise for `JsFuture`).
async fn rpc_await(call: std::result::Result<JsValue, JsValue>) -> Result<JsValue> {
    let v = call.map_err(worker::Error::from)?;
    Ok(JsFuture::from(Promise::resolve(&v)).await?)
}

/// An object's stub, called by `fetch` or (feature `rpc`) by JS RPC.
enum Conn {
    Fetch(Stub),
    Rpc(RpcStub),
}

impl Conn {
    fn new(stub: Stub) -> Self {
        match RPC {
            true => Conn::Rpc(stub.into_rpc::<RpcStub>()),
            false => Conn::Fetch(stub),
        }
    }
}

const SIGNING_SECRET: &[u8] = b"reference-signing-secret-0123456789";
const KEY_CACHE_MS: f64 = 30_000.0;

/// A key's record in KV, as bench/passthrough.mjs seeds it.
#[derive(Clone, Deserialize)]
struct KeyRec {
    id: String,
    prefix: String,
    project: String,
    limit: i64,
    window_ms: i64,
}

/// The rate-limit state of an answer (the `rl` of the JS reference).
#[derive(Clone, Serialize, Deserialize)]
struct Rl {
    limit: i64,
    window: i64,
    remaining: i64,
    reset: i64,
    #[serde(rename = "resetIn")]
    reset_in: i64,
}

/// The object's answer to an admission (the `x-answer` header).
#[derive(Serialize, Deserialize)]
struct Answer {
    status: u16,
    rl: Rl,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    replayed: bool,
}

thread_local! {
    static KEYS: RefCell<HashMap<String, (Option<KeyRec>, f64)>> = RefCell::new(HashMap::new());
    static PENDING: RefCell<Vec<Value>> = const { RefCell::new(Vec::new()) };
    static FLUSHING: Cell<bool> = const { Cell::new(false) };
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

/// The key's record, from the per-isolate cache (30 s) or KV.
async fn lookup(env: &Env, token: &str) -> Result<Option<KeyRec>> {
    let hash = sha256_hex(token.as_bytes());
    let now = Date::now();
    let hit = KEYS.with(|k| k.borrow().get(&hash).cloned());
    if let Some((rec, at)) = hit {
        if now - at < KEY_CACHE_MS {
            return Ok(rec);
        }
    }
    let rec: Option<KeyRec> = env.kv("KEYS")?.get(&format!("h:{hash}")).json().await?;
    KEYS.with(|k| k.borrow_mut().insert(hash, (rec.clone(), now)));
    Ok(rec)
}

/// X-Postguard-Signature's shape: HMAC-SHA256 over the request's fields and the body's SHA-256.
struct Signed<'a> {
    id: &'a str,
    method: &'a str,
    path: &'a str,
    body_hash: &'a str,
    rec: &'a KeyRec,
    key: Option<&'a str>,
    content_type: String,
    client_ip: String,
}

fn sign(s: &Signed<'_>) -> Result<String> {
    let t = (Date::now() / 1000.0).floor() as i64;
    let fields = [
        "v2",
        &t.to_string(),
        s.id,
        s.method,
        s.path,
        s.body_hash,
        &s.rec.project,
        &s.rec.prefix,
        "bench",
        s.key.unwrap_or(""),
        &s.content_type,
        &s.client_ip,
    ]
    .join("\n");
    let mut mac = Hmac::<Sha256>::new_from_slice(SIGNING_SECRET).map_err(|e| e.to_string())?;
    mac.update(fields.as_bytes());
    let tag = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    Ok(format!("t={t},v2={tag}"))
}

fn post(url: &str, body: Option<JsValue>) -> Result<Request> {
    let mut init = RequestInit::new();
    init.with_method(Method::Post).with_body(body);
    Request::new_with_init(url, &init)
}

fn bytes_js(b: &[u8]) -> JsValue {
    Uint8Array::from(b).into()
}

async fn admit(conn: &Conn, rec: &KeyRec, k: Option<&str>, fp: &str) -> Result<(Answer, Vec<u8>)> {
    let stub = match conn {
        Conn::Fetch(stub) => stub,
        Conn::Rpc(rpc) => {
            let call = rpc.admit(
                rec.limit as f64,
                rec.window_ms as f64,
                k.map(str::to_owned),
                fp,
            );
            let reply: Array = rpc_await(call).await?.unchecked_into();
            let a: Answer = serde_json::from_str(&reply.get(0).as_string().unwrap_or_default())?;
            let body = reply
                .get(1)
                .dyn_into::<Uint8Array>()
                .map(|b| b.to_vec())
                .unwrap_or_default();
            return Ok((a, body));
        }
    };
    let mut q = vec![
        ("limit", rec.limit.to_string()),
        ("window", rec.window_ms.to_string()),
    ];
    if let Some(k) = k {
        q.push(("k", k.to_string()));
        q.push(("fp", fp.to_string()));
    }
    let url = Url::parse_with_params("https://ref/admit", &q)?;
    let mut res = stub.fetch_with_request(post(url.as_str(), None)?).await?;
    let header = res.headers().get("x-answer")?.unwrap_or_default();
    let a: Answer = serde_json::from_str(&header)?;
    let body = if a.replayed {
        res.bytes().await?
    } else {
        Vec::new()
    };
    Ok((a, body))
}

async fn complete(conn: &Conn, k: &str, status: u16, body: &[u8]) -> Result<()> {
    let stub = match conn {
        Conn::Fetch(stub) => stub,
        Conn::Rpc(rpc) => {
            rpc_await(rpc.complete(k, status, &Uint8Array::from(body))).await?;
            return Ok(());
        }
    };
    let url = Url::parse_with_params(
        "https://ref/complete",
        &[("k", k), ("s", &status.to_string())],
    )?;
    stub.fetch_with_request(post(url.as_str(), Some(bytes_js(body)))?)
        .await?;
    Ok(())
}

/// Queues an audit row; the request that starts a flush keeps it alive (`wait_until`),
/// later rows join it. One object call per flush writes the batch.
fn audit(env: &Env, ctx: &Context, row: Value) {
    PENDING.with(|p| p.borrow_mut().push(row));
    if FLUSHING.with(|f| f.replace(true)) {
        return;
    }
    let env = env.clone();
    ctx.wait_until(async move {
        Delay::from(Duration::from_millis(20)).await;
        let rows = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
        FLUSHING.with(|f| f.set(false));
        // A failed flush loses its rows, as the JS reference's would.
        let _ = flush(&env, rows).await;
    });
}

async fn flush(env: &Env, rows: Vec<Value>) -> Result<()> {
    let project = rows
        .first()
        .and_then(|r| r.get(8))
        .and_then(Value::as_str)
        .unwrap_or("-")
        .to_string();
    let stub = env
        .durable_object("AUDIT")?
        .id_from_name(&project)?
        .get_stub()?;
    let body = serde_json::to_string(&rows)?;
    let stub = match Conn::new(stub) {
        Conn::Fetch(stub) => stub,
        Conn::Rpc(rpc) => {
            rpc_await(rpc.write(body)).await?;
            return Ok(());
        }
    };
    stub.fetch_with_request(post("https://audit/write", Some(body.into()))?)
        .await?;
    Ok(())
}

fn answer(
    status: u16,
    headers: Headers,
    body: ResponseBody,
    rl: &Rl,
    id: &str,
) -> Result<Response> {
    headers.set("X-RateLimit-Limit", &rl.limit.to_string())?;
    headers.set("X-RateLimit-Remaining", &rl.remaining.to_string())?;
    headers.set("X-RateLimit-Reset", &rl.reset.to_string())?;
    headers.set(
        "RateLimit-Policy",
        &format!("\"default\";q={};w={}", rl.limit, rl.window),
    )?;
    headers.set(
        "RateLimit",
        &format!("\"default\";r={};t={}", rl.remaining, rl.reset_in),
    )?;
    headers.set("X-Request-Id", id)?;
    Ok(ResponseBuilder::new()
        .with_status(status)
        .with_headers(headers)
        .body(body))
}

fn one_header(name: &str, value: &str) -> Result<Headers> {
    let h = Headers::new();
    h.set(name, value)?;
    Ok(h)
}

/// What the audit row needs from the handling.
#[derive(Default)]
struct Facts {
    key: Option<KeyRec>,
    remaining: Option<i64>,
    replayed: bool,
}

async fn handle(mut req: Request, env: &Env, id: &str, facts: &mut Facts) -> Result<Response> {
    let auth = req.headers().get("authorization")?.unwrap_or_default();
    let token = auth.strip_prefix("Bearer ").unwrap_or(&auth);
    let rec = match token.is_empty() {
        true => None,
        false => lookup(env, token).await?,
    };
    let Some(rec) = rec else {
        let h = one_header("content-type", "application/problem+json")?;
        h.set("X-Request-Id", id)?;
        return Ok(ResponseBuilder::new()
            .with_status(401)
            .with_headers(h)
            .fixed(br#"{"code":"INVALID_API_KEY"}"#.to_vec()));
    };
    facts.key = Some(rec.clone());
    let url = req.url()?;
    let path = format!(
        "{}{}",
        url.path(),
        url.query().map(|q| format!("?{q}")).unwrap_or_default()
    );
    let get = req.method() == Method::Get;
    let k = if get {
        None
    } else {
        req.headers().get("idempotency-key")?
    };
    let body = if get { None } else { Some(req.bytes().await?) };
    let fp = sha256_hex(body.as_deref().unwrap_or_default());
    let stub = Conn::new(
        env.durable_object("REF")?
            .id_from_name(&rec.id)?
            .get_stub()?,
    );
    let (a, stored) = admit(&stub, &rec, k.as_deref(), &fp).await?;
    facts.remaining = Some(a.rl.remaining);
    if a.replayed {
        facts.replayed = true;
        let h = one_header("Idempotent-Replayed", "true")?;
        return answer(a.status, h, ResponseBody::Body(stored), &a.rl, id);
    }
    if a.status != 0 {
        let h = one_header("content-type", "application/problem+json")?;
        let problem = format!("{{\"code\":\"{}\"}}", a.status);
        return answer(
            a.status,
            h,
            ResponseBody::Body(problem.into_bytes()),
            &a.rl,
            id,
        );
    }
    let method = req.inner().method();
    let headers = req.headers().clone();
    headers.delete("authorization")?;
    headers.set("X-Request-Id", id)?;
    let signed = Signed {
        id,
        method: &method,
        path: &path,
        body_hash: &fp,
        rec: &rec,
        key: k.as_deref(),
        content_type: req.headers().get("content-type")?.unwrap_or_default(),
        client_ip: req.headers().get("cf-connecting-ip")?.unwrap_or_default(),
    };
    headers.set("X-Postguard-Signature", &sign(&signed)?)?;
    let mut init = RequestInit::new();
    init.with_method(req.method())
        .with_headers(headers)
        .with_redirect(RequestRedirect::Manual)
        .with_body(body.as_deref().map(bytes_js));
    let origin = format!("{}{}", env.var("ORIGIN_URL")?, path);
    let mut res = Fetch::Request(Request::new_with_init(&origin, &init)?)
        .send()
        .await?;
    let status = res.status_code();
    let res_headers = res.headers().clone();
    let Some(k) = k else {
        let (_, stream) = res.into_parts();
        return answer(status, res_headers, stream, &a.rl, id);
    };
    let out = res.bytes().await?;
    complete(&stub, &k, status, &out).await?;
    answer(status, res_headers, ResponseBody::Body(out), &a.rl, id)
}

#[event(fetch)]
async fn fetch(req: Request, env: Env, ctx: Context) -> Result<Response> {
    let started = Date::now();
    let id = random_uuid();
    let mut facts = Facts::default();
    let method = req.inner().method();
    let path = req.path();
    let idem = req.headers().get("idempotency-key")?;
    let res = handle(req, &env, &id, &mut facts).await?;
    let bytes = res
        .headers()
        .get("content-length")?
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|n| *n != 0);
    let key = facts.key.as_ref();
    audit(
        &env,
        &ctx,
        json!([
            id,
            started as i64,
            method,
            path,
            res.status_code(),
            bytes,
            (Date::now() - started) as i64,
            key.map(|k| &k.prefix),
            key.map(|k| &k.project),
            idem,
            i64::from(facts.replayed),
            facts.remaining
        ]),
    );
    Ok(res)
}

fn int(v: i64) -> SqlStorageValue {
    SqlStorageValue::Integer(v)
}

/// The key's object: a fixed window kept in memory and written through, and the
/// Idempotency-Key records (claim, replay, complete), with the JS reference's statements.
#[durable_object]
pub struct Ref {
    sql: SqlStorage,
    window: Cell<(i64, i64)>,
}

impl Ref {
    fn admit(
        &self,
        limit: i64,
        window_ms: i64,
        k: Option<&str>,
        fp: &str,
    ) -> Result<(Answer, Vec<u8>)> {
        let now = Date::now() as i64;
        let start = now - now % window_ms;
        let (w_start, w_n) = self.window.get();
        let used = if w_start == start { w_n } else { 0 };
        let end = start + window_ms;
        let mut rl = Rl {
            limit,
            window: window_ms / 1000,
            remaining: (limit - used - 1).max(0),
            reset: end / 1000,
            reset_in: (end - now + 999) / 1000,
        };
        let reply = |status: u16, rl: Rl| {
            Ok((
                Answer {
                    status,
                    rl,
                    replayed: false,
                },
                Vec::new(),
            ))
        };
        if used >= limit {
            rl.remaining = 0;
            return reply(429, rl);
        }
        self.window.set((start, used + 1));
        self.sql.exec(
            "INSERT INTO w (k, start, n) VALUES (?, ?, ?) ON CONFLICT(k) DO UPDATE SET start = excluded.start, n = excluded.n",
            Some(vec!["window".into(), int(start), int(used + 1)]),
        )?;
        let Some(k) = k else { return reply(0, rl) };
        let row = self
            .sql
            .exec(
                "SELECT fp, status, body FROM r WHERE k = ?",
                Some(vec![k.into()]),
            )?
            .raw()
            .next()
            .transpose()?;
        let Some(row) = row else {
            self.sql.exec(
                "INSERT INTO r (k, fp, status) VALUES (?, ?, 0)",
                Some(vec![k.into(), fp.into()]),
            )?;
            return reply(0, rl);
        };
        let mut cols = row.into_iter();
        let (row_fp, row_status, row_body) = (cols.next(), cols.next(), cols.next());
        if !matches!(&row_fp, Some(SqlStorageValue::String(s)) if s == fp) {
            return reply(422, rl);
        }
        match (row_status, row_body) {
            (Some(SqlStorageValue::Integer(s)), body) if s != 0 => {
                let body = match body {
                    Some(SqlStorageValue::Blob(b)) => b,
                    _ => Vec::new(),
                };
                let status = u16::try_from(s).unwrap_or(500);
                Ok((
                    Answer {
                        status,
                        rl,
                        replayed: true,
                    },
                    body,
                ))
            }
            _ => reply(409, rl),
        }
    }

    fn complete(&self, k: &str, status: i64, body: Vec<u8>) -> Result<()> {
        self.sql.exec(
            "UPDATE r SET status = ?, body = ? WHERE k = ?",
            Some(vec![int(status), SqlStorageValue::Blob(body), k.into()]),
        )?;
        Ok(())
    }
}

/// The object's JS RPC methods (called by rpc-entry.mjs's `Ref`): the answer as
/// `[answer JSON, body or undefined]`.
#[cfg(feature = "rpc")]
#[wasm_bindgen(
    wasm_bindgen = ::worker::wasm_bindgen,
    wasm_bindgen_futures = ::worker::wasm_bindgen_futures,
    js_sys = ::worker::js_sys
)]
impl Ref {
    pub fn admit_rpc(
        &self,
        limit: f64,
        window_ms: f64,
        k: Option<String>,
        fp: String,
    ) -> std::result::Result<Array, JsValue> {
        let (a, body) = self
            .admit(limit as i64, window_ms as i64, k.as_deref(), &fp)
            .map_err(JsValue::from)?;
        let json = serde_json::to_string(&a).map_err(|e| JsValue::from_str(&e.to_string()))?;
        let body = match a.replayed {
            true => Uint8Array::from(body.as_slice()).into(),
            false => JsValue::UNDEFINED,
        };
        Ok(Array::of2(&json.into(), &body))
    }

    pub fn complete_rpc(
        &self,
        k: String,
        status: u16,
        body: Vec<u8>,
    ) -> std::result::Result<(), JsValue> {
        self.complete(&k, i64::from(status), body)
            .map_err(JsValue::from)
    }
}

impl DurableObject for Ref {
    fn new(state: State, _env: Env) -> Self {
        let sql = state.storage().sql();
        let _ = sql.exec("CREATE TABLE IF NOT EXISTS w (k TEXT PRIMARY KEY, start INTEGER NOT NULL, n INTEGER NOT NULL)", None);
        let _ = sql.exec("CREATE TABLE IF NOT EXISTS r (k TEXT PRIMARY KEY, fp TEXT NOT NULL, status INTEGER NOT NULL, body BLOB)", None);
        let window = sql
            .exec("SELECT start, n FROM w", None)
            .ok()
            .and_then(|c| c.raw().next())
            .and_then(|r| r.ok())
            .and_then(|r| match r.as_slice() {
                [SqlStorageValue::Integer(s), SqlStorageValue::Integer(n)] => Some((*s, *n)),
                _ => None,
            })
            .unwrap_or((0, 0));
        Ref {
            sql,
            window: Cell::new(window),
        }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        let url = req.url()?;
        let q: HashMap<_, _> = url.query_pairs().into_owned().collect();
        let num = |name: &str| q.get(name).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
        if url.path() == "/complete" {
            let body = req.bytes().await?;
            self.complete(q.get("k").map_or("", String::as_str), num("s"), body)?;
            return Ok(Response::empty()?.with_status(204));
        }
        let k = q.get("k").map(String::as_str);
        let fp = q.get("fp").map_or("", String::as_str);
        let (a, body) = self.admit(num("limit"), num("window"), k, fp)?;
        let mut res = match a.replayed {
            true => Response::from_bytes(body)?,
            false => Response::empty()?,
        };
        res.headers_mut()
            .set("x-answer", &serde_json::to_string(&a)?)?;
        Ok(res)
    }
}

/// The audit object: inserts each flush's rows in one transaction.
#[durable_object]
pub struct Audit {
    state: State,
}

const INSERT: &str = "INSERT OR IGNORE INTO audit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

fn sql_value(v: &Value) -> SqlStorageValue {
    match v {
        Value::String(s) => s.as_str().into(),
        Value::Number(n) => n
            .as_i64()
            .map_or_else(|| SqlStorageValue::Float(n.as_f64().unwrap_or(0.0)), int),
        Value::Bool(b) => int(i64::from(*b)),
        _ => SqlStorageValue::Null,
    }
}

impl Audit {
    fn write(&self, rows: &[Vec<Value>]) -> Result<usize> {
        let storage = self.state.storage();
        let sql = storage.sql();
        let tx: &TxStorage = storage.as_raw().unchecked_ref();
        let mut failed = None;
        let ran = tx.transaction_sync(&mut || {
            for r in rows {
                if let Err(e) = sql.exec(INSERT, Some(r.iter().map(sql_value).collect())) {
                    failed = Some(e.to_string());
                    return Err(JsValue::from_str("rolled back"));
                }
            }
            Ok(JsValue::UNDEFINED)
        });
        match (ran, failed) {
            (Ok(_), None) => Ok(rows.len()),
            (_, Some(e)) => Err(e.into()),
            (Err(e), None) => Err(format!("{e:?}").into()),
        }
    }
}

#[cfg(feature = "rpc")]
#[wasm_bindgen(
    wasm_bindgen = ::worker::wasm_bindgen,
    wasm_bindgen_futures = ::worker::wasm_bindgen_futures,
    js_sys = ::worker::js_sys
)]
impl Audit {
    /// The JS RPC method (rpc-entry.mjs's `Audit.write`): the rows as JSON.
    pub fn write_rpc(&self, rows: String) -> std::result::Result<usize, JsValue> {
        let rows: Vec<Vec<Value>> =
            serde_json::from_str(&rows).map_err(|e| JsValue::from_str(&e.to_string()))?;
        self.write(&rows).map_err(JsValue::from)
    }
}

impl DurableObject for Audit {
    fn new(state: State, _env: Env) -> Self {
        let _ = state.storage().sql().exec(
            "CREATE TABLE IF NOT EXISTS audit (request_id TEXT PRIMARY KEY, time INTEGER, method TEXT, path TEXT, status INTEGER, response_bytes INTEGER, response_time_ms INTEGER, key_prefix TEXT, project TEXT, idempotency_key TEXT, replayed INTEGER, rate_limit_remaining INTEGER)",
            None,
        );
        Audit { state }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        // GET: the rows written so far (a check that the benchmark's audit rows land).
        if req.method() == Method::Get {
            let n: Value = self
                .state
                .storage()
                .sql()
                .exec("SELECT COUNT(*) AS n FROM audit", None)?
                .one()?;
            return Response::ok(n.get("n").map(Value::to_string).unwrap_or_default());
        }
        let rows: Vec<Vec<Value>> = req.json().await?;
        Response::ok(self.write(&rows)?.to_string())
    }
}
