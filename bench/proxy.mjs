// Benchmark: postguard against (a) a bare pass-through worker, the ceiling for any proxy
// on this runtime, (b) a minimal JS gateway doing the I/O the contract requires, the floor
// for any design with central per-key state (bench/passthrough.mjs), once calling its
// objects by fetch and once by JS RPC, (c) the same minimal gateway and pass-through in
// Rust (bench/minimal-rust, ADR 0023: the floor of any Rust `worker` crate gateway here;
// REFERENCE_RUST=0 leaves them out), and (d) the origin hit directly. Everything runs
// locally under Miniflare (workerd); figures are ratios measured side by side in one run,
// the contenders loaded in alternation, each scenario repeated `rounds` times.
// Usage: node bench/proxy.mjs [rounds] [seconds]
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { startOrigin } from '../tests/support/origin.mjs';
import { ORIGIN_TOKEN, ROOT } from '../tests/support/gateway.mjs';
import { PASS_THROUGH, REFERENCE, REFERENCE_RPC, RUST_PASS_THROUGH, RUST_REFERENCE, RUST_REFERENCE_RPC, startBaseline, withRust } from './passthrough.mjs';
import { benchGateway, commitOf, median, spread, writeSection, loadUrl } from './results.mjs';

const ROUNDS = Number(process.argv[2] ?? 3);
const SECONDS = Number(process.argv[3] ?? 4);
const CONNECTIONS = 16;
// BEFORE_ROOT=<checkout with its own build> adds that build as a fourth contender in the
// same rounds (before/after a change, side by side).
const BEFORE_ROOT = process.env.BEFORE_ROOT;
const commit = commitOf(ROOT);

const load = (url, opts = {}) => loadUrl(url, { ...opts, connections: CONNECTIONS, seconds: SECONDS });

