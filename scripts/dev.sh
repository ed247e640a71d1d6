#!/usr/bin/env bash
# Runs postguard locally: the gateway (wrangler dev, every binding local, state in
# .wrangler/state) in front of the demo origin, with the demo webhook receiver.
#
# It installs and builds only what the dev server needs — the worker, the dashboard, the
# demo origin and receiver (scripts/setup.sh --build: the wasm32 tools, Node 22, the npm
# packages); the test tooling (the SDKs' builds, Chromium, schemathesis) stays with
# scripts/test.sh. The worker is built once (the Rust build starts while the npm packages
# install), the D1 migrations are applied quietly, and the last thing it prints is a short
# block: the dashboard's address, the operator and origin tokens, a fresh portal link and
# the first curl. Logs of the quiet steps: target/dev/.
#
# Ports: DEV_PORT (gateway, 8787), ORIGIN_PORT (8788), RECEIVER_PORT (8789).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"

DEV_PORT="${DEV_PORT:-8787}"
ORIGIN_PORT="${ORIGIN_PORT:-8788}"
RECEIVER_PORT="${RECEIVER_PORT:-8789}"
GW="http://127.0.0.1:$DEV_PORT"
LOGS="$ROOT/target/dev"
mkdir -p "$LOGS"
step() { printf '\033[1m==> %s\033[0m\n' "$*"; }
# A quiet step: its output goes to a log, shown only when it fails.
quiet() {
  local log="$LOGS/$1.log"
  shift
  if ! "$@" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "dev.sh: '$*' failed (the whole log: ${log#"$ROOT"/})" >&2
    exit 1
  fi
}

# The Rust build takes the longest: on a machine that has the wasm32 target, start it now,
# beside the Node and npm installs, with the arguments and environment worker-build gives it
# (WASM_BINDGEN_USE_JS_SYS), so that worker-build finds it done.
cargo_pid=
if command -v cargo >/dev/null 2>&1 && rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
  WASM_BINDGEN_USE_JS_SYS=1 cargo build --lib --release --target wasm32-unknown-unknown --quiet \
    >"$LOGS/cargo.log" 2>&1 &
  cargo_pid=$!
fi
step "tools and npm packages (scripts/setup.sh --build)"
quiet setup bash scripts/setup.sh --build
source scripts/env.sh

# Three distinct random secrets of 48 hex characters (the gateway refuses secrets shorter than
# 32 characters and equal ones). An older .dev.vars with the short dev tokens is replaced.
new_secret() { node -e 'process.stdout.write(require("crypto").randomBytes(24).toString("hex"))'; }
if [ -f .dev.vars ] && ! grep -q '^ORIGIN_SIGNING_SECRET=' .dev.vars; then
  echo "replacing .dev.vars: it predates ORIGIN_SIGNING_SECRET and the 32-character minimum"
  rm .dev.vars
fi
if [ -f .dev.vars ] && ! grep -q 'public_url' .dev.vars; then
  echo "replacing .dev.vars: it predates public_url (portal links and capture URLs are built on it)"
  rm .dev.vars
fi
if [ ! -f .dev.vars ]; then
  cat > .dev.vars <<VARS
ADMIN_TOKEN=dev-admin-$(new_secret)
ORIGIN_TOKEN=dev-origin-$(new_secret)
ORIGIN_SIGNING_SECRET=dev-signing-$(new_secret)
POSTGUARD_CONFIG='{"public_url": "$GW", "webhooks": {"allow_insecure_urls": true, "allow_hosts": ["127.0.0.1"], "schedule_s": [5, 30, 120, 600]}}'
VARS
  echo "wrote .dev.vars: random local secrets, and a config that lets webhooks reach the local receiver"
elif ! grep -q "\"public_url\": \"$GW\"" .dev.vars; then
  # Another DEV_PORT than last time: portal links must name this one.
  sed -i "s#\"public_url\": \"http://127.0.0.1:[0-9]*\"#\"public_url\": \"$GW\"#" .dev.vars
fi

# The D1 schema (migrations/), applied to the state wrangler dev uses — beside the build,
# quietly: one line, not its tables.
wrangler d1 migrations apply DB --local --persist-to .wrangler/state >"$LOGS/migrations.log" 2>&1 < /dev/null &
migrations_pid=$!

