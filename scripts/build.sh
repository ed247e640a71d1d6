#!/usr/bin/env bash
# Builds the dashboard (static assets, dashboard/dist/) and the worker (release,
# wasm32) into build/ with worker-build, using the locally installed
# wasm-bindgen (no downloads). It is wrangler.toml's [build] command, so `wrangler deploy`
# and `wrangler dev` run it on a fresh clone: it installs what the build lacks first
# (setup.sh --build; a few checks, well under a second, when everything is there).
#
# scripts/dev.sh builds before it starts wrangler dev and names a stamp file in
# POSTGUARD_BUILT_STAMP: wrangler's first run of this command then finds it, removes it and
# stops — the worker is built once — and any later run (a change wrangler notices) builds.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
if [ -n "${POSTGUARD_BUILT_STAMP:-}" ] && [ -f "$POSTGUARD_BUILT_STAMP" ] && [ -f build/index.js ]; then
  rm -f "$POSTGUARD_BUILT_STAMP"
  echo "build.sh: built a moment ago by scripts/dev.sh"
  exit 0
fi
bash scripts/setup.sh --build
# Again, now that they exist: ESBUILD_BIN is set only when npm has installed esbuild.
source scripts/env.sh
node scripts/build-dashboard.mjs
# The API document into the assets, for the worker to serve (ADR 0030).
node scripts/openapi-asset.mjs
worker-build --release
# The wasm's size post-processing (wasm-opt passes, names stripped: ADR 0019, 0022) matters to
# a deployment, not to a local dev server: POSTGUARD_DEV_BUILD=1 (scripts/dev.sh) skips it.
if [ -z "${POSTGUARD_DEV_BUILD:-}" ]; then
  bash scripts/wasm-post.sh
else
  echo "build.sh: POSTGUARD_DEV_BUILD: the wasm's size post-processing skipped (a local build)"
fi
# JS RPC to KeyGuard (ADR 0018): worker-build's module moves to build/postguard.js and
# src/entry.mjs, which re-exports it with KeyGuard as a DurableObject class, is the entry.
mv build/index.js build/postguard.js
cp src/entry.mjs build/index.js
