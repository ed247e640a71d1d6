//! Sealing a stored answer of the gateway's own API (AES-256-GCM through the
//! runtime's WebCrypto: no cipher in the wasm). The key and the layout are
//! `postguard_core::gateway`'s; this file only runs the cipher.

use postguard_core::gateway::{sealed, sealed_parts, IV_LEN};
use wasm_bindgen::prelude::wasm_bindgen;
use worker::js_sys::{Promise, Uint8Array};
use worker::wasm_bindgen::{JsCast, JsValue};
use worker::wasm_bindgen_futures::JsFuture;

use crate::runtime::random_bytes;

#[wasm_bindgen(inline_js = r#"
export function aesGcm(encrypt, key, iv, data) {
  // Views of wasm memory: copied before the first await.
  const [k, i, d] = [key.slice(), iv.slice(), data.slice()];
  const use = encrypt ? 'encrypt' : 'decrypt';
  return crypto.subtle.importKey('raw', k, 'AES-GCM', false, [use])
    .then((ck) => crypto.subtle[use]({ name: 'AES-GCM', iv: i }, ck, d))
    .then((out) => new Uint8Array(out));
}
"#)]
extern "C" {
    #[wasm_bindgen(js_name = aesGcm, catch)]
    fn aes_gcm(encrypt: bool, key: &[u8], iv: &[u8], data: &[u8]) -> Result<Promise, JsValue>;
}

async fn run(encrypt: bool, key: &[u8; 32], iv: &[u8], data: &[u8]) -> worker::Result<Vec<u8>> {
    let out = JsFuture::from(aes_gcm(encrypt, key, iv, data)?).await?;
    let bytes: Uint8Array = out
        .dyn_into()
        .map_err(|_| worker::Error::RustError("AES-GCM answered no bytes".into()))?;
    Ok(bytes.to_vec())
}

/// `body` sealed under `key` with a fresh random IV.
pub async fn seal(key: &[u8; 32], body: &[u8]) -> worker::Result<Vec<u8>> {
    let iv = random_bytes::<IV_LEN>().map_err(|e| worker::Error::RustError(e.to_string()))?;
    Ok(sealed(&iv, &run(true, key, &iv, body).await?))
}

/// The body `stored` sealed under `key`; an error when it is not a sealed
/// body or does not open (another key: `ADMIN_TOKEN` was rotated).
pub async fn open(key: &[u8; 32], stored: &[u8]) -> worker::Result<Vec<u8>> {
    let (iv, ciphertext) = sealed_parts(stored)
        .ok_or_else(|| worker::Error::RustError("the stored answer is not sealed".into()))?;
    run(false, key, iv, ciphertext).await
}
