//! Building responses (JSON resources, raw bodies) and subrequests; problems
//! are rendered by `reject::render`.

use serde::Serialize;
use worker::wasm_bindgen::{JsCast, JsValue};
use worker::wasm_bindgen_futures::JsFuture;
use worker::{js_sys, web_sys, Headers, Response, Result};

use crate::reject::Handled;
use crate::runtime::RequestCtx;

pub type HeaderList = Vec<(String, String)>;

/// Headers of a worker request or response as owned pairs.
pub fn header_pairs(h: &Headers) -> HeaderList {
    h.entries().collect()
}

pub fn to_headers<'a, I>(pairs: I) -> Result<Headers>
where
    I: IntoIterator<Item = (&'a str, &'a str)>,
{
    let h = Headers::new();
    for (k, v) in pairs {
        h.append(k, v)?;
    }
    Ok(h)
}

/// Builds a response from a status, header pairs and a body (`None` or empty
/// gives a null body, which 204/304 require).
pub fn respond(
    rc: &RequestCtx,
    status: u16,
    headers: &[(String, String)],
    extra: &[(&str, String)],
    body: Option<Vec<u8>>,
) -> Result<Response> {
    let h = to_headers(headers.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
    for (k, v) in extra {
        h.set(k, v)?;
    }
    h.set("X-Request-Id", &rc.request_id)?;
    cors(rc, &h)?;
    let len = body.as_ref().map_or(0, Vec::len) as u64;
    rc.note(|f| f.response_bytes = Some(len));
    let builder = Response::builder().with_status(status).with_headers(h);
    Ok(match body {
        Some(b) if !b.is_empty() => builder.fixed(b),
        _ => builder.empty(),
    })
}

/// Adds the CORS headers of a cross-origin request, keeping an origin's own
/// `Access-Control-Allow-Origin` in forwarded mode.
pub fn cors(rc: &RequestCtx, h: &Headers) -> Result<()> {
    if rc.origin.is_none() {
        return Ok(());
    }
    let from_origin = h.get("Access-Control-Allow-Origin")?;
    for (k, v) in rc.cors_headers(from_origin.as_deref()) {
        match k {
            // Keep what the origin varies on.
            "Vary" => h.append(k, &v)?,
            _ => h.set(k, &v)?,
        }
    }
    Ok(())
}

/// Like [`respond`], with a streamed body (a replay from R2, a large
/// origin answer): never read into the isolate.
pub fn respond_stream(
    rc: &RequestCtx,
    status: u16,
    headers: &[(String, String)],
    extra: &[(&str, String)],
    body: worker::ResponseBody,
) -> Result<Response> {
    let h = to_headers(headers.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
    for (k, v) in extra {
        h.set(k, v)?;
    }
    h.set("X-Request-Id", &rc.request_id)?;
    cors(rc, &h)?;
    Ok(Response::builder()
        .with_status(status)
        .with_headers(h)
        .body(body))
}

/// A JSON resource.
pub fn json<T: Serialize>(
    rc: &RequestCtx,
    status: u16,
    value: &T,
    extra: &[(&str, String)],
) -> Handled {
    let body = serde_json::to_vec(value)?;
    let mut all: Vec<(&str, String)> = extra.to_vec();
    all.push(("Content-Type", "application/json".to_string()));
    all.push(("Cache-Control", "no-store".to_string()));
    Ok(respond(rc, status, &[], &all, Some(body))?)
}

/// 204 with no body.
pub fn no_content(rc: &RequestCtx) -> Handled {
    Ok(respond(rc, 204, &[], &[], None)?)
}

/// The request's path, and its path with the query string. The runtime hands
/// over an already serialized WHATWG URL, so both are cut out of it (as
/// `worker::Request::path` does) rather than parsed again with the `url`
/// crate (its host processing showed in the profile of a 429).
pub fn path_and_query(req: &worker::Request) -> (String, String) {
    let path = req.path();
    let url = req.inner().url();
    let with_query = match url.split_once('?') {
        Some((_, q)) => format!("{path}?{}", q.split('#').next().unwrap_or_default()),
        None => path.clone(),
    };
    (path, with_query)
}

/// The declared `Content-Length`, if present and numeric.
pub fn content_length(req: &worker::Request) -> Option<u64> {
    req.headers()
        .get("Content-Length")
        .ok()
        .flatten()
        .and_then(|v| v.trim().parse().ok())
}

/// `fetch(url, init)` called on `this` (the global scope, or a Durable Object
/// stub), without the `worker` crate's Request/Response wrappers: those copy
/// the request's `cf` object, wrap and re-create the response, and cost about
/// a fifth of a request's CPU on the paths that make two or three
/// subrequests (bench/RESULTS.md, "Where the time goes").
pub async fn raw_fetch(
    this: &JsValue,
    url: &str,
    init: &web_sys::RequestInit,
) -> Result<web_sys::Response> {
    let fetch: js_sys::Function = js_sys::Reflect::get(this, &JsValue::from_str("fetch"))?
        .dyn_into()
        .map_err(|_| worker::Error::RustError("fetch is not callable".into()))?;
    let promise: js_sys::Promise = fetch
        .call2(this, &JsValue::from_str(url), init)?
        .dyn_into()
        .map_err(|_| worker::Error::RustError("fetch did not return a promise".into()))?;
    let resp = JsFuture::from(promise).await?;
    resp.dyn_into()
        .map_err(|_| worker::Error::RustError("fetch did not resolve to a Response".into()))
}

/// A request init with a method and an optional body.
pub fn request_init(method: &str, body: &[u8]) -> web_sys::RequestInit {
    let init = web_sys::RequestInit::new();
    init.set_method(method);
    if !body.is_empty() {
        init.set_body(&js_sys::Uint8Array::from(body));
    }
    init
}

/// The whole body of a fetched response, read with one `arrayBuffer()` call
/// (`worker::Response::bytes` pulls it chunk by chunk through a stream reader).
pub async fn read_body(resp: &web_sys::Response) -> Result<Vec<u8>> {
    let buf = JsFuture::from(resp.array_buffer()?).await?;
    Ok(js_sys::Uint8Array::new(&buf).to_vec())
}

/// At most `max` bytes of a fetched response's body, read through a stream
/// reader; the rest is cancelled unread, so an endless or huge answer costs
/// neither memory nor time.
pub async fn read_prefix(resp: &web_sys::Response, max: usize) -> Result<Vec<u8>> {
    let Some(stream) = resp.body() else {
        return Ok(Vec::new());
    };
    let reader: web_sys::ReadableStreamDefaultReader = stream
        .get_reader()
        .dyn_into()
        .map_err(|_| worker::Error::RustError("no default reader".into()))?;
    let mut out = Vec::new();
    while out.len() < max {
        let chunk = JsFuture::from(reader.read()).await?;
        let done = js_sys::Reflect::get(&chunk, &JsValue::from_str("done"))?;
        if done.as_bool().unwrap_or(true) {
            break;
        }
        let value = js_sys::Reflect::get(&chunk, &JsValue::from_str("value"))?;
        let bytes = js_sys::Uint8Array::new(&value);
        let take = (max - out.len()).min(bytes.length() as usize);
        out.extend_from_slice(&bytes.subarray(0, take as u32).to_vec());
    }
    // The promise settles once the body is released; nothing waits on it.
    let _ = reader.cancel();
    Ok(out)
}
