// Shared by bench/profile.mjs and bench/publish-profile.mjs: the DevTools protocol client
// and the named copy of a build's wasm the profiles attribute time to.
import fs from 'node:fs';
import path from 'node:path';
import { createHash } from 'node:crypto';

/** A minimal Chrome DevTools protocol client over workerd's inspector WebSocket. */
export function cdp(wsUrl) {
  const ws = new WebSocket(wsUrl);
  let id = 0;
  const waiting = new Map();
  ws.addEventListener('message', (ev) => {
    const msg = JSON.parse(ev.data);
    if (msg.id && waiting.has(msg.id)) {
      const { resolve, reject } = waiting.get(msg.id);
      waiting.delete(msg.id);
      if (msg.error) reject(new Error(JSON.stringify(msg.error)));
      else resolve(msg.result);
    }
  });
  const open = new Promise((resolve, reject) => {
    ws.addEventListener('open', resolve);
    ws.addEventListener('error', reject);
  });
  return {
    open,
    send: (method, params = {}) => new Promise((resolve, reject) => {
      id += 1;
      waiting.set(id, { resolve, reject });
      ws.send(JSON.stringify({ id, method, params }));
    }),
    close: () => ws.close(),
  };
}

/**
 * Miniflare options patch: serve the build's wasm from the copy that keeps its function
 * names, when that copy belongs to this build (the digest scripts/wasm-post.sh recorded
 * matches build/index_bg.wasm). Otherwise the build is profiled as it is.
 */
export function withNames(root) {
  const dir = path.join(root, 'target', 'wasm-names');
  const read = (f) => (fs.existsSync(f) ? fs.readFileSync(f) : null);
  const named = read(path.join(dir, 'index_bg.wasm'));
  const digest = read(path.join(dir, 'stripped.sha256'))?.toString().trim();
  const built = read(path.join(root, 'build', 'index_bg.wasm'));
  if (!named || !built || digest !== createHash('sha256').update(built).digest('hex')) return undefined;
  return (v4) => {
    for (const m of v4.modules) if (m.type === 'CompiledWasm') m.contents = new Uint8Array(named);
  };
}
