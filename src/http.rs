//! Building responses (JSON resources, raw bodies) and subrequests; problems
//! are rendered by `reject::render`.

use postguard_core::headers::{self, HeaderSet};
use wasm_bindgen::prelude::wasm_bindgen;
use worker::wasm_bindgen::{JsCast, JsValue};
use worker::wasm_bindgen_futures::JsFuture;
use worker::{js_sys, web_sys, Headers, Response, Result};

use crate::runtime::RequestCtx;

pub type HeaderList = Vec<(String, String)>;

#[wasm_bindgen(inline_js = r#"
export function headerLines(h) {
  let s = '';
  for (const [k, v] of h) s += k + '\n' + v + '\n';
  return s;
}
export function requestLines(r) {
  return r.method + '\n' + r.url + '\n' + headerLines(r.headers);
}
export function headersOf(s) {
  const h = new Headers();
  const p = s.split('\n');
  for (let i = 0; i + 1 < p.length; i += 2) h.append(p[i], p[i + 1]);
  return h;
}
export function fetchLines(url, method, lines, body, signal) {
  const init = { method, headers: headersOf(lines), redirect: 'manual', signal };
  // `body` is a view of wasm memory: copied before anything else runs.
  if (body.length > 0) init.body = body.slice();
  return fetch(url, init);
}
"#)]
extern "C" {
    /// Every header as `name\nvalue\n` lines (`headers::to_lines`): one
    /// crossing for the whole list, where iterating costs several per header.
    #[wasm_bindgen(js_name = headerLines)]
    fn header_lines(h: &web_sys::Headers) -> String;
    /// A request's method, URL and header lines (`method\nurl\n` then
    /// [`header_lines`]): what the handlers read of it, in one crossing
    /// where `method()`, `url()`, `headers()` and the lines are four.
    #[wasm_bindgen(js_name = requestLines)]
    fn request_lines(r: &web_sys::Request) -> String;
    /// A `Headers` object from such lines, in one crossing.
    #[wasm_bindgen(js_name = headersOf, catch)]
    fn headers_of(lines: &str) -> std::result::Result<web_sys::Headers, JsValue>;
    /// The global `fetch` with a manual-redirect init built in one crossing
    /// (headers from lines; the body copied, none when empty), where the
    /// `RequestInit` setters, the `Headers` object and the body array are
    /// seven.
    #[wasm_bindgen(js_name = fetchLines, catch)]
    fn fetch_lines(
        url: &str,
        method: &str,
        lines: &str,
        body: &[u8],
        signal: &web_sys::AbortSignal,
    ) -> std::result::Result<js_sys::Promise, JsValue>;
}

/// `fetch(url)` with `method`, `headers`, `body` (none when empty), manual
/// redirects and `signal`: the origin request.
pub async fn fetch_manual(
    url: &str,
    method: &str,
    headers: &[(String, String)],
    body: &[u8],
    signal: &web_sys::AbortSignal,
) -> Result<web_sys::Response> {
    let pairs = headers.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    let Some(lines) = headers::to_lines(pairs.clone()) else {
        // A line feed in a pair: the runtime refuses it, as it always did.
        let init = request_init(method, body);
        init.set_headers(&to_headers(pairs)?.0);
        init.set_redirect(web_sys::RequestRedirect::Manual);
        init.set_signal(Some(signal));
        return raw_fetch(&js_sys::global(), url, &init).await;
    };
    let promise = fetch_lines(url, method, &lines, body, signal)?;
    JsFuture::from(promise)
        .await?
        .dyn_into()
        .map_err(|_| worker::Error::RustError("fetch did not resolve to a Response".into()))
}

/// Headers of a runtime request or response as owned pairs.
pub fn raw_header_pairs(h: &web_sys::Headers) -> HeaderList {
    headers::from_lines(&header_lines(h))
}

pub fn to_headers<'a, I>(pairs: I) -> Result<Headers>
where
    I: IntoIterator<Item = (&'a str, &'a str)> + Clone,
{
    if let Some(lines) = headers::to_lines(pairs.clone()) {
        return Ok(Headers(headers_of(&lines)?));
    }
    // A line feed in a pair: appended one by one, so the runtime refuses it
    // exactly as it always did.
    let h = Headers::new();
    for (k, v) in pairs {
        h.append(k, v)?;
    }
    Ok(h)
}

/// The client's request as the runtime hands it to the fetch handler, with
/// what the handlers read from it taken once: no `worker::Request` wrapper,
/// whose construction reads the request's `cf` object (which the runtime
/// builds on first access, and postguard never uses).
pub struct Client {
    pub raw: web_sys::Request,
    pub method: String,
    pub path: String,
    pub url: String,
    pub headers: HeaderList,
}

impl Client {
    pub fn of(raw: web_sys::Request) -> Client {
        let lines = request_lines(&raw);
        let mut parts = lines.splitn(3, '\n');
        let method = parts.next().unwrap_or_default().to_string();
        let url = parts.next().unwrap_or_default().to_string();
        Client {
            method,
            path: path_of(&url),
            headers: headers::from_lines(parts.next().unwrap_or_default()),
            url,
            raw,
        }
    }

    /// The value of header `name` (the runtime's list holds each name once,
    /// values joined, except `Set-Cookie`, which a request does not carry).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The path with the query string (never the fragment).
    pub fn path_and_query(&self) -> String {
        match self.url.split_once('?') {
            Some((_, q)) => format!("{}?{}", self.path, q.split('#').next().unwrap_or_default()),
            None => self.path.clone(),
        }
    }

    /// The declared `Content-Length`, if present and numeric.
    pub fn content_length(&self) -> Option<u64> {
        self.header("Content-Length")
            .and_then(|v| v.trim().parse().ok())
    }

