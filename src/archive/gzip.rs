//! gzip through the runtime's `CompressionStream` and `DecompressionStream`
//! (no compressor in the wasm). Each call hands over one chunk: nothing
//! here holds a whole object.

use wasm_bindgen::prelude::wasm_bindgen;
use worker::js_sys::{Promise, Uint8Array};
use worker::wasm_bindgen::{JsCast, JsValue};
use worker::wasm_bindgen_futures::JsFuture;
use worker::{web_sys, Result};

use crate::streams::{js_err, Reader};

#[wasm_bindgen(inline_js = r#"
export function gzipNew() {
  const cs = new CompressionStream('gzip');
  const g = { w: cs.writable.getWriter(), out: [], size: 0 };
  const r = cs.readable.getReader();
  // Read continuously, so a write resolves as soon as the compressor took it.
  g.pump = (async () => {
    for (;;) {
      const { value, done } = await r.read();
      if (done) return;
      g.out.push(value);
      g.size += value.length;
    }
  })();
  g.pump.catch(() => {});
  return g;
}
function take(g) {
  const o = new Uint8Array(g.size);
  let i = 0;
  for (const c of g.out) { o.set(c, i); i += c.length; }
  g.out = [];
  g.size = 0;
  return o;
}
export function gzipWrite(g, bytes) {
  // A view of wasm memory: copied before anything else runs.
  const copy = bytes.slice();
  return g.w.write(copy).then(() => take(g));
}
export function gzipFinish(g) {
  return g.w.close().then(() => g.pump).then(() => take(g));
}
export function gzipAbort(g) {
  g.w.abort().catch(() => {});
}
export function gunzipReader(stream) {
  return stream.pipeThrough(new DecompressionStream('gzip')).getReader();
}
"#)]
extern "C" {
    #[wasm_bindgen(js_name = gzipNew, catch)]
    fn gzip_new() -> std::result::Result<JsValue, JsValue>;
    #[wasm_bindgen(js_name = gzipWrite, catch)]
    fn gzip_write(g: &JsValue, bytes: &[u8]) -> std::result::Result<Promise, JsValue>;
    #[wasm_bindgen(js_name = gzipFinish, catch)]
    fn gzip_finish(g: &JsValue) -> std::result::Result<Promise, JsValue>;
    #[wasm_bindgen(js_name = gzipAbort)]
    fn gzip_abort(g: &JsValue);
    #[wasm_bindgen(js_name = gunzipReader, catch)]
    fn gunzip_reader(stream: &web_sys::ReadableStream) -> std::result::Result<JsValue, JsValue>;
}

async fn bytes_of(p: Promise) -> Result<Vec<u8>> {
    let v = JsFuture::from(p).await.map_err(js_err)?;
    let a: Uint8Array = v
        .dyn_into()
        .map_err(|_| worker::Error::RustError("the compressor answered no bytes".into()))?;
    Ok(a.to_vec())
}

/// One gzip member being written: lines in, compressed bytes out.
pub struct Gzip(JsValue);

impl Gzip {
    pub fn new() -> Result<Gzip> {
        gzip_new().map(Gzip).map_err(js_err)
    }

    /// Compresses `bytes`; the compressed bytes produced so far.
    pub async fn write(&self, bytes: &[u8]) -> Result<Vec<u8>> {
        bytes_of(gzip_write(&self.0, bytes).map_err(js_err)?).await
    }

    /// Ends the member; the compressed bytes left.
    pub async fn finish(self) -> Result<Vec<u8>> {
        bytes_of(gzip_finish(&self.0).map_err(js_err)?).await
    }

    /// Gives up (an error elsewhere): nothing more is produced.
    pub fn abort(self) {
        gzip_abort(&self.0);
    }
}

/// The decompressed bytes of a gzip stream, read chunk by chunk.
pub fn gunzip(stream: &web_sys::ReadableStream) -> Result<Reader> {
    gunzip_reader(stream).map(Reader::of).map_err(js_err)
}
