//! Bodies read chunk by chunk, never held past a bound: a stream's chunks
//! ([`Reader`]), a fetched answer read whole only up to a size
//! ([`read_up_to`]; past it the whole body is handed back as a stream), and
//! a stream of unknown length stored in R2 part by part ([`put_unsized`]).

use postguard_core::archive::{Parts, PART_BYTES};
use wasm_bindgen::prelude::wasm_bindgen;
use worker::js_sys::{Promise, Uint8Array};
use worker::wasm_bindgen::{JsCast, JsValue};
use worker::wasm_bindgen_futures::JsFuture;
use worker::{web_sys, Bucket, Data, Result};

#[wasm_bindgen(inline_js = r#"
export function plainReader(stream) {
  return stream.getReader();
}
export function readChunk(reader) {
  return reader.read().then(({ value, done }) => (done ? null : value));
}
export function cancelReader(reader) {
  reader.cancel().catch(() => {});
}
// Reads and drops what is left of a request body (a stream, or the reader
// already reading it), at most `maxBytes` and `maxMs`, then cancels it.
export function linger(source, maxBytes, maxMs, idleMs) {
  const reader = typeof source.getReader === 'function' ? source.getReader() : source;
  // A client that stops sending (or never sent more than its head) must not hold the
  // answer: every read races the time left and an idle pause.
  const stop = Date.now() + maxMs;
  return (async () => {
    let n = 0;
    try {
      while (n <= maxBytes) {
        let timer;
        const wait = Math.max(0, Math.min(idleMs, stop - Date.now()));
        const idle = new Promise((r) => { timer = setTimeout(() => r({ idle: true }), wait); });
        const got = await Promise.race([reader.read(), idle]);
        clearTimeout(timer);
        if (got.idle || got.done) break;
        n += got.value.byteLength;
      }
    } catch (_) {}
    reader.cancel().catch(() => {});
  })();
}
// The body whole as bytes when it ends within `max`; otherwise the whole body
// as a stream again: the chunks read so far, then the rest as it comes.
export async function readUpTo(stream, max) {
  const reader = stream.getReader();
  const chunks = [];
  let size = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) {
      const out = new Uint8Array(size);
      let at = 0;
      for (const c of chunks) { out.set(c, at); at += c.byteLength; }
      return out;
    }
    chunks.push(value);
    size += value.byteLength;
    if (size > max) {
      return new ReadableStream({
        start(c) { for (const x of chunks.splice(0)) c.enqueue(x); },
        async pull(c) {
          const r = await reader.read();
          if (r.done) c.close(); else c.enqueue(r.value);
        },
        cancel(why) { return reader.cancel(why); },
      });
    }
  }
}
"#)]
extern "C" {
    #[wasm_bindgen(js_name = plainReader, catch)]
    fn plain_reader(stream: &web_sys::ReadableStream) -> std::result::Result<JsValue, JsValue>;
    #[wasm_bindgen(js_name = readChunk, catch)]
    fn read_chunk(reader: &JsValue) -> std::result::Result<Promise, JsValue>;
    #[wasm_bindgen(js_name = cancelReader)]
    fn cancel_reader(reader: &JsValue);
    #[wasm_bindgen(js_name = linger)]
    fn linger_js(source: &JsValue, max_bytes: f64, max_ms: f64, idle_ms: f64) -> Promise;
    #[wasm_bindgen(js_name = readUpTo, catch)]
    fn read_up_to_js(
        stream: &web_sys::ReadableStream,
        max: f64,
    ) -> std::result::Result<Promise, JsValue>;
}

pub fn js_err(e: JsValue) -> worker::Error {
    worker::Error::JsError(e.as_string().unwrap_or_else(|| format!("{e:?}")))
}

/// A stream read chunk by chunk.
pub struct Reader(JsValue);

impl Reader {
    /// A reader the runtime made (a decompressing one, say).
    pub fn of(reader: JsValue) -> Reader {
        Reader(reader)
    }

    /// The bytes as they come.
    pub fn plain(stream: &web_sys::ReadableStream) -> Result<Reader> {
        plain_reader(stream).map(Reader).map_err(js_err)
    }

    /// The next chunk, `None` at the end.
    pub async fn next(&self) -> Result<Option<Vec<u8>>> {
        let v = JsFuture::from(read_chunk(&self.0).map_err(js_err)?)
            .await
            .map_err(js_err)?;
        if v.is_null() {
            return Ok(None);
        }
        let a: Uint8Array = v
            .dyn_into()
            .map_err(|_| worker::Error::RustError("a stream chunk is not bytes".into()))?;
        Ok(Some(a.to_vec()))
    }

