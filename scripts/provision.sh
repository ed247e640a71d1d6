#!/usr/bin/env bash
# Creates every Cloudflare resource wrangler.toml names (KV namespace, D1 database, queues and
# the dead-letter queue, R2 bucket), writes their ids into wrangler.toml, applies the D1
# migrations remotely and stores the missing secrets (generated, printed once). Idempotent: a
# second run changes nothing and says so. `--dry-run` prints what it would run and changes
# nothing. The logic is scripts/provision.mjs; this brings Node 22 and the pinned wrangler
# first (the same `setup.sh --build` as the build). Needs `wrangler login` or CLOUDFLARE_API_TOKEN.
#   npm run provision [-- --dry-run]
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
bash scripts/setup.sh --build
exec node scripts/provision.mjs "$@"
