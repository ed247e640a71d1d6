// A stand-in for wrangler 4 (4.164.0, package.json's pin) for tests/provision.test.mjs: an
// account held in a JSON file, and the commands scripts/provision.mjs uses, answered with the
// output and exit codes wrangler's own source (node_modules/wrangler/wrangler-dist/cli.js)
// gives them — banner, JSON lists, tables, "does not exist" and "not found" errors on stderr.
// Every call is appended to a log (argv, stdin, cwd) so the test can see what was run.
//   WRANGLER_STUB_STATE  the account: {authenticated, kv: [{id, title}], d1: [{uuid, name,
//                        applied: [file]}], queues: [name], r2: [name], worker: bool,
//                        secrets: {NAME: value}}
//   WRANGLER_STUB_LOG    where calls are appended, one JSON line each
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { parse as parseToml } from 'smol-toml';

const STATE = process.env.WRANGLER_STUB_STATE;
const LOG = process.env.WRANGLER_STUB_LOG;
const BANNER = `\n \u26C5\uFE0F wrangler 4.164.0\n${'\u2500'.repeat(20)}\n`;
const NOW = '2026-12-02T06:00:00.000Z';

const argv = process.argv.slice(2);
const stdin = process.stdin.isTTY ? '' : fs.readFileSync(0, 'utf8');
fs.appendFileSync(LOG, `${JSON.stringify({ args: argv, stdin, cwd: process.cwd() })}\n`);
const state = JSON.parse(fs.readFileSync(STATE, 'utf8'));
const save = () => fs.writeFileSync(STATE, JSON.stringify(state, null, 2));

// Global flags out of the way; the rest is the command and its arguments.
let configFile = 'wrangler.toml';
const words = [];
for (let i = 0; i < argv.length; i++) {
  if (argv[i] === '--config' || argv[i] === '-c') configFile = argv[++i];
  else words.push(argv[i]);
}
const config = () => parseToml(fs.readFileSync(path.resolve(configFile), 'utf8'));

const out = (text) => process.stdout.write(text.endsWith('\n') ? text : `${text}\n`);
function fail(message, { banner = true } = {}) {
  if (banner) out(BANNER);
  process.stderr.write(`\n\u2718 [ERROR] ${message}\n\n\n\uD83E\uDEB5  Logs were written to "/tmp/wrangler-stub.log"\n`);
  process.exit(1);
}
function apiError(urlPath, message, code) {
  fail(`A request to the Cloudflare API (/accounts/0123456789abcdef0123456789abcdef${urlPath}) failed.\n\n  ${message} [code: ${code}]\n  \n  If you think this is a bug, please open an issue at: https://github.com/cloudflare/workers-sdk/issues/new/choose`);
}
/** cli-table3 as wrangler's logger.table draws it (colours off). */
function table(head, rows) {
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => String(r[i]).length)) + 2);
  const line = (l, m, r) => l + widths.map((w) => '\u2500'.repeat(w)).join(m) + r;
  const row = (cells) => `\u2502${cells.map((c, i) => ` ${String(c).padEnd(widths[i] - 1)}`).join('\u2502')}\u2502`;
  const body = rows.flatMap((r, i) => (i ? [line('\u251C', '\u253C', '\u2524'), row(r)] : [row(r)]));
  return [line('\u250C', '\u252C', '\u2510'), row(head), line('\u251C', '\u253C', '\u2524'), ...body, line('\u2514', '\u2534', '\u2518')].join('\n');
}
const requireAuth = (banner = true) => {
  if (state.authenticated === false) {
    fail("In a non-interactive environment, it's necessary to set a CLOUDFLARE_API_TOKEN environment variable for wrangler to work. Please go to https://developers.cloudflare.com/fundamentals/api/get-started/create-token/ for instructions on how to create an api token, and assign its value to CLOUDFLARE_API_TOKEN.", { banner });
  }
};
const bindingName = (name) => name.replace(/[\s-]/g, '_').replace(/[^a-zA-Z0-9_]/g, '');

function d1FromConfig(nameOrBinding) {
  const entry = (config().d1_databases ?? []).find((d) => d.binding === nameOrBinding || d.database_name === nameOrBinding);
  if (!entry) fail(`Couldn't find a D1 DB with the name or binding '${nameOrBinding}' in your wrangler.toml file.`);
  const db = state.d1.find((d) => d.uuid === entry.database_id);
  if (!db) apiError(`/d1/database/${entry.database_id}/query`, `The database ${entry.database_id} could not be found`, 7404);
  const dir = path.resolve(path.dirname(path.resolve(configFile)), entry.migrations_dir ?? 'migrations');
  const files = fs.readdirSync(dir).filter((f) => f.endsWith('.sql')).sort();
  return { db, unapplied: files.filter((f) => !db.applied.includes(f)) };
}