    /// The `worker::Request` the gateway's own endpoints take.
    pub fn into_worker(self) -> worker::Request {
        worker::Request::from(self.raw)
    }
}

/// The path of a serialized WHATWG URL, cut out of it as
/// `worker::Request::path` does: the first `/` after the host begins the
/// path, within which `?` and `#` are always percent-encoded.
fn path_of(url: &str) -> String {
    let Some(host_start) = url.find("://").map(|i| i + 3) else {
        return match url.starts_with('/') {
            true => url.to_string(),
            false => format!("/{url}"),
        };
    };
    match url[host_start..].find('/') {
        Some(i) => {
            let path = &url[host_start + i..];
            path[..path.find(['?', '#']).unwrap_or(path.len())].to_string()
        }
        None => "/".to_string(),
    }
}

/// The headers of an answer: `headers`, then `extra` and the request id
/// replacing any of the same name, then the CORS headers; handed to the
/// runtime in one call.
fn answer_headers(
    rc: &RequestCtx,
    headers: &[(String, String)],
    extra: &[(&str, String)],
) -> Result<Headers> {
    if rc.origin.is_none() {
        // No CORS headers to merge: the lines are written straight away.
        let mut over: Vec<(&str, &str)> = extra.iter().map(|(k, v)| (*k, v.as_str())).collect();
        over.push(("X-Request-Id", &rc.request_id));
        if let Some(lines) = headers::lines_with(headers, &over) {
            return Ok(Headers(headers_of(&lines)?));
        }
    }
    let mut set = HeaderSet::from_pairs(headers);
    for (k, v) in extra {
        set.set(k, v);
    }
    set.set("X-Request-Id", &rc.request_id);
    cors_into(rc, &mut set);
    to_headers(set.pairs().iter().map(|(k, v)| (k.as_str(), v.as_str())))
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
    let h = answer_headers(rc, headers, extra)?;
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
fn cors_into(rc: &RequestCtx, set: &mut HeaderSet) {
    if rc.origin.is_none() {
        return;
    }
    let from_origin = set.get("Access-Control-Allow-Origin");
    for (k, v) in rc.cors_headers(from_origin.as_deref()) {
        match k {
            // Keep what the origin varies on.
            "Vary" => set.append(k, &v),
            _ => set.set(k, &v),
        }
    }
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
    let h = answer_headers(rc, headers, extra)?;
    Ok(Response::builder()
        .with_status(status)
        .with_headers(h)
        .body(body))
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

/// What the origin answered, as far as it was read.
pub struct OriginAnswer {
    pub status: u16,
    pub headers: HeaderList,
    pub body: AnswerBody,
}

pub enum AnswerBody {
    /// Not read: it streams through (no claim stores it).
    Through(Option<web_sys::ReadableStream>),
    /// Read whole: at most the bound.
    Read(Vec<u8>),
    /// Over the bound, declared (`len`) or crossed while reading: the whole
    /// body as a stream, at most the bound plus one chunk read so far.
    Large {
        body: Option<web_sys::ReadableStream>,
        len: Option<u64>,
    },
}

impl AnswerBody {
    /// The body's length when it is known: read, or declared.
    pub fn known_len(&self) -> Option<u64> {
        match self {
            AnswerBody::Read(b) => Some(b.len() as u64),
            AnswerBody::Large { len, .. } => *len,
            AnswerBody::Through(_) => None,
        }
    }
}

/// Why the origin gave no answer.
pub enum NoAnswer {
    Timeout,
    Unreachable(worker::Error),
}

/// The one origin call (the proxy's and an operation's): `origin` sent
/// within `timeout_ms` (then aborted). With `read_up_to`, the answer's body
/// is read whole only up to that many bytes (a declared length over it is
/// not read at all); without, it is left to stream through.
pub async fn fetch_within(
    origin: &postguard_core::proxy::OriginRequest,
    timeout_ms: u64,
    read_up_to: Option<u64>,
) -> std::result::Result<OriginAnswer, NoAnswer> {
    let controller = web_sys::AbortController::new()
        .map_err(|e| NoAnswer::Unreachable(worker::Error::from(e)))?;
    let signal = controller.signal();
    let work = async {
        let resp = fetch_manual(
            &origin.url,
            &origin.method,
            &origin.headers,
            &origin.body,
            &signal,
        )
        .await?;
        let status = resp.status();
        let headers = raw_header_pairs(&resp.headers());
        let body = match read_up_to {
            None => AnswerBody::Through(resp.body()),
            Some(max) => bounded_body(&resp, &headers, max).await?,
        };
        Ok::<_, worker::Error>(OriginAnswer {
            status,
            headers,
            body,
        })
    };
    match crate::runtime::within(timeout_ms, work).await {
        Some(answer) => answer.map_err(NoAnswer::Unreachable),
        None => {
            controller.abort();
            Err(NoAnswer::Timeout)
        }
    }
}

/// The answer's body read up to `max` bytes, or left whole as a stream.
async fn bounded_body(
    resp: &web_sys::Response,
    headers: &HeaderList,
    max: u64,
) -> Result<AnswerBody> {
    let declared = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<u64>().ok());
    let Some(stream) = resp.body() else {
        return Ok(AnswerBody::Read(Vec::new()));
    };
    if let Some(len) = declared.filter(|len| *len > max) {
        return Ok(AnswerBody::Large {
            body: Some(stream),
            len: Some(len),
        });
    }
    Ok(match crate::streams::read_up_to(&stream, max).await? {
        crate::streams::UpTo::Read(bytes) => AnswerBody::Read(bytes),
        crate::streams::UpTo::Over(whole) => AnswerBody::Large {
            body: Some(whole),
            len: None,
        },
    })
}