    /// Stops reading (the rest is not needed).
    pub fn cancel(self) {
        cancel_reader(&self.0);
    }
}

/// How long, and how much, a refused request body is still read (and
/// dropped) after its 413 is answered.
const LINGER_MS: f64 = 10_000.0;
const LINGER_BYTES: f64 = 1024.0 * 1024.0 * 1024.0;
/// A pause in the upload this long ends the lingering: the client stopped.
const LINGER_IDLE_MS: f64 = 500.0;

/// Reads and drops the rest of a request body refused as too large (a
/// stream, or the reader already reading it), before the refusal is
/// answered: the runtime drops a connection whose request body is left
/// unread, and a client still uploading would find it reset instead of
/// reading its 413 (a drain after the answer does not help: the body is
/// gone with the answer). Bounded by [`LINGER_MS`] and [`LINGER_BYTES`],
/// and ended by a pause of [`LINGER_IDLE_MS`] (a client that sent only its
/// head waits that long for its answer).
pub fn linger(source: &JsValue) -> Promise {
    linger_js(source, LINGER_BYTES, LINGER_MS, LINGER_IDLE_MS)
}

/// A body read up to a bound.
pub enum UpTo {
    /// It ended within the bound: all of it.
    Read(Vec<u8>),
    /// It crossed the bound: the whole body (what was read, then the rest),
    /// unread past one chunk over the bound.
    Over(web_sys::ReadableStream),
}

/// Reads `stream` whole if it ends within `max` bytes; at most `max` plus
/// one chunk is ever held.
pub async fn read_up_to(stream: &web_sys::ReadableStream, max: u64) -> Result<UpTo> {
    let v = JsFuture::from(read_up_to_js(stream, max as f64).map_err(js_err)?)
        .await
        .map_err(js_err)?;
    match v.dyn_into::<Uint8Array>() {
        Ok(bytes) => Ok(UpTo::Read(bytes.to_vec())),
        Err(v) => v
            .dyn_into::<web_sys::ReadableStream>()
            .map(UpTo::Over)
            .map_err(|_| {
                worker::Error::RustError("readUpTo gave neither bytes nor a stream".into())
            }),
    }
}

/// Stores a stream of unknown length as object `key`: one `put` when it
/// stays under a part, a multipart upload of equal parts otherwise (one
/// part held at a time). `Ok(None)`: it grew past `max` bytes, and nothing
/// is kept (the upload is aborted, the rest of the stream cancelled);
/// `Ok(Some(bytes))`: stored.
pub async fn put_unsized(
    bucket: &Bucket,
    key: &str,
    stream: &web_sys::ReadableStream,
    max: u64,
) -> Result<Option<u64>> {
    let reader = Reader::plain(stream)?;
    let mut parts = Parts::new(PART_BYTES);
    let mut upload = None;
    let mut done = Vec::new();
    let outcome = async {
        while let Some(chunk) = reader.next().await? {
            let full = parts.push(&chunk);
            if parts.bytes() > max {
                return Ok(false);
            }
            for part in full {
                if upload.is_none() {
                    upload = Some(
                        bucket
                            .create_multipart_upload(key.to_string())
                            .execute()
                            .await?,
                    );
                }
                if let Some(up) = &upload {
                    let number = u16::try_from(done.len() + 1).map_err(|_| {
                        worker::Error::RustError("a body of more than 65,535 parts".into())
                    })?;
                    done.push(up.upload_part(number, Data::Bytes(part)).await?);
                }
            }
        }
        Ok::<_, worker::Error>(true)
    }
    .await;
    match (outcome, upload) {
        (Ok(true), None) => {
            let bytes = parts.bytes();
            bucket
                .put(key, Data::Bytes(parts.finish()))
                .execute()
                .await?;
            Ok(Some(bytes))
        }
        (Ok(true), Some(up)) => {
            let bytes = parts.bytes();
            let last = parts.finish();
            if !last.is_empty() {
                let number = u16::try_from(done.len() + 1).map_err(|_| {
                    worker::Error::RustError("a body of more than 65,535 parts".into())
                })?;
                done.push(up.upload_part(number, Data::Bytes(last)).await?);
            }
            up.complete(done).await?;
            Ok(Some(bytes))
        }
        (over_or_failed, up) => {
            reader.cancel();
            if let Some(up) = up {
                let _ = up.abort().await;
            }
            over_or_failed.map(|_| None)
        }
    }
}
