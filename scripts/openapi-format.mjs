// Writes openapi/openapi.json in its one layout: two-space indents, and any object or
// array whose one-line form fits in 120 columns on one line. Run it after editing the
// document (by hand or by script) so that diffs show changes, not layout:
//   node scripts/openapi-format.mjs          rewrite the file
//   node scripts/openapi-format.mjs --check  exit 1 if it is not in its layout
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const FILE = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'openapi', 'openapi.json');
const WIDTH = 120;

function oneLine(v) {
  if (v === null || typeof v !== 'object') return JSON.stringify(v);
  if (Array.isArray(v)) return `[${v.map(oneLine).join(', ')}]`;
  return `{${Object.keys(v).map((k) => `${JSON.stringify(k)}: ${oneLine(v[k])}`).join(', ')}}`;
}

function layout(v, indent = 0) {
  const flat = oneLine(v);
  if (v === null || typeof v !== 'object' || flat.length + indent <= WIDTH) return flat;
  const pad = ' '.repeat(indent + 2);
  const close = ' '.repeat(indent);
  if (Array.isArray(v)) {
    if (v.length === 0) return '[]';
    return `[\n${v.map((x) => pad + layout(x, indent + 2)).join(',\n')}\n${close}]`;
  }
  const keys = Object.keys(v);
  if (keys.length === 0) return '{}';
  return `{\n${keys.map((k) => `${pad}${JSON.stringify(k)}: ${layout(v[k], indent + 2)}`).join(',\n')}\n${close}}`;
}

const text = fs.readFileSync(FILE, 'utf8');
const formatted = `${layout(JSON.parse(text))}\n`;
if (process.argv.includes('--check')) {
  if (text !== formatted) {
    console.error('openapi/openapi.json is not in its layout: run `node scripts/openapi-format.mjs`');
    process.exit(1);
  }
} else {
  fs.writeFileSync(FILE, formatted);
}
