// After the e2e suite: no worker log line holds a secret (docs/security.md). Reads what the
// test harness kept in target/e2e-logs/ — every line the workers logged
// (worker-<pid>.ndjson) and every secret the gateway handed out in an answer
// (secrets-<pid>.txt: API keys, portal links and sessions, subscription secrets, capture
// URLs) — adds the suite's fixed tokens, and fails naming the log line of any hit (the
// secret itself shown only by its first 8 characters). Also reports how many lines were
// postguard's JSON lines ({level, msg, …}) and lists any that were not.
import fs from 'node:fs';
import path from 'node:path';
import { ADMIN_TOKEN, ORIGIN_TOKEN, ORIGIN_SIGNING_SECRET, E2E_LOG_DIR } from '../tests/support/gateway.mjs';

// `--dir <d>` scans another directory (tests/scan-logs.test.mjs checks the scan itself).
const at = process.argv.indexOf('--dir');
const dir = at > 0 ? process.argv[at + 1] : E2E_LOG_DIR;
const files = fs.existsSync(dir) ? fs.readdirSync(dir) : [];
const read = (prefix) => files.filter((f) => f.startsWith(prefix)).flatMap((f) =>
  fs.readFileSync(path.join(dir, f), 'utf8').split('\n').filter(Boolean).map((line) => ({ file: f, line })));

const secrets = new Set([ADMIN_TOKEN, ORIGIN_TOKEN, ORIGIN_SIGNING_SECRET, ...read('secrets-').map((x) => x.line)]);
const lines = read('worker-');
const hits = [];
let json = 0;
const other = [];
for (const { file, line } of lines) {
  const { message = '' } = JSON.parse(line);
  for (const s of secrets) {
    if (message.includes(s)) hits.push(`${file}: ${s.slice(0, 8)}… in ${message.replaceAll(s, '<secret>').slice(0, 300)}`);
  }
  try {
    const m = JSON.parse(message);
    if (m && typeof m.level === 'string' && typeof m.msg === 'string') json++;
    else other.push(message);
  } catch {
    other.push(message);
  }
}
console.log(`scan-logs: ${lines.length} worker log lines (${json} postguard JSON lines), ${secrets.size} secrets checked`);
if (other.length) {
  console.log(`scan-logs: ${other.length} lines not from postguard's logger (the runtime's own), e.g.:`);
  for (const m of [...new Set(other)].slice(0, 5)) console.log(`  ${m.slice(0, 200)}`);
}
if (lines.length === 0 || secrets.size <= 3) {
  console.error('scan-logs: nothing to scan — run the e2e suite first (npm test)');
  process.exit(1);
}
if (hits.length) {
  console.error(`scan-logs: ${hits.length} secrets found in worker logs:`);
  for (const h of hits.slice(0, 20)) console.error(`  ${h}`);
  process.exit(1);
}
console.log('scan-logs: no secret in any log line');
