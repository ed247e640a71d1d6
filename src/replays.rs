//! R2 storage of response bodies too large for the key's object (issue 10
//! §2): written while the body streams to the client (a `tee`), read back as
//! a stream on replay, deleted by the key's object when the record expires.
//! Never held whole in the isolate.

use crate::log;
use postguard_core::log::Line;
use std::cell::RefCell;

use worker::js_sys::{self, Array, Function, Reflect};
use worker::wasm_bindgen::{JsCast, JsValue};
use worker::wasm_bindgen_futures::JsFuture;
use worker::{web_sys, Bucket, Data, Env, Result};

use crate::bindings;
use crate::http;
use crate::reject::{Extra, Handled, Reject};
use crate::runtime::RequestCtx;
use postguard_core::idempotency::StoredResponse;
use postguard_core::Problem;

thread_local! {
    /// The `REPLAYS` binding, or its absence, held for the isolate
    /// ([`bindings::per_isolate`]): every fresh POST asks.
    static BUCKET: RefCell<Option<Option<Bucket>>> = const { RefCell::new(None) };
}

/// The bucket, or `None` when the binding is absent (then large bodies are
/// not replayable: a retry gets `IDEMPOTENT_REPLAY_UNAVAILABLE`).
pub fn bucket(env: &Env) -> Option<Bucket> {
    let Ok(found) = bindings::per_isolate(&BUCKET, || {
        Ok::<_, std::convert::Infallible>(env.bucket(bindings::REPLAYS).ok())
    });
    found
}

fn js_err(e: JsValue) -> worker::Error {
    worker::Error::JsError(e.as_string().unwrap_or_else(|| format!("{e:?}")))
}

fn method(this: &JsValue, name: &str) -> Result<Function> {
    Reflect::get(this, &JsValue::from_str(name))
        .map_err(js_err)?
        .dyn_into()
        .map_err(|_| worker::Error::RustError(format!("{name} is not callable")))
}

/// Two branches of one body: the client's and storage's.
pub fn tee(
    stream: &web_sys::ReadableStream,
) -> Result<(web_sys::ReadableStream, web_sys::ReadableStream)> {
    let pair: Array = method(stream, "tee")?
        .call0(stream)
        .map_err(js_err)?
        .dyn_into()
        .map_err(|_| worker::Error::RustError("tee did not return a pair".into()))?;
    let branch = |i| {
        pair.get(i)
            .dyn_into::<web_sys::ReadableStream>()
            .map_err(|_| worker::Error::RustError("tee branch is not a stream".into()))
    };
    Ok((branch(0)?, branch(1)?))
}

/// Streams `len` bytes into the object `key`. R2 takes a stream only with a
/// known length: it goes through a `FixedLengthStream`, which also fails the
/// write if the origin sent fewer or more bytes than it declared.
pub async fn put_stream(
    bucket: &Bucket,
    key: &str,
    stream: web_sys::ReadableStream,
    len: u64,
) -> Result<()> {
    let ctor: Function = method(&js_sys::global(), "FixedLengthStream")?;
    let fixed =
        Reflect::construct(&ctor, &Array::of1(&JsValue::from_f64(len as f64))).map_err(js_err)?;
    let writable = Reflect::get(&fixed, &JsValue::from_str("writable")).map_err(js_err)?;
    let readable: web_sys::ReadableStream = Reflect::get(&fixed, &JsValue::from_str("readable"))
        .map_err(js_err)?
        .dyn_into()
        .map_err(|_| worker::Error::RustError("FixedLengthStream has no readable side".into()))?;
    let pipe: js_sys::Promise = method(&stream, "pipeTo")?
        .call1(&stream, &writable)
        .map_err(js_err)?
        .dyn_into()
        .map_err(|_| worker::Error::RustError("pipeTo did not return a promise".into()))?;
    let put = bucket.put(key, Data::ReadableStream(readable)).execute();
    let (piped, stored) = futures_util::future::join(JsFuture::from(pipe), put).await;
    piped.map_err(js_err)?;
    stored.map(|_| ())
}

/// Stores a body already read (a chunked origin answer).
pub async fn put_bytes(bucket: &Bucket, key: &str, body: Vec<u8>) -> Result<()> {
    bucket
        .put(key, Data::Bytes(body))
        .execute()
        .await
        .map(|_| ())
}

/// The stored body of object `key` as a stream, `None` if it is gone.
pub async fn get(bucket: &Bucket, key: &str) -> Result<Option<worker::ResponseBody>> {
    let Some(object) = bucket.get(key).execute().await? else {
        return Ok(None);
    };
    match object.body() {
        Some(body) => body.response_body().map(Some),
        None => Ok(None),
    }
}

/// Deletes the objects of expired records (a failure is logged: the
/// object is orphaned, never replayed, since its record is gone).
pub async fn delete(env: &Env, keys: Vec<String>) {
    if keys.is_empty() {
        return;
    }
    let Some(bucket) = bucket(env) else { return };
    if let Err(e) = bucket.delete_multiple(keys).await {
        log::emit(Line::error("deleting expired replay bodies failed").err(e));
    }
}

/// The stored response of an earlier request with this Idempotency-Key:
/// its body from the object, or streamed from R2; a body kept nowhere (too
/// large, or its storage failed) is `IDEMPOTENT_REPLAY_UNAVAILABLE`, never a
/// success with another body.
pub async fn replay(
    env: &Env,
    rc: &RequestCtx,
    stored: StoredResponse,
    body: Vec<u8>,
    rl: &Extra,
) -> Handled {
    let mut extra = rl.clone();
    extra.push(("Idempotent-Replayed", "true".into()));
    if !stored.body_omitted {
        rc.note(|f| f.replayed = true);
        return Ok(http::respond(
            rc,
            stored.status,
            &stored.headers,
            &extra,
            Some(body),
        )?);
    }
    let unavailable =
        || Reject::from(Problem::replay_unavailable(stored.status, stored.body_len)).with(rl);
    let (Some(object), Some(bucket)) = (&stored.body_object, bucket(env)) else {
        return Err(unavailable());
    };
    match get(&bucket, object).await {
        Ok(Some(stream)) => {
            rc.note(|f| f.replayed = true);
            let r = http::respond_stream(rc, stored.status, &stored.headers, &extra, stream);
            rc.note(|f| f.response_bytes = Some(stored.body_len));
            Ok(r?)
        }
        Ok(None) => Err(unavailable()),
        Err(e) => {
            log::emit(log::of_request(Line::error("replay body unreadable"), rc).err(e));
            Err(unavailable())
        }
    }
}
