// Function order for gzip (ADR 0022). rustc/LLVM lay functions out in an order where the
// instances of one generic (serde's deserialize_struct for forty types, BTreeMap's insert
// for nine…) lie far apart, further than gzip's 32 KB window: each is compressed as if
// new. Placed side by side, they compress against each other (~20 KB of gzip).
//
// binaryen can sort functions by name (`--reorder-functions-by-name`), but a Rust name
// ends in a hash that scatters the instances again. So this script renames:
//   key   IN OUT: prefixes every function's name with its rank under the sort key (see
//             sortKey; ties keep their original order), so that sorting by name sorts by the key;
//   unkey IN OUT: removes the prefix again (the names copy bench/profile.mjs reads).
// Only the name section changes; the code is binaryen's to move.
import fs from 'node:fs';
import { parseNames, readLeb } from './wasm-binary.mjs';

const [mode, input, output] = process.argv.slice(2);
if (!['key', 'unkey'].includes(mode) || !input || !output) {
  console.error('usage: node scripts/wasm-order.mjs key|unkey IN.wasm OUT.wasm');
  process.exit(2);
}

function leb(value) {
  const out = [];
  do {
    let byte = value % 128;
    value = Math.floor(value / 128);
    if (value > 0) byte |= 0x80;
    out.push(byte);
  } while (value > 0);
  return Buffer.from(out);
}

const sized = (bytes) => Buffer.concat([leb(bytes.length), bytes]);

// The function-name map (subsection 1) of the name section, and the other subsections.
function encodeNames(names, others) {
  const entries = [...names.entries()].sort((a, b) => a[0] - b[0]);
  const map = Buffer.concat([
    leb(entries.length),
    ...entries.map(([index, name]) => Buffer.concat([leb(index), sized(Buffer.from(name, 'utf8'))])),
  ]);
  // Subsections in id order (0 module, 1 functions, 2 locals, …), as the format asks.
  const subs = [...others, { id: 1, bytes: map }].sort((a, b) => a.id - b.id);
  return Buffer.concat(subs.map((s) => Buffer.concat([Buffer.from([s.id]), sized(s.bytes)])));
}

// Rust's hashes (`[0123456789abcdef]` crate disambiguators, `::h0123456789abcdef` symbol
// hashes) and generic arguments, which differ between instances of one function. A trait
// method (`<T as Trait>::method`) sorts by the trait's method first, so that, for example,
// every type's `Deserialize::deserialize` lies together (measured: 2.5 KB gzip better than
// by the self type).
const withoutGenerics = (s) => s.replace(/<[^<>]*>/g, '').replace(/<[^<>]*>/g, '');

function sortKey(name) {
  const plain = name.replace(/\[[0-9a-f]{16}\]/g, '').replace(/::h[0-9a-f]{16}$/, '');
  const bare = withoutGenerics(plain);
  const impl = /^<(.*?) as (.*?)>(.*)$/.exec(plain);
  const first = impl ? withoutGenerics(impl[2]) + impl[3] : bare;
  return [first, bare, plain];
}

const PREFIX = /^\d{7} /;

function rename(names) {
  if (mode === 'unkey') {
    return new Map([...names].map(([i, n]) => [i, n.replace(PREFIX, '')]));
  }
  const keyed = [...names].map(([index, name]) => ({ index, name, key: sortKey(name) }));
  keyed.sort((a, b) => {
    for (let k = 0; k < 3; k++) {
      if (a.key[k] !== b.key[k]) return a.key[k] < b.key[k] ? -1 : 1;
    }
    return a.index - b.index;
  });
  return new Map(keyed.map((f, rank) => [f.index, `${String(rank).padStart(7, '0')} ${f.name}`]));
}

const buf = fs.readFileSync(input);
const parts = [buf.subarray(0, 8)];
let pos = 8;
let found = false;
while (pos < buf.length) {
  const sectionStart = pos;
  const id = buf[pos++];
  let size;
  [size, pos] = readLeb(buf, pos);
  const end = pos + size;
  let nameLen;
  let p;
  if (id === 0) [nameLen, p] = readLeb(buf, pos);
  if (id === 0 && buf.subarray(p, p + nameLen).toString() === 'name') {
    const { names, others } = parseNames(buf, p + nameLen, end);
    const payload = Buffer.concat([sized(Buffer.from('name')), encodeNames(rename(names), others)]);
    parts.push(Buffer.from([0]), sized(payload));
    found = true;
  } else {
    parts.push(buf.subarray(sectionStart, end));
  }
  pos = end;
}
if (!found) {
  console.error(`${input}: no name section (run before the names are stripped)`);
  process.exit(1);
}
fs.writeFileSync(output, Buffer.concat(parts));
