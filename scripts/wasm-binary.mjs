// Reading a wasm binary's bytes: what scripts/wasm-order.mjs (rewrites the name section)
// and bench/wasm-groups.mjs (sizes code by function name) both need.

/** An unsigned LEB128 at `pos`: [value, position after it]. */
export function readLeb(buf, pos) {
  let value = 0;
  let shift = 0;
  for (;;) {
    const byte = buf[pos++];
    value += (byte & 0x7f) * 2 ** shift;
    shift += 7;
    if (byte < 0x80) return [value, pos];
  }
}

/** The "name" custom section's body in [start, end): function names by index, and its other subsections. */
export function parseNames(buf, start, end) {
  const names = new Map();
  const others = [];
  let pos = start;
  while (pos < end) {
    const id = buf[pos++];
    let size;
    [size, pos] = readLeb(buf, pos);
    const stop = pos + size;
    if (id === 1) {
      let count;
      let p;
      [count, p] = readLeb(buf, pos);
      for (let i = 0; i < count; i++) {
        let index;
        let len;
        [index, p] = readLeb(buf, p);
        [len, p] = readLeb(buf, p);
        names.set(index, buf.subarray(p, p + len).toString('utf8'));
        p += len;
      }
    } else {
      others.push({ id, bytes: buf.subarray(pos, stop) });
    }
    pos = stop;
  }
  return { names, others };
}
