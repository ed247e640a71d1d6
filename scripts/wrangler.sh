#!/usr/bin/env bash
# The project's wrangler (package.json pins it) under Node 22, for `npm run deploy` and
# `npm run wrangler -- <command>` on any machine with Node and Rust: wrangler refuses Node
# before 22, and `npx wrangler` on a fresh clone would fetch an unpinned one. setup.sh --build
# installs Node 22 into .tools/ (when the machine's is older), the npm packages and the build
# tools that wrangler's [build] command (scripts/build.sh) needs; seconds when they are there.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
# A deploy with wrangler.toml's placeholder ids would fail at Cloudflare after the whole build.
if [ "${1:-}" = deploy ] && ! printf '%s\n' "$@" | grep -Eq -- '^(--dry-run|--config|-c)(=|$)' &&
   grep -Eq '^\s*(id|database_id)\s*=\s*"[0-]+"' wrangler.toml; then
  echo "wrangler.toml still holds placeholder ids: run \`npm run provision\` first (docs/deploying.md)" >&2
  exit 1
fi
bash scripts/setup.sh --build
exec wrangler "$@"
