// Entry of the RPC variant (build/gateway-rpc/index.js; build.sh puts worker-build's module
// beside it as gateway.js), the shape of postguard's src/entry.mjs: the runtime offers JS
// RPC only on classes extending DurableObject, so each Rust object is re-exported as one,
// forwarding to its wasm-bindgen methods. Glue only: the logic stays in Rust.
import { DurableObject } from 'cloudflare:workers';
import { Ref as RustRef, Audit as RustAudit } from './gateway.js';

export { default } from './gateway.js';

export class Ref extends DurableObject {
  #ref;

  constructor(ctx, env) {
    super(ctx, env);
    this.#ref = new RustRef(ctx, env);
  }

  admit(limit, windowMs, k, fp) {
    return this.#ref.admit_rpc(limit, windowMs, k, fp);
  }

  complete(k, status, body) {
    return this.#ref.complete_rpc(k, status, body);
  }
}

export class Audit extends DurableObject {
  #audit;

  constructor(ctx, env) {
    super(ctx, env);
    this.#audit = new RustAudit(ctx, env);
  }

  write(rows) {
    return this.#audit.write_rpc(rows);
  }

  fetch(request) {
    return this.#audit.fetch(request);
  }
}
