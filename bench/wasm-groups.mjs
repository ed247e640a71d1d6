// What the wasm's code is, by group (ADR 0022's method, ADR 0026's figures). Reads the
// copy with names that scripts/wasm-post.sh leaves in target/wasm-names/ (same function
// bodies as the shipped file), and for each regular expression prints how many functions
// match by name, their body bytes, and the gzip -9 size of those bodies compressed
// together (what the group costs in the shipped file, roughly: gzip also finds matches
// across groups). TOP=n also lists the n largest bodies.
// Usage: node bench/wasm-groups.mjs [names.wasm] [regex ...]
//   e.g. node bench/wasm-groups.mjs target/wasm-names/index_bg.wasm serde_wasm_bindgen 'btree' 'slice::sort'
import fs from 'node:fs';
import zlib from 'node:zlib';
import { parseNames, readLeb } from '../scripts/wasm-binary.mjs';

const [file = 'target/wasm-names/index_bg.wasm', ...patterns] = process.argv.slice(2);
const buf = fs.readFileSync(file);

const leb = (pos) => readLeb(buf, pos);

// Imported functions come first in the function index space; only their count matters.
function countFunctionImports(start) {
  let [n, p] = leb(start);
  let imports = 0;
  let len;
  for (let i = 0; i < n; i++) {
    [len, p] = leb(p);
    p += len; // module
    [len, p] = leb(p);
    p += len; // field
    const kind = buf[p++];
    if (kind === 0) {
      [, p] = leb(p); // type index
      imports++;
    } else if (kind === 1 || kind === 2) {
      if (kind === 1) p++; // table: element type
      const flags = buf[p++];
      [, p] = leb(p);
      if (flags & 1) [, p] = leb(p);
    } else if (kind === 3) {
      p += 2; // global: type, mutability
    } else if (kind === 4) {
      p++; // tag: attribute
      [, p] = leb(p);
    }
  }
  return imports;
}

let imports = 0;
const bodies = [];
let names = new Map();
let pos = 8;
while (pos < buf.length) {
  const id = buf[pos++];
  let size;
  [size, pos] = leb(pos);
  const end = pos + size;
  if (id === 2) imports = countFunctionImports(pos);
  if (id === 10) {
    let [n, p] = leb(pos);
    for (let i = 0; i < n; i++) {
      let len;
      [len, p] = leb(p);
      bodies.push(buf.subarray(p, p + len));
      p += len;
    }
  }
  if (id === 0) {
    const [len, p] = leb(pos);
    if (buf.subarray(p, p + len).toString() === 'name') names = parseNames(buf, p + len, end).names;
  }
  pos = end;
}
if (names.size === 0) throw new Error(`${file} has no name section (use the copy in target/wasm-names/)`);

const fns = bodies.map((body, i) => ({ name: names.get(i + imports) ?? '?', body }));
const gzip = (list) => zlib.gzipSync(Buffer.concat(list.map((f) => f.body)), { level: 9 }).length;
const raw = (list) => list.reduce((n, f) => n + f.body.length, 0);
console.log(`${'all code'.padEnd(40)} ${String(fns.length).padStart(6)} fns ${String(raw(fns)).padStart(9)} raw ${String(gzip(fns)).padStart(8)} gzip`);
for (const pattern of patterns) {
  const re = new RegExp(pattern);
  const group = fns.filter((f) => re.test(f.name));
  console.log(`${pattern.padEnd(40)} ${String(group.length).padStart(6)} fns ${String(raw(group)).padStart(9)} raw ${String(gzip(group)).padStart(8)} gzip`);
}
for (const f of [...fns].sort((a, b) => b.body.length - a.body.length).slice(0, Number(process.env.TOP ?? 0))) {
  console.log(`${String(f.body.length).padStart(7)}  ${f.name}`);
}
