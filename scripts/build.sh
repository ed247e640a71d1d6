#!/usr/bin/env bash
# Builds the dashboard (static assets, dashboard/dist/) and the worker (release,
# wasm32) into build/ with worker-build, using the locally installed
# wasm-bindgen (no downloads).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"
node scripts/build-dashboard.mjs
# The API document into the assets, for the worker to serve (ADR 0030).
node scripts/openapi-asset.mjs
worker-build --release
bash scripts/wasm-post.sh
# JS RPC to KeyGuard (ADR 0018): worker-build's module moves to build/postguard.js and
# src/entry.mjs, which re-exports it with KeyGuard as a DurableObject class, is the entry.
mv build/index.js build/postguard.js
cp src/entry.mjs build/index.js
