// Creates every Cloudflare resource wrangler.toml names, writes the ids it gets back into
// wrangler.toml, applies the D1 migrations remotely and stores the three secrets the gateway
// needs — idempotently: what exists is left alone, and a second run changes nothing and says
// so. Run through scripts/provision.sh (`npm run provision`), which brings Node 22 and the
// pinned wrangler first.
//
//   node scripts/provision.mjs [--dry-run] [--config path/to/wrangler.toml]
//
// It plans before it acts: every resource is looked up first with read-only wrangler commands
// (the JSON lists where wrangler has them; `d1 migrations list` also creates wrangler's own
// d1_migrations table when missing, as `apply` would), then the missing ones are created in order. A
// problem found while planning (an id in wrangler.toml the account lacks, wrangler not logged
// in) stops it before anything is changed. --dry-run prints the plan and the exact wrangler
// commands it would run, and changes nothing (neither the account nor wrangler.toml).
//
// WRANGLER names the wrangler to run (default: `wrangler` on PATH); tests/provision.test.mjs
// points it at a stub that answers as wrangler 4 does. Only the top-level configuration is
// provisioned, not [env.*] sections.
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { stripVTControlCharacters } from 'node:util';
import { parse as parseToml } from 'smol-toml';

// The gateway refuses to run without these, with one shorter than 32 characters, or with two
// equal (docs/security.md); a missing one is generated: 32 random bytes, 64 hex characters.
const SECRETS = ['ADMIN_TOKEN', 'ORIGIN_TOKEN', 'ORIGIN_SIGNING_SECRET'];
const WRANGLER = process.env.WRANGLER || 'wrangler';

class Stop extends Error {}

function usage() {
  return 'usage: provision.mjs [--dry-run] [--config wrangler.toml]';
}

function parseArgs(argv) {
  const opts = { dryRun: false, config: 'wrangler.toml' };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--dry-run') opts.dryRun = true;
    else if (a === '--config' && i + 1 < argv.length) opts.config = argv[++i];
    else if (a.startsWith('--config=')) opts.config = a.slice('--config='.length);
    else if (a === '--help' || a === '-h') {
      console.log(usage());
      process.exit(0);
    } else throw new Stop(`unknown argument ${a}\n${usage()}`);
  }
  return opts;
}

/** A placeholder id (all zeros, dashes allowed) means "not provisioned yet". */
const isPlaceholder = (id) => typeof id !== 'string' || /^[0-]*$/.test(id);

/** Shell-quotes an argument for display only (commands run without a shell). */
const quote = (a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : `'${a.replaceAll("'", "'\\''")}'`);

/**
 * Runs wrangler in the configuration's directory with stdin closed (so it never prompts: it
 * takes its non-interactive defaults) and colours off. Returns {code, out, err}, ANSI-free.
 */
function makeWrangler(config) {
  const cwd = path.dirname(config);
  const configArgs = path.basename(config) === 'wrangler.toml' ? [] : ['--config', path.basename(config)];
  const run = (args, input = '') => {
    const r = spawnSync(WRANGLER, [...args, ...configArgs], {
      cwd,
      input,
      encoding: 'utf8',
      maxBuffer: 64 * 1024 * 1024,
      env: { ...process.env, WRANGLER_SEND_METRICS: 'false', FORCE_COLOR: '0', NO_COLOR: '1' },
    });
    if (r.error) throw new Stop(`cannot run ${WRANGLER}: ${r.error.message}`);
    return { code: r.status, out: stripVTControlCharacters(r.stdout), err: stripVTControlCharacters(r.stderr) };
  };
  run.display = (args) => ['wrangler', ...args, ...configArgs].map(quote).join(' ');
  return run;
}

/** wrangler's own words when a command failed: its error lines, without the log-file note. */
function failure(wrangler, args, r) {
  const text = `${r.err}\n${r.out}`
    .split('\n')
    .filter((l) => l.trim() && !/Logs were written to/.test(l))
    .slice(0, 12)
    .join('\n');
  return new Stop(`\`${wrangler.display(args)}\` failed (exit ${r.code}):\n${text}`);
}

