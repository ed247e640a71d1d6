#!/usr/bin/env bash
# Runs postguard locally: the demo origin on :8788 and the gateway (wrangler dev,
# all bindings local, state in .wrangler/state) on :8787.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
bash scripts/setup.sh
bash scripts/build.sh

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
POSTGUARD_CONFIG='{"public_url": "http://127.0.0.1:8787", "webhooks": {"allow_insecure_urls": true, "allow_hosts": ["127.0.0.1"], "schedule_s": [5, 30, 120, 600]}}'
VARS
  echo "wrote .dev.vars with random local development secrets and a config that allows the local receiver"
fi
ADMIN_TOKEN=$(sed -n 's/^ADMIN_TOKEN=//p' .dev.vars)
ORIGIN_TOKEN=$(sed -n 's/^ORIGIN_TOKEN=//p' .dev.vars)
ORIGIN_SIGNING_SECRET=$(sed -n 's/^ORIGIN_SIGNING_SECRET=//p' .dev.vars)

# The audit log's D1 schema (migrations/), applied to the same local state wrangler dev uses.
wrangler d1 migrations apply DB --local --persist-to .wrangler/state < /dev/null

ORIGIN_SIGNING_SECRET="$ORIGIN_SIGNING_SECRET" node tests/support/origin.mjs --port 8788 &
origin_pid=$!
node scripts/demo-receiver.mjs --port 8789 &
receiver_pid=$!
# Once the gateway answers, print a fresh portal link for the project "demo"
# (single use, 1 h): opening it signs the browser in to the dashboard.
(
  for _ in $(seq 1 120); do
    link=$(curl -sf -X POST http://127.0.0.1:8787/_postguard/v1/portal-links \
      -H "Authorization: Bearer $ADMIN_TOKEN" -d '{"project":"demo"}' 2>/dev/null) && break
    sleep 0.5
  done
  url=$(printf '%s' "${link:-}" | sed -n 's/.*"url":"\([^"]*\)".*/\1/p')
  if [ -n "$url" ]; then
    printf '\n  Dashboard portal link for project "demo" (single use, 1 h):\n  %s\n\n' "$url"
  fi
) &
link_pid=$!
trap 'kill $origin_pid $receiver_pid $link_pid 2>/dev/null || true' EXIT INT TERM

cat <<MSG

postguard is starting on http://127.0.0.1:8787 in front of the demo origin on http://127.0.0.1:8788,
with a demo webhook receiver on http://127.0.0.1:8789 (it prints what it receives).

  # the dashboard: sign in with the operator token ($ADMIN_TOKEN) or an API key,
  # or open the portal link printed below once the gateway is up
  http://127.0.0.1:8787/_postguard/dashboard/

  # a portal link for a project (single use; ttl_s 5..86400, default 3600)
  curl -s -X POST http://127.0.0.1:8787/_postguard/v1/portal-links \\
       -H 'Authorization: Bearer $ADMIN_TOKEN' -d '{"project":"demo","ttl_s":3600}'

  # create an API key (shown once)
  curl -s -X POST http://127.0.0.1:8787/_postguard/v1/keys \\
       -H 'Authorization: Bearer $ADMIN_TOKEN' -d '{"project":"demo","plan":"trial"}'

  # use it (replace KEY); run the same command twice: the second answer is a replay
  curl -si -X POST http://127.0.0.1:8787/payments -H 'Authorization: Bearer KEY' \\
       -H 'Idempotency-Key: order-1' -d '{"amount":100}'

  # the key's limit state, and what happened to its requests
  curl -s http://127.0.0.1:8787/_postguard/v1/me -H 'Authorization: Bearer KEY'
  curl -s 'http://127.0.0.1:8787/_postguard/v1/audit?limit=5' -H 'Authorization: Bearer KEY'

  # webhooks: subscribe the demo receiver, hand it the secret, publish an event as the origin
  curl -s -X POST http://127.0.0.1:8787/_postguard/v1/webhooks -H 'Authorization: Bearer KEY' \\
       -d '{"url":"http://127.0.0.1:8789/hooks","events":["*"]}'
  curl -s -X POST http://127.0.0.1:8789/secret -d 'whsec_...'
  curl -s -X POST http://127.0.0.1:8787/_postguard/v1/events -H 'Authorization: Bearer $ORIGIN_TOKEN' \\
       -d '{"project":"demo","type":"payment.succeeded","data":{"id":"pay_1"}}'
  curl -s 'http://127.0.0.1:8787/_postguard/v1/deliveries' -H 'Authorization: Bearer KEY'

MSG
wrangler dev --local --ip 127.0.0.1 --port 8787 --persist-to .wrangler/state
