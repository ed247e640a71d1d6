// The worker's entry module (build/index.js; scripts/build.sh puts worker-build's
// generated module beside it as build/postguard.js). It re-exports every generated
// export unchanged (the fetch/queue/scheduled handlers, each #[durable_object] class)
// except KeyGuard, which it exports as a class extending DurableObject: the runtime
// offers JS RPC only on such a class, and the worker calls the key's object by RPC
// (`run`) rather than by fetch (ADR 0018). Glue only: every decision is in Rust.
import { DurableObject, WorkerEntrypoint } from 'cloudflare:workers';
import Generated, { KeyGuard as RustKeyGuard } from './postguard.js';

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

// worker-build's default export is its entrypoint class behind a Proxy whose
// `construct` and `get` traps build two more Proxies and a handler object on
// every request, to reinitialise the wasm instance after a critical error.
// This class calls the same generated handlers (`Generated.prototype.*`, which
// read `this.env` and `this.ctx`) and keeps that recovery: the flag is the
// shared `__worker_init_state`, and constructing the proxied class runs the
// shim's reinitialisation when it is set (ADR 0025).
const initState = globalThis.__worker_init_state;
const handlers = Generated.prototype;

function enter(self, handler, arg) {
  if (initState.criticalError) new Generated(self.ctx, self.env);
  try {
    return handler.call(self, arg);
  } catch (e) {
    if (e instanceof WebAssembly.RuntimeError) {
      console.error('Critical', e);
      initState.criticalError = true;
    }
    throw e;
  }
}

export default class Postguard extends WorkerEntrypoint {
  fetch(request) {
    return enter(this, handlers.fetch, request);
  }

  queue(batch) {
    return enter(this, handlers.queue, batch);
  }

  scheduled(event) {
    return enter(this, handlers.scheduled, event);
  }
}

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