/** Runs a command that must succeed; returns its stdout. */
function must(wrangler, args, input) {
  const r = wrangler(args, input);
  if (r.code !== 0) throw failure(wrangler, args, r);
  return r.out;
}

/** The JSON array a list command prints (after any banner line wrangler may add). */
function jsonList(wrangler, args) {
  return parseList(wrangler, args, must(wrangler, args));
}

function parseList(wrangler, args, out) {
  const start = out.search(/^\[/m);
  try {
    const list = JSON.parse(out.slice(start));
    if (start >= 0 && Array.isArray(list)) return list;
  } catch {
    // reported below
  }
  throw new Stop(`\`${wrangler.display(args)}\` printed no JSON list:\n${out.slice(0, 400)}`);
}

// ---- the plan: one step per resource, found with read-only commands -----------------------

// A step: `label`, `status` ('exists' | 'create' | 'adopt' | 'apply' | 'nothing' | 'error'),
// `note`; for a change, `commands` (printed by the dry run) and either `run()` (does it, returns
// {note, edit?, shown?}) or `edit` (an id to write into wrangler.toml, for 'adopt').

function kvSteps(toml, wrangler) {
  const entries = toml.kv_namespaces ?? [];
  if (entries.length === 0) return [];
  const listArgs = ['kv', 'namespace', 'list'];
  const list = () => jsonList(wrangler, listArgs);
  const existing = list();
  return entries.map((kv) => {
    const label = `KV namespace ${kv.binding}`;
    if (!isPlaceholder(kv.id)) {
      return existing.some((n) => n.id === kv.id)
        ? { label, status: 'exists', note: `id ${kv.id}` }
        : { label, status: 'error', note: `wrangler.toml names id ${kv.id}, which this account does not have (\`wrangler kv namespace list\`); put the placeholder "${'0'.repeat(32)}" back to create one` };
    }
    // wrangler's own name for a binding it provisions: <worker>-<binding, lower case, dashed>.
    const title = `${toml.name}-${kv.binding.toLowerCase().replaceAll('_', '-')}`;
    const found = existing.find((n) => n.title === title);
    const write = (id) => ({ table: 'kv_namespaces', match: ['binding', kv.binding], key: 'id', value: id });
    if (found) return { label, status: 'adopt', note: `"${title}" exists (id ${found.id}): its id goes into wrangler.toml`, edit: write(found.id) };
    const args = ['kv', 'namespace', 'create', title];
    return {
      label, status: 'create', note: `"${title}"`, commands: [wrangler.display(args), `(then its id into wrangler.toml: [[kv_namespaces]] binding = "${kv.binding}")`],
      run() {
        must(wrangler, args);
        const made = list().find((n) => n.title === title);
        if (!made) throw new Stop(`created KV namespace "${title}" but \`${wrangler.display(listArgs)}\` does not show it`);
        return { note: `id ${made.id}`, edit: write(made.id) };
      },
    };
  });
}

function d1Steps(toml, wrangler, configDir) {
  const entries = toml.d1_databases ?? [];
  if (entries.length === 0) return [];
  const listArgs = ['d1', 'list', '--json'];
  const list = () => jsonList(wrangler, listArgs);
  const existing = list();
  return entries.flatMap((db) => {
    const label = `D1 database ${db.database_name}`;
    const write = (id) => ({ table: 'd1_databases', match: ['binding', db.binding], key: 'database_id', value: id });
    const migrations = migrationStep(db, wrangler, configDir);
    if (!isPlaceholder(db.database_id)) {
      if (!existing.some((d) => d.uuid === db.database_id)) {
        return [{ label, status: 'error', note: `wrangler.toml names database_id ${db.database_id}, which this account does not have (\`wrangler d1 list\`); put the placeholder "00000000-0000-0000-0000-000000000000" back to create one` }];
      }
      return [{ label, status: 'exists', note: `id ${db.database_id}` }, ...(migrations ? [migrations.check()] : [])];
    }
    const found = existing.find((d) => d.name === db.database_name);
    // Migrations of a database whose id is not yet in wrangler.toml are listed once it is.
    const later = migrations ? [migrations.after(found ? 'unknown' : 'all')] : [];
    if (found) return [{ label, status: 'adopt', note: `it exists (id ${found.uuid}): its id goes into wrangler.toml`, edit: write(found.uuid) }, ...later];
    const args = ['d1', 'create', db.database_name];
    return [{
      label, status: 'create', note: '', commands: [wrangler.display(args), `(then its id into wrangler.toml: [[d1_databases]] binding = "${db.binding}")`],
      run() {
        must(wrangler, args);
        const made = list().find((d) => d.name === db.database_name);
        if (!made) throw new Stop(`created D1 database "${db.database_name}" but \`${wrangler.display(listArgs)}\` does not show it`);
        return { note: `id ${made.uuid}`, edit: write(made.uuid) };
      },
    }, ...later];
  });
}

/** The D1 migrations step of one database, or null when it has no migrations folder. */
function migrationStep(db, wrangler, configDir) {
  const dir = path.resolve(configDir, db.migrations_dir ?? 'migrations');
  if (!fs.existsSync(dir)) return null;
  const files = fs.readdirSync(dir).filter((f) => f.endsWith('.sql')).sort();
  const label = `D1 migrations of ${db.binding} (remote)`;
  const listArgs = ['d1', 'migrations', 'list', db.binding, '--remote'];
  const applyArgs = ['d1', 'migrations', 'apply', db.binding, '--remote'];
  const pending = () => {
    const out = must(wrangler, listArgs);
    if (/No migrations to apply/.test(out)) return [];
    // The table's rows are the pending file names; only names of files we have count.
    const named = new Set(out.match(/[\w.-]+\.sql\b/g) ?? []);
    const names = files.filter((f) => named.has(f));
    if (names.length === 0) throw new Stop(`\`${wrangler.display(listArgs)}\` listed no migration this folder has:\n${out.slice(0, 400)}`);
    return names;
  };
  const apply = (names) => {
    if (names.length === 0) return { note: 'none pending' };
    must(wrangler, applyArgs);
    return { note: `applied ${names.join(', ')}` };
  };
  return {
    check() {
      const names = pending();
      return names.length === 0
        ? { label, status: 'exists', note: `all ${files.length} applied` }
        : { label, status: 'apply', note: `${names.length} pending: ${names.join(', ')}`, commands: [wrangler.display(applyArgs)], run: () => apply(names) };
    },
    /** For a database created or adopted in this run: listed after its id is written. */
    after(which) {
      const note = which === 'all' ? `a new database: all ${files.length} pending` : 'listed once its id is in wrangler.toml';
      return { label, status: 'apply', note, commands: [`${wrangler.display(listArgs)}, then if any is pending: ${wrangler.display(applyArgs)}`], run: () => apply(pending()) };
    },
  };
}

function queueSteps(toml, wrangler) {
  const q = toml.queues ?? {};
  const names = [...new Set([
    ...(q.producers ?? []).map((p) => p.queue),
    ...(q.consumers ?? []).flatMap((c) => [c.queue, c.dead_letter_queue]),
  ].filter(Boolean))];
  return names.map((name) => {
    const label = `queue ${name}`;
    // `queues info` is the exact lookup (`queues list` is paged): it names the queue, or
    // fails saying it does not exist; anything else is a real failure.
    const infoArgs = ['queues', 'info', name];
    const r = wrangler(infoArgs);
    const escaped = name.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
    if (r.code === 0 && new RegExp(`^Queue Name: ${escaped}\\s*$`, 'm').test(r.out)) {
      const id = r.out.match(/^Queue ID: (\S+)/m)?.[1];
      return { label, status: 'exists', note: id ? `id ${id}` : '' };
    }
    if (!`${r.out}\n${r.err}`.includes(`Queue "${name}" does not exist`)) throw failure(wrangler, infoArgs, r);
    const args = ['queues', 'create', name];
    return { label, status: 'create', note: '', commands: [wrangler.display(args)], run: () => (must(wrangler, args), { note: 'created' }) };
  });
}

function r2Steps(toml, wrangler) {
  const buckets = (toml.r2_buckets ?? []).map((b) => b.bucket_name).filter(Boolean);
  if (buckets.length === 0) return [];
  // `r2 bucket list` prints "name: <bucket>" and "creation_date: <date>" per bucket.
  const out = must(wrangler, ['r2', 'bucket', 'list']);
  const existing = new Set([...out.matchAll(/^\s*name:\s+(\S+)\s*$/gm)].map((m) => m[1]));
  return [...new Set(buckets)].map((name) => {
    const label = `R2 bucket ${name}`;
    if (existing.has(name)) return { label, status: 'exists', note: '' };
    const args = ['r2', 'bucket', 'create', name];
    return { label, status: 'create', note: '', commands: [wrangler.display(args)], run: () => (must(wrangler, args), { note: 'created' }) };
  });
}

// HOOK — Analytics Engine (issue 27 item 1 adds `[[analytics_engine_datasets]]`): there is
// nothing to create. Cloudflare creates a dataset the first time a Worker writes to it
// (developers.cloudflare.com/workers/examples/analytics-engine), and wrangler has no command
// for it. Should a dataset ever need setting up (e.g. an API token for the SQL API the
// the queries of docs/observability.md), this is the place.
function analyticsSteps(toml) {
  return (toml.analytics_engine_datasets ?? []).map((ds) => ({
    label: `Analytics Engine dataset ${ds.dataset ?? ds.binding}`,
    status: 'nothing',
    note: 'created by Cloudflare on the first write',
  }));
}

function secretSteps(toml, wrangler) {
  const listArgs = ['secret', 'list'];
  const r = wrangler(listArgs);
  let present;
  if (r.code === 0) {
    present = new Set(parseList(wrangler, listArgs, r.out).map((s) => s.name));
  } else if (/Worker "[^"]*"(?: \(env: [^)]*\))? not found/.test(`${r.err}\n${r.out}`)) {
    present = new Set(); // not deployed yet: `secret bulk` creates it as a draft
  } else {
    throw failure(wrangler, listArgs, r);
  }
  const missing = SECRETS.filter((s) => !present.has(s));
  const kept = SECRETS.filter((s) => present.has(s));
  const label = `secrets of Worker ${toml.name}`;
  if (missing.length === 0) return [{ label, status: 'exists', note: SECRETS.join(', ') }];
  const args = ['secret', 'bulk'];
  const stdin = `{${missing.map((s) => `"${s}": <generated>`).join(', ')}}`;
  return [{
    label, status: 'create',
    note: `${missing.join(', ')} missing${kept.length ? ` (${kept.join(', ')} set: left as ${kept.length > 1 ? 'they are' : 'it is'})` : ''}`,
    commands: [`${wrangler.display(args)}   # stdin: ${stdin}`],
    run() {
      // On stdin, never in argv (which other users of the machine can read).
      const values = Object.fromEntries(missing.map((s) => [s, randomBytes(32).toString('hex')]));
      must(wrangler, args, JSON.stringify(values));
      return { note: `stored ${missing.join(', ')}`, shown: Object.entries(values) };
    },
  }];
}