const origin = await startOrigin();
const bare = await startBaseline(PASS_THROUGH, origin.url);
const bareUrl = bare.url;
const ref = await startBaseline(REFERENCE, origin.url);
// The same reference calling its objects by JS RPC instead of fetch (as postguard does).
const rpc = await startBaseline(REFERENCE_RPC, origin.url);
// The Rust floor (ADR 0023): the minimal gateway and the pass-through in Rust.
const RUST = withRust();
const rustBare = RUST ? await startBaseline(RUST_PASS_THROUGH, origin.url) : null;
const rustRef = RUST ? await startBaseline(RUST_REFERENCE, origin.url) : null;
const rustRpc = RUST ? await startBaseline(RUST_REFERENCE_RPC, origin.url) : null;
const { gw, tiny, auth, body } = await benchGateway(origin.url);
let before = null;
if (BEFORE_ROOT) {
  process.env.POSTGUARD_ROOT = BEFORE_ROOT; // the harness reads the build from here
  before = await benchGateway(origin.url);
  delete process.env.POSTGUARD_ROOT;
}
try {
  const json = { 'content-type': 'application/json' };
  const refAuth = (r) => ({ ...json, authorization: `Bearer ${r.key}` });
  for (const r of [ref, rpc, rustRef, rustRpc].filter(Boolean)) await load(`${r.url}/bench/pay`, { method: 'POST', headers: { ...refAuth(r), 'idempotency-key': 'bench-replay' }, body }); // the reference's stored response
  const current = { gw, tiny, auth };
  const scenarios = {
    'GET (no idempotency)': {
      pg: (g) => load(`${g.gw.url}/bench/items`, { headers: g.auth }),
      ref: (r) => load(`${r.url}/bench/items`, { headers: refAuth(r) }),
      bare: (u = bareUrl) => load(`${u}/bench/items`),
    },
    'fresh POST (auth + limit + claim + forward + store)': {
      pg: (g) => load(`${g.gw.url}/bench/pay`, { method: 'POST', headers: g.auth, body, fresh: true }),
      ref: (r) => load(`${r.url}/bench/pay`, { method: 'POST', headers: refAuth(r), body, fresh: true }),
      bare: (u = bareUrl) => load(`${u}/bench/pay`, { method: 'POST', headers: json, body }),
    },
    'replayed POST': {
      pg: (g) => load(`${g.gw.url}/bench/pay`, { method: 'POST', headers: { ...g.auth, 'idempotency-key': 'bench-replay' }, body }),
      ref: (r) => load(`${r.url}/bench/pay`, { method: 'POST', headers: { ...refAuth(r), 'idempotency-key': 'bench-replay' }, body }),
      bare: (u = bareUrl) => load(`${u}/bench/pay`, { method: 'POST', headers: json, body }),
    },
    '429 rejection': {
      pg: (g) => load(`${g.gw.url}/bench/items`, { headers: { authorization: `Bearer ${g.tiny}` } }),
      ref: (r) => load(`${r.url}/bench/items`, { headers: { authorization: `Bearer ${r.tiny}` } }),
      bare: (u = bareUrl) => load(`${u}/bench/items`),
    },
  };
  const origRuns = [];
  for (let i = 0; i < ROUNDS; i++) origRuns.push(await load(`${origin.url}/bench/items`));
  const rows = [];
  const codes = (res) => Object.entries(res.statusCodeStats ?? {}).filter(([, c]) => c.count).map(([code]) => code);
  for (const [name, s] of Object.entries(scenarios)) {
    await s.pg(current); // warm-up
    if (before) await s.pg(before);
    await s.ref(ref);
    await s.ref(rpc);
    if (RUST) await s.ref(rustRef);
    if (RUST) await s.ref(rustRpc);
    const r = { rustRpcJs: [], pgRustRpc: [], rustRpcStatus: new Set(), rustRps: [], rustJs: [], pgRust: [], rustBareJs: [], rustBareAbs: [], rustAbs: [], rustStatus: new Set(), rpcRps: [], pgRpc: [], rpcStatus: new Set(), rps: [], p50: [], p99: [], refRps: [], pgRef: [], pgRps: [], bareRps: [], refAbs: [], pgP50: [], pgP99: [], status: new Set(), refStatus: new Set(), beforeRps: [], afterBefore: [] };
    for (let i = 0; i < ROUNDS; i++) {
      const b = await s.bare();
      const f = await s.ref(ref);
      const fr = await s.ref(rpc);
      const p = await s.pg(current);
      if (before) {
        const o = await s.pg(before);
        r.beforeRps.push(o.requests.average / b.requests.average);
        r.afterBefore.push(p.requests.average / o.requests.average);
      }
      if (RUST) {
        const rb = await s.bare(rustBare.url);
        const rr = await s.ref(rustRef);
        const rrr = await s.ref(rustRpc);
        codes(rr).forEach((c) => r.rustStatus.add(c));
        codes(rrr).forEach((c) => r.rustRpcStatus.add(c));
        r.rustRpcJs.push(rrr.requests.average / fr.requests.average);
        r.pgRustRpc.push(p.requests.average / rrr.requests.average);
        r.rustRps.push(rr.requests.average / b.requests.average);
        r.rustJs.push(rr.requests.average / f.requests.average);
        r.pgRust.push(p.requests.average / rr.requests.average);
        r.rustBareJs.push(rb.requests.average / b.requests.average);
        r.rustBareAbs.push(rb.requests.average);
        r.rustAbs.push(rr.requests.average);
      }
      codes(p).forEach((c) => r.status.add(c));
      codes(f).forEach((c) => r.refStatus.add(c));
      codes(fr).forEach((c) => r.rpcStatus.add(c));
      r.rpcRps.push(fr.requests.average / b.requests.average);
      r.pgRpc.push(p.requests.average / fr.requests.average);
      r.rps.push(p.requests.average / b.requests.average);
      r.refRps.push(f.requests.average / b.requests.average);
      r.pgRef.push(p.requests.average / f.requests.average);
      r.p50.push(p.latency.p50 / Math.max(b.latency.p50, 0.5));
      r.p99.push(p.latency.p99 / Math.max(b.latency.p99, 0.5));
      r.pgRps.push(p.requests.average);
      r.bareRps.push(b.requests.average);
      r.refAbs.push(f.requests.average);
      r.pgP50.push(p.latency.p50);
      r.pgP99.push(p.latency.p99);
    }
    rows.push({ name, ...r });
    console.log(name, JSON.stringify({ rps: r.rps, ref: r.refRps, pgRef: r.pgRef, pgRpc: r.pgRpc, rustJs: r.rustJs, pgRust: r.pgRust, rustBareJs: r.rustBareJs, rustRpcJs: r.rustRpcJs, pgRustRpc: r.pgRustRpc, status: [...r.status], refStatus: [...r.refStatus], rustStatus: [...r.rustStatus] }));
  }
  const wasm = fs.readFileSync(path.join(ROOT, 'build', 'index_bg.wasm'));
  const m = (xs) => `${median(xs).toFixed(2)} (${spread(xs)})`;
  const table = rows.map((r) => `| ${r.name} | ${m(r.rps)} | ${m(r.p50)} | ${m(r.p99)} | ${m(r.refRps)} | ${m(r.pgRef)} | ${median(r.pgRps).toFixed(0)} / ${median(r.refAbs).toFixed(0)} / ${median(r.bareRps).toFixed(0)} | ${median(r.pgP50)} / ${median(r.pgP99)} | ${[...r.status].join(', ')} (reference ${[...r.refStatus].join(', ')}) |`).join('\n');
  const rpcTable = `
The reference with its object calls made by JS RPC instead of \`fetch\` (\`REFERENCE_RPC\` in bench/passthrough.mjs, same code otherwise), in the same rounds:

| scenario | reference (RPC) ÷ bare, req/s | postguard ÷ reference (RPC), req/s | statuses |
|---|---|---|---|
${rows.map((r) => `| ${r.name} | ${m(r.rpcRps)} | ${m(r.pgRpc)} | ${[...r.rpcStatus].join(', ')} |`).join('\n')}
`;
  const rustTable = !RUST ? '' : `
### The Rust floor (ADR 0023)

The same minimal gateway written in Rust with the plain \`worker\` crate (\`bench/minimal-rust\`, objects called by \`fetch\`: the
I/O of \`REFERENCE\` in the same order), and a Rust pure pass-through against the JS one, in the same rounds
(each round: bare, reference, reference (RPC), postguard${before ? ', the earlier build' : ''}, Rust pass-through, Rust reference, Rust reference (RPC)).
"Rust reference ÷ reference" is the price of the language and the \`worker\` crate for the same I/O; "postguard ÷ Rust reference" is
postguard's own cost above that floor; "Rust pass-through ÷ bare" is the fixed Rust tax per request.

| scenario | Rust reference ÷ reference (JS), req/s | postguard ÷ Rust reference, req/s | Rust reference ÷ bare, req/s | Rust pass-through ÷ bare (JS), req/s | req/s Rust reference / Rust pass-through | statuses (Rust reference) |
|---|---|---|---|---|---|---|
${rows.map((r) => `| ${r.name} | ${m(r.rustJs)} | ${m(r.pgRust)} | ${m(r.rustRps)} | ${m(r.rustBareJs)} | ${median(r.rustAbs).toFixed(0)} / ${median(r.rustBareAbs).toFixed(0)} | ${[...r.rustStatus].join(', ')} |`).join('\n')}

Both Rust and JS references calling their objects by JS RPC (\`RUST_REFERENCE_RPC\` through \`bench/minimal-rust/rpc-entry.mjs\`, against \`REFERENCE_RPC\`; postguard calls its key's object by RPC too):

| scenario | Rust reference (RPC) ÷ reference (RPC, JS), req/s | postguard ÷ Rust reference (RPC), req/s | statuses (Rust reference, RPC) |
|---|---|---|---|
${rows.map((r) => `| ${r.name} | ${m(r.rustRpcJs)} | ${m(r.pgRustRpc)} | ${[...r.rustRpcStatus].join(', ')} |`).join('\n')}
`;
  const beforeTable = !before ? '' : `
Before and after, side by side in the same rounds: build ${commitOf(BEFORE_ROOT)} (\`BEFORE_ROOT\`) loaded right after build ${commit}.

| scenario | before ÷ bare, req/s | after ÷ bare, req/s | after ÷ before, req/s |
|---|---|---|---|
${rows.map((r) => `| ${r.name} | ${m(r.beforeRps)} | ${m(r.rps)} | ${m(r.afterBefore)} |`).join('\n')}
`;
  const section = `## postguard against a pass-through and a minimal gateway

\`${before ? 'BEFORE_ROOT=<checkout of an earlier build> ' : ''}node bench/proxy.mjs ${ROUNDS} ${SECONDS}\` — build ${commit}, ${new Date().toISOString().slice(0, 10)}; ${CONNECTIONS} connections, ${SECONDS} s per run,
${ROUNDS} rounds per scenario alternating bare, reference, reference (RPC), postguard${before ? ' and the earlier build' : ''}, all on Miniflare (workerd) on this
machine, same local origin. Medians with the spread over the rounds. "bare": the JS pass-through; "reference":
the minimal JS gateway doing the I/O the contract requires (key lookup, object calls, rate-limit headers, batched audit write; bench/passthrough.mjs). Requests/s: higher
is better; latency: lower is better.

| scenario | postguard ÷ bare, req/s | p50 ratio | p99 ratio | reference ÷ bare, req/s | postguard ÷ reference, req/s | req/s postguard / reference / bare | postguard p50 / p99 ms | statuses |
|---|---|---|---|---|---|---|---|---|
${table}

Origin hit directly (no worker): ${median(origRuns.map((r) => r.requests.average)).toFixed(0)} req/s, p50 ${median(origRuns.map((r) => r.latency.p50))} ms, p99 ${median(origRuns.map((r) => r.latency.p99))} ms.

${rpcTable}${rustTable}
wasm: ${wasm.length.toLocaleString('en')} B raw, ${zlib.gzipSync(wasm, { level: 9 }).length.toLocaleString('en')} B gzip (wasm-opt off).
${beforeTable}`;
  writeSection('proxy', section);
} finally {
  await gw.dispose();
  await before?.gw.dispose();
  await bare.dispose();
  await ref.dispose();
  await rpc.dispose();
  await rustBare?.dispose();
  await rustRef?.dispose();
  await rustRpc?.dispose();
  await origin.kill();
}