# The dashboard is built while the Rust build finishes; worker-build then finds it done.
# POSTGUARD_DEV_BUILD: no size post-processing of the wasm (a deployment's concern).
step "the worker and the dashboard (scripts/build.sh; log: target/dev/build.log)"
export POSTGUARD_DEV_BUILD=1
quiet build bash scripts/build.sh
if [ -n "$cargo_pid" ]; then wait "$cargo_pid" || true; fi
if ! wait "$migrations_pid"; then
  tail -n 40 "$LOGS/migrations.log" >&2
  echo "dev.sh: the D1 migrations failed (target/dev/migrations.log)" >&2
  exit 1
fi
if grep -q 'No migrations to apply' "$LOGS/migrations.log"; then
  step "D1 migrations: .wrangler/state is up to date"
else
  step "D1 migrations applied to .wrangler/state (migrations/*.sql; log: target/dev/migrations.log)"
fi

ADMIN_TOKEN=$(sed -n 's/^ADMIN_TOKEN=//p' .dev.vars)
ORIGIN_TOKEN=$(sed -n 's/^ORIGIN_TOKEN=//p' .dev.vars)
ORIGIN_SIGNING_SECRET=$(sed -n 's/^ORIGIN_SIGNING_SECRET=//p' .dev.vars)

ORIGIN_SIGNING_SECRET="$ORIGIN_SIGNING_SECRET" node tests/support/origin.mjs --port "$ORIGIN_PORT" >"$LOGS/origin.log" 2>&1 &
origin_pid=$!
node scripts/demo-receiver.mjs --port "$RECEIVER_PORT" &
receiver_pid=$!

# Once the gateway answers: the project "demo" gets a live API key if it has none (a portal
# session takes its plan; this key's secret is not shown — make your own with the first
# curl), then the closing block with a fresh portal link (single use, 1 h).
auth=(-H "Authorization: Bearer $ADMIN_TOKEN" -H 'Content-Type: application/json')
(
  for _ in $(seq 1 600); do
    curl -s -o /dev/null "$GW/_postguard/v1/openapi.json" 2>/dev/null && break
    sleep 0.5
  done
  keys=$(curl -s "${auth[@]}" "$GW/_postguard/v1/keys?project=demo&limit=1" || true)
  if printf '%s' "$keys" | grep -q '"data":\[\]'; then
    curl -s -o /dev/null "${auth[@]}" -X POST "$GW/_postguard/v1/keys" \
      -d '{"project":"demo","plan":"trial","name":"made by scripts/dev.sh (for portal sessions)"}' || true
  fi
  link=$(curl -s "${auth[@]}" -X POST "$GW/_postguard/v1/portal-links" -d '{"project":"demo","ttl_s":3600}' || true)
  url=$(printf '%s' "$link" | sed -n 's/.*"url":"\([^"]*\)".*/\1/p')
  # wrangler logs each request a moment after answering it: let those lines come first.
  sleep 1
  cat <<MSG

────────────────────────────────────────────────────────────────────────────────
postguard is up: $GW  (origin :$ORIGIN_PORT, webhook receiver :$RECEIVER_PORT)
  dashboard:     $GW/_postguard/dashboard/
  portal link:   ${url:-(not created: see the log above)}
                 (project "demo", single use, 1 h — or sign in with the operator token)
  operator:      ADMIN=$ADMIN_TOKEN
  origin:        ORIGIN=$ORIGIN_TOKEN
  first curl (create an API key; then README.md "Five minutes with it"):
    curl -s -X POST $GW/_postguard/v1/keys -H "Authorization: Bearer $ADMIN_TOKEN" -H 'Content-Type: application/json' -d '{"project":"demo","plan":"trial"}'
────────────────────────────────────────────────────────────────────────────────
MSG
) &
block_pid=$!
trap 'kill $origin_pid $receiver_pid $block_pid 2>/dev/null || true' EXIT INT TERM

step "starting the gateway (wrangler dev) on $GW"
# Built above: wrangler's [build] command (scripts/build.sh) skips its first run, once; a
# change under src/ that wrangler notices rebuilds as usual.
touch "$LOGS/built"
POSTGUARD_BUILT_STAMP="$LOGS/built" wrangler dev --local --ip 127.0.0.1 --port "$DEV_PORT" \
  --persist-to .wrangler/state --var "ORIGIN_URL:http://127.0.0.1:$ORIGIN_PORT"