// ---- wrangler.toml: write an id into one table of an array, keeping every comment --------

/**
 * Sets `key = "value"` in the `[[table]]` whose `match[0] = "match[1]"`, editing that line of
 * the text only (so comments and layout stay), then checks that the file still parses with
 * that value. Returns the new text.
 */
function setTomlValue(text, { table, match: [mk, mv], key, value }) {
  const lines = text.split('\n');
  const header = new RegExp(`^\\s*\\[\\[\\s*${table}\\s*\\]\\]\\s*(#.*)?$`);
  const anyHeader = /^\s*\[/;
  const assign = (k) => new RegExp(`^(\\s*${k}\\s*=\\s*)"[^"]*"(.*)$`);
  for (let i = 0; i < lines.length; i++) {
    if (!header.test(lines[i])) continue;
    let end = i + 1;
    while (end < lines.length && !anyHeader.test(lines[end])) end++;
    const block = lines.slice(i + 1, end);
    if (!block.some((l) => new RegExp(`^\\s*${mk}\\s*=\\s*"${mv}"\\s*(#.*)?$`).test(l))) continue;
    const at = block.findIndex((l) => assign(key).test(l));
    if (at >= 0) lines[i + 1 + at] = lines[i + 1 + at].replace(assign(key), `$1"${value}"$2`);
    else lines.splice(i + 1, 0, `${key} = "${value}"`);
    const out = lines.join('\n');
    const entry = (parseToml(out)[table] ?? []).find((t) => t[mk] === mv);
    if (entry?.[key] !== value) throw new Stop(`could not write ${key} into wrangler.toml's [[${table}]] ${mk} = "${mv}"`);
    return out;
  }
  throw new Stop(`wrangler.toml has no [[${table}]] with ${mk} = "${mv}"`);
}

// ---- main -----------------------------------------------------------------------------------

const MARK = { exists: 'ok     ', nothing: 'ok     ', create: 'create ', adopt: 'adopt  ', apply: 'apply  ', error: 'ERROR  ' };

function printStep(step) {
  console.log(`  ${MARK[step.status]} ${step.label}${step.note ? ` — ${step.note}` : ''}`);
}

function main() {
  const opts = parseArgs(process.argv.slice(2));
  const config = path.resolve(opts.config);
  let text;
  try {
    text = fs.readFileSync(config, 'utf8');
  } catch (e) {
    throw new Stop(`cannot read ${config}: ${e.message}`);
  }
  const toml = parseToml(text);
  if (!toml.name) throw new Stop(`${config} has no name`);
  const wrangler = makeWrangler(config);

  console.log(`Provisioning what ${opts.config} names (Worker "${toml.name}")${opts.dryRun ? ' — dry run, nothing is changed' : ''}`);
  const steps = [
    ...kvSteps(toml, wrangler),
    ...d1Steps(toml, wrangler, path.dirname(config)),
    ...queueSteps(toml, wrangler),
    ...r2Steps(toml, wrangler),
    ...analyticsSteps(toml),
    ...secretSteps(toml, wrangler),
  ];
  steps.forEach(printStep);

  const errors = steps.filter((s) => s.status === 'error');
  if (errors.length) throw new Stop(`nothing was changed: fix wrangler.toml first (${errors.length} problem${errors.length > 1 ? 's' : ''} above)`);
  const todo = steps.filter((s) => ['create', 'adopt', 'apply'].includes(s.status));
  if (todo.length === 0) {
    console.log('Nothing to change: every resource exists, every migration is applied, every secret is set.');
    return;
  }
  if (opts.dryRun) {
    console.log('Would run, in this order:');
    for (const s of todo) {
      for (const c of s.commands ?? []) console.log(`  ${c}`);
      if (s.edit) console.log(`  (${s.edit.key} = "${s.edit.value}" into wrangler.toml: [[${s.edit.table}]] ${s.edit.match[0]} = "${s.edit.match[1]}")`);
    }
    return;
  }

  const shown = [];
  let edits = 0;
  for (const s of todo) {
    const done = s.run ? s.run() : { note: 'id taken', edit: s.edit };
    if (done.edit) {
      text = setTomlValue(text, done.edit);
      fs.writeFileSync(`${config}.tmp`, text);
      fs.renameSync(`${config}.tmp`, config);
      edits++;
    }
    console.log(`  done    ${s.label} — ${done.note}${done.edit ? `; wrangler.toml: ${done.edit.key} = "${done.edit.value}"` : ''}`);
    shown.push(...(done.shown ?? []));
  }
  if (edits) console.log(`Wrote ${edits} id${edits > 1 ? 's' : ''} into ${path.basename(config)}: commit it (ids are not secrets).`);
  if (shown.length) {
    console.log('\nSecrets generated and stored in the Worker — shown this once, keep them somewhere safe:');
    for (const [k, v] of shown) console.log(`  ${k}=${v}`);
    console.log('The origin needs ORIGIN_TOKEN (to publish events) and ORIGIN_SIGNING_SECRET (to verify X-Postguard-Signature).');
  }
}

try {
  main();
} catch (e) {
  if (!(e instanceof Stop)) throw e;
  console.error(`provision: ${e.message}`);
  process.exit(1);
}
