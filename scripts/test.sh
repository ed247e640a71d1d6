#!/usr/bin/env bash
# The whole test suite: host tests of the core, then the end-to-end suite on
# the real built worker under Miniflare (real Durable Objects and KV) against a
# real local origin, then a deploy dry run that validates wrangler.toml and
# the bundle. The API document is linted before the build writes it into the
# static assets (ADR 0030).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
bash scripts/setup.sh

echo "==> cargo test (core, host)"
cargo test --workspace --exclude postguard

echo "==> lint the API document (its layout, then redocly)"
node scripts/openapi-format.mjs --check
npx redocly lint openapi/openapi.json

echo "==> build the worker"
bash scripts/build.sh

echo "==> end-to-end (node:test + Miniflare)"
rm -rf target/e2e-logs # what the workers log, scanned below
npm test

# The limit tests again with every deployment admitting at the edge (limits.edge, ADR 0040):
# they pass unchanged both ways (~1 min on 2 cores).
echo "==> end-to-end, limits with edges on"
npm run test:edges

echo "==> no secret in any worker log line"
node scripts/scan-logs.mjs

echo "==> wrangler deploy --dry-run"
wrangler deploy --dry-run --outdir "$ROOT/target/dry-run" >/dev/null
echo "deploy dry run ok"
