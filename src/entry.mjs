// The worker's entry module (build/index.js; scripts/build.sh puts worker-build's
// generated module beside it as build/postguard.js). It re-exports every generated
// export unchanged (the fetch/queue/scheduled handlers, each #[durable_object] class)
// except KeyGuard, which it exports as a class extending DurableObject: the runtime
// offers JS RPC only on such a class, and the worker calls the key's object by RPC
// (`run`) rather than by fetch (ADR 0018). Glue only: every decision is in Rust.
import { DurableObject } from 'cloudflare:workers';
import { KeyGuard as RustKeyGuard } from './postguard.js';

// wasm-bindgen's futures wake a Rust task by passing a callback to the global
// `queueMicrotask` each time an awaited promise settles (2–3 times per request). On
// workerd that is a native call wrapping the callback, one of the largest entries in
// bench/profile.mjs; `then` on a settled promise queues the same microtask inside V8
// (same order: both are microtasks). ADR 0021.
const settled = Promise.resolve();
globalThis.queueMicrotask = (task) => {
  settled.then(task);
};

export * from './postguard.js';
export { default } from './postguard.js';

export class KeyGuard extends DurableObject {
  #guard;

  constructor(ctx, env) {
    super(ctx, env);
    this.#guard = new RustKeyGuard(ctx, env);
  }

  /** One operation: `op` is its path ("/admit", …), `frame` the request frame; resolves to the reply frame. */
  run(op, frame) {
    return this.#guard.rpc(op, frame);
  }

  fetch(request) {
    return this.#guard.fetch(request);
  }

  alarm(info) {
    return this.#guard.alarm(info);
  }
}
