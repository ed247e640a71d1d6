// The worker's entry module (build/index.js; scripts/build.sh puts worker-build's
// generated module beside it as build/postguard.js). It re-exports every generated
// export unchanged (each #[durable_object] class) except three: the default entrypoint
// (fetch/queue/scheduled), without the shim's per-request proxies (below), and
// KeyGuard and WebhookShard, which it exports as classes extending DurableObject: the
// runtime offers JS RPC only on such a class, and the worker calls those objects by RPC
// (`run`) rather than by fetch (ADR 0018, ADR 0035). Glue only: every decision is in Rust.
import { DurableObject } from 'cloudflare:workers';
import Generated, {
  KeyGuard as RustKeyGuard,
  ProjectHub as RustProjectHub,
  WebhookShard as RustWebhookShard,
} from './postguard.js';

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

// worker-build wraps its entrypoint class and each object class in a Proxy
// (its shim) whose traps build more Proxies and a handler object on every
// request and every method read, to reinitialise the wasm instance after a
// critical error. The exports below call the same generated code directly and keep
// that recovery: the flag is the shared `__worker_init_state`, constructing a
// proxied class runs the shim's reinitialisation when it is set, and a Rust
// object made before it is made again (ADR 0025).
const initState = globalThis.__worker_init_state;
// The shim's state is worker-build 0.8.7's (pinned in scripts/setup.sh). If a later
// release renames it, fail when the module loads (the deploy and every test fail
// loudly) rather than on each request.
if (!initState || typeof initState !== 'object' || !('instanceId' in initState)) {
  throw new Error('postguard: worker-build shim state (__worker_init_state) not found; see ADR 0025');
}
const handlers = Generated.prototype;
// The proxies trap only `construct`: `prototype.constructor` is the class itself.
const RawKeyGuard = RustKeyGuard.prototype.constructor;
const RawWebhookShard = RustWebhookShard.prototype.constructor;
const RawProjectHub = RustProjectHub.prototype.constructor;

/** `method` called on `self`; a wasm trap marks the instance for reinitialisation (as the shim does). */
function invoke(self, method, ...args) {
  try {
    return method.apply(self, args);
  } catch (e) {
    if (e instanceof WebAssembly.RuntimeError) {
      console.error(JSON.stringify({ level: 'error', msg: 'critical wasm error: the instance is reinitialised', error: String(e) }));
      initState.criticalError = true;
    }
    throw e;
  }
}

// A module-syntax handler object, not a class: the runtime constructs an
// entrypoint class (a native WorkerEntrypoint) for every request.
function enter(handler, arg, env, ctx) {
  if (initState.criticalError) new Generated(ctx, env);
  return invoke({ env, ctx }, handler, arg);
}

export default {
  fetch: (request, env, ctx) => enter(handlers.fetch, request, env, ctx),
  queue: (batch, env, ctx) => enter(handlers.queue, batch, env, ctx),
  scheduled: (event, env, ctx) => enter(handlers.scheduled, event, env, ctx),
};

export class KeyGuard extends DurableObject {
  #guard = null;
  #instance = -1;

  /** The Rust object, made again once the wasm instance was reinitialised. */
  #rust() {
    if (initState.criticalError) new RustKeyGuard(this.ctx, this.env);
    if (this.#instance !== initState.instanceId) {
      this.#guard = new RawKeyGuard(this.ctx, this.env);
      this.#instance = initState.instanceId;
    }
    return this.#guard;
  }

  /** One operation: `op` is its path ("/admit", …), `frame` the request frame; resolves to the reply frame. */
  run(op, frame) {
    return invoke(this.#rust(), RawKeyGuard.prototype.rpc, op, frame);
  }

  fetch(request) {
    return invoke(this.#rust(), RawKeyGuard.prototype.fetch, request);
  }

  /**
   * The alarm is the shell's outbox (src/operations/outbox.rs): it calls back into this
   * object's `run` for each step, so the object itself never publishes or queues.
   */
  alarm() {
    this.#rust();
    // worker-build puts the crate's exported functions on the entrypoint's prototype.
    return invoke(null, handlers.keyGuardAlarm, this, this.env);
  }
}

/**
 * An object class called by JS RPC `run(op, body)` (JSON both ways), over the Rust class
 * `Rust` (its proxied export) and `Raw` (the class itself).
 */
function jsonObject(Rust, Raw) {
  return class extends DurableObject {
    #rustObject = null;
    #instance = -1;

    #rust() {
      if (initState.criticalError) new Rust(this.ctx, this.env);
      if (this.#instance !== initState.instanceId) {
        this.#rustObject = new Raw(this.ctx, this.env);
        this.#instance = initState.instanceId;
      }
      return this.#rustObject;
    }

    run(op, body) {
      return invoke(this.#rust(), Raw.prototype.rpc, op, body);
    }

    fetch(request) {
      return invoke(this.#rust(), Raw.prototype.fetch, request);
    }
  };
}

// The project objects (ADR 0046): the publish path's copy of the subscribers, the ordering lanes.
export class ProjectHub extends jsonObject(RustProjectHub, RawProjectHub) {}

// The webhook shards (ADR 0035) the same way: the worker calls `run` by JS RPC; `fetch`
// stays for tests and operators reaching an object through the runtime's API.
export class WebhookShard extends jsonObject(RustWebhookShard, RawWebhookShard) {}