const commands = {
  'kv namespace list'() {
    requireAuth(false);
    out(JSON.stringify(state.kv.map(({ id, title }) => ({ id, title, supports_url_encoding: true })), null, '  '));
  },
  'kv namespace create'([title]) {
    requireAuth();
    if (state.kv.some((n) => n.title === title)) {
      fail(`A KV namespace with the title "${title}" already exists.\n\nYou can list existing namespaces with their IDs by running:\n  wrangler kv namespace list\n\nOr choose a different namespace name.`);
    }
    const id = randomBytes(16).toString('hex');
    state.kv.push({ id, title });
    save();
    out(`${BANNER}Resource location: remote \n\n\uD83C\uDF00 Creating namespace with title "${title}"\n\u2728 Success!\nTo access your new KV Namespace in your Worker, add the following snippet to your configuration file:\n[[kv_namespaces]]\nbinding = "${bindingName(title)}"\nid = "${id}"\n`);
  },
  'd1 list'(args) {
    requireAuth(!args.includes('--json'));
    const rows = state.d1.map((d) => ({ uuid: d.uuid, name: d.name, created_at: NOW, version: 'production', num_tables: 0, file_size: 12288 }));
    if (args.includes('--json')) out(JSON.stringify(rows, null, 2));
    else out(BANNER + table(Object.keys(rows[0] ?? {}), rows.map((r) => Object.values(r))));
  },
  'd1 create'([name]) {
    requireAuth();
    if (state.d1.some((d) => d.name === name)) apiError('/d1/database', 'A database with that name already exists', 7502);
    const uuid = randomUUID();
    state.d1.push({ uuid, name, applied: [] });
    save();
    out(`${BANNER}\u2705 Successfully created DB '${name}' in region WEUR\nCreated your new D1 database.\n\nTo access your new D1 Database in your Worker, add the following snippet to your configuration file:\n[[d1_databases]]\nbinding = "${bindingName(name)}"\ndatabase_name = "${name}"\ndatabase_id = "${uuid}"\n`);
  },
  'd1 migrations list'([name, ...flags]) {
    requireAuth();
    if (!flags.includes('--remote')) fail('the stub only knows remote databases');
    const { unapplied } = d1FromConfig(name);
    out(`${BANNER}Resource location: remote \n`);
    if (unapplied.length === 0) out('\u2705 No migrations to apply!');
    else out(`Migrations to be applied:\n${table(['Name'], unapplied.map((f) => [f]))}`);
  },
  'd1 migrations apply'([name, ...flags]) {
    requireAuth();
    if (!flags.includes('--remote')) fail('the stub only knows remote databases');
    const { db, unapplied } = d1FromConfig(name);
    out(`${BANNER}Resource location: remote \n`);
    if (unapplied.length === 0) return out('\u2705 No migrations to apply!');
    out(`Migrations to be applied:\n${table(['name'], unapplied.map((f) => [f]))}`);
    // Non-interactive: wrangler's confirm takes its default (yes) and applies them in order.
    db.applied.push(...unapplied);
    save();
    out(`\uD83C\uDF00 Executing on remote database ${name} (${db.uuid}):\n${table(['name', 'status'], unapplied.map((f) => [f, '\u2705']))}`);
  },
  'queues info'([name]) {
    requireAuth();
    if (!state.queues.includes(name)) fail(`Queue "${name}" does not exist. To create it, run: wrangler queues create ${name}`);
    out(`${BANNER}Queue Name: ${name}\nQueue ID: ${createHash('sha256').update(name).digest('hex').slice(0, 32)}\nCreated On: ${NOW}\nLast Modified: ${NOW}\nNumber of Producers: 0\nNumber of Consumers: 0`);
  },
  'queues create'([name]) {
    requireAuth();
    if (state.queues.includes(name)) apiError('/queues', 'Queue name already taken', 11009);
    state.queues.push(name);
    save();
    out(`${BANNER}\uD83C\uDF00 Creating queue '${name}'\n\u2705 Created queue '${name}'\n\nConfigure your Worker to send messages to this queue:\n\n[[queues.producers]]\nqueue = "${name}"\nbinding = "${bindingName(name)}"\n\nConfigure your Worker to consume messages from this queue:\n\n[[queues.consumers]]\nqueue = "${name}"\n`);
  },
  'r2 bucket list'() {
    requireAuth();
    out(`${BANNER}Listing buckets...\n${state.r2.map((b) => `name:           ${b}\ncreation_date:  ${NOW}`).join('\n\n')}`);
  },
  'r2 bucket create'([name]) {
    requireAuth();
    if (state.r2.includes(name)) apiError('/r2/buckets', 'The bucket you tried to create already exists, and you own it.', 10004);
    state.r2.push(name);
    save();
    out(`${BANNER}Creating bucket '${name}'...\n\u2705 Created bucket '${name}' with default storage class of Standard.\nTo access your new R2 Bucket in your Worker, add the following snippet to your configuration file:\n[[r2_buckets]]\nbucket_name = "${name}"\nbinding = "${bindingName(name)}"\n`);
  },
  'secret list'() {
    requireAuth(false);
    if (!state.worker) {
      fail(`Worker "${config().name}" not found.\n\nIf this is a new Worker, run \`wrangler deploy\` first to create it.\nOtherwise, check that the Worker name is correct and you're logged into the right account.`, { banner: false });
    }
    out(JSON.stringify(Object.keys(state.secrets).map((name) => ({ name, type: 'secret_text' })), null, '  '));
  },
  'secret bulk'() {
    requireAuth();
    const name = config().name;
    out(`${BANNER}\uD83C\uDF00 Processing the secrets for the Worker "${name}"`);
    const content = JSON.parse(stdin);
    if (!state.worker) {
      // Non-interactive: wrangler's "create a new Worker?" confirm defaults to yes.
      out(`\uD83C\uDF00 Creating new Worker "${name}"...`);
      state.worker = true;
    }
    Object.assign(state.secrets, content);
    save();
    for (const key of Object.keys(content)) out(`\u2728 Successfully created secret for key: ${key}`);
    out(`\nFinished processing secrets file:\n\u2728 ${Object.keys(content).length} secrets successfully created`);
  },
};

const key = [3, 2].map((n) => words.slice(0, n).join(' ')).find((k) => commands[k]);
if (!key) {
  process.stderr.write(`wrangler stub: unsupported command: ${argv.join(' ')}\n`);
  process.exit(2);
}
commands[key](words.slice(key.split(' ').length));
